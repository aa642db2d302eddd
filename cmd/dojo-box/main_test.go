package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildBox compiles dojo-box with a version stamped in, as a release does.
func buildBox(t *testing.T) string {
	t.Helper()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		if goTool, err = exec.LookPath("go"); err != nil {
			t.Fatal("these tests build dojo-box and need the go tool on PATH; install Go 1.26")
		}
	}
	bin := filepath.Join(t.TempDir(), "dojo-box")
	out, err := exec.Command(goTool, "build", "-ldflags", "-X github.com/dojo-relay/dojo/letterbox.Version=9.9.9-test", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

const (
	token  = "kf_live_process_token"
	secret = "es_process_secret"
)

func sign(ts string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "." + string(body)))
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// daemon starts `dojo-box run` and waits until it answers /healthz.
func daemon(t *testing.T, bin, home, addr string, env ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(bin, "run", "--home", home)
	cmd.Env = append(os.Environ(), append([]string{"DOJO_BOX_HEARTBEAT=1h"}, env...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return cmd, &stderr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("dojo-box did not come up: %v\n%s", err, stderr.String())
		}
		time.Sleep(30 * time.Millisecond)
	}
}

func deliver(addr, id string) (*http.Response, []byte, error) {
	body := []byte(`{"task_id":"` + id + `","from":"A-9X2M","to":"A-7K3P","kind":"kizuna.task","reply_to":null,"content":{"title":"t","body":"b"},"created_at":"2026-11-30T22:51:38.000Z"}`)
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req, _ := http.NewRequest("POST", "http://"+addr+"/kizuna/deliver", bytes.NewReader(body))
	req.Header.Set("X-Kizuna-Task-Id", id)
	req.Header.Set("X-Kizuna-Timestamp", ts)
	req.Header.Set("X-Kizuna-Attempt", "2")
	req.Header.Set("X-Kizuna-Signature", sign(ts, body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func exitCode(t *testing.T, cmd *exec.Cmd, within time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(within):
		t.Fatalf("dojo-box did not exit within %v", within)
		return -1
	}
}

// TestProcess: the binary's version stamp, a crash right after a spool
// write (the letter survives; the redelivery gets the same ACK), status,
// and a graceful stop on SIGTERM with logs free of secrets.
func TestProcess(t *testing.T) {
	bin := buildBox(t)
	out, err := exec.Command(bin, "version").Output()
	if err != nil || string(out) != "dojo-box 9.9.9-test\n" {
		t.Fatalf("version: %q %v", out, err)
	}

	home := filepath.Join(t.TempDir(), "home with space")
	addr := freeAddr(t)
	os.MkdirAll(home, 0o700)
	cfg := fmt.Sprintf(`{"hub_url":"http://%s","agent_id":"A-7K3P","agent_token":%q,"endpoint_secret":%q,"listen":%q}`, freeAddr(t), token, secret, addr)
	if err := os.WriteFile(filepath.Join(home, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}

	cmd, stderr := daemon(t, bin, home, addr, "DOJO_BOX_FAILPOINT=exit-after-spool")
	if _, _, err := deliver(addr, "T-crash"); err == nil {
		t.Fatal("the failpoint should have dropped the connection before the ACK")
	}
	if code := exitCode(t, cmd, 10*time.Second); code != 3 {
		t.Fatalf("exit code %d, want 3 from the failpoint\n%s", code, stderr)
	}
	raw, err := os.ReadFile(filepath.Join(home, "spool", "T-crash.json"))
	if err != nil {
		t.Fatalf("the letter did not survive the crash: %v", err)
	}
	var rec struct {
		ReceivedAt string `json:"received_at"`
		Attempt    int    `json:"attempt"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil || rec.Attempt != 2 {
		t.Fatalf("spool record after the crash: %s %v", raw, err)
	}

	cmd, stderr = daemon(t, bin, home, addr)
	resp, b, err := deliver(addr, "T-crash")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("redelivery: %v %v %s", resp, err, b)
	}
	if want := `{"received_at":"` + rec.ReceivedAt + `","status":"received","task_id":"T-crash"}`; string(b) != want {
		t.Fatalf("ACK %s, want %s", b, want)
	}
	entries, _ := os.ReadDir(filepath.Join(home, "spool"))
	if len(entries) != 2 { // T-crash.json and done/
		t.Fatalf("spool holds %d entries after the redelivery", len(entries))
	}

	st := exec.Command(bin, "status", "--home", home)
	out, err = st.Output()
	if err != nil || !strings.Contains(string(out), "daemon:   healthy") || !strings.Contains(string(out), "1 pending") {
		t.Fatalf("status: %v\n%s", err, out)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, cmd, 15*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0\n%s", code, stderr)
	}
	logs, err := os.ReadFile(filepath.Join(home, "logs", "dojo-box.log"))
	if err != nil || !bytes.Contains(logs, []byte("letterbox stopped")) || !bytes.Contains(logs, []byte("T-crash")) {
		t.Fatalf("log file: %v\n%s", err, logs)
	}
	for _, s := range []string{token, secret} {
		if bytes.Contains(logs, []byte(s)) || strings.Contains(stderr.String(), s) {
			t.Fatalf("the log holds a secret:\n%s", logs)
		}
	}
}
