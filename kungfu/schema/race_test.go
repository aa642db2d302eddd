//go:build race

package schema

// raceFactor scales time limits: the race detector slows the validator
// about tenfold.
const raceFactor = 10
