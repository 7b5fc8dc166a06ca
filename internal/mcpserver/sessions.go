package mcpserver

import (
	"net/http"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/server"
)

// sessions binds each 2025-era session id to the caller that opened it.
// mcp-go keeps a session in the process that opened it, so this table is
// per process as well.
type sessions struct {
	mu   sync.Mutex
	byID map[string]*session
}

type session struct {
	principal string
	opened    time.Time
}

func newSessions() *sessions { return &sessions{byID: map[string]*session{}} }

func (t *sessions) open(id, principal string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byID[id] = &session{principal: principal, opened: time.Now()}
}

func (t *sessions) end(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.byID, id)
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
