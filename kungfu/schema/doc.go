// Package schema compiles JSON Schemas that users supply (task output
// schemas, assignment output schemas) and turns validation failures into
// SCHEMA_MISMATCH details. It is the one place that decides a user's
// schema can never make Dojo read a file or fetch a URL.
package schema
