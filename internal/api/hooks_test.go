package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/seal"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/triggers"
	"github.com/patchbay-dev/patchbay/internal/webhooks"
)

const hookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// triggerParts builds the trigger service and webhook receiver the API
// tests serve: a source "deploys" taking webhooks, and a trigger that
// echoes on mem (and fails to build its input for service "poison", to
// make a dead letter); and an MCP connection "tickets" whose server would
// deliver its events to /hooks/tickets by webhook (never started here).
func triggerParts(t testing.TB, st *store.Store, execs *harness.Executions, reg *registry.Registry) (*triggers.Service, *webhooks.Receiver) {
	t.Helper()
	f := &config.File{
		Connections: map[string]config.Connection{
			"deploys": {
				Source: &config.Source{Events: map[string]any{
					"deploy.failed": map[string]any{"type": "object", "required": []any{"service"}, "properties": map[string]any{"service": map[string]any{"type": "string"}}},
				}},
				Webhooks: &config.Webhooks{Secrets: []string{"whsec_" + "c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24tMTIzNA==", hookSecret}},
			},
			"tickets": {MCP: &config.MCP{URL: "http://127.0.0.1:1/mcp", Subscribe: []config.EventSubscription{{Event: "ticket.escalated"}}}},
		},
		Triggers: []config.Trigger{{
			ID: "failures", Connection: "deploys", Event: "deploy.failed",
			Input:    map[string]any{"text": map[string]any{"$expr": `event.payload.service == "poison" ? string(int(event.payload.service)) : event.payload.service`}},
			Document: json.RawMessage(`{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"say","connection":"mem","op":"echo","args":{"text":{"$expr":"$input.text"}}}}`),
		}},
	}
	box, err := seal.New(make([]byte, 32), "", "api test hooks", "test\x00")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := triggers.New(triggers.Options{Store: st, Executions: execs, Registry: reg, File: f, PublicURL: "https://patchbay.example.com", Seal: box})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	recv, err := webhooks.New(f.Connections, svc, nil)
	if err != nil {
		t.Fatal(err)
	}
	return svc, recv
}

// signed returns the headers of a Standard Webhook for body.
func signed(t testing.TB, secret, id string, at time.Time, body string) []string {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := wh.Sign(id, at, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return []string{"webhook-id", id, "webhook-timestamp", strconv.FormatInt(at.Unix(), 10), "webhook-signature", sig}
}

func deployFailed(id, service string) string {
	return fmt.Sprintf(`{"type":"deploy.failed","id":%q,"payload":{"service":%q}}`, id, service)
}

// exerciseTriggers drives every trigger route, checking each answer
// against openapi.yaml through b.do.
func exerciseTriggers(t *testing.T, b *bundle) {
	t.Helper()
	const jsonCT = "application/json"
	body := deployFailed("evt-1", "api")
	h := signed(t, hookSecret, "msg_1", time.Now(), body)
	if r := b.do(t, "POST", "/hooks/deploys", jsonCT, body, h...); r.status != 204 {
		t.Fatalf("webhook = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/hooks/deploys", jsonCT, body, h...); r.status != 200 || r.json(t)["status"] != "duplicate" {
		t.Fatalf("repeated webhook = %d %s", r.status, r.body)
	}
	bad := append([]string{}, h...)
	bad[5] = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
	if r := b.do(t, "POST", "/hooks/deploys", jsonCT, deployFailed("evt-2", "api"), bad...); r.status != 401 || r.json(t)["code"] != webhooks.CodeBadSignature {
		t.Fatalf("bad signature = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/hooks/deploys", jsonCT, body); r.status != 400 {
		t.Fatalf("unsigned = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/hooks/ghost", jsonCT, body, h...); r.status != 404 {
		t.Fatalf("unknown hook = %d %s", r.status, r.body)
	}

	if r := b.do(t, "POST", "/v1/sources/deploys/events", jsonCT, deployFailed("evt-3", "web")); r.status != 202 || r.json(t)["status"] != "accepted" {
		t.Fatalf("push = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/sources/deploys/events", jsonCT, deployFailed("evt-3", "web")); r.status != 200 || r.json(t)["status"] != "duplicate" {
		t.Fatalf("push again = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/sources/deploys/events", jsonCT, `{"type":"deploy.failed","id":"x","payload":{"service":1}}`); r.status != 422 {
		t.Fatalf("push invalid = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/sources/ghost/events", jsonCT, deployFailed("x", "a")); r.status != 404 {
		t.Fatalf("push unknown = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/sources/deploys/events", jsonCT, deployFailed("evt-4", "poison")); r.status != 202 {
		t.Fatalf("push poison = %d %s", r.status, r.body)
	}

	if r := b.do(t, "POST", "/v1/harness/start", "", ""); r.status != 200 || r.json(t)["started"] != true {
		t.Fatalf("start = %d %s", r.status, r.body)
	}
	var dead []any
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := b.do(t, "GET", "/v1/deadletters", "", "")
		if r.status != 200 {
			t.Fatalf("dead letters = %d %s", r.status, r.body)
		}
		if dead = r.json(t)["items"].([]any); len(dead) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(dead) != 1 {
		t.Fatalf("dead letters = %v", dead)
	}
	id := dead[0].(map[string]any)["id"].(string)
	if r := b.do(t, "POST", "/v1/deadletters/"+id+"/redeliver", "", ""); r.status != 202 {
		t.Fatalf("redeliver = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/deadletters/"+id+"/redeliver", "", ""); r.status != 404 {
		t.Fatalf("redeliver again = %d %s", r.status, r.body)
	}
	for {
		r := b.do(t, "GET", "/v1/harness/status", "", "")
		if r.status != 200 {
			t.Fatalf("status = %d %s", r.status, r.body)
		}
		var st triggers.Status
		if err := json.Unmarshal(r.body, &st); err != nil {
			t.Fatal(err)
		}
		c := st.Triggers[0].Counts
		if c.Succeeded == 2 && c.Dead == 2 {
			if c.Received != 3 || c.Duplicate != 2 || c.Rejected != 3 || c.Redelivered != 1 {
				t.Errorf("counts = %+v", c)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never settled: %s", r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWebhookSameIDConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := deployFailed("evt-c", "api")
	h := signed(t, hookSecret, "msg_c", time.Now(), body)
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			r := b.do(t, "POST", "/hooks/deploys", "application/json", body, h...)
			mu.Lock()
			codes[r.status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[204] != 1 || codes[200] != 15 {
		t.Fatalf("answers = %v, want one 204 and fifteen 200", codes)
	}
	b.do(t, "POST", "/v1/harness/start", "", "")
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := b.do(t, "GET", "/v1/executions?limit=100", "", "")
		items := r.json(t)["items"].([]any)
		if len(items) == 1 && items[0].(map[string]any)["status"] == "succeeded" {
			break
		}
		if len(items) > 1 || time.Now().After(deadline) {
			t.Fatalf("executions = %s", r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWebhookBodyLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	big := fmt.Sprintf(`{"type":"deploy.failed","id":"big","payload":{"service":"%0100000d"}}`, 0)
	h := signed(t, hookSecret, "msg_big", time.Now(), big)
	r := b.do(t, "POST", "/hooks/deploys", "application/json", big, h...)
	if r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("big body = %d %s", r.status, r.body)
	}
}

// TestServerEventHookNeedsTheSubscriptionsSecret: an MCP connection's
// /hooks takes only deliveries signed with a secret patchbay gave one of
// its subscriptions; a source's secret, or any other, is refused.
func TestServerEventHookNeedsTheSubscriptionsSecret(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := `{"eventId":"tkt-1","name":"ticket.escalated","timestamp":"2026-01-01T00:00:00Z","data":{}}`
	r := b.do(t, "POST", "/hooks/tickets", "application/json", body, signed(t, hookSecret, "tkt-1", time.Now(), body)...)
	if r.status != http.StatusUnauthorized || r.json(t)["code"] != "WEBHOOK_SIGNATURE_INVALID" {
		t.Fatalf("POST /hooks/tickets = %d %s, want 401 WEBHOOK_SIGNATURE_INVALID", r.status, r.body)
	}
}
