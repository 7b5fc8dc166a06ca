package registry

import "github.com/patchbay-dev/patchbay/internal/harness/connect"

// Leaser returns the connection's Leaser when it is a pool.
func (c *Connection) Leaser() (connect.Leaser, bool) {
	l, ok := c.provider.(connect.Leaser)
	return l, ok
}

// IsPool reports whether the connection is a pool.
func (c *Connection) IsPool() bool {
	_, ok := c.Leaser()
	return ok
}

// poolStatus is the pool usage shown in the connection's status; nil for
// a connection that is not a pool.
func (c *Connection) poolStatus() *connect.PoolStatus {
	if l, ok := c.Leaser(); ok {
		if st := l.PoolStatus(); st != nil {
			return st
		}
		return &connect.PoolStatus{Leases: []connect.PoolLease{}}
	}
	return nil
}

// LeasedConn is a leased connection's Conn as the harness sees it: it
// carries the lease id, which sealed refs are bound to (gate 3).
type LeasedConn struct {
	connect.Conn
	lease string
}

// LeaseOf is the lease a connection is held on; "" when not leased.
func LeaseOf(c *Connection) string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if lc, ok := c.conn.(*LeasedConn); ok {
		return lc.lease
	}
	return ""
}
