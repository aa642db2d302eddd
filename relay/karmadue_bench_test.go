package relay_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// benchSigned sends one request with the given headers: x-kd-* for a
// signed call, Authorization for a Bearer one (benchCall).
func benchSigned(url string, body []byte, header []string) error {
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := benchClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return nil
}

// BenchmarkKarmaDue compares one call signed kd-mcp-v1 with the same call
// by a Bearer key: memory_get (a read) and thread_post (a write, each
// client in its own room), at 1 and 16 clients. Bearer and signed runs
// alternate, so both see the same machine. Signatures are made before the
// timer starts: the figures are the server's cost (the agent and key
// lookup, Ed25519 verification, the canonical text and the nonce in Redis
// against the key lookup), not the client's.
func BenchmarkKarmaDue(b *testing.B) { benchKarmaDue(b, start(b, withSweep(5*time.Second))) }

// BenchmarkKarmaDueLimited is the same with the rate limits on, as a
// deployment runs (counts raised so no call waits): every call then pays
// its limit check in Redis, Bearer and signed alike.
func BenchmarkKarmaDueLimited(b *testing.B) {
	benchKarmaDue(b, start(b, withSweep(5*time.Second),
		withLimits("register=1000/1h,push=1000/1h,thread_start=1000/1h,get=100000000/1m,thread_write=100000000/1m")))
}

func benchKarmaDue(b *testing.B, d *dojo) {
	type client struct {
		key   string   // Bearer
		agent *kdAgent // signed
		room  string   // own room
		code  string   // own memory
	}
	var bearer, signed []client
	for i := range 16 {
		key, _ := d.register(b)
		bearer = append(bearer, client{key: key,
			room: d.must(b, key, "thread_start", map[string]any{"subject": "bench"}).Body["thread"].(map[string]any)["code"].(string),
			code: d.must(b, key, "memory_put", putArgs()).str("code")})
		a := kdRegister(b, d, "Bench "+benchLabels[i])
		signed = append(signed, client{agent: a,
			room: a.must(b, d, "thread_start", map[string]any{"subject": "bench"}).Body["thread"].(map[string]any)["code"].(string),
			code: a.must(b, d, "memory_put", putArgs()).str("code")})
	}
	bodies := map[string]func(c client, i int) map[string]any{
		"memory_get": func(c client, _ int) map[string]any { return map[string]any{"code": c.code} },
		"thread_post": func(c client, i int) map[string]any {
			return map[string]any{"thread": c.room, "content": fmt.Sprintf("status update number %d", i)}
		},
	}
	for _, tool := range []string{"memory_get", "thread_post"} {
		for _, conc := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/c=%d/bearer", tool, conc), func(b *testing.B) {
				reqs := make([][]byte, b.N)
				for i := range reqs {
					reqs[i] = jsonBytes(b, bodies[tool](bearer[i%conc], i))
				}
				load(b, conc, func(i int) error { return benchCall(d.URL+"/api/v1/"+tool, bearer[i%conc].key, reqs[i]) })
			})
			b.Run(fmt.Sprintf("%s/c=%d/signed", tool, conc), func(b *testing.B) {
				reqs, headers := make([][]byte, b.N), make([][]string, b.N)
				now := time.Now().Unix()
				for i := range reqs {
					c := signed[i%conc]
					reqs[i] = c.agent.args(b, bodies[tool](c, i))
					headers[i] = c.agent.signed(b, tool, reqs[i], now, freshNonce())
				}
				load(b, conc, func(i int) error { return benchSigned(d.URL+"/api/v1/"+tool, reqs[i], headers[i]) })
			})
		}
	}
}

// Labels far apart: one-edit lookalikes of a live label are reserved.
var benchLabels = []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
	"india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"}

func jsonBytes(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
