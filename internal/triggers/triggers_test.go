package triggers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/triggers"
)

const echoWorkflow = `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"say","connection":"mem","op":"echo","args":{"text":{"$expr":"$input.text"},"event":{"$expr":"$input.connection_event.id"}}}}`

type bundle struct {
	st    *store.Store
	reg   *registry.Registry
	execs *harness.Executions
	svc   *triggers.Service
	mem   *connecttest.Memory
}

func baseFile() *config.File {
	return &config.File{
		Connections: map[string]config.Connection{
			"deploys": {Source: &config.Source{Events: map[string]any{
				"deploy.failed": map[string]any{"type": "object", "required": []any{"service"}, "properties": map[string]any{"service": map[string]any{"type": "string"}}},
				"deploy.ok":     true,
			}}},
			"morning": {Cron: &config.Cron{Schedule: "*/15 * * * *"}},
		},
		Triggers: []config.Trigger{{
			ID: "failures", Connection: "deploys", Event: "deploy.failed",
			Filter:   `event.payload.service != "ignored"`,
			Input:    map[string]any{"text": map[string]any{"$expr": `"deploy of " + event.payload.service + " failed"`}},
			Document: json.RawMessage(echoWorkflow),
		}},
		Inbox: &config.Inbox{ReclaimAfter: time.Second},
	}
}

// setup builds a service over st (a fresh store when nil) with a Memory
// connection "mem" and two execution workers.
func setup(t *testing.T, st *store.Store, f *config.File, now func(context.Context) (time.Time, error)) *bundle {
	t.Helper()
	return setupWith(t, st, f, now, nil)
}

// setupWith is setup with providers of its own for some connections (an
// MCP server's stand-in).
func setupWith(t *testing.T, st *store.Store, f *config.File, now func(context.Context) (time.Time, error), providers map[string]connect.Provider) *bundle {
	t.Helper()
	if st == nil {
		st = storetest.New(t)
	}
	mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})
	reg := registry.NewRegistry(nil)
	if err := reg.Add("mem", mem); err != nil {
		t.Fatal(err)
	}
	for name, c := range f.Connections {
		p := providers[name]
		if p == nil {
			p = triggers.NewProvider(name, c)
		}
		if err := reg.Add(name, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := reg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	execs := harness.NewExecutions(st, reg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, 2); close(done) }()
	svc, err := triggers.New(triggers.Options{Store: st, Executions: execs, Registry: reg, File: f, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(); cancel(); <-done })
	return &bundle{st: st, reg: reg, execs: execs, svc: svc, mem: mem}
}

func failed(id, service string) triggers.Event {
	return triggers.Event{Type: "deploy.failed", ID: id, Payload: map[string]any{"service": service}}
}

// waitFor polls cond until it holds or 15 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func status(t *testing.T, b *bundle) *triggers.Status {
	t.Helper()
	st, err := b.svc.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func trigger(st *triggers.Status, id string) triggers.TriggerStatus {
	for _, tr := range st.Triggers {
		if tr.ID == id {
			return tr
		}
	}
	return triggers.TriggerStatus{}
}

func allExecutions(t *testing.T, execs *harness.Executions) []*harness.Execution {
	t.Helper()
	var out []*harness.Execution
	cursor := ""
	for {
		page, err := execs.List(context.Background(), harness.ListOptions{Limit: 100, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, page.Items...)
		if page.Next == "" {
			return out
		}
		cursor = page.Next
	}
}

func eventID(ex *harness.Execution) string {
	in, _ := ex.Input.(map[string]any)
	ev, _ := in["connection_event"].(map[string]any)
	id, _ := ev["id"].(string)
	return id
}

func TestSameEventConcurrentlyStartsOneTurn(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		b := setup(t, st, baseFile(), nil)
		ctx := context.Background()
		var fresh, dups atomic.Int32
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				res, err := b.svc.Emit(ctx, "deploys", failed("run-42", "api"), triggers.Via{Kind: "api"})
				if err != nil {
					t.Error(err)
					return
				}
				if res.Duplicate {
					dups.Add(1)
				} else {
					fresh.Add(1)
				}
			})
		}
		wg.Wait()
		if fresh.Load() != 1 || dups.Load() != 19 {
			t.Fatalf("accepted %d, duplicates %d; want 1 and 19", fresh.Load(), dups.Load())
		}
		if err := b.svc.Start(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the turn to finish", func() bool { return trigger(status(t, b), "failures").Counts.Succeeded == 1 })
		exs := allExecutions(t, b.execs)
		if len(exs) != 1 || eventID(exs[0]) != "run-42" {
			t.Fatalf("executions = %d (%v), want one for run-42", len(exs), exs)
		}
		in := exs[0].Input.(map[string]any)
		if in["text"] != "deploy of api failed" {
			t.Errorf("input = %v", in)
		}
		ev := in["connection_event"].(map[string]any)
		if ev["connection"] != "deploys" || ev["type"] != "deploy.failed" || ev["thread"] != "failures" {
			t.Errorf("connection_event = %v", ev)
		}
		s := status(t, b)
		c := trigger(s, "failures").Counts
		if c.Received != 1 || c.Duplicate != 19 || c.Delivered != 1 || c.Succeeded != 1 {
			t.Errorf("counts = %+v", c)
		}
		if len(s.Inboxes) == 0 || s.Inboxes[0].Depth != 0 || s.LastEventAt == nil {
			t.Errorf("inboxes = %+v", s.Inboxes)
		}
		// The same event again, after its turn: still a duplicate.
		if res, err := b.svc.Emit(ctx, "deploys", failed("run-42", "api"), triggers.Via{Kind: "api"}); err != nil || !res.Duplicate {
			t.Errorf("repeat after the turn: %+v, %v", res, err)
		}
	})
}

func TestDeliveryFilterAndValidation(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		b := setup(t, st, baseFile(), nil)
		ctx := context.Background()
		if err := b.svc.Start(ctx); err != nil {
			t.Fatal(err)
		}
		for i := range 30 {
			svc := "api"
			if i%3 == 0 {
				svc = "ignored"
			}
			if _, err := b.svc.Emit(ctx, "deploys", failed(fmt.Sprintf("e%d", i), svc), triggers.Via{Kind: "api"}); err != nil {
				t.Fatal(err)
			}
		}
		if res, err := b.svc.Emit(ctx, "deploys", triggers.Event{Type: "deploy.ok", ID: "ok1"}, triggers.Via{Kind: "api"}); err != nil || len(res.Triggers) != 0 {
			t.Errorf("deploy.ok: %+v %v", res, err)
		}
		waitFor(t, "20 turns", func() bool { return trigger(status(t, b), "failures").Counts.Succeeded == 20 })
		if n := len(allExecutions(t, b.execs)); n != 20 {
			t.Errorf("executions = %d, want 20", n)
		}
		calls := b.mem.Calls()
		if len(calls) != 20 || calls[0].Args["text"] == "" {
			t.Errorf("calls = %v", calls)
		}

		// Validation against the event's schema, and unknown types.
		var ee *triggers.EventError
		_, err := b.svc.Emit(ctx, "deploys", triggers.Event{Type: "deploy.failed", ID: "x", Payload: map[string]any{"service": 3}}, triggers.Via{Kind: "api"})
		if !errors.As(err, &ee) || ee.Problems[0].Path != "/payload/service" {
			t.Errorf("schema: %v", err)
		}
		_, err = b.svc.Emit(ctx, "deploys", triggers.Event{Type: "deploy.unknown", ID: "x"}, triggers.Via{Kind: "api"})
		if !errors.As(err, &ee) || ee.Problems[0].Path != "/type" {
			t.Errorf("type: %v", err)
		}
		if _, err = b.svc.Emit(ctx, "nope", failed("x", "a"), triggers.Via{Kind: "api"}); !errors.Is(err, triggers.ErrUnknownSource) {
			t.Errorf("unknown source: %v", err)
		}
		if _, err = b.svc.Emit(ctx, "morning", triggers.Event{Type: "tick", ID: "x"}, triggers.Via{Kind: "api"}); !errors.Is(err, triggers.ErrUnknownSource) {
			t.Errorf("push to cron: %v", err)
		}
		recs, err := b.svc.Deliveries(ctx, "deploys", 5)
		if err != nil || len(recs) != 5 || recs[0].EventID != "ok1" || recs[0].Outcome != "accepted" {
			t.Errorf("deliveries = %+v, %v", recs, err)
		}
	})
}

func TestDeadLetterAndRedeliver(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		f := baseFile()
		// An input that fails for service "bad": never deliverable.
		f.Triggers[0].Input = map[string]any{"text": map[string]any{"$expr": `event.payload.service == "bad" ? string(int(event.payload.service)) : "fine"`}}
		b := setup(t, st, f, nil)
		ctx := context.Background()
		if err := b.svc.Start(ctx); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"good", "poison"} {
			svc := map[string]string{"good": "api", "poison": "bad"}[id]
			if _, err := b.svc.Emit(ctx, "deploys", failed(id, svc), triggers.Via{Kind: "api"}); err != nil {
				t.Fatal(err)
			}
		}
		var dls []triggers.DeadLetter
		waitFor(t, "a dead letter", func() bool {
			var err error
			dls, err = b.svc.DeadLetters(ctx)
			return err == nil && len(dls) == 1
		})
		if dls[0].Event.ID != "poison" || dls[0].Trigger != "failures" || dls[0].Reason == "" {
			t.Errorf("dead letter = %+v", dls[0])
		}
		waitFor(t, "the good turn", func() bool { return trigger(status(t, b), "failures").Counts.Succeeded == 1 })
		if _, err := b.svc.Redeliver(ctx, "deploys:0-0"); !errors.Is(err, triggers.ErrDeadLetterNotFound) {
			t.Errorf("redeliver unknown: %v", err)
		}
		if _, err := b.svc.Redeliver(ctx, dls[0].ID); err != nil {
			t.Fatal(err)
		}
		// Still poison: dead again, under a new entry id.
		waitFor(t, "the redelivered dead letter", func() bool {
			d, err := b.svc.DeadLetters(ctx)
			return err == nil && len(d) == 1 && d[0].ID != dls[0].ID
		})
		c := trigger(status(t, b), "failures").Counts
		if c.Dead != 2 || c.Redelivered != 1 {
			t.Errorf("counts = %+v", c)
		}
	})
}
