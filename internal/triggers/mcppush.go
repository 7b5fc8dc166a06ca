package triggers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// # Push delivery of MCP server events
//
// A subscription whose event type offers push is streamed: its holder
// opens events/stream with the persisted cursor and keeps it open while
// it holds the lease. Each message goes through serverEventScript as poll's
// batches do: an event (a batch of one) with the cursor after it,
// notifications/events/active with its cursor (and truncated, after a
// gap), a heartbeat with the position the server has looked up to, so the
// cursor moves on through quiet periods. The script checks the lease
// before anything, so a holder that lost it appends nothing; the lease's
// renewal, failing, also cancels the stream. A replica that dies mid-stream
// leaves the cursor of the last message it ingested, and whoever takes the
// lease over reopens the stream from there: the server replays what came
// after, and event ids seen before are dropped.
//
// A stream that ends (the server closed it, the connection broke, a
// notifications/events/terminated) or stays silent past
// inbox.heartbeatTimeout is reopened from the persisted cursor after a
// wait: the poll floor after a stream that had opened, doubling up to
// maxStreamBackoff while reopening fails, and maxStreamBackoff after a
// termination. notifications/events/error is recorded as the last error
// and the stream goes on.

// maxStreamBackoff bounds the wait before a push stream is reopened.
const maxStreamBackoff = 30 * time.Second

// errHeartbeatTimeout: the stream carried nothing for too long.
var errHeartbeatTimeout = errors.New("no event or heartbeat within inbox.heartbeatTimeout; reopening the stream")

// streamOnce holds one push stream of sb until it ends, ingesting its
// messages. It returns how long to wait before reopening it, and why it
// ended.
func (s *Service) streamOnce(ctx context.Context, sb *subscription, c *registry.Connection) (time.Duration, error) {
	cursor, err := s.cursorOf(ctx, sb)
	if err != nil {
		return max(s.pollFloor, time.Second), err
	}
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	quiet := time.AfterFunc(s.heartbeatWait, func() { cancel(errHeartbeatTimeout) })
	defer quiet.Stop()
	opened := false
	req := connect.EventStreamRequest{Name: sb.event, Arguments: sb.arguments, Cursor: cursor}
	err = c.StreamEvents(sctx, req, func(m connect.StreamMessage) error {
		quiet.Reset(s.heartbeatWait)
		opened = true
		return s.ingestMessage(sctx, sb, &cursor, m)
	})
	if errors.Is(err, errLeaseLost) || ctx.Err() != nil {
		return 0, err
	}
	sb.backoff = nextBackoff(sb.backoff, s.pollFloor, opened)
	wait := sb.backoff
	if errors.Is(err, connect.ErrStreamTerminated) {
		wait = maxStreamBackoff
	}
	return wait, fmt.Errorf("events/stream: %w", err)
}

// nextBackoff is the wait before reopening a stream: floor after one that
// had opened, else twice the last, at most maxStreamBackoff.
func nextBackoff(last, floor time.Duration, opened bool) time.Duration {
	if opened || last == 0 {
		return floor
	}
	return min(2*last, maxStreamBackoff)
}

// ingestMessage ingests one message of a push stream; cursor is the
// stream's position, moved by the messages that carry one.
func (s *Service) ingestMessage(ctx context.Context, sb *subscription, cursor **string, m connect.StreamMessage) error {
	if m.Kind == connect.StreamError {
		s.recordError(ctx, sb, connect.DeliveryPush, fmt.Errorf("the server reported a transient failure: %s", m.Error))
		return nil
	}
	if m.HasCursor {
		*cursor = m.Cursor
	}
	batch := &connect.EventBatch{Cursor: *cursor, Truncated: m.Truncated}
	if m.Kind == connect.StreamEvent {
		batch.Events = []connect.EventOccurrence{*m.Event}
	}
	fresh, err := s.ingestBatch(ctx, sb, batch, connect.DeliveryPush, "")
	if err != nil {
		return err
	}
	if fresh > 0 {
		s.drainOutbox(ctx, sb)
	}
	if m.Truncated {
		s.logger.Warn("server events were skipped upstream (truncated)", "connection", sb.src.name, "event", sb.event)
	}
	return nil
}

// modeNow is the mode sb would be delivered in now, as this replica sees
// the server.
func (s *Service) modeNow(sb *subscription) string {
	if s.reg == nil {
		return connect.DeliveryPoll
	}
	c, err := s.reg.Get(sb.src.name)
	if err != nil {
		return connect.DeliveryPoll
	}
	t, ok := connect.Manifest{Events: c.EventTypes()}.EventType(sb.event)
	if !ok {
		return connect.DeliveryPoll
	}
	if mode, err := chooseDelivery(t, c.StreamsEvents(), s.hookBase); err == nil {
		return mode
	}
	return connect.DeliveryPoll
}
