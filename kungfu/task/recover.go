package task

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Redeliver makes the next attempt of a submission that is due: one left
// delivering by a crash, or uncertain after a try nobody answered. The
// attempt is claimed in PostgreSQL first (its next_attempt_at pushed past
// the request time), so two processes never POST the same attempt.
func (s *Service) Redeliver(ctx context.Context, id int64) error {
	var (
		d       Delivery
		attempt int
		due     bool
	)
	err := pgx.BeginFunc(ctx, s.DB, func(tx pgx.Tx) error {
		now := s.Now()
		var (
			state     string
			accountID int64
			version   int
			payload   []byte
			taskID    int64
		)
		err := tx.QueryRow(ctx, `SELECT s.state, s.attempts, s.account_id, s.version, s.payload, s.task_id, t.code
			FROM submissions s JOIN tasks t ON t.id = s.task_id
			WHERE s.id = $1 AND s.state IN ('delivering', 'uncertain') AND s.next_attempt_at <= $2
			FOR UPDATE OF s SKIP LOCKED`, id, now).Scan(&state, &attempt, &accountID, &version, &payload, &taskID, &d.TaskCode)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // not due, already resolved, or another process has it
		}
		if err != nil {
			return err
		}
		if state == "delivering" {
			// The synchronous try never recorded an outcome: its process died.
			from := "delivering"
			if _, err := tx.Exec(ctx, `UPDATE submissions SET state = 'uncertain', uncertain_since = $2 WHERE id = $1`, id, now); err != nil {
				return err
			}
			if err := event(ctx, tx, id, &from, "uncertain", "stalled", now); err != nil {
				return err
			}
		}
		attempt++
		lease := now.Add(2 * s.grace())
		if _, err := tx.Exec(ctx, `UPDATE submissions SET attempts = $2, next_attempt_at = $3 WHERE id = $1`, id, attempt, lease); err != nil {
			return err
		}
		v, err := loadVersion(ctx, tx, taskID, version)
		if err != nil {
			return err
		}
		d.SubmissionID, d.URL = id, v.ReceiverURL
		d.Body = s.body(id, d.TaskCode, accountID, payload)
		due = true
		return nil
	})
	if err != nil || !due || s.Receiver == nil {
		return err
	}
	_, err = s.record(ctx, id, attempt, s.Receiver.Deliver(ctx, d))
	return err
}

// Target is the receiver URL the next attempt of submission id would POST
// to, or "" when no attempt is due. It counts nothing: the queue asks it
// first to wait for a turn at that host, so an attempt Redeliver counts is
// one that is made.
func (s *Service) Target(ctx context.Context, id int64) (string, error) {
	var url string
	err := s.DB.QueryRow(ctx, `SELECT v.receiver_url FROM submissions s
		JOIN task_versions v ON v.task_id = s.task_id AND v.version = s.version
		WHERE s.id = $1 AND s.state IN ('delivering', 'uncertain') AND s.next_attempt_at <= $2`, id, s.Now()).Scan(&url)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return url, err
}

// Due returns submissions whose next attempt is due, for the sweep to
// hand to the queue (or redeliver itself when the queue is down).
func (s *Service) Due(ctx context.Context, limit int) ([]Pending, error) {
	rows, err := s.DB.Query(ctx, `SELECT id, attempts, next_attempt_at FROM submissions
		WHERE state IN ('delivering', 'uncertain') AND next_attempt_at <= $1 ORDER BY next_attempt_at LIMIT $2`, s.Now(), limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Pending, error) {
		var p Pending
		err := r.Scan(&p.ID, &p.Attempt, &p.At)
		p.Attempt++
		return p, err
	})
}

// Pending is a due redelivery.
type Pending struct {
	ID      int64
	Attempt int
	At      time.Time
}

// Key names one attempt in the queue.
func (p Pending) Key() string { return strconv.Itoa(p.Attempt) }
