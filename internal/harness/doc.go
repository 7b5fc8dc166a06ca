// Package harness is patchbay's engine: the registry of named connections and
// the contract providers implement, workflow documents (parsing, validation,
// expressions), and executions with their worker pool.
//
// It imports no transport and no HTTP framework: providers (internal/mcp)
// implement Provider and Conn, and only cmd/server wires them in.
package harness
