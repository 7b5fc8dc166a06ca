package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
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

// lookLayer builds the node's layer: the connections its tools come from
// (picked ones, else the document's), each with the reads of the profiles
// it speaks that the allowlist grants and a pick's ops globs match (ops
// globs match operations and reads alike), and that the connection has a
// way to take (a declaring server's tool of the read's name, a binding's
// tool or resource). Connections with no such read are left out.
func (r *run) lookLayer(ctx context.Context, n *document.Node) (*agent.LookLayer, error) {
	al, trusted, err := r.grants(ctx)
	if err != nil {
		return nil, err
	}
	layer := &agent.LookLayer{Shown: map[string]string{}, Ask: map[string]string{}}
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
			return nil, &stepError{step: n.ID, code: fault.ConnectionUnavailable, err: err}
		}
		lc := agent.LookConn{Name: name}
		reads := document.ReadsOf(conn)
		for _, read := range document.SortedKeys(reads) {
			if g, picked := globs[name]; picked && !document.MatchOp(g, read) {
				continue
			}
			if len(agent.GrantedOps(al, trusted, grant, as, []connect.Operation{{Name: read}})) == 0 {
				continue
			}
			if _, err := findRead(conn, read); err != nil {
				continue // no way to take it (no tool of its name, not bound)
			}
			timing := reads[read].Read.Look
			if t, ok := r.doc.Looks[name][read]; ok {
				timing = t
			}
			lc.Reads = append(lc.Reads, agent.LookRead{Name: read, Timing: timing})
		}
		if len(lc.Reads) > 0 {
			layer.Conns = append(layer.Conns, lc)
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

// look takes (or replays) the reads due before round and returns the
// message that shows them; "" when none is due.
func (r *run) look(ctx context.Context, f *frame, n *document.Node, round int, l *agent.LookLayer, effected map[string]bool) (string, error) {
	due := l.Due(round, effected)
	if len(due) == 0 {
		return "", nil
	}
	ln := &document.Node{Kind: agent.EntryLook, ID: fmt.Sprintf("%s/round:%d/look", n.ID, round)}
	key := ln.ID + f.suffix
	if out, err, ok := r.replayed(key, ln); ok {
		if err != nil {
			return "", err
		}
		rec, err := agent.DecodeLook(out)
		if err != nil {
			return "", err
		}
		l.Remember(rec.Reads)
		return rec.Text, nil
	}
	r.begin(ln, key, "")
	var rec agent.LookRecord
	var parts []string
	for _, c := range l.Conns {
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
func (r *run) lookOnce(ctx context.Context, f *frame, n *document.Node, l *agent.LookLayer, conn, read string, full bool) (agent.LookShown, string, error) {
	s := agent.LookShown{Connection: conn, Read: read}
	ctx, span := r.traceRead(ctx, "look", conn, read)
	rd, err := r.takeRead(ctx, f, n.ID, conn, read)
	if err != nil {
		if interruption(err) || errors.Is(err, errWaiting) || ctx.Err() != nil {
			span.end("", 0, err)
			return s, "", err
		}
		s.Form = agent.LookFailed
		text := agent.LookHeader(conn, read, agent.LookFailed) + "\n" + r.e.redactor.String(readFailure(err))
		s.Tokens = agent.EstimateTokens(text)
		span.end(s.Form, s.Tokens, err)
		return s, text, nil
	}
	form, body := l.Show(conn, read, rd.Text, full)
	s.Form, s.Render = form, rd.Text
	text := agent.LookHeader(conn, read, form)
	if body != "" {
		text += "\n" + body
	}
	s.Tokens = agent.EstimateTokens(text)
	span.end(s.Form, s.Tokens, nil)
	return s, text, nil
}

// looked reports the reads of a layer or a _look answer: a look event
// each, and their tokens to the observer.
func (r *run) looked(ctx context.Context, key string, n *document.Node, round int, reads []agent.LookShown) {
	obs, counts := r.e.observer.(agent.LookObserver)
	for _, s := range reads {
		r.e.emit(ctx, r.rec.ID, agent.EventLook, map[string]any{"key": key, "id": n.ID, "round": round, "connection": s.Connection,
			"read": s.Read, "form": s.Form, "tokens": s.Tokens})
		if counts {
			obs.LookTokens(s.Read, s.Form, s.Tokens)
		}
	}
}

// lookCall answers a "<connection>_look" call as a ledger entry of its
// own (the tool call's key), so a replay answers the same. ok is false
// when call is not a look tool.
func (r *run) lookCall(ctx context.Context, f *frame, n *document.Node, round int, l *agent.LookLayer, call agent.ModelToolCall) (agent.ModelToolResult, bool, error) {
	conn, ok := l.Ask[call.Name]
	if !ok {
		return agent.ModelToolResult{}, false, nil
	}
	res := agent.ModelToolResult{CallID: call.ID}
	tn := &document.Node{Kind: agent.EntryLook, ID: fmt.Sprintf("%s/round:%d/tool:%s", n.ID, round, call.ID), Connection: conn, Op: document.LookOp}
	key := tn.ID + f.suffix
	if out, err, ok := r.replayed(key, tn); ok {
		if err != nil {
			res.IsError, res.Content = true, r.e.redactor.String(toolErrorText(err))
			return res, true, nil
		}
		rec, err := agent.DecodeLook(out)
		if err != nil {
			return res, true, err
		}
		l.Remember(rec.Reads)
		res.Content = rec.Text
		return res, true, nil
	}
	var args struct {
		Read string `json:"read"`
		Full bool   `json:"full"`
	}
	_ = json.Unmarshal(call.Args, &args)
	if !l.Asks(conn, args.Read) {
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
	rec := agent.LookRecord{Text: text, Reads: []agent.LookShown{s}}
	if _, err := r.done(ctx, key, tn, rec); err != nil {
		return res, true, err
	}
	r.looked(ctx, key, n, round, rec.Reads)
	res.Content, res.IsError = text, s.Form == agent.LookFailed
	return res, true, nil
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
func (r *run) effectOf(ctx context.Context, ts *agent.ToolSet, call agent.ModelToolCall) string {
	if t, ok := ts.ByName[call.Name]; !ok || t.Op == document.LookOp || t.Lists {
		return ""
	}
	var args map[string]any
	_ = json.Unmarshal(call.Args, &args)
	name, op, _, err := ts.Resolve(call.Name, args)
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
