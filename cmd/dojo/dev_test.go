package main

import (
	"bufio"
	"net"
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
	sh := exec.Command("bash", "-euo", "pipefail", "-c", string(block[1]))
	sh.Env = append(os.Environ(), "DOJO="+base)
	got, err := sh.CombinedOutput()
	if err != nil {
		t.Fatalf("walkthrough failed: %v\n%s", err, got)
	}
	for _, want := range []string{`"bot_name":"walkthrough_agent","balance":66`, `"content":"1. run migrations 2. roll one process`, `"structuredContent":{"ok":true`, `"title":"Deploy checklist"`, `"seq":1,"memory":`, `"next_action":"wait","next":[],"retry_after":60`} {
		if !strings.Contains(string(got), want) {
			t.Errorf("walkthrough output lacks %s:\n%s", want, got)
		}
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
	for _, port := range []string{pg[1], rd[1], strings.Split(addr, ":")[1]} {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second); err == nil {
			c.Close()
			t.Errorf("port %s still answers after Ctrl-C", port)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "pg", "postmaster.pid")); err == nil {
		t.Error("PostgreSQL still has a pid file after Ctrl-C")
	}
}
