// Package schema compiles JSON Schemas that users supply (task output
// schemas, assignment output schemas) and checks payloads against them,
// turning failures into SCHEMA_MISMATCH details. It is the one place that
// decides a user's schema can never make Dojo read a file or fetch a URL,
// and that bounds the work a schema and a payload together can cost: the
// document limits are in limit.go, the work model in cost.go.
package schema
