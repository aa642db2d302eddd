package letterbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

const usage = `dojo-box — a Kizuna letterbox

Usage:
  dojo-box enroll --hub URL --token T [--listen ADDR] [--name N] [--capabilities C] [--webhook URL]
  dojo-box run                  receive letters and serve the loopback API
  dojo-box status               show the config, the spool and whether the daemon answers
  dojo-box version

Every command takes --home DIR (default ~/.dojo-box).
`

// Log rotation: 10 MB a file, five old files.
const (
	logMax  = 10 << 20
	logKeep = 5
)

// Main runs the dojo-box command line with args (without the program
// name) and returns the exit status: 0 ok, 1 failed, 2 misused.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "enroll":
		return enroll(args, stdout, stderr)
	case "run":
		return run(args, stdout, stderr)
	case "status":
		return status(args, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "dojo-box %s\n", Version)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "dojo-box: unknown command %q\n\n%s", cmd, usage)
	return 2
}

// flags makes a command's flag set with --home.
func flags(name string, stderr io.Writer) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("dojo-box "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs, fs.String("home", "", "the letterbox's directory (default ~/.dojo-box)")
}

func homeDir(flagged string) (string, error) {
	if flagged != "" {
		return flagged, nil
	}
	h, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no home directory; pass --home: %w", err)
	}
	return filepath.Join(h, ".dojo-box"), nil
}

func parse(fs *flag.FlagSet, args []string, stderr io.Writer) bool {
	if err := fs.Parse(args); err != nil {
		return false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return false
	}
	return true
}

func enroll(args []string, stdout, stderr io.Writer) int {
	fs, homeFlag := flags("enroll", stderr)
	hub := fs.String("hub", "", "the hub's URL")
	token := fs.String("token", "", "the one-time enroll token (or DOJO_BOX_ENROLL_TOKEN, kept off the command line)")
	listen := fs.String("listen", DefaultListen, "the address the daemon listens on")
	fs.String("name", "", "the agent's name (the hub may know it from the token)")
	fs.String("capabilities", "", "what the agent does (the hub may know it from the token)")
	fs.String("webhook", "", "the letterbox's public URL (the hub may know it from the token)")
	if !parse(fs, args, stderr) {
		return 2
	}
	home, err := homeDir(*homeFlag)
	if err != nil {
		fmt.Fprintln(stderr, "dojo-box enroll:", err)
		return 1
	}
	if _, err := os.Stat(ConfigPath(home)); err == nil {
		// Re-running the install resumes here without spending a token.
		c, err := LoadConfig(home)
		if err != nil {
			fmt.Fprintln(stderr, "dojo-box enroll: a config exists but cannot be used:", err)
			return 1
		}
		fmt.Fprintf(stdout, "already enrolled as %s\n", c.AgentID)
		return 0
	} else if !errors.Is(err, iofs.ErrNotExist) {
		fmt.Fprintln(stderr, "dojo-box enroll:", err)
		return 1
	}
	if *token == "" {
		*token = os.Getenv("DOJO_BOX_ENROLL_TOKEN")
	}
	if *hub == "" || *token == "" {
		fmt.Fprintln(stderr, "dojo-box enroll: --hub and --token are required")
		return 2
	}
	if err := checkHubURL(*hub); err != nil {
		fmt.Fprintln(stderr, "dojo-box enroll: --hub", err)
		return 2
	}
	// Only what was given goes to the hub: Dojo fills the rest from what
	// the admin stored with the token.
	body := map[string]string{}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "name", "capabilities":
			body[f.Name] = f.Value.String()
		case "webhook":
			body["webhook_url"] = f.Value.String()
		}
	})
	hubURL := strings.TrimRight(*hub, "/")
	c, err := register(hubURL, *token, body)
	if err != nil {
		fmt.Fprintln(stderr, "dojo-box enroll:", err)
		return 1
	}
	c.HubURL, c.Listen = hubURL, *listen
	listenSet := false
	fs.Visit(func(f *flag.Flag) { listenSet = listenSet || f.Name == "listen" })
	if !listenSet {
		// The admin chose the webhook, and with it the port the hub
		// delivers to; the box should listen there.
		if port := webhookPort(hubURL, c); port != "" {
			c.Listen = ":" + port
		}
	}
	if err := SaveConfig(home, c); err != nil {
		fmt.Fprintln(stderr, "dojo-box enroll:", err)
		return 1
	}
	fmt.Fprintf(stdout, "enrolled as %s; config written to %s\n", c.AgentID, ConfigPath(home))
	return 0
}

// webhookPort asks the hub for the new agent's webhook_url and returns its
// explicit port, or "" when it has none or the hub does not say: a URL
// without a port is taken to be a proxy in front of the box.
func webhookPort(hub string, c Config) string {
	client := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequest(http.MethodGet, hub+"/api/v1/agents/"+url.PathEscape(c.AgentID), nil)
	if err != nil {
		return ""
	}
	req.Header.Set("Authorization", "Bearer "+c.AgentToken)
	req.Header.Set("User-Agent", "dojo-box/"+Version)
	resp, err := client.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var agent struct {
		WebhookURL string `json:"webhook_url"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, maxHubAnswer)).Decode(&agent) != nil {
		return ""
	}
	u, err := url.Parse(agent.WebhookURL)
	if err != nil {
		return ""
	}
	return u.Port()
}

// register spends the enroll token at the hub.
func register(hub, token string, fields map[string]string) (Config, error) {
	body, _ := json.Marshal(fields)
	client := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequest(http.MethodPost, hub+"/api/v1/agents?token="+url.QueryEscape(token), bytes.NewReader(body))
	if err != nil {
		return Config{}, fmt.Errorf("bad hub URL: %w", plainError(err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "dojo-box/"+Version)
	resp, err := client.Do(req)
	if err != nil {
		return Config{}, fmt.Errorf("hub %s not reached: %w", hub, plainError(err))
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxHubAnswer))
	if err != nil {
		return Config{}, fmt.Errorf("reading the hub's answer: %w", err)
	}
	if resp.StatusCode != http.StatusCreated {
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(answer, &e) == nil && e.Error.Code != "" {
			return Config{}, fmt.Errorf("hub refused (HTTP %d): %s: %s", resp.StatusCode, e.Error.Code, e.Error.Message)
		}
		return Config{}, fmt.Errorf("hub refused with HTTP %d", resp.StatusCode)
	}
	var c Config
	if err := json.Unmarshal(answer, &c); err != nil || c.AgentID == "" || c.AgentToken == "" || c.EndpointSecret == "" {
		return Config{}, errors.New("the hub's 201 lacks agent_id, agent_token or endpoint_secret")
	}
	return Config{AgentID: c.AgentID, AgentToken: c.AgentToken, EndpointSecret: c.EndpointSecret}, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	fs, homeFlag := flags("run", stderr)
	if !parse(fs, args, stderr) {
		return 2
	}
	home, err := homeDir(*homeFlag)
	if err != nil {
		fmt.Fprintln(stderr, "dojo-box run:", err)
		return 1
	}
	c, err := LoadConfig(home)
	if err != nil {
		fmt.Fprintln(stderr, "dojo-box run:", err)
		return 1
	}
	box := &Box{Home: home, Config: c}
	if v := os.Getenv("DOJO_BOX_HEARTBEAT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fmt.Fprintln(stderr, "dojo-box run: DOJO_BOX_HEARTBEAT must be a positive duration such as 60s")
			return 2
		}
		box.HeartbeatEvery = d
		box.HeartbeatMax = max(d, min(5*d, DefaultHeartbeatMax))
	}
	logs, err := OpenLogFile(filepath.Join(home, "logs", "dojo-box.log"), logMax, logKeep)
	if err != nil {
		fmt.Fprintln(stderr, "dojo-box run:", err)
		return 1
	}
	defer logs.Close()
	var out io.Writer = logs
	if consoleOrJournal(stderr) {
		// The file first: a closed stderr must not stop the file from
		// getting the line.
		out = io.MultiWriter(logs, stderr)
	}
	box.Log = slog.New(slog.NewJSONHandler(out, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := box.Run(ctx); err != nil {
		box.Log.Error("letterbox failed", "err", err)
		fmt.Fprintln(stderr, "dojo-box run:", err)
		return 1
	}
	return 0
}

// consoleOrJournal reports whether log lines should also go to stderr:
// when someone watches it (a terminal) or systemd keeps it (JOURNAL_STREAM).
// Anywhere else stderr is most likely a file of its own, which would grow
// without the rotation dojo-box.log has, or the same file, doubling lines.
func consoleOrJournal(stderr io.Writer) bool {
	if os.Getenv("JOURNAL_STREAM") != "" {
		return true
	}
	f, ok := stderr.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func status(args []string, stdout, stderr io.Writer) int {
	fs, homeFlag := flags("status", stderr)
	if !parse(fs, args, stderr) {
		return 2
	}
	home, err := homeDir(*homeFlag)
	if err != nil {
		fmt.Fprintln(stderr, "dojo-box status:", err)
		return 1
	}
	c, err := LoadConfig(home)
	if err != nil {
		fmt.Fprintln(stderr, "dojo-box status:", err)
		return 1
	}
	spoolDir := filepath.Join(home, "spool")
	fmt.Fprintf(stdout, "agent_id: %s\nhub_url:  %s\nlisten:   %s\n", c.AgentID, c.HubURL, c.Listen)
	fmt.Fprintf(stdout, "spool:    %d pending, %d done\n", count(spoolDir), count(filepath.Join(spoolDir, "done")))
	outbox := 0
	entries, _ := os.ReadDir(filepath.Join(home, "outbox"))
	for _, e := range entries {
		if isItemName(e.Name()) {
			outbox++
		}
	}
	fmt.Fprintf(stdout, "outbox:   %d waiting\n", outbox)
	u := healthURL(c.Listen)
	if err := checkHealth(u, c.AgentID); err != nil {
		fmt.Fprintf(stdout, "daemon:   not healthy (%s: %v)\n", u, err)
		return 1
	}
	fmt.Fprintf(stdout, "daemon:   healthy (%s)\n", u)
	return 0
}

// healthURL is where the daemon on listen answers this machine.
func healthURL(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		host, port = "", "7788"
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/healthz"
}

func checkHealth(u, agentID string) error {
	client := &http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get(u)
	if err != nil {
		return plainError(err)
	}
	defer resp.Body.Close()
	var h struct {
		OK      bool   `json:"ok"`
		AgentID string `json:"agent_id"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&h); err != nil || resp.StatusCode != http.StatusOK || !h.OK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	if h.AgentID != agentID {
		return fmt.Errorf("the daemon there is agent %q", h.AgentID)
	}
	return nil
}
