package modeltest

import (
	"regexp"
)

// CodexNamespace is the namespace under which Codex offers the model the
// tools of the MCP server named server: "mcp__" + the name with every
// character outside [A-Za-z0-9_] replaced by '_' ("patch-bay" →
// "mcp__patch_bay"). Codex offers it as one tool of type "namespace"
// whose tools are the server's, each a function named by the tool's own
// name with the same replacement ("gh_create-issue" → "gh_create_issue";
// a name that would make "mcp__<server>__<tool>" longer than 64
// characters is cut and ends in a hash).
func CodexNamespace(server string) string { return "mcp__" + codexName(server) }

// CodexMCPCall is the function call by which the model calls tool of the
// MCP server named server: Name is the tool's name, Namespace
// CodexNamespace(server). Codex refuses a call by the flat name
// "mcp__<server>__<tool>" or by the tool's name without the namespace
// ("unsupported call"). arguments is JSON text.
func CodexMCPCall(server, tool, arguments string) FunctionCall {
	return FunctionCall{Name: codexName(tool), Namespace: CodexNamespace(server), Arguments: arguments}
}

var notCodexName = regexp.MustCompile(`[^A-Za-z0-9_]`)

func codexName(s string) string { return notCodexName.ReplaceAllString(s, "_") }
