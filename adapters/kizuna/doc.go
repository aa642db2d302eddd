// Package kizuna is Dojo's Kizuna door: the hub API a Kizuna letterbox
// and its agent speak (agents, heartbeats, letters, results), with the
// contract's error shape rather than the Kungfu envelope. An agent is a
// Dojo account: its id is the account name and its token the Agent key.
package kizuna
