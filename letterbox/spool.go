package letterbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// taskIDPattern is what a task id must look like to become a file name:
// no separators, no leading dot, no "..".
var taskIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// validTaskID reports whether id is safe as spool/<id>.json.
func validTaskID(id string) bool { return taskIDPattern.MatchString(id) }

// spool holds letters: spool/<id>.json while pending, spool/done/<id>.json
// once the agent has handled them. A letter is written once and only ever
// moved, so its file is the proof behind the ACK the hub got.
type spool struct {
	dir, done string
	// locks serialise work on one id (two deliveries of one letter, or a
	// delivery racing its completion) without a map that grows per id.
	locks [64]sync.Mutex
}

func newSpool(home string) (*spool, error) {
	s := &spool{dir: filepath.Join(home, "spool")}
	s.done = filepath.Join(s.dir, "done")
	if err := os.MkdirAll(s.done, 0o700); err != nil {
		return nil, fmt.Errorf("letterbox: spool: %w", err)
	}
	removeTemps(s.dir)
	return s, nil
}

func (s *spool) lock(id string) *sync.Mutex {
	h := fnv.New32a()
	h.Write([]byte(id))
	return &s.locks[h.Sum32()%uint32(len(s.locks))]
}

// record is a spool file without its letter.
type record struct {
	TaskID     string `json:"task_id"`
	ReceivedAt string `json:"received_at"`
	Attempt    int    `json:"attempt"`
}

// encode writes the record with letter spliced in byte for byte: json
// would re-encode a RawMessage, and the agent must see what the hub signed.
func (r record) encode(letter []byte) []byte {
	head, _ := json.Marshal(r)
	out := make([]byte, 0, len(head)+len(letter)+16)
	out = append(out, head[:len(head)-1]...)
	out = append(out, `,"letter":`...)
	out = append(out, letter...)
	return append(out, '}')
}

// errIDClash is put's answer when the file of an id holds another task id:
// on a case-insensitive disk T-a and T-A share one file, and an ACK for
// the second would claim a letter that was never stored.
var errIDClash = errors.New("the spool file holds another task id")

// put stores a letter unless its id is already spooled or done, and
// returns the received_at of the copy on disk and whether this call wrote
// it. The hub delivers at least once, so repeats must answer the same ACK.
func (s *spool) put(id string, attempt int, letter []byte, now time.Time) (string, bool, error) {
	mu := s.lock(id)
	mu.Lock()
	defer mu.Unlock()
	for _, dir := range []string{s.dir, s.done} {
		b, err := os.ReadFile(filepath.Join(dir, id+".json"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", false, err
		}
		var r record
		if err := json.Unmarshal(b, &r); err != nil {
			return "", false, fmt.Errorf("spool file of %s is damaged: %w", id, err)
		}
		if r.TaskID != id {
			return "", false, fmt.Errorf("%w: %s.json holds %q", errIDClash, id, r.TaskID)
		}
		return r.ReceivedAt, false, nil
	}
	at := now.UTC().Format(time.RFC3339)
	rec := record{TaskID: id, ReceivedAt: at, Attempt: attempt}
	if err := writeAtomic(s.dir, id+".json", rec.encode(letter)); err != nil {
		return "", false, err
	}
	return at, true, nil
}

// State names in the loopback API.
const (
	statePending = "pending"
	stateDone    = "done"
)

// get returns the record of id with its state, or nil if there is none.
func (s *spool) get(id string) ([]byte, error) {
	for _, c := range []struct{ dir, state string }{{s.dir, statePending}, {s.done, stateDone}} {
		b, err := os.ReadFile(filepath.Join(c.dir, id+".json"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return withState(b, c.state)
	}
	return nil, nil
}

// withState adds "state" to a spool record without re-encoding its letter.
func withState(b []byte, state string) ([]byte, error) {
	b = bytes.TrimSpace(b)
	if len(b) < 2 || b[0] != '{' || !json.Valid(b) {
		return nil, errors.New("spool file is damaged")
	}
	out := append([]byte(`{"state":"`+state+`",`), b[1:]...)
	if !json.Valid(out) { // an empty object
		return nil, errors.New("spool file is damaged")
	}
	return out, nil
}

// pending lists the pending letters' ids oldest first. A file's time is
// when it was written, which the rename keeps.
func (s *spool) pending() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	type item struct {
		id string
		at time.Time
	}
	var items []item
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || strings.HasPrefix(name, tempPrefix) || !strings.HasSuffix(name, ".json") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // completed meanwhile
		}
		items = append(items, item{strings.TrimSuffix(name, ".json"), info.ModTime()})
	}
	sort.Slice(items, func(i, j int) bool {
		if !items[i].at.Equal(items[j].at) {
			return items[i].at.Before(items[j].at)
		}
		return items[i].id < items[j].id
	})
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.id
	}
	return ids, nil
}

// count is how many .json files dir holds.
func count(dir string) int {
	entries, _ := os.ReadDir(dir)
	n := 0
	for _, e := range entries {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), tempPrefix) && strings.HasSuffix(e.Name(), ".json") {
			n++
		}
	}
	return n
}

// complete moves id to done. It reports false if id is neither pending
// nor done; completing a done letter again is fine.
func (s *spool) complete(id string) (bool, error) {
	mu := s.lock(id)
	mu.Lock()
	defer mu.Unlock()
	err := os.Rename(filepath.Join(s.dir, id+".json"), filepath.Join(s.done, id+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(s.done, id+".json")); err == nil {
			return true, nil
		}
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := syncDir(s.done); err != nil {
		return true, err
	}
	return true, syncDir(s.dir)
}
