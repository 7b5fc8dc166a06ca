package document

import (
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// KindACPAgent runs a coding agent over the Agent Client Protocol: the
// agent named from the config file's agents, given the prompt, reaching
// connections only through the tools the node picks (as a model node's).
const KindACPAgent = "acp-agent"

// AgentSpec is a parsed acp-agent node. Its tools, prompt (Input), until
// and output sit in the node's Model spec, which the tool set, the look
// layer and the allowlist check already read; its Ref is empty.
type AgentSpec struct {
	Agent string // a name under the config file's agents
}

// hostOnly are fields an agent entry of the config file has and a
// document may never set: agents are host code.
var hostOnly = []string{"command", "args", "env", "cwd", "permissions", "fs", "terminal"}

// acpAgent parses {"kind": "acp-agent", "id", "agent", "prompt"?,
// "tools"?, "until"?, "output"?}.
func (p *parser) acpAgent(obj map[string]any, at string) *Node {
	for _, f := range hostOnly {
		if _, ok := obj[f]; ok {
			p.fail(at+"/"+f, fault.CodeValidationFailed, "a document cannot set an agent's %s: agents are host code, declared under the config file's agents; name one in \"agent\"", f)
			delete(obj, f)
		}
	}
	p.checkFields(obj, at, "kind", "id", "agent", "prompt", "tools", "until", "output")
	n := &Node{Kind: KindACPAgent, ID: p.id(obj["id"], at), Path: at}
	spec := &AgentSpec{}
	spec.Agent, _ = obj["agent"].(string)
	if !registry.ValidName(spec.Agent) {
		p.fail(at+"/agent", fault.CodeValidationFailed, "is required: the name of an agent under the config file's agents")
	}
	tools := &ModelSpec{}
	if v, ok := obj["prompt"]; ok {
		p.secrets, p.field = nil, "prompt"
		tools.Input = p.value(v, at+"/prompt")
		for _, s := range p.secrets {
			p.fail(s.Path, fault.CodeValidationFailed, "an agent's prompt may not hold secrets: the agent and its model would read them")
		}
		p.secrets = nil
	}
	if v, ok := obj["tools"]; ok {
		p.modelTools(v, at+"/tools", tools)
	}
	if v, ok := obj["until"]; ok {
		tools.MaxRounds = p.until(v, at+"/until")
	}
	if v, ok := obj["output"]; ok {
		tools.Output = p.output(v, at+"/output")
	}
	n.Agent, n.Model = spec, tools
	p.done[n.ID] = true
	return n
}
