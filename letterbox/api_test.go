package letterbox_test

import (
	"bytes"
	"encoding/json"
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

	"github.com/dojo-relay/dojo/letterbox"
)

// hubCall is one request a fake hub saw.
type hubCall struct {
	Method, Path, Auth, Body string
	At                       time.Time
}

// fakeHub is a real HTTP server standing in for the hub: it records every
// call, answers 503 to the next `fail` ones and `status`/`body` to the rest.
type fakeHub struct {
	mu       sync.Mutex
	all      []hubCall
	accepted []hubCall
	fail     atomic.Int32
	status   int
	body     string
	// beats makes heartbeats count like other calls; otherwise they are
	// answered 200 and not recorded.
	beats bool
}

func (h *fakeHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if r.URL.Path == "/api/v1/heartbeat" && !h.beats {
		io.WriteString(w, `{"ok":true}`)
		return
	}
	c := hubCall{r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), string(b), time.Now()}
	h.mu.Lock()
	h.all = append(h.all, c)
	h.mu.Unlock()
	if h.fail.Add(-1) >= 0 {
		w.Header().Set("Retry-After", "0")
		http.Error(w, `{"error":{"code":"SERVICE_UNAVAILABLE","message":"down"}}`, http.StatusServiceUnavailable)
		return
	}
	h.fail.Store(0)
	h.mu.Lock()
	h.accepted = append(h.accepted, c)
	status, body := h.status, h.body
	h.mu.Unlock()
	if status == 0 {
		status, body = http.StatusAccepted, `{"state":"completed","category":"terminal","relayed":true}`
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Hub", "fake")
	w.WriteHeader(status)
	io.WriteString(w, body)
}

func (h *fakeHub) calls() (all, accepted []hubCall) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hubCall(nil), h.all...), append([]hubCall(nil), h.accepted...)
}

// local makes a loopback API call.
func local(t *testing.T, method, url, body string, header ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
		} else {
			req.Header.Set(header[i], header[i+1])
		}
	}
	return do(t, req)
}

func errCode(b []byte) string {
	var e struct{ Error struct{ Code string } }
	json.Unmarshal(b, &e)
	return e.Error.Code
}

func TestLoopbackAPI(t *testing.T) {
	r := startBox(t, "", "http://127.0.0.1:1", nil)
	for _, id := range []string{"T-b", "T-a"} {
		if status, b := deliver(t, r.url, id, letterBody(id), time.Now().Unix(), ""); status != 200 {
			t.Fatalf("deliver %s: %d %s", id, status, b)
		}
		time.Sleep(30 * time.Millisecond) // distinct arrival times
	}

	status, b := local(t, "GET", r.url+"/healthz", "")
	var h struct {
		OK      bool   `json:"ok"`
		AgentID string `json:"agent_id"`
		Spool   int    `json:"spool"`
		Uptime  *int64 `json:"uptime_s"`
	}
	if json.Unmarshal(b, &h); status != 200 || !h.OK || h.AgentID != "A-7K3P" || h.Spool != 2 || h.Uptime == nil {
		t.Fatalf("healthz %d %s", status, b)
	}

	type rec struct {
		State      string          `json:"state"`
		TaskID     string          `json:"task_id"`
		ReceivedAt string          `json:"received_at"`
		Attempt    int             `json:"attempt"`
		Letter     json.RawMessage `json:"letter"`
	}
	status, b = local(t, "GET", r.url+"/tasks/pending", "")
	var list struct {
		Items []rec `json:"items"`
		Total int   `json:"total"`
	}
	if err := json.Unmarshal(b, &list); err != nil || status != 200 || list.Total != 2 || len(list.Items) != 2 {
		t.Fatalf("pending %d %s", status, b)
	}
	if list.Items[0].TaskID != "T-b" || list.Items[1].TaskID != "T-a" || list.Items[0].State != "pending" {
		t.Fatalf("pending not oldest first: %s", b)
	}
	if !bytes.Equal(list.Items[1].Letter, letterBody("T-a")) {
		t.Fatalf("letter changed on the way: %s", list.Items[1].Letter)
	}
	if status, b = local(t, "GET", r.url+"/tasks/pending?limit=1&offset=1", ""); status != 200 || !bytes.Contains(b, []byte(`"total":2`)) || bytes.Contains(b, []byte(`"T-b"`)) {
		t.Fatalf("page 2: %d %s", status, b)
	}
	if status, b = local(t, "GET", r.url+"/tasks/pending?limit=0", ""); status != 400 {
		t.Fatalf("limit=0: %d %s", status, b)
	}

	status, b = local(t, "GET", r.url+"/tasks/T-a", "")
	var one rec
	if json.Unmarshal(b, &one); status != 200 || one.State != "pending" || one.TaskID != "T-a" || one.Attempt != 1 {
		t.Fatalf("get T-a: %d %s", status, b)
	}
	if status, b = local(t, "GET", r.url+"/tasks/T-none", ""); status != 404 || errCode(b) != "TASK_NOT_FOUND" {
		t.Fatalf("get unknown: %d %s", status, b)
	}
	if status, b = local(t, "GET", r.url+"/tasks/..%2Fconfig", ""); status != 400 {
		t.Fatalf("get ../config: %d %s", status, b)
	}

	for range 2 { // completing twice is fine
		if status, b = local(t, "POST", r.url+"/tasks/T-a/complete", ""); status != 200 || !bytes.Contains(b, []byte(`"state":"done"`)) {
			t.Fatalf("complete: %d %s", status, b)
		}
	}
	if status, b = local(t, "POST", r.url+"/tasks/T-none/complete", ""); status != 404 || errCode(b) != "TASK_NOT_FOUND" {
		t.Fatalf("complete unknown: %d %s", status, b)
	}
	status, b = local(t, "GET", r.url+"/tasks/T-a", "")
	if json.Unmarshal(b, &one); status != 200 || one.State != "done" {
		t.Fatalf("get done T-a: %d %s", status, b)
	}
	if _, err := os.Stat(filepath.Join(r.home, "spool", "done", "T-a.json")); err != nil {
		t.Fatalf("T-a not in spool/done: %v", err)
	}
	if status, b = local(t, "GET", r.url+"/tasks/pending", ""); !bytes.Contains(b, []byte(`"total":1`)) {
		t.Fatalf("pending after complete: %d %s", status, b)
	}
	// A redelivery of a handled letter is ACKed, not spooled again.
	if status, b = deliver(t, r.url, "T-a", letterBody("T-a"), time.Now().Unix(), ""); status != 200 || !strings.Contains(string(b), one.ReceivedAt) {
		t.Fatalf("redeliver done: %d %s", status, b)
	}
	if got := spoolFiles(t, r.home); len(got) != 2 {
		t.Fatalf("spool after redelivering a done letter: %v", got)
	}

	if status, b = local(t, "GET", r.url+"/nowhere", ""); status != 404 {
		t.Fatalf("unknown route: %d %s", status, b)
	}
	if status, b = local(t, "GET", r.url+"/healthz", "", "Origin", "https://evil.example"); status != 403 || errCode(b) != "FORBIDDEN" {
		t.Fatalf("browser call: %d %s", status, b)
	}
	if status, b = local(t, "GET", r.url+"/healthz", "", "Host", "evil.example:7788"); status != 403 {
		t.Fatalf("rebound host: %d %s", status, b)
	}
	if status, b = local(t, "GET", r.url+"/healthz", "", "Host", "localhost:7788"); status != 200 {
		t.Fatalf("localhost host: %d %s", status, b)
	}
	big := `{"to":"A-9X2M","content":{"body":"` + strings.Repeat("x", 1<<20) + `"}}`
	if status, b = local(t, "POST", r.url+"/tasks", big); status != 413 {
		t.Fatalf("oversized send: %d %s", status, b)
	}
	if status, b = local(t, "POST", r.url+"/tasks/T-a/result", `["completed"]`); status != 400 {
		t.Fatalf("non-object result: %d %s", status, b)
	}
}

func TestLoopbackForbiddenFromAnotherAddress(t *testing.T) {
	b := &letterbox.Box{Home: t.TempDir(), Log: quietLog(),
		Config: letterbox.Config{HubURL: "http://127.0.0.1:1", AgentID: "A-7K3P", AgentToken: "tok", EndpointSecret: secret}}
	h, err := b.Handler()
	if err != nil {
		t.Fatal(err)
	}
	routes := []struct{ method, path string }{
		{"GET", "/healthz"}, {"GET", "/tasks/pending"}, {"GET", "/tasks/T-1"},
		{"POST", "/tasks/T-1/complete"}, {"POST", "/tasks/T-1/result"}, {"POST", "/tasks"}, {"GET", "/other"},
	}
	for _, remote := range []string{"192.0.2.7:5555", "[2001:db8::1]:5555", "10.0.0.1:80"} {
		for _, rt := range routes {
			req := httptest.NewRequest(rt.method, "http://127.0.0.1:7788"+rt.path, strings.NewReader(`{"state":"completed"}`))
			req.RemoteAddr = remote
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != 403 || errCode(w.Body.Bytes()) != "FORBIDDEN" {
				t.Fatalf("%s %s from %s: %d %s", rt.method, rt.path, remote, w.Code, w.Body)
			}
		}
	}
	// The delivery path takes letters from anywhere.
	body := letterBody("T-remote")
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req := httptest.NewRequest("POST", "http://box.example:7788/kizuna/deliver", bytes.NewReader(body))
	req.RemoteAddr = "192.0.2.7:5555"
	req.Header.Set("X-Kizuna-Task-Id", "T-remote")
	req.Header.Set("X-Kizuna-Timestamp", ts)
	req.Header.Set("X-Kizuna-Signature", hubSign(secret, ts, body))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != 200 {
		t.Fatalf("deliver from a remote address: %d %s", w.Code, w.Body)
	}
	if entries, _ := os.ReadDir(filepath.Join(b.Home, "outbox")); len(entries) != 0 {
		t.Fatalf("a forbidden call reached the outbox: %v", entries)
	}

	// The same over a real socket, when this machine has a non-loopback
	// address to listen on.
	ip := nonLoopbackIP()
	if ip == "" {
		t.Log("no non-loopback interface address here; the socket check was not run")
		return
	}
	r := startBoxOn(t, net.JoinHostPort(ip, "0"))
	status, got := local(t, "GET", r.url+"/healthz", "", "Host", "127.0.0.1:7788")
	if status != 403 || errCode(got) != "FORBIDDEN" {
		t.Fatalf("healthz over %s: %d %s", ip, status, got)
	}
	if status, got = deliver(t, r.url, "T-net", letterBody("T-net"), time.Now().Unix(), ""); status != 200 {
		t.Fatalf("deliver over %s: %d %s", ip, status, got)
	}
}

func nonLoopbackIP() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

func startBoxOn(t *testing.T, addr string) *running {
	t.Helper()
	home := t.TempDir()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	return startBoxAt(t, home, "http://127.0.0.1:1", ln.Addr().String(), nil)
}

// startBoxAt is startBox on a given address (a restarted box keeps its).
func startBoxAt(t *testing.T, home, hub, addr string, tune func(*letterbox.Box)) *running {
	t.Helper()
	var ln net.Listener
	var err error
	for try := 0; try < 50; try++ {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	return startBox(t, home, hub, func(b *letterbox.Box) {
		b.Config.Listen = addr
		if tune != nil {
			tune(b)
		}
	})
}

func TestForwardToHub(t *testing.T) {
	hub := &fakeHub{}
	srv := httptest.NewServer(hub)
	defer srv.Close()
	var logs letterbox.LogBuffer
	r := startBox(t, "", srv.URL, func(b *letterbox.Box) {
		b.Log = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		b.Config.HubURL += "/"
	})

	result := `{"state":"completed", "message":"built","result":{"n": 1.50}}`
	status, b := local(t, "POST", r.url+"/tasks/T-0001/result", result)
	if status != 202 || string(b) != `{"state":"completed","category":"terminal","relayed":true}` {
		t.Fatalf("result: %d %s", status, b)
	}
	_, acc := hub.calls()
	if len(acc) != 1 || acc[0].Method != "POST" || acc[0].Path != "/api/v1/tasks/T-0001/result" ||
		acc[0].Auth != "Bearer kf_live_agent_token" || acc[0].Body != result {
		t.Fatalf("hub saw %+v", acc)
	}

	// A refusal comes back verbatim and leaves the outbox.
	hub.mu.Lock()
	hub.status, hub.body = 404, `{"error":{"code":"AGENT_NOT_FOUND","message":"no A-NONE"}}`
	hub.mu.Unlock()
	status, b = local(t, "POST", r.url+"/tasks", `{"to":"A-NONE","content":{"title":"hi","body":"x"}}`)
	if status != 404 || errCode(b) != "AGENT_NOT_FOUND" {
		t.Fatalf("send: %d %s", status, b)
	}
	_, acc = hub.calls()
	if len(acc) != 2 || acc[1].Path != "/api/v1/tasks" {
		t.Fatalf("hub saw %+v", acc)
	}

	// A 503 is retried while the agent waits.
	hub.mu.Lock()
	hub.status, hub.body = 202, `{"task_id":"T-new","status":"queued"}`
	hub.mu.Unlock()
	hub.fail.Store(2)
	status, b = local(t, "POST", r.url+"/tasks", `{"to":"A-9X2M","content":{"title":"hi","body":"x"}}`)
	if status != 202 || string(b) != `{"task_id":"T-new","status":"queued"}` {
		t.Fatalf("send through 503s: %d %s", status, b)
	}
	all, acc := hub.calls()
	if len(acc) != 3 || len(all) != 5 {
		t.Fatalf("hub saw %d calls, accepted %d; want 5 and 3", len(all), len(acc))
	}
	waitOutboxEmpty(t, r.home)
	r.stop()
	got := logs.String()
	if !strings.Contains(got, "AGENT_NOT_FOUND") || !strings.Contains(got, `"level":"WARN"`) {
		t.Errorf("the hub's refusal was not logged at warn with its code:\n%s", got)
	}
	if strings.Contains(got, "kf_live_agent_token") || strings.Contains(got, secret) {
		t.Errorf("the log holds a secret:\n%s", got)
	}
}

func outboxItems(home string) []string {
	entries, _ := os.ReadDir(filepath.Join(home, "outbox"))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func waitOutboxEmpty(t *testing.T, home string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(outboxItems(home)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("outbox still holds %v", outboxItems(home))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestOutboxSurvivesRestart(t *testing.T) {
	// The hub's address is known but nothing listens there yet.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hubAddr := ln.Addr().String()
	ln.Close()
	home := t.TempDir()
	short := func(b *letterbox.Box) { b.ForwardWait = 200 * time.Millisecond }
	r1 := startBox(t, home, "http://"+hubAddr, short)

	bodies := []string{
		`{"state":"working"}`,
		`{"to":"A-9X2M","content":{"title":"one","body":"1"}}`,
		`{"state":"completed","result":{"ok":true}}`,
	}
	paths := []string{"/tasks/T-0001/result", "/tasks", "/tasks/T-0001/result"}
	var ids []string
	for i := range bodies {
		status, b := local(t, "POST", r1.url+paths[i], bodies[i])
		var q struct {
			OutboxID string `json:"outbox_id"`
		}
		json.Unmarshal(b, &q)
		if status != 202 || !strings.Contains(string(b), `"status":"queued"`) || len(q.OutboxID) != 20 {
			t.Fatalf("call %d with the hub down: %d %s", i, status, b)
		}
		ids = append(ids, q.OutboxID)
	}
	if got := outboxItems(home); len(got) != 3 || got[0] != ids[0]+".json" || got[2] != ids[2]+".json" {
		t.Fatalf("outbox %v, ids %v", got, ids)
	}
	r1.stop()

	hub := &fakeHub{}
	hub.fail.Store(1) // the first call after the restart meets a 503
	var hln net.Listener
	for try := 0; try < 50; try++ {
		if hln, err = net.Listen("tcp", hubAddr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("hub address %s not reusable: %v", hubAddr, err)
	}
	srv := &http.Server{Handler: hub}
	go srv.Serve(hln)
	defer srv.Close()

	r2 := startBox(t, home, "http://"+hubAddr, short)
	waitOutboxEmpty(t, home)
	time.Sleep(100 * time.Millisecond) // room for a wrong extra call
	all, acc := hub.calls()
	if len(acc) != 3 || len(all) != 4 {
		t.Fatalf("hub saw %d calls, accepted %d: %+v", len(all), len(acc), all)
	}
	want := []string{"/api/v1/tasks/T-0001/result", "/api/v1/tasks", "/api/v1/tasks/T-0001/result"}
	for i, c := range acc {
		if c.Path != want[i] || c.Body != bodies[i] || c.Auth != "Bearer kf_live_agent_token" {
			t.Fatalf("call %d: %+v, want %s %s", i, c, want[i], bodies[i])
		}
	}
	// A new call after the restart does not reuse an old id.
	status, b := local(t, "POST", r2.url+"/tasks", bodies[1])
	if status != 202 || strings.Contains(string(b), "queued") {
		t.Fatalf("call after restart: %d %s", status, b)
	}
}

func TestOutboxFull(t *testing.T) {
	home := t.TempDir()
	dir := filepath.Join(home, "outbox")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= letterbox.MaxOutbox; i++ {
		name := filepath.Join(dir, fmt.Sprintf("%020d.json", i))
		if err := os.WriteFile(name, []byte(`{"method":"POST","path":"/api/v1/heartbeat","queued_at":"2026-01-01T00:00:00Z","body":{}}`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := startBox(t, home, "http://127.0.0.1:1", nil)
	status, b := local(t, "POST", r.url+"/tasks", `{"to":"A-9X2M","content":{"title":"x","body":"y"}}`)
	if status != 503 || errCode(b) != "OUTBOX_FULL" {
		t.Fatalf("full outbox: %d %s", status, b)
	}
}

func TestHeartbeatBackoff(t *testing.T) {
	hub := &fakeHub{status: 200, body: `{"ok":true}`, beats: true}
	hub.fail.Store(3)
	srv := httptest.NewServer(hub)
	defer srv.Close()
	const every = 100 * time.Millisecond
	startBox(t, "", srv.URL, func(b *letterbox.Box) {
		b.HeartbeatEvery = every
		b.HeartbeatMax = 4 * every
	})
	deadline := time.Now().Add(10 * time.Second)
	var all []hubCall
	for len(all) < 6 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		all, _ = hub.calls()
	}
	if len(all) < 6 {
		t.Fatalf("only %d heartbeats", len(all))
	}
	for _, c := range all {
		if c.Method != "POST" || c.Path != "/api/v1/heartbeat" || c.Auth != "Bearer kf_live_agent_token" || c.Body != "{}" {
			t.Fatalf("heartbeat %+v", c)
		}
	}
	gap := func(i int) time.Duration { return all[i].At.Sub(all[i-1].At) }
	// Calls 1-3 fail: the gaps after them double (200 ms, 400 ms) and stop
	// at the 400 ms cap; call 4 succeeds and the next comes after 100 ms.
	slack := 15 * time.Millisecond
	for i, min := range []time.Duration{2 * every, 4 * every, 4 * every} {
		if g := gap(i + 1); g < min-slack {
			t.Errorf("gap after failure %d is %v, want at least %v", i+1, g, min)
		}
	}
	if g := gap(4); g < every-slack || g >= 3*every {
		t.Errorf("gap after the recovery is %v, want about %v", g, every)
	}
	if g := gap(3); g >= 7*every {
		t.Errorf("gap after failure 3 is %v, want it capped at %v, not doubled to %v", g, 4*every, 8*every)
	}
}

// do sends req and returns the status and body.
func do(t testing.TB, req *http.Request) (int, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
