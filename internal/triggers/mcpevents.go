package triggers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// # Events of MCP servers
//
// A trigger on an mcp connection, and each entry of the connection's
// subscribe list, subscribes to one of the server's event types (MCP Events
// extension) with its arguments; triggers with the same event and
// arguments share a subscription. Its delivery mode is chosen each round
// among what the event type offers (chooseDelivery): push when the
// transport can hold a stream (mcppush.go), else webhook when
// PATCHBAY_PUBLIC_URL is set (mcpwebhook.go), else poll. An event type
// patchbay cannot take records why and is not delivered.
//
// Each subscription is served by one replica at a time: the holder of its
// lease ({in:C}:sub:ID:lease, renewed every third of PollLease); when the
// holder dies the lease lapses and another replica takes over. One Lua
// script (serverEventScript) takes a whole events/poll batch, one message
// of a push stream or one webhook delivery: it refuses to run
// for a replica that no longer holds the lease, drops events whose id this
// subscription saw before, appends the others to the inbox (one entry per
// matching trigger) and to the subscription's outbox, and persists the
// cursor the batch ended at, all at once. A replica that dies before the
// script polls again from the old cursor on takeover and gets the same
// events; one that dies after it resumes from the new cursor. Either way
// each event starts its turns once. The outbox feeds the connection's
// event log that wait nodes read: it is drained after the script (and by
// whoever takes the lease over), so an event reaches waits at least once;
// a crash between the append and the drain can show it twice.

// subscription is one MCP event subscription.
type subscription struct {
	id        string
	event     string
	arguments map[string]any
	src       *source
	triggers  []*trigger

	schemaSrc string // the inputSchema the arguments were last judged by
	argsErr   error
	relisted  time.Time // when its missing event type last made the connection list events again

	// backoff is the wait before reopening a push stream that broke,
	// doubled while reopening fails; touched only by the holding goroutine.
	backoff time.Duration
}

// subscriptionID names a subscription by its event and canonical
// arguments (encoding/json sorts map keys).
func subscriptionID(event string, args map[string]any) string {
	b, _ := json.Marshal(args)
	sum := sha256.Sum256(append([]byte(event+"\x00"), b...))
	return hex.EncodeToString(sum[:8])
}

func (sb *subscription) key(parts ...string) string {
	return sb.src.inbox.key(append([]string{"sub", sb.id}, parts...)...)
}

// addSubscription returns the subscription of (event, args) on src,
// creating it.
func (s *Service) addSubscription(src *source, event string, args map[string]any) *subscription {
	if args == nil {
		args = map[string]any{}
	}
	id := subscriptionID(event, args)
	for _, sb := range s.subs {
		if sb.src == src && sb.id == id {
			return sb
		}
	}
	sb := &subscription{id: id, event: event, arguments: args, src: src}
	s.subs = append(s.subs, sb)
	return sb
}

// serverEventScript ingests one events/poll batch, one push message or
// one webhook delivery, and persists its cursor.
//
// KEYS: stream, state, log, lease, sub, outbox, seen keys (one per event)…
// ARGV: holder ("" for a webhook delivery, which any replica may take),
// dedupe ttl ms, cursor JSON, now ms, log size, truncated ("1"/"0"), mode
// (poll/push/webhook), then per event: event JSON, accepted receipt,
// duplicate receipt, trigger count k, k trigger ids.
//
// It answers -1 when the lease is not the caller's, else the number of
// events appended.
var serverEventScript = redis.NewScript(`
if ARGV[1] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[1] then return -1 end
local a, fresh, logsize = 8, 0, tonumber(ARGV[5]) - 1
for i = 1, #KEYS - 6 do
  local ev, acc, dup, k = ARGV[a], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3])
  if redis.call('EXISTS', KEYS[6 + i]) == 1 then
    redis.call('HINCRBY', KEYS[2], 'duplicate', 1)
    redis.call('LPUSH', KEYS[3], dup)
  else
    redis.call('SET', KEYS[6 + i], '1', 'PX', ARGV[2])
    for j = 1, k do
      local t = ARGV[a + 3 + j]
      redis.call('XADD', KEYS[1], '*', 't', t, 'e', ev)
      redis.call('HINCRBY', KEYS[2], 't:' .. t .. ':received', 1)
    end
    redis.call('HINCRBY', KEYS[2], 'accepted', 1)
    redis.call('HSET', KEYS[2], 'lastEventAt', ARGV[4])
    redis.call('LPUSH', KEYS[3], acc)
    redis.call('RPUSH', KEYS[6], ev)
    redis.call('HINCRBY', KEYS[5], 'events', 1)
    fresh = fresh + 1
  end
  redis.call('LTRIM', KEYS[3], 0, logsize)
  a = a + 4 + k
end
if redis.call('HGET', KEYS[5], 'cursor') ~= ARGV[3] then
  redis.call('HSET', KEYS[5], 'cursor', ARGV[3], 'cursorAt', ARGV[4])
end
if ARGV[7] == 'webhook' then
  redis.call('HSET', KEYS[5], 'deliveredAt', ARGV[4])
else
  redis.call('HSET', KEYS[5], 'polledAt', ARGV[4], 'mode', ARGV[7])
  redis.call('HDEL', KEYS[5], 'lastError', 'lastErrorAt')
end
if ARGV[6] == '1' then
  redis.call('HINCRBY', KEYS[5], 'truncated', 1)
  redis.call('HSET', KEYS[5], 'truncatedAt', ARGV[4])
end
return fresh
`)

// releaseScript gives the lease back when it is the caller's.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// errLeaseLost: another replica holds the subscription now.
var errLeaseLost = errors.New("the subscription's lease passed to another replica")

// runSubscription delivers sb whenever this replica holds its lease.
func (s *Service) runSubscription(ctx context.Context, sb *subscription) {
	for ctx.Err() == nil {
		ok, err := s.st.Client.SetNX(ctx, sb.key("lease"), s.consumer, s.pollLease).Result()
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("subscription lease: redis failed", "connection", sb.src.name, "event", sb.event, "err", err)
		}
		if !ok {
			harness.Sleep(ctx, s.pollLease/3)
			continue
		}
		s.hold(ctx, sb)
	}
}

// hold delivers sb until the lease is lost or ctx ends, renewing the
// lease meanwhile.
func (s *Service) hold(ctx context.Context, sb *subscription) {
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		t := time.NewTicker(s.pollLease / 3)
		defer t.Stop()
		for {
			select {
			case <-hctx.Done():
				return
			case <-t.C:
			}
			n, err := store.RenewScript.Run(hctx, s.st.Client, []string{sb.key("lease")}, s.consumer, s.pollLease.Milliseconds()).Int()
			if err == nil && n == 0 {
				cancel(errLeaseLost)
				return
			}
		}
	}()
	defer func() {
		// Given back on a clean stop, so another replica need not wait for
		// the lease to lapse.
		rctx, rc := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer rc()
		_ = releaseScript.Run(rctx, s.st.Client, []string{sb.key("lease")}, s.consumer).Err()
	}()
	s.drainOutbox(hctx, sb)
	sb.backoff = 0
	for hctx.Err() == nil {
		mode, wait, err := s.deliverOnce(hctx, sb)
		if errors.Is(err, errLeaseLost) {
			return
		}
		if err != nil && hctx.Err() == nil {
			s.recordError(hctx, sb, mode, err)
		}
		harness.Sleep(hctx, wait)
	}
}

// deliverOnce sends one events/poll, or holds one push stream until it
// ends, in the mode the event type offers now. It returns the mode, how
// long to wait before the next, and what went wrong.
func (s *Service) deliverOnce(ctx context.Context, sb *subscription) (string, time.Duration, error) {
	retry := max(s.pollFloor, time.Second)
	c, err := s.reg.Get(sb.src.name)
	if err != nil {
		return "", retry, err
	}
	if st := c.State(); st != connect.StateReady {
		// No mode is chosen from a connection that is down: whether it can
		// stream is not known.
		return "", retry, fmt.Errorf("connection %s is %s: %w", sb.src.name, st, connect.ErrUnavailable)
	}
	s.relistMissing(ctx, c, sb)
	mode, err := sb.check(c.EventTypes(), c.StreamsEvents(), s.hookBase)
	if err != nil {
		return mode, retry, err
	}
	if mode != connect.DeliveryPush {
		sb.backoff = 0 // the push stream's reopening backoff starts anew
	}
	if mode != connect.DeliveryWebhook {
		s.dropWebhook(ctx, sb, c)
	}
	var wait time.Duration
	switch mode {
	case connect.DeliveryPush:
		wait, err = s.streamOnce(ctx, sb, c)
	case connect.DeliveryWebhook:
		wait, err = s.subscribeOnce(ctx, sb, c)
	default:
		wait, err = s.pollOnce(ctx, sb, c)
	}
	return mode, wait, err
}

// relistEvery bounds how often a subscription whose event type the
// connection does not list makes it list its events again.
const relistEvery = 30 * time.Second

// relistMissing lists c's events again when sb's event type is missing
// from them, at most every relistEvery: a stateless (2026-07-28) session
// hears no list_changed, so this is how a type the server adds later is
// found.
func (s *Service) relistMissing(ctx context.Context, c *registry.Connection, sb *subscription) {
	listed := slices.ContainsFunc(c.EventTypes(), func(t connect.EventType) bool { return t.Name == sb.event })
	if listed || time.Since(sb.relisted) < relistEvery {
		return
	}
	sb.relisted = time.Now()
	if err := c.RefreshEvents(ctx); err != nil {
		s.logger.Warn("events/list again failed", "connection", sb.src.name, "event", sb.event, "err", err)
	}
}

// pollOnce sends one events/poll and ingests its batch. It returns how
// long to wait before the next.
func (s *Service) pollOnce(ctx context.Context, sb *subscription, c *registry.Connection) (time.Duration, error) {
	retry := max(s.pollFloor, time.Second)
	cursor, err := s.cursorOf(ctx, sb)
	if err != nil {
		return retry, err
	}
	req := s.pollParams
	req.Name, req.Arguments, req.Cursor = sb.event, sb.arguments, cursor
	batch, err := c.PollEvents(ctx, req)
	if err != nil {
		if staleList(err) {
			_ = c.RefreshEvents(ctx) // best effort: the next check judges by the new list
		}
		return pollRetry(err, retry), pollError(err)
	}
	fresh, err := s.ingestBatch(ctx, sb, batch, connect.DeliveryPoll, "")
	if err != nil {
		return retry, err
	}
	if fresh > 0 {
		s.drainOutbox(ctx, sb)
	}
	if batch.Truncated {
		s.logger.Warn("server events were skipped upstream (truncated)", "connection", sb.src.name, "event", sb.event)
	}
	if batch.HasMore {
		return 0, nil
	}
	return max(time.Duration(batch.NextPollMs)*time.Millisecond, s.pollFloor), nil
}

// check judges the subscription against the server's current event
// types: the event is listed, offers a mode patchbay can use, and the
// arguments fit its inputSchema. It returns the mode to deliver by.
func (sb *subscription) check(types []connect.EventType, canStream bool, publicURL string) (string, error) {
	i := slices.IndexFunc(types, func(t connect.EventType) bool { return t.Name == sb.event })
	if i < 0 {
		return "", fmt.Errorf("the server offers no event %q", sb.event)
	}
	t := types[i]
	mode, err := chooseDelivery(t, canStream, publicURL)
	if err != nil {
		return "", err
	}
	if string(t.InputSchema) != sb.schemaSrc {
		sb.schemaSrc, sb.argsErr = string(t.InputSchema), validateArguments(t.InputSchema, sb.arguments)
	}
	return mode, sb.argsErr
}

// chooseDelivery picks how an event type is delivered, in the order the
// reference asks for: push (when the transport can hold a stream open),
// then webhook (when publicURL, PATCHBAY_PUBLIC_URL, is set), then poll.
func chooseDelivery(t connect.EventType, canStream bool, publicURL string) (string, error) {
	switch {
	case t.Offers(connect.DeliveryPush) && canStream:
		return connect.DeliveryPush, nil
	case t.Offers(connect.DeliveryWebhook) && publicURL != "":
		return connect.DeliveryWebhook, nil
	case t.Offers(connect.DeliveryPoll):
		return connect.DeliveryPoll, nil
	case t.Offers(connect.DeliveryWebhook):
		return "", fmt.Errorf("event %q is delivered only by webhook, which needs PATCHBAY_PUBLIC_URL (the URL at which the server reaches this deployment's /hooks) and a key for the secrets (PATCHBAY_SECRET_KEY on a shared Redis)", t.Name)
	}
	return "", fmt.Errorf("event %q is delivered only by %v; patchbay takes push (on a transport that can hold a stream, not legacy HTTP+SSE), webhook and poll", t.Name, t.Delivery)
}

// noFetch refuses every $ref outside the schema: patchbay never loads
// schemas from the network or the disk on a server's say-so.
type noFetch struct{}

func (noFetch) Load(url string) (any, error) { return nil, fmt.Errorf("not loading %s", url) }

// validateArguments checks subscription arguments against an event's
// inputSchema (none: any object).
func validateArguments(schema json.RawMessage, args map[string]any) error {
	if len(schema) == 0 {
		return nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return fmt.Errorf("the event's inputSchema is not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(noFetch{})
	if err := c.AddResource("mem://event-input.json", doc); err != nil {
		return fmt.Errorf("the event's inputSchema: %w", err)
	}
	sch, err := c.Compile("mem://event-input.json")
	if err != nil {
		return fmt.Errorf("the event's inputSchema does not compile: %w", err)
	}
	// Validate the JSON form, as the server will see it.
	b, _ := json.Marshal(args)
	v, _ := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err := sch.Validate(v); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			ps := schemaProblems(ve)
			msgs := make([]string, len(ps))
			for i, p := range ps {
				msgs[i] = "arguments" + p.Path[len("/payload"):] + ": " + p.Message
			}
			return fmt.Errorf("arguments do not fit the event's inputSchema: %v", msgs)
		}
		return fmt.Errorf("arguments do not fit the event's inputSchema: %w", err)
	}
	return nil
}

// cursorOf reads the persisted cursor: nil when none was persisted or the
// server's last answer had none (no replay).
func (s *Service) cursorOf(ctx context.Context, sb *subscription) (*string, error) {
	v, err := s.st.Client.HGet(ctx, sb.key(), "cursor").Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("subscription %s: cursor: %w", sb.id, err)
	}
	var c *string
	if err := json.Unmarshal([]byte(v), &c); err != nil {
		return nil, fmt.Errorf("subscription %s: cursor: %w", sb.id, err)
	}
	return c, nil
}

// ingestBatch runs serverEventScript for batch, delivered in mode: polled
// or streamed by this replica as the lease holder, or delivered by webhook
// with webhookID (any replica may take those).
func (s *Service) ingestBatch(ctx context.Context, sb *subscription, batch *connect.EventBatch, mode, webhookID string) (int, error) {
	in := sb.src.inbox
	now := time.Now().UTC()
	cursor, _ := json.Marshal(batch.Cursor)
	trunc := "0"
	if batch.Truncated {
		trunc = "1"
	}
	keys := []string{in.stream(), in.state(), in.log(), sb.key("lease"), sb.key(), sb.key("outbox")}
	holder, via := s.consumer, "mcp"
	if mode == connect.DeliveryWebhook {
		holder, via = "", "webhook"
	}
	argv := []any{holder, sb.src.dedupe.Milliseconds(), cursor, now.UnixMilli(), s.logSize, trunc, mode}
	for _, occ := range batch.Events {
		ev := Event{Connection: sb.src.name, Type: occ.Name, ID: occurrenceID(occ.EventID), Payload: occ.Data, ReceivedAt: now}
		matched := s.match(sb, ev)
		data, err := json.Marshal(ev)
		if err != nil {
			return 0, fmt.Errorf("subscription %s: encode event: %w", sb.id, err)
		}
		r := Receipt{At: now, Via: via, Outcome: "accepted", WebhookID: webhookID, EventID: ev.ID, Type: ev.Type, Triggers: len(matched)}
		acc, _ := json.Marshal(r)
		r.Outcome, r.Triggers = "duplicate", 0
		dup, _ := json.Marshal(r)
		keys = append(keys, in.key("seen", sb.id, ev.ID))
		argv = append(argv, data, acc, dup, len(matched))
		for _, t := range matched {
			argv = append(argv, t)
		}
	}
	n, err := serverEventScript.Run(ctx, s.st.Client, keys, argv...).Int()
	if err != nil {
		return 0, fmt.Errorf("subscription %s: ingest: %w", sb.id, err)
	}
	if n < 0 {
		return 0, errLeaseLost
	}
	return n, nil
}

// occurrenceID is the server's eventId, or its digest when it cannot be a
// key (too long, unprintable).
func occurrenceID(id string) string {
	if ValidEventID(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// match returns the ids of sb's triggers whose filter ev passes.
func (s *Service) match(sb *subscription, ev Event) []string {
	var out []string
	env := envOf(ev)
	for _, t := range sb.triggers {
		ok, err := t.matches(env)
		if err != nil {
			s.logger.Warn("trigger filter failed; event not delivered to it", "trigger", t.ID, "event", ev.ID, "err", err)
			sb.src.inbox.count(context.Background(), "t:"+t.ID+":filterErrors")
			continue
		}
		if ok {
			out = append(out, t.ID)
		}
	}
	return out
}

// drainOutbox moves the subscription's accepted events to the
// connection's event log, oldest first.
func (s *Service) drainOutbox(ctx context.Context, sb *subscription) {
	if s.execs == nil {
		return
	}
	for ctx.Err() == nil {
		raw, err := s.st.Client.LIndex(ctx, sb.key("outbox"), 0).Result()
		if err != nil {
			return // empty (redis.Nil), or tried again after the next poll
		}
		var ev Event
		if json.Unmarshal([]byte(raw), &ev) == nil {
			err := s.execs.AppendEvent(ctx, harness.ConnEvent{Connection: ev.Connection, Type: ev.Type, ID: ev.ID, Payload: ev.Payload, ReceivedAt: ev.ReceivedAt})
			if err != nil {
				s.logger.Warn("server event not recorded for waits yet", "connection", ev.Connection, "event", ev.ID, "err", err)
				return
			}
		}
		s.st.Client.LPop(ctx, sb.key("outbox"))
	}
}

// recordError keeps the subscription's last error, and the mode it was
// met in ("" before one was chosen: the last is kept), for status.
func (s *Service) recordError(ctx context.Context, sb *subscription, mode string, err error) {
	s.logger.Warn("server event subscription failed", "connection", sb.src.name, "event", sb.event, "mode", mode, "err", err)
	fields := []any{"lastError", connect.Excerpt(err.Error(), 500), "lastErrorAt", time.Now().UnixMilli()}
	if mode != "" {
		fields = append(fields, "mode", mode)
	}
	s.st.Client.HSet(ctx, sb.key(), fields...)
}

// SubscriptionStatus is one MCP event subscription as status shows it.
type SubscriptionStatus struct {
	Connection string         `json:"connection"`
	Event      string         `json:"event"`
	Arguments  map[string]any `json:"arguments"`
	// Mode is how events are delivered: push (events/stream), webhook
	// (events/subscribe) or poll, as the holder last delivered them.
	Mode string `json:"mode"`
	// Triggers are the ids of the triggers it feeds.
	Triggers []string `json:"triggers"`
	// Holder is the replica polling or streaming it, or keeping its
	// webhook subscription, now, if any.
	Holder string `json:"holder,omitempty"`
	// SubscriptionID is the server's id of the webhook subscription (sent
	// with every delivery as X-MCP-Subscription-Id; a routing handle,
	// not a credential).
	SubscriptionID string `json:"subscriptionId,omitempty"`
	// ExpiresAt is when the webhook subscription lapses unless refreshed
	// (the server's refreshBefore); absent with a webhook subscription
	// that never expires.
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	// RefreshedAt is when events/subscribe last succeeded.
	RefreshedAt *time.Time `json:"refreshedAt,omitempty"`
	// LastDeliveryAt is when a webhook delivery was last accepted.
	LastDeliveryAt *time.Time `json:"lastDeliveryAt,omitempty"`
	// HasCursor: a cursor is persisted (the server replays from it).
	HasCursor bool `json:"hasCursor"`
	// CursorAt is when the persisted cursor last moved.
	CursorAt *time.Time `json:"cursorAt,omitempty"`
	// CursorAgeSeconds is the time since CursorAt.
	CursorAgeSeconds *float64 `json:"cursorAgeSeconds,omitempty"`
	// LastPollAt is when the last poll, or the last message of the push
	// stream, was ingested.
	LastPollAt *time.Time `json:"lastPollAt,omitempty"`
	Events     int64      `json:"events"`
	// Truncated counts the answers that said events were skipped
	// upstream; TruncatedAt is the last.
	Truncated   int64      `json:"truncated"`
	TruncatedAt *time.Time `json:"truncatedAt,omitempty"`
	LastError   string     `json:"lastError,omitempty"`
	LastErrorAt *time.Time `json:"lastErrorAt,omitempty"`
}

// subscriptionStatus reads sb's figures.
func (s *Service) subscriptionStatus(ctx context.Context, sb *subscription) (SubscriptionStatus, error) {
	st := SubscriptionStatus{Connection: sb.src.name, Event: sb.event, Arguments: sb.arguments, Triggers: []string{}}
	for _, t := range sb.triggers {
		st.Triggers = append(st.Triggers, t.ID)
	}
	m, err := s.st.Client.HGetAll(ctx, sb.key()).Result()
	if err != nil {
		return st, fmt.Errorf("subscription %s: status: %w", sb.id, err)
	}
	if h, err := s.st.Client.Get(ctx, sb.key("lease")).Result(); err == nil {
		st.Holder = h
	}
	if st.Mode = m["mode"]; st.Mode == "" {
		st.Mode = s.modeNow(sb) // nothing delivered yet
	}
	st.HasCursor = m["cursor"] != "" && m["cursor"] != "null"
	st.CursorAt, st.LastPollAt, st.TruncatedAt, st.LastErrorAt = msTime(m["cursorAt"]), msTime(m["polledAt"]), msTime(m["truncatedAt"]), msTime(m["lastErrorAt"])
	if st.CursorAt != nil {
		age := time.Since(*st.CursorAt).Seconds()
		st.CursorAgeSeconds = &age
	}
	st.Events, st.Truncated, st.LastError = num(m, "events"), num(m, "truncated"), m["lastError"]
	if st.Mode == connect.DeliveryWebhook {
		st.SubscriptionID, st.ExpiresAt = m["hookId"], msTime(m["refreshBefore"])
		st.RefreshedAt, st.LastDeliveryAt = msTime(m["subscribedAt"]), msTime(m["deliveredAt"])
	}
	return st, nil
}

// mcpSources adds a source for each mcp connection with triggers or
// subscriptions, and the subscriptions.
func (s *Service) mcpSources(f *config.File) {
	for _, name := range slices.Sorted(maps.Keys(f.Connections)) {
		c := f.Connections[name]
		if c.MCP == nil || c.Webhooks != nil {
			continue
		}
		wanted := len(c.MCP.Subscribe) > 0 || slices.ContainsFunc(f.Triggers, func(t config.Trigger) bool { return t.Connection == name })
		if !wanted {
			continue
		}
		src := &source{name: name, inbox: newInbox(s.st, name), dedupe: config.DefaultDedupeFor, server: true}
		s.sources[name] = src
		for _, sub := range c.MCP.Subscribe {
			s.addSubscription(src, sub.Event, sub.Arguments)
		}
	}
}

// subscriptionStatuses reads every subscription's figures.
func (s *Service) subscriptionStatuses(ctx context.Context) ([]SubscriptionStatus, error) {
	out := []SubscriptionStatus{}
	for _, sb := range s.subs {
		st, err := s.subscriptionStatus(ctx, sb)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// Subscriptions lists connection's MCP event subscriptions with their
// figures (the admin connection page shows them).
func (s *Service) Subscriptions(ctx context.Context, connection string) ([]SubscriptionStatus, error) {
	out := []SubscriptionStatus{}
	for _, sb := range s.subs {
		if sb.src.name != connection {
			continue
		}
		st, err := s.subscriptionStatus(ctx, sb)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}
