package relay

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestGuardOffLoopback: on a socket that is not loopback (a container, a
// LAN address) a DNS-rebinding page sends Origin and Host both naming the
// attacker, with Sec-Fetch-Site same-origin; the Origin check alone lets
// that through, so Host must still be this server's name for a browser.
func TestGuardOffLoopback(t *testing.T) {
	lan := &net.TCPAddr{IP: net.ParseIP("172.17.0.2"), Port: 8080}
	cases := []struct {
		name, public, host string
		header             map[string]string
		ok                 bool
	}{
		{"rebinding page", "https://dojo.example.org", "evil.example", map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"}, false},
		{"rebinding, no public URL", "", "evil.example:8080", map[string]string{"Origin": "http://evil.example:8080"}, false},
		{"browser on the public name", "https://dojo.example.org", "dojo.example.org", map[string]string{"Origin": "https://dojo.example.org", "Sec-Fetch-Site": "same-origin"}, true},
		{"agent under any name", "https://dojo.example.org", "10.1.2.3:8080", nil, true},
		{"browser on localhost", "", "localhost:8080", map[string]string{"Origin": "http://localhost:8080"}, true},
	}
	for _, c := range cases {
		r := httptest.NewRequest(http.MethodPost, "http://"+c.host+"/api/v1/account_status", nil)
		r = r.WithContext(contextWithLocal(r, lan))
		for k, v := range c.header {
			r.Header.Set(k, v)
		}
		err := newGuard(c.public).check(r)
		if (err == nil) != c.ok {
			t.Errorf("%s: refused=%v, want ok=%v (%v)", c.name, err != nil, c.ok, err)
		}
	}
}

func contextWithLocal(r *http.Request, a net.Addr) context.Context {
	return context.WithValue(r.Context(), http.LocalAddrContextKey, a)
}
