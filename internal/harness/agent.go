package harness

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// AgentRequest is the shorthand for a one-node document: a model turn
// ({"model", "instructions"?, "tools"?, "until"?, "toolChoice"?,
// "maxTokens"?, "output"?}) on the request's input.
type AgentRequest struct {
	Agent     json.RawMessage
	Input     any
	Principal string
	Allowlist string
	// ID is the new execution's id, as Request.ID.
	ID string
}

// agentNodeID is the id of the shorthand's only node.
const agentNodeID = "agent"

// SubmitAgent submits the agent shorthand as the document it stands for.
// The document declares the connections the agent's tools pick, or
// without tools every connection the request's allowlist grants. Problems
// are reported at "/agent/…" paths.
func (e *Executions) SubmitAgent(ctx context.Context, req AgentRequest) (*Execution, error) {
	doc, err := e.agentDocument(ctx, req.Agent, req.Allowlist)
	if err != nil {
		return nil, err
	}
	ex, err := e.Submit(ctx, Request{Workflow: doc, Input: req.Input, Principal: req.Principal, Allowlist: req.Allowlist, ID: req.ID})
	var ve *fault.ValidationError
	if errors.As(err, &ve) {
		for i := range ve.Problems {
			ve.Problems[i].Path = agentPath(ve.Problems[i].Path)
		}
	}
	return ex, err
}

// agentPath maps a problem in the generated document to the request.
func agentPath(p string) string {
	if rest, ok := strings.CutPrefix(p, "/workflow/root"); ok {
		return "/agent" + rest
	}
	return "/agent"
}

func (e *Executions) agentDocument(ctx context.Context, raw json.RawMessage, allowlist string) (json.RawMessage, error) {
	var agent map[string]any
	if err := json.Unmarshal(raw, &agent); err != nil || agent == nil {
		return nil, &fault.ValidationError{Problems: []fault.FieldError{{Path: "/agent", Code: fault.CodeValidationFailed, Message: "must be an object with model, instructions and tools"}}}
	}
	for _, k := range []string{"kind", "id"} {
		if _, ok := agent[k]; ok {
			return nil, &fault.ValidationError{Problems: []fault.FieldError{{Path: "/agent/" + k, Code: fault.CodeValidationFailed,
				Message: "unknown field (allowed: model, instructions, input, tools, until, toolChoice, maxTokens, output)"}}}
		}
	}
	root := map[string]any{"kind": document.KindModel, "id": agentNodeID}
	for k, v := range agent {
		root[k] = v
	}
	conns := map[string]any{}
	if tools, ok := agent["tools"].([]any); ok {
		for _, t := range tools {
			m, _ := t.(map[string]any)
			if name, ok := m["connection"].(string); ok {
				if _, err := e.reg.Get(name); err == nil {
					conns[name] = map[string]any{}
				}
			}
		}
	} else {
		al, err := e.allowlist(ctx, allowlist)
		if err != nil {
			return nil, err
		}
		if al != nil {
			for name := range al.Connections {
				if _, err := e.reg.Get(name); err == nil {
					conns[name] = map[string]any{}
				}
			}
		}
	}
	return json.Marshal(map[string]any{"version": 1, "connections": conns, "root": root})
}
