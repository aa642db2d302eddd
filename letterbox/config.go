package letterbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// DefaultListen is the contract's letterbox port on every interface: the
// hub must reach /kizuna/deliver from outside.
const DefaultListen = ":7788"

// maxConfig bounds config.json; a real one is a few hundred bytes.
const maxConfig = 64 << 10

// Config is config.json. The install scripts and hand-written files use
// these keys; unknown keys are ignored.
type Config struct {
	HubURL         string `json:"hub_url"`
	AgentID        string `json:"agent_id"`
	AgentToken     string `json:"agent_token"`
	EndpointSecret string `json:"endpoint_secret"`
	Listen         string `json:"listen"`
	// DeliverListen, when set, is a second address that serves only
	// POST /kizuna/deliver: the one a reverse proxy should point at.
	DeliverListen string `json:"deliver_listen,omitempty"`
}

// LogValue keeps the token and the secret out of any log line that
// mentions a Config.
func (c Config) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("agent_id", c.AgentID), slog.String("hub_url", c.HubURL), slog.String("listen", c.Listen)}
	if c.DeliverListen != "" {
		attrs = append(attrs, slog.String("deliver_listen", c.DeliverListen))
	}
	return slog.GroupValue(attrs...)
}

// String, like LogValue, leaves the secrets out, so that a stray %v
// cannot print them.
func (c Config) String() string {
	return fmt.Sprintf("agent %s at %s, listening on %s", c.AgentID, c.HubURL, c.Listen)
}

// GoString covers %#v.
func (c Config) GoString() string { return c.String() }

// Check reports the first missing or unusable key and fills the default
// listen address.
func (c *Config) Check() error {
	for _, k := range []struct{ name, v string }{
		{"hub_url", c.HubURL}, {"agent_id", c.AgentID}, {"agent_token", c.AgentToken}, {"endpoint_secret", c.EndpointSecret},
	} {
		if strings.TrimSpace(k.v) == "" {
			return fmt.Errorf("config.json: %s is missing", k.name)
		}
	}
	if err := checkHubURL(c.HubURL); err != nil {
		return fmt.Errorf("config.json: hub_url: %w", err)
	}
	c.HubURL = strings.TrimRight(c.HubURL, "/")
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.DeliverListen != "" && c.DeliverListen == c.Listen {
		return errors.New("config.json: deliver_listen must differ from listen")
	}
	return nil
}

func checkHubURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("must be an absolute http(s) URL")
	}
	return nil
}

// ConfigPath is config.json inside home.
func ConfigPath(home string) string { return filepath.Join(home, "config.json") }

// LoadConfig reads and checks home's config.json.
func LoadConfig(home string) (Config, error) {
	f, err := os.Open(ConfigPath(home))
	if err != nil {
		return Config{}, fmt.Errorf("letterbox: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfig+1))
	if err != nil {
		return Config{}, fmt.Errorf("letterbox: reading config.json: %w", err)
	}
	if len(b) > maxConfig {
		return Config{}, errors.New("letterbox: config.json is larger than 64 KiB")
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return Config{}, fmt.Errorf("letterbox: config.json is not a JSON object: %w", err)
	}
	if err := c.Check(); err != nil {
		return Config{}, fmt.Errorf("letterbox: %w", err)
	}
	return c, nil
}

// SaveConfig writes c to home/config.json with mode 0600, atomically.
func SaveConfig(home string, c Config) error {
	if err := os.MkdirAll(home, 0o700); err != nil {
		return fmt.Errorf("letterbox: %w", err)
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("letterbox: %w", err)
	}
	// CreateTemp already makes the file 0600, before any byte is written.
	if err := writeAtomic(home, "config.json", append(b, '\n')); err != nil {
		return fmt.Errorf("letterbox: writing config.json: %w", err)
	}
	return nil
}
