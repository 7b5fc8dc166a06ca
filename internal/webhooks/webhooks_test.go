package webhooks_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/triggers"
	"github.com/patchbay-dev/patchbay/internal/webhooks"
)

// The Standard Webhooks specification's example: its secret, message id,
// timestamp, payload and expected signature.
const (
	specSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	specMsgID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	specTimestamp = 1614265330
	specPayload   = `{"test": 2432232314}`
	specSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	otherSecret   = "whsec_c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24tMTIzNA=="
)

type bundle struct {
	recv *webhooks.Receiver
	svc  *triggers.Service
}

// setup serves connection "hooks" (any event type, as an MCP server's
// webhooks would be) and "deploys" (a source with a schema), with the
// clock at now.
func setup(t *testing.T, now time.Time) *bundle {
	t.Helper()
	st := storetest.New(t)
	reg := registry.NewRegistry(nil)
	execs := harness.NewExecutions(st, reg, nil)
	conns := map[string]config.Connection{
		"hooks": {MCP: &config.MCP{Command: "x"}, Webhooks: &config.Webhooks{Secrets: []string{otherSecret, specSecret}}},
		"deploys": {
			Source:   &config.Source{Events: map[string]any{"deploy.failed": map[string]any{"type": "object", "required": []any{"service"}}}},
			Webhooks: &config.Webhooks{Secrets: []string{specSecret}},
		},
	}
	svc, err := triggers.New(triggers.Options{Store: st, Executions: execs, Registry: reg, File: &config.File{Connections: conns}})
	if err != nil {
		t.Fatal(err)
	}
	recv, err := webhooks.New(conns, svc, &webhooks.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{recv: recv, svc: svc}
}

func headers(id string, ts int64, sig string) http.Header {
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	h.Set("webhook-signature", sig)
	return h
}

func sign(t *testing.T, secret, id string, ts int64, body string) string {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := wh.Sign(id, time.Unix(ts, 0), []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// TestSpecVectors replays the specification's example: its signature
// verifies with its secret at its timestamp (the body is not an event, so
// the answer is 400, not 401), and every alteration fails verification.
func TestSpecVectors(t *testing.T) {
	t.Parallel()
	if got := sign(t, specSecret, specMsgID, specTimestamp, specPayload); got != specSignature {
		t.Fatalf("library signs the vector as %s, want %s", got, specSignature)
	}
	at := time.Unix(specTimestamp, 0)
	b := setup(t, at)
	ctx := context.Background()
	body := []byte(specPayload)
	tests := []struct {
		name   string
		now    time.Duration // clock offset from the vector's timestamp
		header http.Header
		body   []byte
		status int
		code   string
	}{
		{"vector verifies", 0, headers(specMsgID, specTimestamp, specSignature), body, 400, webhooks.CodeInvalidEvent},
		{"among several signatures", 0, headers(specMsgID, specTimestamp, "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v2,xyz "+specSignature), body, 400, webhooks.CodeInvalidEvent},
		{"4m59s old", 4*time.Minute + 59*time.Second, headers(specMsgID, specTimestamp, specSignature), body, 400, webhooks.CodeInvalidEvent},
		{"4m59s early", -(4*time.Minute + 59*time.Second), headers(specMsgID, specTimestamp, specSignature), body, 400, webhooks.CodeInvalidEvent},
		{"too old", 5*time.Minute + time.Second, headers(specMsgID, specTimestamp, specSignature), body, 401, webhooks.CodeBadTimestamp},
		{"too new", -(5*time.Minute + time.Second), headers(specMsgID, specTimestamp, specSignature), body, 401, webhooks.CodeBadTimestamp},
		{"body changed", 0, headers(specMsgID, specTimestamp, specSignature), []byte(`{"test": 2432232315}`), 401, webhooks.CodeBadSignature},
		{"id changed", 0, headers(specMsgID+"x", specTimestamp, specSignature), body, 401, webhooks.CodeBadSignature},
		{"timestamp changed", 0, headers(specMsgID, specTimestamp+1, specSignature), body, 401, webhooks.CodeBadSignature},
		{"other version", 0, headers(specMsgID, specTimestamp, strings.Replace(specSignature, "v1,", "v2,", 1)), body, 401, webhooks.CodeBadSignature},
		{"trailing data", 0, headers(specMsgID, specTimestamp, specSignature+"x"), body, 401, webhooks.CodeBadSignature},
		{"missing signature", 0, headers(specMsgID, specTimestamp, ""), body, 400, webhooks.CodeMalformed},
		{"bad timestamp", 0, func() http.Header {
			h := headers(specMsgID, 0, specSignature)
			h.Set("webhook-timestamp", "soon")
			return h
		}(), body, 400, webhooks.CodeMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := b.recv
			if tt.now != 0 {
				r2, err := webhooks.New(map[string]config.Connection{"deploys": {Webhooks: &config.Webhooks{Secrets: []string{specSecret}}}}, b.svc,
					&webhooks.Options{Now: func() time.Time { return at.Add(tt.now) }})
				if err != nil {
					t.Fatal(err)
				}
				r = r2
			}
			o := r.Receive(ctx, "deploys", tt.header, tt.body)
			if o.Status != tt.status || o.Code != tt.code {
				t.Errorf("answer = %d %s (%s), want %d %s", o.Status, o.Code, o.Detail, tt.status, tt.code)
			}
		})
	}
}

func TestRotationDedupeAndLog(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := setup(t, now)
	ctx := context.Background()
	ts := now.Unix()
	ev := func(id string) string {
		return `{"type":"deploy.failed","id":"` + id + `","payload":{"service":"api"}}`
	}

	// Either secret of a connection verifies (rotation).
	for i, secret := range []string{otherSecret, specSecret} {
		id := "msg_" + strconv.Itoa(i)
		body := `{"type":"issue.opened","payload":{"n":1}}`
		if o := b.recv.Receive(ctx, "hooks", headers(id, ts, sign(t, secret, id, ts, body)), []byte(body)); o.Status != 204 || o.Event.ID != id {
			t.Errorf("secret %d: %d %s %s", i, o.Status, o.Code, o.Detail)
		}
	}
	// A repeated webhook-id is a duplicate even with another event id, and
	// a repeated event id even under another webhook-id.
	body := ev("e1")
	if o := b.recv.Receive(ctx, "deploys", headers("m1", ts, sign(t, specSecret, "m1", ts, body)), []byte(body)); o.Status != 204 {
		t.Fatalf("first = %d %s", o.Status, o.Detail)
	}
	if o := b.recv.Receive(ctx, "deploys", headers("m1", ts, sign(t, specSecret, "m1", ts, body)), []byte(body)); o.Status != 200 {
		t.Errorf("retry = %d", o.Status)
	}
	body2 := ev("e2")
	if o := b.recv.Receive(ctx, "deploys", headers("m1", ts, sign(t, specSecret, "m1", ts, body2)), []byte(body2)); o.Status != 200 {
		t.Errorf("same webhook-id, new event = %d", o.Status)
	}
	if o := b.recv.Receive(ctx, "deploys", headers("m2", ts, sign(t, specSecret, "m2", ts, body)), []byte(body)); o.Status != 200 {
		t.Errorf("same event, new webhook-id = %d", o.Status)
	}
	// Schema and shape failures are 400 with the field.
	bad := `{"type":"deploy.failed","id":"e3","payload":{}}`
	o := b.recv.Receive(ctx, "deploys", headers("m3", ts, sign(t, specSecret, "m3", ts, bad)), []byte(bad))
	if o.Status != 400 || len(o.Problems) == 0 || o.Problems[0].Path != "/payload" {
		t.Errorf("schema = %d %+v", o.Status, o.Problems)
	}
	if o := b.recv.Receive(ctx, "ghost", http.Header{}, nil); o.Status != 404 {
		t.Errorf("unknown = %d", o.Status)
	}
	recs, err := b.recv.Deliveries(ctx, "deploys", 10)
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []string
	for _, r := range recs {
		outcomes = append(outcomes, r.Outcome)
	}
	if got := strings.Join(outcomes, ","); got != "rejected,duplicate,duplicate,duplicate,accepted" {
		t.Errorf("deliveries = %s", got)
	}
	if recs[0].Reason == "" || recs[0].WebhookID != "m3" {
		t.Errorf("rejected delivery = %+v", recs[0])
	}
	st, err := b.svc.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(st.Inboxes)
	if !strings.Contains(string(data), `"connection":"deploys","depth":0,"pending":0,"deadLetters":0,"accepted":1,"duplicate":3,"rejected":1`) {
		t.Errorf("inboxes = %s", data)
	}
}

func TestWeakSecretRefused(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"whsec_" + "c2hvcnQ=", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_!!!", "whsec_" + strings.Repeat("QUFB", 22)} {
		if _, err := config.WebhookKey(s); err == nil {
			t.Errorf("WebhookKey accepted a bad secret")
		} else if strings.Contains(err.Error(), s) {
			t.Errorf("error quotes the secret: %v", err)
		}
	}
	if _, err := config.WebhookKey(specSecret); err != nil {
		t.Errorf("spec secret: %v", err)
	}
}
