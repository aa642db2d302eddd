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

// TestCheckRegistries walks the IANA IPv4 and IPv6 Special-Purpose Address
// Registries: every entry is refused, or let through on purpose because
// IANA marks it globally reachable and it is no door into the operator's
// network. Regression for issue 7: documentation ranges, 6to4 (2002:7f00:1::
// is 127.0.0.1), Teredo and the local-use NAT64 prefix used to pass.
func TestCheckRegistries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		entry string // registry entry
		addrs []string
		ok    bool
	}{
		// IPv4 Special-Purpose Address Registry.
		{"0.0.0.0/8 this network", []string{"0.0.0.0", "0.1.2.3", "0.255.255.255"}, false},
		{"10.0.0.0/8 private", []string{"10.0.0.1", "10.255.255.255"}, false},
		{"100.64.0.0/10 shared address space", []string{"100.64.0.0", "100.127.255.255"}, false},
		{"127.0.0.0/8 loopback", []string{"127.0.0.1", "127.255.255.254"}, false},
		{"169.254.0.0/16 link local", []string{"169.254.0.1", "169.254.169.254"}, false},
		{"172.16.0.0/12 private", []string{"172.16.0.1", "172.31.255.255"}, false},
		{"192.0.0.0/24 IETF protocol assignments", []string{"192.0.0.1", "192.0.0.100", "192.0.0.255"}, false},
		{"192.0.0.0/29 IPv4 service continuity", []string{"192.0.0.0", "192.0.0.7"}, false},
		{"192.0.0.8/32 IPv4 dummy", []string{"192.0.0.8"}, false},
		// Globally reachable in IANA, refused here: anycast to the nearest
		// PCP server or TURN relay, which may well be the operator's own.
		{"192.0.0.9/32 PCP anycast", []string{"192.0.0.9"}, false},
		{"192.0.0.10/32 TURN anycast", []string{"192.0.0.10"}, false},
		{"192.0.0.170/32, 192.0.0.171/32 NAT64/DNS64 discovery", []string{"192.0.0.170", "192.0.0.171"}, false},
		{"192.0.2.0/24 TEST-NET-1", []string{"192.0.2.1", "192.0.2.255"}, false},
		// Globally reachable: AS112 DNS sinks and AMT relays are public services.
		{"192.31.196.0/24 AS112-v4", []string{"192.31.196.1"}, true},
		{"192.52.193.0/24 AMT", []string{"192.52.193.1"}, true},
		{"192.88.99.0/24 6to4 relay anycast (deprecated), incl. 192.88.99.2 6a44", []string{"192.88.99.1", "192.88.99.2"}, false},
		{"192.168.0.0/16 private", []string{"192.168.0.1", "192.168.255.255"}, false},
		{"192.175.48.0/24 AS112 direct delegation", []string{"192.175.48.6"}, true},
		{"198.18.0.0/15 benchmarking", []string{"198.18.0.1", "198.19.255.255"}, false},
		{"198.51.100.0/24 TEST-NET-2", []string{"198.51.100.7"}, false},
		{"203.0.113.0/24 TEST-NET-3", []string{"203.0.113.9"}, false},
		{"224.0.0.0/4 multicast (incl. 233.252.0.0/24 MCAST-TEST-NET)", []string{"224.0.0.1", "233.252.0.1", "239.255.255.255"}, false},
		{"240.0.0.0/4 reserved", []string{"240.0.0.1", "254.255.255.255"}, false},
		{"255.255.255.255/32 limited broadcast", []string{"255.255.255.255"}, false},

		// IPv6 Special-Purpose Address Registry.
		{"::1/128 loopback", []string{"::1"}, false},
		{"::/128 unspecified", []string{"::"}, false},
		{"::ffff:0:0/96 IPv4-mapped: judged as IPv4", []string{"::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:192.0.2.1"}, false},
		{"::ffff:0:0/96 IPv4-mapped of a public address", []string{"::ffff:8.8.8.8"}, true},
		{"::/96 IPv4-compatible (deprecated)", []string{"::127.0.0.1", "::8.8.8.8"}, false},
		{"64:ff9b::/96 NAT64 of a refused IPv4", []string{"64:ff9b::7f00:1", "64:ff9b::a00:1", "64:ff9b::c000:201"}, false},
		// Globally reachable: NAT64 is how IPv6-only hosts reach IPv4.
		{"64:ff9b::/96 NAT64 of a public IPv4", []string{"64:ff9b::808:808"}, true},
		{"64:ff9b:1::/48 local-use translation", []string{"64:ff9b:1::1", "64:ff9b:1::808:808", "64:ff9b:1:ffff::1"}, false},
		{"100::/64 discard-only", []string{"100::1", "100::ffff:ffff:ffff:ffff"}, false},
		{"100:0:0:1::/64 dummy prefix", []string{"100:0:0:1::1"}, false},
		{"2001::/23 IETF protocol assignments", []string{"2001:5::1", "2001:1ff:ffff::1", "2001:1::4"}, false},
		{"2001::/32 Teredo (embeds an obfuscated IPv4)", []string{"2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001::1", "2001:0:808:808::80ff:fffe"}, false},
		// Globally reachable in IANA, refused: anycast to the nearest
		// service of the kind, likely the operator's own network.
		{"2001:1::1/128 PCP anycast", []string{"2001:1::1"}, false},
		{"2001:1::2/128 TURN anycast", []string{"2001:1::2"}, false},
		{"2001:1::3/128 DNS-SD SRP anycast", []string{"2001:1::3"}, false},
		{"2001:2::/48 benchmarking", []string{"2001:2::1", "2001:2:0:ffff::1"}, false},
		// Globally reachable: public AMT relays.
		{"2001:3::/32 AMT", []string{"2001:3::1"}, true},
		// Globally reachable: public AS112 DNS sinks.
		{"2001:4:112::/48 AS112-v6", []string{"2001:4:112::1"}, true},
		{"2001:10::/28 ORCHID (deprecated)", []string{"2001:10::1", "2001:1f::1"}, false},
		// Globally reachable in IANA, refused: ORCHIDv2 and DETs are
		// identifiers, not locators; nothing answers HTTP there.
		{"2001:20::/28 ORCHIDv2", []string{"2001:20::1", "2001:2f::1"}, false},
		{"2001:30::/28 drone remote ID tags", []string{"2001:30::1"}, false},
		{"2001:db8::/32 documentation", []string{"2001:db8::1", "2001:db8:ffff::1"}, false},
		{"2002::/16 6to4 (embeds an IPv4)", []string{"2002:7f00:1::", "2002:a00:1::1", "2002:808:808::1"}, false},
		// Globally reachable: AS112 direct delegation.
		{"2620:4f:8000::/48 AS112 direct delegation", []string{"2620:4f:8000::1"}, true},
		{"3fff::/20 documentation", []string{"3fff::1", "3fff:fff::1"}, false},
		{"5f00::/16 SRv6 SIDs", []string{"5f00::1"}, false},
		{"fc00::/7 unique local", []string{"fc00::1", "fd12:3456::1"}, false},
		{"fe80::/10 link-local", []string{"fe80::1", "febf::1"}, false},
		// Not in the registries, refused all the same.
		{"fec0::/10 site-local (deprecated)", []string{"fec0::1"}, false},
		{"ff00::/8 multicast", []string{"ff02::1", "ff0e::1"}, false},
		{"outside 2000::/3 (unassigned)", []string{"400::1", "4000::1", "8000::1", "e000::1"}, false},

		// Public addresses that must pass.
		{"public IPv4", []string{"1.1.1.1", "8.8.8.8", "93.184.215.14", "100.63.255.255", "100.128.0.1",
			"172.15.255.255", "172.32.0.1", "192.0.1.1", "192.0.3.1", "192.88.98.1", "192.88.100.1",
			"198.17.255.255", "198.20.0.1", "198.51.99.1", "203.0.112.1", "223.255.255.254"}, true},
		{"public IPv6", []string{"2606:4700::1111", "2a00:1450:4001::200e", "2001:200::1", "2001:4860:4860::8888",
			"2003::1", "2400:cb00::1", "3ffe:ffff::1", "2001:db7:ffff::1", "2001:db9::1"}, true},
	} {
		for _, a := range tc.addrs {
			err := check(netip.MustParseAddr(a), nil)
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrRefused)) {
				t.Errorf("%s: check(%s) = %v, want ok=%v", tc.entry, a, err, tc.ok)
			}
		}
	}
	// The embedded address is named, and the allow list does not open a
	// tunnel to an allowed IPv4 (only NAT64 is judged by what it embeds).
	for addr, want := range map[string]string{
		"2002:7f00:1::":                        "embeds 127.0.0.1",
		"2001:0:4136:e378:8000:63bf:80ff:fffe": "embeds 127.0.0.1",
	} {
		err := check(netip.MustParseAddr(addr), []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("check(%s) = %v, want a refusal that %s", addr, err, want)
		}
	}
}
