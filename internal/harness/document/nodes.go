package document

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// itemConn marks a shorthand call inside a fan-out: its connection is the
// fan-out's item.
const itemConn = "$item"

// Verify limits.
const (
	defaultVerifyTimeout = 5 * time.Second
	maxVerifyTimeout     = 10 * time.Minute
	defaultVerifyEvery   = 250 * time.Millisecond
)

func (p *parser) parallel(obj map[string]any, path string) *Node {
	p.checkFields(obj, path, "kind", "id", "mode", "paths", "over", "steps", "merge")
	n := &Node{Kind: KindParallel, ID: p.id(obj["id"], path), Path: path, Mode: "all"}
	if m, ok := obj["mode"]; ok {
		if m != "all" && m != "any" {
			p.fail(path+"/mode", fault.CodeValidationFailed, "must be \"all\" or \"any\"")
		} else {
			n.Mode = m.(string)
		}
	}
	_, hasPaths := obj["paths"]
	_, hasOver := obj["over"]
	switch {
	case hasPaths == hasOver:
		p.fail(path, fault.CodeValidationFailed, "needs exactly one of paths and over")
	case hasPaths:
		p.paths(n, obj["paths"], path+"/paths")
	default:
		p.fanOut(n, obj, path)
	}
	if m, ok := obj["merge"]; ok {
		if e, ok := p.expression(m, path+"/merge").(*expression); ok {
			n.Merge = e
		}
	}
	p.done[n.ID] = true
	return n
}

// paths parses each path as a sequence. A path sees the steps before the
// parallel node and its own earlier steps, never another path's.
func (p *parser) paths(n *Node, v any, path string) {
	list, ok := v.([]any)
	if !ok || len(list) == 0 {
		p.fail(path, fault.CodeValidationFailed, "must be a non-empty array of paths (a step or an array of steps each)")
		return
	}
	before := p.done
	var seen []map[string]bool
	for i, item := range list {
		p.done = copyBools(before)
		at := path + "/" + strconv.Itoa(i)
		steps, isArray := item.([]any)
		if !isArray {
			steps = []any{item}
		}
		seq := &Node{Kind: KindSequence, ID: n.ID + "/" + strconv.Itoa(i), Path: at}
		for j, s := range steps {
			stepAt := at
			if isArray {
				stepAt += "/" + strconv.Itoa(j)
			}
			if child := p.node(s, stepAt); child != nil {
				seq.Steps = append(seq.Steps, child)
			}
		}
		n.Paths = append(n.Paths, seq)
		seen = append(seen, p.done)
	}
	// After an "all" parallel every path has run, so later steps may read
	// any path's outputs.
	p.done = before
	if n.Mode == "all" {
		for _, s := range seen {
			for id := range s {
				p.done[id] = true
			}
		}
	}
}

// fanOut parses "over" (connection names) and the steps run once per name.
func (p *parser) fanOut(n *Node, obj map[string]any, path string) {
	list, ok := obj["over"].([]any)
	if !ok || len(list) == 0 {
		p.fail(path+"/over", fault.CodeValidationFailed, "must be a non-empty array of connection names")
	}
	for i, v := range list {
		name, _ := v.(string)
		at := path + "/over/" + strconv.Itoa(i)
		switch {
		case !p.declared[name]:
			p.fail(at, fault.CodeValidationFailed, "%v is not a connection declared in the document's connections", v)
		case slices.Contains(n.Over, name):
			p.fail(at, fault.CodeValidationFailed, "%q is listed twice", name)
		default:
			n.Over = append(n.Over, name)
		}
	}
	steps, ok := obj["steps"].([]any)
	if !ok || len(steps) == 0 {
		p.fail(path+"/steps", fault.CodeValidationFailed, "must be a non-empty array of steps, run once per connection in over")
		return
	}
	before, over, enclosing := p.done, p.over, p.enclosing
	p.done, p.over, p.enclosing = copyBools(before), n.Over, itemConn
	seq := &Node{Kind: KindSequence, ID: n.ID + "/each", Path: path + "/steps"}
	for i, s := range steps {
		if child := p.node(s, path+"/steps/"+strconv.Itoa(i)); child != nil {
			seq.Steps = append(seq.Steps, child)
		}
	}
	n.Paths = []*Node{seq}
	// Ids inside a fan-out run once per item; they are not visible after.
	p.done, p.over, p.enclosing = before, over, enclosing
}

func copyBools(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// claim is one thing a verify node checks about its subject.
type claim struct {
	Path     string // JSON Pointer of the claim
	At       []string
	Equals   any
	Contains any
	Expr     *expression
	kind     string // equals, contains, expr
}

func (p *parser) verify(obj map[string]any, path string) *Node {
	p.checkFields(obj, path, "kind", "id", "read", "of", "claims", "timeoutMs", "intervalMs", "connection")
	n := &Node{Kind: KindVerify, ID: p.id(obj["id"], path), Path: path, Timeout: defaultVerifyTimeout, Every: defaultVerifyEvery}
	read, hasRead := obj["read"].(map[string]any)
	readName, hasReadName := obj["read"].(string)
	of, hasOf := obj["of"].(string)
	if _, ok := obj["connection"]; ok && !hasReadName {
		p.fail(path+"/connection", fault.CodeValidationFailed, "goes with a profile read's name in read (\"read\": \"browser.page.summary\")")
	}
	switch {
	case (hasRead || hasReadName) == hasOf:
		p.fail(path, fault.CodeValidationFailed, "needs exactly one subject: read (a profile read's name with connection, or a call) or of (an earlier step's id)")
	case hasReadName:
		n.Subject = p.readSubject(obj, readName, n.ID, path)
	case hasRead:
		call := map[string]any{"kind": KindCall, "id": n.ID + "#read"}
		for k, v := range read {
			call[k] = v
		}
		delete(p.ids, n.ID+"#read")
		n.Subject = p.callNoID(call, path+"/read")
	case !p.done[of]:
		p.fail(path+"/of", fault.CodeValidationFailed, "%q is not the id of an earlier step", of)
	default:
		n.Of = of
	}
	n.Timeout = p.millis(obj, "timeoutMs", path, defaultVerifyTimeout, maxVerifyTimeout)
	n.Every = p.millis(obj, "intervalMs", path, defaultVerifyEvery, time.Minute)
	claims, ok := obj["claims"].([]any)
	if !ok || len(claims) == 0 {
		p.fail(path+"/claims", fault.CodeValidationFailed, "must be a non-empty array of claims (equals, contains or expr)")
	}
	for i, c := range claims {
		if cl, ok := p.claim(c, path+"/claims/"+strconv.Itoa(i)); ok {
			n.Claims = append(n.Claims, cl)
		}
	}
	p.done[n.ID] = true
	return n
}

// callNoID parses a verify's read: a call whose id is derived from its
// verify node and not registered, since no step can refer to it.
func (p *parser) callNoID(obj map[string]any, path string) *Node {
	id := obj["id"].(string)
	obj["id"] = id
	n := p.call(obj, path)
	if n != nil {
		delete(p.ids, id)
		delete(p.done, id)
	}
	return n
}

func (p *parser) millis(obj map[string]any, field, path string, def, limit time.Duration) time.Duration {
	v, ok := obj[field]
	if !ok {
		return def
	}
	ms, isNum := v.(float64)
	if !isNum || ms < 1 || time.Duration(ms)*time.Millisecond > limit {
		p.fail(path+"/"+field, fault.CodeValidationFailed, "must be a number of milliseconds from 1 to %d", limit.Milliseconds())
		return def
	}
	return time.Duration(ms) * time.Millisecond
}

func (p *parser) claim(v any, path string) (claim, bool) {
	obj, ok := v.(map[string]any)
	if !ok {
		p.fail(path, fault.CodeValidationFailed, "must be an object with equals, contains or expr")
		return claim{}, false
	}
	p.checkFields(obj, path, "equals", "contains", "expr", "at")
	c := claim{Path: path}
	if at, ok := obj["at"].(string); ok && at != "" {
		c.At = strings.Split(at, ".")
	}
	_, eq := obj["equals"]
	_, co := obj["contains"]
	_, ex := obj["expr"]
	switch {
	case btoi(eq)+btoi(co)+btoi(ex) != 1:
		p.fail(path, fault.CodeValidationFailed, "needs exactly one of equals, contains and expr")
		return claim{}, false
	case eq:
		c.kind, c.Equals = "equals", obj["equals"]
	case co:
		c.kind, c.Contains = "contains", obj["contains"]
	default:
		e, ok := p.expression(obj["expr"], path+"/expr").(*expression)
		if !ok {
			return claim{}, false
		}
		c.kind, c.Expr = "expr", e
	}
	return c, true
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Holds reports whether the claim is true of subject, with a reason when it
// is not.
func (c claim) Holds(subject any, sc Scope) (bool, string) {
	v, found := valueAt(subject, c.At)
	where := "the subject"
	if len(c.At) > 0 {
		where = strings.Join(c.At, ".")
	}
	switch c.kind {
	case "equals":
		if found && reflect.DeepEqual(normalize(v), normalize(c.Equals)) {
			return true, ""
		}
		return false, fmt.Sprintf("%s is %s, not %s", where, show(v), show(c.Equals))
	case "contains":
		if found && contains(v, c.Contains) {
			return true, ""
		}
		return false, fmt.Sprintf("%s (%s) does not contain %s", where, show(v), show(c.Contains))
	}
	sc.Subject = subject
	out, err := c.Expr.Eval(sc)
	if err != nil {
		return false, err.Error()
	}
	if ok, _ := out.(bool); ok {
		return true, ""
	}
	return false, fmt.Sprintf("%s is %v", c.Expr.src, out)
}

func valueAt(v any, path []string) (any, bool) {
	for _, k := range path {
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[k]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

func contains(v, want any) bool {
	switch x := v.(type) {
	case string:
		s, ok := want.(string)
		return ok && strings.Contains(x, s)
	case []any:
		for _, item := range x {
			if reflect.DeepEqual(normalize(item), normalize(want)) {
				return true
			}
		}
	case map[string]any:
		s, ok := want.(string)
		_, has := x[s]
		return ok && has
	}
	return false
}

// normalize makes values from different decoders comparable (ints and
// float64s, typed and untyped maps).
func normalize(v any) any {
	data, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	if json.Unmarshal(data, &out) != nil {
		return v
	}
	return out
}

func show(v any) string {
	data, err := json.Marshal(v)
	if err != nil || len(data) > 200 {
		return fmt.Sprintf("%.200v", v)
	}
	return string(data)
}
