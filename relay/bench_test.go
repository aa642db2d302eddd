package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
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
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
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

// BenchmarkMemoryPut is memory_put end to end over loopback HTTP: new
// memories, each a transaction with a head row and a revision.
func BenchmarkMemoryPut(b *testing.B) {
	d := start(b)
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
	d := start(b)
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
	d := start(b)
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
