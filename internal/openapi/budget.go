package openapi

import (
	"fmt"
	"unicode/utf8"

	"github.com/patchbay-dev/patchbay/internal/config"
)

// Defaults of the entry's document budgets. Inlining refs multiplies: a
// schema of 40 properties that each $ref one of 40 properties that each
// $ref a 1 MB description is 1.6 GB inlined, from a document of 1 MB. The
// budgets bound what one document can make the provider build and keep,
// whatever its shape. GitHub's description (1,223 operations) needs at
// most 823 values and 23 KB for one operation's input schema, and 2 MB
// for all of them (TestGitHubDocument).
const (
	// DefaultMaxSchemaNodes bounds one operation's input schema in JSON
	// values (objects, arrays, strings, numbers…). It is also what gate 2
	// compiles, whose cost grows with the square of its subschemas.
	DefaultMaxSchemaNodes = 10_000
	// DefaultMaxSchemaBytes bounds one operation's input schema as JSON.
	DefaultMaxSchemaBytes = 1 << 20
	// DefaultMaxManifestBytes bounds all operations together: their
	// names, paths, descriptions and input schemas.
	DefaultMaxManifestBytes = 32 << 20
	// DefaultMaxOperations bounds how many operations a connection offers
	// (after include): each is a tool in status and in every model turn.
	DefaultMaxOperations = 5000
	// maxDescriptionBytes and maxTitleBytes cut an operation's description
	// (summary and description, which every model turn carries) and its
	// title; GitHub's longest description is 4.6 KB.
	maxDescriptionBytes = 8 << 10
	maxTitleBytes       = 512
	// maxDocumentDepth bounds how deep a document nests objects and
	// arrays; GitHub's nests 21 deep, the Petstore's 10.
	maxDocumentDepth = 64
)

// budget is the limits one connection's operations are built within.
type budget struct {
	nodes, bytes  int64 // one operation's input schema
	manifestBytes int64 // every operation together
	operations    int
}

func newBudget(spec config.OpenAPI) budget {
	b := budget{nodes: DefaultMaxSchemaNodes, bytes: DefaultMaxSchemaBytes, manifestBytes: DefaultMaxManifestBytes, operations: DefaultMaxOperations}
	if spec.MaxSchemaNodes > 0 {
		b.nodes = spec.MaxSchemaNodes
	}
	if spec.MaxSchemaBytes > 0 {
		b.bytes = spec.MaxSchemaBytes
	}
	if spec.MaxManifestBytes > 0 {
		b.manifestBytes = spec.MaxManifestBytes
	}
	if spec.MaxOperations > 0 {
		b.operations = spec.MaxOperations
	}
	return b
}

// BudgetError is a document that does not fit its connection's budget. It
// names the operation (when one is to blame), what passed the limit, the
// limit and its setting.
type BudgetError struct {
	Op      string // empty when no one operation is to blame
	What    string // "input schema", "operations", …
	Setting string // the entry's field: maxSchemaNodes, maxSchemaBytes, …
	Limit   int64
	Hint    string
}

func (e *BudgetError) Error() string {
	msg := fmt.Sprintf("%s over %s (%d)", e.What, e.Setting, e.Limit)
	if e.Op != "" {
		msg = "operation " + e.Op + ": " + msg
	}
	if e.Hint != "" {
		msg += ": " + e.Hint
	}
	return msg
}

// size counts what an expansion has produced: JSON values, and bytes as
// JSON writes them (strings counted without their escapes, numbers as 8).
type size struct {
	nodes, bytes int64
}

// expansion builds the input schema of one operation with local refs
// inlined up to maxDepth levels, counting what it produces as it goes.
// Once the count passes the limit it stops expanding (every further
// schema comes out open) and its result is thrown away: the work of one
// attempt is bounded by the budget, not by the product of the widths the
// refs multiply.
type expansion struct {
	r        resolver
	maxDepth int
	limit    budget
	used     size
}

func (e *expansion) over() bool {
	return e.used.nodes > e.limit.nodes || e.used.bytes > e.limit.bytes
}

func (e *expansion) add(nodes, bytes int64) {
	e.used.nodes += nodes
	e.used.bytes += bytes
}

// count adds a value copied as it is (an enum, a default, an extension)
// to the count, stopping once over the limit.
func (e *expansion) count(v any) {
	if e.over() {
		return
	}
	switch v := v.(type) {
	case map[string]any:
		e.add(1, 2)
		for k, x := range v {
			e.add(0, int64(len(k))+4)
			e.count(x)
		}
	case []any:
		e.add(1, 2)
		for _, x := range v {
			e.add(0, 1)
			e.count(x)
		}
	case string:
		e.add(1, int64(len(v))+2)
	default:
		e.add(1, 8)
	}
}

// measure is the exact size of a built schema: its JSON values, and its
// length once marshalled.
func measure(v any) int64 {
	switch v := v.(type) {
	case map[string]any:
		n := int64(1)
		for _, x := range v {
			n += measure(x)
		}
		return n
	case []any:
		n := int64(1)
		for _, x := range v {
			n += measure(x)
		}
		return n
	default:
		return 1
	}
}

// cut shortens s to at most n bytes (on a rune boundary), marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = " …(cut)"
	end := n - len(mark)
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + mark
}
