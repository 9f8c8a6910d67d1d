package main

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

func TestHelpListsEveryVariable(t *testing.T) {
	for _, arg := range []string{"help", "-h", "--help", "-help"} {
		t.Run(arg, func(t *testing.T) {
			cleanEnv(t)
			var stdout, stderr bytes.Buffer
			if err := run(context.Background(), []string{arg}, &stdout, &stderr); err != nil {
				t.Fatalf("run %s: %v", arg, err)
			}
			if stderr.Len() != 0 {
				t.Errorf("stderr: %q", stderr.String())
			}
			rows := usageRows(t, stdout.String())

			// Every field of the config struct is documented, with its
			// envconfig default and a type.
			ct := reflect.TypeFor[config]()
			for i := range ct.NumField() {
				f := ct.Field(i)
				name := envPrefix + "_" + splitWords(f.Name)
				row, ok := rows[name]
				if !ok {
					t.Errorf("%s missing from help", name)
					continue
				}
				if row.typ == "" {
					t.Errorf("%s: no type", name)
				}
				if f.Type.String() == "time.Duration" && row.typ != "Duration" {
					t.Errorf("%s: type %q, want Duration", name, row.typ)
				}
				if row.def != f.Tag.Get("default") {
					t.Errorf("%s: default %q, want %q", name, row.def, f.Tag.Get("default"))
				}
				if row.meaning == "" {
					t.Errorf("%s: no meaning", name)
				}
			}
			if len(rows) != ct.NumField() {
				t.Errorf("help lists %d variables, config has %d", len(rows), ct.NumField())
			}

			// SPEC §3: exact names and defaults.
			spec := map[string]string{
				"BILLING_KAFKA_BROKERS":   "",
				"BILLING_KAFKA_TOPIC":     "order-service.order.confirmed",
				"BILLING_KAFKA_GROUP_ID":  "billing-order-confirmed",
				"BILLING_KAFKA_DLQ_TOPIC": "billing-order-confirmed.dlq",
				"BILLING_DATABASE_URL":    "",
				"BILLING_PAYMENT_URL":     "",
				"BILLING_HTTP_ADDR":       ":9090",
				"BILLING_DEDUP_RETENTION": "168h",
			}
			for name, def := range spec {
				row, ok := rows[name]
				if !ok {
					t.Errorf("SPEC variable %s missing from help", name)
					continue
				}
				if row.def != def {
					t.Errorf("%s: default %q, want %q (SPEC §3)", name, row.def, def)
				}
			}
			if rows["BILLING_DEDUP_RETENTION"].typ != "Duration" {
				t.Errorf("BILLING_DEDUP_RETENTION type %q", rows["BILLING_DEDUP_RETENTION"].typ)
			}
			if !strings.Contains(rows["BILLING_KAFKA_BROKERS"].typ, "list") {
				t.Errorf("BILLING_KAFKA_BROKERS type %q, want a list", rows["BILLING_KAFKA_BROKERS"].typ)
			}

			for _, cmd := range []string{"run", "migrate", "retention", "help", "version"} {
				if !strings.Contains(stdout.String(), "billing-consumer "+cmd) &&
					!strings.Contains(stdout.String(), "billing-consumer ["+cmd+"]") {
					t.Errorf("help does not mention the %s command", cmd)
				}
			}
			if !strings.Contains(stdout.String(), "_FILE") {
				t.Error("help does not mention *_FILE secrets")
			}
		})
	}
}

// SPEC §2 lists `billing-consumer dlq replay [--max N] [--dry-run]`.
func TestDLQReplayCommandExists(t *testing.T) {
	cleanEnv(t)
	var stdout, stderr bytes.Buffer
	_ = run(context.Background(), []string{"help"}, &stdout, &stderr)
	err := run(context.Background(), []string{"dlq", "replay", "--dry-run"}, &stdout, &stderr)
	if errors.Is(err, errUsage) && strings.Contains(err.Error(), "unknown command") {
		t.Fatal("SPEC §2 `dlq replay [--max N] [--dry-run]` is not a command: " + err.Error())
	}
	if !strings.Contains(stdout.String(), "dlq replay") {
		t.Error("help does not mention dlq replay")
	}
	// Without configuration it must fail on the configuration, one line.
	if err == nil {
		t.Fatal("dlq replay without configuration succeeded")
	}
	if strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "BILLING_") {
		t.Errorf("error %q is not one line naming a variable", err)
	}
}

type usageRow struct{ typ, def, meaning string }

// usageRows parses the VARIABLE TYPE DEFAULT MEANING table of help.
func usageRows(t *testing.T, out string) map[string]usageRow {
	t.Helper()
	lines := strings.Split(out, "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "VARIABLE") {
			start = i
			break
		}
	}
	if start < 0 {
		t.Fatalf("no VARIABLE table in help:\n%s", out)
	}
	head := lines[start]
	ti, di, mi := strings.Index(head, "TYPE"), strings.Index(head, "DEFAULT"), strings.Index(head, "MEANING")
	if ti < 0 || di < ti || mi < di {
		t.Fatalf("bad table header %q", head)
	}
	rows := map[string]usageRow{}
	for _, l := range lines[start+1:] {
		if strings.TrimSpace(l) == "" {
			break // the table ends at the first blank line; notes follow
		}
		if len(l) < mi {
			t.Fatalf("short table row %q", l)
		}
		name := strings.TrimSpace(l[:ti])
		if _, dup := rows[name]; dup {
			t.Errorf("%s listed twice", name)
		}
		rows[name] = usageRow{
			typ:     strings.TrimSpace(l[ti:di]),
			def:     strings.TrimSpace(l[di:mi]),
			meaning: strings.TrimSpace(l[mi:]),
		}
	}
	return rows
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		cleanEnv(t)
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), []string{arg}, &stdout, &stderr); err != nil {
			t.Fatalf("%s: %v", arg, err)
		}
		out := stdout.String()
		for _, want := range []string{"billing-consumer", version, commit, runtime.Version()} {
			if !strings.Contains(out, want) {
				t.Errorf("%s output %q lacks %q", arg, out, want)
			}
		}
		if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
			t.Errorf("%s output %q is not one line", arg, out)
		}
	}
}

// Version and help need no configuration at all: an operator must be able
// to run them anywhere.
func TestVersionAndHelpIgnoreBrokenConfig(t *testing.T) {
	setEnv(t, map[string]string{"BILLING_DEDUP_RETENTION": "forever", "BILLING_DATABASE_URL_FILE": "/nonexistent"})
	for _, arg := range []string{"version", "help"} {
		if err := run(context.Background(), []string{arg}, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
			t.Errorf("%s: %v", arg, err)
		}
	}
}

func TestWrongCommandLine(t *testing.T) {
	tests := []struct {
		args []string
		want string // in the error
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--bogus"}, `unknown command "--bogus"`},
		{[]string{""}, `unknown command ""`},
		{[]string{"run", "--bogus"}, "-bogus"},
		{[]string{"run", "extra"}, `"extra"`},
		{[]string{"migrate", "-x"}, "-x"},
		{[]string{"migrate", "now"}, `"now"`},
		{[]string{"retention", "--dry-run"}, "-dry-run"},
		{[]string{"retention", "--", "x"}, `"x"`},
		{[]string{"dlq"}, "dlq"},
		{[]string{"dlq", "frob"}, `"frob"`},
		{[]string{"dlq", "replay", "--bogus"}, "-bogus"},
		{[]string{"dlq", "replay", "--max", "many"}, "many"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			// A valid configuration: the command line alone is wrong.
			setEnv(t, validEnv)
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, &stdout, &stderr)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, errUsage) {
				t.Errorf("error %q does not point to help", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is not one line", err)
			}
			if stdout.Len() != 0 || stderr.Len() != 0 {
				t.Errorf("output %q %q for a wrong command line", stdout.String(), stderr.String())
			}
		})
	}
}

// SPEC §2: "A wrong flag ... exits non-zero". version takes no flags.
func TestVersionRejectsFlags(t *testing.T) {
	cleanEnv(t)
	err := run(context.Background(), []string{"version", "--bogus"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil {
		t.Fatal("`billing-consumer version --bogus` exits 0; SPEC §2 wants a wrong flag to fail")
	}
	if !errors.Is(err, errUsage) {
		t.Errorf("error %q does not point to help", err)
	}
}

// `billing-consumer` without a command is `run`.
func TestNoCommandIsRun(t *testing.T) {
	setEnv(t, validEnv, map[string]string{"BILLING_KAFKA_BROKERS": unset})
	for _, args := range [][]string{nil, {"run"}} {
		err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.HasPrefix(err.Error(), "BILLING_KAFKA_BROKERS: ") {
			t.Errorf("run %q = %v, want the missing brokers", args, err)
		}
	}
}

// migrate and retention need only the database: Kafka and payment settings
// are neither required nor checked.
func TestDatabaseCommandsNeedOnlyTheDatabase(t *testing.T) {
	setEnv(t, map[string]string{
		"BILLING_DATABASE_URL":  "postgres://u:pw@127.0.0.1:1/x",
		"BILLING_KAFKA_BROKERS": "not a broker",
		"BILLING_PAYMENT_URL":   "ftp://nope",
	})
	for _, cmd := range []string{"migrate", "retention"} {
		err := run(context.Background(), []string{cmd}, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil {
			t.Fatalf("%s succeeded without a database", cmd)
		}
		if !strings.HasPrefix(err.Error(), "connect to database 127.0.0.1:1/x") {
			t.Errorf("%s: %v, want a connection error", cmd, err)
		}
	}
}

// splitWords is envconfig's split_words naming, written out: KafkaDLQTopic
// becomes KAFKA_DLQ_TOPIC, HTTPAddr HTTP_ADDR.
func splitWords(field string) string {
	gather := regexp.MustCompile("([^A-Z]+|[A-Z]+[^A-Z]+|[A-Z]+)")
	acronym := regexp.MustCompile("([A-Z]+)([A-Z][^A-Z]+)")
	var words []string
	for _, w := range gather.FindAllString(field, -1) {
		if m := acronym.FindStringSubmatch(w); m != nil {
			words = append(words, m[1], m[2])
			continue
		}
		words = append(words, w)
	}
	return strings.ToUpper(strings.Join(words, "_"))
}
