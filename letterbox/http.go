package letterbox

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Bounds of what strangers and the local agent may send.
const (
	maxLetter   = 4 << 20 // one delivered letter
	maxLoopback = 1 << 20 // one loopback call's body
	maxSkew     = 300     // seconds between the hub's timestamp and our clock
	maxPage     = 1000    // letters in one /tasks/pending answer
	defaultPage = 100
	// maxDeliveries bounds the deliveries whose bodies are read at once;
	// a hub sends a handful in parallel at most.
	maxDeliveries = 32
)

// forwardingHeaders are set by reverse proxies. A request that carries
// one came from somewhere else through a proxy on this machine, so its
// loopback address proves nothing.
var forwardingHeaders = []string{
	"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
	"X-Real-IP", "Via", "CF-Connecting-IP", "True-Client-IP",
}

// routes returns the handler of listen (deliveries and the loopback API)
// and that of deliver_listen (deliveries only).
func (b *Box) routes() (all, deliverOnly http.Handler) {
	notFound := func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "NOT_FOUND", "no such route")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /kizuna/deliver", b.deliver)
	local := http.NewServeMux()
	local.HandleFunc("GET /healthz", b.health)
	local.HandleFunc("GET /tasks/pending", b.pending)
	local.HandleFunc("GET /tasks/{id}", b.task)
	local.HandleFunc("POST /tasks/{id}/complete", b.complete)
	local.HandleFunc("POST /tasks/{id}/result", b.result)
	local.HandleFunc("POST /tasks", b.sendLetter)
	local.HandleFunc("/", notFound)
	mux.Handle("/", loopbackOnly(local))

	only := http.NewServeMux()
	only.HandleFunc("POST /kizuna/deliver", b.deliver)
	only.HandleFunc("/", notFound)
	return mux, only
}

// writeError answers in the Kizuna error envelope.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": code, "message": msg, "details": map[string]any{}}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	writeRaw(w, status, "application/json", b)
}

func writeRaw(w http.ResponseWriter, status int, contentType string, b []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// loopbackOnly admits only calls from this machine. The loopback API has
// no token, so it also turns away what a web page could send through the
// user's browser: any request with an Origin, and any Host that is not a
// loopback name (DNS rebinding). A proxy on this machine makes a stranger's
// call look local, so any forwarding header is refused too.
func loopbackOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isLoopback(r.RemoteAddr) {
			writeError(w, http.StatusForbidden, "FORBIDDEN", "the loopback API answers only calls from this machine")
			return
		}
		for _, h := range forwardingHeaders {
			if len(r.Header.Values(h)) > 0 {
				writeError(w, http.StatusForbidden, "FORBIDDEN", "the loopback API does not answer calls that came through a proxy")
				return
			}
		}
		if r.Header.Get("Origin") != "" || !loopbackHost(r.Host) {
			writeError(w, http.StatusForbidden, "FORBIDDEN", "the loopback API does not answer browser or non-loopback Host requests")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func isLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func loopbackHost(h string) bool {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// readBody reads at most max bytes of r's body and answers the error
// itself when it cannot.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "the body is larger than "+strconv.FormatInt(max, 10)+" bytes")
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, "VALIDATION_FAILED", "the body could not be read")
		return nil, false
	}
	return body, true
}

// verify checks the hub's signature: X-Kizuna-Signature is "sha256=" and
// the hex HMAC-SHA256, keyed with endpoint_secret, of the timestamp header
// as sent, ".", and the raw body; the timestamp (unix seconds) must be
// within maxSkew of now.
func verify(secret string, h http.Header, body []byte, now time.Time) bool {
	sum, ok := signed(h, now)
	if !ok {
		return false
	}
	ts := h.Get("X-Kizuna-Timestamp")
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(body)
	return hmac.Equal(sum, mac.Sum(nil))
}

// signed returns the MAC a request claims if its timestamp is fresh; it
// needs no body, so a stranger's request without one is turned away
// before its body is read.
func signed(h http.Header, now time.Time) ([]byte, bool) {
	ts := h.Get("X-Kizuna-Timestamp")
	if ts == "" || len(ts) > 18 || strings.TrimLeft(ts, "0123456789") != "" {
		return nil, false
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return nil, false
	}
	if d := now.Unix() - sec; d > maxSkew || d < -maxSkew {
		return nil, false
	}
	got, ok := strings.CutPrefix(h.Get("X-Kizuna-Signature"), "sha256=")
	if !ok || len(got) != 2*sha256.Size {
		return nil, false
	}
	sum, err := hex.DecodeString(got)
	return sum, err == nil
}

func (b *Box) deliver(w http.ResponseWriter, r *http.Request) {
	if _, ok := signed(r.Header, b.now()); !ok {
		writeError(w, http.StatusUnauthorized, "UNAUTHORIZED", "missing, stale or malformed X-Kizuna-Signature")
		return
	}
	select {
	case b.deliveries <- struct{}{}:
		defer func() { <-b.deliveries }()
	default:
		// Not an ACK: the hub tries again, and the box's memory stays bounded.
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "BOX_BUSY", "too many letters are being received; try again shortly")
		return
	}
	body, ok := readBody(w, r, maxLetter)
	if !ok {
		return
	}
	if !verify(b.Config.EndpointSecret, r.Header, body, b.now()) {
		writeError(w, http.StatusUnauthorized, "UNAUTHORIZED", "missing, stale or wrong X-Kizuna-Signature")
		return
	}
	id := r.Header.Get("X-Kizuna-Task-Id")
	var letter struct {
		TaskID *string `json:"task_id"`
	}
	trimmed := bytes.TrimSpace(body)
	switch {
	case len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &letter) != nil:
		writeError(w, http.StatusBadRequest, "VALIDATION_FAILED", "the letter must be a JSON object")
		return
	case letter.TaskID == nil || *letter.TaskID != id:
		writeError(w, http.StatusBadRequest, "VALIDATION_FAILED", "the letter's task_id must equal X-Kizuna-Task-Id")
		return
	case !validTaskID(id):
		writeError(w, http.StatusBadRequest, "VALIDATION_FAILED", "task_id must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
		return
	}
	attempt, err := strconv.Atoi(r.Header.Get("X-Kizuna-Attempt"))
	if err != nil || attempt < 0 {
		attempt = 0 // unknown: the header is informative only
	}
	at, fresh, err := b.spool.put(id, attempt, body, b.now())
	if errors.Is(err, errIDClash) {
		b.log().Error("letter not spooled: its file name is taken by another task id (a case-insensitive disk?)", "task_id", id, "err", err)
		writeError(w, http.StatusServiceUnavailable, "SPOOL_UNAVAILABLE", "the letter could not be stored; try again later")
		return
	}
	if err != nil {
		// Not an ACK: the hub tries again later, and the letter is not lost.
		b.log().Error("letter not spooled", "task_id", id, "err", err)
		writeError(w, http.StatusServiceUnavailable, "SPOOL_UNAVAILABLE", "the letter could not be stored; try again later")
		return
	}
	if fresh {
		if b.failpoint {
			os.Exit(3)
		}
		b.log().Info("letter received", "task_id", id, "attempt", attempt)
	} else {
		b.log().Info("letter received again", "task_id", id, "attempt", attempt)
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "received", "task_id": id, "received_at": at})
}

func (b *Box) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"ok":       true,
		"agent_id": b.Config.AgentID,
		"spool":    count(b.spool.dir),
		"uptime_s": int64(b.now().Sub(b.started).Seconds()),
	})
}

// taskID reads and checks the {id} of a loopback route.
func taskID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if !validTaskID(id) {
		writeError(w, http.StatusBadRequest, "VALIDATION_FAILED", "not a valid task id")
		return "", false
	}
	return id, true
}

func (b *Box) pending(w http.ResponseWriter, r *http.Request) {
	limit, offset := defaultPage, 0
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPage {
			writeError(w, http.StatusBadRequest, "VALIDATION_FAILED", "limit must be 1 to "+strconv.Itoa(maxPage))
			return
		}
		limit = n
	}
	if v := r.URL.Query().Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "VALIDATION_FAILED", "offset must be 0 or more")
			return
		}
		offset = n
	}
	ids, err := b.spool.pending()
	if err != nil {
		b.log().Error("spool not readable", "err", err)
		writeError(w, http.StatusServiceUnavailable, "SPOOL_UNAVAILABLE", "the spool could not be read")
		return
	}
	total := len(ids)
	ids = ids[min(offset, total):min(offset+limit, total)]
	var out bytes.Buffer
	out.WriteString(`{"items":[`)
	n := 0
	for _, id := range ids {
		rec, err := b.spool.get(id)
		if err != nil || rec == nil {
			continue // completed meanwhile, or damaged (logged by task)
		}
		if n > 0 {
			out.WriteByte(',')
		}
		out.Write(rec)
		n++
	}
	out.WriteString(`],"total":` + strconv.Itoa(total) + `,"limit":` + strconv.Itoa(limit) + `,"offset":` + strconv.Itoa(offset) + `}`)
	writeRaw(w, http.StatusOK, "application/json", out.Bytes())
}

func (b *Box) task(w http.ResponseWriter, r *http.Request) {
	id, ok := taskID(w, r)
	if !ok {
		return
	}
	rec, err := b.spool.get(id)
	switch {
	case err != nil:
		b.log().Error("spool file not readable", "task_id", id, "err", err)
		writeError(w, http.StatusServiceUnavailable, "SPOOL_UNAVAILABLE", "the letter could not be read")
	case rec == nil:
		writeError(w, http.StatusNotFound, "TASK_NOT_FOUND", "no letter "+id)
	default:
		writeRaw(w, http.StatusOK, "application/json", rec)
	}
}

func (b *Box) complete(w http.ResponseWriter, r *http.Request) {
	id, ok := taskID(w, r)
	if !ok {
		return
	}
	found, err := b.spool.complete(id)
	switch {
	case err != nil:
		b.log().Error("letter not moved to done", "task_id", id, "err", err)
		writeError(w, http.StatusServiceUnavailable, "SPOOL_UNAVAILABLE", "the letter could not be moved")
	case !found:
		writeError(w, http.StatusNotFound, "TASK_NOT_FOUND", "no letter "+id)
	default:
		writeJSON(w, http.StatusOK, map[string]string{"task_id": id, "state": stateDone})
	}
}

func (b *Box) result(w http.ResponseWriter, r *http.Request) {
	id, ok := taskID(w, r)
	if !ok {
		return
	}
	b.forward(w, r, "/api/v1/tasks/"+id+"/result")
}

func (b *Box) sendLetter(w http.ResponseWriter, r *http.Request) {
	b.forward(w, r, "/api/v1/tasks")
}

// forward queues the call for the hub and waits a little for the answer.
// The hub checks the content; the box only makes sure it is one JSON
// object that fits.
func (b *Box) forward(w http.ResponseWriter, r *http.Request, path string) {
	body, ok := readBody(w, r, maxLoopback)
	if !ok {
		return
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(trimmed) {
		writeError(w, http.StatusBadRequest, "VALIDATION_FAILED", "the body must be a JSON object")
		return
	}
	id, ch, err := b.out.add(http.MethodPost, path, trimmed, b.now())
	if errors.Is(err, errOutboxFull) {
		w.Header().Set("Retry-After", "60")
		writeError(w, http.StatusServiceUnavailable, "OUTBOX_FULL", "too many calls are waiting for the hub; try again later")
		return
	}
	if err != nil {
		b.log().Error("call not queued", "path", path, "err", err)
		writeError(w, http.StatusServiceUnavailable, "OUTBOX_UNAVAILABLE", "the call could not be stored; try again later")
		return
	}
	t := time.NewTimer(orDefault(b.ForwardWait, DefaultForwardWait))
	defer t.Stop()
	select {
	case a := <-ch:
		writeRaw(w, a.status, a.contentType, a.body)
		return
	case <-t.C:
	case <-r.Context().Done():
	case <-b.stop:
	}
	b.out.forget(id)
	writeJSON(w, http.StatusAccepted, map[string]string{"status": "queued", "outbox_id": id})
}
