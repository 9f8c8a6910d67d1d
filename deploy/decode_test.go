package deploy

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/yaml"
)

// object is one decoded manifest.
type object struct {
	source string // file, or build directory, it came from
	kind   string // apiVersion/kind, e.g. "apps/v1/Deployment"
	obj    any    // pointer to the typed object
}

// newTyped returns a pointer to the Go type of apiVersion/kind, or nil for
// a kind these tests do not know (an error: every manifest must be
// checked).
func newTyped(kind string) any {
	switch kind {
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "batch/v1/Job":
		return &batchv1.Job{}
	case "batch/v1/CronJob":
		return &batchv1.CronJob{}
	case "v1/Service":
		return &corev1.Service{}
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}
	case "v1/Secret":
		return &corev1.Secret{}
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1/Namespace":
		return &corev1.Namespace{}
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1/PrometheusRule":
		return &monitoringv1.PrometheusRule{}
	case "keda.sh/v1alpha1/ScaledObject":
		return &scaledObject{}
	case "kustomize.config.k8s.io/v1beta1/Kustomization":
		return &types.Kustomization{}
	}
	return nil
}

// decodeStrict decodes one YAML document into its Kubernetes type,
// rejecting unknown and duplicate fields: a misspelt or misplaced field,
// which the API server would silently drop, fails here.
func decodeStrict(source string, doc []byte) (object, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return object{}, fmt.Errorf("%s: %w", source, err)
	}
	kind := head.APIVersion + "/" + head.Kind
	typed := newTyped(kind)
	if typed == nil {
		return object{}, fmt.Errorf("%s: no Go type known for %q: add it to newTyped", source, kind)
	}
	if err := yaml.UnmarshalStrict(doc, typed); err != nil {
		return object{}, fmt.Errorf("%s: %s: %w", source, kind, err)
	}
	return object{source: source, kind: kind, obj: typed}, nil
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// splitDocuments splits a multi-document YAML stream, dropping empty
// documents (comments only).
func splitDocuments(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range docSeparator.Split(string(b), -1) {
		var v any
		if err := yaml.Unmarshal([]byte(d), &v); err == nil && v == nil {
			continue
		}
		docs = append(docs, []byte(d))
	}
	return docs
}

// yamlFiles lists every .yaml and .yml file under deploy/, except the
// promtool unit tests (promtool/), which are not Kubernetes objects:
// TestPromtool reads them.
func yamlFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path == promtoolTests {
			return filepath.SkipDir
		}
		if ext := filepath.Ext(path); !d.IsDir() && (ext == ".yaml" || ext == ".yml") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestManifestsDecodeStrictly decodes every YAML file under deploy/ into
// the Kubernetes, Prometheus operator, KEDA or kustomize type of its kind.
func TestManifestsDecodeStrictly(t *testing.T) {
	files := yamlFiles(t)
	if len(files) < 12 {
		t.Fatalf("found %d YAML files under deploy/, want the base, the overlays and the example", len(files))
	}
	kinds := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("\t")) {
			t.Errorf("%s: contains a tab", f)
		}
		docs := splitDocuments(b)
		if len(docs) == 0 {
			t.Errorf("%s: no document", f)
		}
		for i, d := range docs {
			o, err := decodeStrict(fmt.Sprintf("%s#%d", f, i), d)
			if err != nil {
				t.Error(err)
				continue
			}
			kinds[o.kind]++
		}
	}
	for _, want := range []string{
		"apps/v1/Deployment", "batch/v1/Job", "batch/v1/CronJob", "v1/Service", "v1/ServiceAccount",
		"policy/v1/PodDisruptionBudget", "monitoring.coreos.com/v1/ServiceMonitor",
		"monitoring.coreos.com/v1/PrometheusRule", "keda.sh/v1alpha1/ScaledObject",
		"kustomize.config.k8s.io/v1beta1/Kustomization",
	} {
		if kinds[want] == 0 {
			t.Errorf("no %s under deploy/", want)
		}
	}
}

// TestStrictDecodingRejectsTypos proves the decoder is strict: a field the
// API does not know, or one given twice, is an error.
func TestStrictDecodingRejectsTypos(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 3\n",
		"misplaced":     "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{port: 1, containerPort: 2}]\n",
		"duplicate":     "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {c: d}\n",
		"wrong type":    "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: x}\nspec:\n  scaleTargetRef: {name: x}\n  maxReplicaCount: many\n",
		"keda unknown":  "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: x}\nspec:\n  scaleTargetRef: {name: x}\n  maxReplicas: 3\n",
		"unknown kind":  "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
	} {
		if _, err := decodeStrict(name, []byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// TestNoSecretValuesCommitted allows a Secret only as the documented
// example, with placeholder values.
func TestNoSecretValuesCommitted(t *testing.T) {
	for _, f := range yamlFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range splitDocuments(b) {
			o, err := decodeStrict(f, d)
			if err != nil {
				continue // reported by TestManifestsDecodeStrictly
			}
			s, ok := o.obj.(*corev1.Secret)
			if !ok {
				continue
			}
			if !strings.HasPrefix(f, "examples/") {
				t.Errorf("%s#%d: a Secret outside deploy/examples", f, i)
			}
			if len(s.Data) > 0 {
				t.Errorf("%s#%d: example Secret has base64 data; use stringData placeholders", f, i)
			}
			for k, v := range s.StringData {
				if !strings.Contains(v, "CHANGE-ME") {
					t.Errorf("%s#%d: %s does not look like a placeholder", f, i, k)
				}
			}
		}
	}
	// And no kustomization pulls an example in.
	for _, f := range yamlFiles(t) {
		if filepath.Base(f) != "kustomization.yaml" {
			continue
		}
		b, _ := os.ReadFile(f)
		var k types.Kustomization
		if err := yaml.Unmarshal(b, &k); err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(k.Resources, func(r string) bool { return strings.Contains(r, "examples") }) {
			t.Errorf("%s: includes deploy/examples", f)
		}
	}
}
