package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// startDemoChat runs demo-mcp -profile chat over Streamable HTTP (a server
// that ignores idempotency keys: every chat.post it gets is a new
// message) and returns its URL.
func startDemoChat(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(demoBin, "-profile", "chat", "-http", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		if u, ok := strings.CutPrefix(lines.Text(), "demo-mcp listening on "); ok {
			go func() { _, _ = io.Copy(io.Discard, stderr) }()
			return u
		}
	}
	t.Fatalf("demo-mcp did not say where it listens: %v", lines.Err())
	return ""
}

// postTap stands between patchbay and the demo chat server: it counts the
// chat.post calls that reach the server by idempotency key (the server
// acts on each) and, when hold is set, keeps the answer of the first one
// from patchbay until the test lets go.
type postTap struct {
	mu    sync.Mutex
	posts map[string]int
	hold  bool
	held  chan struct{} // closed when an answer is held
	free  chan struct{} // closed to let it go
}

func newPostTap(t *testing.T, target string) (*postTap, string) {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	tap := &postTap{posts: map[string]int{}}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: u.Scheme, Host: u.Host})
	proxy.FlushInterval = -1 // server-sent events pass at once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		key := postKey(body)
		if key == "" {
			proxy.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		proxy.ServeHTTP(rec, r) // the server has acted
		tap.mu.Lock()
		tap.posts[key]++
		hold := tap.hold
		tap.hold = false
		tap.mu.Unlock()
		if hold {
			close(tap.held)
			<-tap.free
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(srv.Close)
	return tap, srv.URL + u.Path
}

// postKey is the idempotency key of a JSON-RPC chat.post call, "" for
// any other message.
func postKey(body []byte) string {
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Name string         `json:"name"`
			Meta map[string]any `json:"_meta"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &msg) != nil || msg.Method != "tools/call" || msg.Params.Name != "chat.post" {
		return ""
	}
	key, _ := msg.Params.Meta["io.patchbay/idempotency-key"].(string)
	return key
}

func (tap *postTap) count(key string) int {
	tap.mu.Lock()
	defer tap.mu.Unlock()
	return tap.posts[key]
}

// redisFreeze is a TCP proxy to Redis that, once a command writing a key
// containing marker has been answered, forwards nothing more to Redis:
// the process behind it is frozen right after that write, as if killed
// there.
type redisFreeze struct {
	marker []byte
	mu     sync.Mutex
	frozen bool
	done   chan struct{} // closed when frozen
	stop   chan struct{} // closed when the test ends
}

func newRedisFreeze(t *testing.T, redisAddr, marker string) (*redisFreeze, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &redisFreeze{marker: []byte(marker), done: make(chan struct{}), stop: make(chan struct{})}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(c, redisAddr)
		}
	}()
	t.Cleanup(func() { ln.Close(); close(f.stop) })
	return f, ln.Addr().String()
}

func (f *redisFreeze) isFrozen() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.frozen
}

func (f *redisFreeze) serve(client net.Conn, redisAddr string) {
	defer client.Close()
	server, err := net.Dial("tcp", redisAddr)
	if err != nil {
		return
	}
	defer server.Close()
	armed := make(chan struct{}, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 {
				// Frozen before the answer reaches the process: frozen
				// after, the process's next write (on another pooled
				// connection) could pass before the flag was set.
				select {
				case <-armed: // this is the marked write's answer
					f.mu.Lock()
					if !f.frozen {
						f.frozen = true
						close(f.done)
					}
					f.mu.Unlock()
				default:
				}
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			if f.isFrozen() {
				<-f.stop // never forwarded: the process is killed before
				return
			}
			chunk := buf[:n]
			if bytes.Contains(chunk, f.marker) && isSet(chunk) {
				armed <- struct{}{}
			}
			if _, werr := server.Write(chunk); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// isSet reports whether a RESP command is SET (first bulk string).
func isSet(cmd []byte) bool {
	parts := bytes.SplitN(cmd, []byte("\r\n"), 4)
	return len(parts) == 4 && strings.EqualFold(string(parts[2]), "set")
}

// TestOnceAcrossKillsOverTheDemoChat drives chat.post (once in chat@1) on
// demo-mcp -profile chat, which ignores idempotency keys, through the API,
// and kills the server process with SIGKILL between the rounds of an
// execution; a new process resumes it.
//
//   - Killed after the server answered and patchbay recorded the outcome,
//     before the step's ledger entry was done: the resumed run answers the
//     pending post from the record, so the post happened once.
//   - Killed while the post was in flight (the server acted, its answer
//     not yet back): the documented window. The resumed run sends the post
//     again with the same key, and this server, ignoring it, posts twice.
func TestOnceAcrossKillsOverTheDemoChat(t *testing.T) {
	redisURL := storetest.URL(t)
	if redisURL == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") that outlives the killed process")
	}
	t.Parallel()
	ru, err := url.Parse(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	tap, chatURL := newPostTap(t, startDemoChat(t))
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  chat: { mcp: { type: http, url: %q } }
allowlists:
  default: { connections: { chat: { ops: ["*"] } } }
`, chatURL))
	doc, _ := json.Marshal(map[string]any{"workflow": map[string]any{
		"version": 1, "connections": map[string]any{"chat": map[string]any{"profile": "chat@^1"}},
		"root": map[string]any{"kind": "sequence", "id": "rounds", "steps": []any{
			map[string]any{"kind": "call", "id": "first", "connection": "chat", "op": "chat.post", "args": map[string]any{"channel": "#one", "text": "first round"}},
			map[string]any{"kind": "call", "id": "second", "connection": "chat", "op": "chat.post", "args": map[string]any{"channel": "#two", "text": "second round"}},
		}},
	}})
	for _, tc := range []struct {
		name      string
		inFlight  bool
		wantFirst int
	}{
		{"killed after the outcome was recorded", false, 1},
		{"killed while the post was in flight", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := storetest.New(t)
			freeze, proxyAddr := newRedisFreeze(t, ru.Host, st.Prefix+"once:")
			viaProxy := *ru
			viaProxy.Host = proxyAddr
			r := &replica{bin: serverBin, addr: freeAddr(t), logPath: filepath.Join(t.TempDir(), "server.log")}
			env := func(redis string) []string {
				return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "REDIS_URL=" + redis,
					"PATCHBAY_REDIS_PREFIX=" + st.Prefix, "PATCHBAY_CONFIG=" + cfg, "PATCHBAY_ADDR=" + r.addr,
					"PATCHBAY_API_KEYS=once-key", "PATCHBAY_LOG_LEVEL=info", "PATCHBAY_WORKERS=1", "PATCHBAY_CLAIM_TIMEOUT=2s"}
			}
			r.env = env(viaProxy.String())
			if err := r.start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.kill)
			tap.mu.Lock()
			tap.hold, tap.held, tap.free = tc.inFlight, make(chan struct{}), make(chan struct{})
			tap.mu.Unlock()
			status, ex := post2(r.addr, "once-key", doc)
			if status != http.StatusAccepted {
				t.Fatalf("submit: %d %v", status, ex)
			}
			id := ex["id"].(string)
			stopAt := freeze.done
			if tc.inFlight {
				stopAt = tap.held
			}
			select {
			case <-stopAt:
			case <-time.After(30 * time.Second):
				logs, _ := os.ReadFile(r.logPath)
				t.Fatalf("the first post did not reach the kill point:\n%s", logs)
			}
			r.kill()
			close(tap.free)
			// Killed where meant: the first round's entry still pending,
			// and its outcome recorded or not.
			ledger, err := st.Client.HGetAll(context.Background(), st.Key("{exec:"+id+"}", "ledger")).Result()
			if err != nil {
				t.Fatal(err)
			}
			var entry struct{ Status string }
			for _, v := range ledger {
				if strings.Contains(v, `"first"`) {
					_ = json.Unmarshal([]byte(v), &entry)
				}
			}
			records, _ := st.Client.Keys(context.Background(), st.Key("once", "*")).Result()
			if entry.Status != "pending" || len(records) != map[bool]int{false: 1, true: 0}[tc.inFlight] {
				t.Fatalf("at the kill: first round %q, %d once records; ledger %v", entry.Status, len(records), ledger)
			}
			// The process comes back on Redis directly and resumes the run
			// once the dead one's claim has lapsed.
			r.env = env(redisURL)
			if err := r.start(); err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			until(t, "the resumed execution to end", 60*time.Second, func() bool {
				_, got = get2(r.addr, "once-key", "/v1/executions/"+id)
				return got["status"] == "succeeded" || got["status"] == "failed"
			})
			if got["status"] != "succeeded" {
				logs, _ := os.ReadFile(r.logPath)
				t.Fatalf("execution: %v\n%s", got, logs)
			}
			first, second := tap.count(id+":first"), tap.count(id+":second")
			if first != tc.wantFirst || second != 1 {
				t.Fatalf("the server posted %d times for the first round and %d for the second, want %d and 1", first, second, tc.wantFirst)
			}
			t.Logf("first round posted %d time(s), second %d", first, second)
		})
	}
}
