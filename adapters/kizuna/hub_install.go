package kizuna

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5"
)

// The install scripts carry three placeholders, filled in per request.
// The bash ones source common.sh in the repository; the hub serves each
// with common.sh inlined, as one file that `curl | bash` can run.
//
//go:embed install/common.sh install/linux.sh install/macos.sh install/termux.sh install/windows.ps1
var installFiles embed.FS

// installScripts are the scripts GET /install/{script} serves.
var installScripts = []string{"linux.sh", "macos.sh", "termux.sh", "windows.ps1"}

// commonInclude is how a bash script sources common.sh; installScript puts
// the body of common.sh in its place.
const commonInclude = "# shellcheck source-path=SCRIPTDIR source=common.sh\n" +
	`. "$(dirname "${BASH_SOURCE[0]}")/common.sh"` + "\n"

// installScript is the script name as served, before its placeholders are
// filled in: for bash, the platform part with common.sh inlined. All the
// functions are defined before the platform's last line calls main, so a
// cut download still runs nothing.
func installScript(name string) ([]byte, error) {
	text, err := installFiles.ReadFile("install/" + name)
	if err != nil || !strings.HasSuffix(name, ".sh") {
		return text, err
	}
	common, err := installFiles.ReadFile("install/common.sh")
	if err != nil {
		return nil, err
	}
	// common.sh's header (the lines before its first blank line) speaks to
	// shellcheck and to its readers, not to the served script.
	_, body, ok := strings.Cut(string(common), "\n\n")
	if !ok || strings.Count(string(text), commonInclude) != 1 {
		return nil, fmt.Errorf("install script %s: common.sh cannot be inlined", name)
	}
	return []byte(strings.Replace(string(text), commonInclude, body, 1)), nil
}

// DefaultBoxPort is the letterbox's loopback port when the enroll token
// names no webhook port; the contract's prompt checks it.
const DefaultBoxPort = 7788

var (
	// enrollTokenRE is what mintEnroll issues: 32 random bytes, base64url.
	enrollTokenRE = regexp.MustCompile(`^kz_enroll_[A-Za-z0-9_-]{43}$`)
	// safeHubRE admits only characters that mean nothing to a shell or to
	// PowerShell inside single quotes, nor to JSON inside double quotes.
	safeHubRE = regexp.MustCompile(`^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/\-]*)?$`)
)

// boxOS and boxArch are the platforms a letterbox binary can be asked for.
var (
	boxOS   = []string{"linux", "darwin", "windows", "android"}
	boxArch = []string{"amd64", "arm64", "arm", "386"}
)

// serveScript answers GET /install/{linux.sh,macos.sh,termux.sh,windows.ps1}
// with the script, the hub's address, the token and the port filled in.
// A used or expired token still gets its script: a rerun resumes from
// the config the first run wrote, and the hub refuses a second enrollment
// anyway.
func (h *Hub) serveScript(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.route(map[string]handler{http.MethodGet: nil})(w, r)
		return
	}
	name := mux.Vars(r)["script"]
	if !slices.Contains(installScripts, name) {
		h.write(w, r, 0, nil, refuse(http.StatusNotFound, "NOT_FOUND",
			"no install script %q; there are linux.sh, macos.sh, termux.sh and windows.ps1", name))
		return
	}
	token := r.URL.Query().Get("token")
	if !enrollTokenRE.MatchString(token) {
		h.write(w, r, 0, nil, &Error{Status: http.StatusBadRequest, Code: "BAD_REQUEST",
			Message: "token must be an enroll token (kz_enroll_…) from POST /api/v1/enroll-tokens",
			Details: map[string]any{"fields": []field{{"token", "missing or malformed"}}}})
		return
	}
	hub := h.hubURL(r)
	if !safeHubRE.MatchString(hub) {
		h.write(w, r, 0, nil, &Error{Status: http.StatusBadRequest, Code: "BAD_REQUEST",
			Message: "the hub address of this request cannot be written into a script"})
		return
	}
	port, err := h.boxPort(r.Context(), token)
	if err != nil {
		h.write(w, r, 0, nil, err)
		return
	}
	text, err := installScript(name)
	if err != nil {
		h.write(w, r, 0, nil, err)
		return
	}
	// Every value matched a charset without quotes, so the scripts' single
	// quotes around the placeholders hold.
	out := strings.NewReplacer("__DOJO_HUB__", hub, "__DOJO_TOKEN__", token, "__DOJO_PORT__", strconv.Itoa(port)).
		Replace(string(text))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write([]byte(out))
	}
}

// boxPort is the explicit port of the token's webhook_url, or
// DefaultBoxPort: the letterbox listens where the hub will deliver. A URL
// without a port most likely reaches the box through a proxy, so it says
// nothing about the box's own port.
func (h *Hub) boxPort(ctx context.Context, token string) (int, error) {
	sum := sha256.Sum256([]byte(token))
	var raw *string
	err := h.DB.QueryRow(ctx, `SELECT elements::text FROM kz_enroll_tokens WHERE token_hash = $1`, sum[:]).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && raw == nil) {
		return DefaultBoxPort, nil
	}
	if err != nil {
		return 0, fmt.Errorf("install script: %w", err)
	}
	var e elements
	if json.Unmarshal([]byte(*raw), &e) != nil {
		return DefaultBoxPort, nil
	}
	return webhookPort(e.WebhookURL), nil
}

// webhookPort is the explicit port of a webhook URL, else DefaultBoxPort.
func webhookPort(webhook *string) int {
	if webhook == nil {
		return DefaultBoxPort
	}
	u, err := url.Parse(*webhook)
	if err != nil {
		return DefaultBoxPort
	}
	if p, err := strconv.Atoi(u.Port()); err == nil && p > 0 && p < 65536 {
		return p
	}
	return DefaultBoxPort
}

// serveBox answers GET /install/dojo-box/{os}/{arch} with a letterbox
// binary: BoxDir's, or for the host's own platform the Self executable.
func (h *Hub) serveBox(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.route(map[string]handler{http.MethodGet: nil})(w, r)
		return
	}
	goos, arch := mux.Vars(r)["os"], mux.Vars(r)["arch"]
	path := ""
	if slices.Contains(boxOS, goos) && slices.Contains(boxArch, arch) {
		path = h.boxPath(goos, arch)
	}
	if path == "" {
		h.write(w, r, 0, nil, &Error{Status: http.StatusNotFound, Code: "NOT_FOUND",
			Message: fmt.Sprintf("no dojo-box for %s/%s on this hub", goos, arch),
			Details: map[string]any{"available": h.boxPlatforms()}})
		return
	}
	f, err := os.Open(path)
	if err != nil {
		h.write(w, r, 0, nil, fmt.Errorf("dojo-box %s/%s: %w", goos, arch, err))
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		h.write(w, r, 0, nil, fmt.Errorf("dojo-box %s/%s: %w", goos, arch, err))
		return
	}
	file := "dojo-box"
	if goos == "windows" {
		file += ".exe"
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="`+file+`"`)
	w.Header().Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, file, st.ModTime(), f)
}

// boxPath is the binary for one platform, or "" when the hub has none.
func (h *Hub) boxPath(goos, arch string) string {
	if h.BoxDir != "" {
		file := "dojo-box"
		if goos == "windows" {
			file += ".exe"
		}
		p := filepath.Join(h.BoxDir, goos+"-"+arch, file)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
	}
	if h.Self != "" && goos == runtime.GOOS && arch == runtime.GOARCH {
		if st, err := os.Stat(h.Self); err == nil && st.Mode().IsRegular() {
			return h.Self
		}
	}
	return ""
}

// boxPlatforms lists the platforms boxPath can serve, as "os/arch".
func (h *Hub) boxPlatforms() []string {
	out := []string{}
	for _, goos := range boxOS {
		for _, arch := range boxArch {
			if h.boxPath(goos, arch) != "" {
				out = append(out, goos+"/"+arch)
			}
		}
	}
	return out
}
