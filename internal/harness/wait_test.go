package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// setupWait has a connection "app" whose "ship" operation causes a
// "deploy.done" event at once (before its call returns), as a real action
// causes a webhook.
func setupWait(t *testing.T) *harness.Executions {
	t.Helper()
	var execs *harness.Executions
	mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "ship"}, Fn: func(ctx context.Context, a map[string]any) (any, error) {
		svc, _ := a["service"].(string)
		err := execs.AppendEvent(ctx, harness.ConnEvent{Connection: "app", Type: "deploy.done", ID: "ev-" + svc, Payload: map[string]any{"service": svc}, ReceivedAt: time.Now()})
		return map[string]any{"shipped": svc}, err
	}})
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("app", mem))
	must(t, reg.Start(context.Background()))
	st := storetest.New(t)
	execs = startWorkers(t, st, reg, 2, "all", `{"connections":{"app":{"ops":["*"],"events":["deploy.*"]}}}`, harness.ExecutionsOptions{})
	return execs
}

func TestWait(t *testing.T) {
	t.Parallel()
	execs := setupWait(t)
	const entry = `"connections":{"app":{"events":["deploy.done"]}}`
	t.Run("the event the around step causes is not missed", func(t *testing.T) {
		ex := runDocAs(t, execs, `{"version":1,`+entry+`,"root":{"kind":"wait","id":"w","connection":"app","event":"deploy.done",
			"filter":"$event.payload.service == 'api'","around":{"ship":{"service":"api"}},"timeoutMs":5000}}`, "all")
		if ex.Status != harness.ExecSucceeded {
			t.Fatalf("status %s %+v", ex.Status, ex.Error)
		}
		out := ex.Output.(map[string]any)
		if out["event"].(map[string]any)["id"] != "ev-api" || out["around"].(map[string]any)["shipped"] != "api" {
			t.Fatalf("output = %v", out)
		}
	})
	t.Run("a filtered-out event does not end the wait", func(t *testing.T) {
		ex := runDocAs(t, execs, `{"version":1,`+entry+`,"root":{"kind":"wait","id":"w","connection":"app","event":"deploy.done",
			"filter":"$event.payload.service == 'db'","around":[{"ship":{"service":"web"}}],"timeoutMs":300}}`, "all")
		if ex.Status != harness.ExecFailed || ex.Error.Code != "step_failed" || !strings.Contains(ex.Error.Message, "within") {
			t.Fatalf("got %s %+v, want step_failed after the timeout", ex.Status, ex.Error)
		}
	})
	t.Run("an undeclared event fails validation", func(t *testing.T) {
		_, err := execs.Submit(context.Background(), harness.Request{Allowlist: "all", Workflow: json.RawMessage(`{"version":1,"connections":{"app":{}},"root":{"kind":"wait","id":"w","connection":"app","event":"deploy.done"}}`)})
		var ve *fault.ValidationError
		if !errors.As(err, &ve) || ve.Problems[0].Path != "/workflow/root/event" {
			t.Fatalf("Submit = %v", err)
		}
	})
	t.Run("an event the allowlist does not grant", func(t *testing.T) {
		_, err := execs.Submit(context.Background(), harness.Request{Allowlist: "all", Workflow: json.RawMessage(`{"version":1,"connections":{"app":{"events":["build.done"]}},"root":{"kind":"wait","id":"w","connection":"app","event":"build.done"}}`)})
		var ve *fault.ValidationError
		if !errors.As(err, &ve) || ve.Code() != gates.CodeConnectionNotAllowed {
			t.Fatalf("Submit = %v", err)
		}
	})
}
