package document

import (
	"sync"

	"github.com/expr-lang/expr"

	"github.com/patchbay-dev/patchbay/internal/harness/refs"
	"github.com/patchbay-dev/patchbay/internal/sandbox"
)

// maxPrograms bounds the compiled expressions kept (a compiled expression
// is a few KiB; the bound keeps the cache under ~16 MiB).
const maxPrograms = 4096

// programs keeps compiled expressions by their source. A document is
// parsed when it is submitted and again when it runs, and most are sent
// again and again (a client's fixed workflow): compiling its expressions
// was most of the cost of both parses. An expression compiles the same in
// every document — the scope's types and functions are fixed — and a
// compiled program is read-only (each run has a VM of its own), so one
// may serve every run at once. Failures are not kept; the cache is
// emptied when full rather than tracking use, which is enough for a
// working set far smaller than the bound.
var programs = struct {
	sync.RWMutex
	m map[string]*sandbox.Program
}{m: map[string]*sandbox.Program{}}

// compile returns src compiled for the expression scope.
func compile(src string) (*sandbox.Program, error) {
	programs.RLock()
	prog, ok := programs.m[src]
	programs.RUnlock()
	if ok {
		return prog, nil
	}
	prog, err := sandbox.Compile(src, scopeTypes, expr.Function("$refId", refs.RefID))
	if err != nil {
		return nil, err
	}
	programs.Lock()
	if len(programs.m) >= maxPrograms {
		clear(programs.m)
	}
	programs.m[src] = prog
	programs.Unlock()
	return prog, nil
}
