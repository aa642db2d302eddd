package task

import (
	"context"
	"encoding/json"
	"errors"

	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/memory"
)

// Listing is one task on the board.
type Listing struct {
	Code           string `json:"code"`
	Title          string `json:"title"`
	Requirements   string `json:"requirements"`
	Price          int64  `json:"price"`
	Slots          int64  `json:"slots"`
	Audience       string `json:"audience"`
	Stats          Stats  `json:"stats"`
	RejectionsLeft int    `json:"rejections_left"`
	ClaimRequired  bool   `json:"claim_required"`
}

// Board lists claimable tasks: open, with a free slot, visible to the
// caller and not their own, newest first. offeredToMe keeps only restricted
// tasks naming the caller that they have not claimed yet.
func (s *Service) Board(ctx context.Context, who kungfu.Caller, q, code string, offeredToMe bool, page, size int) ([]Listing, int, int, int, error) {
	page, size = paging(page, size)
	now := s.Now()
	where := `t.status = 'open' AND (t.budget_locked - t.settled - t.reserved - t.refunded) >= v.price AND t.publisher_id <> $1
		AND (t.audience = 'open' OR EXISTS (SELECT 1 FROM task_audience a WHERE a.task_id = t.id AND a.account_id = $1))
		AND ($2 = '' OR v.title ILIKE $3 OR v.requirements ILIKE $3) AND ($4 = '' OR t.code = lower($4))
		AND (NOT $5 OR (t.audience = 'restricted' AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.task_id = t.id
		     AND c.account_id = $1 AND c.status = 'active')
		     AND (SELECT count(*) FROM submissions x WHERE x.task_id = t.id AND x.account_id = $1 AND x.state = 'rejected'
		          AND x.terminal_at > $6) < v.max_rejected))`
	args := []any{who.AccountID, strings.TrimSpace(q), likeEscape(q), strings.TrimSpace(code), offeredToMe, now.Add(-24 * time.Hour)}
	var total int
	if err := s.DB.QueryRow(ctx, `SELECT count(*) FROM tasks t JOIN task_versions v ON v.task_id = t.id AND v.version = t.version WHERE `+where, args...).Scan(&total); err != nil {
		return nil, 0, 0, 0, wrap("work_list", err)
	}
	rows, err := s.DB.Query(ctx, `SELECT `+taskColumns+`, `+versionColumns+`,
		(SELECT count(*) FROM submissions x WHERE x.task_id = t.id AND x.account_id = $1 AND x.state = 'rejected' AND x.terminal_at > $6)
		FROM tasks t JOIN accounts p ON p.id = t.publisher_id JOIN task_versions v ON v.task_id = t.id AND v.version = t.version
		WHERE `+where+` ORDER BY t.id DESC LIMIT $7 OFFSET $8`, append(args, size, (page-1)*size)...)
	if err != nil {
		return nil, 0, 0, 0, wrap("work_list", err)
	}
	type listed struct {
		r        row
		rejected int
	}
	found, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (listed, error) {
		var l listed
		var contract []byte
		r := &l.r
		err := cr.Scan(&r.ID, &r.Code, &r.PublisherID, &r.Publisher, &r.Status, &r.PausedReason, &r.Version, &r.Audience,
			&r.BudgetLocked, &r.Settled, &r.Reserved, &r.Refunded, &r.CreatedAt, &r.UpdatedAt,
			&r.v.Number, &contract, &r.v.Title, &r.v.Requirements, &r.v.Price, &r.v.ReceiverURL, &r.v.Schema,
			&r.v.HarnessRefs, &r.v.ClaimRequired, &r.v.ClaimTTL, &r.v.ClaimMax, &r.v.MaxRejected, &l.rejected)
		return l, err
	})
	if err != nil {
		return nil, 0, 0, 0, wrap("work_list", err)
	}
	out := make([]Listing, 0, len(found))
	for _, l := range found {
		st, err := stats(ctx, s.DB, l.r.ID, now, false)
		if err != nil {
			return nil, 0, 0, 0, wrap("work_list", err)
		}
		out = append(out, Listing{Code: l.r.Code, Title: l.r.v.Title, Requirements: runes(l.r.v.Requirements, ExcerptRunes),
			Price: l.r.v.Price, Slots: l.r.slots(), Audience: l.r.Audience, Stats: st,
			RejectionsLeft: max(0, l.r.v.MaxRejected-l.rejected), ClaimRequired: l.r.v.ClaimRequired})
	}
	return out, total, page, size, nil
}

func runes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n])
}

// HarnessEntry is one harness memory in the task package's directory.
type HarnessEntry struct {
	RefID       string `json:"ref_id"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Bytes       int    `json:"bytes"`
	Revision    int    `json:"revision"`
	Pinned      bool   `json:"pinned"`
}

// Package is work_get's result: the contract without its receiver.
type Package struct {
	Code            string         `json:"code"`
	Status          string         `json:"status"`
	PausedReason    *string        `json:"paused_reason"`
	ContractVersion int            `json:"contract_version"`
	Contract        Contract       `json:"contract"`
	Harness         []HarnessEntry `json:"harness"`
	Price           int64          `json:"price"`
	Slots           int64          `json:"slots"`
	Stats           Stats          `json:"stats"`
	My              My             `json:"my"`
}

// My is the caller's standing on a task.
type My struct {
	Claim          *Claim `json:"claim"`
	RejectionsLeft int    `json:"rejections_left"`
	Own            bool   `json:"own"`
}

// engagement is the version and harness pins the caller works against:
// their active claim's, or the current ones.
func (s *Service) engagement(ctx context.Context, q querier, r row, who kungfu.Caller, claimID string) (version, []harnessPin, *Claim, error) {
	var id int64
	if claimID != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(claimID), 10, 64)
		if err != nil {
			return version{}, nil, nil, kungfu.Errorf(kungfu.CodeClaimInvalid, "claim %s is not yours", claimID)
		}
		id = n
	}
	c, err := activeClaim(ctx, q, r, who.AccountID, id)
	if err == nil && !s.Now().Before(c.ExpiresAt) {
		err = pgx.ErrNoRows // expired, whether or not the sweep has run yet
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if claimID != "" {
			return version{}, nil, nil, kungfu.Errorf(kungfu.CodeClaimInvalid, "claim %s is not an active claim of yours on this task", claimID)
		}
		return r.v, nil, nil, nil
	}
	if err != nil {
		return version{}, nil, nil, err
	}
	v := r.v
	if c.ContractVersion != r.Version {
		if v, err = loadVersion(ctx, q, r.ID, c.ContractVersion); err != nil {
			return version{}, nil, nil, err
		}
	}
	var raw []byte
	if err := q.QueryRow(ctx, `SELECT harness FROM claims WHERE id = $1`, c.ClaimID).Scan(&raw); err != nil {
		return version{}, nil, nil, err
	}
	var pins []harnessPin
	_ = json.Unmarshal(raw, &pins)
	return v, pins, &c, nil
}

// Get is work_get: the contract the caller works against (their claim's
// version while they hold one), never the receiver URL.
func (s *Service) Package(ctx context.Context, who kungfu.Caller, code string) (Package, error) {
	r, err := load(ctx, s.DB, who, code, false)
	if err != nil {
		return Package{}, err
	}
	v, pins, c, err := s.engagement(ctx, s.DB, r, who, "")
	if err != nil {
		return Package{}, wrap("work_get", err)
	}
	contract := v.Contract
	contract.Receiver = ReceiverSpec{}
	if contract.Audience != nil && contract.Audience.Type == "restricted" {
		contract.Audience = &Audience{Type: "restricted"} // who else is named is not the caller's business
	}
	out := Package{Code: r.Code, Status: r.Status, PausedReason: r.PausedReason, ContractVersion: v.Number, Contract: contract,
		Price: v.Price, Slots: r.slots(), My: My{Claim: c, Own: r.PublisherID == who.AccountID}, Harness: []HarnessEntry{}}
	if out.Stats, err = stats(ctx, s.DB, r.ID, s.Now(), false); err != nil {
		return Package{}, wrap("work_get", err)
	}
	var rejected int
	if err := s.DB.QueryRow(ctx, `SELECT count(*) FROM submissions WHERE task_id = $1 AND account_id = $2 AND state = 'rejected'
		AND terminal_at > $3`, r.ID, who.AccountID, s.Now().Add(-24*time.Hour)).Scan(&rejected); err != nil {
		return Package{}, wrap("work_get", err)
	}
	out.My.RejectionsLeft = max(0, v.MaxRejected-rejected)
	for _, ref := range v.HarnessRefs {
		m, pinned, err := harnessMemory(ctx, s.DB, ref, pins)
		if err != nil {
			continue // withdrawn and not pinned: not part of the package any more
		}
		out.Harness = append(out.Harness, HarnessEntry{RefID: ref, Title: m.Title, Description: m.Description,
			Bytes: len(m.Content), Revision: m.Revision, Pinned: pinned})
	}
	return out, nil
}

func harnessMemory(ctx context.Context, q querier, ref string, pins []harnessPin) (memory.Memory, bool, error) {
	for _, p := range pins {
		if p.RefID == ref {
			m, err := memory.Revision(ctx, q, p.MemoryID, p.Revision)
			return m, true, err
		}
	}
	var id int64
	var rev int
	err := q.QueryRow(ctx, `SELECT id, revision FROM memories WHERE code = $1 AND status = 'active'`, ref).Scan(&id, &rev)
	if err != nil {
		return memory.Memory{}, false, err
	}
	m, err := memory.Revision(ctx, q, id, rev)
	return m, false, err
}

// Harness is work_harness's result.
type Harness struct {
	RefID       string   `json:"ref_id"`
	Title       string   `json:"title"`
	Tags        []string `json:"tags"`
	Description string   `json:"description"`
	Content     string   `json:"content"`
	Checksum    string   `json:"checksum"`
	Revision    int      `json:"revision"`
	Pinned      bool     `json:"pinned"`
}

// HarnessRead is work_harness: one harness memory at the revision the
// caller's claim pinned, or its current content without a claim.
func (s *Service) HarnessRead(ctx context.Context, who kungfu.Caller, code, ref, claimID string) (Harness, error) {
	r, err := load(ctx, s.DB, who, code, false)
	if err != nil {
		return Harness{}, err
	}
	v, pins, _, err := s.engagement(ctx, s.DB, r, who, claimID)
	if err != nil {
		return Harness{}, err
	}
	ref = strings.ToLower(strings.TrimSpace(ref))
	notFound := kungfu.Errorf(kungfu.CodeHarnessRefNotFound, "%q is not in this task's harness_refs, or it was withdrawn", ref)
	listed := false
	for _, h := range v.HarnessRefs {
		listed = listed || h == ref
	}
	if !listed {
		return Harness{}, notFound
	}
	m, pinned, err := harnessMemory(ctx, s.DB, ref, pins)
	if err != nil {
		return Harness{}, notFound
	}
	return Harness{RefID: ref, Title: m.Title, Tags: m.Tags, Description: m.Description, Content: m.Content,
		Checksum: m.Checksum, Revision: m.Revision, Pinned: pinned}, nil
}

// Status is work_status: one of the caller's submissions with its events.
func (s *Service) Status(ctx context.Context, who kungfu.Caller, submissionID string) (Result, error) {
	notFound := kungfu.Errorf(kungfu.CodeSubmissionNotFound, "no submission %s of yours", submissionID)
	id, err := strconv.ParseInt(strings.TrimSpace(submissionID), 10, 64)
	if err != nil {
		return Result{}, notFound
	}
	var code string
	if err := s.DB.QueryRow(ctx, `SELECT t.code FROM submissions s JOIN tasks t ON t.id = s.task_id
		WHERE s.id = $1 AND s.account_id = $2`, id, who.AccountID).Scan(&code); err != nil {
		return Result{}, notFound
	}
	res, err := result(ctx, s.DB, code, id, true)
	if err != nil {
		return Result{}, wrap("work_status", err)
	}
	rows, err := s.DB.Query(ctx, `SELECT seq, from_state, to_state, cause, at FROM submission_events WHERE submission_id = $1 ORDER BY seq`, id)
	if err != nil {
		return Result{}, wrap("work_status", err)
	}
	res.Events, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.Seq, &e.From, &e.To, &e.Cause, &e.At)
		e.At = e.At.UTC()
		return e, err
	})
	if err != nil {
		return Result{}, wrap("work_status", err)
	}
	// The submitter was in the audience, so the task loads for them.
	if r, err := load(ctx, s.DB, who, code, false); err == nil {
		s.advise(ctx, &res, r, who)
	}
	return res, nil
}

// History is work_history: the caller's submissions, newest first, 20 a page.
func (s *Service) History(ctx context.Context, who kungfu.Caller, page int) ([]Result, int, error) {
	page, _ = paging(page, 20)
	rows, err := s.DB.Query(ctx, `SELECT s.id, t.code FROM submissions s JOIN tasks t ON t.id = s.task_id
		WHERE s.account_id = $1 ORDER BY s.id DESC LIMIT 20 OFFSET $2`, who.AccountID, (page-1)*20)
	if err != nil {
		return nil, 0, wrap("work_history", err)
	}
	type ref struct {
		id   int64
		code string
	}
	refs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ref, error) {
		var x ref
		err := r.Scan(&x.id, &x.code)
		return x, err
	})
	if err != nil {
		return nil, 0, wrap("work_history", err)
	}
	out := make([]Result, 0, len(refs))
	for _, x := range refs {
		res, err := result(ctx, s.DB, x.code, x.id, false)
		if err != nil {
			return nil, 0, wrap("work_history", err)
		}
		out = append(out, res)
	}
	var total int
	err = s.DB.QueryRow(ctx, `SELECT count(*) FROM submissions WHERE account_id = $1`, who.AccountID).Scan(&total)
	return out, total, wrap("work_history", err)
}

// Report is work_report's result.
type Report struct {
	ReportID string `json:"report_id"`
	TaskCode string `json:"task_code"`
	Status   string `json:"status"`
	Created  bool   `json:"created"`
}

// File is work_report: one open report per agent and task.
func (s *Service) File(ctx context.Context, who kungfu.Caller, code, reason string) (Report, error) {
	reason = strings.TrimSpace(reason)
	if n := utf8.RuneCountInString(reason); n < 1 || n > 2000 {
		return Report{}, kungfu.Invalid(kungfu.FieldError{Field: "reason", Message: "1 to 2000 characters"})
	}
	r, err := load(ctx, s.DB, who, code, false)
	if err != nil {
		return Report{}, err
	}
	out := Report{TaskCode: r.Code, Status: "open"}
	var id int64
	err = s.DB.QueryRow(ctx, `INSERT INTO task_reports (task_id, account_id, reason, created_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (task_id, account_id) WHERE status = 'open' DO NOTHING RETURNING id`, r.ID, who.AccountID, reason, s.Now()).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		err = s.DB.QueryRow(ctx, `SELECT id FROM task_reports WHERE task_id = $1 AND account_id = $2 AND status = 'open'`, r.ID, who.AccountID).Scan(&id)
	} else {
		out.Created = true
	}
	out.ReportID = strconv.FormatInt(id, 10)
	return out, wrap("work_report", err)
}

// Attempt is one POST to the receiver, for the publisher.
type Attempt struct {
	Attempt   int       `json:"attempt"`
	At        time.Time `json:"at"`
	Status    *int      `json:"status"`
	LatencyMS int       `json:"latency_ms"`
	Reply     *string   `json:"reply"`
	Outcome   string    `json:"outcome"`
}

// Delivered is one submission in the publisher's delivery record.
type Delivered struct {
	SubmissionID    string     `json:"submission_id"`
	AgentRef        string     `json:"agent_ref"`
	State           string     `json:"state"`
	Failure         *string    `json:"failure"`
	Amount          int64      `json:"amount"`
	ContractVersion int        `json:"contract_version"`
	Reply           *Reply     `json:"reply"`
	Attempts        []Attempt  `json:"attempts"`
	CreatedAt       time.Time  `json:"created_at"`
	TerminalAt      *time.Time `json:"terminal_at"`
}

// Submissions is task_submissions: the delivery record of one of the
// caller's tasks, newest first.
func (s *Service) Submissions(ctx context.Context, who kungfu.Caller, code, state string, page, size int) ([]Delivered, int, int, int, error) {
	page, size = paging(page, size)
	r, err := ownTask(ctx, s.DB, who, code, false)
	if err != nil {
		return nil, 0, 0, 0, err
	}
	var total int
	if err := s.DB.QueryRow(ctx, `SELECT count(*) FROM submissions WHERE task_id = $1 AND ($2 = '' OR state = $2)`, r.ID, state).Scan(&total); err != nil {
		return nil, 0, 0, 0, wrap("task_submissions", err)
	}
	rows, err := s.DB.Query(ctx, `SELECT id, account_id, state, failure, amount, version, response_code, response_body, created_at, terminal_at
		FROM submissions WHERE task_id = $1 AND ($2 = '' OR state = $2) ORDER BY id DESC LIMIT $3 OFFSET $4`, r.ID, state, size, (page-1)*size)
	if err != nil {
		return nil, 0, 0, 0, wrap("task_submissions", err)
	}
	list, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (Delivered, error) {
		var d Delivered
		var id, account int64
		var status *int
		var body *string
		err := cr.Scan(&id, &account, &d.State, &d.Failure, &d.Amount, &d.ContractVersion, &status, &body, &d.CreatedAt, &d.TerminalAt)
		d.SubmissionID = strconv.FormatInt(id, 10)
		if s.AgentRef != nil {
			d.AgentRef = s.AgentRef(r.Code, account)
		}
		if status != nil {
			d.Reply = &Reply{Status: *status, Body: *body}
		}
		return d, err
	})
	if err != nil {
		return nil, 0, 0, 0, wrap("task_submissions", err)
	}
	for i := range list {
		rows, err := s.DB.Query(ctx, `SELECT attempt, started_at, status, latency_ms, reply, outcome FROM delivery_attempts
			WHERE submission_id = $1 ORDER BY id`, list[i].SubmissionID)
		if err != nil {
			return nil, 0, 0, 0, wrap("task_submissions", err)
		}
		if list[i].Attempts, err = pgx.CollectRows(rows, func(cr pgx.CollectableRow) (Attempt, error) {
			var a Attempt
			err := cr.Scan(&a.Attempt, &a.At, &a.Status, &a.LatencyMS, &a.Reply, &a.Outcome)
			a.At = a.At.UTC()
			return a, err
		}); err != nil {
			return nil, 0, 0, 0, wrap("task_submissions", err)
		}
	}
	return list, total, page, size, nil
}
