// Package letterbox is dojo-box, a Kizuna letterbox: a small daemon that
// takes signed letters from a hub, keeps each one on disk before it says
// so, and lets the agent on the same machine read them and report results
// over a loopback API. Calls to the hub wait in an on-disk outbox until the
// hub answers, so neither direction loses anything to a crash or an outage.
//
// It depends on the standard library only, and deliberately not on Dojo's
// own packages: the signature check is written from the Kizuna contract
// alone, so a mistake in the hub's signing cannot hide behind the same
// mistake here.
package letterbox
