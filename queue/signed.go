package queue

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/dojo-relay/dojo/signing"
)

// NewSignedPost builds one outbound delivery POST, the same way for every
// kind (notify pushes, receiver deliveries, letters): a JSON body with an
// explicit Content-Length, the caller's own headers (compatible signatures,
// Idempotency-Key, …), then the Standard Webhooks headers for webhookID,
// so no caller header can replace Content-Type or the webhook-* set. The
// webhook timestamp is the wall clock of this try, not an injected clock:
// receivers judge freshness against their own clocks, and a retry late on
// a ladder must still look fresh. webhookID should be the same on every
// try of one message, so receivers can dedupe. keys nil sends no webhook
// headers. Send the request with the guarded client from NewOutbound.
func NewSignedPost(ctx context.Context, keys *signing.ServerKey, url, webhookID string, body []byte, header http.Header) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("outbound request: %w", err)
	}
	req.ContentLength = int64(len(body))
	for k, v := range header {
		req.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), v...)
	}
	req.Header.Set("Content-Type", "application/json")
	if keys != nil {
		for k, v := range keys.WebhookHeaders(webhookID, time.Now(), body) {
			req.Header[k] = v
		}
	}
	return req, nil
}
