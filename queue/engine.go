package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
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

// Deferred, wrapped in a handler's error, runs the task again after After
// without counting a try: the work was not attempted, typically because its
// target host had no free turn. Retry limits count only real failures.
type Deferred struct {
	After time.Duration
	Why   string
	// closed: the target is paused after timeouts, not merely full.
	closed bool
}

func (d *Deferred) Error() string {
	return fmt.Sprintf("deferred for %v: %s", d.After.Round(time.Millisecond), d.Why)
}

func deferred(err error) (*Deferred, bool) {
	var d *Deferred
	return d, errors.As(err, &d)
}

// Retention keeps a completed task, and so its TaskID, long enough to
// absorb a late duplicate enqueue, and short enough that the sweep can
// enqueue the same row again later.
const Retention = time.Minute

// DefaultWorkers is how many tasks of one type a process runs at once
// unless Workers says otherwise.
const DefaultWorkers = 10

// defaultRetries is asynq's own default, for types without Retry.
const defaultRetries = 25

// Engine runs tasks of the form (type, row id). A task is only a wake-up:
// its handler reads the row from PostgreSQL and decides there, so a
// duplicate or stale task is harmless. Each task type has its own asynq
// queue and its own workers, so one kind of work stuck on slow targets
// (notify pushes, receiver redeliveries) never delays another (assignment
// deadlines).
type Engine struct {
	rdb    *redis.Client
	client *asynq.Client
	insp   *asynq.Inspector
	base   string
	hosts  *Hosts
	log    *slog.Logger

	mu       sync.Mutex
	handlers map[string]handler
	retries  map[string]retry
	loops    []loop
}

type handler struct {
	fn      func(context.Context, int64) error
	workers int
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
// go-redis parses it). base names the deployment: every process of one
// deployment uses the same base, and everything the engine keeps in Redis
// is named from it, the queue of task type T being "<base>:<T>" (asynq
// keys asynq:{<base>:<T>}:…) and the host turns "<base>:host:…". Tests
// use a base of their own so their keys never meet.
func NewEngine(redisURL, base string, log *slog.Logger) (*Engine, error) {
	if err := checkName(base); err != nil {
		return nil, fmt.Errorf("queue: base name: %w", err)
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
		base:     base,
		hosts:    newHosts(rdb, base),
		log:      log,
		handlers: map[string]handler{},
		retries:  map[string]retry{},
	}, nil
}

// checkName refuses names that would break the {queue} hash tag asynq
// relies on in a cluster.
func checkName(s string) error {
	if strings.TrimSpace(s) == "" || strings.ContainsAny(s, "{}") {
		return fmt.Errorf("invalid name %q", s)
	}
	return nil
}

// Queue is the base the queue names are derived from.
func (e *Engine) Queue() string { return e.base }

// QueueOf is the asynq queue of taskType.
func (e *Engine) QueueOf(taskType string) string { return e.base + ":" + taskType }

// Hosts is the deployment's gate for outbound deliveries: turns per target
// host, shared by every process through Redis.
func (e *Engine) Hosts() *Hosts { return e.hosts }

// Handle runs fn for every task of taskType, on DefaultWorkers workers of
// its own. Register before Run.
func (e *Engine) Handle(taskType string, fn func(ctx context.Context, id int64) error) {
	if err := checkName(taskType); err != nil {
		panic("queue: task type: " + err.Error())
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, dup := e.handlers[taskType]; dup {
		panic("queue: two handlers for " + taskType)
	}
	e.handlers[taskType] = handler{fn: fn, workers: DefaultWorkers}
}

// Workers sets how many tasks of taskType this process runs at once. Call
// it after Handle and before Run.
func (e *Engine) Workers(taskType string, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	h, ok := e.handlers[taskType]
	if !ok || n < 1 {
		panic(fmt.Sprintf("queue: Workers(%q, %d) needs a handler and n >= 1", taskType, n))
	}
	h.workers = n
	e.handlers[taskType] = h
}

// Retry sets how often a failed task of taskType is run again (max retries
// after the first run) and after how long (n counts retries so far, from
// 0). Without it asynq's defaults apply (25, exponential). Deferrals
// (Deferred) count toward neither.
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
	if err := checkName(taskType); err != nil {
		return fmt.Errorf("queue: task type: %w", err)
	}
	queue := e.QueueOf(taskType)
	task := asynq.NewTask(taskType, []byte(strconv.FormatInt(id, 10)))
	// asynq archives a task whose retries reach MaxRetry even when the error
	// is a deferral; process enforces the real limit instead.
	opts := []asynq.Option{asynq.Queue(queue), asynq.TaskID(taskID), asynq.Retention(Retention), asynq.MaxRetry(math.MaxInt32)}
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
		info, ierr := e.insp.GetTaskInfo(queue, taskID)
		if ierr != nil || info.State != asynq.TaskStateArchived {
			return nil
		}
		if derr := e.insp.DeleteTask(queue, taskID); derr != nil && !errors.Is(derr, asynq.ErrTaskNotFound) {
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
// prefixes, which would send "notify-x" to "notify") and enforces the
// retry limit, which deferrals do not count toward.
func (e *Engine) process(ctx context.Context, t *asynq.Task) error {
	e.mu.Lock()
	h := e.handlers[t.Type()]
	r, limited := e.retries[t.Type()]
	e.mu.Unlock()
	if h.fn == nil {
		return fmt.Errorf("queue: no handler for %q: %w", t.Type(), asynq.SkipRetry)
	}
	id, err := strconv.ParseInt(string(t.Payload()), 10, 64)
	if err != nil {
		return fmt.Errorf("queue: %s payload %q: %w", t.Type(), t.Payload(), asynq.SkipRetry)
	}
	err = h.fn(ctx, id)
	if err == nil {
		return nil
	}
	if _, ok := deferred(err); ok {
		return err
	}
	if errors.Is(err, ErrGiveUp) {
		return fmt.Errorf("%w (%w)", err, asynq.SkipRetry)
	}
	limit := defaultRetries
	if limited {
		limit = r.max
	}
	if n, _ := asynq.GetRetryCount(ctx); n >= limit {
		return fmt.Errorf("%w (retries exhausted: %w)", err, asynq.SkipRetry)
	}
	return err
}

func (e *Engine) retryDelay(n int, err error, t *asynq.Task) time.Duration {
	if d, ok := deferred(err); ok {
		return d.After
	}
	e.mu.Lock()
	r, ok := e.retries[t.Type()]
	e.mu.Unlock()
	if ok && r.delay != nil {
		return r.delay(n)
	}
	return asynq.DefaultRetryDelayFunc(n, err, t)
}

// Run works the queues and runs the periodic loops until ctx ends, then
// lets running tasks finish (up to 8 s; unfinished ones go back to Redis)
// and returns nil. Each task type gets an asynq server of its own, with
// its own workers polling only its queue.
func (e *Engine) Run(ctx context.Context) error {
	if err := e.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("queue: redis: %w", err)
	}
	e.mu.Lock()
	types := make(map[string]int, len(e.handlers))
	for typ, h := range e.handlers {
		types[typ] = h.workers
	}
	loops := append([]loop(nil), e.loops...)
	e.mu.Unlock()
	logger := newAsynqLog(e.log, time.Now)
	var servers []*asynq.Server
	stop := func() {
		var wg sync.WaitGroup
		for _, s := range servers {
			wg.Go(s.Shutdown)
		}
		wg.Wait()
	}
	for typ, workers := range types {
		srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
			Concurrency: workers,
			Queues:      map[string]int{e.QueueOf(typ): 1},
			// Scheduled wake-ups and retries should not wait the default 5 s,
			// nor new tasks the default 1 s.
			DelayedTaskCheckInterval: 200 * time.Millisecond,
			TaskCheckInterval:        200 * time.Millisecond,
			RetryDelayFunc:           e.retryDelay,
			IsFailure:                func(err error) bool { _, ok := deferred(err); return !ok },
			ShutdownTimeout:          8 * time.Second,
			Logger:                   logger,
			ErrorHandler: asynq.ErrorHandlerFunc(func(_ context.Context, t *asynq.Task, err error) {
				if _, ok := deferred(err); ok {
					e.log.Debug("task deferred", "type", t.Type(), "id", string(t.Payload()), "err", err)
					return
				}
				e.log.Warn("task failed", "type", t.Type(), "id", string(t.Payload()), "err", err)
			}),
		})
		if err := srv.Start(asynq.HandlerFunc(e.process)); err != nil {
			stop()
			return fmt.Errorf("queue: start %s: %w", typ, err)
		}
		servers = append(servers, srv)
	}
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Go(func() { e.every(ctx, l, logger.r) })
	}
	<-ctx.Done()
	stop()
	wg.Wait()
	return nil
}

// every runs one loop. A failure that repeats (Redis down fails every
// sweep) is held back like asynq's own: one line per job, then growing
// gaps, keyed by the job and not by the error, whose text names rows.
func (e *Engine) every(ctx context.Context, l loop, r *repeats) {
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		if err := l.fn(ctx); err != nil && ctx.Err() == nil {
			if ok, held := r.admit("periodic job failed: " + l.name); ok {
				e.log.Warn("periodic job failed", "job", l.name, "err", err, "held_back", held)
			}
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
