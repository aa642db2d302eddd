package queue

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
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
// the operator's networks, cloud metadata services, and every entry of the
// IANA IPv4 and IPv6 Special-Purpose Address Registries that is not meant
// for the public internet. A few registry entries IANA marks globally
// reachable are refused too, because they are anycast addresses of the
// nearest service of their kind, which is often the operator's own router
// or relay (PCP, TURN, DNS-SD SRP), or identifiers that are not locators
// (ORCHIDv2, DETs). The globally reachable entries let through are AS112
// (192.31.196.0/24, 192.175.48.0/24, 2001:4:112::/48, 2620:4f:8000::/48)
// and AMT (192.52.193.0/24, 2001:3::/32); see TestCheckRegistries. More
// specific entries come first so the reason names them.
var blocked = []struct {
	prefix netip.Prefix
	why    string
}{
	// IPv4.
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified (this network)"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared (CGNAT)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/29"), "IPv4 service continuity (DS-Lite)"},
	{netip.MustParsePrefix("192.0.0.8/32"), "the IPv4 dummy address"},
	{netip.MustParsePrefix("192.0.0.9/32"), "PCP anycast (the nearest NAT gateway)"},
	{netip.MustParsePrefix("192.0.0.10/32"), "TURN anycast (the nearest relay)"},
	{netip.MustParsePrefix("192.0.0.170/31"), "NAT64/DNS64 discovery"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation (TEST-NET-1)"},
	{netip.MustParsePrefix("192.88.99.0/24"), "6to4 relay anycast (deprecated)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation (TEST-NET-2)"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation (TEST-NET-3)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	// IPv6. Only 2000::/3 is global unicast (see check); these name the
	// special ranges inside and outside it.
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible (deprecated)"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use IPv4/IPv6 translation"},
	{netip.MustParsePrefix("100::/64"), "discard-only"},
	{netip.MustParsePrefix("100:0:0:1::/64"), "the IPv6 dummy prefix"},
	{netip.MustParsePrefix("2001:1::1/128"), "PCP anycast (the nearest NAT gateway)"},
	{netip.MustParsePrefix("2001:1::2/128"), "TURN anycast (the nearest relay)"},
	{netip.MustParsePrefix("2001:1::3/128"), "DNS-SD SRP anycast (the nearest registrar)"},
	{netip.MustParsePrefix("2001:2::/48"), "benchmarking"},
	{netip.MustParsePrefix("2001:10::/28"), "ORCHID (deprecated)"},
	{netip.MustParsePrefix("2001:20::/28"), "ORCHIDv2 (an identifier, not a locator)"},
	{netip.MustParsePrefix("2001:30::/28"), "drone remote ID tags (identifiers, not locators)"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("3fff::/20"), "documentation"},
	{netip.MustParsePrefix("5f00::/16"), "SRv6 segment identifiers"},
	{netip.MustParsePrefix("fc00::/7"), "private (unique local)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// The IETF protocol assignments block holds a few globally reachable
// entries inside it; those let through are listed here, the rest of the
// block is refused.
var (
	ietf6   = netip.MustParsePrefix("2001::/23")
	ietfOK6 = []netip.Prefix{
		netip.MustParsePrefix("2001:3::/32"),     // AMT
		netip.MustParsePrefix("2001:4:112::/48"), // AS112-v6
	}
	unicast6 = netip.MustParsePrefix("2000::/3")
)

// Addresses that embed an IPv4 address. A NAT64 gateway carries
// 64:ff9b::7f00:1 to 127.0.0.1, so the embedded address is judged and a
// public one is let through: NAT64 is how IPv6-only hosts reach the IPv4
// internet. 6to4 (2002:V4ADDR::/48) and Teredo (2001:0:SERVER:FLAGS:PORT:
// ~CLIENT) are deprecated tunnels that a relay would carry to the embedded
// address; nothing legitimate listens there any more, so they are refused
// whatever they embed, and the reason names the embedded address.
var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4 = netip.MustParsePrefix("2002::/16")
	teredo = netip.MustParsePrefix("2001::/32")
)

// check refuses addr unless it is public or inside allow.
func check(addr netip.Addr, allow []netip.Prefix) error {
	addr = addr.Unmap().WithZone("")
	for _, p := range allow {
		if p.Contains(addr) {
			return nil
		}
	}
	b := addr.As16()
	switch {
	case nat64.Contains(addr):
		if err := check(netip.AddrFrom4([4]byte(b[12:])), allow); err != nil {
			return fmt.Errorf("%w (via NAT64 %s)", err, addr)
		}
		return nil
	case sixTo4.Contains(addr):
		return fmt.Errorf("%w: %s is 6to4 (deprecated; embeds %s)", ErrRefused, addr, netip.AddrFrom4([4]byte(b[2:6])))
	case teredo.Contains(addr):
		client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
		return fmt.Errorf("%w: %s is Teredo (deprecated; embeds %s)", ErrRefused, addr, netip.AddrFrom4(client))
	}
	for _, p := range blocked {
		if p.prefix.Contains(addr) {
			return fmt.Errorf("%w: %s is %s", ErrRefused, addr, p.why)
		}
	}
	if addr.Is6() {
		if !unicast6.Contains(addr) {
			return fmt.Errorf("%w: %s is outside global unicast (2000::/3)", ErrRefused, addr)
		}
		if ietf6.Contains(addr) && !slices.ContainsFunc(ietfOK6, func(p netip.Prefix) bool { return p.Contains(addr) }) {
			return fmt.Errorf("%w: %s is IETF protocol assignments", ErrRefused, addr)
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
