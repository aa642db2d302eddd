package letterbox

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const hardSecret = "es_hardening_secret"

// LogBuffer collects log lines from the box's goroutines. It is exported
// so the package's external tests use it too.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// hardBox serves a box on loopback through Serve, as `dojo-box run`
// does, and returns it with its base URL and its log.
func hardBox(t *testing.T, hub string, tune func(*Box)) (*Box, string, *LogBuffer) {
	t.Helper()
	logs := &LogBuffer{}
	b := &Box{
		Home:           t.TempDir(),
		Config:         Config{HubURL: hub, AgentID: "A-HARD", AgentToken: "kf_live_hard_token", EndpointSecret: hardSecret},
		HeartbeatEvery: time.Hour,
		RetryMin:       10 * time.Millisecond,
		RetryMax:       80 * time.Millisecond,
		ForwardWait:    2 * time.Second,
		Log:            slog.New(slog.NewJSONHandler(logs, nil)),
	}
	if tune != nil {
		tune(b)
	}
	if _, err := b.Handler(); err != nil { // the spool exists before Serve runs
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return b, "http://" + ln.Addr().String(), logs
}

// signedDelivery is a letter for id signed the way a hub signs it.
func signedDelivery(t *testing.T, base, id string) *http.Request {
	t.Helper()
	body := []byte(`{"task_id":"` + id + `","from":"A-9X2M","to":"A-HARD","kind":"kizuna.task","reply_to":null,"content":{"title":"t","body":"b"},"created_at":"2026-11-30T22:51:38.000Z"}`)
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	mac := hmac.New(sha256.New, []byte(hardSecret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	req, err := http.NewRequest(http.MethodPost, base+"/kizuna/deliver", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Kizuna-Task-Id", id)
	req.Header.Set("X-Kizuna-Timestamp", ts)
	req.Header.Set("X-Kizuna-Signature", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	return req
}

// do sends req and returns the status, the error code (if any) and the
// response, whose Body is replaced by the text read.
func do(t *testing.T, req *http.Request) (int, string, *http.Response) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(bytes.NewReader(b))
	var e struct{ Error struct{ Code string } }
	json.Unmarshal(b, &e)
	return resp.StatusCode, e.Error.Code, resp
}

func text(resp *http.Response) string {
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func newReq(t *testing.T, method, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestLoopbackRefusesProxiedCalls(t *testing.T) {
	_, base, _ := hardBox(t, "http://127.0.0.1:1", nil)
	if st, _, _ := do(t, newReq(t, "GET", base+"/healthz", "")); st != 200 {
		t.Fatalf("healthz without forwarding headers: %d", st)
	}
	routes := []struct{ method, path, body string }{
		{"GET", "/healthz", ""}, {"GET", "/tasks/pending", ""}, {"GET", "/tasks/T-1", ""},
		{"POST", "/tasks/T-1/complete", ""}, {"POST", "/tasks/T-1/result", `{"state":"completed"}`},
		{"POST", "/tasks", `{"to":"A-X","content":{}}`}, {"GET", "/nothing-here", ""},
	}
	// Spelled as proxies send them: the check must not depend on case.
	headers := []string{"Forwarded", "x-forwarded-for", "X-Forwarded-Host", "X-FORWARDED-PROTO",
		"X-Real-IP", "Via", "CF-Connecting-IP", "True-Client-IP"}
	for _, h := range headers {
		for _, rt := range routes {
			req := newReq(t, rt.method, base+rt.path, rt.body)
			req.Header.Set(h, "203.0.113.9")
			if st, code, _ := do(t, req); st != 403 || code != "FORBIDDEN" {
				t.Fatalf("%s %s with %s: %d %s, want 403 FORBIDDEN", rt.method, rt.path, h, st, code)
			}
		}
	}
	// An empty value counts too: the header's presence is the proxy's mark.
	req := newReq(t, "GET", base+"/healthz", "")
	req.Header["X-Forwarded-For"] = []string{""}
	if st, code, _ := do(t, req); st != 403 || code != "FORBIDDEN" {
		t.Fatalf("empty X-Forwarded-For: %d %s", st, code)
	}
	// Deliveries are meant to come through a proxy.
	req = signedDelivery(t, base, "T-proxied")
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	req.Header.Set("Via", "1.1 proxy")
	if st, code, _ := do(t, req); st != 200 {
		t.Fatalf("a proxied delivery: %d %s", st, code)
	}
}

func TestDeliverListen(t *testing.T) {
	c := Config{HubURL: "http://127.0.0.1:1", AgentID: "A", AgentToken: "t", EndpointSecret: "s", Listen: "127.0.0.1:7788", DeliverListen: "127.0.0.1:7788"}
	if err := c.Check(); err == nil || !strings.Contains(err.Error(), "deliver_listen") {
		t.Fatalf("deliver_listen equal to listen: %v", err)
	}

	b, base, logs := hardBox(t, "http://127.0.0.1:1", func(b *Box) { b.Config.DeliverListen = "127.0.0.1:0" })
	// The chosen port is in the start line.
	var line struct {
		Msg         string `json:"msg"`
		DeliverAddr string `json:"deliver_addr"`
	}
	deadline := time.Now().Add(5 * time.Second)
	for line.DeliverAddr == "" {
		for _, l := range strings.Split(logs.String(), "\n") {
			if json.Unmarshal([]byte(l), &line) == nil && line.Msg == "letterbox serving" && line.DeliverAddr != "" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no deliver_addr in the log:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	dbase := "http://" + line.DeliverAddr
	if st, code, _ := do(t, signedDelivery(t, dbase, "T-front")); st != 200 {
		t.Fatalf("deliver on deliver_listen: %d %s", st, code)
	}
	if _, err := os.Stat(filepath.Join(b.Home, "spool", "T-front.json")); err != nil {
		t.Fatalf("the letter is not in the spool: %v", err)
	}
	// Nothing else answers there, not even from loopback.
	for _, rt := range []struct{ method, path string }{
		{"GET", "/healthz"}, {"GET", "/tasks/pending"}, {"GET", "/tasks/T-front"}, {"POST", "/tasks/T-front/complete"},
		{"POST", "/tasks/T-front/result"}, {"POST", "/tasks"}, {"GET", "/kizuna/deliver"}, {"GET", "/"},
	} {
		if st, code, _ := do(t, newReq(t, rt.method, dbase+rt.path, `{}`)); st != 404 || code != "NOT_FOUND" {
			t.Fatalf("%s %s on deliver_listen: %d %s, want 404 NOT_FOUND", rt.method, rt.path, st, code)
		}
	}
	// listen keeps the whole API, deliveries included.
	if st, _, _ := do(t, newReq(t, "GET", base+"/tasks/T-front", "")); st != 200 {
		t.Fatalf("the loopback API on listen: %d", st)
	}
	if st, code, _ := do(t, signedDelivery(t, base, "T-back")); st != 200 {
		t.Fatalf("deliver on listen: %d %s", st, code)
	}

	// The key survives a save and a load, and is left out when empty.
	home := t.TempDir()
	if err := SaveConfig(home, Config{HubURL: "http://h", AgentID: "A", AgentToken: "t", EndpointSecret: "s", Listen: "127.0.0.1:7788", DeliverListen: ":7789"}); err != nil {
		t.Fatal(err)
	}
	if got, err := LoadConfig(home); err != nil || got.DeliverListen != ":7789" {
		t.Fatalf("LoadConfig: %+v %v", got.DeliverListen, err)
	}
	if err := SaveConfig(home, Config{HubURL: "http://h", AgentID: "A", AgentToken: "t", EndpointSecret: "s", Listen: ":7788"}); err != nil {
		t.Fatal(err)
	}
	if raw, _ := os.ReadFile(ConfigPath(home)); bytes.Contains(raw, []byte("deliver_listen")) {
		t.Fatalf("an empty deliver_listen was written:\n%s", raw)
	}
}

func TestOutboxAnsweredNotResent(t *testing.T) {
	var calls atomic.Int32
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/api/v1/heartbeat" {
			return
		}
		n := calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"task_id":"T-%d","status":"queued"}`, n)
	}))
	defer hub.Close()

	var refuse atomic.Bool
	refuse.Store(true)
	var removes atomic.Int32
	b, base, logs := hardBox(t, hub.URL, func(b *Box) {
		if _, err := b.Handler(); err != nil { // opens the outbox
			t.Fatal(err)
		}
		b.out.removeFile = func(p string) error {
			removes.Add(1)
			if refuse.Load() {
				return &os.PathError{Op: "remove", Path: p, Err: errors.New("the disk says no")}
			}
			return os.Remove(p)
		}
	})

	// The agent gets the hub's answer even though the file stays.
	st, _, resp := do(t, newReq(t, "POST", base+"/tasks", `{"to":"A-X","content":{"title":"one"}}`))
	if body := text(resp); st != 202 || body != `{"task_id":"T-1","status":"queued"}` || calls.Load() != 1 {
		t.Fatalf("first call: %d %s, hub saw %d", st, body, calls.Load())
	}
	// The sender keeps trying to delete it, and never sends it again.
	deadline := time.Now().Add(5 * time.Second)
	for removes.Load() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the removal was not retried: %d tries", removes.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the hub saw the answered call %d times", n)
	}
	// It does not block the calls behind it.
	st, _, resp = do(t, newReq(t, "POST", base+"/tasks", `{"to":"A-X","content":{"title":"two"}}`))
	if body := text(resp); st != 202 || body != `{"task_id":"T-2","status":"queued"}` || calls.Load() != 2 {
		t.Fatalf("second call: %d %s, hub saw %d", st, body, calls.Load())
	}
	if !strings.Contains(logs.String(), "answered but not removed") {
		t.Errorf("the failed removal was not logged:\n%s", logs)
	}
	// Once the disk obliges, both files go.
	refuse.Store(false)
	deadline = time.Now().Add(5 * time.Second)
	for {
		entries, _ := os.ReadDir(b.out.dir)
		if len(entries) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the outbox still holds %v", entries)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if n := calls.Load(); n != 2 {
		t.Fatalf("the hub saw %d calls, want 2", n)
	}
}

func TestSpoolIDClash(t *testing.T) {
	b, base, logs := hardBox(t, "http://127.0.0.1:1", nil)
	// What a case-insensitive disk shows when T-a arrives after T-A.
	other := record{TaskID: "T-A", ReceivedAt: "2026-11-30T22:51:38Z", Attempt: 1}.encode([]byte(`{"task_id":"T-A"}`))
	path := filepath.Join(b.Home, "spool", "T-a.json")
	if err := os.WriteFile(path, other, 0o600); err != nil {
		t.Fatal(err)
	}
	st, code, _ := do(t, signedDelivery(t, base, "T-a"))
	if st != 503 || code != "SPOOL_UNAVAILABLE" {
		t.Fatalf("a letter whose file holds another id: %d %s, want 503 SPOOL_UNAVAILABLE", st, code)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, other) {
		t.Fatalf("the other letter's file changed:\n%s", got)
	}
	if !strings.Contains(logs.String(), "case-insensitive") {
		t.Errorf("the clash was not logged:\n%s", logs)
	}
	// The letter whose id the file holds is answered as usual: a duplicate
	// on a case-insensitive disk, a new letter here.
	if st, code, _ := do(t, signedDelivery(t, base, "T-A")); st != 200 {
		t.Fatalf("T-A: %d %s", st, code)
	}
}

func TestDeliverBusy(t *testing.T) {
	b, base, _ := hardBox(t, "http://127.0.0.1:1", nil)
	addr := strings.TrimPrefix(base, "http://")
	// maxDeliveries senders that sent their headers and half a body.
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range maxDeliveries {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		req := signedDelivery(t, base, "T-slow"+strconv.Itoa(i))
		fmt.Fprintf(c, "POST /kizuna/deliver HTTP/1.1\r\nHost: %s\r\nContent-Length: 100000\r\n", addr)
		for _, k := range []string{"X-Kizuna-Task-Id", "X-Kizuna-Timestamp", "X-Kizuna-Signature"} {
			fmt.Fprintf(c, "%s: %s\r\n", k, req.Header.Get(k))
		}
		fmt.Fprint(c, "\r\n{\"task_id\":")
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(b.deliveries) < maxDeliveries {
		if time.Now().After(deadline) {
			t.Fatalf("only %d deliveries in progress", len(b.deliveries))
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, code, resp := do(t, signedDelivery(t, base, "T-late"))
	if st != 503 || code != "BOX_BUSY" || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("delivery over the bound: %d %s Retry-After %q", st, code, resp.Header.Get("Retry-After"))
	}
	// A stranger is still turned away by the signature check first.
	if st, code, _ := do(t, newReq(t, "POST", base+"/kizuna/deliver", "{}")); st != 401 {
		t.Fatalf("unsigned delivery: %d %s", st, code)
	}
	// The slow senders give up; their slots come back.
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	deadline = time.Now().Add(5 * time.Second)
	for len(b.deliveries) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d slots still taken", len(b.deliveries))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st, code, _ := do(t, signedDelivery(t, base, "T-late")); st != 200 {
		t.Fatalf("delivery once the slots are free: %d %s", st, code)
	}
}

func TestConsoleOrJournal(t *testing.T) {
	t.Setenv("JOURNAL_STREAM", "")
	if consoleOrJournal(&bytes.Buffer{}) {
		t.Error("a buffer counted as a console")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if consoleOrJournal(f) {
		t.Error("a regular file (the scripts' stderr.log) counted as a console")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if consoleOrJournal(w) {
		t.Error("a pipe counted as a console")
	}
	if dev, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0); err == nil {
		defer dev.Close()
		if !consoleOrJournal(dev) {
			t.Error("a character device did not count as a console")
		}
	}
	t.Setenv("JOURNAL_STREAM", "8:12345")
	if !consoleOrJournal(f) || !consoleOrJournal(&bytes.Buffer{}) {
		t.Error("under systemd (JOURNAL_STREAM) the lines must go to the journal")
	}
}
