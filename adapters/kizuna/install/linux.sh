#!/usr/bin/env bash
# Installs a Kizuna letterbox (dojo-box) on Linux. A Dojo hub serves this
# file with its address, a single-use enroll token and the letterbox port
# filled in. It enrolls FIRST, so a slow download cannot burn the token,
# and it writes nothing when enrollment is refused. Running it again
# resumes: an existing config skips enrollment.

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

unit() { # unit TARGET: a systemd unit that runs the box and restarts it
	cat <<EOF
[Unit]
Description=Kizuna letterbox (dojo-box)
After=network-online.target
Wants=network-online.target

[Service]
ExecStart="$BIN" run --home "$HOME_DIR"
Restart=always
RestartSec=5
NoNewPrivileges=yes

[Install]
WantedBy=$1
EOF
}

# main runs once bash has read the whole script: piped into bash, a
# command reading stdin could otherwise eat the rest of it.
main() {
	command -v curl >/dev/null 2>&1 || fail "curl is needed: install it and run this again"

	case "$(uname -s)" in
	Linux) OS=linux ;;
	*) fail "unsupported platform: $(uname -s); this script is for Linux" ;;
	esac
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
	if systemctl --user show-environment >/dev/null 2>&1; then
		dir="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
		mkdir -p "$dir"
		unit default.target >"$dir/dojo-box.service"
		systemctl --user daemon-reload
		systemctl --user enable dojo-box.service >/dev/null 2>&1
		systemctl --user restart dojo-box.service || say "systemd could not start dojo-box: see journalctl --user -u dojo-box"
		# A user unit stops at logout and waits for a login after boot, unless
		# the user lingers.
		if command -v loginctl >/dev/null 2>&1 && loginctl enable-linger "$(id -un)" >/dev/null 2>&1; then
			METHOD="systemd user unit $dir/dojo-box.service (enabled, lingering: starts at boot)"
		else
			say "could not turn on lingering for $(id -un): the box starts at login, not at boot; an administrator can run: loginctl enable-linger $(id -un)"
			METHOD="systemd user unit $dir/dojo-box.service (enabled; starts at login, not at boot: lingering is off)"
		fi
	elif [ "$(id -u)" = 0 ] && systemctl show-environment >/dev/null 2>&1; then
		unit multi-user.target >/etc/systemd/system/dojo-box.service
		chmod 644 /etc/systemd/system/dojo-box.service
		systemctl daemon-reload
		systemctl enable dojo-box.service >/dev/null 2>&1
		systemctl restart dojo-box.service || say "systemd could not start dojo-box: see journalctl -u dojo-box"
		METHOD="systemd system unit /etc/systemd/system/dojo-box.service (enabled)"
	else
		say "no service manager here (container?): starting in the background"
		start_background
		METHOD="background process (pid $(cat "$PIDFILE"); not restarted on crash or boot: run this script again)"
	fi

	report
}

main "$@"
