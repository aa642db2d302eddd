package relay_test

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
)

func putArgs(extra ...any) map[string]any {
	a := map[string]any{"title": "Field notes", "tags": []string{"notes"}, "content": content(80)}
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i+1] == nil {
			delete(a, extra[i].(string))
			continue
		}
		a[extra[i].(string)] = extra[i+1]
	}
	return a
}

func TestMemoryLifecycle(t *testing.T) {
	t.Parallel()
	d := start(t)
	alice, _ := d.register(t)
	bob, _ := d.register(t)

	created := d.call(t, alice, "memory_put", putArgs("description", "how we work", "tags", []string{" a ", "b"}))
	if !created.ok() || created.str("action") != "created" || created.num("revision") != 1 || created.str("visibility") != "private" || len(created.str("checksum")) != 64 {
		t.Fatalf("create: %s", created.Raw)
	}
	code := created.str("code")
	v2 := d.call(t, alice, "memory_put", putArgs("code", strings.ToUpper(code), "title", "Field notes v2", "content", content(90)))
	if !v2.ok() || v2.str("action") != "updated" || v2.num("revision") != 2 || v2.str("code") != code {
		t.Fatalf("update: %s", v2.Raw)
	}

	// The author reads current and any revision; revisions never change.
	cur := d.call(t, alice, "memory_get", map[string]any{"code": code})
	if cur.num("revision") != 2 || cur.str("title") != "Field notes v2" || cur.str("content") != content(90) {
		t.Fatalf("get current: %s", cur.Raw)
	}
	r1 := d.call(t, alice, "memory_get", map[string]any{"code": code, "revision": 1})
	if r1.num("revision") != 1 || r1.str("description") != "how we work" || r1.num("current_revision") != 2 {
		t.Fatalf("get revision 1: %s", r1.Raw)
	}
	if tags := r1.Body["tags"].([]any); len(tags) != 2 || tags[0] != "a" {
		t.Fatalf("tags not trimmed: %v", tags)
	}
	expect(t, d.call(t, alice, "memory_get", map[string]any{"code": code, "revision": 9}), 404, "NOT_FOUND")

	// Others: private is PRIVATE_KUNGFU; public current is readable; old revisions are the author's.
	expect(t, d.call(t, bob, "memory_get", map[string]any{"code": code}), 403, "PRIVATE_KUNGFU")
	sh := d.call(t, alice, "memory_share", map[string]any{"code": code})
	if !sh.ok() || sh.str("visibility") != "public" || sh.Body["changed"] != true {
		t.Fatalf("share: %s", sh.Raw)
	}
	if again := d.call(t, alice, "memory_share", map[string]any{"code": code}); !again.ok() || again.Body["changed"] != false {
		t.Fatalf("share is not idempotent: %s", again.Raw)
	}
	if g := d.call(t, bob, "memory_get", map[string]any{"code": code}); !g.ok() || g.num("revision") != 2 || g.str("author") == "" {
		t.Fatalf("public read: %s", g.Raw)
	}
	if g := d.call(t, bob, "memory_get", map[string]any{"code": code, "revision": 2}); !g.ok() {
		t.Fatalf("public current revision by number: %s", g.Raw)
	}
	expect(t, d.call(t, bob, "memory_get", map[string]any{"code": code, "revision": 1}), 403, "NOT_OWNER")
	expect(t, d.call(t, bob, "memory_put", putArgs("code", code)), 403, "NOT_OWNER")
	expect(t, d.call(t, bob, "memory_share", map[string]any{"code": code}), 403, "NOT_OWNER")
	expect(t, d.call(t, bob, "memory_delete", map[string]any{"code": code}), 403, "NOT_OWNER")
	un := d.call(t, alice, "memory_unshare", map[string]any{"code": code})
	if !un.ok() || un.str("visibility") != "private" || un.Body["changed"] != true {
		t.Fatalf("unshare: %s", un.Raw)
	}
	expect(t, d.call(t, bob, "memory_get", map[string]any{"code": code}), 403, "PRIVATE_KUNGFU")

	// List: own, active, newest first.
	second := d.call(t, alice, "memory_put", putArgs("title", "Second")).str("code")
	l := d.call(t, alice, "memory_list", map[string]any{})
	items := l.Body["memories"].([]any)
	if l.num("total") != 2 || l.num("returned") != 2 || items[0].(map[string]any)["code"] != second || l.Body["has_more"] != false {
		t.Fatalf("list: %s", l.Raw)
	}
	if p := d.call(t, alice, "memory_list", map[string]any{"limit": 1, "offset": 1}); p.num("returned") != 1 || p.Body["has_more"] != false ||
		p.Body["memories"].([]any)[0].(map[string]any)["code"] != code {
		t.Fatalf("page 2: %s", p.Raw)
	}
	if p := d.call(t, alice, "memory_list", map[string]any{"limit": 500, "offset": -3}); p.num("returned") != 2 || p.num("offset") != 0 {
		t.Fatalf("clamping: %s", p.Raw)
	}
	if b := d.call(t, bob, "memory_list", map[string]any{}); b.num("total") != 0 {
		t.Fatalf("bob sees alice's memories: %s", b.Raw)
	}

	// Withdrawal is terminal; the author can still read a revision.
	del := d.call(t, alice, "memory_delete", map[string]any{"code": code})
	if !del.ok() || del.str("title") != "Field notes v2" {
		t.Fatalf("delete: %s", del.Raw)
	}
	expect(t, d.call(t, alice, "memory_delete", map[string]any{"code": code}), 404, "NOT_FOUND")
	expect(t, d.call(t, alice, "memory_get", map[string]any{"code": code}), 404, "NOT_FOUND")
	expect(t, d.call(t, alice, "memory_put", putArgs("code", code)), 404, "NOT_FOUND")
	expect(t, d.call(t, alice, "memory_share", map[string]any{"code": code}), 404, "NOT_FOUND")
	expect(t, d.call(t, alice, "memory_unshare", map[string]any{"code": code}), 404, "NOT_FOUND")
	expect(t, d.call(t, bob, "memory_get", map[string]any{"code": code}), 404, "NOT_FOUND")
	if g := d.call(t, alice, "memory_get", map[string]any{"code": code, "revision": 1}); !g.ok() || g.str("status") != "deleted" {
		t.Fatalf("author revision after withdrawal: %s", g.Raw)
	}
	if l := d.call(t, alice, "memory_list", map[string]any{}); l.num("total") != 1 {
		t.Fatalf("withdrawn memory listed: %s", l.Raw)
	}
}

func TestMemoryValidation(t *testing.T) {
	t.Parallel()
	d := start(t)
	key, _ := d.register(t)
	code := d.call(t, key, "memory_put", putArgs()).str("code")
	cases := []struct {
		name   string
		args   map[string]any
		status int
		code   string
	}{
		{"missing title", putArgs("title", nil), 400, "MISSING_FIELD"},
		{"blank title", putArgs("title", "   "), 400, "MISSING_FIELD"},
		{"missing content", putArgs("content", nil), 400, "MISSING_FIELD"},
		{"bad code", putArgs("code", "xyz"), 422, "INVALID_CODE"},
		{"unknown code", putArgs("code", "0123456789ab"), 404, "NOT_FOUND"},
		{"long title", putArgs("title", strings.Repeat("é", 129)), 422, "TITLE_TOO_LONG"},
		{"no tags", putArgs("tags", []string{}), 422, "INVALID_TAGS"},
		{"blank tag", putArgs("tags", []string{"ok", " "}), 422, "INVALID_TAGS"},
		{"eleven tags", putArgs("tags", strings.Split("a b c d e f g h i j k", " ")), 422, "TOO_MANY_TAGS"},
		{"long tag", putArgs("tags", []string{strings.Repeat("t", 33)}), 422, "TAG_TOO_LONG"},
		{"long description", putArgs("description", strings.Repeat("d", 501)), 422, "DESCRIPTION_TOO_LONG"},
		{"short content", putArgs("content", "  "+content(49)+"    "), 422, "CONTENT_TOO_SHORT"},
		{"large content", putArgs("content", content(102401)), 413, "CONTENT_TOO_LARGE"},
		{"agent key", putArgs("content", content(60)+" kf_live_"+strings.Repeat("a1", 32)), 422, "SENSITIVE_CONTENT"},
		{"aws key in title", putArgs("title", "AKIAIOSFODNN7EXAMPLE"), 422, "SENSITIVE_CONTENT"},
		{"pem key", putArgs("content", "-----BEGIN RSA PRIVATE KEY-----\n"+content(60)), 422, "SENSITIVE_CONTENT"},
		{"github token in tag", putArgs("tags", []string{"ghp_" + strings.Repeat("A", 36)}), 422, "TAG_TOO_LONG"},
		{"github token", putArgs("description", "ghp_"+strings.Repeat("A", 36)), 422, "SENSITIVE_CONTENT"},
		{"stripe key", putArgs("content", content(60)+" sk_live_"+strings.Repeat("x", 24)), 422, "SENSITIVE_CONTENT"},
		{"anthropic key", putArgs("content", content(60)+" sk-ant-api03-"+strings.Repeat("x", 30)), 422, "SENSITIVE_CONTENT"},
		{"unknown argument", putArgs("colour", "red"), 422, "VALIDATION_FAILED"},
		{"tags not a list", putArgs("tags", "notes"), 422, "VALIDATION_FAILED"},
	}
	for _, c := range cases {
		r := d.call(t, key, "memory_put", c.args)
		if r.Status != c.status || r.code() != c.code {
			t.Errorf("%s: want %d %s, got %d %s", c.name, c.status, c.code, r.Status, r.Raw)
		}
	}
	// A content of exactly the limits is accepted.
	if r := d.call(t, key, "memory_put", putArgs("code", code, "title", strings.Repeat("é", 128), "content", content(102400),
		"tags", strings.Split("a b c d e f g h i j", " "), "description", strings.Repeat("d", 500))); !r.ok() {
		t.Fatalf("limits exactly: %s", r.Raw)
	}
	for _, c := range []struct {
		tool   string
		args   map[string]any
		status int
		code   string
	}{
		{"memory_get", map[string]any{}, 400, "MISSING_FIELD"},
		{"memory_get", map[string]any{"code": "nothex!!!!!!"}, 422, "INVALID_CODE"},
		{"memory_get", map[string]any{"code": code, "revision": 0}, 422, "VALIDATION_FAILED"},
		{"memory_get", map[string]any{"code": "aaaaaaaaaaaa"}, 404, "NOT_FOUND"},
		{"memory_share", map[string]any{"code": "short"}, 422, "INVALID_CODE"},
		{"memory_unshare", map[string]any{"code": "aaaaaaaaaaaa"}, 404, "NOT_FOUND"},
		{"memory_delete", map[string]any{"code": "aaaaaaaaaaaa"}, 404, "NOT_FOUND"},
		{"memory_list", map[string]any{"limit": "ten"}, 422, "VALIDATION_FAILED"},
	} {
		r := d.call(t, key, c.tool, c.args)
		if r.Status != c.status || r.code() != c.code {
			t.Errorf("%s %v: want %d %s, got %d %s", c.tool, c.args, c.status, c.code, r.Status, r.Raw)
		}
	}
	// Bad input changed nothing: one memory at revision 2 (the limits write).
	var memories, revisions int
	_ = d.App.DB.QueryRow(context.Background(), `SELECT count(*), max(revision) FROM memories`).Scan(&memories, &revisions)
	if memories != 1 || revisions != 2 {
		t.Fatalf("after refusals: %d memories, revision %d", memories, revisions)
	}
}

func TestMemoryConcurrentUpdates(t *testing.T) {
	t.Parallel()
	d := start(t)
	key, _ := d.register(t)
	code := d.call(t, key, "memory_put", putArgs()).str("code")
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		revs []int
	)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := d.call(t, key, "memory_put", putArgs("code", code, "content", content(60+i)))
			if !r.ok() {
				t.Errorf("update %d: %s", i, r.Raw)
				return
			}
			mu.Lock()
			revs = append(revs, int(r.num("revision")))
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Ints(revs)
	for i, r := range revs {
		if r != i+2 {
			t.Fatalf("revisions %v: want 2..51 with no gap or duplicate", revs)
		}
	}
	if len(revs) != 50 {
		t.Fatalf("%d updates succeeded", len(revs))
	}
	var stored []int
	rows, _ := d.App.DB.Query(context.Background(), `SELECT revision FROM memory_revisions ORDER BY revision`)
	for rows.Next() {
		var r int
		_ = rows.Scan(&r)
		stored = append(stored, r)
	}
	if len(stored) != 51 || stored[0] != 1 || stored[50] != 51 {
		t.Fatalf("stored revisions %v", stored)
	}
	// Stored revisions are immutable.
	if _, err := d.App.DB.Exec(context.Background(), `UPDATE memory_revisions SET title = 'x'`); err == nil {
		t.Fatal("memory_revisions accepted an UPDATE")
	}
	if r := d.call(t, key, "memory_get", map[string]any{"code": code}); r.num("revision") != 51 {
		t.Fatalf("current revision: %s", r.Raw)
	}
	_ = http.StatusOK
}
