package task

import (
	"errors"
	"strings"
	"testing"

	"github.com/dojo-relay/dojo/kungfu"
)

func TestClassify(t *testing.T) {
	cases := []struct {
		o              Outcome
		state, failure string
	}{
		{Outcome{Status: 200, Sent: true}, "settled", ""},
		{Outcome{Status: 204, Sent: true}, "settled", ""},
		{Outcome{Status: 422, Sent: true}, "rejected", ""},
		{Outcome{Status: 429, Sent: true}, "rejected", ""},
		{Outcome{Status: 500, Sent: true}, "failed", "RECEIVER_FAULT"},
		{Outcome{Status: 503, Sent: true}, "failed", "RECEIVER_FAULT"},
		{Outcome{Status: 302, Sent: true}, "failed", "RECEIVER_PROTOCOL"},
		{Outcome{Status: 101, Sent: true}, "failed", "RECEIVER_PROTOCOL"},
		{Outcome{Err: errors.New("connection refused")}, "failed", "RECEIVER_UNREACHABLE"},
		{Outcome{Err: errors.New("timeout"), Sent: true}, "uncertain", ""},
	}
	for _, c := range cases {
		if s, f := classify(c.o); s != c.state || f != c.failure {
			t.Errorf("classify(%+v) = %s %s, want %s %s", c.o, s, f, c.state, c.failure)
		}
	}
}

func TestContractNormalize(t *testing.T) {
	c := Contract{Title: " T ", Requirements: "do", Receiver: ReceiverSpec{URL: "https://example.org/r"}, Price: 3}
	if err := c.normalize(nil); err != nil {
		t.Fatal(err)
	}
	if c.Title != "T" || c.Limits.MaxRejectedPerAgent != 5 || c.Claim.TTL != 1800 || c.Claim.MaxDuration != 7200 || c.Audience.Type != "open" {
		t.Fatalf("defaults: %+v %+v %+v", c.Limits, c.Claim, c.Audience)
	}
	bad := Contract{Title: "", Requirements: "x", Receiver: ReceiverSpec{URL: "http://example.org"}, Price: 0,
		Claim: &ClaimRules{TTL: 100, MaxDuration: 50}, Audience: &Audience{Type: "friends"}}
	err := bad.normalize(nil)
	for _, field := range []string{"contract.title", "contract.receiver.url", "contract.price", "contract.claim.ttl", "contract.claim.max_duration", "contract.audience.type"} {
		if err == nil || !strings.Contains(errDetails(err), field) {
			t.Errorf("%s not reported: %v", field, errDetails(err))
		}
	}
}

// errDetails lists the fields a VALIDATION_FAILED names.
func errDetails(err error) string {
	e := kungfu.AsError(err)
	if e == nil {
		return ""
	}
	var b strings.Builder
	if d, ok := e.Details.(map[string]any); ok {
		if list, ok := d["errors"].([]kungfu.FieldError); ok {
			for _, f := range list {
				b.WriteString(f.Field + " ")
			}
		}
	}
	return b.String()
}
