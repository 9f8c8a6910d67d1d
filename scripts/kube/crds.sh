#!/usr/bin/env bash
# scripts/kube/crds.sh DIR — the CustomResourceDefinitions deploy/ needs,
# written to DIR (skipped when DIR already holds these versions):
#   ServiceMonitor, PrometheusRule  generated with controller-gen from the
#       Prometheus operator's own Go API types, at the version deploy/go.mod
#       decodes against (github.com/prometheus-operator/prometheus-operator/
#       pkg/apis/monitoring; the operator's main module, which ships the
#       YAML, is not served by the module proxy for current versions)
#   ScaledObject  KEDA's own config/crd/bases/keda.sh_scaledobjects.yaml,
#       from the github.com/kedacore/keda/v2 module
# controller-gen is built once per version through the module proxy and
# cached beside the kube binaries.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DIR=${1:?usage: crds.sh DIR}
KEDA_VERSION="${KEDA_VERSION:-v2.21.0}"
CONTROLLER_GEN_VERSION="${CONTROLLER_GEN_VERSION:-v0.23.0}"
CACHE="${KUBE_TOOLS_CACHE:-${HOME:-/root}/.cache/billing-consumer}"
MONITORING=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring
PROM_VERSION=$(cd deploy && go list -m -f '{{.Version}}' "$MONITORING")
STAMP="monitoring $PROM_VERSION, keda $KEDA_VERSION, controller-gen $CONTROLLER_GEN_VERSION"
[[ -f "$DIR/VERSIONS" && "$(cat "$DIR/VERSIONS")" == "$STAMP" ]] && exit 0

log() { echo "crds.sh: $*" >&2; }
gen="$CACHE/controller-gen-$CONTROLLER_GEN_VERSION/bin/controller-gen"
if [[ ! -x "$gen" ]]; then
	log "building controller-gen $CONTROLLER_GEN_VERSION (one time)"
	rm -rf "$CACHE/controller-gen-$CONTROLLER_GEN_VERSION/bin.tmp"
	CGO_ENABLED=0 GOBIN="$CACHE/controller-gen-$CONTROLLER_GEN_VERSION/bin.tmp" \
		go install -trimpath "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_GEN_VERSION" >&2
	rm -rf "$CACHE/controller-gen-$CONTROLLER_GEN_VERSION/bin"
	mv "$CACHE/controller-gen-$CONTROLLER_GEN_VERSION/bin.tmp" "$CACHE/controller-gen-$CONTROLLER_GEN_VERSION/bin"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Run inside deploy/'s module, so the types are the very ones its tests use.
(cd deploy && "$gen" crd:crdVersions=v1 paths="$MONITORING/v1" output:crd:dir="$tmp/monitoring") >&2
keda=$(go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')
[[ -d "$keda" ]] || { log "cannot download github.com/kedacore/keda/v2@$KEDA_VERSION"; exit 1; }
rm -rf "$DIR" && mkdir -p "$DIR"
cp "$tmp/monitoring/monitoring.coreos.com_servicemonitors.yaml" \
	"$tmp/monitoring/monitoring.coreos.com_prometheusrules.yaml" \
	"$keda/config/crd/bases/keda.sh_scaledobjects.yaml" "$DIR/"
chmod 0644 "$DIR"/*.yaml
echo "$STAMP" >"$DIR/VERSIONS"
log "CRDs in $DIR: $STAMP"
