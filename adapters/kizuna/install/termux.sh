#!/usr/bin/env bash
# Installs a Kizuna letterbox (dojo-box) in Termux on Android. A Dojo hub
# serves this file with its address, a single-use enroll token and the
# letterbox port filled in. It enrolls FIRST, so a slow download cannot
# burn the token, and it writes nothing when enrollment is refused.
# Running it again resumes: an existing config skips enrollment.

# What linux.sh, macos.sh and termux.sh share (common.sh): the hub puts it
# here when it serves the script.
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# is_box PID: PID is alive and, where /proc tells, is a dojo-box.
is_box() {
	kill -0 "$1" 2>/dev/null || return 1
	[ -r "/proc/$1/cmdline" ] || return 0
	tr '\0' ' ' <"/proc/$1/cmdline" | grep -q dojo-box
}

# boot_script is what Termux:Boot runs after the phone starts: with
# termux-services the profile starts runsvdir, which starts the box.
boot_script() {
	printf '#!%s/bin/sh\n# Starts the Kizuna letterbox after boot (written by the dojo-box installer).\ntermux-wake-lock\n' "$PREFIX"
	if [ "$1" = sv ]; then
		printf '. "%s/etc/profile"\n' "$PREFIX"
	else
		printf 'nohup "%s" run --home "%s" >>"%s" 2>&1 </dev/null &\necho "$!" >"%s"\n' "$BIN" "$HOME_DIR" "$ERRLOG" "$PIDFILE"
	fi
}

# main runs once bash has read the whole script: piped into bash, a
# command reading stdin could otherwise eat the rest of it.
main() {
	command -v curl >/dev/null 2>&1 || fail "curl is needed: install it and run this again"

	if [ -z "${TERMUX_VERSION:-}" ] && [ ! -d /data/data/com.termux/files ]; then
		fail "unsupported platform: this script is for Termux on Android ($(uname -s) here)"
	fi
	OS=android
	PREFIX="${PREFIX:-/data/data/com.termux/files/usr}"
	case "$(uname -m)" in
	x86_64 | amd64) ARCH=amd64 ;;
	aarch64 | arm64) ARCH=arm64 ;;
	armv6* | armv7* | armv8l | arm) ARCH=arm ;;
	i386 | i486 | i586 | i686) ARCH=386 ;;
	*) fail "unsupported architecture: $(uname -m)" ;;
	esac

	paths
	case "$HOME_DIR" in
	*[\"\\%\$\`$'\n']*) fail "the letterbox directory $HOME_DIR has a character a service file cannot hold" ;;
	esac

	enroll
	download

	# Crash restart and start at boot, by the service manager when there is one.
	svc="$PREFIX/var/service/dojo-box"
	if command -v sv-enable >/dev/null 2>&1 && [ -d "$PREFIX/var/service" ]; then
		mkdir -p "$svc/log"
		printf '#!%s/bin/sh\nexec "%s" run --home "%s" 2>&1\n' "$PREFIX" "$BIN" "$HOME_DIR" >"$svc/run"
		chmod 700 "$svc/run"
		ln -sf "$PREFIX/share/termux-services/svlogger" "$svc/log/run"
		# runsvdir notices a new service within a few seconds.
		for _ in $(seq 1 10); do
			sv-enable dojo-box >/dev/null 2>&1 && break
			sleep 1
		done
		mode=sv
		METHOD="termux-services ($svc, sv-enable)"
	else
		say "termux-services is not installed (pkg install termux-services): starting in the background"
		start_background
		mode=background
		METHOD="background process (pid $(cat "$PIDFILE"))"
	fi
	mkdir -p "$HOME/.termux/boot"
	boot_script "$mode" >"$HOME/.termux/boot/dojo-box"
	chmod 700 "$HOME/.termux/boot/dojo-box"
	METHOD="$METHOD; at boot: $HOME/.termux/boot/dojo-box (needs the Termux:Boot app, opened once)"

	report
}

main "$@"
