package relay

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/dojo-relay/dojo/kungfu"
)

// serveAPI is the HTTP JSON twin: POST /api/v1/<tool>, one JSON object in,
// one envelope out, the HTTP status taken from the error table.
func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	name := toolName(r)
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		env := refusal(kungfu.Errorf(kungfu.CodeInvalidRequest, "use POST with a JSON object body"))
		env.status = http.StatusMethodNotAllowed
		writeEnvelope(w, env)
		return
	}
	t, ok := s.tools.Lookup(name)
	if !ok {
		writeEnvelope(w, refusal(kungfu.Errorf(kungfu.CodeUnknownTool, "no tool named %q; tools/list on /mcp lists them", name)))
		return
	}
	if e := s.guard.check(r); e != nil {
		writeEnvelope(w, refusal(e))
		return
	}
	if e := jsonBody(r); e != nil {
		writeEnvelope(w, refusal(e))
		return
	}
	body, bodyErr := readBody(w, r, maxAPIBody)
	if bodyErr != nil {
		writeEnvelope(w, refusal(bodyErr))
		return
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		body = []byte(`{}`)
	}
	signed, names := s.inspect(r.Header, body)
	// A call that is neither signed nor names an agent runs as the key's
	// account with these very arguments: its first read may travel with
	// the key lookup.
	prefetchFor := t
	if signed || names {
		prefetchFor = nil
	}
	who, pre, authErr := s.authenticateFor(r, prefetchFor, body)
	if authErr != nil && !t.Public && !signed {
		writeEnvelope(w, s.fail(r.Context(), name, authErr))
		return
	}
	if !json.Valid(body) || body[0] != '{' {
		writeEnvelope(w, refusal(kungfu.Invalid(kungfu.FieldError{Message: "the body must be one JSON object"})))
		return
	}
	who, body, spend, err := s.admit(r, who, authErr, t, body, signed, names)
	if err == nil && spend != nil {
		err = spend(r.Context())
	}
	if err != nil {
		writeEnvelope(w, s.fail(r.Context(), name, err))
		return
	}
	writeEnvelope(w, s.callWith(kungfu.WithCaller(r.Context(), who), who, name, body, pre))
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
