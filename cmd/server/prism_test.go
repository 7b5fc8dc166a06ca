package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/modeltest"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// These tests call real documents nobody here wrote, mocked by Stoplight
// Prism (see npmtest.Prism): Prism answers from the document's examples
// and checks every request patchbay sends against it, and an npmtest.Tap
// in front keeps what it was sent and what it found wrong.

// startPatchbay runs the server on cfg with the embedded store (or the
// real Redis) and the key k1.
func startPatchbay(t *testing.T, cfg, redisURL string, env ...string) *server_ {
	vars := map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
		"REDIS_URL": redisURL, "PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
	}
	for i := 0; i+1 < len(env); i += 2 {
		vars[env[i]] = env[i+1]
	}
	return start(t, vars)
}

// petstoreConfig is examples/petstore.yaml (the connections guide's example) pointed
// at tap and read from this directory.
func petstoreConfig(t *testing.T, tap string) string {
	data, err := os.ReadFile("../../examples/petstore.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.NewReplacer(
		"http://127.0.0.1:4010", tap,
		"./internal/openapi/testdata/", "../../internal/openapi/testdata/",
	).Replace(string(data))
	return writeConfig(t, cfg)
}

const petstoreToken = "pst-0123456789abcdef"

// TestPetstoreOnPrism runs the connections guide's example: the Swagger Petstore 3
// document, mocked by Prism, through examples/petstore.yaml and
// examples/petstore.json.
func TestPetstoreOnPrism(t *testing.T) {
	t.Parallel()
	tap := npmtest.NewTap(t, npmtest.Prism(t, "../../internal/openapi/testdata/petstore3.yaml"))
	cfg := petstoreConfig(t, tap.URL)
	workflow, err := os.ReadFile("../../examples/petstore.json")
	if err != nil {
		t.Fatal(err)
	}
	for mode, redisURL := range redisModes(t) {
		t.Run(mode, func(t *testing.T) {
			srv := startPatchbay(t, cfg, redisURL, "PATCHBAY_SECRET_PETSTORE_TOKEN", petstoreToken)

			t.Run("add, list, read", func(t *testing.T) {
				before := tap.Count()
				ex := post(t, srv.url, "k1", workflow)
				if ex["status"] != "succeeded" {
					t.Fatalf("execution: %v", ex)
				}
				out, _ := ex["output"].(map[string]any)
				if out["id"] != 10.0 || out["name"] != "doggie" {
					t.Fatalf("output = %v (Prism answers the document's example)", ex["output"])
				}
				npmtest.CheckClean(t, tap.Since(before), "POST /pet", "GET /pet/findByStatus", "GET /pet/10")
				checkNoSecret(t, srv.url, ex["id"].(string), petstoreToken)
			})

			t.Run("wrong type refused at gate 2", func(t *testing.T) {
				// Prism answers GET /pet/ten with 400 "petid must be
				// integer"; patchbay refuses it before sending anything.
				refusedAtGate2(t, srv, tap, `{"wait":"10s","workflow":{"version":1,
					"connections":{"pets":{}},"root":{"kind":"call","id":"read","connection":"pets","op":"getPetById",
					"args":{"petId":{"$expr":"$input.id"}}}},"input":{"id":"ten"}}`, "/pet/ten")
			})
		})
	}
}

// TestPetstoreAgentOnPrism runs the agent shorthand: the model calls an
// OpenAPI operation by its tool id, the call goes to Prism, and the
// model's answer is the execution's output.
func TestPetstoreAgentOnPrism(t *testing.T) {
	t.Parallel()
	tap := npmtest.NewTap(t, npmtest.Prism(t, "../../internal/openapi/testdata/petstore3.yaml"))
	llm := newScriptedLLM(t, "pets_getPetById", `{"petId": 10}`, "Pet 10 is doggie.")
	cfg := petstoreConfig(t, tap.URL)
	cfg = writeConfig(t, mustRead(t, cfg)+fmt.Sprintf("models:\n  local: { type: openai, baseURL: %q }\n", llm.URL+"/v1"))
	srv := startPatchbay(t, cfg, "", "PATCHBAY_SECRET_PETSTORE_TOKEN", petstoreToken)
	status, ex := post2(strings.TrimPrefix(srv.url, "http://"), "k1",
		[]byte(`{"agent":{"model":"local/llama3","instructions":"Say what pet 10 is."},"input":"go"}`))
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ex)
	}
	ex = waitDone(t, srv.url, ex["id"].(string))
	if ex["status"] != "succeeded" || ex["output"] != "Pet 10 is doggie." {
		t.Fatalf("execution = %v", ex)
	}
	npmtest.CheckClean(t, tap.Since(0), "GET /pet/10")
	llm.mu.Lock()
	defer llm.mu.Unlock()
	// The model sees the schema gate 2 checks: petId is an integer.
	var params struct {
		Properties map[string]struct {
			Type string `json:"type"`
		} `json:"properties"`
	}
	_ = json.Unmarshal(llm.offered["pets_getPetById"], &params)
	if params.Properties["petId"].Type != "integer" || len(llm.offered) != 8 || !strings.Contains(llm.result, "doggie") {
		t.Fatalf("tools offered %s; tool result sent back %q", llm.offered, llm.result)
	}
}

func mustRead(t *testing.T, path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// scriptedLLM speaks OpenAI's streaming Chat Completions: round 1 calls
// tool with args, round 2 answers text (newScriptedCalls: one round per
// call, then text). It keeps the tools it was offered and the tool
// results it was sent back.
type scriptedLLM struct {
	*httptest.Server
	mu      sync.Mutex
	offered map[string]json.RawMessage // tool id → its parameters
	result  string                     // the last tool result
	results []string
}

// scriptedCall is one tool call of a scripted round.
type scriptedCall = modeltest.ChatCall

func newScriptedLLM(t *testing.T, tool, args, text string) *scriptedLLM {
	return newScriptedCalls(t, []scriptedCall{{Tool: tool, Args: args}}, text)
}

func newScriptedCalls(t *testing.T, calls []scriptedCall, text string) *scriptedLLM {
	f := &scriptedLLM{offered: map[string]json.RawMessage{}}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Messages []struct {
				Role    string `json:"role"`
				Content any    `json:"content"`
			} `json:"messages"`
			Tools []struct {
				Function struct {
					Name       string          `json:"name"`
					Parameters json.RawMessage `json:"parameters"`
				} `json:"function"`
			} `json:"tools"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		round := 0
		f.results = nil
		for _, m := range body.Messages {
			if m.Role == "tool" {
				round++
				f.result = fmt.Sprint(m.Content)
				f.results = append(f.results, f.result)
			}
		}
		if round == 0 {
			for _, tl := range body.Tools {
				f.offered[tl.Function.Name] = tl.Function.Parameters
			}
		}
		f.mu.Unlock()
		modeltest.WriteChatTurn(w, "llama3", round, calls, text)
	}))
	t.Cleanup(f.Close)
	return f
}

// githubIssuePaths are the paths of GitHub's document the tests use:
// issues/list-for-repo and issues/create, issues/get (and issues/update).
var githubIssuePaths = []string{"/repos/{owner}/{repo}/issues", "/repos/{owner}/{repo}/issues/{issue_number}"}

// TestGitHubOnPrism lists, creates and reads issues through GitHub's own
// document (npm @octokit/openapi). Prism takes about 15 s and 300 MB to
// start on the whole 13 MB document, so it mocks a copy trimmed to the
// issue paths and the components they reach; patchbay loads the same
// copy.
func TestGitHubOnPrism(t *testing.T) {
	t.Parallel()
	dir := npmtest.Require(t, "octokit-openapi", "@octokit/openapi@23.0.2")
	doc := npmtest.TrimDocument(t, filepath.Join(dir, "generated", "api.github.com.json"), githubIssuePaths...)
	tap := npmtest.NewTap(t, npmtest.Prism(t, doc))
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  github:
    openapi:
      url: %q
      baseUrl: %q
      headers: { Authorization: "Bearer ${secret:github.token}" }
      include: [issues/list-for-repo, issues/create, issues/get]
allowlists:
  default: { connections: { github: { ops: ["*"] } } }
`, doc, tap.URL))
	const token = "ghp_0123456789abcdefghijklmnop"
	srv := startPatchbay(t, cfg, "", "PATCHBAY_SECRET_GITHUB_TOKEN", token)

	t.Run("list, create, read", func(t *testing.T) {
		before := tap.Count()
		ex := post(t, srv.url, "k1", []byte(`{"wait":"10s","workflow":{"version":1,
			"connections":{"github":{}},"root":{"kind":"sequence","id":"main","steps":[
			{"kind":"call","id":"list","connection":"github","op":"issues/list-for-repo",
			 "args":{"owner":"octocat","repo":"Hello-World","state":"open","labels":"bug","per_page":5}},
			{"kind":"call","id":"create","connection":"github","op":"issues/create",
			 "args":{"owner":"octocat","repo":"Hello-World","title":"Found a bug","body":"It breaks.","labels":["bug"]}},
			{"kind":"call","id":"read","connection":"github","op":"issues/get",
			 "args":{"owner":"octocat","repo":"Hello-World","issue_number":{"$expr":"$steps.create.number"}}}]}}}`))
		if ex["status"] != "succeeded" {
			t.Fatalf("execution: %v", ex)
		}
		steps := ex["steps"].([]any)
		if list, _ := steps[0].(map[string]any)["output"].([]any); len(list) == 0 {
			t.Fatalf("list step = %v", steps[0])
		}
		created, _ := steps[1].(map[string]any)["output"].(map[string]any)
		if created["number"] != 1347.0 || created["title"] != "Found a bug" {
			t.Fatalf("create step = %v", steps[1])
		}
		npmtest.CheckClean(t, tap.Since(before),
			"GET /repos/octocat/Hello-World/issues", "POST /repos/octocat/Hello-World/issues", "GET /repos/octocat/Hello-World/issues/1347")
		checkNoSecret(t, srv.url, ex["id"].(string), token)
	})

	t.Run("wrong type refused at gate 2", func(t *testing.T) {
		refusedAtGate2(t, srv, tap, `{"wait":"10s","workflow":{"version":1,
			"connections":{"github":{}},"root":{"kind":"call","id":"read","connection":"github","op":"issues/get",
			"args":{"owner":"octocat","repo":"Hello-World","issue_number":"one"}}}}`, "/repos/octocat/Hello-World/issues/one")
	})
}

// refusedAtGate2 posts an execution whose one call has an argument of the
// wrong type, and checks that patchbay refuses it at gate 2 with nothing
// sent to Prism, and that Prism itself answers a GET of path (that call's
// request) 4xx with a violation: what patchbay refused first is a request
// Prism would reject.
func refusedAtGate2(t *testing.T, srv *server_, tap *npmtest.Tap, execution, path string) {
	t.Helper()
	before := tap.Count()
	ex := postAny(t, srv.url, "k1", []byte(execution))
	e, _ := ex["error"].(map[string]any)
	if ex["status"] != "failed" || e["code"] != "steering_denied" || e["gate"] != 2.0 {
		t.Fatalf("execution: %v", ex)
	}
	if got := tap.Since(before); len(got) != 0 {
		t.Fatalf("Prism was sent %v", got)
	}
	url := tap.URL + path
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer any")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The violation is in the sl-violations header, or in a problem
	// body when the document declares no 4xx answer to give.
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 4 || !strings.Contains(resp.Header.Get("sl-violations")+string(body), "integer") {
		t.Fatalf("Prism answers GET %s with %d %q %s", url, resp.StatusCode, resp.Header.Get("sl-violations"), body)
	}
}
