package mcpserver

import (
	"context"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

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
// Not forwarded: to 2026-07-28 clients (they have no session to ask on;
// the question waits in the queue), and to a call answered as a task.

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
	params := mcp.ElicitationParams{Mode: q.Mode, Message: q.Message, URL: q.URL, ElicitationID: q.ElicitationID}
	if q.Mode == gates.ModeForm {
		params.RequestedSchema = q.RequestedSchema
	}
	res, err := s.mcp.RequestElicitation(ctx, mcp.ElicitationRequest{Params: params})
	if err != nil {
		s.o.Logger.Info("mcp: a question was not forwarded to the calling client; it waits for a person", "question", id, "err", err)
		return
	}
	by := "mcp-client"
	if c := callerFrom(ctx); c != nil {
		by = c.Name
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
