package relay_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/dojo-relay/dojo/relay"
)

var mcpAccept = []string{"Accept", "application/json, text/event-stream"}

func mcpCall(tool string, args string) []byte {
	return []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`)
}

// TestOriginPolicy: a browser page on another origin must not be able to
// drive either door. Before, /mcp only checked Host on loopback and /api/v1
// checked nothing, so any site could register accounts through a visitor.
func TestOriginPolicy(t *testing.T) {
	t.Parallel()
	d := start(t)
	key, _ := d.register(t)
	status := func(r result) int { return r.Status }

	for _, door := range []struct {
		name string
		send func(header ...string) result
	}{
		{"api", func(h ...string) result { return post(t, d.URL+"/api/v1/account_status", key, []byte(`{}`), h...) }},
		{"mcp", func(h ...string) result {
			return post(t, d.URL+"/mcp", key, mcpCall("account_status", `{}`), append(h, mcpAccept...)...)
		}},
	} {
		for _, bad := range [][]string{
			{"Origin", "https://evil.example"},
			{"Origin", "http://127.0.0.1:1"},
			{"Sec-Fetch-Site", "cross-site"},
		} {
			r := door.send(bad...)
			expect(t, r, http.StatusForbidden, "FORBIDDEN_ORIGIN")
		}
		for _, good := range [][]string{nil, {"Origin", d.URL}, {"Sec-Fetch-Site", "same-origin"}} {
			if r := door.send(good...); status(r) != http.StatusOK {
				t.Errorf("%s with %v: %d %s", door.name, good, r.Status, r.Raw)
			}
		}
	}

	// The refused call changed nothing: the name it tried is still free.
	r := post(t, d.URL+"/api/v1/account_register", "", []byte(`{"name":"origin_victim","password":"secret1"}`), "Origin", "https://evil.example")
	expect(t, r, http.StatusForbidden, "FORBIDDEN_ORIGIN")
	if r := d.call(t, "", "account_register", map[string]any{"name": "origin_victim", "password": "secret1"}); !r.ok() {
		t.Fatalf("the refused registration took the name: %s", r.Raw)
	}
	// The owner's key reset follows the same rule.
	expect(t, post(t, d.URL+"/owner/key", "", []byte(`{"name":"origin_victim","password":"secret1"}`), "Origin", "https://evil.example"),
		http.StatusForbidden, "FORBIDDEN_ORIGIN")
}

// TestHostPolicy: DNS rebinding reaches a loopback Dojo under a foreign
// Host. /mcp refused it before; /api/v1 did not.
func TestHostPolicy(t *testing.T) {
	t.Parallel()
	d := start(t)
	send := func(d *dojo, path string, body []byte, host string) int {
		req, _ := http.NewRequest(http.MethodPost, d.URL+path, strings.NewReader(string(body)))
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	reg := []byte(`{"name":"rebound_agent","password":"secret1"}`)
	if code := send(d, "/api/v1/account_register", reg, "attacker.example"); code != http.StatusForbidden {
		t.Fatalf("api under a foreign Host: %d, want 403", code)
	}
	if code := send(d, "/mcp", mcpCall("account_register", string(reg)), "attacker.example:80"); code != http.StatusForbidden {
		t.Fatalf("mcp under a foreign Host: %d, want 403", code)
	}
	for _, host := range []string{"localhost", "127.0.0.1", strings.TrimPrefix(d.URL, "http://")} {
		if code := send(d, "/api/v1/account_status", []byte(`{}`), host); code != http.StatusUnauthorized {
			t.Errorf("api under Host %q: %d, want to reach the tool (401 without a key)", host, code)
		}
	}
	// Behind a same-host proxy the public name is this server's name, on
	// both doors; other names still are not.
	pub := start(t, func(o *relay.Options) { o.PublicURL = "https://dojo.example.org" })
	if code := send(pub, "/api/v1/account_register", reg, "dojo.example.org"); code != http.StatusOK {
		t.Fatalf("api behind a proxy: %d, want 200", code)
	}
	if code := send(pub, "/api/v1/account_status", []byte(`{}`), "other.example.org"); code != http.StatusForbidden {
		t.Fatalf("api behind a proxy, foreign Host: %d, want 403", code)
	}
	// A browser on the public origin passes although the proxy rewrote Host.
	r := post(t, pub.URL+"/api/v1/account_status", "", []byte(`{}`), "Origin", "https://dojo.example.org")
	expect(t, r, http.StatusUnauthorized, "UNAUTHORIZED")
}

// TestAPIContentType: a form or text/plain body is what a cross-site page
// can send without a preflight; the HTTP JSON door takes JSON only.
func TestAPIContentType(t *testing.T) {
	t.Parallel()
	d := start(t)
	body := []byte(`{"name":"typed_agent","password":"secret1"}`)
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml", "nonsense/"} {
		r := post(t, d.URL+"/api/v1/account_register", "", body, "Content-Type", ct)
		expect(t, r, http.StatusUnsupportedMediaType, "UNSUPPORTED_MEDIA_TYPE")
		if !strings.Contains(r.Raw, "is not JSON: send application/json") {
			t.Fatalf("Content-Type %q: the message does not say what to send: %s", ct, r.Raw)
		}
	}
	for i, ct := range []string{"application/json; charset=utf-8", "application/vnd.dojo+json", ""} {
		b := []byte(`{"name":"typed_agent` + itoa(int64(i)) + `","password":"secret1"}`)
		r := post(t, d.URL+"/api/v1/account_register", "", b, "Content-Type", ct)
		if !r.ok() {
			t.Errorf("Content-Type %q: %s", ct, r.Raw)
		}
	}
}

// TestForwardedForEveryLine: a proxy that adds its own X-Forwarded-For line
// leaves the client's forged first line in place. Only the first line was
// read, so the client chose its address for the per-address limits.
func TestForwardedForEveryLine(t *testing.T) {
	t.Parallel()
	d := start(t, withLimits("register=1/1h"))
	reg := func(name string, xff ...string) result {
		var h []string
		for _, line := range xff {
			h = append(h, "X-Forwarded-For", line)
		}
		return d.call(t, "", "account_register", map[string]any{"name": name, "password": "secret1"}, h...)
	}
	if r := reg("forwarded_1", "203.0.113.1", "198.51.100.20"); !r.ok() {
		t.Fatalf("first registration: %s", r.Raw)
	}
	// Same real client behind the proxy, another forged first line.
	expect(t, reg("forwarded_2", "203.0.113.2", "198.51.100.20"), http.StatusTooManyRequests, "RATE_LIMIT")
	// Lines and commas mix; trusted hops at the right are skipped.
	expect(t, reg("forwarded_3", "203.0.113.3, 198.51.100.20", "127.0.0.1"), http.StatusTooManyRequests, "RATE_LIMIT")
	if r := reg("forwarded_4", "198.51.100.21"); !r.ok() {
		t.Fatalf("another client: %s", r.Raw)
	}
}

// TestLoopbackUnlimited: `dojo dev` lifts per-address limits for loopback
// clients only, so the walkthrough can run twice within the hour.
func TestLoopbackUnlimited(t *testing.T) {
	t.Parallel()
	d := start(t, withLimits("register=1/1h"), func(o *relay.Options) { o.LoopbackUnlimited = true })
	for i := range 3 {
		if r := d.call(t, "", "account_register", map[string]any{"name": "loopback_" + itoa(int64(i)), "password": "secret1"}); !r.ok() {
			t.Fatalf("loopback registration %d: %s", i, r.Raw)
		}
	}
	remote := func(name string) result {
		return d.call(t, "", "account_register", map[string]any{"name": name, "password": "secret1"}, "X-Forwarded-For", "198.51.100.7")
	}
	if !remote("remote_one").ok() {
		t.Fatal("first remote registration refused")
	}
	expect(t, remote("remote_two"), http.StatusTooManyRequests, "RATE_LIMIT")
	// Without the option loopback is a client like any other.
	plain := start(t, withLimits("register=1/1h"))
	plain.register(t)
	expect(t, plain.call(t, "", "account_register", map[string]any{"name": "loopback_x", "password": "secret1"}), http.StatusTooManyRequests, "RATE_LIMIT")
}

// TestPoolSize: the pool is sized for the machine, not pgx's 4, and
// DOJO_DB_MAX_CONNS or pool_max_conns set it.
func TestPoolSize(t *testing.T) {
	t.Parallel()
	if got := start(t, func(o *relay.Options) { o.DBMaxConns = 0 }).App.DB.Config().MaxConns; got != relay.DefaultDBMaxConns() || got < 16 {
		t.Fatalf("default pool: %d connections, want %d (at least 16)", got, relay.DefaultDBMaxConns())
	}
	if got := start(t, func(o *relay.Options) { o.DBMaxConns = 7 }).App.DB.Config().MaxConns; got != 7 {
		t.Fatalf("DBMaxConns 7: %d", got)
	}
	if got := start(t, func(o *relay.Options) { o.DatabaseURL += "&pool_max_conns=5"; o.DBMaxConns = 0 }).App.DB.Config().MaxConns; got != 5 {
		t.Fatalf("pool_max_conns=5: %d", got)
	}
}

// TestAccountIDNamedAlike: account_register and account_status name the
// account id the same way (bot_id, as the protocol's account_status does).
func TestAccountIDNamedAlike(t *testing.T) {
	t.Parallel()
	d := start(t)
	r := d.call(t, "", "account_register", map[string]any{"name": "named_alike", "password": "secret1"})
	st := d.call(t, r.str("api_key"), "account_status", map[string]any{})
	if r.num("bot_id") == 0 || r.num("bot_id") != st.num("bot_id") || r.Body["account_id"] != nil {
		t.Fatalf("register %s, status %s", r.Raw, st.Raw)
	}
}

// TestOwnerKeyFormText: the form-encoded /owner/key path skipped the strict
// JSON reader, so a NUL or an invalid UTF-8 byte in a form value reached
// PostgreSQL and came back as a 500.
func TestOwnerKeyFormText(t *testing.T) {
	t.Parallel()
	d := start(t)
	for _, body := range []string{"name=ab%00cd&password=secret1", "name=ab%FFcd&password=secret1", "name=abcdef&password=se%00cret"} {
		r := post(t, d.URL+"/owner/key", "", []byte(body), "Content-Type", "application/x-www-form-urlencoded")
		expect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		if !strings.Contains(r.Raw, "without NUL") {
			t.Fatalf("%s: %s", body, r.Raw)
		}
	}
}
