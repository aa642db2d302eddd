package task

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credential"
	"github.com/dojo-relay/dojo/kungfu/schema"
)

// Limits from the protocol.
const (
	MaxMoney        = 1<<53 - 1
	MaxTitle        = 128
	MaxRequirements = 20000
	MaxHarness      = 10
	MaxSchema       = 32 * 1024
	MaxPayload      = 512 * 1024
	MaxAudience     = 50
	ExcerptRunes    = 280
)

// Contract is what a publisher offers, as submitted. Every field but the
// receiver is visible to the task's audience.
type Contract struct {
	Title        string       `json:"title"`
	Requirements string       `json:"requirements"`
	HarnessRefs  []string     `json:"harness_refs"`
	Output       *Output      `json:"output,omitempty"`
	Receiver     ReceiverSpec `json:"receiver"`
	Price        int64        `json:"price"`
	Limits       *Limits      `json:"limits,omitempty"`
	Claim        *ClaimRules  `json:"claim,omitempty"`
	Audience     *Audience    `json:"audience,omitempty"`
}

// Output describes the payload.
type Output struct {
	Schema json.RawMessage `json:"schema,omitempty"`
}

// ReceiverSpec is where the publisher's judge listens.
type ReceiverSpec struct {
	URL string `json:"url"`
}

// Limits bound an executor.
type Limits struct {
	MaxRejectedPerAgent int `json:"max_rejected_per_agent"`
}

// ClaimRules configure engagements.
type ClaimRules struct {
	Required    bool `json:"required"`
	TTL         int  `json:"ttl"`
	MaxDuration int  `json:"max_duration"`
}

// Audience is open, or restricted to named agents, fixed at creation.
type Audience struct {
	Type   string   `json:"type"`
	Agents []string `json:"agents,omitempty"`
}

// normalize fills defaults and checks every rule, collecting all problems
// into one VALIDATION_FAILED.
func (c *Contract) normalize(allowHTTP func(netip.Addr) bool) error {
	var errs []kungfu.FieldError
	bad := func(field, format string, args ...any) {
		errs = append(errs, kungfu.FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	c.Title = strings.TrimSpace(c.Title)
	c.Requirements = strings.TrimSpace(c.Requirements)
	if n := utf8.RuneCountInString(c.Title); n < 1 || n > MaxTitle {
		bad("contract.title", "1 to %d characters", MaxTitle)
	}
	if n := utf8.RuneCountInString(c.Requirements); n < 1 || n > MaxRequirements {
		bad("contract.requirements", "1 to %d characters", MaxRequirements)
	}
	if c.HarnessRefs == nil {
		c.HarnessRefs = []string{}
	}
	if len(c.HarnessRefs) > MaxHarness {
		bad("contract.harness_refs", "at most %d memories", MaxHarness)
	}
	seen := map[string]bool{}
	for i, r := range c.HarnessRefs {
		r = strings.ToLower(strings.TrimSpace(r))
		c.HarnessRefs[i] = r
		if seen[r] {
			bad(fmt.Sprintf("contract.harness_refs.%d", i), "listed twice")
		}
		seen[r] = true
	}
	if c.Output != nil && len(bytes.TrimSpace(c.Output.Schema)) > 0 && string(bytes.TrimSpace(c.Output.Schema)) != "null" {
		if len(c.Output.Schema) > MaxSchema {
			bad("contract.output.schema", "larger than %d bytes", MaxSchema)
		} else if _, err := schema.Compile(c.Output.Schema); err != nil {
			bad("contract.output.schema", "%v", err)
		}
	} else {
		c.Output = nil
	}
	if err := checkReceiver(c.Receiver.URL, allowHTTP); err != nil {
		bad("contract.receiver.url", "%v", err)
	}
	if c.Price < 1 || c.Price > MaxMoney {
		bad("contract.price", "1 to %d credits", int64(MaxMoney))
	}
	if c.Limits == nil {
		c.Limits = &Limits{}
	}
	if c.Limits.MaxRejectedPerAgent == 0 {
		c.Limits.MaxRejectedPerAgent = 5
	}
	if m := c.Limits.MaxRejectedPerAgent; m < 1 || m > 50 {
		bad("contract.limits.max_rejected_per_agent", "1 to 50")
	}
	if c.Claim == nil {
		c.Claim = &ClaimRules{}
	}
	if c.Claim.TTL == 0 {
		c.Claim.TTL = 1800
	}
	if c.Claim.MaxDuration == 0 {
		c.Claim.MaxDuration = max(7200, c.Claim.TTL)
	}
	if c.Claim.TTL < 300 || c.Claim.TTL > 7200 {
		bad("contract.claim.ttl", "300 to 7200 seconds")
	}
	if c.Claim.MaxDuration < 600 || c.Claim.MaxDuration > 86400 || c.Claim.MaxDuration < c.Claim.TTL {
		bad("contract.claim.max_duration", "600 to 86400 seconds, and at least ttl")
	}
	if c.Audience == nil {
		c.Audience = &Audience{Type: "open"}
	}
	switch c.Audience.Type {
	case "open":
		if len(c.Audience.Agents) > 0 {
			bad("contract.audience.agents", "only a restricted audience names agents")
		}
		c.Audience.Agents = nil
	case "restricted":
		if n := len(c.Audience.Agents); n < 1 || n > MaxAudience {
			bad("contract.audience.agents", "1 to %d agent names", MaxAudience)
		}
	default:
		bad("contract.audience.type", "open or restricted")
	}
	if b, err := json.Marshal(c); err == nil {
		var v any
		_ = json.Unmarshal(b, &v)
		if ptr, kind := credential.FindIn(v); kind != "" {
			bad("contract"+strings.ReplaceAll(ptr, "/", "."), "holds a credential-shaped string (%s); keep secrets on your receiver", kind)
		}
	}
	if len(errs) > 0 {
		return kungfu.Invalid(errs...)
	}
	return nil
}

// checkReceiver requires https with a host; plain http only for an address
// the operator allowed (DOJO_ALLOW_TARGETS), e.g. a local test receiver.
func checkReceiver(raw string, allowHTTP func(netip.Addr) bool) error {
	if len(raw) > 2048 {
		return errors.New("at most 2048 characters")
	}
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Host == "" || u.User != nil {
		return errors.New("an absolute https URL with a host")
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		host, _, err := net.SplitHostPort(u.Host)
		if err != nil {
			host = u.Host
		}
		if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil && allowHTTP != nil && allowHTTP(a) {
			return nil
		}
		return errors.New("must be https (plain http only for addresses in DOJO_ALLOW_TARGETS)")
	}
	return errors.New("must be https")
}
