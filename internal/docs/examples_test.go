package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/modeltest"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
	"github.com/patchbay-dev/patchbay/internal/pools"
	"github.com/patchbay-dev/patchbay/internal/profiles"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

var update = flag.Bool("update", false, "rewrite the examples' goldens, and the answer blocks tied to them, from what the server answers (or UPDATE_GOLDEN=1)")

func updating() bool { return *update || os.Getenv("UPDATE_GOLDEN") == "1" }

// defaultConfig is the quickstart's: what `make run` serves.
const defaultConfig = "examples/patchbay.yaml"

// sentNotRun names the workflow documents a guide shows that no script
// sends, with the config file whose connections they use: they are
// checked by the engine's own parser against stand-ins of those
// connections (see validateDocument).
var sentNotRun = map[string]string{
	// The browser pool needs @playwright/mcp, chromium and the web.
	"examples/connections/pool-document.json": "examples/connections/pool.yaml",
}

// serverEnv is what a config needs in the environment to start, as the
// guide that shows it says.
var serverEnv = map[string][]string{
	"examples/petstore.yaml": {"PATCHBAY_SECRET_PETSTORE_TOKEN=any-token"},
}

// ---- Markdown ----

// docBlock is one fenced block of a guide (or the README).
type docBlock struct {
	file   string // relative to the repository, slash-separated
	line   int    // the opening fence's line, 1-based
	lang   string
	marker string // "example", "answer", "illustration"; "" when unmarked
	target string // the file under examples/ an example or answer names
	text   string // the content, every line ending in "\n"
	start  int    // byte offsets of text in the file
	end    int
}

func (b docBlock) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

var (
	markerRE    = regexp.MustCompile(`^<!--\s*(?:(example|answer):\s*(\S+)|(illustration))\s*-->\s*$`)
	openFenceRE = regexp.MustCompile("^( {0,3})(```+|~~~+)\\s*([^`\\s]*)[^`]*$")
)

// parseBlocks finds the fenced blocks of a Markdown text and the marker
// comment on the line before each.
func parseBlocks(file, text string) []docBlock {
	var out []docBlock
	lines := strings.SplitAfter(text, "\n")
	offset := 0
	for i := 0; i < len(lines); i++ {
		line := strings.TrimRight(lines[i], "\r\n")
		m := openFenceRE.FindStringSubmatch(line)
		if m == nil {
			offset += len(lines[i])
			continue
		}
		b := docBlock{file: file, line: i + 1, lang: m[3]}
		if i > 0 {
			if mm := markerRE.FindStringSubmatch(strings.TrimRight(lines[i-1], "\r\n")); mm != nil {
				b.marker, b.target = mm[1], mm[2]
				if mm[3] != "" {
					b.marker = mm[3]
				}
			}
		}
		indent, fence := m[1], m[2]
		offset += len(lines[i])
		b.start = offset
		var body strings.Builder
		j := i + 1
		for ; j < len(lines); j++ {
			l := strings.TrimRight(lines[j], "\r\n")
			if t := strings.TrimSpace(l); strings.HasPrefix(t, fence[:1]) && strings.Trim(t, fence[:1]) == "" && len(t) >= len(fence) {
				break
			}
			body.WriteString(strings.TrimPrefix(l, indent) + "\n")
			offset += len(lines[j])
		}
		b.end = offset
		b.text = body.String()
		out = append(out, b)
		if j < len(lines) {
			offset += len(lines[j])
		}
		i = j
	}
	return out
}

// docBlocks are the fenced blocks of the README and the guides, except
// the generated configuration reference.
func docBlocks(t *testing.T) []docBlock {
	t.Helper()
	var out []docBlock
	for _, file := range docFiles(t) {
		name := filepath.ToSlash(strings.TrimPrefix(filepath.Clean(file), filepath.Clean(root)+string(filepath.Separator)))
		if name == "docs/configuration-reference.md" {
			continue
		}
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, parseBlocks(name, string(data))...)
	}
	return out
}

// TestDocBlocksAreMarked: every fenced block of the README and the guides
// says what it is, an example's text is its file's, an answer's is its
// golden's, and no curl command is left as an illustration.
func TestDocBlocksAreMarked(t *testing.T) {
	t.Parallel()
	counts := map[string]int{}
	for _, b := range docBlocks(t) {
		counts[b.marker]++
		switch b.marker {
		case "":
			t.Errorf("%s: a %q block without a marker on the line before it: <!-- example: examples/… -->, <!-- answer: examples/….out --> or <!-- illustration -->", b.where(), b.lang)
		case "illustration":
			if b.lang == "sh" && strings.Contains(b.text, "curl") {
				t.Errorf("%s: a curl command must be an example (a file under examples/ the docs test runs), not an illustration", b.where())
			}
		case "example", "answer":
			if !strings.HasPrefix(b.target, "examples/") || strings.Contains(b.target, "..") {
				t.Errorf("%s: %s %s is not a file under examples/", b.where(), b.marker, b.target)
				continue
			}
			data, err := os.ReadFile(filepath.Join(root, b.target))
			if err != nil {
				t.Errorf("%s: %v", b.where(), err)
				continue
			}
			if string(data) != b.text {
				t.Errorf("%s: the block differs from %s (what a reader copies must be what is tested):\n%s", b.where(), b.target, lineDiff(string(data), b.text))
			}
			if b.marker == "answer" {
				script := strings.TrimSuffix(b.target, ".out") + ".sh"
				if !strings.HasSuffix(b.target, ".out") || !exists(script) {
					t.Errorf("%s: an answer names the golden of a script: %s has no %s beside it", b.where(), b.target, script)
				}
			}
		}
	}
	t.Logf("blocks: %d examples, %d answers, %d illustrations", counts["example"], counts["answer"], counts["illustration"])
}

func exists(rel string) bool {
	_, err := os.Stat(filepath.Join(root, rel))
	return err == nil
}

// lineDiff shows the first line where two texts part.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			return fmt.Sprintf("  line %d\n  file:  %q\n  block: %q", i+1, a, b)
		}
	}
	return "  (they differ in the final newline)"
}

// ---- examples/ ----

// exampleScript is a shell example: the header comments at its top say
// what it runs against.
type exampleScript struct {
	path    string   // examples/…/name.sh
	body    string   // the file
	configs []string // "# config: a.yaml b.yaml": merged in order; default the quickstart's
	needs   []string // "# needs: …": redis, or something the test cannot provide
}

var sendsRE = regexp.MustCompile(`(?:^|[\s@'"])(examples/[\w./-]+\.json)\b`)

func readScript(path string) (exampleScript, error) {
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		return exampleScript{}, err
	}
	s := exampleScript{path: path, body: string(data)}
	for _, line := range strings.Split(s.body, "\n") {
		if !strings.HasPrefix(line, "#") {
			break
		}
		if v, ok := strings.CutPrefix(line, "# config:"); ok {
			s.configs = strings.Fields(v)
		}
		if v, ok := strings.CutPrefix(line, "# needs:"); ok {
			s.needs = append(s.needs, strings.TrimSpace(v))
		}
	}
	if len(s.configs) == 0 {
		s.configs = []string{defaultConfig}
	}
	return s, nil
}

// unmet is what the script needs that the test cannot give it; such a
// script is checked (syntax, config, bodies), not run.
func (s exampleScript) unmet() []string {
	var out []string
	for _, n := range s.needs {
		if n != "redis" {
			out = append(out, n)
		}
	}
	return out
}

func (s exampleScript) redis() bool { return slices.Contains(s.needs, "redis") }

// sends are the files under examples/ the script names (sent with -d @…
// or piped in).
func (s exampleScript) sends() []string {
	var out []string
	for _, m := range sendsRE.FindAllStringSubmatch(s.body, -1) {
		out = append(out, m[1])
	}
	return out
}

var inlineBodyRE = regexp.MustCompile(`(?s)-d\s+'([^']*)'`)

// exampleFiles lists every file under examples/, relative to the
// repository.
func exampleFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(root, "examples"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		r, _ := filepath.Rel(root, p)
		out = append(out, filepath.ToSlash(r))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func scripts(t *testing.T) []exampleScript {
	t.Helper()
	var out []exampleScript
	for _, f := range exampleFiles(t) {
		if strings.HasSuffix(f, ".sh") {
			s, err := readScript(f)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
	}
	return out
}

// topKey is the first top-level key of a YAML file.
func topKey(data []byte) string {
	var n yaml.Node
	if yaml.Unmarshal(data, &n) != nil || len(n.Content) == 0 || n.Content[0].Kind != yaml.MappingNode || len(n.Content[0].Content) == 0 {
		return ""
	}
	return n.Content[0].Content[0].Value
}

var withRE = regexp.MustCompile(`^# with:\s*(\S+)`)

// withFiles is the files a YAML example is loaded on top of ("# with:
// examples/….yaml" on its first line: a fragment that names what another
// file declares), then the file itself.
func withFiles(path string) []string {
	data, _ := os.ReadFile(filepath.Join(root, path))
	first, _, _ := strings.Cut(string(data), "\n")
	if m := withRE.FindStringSubmatch(first); m != nil {
		return append(withFiles(m[1]), path)
	}
	return []string{path}
}

// mergeConfigs is the config the files make together, as if it were the
// last file: mappings merged, later files adding to earlier ones (a list
// grows by the entries it did not have; a scalar is replaced), and the
// paths of trigger workflows made relative to the last file's directory.
// One file is returned as it is.
func mergeConfigs(files []string) ([]byte, error) {
	if len(files) == 1 {
		return os.ReadFile(filepath.Join(root, files[0]))
	}
	var merged any
	last := filepath.Dir(files[len(files)-1])
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		var v map[string]any
		if err := yaml.Unmarshal(data, &v); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		triggers, _ := v["triggers"].([]any)
		for _, tr := range triggers {
			if m, ok := tr.(map[string]any); ok {
				if w, ok := m["workflow"].(string); ok && !filepath.IsAbs(w) {
					m["workflow"], _ = filepath.Rel(last, filepath.Join(filepath.Dir(f), w))
				}
			}
		}
		merged = mergeYAML(merged, v)
	}
	return yaml.Marshal(merged)
}

func mergeYAML(a, b any) any {
	switch bv := b.(type) {
	case map[string]any:
		av, ok := a.(map[string]any)
		if !ok {
			return bv
		}
		out := maps.Clone(av)
		for k, v := range bv {
			out[k] = mergeYAML(av[k], v)
		}
		return out
	case []any:
		av, ok := a.([]any)
		if !ok {
			return bv
		}
		out := slices.Clone(av)
		for _, v := range bv {
			if !slices.ContainsFunc(out, func(x any) bool { return fmt.Sprint(x) == fmt.Sprint(v) }) {
				out = append(out, v)
			}
		}
		return out
	default:
		return b
	}
}

var envRefRE = regexp.MustCompile(`\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}`)

// loadConfig loads the merge of files with the config loader, as the
// server would, giving each ${env:NAME} the files use a stand-in value
// (a webhook secret's is a valid whsec_ one). It returns the files the
// loader read besides the config (a trigger's workflow, say).
func loadConfig(files ...string) (*config.Config, []string, error) {
	data, err := mergeConfigs(files)
	if err != nil {
		return nil, nil, err
	}
	path, _ := filepath.Abs(filepath.Join(root, files[len(files)-1]))
	env := map[string]string{"PATCHBAY_CONFIG": path}
	for _, m := range envRefRE.FindAllStringSubmatch(string(data), -1) {
		env[m[1]] = "example-" + strings.ToLower(m[1])
		if strings.Contains(m[1], "WHSEC") {
			env[m[1]] = "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("k"), 24))
		}
	}
	var read []string
	cfg, err := config.Load(func(k string) string { return env[k] }, func(p string) ([]byte, error) {
		if p == path {
			return data, nil
		}
		if r, err := filepath.Rel(mustAbs(root), p); err == nil {
			read = append(read, filepath.ToSlash(r))
		}
		return os.ReadFile(p)
	})
	return cfg, read, err
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		panic(err)
	}
	return a
}

// TestExampleFiles: every file under examples/ is used by the docs test,
// and what is not run is checked here: config files load with the config
// loader, profile and binding files with the profiles loader, workflow
// documents no script sends pass the engine's parser, and a script whose
// needs the test cannot meet parses, with its config and its bodies.
func TestExampleFiles(t *testing.T) {
	t.Parallel()
	files := exampleFiles(t)
	used := map[string]string{} // file → how the docs test uses it
	use := func(f, how string) {
		if _, ok := used[f]; !ok {
			used[f] = how
		}
	}
	all := scripts(t)
	for _, s := range all {
		use(s.path, "run")
		if len(s.unmet()) > 0 {
			used[s.path] = "checked, not run (needs " + strings.Join(s.unmet(), "; ") + ")"
			if out, err := exec.Command("bash", "-n", filepath.Join(root, s.path)).CombinedOutput(); err != nil {
				t.Errorf("%s: bash -n: %v\n%s", s.path, err, out)
			}
			for _, m := range inlineBodyRE.FindAllStringSubmatch(s.body, -1) {
				if !json.Valid([]byte(m[1])) {
					t.Errorf("%s: the body %q is not JSON", s.path, m[1])
				}
			}
		} else {
			use(strings.TrimSuffix(s.path, ".sh")+".out", "golden of "+s.path)
			if !exists(strings.TrimSuffix(s.path, ".sh")+".out") && !updating() {
				t.Errorf("%s has no golden %s: run the docs test with -update", s.path, strings.TrimSuffix(s.path, ".sh")+".out")
			}
		}
		for _, c := range s.configs {
			use(c, "the config of "+s.path)
			if !exists(c) {
				t.Errorf("%s: its config %s does not exist", s.path, c)
			}
		}
		if _, read, err := loadConfig(s.configs...); err != nil {
			t.Errorf("%s: its config %v does not load: %v", s.path, s.configs, err)
		} else {
			for _, r := range read {
				use(r, "read with the config of "+s.path)
			}
		}
		for _, f := range s.sends() {
			use(f, "sent by "+s.path)
			data, err := os.ReadFile(filepath.Join(root, f))
			if err != nil || !json.Valid(data) {
				t.Errorf("%s sends %s, which is not a JSON file (%v)", s.path, f, err)
			}
		}
	}

	var profileDirs []string
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		switch ext := filepath.Ext(f); {
		case ext == ".yaml" || ext == ".yml":
			if k := topKey(data); k == "profile" || k == "binding" {
				use(f, "loaded with the profiles loader")
				if d := filepath.Dir(f); !slices.Contains(profileDirs, d) {
					profileDirs = append(profileDirs, d)
				}
				continue
			}
			with := withFiles(f)
			_, read, err := loadConfig(with...)
			if err != nil {
				t.Errorf("%s does not load (with %v): %v", f, with, err)
			}
			for _, w := range with {
				use(w, "loaded with the config loader")
			}
			for _, r := range read {
				use(r, "read with "+f+" by the config loader")
			}
		case ext == ".json" && sentNotRun[f] != "":
			use(f, "parsed as a workflow document against "+sentNotRun[f])
			if err := validateDocument(t, f, sentNotRun[f]); err != nil {
				t.Errorf("%s does not validate against %s: %v", f, sentNotRun[f], err)
			}
		}
	}
	for _, d := range profileDirs {
		if err := profiles.Builtin().LoadDir(filepath.Join(root, d)); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
	for _, f := range files {
		if strings.HasSuffix(f, ".out") && !exists(strings.TrimSuffix(f, ".out")+".sh") {
			t.Errorf("%s is a golden of no script", f)
		}
		if how, ok := used[f]; ok {
			t.Logf("%-50s %s", f, how)
		} else {
			t.Errorf("%s is used by no docs test: show it in a guide (an example the test runs, loads or sends) or remove it", f)
		}
	}
}

// validateDocument checks a workflow document with the engine's parser
// (what POST /v1/executions does before anything runs) against stand-ins
// of the connections cfg declares: a pool keeps its setup schema and
// host-only fields, and every stand-in offers the operations the document
// calls. So everything but the operations' existence is checked: fields,
// node kinds, step ids, expressions, handles and their setup values.
func validateDocument(t *testing.T, doc, cfg string) error {
	c, _, err := loadConfig(cfg)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(filepath.Join(root, doc))
	if err != nil {
		return err
	}
	var ops []connecttest.MemoryOp
	for _, m := range regexp.MustCompile(`"op":\s*"([^"]+)"`).FindAllStringSubmatch(string(raw), -1) {
		ops = append(ops, connecttest.MemoryOp{Operation: connect.Operation{Name: m[1]}})
	}
	reg := registry.NewRegistry(nil)
	for _, name := range slices.Sorted(maps.Keys(c.File.Connections)) {
		entry := c.File.Connections[name]
		var p connect.Provider = connecttest.NewMemory(ops...)
		if entry.Pool != nil {
			pool, err := pools.New(storetest.NewEmbedded(t), name, entry.Pool.Max, nil)
			if err != nil {
				return err
			}
			o := pools.ProviderOptions{Provision: func(context.Context, map[string]any) (connect.Conn, error) {
				return connecttest.NewMemory(ops...), nil
			}}
			if s := entry.Pool.Setup; s != nil {
				o.Schema, o.HostOnly = s.Schema, s.HostOnly
			}
			if p, err = pools.NewProvider(pool, o); err != nil {
				return err
			}
		}
		if err := reg.Add(name, p); err != nil {
			return err
		}
	}
	if err := reg.Start(context.Background()); err != nil {
		return err
	}
	defer reg.Close()
	_, err = document.ParseDocument(raw, reg, "/workflow")
	return err
}

// ---- running the scripts ----

// TestExamplesRun runs every script under examples/ whose needs the test
// can meet against a real server (bin/server, built here) on the config
// its header names, and compares what it prints with its golden.
// Scripts of one config share a server and run one after another, in
// path order; allowlists are put back as they were after each.
func TestExamplesRun(t *testing.T) {
	t.Parallel()
	groups := map[string][]exampleScript{}
	for _, s := range scripts(t) {
		if len(s.unmet()) > 0 {
			continue
		}
		key := strings.Join(s.configs, " ")
		if s.redis() {
			key += " on redis"
		}
		groups[key] = append(groups[key], s)
	}
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			npmtest.Missing(t, "the examples are run with bash, curl and jq: %v", err)
		}
	}
	bins := buildBinaries(t)
	for _, key := range slices.Sorted(maps.Keys(groups)) {
		group := groups[key]
		t.Run(key, func(t *testing.T) {
			t.Parallel()
			redisURL := ""
			if group[0].redis() {
				redisURL = os.Getenv("PATCHBAY_TEST_REDIS_URL")
				if redisURL == "" {
					npmtest.Missing(t, "%s need a real Redis: set PATCHBAY_TEST_REDIS_URL", key)
				}
			}
			srv := startDocServer(t, bins, group[0].configs, redisURL)
			for _, s := range group {
				t.Run(filepath.Base(s.path), func(t *testing.T) {
					before := srv.allowlists(t)
					out := srv.run(t, s, bins)
					srv.restoreAllowlists(t, before)
					checkGolden(t, s, out)
				})
			}
		})
	}
}

// checkGolden compares a script's output with its golden; under -update
// a golden that does not match is rewritten, and so is every answer
// block tied to it.
func checkGolden(t *testing.T, s exampleScript, out string) {
	t.Helper()
	golden := strings.TrimSuffix(s.path, ".sh") + ".out"
	want, err := os.ReadFile(filepath.Join(root, golden))
	if err == nil {
		if err = matchOutput(string(want), out); err == nil {
			return
		}
	}
	if !updating() {
		t.Errorf("%s: the output does not match %s: %v\noutput:\n%s", s.path, golden, err, out)
		return
	}
	text := formatGolden(out)
	if err := os.WriteFile(filepath.Join(root, golden), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("updated %s", golden)
	rewriteAnswers(t, golden, text)
}

var docsMu sync.Mutex

// rewriteAnswers puts text in every answer block tied to golden.
func rewriteAnswers(t *testing.T, golden, text string) {
	docsMu.Lock()
	defer docsMu.Unlock()
	for _, file := range docFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		blocks := parseBlocks(file, string(data))
		changed := false
		for i := len(blocks) - 1; i >= 0; i-- {
			b := blocks[i]
			if b.marker == "answer" && b.target == golden && b.text != text {
				data = append(data[:b.start:b.start], append([]byte(text), data[b.end:]...)...)
				changed = true
			}
		}
		if changed {
			if err := os.WriteFile(file, data, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("updated the answer in %s", file)
		}
	}
}

// buildBinaries builds bin/server and bin/demo-mcp into a directory of
// the test's, removed with it.
func buildBinaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, pkg := range []string{"server", "demo-mcp"} {
		wg.Go(func() {
			cmd := exec.Command("go", "build", "-o", filepath.Join(dir, pkg), "./cmd/"+pkg)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("go build ./cmd/%s: %v\n%s", pkg, err, out)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return dir
}

// lockedBuffer collects a process's output while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// docServer is one bin/server process and the fakes its config talks to.
type docServer struct {
	addr  string            // host:port it listens on
	key   string            // an admin key of the test's own
	shown map[string]string // address in an answer → as the guides write it
	out   *lockedBuffer
}

var listeningRE = regexp.MustCompile(`patchbay listening on http://(\S+)`)

// startDocServer runs bin/server on the merge of configs, from a working
// directory that has bin/ (the binaries built here) and the repository's
// examples/ and internal/ (the paths configs name), on a free loopback
// port, with the embedded store or the Redis at redisURL under a prefix
// of its own. A loopback address the config names that a fake stands in
// for (see fakes) is pointed at the fake.
func startDocServer(t *testing.T, bins string, configs []string, redisURL string) *docServer {
	t.Helper()
	data, err := mergeConfigs(configs)
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(data)
	srv := &docServer{key: "docs-" + rand.Text(), shown: map[string]string{}, out: &lockedBuffer{}}
	for _, addr := range slices.Sorted(maps.Keys(fakes)) {
		if strings.Contains(cfg, addr) {
			got := fakes[addr](t, bins)
			cfg = strings.ReplaceAll(cfg, addr, got)
			srv.shown[got] = addr
		}
	}
	dir := t.TempDir()
	for link, target := range map[string]string{"bin": bins, "examples": mustAbs(filepath.Join(root, "examples")), "internal": mustAbs(filepath.Join(root, "internal"))} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "patchbay.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"PATCHBAY_ADDR=127.0.0.1:0", "PATCHBAY_CONFIG=patchbay.yaml",
		"PATCHBAY_API_KEYS=" + srv.key + "@admin", "PATCHBAY_ADMIN_TOKEN=" + rand.Text(),
	}
	if redisURL != "" {
		env = append(env, "REDIS_URL="+redisURL, "PATCHBAY_REDIS_PREFIX=pbdocs:"+rand.Text()[:10]+":")
	}
	for _, c := range configs {
		env = append(env, serverEnv[c]...)
	}
	cmd := exec.Command(filepath.Join(bins, "server"))
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, srv.out, srv.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { stopGroup(cmd.Process.Pid, exited) })

	deadline := time.After(60 * time.Second)
	for {
		if m := listeningRE.FindStringSubmatch(srv.out.String()); m != nil {
			if resp, err := http.Get("http://" + m[1] + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					srv.addr = m[1]
					srv.shown[srv.addr] = "127.0.0.1:8080"
					return srv
				}
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("the server on %v exited: %v\n%s", configs, err, srv.out)
		case <-deadline:
			t.Fatalf("the server on %v is not ready after 60s:\n%s", configs, srv.out)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// stopGroup ends a process the test started, and its group: SIGTERM,
// then SIGKILL after 10 s.
func stopGroup(pid int, exited <-chan error) {
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-exited
	}
}

// run runs a script with bash from the repository's root, the guides'
// localhost:8080 made the server's address, and returns what it printed
// with the addresses of the server and the fakes written back as the
// guides write them.
func (srv *docServer) run(t *testing.T, s exampleScript, bins string) string {
	t.Helper()
	body := strings.NewReplacer("localhost:8080", srv.addr, "127.0.0.1:8080", srv.addr).Replace(s.body)
	file := filepath.Join(t.TempDir(), filepath.Base(s.path))
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", file)
	cmd.Dir = mustAbs(root)
	cmd.Env = append(os.Environ(), "PATH="+bins+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s\nserver:\n%s", s.path, err, stdout.String(), stderr.String(), srv.out)
	}
	out := stdout.String()
	for got, shown := range srv.shown {
		out = strings.ReplaceAll(out, got, shown)
	}
	return out
}

// allowlists are the server's allowlists by name, as PUT takes them.
func (srv *docServer) allowlists(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	var list struct {
		Items []map[string]any `json:"items"`
	}
	srv.api(t, "GET", "/v1/allowlists", nil, &list)
	out := map[string]json.RawMessage{}
	for _, item := range list.Items {
		name, _ := item["name"].(string)
		for _, meta := range []string{"name", "updatedAt", "updatedBy", "history"} {
			delete(item, meta)
		}
		out[name], _ = json.Marshal(item)
	}
	return out
}

// restoreAllowlists puts the allowlists back as before a script changed
// them, so the next script starts from the config's.
func (srv *docServer) restoreAllowlists(t *testing.T, before map[string]json.RawMessage) {
	t.Helper()
	after := srv.allowlists(t)
	for name, body := range after {
		switch was, ok := before[name]; {
		case !ok:
			srv.api(t, "DELETE", "/v1/allowlists/"+name, nil, nil)
		case !bytes.Equal(was, body):
			srv.api(t, "PUT", "/v1/allowlists/"+name, was, nil)
		}
	}
	for name, was := range before {
		if _, ok := after[name]; !ok {
			srv.api(t, "PUT", "/v1/allowlists/"+name, was, nil)
		}
	}
}

func (srv *docServer) api(t *testing.T, method, path string, body []byte, into any) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+srv.addr+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+srv.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		t.Fatalf("%s %s = %d %s", method, path, resp.StatusCode, data)
	}
	if into != nil {
		if err := json.Unmarshal(data, into); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
}

// ---- fakes ----

// fakes stand in for the servers the examples' configs name on loopback,
// by the address the config (and the guide) gives them; each returns the
// host:port of the fake it started for the test.
var fakes = map[string]func(t *testing.T, bins string) string{
	// The demo MCP server over Streamable HTTP (examples/tasks.yaml):
	// bin/demo-mcp -http, as the connections guide starts it.
	"127.0.0.1:8091": func(t *testing.T, bins string) string {
		cmd := exec.Command(filepath.Join(bins, "demo-mcp"), "-http", "127.0.0.1:0")
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = w, w // it says where it listens on one of them
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		err = cmd.Start()
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		found := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(r)
			for sc.Scan() {
				if m := regexp.MustCompile(`listening on http://(\S+)/mcp`).FindStringSubmatch(sc.Text()); m != nil {
					found <- m[1]
				}
			}
			exited <- cmd.Wait()
		}()
		t.Cleanup(func() { stopGroup(cmd.Process.Pid, exited) })
		select {
		case addr := <-found:
			return addr
		case err := <-exited:
			t.Fatalf("demo-mcp -http exited: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("demo-mcp -http did not say where it listens")
		}
		return ""
	},
	// The Petstore mocked by Stoplight Prism (examples/petstore.yaml), as
	// the connections guide starts it.
	"127.0.0.1:4010": func(t *testing.T, _ string) string {
		url := npmtest.Prism(t, filepath.Join(mustAbs(root), "internal", "openapi", "testdata", "petstore3.yaml"))
		return strings.TrimPrefix(url, "http://")
	},
	// A local OpenAI-compatible model (examples/agents/models.yaml's
	// local, an Ollama): a fake that does what the agents guide's prompt
	// asks, through the demo's note tools, then says so.
	"127.0.0.1:11434": func(t *testing.T, _ string) string {
		return fakeModel(t, []modeltest.ChatCall{
			{Tool: "demo_note_put", Args: `{"key":"hi","value":"hello"}`},
			{Tool: "demo_note_get", Args: `{"key":"hi"}`},
		}, "The note hi holds hello.")
	},
}

// fakeModel serves OpenAI's chat completions (streamed): round n calls
// calls[n], and the round after the last answers text.
func fakeModel(t *testing.T, calls []modeltest.ChatCall, text string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Messages []struct {
				Role string `json:"role"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		round := 0
		for _, m := range body.Messages {
			if m.Role == "tool" {
				round++
			}
		}
		modeltest.WriteChatTurn(w, "llama3.1", round, calls, text)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}
