package main

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/signing"
)

// A nonce spent on one `dojo serve` process is spent for every process of
// the deployment: the same signed request sent to a second process is
// replay, although that process never saw it.
func TestNonceReplayAcrossProcesses(t *testing.T) {
	t.Parallel()
	a, b := twoServes(t, nil)

	pub, priv, _ := ed25519.GenerateKey(nil)
	ch := mustCall(t, a.base, "", "register_challenge", map[string]any{})
	reg := mustCall(t, a.base, "", "register_agent", map[string]any{"name": "Twice", "platform": "test",
		"public_key":   base64.RawURLEncoding.EncodeToString(pub),
		"challenge_id": ch["challenge_id"],
		"signature":    base64.RawURLEncoding.EncodeToString(ed25519.Sign(priv, []byte(ch["payload"].(string))))})
	agentID, _ := reg["agent_id"].(string)

	args := []byte(`{"agent_id":"` + agentID + `"}`)
	canonical, err := signing.Canonical(args)
	if err != nil {
		t.Fatal(err)
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	nonce := "two-processes-nonce-1"
	sig := ed25519.Sign(priv, []byte(signing.KDText("todo_list", agentID, ts, nonce, signing.ArgsHash(canonical))))
	send := func(base string) map[string]any {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/todo_list", bytes.NewReader(args))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-kd-signature", base64.RawURLEncoding.EncodeToString(sig))
		req.Header.Set("x-kd-timestamp", ts)
		req.Header.Set("x-kd-nonce", nonce)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var env map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&env)
		env["http_status"] = float64(resp.StatusCode)
		return env
	}
	if r := send(a.base); r["ok"] != true {
		t.Fatalf("first process: %v", r)
	}
	r := send(b.base)
	if e, _ := r["error"].(map[string]any); r["http_status"] != float64(401) || e == nil || e["code"] != "replay" {
		t.Fatalf("second process: %v", r)
	}
	stopGracefully(t, a)
	stopGracefully(t, b)
}
