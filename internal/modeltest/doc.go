// Package modeltest owns fake model servers for tests. Responses is a
// scripted fake of the OpenAI Responses API on loopback; the real Codex
// agent (codex-acp, installed by npmtest.CodexACP and run with
// npmtest.CodexArgs and npmtest.CodexEnv) is pointed at it and so runs
// offline, with the test deciding every model turn.
//
// # What codex-acp 0.16.0 does (codex-rs 0.137.0), as observed on the wire
//
// Model requests. Codex sends only POST {base_url}/responses (stream
// true, store false, header Authorization "Bearer $FAKE_API_KEY"; no GET
// /models, no other host). It reads the SSE events response.created,
// response.output_item.added, response.output_text.delta,
// response.output_item.done (each message and function_call item) and
// response.completed (with usage); a stream that ends without
// response.completed is an error. The input holds, in order: a developer
// message (<permissions instructions>), a user message
// (<environment_context>), the user's prompt as a user message with
// input_text, then per turn function_call and function_call_output items
// and assistant messages; a later turn sends the whole history again.
//
// MCP tools. The tools of an MCP server named S are offered as one tool of
// type "namespace" named "mcp__S" whose "tools" are functions named by the
// MCP tool names (see CodexNamespace for how names are rewritten). The
// model calls one with a function_call whose name is the tool's name and
// whose "namespace" is "mcp__S" (CodexMCPCall); the flat name
// "mcp__S__tool" or the bare name are refused ("unsupported call: …",
// sent back as the call's output; the turn goes on). Codex's own tools
// beside them: exec_command, write_stdin, apply_patch (custom),
// update_plan, view_image, request_user_input, list/read MCP resources,
// goal tools, tool_search. The function_call_output Codex sends back for
// an MCP call is "Wall time: N seconds\nOutput:\n" followed by the
// result's content blocks as JSON (OutputText unwraps it), also for a
// result with isError.
//
// The MCP request. tools/call carries the arguments as the model sent
// them and params._meta = {progressToken (a counter per connection),
// threadId (the ACP sessionId), x-codex-turn-metadata: {session_id,
// thread_id, turn_id, model, reasoning_effort, sandbox,
// turn_started_at_unix_ms}}. No id of the model's function call (call_id)
// reaches the MCP server: two calls in one turn differ only in
// progressToken, JSON-RPC id and arguments. The call_id is the ACP
// toolCallId, so only the ACP client sees it. Headers given in session/new
// (e.g. Authorization) are sent on every MCP request. Without an
// Authorization header, session/new first probes for OAuth metadata: GET
// /.well-known/oauth-authorization-server/<path>,
// <path>/.well-known/oauth-authorization-server and
// /.well-known/oauth-authorization-server on the server's host, 5 s
// timeout each, so a server that answers those by holding an SSE stream
// open (mcp-go's handler mounted at "/") makes session/new take 15 s; one
// that answers 404 or 401 costs nothing. A server name outside
// [A-Za-z0-9_-] (e.g. with a dot) is ignored silently: no connection, no
// tools. session/new returns before the MCP connection is made; the
// first prompt waits for it.
//
// ACP. initialize answers protocolVersion 1, agentCapabilities
// {loadSession: true, promptCapabilities {image, embeddedContext},
// mcpCapabilities {http: true, sse: false}, sessionCapabilities {list,
// resume, close}}, authMethods (env vars CODEX_API_KEY, OPENAI_API_KEY;
// none is needed with the fake provider), agentInfo {name "codex-acp",
// version "0.16.0"}. session/new returns sessionId (a UUIDv7, the codex
// thread id), modes (read-only, auto, full-access; current "full-access"
// under CodexArgs, "read-only" with codex's defaults) and configOptions
// (mode, model, reasoning_effort). A prompt emits, as session/update:
// available_commands_update (first prompt), agent_message_chunk (the
// model's text, whole, once per message), usage_update {used, size}, and
// for an MCP call
//
//	tool_call {toolCallId: <call_id>, title: "Tool: S/tool", status: "in_progress",
//	           rawInput: {server, tool, arguments}}            (no kind)
//	tool_call_update {toolCallId, status: "completed", content: [{type: "content",
//	           content: {type: "text", text}}], rawOutput: {content: [...]}}
//
// or status "failed" with rawOutput {content, isError: true} for an
// isError result, or rawOutput "<message>" when codex failed the call
// (timeout, rejected). A shell command is a tool_call with kind "execute",
// title the command, rawInput {command: ["/bin/bash", "-lc", cmd], cwd,
// …}, then a tool_call_update with rawOutput {exit_code, stdout, stderr,
// …}. session/prompt answers {stopReason: "end_turn"}, or "cancelled"
// after session/cancel (at once, also while an MCP call is in flight:
// that call gets no tool_call_update and the MCP server no
// notifications/cancelled). An error status from the model server (with
// CodexArgs' retries off) answers the prompt with a JSON-RPC error
// -32603, data {codex_error_info, message}.
//
// session/load. Sessions live in CODEX_HOME (rollout files under
// sessions/); a new process with the same CODEX_HOME loads a session
// created by one that was killed (SIGTERM or SIGKILL, after the prompt
// answered) with session/load {sessionId, cwd, mcpServers}. It replays the
// history as session/update before answering: user_message_chunk,
// tool_call {title: the bare tool name, status "completed", rawInput: the
// arguments only}, tool_call_update {rawOutput: the output text as the
// model saw it}, agent_message_chunk. The next prompt sends the model the
// whole earlier history. session/list lists them ({sessionId, cwd, title,
// updatedAt}).
//
// Permission. codex-acp sends session/request_permission before an MCP
// call unless approval_policy is "never" and sandbox_mode is
// "danger-full-access" (CodexArgs' setting: then it never asks). With any
// other combination (codex's defaults, "never" with "workspace-write",
// "on-request", "untrusted") it asks for a tool whose annotations do not
// clear it: it does not ask when readOnlyHint is true (and
// destructiveHint not true), or when destructiveHint and openWorldHint
// are both false; it asks when destructiveHint is true or unset, or
// openWorldHint is true or unset (the MCP defaults, and what mcp-go's
// NewTool sets: destructive, open-world); codex's source skips asking for
// a tool with no annotations at all. The tool_call (in_progress) is sent
// first, then the request: toolCall {toolCallId: <call_id>, status
// "pending", title "Approve MCP tool call", content: the question with
// the arguments, rawInput {id: "mcp_tool_call_approval_<call_id>",
// server_name, turn_id, request: {…}}}, options approved (allow_once),
// approved-for-session (allow_always), approved-always (allow_always),
// cancel (reject_once). Selecting cancel (or answering cancelled) skips
// the call: no tools/call, tool_call_update status "failed" rawOutput
// "user cancelled MCP tool call", the model gets that text as the output
// and the turn goes on to end_turn.
//
// For a shell command codex asks (request first, tool_call after the
// answer) under approval_policy "untrusted" for any command not known to
// be safe (e.g. {"cmd": "touch x"} as exec_command's arguments), or under
// "on-request" with sandbox_mode "workspace-write" when the model sets
// {"sandbox_permissions": "require_escalated", "justification": "…"};
// under "on-request" with "danger-full-access" it runs commands without
// asking. The request: toolCall {toolCallId: <call_id>, kind "execute",
// title: the command, status "pending", rawInput {command, cwd,
// available_decisions, …}}, options approved (allow_once),
// approved-execpolicy-amendment (allow_always), abort (reject_once).
// Selecting abort ends the turn: session/prompt answers stopReason
// "cancelled" and the model is not called again.
//
// Tool timeout. Codex waits 120 s for an MCP tools/call, then fails it:
// tool_call_update "failed", the model gets "tool call error: tool call
// failed for `S/tool` … timed out awaiting tools/call after 120s", the
// turn goes on; the request is not cancelled on the server. Servers given
// through session/new always have that default; a server configured with
// -c (npmtest.CodexMCPServer) may set tool_timeout_sec, but a session/new
// server of the same name replaces it, and -c
// mcp_servers.S.tool_timeout_sec alone makes codex-acp exit at start.
//
// Process. codex-acp answers initialize about 100 ms after it starts
// (330 ms with a cold disk cache: the binary is 233 MB), session/new
// 40-50 ms later, 30-50 ms more with an MCP server (2 cores). It exits
// within milliseconds on SIGTERM, idle or mid-turn; it does not exit when
// its stdin closes (still running 30 s later). It starts /bin/bash
// children (a shell snapshot at session start, commands), so stop it by
// its process group.
package modeltest
