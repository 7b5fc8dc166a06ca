package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/mcpserver"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

const testKey = "test-key"

// The keys of the authorization tests, each with its principal (the test
// key, tester, is an admin). Every key is bound to the test allowlist.
var roleKeys = map[string]authz.Principal{
	"alice-key":    {Name: "alice"},
	"bob-key":      {Name: "bob", Roles: []authz.Role{authz.Run}},
	"auditor-key":  {Name: "auditor", Roles: []authz.Role{authz.Read}},
	"approver-key": {Name: "approver", Roles: []authz.Role{authz.Approve}},
	"pusher-key":   {Name: "pusher", Push: []string{"deploys"}},
}

func testKeys() []api.Key {
	keys := []api.Key{{SHA256: sha256.Sum256([]byte(testKey)), Principal: authz.Principal{Name: "tester", Allowlist: "test", Roles: []authz.Role{authz.Admin}}}}
	for plain, p := range roleKeys {
		p.Allowlist = "test"
		keys = append(keys, api.Key{SHA256: sha256.Sum256([]byte(plain)), Principal: p})
	}
	return keys
}

type bundle struct {
	url    string
	router routers.Router
	spec   *openapi3.T
	routes []*echo.Route // every route the server has

	mu   sync.Mutex
	seen map[string]bool // "METHOD /route status"
}

var (
	specOnce sync.Once
	spec     *openapi3.T
	specErr  error
)

func loadSpec(t testing.TB) *openapi3.T {
	t.Helper()
	specOnce.Do(func() {
		openapi3filter.RegisterBodyDecoder("text/event-stream", openapi3filter.PlainBodyDecoder)
		spec, specErr = openapi3.NewLoader().LoadFromFile("../../openapi.yaml")
		if specErr == nil {
			specErr = spec.Validate(context.Background())
			// Match requests to any host: the test server's port is random.
			spec.Servers = nil
		}
	})
	if specErr != nil {
		t.Fatalf("openapi.yaml: %v", specErr)
	}
	return spec
}

func setup(t testing.TB, opts ...func(*api.Options)) *bundle {
	t.Helper()
	mem := connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "add", InputSchema: json.RawMessage(`{"type":"object"}`)},
			Fn: func(_ context.Context, a map[string]any) (any, error) {
				x, _ := a["a"].(float64)
				y, _ := a["b"].(float64)
				return map[string]any{"sum": x + y}, nil
			}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "guarded"}},
	)
	reg := registry.NewRegistry(nil)
	if err := reg.Add("mem", mem); err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := storetest.New(t)
	als := gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist("test", []byte(`{"connections":{"mem":{"ops":["*"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := als.Put(context.Background(), al, "setup"); err != nil {
		t.Fatal(err)
	}
	must(t, reg.SetPolicy("mem", registry.Policy{Approve: []string{"guarded"}}))
	metrics := api.NewMetrics()
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Observer: metrics, Allowlists: als})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, 2); close(done) }()
	trig, hooks := triggerParts(t, st, execs, reg)
	o := api.Options{
		Executions: execs, Registry: reg, Allowlists: als,
		APIKeys:      testKeys(),
		MaxBodyBytes: 64 << 10, Metrics: metrics, Triggers: trig, Webhooks: hooks,
		MCP: mcpserver.New(mcpserver.Options{Engine: execs}),
	}
	for _, opt := range opts {
		opt(&o)
	}
	e := api.New(o)
	srv := httptest.NewServer(e)
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	s := loadSpec(t)
	router, err := gorillamux.NewRouter(s)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{url: srv.URL, router: router, spec: s, seen: map[string]bool{}, routes: e.Routes()}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return m
}

// do sends a request with the test key and checks the response against
// openapi.yaml.
func (b *bundle) do(t *testing.T, method, path, contentType, body string, headers ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, b.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	b.conform(t, req, resp, data)
	return reply{status: resp.StatusCode, header: resp.Header, body: data}
}

func (b *bundle) conform(t *testing.T, req *http.Request, resp *http.Response, body []byte) {
	t.Helper()
	route, params, err := b.router.FindRoute(req)
	if err != nil {
		if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s %s is not in openapi.yaml (status %d)", req.Method, req.URL.Path, resp.StatusCode)
		}
		return
	}
	b.mu.Lock()
	b.seen[req.Method+" "+route.Path] = true
	b.mu.Unlock()
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status: resp.StatusCode, Header: resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		t.Fatalf("%s %s → %d does not match openapi.yaml: %v\nbody: %s", req.Method, req.URL.Path, resp.StatusCode, err, body)
	}
}

const hello = `{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"main","steps":[
	{"kind":"call","id":"a","connection":"mem","op":"add","args":{"a":{"$expr":"$input.x"},"b":2}},
	{"kind":"call","id":"b","connection":"mem","op":"add","args":{"a":{"$expr":"$steps.a.sum"},"b":3}},
	{"kind":"call","id":"c","connection":"mem","op":"echo","args":{"total":{"$expr":"$steps.b.sum"}}}]}}`

func TestEveryRouteMatchesOpenAPI(t *testing.T) {
	t.Parallel()
	qq := newQuestionQueue(t)
	b := setup(t, withMCPTokens(t, newOAuthIssuer(t)), withQuestions(qq))
	const jsonCT = "application/json"

	r := b.do(t, "POST", "/v1/executions", jsonCT, `{"workflow":`+hello+`,"input":{"x":1},"wait":"10s"}`)
	if r.status != 200 {
		t.Fatalf("POST wait = %d %s", r.status, r.body)
	}
	ex := r.json(t)
	if ex["status"] != "succeeded" || ex["output"].(map[string]any)["total"] != 6.0 {
		t.Fatalf("execution = %s", r.body)
	}
	id := ex["id"].(string)

	r = b.do(t, "POST", "/v1/executions", jsonCT, `{"workflow":`+hello+`,"input":{"x":5}}`)
	if r.status != 202 || r.header.Get("Location") == "" {
		t.Fatalf("POST = %d %v", r.status, r.header)
	}
	if r = b.do(t, "GET", "/v1/executions/"+id, "", ""); r.status != 200 {
		t.Fatalf("GET execution = %d", r.status)
	}
	if r = b.do(t, "GET", "/v1/executions?limit=1", "", ""); r.status != 200 || r.json(t)["next"] == nil {
		t.Fatalf("GET list = %d %s", r.status, r.body)
	}
	if r = b.do(t, "GET", "/v1/executions?status=succeeded", "", ""); r.status != 200 {
		t.Fatalf("GET list filtered = %d", r.status)
	}
	if r = b.do(t, "GET", "/v1/executions/ex_nope", "", ""); r.status != 404 || r.json(t)["code"] != "EXECUTION_NOT_FOUND" {
		t.Fatalf("GET missing = %d %s", r.status, r.body)
	}
	if r = b.do(t, "GET", "/v1/connections", "", ""); r.status != 200 {
		t.Fatalf("GET connections = %d", r.status)
	}
	if r = b.do(t, "GET", "/v1/connections/mem", "", ""); r.status != 200 || len(r.json(t)["operations"].([]any)) != 3 {
		t.Fatalf("GET connection = %d %s", r.status, r.body)
	}
	if r = b.do(t, "GET", "/v1/connections/ghost", "", ""); r.status != 404 || r.json(t)["code"] != "CONNECTION_UNKNOWN" {
		t.Fatalf("GET missing connection = %d %s", r.status, r.body)
	}
	if r = b.do(t, "GET", "/v1/connections/mem/operations/add", "", ""); r.status != 200 || r.json(t)["inputSchema"] == nil {
		t.Fatalf("GET operation = %d %s", r.status, r.body)
	}
	if r = b.do(t, "GET", "/v1/connections/mem/operations/nope", "", ""); r.status != 404 || r.json(t)["code"] != "OPERATION_UNKNOWN" {
		t.Fatalf("GET missing operation = %d %s", r.status, r.body)
	}
	if r = b.do(t, "GET", "/healthz", "", ""); r.status != 200 {
		t.Fatalf("healthz = %d", r.status)
	}
	if r = b.do(t, "GET", "/readyz", "", ""); r.status != 200 {
		t.Fatalf("readyz = %d", r.status)
	}
	if r = b.do(t, "GET", "/.well-known/oauth-protected-resource/mcp", "", "", "Authorization", ""); r.status != 200 || r.json(t)["resource"] == nil {
		t.Fatalf("protected resource metadata = %d %s", r.status, r.body)
	}
	r = b.do(t, "GET", "/metrics", "", "")
	for _, want := range []string{"patchbay_http_requests_total", `patchbay_executions_total{state="succeeded"}`, `patchbay_connection_calls_total{connection="mem",op="add",outcome="ok"}`, "patchbay_connection_call_duration_seconds_bucket"} {
		if !bytes.Contains(r.body, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}

	exerciseAllowlists(t, b)
	exerciseApprovals(t, b)
	exerciseQuestions(t, b, qq)
	exerciseLifecycle(t, b, id)
	exerciseTriggers(t, b)
	exerciseSecrets(t, b)
	exerciseMCP(t, b)

	for path, item := range b.spec.Paths.Map() {
		for method := range item.Operations() {
			if !b.seen[method+" "+path] {
				t.Errorf("%s %s in openapi.yaml was never exercised", method, path)
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wf := func(doc string) string { return `{"workflow":` + doc + `}` }
	call := func(conn, op, args string) string {
		return wf(`{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"` + conn + `","op":"` + op + `","args":` + args + `}}`)
	}
	tests := []struct {
		name        string
		method      string
		path        string
		contentType string
		body        string
		headers     []string
		status      int
		code        string
		field       string
	}{
		{"malformed json", "POST", "/v1/executions", "application/json", `{"workflow":`, nil, 400, "MALFORMED_JSON", ""},
		{"body is an array", "POST", "/v1/executions", "application/json", `[]`, nil, 400, "MALFORMED_JSON", ""},
		{"wrong content type", "POST", "/v1/executions", "text/plain", call("mem", "add", `{}`), nil, 415, "UNSUPPORTED_MEDIA_TYPE", ""},
		{"form that is not json", "POST", "/v1/executions", "application/x-www-form-urlencoded", `a=1`, nil, 415, "UNSUPPORTED_MEDIA_TYPE", ""},
		{"oversized body", "POST", "/v1/executions", "application/json", `{"input":"` + strings.Repeat("x", 70<<10) + `"}`, nil, 413, "BODY_TOO_LARGE", ""},
		{"unknown envelope field", "POST", "/v1/executions", "application/json", `{"workflow":{},"bogus":1}`, nil, 422, "VALIDATION_FAILED", "/bogus"},
		{"workflow missing", "POST", "/v1/executions", "application/json", `{"input":1}`, nil, 422, "VALIDATION_FAILED", "/workflow"},
		{"unknown workflow field", "POST", "/v1/executions", "application/json", wf(`{"version":1,"root":{"kind":"call","id":"a","connection":"mem","op":"add"},"connections":{"mem":{}},"extra":true}`), nil, 422, "VALIDATION_FAILED", "/workflow/extra"},
		{"unknown step field", "POST", "/v1/executions", "application/json", wf(`{"version":1,"root":{"kind":"call","id":"a","connection":"mem","op":"add","oops":1},"connections":{"mem":{}}}`), nil, 422, "VALIDATION_FAILED", "/workflow/root/oops"},
		{"unknown connection", "POST", "/v1/executions", "application/json", call("ghost", "add", `{}`), nil, 422, "CONNECTION_UNKNOWN", "/workflow/root/connection"},
		{"unknown operation", "POST", "/v1/executions", "application/json", call("mem", "sub", `{}`), nil, 422, "OPERATION_UNKNOWN", "/workflow/root/op"},
		{"expression does not compile", "POST", "/v1/executions", "application/json", call("mem", "add", `{"a":{"$expr":"1 +"}}`), nil, 422, "EXPRESSION_INVALID", "/workflow/root/args/a/$expr"},
		{"wait too long", "POST", "/v1/executions", "application/json", `{"workflow":{},"wait":"2m"}`, nil, 422, "VALIDATION_FAILED", "/wait"},
		{"wait not a duration", "POST", "/v1/executions", "application/json", `{"workflow":{},"wait":"soon"}`, nil, 422, "VALIDATION_FAILED", "/wait"},
		{"no api key", "POST", "/v1/executions", "application/json", call("mem", "add", `{}`), []string{"Authorization", ""}, 401, "UNAUTHENTICATED", ""},
		{"wrong api key", "GET", "/v1/executions", "", "", []string{"Authorization", "Bearer nope"}, 401, "UNAUTHENTICATED", ""},
		{"basic auth", "GET", "/v1/executions", "", "", []string{"Authorization", "Basic dGVzdC1rZXk6"}, 401, "UNAUTHENTICATED", ""},
		{"unknown v1 route", "GET", "/v1/nope", "", "", nil, 404, "NOT_FOUND", ""},
		{"bad status filter", "GET", "/v1/executions?status=done", "", "", nil, 422, "VALIDATION_FAILED", "status"},
		{"bad limit", "GET", "/v1/executions?limit=1000", "", "", nil, 422, "VALIDATION_FAILED", "limit"},
		{"bad cursor", "GET", "/v1/executions?cursor=%21%21", "", "", nil, 400, "INVALID_CURSOR", ""},
		{"wrong method", "DELETE", "/v1/executions", "", "", nil, 405, "METHOD_NOT_ALLOWED", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := b.do(t, tt.method, tt.path, tt.contentType, tt.body, tt.headers...)
			if r.status != tt.status {
				t.Fatalf("status = %d, want %d: %s", r.status, tt.status, r.body)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("Content-Type = %q", ct)
			}
			p := r.json(t)
			if p["code"] != tt.code || p["status"] != float64(tt.status) || p["type"] == "" || p["title"] == "" {
				t.Fatalf("problem = %s, want code %s", r.body, tt.code)
			}
			if tt.field == "" {
				return
			}
			errs, _ := p["errors"].([]any)
			for _, e := range errs {
				if e.(map[string]any)["path"] == tt.field {
					return
				}
			}
			t.Fatalf("problem %s names no field %s", r.body, tt.field)
		})
	}
}

func TestCurlFormBodyIsAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do(t, "POST", "/v1/executions", "application/x-www-form-urlencoded", `{"workflow":`+hello+`,"input":{"x":0},"wait":10}`)
	if r.status != 200 || r.json(t)["status"] != "succeeded" {
		t.Fatalf("curl-style POST = %d %s", r.status, r.body)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func exerciseAllowlists(t *testing.T, b *bundle) {
	t.Helper()
	const ct = "application/json"
	if r := b.do(t, "PUT", "/v1/allowlists/ops", ct, `{"connections":{"mem":{"ops":["add","echo"]}}}`); r.status != 201 {
		t.Fatalf("PUT new allowlist = %d %s", r.status, r.body)
	}
	if r := b.do(t, "PUT", "/v1/allowlists/ops", ct, `{"connections":{"mem":{"ops":["add"]}}}`); r.status != 200 {
		t.Fatalf("PUT allowlist = %d %s", r.status, r.body)
	}
	r := b.do(t, "PUT", "/v1/allowlists/ops", ct, `{"connections":{"mem":{"ops":["[bad"]}}}`)
	if r.status != 422 || !bytes.Contains(r.body, []byte(`"/connections/mem/ops/0"`)) {
		t.Fatalf("PUT bad glob = %d %s", r.status, r.body)
	}
	r = b.do(t, "GET", "/v1/allowlists/ops", "", "")
	if r.status != 200 || len(r.json(t)["history"].([]any)) != 2 {
		t.Fatalf("GET allowlist = %d %s", r.status, r.body)
	}
	if r = b.do(t, "GET", "/v1/allowlists", "", ""); r.status != 200 || len(r.json(t)["items"].([]any)) != 2 {
		t.Fatalf("GET allowlists = %d %s", r.status, r.body)
	}
	r = b.do(t, "GET", "/v1/allowlists/ops/describe", "", "")
	if ops := r.json(t)["connections"].(map[string]any)["mem"].([]any); r.status != 200 || len(ops) != 1 {
		t.Fatalf("describe = %d %s", r.status, r.body)
	}
	if r = b.do(t, "DELETE", "/v1/allowlists/ops", "", ""); r.status != 204 {
		t.Fatalf("DELETE = %d", r.status)
	}
	if r = b.do(t, "DELETE", "/v1/allowlists/ops", "", ""); r.status != 404 || r.json(t)["code"] != "ALLOWLIST_NOT_FOUND" {
		t.Fatalf("DELETE again = %d %s", r.status, r.body)
	}
}

func exerciseApprovals(t *testing.T, b *bundle) {
	t.Helper()
	doc := `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"g","connection":"mem","op":"guarded","args":{"x":1}}}`
	r := b.do(t, "POST", "/v1/executions", "application/json", `{"workflow":`+doc+`}`)
	if r.status != 202 {
		t.Fatalf("POST guarded = %d %s", r.status, r.body)
	}
	exec := r.json(t)["id"].(string)
	var id string
	for range 200 {
		r = b.do(t, "GET", "/v1/approvals?state=pending", "", "")
		for _, it := range r.json(t)["items"].([]any) {
			if ap := it.(map[string]any); ap["execution"] == exec {
				id = ap["id"].(string)
			}
		}
		if id != "" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if id == "" {
		t.Fatal("no pending approval")
	}
	if r = b.do(t, "GET", "/v1/approvals/"+id, "", ""); r.status != 200 || r.json(t)["requestedBy"] != "tester" {
		t.Fatalf("GET approval = %d %s", r.status, r.body)
	}
	if r = b.do(t, "POST", "/v1/approvals/"+id+"/approve", "application/json", `{"note":"fine"}`); r.status != 409 || r.json(t)["code"] != "APPROVAL_SELF" {
		t.Fatalf("approve own call = %d %s", r.status, r.body)
	}
	r = b.do(t, "POST", "/v1/approvals/"+id+"/approve", "application/json", `{"note":"fine"}`, "Authorization", "Bearer approver-key")
	if r.status != 200 || r.json(t)["state"] != "approved" || r.json(t)["decidedBy"] != "approver" {
		t.Fatalf("approve = %d %s", r.status, r.body)
	}
	if r = b.do(t, "POST", "/v1/approvals/"+id+"/deny", "", "", "Authorization", "Bearer approver-key"); r.status != 409 || r.json(t)["code"] != "APPROVAL_DECIDED" {
		t.Fatalf("deny after approve = %d %s", r.status, r.body)
	}
	if r = b.do(t, "GET", "/v1/approvals/ap_nope", "", ""); r.status != 404 {
		t.Fatalf("GET missing approval = %d", r.status)
	}
	for range 200 {
		if r = b.do(t, "GET", "/v1/executions/"+exec, "", ""); r.json(t)["status"] == "succeeded" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("guarded execution did not finish: %s", r.body)
}

// exerciseLifecycle reads a finished execution's events (from the start
// and after a Last-Event-ID), cancels it (a no-op once terminal) and asks
// to resume it (refused: it did not fail).
func exerciseLifecycle(t *testing.T, b *bundle, id string) {
	t.Helper()
	r := b.do(t, "GET", "/v1/executions/"+id+"/events", "", "")
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("events = %d %s", r.status, r.header.Get("Content-Type"))
	}
	events := parseSSE(string(r.body))
	if len(events) < 5 || events[len(events)-1].event != "execution.finished" {
		t.Fatalf("events = %+v", events)
	}
	r = b.do(t, "GET", "/v1/executions/"+id+"/events", "", "", "Last-Event-ID", events[1].id)
	again := parseSSE(string(r.body))
	if len(again) != len(events)-2 || again[0].id != events[2].id {
		t.Fatalf("after Last-Event-ID %s: %+v, want the %d events after it", events[1].id, again, len(events)-2)
	}
	// Resuming after the last event of a finished execution ends at once.
	if r = b.do(t, "GET", "/v1/executions/"+id+"/events", "", "", "Last-Event-ID", events[len(events)-1].id); r.status != 200 || len(parseSSE(string(r.body))) != 0 {
		t.Fatalf("after the last event: %d %q", r.status, r.body)
	}
	if r = b.do(t, "GET", "/v1/executions/ex_nope/events", "", ""); r.status != 404 {
		t.Fatalf("events of a missing execution = %d", r.status)
	}
	if r = b.do(t, "POST", "/v1/executions/"+id+"/cancel", "", ""); r.status != 200 || r.json(t)["status"] != "succeeded" {
		t.Fatalf("cancel finished = %d %s", r.status, r.body)
	}
	if r = b.do(t, "POST", "/v1/executions/"+id+"/resume", "application/json", `{"rerun":["mem"]}`); r.status != 409 {
		t.Fatalf("resume succeeded execution = %d %s", r.status, r.body)
	}
	doc := `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"g","connection":"mem","op":"guarded"}}`
	r = b.do(t, "POST", "/v1/executions", "application/json", `{"workflow":`+doc+`}`)
	waiting := r.json(t)["id"].(string)
	for range 200 {
		if b.do(t, "GET", "/v1/executions/"+waiting, "", "").json(t)["status"] == "waiting" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r = b.do(t, "POST", "/v1/executions/"+waiting+"/cancel", "", ""); r.status != 200 || r.json(t)["status"] != "cancelled" {
		t.Fatalf("cancel waiting = %d %s", r.status, r.body)
	}
}

type sseEvent struct{ id, event, data string }

func parseSSE(body string) []sseEvent {
	var out []sseEvent
	for _, block := range strings.Split(body, "\n\n") {
		var ev sseEvent
		for _, line := range strings.Split(block, "\n") {
			k, v, _ := strings.Cut(line, ": ")
			switch k {
			case "id":
				ev.id = v
			case "event":
				ev.event = v
			case "data":
				ev.data = v
			}
		}
		if ev.event != "" {
			out = append(out, ev)
		}
	}
	return out
}
