package letterbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxOutbox bounds the calls waiting for the hub, so a hub that is gone
// for good cannot fill the disk through a chatty agent.
const MaxOutbox = 10000

var errOutboxFull = errors.New("the outbox is full")

// outbox holds calls for the hub, one file each, named by a 20-digit
// sequence so that name order is arrival order.
type outbox struct {
	dir string
	// removeFile is os.Remove; tests make it fail.
	removeFile func(string) error

	mu      sync.Mutex
	next    uint64
	n       int
	waiters map[string]chan answer
	wake    chan struct{}
	// answered holds items the hub answered whose file could not be
	// removed: list skips them, so they are never sent again while the
	// process lives, and retryRemovals keeps trying to delete them.
	answered map[string]bool
}

// item is an outbox file.
type item struct {
	Method   string          `json:"method"`
	Path     string          `json:"path"`
	QueuedAt string          `json:"queued_at"`
	Body     json.RawMessage `json:"body"`
}

// answer is the hub's final answer to an item.
type answer struct {
	status      int
	contentType string
	body        []byte
}

func newOutbox(home string) (*outbox, error) {
	o := &outbox{dir: filepath.Join(home, "outbox"), removeFile: os.Remove,
		waiters: map[string]chan answer{}, wake: make(chan struct{}, 1), answered: map[string]bool{}}
	if err := os.MkdirAll(o.dir, 0o700); err != nil {
		return nil, fmt.Errorf("letterbox: outbox: %w", err)
	}
	removeTemps(o.dir)
	names, err := o.list()
	if err != nil {
		return nil, fmt.Errorf("letterbox: outbox: %w", err)
	}
	o.n = len(names)
	if len(names) > 0 {
		last, _ := strconv.ParseUint(strings.TrimSuffix(names[len(names)-1], ".json"), 10, 64)
		o.next = last
	}
	return o, nil
}

// list returns the waiting items' file names in order.
func (o *outbox) list() ([]string, error) {
	entries, err := os.ReadDir(o.dir) // sorted by name
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var names []string
	for _, e := range entries {
		if isItemName(e.Name()) && e.Type().IsRegular() && !o.answered[e.Name()] {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

func isItemName(name string) bool {
	seq, ok := strings.CutSuffix(name, ".json")
	if !ok || len(seq) != 20 {
		return false
	}
	_, err := strconv.ParseUint(seq, 10, 64)
	return err == nil
}

// add makes a call durable and returns its id and a channel that gets the
// hub's final answer if it comes while someone still waits for it.
func (o *outbox) add(method, path string, body []byte, now time.Time) (string, chan answer, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n >= MaxOutbox {
		return "", nil, errOutboxFull
	}
	o.next++
	id := fmt.Sprintf("%020d", o.next)
	head, _ := json.Marshal(item{Method: method, Path: path, QueuedAt: now.UTC().Format(time.RFC3339)})
	// The body is spliced in as sent: re-encoding would reformat it.
	head = head[:len(head)-len(`,"body":null}`)]
	rec := append(append(append(head, `,"body":`...), body...), '}')
	ch := make(chan answer, 1)
	// The waiter is there before the file can be seen, so the sender
	// cannot answer into the void.
	o.waiters[id] = ch
	if err := writeAtomic(o.dir, id+".json", rec); err != nil {
		delete(o.waiters, id)
		return "", nil, err
	}
	o.n++
	select {
	case o.wake <- struct{}{}:
	default:
	}
	return id, ch, nil
}

// forget drops the waiter of id: nobody listens any more.
func (o *outbox) forget(id string) {
	o.mu.Lock()
	delete(o.waiters, id)
	o.mu.Unlock()
}

// remove deletes a finished item and hands its answer to a waiter. When
// the file stays, the item is remembered as answered all the same: the
// hub must not see it again because a disk refused a deletion.
func (o *outbox) remove(name string, a answer) error {
	err := o.removeFile(filepath.Join(o.dir, name))
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	if err == nil {
		err = syncDir(o.dir)
	}
	id := strings.TrimSuffix(name, ".json")
	o.mu.Lock()
	if err != nil {
		o.answered[name] = true
	}
	o.n--
	ch := o.waiters[id]
	delete(o.waiters, id)
	o.mu.Unlock()
	if ch != nil {
		ch <- a
	}
	return err
}

// retryRemovals tries again to delete the answered items' files and
// reports how many are still there.
func (o *outbox) retryRemovals() int {
	o.mu.Lock()
	names := make([]string, 0, len(o.answered))
	for name := range o.answered {
		names = append(names, name)
	}
	o.mu.Unlock()
	if len(names) == 0 {
		return 0
	}
	var gone []string
	for _, name := range names {
		err := o.removeFile(filepath.Join(o.dir, name))
		if err == nil || errors.Is(err, os.ErrNotExist) {
			gone = append(gone, name)
		}
	}
	if len(gone) > 0 && syncDir(o.dir) != nil {
		gone = nil // not durable yet: a crash could bring them back
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, name := range gone {
		delete(o.answered, name)
	}
	return len(o.answered)
}

// setAside renames an unreadable item so it stops blocking the ones
// behind it, and keeps it for a human to look at.
func (o *outbox) setAside(name string) error {
	err := os.Rename(filepath.Join(o.dir, name), filepath.Join(o.dir, name+".bad"))
	o.mu.Lock()
	o.n--
	delete(o.waiters, strings.TrimSuffix(name, ".json"))
	o.mu.Unlock()
	return err
}

func (o *outbox) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}
