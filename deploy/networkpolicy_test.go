package deploy

import (
	"slices"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// TestNetworkPolicy: in every build, the pods of billing-consumer accept
// traffic only from Prometheus, on the metrics port, and send it only to
// DNS, Kafka, Postgres, HTTPS (the provider) and OTLP/HTTP.
func TestNetworkPolicy(t *testing.T) {
	for _, dir := range kustomizations(t) {
		b := render(t, dir)
		np := one[networkingv1.NetworkPolicy](t, b)
		if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "billing-consumer" ||
			!slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
			t.Errorf("%s: NetworkPolicy must select billing-consumer's pods for ingress and egress: %+v", dir, np.Spec)
		}
		if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || len(np.Spec.Ingress[0].Ports) != 1 ||
			np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "prometheus" ||
			np.Spec.Ingress[0].Ports[0].Port.String() != "http" {
			t.Errorf("%s: ingress must be Prometheus to the http (metrics) port only: %+v", dir, np.Spec.Ingress)
		}
		var ports []int32
		for _, e := range np.Spec.Egress {
			for _, p := range e.Ports {
				ports = append(ports, p.Port.IntVal)
			}
		}
		slices.Sort(ports)
		if want := []int32{53, 53, 443, 4318, 5432, 9092, 9093}; !slices.Equal(ports, want) {
			t.Errorf("%s: egress ports %v, want %v (DNS, HTTPS, OTLP, Postgres, Kafka)", dir, ports, want)
		}
	}
}

// TestMigrationJobForGitOps: the migration Job cleans itself up and carries
// the annotations that make Argo CD, Helm and Flux run it before the
// Deployment and replace it instead of failing on its immutable template.
func TestMigrationJobForGitOps(t *testing.T) {
	for _, dir := range kustomizations(t) {
		for _, j := range all[batchv1.Job](render(t, dir)) {
			if j.Spec.TTLSecondsAfterFinished == nil || *j.Spec.TTLSecondsAfterFinished <= 0 {
				t.Errorf("%s: Job %s without ttlSecondsAfterFinished", dir, j.Name)
			}
			for k, v := range map[string]string{
				"argocd.argoproj.io/hook":               "PreSync",
				"argocd.argoproj.io/hook-delete-policy": "BeforeHookCreation",
				"argocd.argoproj.io/sync-wave":          "-1",
				"helm.sh/hook":                          "pre-install,pre-upgrade",
				"helm.sh/hook-delete-policy":            "before-hook-creation",
				"kustomize.toolkit.fluxcd.io/force":     "enabled",
			} {
				if j.Annotations[k] != v {
					t.Errorf("%s: Job %s annotation %s = %q, want %q", dir, j.Name, k, j.Annotations[k], v)
				}
			}
		}
	}
}
