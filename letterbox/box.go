package letterbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// Version is the box's version, set with -ldflags "-X
// github.com/dojo-relay/dojo/letterbox.Version=...".
var Version = "dev"

// Defaults of the Box's tunables.
const (
	DefaultHeartbeatEvery = 60 * time.Second
	DefaultHeartbeatMax   = 300 * time.Second
	DefaultRetryMin       = time.Second
	DefaultRetryMax       = 60 * time.Second
	DefaultForwardWait    = 5 * time.Second
)

// Failpoint is the environment variable of the crash-test hook: with
// "exit-after-spool" the process exits with status 3 right after a letter
// is durable and before it is acknowledged.
const Failpoint = "DOJO_BOX_FAILPOINT"

// Box is a running letterbox. Set the exported fields, then call Run or
// Serve; zero values take the defaults.
type Box struct {
	Home   string
	Config Config
	// Client makes the calls to the hub. The default has a 30 s timeout
	// and follows no redirects: a redirect would re-send the agent token.
	Client *http.Client
	Now    func() time.Time
	// HeartbeatEvery is the heartbeat period; while heartbeats fail the
	// gap doubles up to HeartbeatMax.
	HeartbeatEvery, HeartbeatMax time.Duration
	// RetryMin and RetryMax bound the outbox's backoff (1 s doubling to
	// 60 s); a Retry-After up to 300 s overrides it.
	RetryMin, RetryMax time.Duration
	// ForwardWait is how long a loopback call waits for the hub's answer
	// before it answers 202 queued.
	ForwardWait time.Duration
	Log         *slog.Logger

	once      sync.Once
	err       error
	spool     *spool
	out       *outbox
	started   time.Time
	failpoint bool
	handler   http.Handler
	// deliverOnly serves the deliver_listen address.
	deliverOnly http.Handler
	// deliveries bounds the letters being read at once: each may hold
	// 4 MiB, and the senders are strangers until the MAC is checked.
	deliveries chan struct{}
	stop       chan struct{}
	stopOnce   sync.Once
}

func (b *Box) now() time.Time {
	if b.Now != nil {
		return b.Now()
	}
	return time.Now()
}

func (b *Box) log() *slog.Logger {
	if b.Log != nil {
		return b.Log
	}
	return slog.Default()
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// prepare checks the config and opens the spool and the outbox, once.
func (b *Box) prepare() error {
	b.once.Do(func() {
		if b.err = b.Config.Check(); b.err != nil {
			b.err = fmt.Errorf("letterbox: %w", b.err)
			return
		}
		if b.Home == "" {
			b.err = errors.New("letterbox: Home is not set")
			return
		}
		if b.Client == nil {
			b.Client = &http.Client{
				Timeout:       30 * time.Second,
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			}
		}
		removeTemps(b.Home) // a config.json write cut short
		if b.spool, b.err = newSpool(b.Home); b.err != nil {
			return
		}
		if b.out, b.err = newOutbox(b.Home); b.err != nil {
			return
		}
		b.started = b.now()
		b.failpoint = os.Getenv(Failpoint) == "exit-after-spool"
		b.stop = make(chan struct{})
		b.deliveries = make(chan struct{}, maxDeliveries)
		b.handler, b.deliverOnly = b.routes()
	})
	return b.err
}

// Handler prepares the box and returns its HTTP handler without starting
// the heartbeat or the outbox sender; Serve starts those.
func (b *Box) Handler() (http.Handler, error) {
	if err := b.prepare(); err != nil {
		return nil, err
	}
	return b.handler, nil
}

// Run listens on Config.Listen (and Config.DeliverListen, if set) and
// serves until ctx ends.
func (b *Box) Run(ctx context.Context) error {
	if err := b.prepare(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", b.Config.Listen)
	if err != nil {
		return fmt.Errorf("letterbox: %w", err)
	}
	return b.Serve(ctx, ln)
}

// Serve serves on ln, sends heartbeats and works the outbox until ctx
// ends, then stops gracefully. It closes ln. When Config.DeliverListen is
// set it also listens there, for deliveries only.
func (b *Box) Serve(ctx context.Context, ln net.Listener) error {
	if err := b.prepare(); err != nil {
		ln.Close()
		return err
	}
	var dln net.Listener
	if b.Config.DeliverListen != "" {
		var err error
		if dln, err = net.Listen("tcp", b.Config.DeliverListen); err != nil {
			ln.Close()
			return fmt.Errorf("letterbox: deliver_listen: %w", err)
		}
	}
	return b.serve(ctx, ln, dln)
}

// serve is Serve with the delivery listener (nil for none) already open.
func (b *Box) serve(ctx context.Context, ln, dln net.Listener) error {
	if err := b.prepare(); err != nil {
		ln.Close()
		if dln != nil {
			dln.Close()
		}
		return err
	}
	newServer := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       30 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       60 * time.Second,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          slog.NewLogLogger(b.log().Handler(), slog.LevelWarn),
		}
	}
	servers := []*http.Server{newServer(b.handler)}
	listeners := []net.Listener{ln}
	if dln != nil {
		servers = append(servers, newServer(b.deliverOnly))
		listeners = append(listeners, dln)
	}
	work, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); b.heartbeat(work) }()
	go func() { defer wg.Done(); b.send(work) }()
	if dln != nil {
		b.log().Info("letterbox serving", "addr", ln.Addr().String(), "deliver_addr", dln.Addr().String(), "config", b.Config, "version", Version)
	} else {
		b.log().Info("letterbox serving", "addr", ln.Addr().String(), "config", b.Config, "version", Version)
	}

	served := make(chan error, len(servers))
	for i, srv := range servers {
		go func() { served <- srv.Serve(listeners[i]) }()
	}
	var err error
	select {
	case err = <-served:
		err = fmt.Errorf("letterbox: %w", err)
	case <-ctx.Done():
	}
	// Calls waiting for the hub answer "queued" at once instead of
	// holding up the shutdown.
	b.stopOnce.Do(func() { close(b.stop) })
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer scancel()
	for _, srv := range servers {
		if serr := srv.Shutdown(sctx); serr != nil && err == nil {
			err = fmt.Errorf("letterbox: shutdown: %w", serr)
		}
	}
	cancel()
	wg.Wait()
	b.log().Info("letterbox stopped")
	return err
}
