package profiles

import (
	"context"
	"fmt"

	"github.com/patchbay-dev/patchbay/internal/sandbox"
)

// Binding maps a server that declares no profile onto one. A binding file:
//
//	binding: playwright-browser     # its name, used by a connection's `binding:`
//	profile: browser@^1             # the profile (range) it provides; the newest match is used
//	server: "@playwright/mcp"       # what it is written for (documentation)
//	operations:
//	  ui.click:
//	    tool: browser_click         # the server's tool
//	    args:                       # each tool argument, an expression over `args` (the profile's
//	      element: args.element     # arguments); one that is nil is left out
//	      ref: args.ref
//	    result: '{"done": true}'    # optional: the profile's result, an expression over `result`
//	reads:
//	  browser.page.summary:
//	    tool: browser_snapshot      # or resource: <uri>
//	    project: '…'                # the read's value, an expression over `result`
//
// Every operation the profile does not mark optional must be bound; tool
// names are checked against the server when it connects.
type Binding struct {
	Name       string
	Profile    *Profile
	Server     string
	Operations map[string]*BoundOp
	Reads      map[string]*BoundRead
	Source     string
}

// BoundOp is how one profile operation runs on the server.
type BoundOp struct {
	Tool   string            `json:"tool"`
	Args   map[string]string `json:"args,omitempty"`
	Result string            `json:"result,omitempty"`

	args   map[string]*sandbox.Program
	result *sandbox.Program
}

// BoundRead is how one profile read is taken from the server.
type BoundRead struct {
	Tool     string            `json:"tool,omitempty"`
	Args     map[string]string `json:"args,omitempty"`
	Resource string            `json:"resource,omitempty"`
	Project  string            `json:"project,omitempty"`

	args    map[string]*sandbox.Program
	project *sandbox.Program
}

type bindingFile struct {
	Binding    string                `json:"binding"`
	Profile    string                `json:"profile"`
	Server     string                `json:"server,omitempty"`
	Operations map[string]*BoundOp   `json:"operations"`
	Reads      map[string]*BoundRead `json:"reads,omitempty"`
}

// ParseBinding parses and validates a binding file against the profiles
// of cat; path names it in errors.
func ParseBinding(path string, data []byte, cat *Catalog) (*Binding, error) {
	var f bindingFile
	if err := decode(data, &f); err != nil {
		return nil, &FileError{Path: path, Problems: []Problem{{Message: err.Error()}}}
	}
	c := &checker{path: path}
	b := &Binding{Name: f.Binding, Server: f.Server, Operations: f.Operations, Reads: f.Reads, Source: path}
	if !profileName.MatchString(f.Binding) {
		c.fail("/binding", "must be a lower-case name (letters, digits, '-'), got %q", f.Binding)
	}
	name, cons, err := ParseRef(f.Profile)
	switch {
	case err != nil:
		c.fail("/profile", "%v", err)
	case !cat.Known(name):
		c.fail("/profile", "unknown profile %q (known: %v)", name, cat.Names())
	default:
		if b.Profile, _ = cat.Match(name, cons); b.Profile == nil {
			c.fail("/profile", "no version of %s is within %s (known: %v)", name, cons, cat.Names())
		}
	}
	if b.Profile != nil {
		c.boundOps(b)
		c.boundReads(b)
	}
	if len(c.problems) > 0 {
		return nil, &FileError{Path: path, Problems: c.problems}
	}
	return b, nil
}

func (c *checker) boundOps(b *Binding) {
	for _, name := range b.Profile.OperationNames() {
		if _, ok := b.Operations[name]; !ok && !b.Profile.Operations[name].Optional {
			c.fail("/operations", "operation %s of %s is not bound", name, b.Profile.ID())
		}
	}
	for _, name := range sortedKeys(b.Operations) {
		at := "/operations/" + escape(name)
		op := b.Operations[name]
		if _, ok := b.Profile.Operations[name]; !ok {
			c.fail(at, "%s has no operation %q", b.Profile.ID(), name)
			continue
		}
		if op == nil || op.Tool == "" {
			c.fail(at+"/tool", "is required (the server's tool)")
			continue
		}
		op.args = c.exprs(at+"/args", op.Args, "args")
		if op.Result != "" {
			op.result = c.expr(at+"/result", op.Result, "result")
		}
	}
}

func (c *checker) boundReads(b *Binding) {
	for _, name := range sortedKeys(b.Reads) {
		at := "/reads/" + escape(name)
		r := b.Reads[name]
		if _, ok := b.Profile.Reads[name]; !ok {
			c.fail(at, "%s has no read %q", b.Profile.ID(), name)
			continue
		}
		if r == nil || (r.Tool == "") == (r.Resource == "") {
			c.fail(at, "needs exactly one of tool and resource")
			continue
		}
		r.args = c.exprs(at+"/args", r.Args, "args")
		if r.Project != "" {
			r.project = c.expr(at+"/project", r.Project, "result")
		}
	}
}

func (c *checker) exprs(at string, srcs map[string]string, variable string) map[string]*sandbox.Program {
	out := map[string]*sandbox.Program{}
	for _, k := range sortedKeys(srcs) {
		out[k] = c.expr(at+"/"+escape(k), srcs[k], variable)
	}
	return out
}

// Tools lists the server tools the binding uses, for the check at
// connect.
func (b *Binding) Tools() []string {
	seen := map[string]bool{}
	var out []string
	for _, name := range sortedKeys(b.Operations) {
		if t := b.Operations[name].Tool; !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	for _, name := range sortedKeys(b.Reads) {
		if t := b.Reads[name].Tool; t != "" && !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}

// MapArgs turns a profile operation's arguments into the tool's.
func (op *BoundOp) MapArgs(ctx context.Context, args map[string]any) (map[string]any, error) {
	return mapArgs(ctx, op.args, args)
}

// MapResult turns the tool's result into the profile operation's; without
// a result expression it passes through.
func (op *BoundOp) MapResult(ctx context.Context, result any) (any, error) {
	if op.result == nil {
		return result, nil
	}
	out, err := op.result.Run(ctx, map[string]any{"result": result})
	if err != nil {
		return nil, fmt.Errorf("binding result of %s: %w", op.Tool, err)
	}
	return out, nil
}

// MapArgs turns a read's arguments (none today) into the tool's.
func (r *BoundRead) MapArgs(ctx context.Context) (map[string]any, error) {
	return mapArgs(ctx, r.args, map[string]any{})
}

// Value turns what the tool or resource returned into the read's value.
func (r *BoundRead) Value(ctx context.Context, result any) (any, error) {
	if r.project == nil {
		return result, nil
	}
	out, err := r.project.Run(ctx, map[string]any{"result": result})
	if err != nil {
		return nil, fmt.Errorf("binding projection: %w", err)
	}
	return out, nil
}

func mapArgs(ctx context.Context, progs map[string]*sandbox.Program, args map[string]any) (map[string]any, error) {
	out := make(map[string]any, len(progs))
	env := map[string]any{"args": args}
	for _, k := range sortedKeys(progs) {
		v, err := progs[k].Run(ctx, env)
		if err != nil {
			return nil, fmt.Errorf("binding argument %s: %w", k, err)
		}
		if v != nil {
			out[k] = v
		}
	}
	return out, nil
}
