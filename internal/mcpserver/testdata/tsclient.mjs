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
const pkg = JSON.parse(await (await import('node:fs/promises')).readFile(join(dir, 'package.json'), 'utf8'));

const conns = new Map();

async function connect(cmd) {
  const options = {};
  if (cmd.mode === 'pin') options.versionNegotiation = { mode: { pin: '2026-07-28' } };
  if (cmd.mode === 'auto') options.versionNegotiation = { mode: 'auto' };
  const client = new Client({ name: `patchbay-interop-${flavor}`, version: pkg.version }, options);
  const transport = new Transport(new URL(cmd.url), {
    requestInit: { headers: { Authorization: `Bearer ${cmd.key}` } },
  });
  await client.connect(transport);
  conns.set(cmd.as, { client, transport });
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

async function run(cmd) {
  if (cmd.op === 'connect') return connect(cmd);
  const c = conns.get(cmd.as);
  if (!c) throw new Error(`no connection ${cmd.as}`);
  switch (cmd.op) {
    case 'list': return list(c);
    case 'call': return call(c, cmd);
    case 'close':
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
