package relay_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Races
// ---------------------------------------------------------------------------

func TestAssignJudgeRace(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 2)
	g, a := ks[0], ks[1]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a)
	work := d.assignTo(t, g, code, ns[a])
	d.must(t, a, "assign_take", kv("assign", work, "payload", `{"v":1}`))

	const n = 20
	results := make([]result, n)
	errs := make([]error, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := kv("assign", work, "verdict", "adopt")
			if i%2 == 1 {
				args = kv("assign", work, "verdict", "reject", "reason", fmt.Sprintf("reason %d", i))
			}
			<-gate
			results[i], errs[i] = d.fire(g, "assign_judge", args)
		}()
	}
	close(gate)
	wg.Wait()

	winner := -1
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("judge %d: %v", i, errs[i])
		}
		if r.ok() {
			if winner >= 0 {
				t.Fatalf("two judgments succeeded: %s and %s", results[winner].Raw, r.Raw)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatal("no judgment succeeded")
	}
	won := results[winner].str("state")
	for i, r := range results {
		if i == winner {
			continue
		}
		expect(t, r, 409, "INVALID_STATE")
		if details(r, "status") != won {
			t.Fatalf("loser %d saw status %v, winner made it %s", i, details(r, "status"), won)
		}
	}
	wantVerdict, wantReason := "adopt", ""
	if winner%2 == 1 {
		wantVerdict, wantReason = "reject", fmt.Sprintf("reason %d", winner)
	}
	got := d.dbStr(t, `SELECT state || '|' || verdict || '|' || coalesce(reason, '') || '|' || end_cause FROM assigns WHERE id = $1`, work)
	if got != won+"|"+wantVerdict+"|"+wantReason+"|judge" {
		t.Fatalf("stored verdict %q, winner was %d (%s)", got, winner, results[winner].Raw)
	}
}

// burst runs calls concurrently and returns their results in order.
func (d *dojo) burst(t *testing.T, calls ...func() (result, error)) []result {
	t.Helper()
	out := make([]result, len(calls))
	errs := make([]error, len(calls))
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Add(1)
		go func() { defer wg.Done(); <-gate; out[i], errs[i] = c() }()
	}
	close(gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	return out
}

// tally counts successes and checks every refusal is status/code.
func tally(t *testing.T, rs []result, status int, code string) (ok int) {
	t.Helper()
	for _, r := range rs {
		if r.ok() {
			ok++
		} else {
			expect(t, r, status, code)
		}
	}
	return ok
}

// The caps and the last-governor rule hold under concurrent requests.
func TestThreadLimitRaces(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, _ := d.crew(t, 56)
	owner, g1, g2 := ks[0], ks[1], ks[2]

	// ROOM_LIMIT: 95 open rooms, 10 concurrent starts ⇒ exactly 5 win.
	for range 95 {
		d.must(t, owner, "thread_start", kv())
	}
	var starts []func() (result, error)
	for range 10 {
		starts = append(starts, func() (result, error) { return d.fire(owner, "thread_start", kv("subject", "race")) })
	}
	if n := tally(t, d.burst(t, starts...), 409, "ROOM_LIMIT"); n != 5 {
		t.Fatalf("%d concurrent starts won, want 5", n)
	}
	if n := d.dbInt(t, `SELECT count(*) FROM thread_members WHERE account_id = $1`, d.accountID(t, owner)); n != 100 {
		t.Fatalf("owner is in %d rooms, want 100", n)
	}

	// MEMBER_LIMIT: 45 members, 10 concurrent joins ⇒ exactly 5 win.
	code, key := d.openRoom(t, g1)
	d.enter(t, key, ks[2:46]...)
	var joins []func() (result, error)
	for _, k := range ks[46:56] {
		joins = append(joins, func() (result, error) { return d.fire(k, "thread_join", kv("key", key)) })
	}
	if n := tally(t, d.burst(t, joins...), 409, "MEMBER_LIMIT"); n != 5 {
		t.Fatalf("%d concurrent joins won, want 5", n)
	}
	if n := d.dbInt(t, `SELECT count(*) FROM thread_members m JOIN threads t ON t.id = m.thread_id WHERE t.code = $1`, code); n != 50 {
		t.Fatalf("members = %d, want 50", n)
	}

	// LAST_MANAGER: two governors leave at once ⇒ one stays.
	d.must(t, g1, "thread_set_role", kv("thread", code, "account", d.nameOf(t, g2), "role", "governor"))
	rs := d.burst(t,
		func() (result, error) { return d.fire(g1, "thread_leave", kv("thread", code)) },
		func() (result, error) { return d.fire(g2, "thread_leave", kv("thread", code)) })
	if n := tally(t, rs, 409, "LAST_MANAGER"); n != 1 {
		t.Fatalf("%d governors left, want 1", n)
	}
	if n := d.dbInt(t, `SELECT count(*) FROM thread_members m JOIN threads t ON t.id = m.thread_id WHERE t.code = $1 AND m.role = 'governor'`, code); n != 1 {
		t.Fatalf("governors = %d, want 1", n)
	}
}

// joinTry is one client-side join attempt with its wall-clock bounds.
type joinTry struct {
	who        int
	keyIdx     int
	sent, recv time.Time
	res        result
}

func TestThreadJoinKeyRace(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, _ := d.crew(t, 31)
	g, joiners := ks[0], ks[1:]
	code, k0 := d.openRoom(t, g)

	// keys[i] is the i-th key; live(i) holds from issued[i] (its response
	// arrived) until asked[i+1] (the next reissue was sent).
	var (
		mu     sync.Mutex
		keys   = []string{k0}
		issued = []time.Time{time.Now()}
		asked  []time.Time
	)
	current := func() (int, string) { mu.Lock(); defer mu.Unlock(); return len(keys) - 1, keys[len(keys)-1] }

	var tries []joinTry
	var tmu sync.Mutex
	var wg sync.WaitGroup
	var failure error
	gate := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-gate
		for range 10 {
			mu.Lock()
			asked = append(asked, time.Now())
			mu.Unlock()
			r, err := d.fire(g, "thread_key", kv("thread", code))
			if err != nil || !r.ok() {
				mu.Lock()
				failure = fmt.Errorf("thread_key: %v %s", err, r.Raw)
				mu.Unlock()
				return
			}
			mu.Lock()
			keys, issued = append(keys, r.str("key")), append(issued, time.Now())
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	for w := range joiners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			for attempt := range 8 { // well under the 20-failure throttle
				if attempt > 0 {
					time.Sleep(time.Duration(1+w%4) * time.Millisecond)
				}
				idx, k := current()
				tr := joinTry{who: w, keyIdx: idx, sent: time.Now()}
				r, err := d.fire(joiners[w], "thread_join", kv("key", k))
				tr.recv, tr.res = time.Now(), r
				if err != nil {
					mu.Lock()
					failure = err
					mu.Unlock()
					return
				}
				tmu.Lock()
				tries = append(tries, tr)
				tmu.Unlock()
				if r.ok() {
					return
				}
			}
		}()
	}
	close(gate)
	wg.Wait()
	if failure != nil {
		t.Fatal(failure)
	}

	liveUntil := func(i int) time.Time { // the next reissue was sent
		if i+1 < len(keys) {
			return asked[i]
		}
		return time.Now().Add(time.Hour)
	}
	supersededAt := func(i int) time.Time { // the next key's response arrived
		if i+1 < len(keys) {
			return issued[i+1]
		}
		return time.Now().Add(time.Hour)
	}
	joinedWith := map[int]int{}
	for _, tr := range tries {
		switch {
		case tr.res.ok():
			if tr.res.Body["already_member"] != false {
				t.Fatalf("fresh join reported an existing membership: %s", tr.res.Raw)
			}
			if !tr.sent.Before(supersededAt(tr.keyIdx)) {
				t.Fatalf("joiner %d joined with key %d sent after the key was replaced", tr.who, tr.keyIdx)
			}
			joinedWith[tr.who] = tr.keyIdx
		default:
			expect(t, tr.res, 401, "KEY_INVALID")
			if tr.sent.After(issued[tr.keyIdx]) && tr.recv.Before(liveUntil(tr.keyIdx)) {
				t.Fatalf("joiner %d was refused key %d while it was certainly live", tr.who, tr.keyIdx)
			}
		}
	}
	if len(joinedWith) == 0 {
		t.Fatal("nobody joined during the race")
	}
	byKey := map[int]int{}
	for _, k := range joinedWith {
		byKey[k]++
	}
	t.Logf("%d attempts, %d joined (per key index %v)", len(tries), len(joinedWith), byKey)
	// Each membership records exactly the key its client used.
	for w, idx := range joinedWith {
		h := d.dbStr(t, `SELECT encode(joined_via_key_hash, 'hex') FROM thread_members m JOIN threads t ON t.id = m.thread_id
			WHERE t.code = $1 AND m.account_id = $2`, code, d.accountID(t, joiners[w]))
		if h != sha(keys[idx]) {
			t.Fatalf("joiner %d: membership key %s, client used key %d", w, h, idx)
		}
	}
	if n := d.dbInt(t, `SELECT count(*) FROM thread_members m JOIN threads t ON t.id = m.thread_id WHERE t.code = $1`, code); n != int64(1+len(joinedWith)) {
		t.Fatalf("members = %d, successful joins = %d", n, len(joinedWith))
	}
	// Exactly one live key: the last one issued.
	if h := d.dbStr(t, `SELECT encode(key_hash, 'hex') FROM threads WHERE code = $1`, code); h != sha(keys[len(keys)-1]) || len(keys) != 11 {
		t.Fatalf("live key %s is not the last of %d issued", h, len(keys))
	}
	// Everyone left out joins with the live key; members get their membership back.
	for w, k := range joiners {
		r := d.must(t, k, "thread_join", kv("key", keys[len(keys)-1]))
		if _, joined := joinedWith[w]; r.Body["already_member"] != joined {
			t.Fatalf("joiner %d after the race: %s", w, r.Raw)
		}
	}
}

// ---------------------------------------------------------------------------
// Randomized room actions with invariants checked after every step
// ---------------------------------------------------------------------------

// codeStatus is the HTTP status each refusal may carry in this test.
var fuzzRefusals = map[string]int{
	"NOT_MEMBER": 403, "READ_ONLY": 403, "NOT_GOVERNOR": 403, "NOT_YOURS": 403,
	"THREAD_CLOSED": 409, "INVALID_STATE": 409, "LAST_MANAGER": 409,
	"INVALID_TARGET": 422, "SCHEMA_MISMATCH": 422, "ASSIGN_NOT_FOUND": 404,
}

type fuzzRoom struct {
	code string
	key  string // the raw live key as the clients know it ("" = none)
}

type fuzzer struct {
	t     *testing.T
	d     *dojo
	rng   *rand.Rand
	keys  []string
	names []string
	ids   []int64
	rooms []*fuzzRoom
	step  int
	what  string
	stats map[string]int // tool → outcome counts, logged at the end
}

func (f *fuzzer) ints(q string, args ...any) []int64 {
	f.t.Helper()
	rows, err := f.d.App.DB.Query(context.Background(), q, args...)
	if err != nil {
		f.t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var n int64
		if err := rows.Scan(&n); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// pick returns a random element of xs, or 99999999 when xs is empty.
func (f *fuzzer) pick(xs []int64) int64 {
	if len(xs) == 0 {
		return 99999999
	}
	return xs[f.rng.IntN(len(xs))]
}

func (f *fuzzer) role(room *fuzzRoom, who int) string {
	return f.d.roleOf(f.t, room.code, f.names[who])
}

func (f *fuzzer) status(room *fuzzRoom) string {
	return f.d.dbStr(f.t, `SELECT status FROM threads WHERE code = $1`, room.code)
}

// do calls a tool and accepts success or a protocol refusal with its
// proper status; anything else (INTERNAL_ERROR included) fails the test.
func (f *fuzzer) do(who int, tool string, args map[string]any) result {
	f.t.Helper()
	r := f.d.call(f.t, f.keys[who], tool, args)
	f.what = fmt.Sprintf("%s by %s %v", tool, f.names[who], args)
	f.stats[tool+" "+map[bool]string{true: "ok", false: r.code()}[r.ok()]]++
	if r.ok() {
		return r
	}
	if st, known := fuzzRefusals[r.code()]; !known || st != r.Status {
		f.t.Fatalf("step %d: %s: unexpected refusal %d %s", f.step, f.what, r.Status, r.Raw)
	}
	return r
}

// usually returns the index of account id (the party an action is meant
// for); one time in five, or when id is unknown, a random account instead,
// so refusals are exercised too.
func (f *fuzzer) usually(id int64) int {
	if i := slices.Index(f.ids, id); i >= 0 && f.rng.IntN(5) != 0 {
		return i
	}
	return f.rng.IntN(len(f.ids))
}

// pickRow returns a random (id, account) pair from a two-column query.
func (f *fuzzer) pickRow(q string, args ...any) (int64, int64) {
	f.t.Helper()
	rows, err := f.d.App.DB.Query(context.Background(), q, args...)
	if err != nil {
		f.t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var all [][2]int64
	for rows.Next() {
		var x [2]int64
		if err := rows.Scan(&x[0], &x[1]); err != nil {
			f.t.Fatal(err)
		}
		all = append(all, x)
	}
	if len(all) == 0 {
		return 99999999, 0
	}
	x := all[f.rng.IntN(len(all))]
	return x[0], x[1]
}

func (f *fuzzer) act() {
	t, d, rng := f.t, f.d, f.rng
	room := f.rooms[rng.IntN(len(f.rooms))]
	roomID := d.dbInt(t, `SELECT id FROM threads WHERE code = $1`, room.code)
	entries := f.ints(`SELECT id FROM thread_entries WHERE thread_id = $1 ORDER BY id`, roomID)
	members := f.ints(`SELECT account_id FROM thread_members WHERE thread_id = $1 ORDER BY account_id`, roomID)
	governors := f.ints(`SELECT account_id FROM thread_members WHERE thread_id = $1 AND role = 'governor' ORDER BY account_id`, roomID)
	speakers := f.ints(`SELECT account_id FROM thread_members WHERE thread_id = $1 AND role <> 'observer' ORDER BY account_id`, roomID)
	nameOf := func(ids []int64) string { return f.names[f.usually(f.pick(ids))] }
	status := f.status(room)

	switch n := rng.IntN(100); {
	case n < 22: // post, maybe asking, replying or assigning
		who := f.usually(f.pick(speakers))
		myRole := f.role(room, who)
		args := kv("thread", room.code, "content", fmt.Sprintf("step %d", f.step))
		if rng.IntN(3) == 0 {
			ask := []string{}
			for range rng.IntN(3) {
				ask = append(ask, nameOf(speakers))
			}
			args["ask"] = ask
		}
		if rng.IntN(3) == 0 && len(entries) > 0 {
			args["reply_to"] = f.pick(entries)
		}
		if rng.IntN(2) == 0 {
			spec := kv("to", nameOf(speakers), "requirements", "work of step "+fmt.Sprint(f.step))
			if rng.IntN(2) == 0 {
				spec["output_schema"] = urlSchema
			}
			args["assign"] = spec
		}
		before := d.entryCount(t, room.code)
		r := f.do(who, "thread_post", args)
		want := ""
		switch {
		case myRole == "":
			want = "NOT_MEMBER"
		case status != "open":
			want = "THREAD_CLOSED"
		case myRole == "observer":
			want = "READ_ONLY"
		}
		if r.code() != want && (want != "" || r.code() != "INVALID_TARGET") {
			t.Fatalf("step %d: %s: got %s, want %q", f.step, f.what, r.Raw, want)
		}
		if after := d.entryCount(t, room.code); (r.ok() && after != before+1) || (!r.ok() && after != before) {
			t.Fatalf("step %d: %s: entries %d → %d", f.step, f.what, before, after)
		}
	case n < 33: // handle a pending receipt (or any entry)
		entry, owner := f.pickRow(`SELECT entry_id, account_id FROM thread_receipts WHERE thread_id = $1 AND state = 'pending' ORDER BY id`, roomID)
		if rng.IntN(6) == 0 {
			entry = f.pick(entries)
		}
		who := f.usually(owner)
		owed := d.dbInt(t, `SELECT count(*) FROM thread_receipts WHERE entry_id = $1 AND account_id = $2 AND state = 'pending'`, entry, f.ids[who])
		r := f.do(who, "thread_handle", kv("thread", room.code, "entry", entry))
		if r.ok() != (owed == 1) {
			t.Fatalf("step %d: %s: %s, but %d pending receipts", f.step, f.what, r.Raw, owed)
		}
	case n < 38: // retract
		entry, author := f.pickRow(`SELECT id, author_id FROM thread_entries WHERE thread_id = $1 ORDER BY id`, roomID)
		who := f.usually(author)
		pending := d.dbInt(t, `SELECT count(*) FROM thread_receipts WHERE entry_id = $1 AND state = 'pending'`, entry)
		if r := f.do(who, "thread_retract", kv("thread", room.code, "entry", entry)); r.ok() && r.num("withdrawn") != pending {
			t.Fatalf("step %d: %s: %s, %d were pending", f.step, f.what, r.Raw, pending)
		}
	case n < 49: // take (with or without delivery)
		id, assignee := f.pickRow(`SELECT id, assignee_id FROM assigns WHERE thread_id = $1 AND state = 'open' ORDER BY id`, roomID)
		args := kv("assign", id)
		if rng.IntN(2) == 0 {
			args["payload"] = kv("url", "https://example.org/"+fmt.Sprint(f.step))
		}
		if r := f.do(f.usually(assignee), "assign_take", args); r.ok() && d.assignState(t, id) != r.str("state") {
			t.Fatalf("step %d: %s: stored %s", f.step, f.what, d.assignState(t, id))
		}
	case n < 59: // submit, sometimes off-schema
		id, assignee := f.pickRow(`SELECT id, assignee_id FROM assigns WHERE thread_id = $1 AND state = 'taken' ORDER BY id`, roomID)
		payload := any(kv("url", "https://example.org"))
		if rng.IntN(4) == 0 {
			payload = kv("link", 1)
		}
		f.do(f.usually(assignee), "assign_submit", kv("assign", id, "payload", payload))
	case n < 68: // judge
		id, creator := f.pickRow(`SELECT id, creator_id FROM assigns WHERE thread_id = $1 AND state = 'delivered' ORDER BY id`, roomID)
		args := kv("assign", id, "verdict", "adopt")
		if rng.IntN(2) == 0 {
			args = kv("assign", id, "verdict", "reject", "reason", "not yet")
		}
		if r := f.do(f.usually(creator), "assign_judge", args); r.ok() && d.assignState(t, id) != r.str("state") {
			t.Fatalf("step %d: %s: stored %s", f.step, f.what, d.assignState(t, id))
		}
	case n < 72: // drop
		id, assignee := f.pickRow(`SELECT id, assignee_id FROM assigns WHERE thread_id = $1 AND state = 'taken' ORDER BY id`, roomID)
		f.do(f.usually(assignee), "assign_drop", kv("assign", id))
	case n < 76: // void
		id, creator := f.pickRow(`SELECT id, creator_id FROM assigns WHERE thread_id = $1 AND state IN ('open', 'taken') ORDER BY id`, roomID)
		f.do(f.usually(creator), "assign_void", kv("assign", id))
	case n < 82: // set a role
		roles := []string{"governor", "speaker", "observer"}
		f.do(f.usually(f.pick(governors)), "thread_set_role", kv("thread", room.code, "account", nameOf(members), "role", roles[rng.IntN(3)]))
	case n < 85: // remove
		r := f.do(f.usually(f.pick(governors)), "thread_remove", kv("thread", room.code, "account", nameOf(members)))
		if r.ok() && f.d.roleOf(t, room.code, r.str("account")) != "" {
			t.Fatalf("step %d: %s: still a member", f.step, f.what)
		}
	case n < 89: // leave
		who := f.usually(f.pick(members))
		pending := d.dbInt(t, `SELECT count(*) FROM thread_receipts WHERE thread_id = $1 AND account_id = $2 AND state = 'pending'`, roomID, f.ids[who])
		if r := f.do(who, "thread_leave", kv("thread", room.code)); r.ok() {
			if f.role(room, who) != "" || r.num("withdrawn") != pending {
				t.Fatalf("step %d: %s: %s (had %d pending)", f.step, f.what, r.Raw, pending)
			}
		}
	case n < 96: // an outsider re-joins with a fresh key the clients know
		var outsiders []int
		for i, id := range f.ids {
			if !slices.Contains(members, id) {
				outsiders = append(outsiders, i)
			}
		}
		if len(outsiders) == 0 || status != "open" {
			return
		}
		if room.key == "" || rng.IntN(2) == 0 {
			r := f.do(slices.Index(f.ids, f.pick(governors)), "thread_key", kv("thread", room.code))
			if !r.ok() {
				t.Fatalf("step %d: %s: a governor could not sign a key: %s", f.step, f.what, r.Raw)
			}
			room.key = r.str("key")
		}
		who := outsiders[rng.IntN(len(outsiders))]
		r := f.d.call(t, f.keys[who], "thread_join", kv("key", room.key))
		f.what = fmt.Sprintf("thread_join by %s", f.names[who])
		f.stats["thread_join ok"]++
		if !r.ok() || r.Body["already_member"] != false {
			t.Fatalf("step %d: rejoin with the live key: %s", f.step, r.Raw)
		}
	default: // key reissue or revoke, by anyone
		who := f.usually(f.pick(governors))
		if rng.IntN(3) == 0 {
			if r := f.do(who, "thread_key_revoke", kv("thread", room.code)); r.ok() {
				room.key = ""
			}
			return
		}
		if r := f.do(who, "thread_key", kv("thread", room.code)); r.ok() {
			room.key = r.str("key")
		}
	}
}

// check asserts the invariants directly in the database and through every
// account's turn.
func (f *fuzzer) check() {
	t, d := f.t, f.d
	t.Helper()
	for _, inv := range []struct{ name, q string }{
		{"a closed room has a key", `SELECT count(*) FROM threads WHERE status <> 'open' AND key_hash IS NOT NULL`},
		{"key columns half set", `SELECT count(*) FROM threads WHERE (key_hash IS NULL) <> (key_role IS NULL) OR (key_hash IS NULL) <> (key_issued_at IS NULL)`},
		{"an open room without governor", `SELECT count(*) FROM threads t WHERE status = 'open'
			AND NOT EXISTS (SELECT 1 FROM thread_members m WHERE m.thread_id = t.id AND m.role = 'governor')`},
		{"a receipt both pending and ended", `SELECT count(*) FROM thread_receipts
			WHERE (state = 'pending') <> (resolution IS NULL) OR (state = 'pending') <> (ended_at IS NULL)`},
		{"a pending receipt nobody can answer", `SELECT count(*) FROM thread_receipts r JOIN threads t ON t.id = r.thread_id
			LEFT JOIN thread_members m ON m.thread_id = r.thread_id AND m.account_id = r.account_id
			WHERE r.state = 'pending' AND (t.status <> 'open' OR m.role IS NULL OR m.role = 'observer')`},
		{"an assignment's ended_at disagrees with its state", `SELECT count(*) FROM assigns
			WHERE (state IN ('open', 'taken', 'delivered')) <> (ended_at IS NULL)`},
		{"an assignment's clocks disagree with its state", `SELECT count(*) FROM assigns
			WHERE (state = 'open' AND taken_at IS NOT NULL) OR (state <> 'open' AND state <> 'voided' AND state <> 'dropped' AND taken_at IS NULL)
			   OR (state IN ('delivered', 'adopted', 'rejected', 'undecided')) <> (delivered_at IS NOT NULL)`},
		{"undelivered work in a closed room", `SELECT count(*) FROM assigns s JOIN threads t ON t.id = s.thread_id
			WHERE s.state IN ('open', 'taken') AND t.status <> 'open'`},
		{"undelivered work of a departed member", `SELECT count(*) FROM assigns s WHERE s.state IN ('open', 'taken') AND
			(NOT EXISTS (SELECT 1 FROM thread_members m WHERE m.thread_id = s.thread_id AND m.account_id = s.creator_id)
			 OR NOT EXISTS (SELECT 1 FROM thread_members m WHERE m.thread_id = s.thread_id AND m.account_id = s.assignee_id))`},
		{"a delivery judged by a departed creator", `SELECT count(*) FROM assigns s WHERE s.state = 'delivered' AND s.judge_forfeited_at IS NULL
			AND NOT EXISTS (SELECT 1 FROM thread_members m WHERE m.thread_id = s.thread_id AND m.account_id = s.creator_id)`},
	} {
		if n := d.dbInt(t, inv.q); n != 0 {
			t.Fatalf("step %d after %s: invariant broken (%d rows): %s", f.step, f.what, n, inv.name)
		}
	}
	// The clients' idea of the live key is the only live key.
	for _, r := range f.rooms {
		want := ""
		if r.key != "" {
			want = sha(r.key)
		}
		if got := d.dbStr(t, `SELECT encode(key_hash, 'hex') FROM threads WHERE code = $1`, r.code); got != want {
			t.Fatalf("step %d after %s: room %s live key %q, clients hold %q", f.step, f.what, r.code, got, want)
		}
	}
	// Every turn item points at something still owed, and everything owed
	// is in the turn exactly once.
	for i, key := range f.keys {
		var items []string
		cursor := ""
		for {
			args := kv()
			if cursor != "" {
				args["cursor"] = cursor
			}
			r := d.must(t, key, "todo_list", args)
			for _, x := range r.Body["todos"].([]any) {
				m := x.(map[string]any)
				var owed int64
				switch m["kind"] {
				case "reply":
					owed = d.dbInt(t, `SELECT count(*) FROM thread_receipts r JOIN threads t ON t.id = r.thread_id
						WHERE r.entry_id = $1 AND r.account_id = $2 AND r.state = 'pending' AND t.code = $3`, int64(m["entry"].(float64)), f.ids[i], m["thread"])
				case "deliver":
					owed = d.dbInt(t, `SELECT count(*) FROM assigns WHERE id = $1 AND assignee_id = $2 AND state = 'taken'`, int64(m["assign"].(float64)), f.ids[i])
				case "judge":
					owed = d.dbInt(t, `SELECT count(*) FROM assigns WHERE id = $1 AND creator_id = $2 AND state = 'delivered'
						AND judge_forfeited_at IS NULL`, int64(m["assign"].(float64)), f.ids[i])
				}
				if owed != 1 {
					t.Fatalf("step %d after %s: %s's turn item %v is not owed", f.step, f.what, f.names[i], m)
				}
				items = append(items, fmt.Sprintf("%v:%v:%v", m["kind"], m["entry"], m["assign"]))
			}
			if cursor, _ = r.Body["next_cursor"].(string); cursor == "" {
				break
			}
		}
		owed := d.dbInt(t, `SELECT (SELECT count(*) FROM thread_receipts WHERE account_id = $1 AND state = 'pending')
			+ (SELECT count(*) FROM assigns WHERE assignee_id = $1 AND state = 'taken')
			+ (SELECT count(*) FROM assigns WHERE creator_id = $1 AND state = 'delivered' AND judge_forfeited_at IS NULL)`, f.ids[i])
		uniq := slices.Compact(slices.Sorted(slices.Values(items)))
		if int64(len(items)) != owed || len(uniq) != len(items) {
			t.Fatalf("step %d after %s: %s's turn has %d items (%d distinct), owes %d", f.step, f.what, f.names[i], len(items), len(uniq), owed)
		}
	}
}

func TestThreadRandomized(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 5)
	f := &fuzzer{t: t, d: d, rng: rand.New(rand.NewPCG(20261130, 5)), keys: ks, stats: map[string]int{}}
	for _, k := range ks {
		f.names = append(f.names, ns[k])
		f.ids = append(f.ids, d.accountID(t, k))
	}
	for g := range 2 {
		code, key := d.openRoom(t, ks[g])
		d.enter(t, key, slices.Delete(slices.Clone(ks), g, g+1)...)
		f.rooms = append(f.rooms, &fuzzRoom{code: code, key: key})
	}
	const steps = 400
	closeAt := map[int]int{steps - 40: 0, steps - 15: 1}
	for f.step = 1; f.step <= steps; f.step++ {
		if r, ok := closeAt[f.step]; ok {
			room := f.rooms[r]
			gov := d.dbInt(t, `SELECT m.account_id FROM thread_members m JOIN threads t ON t.id = m.thread_id
				WHERE t.code = $1 AND m.role = 'governor' ORDER BY m.account_id LIMIT 1`, room.code)
			who := slices.Index(f.ids, gov)
			c := f.do(who, "thread_close", kv("thread", room.code))
			if !c.ok() || f.status(room) != "closed" {
				t.Fatalf("step %d: close: %s", f.step, c.Raw)
			}
			room.key = ""
		} else {
			f.act()
		}
		f.check()
	}
	outcomes := slices.Sorted(maps.Keys(f.stats))
	for i, k := range outcomes {
		outcomes[i] = fmt.Sprintf("%s=%d", k, f.stats[k])
	}
	t.Logf("outcomes: %s", strings.Join(outcomes, ", "))
	// The run exercised the interesting paths.
	for _, q := range []string{
		`SELECT count(*) FROM assigns WHERE state IN ('adopted', 'rejected')`,
		`SELECT count(*) FROM assigns WHERE state = 'voided'`,
		`SELECT count(*) FROM thread_receipts WHERE state = 'fulfilled'`,
		`SELECT count(*) FROM thread_receipts WHERE state = 'withdrawn'`,
		`SELECT count(*) FROM thread_members WHERE role = 'observer'`,
	} {
		if d.dbInt(t, q) == 0 {
			t.Errorf("the random run never reached: %s", q)
		}
	}
}

// ---------------------------------------------------------------------------
// Recovery: a client with nothing but its Agent key clears its turn.
// ---------------------------------------------------------------------------

// fill builds a value satisfying a (simple) JSON Schema.
func fill(schema map[string]any) any {
	switch schema["type"] {
	case "object":
		out := map[string]any{}
		props, _ := schema["properties"].(map[string]any)
		for k, p := range props {
			out[k] = fill(p.(map[string]any))
		}
		return out
	case "array":
		return []any{}
	case "integer", "number":
		return 1
	case "boolean":
		return true
	}
	return "done"
}

func TestTurnRecovery(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 4)
	g1, g2, w, h := ks[0], ks[1], ks[2], ks[3]
	r1, k1 := d.openRoom(t, g1)
	r2, k2 := d.openRoom(t, g2)
	d.enter(t, k1, w, h)
	d.enter(t, k2, w, h)
	rich := map[string]any{"type": "object", "required": []string{"url", "count", "tags"}, "properties": map[string]any{
		"url": map[string]any{"type": "string"}, "count": map[string]any{"type": "integer"},
		"tags": map[string]any{"type": "array", "items": map[string]any{"type": "string"}}}}

	for i := range 30 {
		d.say(t, g1, r1, fmt.Sprintf("question %d", i), "ask", []string{ns[w]})
	}
	for i := range 10 {
		schema := urlSchema
		if i%2 == 0 {
			schema = rich
		}
		id := d.assignTo(t, g1, r1, ns[w], "output_schema", schema)
		d.must(t, w, "assign_take", kv("assign", id))
	}
	for i := range 10 {
		d.say(t, g2, r2, fmt.Sprintf("check %d", i), "ask", []string{ns[w], ns[h]})
	}
	for range 8 {
		id := d.assignTo(t, w, r2, ns[h])
		d.must(t, h, "assign_take", kv("assign", id, "payload", `{"result":"ok"}`))
	}
	if n := len(d.must(t, w, "todo_list", kv()).Body["todos"].([]any)); n != 50 {
		t.Fatalf("the turn should span pages, first page has %d", n)
	}

	// The client: todo_list → thread_get on each item's room → act.
	for round := 0; ; round++ {
		if round == 10 {
			t.Fatal("the turn never emptied")
		}
		turn := d.must(t, w, "todo_list", kv())
		todos := turn.Body["todos"].([]any)
		if len(todos) == 0 {
			if turn.Body["next_action"] != "wait" || turn.num("retry_after") != 60 {
				t.Fatalf("empty turn: %s", turn.Raw)
			}
			break
		}
		byRoom := map[string][]map[string]any{}
		for _, x := range todos {
			m := x.(map[string]any)
			byRoom[m["thread"].(string)] = append(byRoom[m["thread"].(string)], m)
		}
		for room, items := range byRoom {
			ids := []int64{}
			for _, it := range items {
				if it["assign"] != nil {
					ids = append(ids, int64(it["assign"].(float64)))
				}
			}
			v := d.view(t, w, room, "assignments", ids)
			// thread_get's todos are this room's slice of the turn.
			slice := map[string]bool{}
			for _, x := range v.Body["todos"].([]any) {
				m := x.(map[string]any)
				slice[fmt.Sprint(m["kind"], m["entry"], m["assign"])] = true
			}
			for _, it := range items {
				if !slice[fmt.Sprint(it["kind"], it["entry"], it["assign"])] {
					t.Fatalf("todo item %v missing from thread_get's todos", it)
				}
			}
			expanded := map[int64]map[string]any{}
			for _, x := range v.Body["assignments"].([]any) {
				m := x.(map[string]any)
				expanded[int64(m["id"].(float64))] = m
			}
			for _, it := range items {
				switch it["kind"] {
				case "reply":
					d.must(t, w, "thread_post", kv("thread", room, "content", "answer to "+it["summary"].(string), "reply_to", it["entry"]))
				case "deliver":
					a := expanded[int64(it["assign"].(float64))]
					if a == nil || a["requirements"] == nil {
						t.Fatalf("thread_get did not expand assignment %v: %s", it["assign"], v.Raw)
					}
					payload := any("done")
					if s, ok := a["output_schema"].(map[string]any); ok {
						payload = fill(s)
					}
					d.must(t, w, "assign_submit", kv("assign", it["assign"], "payload", payload))
				case "judge":
					a := expanded[int64(it["assign"].(float64))]
					if a == nil || a["payload"] == nil {
						t.Fatalf("no delivery to judge for %v: %s", it["assign"], v.Raw)
					}
					d.must(t, w, "assign_judge", kv("assign", it["assign"], "verdict", "adopt"))
				default:
					t.Fatalf("unknown item %v", it)
				}
			}
		}
	}
	for _, row := range d.must(t, w, "thread_list", kv()).Body["threads"].([]any) {
		if m := row.(map[string]any); m["open_items"] != float64(0) {
			t.Fatalf("room still owes: %v", m)
		}
	}
	wid := d.accountID(t, w)
	if n := d.dbInt(t, `SELECT (SELECT count(*) FROM thread_receipts WHERE account_id = $1 AND state = 'pending')
		+ (SELECT count(*) FROM assigns WHERE assignee_id = $1 AND state = 'taken')
		+ (SELECT count(*) FROM assigns WHERE creator_id = $1 AND state = 'delivered')`, wid); n != 0 {
		t.Fatalf("%d obligations left", n)
	}
	if n := d.dbInt(t, `SELECT count(*) FROM thread_receipts WHERE account_id = $1 AND resolution = 'reply'`, wid); n != 40 {
		t.Fatalf("replies = %d, want 40", n)
	}
	if n := d.dbInt(t, `SELECT count(*) FROM assigns WHERE assignee_id = $1 AND state = 'delivered'`, wid); n != 10 {
		t.Fatalf("deliveries = %d, want 10", n)
	}
	if n := d.dbInt(t, `SELECT count(*) FROM assigns WHERE creator_id = $1 AND state = 'adopted'`, wid); n != 8 {
		t.Fatalf("judgments = %d, want 8", n)
	}
}
