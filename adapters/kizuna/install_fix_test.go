package kizuna_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/dojo-relay/dojo/kungfu/account"
)

func TestKizunaEnrollMintRefusesBadAgentID(t *testing.T) {
	f, db := installHub(t, "", "")
	for _, id := range []string{"ab", "bad name!", strings.Repeat("x", 33), account.ReservedPrefix + "agent1", "admin"} {
		r := f.do(t, http.MethodPost, "/api/v1/enroll-tokens", hubAdmin,
			map[string]any{"name": "Box", "agent_id": id, "capabilities": "", "webhook_url": "http://127.0.0.1:7788/"})
		hubExpect(t, r, http.StatusConflict, "AGENT_CONFLICT")
	}
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM kz_enroll_tokens`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("tokens stored for refused ids: %d %v", n, err)
	}
	// A valid one is still issued.
	mint(t, f, map[string]any{"name": "Box", "agent_id": "good-box", "capabilities": "", "webhook_url": "http://127.0.0.1:7788/"})
}

func TestKizunaEnrollTokenBinds(t *testing.T) {
	f, _ := installHub(t, "", "")
	token := mint(t, f, map[string]any{"name": "Bound", "agent_id": "bound-all", "capabilities": "binds",
		"capability_tags": []string{"a", "b"}, "webhook_url": "http://127.0.0.1:7810/",
		"agent_card": map[string]any{"name": "Bound", "skills": []any{map[string]any{"id": "x", "n": 1.5}}}})

	for _, c := range []struct {
		field string
		value any
	}{
		{"agent_id", "other-box"},
		{"name", "Someone else"},
		{"capabilities", "does anything"},
		{"capabilities", ""},
		{"webhook_url", "http://203.0.113.1:7810/"},
		{"capability_tags", []string{"a"}},
		{"capability_tags", []string{"b", "a"}},
		{"agent_card", map[string]any{"name": "Bound"}},
	} {
		r := f.do(t, http.MethodPost, "/api/v1/agents", "", map[string]any{"enroll_token": token, c.field: c.value})
		hubExpect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
		if got := hubFields(r); len(got) != 1 || got[0] != c.field {
			t.Fatalf("%s=%v: fields %v: %s", c.field, c.value, got, r.raw)
		}
	}
	// Several at once are named together.
	r := f.do(t, http.MethodPost, "/api/v1/agents?token="+token, "", map[string]any{"name": "X", "webhook_url": "http://127.0.0.1:1/"})
	hubExpect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	if got := hubFields(r); len(got) != 2 || got[0] != "name" || got[1] != "webhook_url" {
		t.Fatalf("two overrides: fields %v: %s", got, r.raw)
	}

	// Repeating the token's values is fine, the card's key order and
	// spacing included; none of the refusals above spent the token.
	body := `{"enroll_token":"` + token + `","agent_id":"BOUND-ALL","name":"Bound","capabilities":"binds",` +
		`"capability_tags":["a","b"],"webhook_url":"http://127.0.0.1:7810/",` +
		`"agent_card":{ "skills": [ {"n": 1.50, "id": "x"} ], "name": "Bound" }}`
	r = f.do(t, http.MethodPost, "/api/v1/agents", "", body)
	hubExpect(t, r, http.StatusCreated, "")
	if r.str("agent_id") != "bound-all" {
		t.Fatalf("register: %s", r.raw)
	}
	a := f.do(t, http.MethodGet, "/api/v1/agents/bound-all", hubAdmin, nil)
	if a.str("name") != "Bound" || a.str("webhook_url") != "http://127.0.0.1:7810/" {
		t.Fatalf("agent: %s", a.raw)
	}
}

// recorder is a reverse proxy in front of a hub that keeps every request
// it forwards.
type recorder struct {
	mu   sync.Mutex
	seen []seenRequest
	srv  *httptest.Server
}

type seenRequest struct {
	Method, Path, Query, Auth, Body string
}

func newRecorder(t *testing.T, target string) *recorder {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	rec := &recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		rec.mu.Lock()
		rec.seen = append(rec.seen, seenRequest{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Authorization"), string(b)})
		rec.mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) requests() []seenRequest {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]seenRequest(nil), rec.seen...)
}

// TestKizunaInstallLinuxQuiet runs linux.sh through a recording proxy
// with curl wrapped to log its arguments: no token is ever on a command
// line, the enroll token goes in the body, the box's log is not doubled
// into the file the script gives its stderr, and a rerun served by
// another hub warns and sends the agent token only to the box's own hub.
func TestKizunaInstallLinuxQuiet(t *testing.T) {
	realCurl, _ := exec.LookPath("curl")
	boxDir := buildBox(t)
	f, _ := installHub(t, boxDir, "")
	front := newRecorder(t, f.url)
	port := freePort(t)
	token := mint(t, f, map[string]any{"name": "Quiet Box", "capabilities": "keeps secrets",
		"webhook_url": "http://127.0.0.1:" + strconv.Itoa(port) + "/kizuna/deliver"})
	st, _, script := fetch(t, http.MethodGet, front.srv.URL+"/install/linux.sh?token="+token)
	if st != http.StatusOK || !strings.Contains(string(script), "HUB='"+front.srv.URL+"'") {
		t.Fatalf("linux.sh through the proxy: %d\n%s", st, script)
	}

	stubs := t.TempDir()
	argLog := filepath.Join(t.TempDir(), "curl-args")
	stub := "#!/bin/sh\nprintf '%s\\n' \"$*\" >>'" + argLog + "'\nexec '" + realCurl + "' \"$@\"\n"
	if err := os.WriteFile(filepath.Join(stubs, "curl"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	home, boxHome := scriptHome(t, stubs)

	out, err := runScript(t, script, home, stubs)
	if err != nil || !strings.Contains(out, "health:      ok") {
		t.Fatalf("first run: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(filepath.Join(boxHome, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]string
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}

	var enrolls, lookups int
	for _, r := range front.requests() {
		switch {
		case r.Method == http.MethodPost && r.Path == "/api/v1/agents":
			enrolls++
			if strings.Contains(r.Query, "token") || !strings.Contains(r.Body, `"enroll_token":"`+token+`"`) {
				t.Errorf("enroll: query %q body %q; want the token in the body only", r.Query, r.Body)
			}
		case r.Method == http.MethodGet && r.Path == "/api/v1/agents/"+cfg["agent_id"]:
			lookups++
			if r.Auth != "Bearer "+cfg["agent_token"] {
				t.Errorf("the agent lookup carried %q", r.Auth)
			}
		}
	}
	if enrolls != 1 || lookups != 1 {
		t.Errorf("the hub saw %d enrollments and %d agent lookups, want 1 and 1", enrolls, lookups)
	}
	if !strings.Contains(out, "/kizuna/deliver (the box listens on port") {
		t.Errorf("the report lacks the webhook:\n%s", out)
	}

	// The box logs to its own rotated file only; stderr.log is for what
	// escapes it.
	logs, err := os.ReadFile(filepath.Join(boxHome, "logs", "dojo-box.log"))
	if err != nil || strings.Count(string(logs), `"msg":"letterbox serving"`) != 1 {
		t.Fatalf("dojo-box.log: %v\n%s", err, logs)
	}
	errLog, err := os.ReadFile(filepath.Join(boxHome, "logs", "stderr.log"))
	if err != nil {
		t.Fatalf("stderr.log was not created: %v", err)
	}
	if strings.Contains(string(errLog), "letterbox serving") {
		t.Errorf("the log is doubled into stderr.log:\n%s", errLog)
	}

	// A rerun served by another hub warns, and the agent token goes only
	// to the hub in config.json.
	other := newRecorder(t, f.url)
	moved := strings.Replace(string(script), "HUB='"+front.srv.URL+"'", "HUB='"+other.srv.URL+"'", 1)
	before := len(front.requests())
	out, err = runScript(t, []byte(moved), home, stubs)
	if err != nil || !strings.Contains(out, "WARNING: "+filepath.Join(boxHome, "config.json")+" belongs to the hub at "+front.srv.URL+", not "+other.srv.URL) {
		t.Fatalf("rerun from another hub: %v\n%s", err, out)
	}
	for _, r := range other.requests() {
		if r.Auth != "" {
			t.Errorf("the other hub got an Authorization header on %s %s", r.Method, r.Path)
		}
	}
	var after []seenRequest
	for _, r := range front.requests()[before:] {
		if r.Path != "/api/v1/heartbeat" { // the box's own, whenever it beats
			after = append(after, r)
		}
	}
	if len(after) != 1 || after[0].Path != "/api/v1/agents/"+cfg["agent_id"] {
		t.Errorf("the box's own hub saw %+v on the rerun", after)
	}

	// No curl ever had a token on its command line.
	args, err := os.ReadFile(argLog)
	if err != nil || !strings.Contains(string(args), "/api/v1/agents") {
		t.Fatalf("curl was not called through the wrapper: %v\n%s", err, args)
	}
	for _, secret := range []string{token, cfg["agent_token"], cfg["endpoint_secret"]} {
		if strings.Contains(string(args), secret) {
			t.Errorf("a secret was on curl's command line:\n%s", args)
		}
	}
}

// TestKizunaInstallScriptsText checks what the other platforms' scripts
// cannot show here by running: the same rules, in their text as served.
func TestKizunaInstallScriptsText(t *testing.T) {
	served := servedScripts(t)
	dir := filepath.Join(repoRoot(t), "adapters", "kizuna", "install")
	read := func(name string) string {
		if b, ok := served[name]; ok {
			return string(b)
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, name := range []string{"linux.sh", "macos.sh", "termux.sh"} {
		s := read(name)
		for _, bad := range []string{"?token=$TOKEN", `"Authorization: Bearer $`, `>>"$LOG"`} {
			if strings.Contains(s, bad) {
				t.Errorf("%s still has %q", name, bad)
			}
		}
		for _, want := range []string{`"enroll_token":"%s"`, "-d @-", "-H @-", `ERRLOG="$HOME_DIR/logs/stderr.log"`, "WARNING: $CONFIG belongs to the hub at"} {
			if !strings.Contains(s, want) {
				t.Errorf("%s lacks %q", name, want)
			}
		}
	}
	if s := read("linux.sh"); !strings.Contains(s, "NoNewPrivileges=yes") || !strings.Contains(s, "could not turn on lingering") {
		t.Error("linux.sh: the unit lacks NoNewPrivileges=yes or the lingering warning")
	}
	if s := read("macos.sh"); strings.Count(s, "<string>$ERRLOG</string>") != 2 || strings.Contains(s, "<string>$LOG</string>") {
		t.Error("macos.sh: launchd must send stdout and stderr to stderr.log")
	}
	ps := read("windows.ps1")
	for _, bad := range []string{"agents?token=", "dojo-box.log') -RedirectStandard"} {
		if strings.Contains(ps, bad) {
			t.Errorf("windows.ps1 still has %q", bad)
		}
	}
	for _, want := range []string{"enroll_token = $Token", "'stderr.log'", "WARNING: $Config belongs to the hub at", "$CfgHub/api/v1/agents/"} {
		if !strings.Contains(ps, want) {
			t.Errorf("windows.ps1 lacks %q", want)
		}
	}
}
