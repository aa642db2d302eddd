package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

// TestResetKeyStopsOnOtherProcess: a key reset through one `dojo serve`
// process stops the old key on the very next call to another process of
// the same deployment, and the new key works there at once. No process
// may keep a key it authenticated before the reset. The old key is used on
// B just before the reset, so anything B remembered of it would show.
func TestResetKeyStopsOnOtherProcess(t *testing.T) {
	t.Parallel()
	a, b := twoServes(t, nil)
	reg := mustCall(t, a.base, "", "account_register", map[string]any{"name": "reset_twice", "password": "secret-pw1"})
	old, _ := reg["api_key"].(string)
	put := mustCall(t, b.base, old, "memory_put", map[string]any{"title": "t", "tags": []string{"x"}, "content": "a memory read across a key reset, long enough to keep"})
	code, _ := put["code"].(string)
	for range 3 {
		mustCall(t, b.base, old, "memory_get", map[string]any{"code": code})
	}

	body, _ := json.Marshal(map[string]string{"name": "reset_twice", "password": "secret-pw1"})
	req, _ := http.NewRequest(http.MethodPost, a.base+"/owner/key", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var reset map[string]any
	err = json.NewDecoder(resp.Body).Decode(&reset)
	resp.Body.Close()
	fresh, _ := reset["api_key"].(string)
	if err != nil || resp.StatusCode != 200 || fresh == "" || fresh == old {
		t.Fatalf("reset through A: %d %v %v", resp.StatusCode, reset, err)
	}

	r := call(t, b.base, old, "memory_get", map[string]any{"code": code})
	if r["http_status"] != float64(401) || r["error"].(map[string]any)["code"] != "UNAUTHORIZED" {
		t.Fatalf("the old key on B right after the reset: %v", r)
	}
	if got := mustCall(t, b.base, fresh, "memory_get", map[string]any{"code": code}); got["code"] != code {
		t.Fatalf("the new key on B: %v", got)
	}
	if r := call(t, a.base, old, "account_status", map[string]any{}); r["http_status"] != float64(401) {
		t.Fatalf("the old key on A: %v", r)
	}
	stopGracefully(t, a)
	stopGracefully(t, b)
}
