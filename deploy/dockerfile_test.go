package deploy

import (
	"debug/elf"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

const (
	dockerfile   = "../Dockerfile"
	dockerignore = "../.dockerignore"
	runtimeImage = "gcr.io/distroless/static-debian12:nonroot"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
}

// stage is the instructions after one FROM.
type stage struct {
	from  string
	insts []instruction
}

// parseDockerfile reads the Dockerfile as text: comments dropped, lines
// ending in a backslash joined, split into stages at FROM.
func parseDockerfile(t *testing.T) []stage {
	t.Helper()
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	var stages []stage
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			stages = append(stages, stage{from: in.args})
			return
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("Dockerfile: %s before the first FROM", in.cmd)
			}
			return
		}
		stages[len(stages)-1].insts = append(stages[len(stages)-1].insts, in)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	return stages
}

func (s stage) all(cmd string) []string {
	var out []string
	for _, in := range s.insts {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

var ldflagsRE = regexp.MustCompile(`-ldflags "([^"]*)"`)

// TestDockerfile checks the image's invariants as text. Docker is not
// needed (nor available in CI): TestDockerBuildContext builds what the
// build stage builds.
func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t)
	if len(stages) != 2 {
		t.Fatalf("Dockerfile has %d stages, want build and runtime", len(stages))
	}
	build, runtime := stages[0], stages[1]
	buildImage := strings.Fields(build.from)
	if img := buildImage[len(buildImage)-3]; !strings.HasPrefix(img, "golang:1.26") || !strings.Contains(img, "bookworm") ||
		buildImage[len(buildImage)-2] != "AS" {
		t.Errorf("build stage FROM %q: want golang:1.26-bookworm AS build", build.from)
	}
	if runtime.from != runtimeImage {
		t.Errorf("runtime stage FROM %q, want %s", runtime.from, runtimeImage)
	}

	// Build stage: static, reproducible, stamped.
	env := strings.Join(build.all("ENV"), " ")
	runs := strings.Join(build.all("RUN"), "\n")
	if !strings.Contains(env, "CGO_ENABLED=0") && !strings.Contains(runs, "CGO_ENABLED=0") {
		t.Error("build stage does not set CGO_ENABLED=0")
	}
	var goBuild string
	for _, r := range build.all("RUN") {
		if strings.Contains(r, "go build") {
			goBuild = r
		}
	}
	if goBuild == "" {
		t.Fatal("build stage has no go build")
	}
	for _, want := range []string{"-trimpath", "./cmd/billing-consumer", "-o /out/billing-consumer"} {
		if !strings.Contains(goBuild, want) {
			t.Errorf("go build lacks %s: %s", want, goBuild)
		}
	}
	m := ldflagsRE.FindStringSubmatch(goBuild)
	if m == nil {
		t.Fatalf("go build has no -ldflags: %s", goBuild)
	}
	if !strings.Contains(m[1], "-s -w") || !strings.Contains(m[1], "-X main.version=${VERSION}") ||
		!strings.Contains(m[1], "-X main.commit=${COMMIT}") {
		t.Errorf("go build -ldflags %q: want -s -w -X main.version=${VERSION} -X main.commit=${COMMIT}", m[1])
	}
	args := strings.Join(build.all("ARG"), " ")
	for _, a := range []string{"VERSION", "COMMIT"} {
		if !regexp.MustCompile(`(^|\s)` + a + `(=|\s|$)`).MatchString(args) {
			t.Errorf("build stage does not declare ARG %s", a)
		}
	}

	// Runtime stage: the binary alone, non-root, run by default.
	want := map[string]string{
		"USER":       "65532:65532",
		"ENTRYPOINT": `["/billing-consumer"]`,
		"CMD":        `["run"]`,
		"EXPOSE":     "9090",
		"COPY":       "--from=build /out/billing-consumer /billing-consumer",
	}
	for cmd, w := range want {
		if got := runtime.all(cmd); len(got) != 1 || got[0] != w {
			t.Errorf("runtime stage %s %q, want %s", cmd, got, w)
		}
	}
	if len(runtime.all("RUN")) > 0 {
		t.Error("runtime stage has RUN: distroless has no shell")
	}
	// The Deployment agrees: the same port, the same user.
	b, err := os.ReadFile("base/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o, err := decodeStrict("base/deployment.yaml", b)
	if err != nil {
		t.Fatal(err)
	}
	pod := o.obj.(*appsv1.Deployment).Spec.Template.Spec
	if p := pod.Containers[0].Ports; len(p) != 1 || strconv.Itoa(int(p[0].ContainerPort)) != want["EXPOSE"] {
		t.Errorf("Deployment container ports %v, Dockerfile EXPOSE %s", p, want["EXPOSE"])
	}
	if u := pod.SecurityContext.RunAsUser; u == nil || strconv.FormatInt(*u, 10)+":"+strconv.FormatInt(*u, 10) != want["USER"] {
		t.Errorf("Deployment runAsUser %v, Dockerfile USER %s", u, want["USER"])
	}
	// USER comes after every COPY: nothing runs as root after it.
	seenUser := false
	for _, in := range runtime.insts {
		seenUser = seenUser || in.cmd == "USER"
		if seenUser && in.cmd == "COPY" {
			t.Error("COPY after USER in the runtime stage")
		}
	}
}

// dockerignored reports whether .dockerignore keeps rel (slash-separated)
// out of the build context. It implements what this project's file uses:
// patterns in order, the last match wins, "!" re-includes, "**" spans any
// number of directories, and a pattern matching a directory matches what is
// under it.
func dockerignored(patterns []string, rel string) bool {
	ignored := false
	for _, p := range patterns {
		negate := strings.HasPrefix(p, "!")
		p = strings.TrimSuffix(strings.TrimPrefix(p, "!"), "/")
		if matchesPathOrParent(p, rel) {
			ignored = !negate
		}
	}
	return ignored
}

func matchesPathOrParent(pattern, rel string) bool {
	for p := rel; p != "." && p != "/" && p != ""; p = path.Dir(p) {
		if globSegments(strings.Split(pattern, "/"), strings.Split(p, "/")) {
			return true
		}
	}
	return false
}

func globSegments(pat, name []string) bool {
	if len(pat) == 0 {
		return len(name) == 0
	}
	if pat[0] == "**" {
		for i := 0; i <= len(name); i++ {
			if globSegments(pat[1:], name[i:]) {
				return true
			}
		}
		return false
	}
	if len(name) == 0 {
		return false
	}
	ok, err := path.Match(pat[0], name[0])
	return err == nil && ok && globSegments(pat[1:], name[1:])
}

func readDockerignore(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dockerignore)
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, line)
		}
	}
	return patterns
}

func TestDockerignoreMatcher(t *testing.T) {
	p := []string{"*", "!go.mod", "!cmd/", "**/*_test.go", "**/testdata/"}
	for rel, want := range map[string]bool{
		"go.mod": false, "Makefile": true, "cmd/x/main.go": false, "cmd/x/main_test.go": true,
		"cmd/x/testdata/a.json": true, "deploy/go.mod": true, ".git/HEAD": true,
	} {
		if got := dockerignored(p, rel); got != want {
			t.Errorf("%s: ignored %v, want %v", rel, got, want)
		}
	}
}

// TestDockerBuildContext copies the build context Docker would send (the
// repository minus .dockerignore), runs the Dockerfile's go build in it
// with its flags, and checks the binary: static, and stamped with the
// version and commit build arguments.
func TestDockerBuildContext(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the service")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	patterns := readDockerignore(t)
	ctx := t.TempDir()
	copied := 0
	err = filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", p)
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		if d.IsDir() {
			if rel == ".git" || rel == "deploy" {
				if !dockerignored(patterns, rel+"/x") {
					t.Errorf("%s/ is in the build context", rel)
				}
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || dockerignored(patterns, rel) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		dst := filepath.Join(ctx, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		copied++
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("build context: %d files", copied)
	if copied > 200 {
		t.Errorf("build context has %d files: .dockerignore lets too much in", copied)
	}

	var goBuild string
	for _, r := range parseDockerfile(t)[0].all("RUN") {
		if strings.Contains(r, "go build") {
			goBuild = r
		}
	}
	m := ldflagsRE.FindStringSubmatch(goBuild)
	if m == nil {
		t.Fatal("no -ldflags in the Dockerfile's go build")
	}
	ldflags := strings.NewReplacer("${VERSION}", "v9.9.9-test", "${COMMIT}", "c0ffee1").Replace(m[1])
	bin := filepath.Join(t.TempDir(), "billing-consumer")
	cmd := exec.Command(goBin, "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", bin, "./cmd/billing-consumer")
	cmd.Dir = ctx
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build in the Docker build context: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "v9.9.9-test") || !strings.Contains(string(out), "c0ffee1") {
		t.Errorf("version of the stamped binary: %q (%v): the -X flags do not reach main.version/main.commit", out, err)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("binary has a dynamic loader: not static, will not run on distroless/static")
		}
	}
}
