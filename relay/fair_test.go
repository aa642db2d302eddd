package relay_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/queue"
	"github.com/dojo-relay/dojo/relay"
)

func withHostCooldown(d time.Duration) option { return func(o *relay.Options) { o.HostCooldown = d } }

// Regression for issue 7, item 6: one account's notify endpoint hangs and
// 60 asks owe it 60 pushes; another account's push must still arrive at
// once. Before, every kind of background work shared ten workers and each
// hanging push held one for the whole timeout, so the other push waited
// about a minute. Now the hanging host holds at most its turns
// (queue.DefaultHostLimit) and pushes deferred for want of a turn are
// neither made nor counted as tries.
func TestFairNotifyPushes(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var hung, inFlight, most atomic.Int32
	hanging := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var probe struct{ Type, Challenge string }
		if json.Unmarshal(body, &probe) == nil && probe.Type == "verification" {
			_, _ = w.Write([]byte(`{"echo":"` + probe.Challenge + `"}`))
			return
		}
		hung.Add(1)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	// Registered before start, so it closes after the server has stopped.
	t.Cleanup(func() { close(release); hanging.Close() })
	healthy := newReceiver(t, http.StatusOK)
	pool := x509.NewCertPool()
	pool.AddCert(hanging.Certificate())
	pool.AddCert(healthy.srv.Certificate())
	d := start(t, withRoots(pool), withReceiverTimeout(time.Second), withNotifyBackoff(50*time.Millisecond))

	roomA, bossA, workerA, _ := pair(t, d)
	d.must(t, workerA, "notify_register", map[string]any{"url": hanging.URL + "/hook"})
	roomB, bossB, workerB, _ := pair(t, d)
	d.must(t, workerB, "notify_register", map[string]any{"url": healthy.srv.URL + "/hook"})

	for range 60 {
		d.must(t, bossA, "thread_post", map[string]any{"thread": roomA, "content": "are you there?"})
	}
	// A's pushes are hanging (or, once they timed out, A's host is closed).
	waitFor(t, 5*time.Second, func() bool { return most.Load() >= queue.DefaultHostLimit })

	sent := time.Now()
	d.must(t, bossB, "thread_post", map[string]any{"thread": roomB, "content": "hello"})
	for len(healthy.got()) == 0 {
		if time.Since(sent) > 5*time.Second {
			t.Fatalf("B's push did not arrive within 5 s while A's endpoint hangs (%d of A's pushes in flight)", inFlight.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Unfair, B waited for A's six rounds of 1 s timeouts; fair, it goes at
	// once. 4 s tells the two apart on a loaded machine.
	if took := time.Since(sent); took > 4*time.Second {
		t.Fatalf("B's push took %v behind A's hanging endpoint", took)
	}
	if m := most.Load(); m > queue.DefaultHostLimit {
		t.Fatalf("%d pushes in flight at one host, want at most %d", m, queue.DefaultHostLimit)
	}
	// Only POSTs that were made are tries; deferred pushes count none.
	var tries int64
	if err := d.App.DB.QueryRow(context.Background(), `SELECT coalesce(sum(o.attempts), 0) FROM notify_outbox o
		JOIN notify_endpoints e ON e.account_id = o.account_id WHERE e.url = $1`, hanging.URL+"/hook").Scan(&tries); err != nil {
		t.Fatal(err)
	}
	if made := int64(hung.Load()); tries > made {
		t.Fatalf("%d tries counted for %d POSTs made", tries, made)
	}
}
