package queue

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/dojo-relay/dojo/kungfu/notify"
	"github.com/dojo-relay/dojo/signing"
)

// TaskNotify is the task type of notify pushes; its id is the outbox row.
const TaskNotify = "notify"

// maxReply is how much of a receiver's reply is read.
const maxReply = 64 << 10

// Notifier sends notify pushes and verification probes through the guarded
// outbound client. It is the notify.Verifier for notify.Service.
type Notifier struct {
	Service *notify.Service
	Client  *http.Client
	Engine  *Engine
	// Keys signs every POST with Standard Webhooks headers as well, so an
	// endpoint can verify Dojo from its JWKS; nil sends no webhook headers.
	Keys *signing.ServerKey
	Log  *slog.Logger
	// Sweep is how often due rows are re-enqueued; zero means 5 s.
	Sweep time.Duration
	// Timeout bounds one push (default RequestTimeout, 10 s).
	Timeout time.Duration
	// Hosts paces pushes per endpoint host; Register sets the engine's.
	// Nil pushes without turns.
	Hosts *Hosts
}

// holdMargin is how much longer a turn's lease lasts than the request it
// covers, so it never expires while the request still runs.
const holdMargin = 5 * time.Second

func (n *Notifier) timeout() time.Duration { return orDefault(n.Timeout, RequestTimeout) }

// Verify POSTs a verification probe and returns the reply (at most 64 KB).
// The probe is signed like a push, so an endpoint that insists on a valid
// webhook signature can still be registered; it has no outbox row, so its
// webhook-id is random.
func (n *Notifier) Verify(ctx context.Context, url string, body []byte) (int, []byte, error) {
	resp, err := n.post(ctx, url, "notify_verify_"+rand.Text(), body, nil)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(io.LimitReader(resp.Body, maxReply))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("notify verify: read reply: %w", err)
	}
	return resp.StatusCode, reply, nil
}

func (n *Notifier) post(ctx context.Context, url, webhookID string, body []byte, header http.Header) (*http.Response, error) {
	req, err := NewSignedPost(ctx, n.Keys, url, webhookID, body, header)
	if err != nil {
		return nil, err
	}
	return n.Client.Do(req)
}

// Push is the handler of TaskNotify: one try of outbox row id. PostgreSQL
// counts the tries, so a push is tried at most notify.MaxAttempts times
// however often its task runs; a push deferred for want of a turn at its
// host is not a try.
func (n *Notifier) Push(ctx context.Context, id int64) error {
	p, ok, err := n.Service.Load(ctx, id)
	if err != nil {
		return err
	}
	if !ok {
		return nil
	}
	// A full or closed host defers the task before anything is counted:
	// the try is made later, and a slow host holds at most its turns.
	turn, err := n.Hosts.Take(ctx, p.URL, n.timeout()+holdMargin)
	if _, later := deferred(err); later {
		return fmt.Errorf("notify %d: %w", id, err)
	}
	if err != nil {
		n.log().Warn("notify push without a host turn", "id", id, "err", err)
	}
	// The try's own deadline: Record below must still run after it.
	pctx, cancel := context.WithTimeout(ctx, n.timeout())
	defer cancel()
	// One webhook-id per outbox row: every try of a push carries the same.
	resp, err := n.post(pctx, p.URL, "notify_"+strconv.FormatInt(id, 10), p.Body, http.Header{
		"X-Kungfu-Signature": {signing.KungfuSignature(p.Secret, p.Body)},
	})
	end := endingOf(resp, err)
	status := 0
	if err == nil {
		status = resp.StatusCode
		// Drain a little so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxReply))
		resp.Body.Close()
		if status < 200 || status > 299 {
			err = fmt.Errorf("HTTP %d", status)
		}
	}
	turn.Done(ctx, end)
	giveUp, rerr := n.Service.Record(ctx, id, status, err == nil)
	if rerr != nil {
		// The try is not counted; the retry (or the sweep) will tell.
		return errors.Join(rerr, err)
	}
	if err == nil {
		return nil
	}
	if giveUp {
		return fmt.Errorf("notify %d: try %d of %d failed, giving up: %w (%w)", id, p.Attempts+1, notify.MaxAttempts, err, ErrGiveUp)
	}
	return fmt.Errorf("notify %d: try %d of %d failed: %w", id, p.Attempts+1, notify.MaxAttempts, err)
}

// Register wires notify pushes into e: the handler, a retry ladder
// matching the one recorded in PostgreSQL, and the sweep that re-enqueues
// due rows whose wake-up was lost. It also makes e the engine Enqueue uses
// when Engine is unset, and e's host turns the ones Push takes when Hosts
// is unset.
func (n *Notifier) Register(e *Engine) {
	if n.Engine == nil {
		n.Engine = e
	}
	if n.Hosts == nil {
		n.Hosts = e.Hosts()
	}
	e.Handle(TaskNotify, n.Push)
	// asynq counts retries from 0; after retry n, n+1 tries have failed.
	e.Retry(TaskNotify, notify.MaxAttempts-1, func(k int) time.Duration { return n.Service.RetryDelay(k + 1) })
	every := n.Sweep
	if every <= 0 {
		every = 5 * time.Second
	}
	e.Every("notify-sweep", every, func(ctx context.Context) error {
		ids, err := n.Service.Due(ctx, 50)
		if err != nil {
			return err
		}
		var errs []error
		for _, id := range ids {
			// A row whose enqueue fails here is due again after notify.Lease.
			errs = append(errs, e.Enqueue(ctx, TaskNotify, id, time.Time{}))
		}
		return errors.Join(errs...)
	})
}

// Enqueue wakes the push worker for rows committed by notify.Service.Emit.
// Call it after commit. Errors are only logged: the sweep finds any row
// whose wake-up was lost.
func (n *Notifier) Enqueue(ctx context.Context, ids ...int64) {
	for _, id := range ids {
		if err := n.Engine.Enqueue(ctx, TaskNotify, id, time.Time{}); err != nil {
			n.log().Warn("notify enqueue failed; the sweep will retry", "id", id, "err", err)
		}
	}
}

func (n *Notifier) log() *slog.Logger {
	if n.Log != nil {
		return n.Log
	}
	return slog.Default()
}
