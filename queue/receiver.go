package queue

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/dojo-relay/dojo/kungfu/task"
	"github.com/dojo-relay/dojo/signing"
)

// maxReceiverBody is how much of a receiver's answer is read; 4 000 bytes
// of it are kept.
const maxReceiverBody = 65535

// Receivers POSTs task submissions to publishers' receivers. It is the
// task.Receiver; the domain decides what the outcome means.
type Receivers struct {
	Client *http.Client
	Keys   *signing.ServerKey
	// Timeout bounds one whole request (default RequestTimeout, 10 s).
	Timeout time.Duration
}

// Deliver makes one POST. Whether the request reached the wire decides
// between "nothing was sent" (unreachable) and "sent, no answer"
// (uncertain), so it is latched from httptrace.WroteHeaders.
func (r *Receivers) Deliver(ctx context.Context, d task.Delivery) task.Outcome {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = RequestTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }})
	id := strconv.FormatInt(d.SubmissionID, 10)
	header := http.Header{"Idempotency-Key": {id}, "Kungfu-Task": {d.TaskCode}}
	start := time.Now()
	req, err := NewSignedPost(ctx, r.Keys, d.URL, "sub_"+id, d.Body, header)
	if err != nil {
		return task.Outcome{Err: err, Latency: time.Since(start)}
	}
	resp, err := r.Client.Do(req)
	if err != nil {
		return task.Outcome{Err: err, Sent: wrote.Load(), Latency: time.Since(start)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxReceiverBody))
	out := task.Outcome{Status: resp.StatusCode, Body: body, Sent: true, Latency: time.Since(start)}
	if err != nil && len(body) == 0 {
		out.Err = err
	}
	return out
}
