package relay_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func get(t *testing.T, url string) (int, string, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

func TestPages(t *testing.T) {
	t.Parallel()
	d := start(t)
	if code, _, body := get(t, d.URL+"/healthz"); code != 200 || !strings.Contains(body, `"ok":true`) {
		t.Errorf("healthz: %d %s", code, body)
	}
	if code, _, body := get(t, d.URL+"/readyz"); code != 200 || !strings.Contains(body, `"postgres":"ok"`) || !strings.Contains(body, `"redis":"ok"`) {
		t.Errorf("readyz: %d %s", code, body)
	}
	if code, ct, body := get(t, d.URL+"/"); code != 200 || !strings.HasPrefix(ct, "text/html") || !strings.Contains(body, d.URL+"/mcp") {
		t.Errorf("index: %d %s", code, body)
	}
	if code, ct, body := get(t, d.URL+"/docs/tools.md"); code != 200 || !strings.HasPrefix(ct, "text/markdown") || !strings.Contains(body, "memory_put") {
		t.Errorf("docs/tools.md: %d %s", code, ct)
	}
	if code, _, _ := get(t, d.URL+"/docs/../go.mod"); code != 404 {
		t.Errorf("docs path escape: %d", code)
	}
	if code, _, _ := get(t, d.URL+"/docs/"); code != 200 {
		t.Errorf("docs index: %d", code)
	}
	// GET /mcp is not a stream here.
	if code, _, _ := get(t, d.URL+"/mcp"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /mcp: %d", code)
	}
}

// readyz tells a load balancer when Redis is gone.
func TestReadyzReportsRedisDown(t *testing.T) {
	t.Parallel()
	d := start(t)
	_ = d.App.Redis.Close()
	code, _, body := get(t, d.URL+"/readyz")
	if code != 503 || !strings.Contains(body, `"ok":false`) {
		t.Fatalf("readyz with Redis closed: %d %s", code, body)
	}
}
