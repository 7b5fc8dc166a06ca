package acp

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// fsFixture is a root with a file, a subdirectory, and symlinks in and
// out of it, next to a secret outside it.
func fsFixture(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root = filepath.Join(base, "root")
	outside = filepath.Join(base, "outside")
	for _, dir := range []string{filepath.Join(root, "sub"), outside} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		filepath.Join(root, "a.txt"):        "one\ntwo\nthree\nfour\n",
		filepath.Join(root, "sub", "b.txt"): "bee",
		filepath.Join(outside, "secret"):    "secret",
	}
	for name, text := range files {
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		filepath.Join(root, "out"):      outside,                          // a directory outside
		filepath.Join(root, "secret"):   filepath.Join(outside, "secret"), // a file outside
		filepath.Join(root, "abs-in"):   filepath.Join(root, "sub"),       // absolute, stays inside
		filepath.Join(root, "rel-in"):   "sub/b.txt",                      // relative, stays inside
		filepath.Join(root, "dangling"): filepath.Join(outside, "new"),    // to a file not yet there
	}
	for name, target := range links {
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root, outside
}

func TestFSRead(t *testing.T) {
	t.Parallel()
	root, outside := fsFixture(t)
	f, err := newFS(FSOptions{Root: root, MaxBytes: 12})
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	tests := []struct {
		name        string
		path        string
		line, limit int
		want        string
		wantErr     string
	}{
		{"lines", filepath.Join(root, "a.txt"), 2, 2, "two\nthree\n", ""},
		{"from a line", filepath.Join(root, "a.txt"), 3, -1, "three\nfour\n", ""},
		{"no lines", filepath.Join(root, "a.txt"), 1, 0, "", ""},
		{"past the end", filepath.Join(root, "a.txt"), 9, -1, "", ""},
		{"size bound", filepath.Join(root, "a.txt"), 0, -1, "", "exceeds 12 bytes"},
		{"subdirectory", filepath.Join(root, "sub", "b.txt"), 0, -1, "bee", ""},
		{"dot dot inside", filepath.Join(root, "sub", "..", "sub", "b.txt"), 0, -1, "bee", ""},
		{"absolute symlink inside", filepath.Join(root, "abs-in", "b.txt"), 0, -1, "bee", ""},
		{"relative symlink inside", filepath.Join(root, "rel-in"), 0, -1, "bee", ""},
		{"dot dot escape", root + "/../outside/secret", 0, -1, "", "outside the directory"},
		{"symlinked directory escape", filepath.Join(root, "out", "secret"), 0, -1, "", "outside the directory"},
		{"symlinked file escape", filepath.Join(root, "secret"), 0, -1, "", "outside the directory"},
		{"outside", filepath.Join(outside, "secret"), 0, -1, "", "outside the directory"},
		{"relative path", "a.txt", 0, -1, "", "not absolute"},
		{"missing", filepath.Join(root, "nope.txt"), 0, -1, "", "does not exist"},
		{"directory", filepath.Join(root, "sub"), 0, -1, "", "not a regular file"},
		{"fifo", filepath.Join(root, "fifo"), 0, -1, "", "not a regular file"},
	}
	for _, tt := range tests {
		got, err := f.read(tt.path, tt.line, tt.limit)
		if tt.wantErr == "" && (err != nil || got != tt.want) {
			t.Errorf("%s: read = %q, %v; want %q", tt.name, got, err, tt.want)
		}
		if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s: read = %q, %v; want an error with %q", tt.name, got, err, tt.wantErr)
		}
	}
}

func TestFSWrite(t *testing.T) {
	t.Parallel()
	root, outside := fsFixture(t)
	f, err := newFS(FSOptions{Root: root, Write: true, MaxBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	tests := []struct {
		name, path, content, wantErr string
	}{
		{"new file", filepath.Join(root, "new.txt"), "hello", ""},
		{"overwrite", filepath.Join(root, "a.txt"), "short", ""},
		{"new directories", filepath.Join(root, "x", "y", "z.txt"), "deep", ""},
		{"through a symlink inside", filepath.Join(root, "abs-in", "c.txt"), "c", ""},
		{"size bound", filepath.Join(root, "big.txt"), strings.Repeat("x", 17), "exceeds 16 bytes"},
		{"dot dot escape", root + "/../outside/pwned", "x", "outside the directory"},
		{"symlinked directory escape", filepath.Join(root, "out", "pwned"), "x", "outside the directory"},
		{"symlinked file escape", filepath.Join(root, "secret"), "x", "outside the directory"},
		{"dangling symlink escape", filepath.Join(root, "dangling"), "x", "outside the directory"},
		{"relative path", "new.txt", "x", "not absolute"},
		{"fifo", filepath.Join(root, "fifo"), "x", "not a regular file"},
	}
	for _, tt := range tests {
		err := f.writeFile(tt.path, tt.content)
		if tt.wantErr == "" {
			got, rerr := os.ReadFile(tt.path)
			if err != nil || rerr != nil || string(got) != tt.content {
				t.Errorf("%s: write = %v; file %q, %v", tt.name, err, got, rerr)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: write = %v, want an error with %q", tt.name, err, tt.wantErr)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "secret" {
		t.Errorf("the secret outside became %q", b)
	}
	for _, name := range []string{"pwned", "new"} {
		if _, err := os.Lstat(filepath.Join(outside, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was written outside the root", name)
		}
	}
}

// TestFSRequests serves fs/* to an agent: declared in initialize, only
// for sessions of this connection, errors as JSON-RPC errors.
func TestFSRequests(t *testing.T) {
	t.Parallel()
	root, _ := fsFixture(t)
	var tr transcript
	conn, p := pipeConn(t, &recorder{}, Options{FS: &FSOptions{Root: root}, Wire: tr.wire})
	p.handshake(t.Context(), conn, `{}`)
	if !tr.contains(`"clientCapabilities":{"fs":{"readTextFile":true,"writeTextFile":false},"terminal":false}`) {
		t.Errorf("capabilities declared:\n%s", tr.String())
	}
	path, _ := json.Marshal(filepath.Join(root, "a.txt"))
	tests := []struct{ in, want string }{
		{`{"jsonrpc":"2.0","id":1,"method":"fs/read_text_file","params":{"sessionId":"s1","path":` + string(path) + `,"line":2,"limit":1}}`,
			`{"jsonrpc":"2.0","id":1,"result":{"content":"two\n"}}`},
		{`{"jsonrpc":"2.0","id":2,"method":"fs/read_text_file","params":{"sessionId":"other","path":` + string(path) + `}}`,
			`{"jsonrpc":"2.0","id":2,"error":{"code":-32602,"message":"unknown session \"other\""}}`},
		{`{"jsonrpc":"2.0","id":3,"method":"fs/read_text_file","params":{"sessionId":"s1","path":"/etc/passwd"}}`,
			`{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"/etc/passwd is outside the directory the agent may access"}}`},
		{`{"jsonrpc":"2.0","id":4,"method":"fs/write_text_file","params":{"sessionId":"s1","path":` + string(path) + `,"content":"x"}}`,
			`{"jsonrpc":"2.0","id":4,"error":{"code":-32601,"message":"Method not found","data":{"method":"fs/write_text_file"}}}`},
	}
	for _, tt := range tests {
		p.send(tt.in)
		m := p.recv()
		got, _ := json.Marshal(struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Result  json.RawMessage `json:"result,omitempty"`
			Error   *RPCError       `json:"error,omitempty"`
		}{"2.0", m.ID, m.Result, m.Error})
		if string(got) != tt.want {
			t.Errorf("%s\n got %s\nwant %s", tt.in, got, tt.want)
		}
	}
}
