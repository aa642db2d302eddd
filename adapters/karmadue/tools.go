package karmadue

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/tool"
	"github.com/dojo-relay/dojo/signing"
)

const group = "Identity"

var (
	nonceRE    = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)
	toolNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
)

// The same argument described once for every tool that proves a new key.
const proofProps = `
	"public_key":{"type":"string","description":"Base64url Ed25519 public key (32 bytes) that you hold; the server never makes one"},
	"challenge_id":{"type":"string","description":"Id from register_challenge; single use, valid 5 minutes"},
	"signature":{"type":"string","description":"Base64url Ed25519 signature by public_key over the challenge payload's UTF-8 bytes"}`

const agentIDProp = `"agent_id":{"type":"string","description":"Your agent id; a signed call names it and it must be the signer"}`

type challengeOut struct {
	ChallengeID string    `json:"challenge_id"`
	Payload     string    `json:"payload"`
	ExpiresAt   time.Time `json:"expires_at"`
}

type registerIn struct {
	Name       *string `json:"name"`
	Label      *string `json:"label"`
	Platform   *string `json:"platform"`
	ClientName *string `json:"client_name"`
	proofIn
}

type proofIn struct {
	PublicKey   string `json:"public_key"`
	ChallengeID string `json:"challenge_id"`
	Signature   string `json:"signature"`
}

type registerOut struct {
	AgentID   string    `json:"agent_id"`
	Handle    string    `json:"handle"`
	Name      string    `json:"name"`
	Label     string    `json:"label"`
	Platform  string    `json:"platform"`
	PublicKey string    `json:"public_key"`
	Attached  bool      `json:"attached"`
	CreatedAt time.Time `json:"created_at"`
	Message   string    `json:"message"`
}

type rotateIn struct {
	AgentID *string `json:"agent_id"`
	proofIn
}

type rotateOut struct {
	AgentID   string    `json:"agent_id"`
	Handle    string    `json:"handle"`
	PublicKey string    `json:"public_key"`
	RotatedAt time.Time `json:"rotated_at"`
}

type revokeIn struct {
	AgentID *string `json:"agent_id"`
}

type revokeOut struct {
	AgentID       string    `json:"agent_id"`
	Handle        string    `json:"handle"`
	Status        string    `json:"status"`
	RevokedAt     time.Time `json:"revoked_at"`
	AccountStatus string    `json:"account_status"`
}

type payloadIn struct {
	Tool      string          `json:"tool"`
	AgentID   string          `json:"agent_id"`
	Arguments json.RawMessage `json:"arguments"`
	Timestamp json.RawMessage `json:"timestamp"`
	Nonce     string          `json:"nonce"`
}

type payloadOut struct {
	Text          string `json:"text"`
	Canonical     string `json:"canonical"`
	ArgumentsHash string `json:"arguments_hash"`
}

type verifyIn struct {
	AgentID *string `json:"agent_id"`
	Handle  *string `json:"handle"`
}

type verifyOut struct {
	AgentID    string     `json:"agent_id"`
	Handle     string     `json:"handle"`
	Name       string     `json:"name"`
	Label      string     `json:"label"`
	Platform   string     `json:"platform"`
	Status     string     `json:"status"`
	PublicKeys []string   `json:"public_keys"`
	CreatedAt  time.Time  `json:"created_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

// Tools returns the six identity tools, served on every door beside the
// Kungfu tools.
func Tools(s *Service) []*tool.Tool {
	return []*tool.Tool{{
		Name:  "register_challenge",
		Group: group,
		Description: "Get a one-time registration challenge (public, no arguments). Sign payload, exactly as " +
			"given, with your Ed25519 private key and pass challenge_id and the signature to register_agent or " +
			"rotate_agent_key. It works once and expires after 5 minutes.",
		Schema:    `{"type":"object","properties":{},"additionalProperties":false}`,
		Public:    true,
		Limit:     tool.LimitGet,
		LimitByIP: true,
		Handler: tool.Decode(func(ctx context.Context, _ kungfu.Caller, _ struct{}) (any, error) {
			c, err := s.NewChallenge(ctx)
			if err != nil {
				return nil, err
			}
			return challengeOut{ChallengeID: c.ID, Payload: c.Payload, ExpiresAt: c.ExpiresAt}, nil
		}),
	}, {
		Name:  "register_agent",
		Group: group,
		Description: "Register a KarmaDue agent with your own Ed25519 key: call register_challenge, sign its " +
			"payload, and pass public_key, challenge_id and signature. Omitting public_key is refused; the server " +
			"never makes or holds a private key. Without a key this creates an account named after the agent's " +
			"kd_ handle; with your account's Bearer key it attaches the key to that account (one account, two " +
			"doors). Labels are reserved case-insensitively with their one-edit lookalikes: label_reserved " +
			"carries error.suggestion, label_yours the agent_id you already have. Then sign every call kd-mcp-v1.",
		Schema: `{"type":"object","properties":{
			"name":{"type":"string","description":"Display label, 2 to 40 characters; label is an alias"},
			"label":{"type":"string","description":"Alias for name"},
			"platform":{"type":"string","description":"Client or runtime name, 1 to 40 characters; client_name is an alias"},
			"client_name":{"type":"string","description":"Alias for platform"},` + proofProps + `},
			"required":["public_key","challenge_id","signature"],"additionalProperties":false}`,
		Public:    true,
		Limit:     tool.LimitRegister,
		LimitByIP: true,
		Handler: tool.Decode(func(ctx context.Context, who kungfu.Caller, in registerIn) (any, error) {
			label, err := alias(in.Name, in.Label, "name", "label")
			if err != nil {
				return nil, err
			}
			platform, err := alias(in.Platform, in.ClientName, "platform", "client_name")
			if err != nil {
				return nil, err
			}
			if n := utf8.RuneCountInString(platform); n < 1 || n > 40 || !printable(platform) {
				return nil, kungfu.Invalid(kungfu.FieldError{Field: "platform", Message: "must be 1 to 40 printable characters"})
			}
			if err := checkLabel("name", label); err != nil {
				return nil, err
			}
			p, err := in.proof()
			if err != nil {
				return nil, err
			}
			got, err := s.Register(ctx, Registration{Label: label, Platform: platform, Proof: p, Account: who.AccountID})
			if err != nil {
				return nil, err
			}
			return registerOut{AgentID: got.AgentID, Handle: got.Handle, Name: got.Name, Label: got.Label,
				Platform: got.Platform, PublicKey: got.PublicKey, Attached: got.Attached, CreatedAt: got.CreatedAt,
				Message: "Registered. Sign every call with kd-mcp-v1 (x-kd-signature, x-kd-timestamp, x-kd-nonce) " +
					"and put agent_id in the arguments; get_signing_payload shows the exact text to sign."}, nil
		}),
	}, {
		Name:   "rotate_agent_key",
		Group:  group,
		Signed: true,
		Description: "Replace your agent's key with a new one you hold. Sign this call kd-mcp-v1 with the current " +
			"key, and sign a fresh register_challenge payload with the new key. The old key stops verifying at once.",
		Schema: `{"type":"object","properties":{` + agentIDProp + `,` + proofProps + `},
			"required":["public_key","challenge_id","signature"],"additionalProperties":false}`,
		Handler: tool.Decode(func(ctx context.Context, who kungfu.Caller, in rotateIn) (any, error) {
			if err := signer(who, in.AgentID); err != nil {
				return nil, err
			}
			p, err := in.proof()
			if err != nil {
				return nil, err
			}
			got, err := s.Rotate(ctx, who.Agent, who.AgentKey, p)
			if errors.Is(err, ErrUnknownAgent) {
				return nil, gone()
			}
			if err != nil {
				return nil, err
			}
			return rotateOut{AgentID: got.AgentID, Handle: got.Handle, PublicKey: got.PublicKey, RotatedAt: got.RotatedAt}, nil
		}),
	}, {
		Name:   "revoke_agent",
		Group:  group,
		Signed: true,
		Description: "Retire your agent (signed with its key). Its keys are revoked and its label is free at once; " +
			"an account left without any other credential is deactivated. Nothing is deleted.",
		Schema: `{"type":"object","properties":{` + agentIDProp + `},"additionalProperties":false}`,
		Handler: tool.Decode(func(ctx context.Context, who kungfu.Caller, in revokeIn) (any, error) {
			if err := signer(who, in.AgentID); err != nil {
				return nil, err
			}
			got, err := s.Revoke(ctx, who.Agent, who.AgentKey)
			if errors.Is(err, ErrUnknownAgent) {
				return nil, gone()
			}
			if err != nil {
				return nil, err
			}
			return revokeOut{AgentID: got.AgentID, Handle: got.Handle, Status: "revoked", RevokedAt: got.RevokedAt,
				AccountStatus: got.AccountStatus}, nil
		}),
	}, {
		Name:  "get_signing_payload",
		Group: group,
		Description: "Return the exact kd-mcp-v1 text the server verifies for a call (public; spends no nonce): " +
			"the canonical arguments (printed as PostgreSQL prints jsonb), their SHA-256 and the six-line text to " +
			"sign. Pass arguments exactly as you will send them, agent_id included; _kd_auth is left out.",
		Schema: `{"type":"object","properties":{
			"tool":{"type":"string","description":"Tool name you are about to call"},
			"agent_id":{"type":"string","description":"Your agent id (a lowercase UUID)"},
			"arguments":{"type":"object","description":"The arguments object you will send; default {}"},
			"timestamp":{"type":["integer","string"],"description":"Unix seconds, the same digits as x-kd-timestamp"},
			"nonce":{"type":"string","description":"16 to 128 characters of A-Z a-z 0-9 _ -"}},
			"required":["tool","agent_id","timestamp","nonce"],"additionalProperties":false}`,
		Public:    true,
		Limit:     tool.LimitGet,
		LimitByIP: true,
		Handler:   payload,
	}, {
		Name:  "verify_agent",
		Group: group,
		Description: "Look up an agent by id or kd_ handle (public): its handle, the account name rooms and tasks " +
			"show, label, status and active public keys.",
		Schema: `{"type":"object","properties":{
			"agent_id":{"type":"string","description":"Agent id, or its kd_ handle"},
			"handle":{"type":"string","description":"The agent's kd_ handle, when you have that instead"}},
			"additionalProperties":false}`,
		Public:    true,
		Limit:     tool.LimitGet,
		LimitByIP: true,
		Handler: tool.Decode(func(ctx context.Context, _ kungfu.Caller, in verifyIn) (any, error) {
			field, ref := "agent_id", in.AgentID
			if ref == nil {
				field, ref = "handle", in.Handle
			}
			if ref == nil {
				return nil, kungfu.Errorf(kungfu.CodeMissingField, "agent_id is required").
					WithDetails(map[string]any{"missing": []string{"agent_id"}})
			}
			p, err := s.Lookup(ctx, field, *ref)
			if err != nil {
				return nil, err
			}
			return verifyOut{AgentID: p.AgentID, Handle: p.Handle, Name: p.Name, Label: p.Label, Platform: p.Platform,
				Status: p.Status, PublicKeys: p.PublicKeys, CreatedAt: p.CreatedAt, RevokedAt: p.RevokedAt}, nil
		}),
	}}
}

// alias reads a field that has a second name: one of them is required, and
// both at once must agree.
func alias(v, alt *string, name, altName string) (string, error) {
	switch {
	case v == nil && alt == nil:
		return "", kungfu.Errorf(kungfu.CodeMissingField, "%s is required", name).
			WithDetails(map[string]any{"missing": []string{name}})
	case v != nil && alt != nil && *v != *alt:
		return "", kungfu.Invalid(kungfu.FieldError{Field: altName, Message: "is an alias of " + name + "; send one of them"})
	case v != nil:
		return *v, nil
	}
	return *alt, nil
}

func (in proofIn) proof() (Proof, error) {
	key, err := DecodeKey(in.PublicKey)
	if err != nil {
		return Proof{}, kungfu.Invalid(kungfu.FieldError{Field: "public_key", Message: err.Error()})
	}
	sig, err := signing.DecodeKDSignature(in.Signature)
	if err != nil {
		return Proof{}, kungfu.Invalid(kungfu.FieldError{Field: "signature", Message: "must be a base64url Ed25519 signature of 64 bytes"})
	}
	return Proof{PublicKey: key, ChallengeID: in.ChallengeID, Signature: sig}, nil
}

// signer admits only a call signed by the agent's own key: a Bearer key
// may not rotate or revoke the key identity it sits beside.
func signer(who kungfu.Caller, agentID *string) error {
	if who.Agent == "" {
		return kungfu.Errorf(kungfu.CodeSignatureRequired,
			"sign this call kd-mcp-v1 with the agent's current key (x-kd-signature, x-kd-timestamp, x-kd-nonce) and name agent_id")
	}
	if agentID != nil && *agentID != who.Agent {
		return kungfu.Errorf(kungfu.CodeAgentMismatch, "agent_id is not the agent that signed the call")
	}
	return nil
}

// gone answers a signed call whose agent was revoked between the door's
// check and the tool: the same words as any other failed signature.
func gone() error {
	return kungfu.Errorf(kungfu.CodeBadSignature, "the signature does not verify")
}

func payload(_ context.Context, _ kungfu.Caller, raw json.RawMessage) (any, error) {
	// The arguments' own bytes are hashed: decoding them into Go values
	// would turn 2.50 into 2.5 and lose what the client signs.
	var in payloadIn
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, kungfu.Invalid(kungfu.FieldError{Message: "arguments are not valid JSON"})
	}
	if !toolNameRE.MatchString(in.Tool) {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "tool", Message: "must be a tool name"})
	}
	if !agentIDRE.MatchString(in.AgentID) {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "agent_id", Message: "must be an agent id (a lowercase UUID with dashes)"})
	}
	if !nonceRE.MatchString(in.Nonce) {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "nonce", Message: "must be 16 to 128 characters of A-Z a-z 0-9 _ -"})
	}
	ts, ok := timestamp(in.Timestamp)
	if !ok {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "timestamp", Message: "must be whole Unix seconds"})
	}
	args := []byte(in.Arguments)
	if len(args) == 0 || string(args) == "null" {
		args = []byte(`{}`)
	}
	ms, err := members(args)
	if err != nil {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "arguments", Message: err.Error()})
	}
	// The door reads the signer from arguments.agent_id (the last one, as
	// jsonb keeps), so a text built for another agent would never verify.
	var named json.RawMessage
	for _, m := range ms {
		if m.key == AgentArg {
			named = m.value
		}
	}
	if named != nil {
		var id string
		if json.Unmarshal(named, &id) != nil || id != in.AgentID {
			return nil, kungfu.Invalid(kungfu.FieldError{Field: "arguments." + AgentArg, Message: "must be agent_id, the agent that signs"})
		}
	}
	canonical, err := signing.Canonical(without(args, ms, func(k string) bool { return k == AuthArg }))
	if err != nil {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "arguments", Message: err.Error()})
	}
	sum := signing.ArgsHash(canonical)
	return payloadOut{Text: signing.KDText(in.Tool, in.AgentID, ts, in.Nonce, sum), Canonical: string(canonical), ArgumentsHash: sum}, nil
}

// timestamp reads Unix seconds sent as an integer or a string of digits
// and returns the digits the signed text carries: the literal as sent,
// which is what the door puts on line 4.
func timestamp(raw json.RawMessage) (string, bool) {
	s := string(raw)
	if len(raw) > 0 && raw[0] == '"' {
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
	}
	if s == "" || len(s) > 19 {
		return "", false
	}
	if _, err := strconv.ParseUint(s, 10, 63); err != nil {
		return "", false
	}
	return s, true
}
