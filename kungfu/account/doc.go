// Package account registers accounts, issues and verifies Agent keys, and
// reports an account's status. Keys are shown once and stored only as
// SHA-256; passwords only as bcrypt.
package account
