package relay_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// ackWatch tells a sender when the letterbox has ACKed its letter. The ACK
// can beat the sender's wait (the 202 and the delivery race), so ACKs are
// remembered until claimed.
type ackWatch struct {
	mu      sync.Mutex
	acked   map[string]bool
	waiting map[string]chan struct{}
}

func (w *ackWatch) ack(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c, ok := w.waiting[id]; ok {
		delete(w.waiting, id)
		close(c)
		return
	}
	w.acked[id] = true
}

func (w *ackWatch) wait(id string, within time.Duration) error {
	w.mu.Lock()
	if w.acked[id] {
		delete(w.acked, id)
		w.mu.Unlock()
		return nil
	}
	c := make(chan struct{})
	w.waiting[id] = c
	w.mu.Unlock()
	select {
	case <-c:
		return nil
	case <-time.After(within):
		return fmt.Errorf("letter %s not ACKed within %v", id, within)
	}
}

// BenchmarkKizunaLetter is a letter from POST /api/v1/tasks to the
// recipient box's ACK, end to end over loopback: intake transaction, the
// engine's wake-up, the signed POST to a seed-only letterbox, and the ACK
// transaction with its audit row. 16 agents each write to the next one.
// ops/s is letters accepted→ACKed per second; the latencies are send→ACK.
func BenchmarkKizunaLetter(b *testing.B) {
	d := start(b, withAdmin, withLadder(0.001))
	watch := &ackWatch{acked: map[string]bool{}, waiting: map[string]chan struct{}{}}
	var agents []kzAgent
	for i := range 16 {
		ag := enroll(b, d, fmt.Sprintf("Bench%d", i))
		// Front the box so its ACKs reach the watch; the box itself is unchanged.
		box := ag.Box
		front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id := r.Header.Get("X-Kizuna-Task-Id")
			box.deliver(w, r)
			box.mu.Lock()
			_, ok := box.spool[id]
			box.mu.Unlock()
			if ok {
				watch.ack(id)
			}
		}))
		b.Cleanup(front.Close)
		if r := hub(b, http.MethodPatch, d.URL+"/api/v1/agents/"+ag.ID, kzAdmin, map[string]any{"webhook_url": front.URL}); r.Status != http.StatusOK {
			b.Fatalf("patch webhook: %d %s", r.Status, r.Raw)
		}
		agents = append(agents, ag)
	}
	b.Run("c=16", func(b *testing.B) {
		load(b, 16, func(i int) error {
			from, to := agents[i%16], agents[(i+1)%16]
			body := []byte(`{"to":"` + to.ID + `","content":{"title":"bench","body":"letter number ` + fmt.Sprint(i) + `"}}`)
			req, err := http.NewRequest(http.MethodPost, d.URL+"/api/v1/tasks", bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+from.Token)
			resp, err := benchClient.Do(req)
			if err != nil {
				return err
			}
			var out struct {
				TaskID string `json:"task_id"`
			}
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusAccepted || out.TaskID == "" {
				return fmt.Errorf("send: %d %v", resp.StatusCode, err)
			}
			return watch.wait(out.TaskID, 30*time.Second)
		})
	})
}
