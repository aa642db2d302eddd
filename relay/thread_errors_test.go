package relay_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/relay"
)

// ---------------------------------------------------------------------------
// Helpers shared by thread_errors_test.go, thread_idem_test.go and
// thread_fuzz_test.go.
// ---------------------------------------------------------------------------

var roomKeyShape = regexp.MustCompile(`^kf_[0-9a-f]{32}$`)

// A credential-shaped string (the AWS documentation example key).
const awsKey = "AKIAIOSFODNN7EXAMPLE"

// kv builds an argument object from key/value pairs.
func kv(pairs ...any) map[string]any {
	m := map[string]any{}
	for i := 0; i+1 < len(pairs); i += 2 {
		m[pairs[i].(string)] = pairs[i+1]
	}
	return m
}

// openRoom starts a room owned by gov with a live speaker key.
func (d *dojo) openRoom(t testing.TB, gov string) (code, key string) {
	t.Helper()
	r := d.must(t, gov, "thread_start", kv("subject", "room", "key", true))
	return r.Body["thread"].(map[string]any)["code"].(string), r.str("key")
}

// newKey signs a fresh key of the given role and returns it raw.
func (d *dojo) newKey(t testing.TB, gov, code, role string) string {
	t.Helper()
	return d.must(t, gov, "thread_key", kv("thread", code, "role", role)).str("key")
}

// crew registers n accounts; names maps each key to its account name.
func (d *dojo) crew(t testing.TB, n int) (keys []string, names map[string]string) {
	t.Helper()
	names = map[string]string{}
	for range n {
		k, nm := d.register(t)
		keys, names[k] = append(keys, k), nm
	}
	return keys, names
}

// enter joins every key holder into the room behind roomKey.
func (d *dojo) enter(t testing.TB, roomKey string, who ...string) {
	t.Helper()
	for _, k := range who {
		d.must(t, k, "thread_join", kv("key", roomKey))
	}
}

// say posts text (plus extra arguments) and requires success.
func (d *dojo) say(t testing.TB, who, code, text string, extra ...any) result {
	t.Helper()
	a := kv(extra...)
	a["thread"], a["content"] = code, text
	return d.must(t, who, "thread_post", a)
}

// assignOf is the assignment id a post created.
func assignOf(t testing.TB, r result) int64 {
	t.Helper()
	a, ok := r.Body["assign"].(map[string]any)
	if !ok {
		t.Fatalf("no assignment in %s", r.Raw)
	}
	return int64(a["id"].(float64))
}

var urlSchema = map[string]any{"type": "object", "required": []string{"url"},
	"properties": map[string]any{"url": map[string]any{"type": "string"}}}

// assignTo posts an assignment for `to` and returns its id.
func (d *dojo) assignTo(t testing.TB, creator, code, to string, extra ...any) int64 {
	t.Helper()
	spec := kv("to", to, "requirements", "Write the page")
	for k, v := range kv(extra...) {
		spec[k] = v
	}
	return assignOf(t, d.say(t, creator, code, "work for "+to, "assign", spec))
}

// askedOf lists the names a post asked.
func askedOf(r result) []string {
	var out []string
	for _, x := range r.Body["asked"].([]any) {
		out = append(out, x.(string))
	}
	return out
}

// details returns error.details[k].
func details(r result, k string) any {
	e, _ := r.Body["error"].(map[string]any)
	dm, _ := e["details"].(map[string]any)
	return dm[k]
}

func (d *dojo) dbInt(t testing.TB, q string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := d.App.DB.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func (d *dojo) dbStr(t testing.TB, q string, args ...any) string {
	t.Helper()
	var s *string
	if err := d.App.DB.QueryRow(context.Background(), q, args...).Scan(&s); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	if s == nil {
		return ""
	}
	return *s
}

// world fingerprints every room fact, so a refused call can be shown to
// have changed nothing.
func (d *dojo) world(t testing.TB) string {
	t.Helper()
	return d.dbStr(t, `SELECT concat_ws(' | ',
		coalesce((SELECT string_agg(format('%s:%s:%s:%s', id, status, coalesce(encode(key_hash, 'hex'), '-'), next_seq), ',' ORDER BY id) FROM threads), ''),
		coalesce((SELECT string_agg(format('%s:%s:%s', thread_id, account_id, role), ',' ORDER BY thread_id, account_id) FROM thread_members), ''),
		(SELECT count(*)::text FROM thread_entries),
		coalesce((SELECT string_agg(format('%s:%s', id, state), ',' ORDER BY id) FROM thread_receipts), ''),
		coalesce((SELECT string_agg(format('%s:%s:%s', id, state, judge_forfeited_at IS NOT NULL), ',' ORDER BY id) FROM assigns), ''),
		coalesce((SELECT string_agg(format('%s:%s:%s:%s', id, status, visibility, revision), ',' ORDER BY id) FROM memories), ''),
		(SELECT count(*)::text FROM thread_idempotency))`)
}

// refuse asserts the call is refused with status/code and changed nothing.
func (d *dojo) refuse(t testing.TB, key, tool string, args map[string]any, status int, code string) result {
	t.Helper()
	before := d.world(t)
	r := d.call(t, key, tool, args)
	expect(t, r, status, code)
	if after := d.world(t); after != before {
		t.Fatalf("refused %s %v changed the world:\nbefore %s\nafter  %s", tool, args, before, after)
	}
	return r
}

// view is thread_get for who (must succeed).
func (d *dojo) view(t testing.TB, who, code string, extra ...any) result {
	t.Helper()
	a := kv(extra...)
	a["thread"] = code
	return d.must(t, who, "thread_get", a)
}

// roleOf is name's role in the room from the database ("" = not a member).
func (d *dojo) roleOf(t testing.TB, code, name string) string {
	t.Helper()
	return d.dbStr(t, `SELECT max(m.role) FROM thread_members m JOIN threads t ON t.id = m.thread_id
		JOIN accounts a ON a.id = m.account_id WHERE t.code = $1 AND a.name = $2`, code, name)
}

func (d *dojo) assignState(t testing.TB, id int64) string {
	t.Helper()
	return d.dbStr(t, `SELECT state FROM assigns WHERE id = $1`, id)
}

// receiptState is "state/resolution" of name's receipt on entry ("" = none).
func (d *dojo) receiptState(t testing.TB, entry int64, name string) string {
	t.Helper()
	return d.dbStr(t, `SELECT r.state || '/' || coalesce(r.resolution, '') FROM thread_receipts r
		JOIN accounts a ON a.id = r.account_id WHERE r.entry_id = $1 AND a.name = $2`, entry, name)
}

func sha(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }

func (d *dojo) accountID(t testing.TB, key string) int64 {
	t.Helper()
	return d.must(t, key, "account_status", kv()).num("bot_id")
}

// memoryOf creates a standalone memory for who; public shares it.
func (d *dojo) memoryOf(t testing.TB, who string, public bool) string {
	t.Helper()
	code := d.must(t, who, "memory_put", putArgs()).str("code")
	if public {
		d.must(t, who, "memory_share", kv("code", code))
	}
	return code
}

// codeOf is a thread_start result's room code.
func codeOf(r result) string { return r.Body["thread"].(map[string]any)["code"].(string) }

// ---------------------------------------------------------------------------
// thread_start
// ---------------------------------------------------------------------------

func TestThreadStartErrors(t *testing.T) {
	t.Parallel()
	d := start(t)
	gov, _ := d.register(t)
	joiner, _ := d.register(t)

	// 200 runes (400 bytes) is within the limit; the raw key appears once.
	subject := strings.Repeat("é", 200)
	st := d.must(t, gov, "thread_start", kv("subject", subject, "key", true))
	code, key := codeOf(st), st.str("key")
	th := st.Body["thread"].(map[string]any)
	if th["subject"] != subject || th["status"] != "open" || st.str("role") != "governor" || st.str("key_role") != "speaker" ||
		!roomKeyShape.MatchString(key) || st.str("key_fingerprint") != key[:7]+"…"+key[31:] || st.str("key_issued_at") == "" {
		t.Fatalf("thread_start: %s", st.Raw)
	}
	if h := d.dbStr(t, `SELECT encode(key_hash, 'hex') FROM threads WHERE code = $1`, code); h != sha(key) {
		t.Fatalf("stored key hash %s, want sha256 of the raw key", h)
	}
	if d.roleOf(t, code, d.nameOf(t, gov)) != "governor" {
		t.Fatal("the starter is not the governor")
	}

	// Without key: no key fields and no live key.
	plain := d.must(t, gov, "thread_start", kv("subject", "plain"))
	if _, has := plain.Body["key"]; has {
		t.Fatalf("thread_start without key shows a key: %s", plain.Raw)
	}
	if v := d.view(t, gov, codeOf(plain)); v.Body["key"].(map[string]any)["active"] != false {
		t.Fatalf("plain room has a live key: %s", v.Raw)
	}
	// key_role "read" is the observer alias.
	ro := d.must(t, gov, "thread_start", kv("key", true, "key_role", "read"))
	if ro.str("key_role") != "observer" {
		t.Fatalf("read key role: %s", ro.Raw)
	}
	if j := d.must(t, joiner, "thread_join", kv("key", ro.str("key"))); j.str("role") != "observer" {
		t.Fatalf("joined with a read key: %s", j.Raw)
	}

	for _, c := range []struct {
		name   string
		args   map[string]any
		status int
		code   string
	}{
		{"subject of 201 runes", kv("subject", strings.Repeat("é", 201)), 422, "VALIDATION_FAILED"},
		{"credential in subject", kv("subject", "deploy with "+awsKey), 422, "SENSITIVE_CONTENT"},
		{"room key in subject", kv("subject", "join with "+key, "key", true), 422, "SENSITIVE_CONTENT"},
		{"unknown key role", kv("subject", "x", "key", true, "key_role", "boss"), 422, "VALIDATION_FAILED"},
		{"subject not a string", kv("subject", 7), 422, "VALIDATION_FAILED"},
		{"unknown argument", kv("subject", "x", "colour", "red"), 422, "VALIDATION_FAILED"},
	} {
		t.Run(c.name, func(t *testing.T) { d.refuse(t, gov, "thread_start", c.args, c.status, c.code) })
	}
}

func TestThreadRoomLimit(t *testing.T) {
	t.Parallel()
	d := start(t)
	a, _ := d.register(t)
	b, _ := d.register(t)
	_, bKey := d.openRoom(t, b)
	_, bKey2 := d.openRoom(t, b)

	var first string
	for i := range 100 {
		r := d.must(t, a, "thread_start", kv("subject", fmt.Sprintf("room %d", i)))
		if i == 0 {
			first = codeOf(r)
		}
	}
	d.refuse(t, a, "thread_start", kv("subject", "one too many"), 409, "ROOM_LIMIT")
	d.refuse(t, a, "thread_join", kv("key", bKey), 409, "ROOM_LIMIT")

	// A closed room no longer counts; membership in another's room does.
	d.must(t, a, "thread_close", kv("thread", first))
	d.must(t, a, "thread_join", kv("key", bKey))
	d.refuse(t, a, "thread_start", kv("subject", "still too many"), 409, "ROOM_LIMIT")
	d.refuse(t, a, "thread_join", kv("key", bKey2), 409, "ROOM_LIMIT")
	if n := d.dbInt(t, `SELECT count(*) FROM thread_members m JOIN threads t ON t.id = m.thread_id
		WHERE m.account_id = $1 AND t.status = 'open'`, d.accountID(t, a)); n != 100 {
		t.Fatalf("open memberships = %d, want 100", n)
	}
	// Another account is unaffected by a's cap.
	c, _ := d.register(t)
	d.must(t, c, "thread_join", kv("key", bKey2))
}

// ---------------------------------------------------------------------------
// thread_key / thread_key_revoke
// ---------------------------------------------------------------------------

func TestThreadKeyErrors(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, _ := d.crew(t, 5)
	gov, sp, stranger, late, later := ks[0], ks[1], ks[2], ks[3], ks[4]
	code, k1 := d.openRoom(t, gov)
	d.enter(t, k1, sp)

	// Success: a new key voids the old one.
	r := d.must(t, gov, "thread_key", kv("thread", code, "role", "observer"))
	k2 := r.str("key")
	if !roomKeyShape.MatchString(k2) || k2 == k1 || r.str("key_role") != "observer" || r.str("key_fingerprint") != k2[:7]+"…"+k2[31:] ||
		r.Body["thread"].(map[string]any)["code"] != code {
		t.Fatalf("thread_key: %s", r.Raw)
	}
	d.refuse(t, late, "thread_join", kv("key", k1), 401, "KEY_INVALID")
	// Governors see the fingerprint; speakers only that a key is live.
	gk := d.view(t, gov, code).Body["key"].(map[string]any)
	sk := d.view(t, sp, code).Body["key"].(map[string]any)
	if gk["active"] != true || gk["role"] != "observer" || gk["fingerprint"] != r.str("key_fingerprint") || sk["active"] != true || sk["fingerprint"] != nil {
		t.Fatalf("key facts: governor %v, speaker %v", gk, sk)
	}

	for _, c := range []struct {
		name   string
		who    string
		tool   string
		args   map[string]any
		status int
		code   string
	}{
		{"speaker signs", sp, "thread_key", kv("thread", code), 403, "NOT_GOVERNOR"},
		{"unknown room", gov, "thread_key", kv("thread", "000000000000"), 404, "THREAD_NOT_FOUND"},
		{"bad code", gov, "thread_key", kv("thread", "not-a-code"), 422, "INVALID_CODE"},
		{"non-member", stranger, "thread_key", kv("thread", code), 403, "NOT_MEMBER"},
		{"bad role", gov, "thread_key", kv("thread", code, "role", "boss"), 422, "VALIDATION_FAILED"},
		{"missing thread", gov, "thread_key", kv(), 400, "MISSING_FIELD"},
		{"speaker revokes", sp, "thread_key_revoke", kv("thread", code), 403, "NOT_GOVERNOR"},
		{"non-member revokes", stranger, "thread_key_revoke", kv("thread", code), 403, "NOT_MEMBER"},
		{"revoke unknown room", gov, "thread_key_revoke", kv("thread", "000000000000"), 404, "THREAD_NOT_FOUND"},
		{"revoke bad code", gov, "thread_key_revoke", kv("thread", "zz"), 422, "INVALID_CODE"},
	} {
		t.Run(c.name, func(t *testing.T) { d.refuse(t, c.who, c.tool, c.args, c.status, c.code) })
	}

	// Revoke: no live key, joins refused; a second revoke reports nothing revoked.
	if rv := d.must(t, gov, "thread_key_revoke", kv("thread", code)); rv.Body["revoked"] != true {
		t.Fatalf("revoke: %s", rv.Raw)
	}
	if d.dbStr(t, `SELECT encode(key_hash, 'hex') FROM threads WHERE code = $1`, code) != "" ||
		d.view(t, gov, code).Body["key"].(map[string]any)["active"] != false {
		t.Fatal("revoked key is still live")
	}
	d.refuse(t, late, "thread_join", kv("key", k2), 401, "KEY_INVALID")
	if rv := d.must(t, gov, "thread_key_revoke", kv("thread", code)); rv.Body["revoked"] != false {
		t.Fatalf("second revoke: %s", rv.Raw)
	}
	k3 := d.newKey(t, gov, code, "speaker")
	if j := d.must(t, late, "thread_join", kv("key", k3)); j.str("role") != "speaker" {
		t.Fatalf("join with the new key: %s", j.Raw)
	}

	// A closed room signs and revokes nothing.
	d.must(t, gov, "thread_close", kv("thread", code))
	d.refuse(t, gov, "thread_key", kv("thread", code), 409, "THREAD_CLOSED")
	d.refuse(t, gov, "thread_key_revoke", kv("thread", code), 409, "THREAD_CLOSED")
	d.refuse(t, later, "thread_join", kv("key", k3), 401, "KEY_INVALID")
}

// ---------------------------------------------------------------------------
// thread_join
// ---------------------------------------------------------------------------

func TestThreadJoinErrors(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, _ := d.crew(t, 4)
	gov, joiner, obs, boss := ks[0], ks[1], ks[2], ks[3]
	code, k1 := d.openRoom(t, gov)
	k2 := d.newKey(t, gov, code, "speaker") // k1 is superseded
	closedRoom, closedKey := d.openRoom(t, gov)
	d.must(t, gov, "thread_close", kv("thread", closedRoom))
	revokedRoom, revokedKey := d.openRoom(t, gov)
	d.must(t, gov, "thread_key_revoke", kv("thread", revokedRoom))

	for _, c := range []struct{ name, key string }{
		{"empty", ""},
		{"malformed", "kf_123"},
		{"upper case hex", strings.ToUpper(k2)},
		{"agent key shape", "kf_live_" + strings.Repeat("ab", 32)},
		{"unknown", "kf_" + strings.Repeat("0", 32)},
		{"superseded", k1},
		{"revoked", revokedKey},
		{"closed room", closedKey},
	} {
		t.Run(c.name, func(t *testing.T) { d.refuse(t, joiner, "thread_join", kv("key", c.key), 401, "KEY_INVALID") })
	}

	j := d.must(t, joiner, "thread_join", kv("key", k2))
	if j.str("role") != "speaker" || j.Body["already_member"] != false || j.str("joined_at") == "" || codeOf(j) != code {
		t.Fatalf("join: %s", j.Raw)
	}
	// Joining again, even with a newer governor key, is the same membership.
	k3 := d.newKey(t, gov, code, "governor")
	again := d.must(t, joiner, "thread_join", kv("key", k3))
	if again.Body["already_member"] != true || again.str("role") != "speaker" || again.str("joined_at") != j.str("joined_at") {
		t.Fatalf("rejoin changed the membership: %s vs %s", again.Raw, j.Raw)
	}
	if h := d.dbStr(t, `SELECT encode(joined_via_key_hash, 'hex') FROM thread_members m JOIN threads t ON t.id = m.thread_id
		WHERE t.code = $1 AND m.account_id = $2`, code, d.accountID(t, joiner)); h != sha(k2) {
		t.Fatalf("joined_via_key_hash = %s, want the key used", h)
	}
	if r := d.must(t, boss, "thread_join", kv("key", k3)); r.str("role") != "governor" {
		t.Fatalf("governor key: %s", r.Raw)
	}
	k4 := d.newKey(t, gov, code, "observer")
	if r := d.must(t, obs, "thread_join", kv("key", "  "+k4+"  ")); r.str("role") != "observer" {
		t.Fatalf("observer key: %s", r.Raw)
	}
}

func TestThreadMemberLimit(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, _ := d.crew(t, 51)
	code, key := d.openRoom(t, ks[0])
	d.enter(t, key, ks[1:50]...)
	if n := d.dbInt(t, `SELECT count(*) FROM thread_members m JOIN threads t ON t.id = m.thread_id WHERE t.code = $1`, code); n != 50 {
		t.Fatalf("members = %d", n)
	}
	d.refuse(t, ks[50], "thread_join", kv("key", key), 409, "MEMBER_LIMIT")
	// A member at the limit still gets its existing membership back.
	if r := d.must(t, ks[1], "thread_join", kv("key", key)); r.Body["already_member"] != true {
		t.Fatalf("member rejoin at the limit: %s", r.Raw)
	}
	d.must(t, ks[1], "thread_leave", kv("thread", code))
	d.must(t, ks[50], "thread_join", kv("key", key))
	d.refuse(t, ks[1], "thread_join", kv("key", key), 409, "MEMBER_LIMIT")
}

func TestThreadJoinThrottle(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, _ := d.crew(t, 4)
	gov, guesser, patient, other := ks[0], ks[1], ks[2], ks[3]
	code, key := d.openRoom(t, gov)
	wrong := func(i int) string { return fmt.Sprintf("kf_%032x", i+1) }

	// 19 failures leave the account able to join.
	for i := range 19 {
		expect(t, d.call(t, patient, "thread_join", kv("key", wrong(i))), 401, "KEY_INVALID")
	}
	d.must(t, patient, "thread_join", kv("key", key))

	// After 20 failures even the live key is refused, for that account only.
	for i := range 20 {
		expect(t, d.call(t, guesser, "thread_join", kv("key", wrong(i))), 401, "KEY_INVALID")
	}
	d.refuse(t, guesser, "thread_join", kv("key", key), 401, "KEY_INVALID")
	if d.roleOf(t, code, d.nameOf(t, guesser)) != "" {
		t.Fatal("a throttled account joined")
	}
	if r := d.must(t, other, "thread_join", kv("key", key)); r.Body["already_member"] != false {
		t.Fatalf("another account: %s", r.Raw)
	}
}

// ---------------------------------------------------------------------------
// thread_post
// ---------------------------------------------------------------------------

func TestThreadPostErrors(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 5)
	gov, a, b, obs, stranger := ks[0], ks[1], ks[2], ks[3], ks[4]
	code, key := d.openRoom(t, gov)
	d.enter(t, key, a, b)
	d.enter(t, d.newKey(t, gov, code, "read"), obs)
	other, _ := d.openRoom(t, a)
	foreign := d.say(t, a, other, "elsewhere").num("entry")
	closed, closedKey := d.openRoom(t, gov)
	d.enter(t, closedKey, a)
	d.must(t, gov, "thread_close", kv("thread", closed))

	mine := d.memoryOf(t, a, false)
	theirsPrivate := d.memoryOf(t, b, false)
	theirsPublic := d.memoryOf(t, b, true)
	d.must(t, b, "memory_put", putArgs("code", theirsPublic, "content", content(120))) // now revision 2
	withdrawn := d.memoryOf(t, a, true)
	d.must(t, a, "memory_delete", kv("code", withdrawn))

	post := func(extra ...any) map[string]any {
		m := kv("thread", code, "content", "hello")
		for k, v := range kv(extra...) {
			if v == nil {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		return m
	}
	assign := func(extra ...any) map[string]any {
		m := kv("to", ns[b], "requirements", "do it")
		for k, v := range kv(extra...) {
			m[k] = v
		}
		return m
	}
	many := make([]string, 51)
	for i := range many {
		many[i] = ns[b]
	}
	for _, c := range []struct {
		name   string
		who    string
		args   map[string]any
		status int
		code   string
	}{
		{"observer speaks", obs, post(), 403, "READ_ONLY"},
		{"closed room", a, post("thread", closed), 409, "THREAD_CLOSED"},
		{"non-member", stranger, post(), 403, "NOT_MEMBER"},
		{"unknown room", a, post("thread", "000000000000"), 404, "THREAD_NOT_FOUND"},
		{"bad room code", a, post("thread", "xyz"), 422, "INVALID_CODE"},
		{"reply_to another room's entry", a, post("reply_to", foreign), 422, "INVALID_TARGET"},
		{"reply_to unknown entry", a, post("reply_to", 99999999), 422, "INVALID_TARGET"},
		{"ask a non-member", a, post("ask", []string{d.nameOf(t, stranger)}), 422, "INVALID_TARGET"},
		{"ask an unknown name", a, post("ask", []string{"nobody_here"}), 422, "INVALID_TARGET"},
		{"ask yourself", a, post("ask", []string{ns[a]}), 422, "INVALID_TARGET"},
		{"ask an observer", a, post("ask", []string{ns[obs]}), 422, "INVALID_TARGET"},
		{"ask 51", a, post("ask", many), 422, "VALIDATION_FAILED"},
		{"assign to a non-member", a, post("assign", assign("to", d.nameOf(t, stranger))), 422, "INVALID_TARGET"},
		{"assign to an observer", a, post("assign", assign("to", ns[obs])), 422, "INVALID_TARGET"},
		{"content over 500 without summary", a, post("content", content(501)), 422, "SUMMARY_REQUIRED"},
		{"content over 100 KB", a, post("content", content(102401), "summary", "big"), 413, "CONTENT_TOO_LARGE"},
		{"credential in content", a, post("content", "the key is "+awsKey), 422, "SENSITIVE_CONTENT"},
		{"room key in content", a, post("content", "join with "+key), 422, "SENSITIVE_CONTENT"},
		{"credential in summary", a, post("content", content(600), "summary", "key "+awsKey), 422, "SENSITIVE_CONTENT"},
		{"content and memory", a, post("memory", mine), 422, "VALIDATION_FAILED"},
		{"neither content nor memory", a, post("content", nil), 422, "VALIDATION_FAILED"},
		{"blank content", a, post("content", "  \n "), 422, "VALIDATION_FAILED"},
		{"summary over 500", a, post("content", content(600), "summary", strings.Repeat("s", 501)), 422, "VALIDATION_FAILED"},
		{"deliver_due 59", a, post("assign", assign("deliver_due", 59)), 422, "VALIDATION_FAILED"},
		{"deliver_due 604801", a, post("assign", assign("deliver_due", 604801)), 422, "VALIDATION_FAILED"},
		{"judge_due 59", a, post("assign", assign("judge_due", 59)), 422, "VALIDATION_FAILED"},
		{"judge_due 604801", a, post("assign", assign("judge_due", 604801)), 422, "VALIDATION_FAILED"},
		{"output_schema not a schema", a, post("assign", assign("output_schema", kv("type", 5))), 422, "VALIDATION_FAILED"},
		{"output_schema not an object", a, post("assign", assign("output_schema", "string")), 422, "VALIDATION_FAILED"},
		{"empty requirements", a, post("assign", assign("requirements", " ")), 422, "VALIDATION_FAILED"},
		{"requirements over 16 KB", a, post("assign", assign("requirements", content(16385))), 413, "CONTENT_TOO_LARGE"},
		{"credential in requirements", a, post("assign", assign("requirements", "use "+awsKey)), 422, "SENSITIVE_CONTENT"},
		{"assign without to", a, post("assign", kv("requirements", "x")), 400, "MISSING_FIELD"},
		{"pin a withdrawn memory", a, post("content", nil, "memory", withdrawn), 404, "NOT_FOUND"},
		{"pin an unknown memory", a, post("content", nil, "memory", "000000000000"), 404, "NOT_FOUND"},
		{"pin someone's private memory", a, post("content", nil, "memory", theirsPrivate), 422, "INVALID_TARGET"},
	} {
		t.Run(c.name, func(t *testing.T) { d.refuse(t, c.who, "thread_post", c.args, c.status, c.code) })
	}

	// Successes, with seq strictly increasing from 1.
	var seqs []int64
	p := d.must(t, a, "thread_post", post("content", content(500)))
	if p.num("seq") != 1 || p.num("revision") != 1 || len(p.str("memory")) != 12 || p.str("thread") != code || p.Body["fulfilled"] != false {
		t.Fatalf("post 500 characters: %s", p.Raw)
	}
	seqs = append(seqs, p.num("seq"))
	big := d.must(t, a, "thread_post", post("content", content(102400), "summary", "the whole manual"))
	seqs = append(seqs, big.num("seq"))
	own := d.must(t, a, "thread_post", post("content", nil, "memory", mine))
	if own.str("memory") != mine || own.num("revision") != 1 {
		t.Fatalf("pin own private memory: %s", own.Raw)
	}
	seqs = append(seqs, own.num("seq"))
	pub := d.must(t, a, "thread_post", post("content", nil, "memory", theirsPublic))
	if pub.str("memory") != theirsPublic || pub.num("revision") != 2 {
		t.Fatalf("pin someone's public memory: %s", pub.Raw)
	}
	seqs = append(seqs, pub.num("seq"))
	for _, due := range []int{60, 604800} {
		r := d.must(t, a, "thread_post", post("assign", assign("deliver_due", due, "judge_due", due, "output_schema", urlSchema)))
		if r.Body["assign"].(map[string]any)["state"] != "open" {
			t.Fatalf("assign with due %d: %s", due, r.Raw)
		}
		if s := d.dbInt(t, `SELECT deliver_due_s + judge_due_s FROM assigns WHERE id = $1`, assignOf(t, r)); s != int64(2*due) {
			t.Fatalf("dues stored %d, want %d", s, 2*due)
		}
		seqs = append(seqs, r.num("seq"))
	}
	self := d.must(t, a, "thread_post", post("assign", assign("to", ns[a])))
	seqs = append(seqs, self.num("seq"))
	if !slices.Equal(seqs, []int64{1, 2, 3, 4, 5, 6, 7}) {
		t.Fatalf("seqs = %v", seqs)
	}
	if n := d.dbInt(t, `SELECT count(*) FROM thread_entries e JOIN threads t ON t.id = e.thread_id WHERE t.code = $1`, code); n != 7 {
		t.Fatalf("entries = %d, want 7", n)
	}
	// The stored content is exactly what was posted.
	x := d.view(t, b, code, "entries", []int64{big.num("entry")}).Body["entries"].([]any)[0].(map[string]any)
	if x["content"] != content(102400) || x["readable"] != true {
		t.Fatal("the 100 KB entry was not stored verbatim")
	}
}

func TestThreadResponderRules(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 4)
	g, a, b, c := ks[0], ks[1], ks[2], ks[3]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a)

	check := func(label string, r result, want ...string) {
		t.Helper()
		got := askedOf(r)
		if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("%s: asked %v, want %v (%s)", label, got, want, r.Raw)
		}
		n := d.dbInt(t, `SELECT count(*) FROM thread_receipts WHERE entry_id = $1 AND state = 'pending'`, r.num("entry"))
		if n != int64(len(want)) {
			t.Fatalf("%s: %d pending receipts, want %d", label, n, len(want))
		}
	}
	// Rule 3: exactly two speakers, the other one owes.
	check("two speakers, governor posts", d.say(t, g, code, "hi"), ns[a])
	check("two speakers, speaker posts", d.say(t, a, code, "hi back"), ns[g])
	// ask [] = notify only.
	check("ask []", d.say(t, g, code, "fyi", "ask", []string{}), []string{}...)

	d.enter(t, key, b)
	// Rule 1: explicit ask by any-case name or id, deduplicated, in order.
	all := d.say(t, g, code, "everyone", "ask", []any{strings.ToUpper(ns[a]), d.accountID(t, b), ns[a]})
	check("explicit ask", all, ns[a], ns[b])
	// Rule 4: three speakers, no reply, no ask.
	open := d.say(t, g, code, "anyone?")
	check("three speakers", open)
	// Rule 2: a reply asks the author of the entry replied to.
	r1 := d.say(t, a, code, "me", "reply_to", open.num("entry"))
	check("reply without own receipt", r1, ns[g])
	if r1.Body["fulfilled"] != false {
		t.Fatalf("reply without a receipt fulfilled something: %s", r1.Raw)
	}
	r2 := d.say(t, a, code, "here", "reply_to", all.num("entry"))
	check("reply with own receipt", r2, ns[g])
	if r2.Body["fulfilled"] != true || d.receiptState(t, all.num("entry"), ns[a]) != "fulfilled/reply" {
		t.Fatalf("reply did not fulfil the receipt: %s", r2.Raw)
	}
	// Replying to your own entry is not rule 2; three speakers ⇒ nobody.
	check("reply to own entry", d.say(t, g, code, "addendum", "reply_to", open.num("entry")))
	// An explicit ask beats the reply rule.
	check("reply with ask", d.say(t, a, code, "cc b", "reply_to", open.num("entry"), "ask", []string{ns[b]}), ns[b])
	check("reply with ask []", d.say(t, a, code, "silent", "reply_to", open.num("entry"), "ask", []string{}))

	// Rule 2 has no fallback: b's entry, b demoted to observer; two speakers
	// remain, yet a reply to b's entry asks nobody.
	fromB := d.say(t, b, code, "from b")
	d.must(t, g, "thread_set_role", kv("thread", code, "account", ns[b], "role", "observer"))
	check("reply to a demoted author", d.say(t, a, code, "re b", "reply_to", fromB.num("entry")))
	// Observers do not count as speakers for rule 3.
	check("two speakers and an observer", d.say(t, a, code, "plain"), ns[g])

	// The author of the entry left: nobody.
	d.enter(t, key, c)
	fromC := d.say(t, c, code, "from c")
	d.must(t, c, "thread_leave", kv("thread", code))
	check("reply to a departed author", d.say(t, a, code, "re c", "reply_to", fromC.num("entry")))
}

// ---------------------------------------------------------------------------
// thread_handle / thread_retract
// ---------------------------------------------------------------------------

func TestThreadHandleRetractErrors(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 4)
	g, a, b, stranger := ks[0], ks[1], ks[2], ks[3]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a, b)
	other, _ := d.openRoom(t, a)
	foreign := d.say(t, a, other, "elsewhere").num("entry")
	ask := d.say(t, g, code, "both of you", "ask", []string{ns[a], ns[b]})
	e := ask.num("entry")

	for _, c := range []struct {
		name   string
		who    string
		tool   string
		args   map[string]any
		status int
		code   string
	}{
		{"handle without receipt", g, "thread_handle", kv("thread", code, "entry", e), 422, "INVALID_TARGET"},
		{"handle another room's entry", a, "thread_handle", kv("thread", code, "entry", foreign), 422, "INVALID_TARGET"},
		{"handle note over 1000", a, "thread_handle", kv("thread", code, "entry", e, "note", strings.Repeat("n", 1001)), 422, "VALIDATION_FAILED"},
		{"handle note with credential", a, "thread_handle", kv("thread", code, "entry", e, "note", awsKey), 422, "SENSITIVE_CONTENT"},
		{"handle as non-member", stranger, "thread_handle", kv("thread", code, "entry", e), 403, "NOT_MEMBER"},
		{"handle unknown room", a, "thread_handle", kv("thread", "000000000000", "entry", e), 404, "THREAD_NOT_FOUND"},
		{"retract as non-author", a, "thread_retract", kv("thread", code, "entry", e), 403, "NOT_YOURS"},
		{"retract as non-member", stranger, "thread_retract", kv("thread", code, "entry", e), 403, "NOT_MEMBER"},
		{"retract another room's entry", a, "thread_retract", kv("thread", code, "entry", foreign), 422, "INVALID_TARGET"},
	} {
		t.Run(c.name, func(t *testing.T) { d.refuse(t, c.who, c.tool, c.args, c.status, c.code) })
	}

	// a handles with a 1000-character note; a second handle has nothing to end.
	note := strings.Repeat("n", 1000)
	if h := d.must(t, a, "thread_handle", kv("thread", code, "entry", e, "note", note)); h.Body["handled"] != true || h.num("entry") != e {
		t.Fatalf("handle: %s", h.Raw)
	}
	d.refuse(t, a, "thread_handle", kv("thread", code, "entry", e), 422, "INVALID_TARGET")
	if d.receiptState(t, e, ns[a]) != "fulfilled/handle" || d.dbStr(t, `SELECT note FROM thread_receipts WHERE entry_id = $1 AND note IS NOT NULL`, e) != note {
		t.Fatal("handle not recorded")
	}
	// Retract withdraws only what is still pending (b's), then nothing.
	if r := d.must(t, g, "thread_retract", kv("thread", code, "entry", e)); r.num("withdrawn") != 1 {
		t.Fatalf("retract: %s", r.Raw)
	}
	if d.receiptState(t, e, ns[b]) != "withdrawn/retract" || d.receiptState(t, e, ns[a]) != "fulfilled/handle" {
		t.Fatal("retract touched the wrong receipts")
	}
	if r := d.must(t, g, "thread_retract", kv("thread", code, "entry", e)); r.num("withdrawn") != 0 {
		t.Fatalf("second retract: %s", r.Raw)
	}
	expectTurn(t, d, "b", b)
	d.refuse(t, b, "thread_handle", kv("thread", code, "entry", e), 422, "INVALID_TARGET")
}

// ---------------------------------------------------------------------------
// thread_leave / thread_remove / thread_set_role
// ---------------------------------------------------------------------------

func TestThreadMembershipErrors(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 4)
	g, a, b, stranger := ks[0], ks[1], ks[2], ks[3]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a, b)

	for _, c := range []struct {
		name   string
		who    string
		tool   string
		args   map[string]any
		status int
		code   string
	}{
		{"last governor leaves", g, "thread_leave", kv("thread", code), 409, "LAST_MANAGER"},
		{"last governor removes itself", g, "thread_remove", kv("thread", code, "account", ns[g]), 409, "LAST_MANAGER"},
		{"last governor demotes itself to speaker", g, "thread_set_role", kv("thread", code, "account", ns[g], "role", "speaker"), 409, "LAST_MANAGER"},
		{"last governor demotes itself to observer", g, "thread_set_role", kv("thread", code, "account", ns[g], "role", "observer"), 409, "LAST_MANAGER"},
		{"remove a non-member", g, "thread_remove", kv("thread", code, "account", d.nameOf(t, stranger)), 422, "INVALID_TARGET"},
		{"remove an unknown id", g, "thread_remove", kv("thread", code, "account", 99999999), 422, "INVALID_TARGET"},
		{"set_role of a non-member", g, "thread_set_role", kv("thread", code, "account", d.nameOf(t, stranger), "role", "speaker"), 422, "INVALID_TARGET"},
		{"set the same role", g, "thread_set_role", kv("thread", code, "account", ns[a], "role", "speaker"), 422, "INVALID_TARGET"},
		{"set governor to governor", g, "thread_set_role", kv("thread", code, "account", ns[g], "role", "governor"), 422, "INVALID_TARGET"},
		{"set an unknown role", g, "thread_set_role", kv("thread", code, "account", ns[a], "role", "read"), 422, "VALIDATION_FAILED"},
		{"speaker removes", a, "thread_remove", kv("thread", code, "account", ns[b]), 403, "NOT_GOVERNOR"},
		{"speaker sets a role", a, "thread_set_role", kv("thread", code, "account", ns[b], "role", "observer"), 403, "NOT_GOVERNOR"},
		{"non-member leaves", stranger, "thread_leave", kv("thread", code), 403, "NOT_MEMBER"},
		{"non-member removes", stranger, "thread_remove", kv("thread", code, "account", ns[a]), 403, "NOT_MEMBER"},
		{"leave unknown room", a, "thread_leave", kv("thread", "000000000000"), 404, "THREAD_NOT_FOUND"},
	} {
		t.Run(c.name, func(t *testing.T) { d.refuse(t, c.who, c.tool, c.args, c.status, c.code) })
	}

	// Promote a (by id), then the first governor may leave.
	if r := d.must(t, g, "thread_set_role", kv("thread", code, "account", d.accountID(t, a), "role", "governor")); r.str("role") != "governor" || r.str("account") != ns[a] {
		t.Fatalf("promote: %s", r.Raw)
	}
	if r := d.must(t, g, "thread_leave", kv("thread", code)); r.str("account") != ns[g] {
		t.Fatalf("leave: %s", r.Raw)
	}
	if d.roleOf(t, code, ns[g]) != "" || d.roleOf(t, code, ns[a]) != "governor" {
		t.Fatal("membership after leave is wrong")
	}
	d.refuse(t, a, "thread_set_role", kv("thread", code, "account", ns[a], "role", "observer"), 409, "LAST_MANAGER")
	if r := d.must(t, a, "thread_remove", kv("thread", code, "account", ns[b])); r.str("account") != ns[b] {
		t.Fatalf("remove: %s", r.Raw)
	}
	d.refuse(t, b, "thread_get", kv("thread", code), 403, "NOT_MEMBER")
	d.refuse(t, a, "thread_remove", kv("thread", code, "account", ns[b]), 422, "INVALID_TARGET")
}

func TestThreadDemotionKeepsAssignments(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 3)
	g, a, b := ks[0], ks[1], ks[2]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a, b)
	work := d.assignTo(t, g, code, ns[a], "output_schema", urlSchema)
	later := d.assignTo(t, g, code, ns[a])
	d.must(t, a, "assign_take", kv("assign", work))
	q1 := d.say(t, g, code, "question", "ask", []string{ns[a], ns[b]}).num("entry")
	q2 := d.say(t, b, code, "another", "ask", []string{ns[a]}).num("entry")

	r := d.must(t, g, "thread_set_role", kv("thread", code, "account", ns[a], "role", "observer"))
	if r.num("withdrawn") != 2 || r.str("role") != "observer" {
		t.Fatalf("demote: %s", r.Raw)
	}
	if d.receiptState(t, q1, ns[a]) != "withdrawn/role_change" || d.receiptState(t, q2, ns[a]) != "withdrawn/role_change" ||
		d.receiptState(t, q1, ns[b]) != "pending/" {
		t.Fatal("demotion withdrew the wrong receipts")
	}
	expectTurn(t, d, "a", a, fmt.Sprintf("deliver:%d", work))
	d.refuse(t, a, "thread_post", kv("thread", code, "content", "can I speak?"), 403, "READ_ONLY")
	// The observer still delivers what it took; the creator judges it.
	if s := d.must(t, a, "assign_submit", kv("assign", work, "payload", kv("url", "https://example.org"))); s.str("state") != "delivered" {
		t.Fatalf("observer delivery: %s", s.Raw)
	}
	d.must(t, g, "assign_judge", kv("assign", work, "verdict", "adopt"))
	// It keeps its assignment rights: an open one addressed to it can still be taken.
	if tk := d.must(t, a, "assign_take", kv("assign", later, "payload", `"ok"`)); tk.str("state") != "delivered" {
		t.Fatalf("observer take: %s", tk.Raw)
	}
	// Promoting back to speaker restores speech but not the withdrawn receipts.
	d.must(t, g, "thread_set_role", kv("thread", code, "account", ns[a], "role", "speaker"))
	expectTurn(t, d, "a", a)
	d.say(t, a, code, "back")
}

func TestThreadLeaveCascade(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 4)
	g, h, a, b := ks[0], ks[1], ks[2], ks[3]
	code, key := d.openRoom(t, g)
	d.enter(t, d.newKey(t, g, code, "governor"), h)
	key = d.newKey(t, g, code, "speaker")
	d.enter(t, key, a, b)

	open := d.assignTo(t, h, code, ns[a])
	taken := d.assignTo(t, h, code, ns[a])
	delivered := d.assignTo(t, h, code, ns[a])
	byA := d.assignTo(t, a, code, ns[b])
	keep := d.assignTo(t, h, code, ns[b])
	d.must(t, a, "assign_take", kv("assign", taken))
	d.must(t, a, "assign_take", kv("assign", delivered, "payload", `{"done":true}`))
	q := d.say(t, h, code, "status?", "ask", []string{ns[a]}).num("entry")

	r := d.must(t, a, "thread_leave", kv("thread", code))
	if r.num("withdrawn") != 1 || r.num("voided") != 3 || r.num("forfeited") != 0 {
		t.Fatalf("a leaves: %s", r.Raw)
	}
	for id, want := range map[int64]string{open: "voided", taken: "voided", byA: "voided", delivered: "delivered", keep: "open"} {
		if s := d.assignState(t, id); s != want {
			t.Fatalf("assignment %d is %s, want %s", id, s, want)
		}
	}
	if d.receiptState(t, q, ns[a]) != "withdrawn/leave" {
		t.Fatal("leave did not withdraw the receipt")
	}
	expect(t, d.call(t, a, "assign_take", kv("assign", keep)), 403, "NOT_MEMBER")
	expectTurn(t, d, "h", h, fmt.Sprintf("judge:%d", delivered))

	// h leaves: its delivered assignment loses its judge for good.
	r = d.must(t, h, "thread_leave", kv("thread", code))
	if r.num("forfeited") != 1 || r.num("voided") != 1 {
		t.Fatalf("h leaves: %s", r.Raw)
	}
	expectTurn(t, d, "h", h)
	expect(t, d.call(t, h, "assign_judge", kv("assign", delivered, "verdict", "adopt")), 403, "NOT_MEMBER")
	d.enter(t, d.newKey(t, g, code, "governor"), h)
	j := d.refuse(t, h, "assign_judge", kv("assign", delivered, "verdict", "adopt"), 409, "INVALID_STATE")
	if details(j, "status") != "delivered" {
		t.Fatalf("forfeited judge details: %s", j.Raw)
	}
	expectTurn(t, d, "h", h)
	x := d.view(t, g, code, "assignments", []int64{delivered}).Body["assignments"].([]any)
	for _, row := range x {
		m := row.(map[string]any)
		if int64(m["id"].(float64)) == delivered && m["judge_forfeited"] != true {
			t.Fatalf("thread_get does not show the forfeit: %v", m)
		}
	}
}

// ---------------------------------------------------------------------------
// thread_close
// ---------------------------------------------------------------------------

func TestThreadCloseErrors(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 3)
	g, a, stranger := ks[0], ks[1], ks[2]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a)
	d.assignTo(t, g, code, ns[a])
	d.say(t, g, code, "please", "ask", []string{ns[a]})

	d.refuse(t, a, "thread_close", kv("thread", code), 403, "NOT_GOVERNOR")
	d.refuse(t, stranger, "thread_close", kv("thread", code), 403, "NOT_MEMBER")
	d.refuse(t, g, "thread_close", kv("thread", "000000000000"), 404, "THREAD_NOT_FOUND")
	c := d.must(t, g, "thread_close", kv("thread", code))
	// Two entries asked a (the assignment entry by rule 3, then the ask).
	if c.Body["thread"].(map[string]any)["status"] != "closed" || c.num("voided") != 1 || c.num("withdrawn") != 2 {
		t.Fatalf("close: %s", c.Raw)
	}
	d.refuse(t, g, "thread_close", kv("thread", code), 409, "THREAD_CLOSED")
	d.refuse(t, a, "thread_close", kv("thread", code), 409, "THREAD_CLOSED")
	if d.dbInt(t, `SELECT count(*) FROM threads WHERE code = $1 AND key_hash IS NULL AND closed_at IS NOT NULL`, code) != 1 {
		t.Fatal("close kept the key")
	}
	// Members may leave a closed room, the last governor included.
	d.must(t, a, "thread_leave", kv("thread", code))
	if r := d.must(t, g, "thread_leave", kv("thread", code)); r.str("account") != ns[g] {
		t.Fatalf("last governor leaves a closed room: %s", r.Raw)
	}
	d.refuse(t, g, "thread_get", kv("thread", code), 403, "NOT_MEMBER")
}

// ---------------------------------------------------------------------------
// thread_get
// ---------------------------------------------------------------------------

func TestThreadGetErrorsAndPaging(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 3)
	g, a, stranger := ks[0], ks[1], ks[2]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a)

	for _, c := range []struct {
		name   string
		who    string
		args   map[string]any
		status int
		code   string
	}{
		{"unknown room", g, kv("thread", "000000000000"), 404, "THREAD_NOT_FOUND"},
		{"non-member", stranger, kv("thread", code), 403, "NOT_MEMBER"},
		{"bad code", g, kv("thread", "room-1"), 422, "INVALID_CODE"},
		{"cursor not a number", g, kv("thread", code, "cursor", "abc"), 422, "VALIDATION_FAILED"},
		{"cursor zero", g, kv("thread", code, "cursor", "0"), 422, "VALIDATION_FAILED"},
		{"cursor negative", g, kv("thread", code, "cursor", "-5"), 422, "VALIDATION_FAILED"},
		{"bad assignments_cursor", g, kv("thread", code, "assignments_cursor", "x"), 422, "VALIDATION_FAILED"},
		{"51 entries", g, kv("thread", code, "entries", make([]int64, 51)), 422, "VALIDATION_FAILED"},
	} {
		t.Run(c.name, func(t *testing.T) { d.refuse(t, c.who, "thread_get", c.args, c.status, c.code) })
	}

	// 120 entries page 50/50/20, newest first, nothing repeated or skipped.
	for i := range 120 {
		d.say(t, g, code, fmt.Sprintf("entry %d", i+1), "ask", []string{})
	}
	var seqs []int64
	cursor := ""
	for page := 0; ; page++ {
		args := []any{}
		if cursor != "" {
			args = append(args, "cursor", cursor)
		}
		v := d.view(t, a, code, args...)
		rows := v.Body["timeline"].([]any)
		if want := []int{50, 50, 20}[page]; len(rows) != want {
			t.Fatalf("page %d has %d rows, want %d", page, len(rows), want)
		}
		for _, r := range rows {
			seqs = append(seqs, int64(r.(map[string]any)["seq"].(float64)))
		}
		nc, _ := v.Body["next_cursor"].(string)
		if page == 2 {
			if v.Body["next_cursor"] != nil {
				t.Fatalf("last page has a cursor: %v", v.Body["next_cursor"])
			}
			break
		}
		if nc == "" {
			t.Fatalf("page %d has no next_cursor", page)
		}
		cursor = nc
	}
	for i, s := range seqs {
		if s != int64(120-i) {
			t.Fatalf("timeline seqs %v are not 120..1", seqs)
		}
	}

	// Ids from a room the caller is not in expand to nothing.
	elsewhere, _ := d.openRoom(t, stranger)
	secret := d.say(t, stranger, elsewhere, "secret plan", "assign", kv("to", d.nameOf(t, stranger), "requirements", "secret work"))
	leak := d.view(t, a, code, "entries", []int64{secret.num("entry")}, "assignments", []int64{assignOf(t, secret)})
	if len(leak.Body["entries"].([]any)) != 0 || len(leak.Body["assignments"].([]any)) != 0 || strings.Contains(leak.Raw, "secret") {
		t.Fatalf("another room's entry or assignment leaked: %s", leak.Raw)
	}

	// Readability of pinned versions: another author's standalone memory
	// shows content only while it is active and public.
	mem := d.memoryOf(t, a, true)
	pin := d.must(t, a, "thread_post", kv("thread", code, "memory", mem)).num("entry")
	own := d.say(t, a, code, "thread content, readable by members").num("entry")
	d.must(t, a, "memory_put", putArgs("code", mem, "content", content(200))) // revision 2 is not what was pinned
	expanded := func(who string) map[string]map[string]any {
		out := map[string]map[string]any{}
		for _, x := range d.view(t, who, code, "entries", []int64{pin, own, 99999999}).Body["entries"].([]any) {
			m := x.(map[string]any)
			out[fmt.Sprint(m["entry"])] = m
		}
		return out
	}
	pk, ok := fmt.Sprint(pin), fmt.Sprint(own)
	e := expanded(g)
	if len(e) != 2 || e[pk]["readable"] != true || e[pk]["content"] != content(80) || e[pk]["revision"] != float64(1) ||
		e[ok]["readable"] != true || e[ok]["content"] != "thread content, readable by members" {
		t.Fatalf("public pin expansion: %v", e)
	}
	d.must(t, a, "memory_unshare", kv("code", mem))
	if e := expanded(g); e[pk]["readable"] != false || e[pk]["content"] != nil || e[pk]["checksum"] == "" || e[ok]["readable"] != true {
		t.Fatalf("private pin shown to another member: %v", e)
	}
	if e := expanded(a); e[pk]["readable"] != true || e[pk]["content"] != content(80) {
		t.Fatalf("author cannot read its own pin: %v", e)
	}
	d.must(t, a, "memory_share", kv("code", mem))
	if e := expanded(g); e[pk]["content"] != content(80) {
		t.Fatalf("re-shared pin: %v", e)
	}
	d.must(t, a, "memory_delete", kv("code", mem))
	if e := expanded(g); e[pk]["readable"] != false || e[pk]["content"] != nil {
		t.Fatalf("withdrawn pin shown to another member: %v", e)
	}
	if e := expanded(a); e[pk]["content"] != content(80) {
		t.Fatalf("author lost its withdrawn pin: %v", e)
	}
	_ = ns
}

func TestThreadGetAssignmentDigest(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 3)
	g, a, b := ks[0], ks[1], ks[2]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a, b)
	var ids []int64
	for i := range 55 {
		to := ns[a]
		if i%5 == 0 {
			to = ns[b]
		}
		ids = append(ids, d.assignTo(t, g, code, to))
	}
	d.must(t, a, "assign_take", kv("assign", ids[1]))
	digest := func(who string, extra ...any) ([]int64, string, result) {
		v := d.view(t, who, code, extra...)
		var got []int64
		for _, x := range v.Body["assignments"].([]any) {
			got = append(got, int64(x.(map[string]any)["id"].(float64)))
		}
		c, _ := v.Body["assignments_cursor"].(string)
		return got, c, v
	}
	p1, c1, v1 := digest(g)
	p2, c2, _ := digest(g, "assignments_cursor", c1)
	all := slices.Concat(p1, p2)
	want := slices.Clone(ids)
	slices.Reverse(want)
	if len(p1) != 50 || c1 == "" || c2 != "" || !slices.Equal(all, want) {
		t.Fatalf("digest pages %v / %v", p1, p2)
	}
	if strings.Contains(v1.Raw, "requirements") {
		t.Fatal("light digest rows carry requirements")
	}
	// a's open ones only: 44 addressed to a, one of them taken.
	mine, _, _ := digest(a, "assignments_mine_open", true)
	if len(mine) != 43 || slices.Contains(mine, ids[1]) || slices.Contains(mine, ids[0]) {
		t.Fatalf("assignments_mine_open = %d rows: %v", len(mine), mine)
	}
	// Expanding an id from page 2 adds it with its details.
	x, _, v := digest(g, "assignments", []int64{ids[0]})
	if len(x) != 51 || x[50] != ids[0] || !strings.Contains(v.Raw, `"requirements":"Write the page"`) {
		t.Fatalf("expansion of an off-page assignment: %v", x)
	}
}

// ---------------------------------------------------------------------------
// thread_list
// ---------------------------------------------------------------------------

func TestThreadListCounts(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 2)
	g, a := ks[0], ks[1]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a)

	// a owes: one reply, one delivery, one judgment; two open invites.
	d.say(t, g, code, "question", "ask", []string{ns[a]})
	taken := d.assignTo(t, g, code, ns[a])
	d.must(t, a, "assign_take", kv("assign", taken))
	d.assignTo(t, g, code, ns[a])
	d.assignTo(t, g, code, ns[a])
	toG := d.assignTo(t, a, code, ns[g])
	d.must(t, g, "assign_take", kv("assign", toG, "payload", `"done"`))
	// The assignment posts above also asked a (rule 3); settle those receipts.
	for _, it := range d.must(t, a, "todo_list", kv()).Body["todos"].([]any) {
		m := it.(map[string]any)
		if m["kind"] == "reply" && m["summary"] != "question" {
			d.must(t, a, "thread_handle", kv("thread", code, "entry", m["entry"]))
		}
	}
	row := func(who, status string) map[string]any {
		args := kv()
		if status != "" {
			args["status"] = status
		}
		l := d.must(t, who, "thread_list", args)
		for _, r := range l.Body["threads"].([]any) {
			if m := r.(map[string]any); codeOf(result{Body: m}) == code {
				return m
			}
		}
		return nil
	}
	ar := row(a, "open")
	if ar == nil || ar["open_items"] != float64(3) || ar["open_invites"] != float64(2) || ar["role"] != "speaker" {
		t.Fatalf("a's row: %v", ar)
	}
	if opp := d.must(t, a, "todo_list", kv()).Body["opportunities"].(map[string]any); opp["assignments"] != float64(2) {
		t.Fatalf("opportunities %v, want 2 assignments like open_invites", opp)
	}
	if gr := row(g, ""); gr == nil || gr["open_items"] != float64(0) || gr["open_invites"] != float64(0) || gr["role"] != "governor" {
		t.Fatalf("g's row: %v", gr)
	}

	// Status filter and paging: g is in 55 open rooms and 3 closed ones.
	var closed []string
	for i := range 57 {
		c, _ := d.openRoom(t, g)
		if i < 3 {
			d.must(t, g, "thread_close", kv("thread", c))
			closed = append(closed, c)
		}
	}
	collect := func(status string) []string {
		var codes []string
		cursor := ""
		for range 10 {
			args := kv("status", status)
			if status == "" {
				delete(args, "status")
			}
			if cursor != "" {
				args["cursor"] = cursor
			}
			l := d.must(t, g, "thread_list", args)
			for _, r := range l.Body["threads"].([]any) {
				m := r.(map[string]any)
				if status != "" && m["thread"].(map[string]any)["status"] != status {
					t.Fatalf("status filter %q returned %v", status, m)
				}
				codes = append(codes, codeOf(result{Body: m}))
			}
			nc, _ := l.Body["next_cursor"].(string)
			if nc == "" {
				return codes
			}
			if len(l.Body["threads"].([]any)) != 50 {
				t.Fatalf("a non-final page has %d rows", len(l.Body["threads"].([]any)))
			}
			cursor = nc
		}
		t.Fatal("thread_list never ended")
		return nil
	}
	all, open, shut := collect(""), collect("open"), collect("closed")
	if len(all) != 58 || len(open) != 55 || len(shut) != 3 {
		t.Fatalf("rooms: all %d, open %d, closed %d", len(all), len(open), len(shut))
	}
	seen := map[string]bool{}
	for _, c := range all {
		if seen[c] {
			t.Fatalf("room %s listed twice", c)
		}
		seen[c] = true
	}
	slices.Sort(shut)
	slices.Sort(closed)
	if !slices.Equal(shut, closed) {
		t.Fatalf("closed rooms %v, want %v", shut, closed)
	}
	expect(t, d.call(t, g, "thread_list", kv("cursor", "abc")), 422, "VALIDATION_FAILED")
	expect(t, d.call(t, g, "thread_list", kv("status", "archived")), 422, "VALIDATION_FAILED")
}

// ---------------------------------------------------------------------------
// assign_*
// ---------------------------------------------------------------------------

func TestAssignErrors(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 4)
	g, a, b, stranger := ks[0], ks[1], ks[2], ks[3]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a, b)
	url := kv("url", "https://example.org")

	open := d.assignTo(t, g, code, ns[a], "output_schema", urlSchema)
	taken := d.assignTo(t, g, code, ns[a], "output_schema", urlSchema)
	delivered := d.assignTo(t, g, code, ns[a], "output_schema", urlSchema)
	adopted := d.assignTo(t, g, code, ns[a])
	voided := d.assignTo(t, g, code, ns[a])
	free := d.assignTo(t, g, code, ns[a]) // no schema

	tk := d.must(t, a, "assign_take", kv("assign", taken))
	if tk.str("state") != "taken" || tk.str("deliver_due_at") == "" || tk.str("thread") != code {
		t.Fatalf("take: %s", tk.Raw)
	}
	d.must(t, a, "assign_take", kv("assign", delivered, "payload", url))
	d.must(t, a, "assign_take", kv("assign", adopted, "payload", `{"x":1}`))
	if j := d.must(t, g, "assign_judge", kv("assign", adopted, "verdict", "adopt")); j.str("state") != "adopted" || j.str("verdict") != "adopt" {
		t.Fatalf("judge: %s", j.Raw)
	}
	if v := d.must(t, g, "assign_void", kv("assign", voided)); v.str("state") != "voided" {
		t.Fatalf("void: %s", v.Raw)
	}
	d.must(t, a, "assign_take", kv("assign", free))
	bMem := d.memoryOf(t, b, true)
	aMem := d.memoryOf(t, a, false)
	tooMany := make([]map[string]any, 11)
	for i := range tooMany {
		tooMany[i] = kv("code", aMem)
	}

	const none = 99999999
	type refusal struct {
		name   string
		who    string
		tool   string
		args   map[string]any
		status int
		code   string
		state  string // details.status for INVALID_STATE
	}
	for _, c := range []refusal{
		{"take unknown", a, "assign_take", kv("assign", none), 404, "ASSIGN_NOT_FOUND", ""},
		{"submit unknown", a, "assign_submit", kv("assign", none, "payload", url), 404, "ASSIGN_NOT_FOUND", ""},
		{"judge unknown", g, "assign_judge", kv("assign", none, "verdict", "adopt"), 404, "ASSIGN_NOT_FOUND", ""},
		{"drop unknown", a, "assign_drop", kv("assign", none), 404, "ASSIGN_NOT_FOUND", ""},
		{"void unknown", g, "assign_void", kv("assign", none), 404, "ASSIGN_NOT_FOUND", ""},
		{"take as non-member", stranger, "assign_take", kv("assign", open), 403, "NOT_MEMBER", ""},
		{"take someone else's", b, "assign_take", kv("assign", open), 403, "NOT_YOURS", ""},
		{"submit someone else's", b, "assign_submit", kv("assign", taken, "payload", url), 403, "NOT_YOURS", ""},
		{"judge as assignee", a, "assign_judge", kv("assign", delivered, "verdict", "adopt"), 403, "NOT_YOURS", ""},
		{"drop as creator", g, "assign_drop", kv("assign", taken), 403, "NOT_YOURS", ""},
		{"void as assignee", a, "assign_void", kv("assign", open), 403, "NOT_YOURS", ""},
		{"take+submit off schema", a, "assign_take", kv("assign", open, "payload", kv("url", 5)), 422, "SCHEMA_MISMATCH", ""},
		{"take twice", a, "assign_take", kv("assign", taken), 409, "INVALID_STATE", "taken"},
		{"submit untaken", a, "assign_submit", kv("assign", open, "payload", url), 409, "INVALID_STATE", "open"},
		{"submit twice", a, "assign_submit", kv("assign", delivered, "payload", url), 409, "INVALID_STATE", "delivered"},
		{"judge undelivered", g, "assign_judge", kv("assign", taken, "verdict", "adopt"), 409, "INVALID_STATE", "taken"},
		{"judge twice", g, "assign_judge", kv("assign", adopted, "verdict", "reject", "reason", "no"), 409, "INVALID_STATE", "adopted"},
		{"drop untaken", a, "assign_drop", kv("assign", open), 409, "INVALID_STATE", "open"},
		{"drop delivered", a, "assign_drop", kv("assign", delivered), 409, "INVALID_STATE", "delivered"},
		{"void delivered", g, "assign_void", kv("assign", delivered), 409, "INVALID_STATE", "delivered"},
		{"void voided", g, "assign_void", kv("assign", voided), 409, "INVALID_STATE", "voided"},
		{"take voided", a, "assign_take", kv("assign", voided), 409, "INVALID_STATE", "voided"},
		{"payload off schema", a, "assign_submit", kv("assign", taken, "payload", kv("url", 5)), 422, "SCHEMA_MISMATCH", ""},
		{"payload as JSON string off schema", a, "assign_submit", kv("assign", taken, "payload", `{"link":"x"}`), 422, "SCHEMA_MISMATCH", ""},
		{"schema needs a payload", a, "assign_submit", kv("assign", taken, "memories", []any{kv("code", aMem)}), 422, "SCHEMA_MISMATCH", ""},
		{"payload over 256 KB", a, "assign_submit", kv("assign", free, "payload", kv("text", content(262144))), 413, "PAYLOAD_TOO_LARGE", ""},
		{"credential in payload", a, "assign_submit", kv("assign", free, "payload", kv("k", awsKey)), 422, "SENSITIVE_CONTENT", ""},
		{"nothing delivered", a, "assign_submit", kv("assign", free), 422, "VALIDATION_FAILED", ""},
		{"pin someone else's memory", a, "assign_submit", kv("assign", free, "memories", []any{kv("name", "b's", "code", bMem)}), 422, "INVALID_TARGET", ""},
		{"pin an unknown memory", a, "assign_submit", kv("assign", free, "memories", []any{kv("code", "000000000000")}), 404, "NOT_FOUND", ""},
		{"pin 11 memories", a, "assign_submit", kv("assign", free, "memories", tooMany), 422, "VALIDATION_FAILED", ""},
		{"memories not a list", a, "assign_submit", kv("assign", free, "memories", `{"code":"x"}`), 422, "VALIDATION_FAILED", ""},
		{"reject without reason", g, "assign_judge", kv("assign", delivered, "verdict", "reject"), 422, "VALIDATION_FAILED", ""},
		{"reason over 4000", g, "assign_judge", kv("assign", delivered, "verdict", "reject", "reason", strings.Repeat("r", 4001)), 422, "VALIDATION_FAILED", ""},
		{"unknown verdict", g, "assign_judge", kv("assign", delivered, "verdict", "maybe"), 422, "VALIDATION_FAILED", ""},
		{"credential in reason", g, "assign_judge", kv("assign", delivered, "verdict", "reject", "reason", awsKey), 422, "SENSITIVE_CONTENT", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := d.refuse(t, c.who, c.tool, c.args, c.status, c.code)
			if c.state != "" && details(r, "status") != c.state {
				t.Fatalf("details.status = %v, want %s: %s", details(r, "status"), c.state, r.Raw)
			}
			if c.code == "SCHEMA_MISMATCH" {
				errs, _ := details(r, "errors").([]any)
				if len(errs) == 0 {
					t.Fatalf("no details.errors: %s", r.Raw)
				}
				for _, e := range errs {
					if _, ok := e.(map[string]any)["pointer"].(string); !ok {
						t.Fatalf("error without pointer: %s", r.Raw)
					}
				}
			}
		})
	}
	// The pointer names the offending field.
	r := d.call(t, a, "assign_submit", kv("assign", taken, "payload", kv("url", 5)))
	if e := details(r, "errors").([]any)[0].(map[string]any); e["pointer"] != "/url" || e["message"] == "" {
		t.Fatalf("schema pointer: %s", r.Raw)
	}
	// Exactly 256 KB passes.
	body := kv("text", "")
	raw, _ := json.Marshal(body)
	body["text"] = content(262144 - len(raw))
	if s := d.must(t, a, "assign_submit", kv("assign", free, "payload", body)); s.str("state") != "delivered" || s.str("judge_due_at") == "" {
		t.Fatalf("256 KB payload: %s", s.Raw)
	}

	// Drop succeeds once; afterwards the state is dropped.
	if r := d.must(t, a, "assign_drop", kv("assign", taken)); r.str("state") != "dropped" {
		t.Fatalf("drop: %s", r.Raw)
	}
	r = d.refuse(t, a, "assign_drop", kv("assign", taken), 409, "INVALID_STATE")
	if details(r, "status") != "dropped" {
		t.Fatalf("drop twice: %s", r.Raw)
	}
	// Reject with a reason the assignee reads.
	if j := d.must(t, g, "assign_judge", kv("assign", delivered, "verdict", "reject", "reason", "Wrong URL.")); j.str("state") != "rejected" {
		t.Fatalf("reject: %s", j.Raw)
	}
	v := d.view(t, a, code, "assignments", []int64{delivered})
	if !strings.Contains(v.Raw, "Wrong URL.") {
		t.Fatalf("reason not readable: %s", v.Raw)
	}

	// After leaving, a is no member: NOT_MEMBER before anything else.
	d.must(t, a, "thread_leave", kv("thread", code))
	for _, tool := range []string{"assign_take", "assign_drop"} {
		d.refuse(t, a, tool, kv("assign", open), 403, "NOT_MEMBER")
	}
	d.refuse(t, a, "assign_submit", kv("assign", open, "payload", url), 403, "NOT_MEMBER")
	// Closed room: nothing can be taken.
	late := d.assignTo(t, g, code, ns[b])
	d.must(t, g, "thread_close", kv("thread", code))
	d.refuse(t, b, "assign_take", kv("assign", late), 409, "THREAD_CLOSED")
}

func TestAssignPinnedMemories(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 3)
	g, a, stranger := ks[0], ks[1], ks[2]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a)
	mem := d.memoryOf(t, a, false)
	other := d.memoryOf(t, a, false)
	work := d.assignTo(t, g, code, ns[a])

	s := d.must(t, a, "assign_take", kv("assign", work, "memories", fmt.Sprintf(`[{"name":"notes","code":%q}]`, mem)))
	pins := s.Body["memories"].([]any)
	p := pins[0].(map[string]any)
	if len(pins) != 1 || p["name"] != "notes" || p["code"] != mem || p["revision"] != float64(1) || len(p["checksum"].(string)) != 64 {
		t.Fatalf("pins: %s", s.Raw)
	}
	// The author revises, hides and withdraws the memory.
	d.must(t, a, "memory_put", putArgs("code", mem, "content", content(300)))
	d.must(t, a, "memory_delete", kv("code", mem))
	expect(t, d.call(t, g, "memory_get", kv("code", mem)), 404, "NOT_FOUND")

	got := d.must(t, g, "memory_get", kv("code", mem, "assign", work))
	if got.num("revision") != 1 || got.str("content") != content(80) || got.str("checksum") != p["checksum"] {
		t.Fatalf("pinned read: %s", got.Raw)
	}
	if mine := d.must(t, a, "memory_get", kv("code", mem, "assign", work)); mine.num("revision") != 1 {
		t.Fatalf("author's pinned read: %s", mine.Raw)
	}
	expect(t, d.call(t, stranger, "memory_get", kv("code", mem, "assign", work)), 403, "NOT_MEMBER")
	expect(t, d.call(t, g, "memory_get", kv("code", mem, "assign", work, "revision", 1)), 422, "VALIDATION_FAILED")
	expect(t, d.call(t, g, "memory_get", kv("code", mem, "assign", 99999999)), 404, "ASSIGN_NOT_FOUND")
	expect(t, d.call(t, g, "memory_get", kv("code", other, "assign", work)), 404, "NOT_FOUND")
	// Leaving the room ends that access.
	d.must(t, a, "thread_leave", kv("thread", code))
	expect(t, d.call(t, a, "memory_get", kv("code", mem, "assign", work)), 403, "NOT_MEMBER")
}

// Text the database cannot store (NUL) is the caller's mistake: a 422, never
// an INTERNAL_ERROR.
func TestThreadRefusesNULBytes(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 2)
	g, a := ks[0], ks[1]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a)
	q := d.say(t, g, code, "question", "ask", []string{ns[a]}).num("entry")
	work := d.assignTo(t, g, code, ns[a])
	judged := d.assignTo(t, g, code, ns[a])
	d.must(t, a, "assign_take", kv("assign", work))
	d.must(t, a, "assign_take", kv("assign", judged, "payload", `"done"`))

	for _, c := range []struct {
		name string
		who  string
		tool string
		args map[string]any
	}{
		{"subject", g, "thread_start", kv("subject", "a\x00b")},
		{"content", g, "thread_post", kv("thread", code, "content", "a\x00b")},
		{"summary", g, "thread_post", kv("thread", code, "content", "ab", "summary", "s\x00")},
		{"requirements", g, "thread_post", kv("thread", code, "content", "ab", "assign", kv("to", ns[a], "requirements", "r\x00"))},
		{"handle note", a, "thread_handle", kv("thread", code, "entry", q, "note", "n\x00")},
		{"reject reason", g, "assign_judge", kv("assign", judged, "verdict", "reject", "reason", "r\x00")},
		{"payload value", a, "assign_submit", kv("assign", work, "payload", kv("x", "\x00"))},
		{"payload key", a, "assign_submit", kv("assign", work, "payload", kv("x\x00", 1))},
	} {
		t.Run(c.name, func(t *testing.T) { d.refuse(t, c.who, c.tool, c.args, 422, "VALIDATION_FAILED") })
	}
}

// An output_schema is self-contained: a $ref is never resolved against the
// server's files or network, and the refusal reveals nothing about them.
func TestAssignOutputSchemaExternalRef(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 2)
	g, a := ks[0], ks[1]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a)
	dir := t.TempDir()
	present := filepath.Join(dir, "schema.json")
	if err := os.WriteFile(present, []byte(`{"type":"object","required":["field-from-a-server-file"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.json")
	refuse := func(url string) string {
		t.Helper()
		r := d.refuse(t, g, "thread_post", kv("thread", code, "content", "work", "assign",
			kv("to", ns[a], "requirements", "r", "output_schema", kv("$ref", url))), 422, "VALIDATION_FAILED")
		return strings.ReplaceAll(r.Body["error"].(map[string]any)["message"].(string), url, "<url>")
	}
	existing, absent := refuse("file://"+present), refuse("file://"+missing)
	if existing != absent {
		t.Fatalf("the refusal tells an existing server file from a missing one:\n%s\n%s", existing, absent)
	}
	refuse("http://127.0.0.1:1/schema.json")
}

// With the clock frozen every item of the turn has the same produced time:
// order and paging then rest on (branch, id) alone.
func TestTodoListMixedBranches(t *testing.T) {
	t.Parallel()
	frozen := time.Date(2030, 1, 1, 12, 0, 0, 123456000, time.UTC)
	d := start(t, func(o *relay.Options) { o.Clock = func() time.Time { return frozen } })
	ks, ns := d.crew(t, 3)
	g, a, b := ks[0], ks[1], ks[2]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a, b)
	var replies, delivers, judges []int64
	for i := range 30 {
		replies = append(replies, d.say(t, g, code, fmt.Sprintf("q%d", i), "ask", []string{ns[a]}).num("entry"))
	}
	for range 30 {
		id := d.assignTo(t, g, code, ns[a])
		d.must(t, a, "assign_take", kv("assign", id))
		delivers = append(delivers, id)
	}
	for range 10 {
		id := d.assignTo(t, a, code, ns[b])
		d.must(t, b, "assign_take", kv("assign", id, "payload", `"done"`))
		judges = append(judges, id)
	}
	var want []string
	for _, e := range replies {
		want = append(want, fmt.Sprintf("reply:%d", e))
	}
	for _, x := range delivers {
		want = append(want, fmt.Sprintf("deliver:%d", x))
	}
	for _, x := range judges {
		want = append(want, fmt.Sprintf("judge:%d", x))
	}
	page := func(cursor string) ([]string, string) {
		t.Helper()
		args := kv()
		if cursor != "" {
			args["cursor"] = cursor
		}
		r := d.must(t, a, "todo_list", args)
		var out []string
		for _, x := range r.Body["todos"].([]any) {
			m := x.(map[string]any)
			id := m["entry"]
			if m["assign"] != nil {
				id = m["assign"]
			}
			// author: the entry's author, the creator, the assignee.
			if who := map[any]string{"reply": ns[g], "deliver": ns[g], "judge": ns[b]}[m["kind"]]; m["author"] != who {
				t.Fatalf("item %v: author %v, want %s", id, m["author"], who)
			}
			out = append(out, fmt.Sprintf("%s:%v", m["kind"], id))
		}
		next, _ := r.Body["next_cursor"].(string)
		return out, next
	}
	p1, c1 := page("")
	p2, c2 := page(c1)
	if !slices.Equal(slices.Concat(p1, p2), want) || len(p1) != 50 || c2 != "" {
		t.Fatalf("turn with equal times:\n got %v\nwant %v", slices.Concat(p1, p2), want)
	}
	// Settle the cursor's own item and its neighbours on both sides.
	d.must(t, a, "assign_submit", kv("assign", delivers[19], "payload", `"x"`)) // the last item of page 1
	d.must(t, a, "assign_drop", kv("assign", delivers[18]))
	d.must(t, a, "thread_handle", kv("thread", code, "entry", replies[29]))
	if again, _ := page(c1); !slices.Equal(again, p2) {
		t.Fatalf("page 2 moved after settling page 1:\n got %v\nwant %v", again, p2)
	}
	d.must(t, a, "assign_drop", kv("assign", delivers[20])) // the first item of page 2
	if again, _ := page(c1); !slices.Equal(again, p2[1:]) {
		t.Fatalf("page 2 after settling its first item:\n got %v\nwant %v", again, p2[1:])
	}
}

// ---------------------------------------------------------------------------
// todo_list
// ---------------------------------------------------------------------------

func TestTodoListPaging(t *testing.T) {
	t.Parallel()
	d := start(t)
	ks, ns := d.crew(t, 2)
	g, a := ks[0], ks[1]
	code, key := d.openRoom(t, g)
	d.enter(t, key, a)
	for i := range 120 {
		d.say(t, g, code, fmt.Sprintf("question %d", i+1), "ask", []string{ns[a]})
	}

	for _, bad := range []string{"garbage", "x|1|1", "2030-01-01T00:00:00Z|9|1", "2030-01-01T00:00:00Z|1|0", "2030-01-01T00:00:00Z|1"} {
		r := d.call(t, a, "todo_list", kv("cursor", bad))
		expect(t, r, 422, "VALIDATION_FAILED")
	}

	type page struct {
		entries []int64
		next    string
	}
	fetch := func(cursor string) page {
		t.Helper()
		args := kv()
		if cursor != "" {
			args["cursor"] = cursor
		}
		r := d.must(t, a, "todo_list", args)
		var p page
		for _, it := range r.Body["todos"].([]any) {
			m := it.(map[string]any)
			if m["kind"] != "reply" || m["next_action"] != "respond" || m["thread"] != code {
				t.Fatalf("item: %v", m)
			}
			p.entries = append(p.entries, int64(m["entry"].(float64)))
		}
		p.next, _ = r.Body["next_cursor"].(string)
		return p
	}
	p1 := fetch("")
	p2 := fetch(p1.next)
	p3 := fetch(p2.next)
	if len(p1.entries) != 50 || len(p2.entries) != 50 || len(p3.entries) != 20 || p1.next == "" || p2.next == "" || p3.next != "" {
		t.Fatalf("pages %d/%d/%d, cursors %q %q %q", len(p1.entries), len(p2.entries), len(p3.entries), p1.next, p2.next, p3.next)
	}
	all := slices.Concat(p1.entries, p2.entries, p3.entries)
	seen := map[int64]bool{}
	for i, e := range all {
		if seen[e] || (i > 0 && e <= all[i-1]) {
			t.Fatalf("turn is not oldest first without duplicates: %v", all)
		}
		seen[e] = true
	}
	// The same cursor gives the same page.
	if again := fetch(p1.next); !slices.Equal(again.entries, p2.entries) || again.next != p2.next {
		t.Fatal("cursor is not stable")
	}
	// Settling items of page 1 (and the last item of page 1 itself) between
	// fetches moves nothing on page 2.
	for i, e := range p1.entries {
		if i%3 == 0 || i == 49 {
			d.must(t, a, "thread_handle", kv("thread", code, "entry", e))
		}
	}
	if after := fetch(p1.next); !slices.Equal(after.entries, p2.entries) || after.next != p2.next {
		t.Fatalf("page 2 moved after settling page 1:\n%v\n%v", after.entries, p2.entries)
	}
	// Settling items of page 2 removes exactly them from page 2.
	d.must(t, a, "thread_handle", kv("thread", code, "entry", p2.entries[0]))
	d.must(t, g, "thread_retract", kv("thread", code, "entry", p2.entries[10]))
	after := fetch(p1.next)
	want := slices.DeleteFunc(slices.Clone(p2.entries), func(e int64) bool { return e == p2.entries[0] || e == p2.entries[10] })
	if !slices.Equal(after.entries[:48], want) || len(after.entries) != 50 || after.entries[48] != p3.entries[0] || after.entries[49] != p3.entries[1] {
		t.Fatalf("page 2 after settling two of its items: %v", after.entries)
	}
	// A fresh walk sees every remaining item exactly once.
	var walk []int64
	for c := ""; ; {
		p := fetch(c)
		walk = append(walk, p.entries...)
		if p.next == "" {
			break
		}
		c = p.next
	}
	if n := d.dbInt(t, `SELECT count(*) FROM thread_receipts WHERE state = 'pending'`); int64(len(walk)) != n || n != 120-18-2 {
		t.Fatalf("walk found %d items, %d pending", len(walk), n)
	}
}
