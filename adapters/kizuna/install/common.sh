# shellcheck shell=bash
# The hub serves linux.sh, macos.sh and termux.sh with this file in place
# of the line that sources it, so that each is one self-contained script.
# What it uses without defining (OS, ARCH, METHOD and is_box) comes from
# that platform part.

set -euo pipefail

# The hub fills these in per request.
HUB='__DOJO_HUB__'
TOKEN='__DOJO_TOKEN__'
PORT='__DOJO_PORT__'

say() { printf 'dojo-box install: %s\n' "$*"; }
fail() {
	printf 'dojo-box install: %s\n' "$*" >&2
	exit 1
}

# json_str KEY prints the string value of KEY in the one-line JSON on
# stdin. The values read here are ids, tokens and URLs: no quotes inside.
json_str() { sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\\([^\"]*\\)\".*/\\1/p" | head -n 1; }

# paths sets where the letterbox lives; the platform part then refuses a
# HOME_DIR its service file cannot hold.
paths() {
	HOME_DIR="${DOJO_BOX_HOME:-$HOME/.dojo-box}"
	CONFIG="$HOME_DIR/config.json"
	BIN="$HOME_DIR/bin/dojo-box"
	PIDFILE="$HOME_DIR/dojo-box.pid"
	LOG="$HOME_DIR/logs/dojo-box.log"
	ERRLOG="$HOME_DIR/logs/stderr.log"
}

start_background() {
	mkdir -p "$HOME_DIR/logs"
	if [ -f "$PIDFILE" ]; then
		pid=$(cat "$PIDFILE")
		if [[ $pid =~ ^[0-9]+$ ]] && is_box "$pid"; then
			say "dojo-box already runs in the background (pid $pid)"
			return
		fi
	fi
	# The box writes and rotates $LOG itself; what reaches stdout and stderr
	# (a panic, a refused start) goes to a file of its own.
	nohup "$BIN" run --home "$HOME_DIR" >>"$ERRLOG" 2>&1 </dev/null &
	echo "$!" >"$PIDFILE"
	say "started dojo-box in the background (pid $!, log $LOG)"
}

# enroll writes the config, unless an earlier run already did, and sets
# AGENT_ID and PORT from it.
enroll() {
	if [ -f "$CONFIG" ]; then
		AGENT_ID=$(json_str agent_id <"$CONFIG")
		say "already enrolled as ${AGENT_ID:-?} ($CONFIG): skipping enrollment"
		config_hub=$(json_str hub_url <"$CONFIG")
		if [ "${config_hub%/}" != "$HUB" ]; then
			say "WARNING: $CONFIG belongs to the hub at ${config_hub:-?}, not $HUB, which served this script; the box keeps using ${config_hub:-?} (to move it, stop it, remove $CONFIG and run this again)"
		fi
	else
		say "enrolling with $HUB"
		# The token goes in the body, through stdin: a command line (and so
		# the process list) never holds it.
		if ! reply=$(printf '{"enroll_token":"%s"}' "$TOKEN" | curl -sS -X POST "$HUB/api/v1/agents" \
			-H 'Content-Type: application/json' -d @- -w '\n%{http_code}'); then
			fail "cannot reach the hub at $HUB"
		fi
		status=${reply##*$'\n'}
		body=${reply%$'\n'*}
		if [ "$status" != 201 ]; then
			code=$(printf '%s' "$body" | json_str code)
			message=$(printf '%s' "$body" | json_str message)
			fail "the hub refused enrollment: HTTP $status ${code:-?}: ${message:-no message}"
		fi
		AGENT_ID=$(printf '%s' "$body" | json_str agent_id)
		agent_token=$(printf '%s' "$body" | json_str agent_token)
		secret=$(printf '%s' "$body" | json_str endpoint_secret)
		[[ $AGENT_ID =~ ^[A-Za-z0-9_.-]{1,64}$ ]] || fail "the hub sent an unexpected agent_id"
		[[ $agent_token =~ ^[A-Za-z0-9_]{8,200}$ ]] || fail "the hub sent an unexpected agent_token"
		[[ $secret =~ ^[A-Za-z0-9_]{8,200}$ ]] || fail "the hub sent an unexpected endpoint_secret"
		umask 077
		mkdir -p "$HOME_DIR"
		tmp=$(mktemp "$HOME_DIR/.config.json.XXXXXX")
		printf '{\n  "hub_url": "%s",\n  "agent_id": "%s",\n  "agent_token": "%s",\n  "endpoint_secret": "%s",\n  "listen": ":%s"\n}\n' \
			"$HUB" "$AGENT_ID" "$agent_token" "$secret" "$PORT" >"$tmp"
		chmod 600 "$tmp"
		mv -f "$tmp" "$CONFIG"
		say "enrolled as $AGENT_ID; config written to $CONFIG"
	fi
	umask 077
	listen=$(json_str listen <"$CONFIG")
	PORT=${listen##*:}
	[[ $PORT =~ ^[0-9]{1,5}$ ]] || fail "$CONFIG has no usable listen address (\"$listen\")"
}

# download puts the binary for OS/ARCH in place, unless a working one is.
download() {
	if [ -x "$BIN" ] && "$BIN" version >/dev/null 2>&1; then
		say "dojo-box is installed: $("$BIN" version 2>&1 | head -n 1)"
		return
	fi
	say "downloading dojo-box for $OS/$ARCH"
	mkdir -p "$HOME_DIR/bin"
	# The name starts with dojo-box: a multi-call binary decides by it.
	tmp=$(mktemp "$HOME_DIR/bin/dojo-box.tmp.XXXXXX")
	if ! status=$(curl -sSL -o "$tmp" -w '%{http_code}' "$HUB/install/dojo-box/$OS/$ARCH"); then
		rm -f "$tmp"
		fail "cannot download dojo-box from $HUB"
	fi
	if [ "$status" != 200 ]; then
		message=$(json_str message <"$tmp")
		rm -f "$tmp"
		fail "the hub has no dojo-box for $OS/$ARCH: HTTP $status ${message:-}"
	fi
	chmod 700 "$tmp"
	if ! "$tmp" version >/dev/null 2>&1; then
		rm -f "$tmp"
		fail "the downloaded dojo-box does not run here"
	fi
	mv -f "$tmp" "$BIN"
}

# report waits for the box's health, prints what was installed and how it
# persists (METHOD), and exits 0 only when the box is healthy.
report() {
	health=""
	for _ in $(seq 1 20); do
		if health=$(curl -fsS --max-time 2 "http://127.0.0.1:$PORT/healthz" 2>/dev/null) &&
			[[ $health =~ \"ok\"[[:space:]]*:[[:space:]]*true ]] && [ -n "$(printf '%s' "$health" | json_str agent_id)" ]; then
			break
		fi
		health=""
		sleep 0.5
	done
	# Asked of the hub the box belongs to, with the token on stdin rather
	# than on the command line.
	agent_token=$(json_str agent_token <"$CONFIG")
	config_hub=$(json_str hub_url <"$CONFIG")
	webhook=$(printf 'Authorization: Bearer %s\n' "$agent_token" |
		curl -sS --max-time 5 -H @- "${config_hub%/}/api/v1/agents/$AGENT_ID" 2>/dev/null | json_str webhook_url || true)

	printf '\nKizuna letterbox\n'
	printf '  OS:          %s/%s (%s)\n' "$OS" "$ARCH" "$(uname -sr)"
	printf '  agent_id:    %s\n' "$AGENT_ID"
	printf '  webhook:     %s (the box listens on port %s)\n' "${webhook:-not set on the hub}" "$PORT"
	printf '  persistence: %s\n' "$METHOD"
	if [ -n "$health" ]; then
		printf '  health:      ok %s\n' "$health"
		exit 0
	fi
	printf '  health:      FAILED: nothing healthy on http://127.0.0.1:%s/healthz\n' "$PORT"
	for f in "$LOG" "$ERRLOG"; do
		if [ -s "$f" ]; then
			printf '  last lines of %s:\n' "$f"
			tail -n 5 "$f" | sed 's/^/    /'
		fi
	done
	exit 1
}
