// Package memory keeps versioned working material. A memory has one author
// and immutable revisions: every update writes a new revision, so a
// reference to (code, revision) always reads the same bytes.
package memory
