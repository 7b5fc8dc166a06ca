package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// holds reports whether the claim is true of subject, with a reason when it
// is not.
func (c claim) holds(subject any, sc scope) (bool, string) {
	v, found := at(subject, c.At)
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
	out, err := c.Expr.eval(sc)
	if err != nil {
		return false, err.Error()
	}
	if ok, _ := out.(bool); ok {
		return true, ""
	}
	return false, fmt.Sprintf("%s is %v", c.Expr.src, out)
}

func at(v any, path []string) (any, bool) {
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

// frame is what one path of a run sees: the outputs of the steps before it
// and, in a fan-out, its connection.
type frame struct {
	steps  map[string]any
	item   string // the fan-out's connection
	suffix string // appended to ledger keys inside a fan-out: "@<item>"
	scope  string // the parallel path fresh: path leases belong to
	// ctx is the path's context, so that its expressions stop when the
	// path is cancelled; nil (the root, for now) is context.Background,
	// and each expression is still bounded by sandbox.MaxDuration.
	ctx context.Context
}

func (f *frame) child(item string) *frame {
	c := &frame{steps: make(map[string]any, len(f.steps)), item: f.item, suffix: f.suffix, scope: f.scope, ctx: f.ctx}
	for k, v := range f.steps {
		c.steps[k] = v
	}
	if item != "" {
		c.item, c.suffix = item, f.suffix+"@"+item
	}
	return c
}

func (r *run) scope(f *frame) scope {
	return scope{Input: r.rec.Input, Steps: f.steps, Item: f.item, ctx: f.ctx}
}

// parallel runs the paths (or the fan-out's steps per connection) at once.
// "all" fails on the first failure and cancels the rest; "any" takes the
// first success and cancels the rest. A path that parks (it waits for a
// person) cancels nothing: the others run on until each ends or parks too,
// and then the parallel parks (see the package doc).
func (r *run) parallel(ctx context.Context, f *frame, n *Node) (any, error) {
	type job struct {
		path *Node
		fr   *frame
	}
	var jobs []job
	if len(n.Over) > 0 {
		for _, item := range n.Over {
			jobs = append(jobs, job{n.Paths[0], f.child(item)})
		}
	} else {
		for _, p := range n.Paths {
			jobs = append(jobs, job{p, f.child("")})
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ctx, park := parkScope(ctx)
	defer park(nil)
	results := make([]any, len(jobs))
	errs := make([]error, len(jobs))
	var (
		wg     sync.WaitGroup
		once   sync.Once
		winner = -1
	)
	for i, j := range jobs {
		j.fr.scope = f.scope + "/" + n.ID + "/" + strconv.Itoa(i)
		j.fr.ctx = ctx
		wg.Go(func() {
			results[i], errs[i] = r.node(ctx, j.fr, j.path)
			err := errs[i]
			switch {
			case errors.Is(err, errWaiting):
				park(errParked) // the others stop only where they would wait
				return          // its leases end with the parallel (below)
			case n.Mode == "any" && err == nil:
				once.Do(func() { winner = i; cancel(errAnyWon) })
			case err != nil && (n.Mode == "all" || interruption(err)):
				cancel(err)
			}
			r.pathEnded(ctx, j.fr, err)
		})
	}
	wg.Wait()
	out, err := r.joined(n, errs, results, winner)
	for i, j := range jobs {
		if errors.Is(errs[i], errWaiting) {
			r.pathEnded(ctx, j.fr, err) // kept while the parallel parks
		}
	}
	if err != nil {
		return nil, err
	}
	if len(n.Over) == 0 && n.Mode != "any" {
		r.mu.Lock()
		for _, j := range jobs {
			maps.Copy(f.steps, j.fr.steps)
		}
		r.mu.Unlock()
	}
	if n.Merge != nil {
		sc := r.scope(f)
		if n.Mode == "any" {
			sc.Results = []any{out}
		} else {
			sc.Results = results
		}
		merged, err := n.Merge.eval(sc)
		if err != nil {
			return nil, &stepError{step: n.ID, code: fault.KindStepFailed, err: err}
		}
		out = merged
	}
	return out, nil
}

// joined is the outcome of a parallel's paths: a run that stops (fenced,
// storage) before anything; then "any"'s winner; then a failure; then a
// park, when a path waits and none of the others failed.
func (r *run) joined(n *Node, errs []error, results []any, winner int) (any, error) {
	var waiting error
	for _, err := range errs {
		switch {
		case errors.Is(err, ErrFenced) || isStorage(err):
			return nil, err
		case errors.Is(err, errWaiting) && waiting == nil:
			waiting = err
		}
	}
	switch {
	case n.Mode == "any" && winner >= 0:
		return results[winner], nil
	case n.Mode == "any" && waiting != nil:
		return nil, waiting // a parked path may still win
	case n.Mode == "any":
		return nil, firstReal(errs)
	}
	if err := firstReal(errs); err != nil {
		return nil, err
	}
	if waiting != nil {
		return nil, waiting
	}
	return results, nil
}

// errAnyWon cancels the losing paths of an "any" parallel.
var errAnyWon = errors.New("another path finished first")

// firstReal is the first failure that is not a path cancelled because
// another finished or failed first; parked paths are not failures.
func firstReal(errs []error) error {
	var fallback error
	for _, err := range errs {
		if err == nil || errors.Is(err, errWaiting) {
			continue
		}
		if fallback == nil {
			fallback = err
		}
		if !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return fallback
}

// parkKey holds, in the context of a parallel's paths, the context that is
// done (cause errParked) once one of them, or of an enclosing parallel's,
// parked.
type parkKey struct{}

// parkScope returns ctx for the paths of a new parallel, and the function
// that tells them a path parked. It inherits the enclosing parallel's
// signal, so a park anywhere above reaches nested paths too.
func parkScope(ctx context.Context) (context.Context, context.CancelCauseFunc) {
	parent, ok := ctx.Value(parkKey{}).(context.Context)
	if !ok {
		parent = context.Background()
	}
	sig, park := context.WithCancelCause(parent)
	return context.WithValue(ctx, parkKey{}, sig), park
}

// parking reports whether a sibling path (of this or an enclosing
// parallel) parked: what would wait long stops, and parks too.
func parking(ctx context.Context) bool {
	sig, ok := ctx.Value(parkKey{}).(context.Context)
	return ok && sig.Err() != nil
}

// verify checks its claims until they all hold or its timeout passes. The
// result is one ledger entry: a replay returns the recorded subject.
func (r *run) verify(ctx context.Context, f *frame, n *Node) (any, error) {
	key := n.ID + f.suffix
	if out, err, ok := r.replayed(key, n); ok {
		return out, err
	}
	r.begin(n, key, "")
	deadline := time.Now().Add(n.Timeout)
	for {
		subject, err := r.subject(ctx, f, n)
		reason := ""
		if err == nil {
			reason = r.judge(n, f, subject)
			if reason == "" {
				return r.done(ctx, key, n, subject)
			}
		}
		if errors.Is(err, ErrFenced) || isStorage(err) {
			return nil, err
		}
		if time.Now().Add(n.Every).After(deadline) || ctx.Err() != nil {
			if err == nil {
				err = errors.New(reason)
			}
			return nil, r.fail(ctx, key, n, &stepError{step: n.ID, code: fault.KindStepFailed, err: fmt.Errorf("verify timed out after %s: %w", n.Timeout, err)})
		}
		sleep(ctx, n.Every)
	}
}

func (r *run) subject(ctx context.Context, f *frame, n *Node) (any, error) {
	if n.Of != "" {
		r.mu.Lock()
		defer r.mu.Unlock()
		return f.steps[n.Of], nil
	}
	if n.Subject.Kind == kindRead {
		ctx, span := r.traceRead(ctx, "read", n.Subject.Connection, n.Subject.Op)
		rd, err := r.takeRead(ctx, f, n.ID, n.Subject.Connection, n.Subject.Op)
		if err != nil {
			span.end("", 0, err)
			return nil, err
		}
		span.end("", estimateTokens(rd.Text), nil)
		return rd.Value, nil
	}
	out, _, err := r.send(ctx, f, n.Subject, nil)
	return out, err
}

// judge returns "" when every claim holds, else which one did not and why.
func (r *run) judge(n *Node, f *frame, subject any) string {
	sc := r.scope(f)
	for i, c := range n.Claims {
		if ok, why := c.holds(subject, sc); !ok {
			return fmt.Sprintf("claim %d (%s) did not hold: %s", i, c.Path, why)
		}
	}
	return ""
}
