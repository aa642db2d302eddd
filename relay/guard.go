package relay

import (
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/dojo-relay/dojo/kungfu"
)

// guard is the one Host and Origin policy of every door that acts for a
// caller (/mcp, /api/v1, the owner's key reset). A browser on another site
// can POST to Dojo without any preflight, and a DNS-rebinding page can even
// make its own origin resolve to a loopback Dojo; the MCP transport rules
// ask servers to refuse both, and the HTTP JSON twin gets the same rules so
// neither door is the weak one.
type guard struct {
	// public is the origin of DOJO_PUBLIC_URL ("" when it is loopback).
	public string
	// publicHost is its host[:port], accepted as Host on a loopback socket
	// because a reverse proxy on the same machine forwards it.
	publicHost string
	origin     *http.CrossOriginProtection
}

func newGuard(publicURL string) *guard {
	g := &guard{origin: http.NewCrossOriginProtection()}
	if u, err := url.Parse(publicURL); err == nil && u.Host != "" && !loopbackHost(u.Host) {
		g.public = u.Scheme + "://" + u.Host
		g.publicHost = strings.ToLower(u.Host)
		// The proxy may rewrite Host, so the browser's Origin (the public
		// name) would not match it: trust that one origin by name.
		_ = g.origin.AddTrustedOrigin(g.public)
	}
	return g
}

// check refuses a request whose Host or Origin says it was not meant for
// this server. Host must be this server's name (loopback, or the host of
// DOJO_PUBLIC_URL) whenever the socket is loopback or a browser sent the
// request: a rebinding page makes Origin and Host agree on the attacker's
// name, so only Host itself can tell, on any socket (a container's, a
// LAN's). Requests without Origin or Sec-Fetch-Site (agents, curl) are not
// browsers' and reach a non-loopback socket under any name.
func (g *guard) check(r *http.Request) *kungfu.Error {
	browser := r.Header.Get("Origin") != "" || r.Header.Get("Sec-Fetch-Site") != ""
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	onLoopback := local != nil && loopbackHost(local.String())
	if (onLoopback || browser) && !loopbackHost(r.Host) && strings.ToLower(r.Host) != g.publicHost {
		return kungfu.Errorf(kungfu.CodeForbiddenOrigin, "Host %q is not this server's name", r.Host)
	}
	if err := g.origin.Check(r); err != nil {
		return kungfu.Errorf(kungfu.CodeForbiddenOrigin, "cross-origin request refused: Origin %q is not this server", r.Header.Get("Origin"))
	}
	return nil
}

// jsonBody refuses a body that declares itself as anything but JSON: a
// form or text/plain body is what a cross-site page can send without a
// preflight. A missing Content-Type is left to the origin check.
func jsonBody(r *http.Request) *kungfu.Error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		return nil
	}
	return kungfu.Errorf(kungfu.CodeUnsupportedMediaType, "Content-Type %q is not JSON: send application/json", ct)
}

// loopbackHost reports whether a host[:port] names this machine's loopback.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}
