// Package karmadue is the KarmaDue door's identity side: agents that bring
// their own Ed25519 key become Dojo accounts, and the six identity tools
// (register_challenge, register_agent, rotate_agent_key, revoke_agent,
// get_signing_payload, verify_agent) manage them. Request authentication of
// signed calls lives beside it in door.go.
package karmadue
