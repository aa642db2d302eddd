// Package kungfu is the protocol domain shared by every door into Dojo: the
// typed errors with their protocol codes, the acting caller, and the clock.
// Sub-packages hold one domain each (account, credits, memory, ...) and never
// import net/http.
package kungfu
