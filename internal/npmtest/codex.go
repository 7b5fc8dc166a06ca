package npmtest

import (
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
)

// CodexACPVersion is the pinned @zed-industries/codex-acp, the ACP
// adapter around the Codex agent (it embeds codex-rs, commit f221438).
const CodexACPVersion = "0.16.0"

// CodexModel is the model name CodexArgs configures; the fake model
// server sees it as the request's model and answers whatever it is.
const CodexModel = "gpt-5.4-mini"

// CodexACP installs @zed-industries/codex-acp and its platform package
// (which holds the prebuilt binary) into .cache/npm/codex-acp and returns
// the binary's path, to be run directly (not through node). Under
// CI=true a piece that cannot be had fails the test; elsewhere it skips.
func CodexACP(t testing.TB) string {
	t.Helper()
	platform, ok := codexPlatform()
	if !ok {
		Missing(t, "codex-acp has no prebuilt binary for %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	pkg := "@zed-industries/codex-acp-" + platform
	dirs := RequireAll(t, "codex-acp", "@zed-industries/codex-acp@"+CodexACPVersion, pkg+"@"+CodexACPVersion)
	name := "codex-acp"
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	return filepath.Join(dirs[1], "bin", name)
}

func codexPlatform() (string, bool) {
	arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
	osName := map[string]string{"linux": "linux", "darwin": "darwin", "windows": "win32"}[runtime.GOOS]
	if arch == "" || osName == "" {
		return "", false
	}
	return osName + "-" + arch, true
}

// CodexArgs are the command-line overrides (-c key=TOML value) that run
// codex-acp offline against a fake Responses server at modelBaseURL
// (ending in /v1, as modeltest.Responses.URL does):
//
//   - model CodexModel from a custom provider "fake" (wire_api
//     "responses", its key read from FAKE_API_KEY, which CodexEnv sets),
//     so codex-acp asks for no login (it requires one only for the
//     built-in "openai" provider); retries are off, so an error status
//     from the fake fails the prompt at once (a JSON-RPC error -32603);
//   - approval_policy "never" with sandbox_mode "danger-full-access"
//     (the ACP session mode "full-access"): codex asks no permission for
//     anything, MCP tool calls included. Append -c approval_policy=
//     "on-request" (or "untrusted") to have it ask; a later -c for the
//     same key wins. See the package doc of internal/modeltest for when
//     codex asks.
//
// With these and a fresh CODEX_HOME codex connects to nothing but the
// fake and the MCP servers it is given (checked with strace: no other
// connect), and makes no request to the fake but POST /v1/responses.
func CodexArgs(modelBaseURL string) []string {
	provider := fmt.Sprintf(`model_providers.fake={name="Fake",base_url=%q,wire_api="responses",env_key="FAKE_API_KEY",request_max_retries=0,stream_max_retries=0}`, modelBaseURL)
	return []string{
		"-c", fmt.Sprintf("model=%q", CodexModel),
		"-c", `model_provider="fake"`,
		"-c", provider,
		"-c", `approval_policy="never"`,
		"-c", `sandbox_mode="danger-full-access"`,
	}
}

// CodexMCPServer is the -c override that configures an MCP server over
// Streamable HTTP in codex's own config, for every session of the
// process, instead of through session/new's mcpServers. It is the one way
// to give a server a tool-call timeout other than codex's default of
// 120 s: toolTimeout, when not 0, is its tool_timeout_sec (whole seconds,
// rounded up). codex-acp builds servers from session/new with no timeout
// of their own, and a session/new server of the same name replaces this
// one (timeout and all), so name it in one place only; and
// -c mcp_servers.NAME.tool_timeout_sec alone makes codex-acp exit at
// start ("invalid transport in mcp_servers.NAME"). name must match
// [A-Za-z0-9_-]+ (codex ignores a server named otherwise, silently).
// headers are sent with every request; without an Authorization header
// codex first probes the server for OAuth metadata (see the package doc
// of internal/modeltest).
func CodexMCPServer(name, url string, headers map[string]string, toolTimeout time.Duration) []string {
	fields := []string{fmt.Sprintf("url=%q", url)}
	if len(headers) > 0 {
		keys := make([]string, 0, len(headers))
		for k := range headers {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		hs := make([]string, len(keys))
		for i, k := range keys {
			hs[i] = fmt.Sprintf("%q=%q", k, headers[k])
		}
		fields = append(fields, "http_headers={"+strings.Join(hs, ",")+"}")
	}
	if toolTimeout > 0 {
		fields = append(fields, fmt.Sprintf("tool_timeout_sec=%d", int(math.Ceil(toolTimeout.Seconds()))))
	}
	return []string{"-c", "mcp_servers." + name + "={" + strings.Join(fields, ",") + "}"}
}

// CodexEnv is the whole environment for one codex-acp process: home is
// both HOME and CODEX_HOME (a fresh temp dir per test; codex keeps its
// sessions there as rollout files, sessions/YYYY/MM/DD/rollout-*.jsonl,
// with sqlite state beside them, so a second process given the same home
// can session/load a session the first created), FAKE_API_KEY for the
// fake provider, and a minimal PATH (codex runs shell commands with
// /bin/bash). Nothing is inherited, so no real key or token leaks in;
// RUST_LOG (e.g. "debug") may be appended to get codex's logs on stderr.
// Under /tmp codex prints a harmless warning that it will not create its
// helper binaries there.
func CodexEnv(home string) []string {
	return []string{
		"HOME=" + home,
		"CODEX_HOME=" + home,
		"FAKE_API_KEY=sk-fake",
		"PATH=/usr/local/bin:/usr/bin:/bin",
		"LANG=C.UTF-8",
		"NO_BROWSER=1",
	}
}
