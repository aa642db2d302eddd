// Package tool is Dojo's one tool registry: each Kungfu tool is defined here
// once (name, description, JSON Schema for its arguments, handler) and every
// transport serves this same list. Nothing here knows about HTTP or MCP.
package tool
