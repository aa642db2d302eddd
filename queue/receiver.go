package queue

import (
	"context"
	"fmt"
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
	// Hosts paces deliveries per receiver host; nil sends without turns.
	Hosts *Hosts
	// Wait is how long a submission's first POST waits for a host that
	// is being probed after timeouts (default DefaultFirstWait).
	Wait time.Duration
}

// DefaultFirstWait is how long a first POST waits for a probed host.
const DefaultFirstWait = 5 * time.Second

func (r *Receivers) timeout() time.Duration { return orDefault(r.Timeout, RequestTimeout) }

// Paced wraps the domain's redelivery handler so that an attempt waits for
// a turn at its receiver's host before the domain counts it: target names
// the receiver URL of submission id if an attempt is due ("" if not), and
// redeliver makes the attempt. Without a turn the task is deferred, not
// attempted, so the ladder's attempts are all real POSTs.
func (r *Receivers) Paced(target func(ctx context.Context, id int64) (string, error), redeliver func(ctx context.Context, id int64) error) func(ctx context.Context, id int64) error {
	return func(ctx context.Context, id int64) error {
		if r.Hosts == nil {
			return redeliver(ctx, id)
		}
		url, err := target(ctx, id)
		if err != nil {
			return fmt.Errorf("redeliver %d: %w", id, err)
		}
		if url == "" {
			return nil // not due, or resolved meanwhile
		}
		turn, err := r.Hosts.Take(ctx, url, r.timeout()+holdMargin)
		if _, later := deferred(err); later {
			return fmt.Errorf("redeliver %d: %w", id, err)
		}
		// Redis could not be asked (turn nil): deliver without a turn
		// rather than not at all. Deliver gives the turn back; this only
		// frees one the domain did not use.
		defer turn.Done(ctx, Unsent)
		return redeliver(withTurn(ctx, turn), id)
	}
}

// Deliver makes one POST. Whether the request reached the wire decides
// between "nothing was sent" (unreachable) and "sent, no answer"
// (uncertain), so it is latched from httptrace.WroteHeaders.
//
// A redelivery arrives holding its turn (Paced). A first POST joins the
// host here (Hosts.Join): the agent is waiting for it and it holds no
// worker, so a full host lets it in, but a host closed after timeouts
// does not. Then nothing is sent and the outcome is reported as sent
// without an answer: the submission becomes uncertain and the ladder
// redelivers it with the same Idempotency-Key. RECEIVER_UNREACHABLE would
// instead end the submission and count toward the task's pause for a
// receiver that was never tried.
func (r *Receivers) Deliver(ctx context.Context, d task.Delivery) task.Outcome {
	start := time.Now()
	turn, held := heldTurn(ctx)
	if !held {
		var err error
		turn, err = r.Hosts.Join(ctx, d.URL, r.timeout()+holdMargin, orDefault(r.Wait, DefaultFirstWait))
		if _, later := deferred(err); later {
			return task.Outcome{Sent: true, Err: fmt.Errorf("not sent: %w", err), Latency: time.Since(start)}
		}
		start = time.Now() // the attempt's latency is the receiver's, not the wait's
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout())
	defer cancel()
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }})
	id := strconv.FormatInt(d.SubmissionID, 10)
	header := http.Header{"Idempotency-Key": {id}, "Kungfu-Task": {d.TaskCode}}
	req, err := NewSignedPost(ctx, r.Keys, d.URL, "sub_"+id, d.Body, header)
	if err != nil {
		turn.Done(ctx, Unsent)
		return task.Outcome{Err: err, Latency: time.Since(start)}
	}
	resp, err := r.Client.Do(req)
	if err != nil {
		turn.Done(ctx, endingOf(nil, err))
		return task.Outcome{Err: err, Sent: wrote.Load(), Latency: time.Since(start)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxReceiverBody))
	turn.Done(ctx, Answered)
	out := task.Outcome{Status: resp.StatusCode, Body: body, Sent: true, Latency: time.Since(start)}
	if err != nil && len(body) == 0 {
		out.Err = err
	}
	return out
}
