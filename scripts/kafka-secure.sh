#!/usr/bin/env bash
# scripts/kafka-secure.sh — a second, secured Apache Kafka broker for the
# security tests (e2e/security_test.go starts it with its own KAFKA_DIR and
# free ports, and stops it). It is scripts/kafka.sh with another data dir,
# other ports and extra server.properties (KAFKA_EXTRA_CONFIG), so it never
# touches the plaintext broker of the other suites. Listeners:
#
#   SASL_SSL   TLS + SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; one user
#              per mechanism, each with its own random password (a client
#              that used the wrong algorithm could not log in)
#   MTLS       TLS that requires a client certificate signed by the test CA
#   PLAINTEXT  for the test harness (producing, verifying) and kafka.sh's
#              readiness probe only; the service under test is never given it
#   CONTROLLER KRaft
#
# Certificates come from openssl: a throw-away CA (2 days), a server
# certificate for 127.0.0.1 and localhost, a client certificate. SCRAM users
# are created after start with Kafka's ConfigCommand on the PLAINTEXT
# listener; PLAIN users live in the listener's JAAS configuration.
#
# Usage: scripts/kafka-secure.sh <command>
#
#   start   new certificates and passwords, a FRESH broker (kafka.sh start),
#           SCRAM users; prints KEY=VALUE lines (below) on stdout, also kept in
#           $KAFKA_DIR/secure.env (mode 600). Already running: prints them.
#   env     print the KEY=VALUE lines of the running broker.
#   stop | status | logs [N] | kill    as scripts/kafka.sh, on this broker.
#
# Output: KAFKA_SECURE_PLAINTEXT, KAFKA_SECURE_SASL_SSL, KAFKA_SECURE_MTLS
# (host:port), KAFKA_SECURE_CA_FILE, KAFKA_SECURE_CLIENT_CERT_FILE,
# KAFKA_SECURE_CLIENT_KEY_FILE, and KAFKA_SECURE_<M>_USER / _PASSWORD for M
# in PLAIN, SCRAM_SHA_256, SCRAM_SHA_512.
#
# Environment (defaults):
#   KAFKA_DIR             /tmp/billing-kafka-secure
#   KAFKA_PORT            19692   PLAINTEXT
#   KAFKA_CONTROLLER_PORT $KAFKA_PORT+1
#   KAFKA_SASL_SSL_PORT   $KAFKA_PORT+2
#   KAFKA_MTLS_PORT       $KAFKA_PORT+3
#   everything else as scripts/kafka.sh (KAFKA_VERSION, KAFKA_CACHE, JAVA, ...)
#   OPENSSL               openssl
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA_SH="$SCRIPT_DIR/kafka.sh"

export KAFKA_DIR="${KAFKA_DIR:-/tmp/billing-kafka-secure}"
export KAFKA_HOST="${KAFKA_HOST:-127.0.0.1}"
export KAFKA_PORT="${KAFKA_PORT:-19692}"
export KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}"
KAFKA_SASL_SSL_PORT="${KAFKA_SASL_SSL_PORT:-$((KAFKA_PORT + 2))}"
KAFKA_MTLS_PORT="${KAFKA_MTLS_PORT:-$((KAFKA_PORT + 3))}"
OPENSSL="${OPENSSL:-openssl}"

TLS_DIR="$KAFKA_DIR/tls"
ENV_FILE="$KAFKA_DIR/secure.env"

log() { echo "kafka-secure.sh: $*" >&2; }
die() { echo "kafka-secure.sh: ERROR: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; }

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# random alphanumeric secret: safe in JAAS, ConfigCommand and env files
random_secret() { head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 24; }

# leaf NAME CN EXT: a key and a certificate signed by the test CA
leaf() {
  local name="$1" cn="$2" ext="$3"
  "$OPENSSL" req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$TLS_DIR/$name.key" -out "$TLS_DIR/$name.csr" -subj "/CN=$cn" 2>/dev/null
  printf '%b' "$ext" >"$TLS_DIR/$name.ext"
  "$OPENSSL" x509 -req -in "$TLS_DIR/$name.csr" -CA "$TLS_DIR/ca.pem" -CAkey "$TLS_DIR/ca.key" \
    -CAcreateserial -days 2 -sha256 -extfile "$TLS_DIR/$name.ext" -out "$TLS_DIR/$name.pem" 2>/dev/null
}

make_certs() {
  command -v "$OPENSSL" >/dev/null 2>&1 || die "'$OPENSSL' not found; it generates the test certificates"
  rm -rf "$TLS_DIR"
  mkdir -p "$TLS_DIR"
  chmod 700 "$TLS_DIR"
  "$OPENSSL" req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -sha256 \
    -keyout "$TLS_DIR/ca.key" -out "$TLS_DIR/ca.pem" -subj "/CN=billing-consumer test CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  leaf server localhost 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n'
  leaf client billing-consumer 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n'
  # Kafka's PEM key store: an encrypted PKCS#8 key (PBES1: Java 17's
  # EncryptedPrivateKeyInfo has no PBES2), then the chain.
  KEY_PASSWORD="$(random_secret)"
  "$OPENSSL" pkcs8 -topk8 -v1 PBE-SHA1-3DES -in "$TLS_DIR/server.key" -passout "pass:$KEY_PASSWORD" \
    -out "$TLS_DIR/server.enc.key"
  cat "$TLS_DIR/server.enc.key" "$TLS_DIR/server.pem" "$TLS_DIR/ca.pem" >"$TLS_DIR/server-keystore.pem"
  rm -f "$TLS_DIR"/*.csr "$TLS_DIR"/*.ext "$TLS_DIR/server.enc.key"
}

# the listeners, TLS and SASL settings appended to kafka.sh's server.properties
extra_config() {
  cat <<EOF
listeners=PLAINTEXT://$KAFKA_HOST:$KAFKA_PORT,CONTROLLER://$KAFKA_HOST:$KAFKA_CONTROLLER_PORT,SASL_SSL://$KAFKA_HOST:$KAFKA_SASL_SSL_PORT,MTLS://$KAFKA_HOST:$KAFKA_MTLS_PORT
advertised.listeners=PLAINTEXT://$KAFKA_HOST:$KAFKA_PORT,SASL_SSL://$KAFKA_HOST:$KAFKA_SASL_SSL_PORT,MTLS://$KAFKA_HOST:$KAFKA_MTLS_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL
ssl.keystore.type=PEM
ssl.keystore.location=$TLS_DIR/server-keystore.pem
ssl.key.password=$KEY_PASSWORD
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.pem
ssl.enabled.protocols=TLSv1.2,TLSv1.3
listener.name.mtls.ssl.client.auth=required
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$PLAIN_USER="$PLAIN_PASSWORD";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
EOF
}

# add_scram MECHANISM USER PASSWORD, through the PLAINTEXT listener
add_scram() {
  KAFKA_DIR="$KAFKA_DIR" "$KAFKA_SH" run-class org.apache.kafka.tools.ConfigCommand \
    --bootstrap-server "$KAFKA_HOST:$KAFKA_PORT" --alter --entity-type users --entity-name "$2" \
    --add-config "$1=[iterations=4096,password=$3]" >"$KAFKA_DIR/scram-$2.log" 2>&1
}

running() { "$KAFKA_SH" status >/dev/null 2>&1; }

cmd_start() {
  if running && [[ -s "$ENV_FILE" ]]; then
    log "already running on $KAFKA_HOST:$KAFKA_SASL_SSL_PORT (SASL_SSL)"
    cat "$ENV_FILE"
    return 0
  fi
  local p
  for p in "$KAFKA_SASL_SSL_PORT" "$KAFKA_MTLS_PORT"; do
    port_open "$KAFKA_HOST" "$p" && die "$KAFKA_HOST:$p is already in use; set KAFKA_SASL_SSL_PORT / KAFKA_MTLS_PORT"
  done
  mkdir -p "$KAFKA_DIR"
  PLAIN_USER=billing_plain PLAIN_PASSWORD="$(random_secret)"
  S256_USER=billing_s256 S256_PASSWORD="$(random_secret)"
  S512_USER=billing_s512 S512_PASSWORD="$(random_secret)"
  make_certs
  KAFKA_EXTRA_CONFIG="$(extra_config)" "$KAFKA_SH" start >/dev/null
  # both SCRAM users at once: each ConfigCommand is a JVM start
  local pids=() ok=1
  add_scram SCRAM-SHA-256 "$S256_USER" "$S256_PASSWORD" & pids+=($!)
  add_scram SCRAM-SHA-512 "$S512_USER" "$S512_PASSWORD" & pids+=($!)
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  if (( ! ok )); then
    cat "$KAFKA_DIR"/scram-*.log >&2 || true
    "$KAFKA_SH" stop >/dev/null 2>&1 || true
    die "creating the SCRAM users failed; stopped the broker"
  fi
  umask 077
  cat >"$ENV_FILE" <<EOF
KAFKA_SECURE_PLAINTEXT=$KAFKA_HOST:$KAFKA_PORT
KAFKA_SECURE_SASL_SSL=$KAFKA_HOST:$KAFKA_SASL_SSL_PORT
KAFKA_SECURE_MTLS=$KAFKA_HOST:$KAFKA_MTLS_PORT
KAFKA_SECURE_CA_FILE=$TLS_DIR/ca.pem
KAFKA_SECURE_CLIENT_CERT_FILE=$TLS_DIR/client.pem
KAFKA_SECURE_CLIENT_KEY_FILE=$TLS_DIR/client.key
KAFKA_SECURE_PLAIN_USER=$PLAIN_USER
KAFKA_SECURE_PLAIN_PASSWORD=$PLAIN_PASSWORD
KAFKA_SECURE_SCRAM_SHA_256_USER=$S256_USER
KAFKA_SECURE_SCRAM_SHA_256_PASSWORD=$S256_PASSWORD
KAFKA_SECURE_SCRAM_SHA_512_USER=$S512_USER
KAFKA_SECURE_SCRAM_SHA_512_PASSWORD=$S512_PASSWORD
EOF
  log "secured Kafka ready: SASL_SSL $KAFKA_HOST:$KAFKA_SASL_SSL_PORT, MTLS $KAFKA_HOST:$KAFKA_MTLS_PORT, PLAINTEXT $KAFKA_HOST:$KAFKA_PORT ($KAFKA_DIR)"
  cat "$ENV_FILE"
}

main() {
  local cmd="${1:-}"
  [[ $# -gt 0 ]] && shift
  case "$cmd" in
    start)  cmd_start ;;
    env)    running || die "not running ($KAFKA_DIR)"; cat "$ENV_FILE" ;;
    stop|status|logs|kill) exec "$KAFKA_SH" "$cmd" "$@" ;;
    -h|--help|help) usage ;;
    "")     usage; exit 2 ;;
    *)      log "unknown command: $cmd"; usage; exit 2 ;;
  esac
}

main "$@"
