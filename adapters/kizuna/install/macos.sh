#!/usr/bin/env bash
# Installs a Kizuna letterbox (dojo-box) on macOS. A Dojo hub serves this
# file with its address, a single-use enroll token and the letterbox port
# filled in. It enrolls FIRST, so a slow download cannot burn the token,
# and it writes nothing when enrollment is refused. Running it again
# resumes: an existing config skips enrollment.

# What linux.sh, macos.sh and termux.sh share (common.sh): the hub puts it
# here when it serves the script.
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# is_box PID: PID is alive and is a dojo-box.
is_box() {
	kill -0 "$1" 2>/dev/null || return 1
	ps -p "$1" -o command= 2>/dev/null | grep -q dojo-box
}

LABEL=org.dojo.box

# plist is the launchd job: started at login, restarted whenever it exits.
# The box writes and rotates its own log; launchd's files get only what
# reaches stdout and stderr (a panic, a refused start).
plist() {
	cat <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
	<key>Label</key>
	<string>$LABEL</string>
	<key>ProgramArguments</key>
	<array>
		<string>$BIN</string>
		<string>run</string>
		<string>--home</string>
		<string>$HOME_DIR</string>
	</array>
	<key>RunAtLoad</key>
	<true/>
	<key>KeepAlive</key>
	<true/>
	<key>StandardOutPath</key>
	<string>$ERRLOG</string>
	<key>StandardErrorPath</key>
	<string>$ERRLOG</string>
</dict>
</plist>
EOF
}

# main runs once bash has read the whole script: piped into bash, a
# command reading stdin could otherwise eat the rest of it.
main() {
	command -v curl >/dev/null 2>&1 || fail "curl is needed: install it and run this again"

	case "$(uname -s)" in
	Darwin) OS=darwin ;;
	*) fail "unsupported platform: $(uname -s); this script is for macOS" ;;
	esac
	case "$(uname -m)" in
	x86_64) ARCH=amd64 ;;
	arm64) ARCH=arm64 ;;
	*) fail "unsupported architecture: $(uname -m)" ;;
	esac

	paths
	case "$HOME_DIR" in
	*[\"\\%\$\`\&\<\>$'\n']*) fail "the letterbox directory $HOME_DIR has a character a service file cannot hold" ;;
	esac

	enroll
	download

	# Crash restart and start at boot, by the service manager when there is one.
	uid=$(id -u)
	agents="$HOME/Library/LaunchAgents"
	if command -v launchctl >/dev/null 2>&1 && mkdir -p "$agents" "$HOME_DIR/logs"; then
		plist >"$agents/$LABEL.plist"
		if launchctl print "gui/$uid/$LABEL" >/dev/null 2>&1; then
			launchctl kickstart "gui/$uid/$LABEL" >/dev/null 2>&1 || true
			METHOD="launchd agent $agents/$LABEL.plist (already loaded; RunAtLoad, KeepAlive)"
		elif launchctl bootstrap "gui/$uid" "$agents/$LABEL.plist" 2>/dev/null ||
			launchctl load -w "$agents/$LABEL.plist" 2>/dev/null; then
			METHOD="launchd agent $agents/$LABEL.plist (loaded; RunAtLoad, KeepAlive)"
		else
			say "launchd refused the job: starting in the background"
			start_background
			METHOD="background process (pid $(cat "$PIDFILE"); launchd refused $agents/$LABEL.plist)"
		fi
	else
		say "no launchd here: starting in the background"
		start_background
		METHOD="background process (pid $(cat "$PIDFILE"); not restarted on crash or boot: run this script again)"
	fi

	report
}

main "$@"
