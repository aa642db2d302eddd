//go:build !race

package schema

const raceFactor = 1
