package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestLedgerOfAnOlderRecord: a record written before the ledger had a hash
// of its own (its entries inside the record) loads with its entries, and
// the first save of a run over it moves them to the hash, so nothing it
// recorded is lost to the new shape.
func TestLedgerOfAnOlderRecord(t *testing.T) {
	t.Parallel()
	e := newSubmitExecutions(t, storetest.New(t))
	ctx := t.Context()
	done := StepRecord{Key: "c", ID: "c", Kind: document.KindCall, Connection: "mem", Op: "echo", Status: StepDone,
		IdempotencyKey: "ex_old:c", Output: map[string]any{"x": 1.0}, StartedAt: time.Now().UTC()}
	old := &record{Execution: Execution{ID: "ex_old", Status: ExecRunning, Steps: []StepRecord{done}, CreatedAt: time.Now().UTC()},
		Workflow: json.RawMessage(echoDoc)}
	data, err := marshalRecord(old)
	must(t, err)
	must(t, e.store.Client.Set(ctx, e.recordKey("ex_old"), data, e.retention).Err())

	rec, err := e.load(ctx, "ex_old")
	must(t, err)
	if len(rec.Steps) != 1 || rec.Steps[0].Status != StepDone || rec.Steps[0].IdempotencyKey != "ex_old:c" {
		t.Fatalf("steps of an older record = %+v", rec.Steps)
	}
	epoch, err := e.claim(ctx, "ex_old", "a")
	must(t, err)
	r := &run{e: e, rec: rec, epoch: epoch}
	r.enter(&document.Node{ID: "d", Kind: document.KindCall}, "d", "mem")
	must(t, r.save(ctx))

	n, err := e.store.Client.HLen(ctx, e.ledgerKey("ex_old")).Result()
	must(t, err)
	if n != 2 {
		t.Fatalf("ledger hash has %d entries, want the older one and the new one", n)
	}
	got, err := e.Get(ctx, "ex_old")
	must(t, err)
	if len(got.Steps) != 2 || got.Steps[0].Key != "c" || got.Steps[0].Output == nil || got.Steps[1].Key != "d" {
		t.Fatalf("steps after a save = %+v", got.Steps)
	}
	if ttl := e.store.Client.PTTL(ctx, e.ledgerKey("ex_old")).Val(); ttl <= 0 {
		t.Fatalf("ledger hash expiry = %s, want the retention", ttl)
	}
}

// TestSaveWritesWhatChanged: a step's save writes its own entry, not the
// whole record: another entry and the head are left as they are in Redis.
func TestSaveWritesWhatChanged(t *testing.T) {
	t.Parallel()
	e := newSubmitExecutions(t, storetest.New(t))
	ctx := t.Context()
	r := claimedRun(t, e, "ex_diff")
	ex := &r.rec.Execution
	r.rec.Status = ExecRunning
	r.enter(&document.Node{ID: "a", Kind: document.KindCall}, "a", "mem")
	r.enter(&document.Node{ID: "b", Kind: document.KindCall}, "b", "mem")
	must(t, r.save(ctx))

	// Marks in Redis that a whole-record write would overwrite.
	must(t, e.store.Client.HSet(ctx, e.ledgerKey(ex.ID), "0", `{"key":"a","id":"a","status":"marked","startedAt":"2026-01-01T00:00:00Z","durationMs":0}`).Err())
	head := e.store.Client.Get(ctx, e.recordKey(ex.ID)).Val()
	r.update("b", func(st *StepRecord) { st.Status = StepDone })
	must(t, r.save(ctx))

	got, err := e.Get(ctx, ex.ID)
	must(t, err)
	if got.Steps[0].Status != "marked" || got.Steps[1].Status != StepDone {
		t.Fatalf("entries = %s, %s; want the untouched one as it was and the changed one written", got.Steps[0].Status, got.Steps[1].Status)
	}
	if now := e.store.Client.Get(ctx, e.recordKey(ex.ID)).Val(); now != head {
		t.Fatalf("head rewritten by a step's save:\n%s\n%s", head, now)
	}

	// Dropping entries (a replaced connection's results rerun live)
	// rewrites the hash.
	r.mu.Lock()
	r.truncate(1)
	r.mu.Unlock()
	must(t, r.save(ctx))
	if got, _ := e.Get(ctx, ex.ID); len(got.Steps) != 1 || got.Steps[0].Key != "a" {
		t.Fatalf("after truncate: %+v", got.Steps)
	}
}

// TestDoneRidesWithTheNextSave: a call's done entry costs no round trip of
// its own — it reaches Redis with the next call's pending entry, its
// finished event before the next started one — and, when no save follows,
// a timer writes it within moments. A timer's save that is fenced fails
// the run's next save.
func TestDoneRidesWithTheNextSave(t *testing.T) {
	t.Parallel()
	e := newSubmitExecutions(t, storetest.New(t))
	ctx := t.Context()
	r := claimedRun(t, e, "ex_soon")
	ex := &r.rec.Execution
	status := func(i int) string {
		t.Helper()
		got, err := e.Get(ctx, ex.ID)
		must(t, err)
		if i >= len(got.Steps) {
			return ""
		}
		return got.Steps[i].Status
	}
	pend := func(id string) {
		t.Helper()
		r.beginHeld(&document.Node{ID: id, Kind: document.KindCall}, id, "mem")
		r.update(id, func(st *StepRecord) { st.Status = StepPending })
		must(t, r.save(ctx))
	}

	pend("a")
	_, err := r.done(ctx, "a", &document.Node{ID: "a"}, map[string]any{"x": 1.0})
	must(t, err)
	if got := status(0); got != StepPending {
		t.Fatalf("a's entry right after done = %s, want it still pending in Redis (no round trip of its own)", got)
	}
	pend("b")
	if a, b := status(0), status(1); a != StepDone || b != StepPending {
		t.Fatalf("after b's pending save: a %s, b %s; want done and pending from one save", a, b)
	}
	r.mu.Lock()
	armed := r.soonArmed
	r.mu.Unlock()
	if armed {
		t.Fatal("the timer is still armed after a save took what it held: it would wake for an empty save")
	}
	var order []string
	for _, m := range e.store.Client.XRange(ctx, e.eventsKey(ex.ID), "-", "+").Val() {
		var d map[string]any
		_ = json.Unmarshal([]byte(m.Values["data"].(string)), &d)
		order = append(order, m.Values["type"].(string)+":"+fmt.Sprint(d["key"]))
	}
	if want := []string{EventStepStarted + ":a", EventStepFinished + ":a", EventStepStarted + ":b"}; !slices.Equal(order[len(order)-3:], want) {
		t.Fatalf("events = %v, want them to end %v", order, want)
	}

	// No save follows b's done: the timer writes it.
	_, err = r.done(ctx, "b", &document.Node{ID: "b"}, nil)
	must(t, err)
	for deadline := time.Now().Add(2 * time.Second); status(1) != StepDone; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b's done entry never reached Redis without a save after it")
		}
	}

	// Taken over meanwhile (another runner's epoch): the timer's save is
	// refused, and so is the run's next one.
	pend("c")
	must(t, e.store.Client.Incr(ctx, e.epochKey(ex.ID)).Err())
	_, _ = r.done(ctx, "c", &document.Node{ID: "c"}, nil)
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		r.mu.Lock()
		broken := r.broken
		r.mu.Unlock()
		if broken != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a fenced timer save left no error for the run")
		}
	}
	if err := r.save(ctx); !errors.Is(err, ErrFenced) {
		t.Fatalf("save after a fenced timer save = %v, want ErrFenced", err)
	}
}

// claimedRun submits the echo document as id, claims it and returns its
// run, as a worker would start it.
func claimedRun(t *testing.T, e *Executions, id string) *run {
	t.Helper()
	ctx := t.Context()
	ex, err := e.enqueue(ctx, id, []byte(echoDoc), nil, "t")
	must(t, err)
	epoch, err := e.claim(ctx, ex.ID, "a")
	must(t, err)
	rec, err := e.load(ctx, ex.ID)
	must(t, err)
	return &run{e: e, rec: rec, epoch: epoch}
}
