package relay_test

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkMemoryGetLimited is memory_get over HTTP JSON at 16 clients,
// each its own account reading its own memory, with the rate limits off
// and on (the default rules, get raised so no call waits: every call still
// pays its check in Redis). The two servers are started first and three rounds
// alternate them, so both see the same machine.
func BenchmarkMemoryGetLimited(b *testing.B) {
	type client struct{ key, code string }
	setup := func(d *dojo) []client {
		var cs []client
		for range 16 {
			key, _ := d.register(b)
			cs = append(cs, client{key, d.must(b, key, "memory_put", putArgs()).str("code")})
		}
		return cs
	}
	off := start(b, withSweep(5*time.Second))
	on := start(b, withSweep(5*time.Second), withLimits("register=1000/1h,push=1000/1h,get=100000000/1m"))
	servers := []struct {
		name    string
		d       *dojo
		clients []client
	}{{"off", off, setup(off)}, {"on", on, setup(on)}}
	for round := range 3 {
		for _, s := range servers {
			b.Run(fmt.Sprintf("limits=%s/c=16/round=%d", s.name, round+1), func(b *testing.B) {
				bodies := make([][]byte, len(s.clients))
				for i, c := range s.clients {
					bodies[i] = []byte(`{"code":"` + c.code + `"}`)
				}
				load(b, 16, func(i int) error {
					return benchCall(s.d.URL+"/api/v1/memory_get", s.clients[i%16].key, bodies[i%16])
				})
			})
		}
	}
}
