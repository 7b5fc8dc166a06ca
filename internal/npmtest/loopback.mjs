// Preloaded (node --import) into the npm servers under test: every listen
// is forced onto 127.0.0.1 (on the port asked for), so the test servers are
// reachable from loopback only.
import net from 'node:net';

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const cb = args.find((a) => typeof a === 'function');
  const opts = typeof args[0] === 'object' && args[0] !== null
    ? { ...args[0], host: '127.0.0.1' }
    : { port: Number(args[0] ?? 0), host: '127.0.0.1' };
  return listen.call(this, opts, ...(cb ? [cb] : []));
};
