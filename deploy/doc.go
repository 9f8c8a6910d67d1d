// Package deploy holds no code: deploy/ is a Go module of its own only so
// that the tests of the Kubernetes manifests, the Prometheus rules, the
// Grafana dashboard and the Dockerfile can use the Kubernetes, kustomize and
// Prometheus libraries without adding them to the service's go.mod.
//
// Run them with `cd deploy && go test ./...`.
package deploy
