package profiles_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// The connections guide's example profile and binding files load as written, so the
// section stays true as the format changes.
func TestReadmeExamplesLoad(t *testing.T) {
	readme, err := os.ReadFile("../../docs/connections.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	start := strings.Index(text, "## Profiles: shared vocabularies")
	end := strings.Index(text[start:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal("docs/connections.md has no Profiles section")
	}
	dir := t.TempDir()
	files := 0
	for i, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(text[start:start+end], -1) {
		if !strings.HasPrefix(m[1], "profile:") && !strings.HasPrefix(m[1], "binding:") {
			continue // a config file excerpt
		}
		files++
		if err := os.WriteFile(filepath.Join(dir, string(rune('a'+i))+".yaml"), []byte(m[1]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if files != 2 {
		t.Fatalf("found %d example files, want a profile and a binding", files)
	}
	cat := profiles.Builtin()
	if err := cat.LoadDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, ok := cat.Match("tickets", nil); !ok {
		t.Fatal("the example profile is missing")
	}
	if _, ok := cat.Binding("my-chat"); !ok {
		t.Fatal("the example binding is missing")
	}
}
