package deploy

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestVariablesAreKnown builds billing-consumer and checks that every
// BILLING_* variable the manifests set (ConfigMap keys and env) is one the
// service reads: `billing-consumer help` prints them all, from the same
// struct envconfig fills. A misspelt name would otherwise be silently
// ignored and its default used.
func TestVariablesAreKnown(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the service")
	}
	bin := buildConsumer(t)
	out, err := exec.Command(bin, "help").Output()
	if err != nil {
		t.Fatalf("billing-consumer help: %v", err)
	}
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^(BILLING_[A-Z0-9_]+)\s`).FindAllStringSubmatch(string(out), -1) {
		known[m[1]] = true
	}
	if !known["BILLING_KAFKA_BROKERS"] || !known["BILLING_DATABASE_URL_FILE"] {
		t.Fatalf("help output does not list the variables as expected:\n%s", out)
	}
	for _, dir := range kustomizations(t) {
		b := render(t, dir)
		for _, pt := range podTemplates(t, b) {
			for _, c := range pt.spec.Spec.Containers {
				var names []string
				for _, e := range c.Env {
					names = append(names, e.Name)
				}
				for k := range config(t, b, c) {
					names = append(names, k)
				}
				for _, n := range names {
					if strings.HasPrefix(n, "BILLING_") && !known[n] {
						t.Errorf("%s: %s sets %s, which billing-consumer does not read (see billing-consumer help)", dir, pt.owner, n)
					}
				}
			}
		}
	}
}
