package drive_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/drive"
	"github.com/patchbay-dev/patchbay/internal/drive/drivetest"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

const (
	docMIME    = "application/vnd.google-apps.document"
	sheetMIME  = "application/vnd.google-apps.spreadsheet"
	slidesMIME = "application/vnd.google-apps.presentation"
)

type bundle struct {
	fake *drivetest.Drive
	conn connect.Conn
}

// setup is a fake Drive with alice's and bob's tokens and a connected
// per-user provider over it (no service account).
func setup(t *testing.T, spec config.Drive) *bundle {
	t.Helper()
	fake := drivetest.New(t, map[string]string{"tok-alice": "alice", "tok-bob": "bob"})
	spec.APIBaseURL, spec.UploadBaseURL = fake.APIURL(), fake.UploadURL()
	c, err := drive.New("gdrive", spec, nil).Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{fake: fake, conn: c}
}

// as calls op with user's token, as the harness does after gate 6.
func (b *bundle) as(t *testing.T, user, op string, args map[string]any) (map[string]any, error) {
	t.Helper()
	out, err := b.conn.Call(context.Background(), connect.CallRequest{
		Op: op, Args: args, Principal: user, Headers: map[string]string{"Authorization": "Bearer tok-" + user},
	})
	if err != nil {
		return nil, err
	}
	m, ok := out.(map[string]any)
	if !ok {
		t.Fatalf("%s returned %T, want an object", op, out)
	}
	return m, nil
}

func (b *bundle) must(t *testing.T, user, op string, args map[string]any) map[string]any {
	t.Helper()
	out, err := b.as(t, user, op, args)
	if err != nil {
		t.Fatalf("%s %v: %v", op, args, err)
	}
	return out
}

func callError(t *testing.T, err error, contains string) {
	t.Helper()
	var ce *connect.CallError
	if !errors.As(err, &ce) || !strings.Contains(ce.Message, contains) {
		t.Fatalf("err = %v, want a CallError containing %q", err, contains)
	}
}

func fileOf(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	f, ok := m["file"].(map[string]any)
	if !ok {
		t.Fatalf("no file in %v", m)
	}
	return f
}

// TestManifest: eight tools with precise schemas and every hint declared;
// the read-only ones are exactly list, find and read, and delete is the
// destructive one. Their model ids are <connection>_<tool>.
func TestManifest(t *testing.T) {
	t.Parallel()
	b := setup(t, config.Drive{})
	var names []string
	for _, op := range b.conn.Manifest().Operations {
		names = append(names, op.Name)
		a := op.Annotations
		if a.ReadOnlyHint == nil || a.DestructiveHint == nil || a.IdempotentHint == nil || a.OpenWorldHint == nil {
			t.Errorf("%s: undeclared hints %+v", op.Name, a)
			continue
		}
		wantRO := op.Name == "list_files" || op.Name == "find_file" || op.Name == "read_file"
		if *a.ReadOnlyHint != wantRO || *a.DestructiveHint != (op.Name == "delete_file") {
			t.Errorf("%s: readOnly %v destructive %v", op.Name, *a.ReadOnlyHint, *a.DestructiveHint)
		}
	}
	want := "list_files find_file read_file create_file update_file save_file create_folder delete_file"
	if strings.Join(names, " ") != want {
		t.Fatalf("operations = %v", names)
	}
	ids := connect.ToolIDs("gdrive", names)
	if ids["read_file"] != "gdrive_read_file" || ids["delete_file"] != "gdrive_delete_file" {
		t.Fatalf("tool ids = %v", ids)
	}
	if info := b.conn.Info(); info["rootFolderId"] != "root" || info["auth"] != "oauth" {
		t.Fatalf("info = %v", info)
	}
}

// TestSchemas: gate 2 compiles each schema and holds a call to it: one of
// fileId and path, never both; folderId or folderPath, not both; no
// unknown arguments; ids that could not be ids are refused.
func TestSchemas(t *testing.T) {
	t.Parallel()
	b := setup(t, config.Drive{})
	schemas := map[string]*jsonschema.Schema{}
	for _, op := range b.conn.Manifest().Operations {
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(op.InputSchema)))
		if err != nil {
			t.Fatal(err)
		}
		c := jsonschema.NewCompiler()
		if err := c.AddResource("op.json", doc); err != nil {
			t.Fatal(err)
		}
		if schemas[op.Name], err = c.Compile("op.json"); err != nil {
			t.Fatalf("%s: %v", op.Name, err)
		}
	}
	for _, tc := range []struct {
		op, args string
		ok       bool
	}{
		{"read_file", `{"fileId": "abc_-1"}`, true},
		{"read_file", `{"path": "A/b.txt"}`, true},
		{"read_file", `{}`, false},
		{"read_file", `{"fileId": "abc", "path": "A/b.txt"}`, false},
		{"read_file", `{"fileId": "x' or '1'='1"}`, false},
		{"read_file", `{"fileId": "abc", "extra": 1}`, false},
		{"delete_file", `{"path": "a"}`, true},
		{"delete_file", `{}`, false},
		{"list_files", `{}`, true},
		{"list_files", `{"q": "name contains 'a'", "folderId": "f1", "pageSize": 10, "pageToken": "t"}`, true},
		{"list_files", `{"pageSize": 0}`, false},
		{"list_files", `{"pageSize": 1001}`, false},
		{"find_file", `{"path": ""}`, false},
		{"create_file", `{"name": "a.txt", "content": "x", "folderPath": "A"}`, true},
		{"create_file", `{"name": "a.txt", "content": "x", "folderId": "f", "folderPath": "A"}`, false},
		{"create_file", `{"name": "a/b.txt", "content": "x"}`, false},
		{"create_file", `{"name": "a.txt"}`, false},
		{"update_file", `{"fileId": "f", "content": ""}`, true},
		{"save_file", `{"path": "A/b.txt", "content": "x", "mimeType": "text/markdown"}`, true},
		{"create_folder", `{"name": "A", "parentId": "p", "parentPath": "B"}`, false},
		{"create_folder", `{"name": "A"}`, true},
	} {
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(tc.args))
		if err != nil {
			t.Fatal(err)
		}
		if err := schemas[tc.op].Validate(v); (err == nil) != tc.ok {
			t.Errorf("%s %s: valid = %v, want %v (%v)", tc.op, tc.args, err == nil, tc.ok, err)
		}
	}
}

// TestTools runs every tool against the fake and checks the requests
// went out as Google documents them: content created with a multipart
// upload, replaced with a media upload, read with alt=media, Workspace
// files exported.
func TestTools(t *testing.T) {
	t.Parallel()
	b := setup(t, config.Drive{})
	fake := b.fake

	reports := fileOf(t, map[string]any{"file": b.must(t, "alice", "create_folder", map[string]any{"name": "Reports"})})
	if reports["mimeType"] != drive.FolderMIME || reports["parents"].([]any)[0] != "root" {
		t.Fatalf("folder = %v", reports)
	}
	saved := b.must(t, "alice", "save_file", map[string]any{"path": "Reports/2026/q1.txt", "content": "first"})
	q1 := fileOf(t, saved)
	if saved["created"] != true || q1["name"] != "q1.txt" {
		t.Fatalf("save_file = %v", saved)
	}
	again := b.must(t, "alice", "save_file", map[string]any{"path": "/Reports/2026/q1.txt", "content": "second", "mimeType": "text/markdown"})
	if again["created"] != false || fileOf(t, again)["id"] != q1["id"] {
		t.Fatalf("second save_file = %v", again)
	}
	if got := string(fake.File("tok-alice", q1["id"].(string)).Content); got != "second" {
		t.Fatalf("content after save = %q", got)
	}

	found := b.must(t, "alice", "find_file", map[string]any{"path": "Reports/2026/q1.txt"})
	if found["found"] != true || fileOf(t, found)["id"] != q1["id"] {
		t.Fatalf("find_file = %v", found)
	}
	if nf := b.must(t, "alice", "find_file", map[string]any{"path": "Reports/2027/q1.txt"}); nf["found"] != false || len(nf) != 1 {
		t.Fatalf("find_file of a missing path = %v", nf)
	}
	for _, args := range []map[string]any{{"path": "Reports/2026/q1.txt"}, {"fileId": q1["id"]}} {
		r := b.must(t, "alice", "read_file", args)
		if r["content"] != "second" || r["encoding"] != "utf-8" || r["exportedAs"] != nil {
			t.Fatalf("read_file %v = %v", args, r)
		}
	}

	created := b.must(t, "alice", "create_file", map[string]any{"name": "notes.md", "content": "# notes", "mimeType": "text/markdown", "folderPath": "Reports"})
	if created["mimeType"] != "text/markdown" || created["parents"].([]any)[0] != reports["id"] {
		t.Fatalf("create_file = %v", created)
	}
	if _, err := b.as(t, "alice", "create_file", map[string]any{"name": "x.txt", "content": "x", "folderPath": "Nowhere"}); err == nil {
		t.Fatal("create_file into a missing folderPath succeeded")
	} else {
		callError(t, err, `no folder "Nowhere"`)
	}
	updated := b.must(t, "alice", "update_file", map[string]any{"fileId": created["id"], "content": "# notes, v2"})
	if updated["id"] != created["id"] || string(fake.File("tok-alice", created["id"].(string)).Content) != "# notes, v2" {
		t.Fatalf("update_file = %v", updated)
	}

	list := b.must(t, "alice", "list_files", map[string]any{"folderId": reports["id"]})
	if n := len(list["files"].([]any)); n != 2 { // 2026 and notes.md
		t.Fatalf("list_files of Reports = %v", list)
	}
	search := b.must(t, "alice", "list_files", map[string]any{"q": "name contains 'Q1'"})
	if fs := search["files"].([]any); len(fs) != 1 || fs[0].(map[string]any)["id"] != q1["id"] {
		t.Fatalf("list_files q = %v", search)
	}
	root := b.must(t, "alice", "list_files", map[string]any{"pageSize": 10})
	if fs := root["files"].([]any); len(fs) != 1 || fs[0].(map[string]any)["id"] != reports["id"] {
		t.Fatalf("list_files of the root = %v", root)
	}
	if sub := b.must(t, "alice", "create_folder", map[string]any{"name": "Drafts", "parentPath": "Reports/2026"}); sub["parents"].([]any)[0] == reports["id"] {
		t.Fatalf("create_folder parentPath = %v", sub)
	}

	del := b.must(t, "alice", "delete_file", map[string]any{"path": "Reports/notes.md"})
	if del["deleted"] != true || del["fileId"] != created["id"] || fake.File("tok-alice", created["id"].(string)) != nil {
		t.Fatalf("delete_file = %v", del)
	}
	if _, err := b.as(t, "alice", "delete_file", map[string]any{"fileId": created["id"]}); err == nil {
		t.Fatal("deleting a deleted file succeeded")
	} else {
		callError(t, err, "HTTP 404 notFound: File not found")
	}

	// How the requests went out.
	var multipart, media, altMedia int
	for _, r := range fake.Requests() {
		q := r.Query()
		switch {
		case r.Method == "POST" && r.Path == "/upload/drive/v3/files" && q.Get("uploadType") == "multipart":
			multipart++
		case r.Method == "PATCH" && strings.HasPrefix(r.Path, "/upload/drive/v3/files/") && q.Get("uploadType") == "media":
			media++
		case r.Method == "GET" && q.Get("alt") == "media":
			altMedia++
		}
		if r.Owner != "alice" {
			t.Errorf("request %s %s carried %q", r.Method, r.Path, r.Auth)
		}
	}
	if multipart != 2 || media != 2 || altMedia != 2 {
		t.Fatalf("multipart %d, media %d, alt=media %d; want 2 each", multipart, media, altMedia)
	}
}

// TestReadFormats: Docs and Slides are exported as text/plain, Sheets as
// text/csv; binary content comes back as base64; folders, other
// Workspace types and files over maxFileBytes are refused before any
// content is fetched.
func TestReadFormats(t *testing.T) {
	t.Parallel()
	b := setup(t, config.Drive{MaxFileBytes: 16})
	f := b.fake
	doc := f.Add("tok-alice", "Plan", docMIME, "root", "the plan")
	sheet := f.Add("tok-alice", "Budget", sheetMIME, "root", "a,b\n1,2\n")
	slides := f.Add("tok-alice", "Deck", slidesMIME, "root", "slide one")
	f.Add("tok-alice", "logo.png", "image/png", "root", "\x89PNG\r\n\x1a\n\xff")
	big := f.Add("tok-alice", "big.txt", "text/plain", "root", strings.Repeat("x", 17))
	folder := f.Add("tok-alice", "Folder", drive.FolderMIME, "root", "")
	form := f.Add("tok-alice", "Survey", "application/vnd.google-apps.form", "root", "")

	for _, tc := range []struct{ id, content, as string }{
		{doc, "the plan", "text/plain"}, {sheet, "a,b\n1,2\n", "text/csv"}, {slides, "slide one", "text/plain"},
	} {
		r := b.must(t, "alice", "read_file", map[string]any{"fileId": tc.id})
		if r["content"] != tc.content || r["exportedAs"] != tc.as {
			t.Fatalf("read_file %s = %v", tc.id, r)
		}
	}
	r := b.must(t, "alice", "read_file", map[string]any{"path": "logo.png"})
	if raw, _ := base64.StdEncoding.DecodeString(r["content"].(string)); r["encoding"] != "base64" || string(raw) != "\x89PNG\r\n\x1a\n\xff" {
		t.Fatalf("binary read = %v", r)
	}
	before := len(f.Requests())
	for id, want := range map[string]string{big: "17 bytes, more than the 16", folder: "is a folder", form: "has no text form"} {
		_, err := b.as(t, "alice", "read_file", map[string]any{"fileId": id})
		callError(t, err, want)
	}
	for _, r := range f.Requests()[before:] {
		if r.Query().Get("alt") == "media" || strings.HasSuffix(r.Path, "/export") {
			t.Fatalf("content fetched for a refused read: %+v", r)
		}
	}
	// A Workspace file has no size to check first: its export is cut off
	// at the bound and refused.
	long := f.Add("tok-alice", "Long", docMIME, "root", strings.Repeat("z", 17))
	_, err := b.as(t, "alice", "read_file", map[string]any{"fileId": long})
	callError(t, err, "larger than 16 bytes, the most this connection reads")
	if _, err := b.as(t, "alice", "save_file", map[string]any{"path": "x.txt", "content": strings.Repeat("y", 17)}); err == nil {
		t.Fatal("a write over maxFileBytes was sent")
	} else {
		callError(t, err, "more than the 16 this connection writes")
	}
}

// TestAmbiguousPaths: a name two siblings share fails every path lookup
// through it, naming both ids, instead of picking one; nothing is
// written.
func TestAmbiguousPaths(t *testing.T) {
	t.Parallel()
	b := setup(t, config.Drive{})
	f := b.fake
	a1 := f.Add("tok-alice", "dup.txt", "text/plain", "root", "one")
	a2 := f.Add("tok-alice", "dup.txt", "text/plain", "root", "two")
	p1 := f.Add("tok-alice", "Projects", drive.FolderMIME, "root", "")
	p2 := f.Add("tok-alice", "Projects", drive.FolderMIME, "root", "")
	f.Add("tok-alice", "readme.txt", "text/plain", p1, "in p1")
	f.SetPageCap(1) // Drive may split the matches over pages

	for _, tc := range []struct {
		op   string
		args map[string]any
		ids  []string
	}{
		{"find_file", map[string]any{"path": "dup.txt"}, []string{a1, a2}},
		{"read_file", map[string]any{"path": "dup.txt"}, []string{a1, a2}},
		{"delete_file", map[string]any{"path": "dup.txt"}, []string{a1, a2}},
		{"save_file", map[string]any{"path": "dup.txt", "content": "three"}, []string{a1, a2}},
		{"find_file", map[string]any{"path": "Projects/readme.txt"}, []string{p1, p2}},
		{"save_file", map[string]any{"path": "Projects/new.txt", "content": "x"}, []string{p1, p2}},
		{"create_file", map[string]any{"name": "n.txt", "content": "x", "folderPath": "Projects"}, []string{p1, p2}},
	} {
		before := len(f.Requests())
		_, err := b.as(t, "alice", tc.op, tc.args)
		callError(t, err, fmt.Sprintf("ids %s, %s", tc.ids[0], tc.ids[1]))
		for _, r := range f.Requests()[before:] {
			if r.Method != "GET" {
				t.Fatalf("%s %v sent %s %s", tc.op, tc.args, r.Method, r.Path)
			}
		}
	}
	if string(f.File("tok-alice", a1).Content) != "one" || f.File("tok-alice", a2) == nil {
		t.Fatal("an ambiguous path changed a file")
	}
}

// TestQuoting: names with quotes and backslashes are escaped in the
// query as Drive's syntax says, and found.
func TestQuoting(t *testing.T) {
	t.Parallel()
	b := setup(t, config.Drive{})
	name := `it's a \ name' or name contains '.txt`
	dir := b.fake.Add("tok-alice", `Bob's \folder`, drive.FolderMIME, "root", "")
	id := b.fake.Add("tok-alice", name, "text/plain", dir, "quoted")
	b.fake.Add("tok-alice", "other.txt", "text/plain", dir, "not this")
	r := b.must(t, "alice", "read_file", map[string]any{"path": `Bob's \folder/` + name})
	if r["content"] != "quoted" || fileOf(t, r)["id"] != id {
		t.Fatalf("read_file = %v", r)
	}
	var qs []string
	for _, s := range b.fake.Requests() {
		qs = append(qs, s.Query().Get("q"))
	}
	want := `'` + dir + `' in parents and name = 'it\'s a \\ name\' or name contains \'.txt' and trashed = false`
	if !strings.Contains(strings.Join(qs, "\n"), want) {
		t.Fatalf("queries sent:\n%s\nwant one:\n%s", strings.Join(qs, "\n"), want)
	}
}

// TestRootFolder: paths and the default listing start at rootFolderId.
func TestRootFolder(t *testing.T) {
	t.Parallel()
	fake := drivetest.New(t, map[string]string{"tok-alice": "alice"})
	shared := fake.Add("tok-alice", "Shared", drive.FolderMIME, "root", "")
	fake.Add("tok-alice", "a.txt", "text/plain", "root", "outside")
	fake.Add("tok-alice", "a.txt", "text/plain", shared, "inside")
	c, err := drive.New("gdrive", config.Drive{RootFolderID: shared, APIBaseURL: fake.APIURL(), UploadBaseURL: fake.UploadURL()}, nil).Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{fake: fake, conn: c}
	if r := b.must(t, "alice", "read_file", map[string]any{"path": "a.txt"}); r["content"] != "inside" {
		t.Fatalf("read_file = %v", r)
	}
	if l := b.must(t, "alice", "list_files", map[string]any{}); len(l["files"].([]any)) != 1 {
		t.Fatalf("list_files = %v", l)
	}
	saved := b.must(t, "alice", "save_file", map[string]any{"path": "new/b.txt", "content": "b"})
	dir := fake.File("tok-alice", fileOf(t, saved)["parents"].([]any)[0].(string))
	if dir.Name != "new" || dir.Parents[0] != shared {
		t.Fatalf("folder created at %+v", dir)
	}
}

// TestPerUser: alice's and bob's calls each carry their own token (and
// so see their own Drive), also when they run at once; a call without
// credentials sends nothing and asks for a sign-in; a token Drive
// refuses asks the harness to refresh it.
func TestPerUser(t *testing.T) {
	t.Parallel()
	b := setup(t, config.Drive{})
	b.fake.Add("tok-alice", "me.txt", "text/plain", "root", "alice's")
	b.fake.Add("tok-bob", "me.txt", "text/plain", "root", "bob's")
	var wg sync.WaitGroup
	for i := range 20 {
		user := []string{"alice", "bob"}[i%2]
		wg.Go(func() {
			r, err := b.as(t, user, "read_file", map[string]any{"path": "me.txt"})
			if err != nil || r["content"] != user+"'s" {
				t.Errorf("%s read %v, %v", user, r, err)
			}
		})
	}
	wg.Wait()
	for _, r := range b.fake.Requests() {
		if r.Auth != "Bearer tok-"+r.Owner {
			t.Fatalf("request %+v", r)
		}
	}

	before := len(b.fake.Requests())
	_, err := b.conn.Call(context.Background(), connect.CallRequest{Op: "list_files", Args: map[string]any{}})
	if !errors.Is(err, connect.ErrNeedsSignIn) {
		t.Fatalf("a call without credentials: %v", err)
	}
	if len(b.fake.Requests()) != before {
		t.Fatal("a call without credentials was sent")
	}
	_, err = b.conn.Call(context.Background(), connect.CallRequest{Op: "list_files", Args: map[string]any{},
		Headers: map[string]string{"Authorization": "Bearer revoked"}})
	if !errors.Is(err, connect.ErrNeedsSignIn) {
		t.Fatalf("a refused token: %v", err)
	}
}

// TestResults: every result is plain JSON (it is stored in the ledger).
func TestResults(t *testing.T) {
	t.Parallel()
	b := setup(t, config.Drive{})
	out := b.must(t, "alice", "save_file", map[string]any{"path": "a/b.txt", "content": "c"})
	if _, err := json.Marshal(out); err != nil {
		t.Fatal(err)
	}
}
