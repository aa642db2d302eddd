package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dojo-relay/dojo/adapters/karmadue"
	"github.com/dojo-relay/dojo/adapters/kizuna"
	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/account"
	"github.com/dojo-relay/dojo/kungfu/tool"
	"github.com/dojo-relay/dojo/signing"
)

// Body caps: the MCP transport takes 1 MiB, the HTTP JSON twin 512 KB plus
// room for the envelope of a maximal work payload.
const (
	maxMCPBody = 1 << 20
	maxAPIBody = 512*1024 + 4*1024
)

// Config is what the relay needs besides its dependencies.
type Config struct {
	// PublicURL prefixes the links Dojo hands out (no trailing slash).
	PublicURL string
	// TrustedProxies may set X-Forwarded-For; others are taken at their
	// socket address.
	TrustedProxies []netip.Prefix
	// LoopbackUnlimited lifts the per-address limits (register, owner
	// login) for loopback clients: `dojo dev`, where one developer is every
	// client and a walkthrough run twice must not hit the hourly cap.
	LoopbackUnlimited bool
}

// Server serves every door over one registry.
type Server struct {
	cfg      Config
	db       *pgxpool.Pool
	redis    redis.UniversalClient
	accounts *account.Service
	tools    *tool.Registry
	limiter  *Limiter
	keys     *signing.ServerKey
	guard    *guard
	log      *slog.Logger
	// door admits kd-mcp-v1 signed calls; nil admits none.
	door *karmadue.Door
	// hub serves the Kizuna hub paths; nil serves none.
	hub *kizuna.Hub
	// agentArg names the tools that take an agent_id argument of their own.
	agentArg map[string]bool
}

// Deps are the server's collaborators.
type Deps struct {
	DB       *pgxpool.Pool
	Redis    redis.UniversalClient
	Accounts *account.Service
	Tools    *tool.Registry
	Limiter  *Limiter
	// Keys is the server key whose public half is served as the JWKS;
	// nil serves no JWKS (404).
	Keys *signing.ServerKey
	Log  *slog.Logger
	// Door admits KarmaDue agents' signed calls; nil refuses none and
	// admits none (every x-kd-* header is ignored).
	Door *karmadue.Door
	// Hub is the Kizuna hub; nil leaves its paths to the tool routes.
	Hub *kizuna.Hub
}

// New builds the relay.
func New(cfg Config, d Deps) *Server {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	cfg.PublicURL = strings.TrimRight(cfg.PublicURL, "/")
	return &Server{cfg: cfg, db: d.DB, redis: d.Redis, accounts: d.Accounts, tools: d.Tools, limiter: d.Limiter,
		keys: d.Keys, guard: newGuard(cfg.PublicURL), log: d.Log, door: d.Door, hub: d.Hub, agentArg: takesAgentID(d.Tools)}
}

// Handler returns the HTTP routes.
func (s *Server) Handler() http.Handler {
	r := mux.NewRouter()
	// Tool calls are most of the traffic. Matched first, by name, they
	// skip the regexps of every route below; a name that is no tool falls
	// through to the hub's fixed paths and then to /api/v1/{tool}, which
	// answers UNKNOWN_TOOL.
	r.MatcherFunc(s.isToolPath).HandlerFunc(s.serveAPI)
	r.Handle("/mcp", s.mcpHandler())
	// The hub's fixed paths come before /api/v1/{tool}, which would
	// otherwise take /api/v1/agents and /api/v1/tasks for tool names.
	if s.hub != nil {
		s.hub.Mount(r)
	}
	r.HandleFunc("/api/v1/{tool}", s.serveAPI)
	r.HandleFunc("/owner/key", s.serveOwnerKey)
	r.HandleFunc("/healthz", s.serveHealth).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/readyz", s.serveReady).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/.well-known/jwks.json", s.serveJWKS).Methods(http.MethodGet, http.MethodHead)
	r.PathPrefix("/docs").HandlerFunc(s.serveDocs).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/", s.serveIndex).Methods(http.MethodGet, http.MethodHead)
	return r
}

// isToolPath matches /api/v1/<name of a tool>.
func (s *Server) isToolPath(r *http.Request, _ *mux.RouteMatch) bool {
	name, ok := strings.CutPrefix(r.URL.Path, "/api/v1/")
	if !ok {
		return false
	}
	_, known := s.tools.Lookup(name)
	return known
}

// toolName is the tool an /api/v1/ path names.
func toolName(r *http.Request) string {
	if name := mux.Vars(r)["tool"]; name != "" {
		return name
	}
	return strings.TrimPrefix(r.URL.Path, "/api/v1/")
}

// call runs one tool for who: authorization, rate limit, argument
// validation, the handler, and the envelope. Both transports end here.
//
// The rate-limit check in Redis runs beside validation, and beside the
// handler of a tool that only reads, instead of before them: its verdict is
// still given before any result, so a refused call answers as it always
// did, and a tool that writes starts only once the verdict allows it.
func (s *Server) call(ctx context.Context, who kungfu.Caller, name string, args json.RawMessage) envelope {
	return s.callWith(ctx, who, name, args, nil)
}

// callWith is call with the handler authenticateFor left when it sent the
// tool's first read (nil when it did not); args then passed the schema.
func (s *Server) callWith(ctx context.Context, who kungfu.Caller, name string, args json.RawMessage, pre tool.Handler) envelope {
	t, ok := s.tools.Lookup(name)
	if !ok {
		return refusal(kungfu.Errorf(kungfu.CodeUnknownTool, "no tool named %q", name))
	}
	if t.Signed && who.Agent == "" {
		return refusal(kungfu.Errorf(kungfu.CodeSignatureRequired, "%s must be signed with kd-mcp-v1 by the agent's current key", name))
	}
	if !t.Public && who.Anonymous() {
		return refusal(kungfu.Errorf(kungfu.CodeUnauthorized, "missing or invalid Agent key"))
	}
	verdict := s.limit(ctx, t, who)
	handler, verr := pre, error(nil)
	if pre == nil {
		handler, verr = t.Handler, t.Validate(args)
	}
	var (
		result any
		err    error
		ran    bool
	)
	if verr == nil && t.ReadOnly && verdict != nil {
		result, err = handler(verdict.read, who, args)
		ran = true
	}
	if env := verdict.wait(); env != nil {
		return *env
	}
	if verr != nil {
		return s.fail(ctx, name, verr)
	}
	if !ran {
		result, err = handler(ctx, who, args)
	}
	if err != nil {
		return s.fail(ctx, name, err)
	}
	env, err := success(result)
	if err != nil {
		return s.internal(ctx, name, err)
	}
	return env
}

// limit starts the rate-limit check of one call, or returns nil when no
// limit applies.
func (s *Server) limit(ctx context.Context, t *tool.Tool, who kungfu.Caller) *pending {
	if t.Limit == "" || s.limiter == nil || s.limiter.Redis == nil || (t.LimitByIP && s.unlimited(who.IP)) {
		return nil
	}
	if _, ok := s.limiter.Rules[t.Limit]; !ok {
		return nil
	}
	subject := "a" + itoa(who.AccountID)
	if t.LimitByIP {
		subject = "ip" + who.IP
	}
	p := &pending{s: s, ctx: ctx, name: t.Name}
	p.read, p.stop = context.WithCancel(ctx)
	// A read under way is wasted once the call is refused: end it.
	p.check = s.limiter.Start(ctx, t.Limit, subject, p.stop)
	return p
}

// pending is a rate-limit verdict on its way from Redis.
type pending struct {
	s     *Server
	ctx   context.Context
	name  string
	check *Check
	// read is the context of a read run before the verdict; stop ends it.
	read context.Context
	stop context.CancelFunc
}

// wait returns the refusal, or nil when the call may go on.
func (p *pending) wait() *envelope {
	if p == nil {
		return nil
	}
	delay, err := p.check.Wait()
	p.stop()
	var env envelope
	switch {
	case err != nil:
		env = p.s.unavailable(p.ctx, p.name, err)
	case delay > 0:
		env = rateLimited(delay)
	default:
		return nil
	}
	return &env
}

func rateLimited(wait time.Duration) envelope {
	secs := seconds(wait)
	return refusal(&kungfu.Error{Code: kungfu.CodeRateLimit, Message: "rate limited; retry after " + itoa(int64(secs)) + "s",
		Details: map[string]any{"retry_after": secs}, RetryAfter: &secs})
}

func (s *Server) fail(ctx context.Context, name string, err error) envelope {
	if e := kungfu.AsError(err); e != nil {
		return refusal(e)
	}
	if errors.Is(err, errRedis) {
		return s.unavailable(ctx, name, err)
	}
	return s.internal(ctx, name, err)
}

func (s *Server) internal(ctx context.Context, name string, err error) envelope {
	s.log.ErrorContext(ctx, "tool failed", "tool", name, "err", err)
	return refusal(kungfu.Errorf(kungfu.CodeInternal, "internal error"))
}

// authenticate resolves the Authorization header. No header is anonymous;
// a header that does not verify is reported so protected calls get 401.
func (s *Server) authenticate(r *http.Request) (kungfu.Caller, error) {
	who, _, err := s.authenticateFor(r, nil, nil)
	return who, err
}

// authenticateFor is authenticate for a call of t with args. When t can
// prefetch, the args pass its schema and a key is given, the tool's first
// read goes to PostgreSQL in the same round trip as the key lookup, and pre
// is the handler that finishes the call from it; otherwise pre is nil.
// The read is judged only once the caller is known, and dropped when the
// key is refused.
func (s *Server) authenticateFor(r *http.Request, t *tool.Tool, args json.RawMessage) (who kungfu.Caller, pre tool.Handler, err error) {
	who = kungfu.Caller{IP: s.clientIP(r)}
	h := r.Header.Get("Authorization")
	if h == "" {
		return who, nil, nil
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return who, nil, kungfu.Errorf(kungfu.CodeUnauthorized, "use Authorization: Bearer <Agent key>")
	}
	token = strings.TrimSpace(token)
	b := &pgx.Batch{}
	finish := account.QueueAuthenticate(b, token)
	if gate := account.KeyGate(token); gate != nil && t != nil && t.Prefetch != nil && t.Validate(args) == nil {
		pre = t.Prefetch(b, gate, args)
	}
	var cerr error
	if b.Len() > 0 {
		// Each statement's own error comes from its finish; this one is
		// the batch's (a lost connection).
		cerr = s.accounts.DB.SendBatch(r.Context(), b).Close()
	}
	c, err := finish()
	if errors.Is(err, account.ErrNotSent) && pre != nil {
		// The tool's read broke the batch before the key was looked up:
		// the key alone decides, and the tool reads for itself.
		return s.authenticateFor(r, nil, nil)
	}
	if err != nil {
		if kungfu.AsError(err) == nil && cerr != nil {
			err = fmt.Errorf("%w (%w)", err, cerr)
		}
		return who, nil, err
	}
	c.IP = who.IP
	return c, pre, nil
}

// clientIP is the socket peer, or the right-most X-Forwarded-For hop that
// is not a trusted proxy when the peer is one. Every X-Forwarded-For line
// counts, in order: a proxy that appends its own line instead of extending
// the client's must not let the client pick its address by sending a first
// line of its own. A hop that does not parse stops the walk there, since
// nothing left of it can be trusted either.
func (s *Server) clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	peer, err := netip.ParseAddr(host)
	if err != nil || !s.trusted(peer) {
		return host
	}
	var hops []string
	for _, line := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(line, ",")...)
	}
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break
		}
		if !s.trusted(a) || i == 0 {
			return a.Unmap().String()
		}
	}
	return host
}

// unlimited reports whether per-address limits are lifted for ip.
func (s *Server) unlimited(ip string) bool {
	a, err := netip.ParseAddr(ip)
	return s.cfg.LoopbackUnlimited && err == nil && a.Unmap().IsLoopback()
}

func (s *Server) trusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func writeEnvelope(w http.ResponseWriter, env envelope) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if env.status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="dojo"`)
	}
	if env.status == http.StatusTooManyRequests || env.status == http.StatusServiceUnavailable {
		var h head
		if json.Unmarshal(env.body, &h) == nil && h.RetryAfter != nil {
			w.Header().Set("Retry-After", itoa(int64(*h.RetryAfter)))
		}
	}
	w.WriteHeader(env.status)
	_, _ = w.Write(env.body)
	_, _ = w.Write([]byte("\n"))
}

// readBody reads at most limit bytes; a larger body is PAYLOAD_TOO_LARGE.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *kungfu.Error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, kungfu.Errorf(kungfu.CodePayloadTooLarge, "request body is larger than %d bytes", limit)
	}
	if err != nil {
		return nil, kungfu.Errorf(kungfu.CodeInvalidRequest, "could not read the request body")
	}
	return body, nil
}
