package relay_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// fire is a goroutine-safe tool call: transport errors are returned, not
// reported through t.
func (d *dojo) fire(key, tool string, args any) (result, error) {
	b, err := json.Marshal(args)
	if err != nil {
		return result{}, err
	}
	req, err := http.NewRequest(http.MethodPost, d.URL+"/api/v1/"+tool, bytes.NewReader(b))
	if err != nil {
		return result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{}, err
	}
	r := result{Status: resp.StatusCode, Header: resp.Header, Raw: string(raw)}
	return r, json.Unmarshal(raw, &r.Body)
}

// withKey copies args and adds an idempotency_key.
func withKey(args map[string]any, key string) map[string]any {
	m := kv("idempotency_key", key)
	for k, v := range args {
		m[k] = v
	}
	return m
}

// sameBytes fails unless a replay is byte-identical to the first result. It
// first compares the decoded values, so a failure says whether the values
// or only their encoding differ.
func sameBytes(t testing.TB, what string, first, replay result) {
	t.Helper()
	var x, y any
	if err := json.Unmarshal([]byte(first.Raw), &x); err != nil {
		t.Fatalf("%s: first result is not JSON: %s", what, first.Raw)
	}
	if err := json.Unmarshal([]byte(replay.Raw), &y); err != nil {
		t.Fatalf("%s: replay is not JSON: %s", what, replay.Raw)
	}
	if !reflect.DeepEqual(x, y) {
		t.Fatalf("%s: the replay's values differ from the first result\nfirst:  %s\nreplay: %s", what, first.Raw, replay.Raw)
	}
	if first.Raw != replay.Raw {
		t.Errorf("%s: same values, but the replay is not byte-identical (field order)\nfirst:  %s\nreplay: %s", what, first.Raw, replay.Raw)
	}
}

func (d *dojo) entryCount(t testing.TB, code string) int64 {
	t.Helper()
	return d.dbInt(t, `SELECT count(*) FROM thread_entries e JOIN threads t ON t.id = e.thread_id WHERE t.code = $1`, code)
}

func TestThreadIdemPostReplay(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 3)
	g, a, b := ks[0], ks[1], ks[2]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a, b)

	args := withKey(kv("thread", code, "content", "Kickoff", "ask", []string{ns[a]},
		"assign", kv("to", ns[b], "requirements", "Write it")), "post-1")
	first := d.must(t, g, "thread_post", args)
	replay := d.must(t, g, "thread_post", args)
	sameBytes(t, "thread_post replay", first, replay)
	if d.entryCount(t, code) != 1 || d.dbInt(t, `SELECT next_seq FROM threads WHERE code = $1`, code) != 2 ||
		d.dbInt(t, `SELECT count(*) FROM thread_receipts`) != 1 || d.dbInt(t, `SELECT count(*) FROM assigns`) != 1 ||
		d.dbInt(t, `SELECT count(*) FROM memories WHERE origin = 'thread'`) != 1 {
		t.Fatalf("the replay had a second effect: %s", d.world(t))
	}

	// The world changes; the replay is still the first snapshot.
	d.say(t, a, code, "on it", "reply_to", first.num("entry"))
	d.must(t, b, "assign_take", kv("assign", assignOf(t, first)))
	d.say(t, b, code, "more")
	d.must(t, g, "thread_close", kv("thread", code))
	after := d.must(t, g, "thread_post", args)
	sameBytes(t, "thread_post replay after the room closed", first, after)
	if after.num("entry") != first.num("entry") || after.Body["assign"].(map[string]any)["state"] != "open" {
		t.Fatalf("replay is not the first snapshot: %s", after.Raw)
	}

	// The same request with its keys in another order and other spacing is
	// the same request.
	raw := fmt.Sprintf(`{ "idempotency_key": "post-1", "assign": {"requirements": "Write it", "to": %q},
		"ask": [%q], "content": "Kickoff", "thread": %q }`, ns[b], ns[a], code)
	if r := post(t, d.URL+"/api/v1/thread_post", g, []byte(raw)); !r.ok() || r.num("entry") != first.num("entry") {
		t.Fatalf("reordered request: %s", r.Raw)
	} else {
		sameBytes(t, "reordered request", first, r)
	}
	if d.entryCount(t, code) != 3 {
		t.Fatalf("entries = %d, want 3", d.entryCount(t, code))
	}
}

func TestThreadIdemConflicts(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 3)
	g, a, obs := ks[0], ks[1], ks[2]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a)
	d.enter(t, d.newKey(t, g, code, "observer"), obs)

	base := kv("thread", code, "content", "hello")
	d.must(t, g, "thread_post", withKey(base, "k1"))
	for _, c := range []struct {
		name string
		args map[string]any
	}{
		{"different content", kv("thread", code, "content", "hello!")},
		{"ask [] where ask was absent", kv("thread", code, "content", "hello", "ask", []string{})},
		{"an added summary", kv("thread", code, "content", "hello", "summary", "hi")},
		{"explicit ask", kv("thread", code, "content", "hello", "ask", []string{ns[a]})},
	} {
		t.Run(c.name, func(t *testing.T) {
			d.refuse(t, g, "thread_post", withKey(c.args, "k1"), 409, "IDEMPOTENCY_CONFLICT")
		})
	}
	// And the other way round: ask [] first, absent second.
	d.must(t, g, "thread_post", withKey(kv("thread", code, "content", "notify", "ask", []string{}), "k2"))
	d.refuse(t, g, "thread_post", withKey(kv("thread", code, "content", "notify"), "k2"), 409, "IDEMPOTENCY_CONFLICT")

	// Conflicts on other tools too.
	d.must(t, g, "thread_key", withKey(kv("thread", code, "role", "speaker"), "key-1"))
	d.refuse(t, g, "thread_key", withKey(kv("thread", code, "role", "observer"), "key-1"), 409, "IDEMPOTENCY_CONFLICT")
	d.refuse(t, g, "thread_key", withKey(kv("thread", code), "key-1"), 409, "IDEMPOTENCY_CONFLICT")

	// Keys are scoped per account and per tool: the same key elsewhere is new.
	ra := d.must(t, a, "thread_post", withKey(kv("thread", code, "content", "from a"), "k1"))
	rh := d.must(t, a, "thread_handle", withKey(kv("thread", code, "entry", d.dbInt(t, `SELECT min(id) FROM thread_entries`)), "k1"))
	if ra.num("entry") == 0 || rh.Body["handled"] != true || d.entryCount(t, code) != 3 {
		t.Fatalf("scoped keys: %s / %s", ra.Raw, rh.Raw)
	}
	if n := d.dbInt(t, `SELECT count(*) FROM thread_idempotency WHERE key = 'k1'`); n != 3 {
		t.Fatalf("k1 stored %d times, want 3 (g/thread_post, a/thread_post, a/thread_handle)", n)
	}

	// A refusal stores nothing: the same key and request run again later.
	expect(t, d.call(t, obs, "thread_post", withKey(kv("thread", code, "content", "let me speak"), "obs-1")), 403, "READ_ONLY")
	d.must(t, g, "thread_set_role", kv("thread", code, "account", ns[obs], "role", "speaker"))
	if r := d.must(t, obs, "thread_post", withKey(kv("thread", code, "content", "let me speak"), "obs-1")); r.num("seq") != 4 {
		t.Fatalf("post after the refusal: %s", r.Raw)
	}

	// The key grammar.
	for _, bad := range []string{"", "has space", "ключ", "a/b", "semi;colon", strings.Repeat("k", 129)} {
		t.Run("key "+bad, func(t *testing.T) {
			d.refuse(t, g, "thread_post", withKey(base, bad), 422, "VALIDATION_FAILED")
		})
	}
	d.refuse(t, g, "thread_post", kv("thread", code, "content", "x", "idempotency_key", 12), 422, "VALIDATION_FAILED")
	d.must(t, g, "thread_post", withKey(base, strings.Repeat("k", 128)))
	d.must(t, g, "thread_post", withKey(base, "A-z_0.9~"))
}

func TestThreadIdemKeysNeverReplayed(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, _ := d.crew(t, 3)
	g, a, b := ks[0], ks[1], ks[2]

	args := kv("subject", "idem", "key", true, "idempotency_key", "start-1")
	first := d.must(t, g, "thread_start", args)
	raw := first.str("key")
	replay := d.must(t, g, "thread_start", args)
	if !roomKeyShape.MatchString(raw) || replay.str("key") != "" || replay.Body["key"] == nil ||
		replay.str("key_fingerprint") != first.str("key_fingerprint") || codeOf(replay) != codeOf(first) {
		t.Fatalf("thread_start replay: %s", replay.Raw)
	}
	// Apart from the raw key the replay is the first result, byte for byte.
	sameBytes(t, "thread_start replay", result{Raw: strings.Replace(first.Raw, `"key":"`+raw+`"`, `"key":""`, 1)}, replay)
	if strings.Contains(replay.Raw, raw) || strings.Contains(d.dbStr(t, `SELECT string_agg(snapshot::text, '') FROM thread_idempotency`), raw) {
		t.Fatal("the raw key was replayed or stored")
	}
	if n := d.dbInt(t, `SELECT count(*) FROM threads`); n != 1 {
		t.Fatalf("rooms = %d, want 1", n)
	}
	code := codeOf(first)
	d.enter(t, raw, a) // the replay did not sign a new key

	kargs := kv("thread", code, "role", "speaker", "idempotency_key", "key-1")
	k1 := d.must(t, g, "thread_key", kargs)
	k2 := d.must(t, g, "thread_key", kargs)
	if k2.str("key") != "" || k2.str("key_fingerprint") != k1.str("key_fingerprint") || k2.str("key_issued_at") != k1.str("key_issued_at") {
		t.Fatalf("thread_key replay: %s", k2.Raw)
	}
	sameBytes(t, "thread_key replay", result{Raw: strings.Replace(k1.Raw, `"key":"`+k1.str("key")+`"`, `"key":""`, 1)}, k2)
	if h := d.dbStr(t, `SELECT encode(key_hash, 'hex') FROM threads WHERE code = $1`, code); h != sha(k1.str("key")) {
		t.Fatal("the thread_key replay signed another key")
	}
	d.enter(t, k1.str("key"), b)
}

// Every keyed room write replays its first result, and a probe without the
// key shows the effect happened once.
func TestThreadIdemReplayEveryTool(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 5)
	g, a, b, c, e := ks[0], ks[1], ks[2], ks[3], ks[4]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a, b, c)
	q := d.say(t, g, code, "both?", "ask", []string{ns[a], ns[b]}).num("entry")
	q2 := d.say(t, g, code, "c?", "ask", []string{ns[c]}).num("entry")
	take := d.assignTo(t, g, code, ns[a])
	submit := d.assignTo(t, g, code, ns[a])
	judge := d.assignTo(t, g, code, ns[a])
	drop := d.assignTo(t, g, code, ns[a])
	void := d.assignTo(t, g, code, ns[a])
	d.must(t, a, "assign_take", kv("assign", submit))
	d.must(t, a, "assign_take", kv("assign", judge, "payload", `{"v":1}`))
	d.must(t, a, "assign_take", kv("assign", drop))
	other, _ := d.openRoom(t, g)

	for _, s := range []struct {
		name       string
		who        string
		tool       string
		args       map[string]any
		probeCode  string // what the same call without a key answers afterwards
		probeState int
	}{
		{"thread_handle", a, "thread_handle", kv("thread", code, "entry", q), "INVALID_TARGET", 422},
		{"thread_retract", g, "thread_retract", kv("thread", code, "entry", q2), "", 200},
		{"thread_join", e, "thread_join", kv("key", key), "", 200},
		{"assign_take", a, "assign_take", kv("assign", take), "INVALID_STATE", 409},
		{"assign_submit", a, "assign_submit", kv("assign", submit, "payload", kv("v", 2)), "INVALID_STATE", 409},
		{"assign_judge", g, "assign_judge", kv("assign", judge, "verdict", "adopt"), "INVALID_STATE", 409},
		{"assign_drop", a, "assign_drop", kv("assign", drop), "INVALID_STATE", 409},
		{"assign_void", g, "assign_void", kv("assign", void), "INVALID_STATE", 409},
		{"thread_set_role", g, "thread_set_role", kv("thread", code, "account", ns[b], "role", "observer"), "INVALID_TARGET", 422},
		{"thread_remove", g, "thread_remove", kv("thread", code, "account", ns[c]), "INVALID_TARGET", 422},
		{"thread_leave", b, "thread_leave", kv("thread", code), "NOT_MEMBER", 403},
		{"thread_key_revoke", g, "thread_key_revoke", kv("thread", other), "", 200},
		{"thread_close", g, "thread_close", kv("thread", code), "THREAD_CLOSED", 409},
	} {
		t.Run(s.name, func(t *testing.T) {
			args := withKey(s.args, "replay-"+s.name)
			first := d.must(t, s.who, s.tool, args)
			before := d.world(t)
			replay := d.must(t, s.who, s.tool, args)
			sameBytes(t, s.tool, first, replay)
			if after := d.world(t); after != before {
				t.Fatalf("the replay changed the world:\nbefore %s\nafter  %s", before, after)
			}
			probe := d.call(t, s.who, s.tool, s.args)
			if s.probeCode != "" {
				expect(t, probe, s.probeState, s.probeCode)
			} else if !probe.ok() {
				t.Fatalf("probe: %s", probe.Raw)
			}
		})
	}
	// The unkeyed probe ran the revoke for real: nothing was left to revoke.
	if r := d.must(t, g, "thread_key_revoke", kv("thread", other)); r.Body["revoked"] != false {
		t.Fatalf("revoke replay re-ran: %s", r.Raw)
	}
}

func TestThreadIdemConcurrentPosts(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 2)
	g, a := ks[0], ks[1]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a)
	args := withKey(kv("thread", code, "content", "once", "ask", []string{ns[a]}), "race-1")

	const n = 10
	results := make([]result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			results[i], errs[i] = d.fire(g, "thread_post", args)
		}()
	}
	close(gate)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if !results[i].ok() {
			t.Fatalf("call %d refused: %s", i, results[i].Raw)
		}
		sameBytes(t, fmt.Sprintf("concurrent call %d", i), results[0], results[i])
	}
	if c := d.entryCount(t, code); c != 1 {
		t.Fatalf("entries = %d, want 1", c)
	}
	if r := d.dbInt(t, `SELECT count(*) FROM thread_receipts`); r != 1 {
		t.Fatalf("receipts = %d, want 1", r)
	}
	if s := d.dbInt(t, `SELECT next_seq FROM threads WHERE code = $1`, code); s != 2 {
		t.Fatalf("next_seq = %d, want 2", s)
	}
	expectTurn(t, d, "a", a, "reply:"+id(results[0], "entry"))
}

// Concurrent thread_start(key:true) under one key: one room, and the raw key
// reaches exactly one caller; everyone else sees its fingerprint.
func TestThreadIdemConcurrentStart(t *testing.T) {
	t.Parallel()
	d := start(t)
	g, _ := d.register(t)
	args := kv("subject", "once", "key", true, "idempotency_key", "start-race")
	const n = 8
	results := make([]result, n)
	errs := make([]error, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); <-gate; results[i], errs[i] = d.fire(g, "thread_start", args) }()
	}
	close(gate)
	wg.Wait()
	raw := ""
	for i, r := range results {
		if errs[i] != nil || !r.ok() {
			t.Fatalf("start %d: %v %s", i, errs[i], r.Raw)
		}
		if k := r.str("key"); k != "" {
			if raw != "" {
				t.Fatalf("the raw key was returned twice")
			}
			raw = k
		}
		if codeOf(r) != codeOf(results[0]) || r.str("key_fingerprint") != results[0].str("key_fingerprint") {
			t.Fatalf("start %d is another room or key: %s vs %s", i, r.Raw, results[0].Raw)
		}
	}
	if raw == "" || d.dbInt(t, `SELECT count(*) FROM threads`) != 1 ||
		d.dbStr(t, `SELECT encode(key_hash, 'hex') FROM threads`) != sha(raw) {
		t.Fatalf("want one room whose key is the one raw key returned (%q)", raw)
	}
}
