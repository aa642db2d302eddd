package main

import (
	"bufio"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDevPrivateWalkthrough is command 1 on a machine where nothing is
// configured: dojo dev --private starts its own PostgreSQL and Redis, the
// README's walkthrough runs verbatim against it, and Ctrl-C stops all of it.
func TestDevPrivateWalkthrough(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not installed; .ci/run installs it")
	}
	dir, err := os.MkdirTemp("", "dojo-dev-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// PostgreSQL runs as the postgres user when we are root: it must reach the folder.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := command(t, map[string]string{"DOJO_ADDR": addr}, "dev", "--private", "--dir", filepath.Join(dir, "state"))
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	banner := make(chan string, 1)
	var out strings.Builder
	go func() {
		sc := bufio.NewScanner(stdout)
		sent := false
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if !sent && strings.Contains(sc.Text(), "Ctrl-C stops Dojo") {
				banner <- out.String()
				sent = true
			}
		}
	}()
	var printed string
	select {
	case printed = <-banner:
	case <-time.After(90 * time.Second):
		t.Fatalf("dojo dev did not come up:\n%s", out.String())
	}
	base := "http://" + addr
	pg := regexp.MustCompile(`PostgreSQL: postgres://postgres@127\.0\.0\.1:(\d+)/dojo`).FindStringSubmatch(printed)
	rd := regexp.MustCompile(`Redis:      redis://127\.0\.0\.1:(\d+)/0 \(private`).FindStringSubmatch(printed)
	if !strings.Contains(printed, "MCP:        "+base+"/mcp") || pg == nil || rd == nil || !strings.Contains(printed, "curl -s "+base+"/api/v1/account_register") {
		t.Fatalf("banner:\n%s", printed)
	}

	// The README's walkthrough, exactly as printed there.
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)<!-- walkthrough:start -->\\s*```sh\\n(.*?)```\\s*<!-- walkthrough:end -->").FindSubmatch(readme)
	if block == nil {
		t.Fatal("README has no walkthrough block")
	}
	// Twice: a second run must not trip over the first one's account or
	// the hourly register limit.
	for run := 1; run <= 2; run++ {
		sh := exec.Command("bash", "-c", string(block[1]))
		sh.Env = append(os.Environ(), "DOJO="+base)
		got, err := sh.CombinedOutput()
		if err != nil {
			t.Fatalf("walkthrough run %d failed: %v\n%s", run, err, got)
		}
		for _, want := range []*regexp.Regexp{regexp.MustCompile(`"bot_name":"walkthrough_\d+_\d+","balance":66`),
			regexp.MustCompile(`"content":"1\. run migrations 2\. roll one process`), regexp.MustCompile(`"structuredContent":\{"ok":true`),
			regexp.MustCompile(`"title":"Deploy checklist"`), regexp.MustCompile(`"seq":1,"memory":`),
			regexp.MustCompile(`"next_action":"wait","next":\[\],"retry_after":60`)} {
			if !want.Match(got) {
				t.Errorf("walkthrough run %d output lacks %s:\n%s", run, want, got)
			}
		}
	}
	// A refused step says so and stops: no chain of UNAUTHORIZED after it.
	broken := strings.Replace(string(block[1]), `"password\":\"change-me-please\"`, `"password\":\"short\"`, 1)
	if broken == string(block[1]) {
		t.Fatal("walkthrough no longer registers with the password this test breaks")
	}
	sh := exec.Command("bash", "-c", broken)
	sh.Env = append(os.Environ(), "DOJO="+base)
	got, err := sh.CombinedOutput()
	if err == nil || !strings.Contains(string(got), "step account_register was refused") || !strings.Contains(string(got), "INVALID_PASSWORD") ||
		strings.Contains(string(got), "UNAUTHORIZED") {
		t.Errorf("a failing walkthrough step: err %v, output:\n%s", err, got)
	}

	// The printed admin token registers a Kizuna agent.
	admin := regexp.MustCompile(`Admin token \(DOJO_ADMIN_TOKEN, generated for this run\):\s+(dojo_admin_[0-9a-f]{48})`).FindStringSubmatch(printed)
	if admin == nil {
		t.Fatalf("banner has no generated admin token:\n%s", printed)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/agents",
		strings.NewReader(`{"name":"Dev box","capabilities":"","webhook_url":"http://127.0.0.1:7788"}`))
	req.Header.Set("Authorization", "Bearer "+admin[1])
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusCreated {
		t.Errorf("register with the printed admin token: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// dojo check audits this run's private database, found through --dir.
	chk, err := command(t, nil, "check", "--dir", filepath.Join(dir, "state")).CombinedOutput()
	if err != nil || !strings.Contains(string(chk), "127.0.0.1:"+pg[1]+"/dojo") || !strings.Contains(string(chk), "every balance equals its ledger") {
		t.Errorf("dojo check during dojo dev --private: %v\n%s", err, chk)
	}

	// Ctrl-C stops Dojo, PostgreSQL and Redis.
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dojo dev exit: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("dojo dev did not stop on SIGINT")
	}
	// A socket can outlive its process by a moment on a loaded machine:
	// each port has a few seconds to stop answering.
	for _, port := range []string{pg[1], rd[1], strings.Split(addr, ":")[1]} {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second)
			if err != nil {
				break
			}
			c.Close()
			if time.Now().After(deadline) {
				t.Errorf("port %s still answers 10 s after Ctrl-C", port)
				break
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "dev.env")); err == nil {
		t.Error("dojo dev left its dev.env behind")
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "pg", "postmaster.pid")); err == nil {
		t.Error("PostgreSQL still has a pid file after Ctrl-C")
	}
}

// TestDevHelp: asking for help is not an error.
func TestDevHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"dev", "--help"}, {"dev", "-h"}, {"check", "--help"}, {"tools", "--help"}} {
		out, err := command(t, nil, args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Usage") && !strings.Contains(string(out), "-dir") && !strings.Contains(string(out), "-markdown") {
			t.Errorf("dojo %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	out, _ := command(t, nil, "dev", "--help").CombinedOutput()
	if !strings.Contains(string(out), "Usage: dojo dev") || !strings.Contains(string(out), "-private") {
		t.Errorf("dojo dev --help:\n%s", out)
	}
}
