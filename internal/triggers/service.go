package triggers

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/seal"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// Options configure a Service; nil pointers and zero values mean defaults.
type Options struct {
	Store      *store.Store
	Executions *harness.Executions
	Registry   *registry.Registry
	// File is the config file: its connections with source, cron or
	// webhooks, its triggers and its inbox settings.
	File *config.File
	// Consumer names this replica in the inbox consumer groups. Default:
	// a random name, so a restarted process never mistakes a dead one's
	// entries for its own.
	Consumer string
	// Now is the clock cron reads. Default: Redis TIME, so replicas with
	// skewed clocks agree on when a slot is due. Tests inject one.
	Now func(ctx context.Context) (time.Time, error)
	// MaxInFlight bounds the events one replica holds per connection.
	// Default 1024.
	MaxInFlight int
	// Observer receives delivery figures; nil discards them.
	Observer Observer
	Logger   *slog.Logger
	// PublicURL (PATCHBAY_PUBLIC_URL) is where MCP servers reach this
	// deployment; their webhook deliveries go to PublicURL/hooks/{name}.
	// Empty: server events are never delivered by webhook.
	PublicURL string
	// Seal encrypts the whsec_ secrets of webhook subscriptions at rest.
	// Nil: server events are never delivered by webhook.
	Seal *seal.Box
	// WebhookTTL is the subscription lifetime patchbay suggests to a
	// server (ttlMs); the server's refreshBefore decides. Default 1 h.
	WebhookTTL time.Duration
}

// Observer receives the figures the inbox produces. Implementations must
// be safe for concurrent use.
type Observer interface {
	// Started is called when an event's execution was created, with the
	// time since the event was received.
	Started(connection, trigger string, sinceReceived time.Duration)
}

type nopObserver struct{}

func (nopObserver) Started(string, string, time.Duration) {}

// Service runs the sources, the inbox and the triggers of one deployment.
type Service struct {
	st       *store.Store
	execs    *harness.Executions
	reg      *registry.Registry
	consumer string
	now      func(ctx context.Context) (time.Time, error)
	logger   *slog.Logger
	observer Observer

	reclaimAfter  time.Duration
	maxDeliveries int64
	logSize       int
	maxInFlight   int
	pollFloor     time.Duration
	pollLease     time.Duration
	pollParams    connect.EventPoll // maxEvents, timeoutMs and maxAgeMs of every events/poll
	heartbeatWait time.Duration     // a push stream quiet this long is broken
	hookBase      string            // PublicURL when webhook delivery is possible, else ""
	box           *seal.Box         // seals webhook secrets
	webhookTTL    time.Duration

	sources  map[string]*source // by connection: every source, cron and webhook connection
	crons    map[string]*cronSource
	triggers map[string]*trigger // by id
	subs     []*subscription     // MCP event subscriptions, in config order

	// mu serializes Start and Close, and guards cancel. started is read
	// without it: Start holds mu across Redis calls, and a status read
	// must not wait behind a Start stuck on an unanswering Redis (each
	// request waits on Redis at most store.RequestWait, not twice that).
	mu      sync.Mutex
	started atomic.Bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// New compiles the sources and triggers of o.File. Its errors are
// configuration errors: Validate has normally reported them already.
func New(o Options) (*Service, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Consumer == "" {
		o.Consumer = "replica-" + strings.ToLower(rand.Text()[:10])
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 1024
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	f := o.File
	if f == nil {
		f = &config.File{}
	}
	s := &Service{
		st: o.Store, execs: o.Executions, reg: o.Registry, consumer: o.Consumer, logger: o.Logger, observer: o.Observer,
		reclaimAfter: config.DefaultReclaimAfter, maxDeliveries: config.DefaultMaxDeliveries, logSize: config.DefaultLogSize,
		maxInFlight: o.MaxInFlight, pollFloor: config.DefaultPollFloor, pollLease: config.DefaultPollLease, heartbeatWait: config.DefaultHeartbeatWait,
		sources: map[string]*source{}, crons: map[string]*cronSource{}, triggers: map[string]*trigger{},
	}
	if o.PublicURL != "" && o.Seal != nil {
		s.hookBase, s.box = strings.TrimSuffix(o.PublicURL, "/"), o.Seal
	}
	if s.webhookTTL = o.WebhookTTL; s.webhookTTL <= 0 {
		s.webhookTTL = defaultWebhookTTL
	}
	if s.now = o.Now; s.now == nil {
		s.now = func(ctx context.Context) (time.Time, error) { return s.st.Client.Time(ctx).Result() }
	}
	if in := f.Inbox; in != nil {
		if in.ReclaimAfter > 0 {
			s.reclaimAfter = in.ReclaimAfter
		}
		if in.MaxDeliveries > 0 {
			s.maxDeliveries = int64(in.MaxDeliveries)
		}
		if in.LogSize > 0 {
			s.logSize = in.LogSize
		}
		if in.PollFloor > 0 {
			s.pollFloor = in.PollFloor
		}
		if in.PollLease > 0 {
			s.pollLease = in.PollLease
		}
		if in.HeartbeatTimeout > 0 {
			s.heartbeatWait = in.HeartbeatTimeout
		}
	}
	s.pollParams = pollParams(f.Inbox)
	for _, name := range slices.Sorted(maps.Keys(f.Connections)) {
		c := f.Connections[name]
		if c.Source == nil && c.Cron == nil && c.Webhooks == nil {
			continue
		}
		src := &source{name: name, inbox: newInbox(o.Store, name), dedupe: config.DefaultDedupeFor}
		if c.Webhooks != nil && c.Webhooks.DedupeFor > 0 {
			src.dedupe = c.Webhooks.DedupeFor
		}
		switch {
		case c.Source != nil:
			src.schemas = map[string]*jsonschema.Schema{}
			for typ, raw := range c.Source.Events {
				sch, err := config.CompileEventSchema(raw)
				if err != nil {
					return nil, fmt.Errorf("triggers: connection %s: event %s: %w", name, typ, err)
				}
				src.schemas[typ] = sch
			}
		case c.Cron != nil:
			cs, err := newCronSource(name, *c.Cron)
			if err != nil {
				return nil, fmt.Errorf("triggers: connection %s: %w", name, err)
			}
			s.crons[name] = cs
			src.schemas = map[string]*jsonschema.Schema{config.CronEventTick: nil}
		}
		s.sources[name] = src
	}
	s.mcpSources(f)
	for _, t := range f.Triggers {
		src, ok := s.sources[t.Connection]
		if !ok {
			return nil, fmt.Errorf("triggers: trigger %s: connection %q has no events", t.ID, t.Connection)
		}
		c, err := compileTrigger(t)
		if err != nil {
			return nil, fmt.Errorf("triggers: %w", err)
		}
		s.triggers[t.ID] = c
		src.triggers = append(src.triggers, c)
		if src.server {
			sb := s.addSubscription(src, t.Event, t.Arguments)
			sb.triggers = append(sb.triggers, c)
		}
	}
	return s, nil
}

// Via says how an event arrived.
type Via struct {
	// Kind is webhook, api or cron.
	Kind string
	// WebhookID is the webhook-id header, deduplicated with the event id.
	WebhookID string
	// cursor is the cron slot (Unix ms); a slot not after the watermark
	// is a duplicate.
	cursor string
}

// Result is what Emit did with an event.
type Result struct {
	// Duplicate: the event (or webhook-id) was seen within the dedupe
	// window, or the cron slot was fired already; nothing was appended.
	Duplicate bool
	// Triggers are the ids of the triggers it matched.
	Triggers []string
}

// HasSource reports whether connection takes events.
func (s *Service) HasSource(connection string) bool {
	_, ok := s.sources[connection]
	return ok
}

// Emit validates ev for connection and ingests it: an *EventError for a
// bad event, ErrUnknownSource for a connection that takes no events.
func (s *Service) Emit(ctx context.Context, connection string, ev Event, via Via) (Result, error) {
	src, ok := s.sources[connection]
	if !ok || src.server || (via.Kind != "cron" && s.crons[connection] != nil) {
		return Result{}, fmt.Errorf("%w: %q", ErrUnknownSource, connection)
	}
	if !ValidEventID(ev.ID) {
		return Result{}, &EventError{Problems: []FieldProblem{{"/id", fmt.Sprintf("must be a string of 1 to %d printable characters", MaxEventIDLen)}}}
	}
	if via.Kind != "cron" {
		if err := src.validate(ev); err != nil {
			return Result{}, err
		}
		if err := s.checkProfilePayload(connection, ev); err != nil {
			return Result{}, err
		}
	}
	ev.Connection = connection
	if ev.ReceivedAt.IsZero() {
		ev.ReceivedAt = time.Now().UTC()
	}
	var matched []string
	env := envOf(ev)
	for _, t := range src.triggers {
		if t.Event != ev.Type {
			continue
		}
		ok, err := t.matches(env)
		if err != nil {
			s.logger.Warn("trigger filter failed; event not delivered to it", "trigger", t.ID, "event", ev.ID, "err", err)
			src.inbox.count(ctx, "t:"+t.ID+":filterErrors")
			continue
		}
		if ok {
			matched = append(matched, t.ID)
		}
	}
	stampTrace(ctx, &ev)
	data, err := json.Marshal(ev)
	if err != nil {
		return Result{}, fmt.Errorf("triggers: encode event: %w", err)
	}
	receipt := Receipt{At: ev.ReceivedAt, Via: via.Kind, Outcome: "accepted", WebhookID: via.WebhookID, EventID: ev.ID, Type: ev.Type, Triggers: len(matched)}
	acc, _ := json.Marshal(receipt)
	receipt.Outcome, receipt.Triggers = "duplicate", 0
	dup, _ := json.Marshal(receipt)
	dedupe := []string{src.inbox.key("seen", ev.ID)}
	if via.WebhookID != "" {
		dedupe = append(dedupe, src.inbox.key("wh", via.WebhookID))
	}
	fresh, err := src.inbox.ingest(ctx, rand.Text(), ingestArgs{
		event: data, dedupe: dedupe, ttl: src.dedupe, cursor: via.cursor, mustAdvance: via.cursor != "",
		received: ev.ReceivedAt, accepted: acc, duplicate: dup, logSize: s.logSize, triggers: matched,
	})
	if err != nil {
		return Result{}, err
	}
	if !fresh {
		return Result{Duplicate: true}, nil
	}
	// Wait nodes listening on this connection see each accepted event
	// once; a failure here loses no trigger (the inbox has the event).
	if s.execs != nil {
		err := s.execs.AppendEvent(ctx, harness.ConnEvent{Connection: connection, Type: ev.Type, ID: ev.ID, Payload: ev.Payload, ReceivedAt: ev.ReceivedAt})
		if err != nil {
			s.logger.Warn("event not recorded for waits", "connection", connection, "event", ev.ID, "err", err)
		}
	}
	return Result{Triggers: matched}, nil
}

// Reject counts and logs a delivery refused before it became an event (a
// bad signature, a malformed body).
func (s *Service) Reject(ctx context.Context, connection string, r Receipt) {
	src, ok := s.sources[connection]
	if !ok {
		return
	}
	r.Outcome = "rejected"
	if r.At.IsZero() {
		r.At = time.Now().UTC()
	}
	data, _ := json.Marshal(r)
	if err := src.inbox.reject(ctx, data, s.logSize); err != nil {
		s.logger.Warn("could not record a rejected delivery", "connection", connection, "err", err)
	}
}

// Deliveries returns the last n deliveries to connection, newest first.
func (s *Service) Deliveries(ctx context.Context, connection string, n int) ([]Receipt, error) {
	src, ok := s.sources[connection]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownSource, connection)
	}
	if n <= 0 || n > s.logSize {
		n = s.logSize
	}
	return src.inbox.receipts(ctx, n)
}

// Start validates the triggers' workflows and starts delivery and cron.
// It is idempotent; a second call does nothing.
func (s *Service) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started.Load() {
		return nil
	}
	for _, id := range slices.Sorted(maps.Keys(s.triggers)) {
		t := s.triggers[id]
		if _, err := document.ParseDocument(t.Document, s.reg, "/workflow"); err != nil {
			s.logger.Warn("trigger workflow does not validate now; its events wait in the inbox until it does or they are dead-lettered", "trigger", id, "err", err)
		}
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	for _, name := range slices.Sorted(maps.Keys(s.sources)) {
		src := s.sources[name]
		if len(src.triggers) == 0 {
			continue
		}
		if err := src.inbox.ensureGroup(ctx); err != nil {
			cancel()
			return err
		}
		d := newDeliverer(s, src)
		s.wg.Go(func() { d.run(runCtx) })
	}
	for _, name := range slices.Sorted(maps.Keys(s.crons)) {
		c := s.crons[name]
		s.wg.Go(func() { s.runCron(runCtx, c) })
	}
	for _, sb := range s.subs {
		s.wg.Go(func() { s.runSubscription(runCtx, sb) })
	}
	s.cancel = cancel
	s.started.Store(true)
	s.logger.Info("triggers started", "triggers", len(s.triggers), "sources", len(s.sources), "consumer", s.consumer)
	return nil
}

// Started reports whether Start has run.
func (s *Service) Started() bool { return s.started.Load() }

// Close stops delivery and cron and waits for them. Events held are left
// pending; another replica (or this one, restarted) reclaims them.
func (s *Service) Close() {
	s.mu.Lock()
	cancel := s.cancel
	s.cancel = nil
	s.started.Store(false)
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	s.wg.Wait()
}

// DeadLetters lists the dead letters of every connection, oldest first.
func (s *Service) DeadLetters(ctx context.Context) ([]DeadLetter, error) {
	var out []DeadLetter
	for _, name := range slices.Sorted(maps.Keys(s.sources)) {
		dls, err := s.sources[name].inbox.deadLetters(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, dls...)
	}
	slices.SortFunc(out, func(a, b DeadLetter) int { return a.DeadAt.Compare(b.DeadAt) })
	return out, nil
}

// Redeliver puts dead letter id ("<connection>:<entry id>") back in its
// inbox. The event keeps its message id, so it still names at most one
// execution. It returns the new entry id.
func (s *Service) Redeliver(ctx context.Context, id string) (string, error) {
	conn, entry, ok := strings.Cut(id, ":")
	src, known := s.sources[conn]
	if !ok || !known {
		return "", ErrDeadLetterNotFound
	}
	return src.inbox.redeliver(ctx, entry)
}

// Counts are a trigger's figures. Duplicate and Rejected are those of its
// connection (a delivery is refused before triggers are matched).
type Counts struct {
	Received    int64 `json:"received"`
	Duplicate   int64 `json:"duplicate"`
	Rejected    int64 `json:"rejected"`
	Delivered   int64 `json:"delivered"`
	Succeeded   int64 `json:"succeeded"`
	Failed      int64 `json:"failed"`
	Dead        int64 `json:"dead"`
	Redelivered int64 `json:"redelivered"`
}

// TriggerStatus is one trigger as status shows it.
type TriggerStatus struct {
	ID          string     `json:"id"`
	Connection  string     `json:"connection"`
	Event       string     `json:"event"`
	Counts      Counts     `json:"counts"`
	LastEventAt *time.Time `json:"lastEventAt,omitempty"`
}

// InboxStatus is one connection's inbox.
type InboxStatus struct {
	Connection string `json:"connection"`
	// Depth is the number of entries not yet done (pending or unread).
	Depth int64 `json:"depth"`
	// Pending is the number of entries held by a replica.
	Pending     int64      `json:"pending"`
	DeadLetters int64      `json:"deadLetters"`
	Accepted    int64      `json:"accepted"`
	Duplicate   int64      `json:"duplicate"`
	Rejected    int64      `json:"rejected"`
	LastEventAt *time.Time `json:"lastEventAt,omitempty"`
	// Watermark is a cron connection's last fired (or skipped) slot.
	Watermark *time.Time `json:"watermark,omitempty"`
}

// Status is the harness as GET /v1/harness/status shows it.
type Status struct {
	Started     bool              `json:"started"`
	Connections []registry.Status `json:"connections"`
	Triggers    []TriggerStatus   `json:"triggers"`
	Inboxes     []InboxStatus     `json:"inboxes"`
	// Subscriptions are the MCP event subscriptions.
	Subscriptions []SubscriptionStatus `json:"subscriptions"`
	LastEventAt   *time.Time           `json:"lastEventAt,omitempty"`
}

// Status reads the figures of every source and trigger.
func (s *Service) Status(ctx context.Context) (*Status, error) {
	out := &Status{Started: s.Started(), Connections: []registry.Status{}, Triggers: []TriggerStatus{}, Inboxes: []InboxStatus{}}
	if s.reg != nil {
		for _, c := range s.reg.List() {
			out.Connections = append(out.Connections, c.Status())
		}
	}
	states := map[string]map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(s.sources)) {
		in := s.sources[name].inbox
		st, err := in.stateOf(ctx)
		if err != nil {
			return nil, err
		}
		states[name] = st
		is := InboxStatus{Connection: name, Accepted: num(st, "accepted"), Duplicate: num(st, "duplicate"), Rejected: num(st, "rejected"), LastEventAt: msTime(st["lastEventAt"])}
		if s.crons[name] != nil {
			is.Watermark = msTime(st["cursor"])
		}
		if is.Depth, err = s.st.Client.XLen(ctx, in.stream()).Result(); err != nil {
			return nil, fmt.Errorf("inbox %s: depth: %w", name, err)
		}
		if p, err := s.st.Client.XPending(ctx, in.stream(), group).Result(); err == nil {
			is.Pending = p.Count
		}
		if is.DeadLetters, err = s.st.Client.HLen(ctx, in.dead()).Result(); err != nil {
			return nil, fmt.Errorf("inbox %s: dead letters: %w", name, err)
		}
		if is.LastEventAt != nil && (out.LastEventAt == nil || is.LastEventAt.After(*out.LastEventAt)) {
			out.LastEventAt = is.LastEventAt
		}
		out.Inboxes = append(out.Inboxes, is)
	}
	for _, id := range slices.Sorted(maps.Keys(s.triggers)) {
		t := s.triggers[id]
		st := states[t.Connection]
		f := func(k string) int64 { return num(st, "t:"+id+":"+k) }
		out.Triggers = append(out.Triggers, TriggerStatus{
			ID: id, Connection: t.Connection, Event: t.Event, LastEventAt: msTime(st["lastEventAt"]),
			Counts: Counts{
				Received: f("received"), Duplicate: num(st, "duplicate"), Rejected: num(st, "rejected"),
				Delivered: f("delivered"), Succeeded: f("succeeded"), Failed: f("failed"), Dead: f("dead"), Redelivered: f("redelivered"),
			},
		})
	}
	subs, err := s.subscriptionStatuses(ctx)
	if err != nil {
		return nil, err
	}
	out.Subscriptions = subs
	return out, nil
}

func num(m map[string]string, k string) int64 {
	n, _ := strconv.ParseInt(m[k], 10, 64)
	return n
}

func msTime(v string) *time.Time {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return nil
	}
	t := time.UnixMilli(n).UTC()
	return &t
}

// isPermanent reports whether a SubmitOnce failure will recur on every
// delivery (the workflow does not validate for a reason other than a
// connection that is not ready yet).
func isPermanent(err error) bool {
	var ve *fault.ValidationError
	if !errors.As(err, &ve) {
		return false
	}
	for _, p := range ve.Problems {
		if p.Code.NotReady() {
			return false
		}
	}
	return true
}

// pollParams are the knobs every events/poll sends (inbox settings, else
// their defaults): maxEvents bounds one ingest script, timeoutMs lets the
// server answer as soon as an event arrives instead of after nextPollMs,
// and maxAgeMs keeps a subscription resumed after a long stop from
// starting turns for stale events.
func pollParams(in *config.Inbox) connect.EventPoll {
	p := connect.EventPoll{MaxEvents: config.DefaultPollMaxEvents, Timeout: config.DefaultPollTimeout, MaxAge: config.DefaultPollMaxAge}
	if in == nil {
		return p
	}
	if in.PollMaxEvents > 0 {
		p.MaxEvents = in.PollMaxEvents
	}
	if in.PollTimeout > 0 {
		p.Timeout = in.PollTimeout
	}
	if in.PollMaxAge > 0 {
		p.MaxAge = in.PollMaxAge
	}
	return p
}
