package docs_test

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// imgDir holds the docs' pictures; sourcesFile says which browser test
// takes each (`make screenshots` reads it too).
var (
	imgDir      = filepath.Join(root, "docs", "img")
	sourcesFile = filepath.Join(imgDir, "SOURCES")
)

var (
	// ![alt](path "title"), ![alt][label] and ![alt][] with [label]: path,
	// and <img … src="path" …>.
	mdImageRE  = regexp.MustCompile(`!\[([^\]]*)\]\(\s*<?([^)\s>]+)`)
	refImageRE = regexp.MustCompile(`!\[([^\]]*)\]\[([^\]]*)\]`)
	refDefRE   = regexp.MustCompile(`^\s{0,3}\[([^\]]+)\]:\s*<?([^\s>]+)`)
	htmlImgRE  = regexp.MustCompile(`(?i)<img\b[^>]*?\bsrc\s*=\s*["']?([^"'\s>]+)`)
	codeSpanRE = regexp.MustCompile("`+[^`]*`+")
)

// source is one line of docs/img/SOURCES: the picture docs/img/<picture>
// is artifacts/screenshots/<shot>.png as test (in package pkg) leaves it.
type source struct {
	picture, shot, pkg, test string
	line                     int
}

func readSources(t *testing.T) map[string]source {
	t.Helper()
	f, err := os.Open(sourcesFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]source{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 4 {
			t.Errorf("SOURCES:%d: want 4 columns (picture shot package test), got %q", n, line)
			continue
		}
		s := source{picture: fields[0], shot: fields[1], pkg: fields[2], test: fields[3], line: n}
		if strings.ContainsRune(s.picture, '/') || !strings.HasSuffix(s.picture, ".png") {
			t.Errorf("SOURCES:%d: picture %q must be a .png file name in docs/img", n, s.picture)
		}
		if prev, dup := out[s.picture]; dup {
			t.Errorf("SOURCES:%d: %s is listed again (first on line %d)", n, s.picture, prev.line)
		}
		out[s.picture] = s
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("SOURCES lists no picture")
	}
	return out
}

// picture is an image a Markdown file shows, where it shows it.
type picture struct {
	where, target string
}

// pictures lists the images of a Markdown file, outside code: Markdown
// images (inline and by reference) and HTML <img> tags.
func pictures(t *testing.T, file string) []picture {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	defs := map[string]string{}
	inFence := false
	for _, line := range lines {
		if fenceRE.MatchString(line) {
			inFence = !inFence
			continue
		}
		if m := refDefRE.FindStringSubmatch(line); m != nil && !inFence {
			defs[strings.ToLower(m[1])] = m[2]
		}
	}
	var out []picture
	inFence = false
	for n, line := range lines {
		if fenceRE.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		line = codeSpanRE.ReplaceAllString(line, "")
		where := filepath.Base(file) + ":" + itoa(n+1)
		for _, m := range mdImageRE.FindAllStringSubmatch(line, -1) {
			out = append(out, picture{where, m[2]})
		}
		for _, m := range refImageRE.FindAllStringSubmatch(line, -1) {
			label := m[2]
			if label == "" {
				label = m[1]
			}
			target, ok := defs[strings.ToLower(label)]
			if !ok {
				t.Errorf("%s: picture [%s] has no [%s]: definition", where, label, label)
				continue
			}
			out = append(out, picture{where, target})
		}
		for _, m := range htmlImgRE.FindAllStringSubmatch(line, -1) {
			out = append(out, picture{where, m[1]})
		}
	}
	return out
}

// TestPicturesComeFromTests: every picture the README and the guides show
// is a file in docs/img that SOURCES lists, every listed picture is there
// (and nothing else is), and the test SOURCES names takes its shot, so
// that `make screenshots` can make each one again.
func TestPicturesComeFromTests(t *testing.T) {
	sources := readSources(t)
	imgAbs, err := filepath.Abs(imgDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range docFiles(t) {
		for _, p := range pictures(t, file) {
			target := p.target
			if strings.Contains(target, "://") || strings.HasPrefix(target, "data:") {
				continue // a picture from the web (a badge) is no picture of ours
			}
			target, _, _ = strings.Cut(target, "#")
			target, _, _ = strings.Cut(target, "?")
			full := filepath.Join(filepath.Dir(file), target)
			if strings.HasPrefix(target, "/") { // GitHub reads these from the repository's root
				full = filepath.Join(root, target)
			}
			abs, err := filepath.Abs(full)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Dir(abs) != imgAbs {
				t.Errorf("%s: picture %s is not in docs/img/ (move it there and list it in docs/img/SOURCES)", p.where, p.target)
				continue
			}
			if _, ok := sources[filepath.Base(abs)]; !ok {
				t.Errorf("%s: picture %s is not listed in docs/img/SOURCES (which test takes it?)", p.where, p.target)
			}
		}
	}

	for _, s := range sources {
		if _, err := os.Stat(filepath.Join(imgDir, s.picture)); err != nil {
			t.Errorf("SOURCES:%d: docs/img/%s is missing (run make screenshots)", s.line, s.picture)
		}
		if err := takesShot(filepath.Join(root, s.pkg), s.test, s.shot); err != "" {
			t.Errorf("SOURCES:%d: %s: %s", s.line, s.picture, err)
		}
	}

	entries, err := os.ReadDir(imgDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if _, ok := sources[e.Name()]; !ok && e.Name() != "SOURCES" {
			t.Errorf("docs/img/%s is listed in no line of SOURCES, so no test makes it", e.Name())
		}
	}
}

// takesShot reports, as "" or the problem, whether the test function
// named test among dir's _test.go files writes artifacts/screenshots/<shot>.png
// through one of the browser tests' helpers: shot(name), both(name) (name
// and name-390) or saveScreenshot(t, name+".png", …).
func takesShot(dir, test, shot string) string {
	files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if len(files) == 0 {
		return "no test files in " + rel(dir)
	}
	fset := token.NewFileSet()
	for _, file := range files {
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			return err.Error()
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Name.Name != test || fn.Body == nil {
				continue
			}
			found := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || found {
					return !found
				}
				helper, ok := call.Fun.(*ast.Ident)
				if !ok {
					return true
				}
				for _, arg := range call.Args {
					lit, ok := arg.(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						continue
					}
					switch helper.Name {
					case "shot":
						found = found || v == shot
					case "both":
						found = found || v == shot || v+"-390" == shot
					case "saveScreenshot":
						found = found || v == shot+".png"
					}
				}
				return !found
			})
			if !found {
				return test + " (" + rel(file) + ") takes no shot " + strconv.Quote(shot)
			}
			return ""
		}
	}
	return "no func " + test + " in " + rel(dir)
}

// rel is a path below root as from the repository's root.
func rel(path string) string {
	if r, err := filepath.Rel(root, path); err == nil {
		return filepath.ToSlash(r)
	}
	return path
}

// TestPicturesParse: the forms of picture the docs check finds.
func TestPicturesParse(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "guide.md")
	text := "![A](img/a.png \"title\") and ![B][b] and ![c][]\n" +
		"<p><img alt=\"D\" src=\"img/d.png\" width=\"400\"></p> <IMG SRC='e.png'>\n" +
		"`![not](code.png)`\n" +
		"```\n![not](fenced.png)\n```\n" +
		"[b]: img/b.png\n[C]: <img/c.png>\n"
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pictures(t, file) {
		got = append(got, p.where+" "+p.target)
	}
	want := "guide.md:1 img/a.png|guide.md:1 img/b.png|guide.md:1 img/c.png|guide.md:2 img/d.png|guide.md:2 e.png"
	if strings.Join(got, "|") != want {
		t.Errorf("pictures:\n got %s\nwant %s", strings.Join(got, "|"), want)
	}
}
