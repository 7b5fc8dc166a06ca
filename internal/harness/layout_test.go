package harness_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/patchbay-dev/patchbay/internal/"

// layers are the engine's packages, top to bottom: each may import only
// packages below it, so no part can reach back into the engine or into a
// part above it (docs/development.md: the layout).
var layers = []string{
	"harness",
	"harness/agent",
	"harness/gates",
	"harness/document",
	"harness/registry",
	"harness/refs",
	"harness/secrets",
	"harness/connect/connecttest",
	"harness/connect",
	"harness/fault",
}

// providers implement connections; of the engine they may use only the
// contract, the error codes and the secret stores.
var (
	providers    = []string{"mcp", "openapi", "drive", "githubapp", "pools"}
	providerMay  = []string{"harness/connect", "harness/fault", "harness/secrets"}
	internalRoot = filepath.Join("..")
)

// imports lists the internal packages the non-test files of dir import,
// as paths below internal/.
func imports(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(internalRoot, dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("package %s has no Go files", dir)
	}
	var out []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if rest, ok := strings.CutPrefix(p, module); ok && !slices.Contains(out, rest) {
				out = append(out, rest)
			}
		}
	}
	return out
}

func TestImportsPointDown(t *testing.T) {
	for i, pkg := range layers {
		for _, imp := range imports(t, pkg) {
			j := slices.Index(layers, imp)
			if strings.HasPrefix(imp, "harness") && j < 0 {
				t.Errorf("%s imports %s, which has no place in the layers", pkg, imp)
			}
			if j >= 0 && j <= i {
				t.Errorf("%s imports %s, which is not below it", pkg, imp)
			}
		}
	}
}

func TestEveryEnginePackageHasALayer(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() || d.Name() == "testdata" {
			return err
		}
		if gos, _ := filepath.Glob(filepath.Join(path, "*.go")); len(gos) == 0 {
			return nil
		}
		if pkg := filepath.ToSlash(filepath.Join("harness", path)); !slices.Contains(layers, pkg) {
			t.Errorf("package %s has no place in the layers", pkg)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestProvidersUseOnlyTheContract(t *testing.T) {
	for _, pkg := range providers {
		for _, imp := range imports(t, pkg) {
			if strings.HasPrefix(imp, "harness") && !slices.Contains(providerMay, imp) {
				t.Errorf("provider %s imports %s; of the engine it may use only %v", pkg, imp, providerMay)
			}
		}
	}
}

// Only the engine itself knows the Redis keys of executions.
func TestOnlyTheEngineKnowsExecutionKeys(t *testing.T) {
	for _, pkg := range layers[1:] {
		files, _ := filepath.Glob(filepath.Join(internalRoot, pkg, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(src), "{exec:") {
				t.Errorf("%s names an execution's Redis key", f)
			}
		}
	}
}

// No package holds more than 15 % of the module's non-test, non-generated
// Go lines, so no one package grows back into holding everything.
func TestNoPackageHoldsMostOfTheCode(t *testing.T) {
	lines := map[string]int{}
	total := 0
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		name := d.Name()
		if d.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || strings.HasSuffix(name, "_templ.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n := strings.Count(string(src), "\n")
		lines[filepath.Dir(path)] += n
		total += n
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, n := range lines {
		if share := float64(n) / float64(total); share > 0.15 {
			t.Errorf("%s holds %d of %d lines (%.1f %%), more than 15 %%", dir, n, total, 100*share)
		}
	}
	engine := filepath.Join(root, "internal", "harness")
	t.Logf("engine root: %d of %d lines (%.1f %%)", lines[engine], total, 100*float64(lines[engine])/float64(total))
}

// No package imports the edges (the JSON API, the admin UI): they sit on
// top with the MCP face and are wired together by cmd/server alone.
func TestNothingImportsTheEdges(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join(internalRoot, "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		pkg := filepath.Base(d)
		if files, _ := filepath.Glob(filepath.Join(d, "*.go")); len(files) == 0 {
			continue
		}
		for _, imp := range imports(t, pkg) {
			if imp == "api" || imp == "web" {
				t.Errorf("package %s imports %s; only cmd/server may", pkg, imp)
			}
		}
	}
}
