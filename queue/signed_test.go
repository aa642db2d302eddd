package queue_test

import (
	"context"
	"crypto/ed25519"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/dojo-relay/dojo/queue"
	"github.com/dojo-relay/dojo/signing"
)

type seen struct {
	header        http.Header
	body          []byte
	contentLength int64
	chunked       bool
}

// capture is a real loopback HTTP server that records one request.
func capture(t *testing.T) (*httptest.Server, <-chan seen) {
	t.Helper()
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Header.Clone(), body, r.ContentLength, len(r.TransferEncoding) > 0}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

func send(t *testing.T, req *http.Request, got <-chan seen) seen {
	t.Helper()
	allow, _ := queue.ParseAllow("127.0.0.1")
	resp, err := queue.NewOutbound(allow, nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d", resp.StatusCode)
	}
	select {
	case s := <-got:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("the request did not arrive")
		return seen{}
	}
}

func TestNewSignedPost(t *testing.T) {
	t.Parallel()
	text, _ := signing.GenerateServerKey()
	keys, err := signing.ParseServerKey(text)
	if err != nil {
		t.Fatal(err)
	}
	srv, got := capture(t)
	body := []byte(`{"submission_id":"9","task_code":"t_x","agent_ref":"00112233aabbccdd","payload":{}}`)
	req, err := queue.NewSignedPost(context.Background(), keys, srv.URL+"/receive", "submission_9", body, http.Header{
		"Idempotency-Key": {"9"},
		"kungfu-task":     {"t_x"},
		// Callers cannot replace what NewSignedPost owns.
		"Content-Type": {"text/plain"},
		"webhook-id":   {"forged"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if req.Method != http.MethodPost || req.ContentLength != int64(len(body)) || req.GetBody == nil {
		t.Fatalf("request %s, length %d, replayable %v", req.Method, req.ContentLength, req.GetBody != nil)
	}
	s := send(t, req, got)
	if string(s.body) != string(body) || s.contentLength != int64(len(body)) || s.chunked {
		t.Fatalf("received %q, Content-Length %d, chunked %v", s.body, s.contentLength, s.chunked)
	}
	for k, want := range map[string]string{"Idempotency-Key": "9", "Kungfu-Task": "t_x",
		"Content-Type": "application/json", "Webhook-Id": "submission_9"} {
		if v := s.header.Values(k); len(v) != 1 || v[0] != want {
			t.Errorf("%s: %q, want %q", k, v, want)
		}
	}
	pub := keys.Ed25519().Public().(ed25519.PublicKey)
	if err := signing.VerifyWebhook(pub, s.header, s.body, 5*time.Minute, time.Now()); err != nil {
		t.Fatalf("webhook headers: %v", err)
	}
}

func TestNewSignedPostWithoutKeys(t *testing.T) {
	t.Parallel()
	srv, got := capture(t)
	req, err := queue.NewSignedPost(context.Background(), nil, srv.URL, "notify_1", []byte(`{}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := send(t, req, got)
	for _, k := range []string{"webhook-id", "webhook-timestamp", "webhook-signature"} {
		if v := s.header.Get(k); v != "" {
			t.Errorf("%s = %q without keys", k, v)
		}
	}
	if string(s.body) != `{}` || s.header.Get("Content-Type") != "application/json" {
		t.Fatalf("received %q %v", s.body, s.header)
	}
	if _, err := queue.NewSignedPost(context.Background(), nil, "http://bad host/", "x", nil, nil); err == nil {
		t.Fatal("a malformed URL was accepted")
	}
}
