package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository, from this package's directory.
const root = "../.."

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*)$`)
	fenceRE   = regexp.MustCompile("^\\s*(```+|~~~+)[^`]*$")
)

// docFiles are the Markdown files whose links are checked: the README and
// every guide under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{filepath.Join(root, "README.md")}
	guides, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	return append(files, guides...)
}

// anchors are the ids GitHub gives a file's headings: lowercased, marks
// other than hyphens and underscores dropped, spaces made hyphens, a
// repeated id suffixed -1, -2, ….
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(text, "\n") {
		if fenceRE.MatchString(line) {
			inFence = !inFence
			continue
		}
		m := headingRE.FindStringSubmatch(line)
		if inFence || m == nil {
			continue
		}
		id := slug(m[1])
		if n := seen[id]; n > 0 {
			out[id+"-"+itoa(n)] = true
		} else {
			out[id] = true
		}
		seen[id]++
	}
	return out
}

func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

func itoa(n int) string {
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}

// TestLinksResolve: every relative link of the README and the guides
// names a file that exists, and every #anchor a heading of its file.
func TestLinksResolve(t *testing.T) {
	for _, file := range docFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		own := anchors(text)
		inFence := false
		for n, line := range strings.Split(text, "\n") {
			if fenceRE.MatchString(line) {
				inFence = !inFence
				continue
			}
			if inFence {
				continue
			}
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue // the web is not checked here
				}
				path, anchor, _ := strings.Cut(target, "#")
				where := filepath.Base(file) + ":" + itoa(n+1)
				if path == "" {
					if !own[anchor] {
						t.Errorf("%s: link to #%s, which no heading of %s makes", where, anchor, filepath.Base(file))
					}
					continue
				}
				full := filepath.Join(filepath.Dir(file), path)
				body, err := os.ReadFile(full)
				if err != nil {
					if _, serr := os.Stat(full); serr != nil {
						t.Errorf("%s: link to %s, which does not exist", where, path)
					}
					continue
				}
				if anchor != "" && strings.HasSuffix(path, ".md") && !anchors(string(body))[anchor] {
					t.Errorf("%s: link to %s#%s, which no heading there makes", where, path, anchor)
				}
			}
		}
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Coding agents over ACP":                              "coding-agents-over-acp",
		"Connect your agent: patchbay as an MCP server":       "connect-your-agent-patchbay-as-an-mcp-server",
		"Exposure: tools of their own, or `_ops` and `_call`": "exposure-tools-of-their-own-or-_ops-and-_call",
		"Profiles: shared vocabularies (browser@1, chat@1)":   "profiles-shared-vocabularies-browser1-chat1",
		"Try it: the Petstore on Prism":                       "try-it-the-petstore-on-prism",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}
