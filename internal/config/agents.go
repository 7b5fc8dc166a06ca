package config

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
)

// Agent is one entry under agents: a coding agent that speaks the Agent
// Client Protocol over stdio, which an acp-agent node names. Agents are
// host code: a workflow document names an agent, it never brings a
// command, and an allowlist grants agents by name.
type Agent struct {
	// Command is the agent's executable (a path, or a name looked up in
	// PATH), started over stdio for each node run; required. ${env:NAME}
	// may stand in it.
	Command string `yaml:"command"`
	// Args are the command's arguments; ${env:NAME} may stand in them.
	Args []string `yaml:"args"`
	// Env is the agent's whole environment beside PATH and HOME (nothing
	// else of patchbay's is inherited): API keys and the like. A value
	// that is exactly ${secret:NAME} is resolved through the secret chain
	// when the agent starts; every value is redacted wherever it could
	// show.
	Env map[string]string `yaml:"env"`
	// Cwd is the agent's working directory, and the root its file and
	// terminal capabilities are confined to. Empty: a fresh temporary
	// directory per node run.
	Cwd string `yaml:"cwd"`
	// TimeoutMs bounds one node run of the agent (default 10 minutes).
	TimeoutMs int64 `yaml:"timeoutMs"`
	// Permissions decides the agent's permission requests by tool kind
	// without asking a person; kinds in neither list become approvals.
	Permissions *AgentPermissions `yaml:"permissions"`
	// FS and Terminal turn on the client capabilities patchbay declares
	// (reading and writing files, running commands), confined to Cwd.
	FS       bool `yaml:"fs"`
	Terminal bool `yaml:"terminal"`
	// Determinism: replayable | unsafe (default). After a crash an agent
	// that cannot load its session is sent the prompt again in a new
	// session only when replayable; unsafe fails the node instead.
	Determinism string `yaml:"determinism"`
}

// AgentPermissions are ACP tool kinds (read, edit, delete, move, search,
// execute, think, fetch, switch_mode, other) or "*".
type AgentPermissions struct {
	// Allow lists the tool kinds (read, edit, delete, move, search,
	// execute, think, fetch, switch_mode, other, or "*" for any) whose
	// permission requests are granted without asking a person.
	Allow []string `yaml:"allow"`
	// Deny lists the tool kinds whose requests are refused without
	// asking; a kind in both lists is refused.
	Deny []string `yaml:"deny"`
}

// DefaultAgentTimeoutMs bounds an agent node run when its entry sets no
// timeoutMs.
const DefaultAgentTimeoutMs = 10 * 60 * 1000

const maxAgentTimeoutMs = 24 * 60 * 60 * 1000

var agentToolKinds = []string{"read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other", "*"}

// substituteAgents replaces ${env:NAME} in agent entries; an env value
// that is exactly ${secret:NAME} is kept for the server to resolve.
func (f *File) substituteAgents(getenv func(string) string, ps *problems) {
	for _, name := range slices.Sorted(maps.Keys(f.Agents)) {
		a, path := f.Agents[name], "agents."+name
		a.Command = substituteString(a.Command, path+".command", getenv, ps)
		for i := range a.Args {
			a.Args[i] = substituteString(a.Args[i], fmt.Sprintf("%s.args[%d]", path, i), getenv, ps)
		}
		for _, k := range slices.Sorted(maps.Keys(a.Env)) {
			if _, ok := SecretRef(a.Env[k]); !ok {
				a.Env[k] = substituteString(a.Env[k], path+".env."+k, getenv, ps)
			}
		}
		a.Cwd = substituteString(a.Cwd, path+".cwd", getenv, ps)
		f.Agents[name] = a
	}
}

func (f *File) validateAgents(ps *problems) {
	for _, name := range slices.Sorted(maps.Keys(f.Agents)) {
		a, path := f.Agents[name], "agents."+name
		if !ValidName(name) {
			ps.add(path, "name must be a letter followed by letters, digits, '_' or '-', at most 64 characters")
		}
		if strings.TrimSpace(a.Command) == "" {
			ps.add(path+".command", "is required: the agent's executable")
		}
		for _, k := range slices.Sorted(maps.Keys(a.Env)) {
			if !envNameRE.MatchString(k) {
				ps.add(path+".env."+k, "is not a valid environment variable name")
			}
		}
		if a.Cwd != "" && !filepath.IsAbs(a.Cwd) {
			ps.add(path+".cwd", "must be an absolute path")
		}
		if a.TimeoutMs < 0 || a.TimeoutMs > maxAgentTimeoutMs {
			ps.add(path+".timeoutMs", "must be from 0 (the default, 10 minutes) to %d", maxAgentTimeoutMs)
		}
		switch a.Determinism {
		case "", "replayable", "unsafe":
		default:
			ps.add(path+".determinism", "must be replayable or unsafe, not %q", a.Determinism)
		}
		if (a.FS || a.Terminal) && a.Cwd == "" {
			ps.add(path+".cwd", "is required when fs or terminal is on: it is the directory they are confined to")
		}
		if p := a.Permissions; p != nil {
			for field, kinds := range map[string][]string{"allow": p.Allow, "deny": p.Deny} {
				for i, k := range kinds {
					if !slices.Contains(agentToolKinds, k) {
						ps.add(fmt.Sprintf("%s.permissions.%s[%d]", path, field, i), "must be a tool kind (%s), not %q", strings.Join(agentToolKinds, ", "), k)
					}
				}
			}
		}
	}
}

// Timeout is the entry's bound on one node run, in milliseconds.
func (a Agent) Timeout() int64 {
	if a.TimeoutMs == 0 {
		return DefaultAgentTimeoutMs
	}
	return a.TimeoutMs
}
