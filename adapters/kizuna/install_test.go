package kizuna_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dojo-relay/dojo/adapters/kizuna"
)

// installHub is a hub on the real clock (the letterbox heartbeats it) with
// a BoxDir and a Self of the test's choosing.
func installHub(t *testing.T, boxDir, self string) (*hubFixture, *pgxpool.Pool) {
	t.Helper()
	f := newHub(t, func(h *kizuna.Hub) {
		h.BoxDir, h.Self, h.Deliver, h.Now, h.Accounts.Now = boxDir, self, nil, nil, time.Now
	})
	return f, f.db
}

// mint asks for an enroll token with the given elements.
func mint(t *testing.T, f *hubFixture, form map[string]any) string {
	t.Helper()
	r := f.do(t, http.MethodPost, "/api/v1/enroll-tokens", hubAdmin, form)
	hubExpect(t, r, http.StatusCreated, "")
	return r.str("enroll_token")
}

func TestKizunaEnrollElements(t *testing.T) {
	f, db := installHub(t, "", "")
	get := func(id string) hubReply {
		t.Helper()
		r := f.do(t, http.MethodGet, "/api/v1/agents/"+id, hubAdmin, nil)
		hubExpect(t, r, http.StatusOK, "")
		return r
	}

	// {} registers the agent the admin described.
	full := mint(t, f, map[string]any{"name": "Printer", "agent_id": "printer-box", "capabilities": "prints letters",
		"capability_tags": []string{"print"}, "webhook_url": "http://127.0.0.1:7799/kizuna", "agent_card": map[string]any{"name": "Printer"}})
	r := f.do(t, http.MethodPost, "/api/v1/agents?token="+full, "", map[string]any{})
	hubExpect(t, r, http.StatusCreated, "")
	if r.str("agent_id") != "printer-box" || r.str("agent_token") == "" || r.str("endpoint_secret") == "" {
		t.Fatalf("register with {}: %s", r.raw)
	}
	a := get("printer-box")
	if a.str("name") != "Printer" || a.str("capabilities") != "prints letters" || a.str("webhook_url") != "http://127.0.0.1:7799/kizuna" {
		t.Fatalf("elements not applied: %s", a.raw)
	}
	if tags, _ := a.body["capability_tags"].([]any); len(tags) != 1 || tags[0] != "print" {
		t.Fatalf("tags not applied: %s", a.raw)
	}
	if card, _ := a.body["agent_card"].(map[string]any); card["name"] != "Printer" {
		t.Fatalf("card not applied: %s", a.raw)
	}
	// Spent: 410, whatever the body says.
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents?token="+full, "", map[string]any{}), http.StatusGone, "ENROLL_TOKEN_USED")

	// The token's fields bind: a body may repeat them, and may give only
	// what the admin left out (here the tags and the card).
	loose := mint(t, f, map[string]any{"name": "Scanner", "capabilities": "scans", "webhook_url": "http://127.0.0.1:7800/"})
	r = f.do(t, http.MethodPost, "/api/v1/agents", "", map[string]any{"enroll_token": loose, "name": "Scanner two",
		"webhook_url": "http://127.0.0.1:7801/"})
	hubExpect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	if got := hubFields(r); len(got) != 2 || got[0] != "name" || got[1] != "webhook_url" {
		t.Fatalf("override fields %v: %s", got, r.raw)
	}
	r = f.do(t, http.MethodPost, "/api/v1/agents", "", map[string]any{"enroll_token": loose, "name": "Scanner",
		"capability_tags": []string{"scan"}, "agent_card": map[string]any{"name": "Scanner"}})
	hubExpect(t, r, http.StatusCreated, "")
	s := get(r.str("agent_id"))
	if s.str("name") != "Scanner" || s.str("capabilities") != "scans" || s.str("webhook_url") != "http://127.0.0.1:7800/" {
		t.Fatalf("token fields: %s", s.raw)
	}
	if tags, _ := s.body["capability_tags"].([]any); len(tags) != 1 || tags[0] != "scan" {
		t.Fatalf("tags from the body: %s", s.raw)
	}

	// A bound agent id cannot be swapped; the refusal does not spend the token.
	bound := mint(t, f, map[string]any{"name": "Bound", "agent_id": "bound-box", "capabilities": "", "webhook_url": "http://127.0.0.1:7802/"})
	r = f.do(t, http.MethodPost, "/api/v1/agents?token="+bound, "", map[string]any{"agent_id": "other-box"})
	hubExpect(t, r, http.StatusUnprocessableEntity, "VALIDATION_FAILED")
	if got := hubFields(r); len(got) != 1 || got[0] != "agent_id" {
		t.Fatalf("mismatch fields %v: %s", got, r.raw)
	}
	r = f.do(t, http.MethodPost, "/api/v1/agents?token="+bound, "", map[string]any{"agent_id": "Bound-Box", "name": "Bound"})
	hubExpect(t, r, http.StatusCreated, "")
	if r.str("agent_id") != "bound-box" || get("bound-box").str("name") != "Bound" {
		t.Fatalf("bound id: %s", r.raw)
	}

	// Expired before use: 410 EXPIRED, and nothing registered.
	late := mint(t, f, map[string]any{"name": "Late", "agent_id": "late-box", "capabilities": "", "webhook_url": "http://127.0.0.1:7803/"})
	sum := sha256.Sum256([]byte(late))
	if _, err := db.Exec(context.Background(), `UPDATE kz_enroll_tokens SET expires_at = now() - interval '1 second' WHERE token_hash = $1`, sum[:]); err != nil {
		t.Fatal(err)
	}
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents?token="+late, "", map[string]any{}), http.StatusGone, "ENROLL_TOKEN_EXPIRED")
	hubExpect(t, f.do(t, http.MethodGet, "/api/v1/agents/late-box", hubAdmin, nil), http.StatusNotFound, "AGENT_NOT_FOUND")
}

// fetch GETs a path and returns the status, headers and body.
func fetch(t *testing.T, method, url string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

func wantError(t *testing.T, status int, body []byte, wantStatus int, code string) map[string]any {
	t.Helper()
	var v struct {
		Error struct {
			Code    string         `json:"code"`
			Message string         `json:"message"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	if status != wantStatus || json.Unmarshal(body, &v) != nil || v.Error.Code != code || v.Error.Message == "" {
		t.Fatalf("want %d %s, got %d %s", wantStatus, code, status, body)
	}
	return v.Error.Details
}

func TestKizunaInstallEndpoints(t *testing.T) {
	boxDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(boxDir, "linux-arm64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(boxDir, "linux-arm64", "dojo-box"), []byte("arm64 box"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(boxDir, "windows-amd64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(boxDir, "windows-amd64", "dojo-box.exe"), []byte("windows box"), 0o755); err != nil {
		t.Fatal(err)
	}
	self := filepath.Join(t.TempDir(), "dojo")
	if err := os.WriteFile(self, []byte("the host's own box"), 0o755); err != nil {
		t.Fatal(err)
	}
	f, _ := installHub(t, boxDir, self)

	// Scripts: a missing or malformed token is 400 in the hub's shape.
	for _, q := range []string{"", "?token=", "?token=kz_enroll_short", "?token=kz_enroll_" + strings.Repeat("A", 42) + "'",
		"?token=" + strings.Repeat("A", 53)} {
		st, _, b := fetch(t, http.MethodGet, f.url+"/install/linux.sh"+q)
		wantError(t, st, b, http.StatusBadRequest, "BAD_REQUEST")
	}
	for _, name := range []string{"solaris.sh", "common.sh"} {
		st, _, b := fetch(t, http.MethodGet, f.url+"/install/"+name+"?token=kz_enroll_"+strings.Repeat("A", 43))
		wantError(t, st, b, http.StatusNotFound, "NOT_FOUND")
	}
	st, _, b := fetch(t, http.MethodGet, f.url+"/install/linux.sh?token=kz_enroll_"+strings.Repeat("A", 43))
	if st != http.StatusOK {
		t.Fatalf("linux.sh: %d %s", st, b)
	}
	st, _, b = fetch(t, http.MethodPost, f.url+"/install/linux.sh")
	wantError(t, st, b, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED")

	// A well-formed token the hub never issued still gets the script
	// (nothing is revealed by it) with the default port.
	unknown := "kz_enroll_" + strings.Repeat("B", 43)
	st, hdr, b := fetch(t, http.MethodGet, f.url+"/install/linux.sh?token="+unknown)
	if st != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") || hdr.Get("Cache-Control") != "no-store" {
		t.Fatalf("script: %d %v", st, hdr)
	}
	for _, want := range []string{"#!/usr/bin/env bash", "HUB='" + f.url + "'", "TOKEN='" + unknown + "'", "PORT='7788'"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("linux.sh lacks %q", want)
		}
	}
	// A minted token's webhook port becomes the box's port, in every script;
	// used or not, the script is served so that a rerun can resume.
	minted := f.do(t, http.MethodPost, "/api/v1/enroll-tokens", hubAdmin,
		map[string]any{"name": "Ported", "capabilities": "", "webhook_url": "http://127.0.0.1:7791/kizuna/deliver"})
	hubExpect(t, minted, http.StatusCreated, "")
	token := minted.str("enroll_token")
	if p := minted.str("prompt"); !strings.Contains(p, "GET http://127.0.0.1:7791/healthz") || strings.Contains(p, "7788") {
		t.Errorf("the prompt checks the wrong port:\n%s", p)
	}
	hubExpect(t, f.do(t, http.MethodPost, "/api/v1/agents?token="+token, "", map[string]any{}), http.StatusCreated, "")
	for _, name := range []string{"linux.sh", "macos.sh", "termux.sh", "windows.ps1"} {
		st, _, b := fetch(t, http.MethodGet, f.url+"/install/"+name+"?token="+token)
		if st != http.StatusOK {
			t.Fatalf("%s: %d %s", name, st, b)
		}
		for _, want := range []string{"'" + f.url + "'", "'" + token + "'", "'7791'"} {
			if !bytes.Contains(b, []byte(want)) {
				t.Errorf("%s lacks %q", name, want)
			}
		}
		if bytes.Contains(b, []byte("__DOJO_")) {
			t.Errorf("%s keeps a placeholder", name)
		}
	}
	// A Host header that could break out of the quotes is refused.
	req, _ := http.NewRequest(http.MethodGet, f.url+"/install/linux.sh?token="+token, nil)
	req.Host = "evil'$(id)"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	wantError(t, resp.StatusCode, b, http.StatusBadRequest, "BAD_REQUEST")

	// Binaries: BoxDir's, the host's own from Self, 404 listing the rest.
	for _, c := range []struct{ path, body string }{
		{"/install/dojo-box/linux/arm64", "arm64 box"},
		{"/install/dojo-box/windows/amd64", "windows box"},
		{"/install/dojo-box/" + runtime.GOOS + "/" + runtime.GOARCH, "the host's own box"},
	} {
		if c.path == "/install/dojo-box/linux/arm64" && runtime.GOOS == "linux" && runtime.GOARCH == "arm64" {
			c.body = "arm64 box" // BoxDir comes before Self
		}
		st, hdr, b := fetch(t, http.MethodGet, f.url+c.path)
		if st != http.StatusOK || string(b) != c.body || hdr.Get("Content-Type") != "application/octet-stream" {
			t.Errorf("%s: %d %q %v", c.path, st, b, hdr)
		}
	}
	for _, p := range []string{"/install/dojo-box/plan9/amd64", "/install/dojo-box/linux/mips", "/install/dojo-box/darwin/arm"} {
		st, _, b := fetch(t, http.MethodGet, f.url+p)
		d := wantError(t, st, b, http.StatusNotFound, "NOT_FOUND")
		avail, _ := d["available"].([]any)
		if !slices.Contains(avail, any("linux/arm64")) || !slices.Contains(avail, any(runtime.GOOS+"/"+runtime.GOARCH)) {
			t.Errorf("%s: available %v", p, avail)
		}
	}
}

// servedScripts fetches the bash install scripts as the hub serves them,
// common.sh inlined and the placeholders filled in.
func servedScripts(t *testing.T) map[string][]byte {
	t.Helper()
	f, _ := installHub(t, "", "")
	out := map[string][]byte{}
	for _, name := range []string{"linux.sh", "macos.sh", "termux.sh"} {
		st, _, b := fetch(t, http.MethodGet, f.url+"/install/"+name+"?token=kz_enroll_"+strings.Repeat("C", 43))
		if st != http.StatusOK {
			t.Fatalf("%s: %d %s", name, st, b)
		}
		out[name] = b
	}
	return out
}

// TestKizunaInstallServedWhole checks that each served bash script stands
// alone and that a download cut before its last line runs nothing.
func TestKizunaInstallServedWhole(t *testing.T) {
	for name, b := range servedScripts(t) {
		s := string(b)
		for _, bad := range []string{"common.sh\"", "source=", "__DOJO_", "shellcheck shell="} {
			if strings.Contains(s, bad) {
				t.Errorf("served %s has %q", name, bad)
			}
		}
		for _, fn := range []string{"\nsay() {", "\njson_str() {", "\nstart_background() {", "\nenroll() {", "\ndownload() {", "\nreport() {", "\nmain() {"} {
			if strings.Count(s, fn) != 1 {
				t.Errorf("served %s defines %q %d times", name, fn, strings.Count(s, fn))
			}
		}
		if !strings.HasSuffix(s, "\nmain \"$@\"\n") || strings.Count(s, "\nmain \"$@\"") != 1 {
			t.Fatalf("served %s does not end by calling main", name)
		}
		// Every line but the last only defines: bash reading up to there
		// must print nothing, write nothing and ask no one.
		home := t.TempDir()
		cut := strings.TrimSuffix(s, "main \"$@\"\n")
		cmd := exec.Command("bash")
		cmd.Stdin = strings.NewReader(cut)
		cmd.Env = []string{"HOME=" + home, "PATH=/nonexistent"}
		out, err := cmd.CombinedOutput()
		if err != nil || len(out) != 0 {
			t.Errorf("served %s cut before main: %v %q", name, err, out)
		}
		if ents, _ := os.ReadDir(home); len(ents) != 0 {
			t.Errorf("served %s cut before main wrote %v", name, ents)
		}
	}
}

// TestKizunaInstallShellcheck lints every shell script of the repository
// and the bash install scripts as the hub serves them.
func TestKizunaInstallShellcheck(t *testing.T) {
	sc, err := exec.LookPath("shellcheck")
	if err != nil {
		t.Fatal("shellcheck is not installed: install shellcheck (apt-get install -y shellcheck)")
	}
	served := t.TempDir()
	for name, b := range servedScripts(t) {
		if err := os.WriteFile(filepath.Join(served, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(sc, "-s", "bash", filepath.Join(served, "linux.sh"), filepath.Join(served, "macos.sh"),
		filepath.Join(served, "termux.sh")).CombinedOutput()
	if err != nil {
		t.Fatalf("shellcheck of the served scripts: %v\n%s", err, out)
	}
	root := repoRoot(t)
	var scripts []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".sh") {
			scripts = append(scripts, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(scripts) < 3 {
		t.Fatalf("found only %v", scripts)
	}
	// -x follows the install scripts' source of common.sh.
	out, err = exec.Command(sc, append([]string{"-s", "bash", "-x"}, scripts...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("shellcheck: %v\n%s", err, out)
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// freePort is a loopback port nobody listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// runScript pipes a script into bash the way the install prompt does.
func runScript(t *testing.T, script []byte, home, stubs string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash")
	cmd.Stdin = bytes.NewReader(script)
	env := []string{"HOME=" + home, "PATH=" + stubs + string(os.PathListSeparator) + os.Getenv("PATH")}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k != "HOME" && k != "PATH" && k != "DOJO_BOX_HOME" && k != "XDG_CONFIG_HOME" {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	t.Logf("bash <linux.sh (HOME=%s): %v\n%s", home, err, out)
	return string(out), err
}

// buildBox builds the real cmd/dojo-box for this platform into a temporary
// DOJO_BOX_DIR layout and returns that directory. It first makes sure the
// tools the scripts use are here.
func buildBox(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"bash", "curl", "sed"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: install it to run the install script test", tool)
		}
	}
	boxDir := t.TempDir()
	bin := filepath.Join(boxDir, runtime.GOOS+"-"+runtime.GOARCH, "dojo-box")
	build := exec.Command("go", "build", "-o", bin, "./cmd/dojo-box")
	build.Dir = repoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/dojo-box: %v\n%s", err, out)
	}
	return boxDir
}

// scriptHome prepares a run of an install script: a failing systemctl in
// stubs (no systemd here, for certain), a temporary HOME, and a cleanup
// that stops the background box the script starts. It returns HOME and
// the box's home in it.
func scriptHome(t *testing.T, stubs string) (home, boxHome string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(stubs, "systemctl"), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	home = t.TempDir()
	boxHome = filepath.Join(home, ".dojo-box")
	t.Cleanup(func() {
		b, err := os.ReadFile(filepath.Join(boxHome, "dojo-box.pid"))
		if err != nil {
			return
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGTERM)
			for i := 0; i < 50 && syscall.Kill(pid, 0) == nil; i++ {
				time.Sleep(100 * time.Millisecond)
			}
		}
	})
	return home, boxHome
}

// TestKizunaInstallLinux runs linux.sh end to end against a real hub with
// the real letterbox: enroll, download, background start, health; a rerun
// resumes; a spent token writes nothing.
func TestKizunaInstallLinux(t *testing.T) {
	boxDir := buildBox(t)
	f, _ := installHub(t, boxDir, "")
	port := freePort(t)
	token := mint(t, f, map[string]any{"name": "Install Box", "capabilities": "receives letters",
		"webhook_url": "http://127.0.0.1:" + strconv.Itoa(port) + "/kizuna/deliver"})
	st, _, script := fetch(t, http.MethodGet, f.url+"/install/linux.sh?token="+token)
	if st != http.StatusOK {
		t.Fatalf("linux.sh: %d %s", st, script)
	}
	stubs := t.TempDir()
	home, boxHome := scriptHome(t, stubs)
	pidOf := func() int {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(boxHome, "dojo-box.pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}

	out, err := runScript(t, script, home, stubs)
	if err != nil {
		t.Fatalf("first run: %v\n%s", err, out)
	}
	for _, want := range []string{"no service manager here (container?): starting in the background", "health:      ok"} {
		if !strings.Contains(out, want) {
			t.Errorf("first run output lacks %q:\n%s", want, out)
		}
	}
	cfgPath := filepath.Join(boxHome, "config.json")
	st2, err := os.Stat(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Mode().Perm() != 0o600 {
		t.Errorf("config.json mode %v", st2.Mode().Perm())
	}
	raw, _ := os.ReadFile(cfgPath)
	var cfg map[string]string
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatalf("config.json: %v\n%s", err, raw)
	}
	keys := make([]string, 0, len(cfg))
	for k := range cfg {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if strings.Join(keys, ",") != "agent_id,agent_token,endpoint_secret,hub_url,listen" ||
		cfg["hub_url"] != f.url || cfg["listen"] != ":"+strconv.Itoa(port) || !strings.HasPrefix(cfg["endpoint_secret"], "kzs_") {
		t.Fatalf("config.json: %s", raw)
	}
	if !strings.Contains(out, cfg["agent_id"]) || !strings.Contains(out, "http://127.0.0.1:"+strconv.Itoa(port)+"/kizuna/deliver") {
		t.Errorf("report lacks the agent id or webhook:\n%s", out)
	}
	st, _, health := fetch(t, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+"/healthz")
	var hv map[string]any
	if st != http.StatusOK || json.Unmarshal(health, &hv) != nil || hv["ok"] != true || hv["agent_id"] != cfg["agent_id"] {
		t.Fatalf("healthz: %d %s", st, health)
	}
	pid := pidOf()

	// A rerun resumes: no second agent, the same box keeps running.
	out, err = runScript(t, script, home, stubs)
	if err != nil {
		t.Fatalf("second run: %v\n%s", err, out)
	}
	if !strings.Contains(out, "already enrolled as "+cfg["agent_id"]) || !strings.Contains(out, "already runs in the background (pid "+strconv.Itoa(pid)+")") {
		t.Errorf("second run did not resume:\n%s", out)
	}
	if pidOf() != pid || syscall.Kill(pid, 0) != nil {
		t.Errorf("the box was restarted: pid %d, now %d", pid, pidOf())
	}
	r := f.do(t, http.MethodGet, "/api/v1/agents?q=Install+Box", hubAdmin, nil)
	if items, _ := r.body["items"].([]any); len(items) != 1 {
		t.Errorf("directory after two runs: %s", r.raw)
	}

	// The spent token on a machine without a config: refused, nothing written.
	fresh := t.TempDir()
	out, err = runScript(t, script, fresh, stubs)
	if err == nil || !strings.Contains(out, "410") || !strings.Contains(out, "ENROLL_TOKEN_USED") {
		t.Errorf("spent token: err %v\n%s", err, out)
	}
	if left, _ := os.ReadDir(fresh); len(left) != 0 {
		t.Errorf("spent token left %v under HOME", left)
	}
}
