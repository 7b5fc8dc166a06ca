package harness

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"
)

// handoff passes an execution that finished in this process to the waiters
// here (Wait), so that a POST with "wait" — whose execution a worker of the
// same process usually runs — is answered from the run's own record
// instead of reading back what the run has just written. A run on another
// replica is still seen through the done channel and a read.
//
// The record handed over is the run's in memory after its last save
// succeeded: what Redis holds, entry for entry. Its outputs are made what
// a read would give (a JSON round trip of those values alone: a run holds
// an int64 where a read gives a float64), so a waiter cannot tell a
// hand-over from a read. Each waiter gets a copy of its own, with its own
// ledger slice; the input is shared, and nothing writes it.
type handoff struct {
	mu      sync.Mutex
	running map[string]int // runs of an execution in this process
	waiting map[string][]chan *Execution
}

// begin notes a run of id in this process; end must follow.
func (h *handoff) begin(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.running == nil {
		h.running = map[string]int{}
	}
	h.running[id]++
}

// end notes that a run of id here ended and gives each waiter a copy of
// the execution it finished, or nil when it did not finish it (it waits
// for a person, lost its claim, could not save): the waiter reads. The
// run stops counting and its waiters get their copies at once, so a
// waiter that hears the done channel and finds no run here finds its copy.
func (h *handoff) end(id string, finished *Execution) {
	h.mu.Lock()
	want := len(h.waiting[id]) > 0
	h.mu.Unlock()
	var read *Execution
	if want && finished != nil {
		read, _ = asRead(finished) // nil when it cannot be: the waiters read
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.running[id]--; h.running[id] <= 0 {
		delete(h.running, id)
	}
	for _, ch := range h.waiting[id] {
		var c *Execution
		if read != nil {
			cp := *read
			cp.Steps = slices.Clone(read.Steps)
			c = &cp
		}
		ch <- c // buffered: one delivery per registration
	}
	delete(h.waiting, id)
}

// asRead is ex with its outputs as a read of the saved record decodes
// them; nil for nil.
func asRead(ex *Execution) (*Execution, error) {
	if ex == nil {
		return nil, nil
	}
	c := *ex
	c.Steps = slices.Clone(ex.Steps)
	var err error
	if c.Output, err = decoded(c.Output); err != nil {
		return nil, err
	}
	for i := range c.Steps {
		if c.Steps[i].Output, err = decoded(c.Steps[i].Output); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

// decoded is v encoded and decoded again.
func decoded(v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	err = json.Unmarshal(data, &out)
	return out, err
}

// runsHere reports whether a run of id is under way in this process: its
// end will reach the waiters.
func (h *handoff) runsHere(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.running[id] > 0
}

// expect registers a waiter for the end of id's next run here; stop
// unregisters it.
func (h *handoff) expect(id string) (ended <-chan *Execution, stop func()) {
	ch := make(chan *Execution, 1)
	h.mu.Lock()
	if h.waiting == nil {
		h.waiting = map[string][]chan *Execution{}
	}
	h.waiting[id] = append(h.waiting[id], ch)
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		rest := slices.DeleteFunc(h.waiting[id], func(c chan *Execution) bool { return c == ch })
		if len(rest) == 0 {
			delete(h.waiting, id)
			return
		}
		h.waiting[id] = rest
	}
}

// ending is a waiter's ears for the end of one execution: the run here
// handing its record over (handoff) and the done channel (a run on another
// replica).
type ending struct {
	id       string
	f        *handoff
	here     <-chan *Execution
	unexpect func()
	done     <-chan struct{}
	stop     func()
	expiry   *time.Timer // set while it waits to be taken (awaited)
}

// listenEnd starts listening for id's end, here and elsewhere.
func (e *Executions) listenEnd(ctx context.Context, id string) *ending {
	here, unexpect := e.finished.expect(id)
	done, stop := e.notify.listen(ctx, e.doneKey(id))
	return &ending{id: id, f: &e.finished, here: here, unexpect: unexpect, done: done, stop: stop}
}

// again expects the end of the next run here, after one that ended
// without finishing.
func (n *ending) again() {
	n.unexpect()
	n.here, n.unexpect = n.f.expect(n.id)
}

func (n *ending) release() {
	n.unexpect()
	n.stop()
}

// awaitHold bounds how long the ears a Submit with Await opened wait for
// their Wait.
const awaitHold = time.Minute

// hold keeps n for the Wait that follows a Submit with Await.
func (e *Executions) hold(n *ending) {
	n.expiry = time.AfterFunc(awaitHold, func() {
		if e.awaited.CompareAndDelete(n.id, n) {
			n.release()
		}
	})
	e.awaited.Store(n.id, n)
}

// taken returns the ears a Submit with Await opened for id, if any.
func (e *Executions) taken(id string) *ending {
	v, ok := e.awaited.LoadAndDelete(id)
	if !ok {
		return nil
	}
	n := v.(*ending)
	n.expiry.Stop()
	return n
}
