#!/usr/bin/env bash
# Manages a scratch PostgreSQL 15 cluster on loopback for tests, the demo and
# the benchmark. Nothing here touches the system's own cluster.
#
#   scripts/pg.sh start    init (first time) and start; prints the database URL
#   scripts/pg.sh stop     fast shutdown
#   scripts/pg.sh restart  stop + start, keeping the data (fault tests)
#   scripts/pg.sh crash    immediate-mode stop (no checkpoint, as a crash or
#                          a node loss) + start with crash recovery (fault tests)
#   scripts/pg.sh url      print the URL of the billing database
#   scripts/pg.sh status
#
# PG_DIR (default /tmp/billing-pg) holds the cluster, PG_PORT (default 55432)
# is its port. Postgres refuses to run as root, so as root the server runs as
# the "postgres" user. fsync stays on: benchmarks must measure real commits.
set -euo pipefail

PG_DIR=${PG_DIR:-/tmp/billing-pg}
PG_PORT=${PG_PORT:-55432}
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)}
DATA=$PG_DIR/data
URL="postgres://billing:billing@127.0.0.1:$PG_PORT/billing?sslmode=disable"

die() { echo "pg.sh: $*" >&2; exit 1; }

as_owner() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

ensure_installed() {
	if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
		[ "$(id -u)" = 0 ] || die "PostgreSQL server binaries not found; install postgresql-15"
		echo "pg.sh: installing postgresql-15" >&2
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >/dev/null
		PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)
	fi
}

psql_admin() {
	as_owner "$PG_BIN/psql" -h "$PG_DIR" -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt "$@"
}

running() {
	[ -n "$PG_BIN" ] && [ -f "$DATA/postmaster.pid" ] && as_owner "$PG_BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

start() {
	ensure_installed
	if running; then
		echo "$URL"
		return
	fi
	mkdir -p "$PG_DIR"
	if [ "$(id -u)" = 0 ]; then chown postgres: "$PG_DIR"; fi
	if [ ! -f "$DATA/PG_VERSION" ]; then
		as_owner "$PG_BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$PG_DIR/initdb.log" 2>&1 ||
			{ cat "$PG_DIR/initdb.log" >&2; die "initdb failed"; }
		cat >>"$DATA/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_DIR'
max_connections = 300
shared_buffers = 256MB
fsync = on
synchronous_commit = on
log_min_messages = warning
CONF
	fi
	as_owner "$PG_BIN/pg_ctl" -D "$DATA" -l "$PG_DIR/server.log" -w -t 60 start >/dev/null ||
		{ tail -n 30 "$PG_DIR/server.log" >&2; die "postgres did not start"; }
	psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname='billing'" | grep -q 1 ||
		psql_admin -c "CREATE ROLE billing LOGIN CREATEDB PASSWORD 'billing'"
	# Tests drop their databases WITH (FORCE), which must also stop an
	# autovacuum worker found there.
	psql_admin -c "GRANT pg_signal_backend TO billing" >/dev/null
	psql_admin -c "SELECT 1 FROM pg_database WHERE datname='billing'" | grep -q 1 ||
		psql_admin -c "CREATE DATABASE billing OWNER billing"
	echo "$URL"
}

stop() {
	if running; then as_owner "$PG_BIN/pg_ctl" -D "$DATA" -m "${1:-fast}" -w stop >/dev/null; fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
restart) stop; start ;;
crash) stop immediate; start ;;
url) echo "$URL" ;;
status) if running; then echo "running on 127.0.0.1:$PG_PORT"; else echo "stopped"; exit 3; fi ;;
*) die "usage: scripts/pg.sh start|stop|restart|crash|url|status" ;;
esac
