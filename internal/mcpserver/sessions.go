package mcpserver

import (
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/authz"
)

// sessions binds each 2025-era session id to the caller that opened it,
// and keeps what the admin UI shows of every client: 2025-era sessions,
// and 2026-era clients (which have no session) by caller and client name,
// forgotten after idle. mcp-go keeps a session in the process that opened
// it, so this table is per process as well.
type sessions struct {
	mu   sync.Mutex
	byID map[string]*session
	// modern are the 2026-era clients, by caller and client name.
	modern map[string]*session
	idle   time.Duration
}

type session struct {
	principal string
	// caller is the principal with its allowlist, from the initialize
	// request; the list watch reads what it is offered.
	caller authz.Principal
	// tools is the digest of the tool names last offered (see watch.go).
	tools    string
	opened   time.Time
	client   string
	version  string
	era      string
	calls    int
	lastCall time.Time
}

// Session is one live MCP client as the admin UI lists it.
type Session struct {
	// ID is the 2025-era session id; "" for a 2026-era client.
	ID        string
	Principal string
	Client    string
	Version   string
	// Era is the protocol version the client speaks.
	Era      string
	Opened   time.Time
	Calls    int
	LastCall time.Time
}

func newSessions(idle time.Duration) *sessions {
	return &sessions{byID: map[string]*session{}, modern: map[string]*session{}, idle: idle}
}

// open binds a new session to its caller. The initialize hook (hello)
// runs before the response carrying the id is written, so the record
// may exist already, bound to no one.
func (t *sessions) open(id, principal string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.byID[id]
	if s == nil {
		s = &session{opened: time.Now()}
		t.byID[id] = s
	}
	s.principal = principal
}

// end forgets a session and says whose it was.
func (t *sessions) end(id string) (principal string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.byID[id]
	delete(t.byID, id)
	if !ok || s.principal == "" {
		return "", false
	}
	return s.principal, true
}

// hello records who the client says it is.
func (t *sessions) hello(id string, caller authz.Principal, client, version, era string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.byID[id]
	if s == nil {
		s = &session{opened: time.Now()}
		t.byID[id] = s
	}
	s.client, s.version, s.era, s.caller = client, version, era, caller
}

// called counts a tools/call of a session (id) or of a 2026-era client.
func (t *sessions) called(id, principal, client, version, era string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	s := t.byID[id]
	if id == "" {
		key := principal + "\x00" + client
		if s = t.modern[key]; s == nil {
			s = &session{principal: principal, opened: now, client: client, version: version, era: era}
			t.modern[key] = s
		}
	}
	if s == nil {
		return
	}
	s.calls++
	s.lastCall = now
}

// list is every live client, most recent call first.
func (t *sessions) list() []Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Session
	add := func(id string, s *session) {
		out = append(out, Session{ID: id, Principal: s.principal, Client: s.client, Version: s.version, Era: s.era,
			Opened: s.opened, Calls: s.calls, LastCall: s.lastCall})
	}
	for id, s := range t.byID {
		add(id, s)
	}
	for key, s := range t.modern {
		if time.Since(s.lastCall) > t.idle {
			delete(t.modern, key)
			continue
		}
		add("", s)
	}
	slices.SortFunc(out, func(a, b Session) int { return b.LastCall.Compare(a.LastCall) })
	return out
}

// ownedBy reports whether principal opened the session id. An id this
// process never opened is nobody's.
func (t *sessions) ownedBy(id, principal string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.byID[id]
	return ok && s.principal == principal
}

func (t *sessions) count(principal string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, s := range t.byID {
		if s.principal == principal {
			n++
		}
	}
	return n
}

// sessionCapture notes the session id an initialize response mints.
type sessionCapture struct {
	http.ResponseWriter
	opened func(id string)
	seen   bool
}

func (w *sessionCapture) WriteHeader(code int) {
	w.note()
	w.ResponseWriter.WriteHeader(code)
}

func (w *sessionCapture) Write(p []byte) (int, error) {
	w.note()
	return w.ResponseWriter.Write(p)
}

func (w *sessionCapture) note() {
	if w.seen {
		return
	}
	w.seen = true
	if id := w.Header().Get(server.HeaderKeySessionID); id != "" {
		w.opened(id)
	}
}

// Flush lets the transport stream through the capture.
func (w *sessionCapture) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *sessionCapture) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// live is every 2025-era session with the caller that opened it.
func (t *sessions) live() map[string]authz.Principal {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]authz.Principal, len(t.byID))
	for id, s := range t.byID {
		if s.principal != "" && s.caller.Name == s.principal {
			out[id] = s.caller
		}
	}
	return out
}

// offered records the digest of the tools a session is offered now and
// reports whether it differs from the last one recorded (the first
// record is no change: the client has just listed).
func (t *sessions) offered(id, digest string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.byID[id]
	if s == nil {
		return false
	}
	changed := s.tools != "" && s.tools != digest
	s.tools = digest
	return changed
}
