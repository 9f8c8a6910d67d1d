package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// EnvImage names the runtime image under test, e.g.
// localhost/billing-consumer:v1.2.3. scripts/test.sh builds it (make image)
// and sets it, with CONTAINERS_CONF for podman (scripts/image.sh).
const EnvImage = "BILLING_TEST_IMAGE"

// EnvDockerfileImage names the image the repository's Dockerfile built, on
// local stand-ins of its base images (scripts/image.sh dockerfile).
const EnvDockerfileImage = "BILLING_TEST_DOCKERFILE_IMAGE"

// The user the image and the Deployment run as (distroless's nonroot).
const nonrootUID = "65532"

// TestImage runs each built image, make image's and the Dockerfile's, the
// way deploy/ runs it: read-only root filesystem, every capability dropped,
// no new privileges. It checks
// `version` and `help`, then `migrate` and `run` against the test's
// Postgres, Kafka and payment simulator (host networking, so the container
// reaches their loopback addresses): /healthz and /readyz answer, the
// container's process runs as 65532 with no capabilities (read from the
// host's /proc/<pid>/status), the events are charged exactly once, and
// SIGTERM ends it with exit code 0 within BILLING_SHUTDOWN_TIMEOUT.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the container image; runs in make test")
	}
	for _, im := range []struct{ name, env string }{
		{"make-image", EnvImage},
		{"Dockerfile", EnvDockerfileImage},
	} {
		t.Run(im.name, func(t *testing.T) {
			image := os.Getenv(im.env)
			if image == "" {
				if os.Getenv("CI") != "" {
					t.Fatalf("%s is not set: CI must test the container image (use make test, which builds it)", im.env)
				}
				t.Skipf("%s is not set (scripts/test.sh builds the image and sets it)", im.env)
			}
			if _, err := exec.LookPath("podman"); err != nil {
				t.Fatalf("%s is set but podman is missing: %v", im.env, err)
			}
			testImage(t, image)
		})
	}
}

func testImage(t *testing.T, image string) {
	c := &container{t: t, image: image}

	// Both images are tagged with the version their binary is stamped with.
	wantVersion := image[strings.LastIndex(image, ":")+1:]
	out := c.output("version")
	if !strings.HasPrefix(out, "billing-consumer "+wantVersion+" ") {
		t.Errorf("version printed %q, want version %q (the -ldflags stamp)", out, wantVersion)
	}
	if label := c.inspect("{{index .Labels \"org.opencontainers.image.version\"}}"); label != wantVersion {
		t.Errorf("label org.opencontainers.image.version is %q, want %q", label, wantVersion)
	}
	if help := c.output("help"); !strings.Contains(help, "BILLING_KAFKA_BROKERS") {
		t.Errorf("help does not list BILLING_KAFKA_BROKERS:\n%s", help)
	}

	w := newWorldFor(t, "", kafkatest.Brokers(t), pgtest.NewDatabase(t), 2, paysim.Faults{})
	c.env, c.log = w.env(), w.log
	if err := c.start("migrate").Wait(context.Background()); err != nil {
		t.Fatalf("migrate in the image: %v", err)
	}
	first := time.Now().UnixMilli()*10 + 3
	const orders = 30
	plan := mustPlan(t, harness.Spec{Orders: orders, FirstOrderID: first, DuplicateRate: 0.2, Invalid: 2, Seed: 13, Now: time.Now()})
	if err := harness.Produce(context.Background(), w.brokers, w.topic, plan.Records); err != nil {
		t.Fatal(err)
	}

	const shutdown = 20 * time.Second // BILLING_SHUTDOWN_TIMEOUT of w.env
	addr := kafkatest.FreePort(t)
	c.env = w.env("BILLING_HTTP_ADDR=" + addr)
	p := c.start("run")
	w.waitDrained(t, p, 2*time.Minute)
	if code, body := opsGet(t, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d %q, want 200", code, body)
	}
	pollOps(t, 30*time.Second, "/readyz to answer 200", func() string {
		if code, body := opsGet(t, "http://"+addr+"/readyz"); code != http.StatusOK {
			return fmt.Sprintf("%d %q", code, strings.TrimSpace(body))
		}
		return ""
	})
	c.checkProcess()
	report(t, w.verify(t, plan, first, orders))

	start := time.Now()
	err := p.Stop(shutdown + 10*time.Second)
	took := time.Since(start)
	t.Logf("container stopped %v after SIGTERM: %v", took.Round(time.Millisecond), err)
	if err != nil {
		t.Errorf("SIGTERM: %v, want exit code 0", err)
	}
	if took > shutdown {
		t.Errorf("SIGTERM took %v, more than BILLING_SHUTDOWN_TIMEOUT %v", took, shutdown)
	}
}

// container runs one image with podman, hardened as the Deployment's pod
// security context: read-only root, no capabilities, no new privileges.
type container struct {
	t     *testing.T
	image string
	env   []string
	log   io.Writer
	name  string // of the last container started
}

func (c *container) args(name string, cmd ...string) []string {
	args := []string{"run", "--rm", "--name", name, "--network", "host",
		"--read-only", "--cap-drop=ALL", "--security-opt", "no-new-privileges"}
	for _, kv := range c.env {
		args = append(args, "--env", kv)
	}
	return append(append(args, c.image), cmd...)
}

// podmanEnv is what podman itself needs (harness.Start passes exactly the
// env it is given, plus PATH).
func podmanEnv() []string {
	var env []string
	for _, k := range []string{"HOME", "CONTAINERS_CONF", "TMPDIR", "XDG_RUNTIME_DIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

func (c *container) output(cmd ...string) string {
	c.t.Helper()
	out, err := exec.Command("podman", c.args(kafkatest.UniqueName("billing-image"), cmd...)...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("podman run %s %v: %v\n%s", c.image, cmd, err, out)
	}
	return strings.TrimSpace(string(out))
}

func (c *container) inspect(format string) string {
	c.t.Helper()
	out, err := exec.Command("podman", "image", "inspect", "--format", format, c.image).Output()
	if err != nil {
		c.t.Fatalf("podman image inspect %s: %v", c.image, err)
	}
	return strings.TrimSpace(string(out))
}

// start runs cmd in a new container; t.Cleanup removes it if it is left.
func (c *container) start(cmd ...string) *harness.Process {
	c.t.Helper()
	c.name = kafkatest.UniqueName("billing-image")
	name := c.name
	p, err := harness.Start("podman", c.args(name, cmd...), podmanEnv(), c.log)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() {
		p.Kill()
		_ = exec.Command("podman", "rm", "--force", "--ignore", name).Run()
	})
	return p
}

// checkProcess reads the running container's process from the host's /proc:
// real, effective, saved and filesystem uid and gid all 65532, no effective
// or permitted capability, no_new_privs set.
func (c *container) checkProcess() {
	c.t.Helper()
	out, err := exec.Command("podman", "inspect", "--format", "{{.State.Pid}}", c.name).Output()
	if err != nil {
		c.t.Fatalf("podman inspect %s: %v", c.name, err)
	}
	pid := strings.TrimSpace(string(out))
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		c.t.Fatalf("the container's process: %v", err)
	}
	defer f.Close()
	want := map[string]string{
		"Uid":        strings.Repeat(nonrootUID+"\t", 3) + nonrootUID,
		"Gid":        strings.Repeat(nonrootUID+"\t", 3) + nonrootUID,
		"CapEff":     "0000000000000000",
		"CapPrm":     "0000000000000000",
		"NoNewPrivs": "1",
	}
	got := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		got[k] = strings.TrimSpace(v)
	}
	for k, v := range want {
		if got[k] != v {
			c.t.Errorf("/proc/%s/status %s: %q, want %q", pid, k, got[k], v)
		}
	}
	c.t.Logf("container process %s (host pid %s): Uid %s, CapEff %s, NoNewPrivs %s", got["Name"], pid, got["Uid"], got["CapEff"], got["NoNewPrivs"])
}
