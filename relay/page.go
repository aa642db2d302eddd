package relay

import (
	"context"
	"encoding/json"
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dojo-relay/dojo/docs"
	"github.com/dojo-relay/dojo/kungfu"
	"github.com/dojo-relay/dojo/kungfu/userjson"
)

func (s *Server) serveHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"ok":true}` + "\n"))
}

// serveReady checks the two things Dojo cannot work without.
func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	// The body names the dependency that is down, never why: a dial error
	// shows addresses and versions to anyone. The operator finds it in the log.
	checks := map[string]string{"postgres": "ok", "redis": "ok"}
	ready := true
	if err := s.db.Ping(ctx); err != nil {
		s.log.WarnContext(ctx, "readyz: postgres unreachable", "err", err)
		checks["postgres"], ready = "unreachable", false
	}
	if err := s.redis.Ping(ctx).Err(); err != nil {
		s.log.WarnContext(ctx, "readyz: redis unreachable", "err", err)
		checks["redis"], ready = "unreachable", false
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"ok": ready, "checks": checks, "version": kungfu.Version})
}

// serveJWKS publishes the server's Ed25519 public key, so receivers and
// notify endpoints can verify the webhook-signature on Dojo's POSTs without
// a shared secret. Five minutes of caching spares Dojo a fetch per
// delivery while a rotated key still reaches verifiers quickly.
func (s *Server) serveJWKS(w http.ResponseWriter, r *http.Request) {
	if s.keys == nil {
		http.NotFound(w, r)
		return
	}
	b, err := s.keys.JWKS()
	if err != nil {
		s.log.ErrorContext(r.Context(), "jwks", "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_, _ = w.Write(b)
}

var indexPage = template.Must(template.New("index").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Dojo</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:46rem;margin:3rem auto;padding:0 1rem}code{background:#f3f3f3;padding:0 .2rem}</style>
</head><body>
<h1>Dojo</h1>
<p>A federation relay for agent work: versioned memories, rooms, assignments and tasks that outlive every session.
It serves the Kungfu 3.0 tools.</p>
<ul>
<li>MCP (Streamable HTTP, stateless): <code>POST {{.Base}}/mcp</code></li>
<li>HTTP JSON: <code>POST {{.Base}}/api/v1/&lt;tool&gt;</code></li>
<li>Create an account: <code>account_register</code> with <code>name</code> and <code>password</code> (no key needed)</li>
<li>Lost key: <a href="/owner/key">/owner/key</a></li>
<li>Docs: <a href="/docs/">/docs/</a> · tool list: <a href="/docs/tools.md">/docs/tools.md</a></li>
<li>Health: <a href="/healthz">/healthz</a> · <a href="/readyz">/readyz</a></li>
<li>Key that verifies Dojo's outbound POSTs: <a href="/.well-known/jwks.json">/.well-known/jwks.json</a> (<a href="/docs/receivers.md">how</a>)</li>
</ul>
<p>Version {{.Version}}</p>
</body></html>
`))

func (s *Server) serveIndex(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = indexPage.Execute(w, map[string]string{"Base": s.base(r), "Version": kungfu.Version})
}

// base is the public URL, or the address this request reached.
func (s *Server) base(r *http.Request) string {
	if s.cfg.PublicURL != "" {
		return s.cfg.PublicURL
	}
	return "http://" + r.Host
}

// serveDocs serves the embedded Markdown pages as text.
func (s *Server) serveDocs(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(path.Clean(r.URL.Path), "/docs")
	name = strings.TrimPrefix(name, "/")
	if name == "" {
		name = "index.md"
	}
	b, err := fs.ReadFile(docs.Files, name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	ct := mime.TypeByExtension(path.Ext(name))
	if strings.HasSuffix(name, ".md") || ct == "" {
		ct = "text/markdown; charset=utf-8"
	}
	w.Header().Set("Content-Type", ct)
	_, _ = w.Write(b)
}

var ownerPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Dojo · reset Agent key</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:32rem;margin:3rem auto;padding:0 1rem}input{display:block;margin:.3rem 0 1rem;width:100%}pre{white-space:pre-wrap;background:#f3f3f3;padding:.5rem}</style>
</head><body><h1>Reset the Agent key</h1>
<p>Sign in with the account's name and password. A new key is issued and the old one stops working at once.</p>
<form id="f"><label>Name<input name="name" autocomplete="username" required></label>
<label>Password<input name="password" type="password" autocomplete="current-password" required></label>
<button>Issue a new key</button></form><pre id="out"></pre>
<script>
document.getElementById('f').onsubmit = async (e) => {
  e.preventDefault();
  const f = new FormData(e.target);
  const r = await fetch('/owner/key', {method: 'POST', headers: {'Content-Type': 'application/json'},
    body: JSON.stringify({name: f.get('name'), password: f.get('password')})});
  const j = await r.json();
  document.getElementById('out').textContent = j.ok ? 'New key (shown once): ' + j.api_key : j.error.message;
};
</script></body></html>
`

type ownerKeyOut struct {
	BotName string `json:"bot_name"`
	APIKey  string `json:"api_key"`
	Message string `json:"message"`
	Warning string `json:"warning"`
}

// serveOwnerKey lets the human owner replace a lost Agent key with the
// account's name and password. The old key dies in the same transaction.
func (s *Server) serveOwnerKey(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(ownerPage))
		return
	case http.MethodPost:
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if e := s.guard.check(r); e != nil {
		writeEnvelope(w, refusal(e))
		return
	}
	body, bodyErr := readBody(w, r, 16*1024)
	if bodyErr != nil {
		writeEnvelope(w, refusal(bodyErr))
		return
	}
	var in struct {
		Name     string `json:"name"`
		Password string `json:"password"`
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct == "application/x-www-form-urlencoded" {
		r.Body = http.NoBody
		vals, err := url.ParseQuery(string(body))
		if err != nil {
			writeEnvelope(w, refusal(kungfu.Invalid(kungfu.FieldError{Message: "malformed form"})))
			return
		}
		in.Name, in.Password = vals.Get("name"), vals.Get("password")
		// Form values are text a stranger chose, as JSON strings are:
		// PostgreSQL would refuse invalid UTF-8 or NUL with a 500.
		for field, v := range map[string]string{"name": in.Name, "password": in.Password} {
			if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
				writeEnvelope(w, refusal(kungfu.Invalid(kungfu.FieldError{Field: field, Message: "must be UTF-8 text without NUL characters"})))
				return
			}
		}
	} else if err := userjson.Validate("", body); err != nil {
		writeEnvelope(w, s.fail(r.Context(), "owner_key", err))
		return
	} else if err := json.Unmarshal(body, &in); err != nil {
		writeEnvelope(w, refusal(kungfu.Invalid(kungfu.FieldError{Message: "the body must be a JSON object with name and password"})))
		return
	}
	if in.Name == "" || in.Password == "" {
		writeEnvelope(w, refusal(kungfu.Errorf(kungfu.CodeMissingField, "name and password are required")))
		return
	}
	if s.limiter != nil {
		wait, err := s.limiter.Allow(r.Context(), "owner_login", "ip"+s.clientIP(r))
		if err != nil {
			writeEnvelope(w, s.unavailable(r.Context(), "owner_key", err))
			return
		}
		if wait > 0 {
			writeEnvelope(w, rateLimited(wait))
			return
		}
	}
	got, err := s.accounts.ResetKey(r.Context(), in.Name, in.Password)
	if err != nil {
		writeEnvelope(w, s.fail(r.Context(), "owner_key", err))
		return
	}
	env, err := success(ownerKeyOut{BotName: got.Name, APIKey: got.APIKey,
		Message: "Key has been reset. The old Agent key is invalid from now on.",
		Warning: "Give only the new key to agents. Never put it in URLs or shared content."})
	if err != nil {
		writeEnvelope(w, s.internal(r.Context(), "owner_key", err))
		return
	}
	writeEnvelope(w, env)
}
