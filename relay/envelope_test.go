package relay

import (
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/dojo-relay/dojo/kungfu"
)

type advised struct {
	X int `json:"x"`
}

func (advised) Advice() (string, *int) { n := 60; return "wait", &n }

func TestEnvelopeShape(t *testing.T) {
	env, err := success(struct {
		Code string `json:"code"`
	}{"abc"})
	if err != nil || string(env.body) != `{"ok":true,"error":null,"next_action":null,"next":[],"retry_after":null,"api_version":"`+kungfu.Version+`","code":"abc"}` {
		t.Fatalf("success: %s %v", env.body, err)
	}
	env, _ = success(advised{X: 1})
	if !strings.Contains(string(env.body), `"next_action":"wait","next":[],"retry_after":60`) {
		t.Fatalf("advice: %s", env.body)
	}
	if _, err := success([]int{1}); err == nil {
		t.Fatal("a non-object result was accepted")
	}
	ref := refusal(kungfu.Errorf(kungfu.CodeSensitiveContent, "no <secrets>"))
	if ref.status != 422 || !strings.HasPrefix(string(ref.body), `{"ok":false,"error":{"code":"SENSITIVE_CONTENT","message":"no <secrets>","details":null},"next_action":"revise"`) {
		t.Fatalf("refusal: %d %s", ref.status, ref.body)
	}
	// A code missing from the table never leaks: it becomes INTERNAL_ERROR.
	if r := refusal(&kungfu.Error{Code: "MADE_UP", Message: "secret detail"}); r.status != 500 || strings.Contains(string(r.body), "secret detail") || !strings.Contains(string(r.body), "INTERNAL_ERROR") {
		t.Fatalf("unknown code: %d %s", r.status, r.body)
	}
}

func TestClientIP(t *testing.T) {
	s := New(Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, Deps{})
	cases := []struct{ peer, xff, want string }{
		{"203.0.113.5:1234", "", "203.0.113.5"},
		{"203.0.113.5:1234", "1.2.3.4", "203.0.113.5"}, // untrusted peer: header ignored
		{"10.0.0.2:80", "198.51.100.7", "198.51.100.7"},
		{"10.0.0.2:80", "198.51.100.7, 10.0.0.9", "198.51.100.7"},
		{"10.0.0.2:80", "6.6.6.6, 198.51.100.7", "198.51.100.7"}, // the client cannot spoof past the proxy
		{"10.0.0.2:80", "garbage", "10.0.0.2"},
		{"[::1]:80", "1.2.3.4", "::1"},
	}
	for _, c := range cases {
		r := httptest.NewRequest("POST", "/", nil)
		r.RemoteAddr = c.peer
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		if got := s.clientIP(r); got != c.want {
			t.Errorf("peer %s xff %q: got %s, want %s", c.peer, c.xff, got, c.want)
		}
	}
}

// error.suggestion is a member of the error object only when a refusal
// carries one (label_reserved); every other refusal keeps the old shape.
func TestEnvelopeSuggestion(t *testing.T) {
	e := kungfu.Errorf(kungfu.CodeLabelReserved, "label taken")
	e.Suggestion = "Alice-claude"
	env := refusal(e)
	if env.status != 409 || !strings.Contains(string(env.body), `"error":{"code":"label_reserved","message":"label taken","details":null,"suggestion":"Alice-claude"}`) {
		t.Fatalf("label_reserved: %d %s", env.status, env.body)
	}
	env = refusal(kungfu.Errorf(kungfu.CodeLabelYours, "yours"))
	if env.status != 409 || strings.Contains(string(env.body), "suggestion") {
		t.Fatalf("label_yours: %d %s", env.status, env.body)
	}
}
