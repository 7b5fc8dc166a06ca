// 100 sequential echo calls from the MCP TypeScript SDK on one warm stdio
// connection, for BenchmarkHundredCalls (cmd/server/peer_bench_test.go).
//
// It starts the demo MCP server (DEMO_MCP, the binary's path) once,
// initializes, and prints "ready". Then every line it reads on stdin makes
// one run: CALLS (default 100) echo calls, each awaited before the next,
// with an idempotency key in _meta as patchbay sends; it prints the run's
// milliseconds (performance.now) on a line of its own. It exits when stdin
// closes. The benchmark drives it line by line, so its runs alternate with
// the other clients' runs.
//
// Needs @modelcontextprotocol/sdk resolvable from this file's directory
// (the benchmark copies it next to a node_modules of its own).
import { createInterface } from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

const demo = process.env.DEMO_MCP;
if (!demo) {
  console.error('DEMO_MCP must name the demo-mcp binary');
  process.exit(2);
}
const calls = Number(process.env.CALLS ?? 100);

const client = new Client({ name: 'hundred', version: '1.0.0' });
await client.connect(new StdioClientTransport({ command: demo, stderr: 'inherit' }));
process.stdout.write('ready\n');

let run = 0;
for await (const _ of createInterface({ input: process.stdin })) {
  run++;
  const start = performance.now();
  for (let i = 0; i < calls; i++) {
    const res = await client.callTool({
      name: 'echo',
      arguments: { text: 'hello' },
      _meta: { 'io.patchbay/idempotency-key': `run-${run}:e${i}` },
    });
    if (res.isError) {
      console.error(`echo failed: ${JSON.stringify(res.content)}`);
      process.exit(1);
    }
  }
  process.stdout.write(`${(performance.now() - start).toFixed(3)}\n`);
}
await client.close();
