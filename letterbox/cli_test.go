package letterbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/letterbox"
)

// enrollHub is a fake hub's POST /api/v1/agents.
type enrollHub struct {
	mu     sync.Mutex
	calls  int
	query  string
	body   map[string]any
	status int
	answer string
	// webhook is what GET /api/v1/agents/A-9X2M says of the new agent.
	webhook string
}

func (h *enrollHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.Method == "GET" && r.URL.Path == "/api/v1/agents/A-9X2M" && r.Header.Get("Authorization") == "Bearer kf_live_secret_token" {
		json.NewEncoder(w).Encode(map[string]string{"agent_id": "A-9X2M", "webhook_url": h.webhook})
		return
	}
	h.calls++
	if r.Method != "POST" || r.URL.Path != "/api/v1/agents" {
		http.NotFound(w, r)
		return
	}
	h.query = r.URL.RawQuery
	h.body = nil
	json.NewDecoder(r.Body).Decode(&h.body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(h.status)
	io.WriteString(w, h.answer)
}

func runMain(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := letterbox.Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestEnroll(t *testing.T) {
	hub := &enrollHub{status: 201, answer: `{"agent_id":"A-9X2M","agent_token":"kf_live_secret_token","endpoint_secret":"es_secret"}`,
		webhook: "https://box.example:7801/"}
	srv := httptest.NewServer(hub)
	defer srv.Close()
	home := filepath.Join(t.TempDir(), "box")

	code, out, errs := runMain("enroll", "--home", home, "--hub", srv.URL+"/", "--token", "et_one time", "--name", "Build bot", "--webhook", "https://box.example:7788")
	if code != 0 {
		t.Fatalf("enroll: %d %s %s", code, out, errs)
	}
	if hub.query != "token=et_one+time" {
		t.Errorf("query %q", hub.query)
	}
	if len(hub.body) != 2 || hub.body["name"] != "Build bot" || hub.body["webhook_url"] != "https://box.example:7788" {
		t.Errorf("body %v: only the given flags belong in it", hub.body)
	}
	if strings.Contains(out+errs, "kf_live_secret_token") || strings.Contains(out+errs, "es_secret") || strings.Contains(out+errs, "et_one") {
		t.Errorf("enroll printed a secret: %s %s", out, errs)
	}
	info, err := os.Stat(letterbox.ConfigPath(home))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("config mode %v, want 0600", info.Mode().Perm())
	}
	raw, _ := os.ReadFile(letterbox.ConfigPath(home))
	var cfg map[string]string
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range cfg {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if strings.Join(keys, ",") != "agent_id,agent_token,endpoint_secret,hub_url,listen" {
		t.Fatalf("config keys %v", keys)
	}
	if cfg["hub_url"] != srv.URL || cfg["agent_id"] != "A-9X2M" || cfg["agent_token"] != "kf_live_secret_token" ||
		cfg["endpoint_secret"] != "es_secret" || cfg["listen"] != ":7801" {
		// listen follows the port of the webhook the hub has for the agent.
		t.Fatalf("config %v", cfg)
	}

	// Enrolled already: no network, no token spent.
	code, out, _ = runMain("enroll", "--home", home, "--hub", srv.URL, "--token", "et_two")
	if code != 0 || !strings.Contains(out, "already enrolled as A-9X2M") || hub.calls != 1 {
		t.Fatalf("second enroll: %d %q, hub calls %d", code, out, hub.calls)
	}
}

func TestEnrollRefused(t *testing.T) {
	hub := &enrollHub{status: 410, answer: `{"error":{"code":"ENROLL_TOKEN_USED","message":"this enroll token was already used","details":{}}}`}
	srv := httptest.NewServer(hub)
	defer srv.Close()
	home := filepath.Join(t.TempDir(), "box")
	code, _, errs := runMain("enroll", "--home", home, "--hub", srv.URL, "--token", "et_used", "--listen", "127.0.0.1:9999")
	if code != 1 || !strings.Contains(errs, "ENROLL_TOKEN_USED") || !strings.Contains(errs, "already used") {
		t.Fatalf("refused enroll: %d %s", code, errs)
	}
	if len(hub.body) != 0 {
		t.Errorf("body %v, want {} when no optional flag is given", hub.body)
	}
	if _, err := os.Stat(home); !os.IsNotExist(err) {
		t.Fatalf("a refused enroll left %s behind (%v)", home, err)
	}

	// A hub that is not there: same, and the token is not printed.
	srv.Close()
	code, _, errs = runMain("enroll", "--home", home, "--hub", srv.URL, "--token", "et_secret_value")
	if code != 1 || strings.Contains(errs, "et_secret_value") {
		t.Fatalf("unreachable hub: %d %s", code, errs)
	}
	if _, err := os.Stat(home); !os.IsNotExist(err) {
		t.Fatalf("a failed enroll left %s behind", home)
	}
	if code, _, errs = runMain("enroll", "--home", home, "--hub", "ftp://x"); code != 2 {
		t.Fatalf("bad flags: %d %s", code, errs)
	}
}

func TestStatusAndVersion(t *testing.T) {
	code, out, _ := runMain("version")
	if code != 0 || out != "dojo-box "+letterbox.Version+"\n" {
		t.Fatalf("version: %d %q", code, out)
	}
	if code, _, _ := runMain("bogus"); code != 2 {
		t.Fatalf("unknown command: %d", code)
	}

	home := t.TempDir()
	code, _, errs := runMain("status", "--home", home)
	if code != 1 || !strings.Contains(errs, "config.json") {
		t.Fatalf("status without config: %d %s", code, errs)
	}
	// A hand-written config, with an unknown key and without listen.
	os.WriteFile(letterbox.ConfigPath(home), []byte(`{"hub_url":"http://127.0.0.1:1","agent_id":"A-7K3P","agent_token":"tok_hidden","endpoint_secret":"sec_hidden","note":"by hand"}`), 0o600)
	c, err := letterbox.LoadConfig(home)
	if err != nil || c.Listen != ":7788" {
		t.Fatalf("hand-written config: %+v %v", c, err)
	}
	os.WriteFile(letterbox.ConfigPath(home), []byte(`{"hub_url":"http://127.0.0.1:1","agent_id":"A-7K3P","endpoint_secret":"x"}`), 0o600)
	if _, err := letterbox.LoadConfig(home); err == nil || !strings.Contains(err.Error(), "agent_token is missing") {
		t.Fatalf("config without agent_token: %v", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c = letterbox.Config{HubURL: "http://127.0.0.1:1", AgentID: "A-7K3P", AgentToken: "tok_hidden", EndpointSecret: "sec_hidden", Listen: ln.Addr().String()}
	if err := letterbox.SaveConfig(home, c); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runMain("status", "--home", home)
	if code != 1 || !strings.Contains(out, "not healthy") {
		t.Fatalf("status with no daemon: %d %s", code, out)
	}

	b := &letterbox.Box{Home: home, Config: c, Log: quietLog(), HeartbeatEvery: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	url := "http://" + ln.Addr().String()
	req, _ := http.NewRequest("POST", url+"/kizuna/deliver", bytes.NewReader(letterBody("T-1")))
	ts := time.Now().Unix()
	req.Header.Set("X-Kizuna-Task-Id", "T-1")
	req.Header.Set("X-Kizuna-Timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("X-Kizuna-Signature", hubSign("sec_hidden", strconv.FormatInt(ts, 10), letterBody("T-1")))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("deliver: %v %v", resp, err)
	}
	code, out, errs = runMain("status", "--home", home)
	if code != 0 || !strings.Contains(out, "agent_id: A-7K3P") || !strings.Contains(out, "1 pending, 0 done") ||
		!strings.Contains(out, "0 waiting") || !strings.Contains(out, "daemon:   healthy") {
		t.Fatalf("status: %d %s %s", code, out, errs)
	}
	if strings.Contains(out, "tok_hidden") || strings.Contains(out, "sec_hidden") {
		t.Fatalf("status printed a secret: %s", out)
	}
}
