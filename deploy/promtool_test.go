package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const promtoolTests = "promtool"

// promtoolPath finds promtool. Without it the test fails under CI
// (scripts/test.sh installs Debian's prometheus package, which ships it)
// and is skipped only in a developer's run without CI set.
func promtoolPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found: scripts/test.sh installs it (apt-get install prometheus); CI must not skip the alert tests")
		}
		t.Skip("promtool not found (apt-get install --no-install-recommends prometheus)")
	}
	return p
}

// TestPromtool evaluates the PrometheusRule with Prometheus' own tools:
// its spec is written as a rule file, `promtool check rules` checks it and
// `promtool test rules` runs the unit tests of deploy/promtool/ on it.
// Every alert must have a test in which it fires and one in which it
// stays silent.
func TestPromtool(t *testing.T) {
	promtool := promtoolPath(t)
	pr := loadRules(t)
	spec, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(promtoolTests, "*.test.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool tests in %s (%v)", promtoolTests, err)
	}
	var names []string
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var tf struct {
			Tests []struct {
				AlertRuleTest []struct {
					Alertname string           `json:"alertname"`
					ExpAlerts []map[string]any `json:"exp_alerts"`
				} `json:"alert_rule_test"`
			} `json:"tests"`
		}
		if err := yaml.Unmarshal(b, &tf); err != nil { // promtool checks the rest
			t.Fatalf("%s: %v", f, err)
		}
		for _, tc := range tf.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				} else {
					silent[a.Alertname] = true
				}
			}
		}
		name := filepath.Base(f)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && (!fires[r.Alert] || !silent[r.Alert]) {
				t.Errorf("alert %s: promtool tests where it fires: %v, where it stays silent: %v; want both", r.Alert, fires[r.Alert], silent[r.Alert])
			}
		}
	}
	run := func(args ...string) {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("check", "rules", "rules.yaml")
	slices.Sort(names)
	run(append([]string{"test", "rules"}, names...)...)
}
