package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// Questions from servers (MCP elicitation). Every session declares the
// elicitation capability, form and URL modes, and answers a server's
// elicitation/create (2025 eras) or input_required round (2026-07-28,
// which mcp-go's client drives) through the Asker of the call it belongs
// to (connect.CallRequest.Ask): the harness puts the question to a person
// and returns the answer. A call without an Asker, or a question that
// cannot be tied to one call, is declined.
//
// Tying a question to its call: over HTTP the server asks on the call's
// own response stream, and mcp-go hands the handler a context derived
// from the call's, which carries the call's slot. Over stdio the handler
// gets the transport's context, so the question belongs to the one call
// in flight on the connection; with several in flight it is declined
// (the protocol names no related request in the question).
//
// While a question waits, the call's requestTimeoutMs is paused: a person
// may take longer to answer than a server to reply; the harness bounds
// the wait instead.

// elicitor is a connection's answerer of elicitation requests.
type elicitor struct {
	mu       sync.Mutex
	inflight map[*slot]bool // calls in flight that carry an Asker
}

func newElicitor() *elicitor { return &elicitor{inflight: map[*slot]bool{}} }

// capability is what every session declares.
func elicitationCapability() *mcp.ElicitationCapability {
	return &mcp.ElicitationCapability{Form: &struct{}{}, URL: &struct{}{}}
}

func (e *elicitor) enter(s *slot) {
	e.mu.Lock()
	e.inflight[s] = true
	e.mu.Unlock()
}

func (e *elicitor) leave(s *slot) {
	e.mu.Lock()
	delete(e.inflight, s)
	e.mu.Unlock()
}

// slotOf is the call a question belongs to.
func (e *elicitor) slotOf(ctx context.Context) *slot {
	if s, ok := ctx.Value(slotKey{}).(*slot); ok && s.ask != nil {
		return s
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.inflight) != 1 {
		return nil
	}
	for s := range e.inflight {
		return s
	}
	return nil
}

// errRequestTimeout cuts a call that had no answer within
// requestTimeoutMs (not counting the time its questions waited).
var errRequestTimeout = fmt.Errorf("requestTimeoutMs passed: %w", context.DeadlineExceeded)

// Elicit implements client.ElicitationHandler.
func (e *elicitor) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	s := e.slotOf(ctx)
	if s == nil {
		return decline(), nil
	}
	q := connect.Question{Mode: req.Params.Mode, Message: req.Params.Message, URL: req.Params.URL, ElicitationID: req.Params.ElicitationID}
	if q.Mode == "" {
		q.Mode = "form"
	}
	if schema, ok := req.Params.RequestedSchema.(map[string]any); ok {
		q.RequestedSchema = schema
	} else if req.Params.RequestedSchema != nil {
		q.RequestedSchema = toMap(req.Params.RequestedSchema)
	}
	if s.park && s.input() != nil {
		// Asked in the call's answer (input_required): the harness parks
		// the run and sends the call again with the answers.
		return nil, errParked
	}
	s.pause()
	defer s.resume()
	ans, err := s.ask(s.callCtx, q)
	if err != nil {
		return nil, err
	}
	res := &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseAction(ans.Action)}}
	if ans.Action == connect.AnswerAccept && q.Mode != "url" {
		res.Content = ans.Content
	}
	return res, nil
}

func decline() *mcp.ElicitationResult {
	return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionDecline}}
}

// pausable is a call's requestTimeoutMs, which stops while the call
// waits for a person.
type pausable struct {
	mu     sync.Mutex
	d      time.Duration
	timer  *time.Timer
	cancel context.CancelCauseFunc
	paused int
}

// toMap turns a schema given as another Go value into a map, through
// JSON.
func toMap(v any) map[string]any {
	data, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(data, &m) != nil {
		return nil
	}
	return m
}

func (p *pausable) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused++; p.paused == 1 && p.timer != nil {
		p.timer.Stop()
	}
}

func (p *pausable) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused--; p.paused == 0 && p.timer != nil {
		p.timer.Reset(p.d) // a fresh timeout for the rest of the call
	}
}

// errParked stops mcp-go's multi round-trip loop for a call whose
// questions the harness answers durably (connect.CallRequest.Park).
var errParked = errors.New("the questions are put to a person; the run waits for the answers")

// inputRound is an input_required answer to a call: its state and the
// raw input requests, by id.
type inputRound struct {
	State    string
	Requests map[string]json.RawMessage
}

// noteInputRequired records an input_required tools/call result on the
// call's slot.
func noteInputRequired(ctx context.Context, result json.RawMessage) {
	s, ok := ctx.Value(slotKey{}).(*slot)
	if !ok || !mayBeResultType(result, string(mcp.ResultTypeInputRequired)) {
		return
	}
	var r struct {
		ResultType    string                     `json:"resultType"`
		RequestState  string                     `json:"requestState"`
		InputRequests map[string]json.RawMessage `json:"inputRequests"`
	}
	if json.Unmarshal(result, &r) != nil || r.ResultType != string(mcp.ResultTypeInputRequired) {
		return
	}
	s.mu.Lock()
	s.round = &inputRound{State: r.RequestState, Requests: r.InputRequests}
	s.mu.Unlock()
}

// mayBeResultType reports whether a call's result may have the
// resultType want: a task, or questions. Most results are plain (2026-07-28
// results say "complete"), and decoding each one twice more to find out
// cost more than the rest of the call's own work, so every "resultType"
// member the text holds is looked at without decoding — any that says
// want sends the result to the full decode, which judges. A server that
// escapes the key's letters is not worth the scan.
func mayBeResultType(result json.RawMessage, want string) bool {
	const key = `"resultType"`
	for rest := []byte(result); ; {
		i := bytes.Index(rest, []byte(key))
		if i < 0 {
			return false
		}
		rest = rest[i+len(key):]
		value, isMember := bytes.CutPrefix(bytes.TrimLeft(rest, " \t\r\n"), []byte(":"))
		if isMember && bytes.HasPrefix(bytes.TrimLeft(value, " \t\r\n"), []byte(`"`+want+`"`)) {
			return true
		}
	}
}

// inputRequired is the call's questions, for the harness to park on.
func inputRequired(op string, r *inputRound) (*connect.InputRequired, error) {
	ir := &connect.InputRequired{Op: op, RequestState: r.State, Questions: map[string]connect.Question{}}
	for id, raw := range r.Requests {
		var req struct {
			Method string                `json:"method"`
			Params mcp.ElicitationParams `json:"params"`
		}
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, fmt.Errorf("input request %q: %w", id, err)
		}
		if req.Method != string(mcp.MethodElicitationCreate) {
			return nil, fmt.Errorf("input request %q asks for %s, which patchbay does not give", id, req.Method)
		}
		q := connect.Question{Mode: req.Params.Mode, Message: req.Params.Message, URL: req.Params.URL, ElicitationID: req.Params.ElicitationID}
		if q.Mode == "" {
			q.Mode = "form"
		}
		q.RequestedSchema = toMap(req.Params.RequestedSchema)
		ir.Questions[id] = q
	}
	return ir, nil
}

// resumeParams are the answers of a parked call, as a retry carries them.
func resumeParams(r *connect.InputResume) mcp.MultiRoundTripParams {
	out := mcp.MultiRoundTripParams{RequestState: r.RequestState, InputResponses: mcp.InputResponses{}}
	for id, a := range r.Answers {
		res := mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseAction(a.Action)}}
		if a.Action == connect.AnswerAccept && a.Content != nil {
			res.Content = a.Content
		}
		out.InputResponses[id] = mcp.NewElicitationInputResponse(res)
	}
	return out
}

// withResume puts a parked call's answers (connect.CallRequest.Resume) on
// the first tools/call the call sends: mcp-go's client starts every call
// with empty round-trip params, so they are set here, once.
func withResume(ctx context.Context, params any) any {
	s, ok := ctx.Value(slotKey{}).(*slot)
	if !ok {
		return params
	}
	s.mu.Lock()
	resume := s.resumeWith
	s.resumeWith = nil
	s.mu.Unlock()
	if resume == nil {
		return params
	}
	m := toMap(params)
	if m == nil {
		return params
	}
	mrt := resumeParams(resume)
	m["requestState"] = mrt.RequestState
	m["inputResponses"] = mrt.InputResponses
	return m
}
