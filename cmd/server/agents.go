package main

import (
	"net"
	"strconv"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
)

// agentEntries are the config file's agents as the engine runs them.
func agentEntries(specs map[string]config.Agent) map[string]harness.AgentEntry {
	out := make(map[string]harness.AgentEntry, len(specs))
	for name, a := range specs {
		e := harness.AgentEntry{
			Command: a.Command, Args: a.Args, Env: a.Env, Cwd: a.Cwd,
			Timeout: time.Duration(a.Timeout()) * time.Millisecond,
			FS:      a.FS, Terminal: a.Terminal, Replayable: a.Determinism == "replayable",
		}
		if p := a.Permissions; p != nil {
			e.Allow, e.Deny = p.Allow, p.Deny
		}
		out[name] = e
	}
	return out
}

// bridgeURL is where agents this process starts reach its /mcp: the
// address it listens on, loopback when it listens on every interface.
func bridgeURL(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return "http://" + addr.String() + "/mcp"
	}
	host := tcp.IP.String()
	if tcp.IP == nil || tcp.IP.IsUnspecified() {
		host = "127.0.0.1"
		if tcp.IP != nil && tcp.IP.To4() == nil {
			host = "::1"
		}
	}
	return "http://" + net.JoinHostPort(host, strconv.Itoa(tcp.Port)) + "/mcp"
}
