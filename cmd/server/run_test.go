package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/demo"
)

var demoBin, serverBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "patchbay-server-test")
	if err != nil {
		panic(err)
	}
	demoBin = filepath.Join(dir, "demo-mcp")
	if out, err := exec.Command("go", "build", "-o", demoBin, "../demo-mcp").CombinedOutput(); err != nil {
		panic(fmt.Sprintf("build demo-mcp: %v\n%s", err, out))
	}
	serverBin = filepath.Join(dir, "server")
	if out, err := exec.Command("go", "build", "-o", serverBin, ".").CombinedOutput(); err != nil {
		panic(fmt.Sprintf("build server: %v\n%s", err, out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// syncBuffer collects the server's output for the test to read while it
// runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type server_ struct {
	url    string
	output *syncBuffer
	stop   func() error
}

var listening = regexp.MustCompile(`patchbay listening on (http://\S+)`)

// start runs the server in-process with env, returning once it is ready.
func start(t *testing.T, env map[string]string) *server_ {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, func(k string) string { return env[k] }, out) }()
	stop := sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			return errors.New("server did not stop within 20s")
		}
	})
	t.Cleanup(func() { _ = stop() })
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := listening.FindStringSubmatch(out.String()); m != nil {
			if resp, err := http.Get(m[1] + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return &server_{url: m[1], output: out, stop: stop}
				}
			}
		}
		select {
		case err := <-done:
			t.Fatalf("server exited: %v\n%s", err, out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("server not ready:\n%s", out)
	return nil
}

func writeConfig(t testing.TB, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "patchbay.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// redisModes are the stores the end-to-end test runs on: the embedded one
// always, the real one when PATCHBAY_TEST_REDIS_URL is set (required in CI).
func redisModes(t *testing.T) map[string]string {
	modes := map[string]string{"embedded": ""}
	if url := os.Getenv("PATCHBAY_TEST_REDIS_URL"); url != "" {
		modes["redis"] = url
	} else if os.Getenv("CI") == "true" {
		t.Fatal("CI requires PATCHBAY_TEST_REDIS_URL")
	}
	return modes
}

func TestThreeCallWorkflowOverStdioAndHTTP(t *testing.T) {
	t.Parallel()
	mcpHTTP := httptest.NewServer(server.NewStreamableHTTPServer(demo.NewServer()))
	t.Cleanup(mcpHTTP.Close)
	cfg := writeConfig(t, fmt.Sprintf(`
name: e2e
connections:
  stdio:
    mcp: { command: %q }
  remote:
    mcp: { type: http, url: %q }
allowlists:
  default:
    connections:
      stdio: { ops: ["*"] }
      remote: { ops: ["add", "note_*"] }
`, demoBin, mcpHTTP.URL+"/mcp"))

	for mode, redisURL := range redisModes(t) {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := start(t, map[string]string{
				"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
				"REDIS_URL": redisURL, "PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
			})
			for _, conn := range []string{"stdio", "remote"} {
				t.Run(conn, func(t *testing.T) {
					ex := post(t, srv.url, "k1", helloFor(t, conn))
					if ex["status"] != "succeeded" {
						t.Fatalf("execution: %v", ex)
					}
					out, _ := ex["output"].(map[string]any)
					if out["value"] != "hello, patchbay: 5" {
						t.Fatalf("output = %v", ex["output"])
					}
					steps := ex["steps"].([]any)
					if len(steps) != 3 || steps[0].(map[string]any)["output"].(map[string]any)["sum"] != 5.0 {
						t.Fatalf("steps = %v", steps)
					}
				})
			}
			if err := srv.stop(); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			if !strings.Contains(srv.output.String(), "shutting down") {
				t.Fatalf("no shutdown line:\n%s", srv.output)
			}
		})
	}
}

// helloFor is examples/hello.json with its connection renamed.
func helloFor(t *testing.T, conn string) []byte {
	t.Helper()
	data, err := os.ReadFile("../../examples/hello.json")
	if err != nil {
		t.Fatal(err)
	}
	return bytes.ReplaceAll(data, []byte(`"demo"`), []byte(`"`+conn+`"`))
}

func post(t *testing.T, base, key string, body []byte) map[string]any {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/executions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("POST = %d %s", resp.StatusCode, data)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestBadConfigIsAValidationError(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, "connections:\n  1bad:\n    mcp: { url: 'ftp://x' }\n")
	err := run(context.Background(), nil, envMap{"PATCHBAY_CONFIG": cfg, "PATCHBAY_WORKERS": "0"}.get, io.Discard)
	var ve *config.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) < 2 {
		t.Fatalf("run = %v, want every problem", err)
	}
}

func TestGeneratedKeyIsPrinted(t *testing.T) {
	t.Parallel()
	srv := start(t, map[string]string{"PATCHBAY_ADDR": "127.0.0.1:0"})
	m := regexp.MustCompile(`API key is: (pb_\S+)`).FindStringSubmatch(srv.output.String())
	if m == nil {
		t.Fatalf("no key printed:\n%s", srv.output)
	}
	req, _ := http.NewRequest("GET", srv.url+"/v1/connections", nil)
	req.Header.Set("Authorization", "Bearer "+m[1])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("with the printed key: %d", resp.StatusCode)
	}
}

type envMap map[string]string

func (e envMap) get(k string) string { return e[k] }

// TestDocumentBringsAServer: a document attaches the demo MCP server over
// Streamable HTTP, granted by its exact URL, with a header from a secret.
func TestDocumentBringsAServer(t *testing.T) {
	t.Parallel()
	mcpHTTP := httptest.NewServer(server.NewStreamableHTTPServer(demo.NewServer()))
	t.Cleanup(mcpHTTP.Close)
	url := mcpHTTP.URL + "/mcp"
	cfg := writeConfig(t, fmt.Sprintf(`
allowlists:
  default:
    mcp:
      - { name: notes, url: %q, secrets: [notes.token], ops: ["echo"] }
`, url))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
		"PATCHBAY_SECRET_NOTES_TOKEN": "tok-attached-0123456789",
	})
	doc := fmt.Sprintf(`{"wait":"10s","workflow":{"version":1,"connections":{"notes":{"mcp":{"name":"notes","type":"http","url":%q,
		"headers":{"X-Token":{"$secret":"notes.token"}}}}},"root":{"echo":{"text":"from an attached server"}}}}`, url)
	ex := post(t, srv.url, "k1", []byte(doc))
	if ex["status"] != "succeeded" || ex["output"].(map[string]any)["text"] != "from an attached server" {
		t.Fatalf("execution: %v", ex)
	}
	if strings.Contains(srv.output.String(), "tok-attached-0123456789") {
		t.Fatal("the attached server's secret reached the log")
	}
}
