package credential

import (
	"strings"
	"testing"
)

func TestFind(t *testing.T) {
	hex64 := strings.Repeat("0123456789abcdef", 4)
	hits := map[string]string{
		"key: kf_live_" + hex64:                    "kungfu agent key",
		"KF_LIVE_" + strings.ToUpper(hex64):        "kungfu agent key",
		"room kf_" + hex64[:32] + " done":          "kungfu room key",
		"AKIAIOSFODNN7EXAMPLE":                     "aws access key",
		"-----BEGIN OPENSSH PRIVATE KEY-----\nabc": "private key",
		"-----BEGIN PRIVATE KEY-----":              "private key",
		"ghp_" + strings.Repeat("a", 36):           "github token",
		"github_pat_" + strings.Repeat("B", 30):    "github token",
		"xoxb-1234567890-abcdef":                   "slack token",
		"sk-ant-api03-" + strings.Repeat("z", 24):  "anthropic key",
		"sk-" + strings.Repeat("Q", 40):            "openai-style key",
		"sk-proj-" + strings.Repeat("Q", 40):       "openai-style key",
		"sk_live_" + strings.Repeat("9", 24):       "stripe live key",
		"rk_live_" + strings.Repeat("9", 24):       "stripe live key",
	}
	for s, want := range hits {
		if got := Find(s); got != want {
			t.Errorf("Find(%q) = %q, want %q", s, got, want)
		}
	}
	for _, s := range []string{
		"plain prose about keys and tokens",
		"kf_live_short",
		"sk_test_" + strings.Repeat("9", 24), // test keys are harmless
		"AKIA-not-a-key",
		"ghp_short",
		"-----BEGIN PUBLIC KEY-----",
		"desk-" + strings.Repeat("a", 40),
	} {
		if got := Find(s); got != "" {
			t.Errorf("Find(%q) = %q, want no match", s, got)
		}
	}
}

func TestFindIn(t *testing.T) {
	v := map[string]any{
		"a": []any{"fine", map[string]any{"b/c": "AKIAIOSFODNN7EXAMPLE"}},
		"z": "AKIAIOSFODNN7EXAMPLE",
	}
	if p, k := FindIn(v); p != "/a/1/b~1c" || k != "aws access key" {
		t.Fatalf("FindIn = %q %q", p, k)
	}
	if p, k := FindIn(map[string]any{"sk_live_" + strings.Repeat("x", 20): 1}); k == "" || p == "" {
		t.Fatal("credential in an object key not found")
	}
	if _, k := FindIn(map[string]any{"n": 1.5, "ok": true, "s": []any{"x"}}); k != "" {
		t.Fatalf("false positive %q", k)
	}
}
