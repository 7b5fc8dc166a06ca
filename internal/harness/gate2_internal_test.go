package harness

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// Cancelling an execution whose call waits at gate 2 for a compile that
// does not end stops the execution at once, cancelled, not refused.
func TestCancelStopsAGate2Wait(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	reg := registry.NewRegistry(nil)
	if err := reg.Add("mem", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`)}})); err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	als := gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist("all", []byte(`{"connections":{"mem":{"ops":["*"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := als.Put(t.Context(), al, "tester"); err != nil {
		t.Fatal(err)
	}
	e := NewExecutions(st, reg, &ExecutionsOptions{Allowlists: als, SchemaCompileTimeout: time.Hour})
	started, release := make(chan struct{}, 16), make(chan struct{})
	defer close(release)
	e.pipeline = gates.New(gates.Options{Redactor: e.redactor, Logger: e.logger, SchemaCompileTimeout: time.Hour,
		Compile: func(string, connect.Operation) (*jsonschema.Schema, error) {
			started <- struct{}{}
			<-release
			return nil, nil
		}})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx, 1); close(done) }()
	t.Cleanup(func() { stop(); <-done })

	ex, err := e.Submit(t.Context(), Request{Workflow: json.RawMessage(echoDoc), Principal: "tester", Allowlist: "all"})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	start := time.Now()
	if _, err := e.Cancel(t.Context(), ex.ID); err != nil {
		t.Fatal(err)
	}
	got, err := e.Wait(t.Context(), ex.ID, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != ExecCancelled {
		t.Fatalf("status %s %+v, want cancelled", got.Status, got.Error)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("cancelled after %s", took)
	}
	t.Logf("cancelled %s after Cancel", time.Since(start))
}
