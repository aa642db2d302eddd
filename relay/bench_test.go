package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

var benchClient = &http.Client{Transport: &http.Transport{MaxIdleConns: 128, MaxIdleConnsPerHost: 128}, Timeout: 30 * time.Second}

// load runs b.N operations across conc workers and reports throughput and
// latency percentiles.
func load(b *testing.B, conc int, op func(i int) error) {
	b.Helper()
	var (
		next int64 = -1
		mu   sync.Mutex
		lat  = make([]time.Duration, 0, b.N)
		wg   sync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, b.N/conc+1)
			for {
				i := atomic.AddInt64(&next, 1)
				if i >= int64(b.N) {
					break
				}
				t0 := time.Now()
				if err := op(int(i)); err != nil {
					b.Error(err)
					return
				}
				local = append(local, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "ops/s")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
}

func benchCall(url, key string, body []byte) error {
	return benchSigned(url, body, []string{"Authorization", "Bearer " + key})
}

// BenchmarkMemoryPut is memory_put end to end over loopback HTTP: new
// memories, each a transaction with a head row and a revision.
func BenchmarkMemoryPut(b *testing.B) {
	d := start(b, withSweep(5*time.Second))
	key, _ := d.register(b)
	body, _ := json.Marshal(putArgs())
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) {
			load(b, conc, func(int) error { return benchCall(d.URL+"/api/v1/memory_put", key, body) })
		})
	}
}

// BenchmarkMemoryGet reads one memory end to end over loopback HTTP.
func BenchmarkMemoryGet(b *testing.B) {
	d := start(b, withSweep(5*time.Second))
	key, _ := d.register(b)
	code := d.call(b, key, "memory_put", putArgs()).str("code")
	body := []byte(`{"code":"` + code + `"}`)
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) {
			load(b, conc, func(int) error { return benchCall(d.URL+"/api/v1/memory_get", key, body) })
		})
	}
}

// BenchmarkPostgresInsert is the reference: raw single-row INSERTs, one
// autocommit statement each, through the same pgx pool settings.
func BenchmarkPostgresInsert(b *testing.B) {
	d := start(b, withSweep(5*time.Second))
	pool, err := pgxpool.New(context.Background(), d.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE bench_insert (id bigserial PRIMARY KEY, body text NOT NULL, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		b.Fatal(err)
	}
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) {
			load(b, conc, func(int) error {
				_, err := pool.Exec(context.Background(), `INSERT INTO bench_insert (body) VALUES ($1)`, "reference row")
				return err
			})
		})
	}
}

// BenchmarkThreadPost is thread_post end to end at 16 concurrent clients:
// each in its own room (rooms are independent), and all in one shared room
// (every post in a room takes the room's lock, so they serialize).
func BenchmarkThreadPost(b *testing.B) {
	d := start(b, withSweep(5*time.Second))
	type client struct{ key, room string }
	var own, shared []client
	gov, _ := d.register(b)
	st := d.must(b, gov, "thread_start", map[string]any{"subject": "shared", "key": true})
	sharedRoom := st.Body["thread"].(map[string]any)["code"].(string)
	for range 16 {
		k, _ := d.register(b)
		r := d.must(b, k, "thread_start", map[string]any{"subject": "bench"})
		own = append(own, client{k, r.Body["thread"].(map[string]any)["code"].(string)})
		d.must(b, k, "thread_join", map[string]any{"key": st.str("key")})
		shared = append(shared, client{k, sharedRoom})
	}
	for _, c := range []struct {
		name    string
		clients []client
	}{{"own-rooms/c=16", own}, {"shared-room/c=16", shared}} {
		b.Run(c.name, func(b *testing.B) {
			var next atomic.Int64
			load(b, 16, func(i int) error {
				cl := c.clients[next.Add(1)%16]
				body := []byte(`{"thread":"` + cl.room + `","content":"status update number ` + fmt.Sprint(i) + `","ask":[]}`)
				return benchCall(d.URL+"/api/v1/thread_post", cl.key, body)
			})
		})
	}
}

// BenchmarkTodoList reads the first page of the turn of an account with
// 1 000 open items, in a database holding 100 000 open items in all.
func BenchmarkTodoList(b *testing.B) {
	d := start(b, withSweep(5*time.Second))
	key, name := d.register(b)
	ctx := context.Background()
	seed := []string{
		`INSERT INTO accounts (name, password_hash, created_at, updated_at)
		 SELECT 'bench_' || g, 'x', now(), now() FROM generate_series(1, 99) g`,
		`INSERT INTO memories (code, account_id, origin, revision, created_at, updated_at)
		 SELECT 'abcdefabcdef', min(id), 'thread', 1, now(), now() FROM accounts`,
		`INSERT INTO memory_revisions (memory_id, revision, title, tags, content, checksum, created_at)
		 SELECT id, 1, 'entry', '{thread}', 'seeded entry', 'x', now() FROM memories`,
		`INSERT INTO threads (code, subject, created_by, created_at, next_seq)
		 SELECT substr(md5(g::text), 1, 12), 'room ' || g, (SELECT min(id) FROM accounts), now(), 51 FROM generate_series(1, 2000) g`,
		`INSERT INTO thread_entries (thread_id, seq, author_id, memory_id, revision, summary, created_at)
		 SELECT t.id, s, (SELECT min(id) FROM accounts), (SELECT id FROM memories), 1, 'entry ' || s,
		        now() - interval '1 day' + (t.id * 50 + s) * interval '1 ms'
		 FROM threads t, generate_series(1, 50) s`,
		// One receipt per entry: 1 000 for the benchmarked account, the rest spread over 99 others.
		`INSERT INTO thread_receipts (thread_id, entry_id, account_id, created_at)
		 SELECT e.thread_id, e.id,
		        CASE WHEN e.id % 100 = 0 THEN (SELECT id FROM accounts WHERE name = $1)
		             ELSE (SELECT id FROM accounts WHERE name = 'bench_' || (1 + e.id % 99)) END,
		        e.created_at
		 FROM thread_entries e`,
		`ANALYZE`,
	}
	for _, q := range seed {
		var err error
		if strings.Contains(q, "$1") {
			_, err = d.App.DB.Exec(ctx, q, name)
		} else {
			_, err = d.App.DB.Exec(ctx, q)
		}
		if err != nil {
			b.Fatalf("seed: %v\n%s", err, q)
		}
	}
	var mine, all int
	_ = d.App.DB.QueryRow(ctx, `SELECT count(*) FILTER (WHERE a.name = $1), count(*) FROM thread_receipts r JOIN accounts a ON a.id = r.account_id`, name).Scan(&mine, &all)
	if mine != 1000 || all != 100000 {
		b.Fatalf("seeded %d of %d open items", mine, all)
	}
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) {
			load(b, conc, func(int) error { return benchCall(d.URL+"/api/v1/todo_list", key, []byte(`{}`)) })
		})
	}
}

// BenchmarkWorkSubmit is work_submit → settled end to end: intake
// transaction, synchronous POST to a loopback receiver that accepts, and the
// settle transaction that pays the executor; 16 executors submit claim-less.
// one-task: all to one task, whose row lock serializes intake and settle
// (that lock is what keeps its money exact); own-tasks: one task each.
func BenchmarkWorkSubmit(b *testing.B) {
	d := start(b, withSweep(5*time.Second))
	j := newJudge(b, 200, `{"accepted":true}`)
	pub, _ := d.register(b)
	var execs []string
	for range 16 {
		k, _ := d.register(b)
		execs = append(execs, k)
	}
	// Fund the publisher beyond the signup grant, through the ledger.
	ctx := context.Background()
	if _, err := d.App.DB.Exec(ctx, `UPDATE accounts SET balance = balance + 10000000 WHERE id = (SELECT min(id) FROM accounts)`); err != nil {
		b.Fatal(err)
	}
	if _, err := d.App.DB.Exec(ctx, `INSERT INTO ledger (account_id, type, amount, balance_after, created_at)
		SELECT id, 'grant_payment', 10000000, balance, now() FROM accounts WHERE id = (SELECT min(id) FROM accounts)`); err != nil {
		b.Fatal(err)
	}
	one := newTask(b, d, pub, j.srv.URL, 1, 1000000, nil)
	var own []string
	for range 16 {
		own = append(own, newTask(b, d, pub, j.srv.URL, 1, 100000, nil))
	}
	for _, c := range []struct {
		name  string
		tasks func(i int64) string
	}{{"one-task/c=16", func(int64) string { return one }}, {"own-tasks/c=16", func(i int64) string { return own[i%16] }}} {
		b.Run(c.name, func(b *testing.B) {
			var n atomic.Int64
			load(b, 16, func(i int) error {
				k := n.Add(1)
				body := []byte(fmt.Sprintf(`{"code":"%s","request_key":"%s-%d","payload":{"n":%d}}`, c.tasks(k), c.name[:3], i, i))
				return benchCall(d.URL+"/api/v1/work_submit", execs[k%16], body)
			})
		})
	}
	var unsettled int
	_ = d.App.DB.QueryRow(ctx, `SELECT count(*) FROM submissions WHERE state <> 'settled'`).Scan(&unsettled)
	if unsettled > 0 {
		b.Fatalf("%d submissions did not settle", unsettled)
	}
}
