#!/usr/bin/env bash
# Makes sure promtool is on PATH, for deploy/'s TestPromtool (alert rules
# checked and unit-tested by Prometheus itself). Debian's prometheus
# package ships it; the package's service is never started: a policy-rc.d
# that refuses every start is in place during the install when none exists.
# Prints promtool's version.
set -euo pipefail
if ! command -v promtool >/dev/null 2>&1; then
	if [ "$(id -u)" != 0 ]; then
		echo "promtool.sh: promtool is missing; run as root, or: sudo apt-get install --no-install-recommends prometheus" >&2
		exit 1
	fi
	policy=/usr/sbin/policy-rc.d
	created=
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod +x "$policy"
		created=1
	fi
	trap '[ -n "$created" ] && rm -f "$policy"' EXIT
	echo "promtool.sh: installing Debian's prometheus package for promtool" >&2
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2
fi
promtool --version 2>&1 | head -1
