package triggers

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// # Webhook delivery of server events
//
// When chooseDelivery picks webhook, the lease holder of a subscription
// calls events/subscribe (MCP Events design sketch at commit 6104601d)
// with the URL PublicURL/hooks/{connection}, a whsec_ secret of its own
// making, the persisted cursor and WebhookTTL as ttlMs, then calls it
// again with the same secret (a refresh) halfway to the server's
// refreshBefore. The subscription's state hash records what exists
// (hookId, hookUrl, refreshBefore, subscribedAt), so after a restart the
// next holder refreshes a subscription that is still live and creates
// anew one that lapsed or was never made. Each new subscription gets a
// fresh secret; the previous one is still accepted for secretOverlap,
// since the server may retry deliveries it signed before. Secrets are
// sealed (package seal, under PATCHBAY_SECRET_KEY) in {in:C}:sub:ID:whsec
// and never logged, returned or shown.
//
// Any replica may receive a delivery: /hooks/{connection} verifies it
// (package webhooks, Standard Webhooks) with the secrets of the
// subscription its X-MCP-Subscription-Id names ({in:C}:hooks maps the
// server's ids to ours), then with those of the connection's other webhook
// subscriptions, since a verification request comes before the server's
// id is known. A verified event goes through serverEventScript like a polled
// batch: its id deduplicated within the subscription, one inbox entry per
// matching trigger, its cursor persisted with it. Control envelopes are
// answered too: verification (the challenge echoed), gap (cursor and
// truncated recorded) and terminated (recorded; the next round subscribes
// anew).
const (
	defaultWebhookTTL = time.Hour
	// noExpiryCheck is how often a subscription granted no expiry is
	// refreshed anyway: the sketch advises it, for the cursor.
	noExpiryCheck  = time.Hour
	secretOverlap  = 10 * time.Minute
	minRefreshWait = 100 * time.Millisecond
	never          = "never"
)

// rotateScript makes secret ARGV[2] the subscription's current one,
// keeping the former as prev until ARGV[3]+ARGV[4] ms; only for the lease
// holder. A retry with the same sealed value changes nothing.
//
// KEYS: lease, whsec. ARGV: holder, sealed secret, now ms, overlap ms.
var rotateScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local cur = redis.call('HGET', KEYS[2], 'cur')
if cur == ARGV[2] then return 1 end
if cur then
  redis.call('HSET', KEYS[2], 'prev', cur, 'prevUntil', tonumber(ARGV[3]) + tonumber(ARGV[4]))
end
redis.call('HSET', KEYS[2], 'cur', ARGV[2])
return 1
`)

// hookURL is where connection's server delivers.
func (s *Service) hookURL(connection string) string { return s.hookBase + "/hooks/" + connection }

// secretName is what a subscription's sealed secrets are bound to.
func (sb *subscription) secretName() string {
	return sb.src.inbox.tag + ":sub:" + sb.id + ":whsec"
}

// newWebhookSecret is a Standard Webhooks secret of 32 random bytes.
func newWebhookSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// lapsed reports whether a persisted refreshBefore (Unix ms, or never)
// has passed.
func lapsed(v string, now time.Time) bool {
	if v == never {
		return false
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	return err != nil || now.UnixMilli() >= ms
}

// subscribeOnce creates or refreshes sb's webhook subscription and returns
// how long to wait before the next refresh.
func (s *Service) subscribeOnce(ctx context.Context, sb *subscription, c *registry.Connection) (time.Duration, error) {
	retry := max(s.pollFloor, time.Second)
	st, err := s.st.Client.HGetAll(ctx, sb.key()).Result()
	if err != nil {
		return retry, fmt.Errorf("subscription %s: state: %w", sb.id, err)
	}
	url := s.hookURL(sb.src.name)
	fresh := st["hookId"] == "" || st["hookUrl"] != url || lapsed(st["refreshBefore"], time.Now())
	secret, err := s.hookSecret(ctx, sb, fresh)
	if err != nil {
		return retry, err
	}
	cursor, err := s.cursorOf(ctx, sb)
	if err != nil {
		return retry, err
	}
	res, err := c.SubscribeEvents(ctx, connect.EventSubscribe{Name: sb.event, Arguments: sb.arguments, URL: url, Secret: secret, Cursor: cursor, TTL: s.webhookTTL})
	if err != nil {
		// The error becomes the subscription's last error, shown in
		// status: a server quoting the request must not show the secret.
		return retry, errors.New("events/subscribe: " + strings.ReplaceAll(err.Error(), secret, "<redacted>"))
	}
	if err := s.recordSubscribed(ctx, sb, st["hookId"], url, cursor, res); err != nil {
		return retry, err
	}
	if fresh {
		s.logger.Info("webhook subscription created", "connection", sb.src.name, "event", sb.event, "subscription", res.ID)
	}
	if res.Truncated {
		s.logger.Warn("server events were skipped upstream (truncated)", "connection", sb.src.name, "event", sb.event)
	}
	if res.RefreshBefore == nil {
		return noExpiryCheck, nil
	}
	return max(time.Until(*res.RefreshBefore)/2, minRefreshWait), nil
}

// hookSecret is the secret to subscribe with: the current one for a
// refresh, a fresh one (stored before the server may use it) for a new
// subscription or when the current one cannot be read.
func (s *Service) hookSecret(ctx context.Context, sb *subscription, fresh bool) (string, error) {
	if !fresh {
		if cur, err := s.openSecret(ctx, sb, "cur"); err == nil && cur != "" {
			return cur, nil
		}
	}
	secret := newWebhookSecret()
	sealed, err := s.box.Seal(sb.secretName(), secret)
	if err != nil {
		return "", fmt.Errorf("subscription %s: seal the webhook secret: %w", sb.id, err)
	}
	n, err := rotateScript.Run(ctx, s.st.Client, []string{sb.key("lease"), sb.key("whsec")}, s.consumer, sealed, time.Now().UnixMilli(), secretOverlap.Milliseconds()).Int()
	if err != nil {
		return "", fmt.Errorf("subscription %s: store the webhook secret: %w", sb.id, err)
	}
	if n < 0 {
		return "", errLeaseLost
	}
	return secret, nil
}

// openSecret reads one of sb's sealed secrets ("" when there is none).
func (s *Service) openSecret(ctx context.Context, sb *subscription, field string) (string, error) {
	v, err := s.st.Client.HGet(ctx, sb.key("whsec"), field).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("subscription %s: webhook secret: %w", sb.id, err)
	}
	var secret string
	if err := s.box.Open(sb.secretName(), v, &secret); err != nil {
		return "", fmt.Errorf("subscription %s: %w", sb.id, err)
	}
	return secret, nil
}

// recordSubscribed persists a successful events/subscribe: the server's
// id and grant, and the cursor it answered when it moved.
func (s *Service) recordSubscribed(ctx context.Context, sb *subscription, oldID, url string, sent *string, res *connect.EventSubscription) error {
	now := time.Now().UnixMilli()
	until := never
	if res.RefreshBefore != nil {
		until = strconv.FormatInt(res.RefreshBefore.UnixMilli(), 10)
	}
	routes := sb.src.inbox.key("hooks")
	_, err := s.st.Client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, sb.key(), "mode", connect.DeliveryWebhook, "hookId", res.ID, "hookUrl", url, "refreshBefore", until, "subscribedAt", now)
		p.HDel(ctx, sb.key(), "lastError", "lastErrorAt")
		if res.Cursor != nil && (sent == nil || *sent != *res.Cursor) {
			cursor, _ := json.Marshal(res.Cursor)
			p.HSet(ctx, sb.key(), "cursor", cursor, "cursorAt", now)
		}
		if res.Truncated {
			p.HIncrBy(ctx, sb.key(), "truncated", 1)
			p.HSet(ctx, sb.key(), "truncatedAt", now)
		}
		if oldID != "" && oldID != res.ID {
			p.HDel(ctx, routes, oldID)
		}
		p.HSet(ctx, routes, res.ID, sb.id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("subscription %s: record events/subscribe: %w", sb.id, err)
	}
	return nil
}

// dropWebhook ends sb's webhook subscription when another mode was chosen
// (PATCHBAY_PUBLIC_URL removed, the server stopped offering webhook). A
// server that cannot be told lets it lapse at its expiry.
func (s *Service) dropWebhook(ctx context.Context, sb *subscription, c *registry.Connection) {
	st, err := s.st.Client.HMGet(ctx, sb.key(), "hookId", "hookUrl").Result()
	if err != nil || st[0] == nil {
		return
	}
	id, _ := st[0].(string)
	url, _ := st[1].(string)
	if err := c.UnsubscribeEvents(ctx, sb.event, sb.arguments, url); err != nil {
		s.logger.Warn("events/unsubscribe failed; the server's subscription lapses at its expiry", "connection", sb.src.name, "event", sb.event, "err", err)
	}
	s.st.Client.HDel(ctx, sb.key(), "hookId", "hookUrl", "refreshBefore", "subscribedAt")
	s.st.Client.HDel(ctx, sb.src.inbox.key("hooks"), id)
}

// HookCandidate is a webhook subscription a delivery to /hooks may be
// for, with the secrets that may have signed it (the current one, and the
// previous one during the overlap).
type HookCandidate struct {
	sb      *subscription
	Secrets []string
}

// TakesServerHooks reports whether connection's MCP server may deliver
// events by webhook to /hooks/{connection}.
func (s *Service) TakesServerHooks(connection string) bool {
	src, ok := s.sources[connection]
	return ok && src.server && s.hookBase != ""
}

// HookCandidates returns the webhook subscriptions of connection a
// delivery may be for: first the one serverID (X-MCP-Subscription-Id, may
// be empty or unknown) names, then the others.
func (s *Service) HookCandidates(ctx context.Context, connection, serverID string) ([]HookCandidate, error) {
	src, ok := s.sources[connection]
	if !ok || !src.server {
		return nil, fmt.Errorf("%w: %q", ErrUnknownSource, connection)
	}
	var first string
	if serverID != "" && len(serverID) <= MaxEventIDLen {
		id, err := s.st.Client.HGet(ctx, src.inbox.key("hooks"), serverID).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("inbox %s: webhook routes: %w", connection, err)
		}
		first = id
	}
	var out []HookCandidate
	for _, sb := range s.subs {
		if sb.src != src {
			continue
		}
		secrets, err := s.secretsOf(ctx, sb)
		if err != nil {
			return nil, err
		}
		if len(secrets) == 0 {
			continue
		}
		c := HookCandidate{sb: sb, Secrets: secrets}
		if sb.id == first {
			out = append([]HookCandidate{c}, out...)
		} else {
			out = append(out, c)
		}
	}
	return out, nil
}

// secretsOf returns sb's current secret and, during the overlap, the
// previous one.
func (s *Service) secretsOf(ctx context.Context, sb *subscription) ([]string, error) {
	m, err := s.st.Client.HGetAll(ctx, sb.key("whsec")).Result()
	if err != nil {
		return nil, fmt.Errorf("subscription %s: webhook secrets: %w", sb.id, err)
	}
	var out []string
	for _, f := range []string{"cur", "prev"} {
		if m[f] == "" || (f == "prev" && lapsed(m["prevUntil"], time.Now())) {
			continue
		}
		var secret string
		if err := s.box.Open(sb.secretName(), m[f], &secret); err != nil {
			s.logger.Warn("a webhook secret does not decrypt; deliveries signed with it are refused", "connection", sb.src.name, "event", sb.event, "err", err)
			continue
		}
		out = append(out, secret)
	}
	return out, nil
}

// HookAnswer is what a verified delivery of server events came to.
type HookAnswer struct {
	// Challenge is the nonce of a verification request, to be echoed.
	Challenge string
	// Event is the event delivered; nil for a control envelope.
	Event *Event
	// Duplicate: the event's id was taken already.
	Duplicate bool
}

// hookBody is a webhook body: an EventOccurrence, or a control envelope
// (a body with a top-level type).
type hookBody struct {
	Type      *string        `json:"type"`
	Challenge string         `json:"challenge"`
	Error     *hookError     `json:"error"`
	EventID   string         `json:"eventId"`
	Name      string         `json:"name"`
	Timestamp string         `json:"timestamp"`
	Data      map[string]any `json:"data"`
	Cursor    *string        `json:"cursor"`
}

type hookError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// DeliverHook takes the body of a delivery verified with c's secrets. A
// body that is neither an event of c's type nor a known envelope is an
// *EventError.
func (s *Service) DeliverHook(ctx context.Context, c HookCandidate, webhookID string, body []byte) (HookAnswer, error) {
	sb := c.sb
	var b hookBody
	if err := json.Unmarshal(body, &b); err != nil {
		return HookAnswer{}, &EventError{Problems: []FieldProblem{{Path: "", Message: "must be a JSON object: an event occurrence or a control envelope"}}}
	}
	if b.Type != nil {
		return s.hookEnvelope(ctx, sb, *b.Type, b)
	}
	var ps []FieldProblem
	if b.EventID == "" {
		ps = append(ps, FieldProblem{"/eventId", "is required"})
	}
	if b.Name != sb.event {
		ps = append(ps, FieldProblem{"/name", fmt.Sprintf("must be %q, the event this subscription is for", sb.event)})
	}
	if b.Data == nil {
		ps = append(ps, FieldProblem{"/data", "is required and must be an object"})
	}
	if len(ps) > 0 {
		return HookAnswer{}, &EventError{Problems: ps}
	}
	occ := connect.EventOccurrence{EventID: b.EventID, Name: b.Name, Timestamp: b.Timestamp, Data: b.Data}
	n, err := s.ingestBatch(ctx, sb, &connect.EventBatch{Events: []connect.EventOccurrence{occ}, Cursor: b.Cursor}, connect.DeliveryWebhook, webhookID)
	if err != nil {
		return HookAnswer{}, err
	}
	if n > 0 {
		s.drainOutbox(ctx, sb)
	}
	ev := &Event{Connection: sb.src.name, Type: b.Name, ID: occurrenceID(b.EventID), Payload: b.Data}
	return HookAnswer{Event: ev, Duplicate: n == 0}, nil
}

// hookEnvelope answers a control envelope.
func (s *Service) hookEnvelope(ctx context.Context, sb *subscription, typ string, b hookBody) (HookAnswer, error) {
	now := time.Now().UnixMilli()
	switch typ {
	case "verification":
		if b.Challenge == "" || len(b.Challenge) > 512 {
			return HookAnswer{}, &EventError{Problems: []FieldProblem{{"/challenge", "is required: a string of at most 512 characters"}}}
		}
		return HookAnswer{Challenge: b.Challenge}, nil
	case "gap":
		cursor, _ := json.Marshal(b.Cursor)
		s.logger.Warn("server events were skipped upstream (gap)", "connection", sb.src.name, "event", sb.event)
		_, err := s.st.Client.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, sb.key(), "cursor", cursor, "cursorAt", now, "truncatedAt", now)
			p.HIncrBy(ctx, sb.key(), "truncated", 1)
			return nil
		})
		if err != nil {
			return HookAnswer{}, fmt.Errorf("subscription %s: record a gap: %w", sb.id, err)
		}
		return HookAnswer{}, nil
	case "terminated":
		msg := "the server ended the webhook subscription"
		if b.Error != nil {
			msg += fmt.Sprintf(": %s (code %d)", connect.Excerpt(b.Error.Message, 200), b.Error.Code)
		}
		s.logger.Warn(msg, "connection", sb.src.name, "event", sb.event)
		// Without hookId the next round subscribes anew.
		_, err := s.st.Client.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HDel(ctx, sb.key(), "hookId", "refreshBefore")
			p.HSet(ctx, sb.key(), "lastError", msg, "lastErrorAt", now)
			return nil
		})
		if err != nil {
			return HookAnswer{}, fmt.Errorf("subscription %s: record its end: %w", sb.id, err)
		}
		return HookAnswer{}, nil
	}
	return HookAnswer{}, &EventError{Problems: []FieldProblem{{"/type", "must be verification, gap or terminated"}}}
}
