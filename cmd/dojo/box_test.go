package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
)

// Process tests of the letterbox against a real hub: `dojo serve` and
// `dojo box run` are both this test binary (see TestMain), so the whole
// path — hub, signed delivery, spool, loopback API, outbox — runs as it
// does in production, race detector included.

// boxScale makes the delivery ladder's gaps 180 ms, 600 ms, 1.8 s, 3.6 s
// and 7.2 s: all six attempts fit in about 14 s.
const boxScale = "0.001"

// hubAgent is an agent registered at the hub, with its box's address.
type hubAgent struct {
	id, token, secret string
	addr              string // the box's listen address, 127.0.0.1:port
}

// registerAgent registers an agent with the admin token whose webhook is
// a box on a free loopback port.
func registerAgent(t *testing.T, base, name string) hubAgent {
	t.Helper()
	addr := freeAddr(t)
	st, r, err := hubCall(base, http.MethodPost, "/api/v1/agents", kzAdminToken, map[string]any{
		"name": name, "capabilities": "answers letters", "capability_tags": []string{"box"}, "webhook_url": "http://" + addr})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("register %s: %d %v %v", name, st, r, err)
	}
	return hubAgent{id: r["agent_id"].(string), token: r["agent_token"].(string), secret: r["endpoint_secret"].(string), addr: addr}
}

// boxHome writes ag's config.json by hand, as an owner may, and returns
// the box's home directory.
func boxHome(t *testing.T, hub string, ag hubAgent) string {
	t.Helper()
	home := filepath.Join(t.TempDir(), "box-"+ag.id)
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]string{"hub_url": hub, "agent_id": ag.id, "agent_token": ag.token,
		"endpoint_secret": ag.secret, "listen": ag.addr})
	if err := os.WriteFile(filepath.Join(home, "config.json"), cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	return home
}

// boxProc is one `dojo box run` process.
type boxProc struct {
	cmd  *exec.Cmd
	home string
	addr string
	out  *kungfutest.Buffer
	done chan struct{}
	err  error // valid once done is closed
}

// startBox runs `dojo box run --home home` and waits until it answers
// /healthz on addr.
func startBox(t *testing.T, home, addr string, env map[string]string) *boxProc {
	t.Helper()
	e := map[string]string{"DOJO_BOX_HEARTBEAT": "1h"}
	for k, v := range env {
		e[k] = v
	}
	cmd := command(t, e, "box", "run", "--home", home)
	b := &boxProc{cmd: cmd, home: home, addr: addr, out: &kungfutest.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = b.out, b.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { b.err = cmd.Wait(); close(b.done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-b.done })
	end := time.Now().Add(20 * time.Second)
	for {
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return b
			}
		}
		select {
		case <-b.done:
			t.Fatalf("dojo box run exited before it was healthy (%v): %s", b.err, b.out.String())
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("dojo box run did not answer /healthz on %s: %s", addr, b.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exitCode waits for the box to exit and returns its status.
func (b *boxProc) exitCode(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(within):
		t.Fatalf("dojo box run did not exit within %v: %s", within, b.out.String())
	}
	var ee *exec.ExitError
	if errors.As(b.err, &ee) {
		return ee.ExitCode()
	}
	if b.err != nil {
		t.Fatalf("dojo box run: %v", b.err)
	}
	return 0
}

// local calls a box's loopback API.
func local(t *testing.T, addr, method, path string, body any) (int, map[string]any) {
	t.Helper()
	st, r, err := hubCall("http://"+addr, method, path, "", body)
	if err != nil {
		t.Fatalf("%s %s on the box at %s: %v", method, path, addr, err)
	}
	return st, r
}

// pendingLetters is a box's /tasks/pending, by task id.
func pendingLetters(t *testing.T, addr string) map[string]map[string]any {
	t.Helper()
	st, r := local(t, addr, http.MethodGet, "/tasks/pending?limit=1000", nil)
	if st != http.StatusOK {
		t.Fatalf("GET /tasks/pending: %d %v", st, r)
	}
	items, _ := r["items"].([]any)
	out := map[string]map[string]any{}
	for _, it := range items {
		rec, _ := it.(map[string]any)
		id, _ := rec["task_id"].(string)
		out[id] = rec
	}
	return out
}

// letterOf is the letter a spool record holds.
func letterOf(rec map[string]any) map[string]any {
	l, _ := rec["letter"].(map[string]any)
	return l
}

// spoolCount is how many files a box holds for id, pending or done, and
// how many spool files it holds in all.
func spoolCount(t *testing.T, home, id string) (forID, all int) {
	t.Helper()
	for _, dir := range []string{filepath.Join(home, "spool"), filepath.Join(home, "spool", "done")} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.IsDir() {
				continue
			}
			all++
			if e.Name() == id+".json" {
				forID++
			}
		}
	}
	return forID, all
}

// outboxCount is how many calls wait in a box's outbox.
func outboxCount(t *testing.T, home string) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(home, "outbox"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".json") && len(e.Name()) == len("00000000000000000001.json") {
			n++
		}
	}
	return n
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what func() string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(within)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("after %v: %s", within, what())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// taskView is the hub's GET /api/v1/tasks/{id} as token.
func taskView(t *testing.T, base, token, id string) map[string]any {
	t.Helper()
	st, r, err := hubCall(base, http.MethodGet, "/api/v1/tasks/"+id, token, nil)
	if err != nil || st != http.StatusOK {
		t.Fatalf("GET /api/v1/tasks/%s: %d %v %v", id, st, r, err)
	}
	return r
}

// auditOutcomes are the admin audit's outcomes for id.
func auditOutcomes(t *testing.T, base, id string) []string {
	t.Helper()
	st, r, err := hubCall(base, http.MethodGet, "/api/v1/audit?task_id="+id, kzAdminToken, nil)
	if err != nil || st != http.StatusOK {
		t.Fatalf("GET /api/v1/audit: %d %v %v", st, r, err)
	}
	var out []string
	items, _ := r["items"].([]any)
	for _, it := range items {
		row, _ := it.(map[string]any)
		if row["task_id"] == id {
			o, _ := row["outcome"].(string)
			out = append(out, o)
		}
	}
	return out
}

// resultStates is the hub's result history of id, oldest first, as token.
func resultStates(t *testing.T, base, token, id string) []string {
	t.Helper()
	st, r, err := hubCall(base, http.MethodGet, "/api/v1/tasks/"+id+"/result", token, nil)
	if err != nil || st != http.StatusOK {
		t.Fatalf("GET /api/v1/tasks/%s/result: %d %v %v", id, st, r, err)
	}
	var out []string
	items, _ := r["items"].([]any)
	for _, it := range items {
		v, _ := it.(map[string]any)
		s, _ := v["state"].(string)
		out = append(out, s)
	}
	return out
}

// sendVia sends a letter straight to the hub with from's token.
func sendVia(t *testing.T, base string, from hubAgent, to string, n int) string {
	t.Helper()
	st, r, err := hubCall(base, http.MethodPost, "/api/v1/tasks", from.token, map[string]any{
		"to": to, "content": map[string]any{"title": "letter", "body": fmt.Sprintf("letter number %d", n)}})
	id, _ := r["task_id"].(string)
	if err != nil || st != http.StatusAccepted || !strings.HasPrefix(id, "T-") {
		t.Fatalf("send %d: %d %v %v", n, st, r, err)
	}
	return id
}

// replies are the reply letters to id in a box's pending list.
func replies(t *testing.T, addr, id string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, rec := range pendingLetters(t, addr) {
		if l := letterOf(rec); l["kind"] == "kizuna.task-result" && l["reply_to"] == id {
			out = append(out, rec)
		}
	}
	return out
}

// TestBoxRoundTrip: A's agent sends B a letter through A's box; B's box
// spools it, B's agent reports working and completed through B's box, and
// the reply letter lands in A's box. The hub's history and audit agree.
func TestBoxRoundTrip(t *testing.T) {
	t.Parallel()
	env := kizunaEnv(kungfutest.DatabaseURL(t), kungfutest.RedisPrefix(t), kungfutest.Queue(t), boxScale)
	s := startServe(t, env())
	a, b := registerAgent(t, s.base, "BoxRoundA"), registerAgent(t, s.base, "BoxRoundB")
	boxA := startBox(t, boxHome(t, s.base, a), a.addr, nil)
	boxB := startBox(t, boxHome(t, s.base, b), b.addr, nil)

	st, r := local(t, a.addr, http.MethodPost, "/tasks", map[string]any{
		"to": b.id, "content": map[string]any{"title": "Nightly build", "body": "build main at 02:00"}})
	id, _ := r["task_id"].(string)
	if st != http.StatusAccepted || r["status"] != "queued" || !strings.HasPrefix(id, "T-") {
		t.Fatalf("POST /tasks through A's box: %d %v", st, r)
	}

	var rec map[string]any
	waitFor(t, 20*time.Second, func() string { return "B's box never listed the letter: " + boxB.out.String() }, func() bool {
		rec = pendingLetters(t, b.addr)[id]
		return rec != nil
	})
	l := letterOf(rec)
	if rec["state"] != "pending" || l["from"] != a.id || l["to"] != b.id || l["kind"] != "kizuna.task" || l["reply_to"] != nil {
		t.Fatalf("B's spool record: %v", rec)
	}
	if c, _ := l["content"].(map[string]any); c["title"] != "Nightly build" {
		t.Fatalf("letter content: %v", l["content"])
	}

	st, r = local(t, b.addr, http.MethodPost, "/tasks/"+id+"/result", map[string]any{"state": "working", "message": "on it"})
	if st != http.StatusAccepted || r["state"] != "working" || r["category"] != "in_progress" {
		t.Fatalf("working through B's box: %d %v", st, r)
	}
	st, r = local(t, b.addr, http.MethodPost, "/tasks/"+id+"/result", map[string]any{
		"state": "completed", "message": "built", "result": map[string]any{"artifact": "build-812.tar.gz"}})
	if st != http.StatusAccepted || r["state"] != "completed" || r["relayed"] != true {
		t.Fatalf("completed through B's box: %d %v", st, r)
	}
	if st, r = local(t, b.addr, http.MethodPost, "/tasks/"+id+"/complete", nil); st != http.StatusOK || r["state"] != "done" {
		t.Fatalf("complete on B's box: %d %v", st, r)
	}
	if n, all := spoolCount(t, boxB.home, id); n != 1 || all != 1 {
		t.Fatalf("B's spool: %d files for the letter, %d in all", n, all)
	}
	if _, err := os.Stat(filepath.Join(boxB.home, "spool", "done", id+".json")); err != nil {
		t.Fatalf("the completed letter is not in spool/done: %v", err)
	}

	var reply []map[string]any
	waitFor(t, 20*time.Second, func() string { return "A's box never got the reply letter: " + boxA.out.String() }, func() bool {
		reply = replies(t, a.addr, id)
		return len(reply) > 0
	})
	rl := letterOf(reply[0])
	replyID, _ := rl["task_id"].(string)
	c, _ := rl["content"].(map[string]any)
	body, _ := c["body"].(map[string]any)
	res, _ := body["result"].(map[string]any)
	if len(reply) != 1 || rl["from"] != b.id || rl["to"] != a.id || body["state"] != "completed" || res["artifact"] != "build-812.tar.gz" {
		t.Fatalf("reply letters in A's box: %v", reply)
	}

	if got := resultStates(t, s.base, a.token, id); strings.Join(got, ",") != "working,completed" {
		t.Fatalf("the hub's result history: %v, want working then completed", got)
	}
	for _, lid := range []string{id, replyID} {
		waitFor(t, 10*time.Second, func() string { return lid + " has no acked audit row" }, func() bool {
			return strings.Join(auditOutcomes(t, s.base, lid), ",") == "acked"
		})
	}
	stopAll(t, []*server{s}, boxA, boxB)
}

// TestBoxCrashAfterSpool: B's box dies after the letter is durable and
// before the ACK. The hub counts a failed attempt, the restarted box gets
// the redelivery and ACKs it from the spool: one file, ACKed once.
func TestBoxCrashAfterSpool(t *testing.T) {
	t.Parallel()
	env := kizunaEnv(kungfutest.DatabaseURL(t), kungfutest.RedisPrefix(t), kungfutest.Queue(t), boxScale)
	s := startServe(t, env())
	a, b := registerAgent(t, s.base, "BoxCrashA"), registerAgent(t, s.base, "BoxCrashB")
	home := boxHome(t, s.base, b)
	first := startBox(t, home, b.addr, map[string]string{"DOJO_BOX_FAILPOINT": "exit-after-spool"})

	id := sendVia(t, s.base, a, b.id, 1)
	if code := first.exitCode(t, 20*time.Second); code != 3 {
		t.Fatalf("the box exited %d, want 3 from the failpoint: %s", code, first.out.String())
	}
	raw, err := os.ReadFile(filepath.Join(home, "spool", id+".json"))
	if err != nil {
		t.Fatalf("the letter is not in the spool after the crash: %v", err)
	}
	var before struct {
		ReceivedAt string `json:"received_at"`
	}
	if err := json.Unmarshal(raw, &before); err != nil || before.ReceivedAt == "" {
		t.Fatalf("spool record: %s %v", raw, err)
	}
	if v := taskView(t, s.base, a.token, id); v["outcome"] != nil {
		t.Fatalf("the hub settled the letter without an ACK: %v", v)
	}

	second := startBox(t, home, b.addr, nil)
	var view map[string]any
	waitFor(t, 25*time.Second, func() string { return fmt.Sprintf("not acked after the restart: %v\n%s", view, second.out.String()) }, func() bool {
		view = taskView(t, s.base, a.token, id)
		return view["outcome"] == "acked"
	})
	attempts, _ := view["attempts"].([]any)
	if len(attempts) < 2 {
		t.Fatalf("attempts: %v, want the failed first one and the ACKed redelivery", attempts)
	}
	if first, _ := attempts[0].(map[string]any); first["status"] != nil {
		t.Fatalf("the first attempt got an answer (%v); the failpoint should drop the connection", first)
	}
	if last, _ := attempts[len(attempts)-1].(map[string]any); last["status"] != float64(200) {
		t.Fatalf("the last attempt: %v", last)
	}
	if n, all := spoolCount(t, home, id); n != 1 || all != 1 {
		t.Fatalf("B's spool: %d files for the letter, %d in all", n, all)
	}
	_, r := local(t, b.addr, http.MethodGet, "/tasks/"+id, nil)
	if r["received_at"] != before.ReceivedAt || r["state"] != "pending" {
		t.Fatalf("the record after the redelivery: %v, want received_at %s", r, before.ReceivedAt)
	}
	if got := auditOutcomes(t, s.base, id); strings.Join(got, ",") != "acked" {
		t.Fatalf("audit: %v", got)
	}
	stopAll(t, []*server{s}, second)
}

// TestBoxDownThenBack: letters sent while B's box is down climb the
// ladder; once the box starts, every one is ACKed and spooled once.
func TestBoxDownThenBack(t *testing.T) {
	t.Parallel()
	env := kizunaEnv(kungfutest.DatabaseURL(t), kungfutest.RedisPrefix(t), kungfutest.Queue(t), boxScale)
	s := startServe(t, env())
	a, b := registerAgent(t, s.base, "BoxDownA"), registerAgent(t, s.base, "BoxDownB")
	home := boxHome(t, s.base, b)
	var ids []string
	for n := range 5 {
		ids = append(ids, sendVia(t, s.base, a, b.id, n))
	}
	for _, id := range ids {
		var view map[string]any
		waitFor(t, 10*time.Second, func() string { return fmt.Sprintf("%s never reached two attempts: %v", id, view) }, func() bool {
			view = taskView(t, s.base, a.token, id)
			attempts, _ := view["attempts"].([]any)
			return len(attempts) >= 2
		})
		if view["outcome"] != nil {
			t.Fatalf("%s settled with no box running: %v", id, view)
		}
	}

	box := startBox(t, home, b.addr, nil)
	for _, id := range ids {
		waitFor(t, 25*time.Second, func() string { return id + " not acked: " + box.out.String() }, func() bool {
			return taskView(t, s.base, a.token, id)["outcome"] == "acked"
		})
	}
	pending := pendingLetters(t, b.addr)
	for _, id := range ids {
		if n, all := spoolCount(t, home, id); n != 1 || all != len(ids) {
			t.Errorf("%s: %d files in B's spool, %d in all", id, n, all)
		}
		if pending[id] == nil {
			t.Errorf("%s is not in B's /tasks/pending", id)
		}
		if got := auditOutcomes(t, s.base, id); strings.Join(got, ",") != "acked" {
			t.Errorf("%s audit: %v", id, got)
		}
	}
	stopAll(t, []*server{s}, box)
}

// TestBoxHubDownResult: B reports working and completed while the hub is
// down; both wait in B's outbox and reach the new hub process in order,
// once each, and A gets one reply letter.
func TestBoxHubDownResult(t *testing.T) {
	t.Parallel()
	env := kizunaEnv(kungfutest.DatabaseURL(t), kungfutest.RedisPrefix(t), kungfutest.Queue(t), boxScale)
	hubAddr := freeAddr(t)
	s := serveAt(t, env(), hubAddr)
	a, b := registerAgent(t, s.base, "BoxHubDownA"), registerAgent(t, s.base, "BoxHubDownB")
	boxA := startBox(t, boxHome(t, s.base, a), a.addr, nil)
	boxB := startBox(t, boxHome(t, s.base, b), b.addr, nil)

	id := sendVia(t, s.base, a, b.id, 1)
	waitFor(t, 20*time.Second, func() string { return "not acked: " + boxB.out.String() }, func() bool {
		return taskView(t, s.base, a.token, id)["outcome"] == "acked"
	})
	if pendingLetters(t, b.addr)[id] == nil {
		t.Fatal("the ACKed letter is not in B's /tasks/pending")
	}
	stopGracefully(t, s)

	// Both reports go in while the hub is down; the second is sent once
	// the first is on disk, so the outbox order is working, completed.
	type answer struct {
		st int
		r  map[string]any
	}
	answers := make([]chan answer, 2)
	for i, state := range []string{"working", "completed"} {
		answers[i] = make(chan answer, 1)
		go func() {
			st, r, err := hubCall("http://"+b.addr, http.MethodPost, "/tasks/"+id+"/result", "", map[string]any{"state": state, "message": state + " while the hub was down"})
			if err != nil {
				r = map[string]any{"err": err.Error()}
			}
			answers[i] <- answer{st, r}
		}()
		waitFor(t, 5*time.Second, func() string { return state + " never reached B's outbox" }, func() bool { return outboxCount(t, boxB.home) == i+1 })
	}
	var outboxIDs []string
	for i, ch := range answers {
		ans := <-ch
		oid, _ := ans.r["outbox_id"].(string)
		if ans.st != http.StatusAccepted || ans.r["status"] != "queued" || oid == "" {
			t.Fatalf("report %d with the hub down: %d %v", i, ans.st, ans.r)
		}
		outboxIDs = append(outboxIDs, oid)
	}
	if outboxIDs[0] >= outboxIDs[1] {
		t.Fatalf("outbox ids %v: working must be queued before completed", outboxIDs)
	}
	out, err := command(t, nil, "box", "status", "--home", boxB.home).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "outbox:   2 waiting") || !strings.Contains(string(out), "daemon:   healthy") {
		t.Fatalf("box status with the hub down: %v\n%s", err, out)
	}

	s2 := serveAt(t, env(), hubAddr)
	waitFor(t, 25*time.Second, func() string { return "B's outbox did not drain: " + boxB.out.String() }, func() bool {
		return outboxCount(t, boxB.home) == 0
	})
	if got := resultStates(t, s2.base, a.token, id); strings.Join(got, ",") != "working,completed" {
		t.Fatalf("the hub's result history: %v, want working then completed once each", got)
	}
	var reply []map[string]any
	waitFor(t, 20*time.Second, func() string { return "A's box never got the reply letter: " + boxA.out.String() }, func() bool {
		reply = replies(t, a.addr, id)
		return len(reply) > 0
	})
	replyID, _ := letterOf(reply[0])["task_id"].(string)
	waitFor(t, 10*time.Second, func() string { return "the reply letter has no acked audit row" }, func() bool {
		return strings.Join(auditOutcomes(t, s2.base, replyID), ",") == "acked"
	})
	// The hub makes a reply letter while it answers a terminal report, so
	// with the outbox drained every reply there will ever be exists now.
	st, r, err := hubCall(s2.base, http.MethodGet, "/api/v1/tasks?from="+b.id, kzAdminToken, nil)
	if err != nil || st != http.StatusOK {
		t.Fatalf("GET /api/v1/tasks: %d %v %v", st, r, err)
	}
	made := 0
	items, _ := r["items"].([]any)
	for _, it := range items {
		if l, _ := it.(map[string]any); l["reply_to"] == id {
			made++
		}
	}
	if reply = replies(t, a.addr, id); made != 1 || len(reply) != 1 {
		t.Fatalf("the hub made %d reply letters and A's box holds %d, want 1 each: %v", made, len(reply), reply)
	}
	stopAll(t, []*server{s2}, boxA, boxB)
}

// stopAll stops boxes and servers at once with SIGTERM and expects each
// to exit 0; one at a time, a test spends seconds on it.
func stopAll(t *testing.T, servers []*server, boxes ...*boxProc) {
	t.Helper()
	for _, b := range boxes {
		if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range servers {
		stopGracefully(t, s)
	}
	for _, b := range boxes {
		if code := b.exitCode(t, 15*time.Second); code != 0 {
			t.Fatalf("dojo box run exited %d after SIGTERM: %s", code, b.out.String())
		}
	}
}

// TestBoxEnroll: `dojo box enroll` with only --hub, --token and --home
// registers the agent the admin described with the token, writes a
// private config.json, and that config runs a working box.
func TestBoxEnroll(t *testing.T) {
	t.Parallel()
	env := kizunaEnv(kungfutest.DatabaseURL(t), kungfutest.RedisPrefix(t), kungfutest.Queue(t), boxScale)
	s := startServe(t, env())
	boxAddr := freeAddr(t)
	st, r, err := hubCall(s.base, http.MethodPost, "/api/v1/enroll-tokens", kzAdminToken, map[string]any{
		"name": "Enrolled box", "capabilities": "answers enrolled letters", "capability_tags": []string{"enrolled"},
		"webhook_url": "http://" + boxAddr})
	token, _ := r["enroll_token"].(string)
	if err != nil || st != http.StatusCreated || !strings.HasPrefix(token, "kz_enroll_") {
		t.Fatalf("mint an enroll token: %d %v %v", st, r, err)
	}

	home := filepath.Join(t.TempDir(), "enrolled")
	out, err := command(t, nil, "box", "enroll", "--hub", s.base, "--token", token, "--home", home).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "enrolled as A-") {
		t.Fatalf("box enroll: %v\n%s", err, out)
	}
	info, err := os.Stat(filepath.Join(home, "config.json"))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("config.json: %v %v", info, err)
	}
	raw, _ := os.ReadFile(filepath.Join(home, "config.json"))
	var cfg map[string]string
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	id := cfg["agent_id"]
	if cfg["hub_url"] != s.base || !strings.HasPrefix(id, "A-") || !strings.HasPrefix(cfg["agent_token"], "kf_live_") ||
		cfg["endpoint_secret"] == "" || cfg["listen"] != ":"+boxAddr[strings.LastIndex(boxAddr, ":")+1:] {
		t.Fatalf("config.json: hub_url %q agent_id %q listen %q", cfg["hub_url"], id, cfg["listen"])
	}
	if !strings.Contains(string(out), id) || strings.Contains(string(out), cfg["agent_token"]) || strings.Contains(string(out), token) {
		t.Fatalf("box enroll printed %q", out)
	}
	st, view, err := hubCall(s.base, http.MethodGet, "/api/v1/agents/"+id, kzAdminToken, nil)
	if err != nil || st != http.StatusOK || view["name"] != "Enrolled box" || view["capabilities"] != "answers enrolled letters" ||
		view["webhook_url"] != "http://"+boxAddr {
		t.Fatalf("the hub's view of the enrolled agent: %d %v %v", st, view, err)
	}

	// A rerun resumes without spending anything; the spent token enrolls
	// nobody else and leaves no trace.
	out, err = command(t, nil, "box", "enroll", "--hub", s.base, "--token", token, "--home", home).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "already enrolled as "+id {
		t.Fatalf("second enroll: %v\n%s", err, out)
	}
	other := filepath.Join(t.TempDir(), "other")
	cmd := command(t, nil, "box", "enroll", "--hub", s.base, "--token", token, "--home", other)
	out, err = cmd.CombinedOutput()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "ENROLL_TOKEN_USED") {
		t.Fatalf("enroll with a spent token: %v\n%s", err, out)
	}
	if _, err := os.Stat(other); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused enroll left %s behind: %v", other, err)
	}

	// enroll took the port from the admin's webhook; the test binds it to
	// loopback only.
	cfg["listen"] = boxAddr
	raw, _ = json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(home, "config.json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	box := startBox(t, home, boxAddr, nil)
	sender := registerAgent(t, s.base, "EnrollSender")
	lid := sendVia(t, s.base, sender, id, 1)
	waitFor(t, 20*time.Second, func() string { return "not acked: " + box.out.String() }, func() bool {
		return taskView(t, s.base, sender.token, lid)["outcome"] == "acked"
	})
	if rec := pendingLetters(t, boxAddr)[lid]; rec == nil || letterOf(rec)["from"] != sender.id {
		t.Fatalf("the enrolled box's spool: %v", rec)
	}
	// The start-up heartbeat went out with the enrolled agent token.
	_, view, _ = hubCall(s.base, http.MethodGet, "/api/v1/agents/"+id, kzAdminToken, nil)
	if view["status"] != "online" {
		t.Fatalf("the enrolled agent after its box started: %v", view)
	}
	stopAll(t, []*server{s}, box)
}
