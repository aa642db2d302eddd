package queue

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func tlsServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func TestOutboundRefusesLoopbackUnlessAllowed(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "hello")
	})
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs

	_, err := NewOutbound(nil, roots).Post(srv.URL, "application/json", strings.NewReader("{}"))
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "127.0.0.1 is loopback") {
		t.Fatalf("without allow list: %v", err)
	}
	if hits.Load() != 0 {
		t.Fatalf("refused request reached the server %d times", hits.Load())
	}
	// Allowing another range does not open loopback.
	other, _ := ParseAllow("10.0.0.0/8")
	if _, err := NewOutbound(other, roots).Get(srv.URL); !errors.Is(err, ErrRefused) {
		t.Fatalf("with an unrelated allow list: %v", err)
	}

	allow, err := ParseAllow("127.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := NewOutbound(allow, roots).Get(srv.URL)
	if err != nil {
		t.Fatalf("allowed: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello" || hits.Load() != 1 {
		t.Fatalf("allowed: %d %q, %d hits", resp.StatusCode, body, hits.Load())
	}

	// Mapped IPv6 loopback is loopback.
	mapped := strings.Replace(srv.URL, "127.0.0.1", "[::ffff:127.0.0.1]", 1)
	if _, err := NewOutbound(nil, roots).Get(mapped); !errors.Is(err, ErrRefused) {
		t.Fatalf("IPv4-mapped loopback: %v", err)
	}
}

func TestOutboundDoesNotFollowRedirects(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		paths []string
	)
	srv := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		if r.URL.Path == "/start" {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
			return
		}
		io.WriteString(w, "followed")
	})
	allow, _ := ParseAllow("127.0.0.1")
	c := NewOutbound(allow, srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs)
	resp, err := c.Post(srv.URL+"/start", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/elsewhere" {
		t.Fatalf("got %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 1 {
		t.Fatalf("server saw %v", paths)
	}
}

func TestOutboundRefusesPrivateWithoutSending(t *testing.T) {
	t.Parallel()
	c := NewOutbound(nil, nil)
	for _, u := range []string{
		"https://10.255.255.1/hook",
		"https://169.254.169.254/latest/meta-data/",
		"https://[fd00::1]/hook",
		"https://[::ffff:192.168.1.1]/hook",
		"https://[::1]/hook",
	} {
		start := time.Now()
		_, err := c.Get(u)
		if !errors.Is(err, ErrRefused) {
			t.Errorf("%s: %v", u, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: refusal took %v; the guard should act before connecting", u, d)
		}
	}
}

func TestCheck(t *testing.T) {
	allow := []netip.Prefix{netip.MustParsePrefix("192.168.7.0/24")}
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1", false},
		{"::1", false},
		{"::ffff:127.0.0.1", false},
		{"::ffff:10.1.2.3", false},
		{"::", false},
		{"0.0.0.0", false},
		{"10.1.2.3", false},
		{"172.31.255.255", false},
		{"192.168.1.1", false},
		{"100.64.0.1", false},
		{"100.127.255.254", false},
		{"169.254.169.254", false},
		{"fe80::1", false},
		{"fe80::1%eth0", false},
		{"fc00::1", false},
		{"fdff::1", false},
		{"224.0.0.251", false},
		{"ff02::1", false},
		{"255.255.255.255", false},
		{"64:ff9b::a00:1", false}, // NAT64 of 10.0.0.1
		{"::127.0.0.1", false},    // IPv4-compatible
		{"8.8.8.8", true},
		{"100.128.0.1", true},
		{"2606:4700::1111", true},
		{"64:ff9b::808:808", true},   // NAT64 of 8.8.8.8
		{"192.168.7.9", true},        // allowed
		{"::ffff:192.168.7.9", true}, // allowed, mapped
		{"64:ff9b::c0a8:709", true},  // allowed, via NAT64
		{"192.168.8.1", false},       // next to the allowed range
	} {
		err := check(netip.MustParseAddr(tc.addr), allow)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrRefused)) {
			t.Errorf("check(%s) = %v, want ok=%v", tc.addr, err, tc.ok)
		}
	}
}

func TestParseAllow(t *testing.T) {
	got, err := ParseAllow(" 127.0.0.0/8, ::1 ,10.1.2.3,fd00::/8,, 192.168.1.77/24")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"127.0.0.0/8", "::1/128", "10.1.2.3/32", "fd00::/8", "192.168.1.0/24"}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if got, err := ParseAllow(""); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v %v", got, err)
	}
	for _, bad := range []string{"localhost", "127.0.0.0/33", "10.0.0.0/8,nope"} {
		if _, err := ParseAllow(bad); err == nil {
			t.Errorf("ParseAllow(%q) accepted", bad)
		}
	}
}
