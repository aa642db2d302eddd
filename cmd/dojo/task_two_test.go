package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
)

// Two dojo serve processes on one database and Redis take a concurrent mix
// of claims, claim-based and claim-less submissions, releases and forced
// expiries. No submission is paid twice, no reservation is left behind,
// and dojo check passes.
func TestTwoServersMoneyMix(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	judge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if n.Add(1)%3 == 0 {
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"accepted":false,"message":"needs a source"}`)
			return
		}
		_, _ = io.WriteString(w, `{"accepted":true}`)
	}))
	defer judge.Close()
	dsn, prefix, queue := kungfutest.DatabaseURL(t), kungfutest.RedisPrefix(t), kungfutest.Queue(t)
	env := taskEnv(dsn, prefix, queue, "0.001")
	a, b := startServe(t, env()), startServe(t, env())
	servers := []*server{a, b}

	pub := registerOn(t, a.base, "mix_publisher")
	task := mustCall(t, b.base, pub, "task_create", map[string]any{"budget": 40, "open": true, "contract": map[string]any{
		"title": "Mix", "requirements": "Send anything.", "receiver": map[string]any{"url": judge.URL}, "price": 2,
		"limits": map[string]any{"max_rejected_per_agent": 50}}})["code"].(string)

	var execs []string
	for i := range 8 {
		execs = append(execs, registerOn(t, servers[i%2].base, fmt.Sprintf("mix_exec_%d", i)))
	}
	var wg sync.WaitGroup
	for i, key := range execs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for step := range 6 {
				here, there := servers[(i+step)%2], servers[(i+step+1)%2]
				payload := map[string]any{"n": step}
				rk := fmt.Sprintf("e%d-s%d", i, step)
				switch (i + step) % 4 {
				case 0: // claim on one process, submit through the other
					c, err := tryCall(here.base, key, "work_claim", map[string]any{"code": task})
					if err == nil && c["ok"] == true {
						_, _ = tryCall(there.base, key, "work_submit", map[string]any{"code": task, "request_key": rk, "payload": payload, "claim_id": c["claim_id"]})
					}
				case 1: // claim-less
					_, _ = tryCall(here.base, key, "work_submit", map[string]any{"code": task, "request_key": rk, "payload": payload})
				case 2: // claim and release
					c, err := tryCall(here.base, key, "work_claim", map[string]any{"code": task})
					if err == nil && c["ok"] == true {
						_, _ = tryCall(there.base, key, "work_release", map[string]any{"claim_id": c["claim_id"]})
					}
				case 3: // claim and let it expire (forced below), plus a replayed submission
					_, _ = tryCall(here.base, key, "work_claim", map[string]any{"code": task})
					_, _ = tryCall(there.base, key, "work_submit", map[string]any{"code": task, "request_key": rk + "r", "payload": payload})
					_, _ = tryCall(here.base, key, "work_submit", map[string]any{"code": task, "request_key": rk + "r", "payload": payload})
				}
			}
		}()
	}
	wg.Wait()
	// Expire every claim still active; the claim-expiry sweep of either process releases them.
	if got := dbCount(t, dsn, `WITH x AS (UPDATE claims SET expires_at = now() WHERE status = 'active' RETURNING 1) SELECT count(*) FROM x`); got < 0 {
		t.Fatal("expiry update")
	}
	end := time.Now().Add(60 * time.Second)
	for dbCount(t, dsn, `SELECT reserved FROM tasks WHERE code = $1`, task) != 0 ||
		dbCount(t, dsn, `SELECT count(*) FROM submissions WHERE state IN ('delivering', 'uncertain')`) != 0 {
		if time.Now().After(end) {
			t.Fatalf("reservations or deliveries left: reserved %d", dbCount(t, dsn, `SELECT reserved FROM tasks WHERE code = $1`, task))
		}
		time.Sleep(250 * time.Millisecond)
	}
	if paidTwice := dbCount(t, dsn, `SELECT count(*) FROM (SELECT ref_id FROM ledger WHERE type = 'earn_task' GROUP BY ref_id HAVING count(*) > 1) x`); paidTwice != 0 {
		t.Fatalf("%d submissions paid twice", paidTwice)
	}
	settled := dbCount(t, dsn, `SELECT count(*) FROM submissions WHERE state = 'settled'`)
	if settled == 0 || settled > 20 || dbCount(t, dsn, `SELECT settled FROM tasks WHERE code = $1`, task) != 2*settled {
		t.Fatalf("settled %d submissions; task counters disagree", settled)
	}
	dojoCheck(t, env())
	for _, s := range servers {
		stopGracefully(t, s)
	}
}
