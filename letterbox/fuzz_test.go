package letterbox_test

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/letterbox"
)

// FuzzDeliver throws arbitrary letters and headers at /kizuna/deliver: it
// must never panic or answer 5xx, and it must spool nothing whose
// signature is not valid.
func FuzzDeliver(f *testing.F) {
	f.Add([]byte(`{"task_id":"T-1"}`), "T-1", int64(0), uint8(0), "")
	f.Add([]byte(`{"task_id":"T-1"}`), "T-1", int64(0), uint8(1), "sha256=00")
	f.Add([]byte(`{"task_id":"T-2","x":[1,{"y":null}]}`), "T-2", int64(-301), uint8(0), "")
	f.Add([]byte(`{"task_id":"../etc"}`), "../etc", int64(5), uint8(0), "")
	f.Add([]byte(`[]`), "T-3", int64(0), uint8(0), "")
	f.Add([]byte(`{"task_id":"T-4"`), "T-4", int64(0), uint8(2), "x")
	f.Add([]byte(``), "", int64(0), uint8(3), "")

	home := f.TempDir()
	box := &letterbox.Box{Home: home, Log: quietLog(),
		Config: letterbox.Config{HubURL: "http://127.0.0.1:1", AgentID: "A-7K3P", AgentToken: "tok", EndpointSecret: secret}}
	h, err := box.Handler()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, id string, off int64, mode uint8, sig string) {
		now := time.Now().Unix()
		ts := strconv.FormatInt(now+off%1000, 10)
		valid := false
		switch mode % 4 {
		case 0: // signed correctly
			sig = hubSign(secret, ts, body)
			valid = off%1000 >= -299 && off%1000 <= 299
		case 1: // the fuzzer's own signature
		case 2: // signed with the fuzzer's string as timestamp
			ts = sig
			sig = hubSign(secret, ts, body)
		case 3: // no signature
			sig = ""
		}
		req := httptest.NewRequest("POST", "http://box.example/kizuna/deliver", bytes.NewReader(body))
		req.RemoteAddr = "192.0.2.9:4000"
		req.Header.Set("X-Kizuna-Task-Id", id)
		req.Header.Set("X-Kizuna-Timestamp", ts)
		if sig != "" {
			req.Header.Set("X-Kizuna-Signature", sig)
		}
		before := countFiles(home)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		if w.Code == 200 && mode%4 == 1 {
			// The fuzzer found a valid HMAC by itself: only possible if it
			// copied a correct one, which it cannot compute.
			t.Fatalf("an unsigned letter was accepted: %s", w.Body)
		}
		if !valid && mode%4 != 2 && countFiles(home) != before {
			t.Fatalf("a letter with an invalid signature was spooled")
		}
		if w.Code == 200 {
			if _, err := os.Stat(filepath.Join(home, "spool", id+".json")); err != nil {
				t.Fatalf("ACK without a spool file: %v", err)
			}
		}
	})
}

func countFiles(home string) int {
	entries, _ := os.ReadDir(filepath.Join(home, "spool"))
	return len(entries)
}

// BenchmarkSpool measures letters spooled per second (each fsynced, file
// and directory) through signed POSTs over loopback to a real Box.
func BenchmarkSpool(b *testing.B) {
	for _, c := range []int{1, 16} {
		b.Run("c="+strconv.Itoa(c), func(b *testing.B) {
			r := startBox(b, "", "http://127.0.0.1:1", nil)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c, DialContext: (&net.Dialer{}).DialContext}}
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for w := 0; w < c; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						n := next.Add(1)
						if n > int64(b.N) {
							return
						}
						id := "T-" + strconv.FormatInt(n, 10)
						body := letterBody(id)
						ts := strconv.FormatInt(time.Now().Unix(), 10)
						req, _ := http.NewRequest("POST", r.url+"/kizuna/deliver", bytes.NewReader(body))
						req.Header.Set("X-Kizuna-Task-Id", id)
						req.Header.Set("X-Kizuna-Timestamp", ts)
						req.Header.Set("X-Kizuna-Signature", hubSign(secret, ts, body))
						resp, err := client.Do(req)
						if err != nil {
							b.Error(err)
							return
						}
						resp.Body.Close()
						if resp.StatusCode != 200 {
							b.Errorf("status %d", resp.StatusCode)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "letters/s")
		})
	}
}
