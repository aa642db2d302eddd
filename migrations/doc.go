// Package migrations holds Dojo's SQL schema as goose migrations embedded in
// the binary, so `dojo migrate` needs nothing on disk but the database.
package migrations
