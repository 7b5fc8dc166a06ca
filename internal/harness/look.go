package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// # Looking
//
// A model node gets a context layer per connection of its turn that
// speaks a profile with reads: before each round, the reads due then are
// taken (run.takeRead, through the gates) and shown to the model as one
// user message, each under a "[<connection> <read>]" header. When each
// read is due is its look timing, the profile's default unless the
// document's manifest entry overrides it
// ({"look": {"browser.page.summary": "turn", "ui.tree": "effect"}}):
//   - turn: before every round;
//   - effect: before the first round (the model needs the state it acts
//     on) and after a round with a call on that connection that is not
//     read-only (its annotations; a bound profile operation's readOnly);
//   - ask: never by itself; the model calls "<connection>_look" with the
//     read's name and is answered with it.
//
// A read shown before is shown as a line diff against the last one the
// model saw of it ("-" old line, "+" new line; "unchanged" when equal);
// "<connection>_look" takes "full": true for the whole read. The diff is a longest common
// subsequence over lines written here (lineDiff; no library), which falls
// back to the whole read past maxDiffLines changed lines.
//
// Each read shown is a "look" event {key, id, round, connection, read,
// profile, form (full|diff|unchanged|failed), tokens} and counts toward the
// observer's LookTokens. tokens is an estimate: bytes/4 rounded up, the
// usual rule of thumb for English text and JSON with BPE tokenizers; the
// provider's count of the whole round is in model.round's usage.
//
// Durability: the layer shown before a round is one ledger entry
// ("<node>/round:<n>/look") and a "<connection>_look" answer is one too
// (the tool call's own entry). Each records the text the model was shown
// and the whole render of every read in it, so a resumed run replays the
// very messages it sent before and diffs its next live read against what
// the model last saw, not against nothing.

// EventLook is one read shown to a model.
const EventLook = "look"

// kindLook marks the ledger entry of a round's context layer.
const kindLook = "look"

// Look forms: how a read was shown.
const (
	lookFull      = "full"
	lookDiff      = "diff"
	lookUnchanged = "unchanged"
	lookFailed    = "failed"
)

// maxDiffLines bounds the changed lines a diff compares (its LCS table is
// their product: 4 MB at most); a read changed more is shown whole.
const maxDiffLines = 1000

// LookObserver is implemented by an Observer that counts what looking
// costs. It is separate so existing Observers keep compiling.
type LookObserver interface {
	// LookTokens records one read shown to a model: its read name, its
	// form (full, diff, unchanged, failed) and its estimated tokens.
	LookTokens(read, form string, tokens int)
}

// estimateTokens is a text's size in tokens, estimated as bytes/4.
func estimateTokens(s string) int { return (len(s) + 3) / 4 }

// lookRead is one read of a layer and when it is taken.
type lookRead struct {
	Name   string
	Timing string
}

// lookConn is one connection of a layer.
type lookConn struct {
	Name  string
	Reads []lookRead
}

// lookLayer is the context layer of one model turn.
type lookLayer struct {
	conns []lookConn
	// shown is the whole render of each read the model last saw, by
	// "<connection>\x00<read>".
	shown map[string]string
	// ask maps each "<connection>_look" tool to its connection.
	ask map[string]string
}

// lookShown is one read as a layer entry or a _look answer records it.
type lookShown struct {
	Connection string `json:"connection"`
	Read       string `json:"read"`
	Form       string `json:"form"`
	Tokens     int    `json:"tokens"`
	// Render is the read's whole render, what the next diff compares
	// with; empty when it failed.
	Render string `json:"render,omitempty"`
}

// lookRecord is the output of a look ledger entry.
type lookRecord struct {
	Text  string      `json:"text"`
	Reads []lookShown `json:"reads"`
}

// lookLayer builds the node's layer: the connections its tools come from
// (picked ones, else the document's), each with the reads of the profiles
// it speaks that the allowlist grants and a pick's ops globs match (ops
// globs match operations and reads alike), and that the connection has a
// way to take (a declaring server's tool of the read's name, a binding's
// tool or resource). Connections with no such read are left out.
func (r *run) lookLayer(ctx context.Context, n *document.Node) (*lookLayer, error) {
	al, trusted, err := r.grants(ctx)
	if err != nil {
		return nil, err
	}
	layer := &lookLayer{shown: map[string]string{}, ask: map[string]string{}}
	spec := n.Model
	var names []string
	globs := map[string][]string{}
	if spec.HasTools {
		for _, p := range spec.Picks {
			if !slices.Contains(names, p.Connection) {
				names = append(names, p.Connection)
			}
			if p.Ops == nil {
				globs[p.Connection] = []string{"*"}
			} else {
				globs[p.Connection] = append(globs[p.Connection], p.Ops...)
			}
		}
	} else {
		names = r.doc.Connections
	}
	for _, name := range names {
		conn, grant, as, err := r.lookConn(ctx, name)
		if err != nil {
			return nil, &stepError{step: n.ID, code: fault.KindConnectionUnavailable, err: err}
		}
		lc := lookConn{Name: name}
		reads := document.ReadsOf(conn)
		for _, read := range document.SortedKeys(reads) {
			if g, picked := globs[name]; picked && !document.MatchOp(g, read) {
				continue
			}
			if len(grantedOps(al, trusted, grant, as, []connect.Operation{{Name: read}})) == 0 {
				continue
			}
			if _, err := findRead(conn, read); err != nil {
				continue // no way to take it (no tool of its name, not bound)
			}
			timing := reads[read].Read.Look
			if t, ok := r.doc.Looks[name][read]; ok {
				timing = t
			}
			lc.Reads = append(lc.Reads, lookRead{Name: read, Timing: timing})
		}
		if len(lc.Reads) > 0 {
			layer.conns = append(layer.conns, lc)
		}
	}
	return layer, nil
}

// lookConn is the connection that says what a document's connection name
// speaks (a handle: its pool, so naming reads takes no lease), and the
// name and server its allowlist grant is under (a server the node
// attaches for itself its toolSet has attached already).
func (r *run) lookConn(ctx context.Context, name string) (*registry.Connection, string, *document.AttachSpec, error) {
	if _, ok := r.doc.Handles[name]; ok {
		grant, conn, err := r.e.toolConn(r.doc, name)
		return conn, grant, nil, err
	}
	conn, err := r.conn(ctx, name)
	return conn, name, attachSpecOf(r.doc, name), err
}

// addLookTools offers "<connection>_look" for each connection of the layer
// with reads the model asks for. A name a tool already has is a
// collision, as between connections.
func (l *lookLayer) addLookTools(ts *toolSet) error {
	for _, c := range l.conns {
		var asks []string
		for _, rd := range c.Reads {
			if rd.Timing == profiles.LookAsk {
				asks = append(asks, rd.Name)
			}
		}
		if len(asks) == 0 {
			continue
		}
		name := c.Name + "_look"
		if _, taken := ts.byName[name]; taken {
			return fault.Errorf(document.CodeToolIDCollision, "tool id %q names both an operation of %s and the look tool of its profile reads; rename the connection or narrow its operations", name, c.Name)
		}
		schema, _ := json.Marshal(map[string]any{"type": "object", "required": []string{"read"}, "properties": map[string]any{
			"read": map[string]any{"type": "string", "enum": asks, "description": "The read to take."},
			"full": map[string]any{"type": "boolean", "description": "Show it whole rather than as changes since you last saw it."},
		}})
		ro := true
		ts.add(&modelTool{Op: document.LookOp, Targets: []string{c.Name}, ModelTool: ModelTool{Name: name, InputSchema: schema,
			Description: "[" + c.Name + "] Look at the connection's state: " + strings.Join(asks, ", ") + ". (read-only)",
			Annotations: connect.Annotations{ReadOnlyHint: &ro}}})
		l.ask[name] = c.Name
	}
	return nil
}

// due lists, per connection, the reads to take before round: turn reads
// always; effect reads before the first round and after a round with an
// effect on the connection.
func (l *lookLayer) due(round int, effected map[string]bool) map[string][]string {
	out := map[string][]string{}
	for _, c := range l.conns {
		for _, rd := range c.Reads {
			if rd.Timing == profiles.LookTurn || (rd.Timing == profiles.LookEffect && (round == 1 || effected[c.Name])) {
				out[c.Name] = append(out[c.Name], rd.Name)
			}
		}
	}
	return out
}

// show is how a read's render is shown given what the model last saw of
// it, and remembers it as last seen.
func (l *lookLayer) show(conn, read, render string, full bool) (form, text string) {
	key := conn + "\x00" + read
	prev, seen := l.shown[key]
	l.shown[key] = render
	switch {
	case !seen || full:
		return lookFull, render
	case prev == render:
		return lookUnchanged, ""
	}
	if d, ok := lineDiff(prev, render); ok {
		return lookDiff, d
	}
	return lookFull, render
}

// remember replays recorded reads into what the model last saw.
func (l *lookLayer) remember(reads []lookShown) {
	for _, s := range reads {
		if s.Form != lookFailed {
			l.shown[s.Connection+"\x00"+s.Read] = s.Render
		}
	}
}

// lookHeader is the line above a read in what the model is shown.
func lookHeader(conn, read, form string) string {
	switch form {
	case lookDiff:
		return "[" + conn + " " + read + ": changes since last shown]"
	case lookUnchanged:
		return "[" + conn + " " + read + ": unchanged]"
	case lookFailed:
		return "[" + conn + " " + read + ": could not be read]"
	}
	return "[" + conn + " " + read + "]"
}

// look takes (or replays) the reads due before round and returns the
// message that shows them; "" when none is due.
func (r *run) look(ctx context.Context, f *frame, n *document.Node, round int, l *lookLayer, effected map[string]bool) (string, error) {
	due := l.due(round, effected)
	if len(due) == 0 {
		return "", nil
	}
	ln := &document.Node{Kind: kindLook, ID: fmt.Sprintf("%s/round:%d/look", n.ID, round)}
	key := ln.ID + f.suffix
	if out, err, ok := r.replayed(key, ln); ok {
		if err != nil {
			return "", err
		}
		rec, err := decodeLook(out)
		if err != nil {
			return "", err
		}
		l.remember(rec.Reads)
		return rec.Text, nil
	}
	r.begin(ln, key, "")
	var rec lookRecord
	var parts []string
	for _, c := range l.conns {
		for _, read := range due[c.Name] {
			s, text, err := r.lookOnce(ctx, f, n, l, c.Name, read, false)
			if err != nil {
				return "", err
			}
			rec.Reads = append(rec.Reads, s)
			parts = append(parts, text)
		}
	}
	rec.Text = "Current state of your connections:\n\n" + strings.Join(parts, "\n\n")
	if _, err := r.done(ctx, key, ln, rec); err != nil {
		return "", err
	}
	r.looked(ctx, key, n, round, rec.Reads)
	return rec.Text, nil
}

// lookOnce takes one read and shows it against what the model last saw.
// A read that fails is shown as failing (the model may act on that); an
// interruption of the run is returned.
func (r *run) lookOnce(ctx context.Context, f *frame, n *document.Node, l *lookLayer, conn, read string, full bool) (lookShown, string, error) {
	s := lookShown{Connection: conn, Read: read}
	ctx, span := r.traceRead(ctx, "look", conn, read)
	rd, err := r.takeRead(ctx, f, n.ID, conn, read)
	if err != nil {
		if interruption(err) || errors.Is(err, errWaiting) || ctx.Err() != nil {
			span.end("", 0, err)
			return s, "", err
		}
		s.Form = lookFailed
		text := lookHeader(conn, read, lookFailed) + "\n" + r.e.redactor.String(readFailure(err))
		s.Tokens = estimateTokens(text)
		span.end(s.Form, s.Tokens, err)
		return s, text, nil
	}
	form, body := l.show(conn, read, rd.Text, full)
	s.Form, s.Render = form, rd.Text
	text := lookHeader(conn, read, form)
	if body != "" {
		text += "\n" + body
	}
	s.Tokens = estimateTokens(text)
	span.end(s.Form, s.Tokens, nil)
	return s, text, nil
}

// looked reports the reads of a layer or a _look answer: a look event
// each, and their tokens to the observer.
func (r *run) looked(ctx context.Context, key string, n *document.Node, round int, reads []lookShown) {
	obs, counts := r.e.observer.(LookObserver)
	for _, s := range reads {
		r.e.emit(ctx, r.rec.ID, EventLook, map[string]any{"key": key, "id": n.ID, "round": round, "connection": s.Connection,
			"read": s.Read, "form": s.Form, "tokens": s.Tokens})
		if counts {
			obs.LookTokens(s.Read, s.Form, s.Tokens)
		}
	}
}

// lookCall answers a "<connection>_look" call as a ledger entry of its
// own (the tool call's key), so a replay answers the same. ok is false
// when call is not a look tool.
func (r *run) lookCall(ctx context.Context, f *frame, n *document.Node, round int, l *lookLayer, call ModelToolCall) (ModelToolResult, bool, error) {
	conn, ok := l.ask[call.Name]
	if !ok {
		return ModelToolResult{}, false, nil
	}
	res := ModelToolResult{CallID: call.ID}
	tn := &document.Node{Kind: kindLook, ID: fmt.Sprintf("%s/round:%d/tool:%s", n.ID, round, call.ID), Connection: conn, Op: document.LookOp}
	key := tn.ID + f.suffix
	if out, err, ok := r.replayed(key, tn); ok {
		if err != nil {
			res.IsError, res.Content = true, r.e.redactor.String(toolErrorText(err))
			return res, true, nil
		}
		rec, err := decodeLook(out)
		if err != nil {
			return res, true, err
		}
		l.remember(rec.Reads)
		res.Content = rec.Text
		return res, true, nil
	}
	var args struct {
		Read string `json:"read"`
		Full bool   `json:"full"`
	}
	_ = json.Unmarshal(call.Args, &args)
	if !l.asks(conn, args.Read) {
		_, err := r.refused(ctx, f, tn, fault.Deny(fault.GateDeclared, fmt.Sprintf("%s: %q is not a read this step may ask for", call.Name, args.Read)))
		if err != nil && !isStepFailure(err) {
			return res, true, err
		}
		res.IsError, res.Content = true, r.e.redactor.String(toolErrorText(err))
		return res, true, nil
	}
	tn.Op = args.Read
	r.begin(tn, key, conn)
	s, text, err := r.lookOnce(ctx, f, n, l, conn, args.Read, args.Full)
	if err != nil {
		return res, true, err
	}
	rec := lookRecord{Text: text, Reads: []lookShown{s}}
	if _, err := r.done(ctx, key, tn, rec); err != nil {
		return res, true, err
	}
	r.looked(ctx, key, n, round, rec.Reads)
	res.Content, res.IsError = text, s.Form == lookFailed
	return res, true, nil
}

// asks reports whether read is one of conn's reads the model asks for.
func (l *lookLayer) asks(conn, read string) bool {
	for _, c := range l.conns {
		if c.Name != conn {
			continue
		}
		for _, rd := range c.Reads {
			if rd.Name == read && rd.Timing == profiles.LookAsk {
				return true
			}
		}
	}
	return false
}

// isStepFailure reports whether err is a step's own failure (returned to
// the model) rather than the run stopping.
func isStepFailure(err error) bool {
	var se *stepError
	return errors.As(err, &se)
}

// effectOf is the connection a tool call may have changed: the one it
// resolves to (through a merged tool's target or a _call pair), unless
// its operation is read-only there (the server's annotation, or a
// profile's readOnly mark); "" for none, a look, a listing or a refusal.
func (r *run) effectOf(ctx context.Context, ts *toolSet, call ModelToolCall) string {
	if t, ok := ts.byName[call.Name]; !ok || t.Op == document.LookOp || t.Lists {
		return ""
	}
	var args map[string]any
	_ = json.Unmarshal(call.Args, &args)
	name, op, _, err := ts.resolve(call.Name, args)
	if err != nil {
		return ""
	}
	conn, _, _, err := r.lookConn(ctx, name)
	if err != nil {
		return name // cannot tell: assume it acted
	}
	if o, ok := conn.Manifest().Operation(op); ok && o.Annotations.ReadOnlyHint != nil && *o.Annotations.ReadOnlyHint {
		return ""
	}
	for _, sp := range conn.Profiles() {
		if sp.Profile != nil && sp.Profile.Operations[op] != nil && sp.Profile.Operations[op].ReadOnly {
			return ""
		}
	}
	return name
}

func decodeLook(out any) (*lookRecord, error) { return decodeLedger[lookRecord]("look", out) }

// lineDiff lists the lines removed from a ("- ") and added in b ("+ "),
// in order: the lines both start and end with are skipped, and the rest
// compared by a longest common subsequence. ok is false when what is left
// to compare has more than maxDiffLines lines on either side.
func lineDiff(a, b string) (string, bool) {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	for len(x) > 0 && len(y) > 0 && x[0] == y[0] {
		x, y = x[1:], y[1:]
	}
	for len(x) > 0 && len(y) > 0 && x[len(x)-1] == y[len(y)-1] {
		x, y = x[:len(x)-1], y[:len(y)-1]
	}
	if len(x) > maxDiffLines || len(y) > maxDiffLines {
		return "", false
	}
	// lcs[i][j] is the LCS length of x[i:] and y[j:].
	lcs := make([][]int32, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int32, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			i, j = i+1, j+1
		case i < len(x) && (j == len(y) || lcs[i+1][j] >= lcs[i][j+1]):
			out = append(out, "- "+x[i])
			i++
		default:
			out = append(out, "+ "+y[j])
			j++
		}
	}
	return strings.Join(out, "\n"), true
}
