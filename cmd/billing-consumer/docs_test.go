package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const operationsDoc = "../../docs/operations.md"

// helpDefaults returns the default of every variable, as help prints it.
func helpDefaults(t *testing.T) map[string]string {
	t.Helper()
	var b bytes.Buffer
	if err := printUsage(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	def, meaning := strings.Index(lines[0], "DEFAULT"), strings.Index(lines[0], "MEANING")
	if def < 0 || meaning < def {
		t.Fatalf("usage header %q", lines[0])
	}
	out := map[string]string{}
	for _, l := range lines[1:] {
		if len(l) < meaning {
			continue
		}
		out[strings.Fields(l)[0]] = strings.TrimSpace(l[def:meaning])
	}
	return out
}

// docs/operations.md names only variables the binary reads, and its table
// of defaults says what help says: the documentation cannot drift from the
// code (it once stated a pool default of 16).
func TestOperationsDocMatchesHelp(t *testing.T) {
	b, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	defaults := helpDefaults(t)
	for _, m := range regexp.MustCompile(`BILLING_[A-Z0-9_]*[A-Z0-9]`).FindAllString(doc, -1) {
		if _, ok := defaults[m]; !ok && m != "BILLING_TEST_DATABASE_URL" && !serviceLinkVar.MatchString(m) {
			t.Errorf("%s names %s, which billing-consumer does not read (see billing-consumer help)", operationsDoc, m)
		}
	}
	rows := regexp.MustCompile("(?m)^\\| `(BILLING_[A-Z0-9_]+)` \\| (`([^`]*)`|\\(empty[^)]*\\)) \\|$").FindAllStringSubmatch(doc, -1)
	if len(rows) < 10 {
		t.Fatalf("%s: found %d rows of the defaults table; the pattern no longer matches it", operationsDoc, len(rows))
	}
	for _, r := range rows {
		want, documented := defaults[r[1]], r[3]
		if strings.HasPrefix(r[2], "(empty") {
			documented = ""
		}
		if documented != want {
			t.Errorf("%s documents %s default %q; help says %q", operationsDoc, r[1], documented, want)
		}
	}
}

// docCommand is one billing-consumer command line found in the docs.
type docCommand struct {
	where string   // file:line
	words []string // after the program name, brackets removed
}

// docCommands extracts every billing-consumer command line from the code
// of README.md and docs/*.md: fenced blocks and inline code spans, where
// billing-consumer (or /billing-consumer, the image's path) starts a word.
// A shell comment, a pipe or a closing backtick ends the line.
func docCommands(t *testing.T) []docCommand {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []docCommand
	for _, f := range append(files, "../../README.md") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// Fenced blocks line by line; the rest as one text whose code
		// spans may wrap lines.
		var prose strings.Builder
		fenced := false
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
				prose.WriteString("\n")
				continue
			}
			if fenced {
				out = append(out, commandsIn(fmt.Sprintf("%s:%d", strings.TrimPrefix(f, "../../"), i+1), line)...)
				line = ""
			}
			prose.WriteString(line + "\n")
		}
		text := prose.String()
		parts := strings.Split(text, "`")
		offset := 0
		for j, part := range parts {
			if j%2 == 1 {
				where := fmt.Sprintf("%s:%d", strings.TrimPrefix(f, "../../"), strings.Count(text[:offset], "\n")+1)
				code := strings.ReplaceAll(strings.ReplaceAll(part, "\n", " "), `\|`, "|")
				out = append(out, commandsIn(where, code)...)
			}
			offset += len(part) + 1
		}
	}
	return out
}

// commandsIn returns the billing-consumer commands of one line of code.
func commandsIn(where, code string) []docCommand {
	var out []docCommand
	const prog = "billing-consumer"
	for i := 0; ; {
		j := strings.Index(code[i:], prog)
		if j < 0 {
			return out
		}
		start, end := i+j, i+j+len(prog)
		i = end
		before := ""
		if start > 0 {
			before = code[:start]
		}
		before = strings.TrimSuffix(before, "/")
		if before != "" && !strings.HasSuffix(before, " ") && !strings.HasSuffix(before, "(") {
			continue // deploy/billing-consumer, name=billing-consumer
		}
		if end < len(code) && code[end] != ' ' {
			continue // billing-consumer-secrets, billing-consumer:v1
		}
		var words []string
		for _, w := range shellFields(code[end:]) {
			if w == "|" || strings.HasPrefix(w, "#") || w == "&&" || w == ";" || w == ">" || strings.HasPrefix(w, "2>") {
				break
			}
			if w = strings.Trim(w, "[]"); w != "" {
				words = append(words, w)
			}
		}
		out = append(out, docCommand{where, words})
	}
}

// shellFields splits a command line into words as a shell does for the
// plain cases the docs use: on spaces, except inside double quotes, which
// it removes ("--reason "TICKET: why"" is one flag and one value).
func shellFields(line string) []string {
	var words []string
	var w strings.Builder
	quoted, in := false, false
	for _, r := range line {
		switch {
		case r == '"':
			quoted, in = !quoted, true
		case r == ' ' && !quoted:
			if in {
				words = append(words, w.String())
				w.Reset()
			}
			in = false
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// flagsOf runs path -h and returns its flags, each with whether it takes
// a value (flag.PrintDefaults names the value: "-max N"; a bool has none).
func flagsOf(path []string) (map[string]bool, error) {
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), append(slices.Clone(path), "-h"), &stdout, &stderr); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(stdout.String(), "Usage: billing-consumer") {
		return nil, fmt.Errorf("-h printed no usage: %.80q", stdout.String())
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z][a-z0-9-]*)( \S+)?`).FindAllStringSubmatch(stdout.String(), -1) {
		flags[m[1]] = m[2] != ""
	}
	return flags, nil
}

// Every billing-consumer command line in README.md and docs/ exists: its
// command path answers -h, and each of its flags is one that command's
// usage lists, with a value where it takes one. A runbook that says
// `dlq replay --order ID` fails here until the binary has --order.
func TestDocsCommandLines(t *testing.T) {
	cleanEnv(t)
	cmds := docCommands(t)
	if len(cmds) < 20 {
		t.Fatalf("found %d command lines in the docs; the extraction no longer works", len(cmds))
	}
	for _, c := range cmds {
		var path []string
		rest := c.words
		for len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
			path, rest = append(path, rest[0]), rest[1:]
		}
		if len(path) == 0 {
			path = []string{"run"} // the command when none is given
		}
		for _, p := range expandAlternatives(path) {
			flags, err := flagsOf(p)
			if err != nil {
				t.Errorf("%s: billing-consumer %s: not a command (%v)", c.where, strings.Join(p, " "), err)
				continue
			}
			for k := 0; k < len(rest); k++ {
				name, _, hasValue := strings.Cut(strings.TrimLeft(rest[k], "-"), "=")
				takes, ok := flags[name]
				switch {
				case name == "h" || name == "help":
				case !strings.HasPrefix(rest[k], "-"):
					t.Errorf("%s: billing-consumer %s: unexpected argument %q", c.where, strings.Join(p, " "), rest[k])
				case !ok:
					t.Errorf("%s: billing-consumer %s has no flag %s", c.where, strings.Join(p, " "), rest[k])
				case takes && !hasValue && k+1 == len(rest):
					t.Errorf("%s: billing-consumer %s: %s needs a value", c.where, strings.Join(p, " "), rest[k])
				case takes && !hasValue:
					k++ // its value
				}
			}
		}
	}
}

// expandAlternatives turns "claim show|release" into one path per
// alternative.
func expandAlternatives(path []string) [][]string {
	out := [][]string{nil}
	for _, w := range path {
		var next [][]string
		for _, a := range strings.Split(w, "|") {
			for _, p := range out {
				next = append(next, append(slices.Clone(p), a))
			}
		}
		out = next
	}
	return out
}
