package profiles_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/Masterminds/semver/v3"

	"github.com/patchbay-dev/patchbay/internal/profiles"
)

func TestBuiltinProfiles(t *testing.T) {
	cat := profiles.Builtin()
	got := strings.Join(cat.Names(), ",")
	if got != "browser@1.0.0,chat@1.0.0" {
		t.Fatalf("names = %s", got)
	}
	chat, ok := cat.Match("chat", nil)
	if !ok {
		t.Fatal("chat missing")
	}
	post := chat.Operations["chat.post"]
	if !post.Once || !post.Effects {
		t.Fatalf("chat.post marks = %+v", post)
	}
	if err := post.CheckInput(map[string]any{"channel": "c", "text": "hi"}); err != nil {
		t.Fatal(err)
	}
	if err := post.CheckInput(map[string]any{"channel": "c"}); err == nil {
		t.Fatal("missing text accepted")
	}
	if err := post.CheckOutput(map[string]any{"message": "m"}); err == nil {
		t.Fatal("output without thread accepted")
	}
	if chat.Events["chat.message.created"].Thread != "payload.thread" {
		t.Fatal("chat.message.created has no thread")
	}
	browser, _ := cat.Match("browser", nil)
	if browser.Reads["screen.current"].Sensitive[0] != "/data" || browser.Reads["ui.tree"].Look != profiles.LookEffect {
		t.Fatalf("browser reads = %+v", browser.Reads)
	}
	if browser.Setup.HostOnly[0] != "executable" {
		t.Fatal("executable is not host-only")
	}
}

// TestBuiltinReadsRender renders each shipped read from a value its
// schema allows: a render that does not run would fail every look.
func TestBuiltinReadsRender(t *testing.T) {
	cat := profiles.Builtin()
	browser, _ := cat.Match("browser", nil)
	chat, _ := cat.Match("chat", nil)
	cases := []struct {
		read  *profiles.Read
		value map[string]any
		want  string
	}{
		{browser.Reads["browser.page.summary"], map[string]any{"url": "http://a.test/", "title": "Home"}, "http://a.test/ — Home"},
		{browser.Reads["browser.page.summary"], map[string]any{"url": "http://a.test/"}, "http://a.test/"},
		{browser.Reads["browser.page.summary"], map[string]any{"url": "http://a.test/", "title": ""}, "http://a.test/"},
		{browser.Reads["ui.tree"], map[string]any{"tree": "- button \"Go\""}, "- button \"Go\""},
		{browser.Reads["screen.current"], map[string]any{"data": "[sensitive blob withheld]", "mimeType": "image/png"}, "[screenshot image/png]"},
		{chat.Reads["chat.thread.recent"], map[string]any{"messages": []any{map[string]any{"author": "ann", "text": "hi"}, map[string]any{"text": "yo"}}}, "ann: hi\n?: yo"},
	}
	for _, tc := range cases {
		if err := tc.read.CheckOutput(tc.value); err != nil {
			t.Fatalf("%v does not match the read's schema: %v", tc.value, err)
		}
		got, err := tc.read.Text(context.Background(), tc.value)
		if err != nil || got != tc.want {
			t.Errorf("render of %v = %q, %v; want %q", tc.value, got, err, tc.want)
		}
	}
}

// TestEagerSets: the shipped profiles list their common operations; a
// profile without a list has every operation eager, an empty list none.
func TestEagerSets(t *testing.T) {
	cat := profiles.Builtin()
	browser, _ := cat.Match("browser", nil)
	chat, _ := cat.Match("chat", nil)
	dir := t.TempDir()
	for name, body := range map[string]string{
		"all.yaml":  "profile: all\nversion: 1.0.0\noperations: {a.b: {input: {type: object}}, a.c: {input: {type: object}}}",
		"none.yaml": "profile: none\nversion: 1.0.0\neager: []\noperations: {a.b: {input: {type: object}}}",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := cat.LoadDir(dir); err != nil {
		t.Fatal(err)
	}
	all, _ := cat.Match("all", nil)
	none, _ := cat.Match("none", nil)
	for _, tc := range []struct {
		p    *profiles.Profile
		op   string
		want bool
	}{
		{browser, "navigate", true}, {browser, "ui.click", true}, {browser, "ui.fill", true}, {browser, "ui.press", true},
		{browser, "navigate.back", false}, {browser, "ui.hover", false}, {browser, "ui.select", false},
		{chat, "chat.post", true}, {chat, "chat.reply", true}, {chat, "chat.history", false},
		{all, "a.b", true}, {all, "a.c", true}, {all, "a.d", false},
		{none, "a.b", false},
	} {
		if got := tc.p.IsEager(tc.op); got != tc.want {
			t.Errorf("%s IsEager(%s) = %v, want %v", tc.p.ID(), tc.op, got, tc.want)
		}
	}
}

func TestBadProfileFile(t *testing.T) {
	cases := []struct {
		name, body, pointer string
	}{
		{"bad version", "profile: x\nversion: one\noperations: {a.b: {input: {type: object}}}", "/version"},
		{"bad name", "profile: X\nversion: 1.0.0\noperations: {a.b: {input: {type: object}}}", "/profile"},
		{"no operations", "profile: x\nversion: 1.0.0", "/operations"},
		{"input not object", "profile: x\nversion: 1.0.0\noperations: {a.b: {input: {type: string}}}", "/operations/a.b/input"},
		{"schema does not compile", "profile: x\nversion: 1.0.0\noperations: {a.b: {input: {type: object, minProperties: -1}}}", "/operations/a.b/input"},
		{"bad look", "profile: x\nversion: 1.0.0\noperations: {a.b: {input: {type: object}}}\nreads: {r: {look: never, output: {type: object}}}", "/reads/r/look"},
		{"render does not compile", "profile: x\nversion: 1.0.0\noperations: {a.b: {input: {type: object}}}\nreads: {r: {look: ask, output: {type: object}, render: 'value.('}}", "/reads/r/render"},
		{"thread does not compile", "profile: x\nversion: 1.0.0\noperations: {a.b: {input: {type: object}}}\nevents: {e: {payload: {type: object}, thread: '))'}}", "/events/e/thread"},
		{"sensitive not a property", "profile: x\nversion: 1.0.0\noperations: {a.b: {input: {type: object}}}\nreads: {r: {look: ask, output: {type: object, properties: {a: {}}}, sensitive: [/b]}}", "/reads/r/sensitive/0"},
		{"hostOnly not a property", "profile: x\nversion: 1.0.0\noperations: {a.b: {input: {type: object}}}\nsetup: {schema: {type: object}, hostOnly: [exe]}", "/setup/hostOnly/0"},
		{"unknown field", "profile: x\nversion: 1.0.0\nopertions: {}", ""},
		{"eager names no operation", "profile: x\nversion: 1.0.0\noperations: {a.b: {input: {type: object}}}\neager: [a.b, a.c]", "/eager/1"},
		{"eager lists one twice", "profile: x\nversion: 1.0.0\noperations: {a.b: {input: {type: object}}}\neager: [a.b, a.b]", "/eager/1"},
		{"read-only with effects", "profile: x\nversion: 1.0.0\noperations: {a.b: {input: {type: object}, readOnly: true, effects: true}}", "/operations/a.b/readOnly"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "bad.yaml")
			if err := os.WriteFile(path, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			err := profiles.Builtin().LoadDir(dir)
			var fe *profiles.FileError
			if !errors.As(err, &fe) || fe.Path != path {
				t.Fatalf("err = %v, want a FileError naming %s", err, path)
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name the file", err)
			}
			if tc.pointer != "" && fe.Problems[0].Pointer != tc.pointer {
				t.Fatalf("problems = %+v, want pointer %s", fe.Problems, tc.pointer)
			}
		})
	}
}

func TestLoadDirAddsVersions(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("chat12.yaml", "profile: chat\nversion: 1.2.0\noperations: {chat.post: {input: {type: object}}}")
	write("chat2.json", `{"profile": "chat", "version": "2.0.0", "operations": {"chat.send": {"input": {"type": "object"}}}}`)
	write("notes.txt", "not a profile")
	cat := profiles.Builtin()
	if err := cat.LoadDir(dir); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ ref, want string }{
		{"chat@^1", "chat@1.2.0"},
		{"chat@~1.0", "chat@1.0.0"},
		{"chat@>=1", "chat@2.0.0"},
		{"chat@^1.3", ""},
		{"chat@^3", ""},
	} {
		name, cons, err := profiles.ParseRef(tc.ref)
		if err != nil {
			t.Fatal(err)
		}
		p, ok := cat.Match(name, cons)
		got := ""
		if ok {
			got = p.ID()
		}
		if got != tc.want {
			t.Errorf("%s matched %q, want %q", tc.ref, got, tc.want)
		}
	}
	// A server implementing 1.1.0 is checked against 1.0.0, the newest
	// not newer than it in its major.
	p, _ := cat.ForVersion("chat", semver.MustParse("1.1.0"))
	if p.ID() != "chat@1.0.0" {
		t.Fatalf("ForVersion(1.1.0) = %s", p.ID())
	}
	write("dup.yaml", "profile: chat\nversion: 1.2.0\noperations: {chat.post: {input: {type: object}}}")
	if err := profiles.Builtin().LoadDir(dir); err == nil || !strings.Contains(err.Error(), "already defined") {
		t.Fatalf("duplicate version: %v", err)
	}
}

func TestParseRef(t *testing.T) {
	for _, s := range []string{"browser", "browser@", "Browser@^1", "browser@^^1"} {
		if _, _, err := profiles.ParseRef(s); err == nil {
			t.Errorf("ParseRef(%q) accepted", s)
		}
	}
}

func TestCheckDeclaredTools(t *testing.T) {
	chat, _ := profiles.Builtin().Match("chat", nil)
	postSchema := `{"type":"object","required":["channel","text"],"properties":{"channel":{"type":"string"},"text":{"type":"string"}}}`
	replySchema := `{"type":"object","required":["thread","text"],"properties":{"thread":{"type":"string"},"text":{"type":"string"}}}`
	cases := []struct {
		name  string
		tools []profiles.Tool
		want  string
	}{
		{"match", []profiles.Tool{{Name: "chat.post", InputSchema: []byte(postSchema)}, {Name: "chat.reply", InputSchema: []byte(replySchema)}, {Name: "other"}}, ""},
		{"missing operation", []profiles.Tool{{Name: "chat.post", InputSchema: []byte(postSchema)}}, "missing operation chat.reply"},
		{"tool requires more", []profiles.Tool{{Name: "chat.post", InputSchema: []byte(`{"type":"object","required":["channel","text","urgent"],"properties":{"channel":{},"text":{},"urgent":{}}}`)}, {Name: "chat.reply", InputSchema: []byte(replySchema)}}, `requires "urgent"`},
		{"type differs", []profiles.Tool{{Name: "chat.post", InputSchema: []byte(`{"type":"object","properties":{"channel":{"type":"integer"},"text":{"type":"string"}}}`)}, {Name: "chat.reply", InputSchema: []byte(replySchema)}}, `"channel" is integer in the tool and string`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := profiles.Check(chat, tc.tools)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestPlaywrightBinding(t *testing.T) {
	b, ok := profiles.Builtin().Binding("playwright-browser")
	if !ok {
		t.Fatal("binding missing")
	}
	if b.Profile.ID() != "browser@1.0.0" {
		t.Fatalf("profile = %s", b.Profile.ID())
	}
	ctx := context.Background()
	args, err := b.Operations["ui.fill"].MapArgs(ctx, map[string]any{"element": "textbox \"Name\"", "ref": "e7", "text": "Ada"})
	if err != nil {
		t.Fatal(err)
	}
	if args["target"] != "e7" || args["text"] != "Ada" || args["element"] != "textbox \"Name\"" {
		t.Fatalf("args = %v", args)
	}
	if _, has := args["submit"]; has {
		t.Fatal("an absent argument was passed as nil")
	}
	snapshot := "### Page state\n- Page URL: http://127.0.0.1:8080/form\n- Page Title: Sign up\n- Page Snapshot:\n```yaml\n- button \"Send\" [ref=e3]\n```"
	v, err := b.Reads["browser.page.summary"].Value(ctx, snapshot)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := v.(map[string]any)
	if m["url"] != "http://127.0.0.1:8080/form" || m["title"] != "Sign up" {
		t.Fatalf("summary = %v", v)
	}
	if err := b.Profile.Reads["browser.page.summary"].CheckOutput(v); err != nil {
		t.Fatalf("projected summary does not fit the profile: %v", err)
	}
}

func TestBadBinding(t *testing.T) {
	cases := []struct{ name, body, pointer string }{
		{"unknown profile", "binding: b\nprofile: fax@^1\noperations: {}", "/profile"},
		{"range unsatisfied", "binding: b\nprofile: chat@^2\noperations: {}", "/profile"},
		{"operation not bound", "binding: b\nprofile: chat@^1\noperations: {chat.post: {tool: post}}", "/operations"},
		{"operation the profile lacks", "binding: b\nprofile: chat@^1\noperations: {chat.post: {tool: p}, chat.reply: {tool: r}, chat.fax: {tool: f}}", "/operations/chat.fax"},
		{"bad expression", "binding: b\nprofile: chat@^1\noperations: {chat.post: {tool: p, args: {to: 'args.'}}, chat.reply: {tool: r}}", "/operations/chat.post/args/to"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "b.yaml")
			if err := os.WriteFile(path, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			err := profiles.Builtin().LoadDir(dir)
			var fe *profiles.FileError
			if !errors.As(err, &fe) || fe.Path != path || fe.Problems[0].Pointer != tc.pointer {
				t.Fatalf("err = %v, want %s at %s", err, path, tc.pointer)
			}
		})
	}
}

// A binding file that sorts before its profile's file still finds it.
func TestLoadDirAddsProfilesBeforeBindings(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a-binding.yaml": "binding: zeta-notes\nprofile: zeta@^1\noperations:\n  zeta.put: { tool: note_put }\n",
		"zeta.yaml":      "profile: zeta\nversion: 1.0.0\noperations:\n  zeta.put: { input: { type: object }, output: { type: object } }\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cat := profiles.Builtin()
	if err := cat.LoadDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, ok := cat.Binding("zeta-notes"); !ok {
		t.Fatalf("binding not loaded; bindings: %v", cat.BindingNames())
	}
}
