package demo

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// The demo's webhook delivery (MCP Events design sketch at commit
// 6104601d, "Webhook-Based Delivery"): ticket.escalated, raised by every
// high-priority open_ticket, is offered by webhook only. events/subscribe
// {name, arguments, delivery: {url, secret}, cursor, ttlMs} checks the
// secret (whsec_, 24 to 64 bytes), proves the endpoint wants deliveries
// with a signed verification request whose challenge it must echo (once
// per URL), grants at most MaxTTL and answers {id, refreshBefore, cursor,
// truncated}; the same call before refreshBefore refreshes, replacing the
// secret (the old one still signs beside it for a minute). Each
// subscription delivers in order, each event signed per Standard Webhooks
// with X-MCP-Subscription-Id, retried with backoff up to five attempts; its
// cursor is the sequence number of the last event acknowledged or given
// up. A subscription not refreshed by refreshBefore is dropped; a new one
// replays the escalations after the cursor it is given.
//
// Deviations, since this is a local demo: the principal is the one
// anonymous caller (the sketch wants webhook only with authentication),
// and a callback URL may be http on a loopback host (the sketch wants
// https, and refuses private addresses).
const (
	EventTicketEscalated = "ticket.escalated"
	defaultMaxTTL        = time.Hour
	secretGrace          = time.Minute
	deliveryAttempts     = 5
	defaultRetryBase     = 200 * time.Millisecond
)

var escalatedEventType = map[string]any{
	"name":        EventTicketEscalated,
	"description": "A high-priority ticket was opened (open_ticket with priority high). Delivered by webhook only.",
	"delivery":    []string{"webhook"},
	"inputSchema": map[string]any{"type": "object", "additionalProperties": false},
	"payloadSchema": map[string]any{
		"type":       "object",
		"properties": map[string]any{"ticket": map[string]any{"type": "string"}, "title": map[string]any{"type": "string"}},
	},
}

// Hooks holds the webhook subscriptions of one demo server.
type Hooks struct {
	// MaxTTL caps the lifetime granted; zero means 1 h.
	MaxTTL time.Duration
	// RetryBase is the wait before a delivery's first retry, doubled for
	// each later one; zero means 200 ms.
	RetryBase time.Duration
	// Client sends deliveries; nil means one with a 5 s timeout that
	// follows no redirect.
	Client *http.Client

	mu         sync.Mutex
	subs       map[string]*hookSub
	verified   map[string]bool // callback URLs that echoed a challenge
	log        []ticket        // escalations, for replay
	deliveries int
}

type hookSub struct {
	id, url    string
	secret     string
	prev       string // signs beside secret until prevUntil
	prevUntil  time.Time
	expires    time.Time
	acked      int64 // the cursor: last event acknowledged or given up
	queue      chan ticket
	stop       context.CancelFunc
	deliveries int
}

// NewHooks returns a Hooks with no subscriptions.
func NewHooks() *Hooks { return &Hooks{} }

// Deliveries is how many event deliveries were acknowledged.
func (h *Hooks) Deliveries() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deliveries
}

// Subscriptions is how many subscriptions are live.
func (h *Hooks) Subscriptions() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, s := range h.subs {
		if time.Now().Before(s.expires) {
			n++
		}
	}
	return n
}

func (h *Hooks) client() *http.Client {
	if h.Client != nil {
		return h.Client
	}
	return &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// raise queues an escalation for every live subscription.
func (h *Hooks) raise(t ticket) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.log = append(h.log, t)
	if len(h.log) > defaultRetain {
		h.log = h.log[len(h.log)-defaultRetain:]
	}
	for id, s := range h.subs {
		if time.Now().After(s.expires) {
			s.stop()
			delete(h.subs, id)
			continue
		}
		select {
		case s.queue <- t:
		default: // a stuck endpoint: the event is given up
		}
	}
}

type subscribeParams struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	Delivery  struct {
		Mode   string `json:"mode"`
		URL    string `json:"url"`
		Secret string `json:"secret"`
	} `json:"delivery"`
	Cursor *string `json:"cursor"`
	TTLMs  *int64  `json:"ttlMs"`
}

// handle answers events/subscribe and events/unsubscribe.
func (h *Hooks) handle(method string, raw json.RawMessage) (any, *mcp.JSONRPCErrorDetails) {
	var p subscribeParams
	if json.Unmarshal(raw, &p) != nil {
		return nil, invalidParams("params must be an object")
	}
	switch {
	case p.Name == EventTicketCreated:
		return nil, &mcp.JSONRPCErrorDetails{Code: codeUnsupported, Message: "Unsupported", Data: map[string]any{"feature": "deliveryMode", "value": "webhook"}}
	case p.Name != EventTicketEscalated:
		return nil, &mcp.JSONRPCErrorDetails{Code: codeNotFound, Message: "NotFound", Data: map[string]any{"kind": "event"}}
	case len(p.Arguments) > 0 && string(p.Arguments) != "null" && string(p.Arguments) != "{}":
		return nil, invalidParams("arguments: %s takes none", EventTicketEscalated)
	}
	if err := checkCallback(p.Delivery.URL); err != nil {
		return nil, invalidParams("delivery.url: %v", err)
	}
	id := hookID(p.Delivery.URL, p.Name)
	if method == "events/unsubscribe" {
		return h.unsubscribe(id)
	}
	if !validSecret(p.Delivery.Secret) {
		return nil, invalidParams("delivery.secret must be whsec_ followed by base64 of 24 to 64 bytes")
	}
	if rpcErr := h.verify(p.Delivery.URL, id, p.Delivery.Secret); rpcErr != nil {
		return nil, rpcErr
	}
	return h.subscribe(id, p), nil
}

func (h *Hooks) unsubscribe(id string) (any, *mcp.JSONRPCErrorDetails) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.subs[id]
	if !ok {
		return nil, &mcp.JSONRPCErrorDetails{Code: codeNotFound, Message: "NotFound", Data: map[string]any{"kind": "subscription"}}
	}
	s.stop()
	delete(h.subs, id)
	return map[string]any{}, nil
}

// subscribe creates or refreshes subscription id.
func (h *Hooks) subscribe(id string, p subscribeParams) map[string]any {
	maxTTL := h.MaxTTL
	if maxTTL <= 0 {
		maxTTL = defaultMaxTTL
	}
	ttl := maxTTL
	if p.TTLMs != nil && *p.TTLMs > 0 {
		ttl = min(time.Duration(*p.TTLMs)*time.Millisecond, maxTTL)
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = map[string]*hookSub{}
	}
	truncated := false
	s, live := h.subs[id]
	if live && now.After(s.expires) {
		s.stop()
		live = false
	}
	if live {
		if s.secret != p.Delivery.Secret {
			s.prev, s.prevUntil, s.secret = s.secret, now.Add(secretGrace), p.Delivery.Secret
		}
	} else {
		ctx, stop := context.WithCancel(context.Background())
		s = &hookSub{id: id, url: p.Delivery.URL, secret: p.Delivery.Secret, queue: make(chan ticket, defaultRetain), stop: stop, acked: h.head()}
		truncated = h.replay(s, p.Cursor)
		h.subs[id] = s
		go h.deliver(ctx, s)
	}
	s.expires = now.Add(ttl)
	return map[string]any{
		"id": id, "refreshBefore": s.expires.UTC().Format(time.RFC3339Nano),
		"cursor": strconv.FormatInt(s.acked, 10), "truncated": truncated,
	}
}

// head is the sequence number of the last escalation.
func (h *Hooks) head() int64 {
	if len(h.log) == 0 {
		return 0
	}
	return h.log[len(h.log)-1].seq
}

// replay queues the escalations after cursor for a new subscription; it
// reports whether some were no longer kept.
func (h *Hooks) replay(s *hookSub, cursor *string) bool {
	if cursor == nil {
		return false
	}
	from, err := strconv.ParseInt(*cursor, 10, 64)
	if err != nil || from < 0 {
		return false
	}
	s.acked = from
	for _, t := range h.log {
		if t.seq > from {
			s.queue <- t
		}
	}
	return len(h.log) > 0 && from < h.log[0].seq-1
}

// deliver posts s's events in order until s ends.
func (h *Hooks) deliver(ctx context.Context, s *hookSub) {
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-s.queue:
			ok := h.post(ctx, s, t)
			h.mu.Lock()
			s.acked = t.seq
			if ok {
				s.deliveries++
				h.deliveries++
			}
			h.mu.Unlock()
		}
	}
}

// post delivers one event, retrying with backoff; it reports whether the
// endpoint acknowledged it.
func (h *Hooks) post(ctx context.Context, s *hookSub, t ticket) bool {
	h.mu.Lock()
	cursor := strconv.FormatInt(s.acked, 10)
	h.mu.Unlock()
	body, _ := json.Marshal(map[string]any{
		"eventId": eventID(t.seq), "name": EventTicketEscalated, "timestamp": t.at.Format(time.RFC3339Nano),
		"data": map[string]any{"ticket": eventID(t.seq), "title": t.title}, "cursor": cursor,
	})
	wait := h.RetryBase
	if wait <= 0 {
		wait = defaultRetryBase
	}
	for range deliveryAttempts {
		status, _, err := h.send(ctx, s, eventID(t.seq), body)
		switch {
		case err == nil && status/100 == 2:
			return true
		case err == nil && (status == http.StatusGone || status == http.StatusRequestEntityTooLarge):
			return false // the endpoint does not want it retried
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait *= 2
	}
	return false
}

// send POSTs one signed body to s (every attempt signed anew) and returns
// the status and the body of the answer.
func (h *Hooks) send(ctx context.Context, s *hookSub, msgID string, body []byte) (int, []byte, error) {
	h.mu.Lock()
	secrets := []string{s.secret}
	if s.prev != "" && time.Now().Before(s.prevUntil) {
		secrets = append(secrets, s.prev)
	}
	target, id := s.url, s.id
	h.mu.Unlock()
	now := time.Now()
	var sigs []string
	for _, secret := range secrets {
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			return 0, nil, err
		}
		sig, err := wh.Sign(msgID, now, body)
		if err != nil {
			return 0, nil, err
		}
		sigs = append(sigs, sig)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(standardwebhooks.HeaderWebhookID, msgID)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, strings.Join(sigs, " "))
	req.Header.Set("X-MCP-Subscription-Id", id)
	resp, err := h.client().Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, answer, nil
}

// verify proves, once per URL, that the endpoint wants the deliveries: it
// must echo the challenge of a signed verification request.
func (h *Hooks) verify(target, id, secret string) *mcp.JSONRPCErrorDetails {
	h.mu.Lock()
	done := h.verified[target]
	h.mu.Unlock()
	if done {
		return nil
	}
	challenge := rand.Text()
	body, _ := json.Marshal(map[string]any{"type": "verification", "challenge": challenge})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	probe := &hookSub{id: id, url: target, secret: secret}
	status, answer, err := h.send(ctx, probe, "msg_verification_"+rand.Text(), body)
	if err != nil {
		reason := "connection_refused"
		if errors.Is(err, context.DeadlineExceeded) {
			reason = "timeout"
		}
		return &mcp.JSONRPCErrorDetails{Code: codeCallbackError, Message: "CallbackEndpointError", Data: map[string]any{"reason": reason}}
	}
	var echo struct {
		Challenge string `json:"challenge"`
	}
	if status/100 != 2 || json.Unmarshal(answer, &echo) != nil || subtle.ConstantTimeCompare([]byte(echo.Challenge), []byte(challenge)) != 1 {
		return &mcp.JSONRPCErrorDetails{Code: codeCallbackError, Message: "CallbackEndpointError", Data: map[string]any{"reason": "challenge_failed"}}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.verified == nil {
		h.verified = map[string]bool{}
	}
	h.verified[target] = true
	return nil
}

// checkCallback accepts an https URL, or http on a loopback host (the
// demo runs beside patchbay).
func checkCallback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.User != nil {
		return errors.New("must be an absolute https URL")
	}
	if u.Scheme == "https" {
		return nil
	}
	ip := net.ParseIP(u.Hostname())
	if u.Scheme == "http" && (u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback())) {
		return nil
	}
	return errors.New("must be https (http only to a loopback host)")
}

// validSecret reports whether s is whsec_ and base64 of 24 to 64 bytes.
func validSecret(s string) bool {
	b64, ok := strings.CutPrefix(s, "whsec_")
	if !ok {
		return false
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	return err == nil && len(b) >= 24 && len(b) <= 64
}

// hookID derives the subscription's id from its key (the principal is
// always the same here).
func hookID(url, name string) string {
	sum := sha256.Sum256([]byte(url + "\x00" + name + "\x00{}"))
	return "sub_" + hex.EncodeToString(sum[:8])
}
