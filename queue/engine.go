package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// ErrGiveUp, wrapped in a handler's error, stops asynq from retrying the
// task. Use it when PostgreSQL says the work is over (abandoned, gone).
var ErrGiveUp = errors.New("give up")

// Retention keeps a completed task, and so its TaskID, long enough to
// absorb a late duplicate enqueue, and short enough that the sweep can
// enqueue the same row again later.
const Retention = time.Minute

// Engine runs tasks of the form (type, row id) on one asynq queue. A task
// is only a wake-up: its handler reads the row from PostgreSQL and decides
// there, so a duplicate or stale task is harmless.
type Engine struct {
	rdb    *redis.Client
	client *asynq.Client
	insp   *asynq.Inspector
	queue  string
	log    *slog.Logger

	mu       sync.Mutex
	handlers map[string]func(context.Context, int64) error
	retries  map[string]retry
	loops    []loop
}

type retry struct {
	max   int
	delay func(n int) time.Duration
}

type loop struct {
	name     string
	interval time.Duration
	fn       func(context.Context) error
}

// NewEngine connects to Redis at redisURL (redis:// or rediss://, as
// go-redis parses it). Every process of one deployment uses the same
// queue name; tests use their own so their keys (asynq:{<queue>}:…) never
// meet.
func NewEngine(redisURL, queueName string, log *slog.Logger) (*Engine, error) {
	if queueName == "" || strings.ContainsAny(queueName, "{}") {
		// Braces would break the {queue} hash tag asynq relies on in a cluster.
		return nil, fmt.Errorf("queue: invalid queue name %q", queueName)
	}
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, fmt.Errorf("queue: redis URL: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	rdb := redis.NewClient(opt)
	return &Engine{
		rdb:      rdb,
		client:   asynq.NewClientFromRedisClient(rdb),
		insp:     asynq.NewInspectorFromRedisClient(rdb),
		queue:    queueName,
		log:      log,
		handlers: map[string]func(context.Context, int64) error{},
		retries:  map[string]retry{},
	}, nil
}

// Queue is the asynq queue name.
func (e *Engine) Queue() string { return e.queue }

// Handle runs fn for every task of taskType. Register before Run.
func (e *Engine) Handle(taskType string, fn func(ctx context.Context, id int64) error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, dup := e.handlers[taskType]; dup {
		panic("queue: two handlers for " + taskType)
	}
	e.handlers[taskType] = fn
}

// Retry sets how often a failed task of taskType is run again (max retries
// after the first run) and after how long (n counts retries so far, from
// 0). Without it asynq's defaults apply (25, exponential).
func (e *Engine) Retry(taskType string, max int, delay func(n int) time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.retries[taskType] = retry{max: max, delay: delay}
}

// Every runs fn every interval while Run runs, starting at once. Every
// process runs its own loops, so fn must be safe to run concurrently with
// itself elsewhere (sweeps use SKIP LOCKED and enqueue by TaskID).
func (e *Engine) Every(name string, interval time.Duration, fn func(ctx context.Context) error) {
	if interval <= 0 {
		panic("queue: Every " + name + " needs a positive interval")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.loops = append(e.loops, loop{name: name, interval: interval, fn: fn})
}

// TaskID is the asynq task id of (taskType, id).
func TaskID(taskType string, id int64) string {
	return taskType + ":" + strconv.FormatInt(id, 10)
}

// Enqueue asks for taskType to run on row id, at once or at at. A task
// already queued for the same row counts as success: the existing one will
// do the work.
func (e *Engine) Enqueue(ctx context.Context, taskType string, id int64, at time.Time) error {
	return e.enqueue(ctx, taskType, id, TaskID(taskType, id), at)
}

// EnqueueKey is Enqueue for work that recurs on one row (a deadline per
// clock, a redelivery per attempt): key makes each occurrence its own
// task, so a finished one kept in Redis never hides the next.
func (e *Engine) EnqueueKey(ctx context.Context, taskType string, id int64, key string, at time.Time) error {
	return e.enqueue(ctx, taskType, id, TaskID(taskType, id)+":"+key, at)
}

func (e *Engine) enqueue(ctx context.Context, taskType string, id int64, taskID string, at time.Time) error {
	task := asynq.NewTask(taskType, []byte(strconv.FormatInt(id, 10)))
	opts := []asynq.Option{asynq.Queue(e.queue), asynq.TaskID(taskID), asynq.Retention(Retention)}
	e.mu.Lock()
	r, ok := e.retries[taskType]
	e.mu.Unlock()
	if ok {
		opts = append(opts, asynq.MaxRetry(r.max))
	}
	if at.After(time.Now()) {
		// asynq keeps whole seconds and wakes a task once its second has
		// begun, up to 1 s early; rounding up makes "not before at" hold.
		if r := at.Truncate(time.Second); !r.Equal(at) {
			at = r.Add(time.Second)
		}
		opts = append(opts, asynq.ProcessAt(at))
	}
	_, err := e.client.EnqueueContext(ctx, task, opts...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		// An archived task (retries exhausted) would hold its TaskID for
		// months. The caller only enqueues what PostgreSQL says is due, so
		// the archived copy is stale: replace it.
		info, ierr := e.insp.GetTaskInfo(e.queue, taskID)
		if ierr != nil || info.State != asynq.TaskStateArchived {
			return nil
		}
		if derr := e.insp.DeleteTask(e.queue, taskID); derr != nil && !errors.Is(derr, asynq.ErrTaskNotFound) {
			return fmt.Errorf("queue: replace archived %s: %w", taskID, derr)
		}
		_, err = e.client.EnqueueContext(ctx, task, opts...)
		if errors.Is(err, asynq.ErrTaskIDConflict) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("queue: enqueue %s: %w", taskID, err)
	}
	return nil
}

// process dispatches on the exact task type (asynq's ServeMux matches
// prefixes, which would send "notify-x" to "notify").
func (e *Engine) process(ctx context.Context, t *asynq.Task) error {
	e.mu.Lock()
	fn := e.handlers[t.Type()]
	e.mu.Unlock()
	if fn == nil {
		return fmt.Errorf("queue: no handler for %q: %w", t.Type(), asynq.SkipRetry)
	}
	id, err := strconv.ParseInt(string(t.Payload()), 10, 64)
	if err != nil {
		return fmt.Errorf("queue: %s payload %q: %w", t.Type(), t.Payload(), asynq.SkipRetry)
	}
	err = fn(ctx, id)
	if errors.Is(err, ErrGiveUp) {
		return fmt.Errorf("%w (%w)", err, asynq.SkipRetry)
	}
	return err
}

func (e *Engine) retryDelay(n int, err error, t *asynq.Task) time.Duration {
	e.mu.Lock()
	r, ok := e.retries[t.Type()]
	e.mu.Unlock()
	if ok && r.delay != nil {
		return r.delay(n)
	}
	return asynq.DefaultRetryDelayFunc(n, err, t)
}

// Run works the queue and runs the periodic loops until ctx ends, then
// lets running tasks finish (up to 8 s; unfinished ones go back to Redis)
// and returns nil.
func (e *Engine) Run(ctx context.Context) error {
	if err := e.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("queue: redis: %w", err)
	}
	srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Concurrency: 10,
		Queues:      map[string]int{e.queue: 1},
		// Scheduled wake-ups and retries should not wait the default 5 s,
		// nor new tasks the default 1 s.
		DelayedTaskCheckInterval: 200 * time.Millisecond,
		TaskCheckInterval:        200 * time.Millisecond,
		RetryDelayFunc:           e.retryDelay,
		ShutdownTimeout:          8 * time.Second,
		Logger:                   asynqLog{e.log},
		ErrorHandler: asynq.ErrorHandlerFunc(func(_ context.Context, t *asynq.Task, err error) {
			e.log.Warn("task failed", "type", t.Type(), "id", string(t.Payload()), "err", err)
		}),
	})
	if err := srv.Start(asynq.HandlerFunc(e.process)); err != nil {
		return fmt.Errorf("queue: start: %w", err)
	}
	e.mu.Lock()
	loops := append([]loop(nil), e.loops...)
	e.mu.Unlock()
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Go(func() { e.every(ctx, l) })
	}
	<-ctx.Done()
	srv.Shutdown()
	wg.Wait()
	return nil
}

func (e *Engine) every(ctx context.Context, l loop) {
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		if err := l.fn(ctx); err != nil && ctx.Err() == nil {
			e.log.Warn("periodic job failed", "job", l.name, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Close releases the Redis connections; call it after Run has returned.
func (e *Engine) Close() error { return e.rdb.Close() }

// asynqLog sends asynq's logs to slog. Its info lines (start, stop, and
// advice about signals that Dojo handles itself) are debug here.
type asynqLog struct{ log *slog.Logger }

func (l asynqLog) Debug(args ...any) { l.log.Debug(fmt.Sprint(args...), "component", "asynq") }
func (l asynqLog) Info(args ...any)  { l.log.Debug(fmt.Sprint(args...), "component", "asynq") }
func (l asynqLog) Warn(args ...any)  { l.log.Warn(fmt.Sprint(args...), "component", "asynq") }
func (l asynqLog) Error(args ...any) { l.log.Error(fmt.Sprint(args...), "component", "asynq") }

// Fatal is only logged: a library must not end the process.
func (l asynqLog) Fatal(args ...any) { l.log.Error(fmt.Sprint(args...), "component", "asynq") }
