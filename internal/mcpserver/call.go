package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// progressEvery is how often a held call tells the client it still
// waits; well inside the idle timeouts of clients and proxies.
const progressEvery = 2 * time.Second

// call serves every tools/call: the call runs as an execution the
// caller owns, and the client is held until it ends or Hold passes.
func (s *Server) call(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	c := callerFrom(ctx)
	if c == nil {
		return nil, errors.New("mcp: a call without a caller")
	}
	s.count(ctx, c.Name)
	if c.Bridge != "" {
		return s.bridgeCall(ctx, c, req)
	}
	tc := toolCall(c.Principal, c.offer, sessionID(ctx), req.Params.Meta, req.Params.Name, req.GetArguments())
	if callID, ok := s.answered(ctx, c, req); ok {
		tc.CallID = callID // the retry of a call that asked: the same call
	}
	ex, err := s.o.Engine.CallTool(ctx, tc)
	if err != nil {
		return refusal(err)
	}
	return s.await(ctx, req, ex, tc.CallID)
}

// bridgeCall runs an acp-agent node's call as a step of the node's
// execution: the agent waits for it in place, approvals included (the
// node run holds the agent anyway), so there is no Hold and no task.
func (s *Server) bridgeCall(ctx context.Context, c *caller, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	res, err := s.o.Engine.BridgeCall(ctx, c.Bridge, req.Params.Name, req.GetArguments())
	switch {
	case errors.Is(err, harness.ErrBridgeClosed):
		return mcp.NewToolResultError(err.Error()), nil
	case err != nil:
		return nil, err
	case res.IsError:
		return mcp.NewToolResultError(res.Content), nil
	}
	return mcp.NewToolResultText(res.Content), nil
}

// toolCall is a tools/call of p as the engine takes it: under the call id
// the client named in _meta, else one named here (so that a held call's
// answer can say which id gets its outcome); refs sealed to the caller
// and its 2025-era session, which holds the pool leases its calls take.
func toolCall(p authz.Principal, offer *harness.ToolOffer, session string, meta *mcp.Meta, tool string, args map[string]any) harness.ToolCall {
	callID := ""
	if meta != nil {
		callID, _ = meta.AdditionalFields[MetaCallID].(string)
	}
	if callID == "" {
		callID = "c_" + strings.ToLower(rand.Text())
	}
	scope := "mcp:" + p.Name
	if session != "" {
		scope = sessionScope(p.Name, session)
	}
	return harness.ToolCall{
		ToolCaller: harness.ToolCaller{Principal: p.Name, Allowlist: p.Allowlist},
		CallID:     callID, Scope: scope, HoldLeases: session != "",
		Tool: tool, Args: args, Offer: offer,
	}
}

// count notes the call on its session (or 2026-era client) for the
// admin UI.
func (s *Server) count(ctx context.Context, principal string) {
	cs := server.ClientSessionFromContext(ctx)
	if cs == nil {
		return
	}
	var client, version, era string
	if ci, ok := cs.(server.SessionWithClientInfo); ok {
		client, version = ci.GetClientInfo().Name, ci.GetClientInfo().Version
	}
	if pi := server.RequestProtocolInfoFromContext(ctx); pi != nil {
		era = pi.ProtocolVersion
		if pi.ClientInfo != nil {
			client, version = pi.ClientInfo.Name, pi.ClientInfo.Version
		}
	}
	s.sessions.called(cs.SessionID(), principal, client, version, era)
}

// sessionScope is a 2025-era session's scope: its refs, and the pool
// leases it holds across its calls (released when the session ends).
// A 2026-era caller has no session, so each of its calls leases afresh.
func sessionScope(principal, session string) string { return "mcp:" + principal + ":" + session }

// sessionID is the request's 2025-era session, "" for none.
func sessionID(ctx context.Context) string {
	if cs := server.ClientSessionFromContext(ctx); cs != nil {
		return cs.SessionID()
	}
	return ""
}

// refusal is the answer to a call that could not start: a tool error the
// model can read for what the caller got wrong, else the error itself
// (a JSON-RPC internal error; its detail is logged, not sent).
func refusal(err error) (*mcp.CallToolResult, error) {
	var ve *fault.ValidationError
	var fe *fault.Error
	switch {
	case errors.Is(err, harness.ErrUnknownTool), errors.Is(err, harness.ErrCallIDReused):
		return mcp.NewToolResultError(err.Error()), nil
	case errors.As(err, &ve):
		msg := "refused:"
		for _, p := range ve.Problems {
			msg += fmt.Sprintf(" %s: %s (%s);", p.Path, p.Message, p.Code)
		}
		return mcp.NewToolResultError(msg), nil
	case errors.As(err, &fe):
		return mcp.NewToolResultError(fe.Error()), nil
	}
	return nil, err
}

// await holds the client while the call's execution runs, telling it of
// progress, and answers with its result; past Hold, with a tool error
// naming what it waits for.
func (s *Server) await(ctx context.Context, req mcp.CallToolRequest, ex *harness.Execution, callID string) (*mcp.CallToolResult, error) {
	deadline := time.Now().Add(s.o.Hold)
	var token mcp.ProgressToken
	if req.Params.Meta != nil {
		token = req.Params.Meta.ProgressToken
	}
	var step float64
	forwarded := map[string]bool{}
	for {
		o := harness.OutcomeOf(ex)
		if o.Question != "" && !forwarded[o.Question] {
			forwarded[o.Question] = true
			if res, ok := s.askInResult(ctx, o.Question, ex, callID); ok {
				return res, nil
			}
			s.forward(ctx, o.Question)
		}
		if o.Done {
			if u, ok := s.signInURL(ex, o.Error); ok && elicitsURL(ctx, req) {
				return signInElicitation(u, ex), nil
			}
			return s.result(ex, o), nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return held(ex.ID, callID, o), nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if token != nil {
			step++
			msg := "running"
			if o.Approval != "" {
				msg = "waiting for approval " + o.Approval
			}
			_ = s.mcp.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
				"progressToken": token, "progress": step, "message": msg,
			})
		}
		next, err := s.o.Engine.Wait(ctx, ex.ID, min(progressEvery, left))
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("mcp: follow execution %s: %w", ex.ID, err)
		}
		ex = next
	}
}

// result is a finished call's answer. Text stays text; any other value is
// its JSON, and an object is also the structured content.
func (s *Server) result(ex *harness.Execution, o harness.ToolOutcome) *mcp.CallToolResult {
	var res *mcp.CallToolResult
	switch {
	case o.Error != nil:
		res = mcp.NewToolResultError(o.Error.Code + ": " + o.Error.Message + s.signInHint(ex, o.Error))
	default:
		res = valueResult(o.Output)
	}
	res.Meta = mcp.NewMetaFromMap(map[string]any{MetaExecution: ex.ID})
	return res
}

// signInURL is where a caller refused for want of its own sign-in (gate 6
// of a per-user connection) signs in: the admin UI's sign-in route,
// signed in there as the same principal.
func (s *Server) signInURL(ex *harness.Execution, e *harness.ExecError) (string, bool) {
	if e == nil || e.Code != fault.SteeringDenied || e.Gate != int(fault.GateSecrets) || !strings.Contains(e.Message, "needs a sign-in") || len(ex.Steps) == 0 {
		return "", false
	}
	return s.o.PublicURL + "/oauth/" + url.PathEscape(ex.Steps[0].Connection) + "/start", true
}

func (s *Server) signInHint(ex *harness.Execution, e *harness.ExecError) string {
	u, ok := s.signInURL(ex, e)
	if !ok {
		return ""
	}
	return fmt.Sprintf(" Sign in at %s (the admin UI, as %s), then call again.", u, ex.Principal)
}

// elicitsURL reports whether the client takes a URL elicitation in a
// 2026-era result (it declared elicitation.url), and this is the call's
// first round: a retry carrying answers is not asked again, so a caller
// who did not sign in gets the tool error rather than a loop.
func elicitsURL(ctx context.Context, req mcp.CallToolRequest) bool {
	pi := server.RequestProtocolInfoFromContext(ctx)
	return pi != nil && pi.Modern && pi.ClientCapabilities != nil && pi.ClientCapabilities.Elicitation != nil &&
		pi.ClientCapabilities.Elicitation.URL != nil && len(req.Params.InputResponses) == 0
}

// signInElicitation asks the client to open the sign-in URL, then call
// again (SEP-2322's input_required result with a URL elicitation).
func signInElicitation(u string, ex *harness.Execution) *mcp.CallToolResult {
	res := server.NewInputRequestBuilder("").Elicit("sign-in", mcp.ElicitationParams{
		Mode: "url", URL: u, ElicitationID: "signin_" + ex.ID,
		Message: fmt.Sprintf("This tool acts as you (%s): sign in to its service, then the call runs again.", ex.Principal),
	}).ToolResult()
	res.Meta = mcp.NewMetaFromMap(map[string]any{MetaExecution: ex.ID})
	return res
}

func valueResult(v any) *mcp.CallToolResult {
	if text, ok := v.(string); ok {
		return mcp.NewToolResultText(text)
	}
	data, err := json.Marshal(v)
	if err != nil {
		return mcp.NewToolResultError("the result could not be encoded")
	}
	res := mcp.NewToolResultText(string(data))
	if obj, ok := v.(map[string]any); ok {
		res.StructuredContent = obj
	}
	return res
}

// held is the answer of a call still running or waiting when the client
// has been held long enough: a tool error saying what it waits for and
// how to get its outcome (the same call id again).
func held(id, callID string, o harness.ToolOutcome) *mcp.CallToolResult {
	var why string
	if o.Approval != "" {
		why = fmt.Sprintf("approval_pending: this call waits for approval %s (a person decides it in the admin UI or through POST /v1/approvals/%s/approve)", o.Approval, o.Approval)
	} else {
		why = "still_running: this call has not finished yet"
	}
	res := mcp.NewToolResultError(why + fmt.Sprintf("; it runs as execution %s. Call again with the same arguments and _meta {%q: %q} to get its outcome.", id, MetaCallID, callID))
	meta := map[string]any{MetaExecution: id, MetaCallID: callID}
	if o.Approval != "" {
		meta[MetaApproval] = o.Approval
	}
	res.Meta = mcp.NewMetaFromMap(meta)
	return res
}
