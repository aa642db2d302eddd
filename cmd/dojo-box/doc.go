// Command dojo-box is a Kizuna letterbox: it enrolls with a hub, receives
// signed letters into an on-disk spool, serves them to the local agent on
// a loopback API and forwards the agent's results and letters to the hub.
// The work is done by package letterbox; see docs/letterbox.md.
package main
