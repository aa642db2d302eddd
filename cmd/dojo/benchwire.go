package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// wireClient is the bench's HTTP client: one kept-alive
// HTTP/1.1 connection per worker and server, a request written in one
// write and its answer read with http.ReadResponse. The load runs on the
// same cores as the Dojo it measures, so its own cost is taken from Dojo's
// share; net/http's client, with two goroutines and channel handoffs per
// connection, took about a fifth of the CPU in a memory_get window. This
// is the same trade wrk makes.
type wireClient struct {
	mu    sync.Mutex
	conns map[wireKey]*wireConn
}

type wireKey struct {
	host   string
	worker int
}

type wireConn struct {
	c    net.Conn
	r    *bufio.Reader
	buf  []byte
	host string
}

func newWireClient() *wireClient { return &wireClient{conns: map[wireKey]*wireConn{}} }

// post sends one POST on worker's connection to base (an http:// URL) and
// returns the answer's body and status. A connection that fails is closed
// and the next call dials again.
func (wc *wireClient) post(ctx context.Context, worker int, base, path, key string, body []byte, mcp bool) ([]byte, int, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, 0, fmt.Errorf("want an http(s) base URL, got %q", base)
	}
	k := wireKey{u.Host, worker}
	wc.mu.Lock()
	c := wc.conns[k]
	delete(wc.conns, k)
	wc.mu.Unlock()
	reused := c != nil
	if c == nil {
		if c, err = wc.dial(ctx, u); err != nil {
			return nil, 0, err
		}
	}
	raw, status, keep, err := c.roundTrip(ctx, u.Path+path, key, body, mcp)
	if reused && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		// The server closed the idle connection (its idle timeout) before
		// this request reached it: nothing ran, so it goes again once.
		c.c.Close()
		if c, err = wc.dial(ctx, u); err != nil {
			return nil, 0, err
		}
		raw, status, keep, err = c.roundTrip(ctx, u.Path+path, key, body, mcp)
	}
	if err != nil || !keep {
		c.c.Close()
		return raw, status, err
	}
	wc.mu.Lock()
	defer wc.mu.Unlock()
	if wc.conns[k] != nil {
		c.c.Close() // a concurrent call of the same worker kept its own
	} else {
		wc.conns[k] = c
	}
	return raw, status, nil
}

func (wc *wireClient) dial(ctx context.Context, u *url.URL) (*wireConn, error) {
	nc, err := dial(ctx, u)
	if err != nil {
		return nil, err
	}
	return &wireConn{c: nc, r: bufio.NewReaderSize(nc, 16<<10), host: u.Host}, nil
}

func dial(ctx context.Context, u *url.URL) (net.Conn, error) {
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	if u.Scheme == "https" {
		d := tls.Dialer{Config: &tls.Config{ServerName: u.Hostname(), NextProtos: []string{"http/1.1"}}}
		return d.DialContext(ctx, "tcp", host)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", host)
}

// roundTrip also says whether the connection may carry another request.
func (c *wireConn) roundTrip(ctx context.Context, path, key string, body []byte, mcp bool) (raw []byte, status int, keep bool, err error) {
	deadline := time.Now().Add(30 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.c.SetDeadline(deadline); err != nil {
		return nil, 0, false, err
	}
	b := c.buf[:0]
	b = append(b, "POST "...)
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, c.host...)
	b = append(b, "\r\nContent-Type: application/json\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	if key != "" {
		b = append(b, "\r\nAuthorization: Bearer "...)
		b = append(b, key...)
	}
	if mcp {
		b = append(b, "\r\nAccept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-11-25"...)
	}
	b = append(b, "\r\n\r\n"...)
	b = append(b, body...)
	c.buf = b
	if _, err := c.c.Write(b); err != nil {
		return nil, 0, false, err
	}
	// io.EOF here, before the first byte of an answer, is a connection
	// the server had closed; ReadResponse would call it unexpected.
	if _, err := c.r.Peek(1); err != nil {
		return nil, 0, false, err
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return nil, 0, false, err
	}
	raw, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		return nil, 0, false, err
	}
	return raw, resp.StatusCode, !resp.Close, nil
}

func (wc *wireClient) close() {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	for k, c := range wc.conns {
		c.c.Close()
		delete(wc.conns, k)
	}
}
