package letterbox_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/letterbox"
)

const secret = "es_interop_secret"

// hubSign is the hub side of the contract, written from the seed alone:
// "sha256=" + hex(HMAC_SHA256(endpoint_secret, timestamp + "." + raw_body)).
func hubSign(secret, ts string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "."))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

func TestHubSignVector(t *testing.T) {
	got := hubSign("es_test_secret", "1761724800", []byte(`{"task_id":"T-0001","from":"A-9X2M","to":"A-7K3P"}`))
	if want := "sha256=c1ed1fd947cbb0fd9705bd8f15cc9bb8c2426f093db8b49010fc4db7b288db35"; got != want {
		t.Fatalf("test vector: got %s, want %s", got, want)
	}
}

// running is a Box served on loopback for one test.
type running struct {
	box  *letterbox.Box
	url  string
	home string
	stop func()
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startBox serves a Box for home (a new one if empty) talking to hub.
func startBox(t testing.TB, home, hub string, tune func(*letterbox.Box)) *running {
	t.Helper()
	if home == "" {
		home = t.TempDir()
	}
	b := &letterbox.Box{
		Home:           home,
		Config:         letterbox.Config{HubURL: hub, AgentID: "A-7K3P", AgentToken: "kf_live_agent_token", EndpointSecret: secret},
		HeartbeatEvery: time.Hour,
		RetryMin:       20 * time.Millisecond,
		RetryMax:       100 * time.Millisecond,
		ForwardWait:    2 * time.Second,
		Log:            quietLog(),
	}
	if tune != nil {
		tune(b)
	}
	addr := b.Config.Listen
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Serve(ctx, ln) }()
	r := &running{box: b, url: "http://" + ln.Addr().String(), home: home}
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(r.stop)
	return r
}

// deliver POSTs a letter the way a hub does.
func deliver(t testing.TB, base, id string, body []byte, ts int64, sig string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/kizuna/deliver", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	stamp := strconv.FormatInt(ts, 10)
	if sig == "" {
		sig = hubSign(secret, stamp, body)
	}
	req.Header.Set("Content-Type", "application/json")
	if id != "" {
		req.Header.Set("X-Kizuna-Task-Id", id)
	}
	req.Header.Set("X-Kizuna-Timestamp", stamp)
	req.Header.Set("X-Kizuna-Attempt", "1")
	if sig != "-" {
		req.Header.Set("X-Kizuna-Signature", sig)
	}
	return do(t, req)
}

func letterBody(id string) []byte {
	return []byte(`{"task_id":"` + id + `","from":"A-9X2M","to":"A-7K3P","kind":"kizuna.task","reply_to":null,` +
		`"content":{"title":"Nightly build","format":"json","body":{"b": 1.50, "a":[1,2]}},"created_at":"2026-11-30T22:51:38.000Z"}`)
}

// spoolFiles lists the names of every file below home/spool.
func spoolFiles(t testing.TB, home string) []string {
	t.Helper()
	var names []string
	filepath.WalkDir(filepath.Join(home, "spool"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(home, p)
			names = append(names, filepath.ToSlash(rel))
		}
		return nil
	})
	return names
}

type ack struct {
	Status     string `json:"status"`
	TaskID     string `json:"task_id"`
	ReceivedAt string `json:"received_at"`
}

func decodeAck(t *testing.T, b []byte) ack {
	t.Helper()
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("ACK %s: %v", b, err)
	}
	if len(raw) != 3 {
		t.Fatalf("ACK has keys other than status, task_id, received_at: %s", b)
	}
	var a ack
	json.Unmarshal(b, &a)
	if _, err := time.Parse(time.RFC3339, a.ReceivedAt); err != nil || a.ReceivedAt[len(a.ReceivedAt)-1] != 'Z' {
		t.Fatalf("received_at %q is not UTC RFC 3339", a.ReceivedAt)
	}
	return a
}

func TestDeliverInterop(t *testing.T) {
	r := startBox(t, "", "http://127.0.0.1:1", nil)
	now := time.Now().Unix()

	t.Run("valid letter is spooled then ACKed", func(t *testing.T) {
		body := letterBody("T-0001")
		status, b := deliver(t, r.url, "T-0001", body, now, "")
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, b)
		}
		a := decodeAck(t, b)
		if a.Status != "received" || a.TaskID != "T-0001" {
			t.Fatalf("ACK %s", b)
		}
		raw, err := os.ReadFile(filepath.Join(r.home, "spool", "T-0001.json"))
		if err != nil {
			t.Fatalf("no spool file after the ACK: %v", err)
		}
		var rec struct {
			TaskID     string          `json:"task_id"`
			ReceivedAt string          `json:"received_at"`
			Attempt    int             `json:"attempt"`
			Letter     json.RawMessage `json:"letter"`
		}
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.TaskID != "T-0001" || rec.ReceivedAt != a.ReceivedAt || rec.Attempt != 1 || !bytes.Equal(rec.Letter, body) {
			t.Fatalf("spool record %s", raw)
		}
		if info, _ := os.Stat(filepath.Join(r.home, "spool", "T-0001.json")); info.Mode().Perm()&0o077 != 0 {
			t.Errorf("spool file mode %v is readable by others", info.Mode())
		}

		time.Sleep(1100 * time.Millisecond) // a fresh ACK would carry a later second
		status, b2 := deliver(t, r.url, "T-0001", body, time.Now().Unix(), "")
		if status != http.StatusOK || !bytes.Equal(b, b2) {
			t.Fatalf("duplicate: status %d, ACK %s, want the first ACK %s", status, b2, b)
		}
		if got := spoolFiles(t, r.home); len(got) != 1 {
			t.Fatalf("spool after a duplicate: %v", got)
		}
	})

	// sig builds the signature header from the timestamp actually sent;
	// nil signs correctly, "-" sends none.
	type signer func(ts string) string
	with := func(key string, body []byte) signer {
		return func(ts string) string { return hubSign(key, ts, body) }
	}
	fixed := func(s string) signer { return func(string) string { return s } }
	bad := []struct {
		name   string
		id     string
		body   []byte
		off    int64
		sig    signer
		status int
		code   string
	}{
		{"tampered body", "T-0002", letterBody("T-0002"), 0, with(secret, letterBody("T-0003")), 401, "UNAUTHORIZED"},
		{"bad signature", "T-0002", letterBody("T-0002"), 0, with("another secret", letterBody("T-0002")), 401, "UNAUTHORIZED"},
		{"not hex", "T-0002", letterBody("T-0002"), 0, fixed("sha256=zz"), 401, "UNAUTHORIZED"},
		{"no sha256 prefix", "T-0002", letterBody("T-0002"), 0, func(ts string) string { return hubSign(secret, ts, letterBody("T-0002"))[7:] }, 401, "UNAUTHORIZED"},
		{"missing signature", "T-0002", letterBody("T-0002"), 0, fixed("-"), 401, "UNAUTHORIZED"},
		{"stale timestamp", "T-0002", letterBody("T-0002"), -301, nil, 401, "UNAUTHORIZED"},
		{"future timestamp", "T-0002", letterBody("T-0002"), 301, nil, 401, "UNAUTHORIZED"},
		{"id mismatch", "T-0009", letterBody("T-0002"), 0, nil, 400, "VALIDATION_FAILED"},
		{"missing id header", "", letterBody("T-0002"), 0, nil, 400, "VALIDATION_FAILED"},
		{"unsafe id", "../x", letterBody("../x"), 0, nil, 400, "VALIDATION_FAILED"},
		{"not an object", "T-0002", []byte(`["T-0002"]`), 0, nil, 400, "VALIDATION_FAILED"},
		{"not JSON", "T-0002", []byte(`{"task_id":"T-0002"`), 0, nil, 400, "VALIDATION_FAILED"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			ts := time.Now().Unix() + c.off
			sig := ""
			if c.sig != nil {
				sig = c.sig(strconv.FormatInt(ts, 10))
			}
			status, b := deliver(t, r.url, c.id, c.body, ts, sig)
			var e struct {
				Error struct{ Code, Message string }
			}
			json.Unmarshal(b, &e)
			if status != c.status || e.Error.Code != c.code {
				t.Fatalf("status %d %s, want %d %s", status, b, c.status, c.code)
			}
			if got := spoolFiles(t, r.home); len(got) != 1 {
				t.Fatalf("spool holds %v", got)
			}
		})
	}

	t.Run("window edge is accepted", func(t *testing.T) {
		status, b := deliver(t, r.url, "T-edge", letterBody("T-edge"), time.Now().Unix()-299, "")
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, b)
		}
	})

	t.Run("too large", func(t *testing.T) {
		body := append(letterBody("T-big")[:0:0], `{"task_id":"T-big","pad":"`...)
		body = append(body, bytes.Repeat([]byte("x"), 4<<20)...)
		body = append(body, `"}`...)
		status, _ := deliver(t, r.url, "T-big", body, time.Now().Unix(), "")
		if status != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d, want 413", status)
		}
		if _, err := os.Stat(filepath.Join(r.home, "spool", "T-big.json")); err == nil {
			t.Fatal("an oversized letter was spooled")
		}
	})
}

func TestDeliverConcurrentDuplicates(t *testing.T) {
	r := startBox(t, "", "http://127.0.0.1:1", nil)
	body := letterBody("T-race")
	const n = 32
	acks := make([][]byte, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			status, b := deliver(t, r.url, "T-race", body, time.Now().Unix(), "")
			if status != http.StatusOK {
				t.Errorf("status %d: %s", status, b)
			}
			acks[i] = b
		}()
	}
	close(start)
	wg.Wait()
	for i := range acks {
		if !bytes.Equal(acks[i], acks[0]) {
			t.Fatalf("ACK %d %s differs from ACK 0 %s", i, acks[i], acks[0])
		}
	}
	if got := spoolFiles(t, r.home); len(got) != 1 || got[0] != "spool/T-race.json" {
		t.Fatalf("spool holds %v, want one file", got)
	}
}
