package mcp

import (
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// MaxToolIDLen is the longest tool id a model is shown (the tool-name limit
// of the model APIs).
const MaxToolIDLen = connect.MaxToolIDLen

// ToolIDs names the tools of a connection for models: "<connection>_<tool>".
// Characters outside [A-Za-z0-9_-] become '_' and ids are cut to 128
// characters. An id that needed neither (the tool's name was already valid)
// is kept as is; only reduced ids are ever suffixed (_2, _3, …) when they
// collide, so adding a dotted tool to a server never moves an existing one.
// The map goes from remote tool name to id; the remote tool is still called
// by its own name. The rule is the harness's (model turns name tools by
// it), so an id shown here is the one a model sees.
func ToolIDs(connection string, tools []string) map[string]string {
	return connect.ToolIDs(connection, tools)
}

// ModelTool is one operation as a model sees it.
type ModelTool struct {
	// ID is the name the model calls it by (see ToolIDs).
	ID string `json:"id"`
	// Operation is the remote tool's own name, which the call is sent with.
	Operation string `json:"operation"`
	// Description is prefixed "[<connection>] " so a model can tell which
	// server a tool comes from.
	Description string              `json:"description"`
	InputSchema []byte              `json:"inputSchema,omitempty"`
	Annotations connect.Annotations `json:"annotations"`
}

// ModelTools lists a connection's operations for a model, in manifest
// order, with ids from ToolIDs and annotations (title and hints) carried.
func ModelTools(connection string, m connect.Manifest) []ModelTool {
	names := make([]string, len(m.Operations))
	for i, op := range m.Operations {
		names[i] = op.Name
	}
	ids := ToolIDs(connection, names)
	out := make([]ModelTool, 0, len(m.Operations))
	for _, op := range m.Operations {
		desc := "[" + connection + "]"
		if op.Description != "" {
			desc += " " + op.Description
		}
		out = append(out, ModelTool{
			ID:          ids[op.Name],
			Operation:   op.Name,
			Description: desc,
			InputSchema: op.InputSchema,
			Annotations: op.Annotations,
		})
	}
	return out
}
