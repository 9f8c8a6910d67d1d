#!/usr/bin/env bash
# scripts/kafka.sh — a real single-node Apache Kafka (KRaft, combined
# broker+controller) on loopback, for integration / fault tests and CI.
#
# No Docker and no Kafka tarball: the broker's jars come from Maven Central
# (scripts/kafka/pom.xml, `mvn dependency:copy-dependencies`) and are cached
# in $KAFKA_CACHE, so a warm start only launches a JVM.
#
# Usage: scripts/kafka.sh <command> [args]
#
#   start       fetch jars if needed, format a FRESH data dir (new random
#               cluster id, all previous data deleted), start the broker in the
#               background and wait until it serves metadata. Prints the
#               bootstrap address (alone, on stdout). Already running: says so,
#               prints the address, exits 0.
#   stop        graceful stop (SIGTERM, controlled shutdown), SIGKILL after
#               $KAFKA_STOP_TIMEOUT seconds. Keeps the data dir.
#   restart     stop (if running) + start KEEPING the data dir (topics,
#               messages, committed offsets survive). Formats only if the data
#               dir was never formatted.
#   kill        SIGKILL the broker (crash; `restart` then recovers the log).
#   pause       SIGSTOP the broker (hung broker: connections stay open, no replies).
#   resume      SIGCONT a paused broker.
#   status      running/stopped, pid, address, dirs. Exit 0 if running and
#               serving, 3 if not running, 1 if running but not answering.
#   fetch       only fetch the jars into $KAFKA_CACHE.
#   version     print the Kafka version used.
#   bootstrap   print the bootstrap address.
#   topics ...  run org.apache.kafka.tools.TopicCommand against the broker
#               (--bootstrap-server is added), e.g.
#                 scripts/kafka.sh topics --create --topic t --partitions 3
#   groups ...  run org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
#               (--bootstrap-server is added), e.g.
#                 scripts/kafka.sh groups --describe --group g
#   run-class CLASS [args]   run any class on the Kafka classpath.
#   logs [N]    last N (default 100) lines of the broker log.
#
# Environment (defaults):
#   KAFKA_VERSION         4.4.0
#   KAFKA_CACHE           $HOME/.cache/billing-consumer/kafka-$KAFKA_VERSION  (jars)
#   KAFKA_DIR             /tmp/billing-kafka   (server.properties, data/, broker.log, kafka.pid)
#   KAFKA_HOST            127.0.0.1
#   KAFKA_PORT            19092                PLAINTEXT listener (clients)
#   KAFKA_CONTROLLER_PORT $KAFKA_PORT+1        CONTROLLER listener (KRaft)
#   KAFKA_HEAP_OPTS       -Xms256m -Xmx512m
#   KAFKA_JVM_OPTS        (extra JVM flags)
#   KAFKA_EXTRA_CONFIG    extra server.properties lines, newline separated,
#                         appended last (so they override the defaults)
#   KAFKA_START_TIMEOUT   90   seconds to wait for readiness
#   KAFKA_STOP_TIMEOUT    30   seconds to wait for a graceful stop
#   KAFKA_WARMUP_GROUP    kafka-sh-warmup  readiness also waits for the group
#                         coordinator of this (never joined) group, which creates
#                         __consumer_offsets; set empty to skip
#   JAVA                  java (or $JAVA_HOME/bin/java)
#   MVN                   mvn
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ASSETS="$SCRIPT_DIR/kafka"

KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
KAFKA_CACHE="${KAFKA_CACHE:-${HOME:-/root}/.cache/billing-consumer/kafka-$KAFKA_VERSION}"
KAFKA_DIR="${KAFKA_DIR:-/tmp/billing-kafka}"
KAFKA_HOST="${KAFKA_HOST:-127.0.0.1}"
KAFKA_PORT="${KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}"
KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"
KAFKA_JVM_OPTS="${KAFKA_JVM_OPTS:-}"
KAFKA_EXTRA_CONFIG="${KAFKA_EXTRA_CONFIG:-}"
KAFKA_START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
KAFKA_STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
KAFKA_WARMUP_GROUP="${KAFKA_WARMUP_GROUP-kafka-sh-warmup}"
MVN="${MVN:-mvn}"
if [[ -n "${JAVA:-}" ]]; then :
elif [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then JAVA="$JAVA_HOME/bin/java"
else JAVA=java; fi

BOOTSTRAP="$KAFKA_HOST:$KAFKA_PORT"
DATA_DIR="$KAFKA_DIR/data"
PID_FILE="$KAFKA_DIR/kafka.pid"
LOG_FILE="$KAFKA_DIR/broker.log"
CONF_FILE="$KAFKA_DIR/server.properties"
TOOLS_CONF="$KAFKA_DIR/tools.properties"
MARKER="$KAFKA_CACHE/.fetched"

log() { echo "kafka.sh: $*" >&2; }
die() { echo "kafka.sh: ERROR: $*" >&2; exit 1; }

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; }

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

# ---------------------------------------------------------------- jars ----

pom_sum() { { echo "$KAFKA_VERSION"; cat "$ASSETS/pom.xml"; } | sha256sum | cut -d' ' -f1; }

cache_ok() {
  [[ -f "$MARKER" ]] && [[ "$(cat "$MARKER")" == "$(pom_sum)" ]] \
    && compgen -G "$KAFKA_CACHE/kafka_2.13-$KAFKA_VERSION.jar" >/dev/null
}

fetch() {
  cache_ok && return 0
  command -v "$MVN" >/dev/null 2>&1 || die "'$MVN' (Maven) not found; it is needed once to fetch Kafka $KAFKA_VERSION into $KAFKA_CACHE"
  mkdir -p "$(dirname "$KAFKA_CACHE")"
  # serialize concurrent fetches of the same cache dir
  exec 8>"$KAFKA_CACHE.lock"
  flock 8
  if cache_ok; then exec 8>&-; return 0; fi
  local t0 tmp
  t0="$(now)"
  tmp="$KAFKA_CACHE.tmp.$$"
  rm -rf "$tmp"
  log "fetching Apache Kafka $KAFKA_VERSION jars from Maven Central into $KAFKA_CACHE ..."
  if ! "$MVN" -B -q -f "$ASSETS/pom.xml" \
        -Dkafka.version="$KAFKA_VERSION" \
        -DincludeScope=runtime -DoutputDirectory="$tmp" \
        dependency:copy-dependencies >"$tmp.mvn.log" 2>&1; then
    tail -n 40 "$tmp.mvn.log" >&2 || true
    rm -rf "$tmp" "$tmp.mvn.log"
    die "maven could not fetch org.apache.kafka:kafka_2.13:$KAFKA_VERSION (see above)"
  fi
  rm -f "$tmp.mvn.log"
  [[ -f "$tmp/kafka_2.13-$KAFKA_VERSION.jar" ]] || { rm -rf "$tmp"; die "fetch finished but kafka_2.13-$KAFKA_VERSION.jar is missing"; }
  pom_sum >"$tmp/.fetched"
  rm -rf "$KAFKA_CACHE"
  mv "$tmp" "$KAFKA_CACHE"
  exec 8>&-
  probe_dir >/dev/null
  log "fetched $(ls "$KAFKA_CACHE"/*.jar | wc -l) jars ($(du -sh "$KAFKA_CACHE" | cut -f1)) in $(elapsed "$t0")s"
}

classpath() { echo "$KAFKA_CACHE/*"; }

need_java() {
  command -v "$JAVA" >/dev/null 2>&1 || die "java not found (JAVA=$JAVA); Kafka $KAFKA_VERSION needs Java 17+"
}

# run a Kafka CLI class with quiet logging; stdout is the tool's
run_class() {
  need_java
  fetch
  local cls="$1"; shift
  "$JAVA" -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Dlog4j2.configurationFile="$ASSETS/tools-log4j2.properties" \
    -cp "$(classpath)" "$cls" "$@"
}

# ------------------------------------------------------------- process ----

# pid of our broker if it is alive (and really is a kafka.Kafka JVM), else ""
broker_pid() {
  [[ -f "$PID_FILE" ]] || return 0
  local pid
  pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  if [[ -r "/proc/$pid/cmdline" ]] && ! tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'kafka\.Kafka'; then
    return 0 # pid reused by something else
  fi
  echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

write_tools_conf() {
  cat >"$TOOLS_CONF" <<EOF
request.timeout.ms=5000
default.api.timeout.ms=15000
EOF
}

# Compile scripts/kafka/KafkaReady.java (an AdminClient readiness probe) into
# the cache once. Prints the probe's class dir, or nothing if javac is missing.
probe_dir() {
  local src="$ASSETS/KafkaReady.java" dir="$KAFKA_CACHE/probe" sum
  sum="$(sha256sum "$src" | cut -d' ' -f1)"
  if [[ -f "$dir/KafkaReady.class" && "$(cat "$dir/.sum" 2>/dev/null)" == "$sum" ]]; then
    echo "$dir"; return 0
  fi
  local javac="${JAVAC:-}"
  if [[ -z "$javac" ]]; then
    if [[ -x "$(dirname "$(readlink -f "$(command -v "$JAVA")")")/javac" ]]; then
      javac="$(dirname "$(readlink -f "$(command -v "$JAVA")")")/javac"
    elif command -v javac >/dev/null 2>&1; then javac=javac
    else return 0; fi
  fi
  local tmp="$dir.tmp.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  if "$javac" -nowarn -cp "$(classpath)" -d "$tmp" "$src" >/dev/null 2>&1; then
    echo "$sum" >"$tmp/.sum"
    rm -rf "$dir"; mv "$tmp" "$dir"
    echo "$dir"
  else
    rm -rf "$tmp"
  fi
}

# probe TIMEOUT [WARMUP_GROUP]: broker answers metadata (and the group
# coordinator answers, which creates __consumer_offsets)
probe() {
  local timeout_s="$1" group="${2:-}" dir
  dir="$(probe_dir)"
  if [[ -n "$dir" ]]; then
    timeout $((timeout_s + 10)) "$JAVA" -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
      -Dlog4j2.configurationFile="$ASSETS/tools-log4j2.properties" \
      -Dlog4j2.level=ERROR \
      -cp "$dir:$(classpath)" KafkaReady "$BOOTSTRAP" "$timeout_s" ${group:+"$group"}
  else
    # fallback without javac: TopicCommand --list proves metadata is served
    [[ -f "$TOOLS_CONF" ]] || write_tools_conf
    timeout $((timeout_s + 10)) "$JAVA" -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
      -Dlog4j2.configurationFile="$ASSETS/tools-log4j2.properties" \
      -cp "$(classpath)" org.apache.kafka.tools.TopicCommand \
      --bootstrap-server "$BOOTSTRAP" --command-config "$TOOLS_CONF" --list >/dev/null
  fi
}

serving() { port_open "$KAFKA_HOST" "$KAFKA_PORT" && probe 3 >/dev/null 2>&1; }

write_config() {
  cat >"$CONF_FILE" <<EOF
# generated by scripts/kafka.sh — single-node KRaft, combined broker+controller
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$KAFKA_HOST:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://$KAFKA_HOST:$KAFKA_PORT,CONTROLLER://$KAFKA_HOST:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$KAFKA_HOST:$KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DATA_DIR

num.partitions=3
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
delete.topic.enable=true

offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# let tests use short consumer session timeouts (kafka-go SessionTimeout,
# default 30s): after a broker restart a member whose LeaveGroup was lost
# blocks every new JoinGroup until its session expires
group.min.session.timeout.ms=500

# after a crash (kafka.sh kill), the restarted broker can only re-register once the
# controller has expired its old session (default 9s); heartbeat faster
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=4000

# small and fast for tests
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.segment.bytes=16777216
log.retention.check.interval.ms=300000
EOF
  if [[ -n "$KAFKA_EXTRA_CONFIG" ]]; then
    printf '\n# KAFKA_EXTRA_CONFIG\n%s\n' "$KAFKA_EXTRA_CONFIG" >>"$CONF_FILE"
  fi
}

format_storage() {
  local cid
  # a Kafka cluster id is a base64url-encoded 16-byte UUID (22 chars); like
  # Kafka's Uuid.randomUuid(), avoid a leading '-' (the CLI parser takes it
  # for an option)
  cid="-"
  while [[ "$cid" == -* ]]; do
    cid="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
  done
  rm -rf "$DATA_DIR"
  mkdir -p "$DATA_DIR"
  if ! run_class kafka.tools.StorageTool format --ignore-formatted \
        -t "$cid" -c "$CONF_FILE" >"$KAFKA_DIR/format.log" 2>&1; then
    cat "$KAFKA_DIR/format.log" >&2
    die "kafka-storage format failed"
  fi
  log "formatted $DATA_DIR (cluster id $cid)"
}

LOG_MARK=0 # line count of broker.log before this launch

show_log_tail() {
  echo "----- $LOG_FILE (last 40 lines of this start) -----" >&2
  tail -n +"$((LOG_MARK + 1))" "$LOG_FILE" 2>/dev/null | tail -n 40 >&2 || true
  echo "-----" >&2
}

startup_failed_if_dead() {
  kill -0 "$1" 2>/dev/null && return 0
  rm -f "$PID_FILE"
  show_log_tail
  die "broker process exited during startup (log: $LOG_FILE)"
}

startup_timeout() {
  show_log_tail
  stop_broker >/dev/null 2>&1 || true
  die "broker not serving on $BOOTSTRAP after ${KAFKA_START_TIMEOUT}s ($1); stopped it (log: $LOG_FILE)"
}

check_ports_free() {
  if port_open "$KAFKA_HOST" "$KAFKA_PORT"; then
    die "$BOOTSTRAP is already in use by another process (not the broker in $KAFKA_DIR); set KAFKA_PORT"
  fi
  if port_open "$KAFKA_HOST" "$KAFKA_CONTROLLER_PORT"; then
    die "controller port $KAFKA_HOST:$KAFKA_CONTROLLER_PORT is already in use; set KAFKA_CONTROLLER_PORT"
  fi
}

launch_and_wait() {
  local t0="$1" pid tl tp
  tl="$(now)"
  LOG_MARK=0
  if [[ -f "$LOG_FILE" ]]; then LOG_MARK="$(wc -l <"$LOG_FILE")"; fi
  {
    echo "===== $(date -u +%FT%TZ) kafka.sh starting Kafka $KAFKA_VERSION on $BOOTSTRAP ====="
  } >>"$LOG_FILE"
  # setsid: own session, so ^C / process-group kills of the caller (go test)
  # don't take the broker down; the inner shell records its pid and execs java.
  rm -f "$PID_FILE"
  # shellcheck disable=SC2016,SC2086
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' kafka-launch "$PID_FILE" \
    "$JAVA" $KAFKA_HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$ASSETS/log4j2.properties" \
    $KAFKA_JVM_OPTS \
    -cp "$(classpath)" kafka.Kafka "$CONF_FILE" \
    >>"$LOG_FILE" 2>&1 </dev/null 8>&- 9>&- &
  local i
  for i in $(seq 1 100); do [[ -s "$PID_FILE" ]] && break; sleep 0.02; done
  pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || die "could not launch the broker JVM"

  local deadline=$(( $(date +%s) + KAFKA_START_TIMEOUT )) left
  # cheap wait for the listener socket, watching the process
  while ! port_open "$KAFKA_HOST" "$KAFKA_PORT"; do
    startup_failed_if_dead "$pid"
    if (( $(date +%s) >= deadline )); then
      startup_timeout "port $KAFKA_PORT never opened"
    fi
    sleep 0.1
  done
  tp="$(now)"
  # then a real metadata round trip (+ group coordinator warm-up)
  while :; do
    left=$(( deadline - $(date +%s) )); (( left < 1 )) && left=1
    if probe "$left" "$KAFKA_WARMUP_GROUP" 2>"$KAFKA_DIR/probe.log"; then
      break
    fi
    startup_failed_if_dead "$pid"
    if (( $(date +%s) >= deadline )); then
      cat "$KAFKA_DIR/probe.log" >&2 || true
      startup_timeout "no metadata answer"
    fi
    sleep 0.3
  done
  log "Kafka $KAFKA_VERSION ready on $BOOTSTRAP (pid $pid, data $DATA_DIR, log $LOG_FILE) in $(elapsed "$t0")s [listener up after $(awk -v a="$tl" -v b="$tp" 'BEGIN{printf "%.1f", b-a}')s, probe $(elapsed "$tp")s]"
  echo "$BOOTSTRAP"
}

stop_broker() {
  local pid
  pid="$(broker_pid)"
  if [[ -z "$pid" ]]; then
    rm -f "$PID_FILE"
    log "not running"
    return 0
  fi
  local t0; t0="$(now)"
  kill -CONT "$pid" 2>/dev/null || true # in case it was paused
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$(( $(date +%s) + KAFKA_STOP_TIMEOUT ))
  while kill -0 "$pid" 2>/dev/null; do
    if (( $(date +%s) >= deadline )); then
      log "no graceful stop after ${KAFKA_STOP_TIMEOUT}s; SIGKILL $pid"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
    fi
    sleep 0.1
  done
  rm -f "$PID_FILE"
  log "stopped (pid $pid) in $(elapsed "$t0")s"
}

lock_dir() {
  mkdir -p "$KAFKA_DIR"
  exec 9>"$KAFKA_DIR/.lock"
  flock -w 300 9 || die "could not lock $KAFKA_DIR/.lock"
}

cmd_start() {
  local t0; t0="$(now)"
  need_java
  fetch
  lock_dir
  local pid; pid="$(broker_pid)"
  if [[ -n "$pid" ]]; then
    log "already running (pid $pid) on $BOOTSTRAP"
    echo "$BOOTSTRAP"
    return 0
  fi
  check_ports_free
  write_config
  write_tools_conf
  # fresh broker, fresh log (the previous one is kept as broker.log.1)
  [[ -f "$LOG_FILE" ]] && mv -f "$LOG_FILE" "$LOG_FILE.1"
  format_storage
  launch_and_wait "$t0"
}

cmd_restart() {
  local t0; t0="$(now)"
  need_java
  fetch
  lock_dir
  stop_broker
  check_ports_free
  write_config
  write_tools_conf
  if [[ ! -f "$DATA_DIR/meta.properties" ]]; then
    format_storage
  fi
  launch_and_wait "$t0"
}

cmd_status() {
  local pid; pid="$(broker_pid)"
  echo "version:   $KAFKA_VERSION"
  echo "bootstrap: $BOOTSTRAP"
  echo "dir:       $KAFKA_DIR"
  echo "cache:     $KAFKA_CACHE ($(cache_ok && echo fetched || echo 'not fetched'))"
  if [[ -z "$pid" ]]; then
    echo "state:     stopped"
    return 3
  fi
  if [[ "$(awk '/^State:/{print $2}' "/proc/$pid/status" 2>/dev/null)" == "T" ]]; then
    echo "state:     paused (pid $pid)"
    return 1
  fi
  if serving; then
    echo "state:     running (pid $pid)"
    return 0
  fi
  echo "state:     running but not answering (pid $pid)"
  return 1
}

signal_broker() {
  local sig="$1" pid
  pid="$(broker_pid)"
  [[ -n "$pid" ]] || die "not running"
  kill "-$sig" "$pid"
  log "sent SIG$sig to broker pid $pid"
}

main() {
  local cmd="${1:-}"
  [[ $# -gt 0 ]] && shift
  case "$cmd" in
    start)     cmd_start ;;
    stop)      lock_dir; stop_broker ;;
    restart)   cmd_restart ;;
    kill)      lock_dir; signal_broker KILL
               local pid; pid="$(cat "$PID_FILE" 2>/dev/null || true)"
               while [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
               rm -f "$PID_FILE" ;;
    pause)     signal_broker STOP ;;
    resume)    signal_broker CONT ;;
    status)    cmd_status ;;
    fetch)     local t0; t0="$(now)"; fetch
               log "Kafka $KAFKA_VERSION jars in $KAFKA_CACHE ($(ls "$KAFKA_CACHE"/*.jar | wc -l) jars, $(du -sh "$KAFKA_CACHE" | cut -f1)), $(elapsed "$t0")s" ;;
    version)   echo "$KAFKA_VERSION" ;;
    bootstrap) echo "$BOOTSTRAP" ;;
    topics)    [[ -f "$TOOLS_CONF" ]] || { mkdir -p "$KAFKA_DIR"; write_tools_conf; }
               run_class org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" --command-config "$TOOLS_CONF" "$@" ;;
    groups)    [[ -f "$TOOLS_CONF" ]] || { mkdir -p "$KAFKA_DIR"; write_tools_conf; }
               run_class org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server "$BOOTSTRAP" --command-config "$TOOLS_CONF" "$@" ;;
    run-class) [[ $# -ge 1 ]] || die "usage: $0 run-class CLASS [args...]"
               run_class "$@" ;;
    logs)      tail -n "${1:-100}" "$LOG_FILE" ;;
    -h|--help|help) usage ;;
    "")        usage; exit 2 ;;
    *)         log "unknown command: $cmd"; usage; exit 2 ;;
  esac
}

main "$@"
