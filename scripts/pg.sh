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
#   scripts/pg.sh standby ...  a primary and a streaming standby (see below)
#
# PG_DIR (default /tmp/billing-pg) holds the cluster, PG_PORT (default 55432)
# is its port. Postgres refuses to run as root, so as root the server runs as
# the "postgres" user. fsync stays on: benchmarks must measure real commits.
#
# Standby mode, for failover tests (issue 30): a primary and a streaming
# standby made from it with pg_basebackup, both on loopback.
#
#   scripts/pg.sh standby start [async|sync]
#       init (first time) and start both; prints the URL naming both hosts
#       with target_session_attrs=read-write, which pgx follows to whichever
#       accepts writes. sync sets the primary's synchronous_standby_names to
#       the standby: a commit returns once the standby has flushed it.
#   scripts/pg.sh standby url | primary-url | standby-url
#   scripts/pg.sh standby pause-receiver    SIGSTOP the standby's WAL receiver
#                                           (a slow link: the standby lags)
#   scripts/pg.sh standby resume-receiver   SIGCONT it
#   scripts/pg.sh standby kill-receiver     SIGKILL the standby's WAL receiver
#       (stopped or not): the WAL in the socket buffers between the two
#       (megabytes on loopback, which a stopped receiver lets fill) is lost,
#       as behind a slow link to a primary that dies. The standby's
#       postmaster takes it for a crash and restarts its recovery, keeping
#       the WAL the receiver had written.
#   scripts/pg.sh standby kill-primary      SIGKILL the primary's postmaster and
#       every child at once, as a node dies. Killing the postmaster alone
#       would let its walsender ship the rest of the WAL to the standby.
#   scripts/pg.sh standby promote           resume the receiver if it is
#       stopped, promote the standby and wait until it accepts writes
#   scripts/pg.sh standby status            each node's role and replication
#   scripts/pg.sh standby stop              immediate stop of both
#
# PG_DIR (default /tmp/billing-pg-standby) holds both clusters; PG_PORT and
# PG_STANDBY_PORT are their ports (default: free ports picked at the first
# start, kept in $PG_DIR/ports). A pair that has failed over is not
# restarted as a pair: stop it and remove PG_DIR.
set -euo pipefail

PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)}
if [ "${1:-}" = standby ]; then
	PG_DIR=${PG_DIR:-/tmp/billing-pg-standby}
	# The primary is the ordinary cluster of this script in $PG_DIR/data
	# (start below makes it); its port is set by standby_ports.
	PG_PORT=${PG_PORT:-}
	PG_STANDBY_PORT=${PG_STANDBY_PORT:-}
else
	PG_DIR=${PG_DIR:-/tmp/billing-pg}
	PG_PORT=${PG_PORT:-55432}
fi
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
	# The bench starts each phase at a checkpoint (cmd/billing-bench).
	psql_admin -c "GRANT pg_checkpoint TO billing" >/dev/null
	psql_admin -c "SELECT 1 FROM pg_database WHERE datname='billing'" | grep -q 1 ||
		psql_admin -c "CREATE DATABASE billing OWNER billing"
	echo "$URL"
}

stop() {
	if running; then as_owner "$PG_BIN/pg_ctl" -D "$DATA" -m "${1:-fast}" -w stop >/dev/null; fi
}

# ---- standby mode ----------------------------------------------------------

STANDBY=$PG_DIR/standby
# The name the standby's WAL receiver gives the primary, which sync mode
# lists in synchronous_standby_names.
STANDBY_NAME=billing_standby

# free_port prints a loopback port nothing listens on now.
free_port() {
	local p
	for _ in $(seq 100); do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
	die "no free port found"
}

# standby_ports sets PG_PORT and PG_STANDBY_PORT: those of an existing pair
# ($PG_DIR/ports), else the environment's, else free ones; and the URLs.
standby_ports() {
	if [ -f "$PG_DIR/ports" ]; then
		# shellcheck disable=SC1091
		. "$PG_DIR/ports"
	else
		PG_PORT=${PG_PORT:-$(free_port)}
		PG_STANDBY_PORT=${PG_STANDBY_PORT:-$(free_port)}
		[ "$PG_PORT" != "$PG_STANDBY_PORT" ] || PG_STANDBY_PORT=$(free_port)
	fi
	URL="postgres://billing:billing@127.0.0.1:$PG_PORT/billing?sslmode=disable"
	STANDBY_URL="postgres://billing:billing@127.0.0.1:$PG_STANDBY_PORT/billing?sslmode=disable"
	PAIR_URL="postgres://billing:billing@127.0.0.1:$PG_PORT,127.0.0.1:$PG_STANDBY_PORT/billing?sslmode=disable&target_session_attrs=read-write"
}

psql_standby() {
	as_owner "$PG_BIN/psql" -h "$PG_DIR" -p "$PG_STANDBY_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt "$@"
}

standby_running() {
	[ -f "$STANDBY/postmaster.pid" ] && as_owner "$PG_BIN/pg_ctl" -D "$STANDBY" status >/dev/null 2>&1
}

# poll runs "$@" every 100 ms until it succeeds, for up to 60 s.
poll() {
	for _ in $(seq 600); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 0.1
	done
	return 1
}

streaming() {
	psql_admin -c "SELECT 1 FROM pg_stat_replication WHERE application_name = '$STANDBY_NAME' AND state = 'streaming'" | grep -q 1
}

synchronous() {
	psql_admin -c "SELECT 1 FROM pg_stat_replication WHERE application_name = '$STANDBY_NAME' AND sync_state = 'sync'" | grep -q 1
}

standby_start() {
	local mode=${1:-async}
	case "$mode" in async | sync) ;; *) die "standby start: mode must be async or sync, not $mode" ;; esac
	ensure_installed
	standby_ports
	if [ -f "$PG_DIR/mode" ] && [ "$(cat "$PG_DIR/mode")" != "$mode" ]; then
		die "$PG_DIR holds a $(cat "$PG_DIR/mode") pair; stop it and remove $PG_DIR for a $mode one"
	fi
	mkdir -p "$PG_DIR"
	printf 'PG_PORT=%s\nPG_STANDBY_PORT=%s\n' "$PG_PORT" "$PG_STANDBY_PORT" >"$PG_DIR/ports"
	echo "$mode" >"$PG_DIR/mode"
	start >/dev/null # the primary: the ordinary cluster of this script
	# WAL kept for a standby that lags (its receiver stopped on purpose).
	psql_admin -c "ALTER SYSTEM SET wal_keep_size = '256MB'" -c "SELECT pg_reload_conf()" >/dev/null
	# The service's role may read its standbys' sync state
	# (billing_postgres_sync_standbys), as a monitoring role would.
	psql_admin -c "GRANT pg_read_all_stats TO billing" >/dev/null
	if [ ! -f "$STANDBY/PG_VERSION" ]; then
		as_owner "$PG_BIN/pg_basebackup" -h "$PG_DIR" -p "$PG_PORT" -U postgres -D "$STANDBY" -X stream -c fast -R \
			>"$PG_DIR/basebackup.log" 2>&1 || { cat "$PG_DIR/basebackup.log" >&2; die "pg_basebackup failed"; }
		# postgresql.auto.conf overrides postgresql.conf (copied from the
		# primary): the standby's own port, a named WAL receiver, and no
		# synchronous standby of its own, so that once promoted it does
		# not wait for one it cannot have (its commits would hang); and a
		# quick retry of a lost primary (5 s by default), which a promotion
		# would otherwise wait out.
		cat >>"$STANDBY/postgresql.auto.conf" <<CONF
port = $PG_STANDBY_PORT
primary_conninfo = 'host=127.0.0.1 port=$PG_PORT user=postgres application_name=$STANDBY_NAME'
synchronous_standby_names = ''
wal_retrieve_retry_interval = '100ms'
CONF
	fi
	if ! standby_running; then
		as_owner "$PG_BIN/pg_ctl" -D "$STANDBY" -l "$PG_DIR/standby.log" -w -t 60 start >/dev/null ||
			{ tail -n 30 "$PG_DIR/standby.log" >&2; die "the standby did not start"; }
	fi
	poll streaming || die "the standby does not stream from the primary (see $PG_DIR/standby.log)"
	if [ "$mode" = sync ]; then
		psql_admin -c "ALTER SYSTEM SET synchronous_standby_names = '$STANDBY_NAME'" -c "SELECT pg_reload_conf()" >/dev/null
		poll synchronous || die "the standby did not become synchronous"
	fi
	echo "$PAIR_URL"
}

# receiver_pid prints the pid of the standby's WAL receiver (none: empty).
receiver_pid() {
	local pm
	pm=$(head -n1 "$STANDBY/postmaster.pid")
	ps -o pid=,args= --ppid "$pm" | awk '/walreceiver/ { print $1 }'
}

standby_signal_receiver() {
	local pid
	pid=$(receiver_pid)
	[ -n "$pid" ] || die "the standby has no WAL receiver"
	kill "-$1" "$pid"
}

# alive tells whether process $1 runs: a killed one may stay a zombie
# until its parent (init, in a container whatever runs as pid 1) reaps it.
# No process is started (kill_primary's timing depends on it).
alive() {
	local st
	[ -r "/proc/$1/stat" ] && read -r st <"/proc/$1/stat" 2>/dev/null || return 1
	st=${st##*) }
	[ "${st:0:1}" != Z ]
}

# kill_primary kills the primary's postmaster and every child of it. Each
# child is a process group of its own (Postgres calls setsid in every
# child), so no single kill reaches them all: all are stopped first, in
# one kill call, so that none (the walsender above all) runs on while the
# others die, then killed. It reads the children from /proc and starts no
# process before the kill: on a busy machine each would take its time
# while the primary goes on committing.
kill_primary() {
	[ -f "$DATA/postmaster.pid" ] || die "the primary is not running"
	local pm kids=() shm
	read -r pm <"$DATA/postmaster.pid"
	alive "$pm" || die "the primary is not running"
	children() {
		kids=()
		if [ -r "/proc/$pm/task/$pm/children" ]; then
			read -r -a kids <"/proc/$pm/task/$pm/children" || true
		else
			mapfile -t kids < <(ps -o pid= --ppid "$pm")
		fi
	}
	children
	kill -STOP "$pm" "${kids[@]}" 2>/dev/null || true
	# A child forked between the listing and the stop, now stopped too.
	children
	kill -KILL "$pm" "${kids[@]}" 2>/dev/null || true
	for _ in $(seq 100); do
		alive "$pm" || break
		sleep 0.02
	done
	! alive "$pm" || die "the primary's postmaster $pm survived SIGKILL"
	# The primary's System V segment (line 7 of postmaster.pid: key, id) has
	# no process attached any more; nothing else would remove it.
	shm=$(sed -n 7p "$DATA/postmaster.pid" | awk '{ print $2 }')
	if [ -n "$shm" ]; then ipcrm -m "$shm" 2>/dev/null || true; fi
}

promote() {
	local pid
	pid=$(receiver_pid)
	# A stopped receiver would never exit, and promotion waits for it. The
	# one listed may have exited since (killed by kill-receiver, or the
	# startup process restarting it): that is not a failure.
	if [ -n "$pid" ]; then kill -CONT "$pid" 2>/dev/null || true; fi
	as_owner "$PG_BIN/pg_ctl" -D "$STANDBY" -w -t 60 promote >/dev/null || die "promotion failed"
	psql_standby -c "SELECT pg_is_in_recovery()" | grep -q f || die "the promoted standby is still in recovery"
}

standby_status() {
	local role
	for node in primary standby; do
		if [ $node = primary ]; then
			primary_alive && role=$(psql_admin -c "SELECT CASE WHEN pg_is_in_recovery() THEN 'standby' ELSE 'primary' END") || role=down
			echo "primary   127.0.0.1:$PG_PORT: $role"
			[ "$role" = down ] || psql_admin -c "SELECT '  replication: ' || application_name || ' ' || state || ' ' || sync_state FROM pg_stat_replication"
		else
			standby_running && role=$(psql_standby -c "SELECT CASE WHEN pg_is_in_recovery() THEN 'standby' ELSE 'primary' END") || role=down
			echo "standby   127.0.0.1:$PG_STANDBY_PORT: $role"
		fi
	done
}

primary_alive() {
	local pm
	[ -f "$DATA/postmaster.pid" ] && read -r pm <"$DATA/postmaster.pid" && alive "$pm"
}

standby_stop() {
	if standby_running; then as_owner "$PG_BIN/pg_ctl" -D "$STANDBY" -m immediate -w stop >/dev/null; fi
	# A killed primary may linger as a zombie, which pg_ctl takes for a
	# server that never stops.
	if primary_alive; then stop immediate; fi
}

standby_cmd() {
	standby_ports
	case "${1:-}" in
	start) standby_start "${2:-async}" ;;
	url) echo "$PAIR_URL" ;;
	primary-url) echo "$URL" ;;
	standby-url) echo "$STANDBY_URL" ;;
	pause-receiver) standby_signal_receiver STOP ;;
	kill-receiver) standby_signal_receiver KILL ;;
	resume-receiver) standby_signal_receiver CONT ;;
	kill-primary) kill_primary ;;
	promote) promote ;;
	status) standby_status ;;
	stop) standby_stop ;;
	*) die "usage: scripts/pg.sh standby start [async|sync]|url|primary-url|standby-url|pause-receiver|resume-receiver|kill-receiver|kill-primary|promote|status|stop" ;;
	esac
}

case "${1:-}" in
standby) shift; standby_cmd "$@" ;;
start) start ;;
stop) stop ;;
restart) stop; start ;;
crash) stop immediate; start ;;
url) echo "$URL" ;;
status) if running; then echo "running on 127.0.0.1:$PG_PORT"; else echo "stopped"; exit 3; fi ;;
*) die "usage: scripts/pg.sh start|stop|restart|crash|url|status|standby ..." ;;
esac
