package thread

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/credential"
	"github.com/dojo-relay/dojo/kungfu/memory"
	"github.com/dojo-relay/dojo/kungfu/schema"
	"github.com/dojo-relay/dojo/kungfu/userjson"
)

type assignSpec struct {
	to                   string
	requirements         string
	schema               []byte
	deliverDue, judgeDue int
}

func checkAssign(in AssignInput) (*assignSpec, error) {
	spec := &assignSpec{to: in.To, requirements: strings.TrimSpace(in.Requirements)}
	switch {
	case strings.TrimSpace(in.To) == "":
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "assign.to", Message: "name the member who does the work"})
	case spec.requirements == "":
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "assign.requirements", Message: "must not be empty"})
	case len(spec.requirements) > MaxRequirement:
		return nil, kungfu.Errorf(kungfu.CodeContentTooLarge, "requirements are larger than %d bytes", MaxRequirement)
	case credential.Find(spec.requirements) != "":
		return nil, kungfu.Errorf(kungfu.CodeSensitiveContent, "the requirements contain a credential-shaped string")
	}
	var err error
	if spec.deliverDue, err = due("assign.deliver_due", in.DeliverDue); err != nil {
		return nil, err
	}
	if spec.judgeDue, err = due("assign.judge_due", in.JudgeDue); err != nil {
		return nil, err
	}
	if s := bytes.TrimSpace(in.OutputSchema); len(s) > 0 && string(s) != "null" {
		if _, err := schema.Compile(s); err != nil {
			return nil, kungfu.Invalid(kungfu.FieldError{Field: "assign.output_schema", Message: err.Error()})
		}
		spec.schema = s
	}
	return spec, nil
}

func due(field string, s int) (int, error) {
	if s <= 0 {
		return DefaultDue, nil
	}
	if s < MinDue || s > MaxDue {
		return 0, kungfu.Invalid(kungfu.FieldError{Field: field, Message: fmt.Sprintf("seconds between %d and %d", MinDue, MaxDue)})
	}
	return s, nil
}

// assignment is a locked assignment row with its room.
type assignment struct {
	ID, Thread, Entry, Creator, Assignee int64
	State                                string
	Schema                               []byte
	DeliverDueS, JudgeDueS               int
	DeliverDueAt, JudgeDueAt             *time.Time
	Forfeited                            *time.Time
	room                                 room
}

// lockAssign locks the assignment's room, then the assignment, and checks
// the caller is still a member (a closed room's members may still act on
// delivered work).
func (w *write) lockAssign(ctx context.Context, id int64) (assignment, string, error) {
	notFound := kungfu.Errorf(kungfu.CodeAssignNotFound, "no assignment %d", id)
	var code string
	err := w.tx.QueryRow(ctx, `SELECT t.code FROM assigns a JOIN threads t ON t.id = a.thread_id WHERE a.id = $1`, id).Scan(&code)
	if errors.Is(err, pgx.ErrNoRows) {
		return assignment{}, "", notFound
	}
	if err != nil {
		return assignment{}, "", err
	}
	r, err := w.lockRoom(ctx, code)
	if err != nil {
		return assignment{}, "", err
	}
	rl, err := role(ctx, w.tx, r.ID, w.who.AccountID)
	if err != nil {
		return assignment{}, "", err
	}
	a := assignment{room: r}
	err = w.tx.QueryRow(ctx, `SELECT id, thread_id, entry_id, creator_id, assignee_id, state, output_schema, deliver_due_s, judge_due_s,
		deliver_due_at, judge_due_at, judge_forfeited_at FROM assigns WHERE id = $1 FOR UPDATE`, id).
		Scan(&a.ID, &a.Thread, &a.Entry, &a.Creator, &a.Assignee, &a.State, &a.Schema, &a.DeliverDueS, &a.JudgeDueS,
			&a.DeliverDueAt, &a.JudgeDueAt, &a.Forfeited)
	if err != nil {
		return assignment{}, "", err
	}
	return a, rl, nil
}

// expireIfDue applies a passed deadline before any action: the deadline
// wins over an action in flight. It reports whether the assignment ended.
func (w *write) expireIfDue(ctx context.Context, a *assignment) (bool, error) {
	var to string
	switch {
	case a.State == "taken" && !w.now.Before(*a.DeliverDueAt):
		to = "timed_out"
	case a.State == "delivered" && !w.now.Before(*a.JudgeDueAt):
		to = "undecided"
	default:
		return false, nil
	}
	if err := w.finish(ctx, a, to, "deadline"); err != nil {
		return false, err
	}
	for _, id := range []int64{a.Creator, a.Assignee} {
		if err := w.notify(ctx, id, "exit"); err != nil {
			return false, err
		}
		if a.Creator == a.Assignee {
			break
		}
	}
	return true, nil
}

func (w *write) finish(ctx context.Context, a *assignment, state, cause string) error {
	_, err := w.tx.Exec(ctx, `UPDATE assigns SET state = $2, ended_at = $3, end_cause = $4 WHERE id = $1`, a.ID, state, w.now, cause)
	a.State = state
	return err
}

func invalidState(a assignment, want string) error {
	return kungfu.Errorf(kungfu.CodeInvalidState, "assignment %d is %s; this needs it %s", a.ID, a.State, want).
		WithDetails(map[string]any{"status": a.State})
}

// Delivery is an assignee's work: a JSON payload and/or pinned memories.
type Delivery struct {
	Payload  json.RawMessage
	Memories json.RawMessage
}

func (d Delivery) empty() bool {
	return len(bytes.TrimSpace(d.Payload)) == 0 && len(bytes.TrimSpace(d.Memories)) == 0
}

// Pin is one memory version a delivery fixed.
type Pin struct {
	Name     string `json:"name"`
	Code     string `json:"code"`
	Revision int    `json:"revision"`
	Checksum string `json:"checksum"`
}

// AssignResult is the result of every assign_* tool.
type AssignResult struct {
	Assign       int64      `json:"assign"`
	Thread       string     `json:"thread"`
	State        string     `json:"state"`
	DeliverDueAt *time.Time `json:"deliver_due_at,omitempty"`
	JudgeDueAt   *time.Time `json:"judge_due_at,omitempty"`
	Fulfilled    bool       `json:"fulfilled,omitempty"`
	Verdict      string     `json:"verdict,omitempty"`
	Pins         []Pin      `json:"memories,omitempty"`
}

// Take claims an open assignment addressed to the caller and starts its
// deliver clock; with a delivery it is take and submit in one action.
func (s *Service) Take(ctx context.Context, who kungfu.Caller, id int64, d Delivery, idem Idem) (any, error) {
	var pre checked
	if !d.empty() {
		pre = s.precheck(ctx, id, d)
	}
	return s.run(ctx, who, "assign_take", idem, func(ctx context.Context, w *write) (any, error) {
		a, _, err := w.lockAssign(ctx, id)
		if err != nil {
			return nil, err
		}
		if a.Assignee != who.AccountID {
			return nil, kungfu.Errorf(kungfu.CodeNotYours, "assignment %d is addressed to someone else", id)
		}
		if err := requireOpen(a.room); err != nil {
			return nil, err
		}
		if a.State != "open" {
			return nil, invalidState(a, "open")
		}
		due := w.now.Add(time.Duration(a.DeliverDueS) * time.Second)
		if _, err := w.tx.Exec(ctx, `UPDATE assigns SET state = 'taken', taken_at = $2, deliver_due_at = $3 WHERE id = $1`, id, w.now, due); err != nil {
			return nil, err
		}
		a.State, a.DeliverDueAt = "taken", &due
		tag, err := w.tx.Exec(ctx, `UPDATE thread_receipts SET state = 'fulfilled', resolution = 'take', ended_at = $3
			WHERE entry_id = $1 AND account_id = $2 AND state = 'pending'`, a.Entry, who.AccountID, w.now)
		if err != nil {
			return nil, err
		}
		out := AssignResult{Assign: id, Thread: a.room.Code, State: "taken", DeliverDueAt: &due, Fulfilled: tag.RowsAffected() == 1}
		if d.empty() {
			w.wakeAt(id, "deliver", due)
			return out, nil
		}
		res, err := w.deliver(ctx, &a, d, pre)
		res.Fulfilled = out.Fulfilled
		res.DeliverDueAt = &due
		return res, err
	})
}

// Submit delivers the caller's taken assignment. Deliveries are immutable.
func (s *Service) Submit(ctx context.Context, who kungfu.Caller, id int64, d Delivery, idem Idem) (any, error) {
	if d.empty() {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "payload", Message: "give payload and/or memories"})
	}
	pre := s.precheck(ctx, id, d)
	return s.run(ctx, who, "assign_submit", idem, func(ctx context.Context, w *write) (any, error) {
		a, _, err := w.lockAssign(ctx, id)
		if err != nil {
			return nil, err
		}
		if a.Assignee != who.AccountID {
			return nil, kungfu.Errorf(kungfu.CodeNotYours, "assignment %d is not yours to deliver", id)
		}
		if ended, err := w.expireIfDue(ctx, &a); err != nil {
			return nil, err
		} else if ended {
			return nil, committed{kungfu.Errorf(kungfu.CodeInvalidState, "the deliver deadline of assignment %d has passed", id).
				WithDetails(map[string]any{"status": a.State})}
		}
		if a.State != "taken" {
			return nil, invalidState(a, "taken")
		}
		return w.deliver(ctx, &a, d, pre)
	})
}

// checked is a delivery's payload checked against its assignment's output
// schema before the transaction: the check's cost is the assignee's to
// choose, and under the room and assignment locks it would hold up every
// write to the room.
type checked struct {
	read    bool
	schema  []byte
	payload []byte
	err     error
}

// precheck reads the output schema without a lock (it never changes after
// the assignment is posted) and checks the payload against it. A failed
// read is left to the transaction, which meets it again in its place.
func (s *Service) precheck(ctx context.Context, id int64, d Delivery) checked {
	var sch []byte
	if err := s.DB.QueryRow(ctx, `SELECT output_schema FROM assigns WHERE id = $1`, id).Scan(&sch); err != nil {
		return checked{}
	}
	p, err := checkDelivery(d, sch)
	return checked{read: true, schema: sch, payload: p, err: err}
}

// checkDelivery applies the assignment's rules to a delivery's payload and
// returns the JSON to store (nil for none).
func checkDelivery(d Delivery, outputSchema []byte) ([]byte, error) {
	var payload []byte
	if p := bytes.TrimSpace(d.Payload); len(p) > 0 && string(p) != "null" {
		// The protocol sends payload as a JSON string; a string that holds
		// JSON is that JSON, any other string is the value itself.
		var str string
		if json.Unmarshal(p, &str) == nil && json.Valid([]byte(str)) {
			p = []byte(str)
			// A wrapped document is user JSON in its own right: read as
			// strictly as the arguments around it before it is stored.
			if err := userjson.Validate("payload", p); err != nil {
				return nil, err
			}
		}
		if len(p) > MaxPayload {
			return nil, kungfu.Errorf(kungfu.CodePayloadTooLarge, "payload is larger than %d bytes", MaxPayload)
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(p))
		if err != nil {
			return nil, kungfu.Invalid(kungfu.FieldError{Field: "payload", Message: "not valid JSON"})
		}
		if ptr, _ := credential.FindIn(inst); ptr != "" || credential.Find(string(p)) != "" {
			return nil, kungfu.Errorf(kungfu.CodeSensitiveContent, "the payload contains a credential-shaped string").
				WithDetails(map[string]any{"pointer": ptr})
		}
		if len(outputSchema) > 0 {
			if err := schema.CheckStored(outputSchema, inst, "the payload does not match the assignment's output_schema"); err != nil {
				return nil, err
			}
		}
		payload = p
	} else if len(outputSchema) > 0 {
		return nil, kungfu.Errorf(kungfu.CodeSchemaMismatch, "this assignment's output_schema needs a payload").
			WithDetails(map[string]any{"errors": []map[string]string{{"pointer": "", "message": "payload is required"}}})
	}
	return payload, nil
}

// deliver validates and stores a delivery and starts the judge clock.
func (w *write) deliver(ctx context.Context, a *assignment, d Delivery, pre checked) (AssignResult, error) {
	if !pre.read || !bytes.Equal(pre.schema, a.Schema) {
		// Unread before the lock (the row is that new): check it here.
		p, err := checkDelivery(d, a.Schema)
		pre = checked{read: true, schema: a.Schema, payload: p, err: err}
	}
	payload, err := pre.payload, pre.err
	if err != nil {
		return AssignResult{}, err
	}
	pins, err := w.pins(ctx, d.Memories)
	if err != nil {
		return AssignResult{}, err
	}
	pinsJSON, _ := json.Marshal(pins)
	judgeDue := w.now.Add(time.Duration(a.JudgeDueS) * time.Second)
	if _, err := w.tx.Exec(ctx, `UPDATE assigns SET state = 'delivered', delivered_at = $2, judge_due_at = $3, payload = $4, memories = $5
		WHERE id = $1`, a.ID, w.now, judgeDue, nullable(payload), pinsJSON); err != nil {
		return AssignResult{}, err
	}
	a.State = "delivered"
	w.wakeAt(a.ID, "judge", judgeDue)
	if a.Forfeited == nil {
		if err := w.notify(ctx, a.Creator, "judge"); err != nil {
			return AssignResult{}, err
		}
	}
	return AssignResult{Assign: a.ID, Thread: a.room.Code, State: "delivered", JudgeDueAt: &judgeDue, Pins: pins}, nil
}

func nullable(b []byte) any {
	if b == nil {
		return nil
	}
	return b
}

// pins resolves [{name, code}] (an array, or a JSON string holding one) to
// the caller's own active memories at their current revisions.
func (w *write) pins(ctx context.Context, raw json.RawMessage) ([]Pin, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return []Pin{}, nil
	}
	var str string
	if json.Unmarshal(raw, &str) == nil {
		raw = []byte(str)
		if json.Valid(raw) {
			if err := userjson.Validate("memories", raw); err != nil {
				return nil, err
			}
		}
	}
	var refs []struct {
		Name string `json:"name"`
		Code string `json:"code"`
	}
	if err := json.Unmarshal(raw, &refs); err != nil {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "memories", Message: `a list of {"name", "code"}`})
	}
	if len(refs) > MaxPins {
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "memories", Message: fmt.Sprintf("at most %d memories", MaxPins)})
	}
	pins := make([]Pin, 0, len(refs))
	for _, ref := range refs {
		h, err := memory.LookupHead(ctx, w.tx, ref.Code)
		if err != nil {
			return nil, err
		}
		if h.OwnerID != w.who.AccountID || h.Status != "active" {
			return nil, kungfu.Errorf(kungfu.CodeInvalidTarget, "memory %s is not one of your active memories", h.Code)
		}
		name := strings.TrimSpace(ref.Name)
		if name == "" {
			name = h.Title
		}
		pins = append(pins, Pin{Name: truncate(name, 128), Code: h.Code, Revision: h.Revision, Checksum: h.Checksum})
	}
	return pins, nil
}

// Judge settles a delivery: adopt, or reject with a reason the assignee
// reads. It works in a closed room, never after the judge deadline, and
// never once the creator's judgment was forfeited.
func (s *Service) Judge(ctx context.Context, who kungfu.Caller, id int64, verdict, reason string, idem Idem) (any, error) {
	verdict = strings.ToLower(strings.TrimSpace(verdict))
	reason = strings.TrimSpace(reason)
	switch {
	case verdict != "adopt" && verdict != "reject":
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "verdict", Message: "adopt or reject"})
	case verdict == "reject" && reason == "":
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "reason", Message: "a rejection needs a reason the assignee can act on"})
	case utf8.RuneCountInString(reason) > MaxReason:
		return nil, kungfu.Invalid(kungfu.FieldError{Field: "reason", Message: fmt.Sprintf("at most %d characters", MaxReason)})
	case credential.Find(reason) != "":
		return nil, kungfu.Errorf(kungfu.CodeSensitiveContent, "the reason contains a credential-shaped string")
	}
	return s.run(ctx, who, "assign_judge", idem, func(ctx context.Context, w *write) (any, error) {
		a, _, err := w.lockAssign(ctx, id)
		if err != nil {
			return nil, err
		}
		if a.Creator != who.AccountID {
			return nil, kungfu.Errorf(kungfu.CodeNotYours, "only the assignment's creator judges it")
		}
		if ended, err := w.expireIfDue(ctx, &a); err != nil {
			return nil, err
		} else if ended {
			return nil, committed{kungfu.Errorf(kungfu.CodeInvalidState, "the judge deadline of assignment %d has passed", id).
				WithDetails(map[string]any{"status": a.State})}
		}
		if a.State != "delivered" {
			return nil, invalidState(a, "delivered")
		}
		if a.Forfeited != nil {
			return nil, kungfu.Errorf(kungfu.CodeInvalidState, "your judgment of assignment %d was forfeited when you left the room", id).
				WithDetails(map[string]any{"status": a.State})
		}
		state := map[string]string{"adopt": "adopted", "reject": "rejected"}[verdict]
		var rs *string
		if reason != "" {
			rs = &reason
		}
		if _, err := w.tx.Exec(ctx, `UPDATE assigns SET state = $2, verdict = $3, reason = $4, ended_at = $5, end_cause = 'judge' WHERE id = $1`,
			id, state, verdict, rs, w.now); err != nil {
			return nil, err
		}
		if err := w.notify(ctx, a.Assignee, "verdict"); err != nil {
			return nil, err
		}
		return AssignResult{Assign: id, Thread: a.room.Code, State: state, Verdict: verdict}, nil
	})
}

// Drop lets the assignee abandon taken work before delivery.
func (s *Service) Drop(ctx context.Context, who kungfu.Caller, id int64, idem Idem) (any, error) {
	return s.end(ctx, who, "assign_drop", id, idem, func(a assignment) error {
		if a.Assignee != who.AccountID {
			return kungfu.Errorf(kungfu.CodeNotYours, "only the assignee can drop assignment %d", id)
		}
		if a.State != "taken" {
			return invalidState(a, "taken")
		}
		return nil
	}, "dropped", a2c)
}

// Void lets the creator kill anything undelivered.
func (s *Service) Void(ctx context.Context, who kungfu.Caller, id int64, idem Idem) (any, error) {
	return s.end(ctx, who, "assign_void", id, idem, func(a assignment) error {
		if a.Creator != who.AccountID {
			return kungfu.Errorf(kungfu.CodeNotYours, "only the creator can void assignment %d", id)
		}
		if a.State != "open" && a.State != "taken" {
			return invalidState(a, "open or taken")
		}
		return nil
	}, "voided", c2a)
}

type direction int

const (
	a2c direction = iota // tell the creator
	c2a                  // tell the assignee
)

func (s *Service) end(ctx context.Context, who kungfu.Caller, tool string, id int64, idem Idem, allowed func(assignment) error, state string, tell direction) (any, error) {
	return s.run(ctx, who, tool, idem, func(ctx context.Context, w *write) (any, error) {
		a, _, err := w.lockAssign(ctx, id)
		if err != nil {
			return nil, err
		}
		if ended, err := w.expireIfDue(ctx, &a); err != nil {
			return nil, err
		} else if ended {
			return nil, committed{invalidState(a, "before its deadline")}
		}
		if err := allowed(a); err != nil {
			return nil, err
		}
		if err := w.finish(ctx, &a, state, strings.TrimPrefix(tool, "assign_")); err != nil {
			return nil, err
		}
		other := a.Creator
		if tell == c2a {
			other = a.Assignee
		}
		if other != who.AccountID {
			if err := w.notify(ctx, other, "exit"); err != nil {
				return nil, err
			}
		}
		return AssignResult{Assign: id, Thread: a.room.Code, State: state}, nil
	})
}

// Expire applies an assignment's passed deadline; the queue's wake-up and
// the sweep both call it, and a second call is a no-op.
func (s *Service) Expire(ctx context.Context, id int64) (bool, error) {
	ended := false
	var w *write
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		w = &write{tx: tx, now: s.Now(), s: s}
		a := assignment{ID: id}
		err := tx.QueryRow(ctx, `SELECT creator_id, assignee_id, state, deliver_due_at, judge_due_at FROM assigns WHERE id = $1 FOR UPDATE SKIP LOCKED`, id).
			Scan(&a.Creator, &a.Assignee, &a.State, &a.DeliverDueAt, &a.JudgeDueAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // gone, or someone else is settling it right now
		}
		if err != nil {
			return err
		}
		ended, err = w.expireIfDue(ctx, &a)
		return err
	})
	if err == nil && ended {
		s.after(ctx, w)
	}
	return ended, err
}

// Sweep expires up to limit overdue assignments, whatever Redis remembers.
func (s *Service) Sweep(ctx context.Context, limit int) (int, error) {
	rows, err := s.DB.Query(ctx, `SELECT id FROM assigns
		WHERE (state = 'taken' AND deliver_due_at <= $1) OR (state = 'delivered' AND judge_due_at <= $1)
		ORDER BY id LIMIT $2`, s.Now(), limit)
	if err != nil {
		return 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		ended, err := s.Expire(ctx, id)
		if err != nil {
			return n, err
		}
		if ended {
			n++
		}
	}
	return n, nil
}
