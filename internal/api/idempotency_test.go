package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

const otherKey = "other-key"

func withOtherKey(o *api.Options) {
	o.APIKeys = append(o.APIKeys, api.Key{SHA256: sha256.Sum256([]byte(otherKey)), Principal: authz.Principal{Name: "other", Allowlist: "test", Roles: []authz.Role{authz.Admin}}})
}

// TestIdempotencyKeyOnSubmit runs its steps in order on one server: each
// builds on the keys the previous ones used.
func TestIdempotencyKeyOnSubmit(t *testing.T) {
	t.Parallel()
	b := setup(t, withOtherKey)
	const ct = "application/json"
	body := `{"workflow":` + hello + `,"input":{"x":1}}`
	// The same request encoded differently: other spacing, other order.
	reencoded := `{ "input": {"x": 1}, "workflow": ` + hello + ` }`
	ids := map[string]string{}

	for _, tc := range []struct {
		name       string
		key        string
		bearer     string // "" is the test key
		body       string
		wantStatus int
		wantCode   string
		replayed   bool
		sameAs     string // a step whose id this one must return
		notSameAs  string
	}{
		{name: "first", key: "order-1", body: body, wantStatus: 202},
		{name: "repeat", key: "order-1", body: body, wantStatus: 202, replayed: true, sameAs: "first"},
		{name: "repeat re-encoded", key: "order-1", body: reencoded, wantStatus: 202, replayed: true, sameAs: "first"},
		{name: "quoted key is the same key", key: `"order-1"`, body: body, wantStatus: 202, replayed: true, sameAs: "first"},
		{name: "other body", key: "order-1", body: `{"workflow":` + hello + `,"input":{"x":2}}`, wantStatus: 422, wantCode: "IDEMPOTENCY_KEY_REUSED"},
		{name: "other principal", key: "order-1", bearer: otherKey, body: body, wantStatus: 202, notSameAs: "first"},
		{name: "other key", key: "order-2", body: body, wantStatus: 202, notSameAs: "first"},
		{name: "wait", key: "order-3", body: `{"workflow":` + hello + `,"input":{"x":1},"wait":"10s"}`, wantStatus: 200},
		{name: "wait repeated", key: "order-3", body: `{"workflow":` + hello + `,"input":{"x":1},"wait":"10s"}`, wantStatus: 200, replayed: true, sameAs: "wait"},
		{name: "refused document", key: "order-4", body: `{"workflow":{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"nope"}}}`, wantStatus: 422, wantCode: "OPERATION_UNKNOWN"},
		{name: "corrected under the same key", key: "order-4", body: body, wantStatus: 202},
		{name: "blank key", key: " ", body: body, wantStatus: 400, wantCode: "IDEMPOTENCY_KEY_INVALID"},
		{name: "key too long", key: strings.Repeat("k", 256), body: body, wantStatus: 400, wantCode: "IDEMPOTENCY_KEY_INVALID"},
		{name: "key not ASCII", key: "clé", body: body, wantStatus: 400, wantCode: "IDEMPOTENCY_KEY_INVALID"},
		{name: "longest key", key: strings.Repeat("k", 255), body: body, wantStatus: 202},
	} {
		headers := []string{"Idempotency-Key", tc.key}
		if tc.bearer != "" {
			headers = append(headers, "Authorization", "Bearer "+tc.bearer)
		}
		r := b.do(t, "POST", "/v1/executions", ct, tc.body, headers...)
		if r.status != tc.wantStatus {
			t.Fatalf("%s: status %d, want %d: %s", tc.name, r.status, tc.wantStatus, r.body)
		}
		m := r.json(t)
		if tc.wantCode != "" {
			if m["code"] != tc.wantCode {
				t.Errorf("%s: code %v, want %s", tc.name, m["code"], tc.wantCode)
			}
			continue
		}
		id, _ := m["id"].(string)
		ids[tc.name] = id
		if got := r.header.Get("Idempotent-Replayed") == "true"; got != tc.replayed {
			t.Errorf("%s: Idempotent-Replayed = %q, want %v", tc.name, r.header.Get("Idempotent-Replayed"), tc.replayed)
		}
		if tc.sameAs != "" && id != ids[tc.sameAs] {
			t.Errorf("%s: id %s, want %s's %s", tc.name, id, tc.sameAs, ids[tc.sameAs])
		}
		if tc.notSameAs != "" && id == ids[tc.notSameAs] {
			t.Errorf("%s: id %s is %s's; want a new execution", tc.name, id, tc.notSameAs)
		}
		if loc := r.header.Get("Location"); loc != "/v1/executions/"+id {
			t.Errorf("%s: Location %q", tc.name, loc)
		}
	}
}

// TestIdempotencyKeyConcurrent: requests racing with one key create one
// execution; those that lose are told 409 with Retry-After, or get it.
func TestIdempotencyKeyConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := `{"workflow":` + hello + `,"input":{"x":1}}`
	const n = 8
	type answer struct {
		status int
		id     string
		retry  string
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", b.url+"/v1/executions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+testKey)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "race")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			var m struct{ ID string }
			data, _ := io.ReadAll(resp.Body)
			_ = json.Unmarshal(data, &m)
			answers[i] = answer{resp.StatusCode, m.ID, resp.Header.Get("Retry-After")}
		})
	}
	wg.Wait()
	ids := map[string]bool{}
	for _, a := range answers {
		switch a.status {
		case http.StatusAccepted:
			ids[a.id] = true
		case http.StatusConflict:
			if a.retry == "" {
				t.Errorf("409 without Retry-After")
			}
		default:
			t.Errorf("status %d", a.status)
		}
	}
	if len(ids) != 1 {
		t.Errorf("executions created: %v, want one", ids)
	}
}

func TestIdempotencyKeyOnPush(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ct, path = "application/json", "/v1/sources/deploys/events"
	noID := `{"type":"deploy.failed","payload":{"service":"api"}}`
	for _, tc := range []struct {
		name, key, body string
		wantStatus      int
		wantCode        string
		replayed        bool
		wantID          string
	}{
		{name: "the key is the event id", key: "push-1", body: noID, wantStatus: 202, wantID: "push-1"},
		{name: "repeat", key: "push-1", body: noID, wantStatus: 202, replayed: true, wantID: "push-1"},
		{name: "other body", key: "push-1", body: `{"type":"deploy.failed","payload":{"service":"web"}}`, wantStatus: 422, wantCode: "IDEMPOTENCY_KEY_REUSED"},
		{name: "body id wins", key: "push-2", body: deployFailed("evt-own", "api"), wantStatus: 202, wantID: "evt-own"},
		{name: "invalid event", key: "push-3", body: `{"type":"deploy.failed","payload":{}}`, wantStatus: 422, wantCode: "VALIDATION_FAILED"},
		{name: "corrected under the same key", key: "push-3", body: noID, wantStatus: 202, wantID: "push-3"},
		{name: "invalid key", key: strings.Repeat("k", 300), body: noID, wantStatus: 400, wantCode: "IDEMPOTENCY_KEY_INVALID"},
	} {
		r := b.do(t, "POST", path, ct, tc.body, "Idempotency-Key", tc.key)
		if r.status != tc.wantStatus {
			t.Fatalf("%s: status %d, want %d: %s", tc.name, r.status, tc.wantStatus, r.body)
		}
		m := r.json(t)
		if tc.wantCode != "" {
			if m["code"] != tc.wantCode {
				t.Errorf("%s: code %v, want %s", tc.name, m["code"], tc.wantCode)
			}
			continue
		}
		if m["id"] != tc.wantID || m["status"] != "accepted" {
			t.Errorf("%s: answer %s, want accepted %s", tc.name, r.body, tc.wantID)
		}
		if got := r.header.Get("Idempotent-Replayed") == "true"; got != tc.replayed {
			t.Errorf("%s: Idempotent-Replayed = %q, want %v", tc.name, r.header.Get("Idempotent-Replayed"), tc.replayed)
		}
	}
}

// TestConnectionStartingIs503: a document using a connection that has not
// finished connecting is refused with a status clients retry.
func TestConnectionStartingIs503(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *api.Options) {
		// Added after Start, so it stays connecting.
		must(t, o.Registry.Add("slow", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})))
	})
	doc := `{"version":1,"connections":{"slow":{}},"root":{"kind":"call","id":"a","connection":"slow","op":"echo"}}`
	r := b.do(t, "POST", "/v1/executions", "application/json", `{"workflow":`+doc+`}`)
	if r.status != http.StatusServiceUnavailable || r.json(t)["code"] != "CONNECTION_STARTING" || r.header.Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q: %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	// With a key, the refusal keeps nothing: the retry is a new request.
	r = b.do(t, "POST", "/v1/executions", "application/json", `{"workflow":`+doc+`}`, "Idempotency-Key", "start-1")
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("with a key: status %d: %s", r.status, r.body)
	}
	r = b.do(t, "POST", "/v1/executions", "application/json", `{"workflow":`+doc+`}`, "Idempotency-Key", "start-1")
	if r.status != http.StatusServiceUnavailable || r.json(t)["code"] != "CONNECTION_STARTING" {
		t.Fatalf("retried with the key: status %d: %s", r.status, r.body)
	}
}

// refusingStore is a store whose Redis refuses connections.
func refusingStore(t *testing.T) *store.Store {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	st := &store.Store{
		Client: redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1}),
		Prefix: storetest.Prefix(),
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// downSetup serves the API over st, whose Redis is out of reach.
func downSetup(t *testing.T, st *store.Store) *bundle {
	t.Helper()
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("mem", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "add"}}, connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})))
	must(t, reg.Start(context.Background()))
	als := gates.NewAllowlists(st)
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Allowlists: als})
	trig, hooks := triggerParts(t, st, execs, reg)
	keys, err := secrets.NewKeyring(secrets.KeyringKey{ID: "k1", Key: bytes.Repeat([]byte{7}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	e := api.New(api.Options{
		Executions: execs, Registry: reg, Allowlists: als, Triggers: trig, Webhooks: hooks, Secrets: secrets.NewRedisSecrets(st, keys),
		Questions: gates.NewQuestions(st, gates.QuestionHooks{}),
		APIKeys: []api.Key{
			{SHA256: sha256.Sum256([]byte(testKey)), Principal: authz.Principal{Name: "tester", Allowlist: "test", Roles: []authz.Role{authz.Admin}}},
			{SHA256: sha256.Sum256([]byte("alice-key")), Principal: authz.Principal{Name: "alice", Allowlist: "test"}},
		},
		Ready: st.Ping,
	})
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	s := loadSpec(t)
	router, err := gorillamux.NewRouter(s)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{url: srv.URL, router: router, spec: s, seen: map[string]bool{}, routes: e.Routes()}
}

// downBound is how soon a route must answer with Redis out of reach: the
// request's wait on Redis, and slack for a loaded machine.
const downBound = store.RequestWait + 2*time.Second

// TestStoreDownIs503: with Redis out of reach, every route that needs it
// answers 503 STORE_UNAVAILABLE with Retry-After, never a 500, within
// store.RequestWait (and some slack): Redis refusing connections, and
// Redis frozen (connections open, nothing answered), where only the
// request's wait ends it. A route the server has that the table does not
// cover fails the test; the routes that never touch Redis are listed as
// such.
func TestStoreDownIs503(t *testing.T) {
	t.Parallel()
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		storeDownIs503(t, downSetup(t, refusingStore(t)))
	})
	t.Run("frozen", func(t *testing.T) {
		t.Parallel()
		st, proxy := storetest.NewFreezable(t)
		b := downSetup(t, st)
		proxy.Freeze()
		storeDownIs503(t, b)
	})
}

func storeDownIs503(t *testing.T, b *bundle) {
	const ct = "application/json"
	event := deployFailed("evt-down", "api")
	// Liveness and metrics answer from the process alone.
	covered := map[string]bool{"GET /healthz": true, "GET /metrics": true}
	for _, tc := range []struct {
		method, route, path, body string
		headers                   []string
	}{
		{"POST", "/v1/executions", "/v1/executions", `{"workflow":` + hello + `}`, nil},
		{"POST", "/v1/executions", "/v1/executions", `{"workflow":` + hello + `}`, []string{"Idempotency-Key", "down-1"}},
		{"GET", "/v1/executions", "/v1/executions", "", nil},
		{"GET", "/v1/executions/:id", "/v1/executions/ex_missing", "", nil},
		{"POST", "/v1/executions/:id/cancel", "/v1/executions/ex_missing/cancel", "", nil},
		{"POST", "/v1/executions/:id/resume", "/v1/executions/ex_missing/resume", "", nil},
		{"GET", "/v1/executions/:id/events", "/v1/executions/ex_missing/events", "", nil},
		// A key that sees every connection needs no allowlist, and so no
		// Redis, to list them; a run key's view is its allowlist's.
		{"GET", "/v1/connections", "/v1/connections", "", []string{"Authorization", "Bearer alice-key"}},
		{"GET", "/v1/connections/:name", "/v1/connections/mem", "", []string{"Authorization", "Bearer alice-key"}},
		{"GET", "/v1/connections/:name/operations/*", "/v1/connections/mem/operations/echo", "", []string{"Authorization", "Bearer alice-key"}},
		{"PUT", "/v1/secrets/:name", "/v1/secrets/app.token", `{"value":"a-long-enough-value"}`, nil},
		{"GET", "/v1/approvals", "/v1/approvals", "", nil},
		{"GET", "/v1/approvals/:id", "/v1/approvals/ap_missing", "", nil},
		{"POST", "/v1/approvals/:id/approve", "/v1/approvals/ap_missing/approve", "", nil},
		{"POST", "/v1/approvals/:id/deny", "/v1/approvals/ap_missing/deny", "", nil},
		{"GET", "/v1/questions", "/v1/questions", "", nil},
		{"GET", "/v1/questions/:id", "/v1/questions/qs_missing", "", nil},
		{"POST", "/v1/questions/:id/answer", "/v1/questions/qs_missing/answer", "", nil},
		{"POST", "/v1/questions/:id/decline", "/v1/questions/qs_missing/decline", "", nil},
		{"POST", "/v1/questions/:id/cancel", "/v1/questions/qs_missing/cancel", "", nil},
		{"GET", "/v1/allowlists", "/v1/allowlists", "", nil},
		{"GET", "/v1/allowlists/:name", "/v1/allowlists/test", "", nil},
		{"GET", "/v1/allowlists/:name/describe", "/v1/allowlists/test/describe", "", nil},
		{"PUT", "/v1/allowlists/:name", "/v1/allowlists/new", `{"connections":{"mem":{"ops":["*"]}}}`, nil},
		{"DELETE", "/v1/allowlists/:name", "/v1/allowlists/test", "", nil},
		{"POST", "/v1/sources/:name/events", "/v1/sources/deploys/events", event, nil},
		{"POST", "/v1/sources/:name/events", "/v1/sources/deploys/events", event, []string{"Idempotency-Key", "down-2"}},
		{"POST", "/hooks/:connection", "/hooks/deploys", event, signed(t, hookSecret, "msg_down", time.Now(), event)},
		{"POST", "/v1/harness/start", "/v1/harness/start", "", nil},
		{"GET", "/v1/harness/status", "/v1/harness/status", "", nil},
		{"GET", "/v1/deadletters", "/v1/deadletters", "", nil},
		{"POST", "/v1/deadletters/:id/redeliver", "/v1/deadletters/deploys:1-0/redeliver", "", nil},
		{"GET", "/readyz", "/readyz", "", nil},
	} {
		covered[tc.method+" "+tc.route] = true
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			// In parallel: frozen, each takes the whole wait.
			t.Parallel()
			contentType := ""
			if tc.body != "" {
				contentType = ct
			}
			start := time.Now()
			r := b.do(t, tc.method, tc.path, contentType, tc.body, tc.headers...)
			if d := time.Since(start); d > downBound {
				t.Errorf("answered after %s, want within %s", d, downBound)
			}
			if r.status != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503: %s", r.status, r.body)
			}
			if code := r.json(t)["code"]; code != "STORE_UNAVAILABLE" {
				t.Errorf("code %v, want STORE_UNAVAILABLE", code)
			}
			if r.header.Get("Retry-After") == "" {
				t.Error("no Retry-After")
			}
		})
	}
	for _, rt := range b.routes {
		if !covered[rt.Method+" "+rt.Path] {
			t.Errorf("route %s %s is not in the store-down table: add a row (or list it as answering without Redis)", rt.Method, rt.Path)
		}
	}
}
