package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// petstore is a Petstore-like API with its OpenAPI 3 document at
// /openapi.yaml. Every API request must carry the key; the document
// request must not (it has another origin's rules: no baseUrl is set).
type petstore struct {
	key       string
	tenant    string
	apiCalls  atomic.Int64
	docHadKey atomic.Bool
	mu        sync.Mutex
	pets      []map[string]any
}

const petstoreDoc = `openapi: 3.0.3
info: { title: Petstore, version: "1.0" }
paths:
  /pets:
    get:
      operationId: listPets
      tags: [pets]
      parameters:
        - { name: limit, in: query, required: false, schema: { type: integer, format: int32, minimum: 1 } }
      responses:
        "200": { description: ok, content: { application/json: { schema: { type: array, items: { $ref: "#/components/schemas/Pet" } } } } }
    post:
      operationId: createPet
      tags: [pets]
      requestBody:
        required: true
        content:
          application/json:
            schema: { $ref: "#/components/schemas/NewPet" }
      responses:
        "201": { description: created, content: { application/json: { schema: { $ref: "#/components/schemas/Pet" } } } }
  /pets/{petId}:
    parameters:
      - { name: petId, in: path, required: true, schema: { type: string } }
    get:
      operationId: showPetById
      tags: [pets]
      responses:
        "200": { description: ok, content: { application/json: { schema: { $ref: "#/components/schemas/Pet" } } } }
components:
  schemas:
    NewPet:
      type: object
      required: [name]
      properties:
        name: { type: string }
        tag: { type: string, nullable: true }
    Pet:
      allOf:
        - $ref: "#/components/schemas/NewPet"
        - { type: object, required: [id], properties: { id: { type: string } } }
`

func (p *petstore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/openapi.yaml" {
		p.docHadKey.Store(r.Header.Get("X-Api-Key") != "")
		w.Header().Set("Content-Type", "application/yaml")
		io.WriteString(w, petstoreDoc)
		return
	}
	// The "gone" connection's document fetches (retried in the background)
	// are not API calls: counting them made the gate-2 check flaky.
	if strings.HasPrefix(r.URL.Path, "/pets") {
		p.apiCalls.Add(1)
	}
	if r.Header.Get("X-Api-Key") != p.key || r.Header.Get("X-Tenant") != p.tenant {
		http.Error(w, `{"message":"bad key"}`, http.StatusUnauthorized)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == "GET" && r.URL.Path == "/pets":
		json.NewEncoder(w).Encode(p.pets)
	case r.Method == "POST" && r.URL.Path == "/pets":
		var pet map[string]any
		if err := json.NewDecoder(r.Body).Decode(&pet); err != nil || pet["name"] == nil {
			http.Error(w, `{"message":"bad body"}`, http.StatusBadRequest)
			return
		}
		pet["id"] = fmt.Sprintf("pet-%d", len(p.pets)+1)
		p.pets = append(p.pets, pet)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(pet)
	case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/pets/"):
		id := strings.TrimPrefix(r.URL.Path, "/pets/")
		for _, pet := range p.pets {
			if pet["id"] == id {
				json.NewEncoder(w).Encode(pet)
				return
			}
		}
		// The excerpt of an error body reaches the execution record: a
		// key echoed here must come out redacted.
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"message":"no pet %s", "sentKey":%q, "tenant":%q}`, id, r.Header.Get("X-Api-Key"), r.Header.Get("X-Tenant"))
	default:
		http.NotFound(w, r)
	}
}

func TestOpenAPIConnection(t *testing.T) {
	t.Parallel()
	// The key comes from the secret chain at each call; the tenant from
	// the environment at load. Both are secrets to redact.
	const key, tenant = "pk-live-0123456789abcdef", "tenant-9f8e7d6c5b"
	api := &petstore{key: key, tenant: tenant}
	ts := httptest.NewServer(api)
	t.Cleanup(ts.Close)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  pets:
    openapi:
      url: %q
      headers: { X-Api-Key: "${secret:pets.key}", X-Tenant: "${env:PETS_TENANT}" }
  gone:
    openapi: { url: %q }
allowlists:
  default:
    connections:
      pets: { ops: ["*"] }
      gone: { ops: ["*"] }
`, ts.URL+"/openapi.yaml", ts.URL+"/missing.yaml?token=abc"))
	for mode, redisURL := range redisModes(t) {
		t.Run(mode, func(t *testing.T) {
			srv := start(t, map[string]string{
				"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
				"PATCHBAY_SECRET_PETS_KEY": key, "PETS_TENANT": tenant,
				"REDIS_URL": redisURL, "PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
			})
			if api.docHadKey.Load() {
				t.Fatal("the document request carried the API key (no baseUrl, no docAuth)")
			}

			t.Run("status", func(t *testing.T) {
				var conn struct {
					Kind       string         `json:"kind"`
					URL        string         `json:"url"`
					Tools      []string       `json:"tools"`
					LastError  string         `json:"lastError"`
					State      string         `json:"state"`
					Info       map[string]any `json:"info"`
					Identity   map[string]any `json:"identity"`
					Operations []struct {
						Name        string          `json:"name"`
						InputSchema json.RawMessage `json:"inputSchema"`
					} `json:"operations"`
				}
				getJSON(t, srv.url+"/v1/connections/pets", &conn)
				if conn.State != "ready" || conn.Info["document"] != ts.URL+"/openapi.yaml" || conn.Info["baseUrl"] != ts.URL ||
					conn.Info["operations"] != 3.0 || conn.Identity["surface"] != "openapi" || len(conn.Operations) != 3 {
					t.Fatalf("connection = %+v", conn)
				}
				if conn.Kind != "openapi" || conn.URL != ts.URL+"/openapi.yaml" || strings.Join(conn.Tools, " ") != "pets_listPets pets_createPet pets_showPetById" {
					t.Fatalf("report = %s %s %q", conn.Kind, conn.URL, conn.Tools)
				}
				// A connection whose document cannot be had reports no tools
				// and why, without the URL's query.
				var gone struct {
					State     string   `json:"state"`
					URL       string   `json:"url"`
					Tools     []string `json:"tools"`
					LastError string   `json:"lastError"`
				}
				getJSON(t, srv.url+"/v1/connections/gone", &gone)
				if gone.State != "unavailable" || gone.Tools == nil || len(gone.Tools) != 0 || !strings.Contains(gone.LastError, "HTTP 401") || gone.URL != ts.URL+"/missing.yaml" {
					t.Fatalf("failed connection = %+v", gone)
				}
			})

			t.Run("create, list, read", func(t *testing.T) {
				ex := post(t, srv.url, "k1", []byte(`{"wait":"10s","input":{"name":"Rex"},"workflow":{"version":1,
					"connections":{"pets":{}},"root":{"kind":"sequence","id":"main","steps":[
					{"kind":"call","id":"create","connection":"pets","op":"createPet","args":{"name":{"$expr":"$input.name"},"tag":null}},
					{"kind":"call","id":"list","connection":"pets","op":"listPets","args":{"limit":10}},
					{"kind":"call","id":"read","connection":"pets","op":"showPetById","args":{"petId":{"$expr":"$steps.create.id"}}}]}}}`))
				if ex["status"] != "succeeded" {
					t.Fatalf("execution: %v", ex)
				}
				out, _ := ex["output"].(map[string]any)
				if out["name"] != "Rex" || out["id"] == nil {
					t.Fatalf("output = %v", ex["output"])
				}
				steps := ex["steps"].([]any)
				if list, _ := steps[1].(map[string]any)["output"].([]any); len(list) == 0 {
					t.Fatalf("list step = %v", steps[1])
				}
				checkNoSecret(t, srv.url, ex["id"].(string), key, tenant)
			})

			t.Run("wrong type refused at gate 2", func(t *testing.T) {
				before := api.apiCalls.Load()
				ex := postAny(t, srv.url, "k1", []byte(`{"wait":"10s","input":{"limit":"ten"},"workflow":{"version":1,
					"connections":{"pets":{}},"root":{"kind":"call","id":"list","connection":"pets","op":"listPets",
					"args":{"limit":{"$expr":"$input.limit"}}}}}`))
				e, _ := ex["error"].(map[string]any)
				if ex["status"] != "failed" || e["code"] != "steering_denied" || e["gate"] != 2.0 {
					t.Fatalf("execution: %v", ex)
				}
				if n := api.apiCalls.Load(); n != before {
					t.Fatalf("%d requests reached the API", n-before)
				}
			})

			t.Run("an API error is a failed call, its body redacted", func(t *testing.T) {
				ex := postAny(t, srv.url, "k1", []byte(`{"wait":"10s","workflow":{"version":1,
					"connections":{"pets":{}},"root":{"kind":"call","id":"read","connection":"pets","op":"showPetById",
					"args":{"petId":"a b?c"}}}}`))
				// The server sees one path segment "a b?c": the value was
				// escaped.
				text := fmt.Sprint(ex)
				if ex["status"] != "failed" || !strings.Contains(text, "HTTP 404") || !strings.Contains(text, "no pet a b?c") {
					t.Fatalf("execution: %v", ex)
				}
				if !strings.Contains(text, `"sentKey":"<redacted>", "tenant":"<redacted>"`) {
					t.Fatalf("the echoed headers are not redacted: %v", ex)
				}
				checkNoSecret(t, srv.url, ex["id"].(string), key, tenant)
			})

			if out := srv.output.String(); strings.Contains(out, key) || strings.Contains(out, tenant) {
				t.Fatal("a header's secret reached the log")
			}
		})
	}
}

// postAny posts an execution and returns its record whatever the status.
func postAny(t *testing.T, base, key string, body []byte) map[string]any {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/executions", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("POST = %d %s", resp.StatusCode, data)
	}
	return m
}

// checkNoSecret reads an execution's record and its events and fails when
// a secret appears in either.
func checkNoSecret(t *testing.T, base, id string, secrets ...string) {
	t.Helper()
	checkNoSecretAs(t, base, "k1", id, secrets...)
}

// checkNoSecretAs is checkNoSecret for an execution of the API key key.
func checkNoSecretAs(t *testing.T, base, key, id string, secrets ...string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	for _, path := range []string{"/v1/executions/" + id, "/v1/executions/" + id + "/events"} {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(data) == 0 {
			t.Fatalf("GET %s = %d %s", path, resp.StatusCode, data)
		}
		for _, secret := range secrets {
			if strings.Contains(string(data), secret) {
				t.Fatalf("GET %s shows a secret:\n%s", path, data)
			}
		}
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	getJSONAs(t, url, "k1", v)
}
