package harness

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// allowlistFresh bounds how long a copy of an allowlist is used without
// reading it again. Changes are announced (gates.Allowlists.ChangedChannel)
// and drop every copy at once; the bound backs up an announcement lost to
// a dropped subscription.
const allowlistFresh = time.Second

// allowlistCopies keeps the allowlists submits and runs are checked
// against, decoded, so that a submit does not read and decode its
// allowlist each time. A copy is dropped when a change is announced by any
// process, when this process changed an allowlist since it was taken
// (read-your-writes, before the announcement comes back), and after
// allowlistFresh. Copies are shared and read-only: nothing writes an
// *Allowlist it was given.
type allowlistCopies struct {
	start   sync.Once
	hearing atomic.Bool // the announcements are subscribed to
	mu      sync.Mutex
	heard   uint64 // announcements heard, and subscriptions made again
	items   map[string]allowlistCopy
}

type allowlistCopy struct {
	al           *gates.Allowlist // nil: there is none of that name
	heard, local uint64
	at           time.Time
}

// allowlist returns the named allowlist, nil when there is none (an
// unknown or empty name grants nothing).
func (e *Executions) allowlist(ctx context.Context, name string) (*gates.Allowlist, error) {
	if e.allowlists == nil || name == "" {
		return nil, nil
	}
	c := &e.copies
	c.start.Do(func() { e.hearChanges() })
	local := e.allowlists.Changes()
	c.mu.Lock()
	heard := c.heard
	if it, ok := c.items[name]; ok && it.heard == heard && it.local == local && time.Since(it.at) < allowlistFresh {
		c.mu.Unlock()
		return it.al, nil
	}
	c.mu.Unlock()
	al, err := e.allowlists.Get(ctx, name)
	if errors.Is(err, gates.ErrAllowlistNotFound) {
		al, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	// Kept only when nothing changed while it was read.
	if c.heard == heard && c.hearing.Load() {
		if c.items == nil {
			c.items = map[string]allowlistCopy{}
		}
		c.items[name] = allowlistCopy{al: al, heard: heard, local: local, at: time.Now()}
	}
	c.mu.Unlock()
	return al, nil
}

// hearChanges subscribes to the announcements of allowlist changes and
// drops every copy at each (and when the subscription is made again after
// a lost connection, when announcements may have been missed), for the
// life of the process.
// Copies are kept only once the subscription is made (watch waits for
// Redis to confirm it, off the submit's path).
func (e *Executions) hearChanges() {
	go func() {
		changed, _ := e.notify.watch(context.Background(), e.allowlists.ChangedChannel())
		e.copies.hearing.Store(true)
		for range changed {
			e.copies.mu.Lock()
			e.copies.heard++
			clear(e.copies.items)
			e.copies.mu.Unlock()
		}
	}()
}
