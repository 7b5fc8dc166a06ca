// Package drive is the Google Drive provider: a connection kind written
// in Go for what the generic MCP and OpenAPI clients cannot express.
package drive
