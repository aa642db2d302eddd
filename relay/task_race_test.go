package relay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/kungfu/credits"
	"github.com/dojo-relay/dojo/kungfu/kungfutest"
)

// pair of relay servers on one database, one Redis prefix and one queue.
func twoServers(t *testing.T, opts ...option) (*dojo, *dojo) {
	t.Helper()
	q := kungfutest.Queue(t)
	a := start(t, append([]option{withQueue(q)}, opts...)...)
	b := startOn(t, a.DSN, a.Prefix, append([]option{withQueue(q)}, opts...)...)
	return a, b
}

// drained waits until nothing is reserved by a claim or an unresolved
// delivery.
func drained(t *testing.T, d *dojo, within time.Duration) {
	t.Helper()
	end := time.Now().Add(within)
	for {
		n := d.dbInt(t, `SELECT (SELECT count(*) FROM claims WHERE status = 'active')
			+ (SELECT count(*) FROM submissions WHERE state IN ('delivering', 'uncertain'))`)
		if n == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d claims or deliveries still open after %v", n, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// exactlyOncePay asserts every settled submission was paid once and no
// other one at all.
func exactlyOncePay(t *testing.T, d *dojo) {
	t.Helper()
	if n := d.dbInt(t, `SELECT count(*) FROM submissions s
		WHERE (SELECT count(*) FROM ledger l WHERE l.type = 'earn_task' AND l.ref_type = 'task_submission' AND l.ref_id = s.id::text)
		      <> CASE WHEN s.state = 'settled' THEN 1 ELSE 0 END`); n != 0 {
		t.Fatalf("%d submissions paid other than exactly once when settled", n)
	}
	if drift, err := credits.Check(context.Background(), d.App.DB); err != nil || len(drift) > 0 {
		t.Fatalf("credits drift %+v %v", drift, err)
	}
	checkMoney(t, d)
}

// Two servers, many executors: claims, claim-bound and claim-less
// submissions, duplicates through both servers, releases and forced
// expiries, with receivers that accept, reject, fail or hang once. Nothing
// is paid twice, no reservation is left behind, the ledger holds.
func TestTaskTwoServersConcurrentMix(t *testing.T) {
	t.Parallel()
	a, b := twoServers(t, withReceiverTimeout(300*time.Millisecond), withLadder(0.001), withGrace(2*time.Second), withSweep(150*time.Millisecond))
	servers := []*dojo{a, b}
	pub, _ := a.register(t)
	rcv := newScripted(t, func(h tapHit, attempt int) answer {
		id, _ := strconv.Atoi(h.Header.Get("Idempotency-Key"))
		switch {
		case id%5 == 0 && attempt == 1:
			return hangs()
		case id%3 == 0:
			return says(422, "not good enough")
		case id%7 == 0:
			return says(500, "oops")
		}
		return says(200, "ok")
	})
	const price = 2
	code := newTask(t, a, pub, rcv.url(), price, 40, map[string]any{"limits": map[string]any{"max_rejected_per_agent": 50}})

	var (
		mu         sync.Mutex
		unexpected []string
		dupes      int
	)
	allowed := map[string]bool{"SLOTS_EXHAUSTED": true, "CLAIM_INVALID": true, "TASK_NOT_OPEN": true}
	note := func(what string, r result) {
		if r.ok() || (allowed[r.code()] && r.Status == 409) {
			return
		}
		mu.Lock()
		unexpected = append(unexpected, fmt.Sprintf("%s: %d %s", what, r.Status, r.Raw))
		mu.Unlock()
	}
	const executors, ops = 6, 25
	keys := make([]string, executors)
	for i := range keys {
		keys[i], _ = servers[i%2].register(t)
	}
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			claim := ""
			for op := range ops {
				srv := servers[rng.IntN(2)]
				reqKey := fmt.Sprintf("e%d-op%d", i, op)
				payload := map[string]any{"bullets": []string{reqKey}}
				switch rng.IntN(6) {
				case 0:
					r := srv.call(t, key, "work_claim", map[string]any{"code": code})
					note("claim", r)
					if r.ok() {
						claim = r.str("claim_id")
					}
				case 1:
					if claim == "" {
						continue
					}
					note("submit with claim", submit(t, srv, key, code, reqKey, payload, "claim_id", claim))
					claim = ""
				case 2:
					note("claim-less submit", submit(t, srv, key, code, reqKey, payload))
				case 3:
					if claim == "" {
						continue
					}
					note("release", srv.call(t, key, "work_release", map[string]any{"claim_id": claim}))
					claim = ""
				case 4:
					if claim == "" {
						continue
					}
					if _, err := srv.App.DB.Exec(context.Background(), `UPDATE claims SET expires_at = now() WHERE id = $1`, claim); err != nil {
						t.Error(err)
					}
					if rng.IntN(2) == 0 {
						r := submit(t, srv, key, code, reqKey, payload, "claim_id", claim)
						if r.code() != "CLAIM_INVALID" {
							mu.Lock()
							unexpected = append(unexpected, "submit with an expired claim: "+r.Raw)
							mu.Unlock()
						}
					}
					claim = ""
				case 5:
					// The same request through both servers at once.
					var x, y result
					var inner sync.WaitGroup
					inner.Go(func() { x = submit(t, a, key, code, reqKey, payload) })
					inner.Go(func() { y = submit(t, b, key, code, reqKey, payload) })
					inner.Wait()
					note("duplicate", x)
					note("duplicate", y)
					// Both accepted: one submission. (A refusal creates nothing, so
					// the twin may still find a slot freed in between.)
					if x.ok() && y.ok() && x.str("submission_id") != y.str("submission_id") {
						mu.Lock()
						unexpected = append(unexpected, "duplicate answered differently: "+x.Raw+" / "+y.Raw)
						mu.Unlock()
					}
					if x.ok() {
						mu.Lock()
						dupes++
						mu.Unlock()
					}
				}
			}
			if claim != "" && rng.IntN(2) == 0 {
				note("final release", servers[rng.IntN(2)].call(t, key, "work_release", map[string]any{"claim_id": claim}))
			}
		})
	}
	wg.Go(func() {
		for i := range 2 {
			time.Sleep(time.Duration(200+300*i) * time.Millisecond)
			note("fund", servers[i].call(t, pub, "task_fund", map[string]any{"code": code, "amount": 6}))
		}
	})
	wg.Wait()
	for _, u := range unexpected {
		t.Error(u)
	}
	// Whatever claims are left expire through the sweep.
	if _, err := a.App.DB.Exec(context.Background(), `UPDATE claims SET expires_at = now() WHERE status = 'active'`); err != nil {
		t.Fatal(err)
	}
	drained(t, a, 60*time.Second)
	g := taskView(t, a, pub, code)
	if g.num("reserved") != 0 || g.num("budget_locked") != 52 || g.num("settled")+g.num("available") != 52 {
		t.Fatalf("task after the storm: %s", g.Raw)
	}
	exactlyOncePay(t, a)
	// The receiver answered each submission finally at most once with a 2xx.
	rcv.mu.Lock()
	for key, statuses := range rcv.answered {
		ok := 0
		for _, s := range statuses {
			if s < 300 {
				ok++
			}
		}
		if ok > 1 {
			t.Errorf("submission %s accepted %d times by the receiver", key, ok)
		}
	}
	rcv.mu.Unlock()
	var settled int64
	for _, k := range keys {
		settled += balanceOf(t, a, k) - 66
	}
	if settled != g.num("settled") {
		t.Fatalf("executors earned %d, task settled %d", settled, g.num("settled"))
	}
	t.Logf("settled %d credits, %d concurrent duplicates, %d receiver requests", settled, dupes, rcv.count())
}

// 100 executors submit at once to a task whose budget covers 10: exactly
// 10 settle, the other 90 are SLOTS_EXHAUSTED, the ledger holds.
func TestTaskHundredParallelSubmissions(t *testing.T) {
	t.Parallel()
	a, b := twoServers(t)
	servers := []*dojo{a, b}
	pub, _ := a.register(t)
	j := newJudge(t, 200, `{"accepted":true}`)
	const price = 3
	code := newTask(t, a, pub, j.srv.URL, price, 10*price, nil)

	keys := make([]string, 100)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range keys {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			keys[i], _ = servers[i%2].register(t)
		})
	}
	wg.Wait()

	results := make([]result, len(keys))
	gate := make(chan struct{})
	for i, key := range keys {
		wg.Go(func() {
			<-gate
			results[i] = submit(t, servers[i%2], key, code, "race", bullets)
		})
	}
	close(gate)
	wg.Wait()
	settled := 0
	for i, r := range results {
		switch {
		case r.ok() && r.str("state") == "settled":
			settled++
			if bal := balanceOf(t, a, keys[i]); bal != 66+price {
				t.Errorf("executor %d balance %d", i, bal)
			}
		case r.Status == 409 && r.code() == "SLOTS_EXHAUSTED" && nextAction(r) == "stop":
		default:
			t.Errorf("executor %d: %d %s", i, r.Status, r.Raw)
		}
	}
	if settled != 10 {
		t.Fatalf("%d settled, want 10", settled)
	}
	g := taskView(t, a, pub, code)
	if g.num("settled") != 10*price || g.num("reserved") != 0 || g.num("available") != 0 || g.num("slots") != 0 {
		t.Fatalf("task: %s", g.Raw)
	}
	if j.count() != 10 {
		t.Fatalf("receiver saw %d", j.count())
	}
	exactlyOncePay(t, a)
}
