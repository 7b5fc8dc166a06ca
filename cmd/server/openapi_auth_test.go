package main

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestOpenAPIOAuthWiring: auth on openapi entries is wired as on MCP
// ones. A shared entry needs a sign-in before it is ready (its calls all
// use the shared token); a per-user one is ready, reports its sign-in
// kind, and refuses at gate 6 a principal who has not signed in, with
// nothing sent to the API.
func TestOpenAPIOAuthWiring(t *testing.T) {
	t.Parallel()
	api := &petstore{key: "unused-key", tenant: "unused-tenant"}
	ts := httptest.NewServer(api)
	t.Cleanup(ts.Close)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  shared: { openapi: { url: %[1]q }, auth: oauth }
  mine:   { openapi: { url: %[1]q }, auth: { oauth: { scopes: [pets] }, perUser: true }, requiresPrincipal: true }
allowlists:
  default:
    connections:
      shared: { ops: ["*"] }
      mine: { ops: ["*"] }
`, ts.URL+"/openapi.yaml"))
	srv := start(t, map[string]string{"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1"})

	var shared, mine struct {
		Kind      string   `json:"kind"`
		State     string   `json:"state"`
		SignIn    string   `json:"signIn"`
		SignInURL string   `json:"signInUrl"`
		Tools     []string `json:"tools"`
	}
	getJSON(t, srv.url+"/v1/connections/shared", &shared)
	if shared.Kind != "openapi" || shared.State != "needs_sign_in" || shared.SignIn != "shared" || shared.SignInURL != "/oauth/shared/start" {
		t.Fatalf("shared = %+v, want needs_sign_in with its sign-in link", shared)
	}
	getJSON(t, srv.url+"/v1/connections/mine", &mine)
	if mine.State != "ready" || mine.SignIn != "per-user" || strings.Join(mine.Tools, " ") != "mine_listPets mine_createPet mine_showPetById" {
		t.Fatalf("mine = %+v", mine)
	}

	doc := `{"wait":"10s","workflow":{"version":1,"connections":{"mine":{}},"root":{"kind":"call","id":"list","connection":"mine","op":"listPets","args":{}}}}`
	ex := postAny(t, srv.url, "k1", []byte(doc))
	e, _ := ex["error"].(map[string]any)
	if ex["status"] != "failed" || e["code"] != "steering_denied" || e["gate"] != 6.0 || !strings.Contains(fmt.Sprint(e["message"]), "needs a sign-in") {
		t.Fatalf("execution = %v, want steering_denied at gate 6 for a sign-in", ex)
	}
	if n := api.apiCalls.Load(); n != 0 {
		t.Fatalf("%d requests reached the API", n)
	}
}
