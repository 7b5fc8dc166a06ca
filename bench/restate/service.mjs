// The three-call workflow of examples/hello.json as a Restate service, for
// BenchmarkBesideRestate (cmd/server/peer_bench_test.go): the handler
// hello/run takes {a, b, name} and makes the same three calls to the demo
// MCP server that the workflow makes (add, note_put, note_get), each one a
// journaled ctx.run step, and answers what note_get returned.
//
// Like patchbay, the process keeps one warm stdio connection to one
// demo-mcp (DEMO_MCP, the binary's path) and sends every call over it, with
// an idempotency key in _meta as patchbay sends. It serves the Restate
// endpoint over HTTP/2 on PORT (default 9080); the benchmark starts it in
// the same private network namespace as restate-server and registers it
// through the admin API.
//
// Needs Node 22, @restatedev/restate-sdk and @modelcontextprotocol/sdk
// resolvable from this file's directory (the benchmark copies it next to a
// node_modules of its own).
import * as restate from '@restatedev/restate-sdk';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

const demo = process.env.DEMO_MCP;
if (!demo) {
  console.error('DEMO_MCP must name the demo-mcp binary');
  process.exit(2);
}

const client = new Client({ name: 'restate-bench', version: '1.0.0' });
await client.connect(new StdioClientTransport({ command: demo, stderr: 'inherit' }));

// call sends one tool call and answers its structured result (or its
// first text block, parsed as JSON when it is JSON), as patchbay maps an
// MCP result; a tool error fails the step for good.
async function call(name, args, key) {
  const res = await client.callTool({
    name,
    arguments: args,
    _meta: { 'io.patchbay/idempotency-key': key },
  });
  if (res.isError) {
    throw new restate.TerminalError(`${name}: ${res.content?.[0]?.text ?? 'tool error'}`);
  }
  if (res.structuredContent !== undefined) {
    return res.structuredContent;
  }
  const text = res.content?.[0]?.text ?? '';
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

const hello = restate.service({
  name: 'hello',
  handlers: {
    run: async (ctx, input) => {
      const id = ctx.request().id;
      const sum = await ctx.run('sum', () => call('add', { a: input.a, b: input.b }, `${id}:sum`));
      await ctx.run('save', () =>
        call('note_put', { key: 'greeting', value: `hello, ${input.name}: ${sum.sum}` }, `${id}:save`),
      );
      return ctx.run('read', () => call('note_get', { key: 'greeting' }, `${id}:read`));
    },
  },
});

const port = await restate.serve({ services: [hello], port: Number(process.env.PORT ?? 9080) });
console.error(`restate-bench service listening on ${port}`);
