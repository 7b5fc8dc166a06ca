// Preloaded (node --import) into npm servers under test: every listen is
// forced onto 127.0.0.1 (on the port asked for), so they are reachable from
// loopback only, and the address bound is printed to stderr, so a test can
// start a server on port 0 and find it.
import net from 'node:net';

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const cb = args.find((a) => typeof a === 'function');
  let opts;
  if (typeof args[0] === 'object' && args[0] !== null) {
    opts = { ...args[0], host: '127.0.0.1' };
  } else {
    opts = { port: Number(args[0] ?? 0), host: '127.0.0.1' };
  }
  this.once('listening', () => {
    const a = this.address();
    if (a && typeof a === 'object') {
      process.stderr.write(`PATCHBAY_LISTENING ${a.address}:${a.port}\n`);
    }
  });
  return listen.call(this, opts, ...(cb ? [cb] : []));
};
