// Drives patchbay's /mcp with the official TypeScript MCP client, as a
// test tells it to: one JSON command a line on stdin, one JSON answer a line
// on stdout, so that the Go test can act (approve, check the ledger)
// between two steps.
//
//   node tsclient.mjs sdk <dir of @modelcontextprotocol/sdk>     (v1: the 2025 era)
//   node tsclient.mjs client <dir of @modelcontextprotocol/client> (v2: 2026-07-28)
//
// Commands (every one names the connection it uses with "as"):
//   {"op":"connect","as":"alice","url":"…/mcp","key":"…","mode":"legacy"|"pin"|"auto"}
//   {"op":"list","as":"alice"}
//   {"op":"call","as":"alice","tool":"mem_add","args":{…},"meta":{…},"progress":true}
//   {"op":"close","as":"alice"}
//   connect with "elicit": {…}: the client takes form elicitations and
//   answers each with that content; {"op":"asked"} → {asked: [messages]}
// Tasks, through each line's own task API: the SDK v1's experimental tasks
// (client.experimental.tasks, 2025-11-25), or, with the client v2,
// @modelcontextprotocol/ext-tasks installed next to it (2026-07-28):
//   {"op":"taskCall","as":"alice","tool":"mem_guarded","args":{…}}  → {kind:"task",taskId} or {kind:"immediate",outcome}
//   {"op":"taskGet","as":"alice","taskId":"…"}     → {task}
//   {"op":"taskSettle","as":"alice","taskId":"…"}  → {outcome:{status,result|error},statuses}: the call's own
//                                                    driver, polling to the end
//   {"op":"taskCancel","as":"alice","taskId":"…"}
//   {"op":"taskResult","as":"alice","taskId":"…"}  → {outcome}
//   {"op":"taskList","as":"alice"}                 → {tasks} (2025 era)
// Answers: {"ok":true,…} or {"ok":false,"error":"…","code":…}.
import { createInterface } from 'node:readline';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [flavor, dir] = process.argv.slice(2);
const load = (file) => import(pathToFileURL(join(dir, file)).href);

let Client, Transport;
if (flavor === 'sdk') {
  ({ Client } = await load('dist/esm/client/index.js'));
  ({ StreamableHTTPClientTransport: Transport } = await load('dist/esm/client/streamableHttp.js'));
} else if (flavor === 'client') {
  ({ Client, StreamableHTTPClientTransport: Transport } = await load('dist/index.mjs'));
} else {
  throw new Error(`unknown flavor ${flavor}`);
}
const fs = await import('node:fs/promises');
const pkg = JSON.parse(await fs.readFile(join(dir, 'package.json'), 'utf8'));

// The task APIs: the SDK v1's types (for tasks/result), or ext-tasks next
// to the client v2, when it is installed there.
let CallToolResultSchema, extTasks;
if (flavor === 'sdk') {
  ({ CallToolResultSchema } = await load('dist/esm/types.js'));
} else {
  const extDir = join(dir, '..', 'ext-tasks');
  if (await fs.stat(extDir).catch(() => null)) {
    extTasks = await import(pathToFileURL(join(extDir, 'dist', 'client', 'index.js')).href);
  }
}

const conns = new Map();
// The messages of the elicitations clients were asked ({"op":"asked"}).
const asked = [];

async function connect(cmd) {
  const options = {};
  if (cmd.mode === 'pin') options.versionNegotiation = { mode: { pin: '2026-07-28' } };
  if (cmd.mode === 'auto') options.versionNegotiation = { mode: 'auto' };
  if (cmd.elicit) options.capabilities = { elicitation: { form: {} } };
  const client = new Client({ name: `patchbay-interop-${flavor}`, version: pkg.version }, options);
  if (cmd.elicit) {
    // The person at this client answers every form with cmd.elicit.
    const { ElicitRequestSchema } = await load(flavor === 'sdk' ? 'dist/esm/types.js' : 'dist/index.mjs');
    client.setRequestHandler(ElicitRequestSchema, async (req) => {
      asked.push(req.params.message);
      return { action: 'accept', content: cmd.elicit };
    });
  }
  const transport = new Transport(new URL(cmd.url), {
    requestInit: { headers: { Authorization: `Bearer ${cmd.key}` } },
  });
  await client.connect(transport);
  conns.set(cmd.as, { client, transport, url: cmd.url, key: cmd.key, as: cmd.as, tasks: new Map(), info: { name: `patchbay-interop-${flavor}`, version: pkg.version } });
  return {
    sdk: `${pkg.name}@${pkg.version}`,
    era: client.getProtocolEra?.() ?? 'legacy',
    protocolVersion: client.getNegotiatedProtocolVersion?.() ?? transport.protocolVersion,
    sessionId: transport.sessionId ?? '',
    server: client.getServerVersion()?.name ?? '',
  };
}

async function list(c) {
  const names = [];
  let cursor;
  do {
    const page = await c.client.listTools(cursor ? { cursor } : undefined);
    names.push(...page.tools.map((t) => t.name));
    cursor = page.nextCursor;
  } while (cursor);
  return { tools: names };
}

async function call(c, cmd) {
  const params = { name: cmd.tool, arguments: cmd.args ?? {} };
  if (cmd.meta) params._meta = cmd.meta;
  const progress = [];
  const options = { timeout: 60_000 };
  if (cmd.progress) options.onprogress = (p) => progress.push(p);
  const result = flavor === 'sdk'
    ? await c.client.callTool(params, undefined, options)
    : await c.client.callTool(params, options);
  return { result, progress };
}

// rawDispatch is the request path ext-tasks needs for the 2026 era's task
// wire shapes (the SDK's own tools/call does not take a CreateTaskResult):
// one POST a request, as the transport sends one (the era has no session),
// with the routing headers SEP-2243 and SEP-2663 ask for.
function rawDispatch(c) {
  let next = 0;
  return async (request, options = {}) => {
    const id = `task-rpc-${++next}`;
    const headers = {
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
      'Mcp-Protocol-Version': request.params?._meta?.['io.modelcontextprotocol/protocolVersion'] ?? '2026-07-28',
      'Mcp-Method': request.method,
      Authorization: `Bearer ${c.key}`,
    };
    if (request.method === 'tools/call') headers['Mcp-Name'] = request.params.name;
    Object.assign(headers, options.context?.headers ?? {});
    const res = await fetch(c.url, {
      method: 'POST', headers, signal: options.signal,
      body: JSON.stringify({ jsonrpc: '2.0', id, method: request.method, params: request.params }),
    });
    const text = await res.text();
    let msg;
    if ((res.headers.get('content-type') ?? '').includes('text/event-stream')) {
      for (const line of text.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const m = JSON.parse(line.slice(5));
        if (m.id === id) msg = m;
      }
    } else {
      try { msg = JSON.parse(text); } catch { /* not JSON-RPC */ }
    }
    if (!msg || (!('result' in msg) && !('error' in msg))) throw new Error(`${request.method}: HTTP ${res.status}: ${text}`);
    return msg.error ? { kind: 'error', error: msg.error } : { kind: 'result', result: msg.result };
  };
}

// taskSession is the connection's ext-tasks session (client v2).
function taskSession(c) {
  if (!extTasks) throw new Error('@modelcontextprotocol/ext-tasks is not installed next to the client');
  c.session ??= extTasks.createTaskSessionFromClient(c.client, {
    endpointId: `patchbay-interop:${c.as}`,
    rawDispatch: rawDispatch(c),
    v2RequestFraming: { protocolVersion: c.client.getNegotiatedProtocolVersion(), clientInfo: c.info, clientCapabilities: {} },
  });
  return c.session;
}

// outcomeOf is a settled outcome as JSON.
function outcomeOf(outcome) {
  return {
    status: outcome.status,
    ...(outcome.result === undefined ? {} : { result: outcome.result }),
    ...(outcome.error === undefined ? {} : { error: String(outcome.error?.message ?? outcome.error), code: outcome.error?.code }),
  };
}

async function taskCall(c, cmd) {
  const args = cmd.args ?? {};
  if (flavor === 'sdk') {
    // The SDK calls a tool as a task when tools/list said it may and the
    // server has the capability.
    if (!c.listed) { await c.client.listTools(); c.listed = true; }
    const stream = c.client.experimental.tasks.callToolStream({ name: cmd.tool, arguments: args }, undefined, { timeout: 60_000 });
    const it = stream[Symbol.asyncIterator]();
    const first = (await it.next()).value;
    if (first?.type === 'taskCreated') {
      c.tasks.set(first.task.taskId, { it, statuses: [] });
      return { kind: 'task', taskId: first.task.taskId, task: first.task };
    }
    if (first?.type === 'result') return { kind: 'immediate', outcome: { status: 'completed', result: first.result } };
    throw first?.error ?? new Error('the call yielded nothing');
  }
  const execution = await taskSession(c).callTool(cmd.tool, args);
  if (execution.kind === 'task') {
    c.tasks.set(execution.handle.taskId, { execution });
    return { kind: 'task', taskId: execution.handle.taskId };
  }
  const { outcome } = await execution.settle();
  return { kind: 'immediate', outcome: outcomeOf(outcome) };
}

async function taskSettle(c, cmd) {
  const t = c.tasks.get(cmd.taskId);
  if (!t) throw new Error(`no task ${cmd.taskId} started here`);
  const statuses = [];
  if (flavor === 'sdk') {
    for (;;) {
      const { value, done } = await t.it.next();
      if (done) throw new Error('the stream ended without a result');
      if (value.type === 'taskStatus') statuses.push(value.task.status);
      if (value.type === 'result') return { outcome: { status: 'completed', result: value.result }, statuses };
      if (value.type === 'error') return { outcome: { status: 'error', error: String(value.error?.message ?? value.error), code: value.error?.code }, statuses };
    }
  }
  const { outcome } = await t.execution.settle({ onEvent: (e) => { if (e.type === 'task') statuses.push(e.task.status); } });
  return { outcome: outcomeOf(outcome), statuses };
}

async function taskOp(c, cmd) {
  const tasks = c.client.experimental?.tasks;
  switch (cmd.op) {
    case 'taskCall': return taskCall(c, cmd);
    case 'taskSettle': return taskSettle(c, cmd);
    case 'taskGet':
      return { task: flavor === 'sdk' ? await tasks.getTask(cmd.taskId) : await taskSession(c).task(cmd.taskId).snapshot() };
    case 'taskCancel':
      if (flavor === 'sdk') return { task: await tasks.cancelTask(cmd.taskId) };
      await taskSession(c).cancelTask(cmd.taskId);
      return {};
    case 'taskResult':
      if (flavor === 'sdk') return { outcome: { status: 'completed', result: await tasks.getTaskResult(cmd.taskId, CallToolResultSchema) } };
      return { outcome: outcomeOf(await taskSession(c).task(cmd.taskId).result()) };
    case 'taskList': {
      const all = [];
      let cursor;
      do {
        const page = await tasks.listTasks(cursor);
        all.push(...page.tasks);
        cursor = page.nextCursor;
      } while (cursor);
      return { tasks: all };
    }
  }
  throw new Error(`unknown op ${cmd.op}`);
}

async function run(cmd) {
  if (cmd.op === 'connect') return connect(cmd);
  if (cmd.op === 'asked') return { asked };
  const c = conns.get(cmd.as);
  if (!c) throw new Error(`no connection ${cmd.as}`);
  switch (cmd.op) {
    case 'list': return list(c);
    case 'call': return call(c, cmd);
    case 'taskCall': case 'taskSettle': case 'taskGet': case 'taskCancel': case 'taskResult': case 'taskList':
      return taskOp(c, cmd);
    case 'close':
      await c.session?.close().catch(() => {});
      await c.transport.terminateSession?.().catch(() => {});
      await c.client.close();
      conns.delete(cmd.as);
      return {};
  }
  throw new Error(`unknown op ${cmd.op}`);
}

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  let answer;
  try {
    answer = { ok: true, ...(await run(JSON.parse(line))) };
  } catch (err) {
    answer = { ok: false, error: String(err?.message ?? err), code: err?.code };
  }
  process.stdout.write(JSON.stringify(answer) + '\n');
}
for (const c of conns.values()) await c.client.close().catch(() => {});
