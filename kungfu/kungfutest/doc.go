// Package kungfutest gives each test its own real PostgreSQL database,
// cloned from a migrated template, and its own Redis key prefix, so tests
// run in parallel against real services without seeing each other.
package kungfutest
