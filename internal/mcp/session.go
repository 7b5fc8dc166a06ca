package mcp

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/mark3labs/mcp-go/client"
)

// session is one MCP session with the server: the connection's own, opened
// at connect and used for discovery and for calls without per-call
// headers, or a tenant's, opened for one distinct set of per-call headers.
// Over 2026-07-28 a "session" holds no server state; it is still a client
// of its own, so one tenant's headers never ride on another's requests.
type session struct {
	client  *client.Client
	capture *capture
	wire    *wire // nil over stdio
	tenant  bool  // a tenant's: its failures fail that tenant's calls only
	// direct sends the session's tool calls without mcp-go's CallTool
	// (call.go); set over stdio, nil where mcp-go's path is kept.
	direct *directCall

	mu  sync.Mutex // serialises re-initialize
	gen int64      // counts re-initializes, under mu

	// lost is why a tenant's session can no longer be used (its event
	// stream went away or overflowed, the network failed under it); the
	// next call for that tenant opens a new one.
	lost      once
	closeOnce sync.Once
}

func (s *session) generation() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// close ends a tenant's session; the error is not interesting (mcp-go's
// HTTP transports log their own) and it may run more than once.
func (s *session) close() {
	s.closeOnce.Do(func() {
		if s.client != nil {
			_ = s.client.Close()
		}
	})
}

// maxTenants bounds the tenant sessions a connection keeps open; the least
// recently used is closed when another is needed.
const maxTenants = 64

// tenants keeps the sessions of a connection's tenants, by header-set key,
// least recently used last. A session in use by a call (refs > 0) is closed
// when that call ends if it was evicted meanwhile, so eviction never breaks
// a call in flight; Close of the connection closes every one at once.
type tenants struct {
	max int

	mu     sync.Mutex
	byKey  map[string]*tenant
	order  list.List // of *tenant, most recently used first
	closed bool
}

type tenant struct {
	key   string
	elem  *list.Element
	ready chan struct{} // closed when open has finished
	sess  *session      // set before ready closes, on success
	err   error         // set before ready closes, on failure
	refs  int
	gone  bool // no longer in byKey: close once refs is 0
}

// errTenantsClosed is a call that raced the connection's Close.
var errTenantsClosed = errors.New("connection closed")

// acquire returns the open session for key, opening it with open when
// there is none (or the last one was lost). Concurrent calls for one key
// share one open, which runs in its own goroutine bounded by its own
// context, so a caller that gives up does not fail the others. The caller
// must release the tenant.
func (ts *tenants) acquire(ctx context.Context, key string, open func() (*session, error)) (*tenant, error) {
	ts.mu.Lock()
	if ts.closed {
		ts.mu.Unlock()
		return nil, errTenantsClosed
	}
	if ts.byKey == nil {
		ts.byKey = map[string]*tenant{}
	}
	t := ts.byKey[key]
	if t != nil && t.sess != nil && t.sess.lost.get() != nil {
		ts.drop(t)
		t = nil
	}
	if t == nil {
		t = &tenant{key: key, ready: make(chan struct{})}
		ts.byKey[key] = t
		t.elem = ts.order.PushFront(t)
		for ts.order.Len() > ts.max {
			ts.drop(ts.order.Back().Value.(*tenant))
		}
		go ts.open(t, open)
	} else {
		ts.order.MoveToFront(t.elem)
	}
	t.refs++
	ts.mu.Unlock()

	select {
	case <-t.ready:
	case <-ctx.Done():
		ts.release(t)
		return nil, ctx.Err()
	}
	if t.err != nil {
		ts.release(t)
		return nil, t.err
	}
	return t, nil
}

func (ts *tenants) open(t *tenant, open func() (*session, error)) {
	sess, err := open()
	ts.mu.Lock()
	var stale *session
	if err == nil && ts.closed {
		// The connection closed while this session was opening.
		stale, sess, err = sess, nil, errTenantsClosed
	}
	t.sess, t.err = sess, err
	if err != nil && !t.gone {
		ts.drop(t) // the next call tries again
	}
	closeNow := sess != nil && t.gone && t.refs == 0
	ts.mu.Unlock()
	close(t.ready)
	if closeNow {
		sess.close()
	}
	if stale != nil {
		stale.close()
	}
}

// drop takes t out of the map; its session is closed now if no call uses
// it, else by the last release. Callers hold ts.mu.
func (ts *tenants) drop(t *tenant) {
	if t.gone {
		return
	}
	t.gone = true
	if ts.byKey[t.key] == t {
		delete(ts.byKey, t.key)
	}
	ts.order.Remove(t.elem)
	if t.refs == 0 && t.sess != nil {
		go t.sess.close() // a DELETE to the server: not under the lock
	}
}

// release ends a call's use of t.
func (ts *tenants) release(t *tenant) {
	ts.mu.Lock()
	t.refs--
	closeNow := t.gone && t.refs == 0 && t.sess != nil
	ts.mu.Unlock()
	if closeNow {
		t.sess.close()
	}
}

// lose drops t's session after a failure that leaves it unusable, so the
// next call for the tenant opens a new one.
func (ts *tenants) lose(t *tenant) {
	ts.mu.Lock()
	ts.drop(t)
	ts.mu.Unlock()
}

// len is the number of tenant sessions kept.
func (ts *tenants) len() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.byKey)
}

// closeAll closes every tenant session, in use or not, and refuses new
// ones; a session still opening is closed when its open finishes.
func (ts *tenants) closeAll() {
	ts.mu.Lock()
	ts.closed = true
	var open []*session
	for _, t := range ts.byKey {
		t.gone = true
		if t.sess != nil {
			open = append(open, t.sess)
		}
		// Still opening: open() sees gone and closes it once no call
		// holds it; a call that holds it fails on the closed client.
	}
	ts.byKey = nil
	ts.order.Init()
	ts.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range open {
		wg.Go(s.close)
	}
	wg.Wait()
}

// reservedHeaders are set by the transport itself; a per-call header may
// not replace them (mcp-go lets configured headers win over its own, so a
// tenant could otherwise pick another tenant's session or protocol).
var reservedHeaders = []string{
	"Accept", "Connection", "Content-Length", "Content-Type", "Host", "Last-Event-Id",
	"Mcp-Method", "Mcp-Name", "Mcp-Protocol-Version", "Mcp-Session-Id", "Transfer-Encoding",
}

// tenantHeaders is the header set of a tenant: the connection's configured
// headers overlaid by a call's resolved ones, names compared
// case-insensitively, and a key that names the set. Bad per-call headers
// are refused by name; values never appear in errors.
func tenantHeaders(configured, call map[string]string) (map[string]string, string, error) {
	merged := make(map[string]string, len(configured)+len(call))
	for k, v := range configured {
		merged[http.CanonicalHeaderKey(k)] = v
	}
	fromCall := map[string]bool{}
	for k, v := range call {
		name := http.CanonicalHeaderKey(k)
		switch {
		case !validHeaderName(k):
			return nil, "", fmt.Errorf("per-call header %q: not a valid header name", k)
		case strings.ContainsAny(v, "\r\n\x00"):
			return nil, "", fmt.Errorf("per-call header %s: the value holds a line break or NUL", name)
		case slices.Contains(reservedHeaders, name) || strings.HasPrefix(name, "Mcp-Param-"):
			return nil, "", fmt.Errorf("per-call header %s: set by the transport, not by a caller", name)
		case fromCall[name]:
			return nil, "", fmt.Errorf("per-call header %s: given twice (names are case-insensitive)", name)
		}
		fromCall[name] = true
		merged[name] = v
	}
	names := make([]string, 0, len(merged))
	for k := range merged {
		names = append(names, k)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, k := range names {
		// Lengths first, so no two sets encode alike.
		fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(merged[k]), merged[k])
	}
	return merged, hex.EncodeToString(h.Sum(nil)), nil
}

// validHeaderName reports whether name is an HTTP token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}
