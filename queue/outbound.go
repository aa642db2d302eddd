package queue

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"time"
)

// ErrRefused marks an outbound connection the guard refused: nothing was
// sent. Test with errors.Is; the http.Client's *url.Error wraps it.
var ErrRefused = errors.New("outbound address refused")

// Outbound timeouts.
const (
	DialTimeout    = 5 * time.Second
	RequestTimeout = 10 * time.Second
)

// blocked are the ranges a caller-supplied URL must never reach: this host,
// the operator's networks and cloud metadata services.
var blocked = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared (CGNAT)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "reserved"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/96"), "unspecified or IPv4-compatible"},
	{netip.MustParsePrefix("fc00::/7"), "private"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// nat64 embeds an IPv4 address in its last 32 bits; a gateway would carry
// 64:ff9b::7f00:1 to 127.0.0.1, so the embedded address is judged too.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// check refuses addr unless it is public or inside allow.
func check(addr netip.Addr, allow []netip.Prefix) error {
	addr = addr.Unmap().WithZone("")
	for _, p := range allow {
		if p.Contains(addr) {
			return nil
		}
	}
	if nat64.Contains(addr) {
		b := addr.As16()
		if err := check(netip.AddrFrom4([4]byte(b[12:])), allow); err != nil {
			return fmt.Errorf("%w (via NAT64 %s)", err, addr)
		}
	}
	for _, b := range blocked {
		if b.prefix.Contains(addr) {
			return fmt.Errorf("%w: %s is %s", ErrRefused, addr, b.why)
		}
	}
	return nil
}

// NewOutbound returns the one HTTP client for every outbound POST (notify
// pushes, receivers, letters). The guard runs at dial time, on the address
// actually being connected to, so DNS answers that change between check
// and use cannot slip past it. Addresses inside allow are let through
// (DOJO_ALLOW_TARGETS, for tests and local daemons); there is no way to
// switch the guard off. Redirects are returned, never followed, and no
// proxy from the environment is used, since the guard would then judge the
// proxy instead of the target. roots nil means the system roots.
func NewOutbound(allow []netip.Prefix, roots *x509.CertPool) *http.Client {
	allow = append([]netip.Prefix(nil), allow...)
	dialer := &net.Dialer{
		Timeout: DialTimeout,
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: unparsable address %q", ErrRefused, address)
			}
			return check(ap.Addr(), allow)
		},
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         dialer.DialContext,
		TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: DialTimeout,
		MaxIdleConns:        100,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	return &http.Client{
		Transport: tr,
		Timeout:   RequestTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// ParseAllow reads DOJO_ALLOW_TARGETS: comma-separated prefixes or bare
// addresses ("127.0.0.0/8, ::1"). Empty means none.
func ParseAllow(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, fmt.Errorf("allow list: %q is neither an address nor a prefix", f)
			}
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("allow list: %w", err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
