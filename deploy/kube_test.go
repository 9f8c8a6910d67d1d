package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The real API server of scripts/kube.sh (kube-apiserver and etcd on
// loopback, with the Prometheus operator's and KEDA's CRDs installed):
// scripts/test.sh starts it and sets both variables.
const (
	envKubeconfig = "BILLING_TEST_KUBECONFIG"
	envKubectl    = "BILLING_TEST_KUBECTL"
)

// The namespace the overlays name, and the one the base is applied in.
const (
	overlayNamespace = "billing"
	baseNamespace    = "billing-base"
)

// kube runs kubectl against the test's API server.
type kube struct {
	t                  *testing.T
	kubectl, kubconfig string
}

func apiServer(t *testing.T) *kube {
	t.Helper()
	k := &kube{t: t, kubectl: os.Getenv(envKubectl), kubconfig: os.Getenv(envKubeconfig)}
	if k.kubectl == "" || k.kubconfig == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s and %s are not set: CI applies the manifests to a real API server (use make test)", envKubectl, envKubeconfig)
		}
		t.Skipf("%s/%s not set: start one with scripts/kube.sh start; eval \"$(scripts/kube.sh env)\"", envKubectl, envKubeconfig)
	}
	return k
}

// run returns kubectl's stdout and stderr; err is its exit status.
func (k *kube) run(stdin []byte, args ...string) (string, string, error) {
	cmd := exec.Command(k.kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+k.kubconfig)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

func (k *kube) must(stdin []byte, args ...string) string {
	k.t.Helper()
	out, errOut, err := k.run(stdin, args...)
	if err != nil {
		k.t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// restrictedNamespace creates (or keeps) ns enforcing, warning and auditing
// the restricted Pod Security Standard.
func (k *kube) restrictedNamespace(name string) {
	k.t.Helper()
	ns := corev1.Namespace{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted",
			"pod-security.kubernetes.io/warn":    "restricted",
			"pod-security.kubernetes.io/audit":   "restricted",
		}},
	}
	k.must(mustJSON(k.t, ns), "apply", "-f", "-")
}

// serviceAccounts creates b's ServiceAccounts in ns for real: a Pod is
// admitted only with its ServiceAccount in place.
func (k *kube) serviceAccounts(b build, ns string) {
	k.t.Helper()
	for _, sa := range all[corev1.ServiceAccount](b) {
		sa := sa.DeepCopy()
		sa.Namespace = ns
		k.must(mustJSON(k.t, sa), "apply", "-f", "-")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var dryRunLine = regexp.MustCompile(`(?m)^\S+ (created|configured|unchanged) \(server dry run\)$`)

// TestServerDryRun applies the base and every overlay with `kubectl apply
// --dry-run=server -k` to a real kube-apiserver, in namespaces that enforce
// the restricted Pod Security Standard: every object must be admitted
// (schemas of the built-in kinds and of the CRDs, strict field validation)
// with no warning. Pod Security admission enforces on Pods only and merely
// warns on workloads, so each pod template is also submitted as a Pod, where
// a violation is refused.
func TestServerDryRun(t *testing.T) {
	k := apiServer(t)
	k.restrictedNamespace(overlayNamespace)
	k.restrictedNamespace(baseNamespace)
	t.Logf("server: %s", strings.Join(strings.Fields(k.must(nil, "version")), " "))
	for _, dir := range kustomizations(t) {
		t.Run(dir, func(t *testing.T) {
			b := render(t, dir)
			args := []string{"apply", "--dry-run=server", "-k", dir}
			ns := overlayNamespace
			if dir == "base" {
				ns = baseNamespace
				args = append(args, "-n", ns)
			}
			out, errOut, err := k.run(nil, args...)
			if err != nil {
				t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
			}
			if strings.Contains(errOut, "Warning:") {
				t.Errorf("kubectl %s warned:\n%s", strings.Join(args, " "), errOut)
			}
			if got := len(dryRunLine.FindAllString(out, -1)); got != len(b.objs) {
				t.Errorf("%d objects admitted, want the %d rendered:\n%s", got, len(b.objs), out)
			}
			k.serviceAccounts(b, ns)
			for _, pt := range podTemplates(t, b) {
				pod := podOf(pt, ns)
				if out, errOut, err := k.run(mustJSON(t, pod), "create", "--dry-run=server", "-f", "-"); err != nil || strings.Contains(errOut, "Warning:") {
					t.Errorf("the pod of %s, refused or warned in a restricted namespace: %v\n%s%s", pt.owner, err, out, errOut)
				}
			}
			if !t.Failed() {
				t.Logf("%s: %d objects and %d pods admitted", dir, len(b.objs), len(podTemplates(t, b)))
			}
		})
	}
}

// podOf is the Pod a controller would create from pt, in ns.
func podOf(pt podTemplate, ns string) corev1.Pod {
	name := strings.ToLower(strings.ReplaceAll(pt.owner, " ", "-"))
	return corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: pt.spec.Labels},
		Spec:       pt.spec.Spec,
	}
}

// TestServerRefusesBrokenManifests proves that TestServerDryRun can fail:
// the same server (which, as kubeadm's, allows privileged pods where the
// namespace's policy does) refuses the base's Deployment with an unknown
// field, its pod made privileged, and a ScaledObject that breaks KEDA's CRD schema,
// and warns on a privileged Deployment.
func TestServerRefusesBrokenManifests(t *testing.T) {
	k := apiServer(t)
	k.restrictedNamespace(baseNamespace)
	b := render(t, "base")
	d := one[appsv1.Deployment](t, b)
	d.Namespace = baseNamespace

	var unknown map[string]any
	if err := json.Unmarshal(mustJSON(t, d), &unknown); err != nil {
		t.Fatal(err)
	}
	unknown["spec"].(map[string]any)["replicaz"] = 2
	refused(t, k, "a Deployment with an unknown field", mustJSON(t, unknown), `unknown field "spec.replicaz"`)

	priv := d.DeepCopy()
	yes := true
	priv.Spec.Template.Spec.Containers[0].SecurityContext.Privileged = &yes
	priv.Spec.Template.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes
	k.serviceAccounts(b, baseNamespace)
	pod := podOf(podTemplate{owner: "privileged " + d.Name, spec: priv.Spec.Template}, baseNamespace)
	refused(t, k, "a privileged pod", mustJSON(t, pod), `violates PodSecurity "restricted`)
	_, errOut, err := k.run(mustJSON(t, priv), "apply", "--dry-run=server", "-f", "-")
	if err != nil || !strings.Contains(errOut, `would violate PodSecurity "restricted`) {
		t.Errorf("a privileged Deployment: %v, want admitted with a PodSecurity warning; stderr:\n%s", err, errOut)
	}

	scaled, err := yaml.YAMLToJSON([]byte(fmt.Sprintf(`
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: broken, namespace: %s}
spec:
  scaleTargetRef: {name: billing-consumer}
  maxReplicaCount: twelve
  triggers: [{type: prometheus, metadata: {query: up}}]
`, baseNamespace)))
	if err != nil {
		t.Fatal(err)
	}
	refused(t, k, "a ScaledObject with a string maxReplicaCount", scaled, `spec.maxReplicaCount`)
}

func refused(t *testing.T, k *kube, what string, manifest []byte, want string) {
	t.Helper()
	out, errOut, err := k.run(manifest, "apply", "--dry-run=server", "-f", "-")
	if err == nil {
		t.Errorf("%s was admitted:\n%s", what, out)
		return
	}
	if !strings.Contains(errOut, want) {
		t.Errorf("%s refused, but not for %q: %v\n%s", what, want, err, errOut)
		return
	}
	t.Logf("%s refused: %s", what, strings.TrimSpace(errOut))
}
