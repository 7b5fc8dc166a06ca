package mcpserver

import (
	"context"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// Questions a call's server asks, forwarded to the calling client: a held
// call of a 2025-era session whose client declared elicitation gets the
// question as an elicitation/create of its own, and the client's answer
// (the person at that client) decides the question, as an answer through
// the API would. A client that takes no elicitations, or does not answer,
// leaves the question in the queue for a person. The answer is checked
// against the requested schema first; one that does not match leaves the
// question pending.
//
// A 2026-07-28 client that declared elicitation has no session to be
// asked on: its call is answered with an input_required result carrying
// the question and a requestState naming it and the call id; the retry
// carrying the answer decides the question and follows the same call.
// Not forwarded: to a call answered as a task.

// forward puts the question id to the calling client, if it takes
// elicitations, and decides the question with its answer.
func (s *Server) forward(ctx context.Context, id string) {
	if !elicits(ctx) {
		return
	}
	qs := s.o.Engine.Questions()
	q, err := qs.Get(ctx, id)
	if err != nil || q.State != gates.QuestionPending {
		return
	}
	res, err := s.mcp.RequestElicitation(ctx, mcp.ElicitationRequest{Params: elicitation(q)})
	if err != nil {
		s.o.Logger.Info("mcp: a question was not forwarded to the calling client; it waits for a person", "question", id, "err", err)
		return
	}
	by := "mcp-client"
	if c := callerFrom(ctx); c != nil {
		by = c.Name
	}
	s.decide(ctx, by, id, res)
}

// decide records the calling client's answer to question id: checked
// against the schema first (an answer that does not match leaves it
// pending, for a person).
func (s *Server) decide(ctx context.Context, by, id string, res *mcp.ElicitationResult) {
	qs := s.o.Engine.Questions()
	q, err := qs.Get(ctx, id)
	if err != nil || q.State != gates.QuestionPending {
		return
	}
	var state gates.QuestionState
	var content map[string]any
	switch res.Action {
	case mcp.ElicitationResponseActionAccept:
		state = gates.QuestionAnswered
		if q.Mode == gates.ModeForm {
			content, _ = res.Content.(map[string]any)
			if problems := gates.ValidateAnswer(q.RequestedSchema, content); len(problems) > 0 {
				s.o.Logger.Info("mcp: the calling client's answer does not match the question's schema; it waits for a person", "question", id)
				return
			}
		}
	case mcp.ElicitationResponseActionDecline:
		state = gates.QuestionDeclined
	default:
		state = gates.QuestionCancelled
	}
	if _, err := qs.Decide(ctx, id, state, by, content, "answered by the calling MCP client"); err != nil {
		s.o.Logger.Info("mcp: the calling client's answer was not recorded", "question", id, "err", err)
	}
}

// elicits reports whether the request's client takes elicitations: a
// 2025-era session whose client declared the capability.
func elicits(ctx context.Context) bool {
	cs := server.ClientSessionFromContext(ctx)
	if cs == nil {
		return false
	}
	ci, ok := cs.(server.SessionWithClientInfo)
	if !ok {
		return false
	}
	return ci.GetClientCapabilities().Elicitation != nil
}

// stateQuestion starts the requestState of a call that asks its client a
// question: "pbq:<question>:<call id>".
const stateQuestion = "pbq:"

// askInResult answers a 2026-07-28 call whose client takes elicitations
// with the question, for the client to answer in its retry.
func (s *Server) askInResult(ctx context.Context, id string, ex *harness.Execution, callID string) (*mcp.CallToolResult, bool) {
	pi := server.RequestProtocolInfoFromContext(ctx)
	if pi == nil || !pi.Modern || pi.ClientCapabilities == nil || pi.ClientCapabilities.Elicitation == nil {
		return nil, false
	}
	q, err := s.o.Engine.Questions().Get(ctx, id)
	if err != nil || q.State != gates.QuestionPending {
		return nil, false
	}
	caps := pi.ClientCapabilities.Elicitation
	if q.Mode == gates.ModeURL && caps.URL == nil || q.Mode == gates.ModeForm && caps.Form == nil && caps.URL != nil {
		return nil, false // a mode the client does not take
	}
	res := server.NewInputRequestBuilder(stateQuestion+id+":"+callID).Elicit("q", elicitation(q)).ToolResult()
	res.Meta = mcp.NewMetaFromMap(map[string]any{MetaExecution: ex.ID, MetaCallID: callID})
	return res, true
}

// answered decides the question a retry answers (its requestState names
// it) and returns the call id of the call that asked.
func (s *Server) answered(ctx context.Context, c *caller, req mcp.CallToolRequest) (string, bool) {
	rest, ok := strings.CutPrefix(req.Params.RequestState, stateQuestion)
	if !ok {
		return "", false
	}
	id, callID, ok := strings.Cut(rest, ":")
	if !ok || !harness.ValidCallID(callID) {
		return "", false
	}
	if res := server.ElicitationResponse(req.Params.InputResponses, "q"); res != nil {
		s.decide(ctx, c.Name, id, res)
	}
	return callID, true
}

// elicitation is a question as its client is asked it.
func elicitation(q *gates.Question) mcp.ElicitationParams {
	params := mcp.ElicitationParams{Mode: q.Mode, Message: q.Message, URL: q.URL, ElicitationID: q.ElicitationID}
	if q.Mode == gates.ModeForm {
		params.RequestedSchema = q.RequestedSchema
	}
	return params
}
