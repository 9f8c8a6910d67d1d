package deploy

import (
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	promlabels "github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// topicPartitions is the partition count of order-service.order.confirmed.
// In a consumer group a partition has one consumer at a time, so replicas
// beyond it idle: KEDA's maxReplicaCount must equal it, and a fixed replica
// count must not exceed it. Change it only with the topic.
const topicPartitions = 12

// Settings the manifests must agree with (cmd/billing-consumer/config.go).
const (
	defaultShutdownTimeout = 30 * time.Second
	// httpShutdown is serve.go's bound on what follows
	// BILLING_SHUTDOWN_TIMEOUT: background loops (3s), HTTP servers (3s)
	// and the span flush (5s).
	httpShutdown  = 11 * time.Second
	defaultHTTP   = ":9090"
	nonrootUID    = 65532
	secretName    = "billing-consumer-secrets"
	appName       = "billing-consumer"
	nameLabel     = "app.kubernetes.io/name"
	componentKey  = "app.kubernetes.io/component"
	partOfLabel   = "app.kubernetes.io/part-of"
	defaultTopic  = "order-service.order.confirmed"
	lagMetricName = "billing_kafka_consumer_lag"
)

// migrateFirstSelector selects what the migration Job needs and nothing
// else; docs/operations.md applies it before everything else.
const migrateFirstSelector = "app.kubernetes.io/component in (shared,migrate)"

// build is the rendered output of one kustomization.
type build struct {
	dir  string
	objs []object
}

// kustomizations lists the base and every overlay.
func kustomizations(t *testing.T) []string {
	t.Helper()
	overlays, err := filepath.Glob("overlays/*/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{"base"}
	for _, o := range overlays {
		dirs = append(dirs, filepath.Dir(o))
	}
	if len(dirs) < 3 {
		t.Fatalf("kustomizations %v: want base, overlays/keda and overlays/production-like", dirs)
	}
	return dirs
}

// render runs kustomize in-process on dir and decodes every resource
// strictly.
func render(t *testing.T, dir string) build {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	b := build{dir: dir}
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		o, err := decodeStrict(dir+": "+r.CurId().String(), y)
		if err != nil {
			t.Fatal(err)
		}
		b.objs = append(b.objs, o)
	}
	return b
}

// all returns the objects of type T in b.
func all[T any](b build) []*T {
	var out []*T
	for _, o := range b.objs {
		if v, ok := o.obj.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}

// one returns the only object of type T in b.
func one[T any](t *testing.T, b build) *T {
	t.Helper()
	objs := all[T](b)
	if len(objs) != 1 {
		t.Fatalf("%s: %d objects of %T, want 1", b.dir, len(objs), *new(T))
	}
	return objs[0]
}

// podTemplate is a pod template and what runs it.
type podTemplate struct {
	owner string
	args  []string // expected args of the billing-consumer container
	spec  corev1.PodTemplateSpec
}

func podTemplates(t *testing.T, b build) []podTemplate {
	t.Helper()
	var pts []podTemplate
	for _, d := range all[appsv1.Deployment](b) {
		pts = append(pts, podTemplate{"Deployment " + d.Name, []string{"run"}, d.Spec.Template})
	}
	for _, j := range all[batchv1.Job](b) {
		pts = append(pts, podTemplate{"Job " + j.Name, []string{"migrate"}, j.Spec.Template})
	}
	for _, c := range all[batchv1.CronJob](b) {
		pts = append(pts, podTemplate{"CronJob " + c.Name, cronJobArgs[c.Name], c.Spec.JobTemplate.Spec.Template})
	}
	if len(pts) != 2+len(cronJobArgs) {
		t.Fatalf("%s: %d pod templates, want the Deployment, the migration Job and the CronJobs %v", b.dir, len(pts), slices.Sorted(maps.Keys(cronJobArgs)))
	}
	return pts
}

// cronJobArgs are the args of each CronJob: the hourly retention pass, and
// the suspended templates of the operator's one-off Jobs (kubectl create
// job --from=cronjob/...).
var cronJobArgs = map[string][]string{
	"billing-consumer-retention":  {"retention"},
	"billing-consumer-dlq-replay": {"dlq", "replay"},
	"billing-consumer-reconcile":  {"reconcile"},
}

// cronJob returns the CronJob named name.
func cronJob(t *testing.T, b build, name string) *batchv1.CronJob {
	t.Helper()
	for _, c := range all[batchv1.CronJob](b) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("%s: no CronJob %s", b.dir, name)
	return nil
}

// config returns the data of the ConfigMap the consumer's envFrom names.
func config(t *testing.T, b build, c corev1.Container) map[string]string {
	t.Helper()
	data := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			t.Errorf("%s: container %s: envFrom other than a ConfigMap", b.dir, c.Name)
			continue
		}
		var found bool
		for _, cm := range all[corev1.ConfigMap](b) {
			if cm.Name == ef.ConfigMapRef.Name {
				found = true
				for k, v := range cm.Data {
					data[k] = v
				}
			}
		}
		if !found {
			t.Errorf("%s: container %s: ConfigMap %s is not in the build", b.dir, c.Name, ef.ConfigMapRef.Name)
		}
	}
	return data
}

// TestKustomizationsRender builds every kustomization in-process and
// checks what the cluster would receive.
func TestKustomizationsRender(t *testing.T) {
	for _, dir := range kustomizations(t) {
		t.Run(dir, func(t *testing.T) {
			b := render(t, dir)
			checkLabels(t, b)
			checkPods(t, b)
			checkConsumer(t, b)
			checkDiscovery(t, b)
			checkScaling(t, b)
			checkMigrateFirst(t, b)
		})
	}
}

func checkLabels(t *testing.T, b build) {
	for _, o := range b.objs {
		if _, ok := o.obj.(*corev1.Namespace); ok {
			continue
		}
		if _, ok := o.obj.(*corev1.Secret); ok {
			t.Errorf("%s: renders a Secret; secrets are created out of band", o.source)
		}
		m, err := meta.Accessor(o.obj)
		if err != nil {
			t.Fatal(err)
		}
		l := m.GetLabels()
		if l[nameLabel] != appName || l[componentKey] == "" || l[partOfLabel] != "billing" {
			t.Errorf("%s: labels %v: want %s=%s, a component and %s=billing", o.source, l, nameLabel, appName, partOfLabel)
		}
	}
}

var gomemlimitRE = regexp.MustCompile(`^([0-9]+)(B|KiB|MiB|GiB|TiB)?$`)

// parseGoMemLimit parses GOMEMLIMIT as the Go runtime does (no decimal
// suffixes such as M or MB: they are not accepted).
func parseGoMemLimit(s string) (int64, error) {
	m := gomemlimitRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("GOMEMLIMIT %q: want a number with an optional B, KiB, MiB, GiB or TiB suffix", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, err
	}
	shift := map[string]uint{"": 0, "B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m[2]]
	return n << shift, nil
}

// checkPods holds every pod to the restricted Pod Security Standard and
// the resource and memory-limit rules.
func checkPods(t *testing.T, b build) {
	image := ""
	for _, pt := range podTemplates(t, b) {
		where := b.dir + ": " + pt.owner
		s := pt.spec.Spec
		psc := s.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != nonrootUID ||
			psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod securityContext must set runAsNonRoot, runAsUser %d and seccompProfile RuntimeDefault", where, nonrootUID)
		}
		if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
			t.Errorf("%s: automountServiceAccountToken must be false", where)
		}
		if s.EnableServiceLinks == nil || *s.EnableServiceLinks {
			t.Errorf("%s: enableServiceLinks must be false", where)
		}
		if s.HostNetwork || s.HostPID || s.HostIPC {
			t.Errorf("%s: uses a host namespace", where)
		}
		for _, v := range s.Volumes {
			if v.HostPath != nil {
				t.Errorf("%s: hostPath volume %s", where, v.Name)
			}
		}
		if len(s.InitContainers) > 0 || len(s.Containers) != 1 {
			t.Fatalf("%s: want exactly one container", where)
		}
		c := s.Containers[0]
		if image == "" {
			image = c.Image
		} else if c.Image != image {
			t.Errorf("%s: image %s differs from %s: the Jobs must run the consumer's version", where, c.Image, image)
		}
		if base, _, _ := strings.Cut(c.Image, ":"); base != appName && !strings.HasSuffix(base, "/"+appName) {
			t.Errorf("%s: image %s is not billing-consumer", where, c.Image)
		}
		if strings.Contains(c.Image, "/") && !strings.Contains(c.Image, "@sha256:") &&
			(!strings.Contains(c.Image[strings.LastIndex(c.Image, "/"):], ":") || strings.HasSuffix(c.Image, ":latest")) {
			t.Errorf("%s: image %s from a registry must be pinned to a version or digest", where, c.Image)
		}
		if len(c.Command) > 0 {
			t.Errorf("%s: command overrides the image's ENTRYPOINT", where)
		}
		if !slices.Equal(c.Args, pt.args) {
			t.Errorf("%s: args %q, want %q", where, c.Args, pt.args)
		}
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 ||
			(sc.Privileged != nil && *sc.Privileged) || (sc.RunAsUser != nil && *sc.RunAsUser == 0) {
			t.Errorf("%s: container securityContext must forbid privilege escalation, drop ALL capabilities and mount the root read-only", where)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, okReq := c.Resources.Requests[r]
			lim, okLim := c.Resources.Limits[r]
			if !okReq || !okLim {
				t.Errorf("%s: %s request and limit must both be set", where, r)
			} else if req.Cmp(lim) > 0 {
				t.Errorf("%s: %s request %s above its limit %s", where, r, req.String(), lim.String())
			} else if r == corev1.ResourceMemory && req.Cmp(lim) != 0 {
				// Memory is not compressible: a node that overcommits it
				// OOM-kills the pods using more than their request first.
				t.Errorf("%s: memory request %s below its limit %s; set them equal", where, req.String(), lim.String())
			}
		}
		checkEnv(t, where, c, s)
	}
}

// checkEnv checks the container's variables: BILLING_* (and GOMEMLIMIT,
// OTEL_*) only; GOMEMLIMIT just under the memory limit; *_FILE secrets on
// a mounted file of the billing Secret.
func checkEnv(t *testing.T, where string, c corev1.Container, s corev1.PodSpec) {
	var gomemlimit string
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, "BILLING_") && e.Name != "GOMEMLIMIT" && !strings.HasPrefix(e.Name, "OTEL_") {
			t.Errorf("%s: variable %s is not BILLING_*, GOMEMLIMIT or OTEL_*", where, e.Name)
		}
		if e.Name == "GOMEMLIMIT" {
			gomemlimit = e.Value
		}
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			t.Errorf("%s: %s comes from a secret as a variable; mount it as a file (%s_FILE)", where, e.Name, e.Name)
		}
		if strings.HasSuffix(e.Name, "_FILE") && !secretFileMounted(s, c, e.Value) {
			t.Errorf("%s: %s=%s is not a file of Secret %s mounted in the container", where, e.Name, e.Value, secretName)
		}
	}
	limit := c.Resources.Limits.Memory().Value()
	n, err := parseGoMemLimit(gomemlimit)
	switch {
	case gomemlimit == "":
		t.Errorf("%s: GOMEMLIMIT is not set", where)
	case err != nil:
		t.Errorf("%s: %v", where, err)
	case n < limit*80/100 || n > limit*95/100:
		t.Errorf("%s: GOMEMLIMIT %s is %d%% of the memory limit %s; keep it at 80-95%% (update both together)",
			where, gomemlimit, n*100/limit, c.Resources.Limits.Memory().String())
	}
}

// secretFileMounted reports whether path is an item of the billing Secret
// mounted in c.
func secretFileMounted(s corev1.PodSpec, c corev1.Container, path string) bool {
	for _, vm := range c.VolumeMounts {
		for _, v := range s.Volumes {
			if v.Name != vm.Name || v.Secret == nil || v.Secret.SecretName != secretName || !vm.ReadOnly {
				continue
			}
			if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
				continue // world-readable secret files
			}
			for _, it := range v.Secret.Items {
				if filepath.Join(vm.MountPath, it.Path) == path {
					return true
				}
			}
		}
	}
	return false
}

// consumer returns the Deployment and its billing-consumer container.
func consumer(t *testing.T, b build) (*appsv1.Deployment, corev1.Container) {
	t.Helper()
	d := one[appsv1.Deployment](t, b)
	if d.Name != appName || len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%s: Deployment %s: want %s with one container", b.dir, d.Name, appName)
	}
	return d, d.Spec.Template.Spec.Containers[0]
}

// checkConsumer checks the Deployment against the service's settings.
func checkConsumer(t *testing.T, b build) {
	d, c := consumer(t, b)
	cfg := config(t, b, c)
	for k := range cfg {
		if !strings.HasPrefix(k, "BILLING_") {
			t.Errorf("%s: ConfigMap key %s is not a BILLING_* variable", b.dir, k)
		}
		if strings.Contains(k, "DATABASE_URL") || strings.Contains(k, "TOKEN") || strings.Contains(k, "PASSWORD") {
			t.Errorf("%s: ConfigMap holds secret-looking %s; mount secrets as files", b.dir, k)
		}
	}
	for _, k := range []string{"BILLING_KAFKA_BROKERS", "BILLING_PAYMENT_URL"} {
		if cfg[k] == "" {
			t.Errorf("%s: required %s is not in the ConfigMap", b.dir, k)
		}
	}

	// Probes on the port the service listens on.
	addr := cfg["BILLING_HTTP_ADDR"]
	if addr == "" {
		addr = defaultHTTP
	}
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s: BILLING_HTTP_ADDR %q: %v", b.dir, addr, err)
	}
	port, _ := strconv.Atoi(portStr)
	if len(c.Ports) != 1 || int(c.Ports[0].ContainerPort) != port {
		t.Errorf("%s: container ports %v, want the one port of BILLING_HTTP_ADDR %s", b.dir, c.Ports, addr)
	}
	for name, p := range map[string]struct {
		probe *corev1.Probe
		path  string
	}{"startup": {c.StartupProbe, "/healthz"}, "liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: %s probe missing or not httpGet", b.dir, name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s: %s probe path %s, want %s", b.dir, name, p.probe.HTTPGet.Path, p.path)
		}
		if got, ok := containerPort(c, p.probe.HTTPGet.Port); !ok || got != port {
			t.Errorf("%s: %s probe port %s is not the declared port %d", b.dir, name, p.probe.HTTPGet.Port.String(), port)
		}
	}

	// The kubelet's SIGKILL after the whole graceful shutdown.
	shutdown := defaultShutdownTimeout
	if v := cfg["BILLING_SHUTDOWN_TIMEOUT"]; v != "" {
		if shutdown, err = time.ParseDuration(v); err != nil {
			t.Fatalf("%s: BILLING_SHUTDOWN_TIMEOUT %q: %v", b.dir, v, err)
		}
	}
	grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= shutdown+httpShutdown {
		t.Errorf("%s: terminationGracePeriodSeconds %s must exceed BILLING_SHUTDOWN_TIMEOUT %s + %s", b.dir, show(grace), shutdown, httpShutdown)
	}

	// The ServiceAccount exists.
	sa := d.Spec.Template.Spec.ServiceAccountName
	if !slices.ContainsFunc(all[corev1.ServiceAccount](b), func(s *corev1.ServiceAccount) bool { return s.Name == sa }) {
		t.Errorf("%s: ServiceAccount %q is not in the build", b.dir, sa)
	}
	// Spreading across nodes and zones.
	aff := d.Spec.Template.Spec.Affinity
	if aff == nil || aff.PodAntiAffinity == nil || len(d.Spec.Template.Spec.TopologySpreadConstraints) == 0 {
		t.Errorf("%s: want pod anti-affinity and topology spread constraints", b.dir)
	}
}

// show formats an optional number.
func show[T int32 | int64](p *T) string {
	if p == nil {
		return "unset"
	}
	return strconv.FormatInt(int64(*p), 10)
}

// containerPort resolves a probe's or Service's port (a number or a port
// name) against the container's ports.
func containerPort(c corev1.Container, p intstr.IntOrString) (int, bool) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return int(cp.ContainerPort), true
		}
	}
	return 0, false
}

func selects(t *testing.T, sel *metav1.LabelSelector, l map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return !s.Empty() && s.Matches(labels.Set(l))
}

// checkDiscovery checks that the Service, the ServiceMonitor and the PDB
// find the consumer pods, and only them.
func checkDiscovery(t *testing.T, b build) {
	d, c := consumer(t, b)
	podLabels := d.Spec.Template.Labels
	for _, pt := range podTemplates(t, b)[1:] {
		if selects(t, d.Spec.Selector, pt.spec.Labels) {
			t.Errorf("%s: the Deployment's selector matches the pods of %s", b.dir, pt.owner)
		}
	}
	svc := one[corev1.Service](t, b)
	if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, podLabels) {
		t.Errorf("%s: Service %s does not select the consumer pods", b.dir, svc.Name)
	}
	if !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("%s: Service %s must publish not-ready pods, or their metrics go unscraped", b.dir, svc.Name)
	}
	if svc.Name != appName {
		t.Errorf("%s: Service %s: the alerts' job label is %s", b.dir, svc.Name, appName)
	}
	portNames := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		if _, ok := containerPort(c, p.TargetPort); !ok {
			t.Errorf("%s: Service port %s targets %s, not a container port", b.dir, p.Name, p.TargetPort.String())
		}
		portNames[p.Name] = true
	}
	sm := one[monitoringv1.ServiceMonitor](t, b)
	if !selects(t, &sm.Spec.Selector, svc.Labels) {
		t.Errorf("%s: ServiceMonitor does not select Service %s", b.dir, svc.Name)
	}
	if len(sm.Spec.Endpoints) == 0 {
		t.Errorf("%s: ServiceMonitor has no endpoint", b.dir)
	}
	for _, ep := range sm.Spec.Endpoints {
		if !portNames[ep.Port] || ep.Path != "/metrics" {
			t.Errorf("%s: ServiceMonitor endpoint %+v: want a Service port name and /metrics", b.dir, ep)
		}
	}
	pdb := one[policyv1.PodDisruptionBudget](t, b)
	if !selects(t, pdb.Spec.Selector, podLabels) {
		t.Errorf("%s: PodDisruptionBudget does not select the consumer pods", b.dir)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.String() != "1" || pdb.Spec.MinAvailable != nil {
		t.Errorf("%s: PodDisruptionBudget: want maxUnavailable 1", b.dir)
	}
	cj := cronJob(t, b, "billing-consumer-retention")
	if cj.Spec.Suspend != nil && *cj.Spec.Suspend {
		t.Errorf("%s: the retention CronJob is suspended", b.dir)
	}
	f := strings.Fields(cj.Spec.Schedule)
	if minute, err := strconv.Atoi(f[0]); len(f) != 5 || err != nil || minute < 0 || minute > 59 || strings.Join(f[1:], " ") != "* * * *" {
		t.Errorf("%s: retention schedule %q: want hourly (M * * * *)", b.dir, cj.Spec.Schedule)
	}
	if cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Errorf("%s: retention CronJob concurrencyPolicy %q, want Forbid", b.dir, cj.Spec.ConcurrencyPolicy)
	}
	jobs := []batchv1.JobSpec{one[batchv1.Job](t, b).Spec}
	for _, c := range all[batchv1.CronJob](b) {
		jobs = append(jobs, c.Spec.JobTemplate.Spec)
		// The one-off templates never run by themselves.
		if c.Name != cj.Name && (c.Spec.Suspend == nil || !*c.Spec.Suspend) {
			t.Errorf("%s: CronJob %s is the template of a one-off Job and must be suspended", b.dir, c.Name)
		}
	}
	for _, j := range jobs {
		if j.BackoffLimit == nil || j.ActiveDeadlineSeconds == nil {
			t.Errorf("%s: Jobs must bound their retries (backoffLimit) and their time (activeDeadlineSeconds)", b.dir)
		}
	}
}

// checkScaling checks replicas against the partition count, and the KEDA
// ScaledObject where there is one.
func checkScaling(t *testing.T, b build) {
	d, c := consumer(t, b)
	sos := all[scaledObject](b)
	if len(sos) == 0 {
		if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 || *d.Spec.Replicas > topicPartitions {
			t.Errorf("%s: replicas %s: want 2..%d (the partition count)", b.dir, show(d.Spec.Replicas), topicPartitions)
		}
		return
	}
	if len(sos) != 1 {
		t.Fatalf("%s: %d ScaledObjects", b.dir, len(sos))
	}
	so := sos[0].Spec
	if d.Spec.Replicas != nil {
		t.Errorf("%s: the Deployment sets replicas while KEDA scales it: every apply would reset the scale", b.dir)
	}
	if so.ScaleTargetRef.Name != d.Name || (so.ScaleTargetRef.Kind != "" && so.ScaleTargetRef.Kind != "Deployment") {
		t.Errorf("%s: ScaledObject targets %+v, not Deployment %s", b.dir, so.ScaleTargetRef, d.Name)
	}
	if so.MaxReplicaCount == nil || *so.MaxReplicaCount != topicPartitions {
		t.Errorf("%s: maxReplicaCount %s, want the partition count %d: more consumers than partitions idle", b.dir, show(so.MaxReplicaCount), topicPartitions)
	}
	if so.MinReplicaCount == nil || *so.MinReplicaCount < 1 || (so.MaxReplicaCount != nil && *so.MinReplicaCount > *so.MaxReplicaCount) {
		t.Errorf("%s: minReplicaCount %s: want at least 1 (the consumers report the lag that scales them)", b.dir, show(so.MinReplicaCount))
	}
	if so.Fallback != nil && (so.Fallback.Replicas < 1 || so.Fallback.Replicas > topicPartitions) {
		t.Errorf("%s: fallback replicas %d out of 1..%d", b.dir, so.Fallback.Replicas, topicPartitions)
	}
	topic := config(t, b, c)["BILLING_KAFKA_TOPIC"]
	if topic == "" {
		topic = defaultTopic
	}
	if len(so.Triggers) != 1 || so.Triggers[0].Type != "prometheus" {
		t.Fatalf("%s: want one prometheus trigger, got %+v", b.dir, so.Triggers)
	}
	md := so.Triggers[0].Metadata
	for _, k := range []string{"serverAddress", "query", "threshold"} {
		if md[k] == "" {
			t.Errorf("%s: prometheus trigger without %s", b.dir, k)
		}
	}
	if v, err := strconv.ParseFloat(md["threshold"], 64); err != nil || v <= 0 {
		t.Errorf("%s: threshold %q is not a positive number", b.dir, md["threshold"])
	}
	expr, err := promQL().ParseExpr(md["query"])
	if err != nil {
		t.Fatalf("%s: ScaledObject query: %v", b.dir, err)
	}
	ns := sos[0].Namespace
	var found bool
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		found = vs.Name == lagMetricName
		want := map[string]string{"namespace": ns, "topic": topic}
		for _, m := range vs.LabelMatchers {
			if w, ok := want[m.Name]; ok && m.Type == promlabels.MatchEqual && m.Value == w {
				delete(want, m.Name)
			}
		}
		if len(want) > 0 {
			t.Errorf("%s: ScaledObject query does not select %v (the overlay's namespace and BILLING_KAFKA_TOPIC)", b.dir, want)
		}
		return nil
	})
	if !found {
		t.Errorf("%s: ScaledObject query does not read %s", b.dir, lagMetricName)
	}
}

// checkMigrateFirst checks the documented first step: the selector picks
// the migration Job and exactly what it needs.
func checkMigrateFirst(t *testing.T, b build) {
	sel, err := labels.Parse(migrateFirstSelector)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range b.objs {
		m, _ := meta.Accessor(o.obj)
		if sel.Matches(labels.Set(m.GetLabels())) {
			kinds = append(kinds, o.kind)
		}
	}
	slices.Sort(kinds)
	if want := []string{"batch/v1/Job", "v1/ConfigMap", "v1/ServiceAccount"}; !slices.Equal(kinds, want) {
		t.Errorf("%s: %q selects %v, want %v", b.dir, migrateFirstSelector, kinds, want)
	}
}
