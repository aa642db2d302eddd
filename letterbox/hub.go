package letterbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// maxHubAnswer bounds what is read of a hub's answer.
const maxHubAnswer = 1 << 20

// maxRetryAfter caps a hub's Retry-After, so a wrong header cannot park
// the outbox for a day.
const maxRetryAfter = 300 * time.Second

// call makes one request to the hub with the agent token.
func (b *Box) call(ctx context.Context, method, path string, body []byte) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, b.Config.HubURL+path, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+b.Config.AgentToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "dojo-box/"+Version)
	resp, err := b.Client.Do(req)
	if err != nil {
		return nil, nil, plainError(err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxHubAnswer))
	if err != nil {
		return nil, nil, err
	}
	return resp, answer, nil
}

// plainError drops the URL a *url.Error carries: logs then show the cause
// without repeating addresses that may hold a token (the enroll call's).
func plainError(err error) error {
	var u *url.Error
	if errors.As(err, &u) {
		return u.Err
	}
	return err
}

// retryable reports whether the hub asked to be called again later.
func retryable(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500
}

// retryAfter reads a Retry-After of seconds or an HTTP date.
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.Atoi(v); err == nil {
		d = time.Duration(n) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), maxRetryAfter)
}

// hubCode is the error.code of a hub's answer, if it has one.
func hubCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal(body, &e)
	return e.Error.Code
}

// send works the outbox strictly in order, one call at a time, until ctx
// ends. A call leaves the outbox only once the hub gave it a final
// answer, so the hub may see the head call twice (if the box dies between
// the answer and the removal) but never misses one. An answered call whose
// file cannot be removed is skipped from then on, and its removal retried.
func (b *Box) send(ctx context.Context) {
	lo := orDefault(b.RetryMin, DefaultRetryMin)
	hi := orDefault(b.RetryMax, DefaultRetryMax)
	backoff, removeWait := lo, lo
	for {
		left := b.out.retryRemovals()
		names, err := b.out.list()
		if err != nil {
			b.log().Error("outbox not readable", "err", err)
		}
		if len(names) == 0 || err != nil {
			wait := time.Duration(0)
			if err != nil || left > 0 {
				wait = hi
			}
			if !b.idle(ctx, wait) {
				return
			}
			continue
		}
		name := names[0]
		raw, err := os.ReadFile(filepath.Join(b.out.dir, name))
		var it item
		if err == nil {
			err = json.Unmarshal(raw, &it)
		}
		if err == nil && (it.Method == "" || !strings.HasPrefix(it.Path, "/")) {
			err = errors.New("no method or path")
		}
		if err != nil {
			b.log().Error("outbox item unreadable; set aside as .bad", "item", name, "err", err)
			if err := b.out.setAside(name); err != nil {
				b.log().Error("outbox item not set aside", "item", name, "err", err)
				if !sleep(ctx, hi) {
					return
				}
			}
			continue
		}
		resp, body, err := b.call(ctx, it.Method, it.Path, it.Body)
		if ctx.Err() != nil {
			return
		}
		if err != nil || retryable(resp.StatusCode) {
			wait := backoff
			if err != nil {
				b.log().Warn("hub not reached; the call stays in the outbox", "item", name, "path", it.Path, "err", err, "retry_in", wait.String())
			} else {
				if ra := retryAfter(resp.Header, b.now()); ra > 0 {
					wait = ra
				}
				b.log().Warn("hub asked to retry; the call stays in the outbox", "item", name, "path", it.Path, "status", resp.StatusCode, "code", hubCode(body), "retry_in", wait.String())
			}
			backoff = min(backoff*2, hi)
			if !sleep(ctx, wait) {
				return
			}
			continue
		}
		backoff = lo
		if resp.StatusCode >= 300 {
			b.log().Warn("hub refused a call; it is dropped from the outbox", "item", name, "path", it.Path, "status", resp.StatusCode, "code", hubCode(body))
		} else {
			b.log().Info("call delivered to the hub", "item", name, "path", it.Path, "status", resp.StatusCode)
		}
		ct := resp.Header.Get("Content-Type")
		if ct == "" {
			ct = "application/json"
		}
		if err := b.out.remove(name, answer{status: resp.StatusCode, contentType: ct, body: body}); err != nil {
			// A disk that refuses deletions must not turn into a resend loop:
			// the item is skipped from now on, and the sender slows down.
			b.log().Error("outbox item answered but not removed; it will not be sent again by this process", "item", name, "err", err, "retry_in", removeWait.String())
			if !sleep(ctx, removeWait) {
				return
			}
			removeWait = min(removeWait*2, hi)
		} else {
			removeWait = lo
		}
	}
}

// idle waits for a new outbox item (or wait, if non-zero) and reports
// false once ctx ends.
func (b *Box) idle(ctx context.Context, wait time.Duration) bool {
	var tick <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		tick = t.C
	}
	select {
	case <-b.out.wake:
		return true
	case <-tick:
		return true
	case <-ctx.Done():
		return false
	}
}

// sleep waits d and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// heartbeat tells the hub the box is alive at start and then every
// HeartbeatEvery; while it fails, the gap doubles up to HeartbeatMax so
// a hub in trouble is not hammered.
func (b *Box) heartbeat(ctx context.Context) {
	every := orDefault(b.HeartbeatEvery, DefaultHeartbeatEvery)
	most := orDefault(b.HeartbeatMax, DefaultHeartbeatMax)
	fails := 0
	for {
		wait := every
		resp, body, err := b.call(ctx, http.MethodPost, "/api/v1/heartbeat", []byte("{}"))
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			b.log().Warn("heartbeat failed", "err", err)
		case resp.StatusCode/100 != 2:
			err = errors.New(resp.Status)
			b.log().Warn("heartbeat refused", "status", resp.StatusCode, "code", hubCode(body))
		}
		if err != nil {
			fails = min(fails+1, 30)
			wait = min(every<<fails, most)
			if every<<fails <= 0 { // overflow
				wait = most
			}
		} else {
			if fails > 0 {
				b.log().Info("heartbeat accepted again")
			}
			fails = 0
		}
		if !sleep(ctx, wait) {
			return
		}
	}
}
