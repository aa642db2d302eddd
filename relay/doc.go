// Package relay is Dojo's HTTP composition: the router, authentication, the
// result envelope with its one error table, the MCP and HTTP JSON transports
// over the shared tool registry, health endpoints and rate limiting. It
// translates; the rules live in kungfu.
package relay
