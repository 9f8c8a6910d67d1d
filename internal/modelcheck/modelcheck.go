// Package modelcheck is a small explicit-state model checker: it explores
// every state a model can reach, breadth first, remembering each state it
// has seen (a state is a comparable value, so the map of seen states is
// its hash table), and checks each invariant in each state. For every
// invariant that fails it keeps the first violating state found, which
// breadth-first order makes one of the fewest steps from the start, and
// rebuilds the labelled steps that lead there: a shortest counterexample.
//
// It is the pattern of TLA+'s TLC and Rust's stateright reduced to what a
// Go test needs: the model's steps are ordinary Go functions (in this
// project, the production's own transition functions), so what is checked
// is the code, not a copy of it. A model must be finite; Config.MaxStates
// stops an exploration that is not.
package modelcheck

import (
	"fmt"
	"slices"
	"strings"
)

// Step is one transition out of a state: Label says what happened (it is
// printed in counterexamples), To is the state after it.
type Step[S comparable] struct {
	Label string
	To    S
}

// Invariant is a property that must hold in every reachable state.
type Invariant[S comparable] struct {
	Name  string
	Holds func(S) bool
}

// Config is one exploration.
type Config[S comparable] struct {
	// Init is the start state.
	Init S
	// Next returns every step out of s; none for a final state. It must
	// be a pure function of s.
	Next func(s S) []Step[S]
	// Invariants are checked, each on its own, in every reachable state.
	Invariants []Invariant[S]
	// MaxStates bounds the exploration: past it Explore returns an error
	// (the model is larger than its bounds were meant to allow). Zero
	// means 10 million.
	MaxStates int
	// Show renders a state in a counterexample; nil uses %+v.
	Show func(S) string
	// StopWhen, if set, ends the exploration as soon as every invariant
	// it names has failed: a check that wants a counterexample needs no
	// more. The result then covers only what was reached (no error).
	StopWhen []string
}

// Violation is an invariant that failed, with a shortest trace to a state
// where it fails.
type Violation[S comparable] struct {
	Invariant string
	// Trace is the labelled steps from Init; State is where they end.
	Trace []string
	State S
}

// Result is what Explore found.
type Result[S comparable] struct {
	// States is how many distinct states were reached; Transitions how
	// many steps were taken (into new or known states); Depth the length
	// of the longest shortest path.
	States, Transitions, Depth int
	// Violations has one entry per failed invariant, in the order of
	// Config.Invariants.
	Violations []Violation[S]
}

// node is what the explorer keeps of a reached state: the state, and the
// step that first reached it (parent is an index into the nodes, -1 for
// the start).
type node[S comparable] struct {
	state  S
	parent int32
	depth  int32
	label  string
}

// Explore reaches every state from cfg.Init and checks the invariants in
// each. Its error means the exploration stopped at MaxStates: the result
// then covers only what was reached.
func Explore[S comparable](cfg Config[S]) (Result[S], error) {
	limit := cfg.MaxStates
	if limit <= 0 {
		limit = 10_000_000
	}
	// The nodes are the queue too: breadth first, each is expanded in the
	// order it was reached.
	nodes := []node[S]{{state: cfg.Init, parent: -1}}
	index := map[S]int32{cfg.Init: 0}
	failed := make([]bool, len(cfg.Invariants))
	var res Result[S]
	var found []Violation[S]
	for at := 0; at < len(nodes); at++ {
		s, depth := nodes[at].state, nodes[at].depth
		res.Depth = max(res.Depth, int(depth))
		for i, inv := range cfg.Invariants {
			if !failed[i] && !inv.Holds(s) {
				failed[i] = true
				found = append(found, Violation[S]{Invariant: inv.Name, Trace: trace(nodes, at), State: s})
			}
		}
		if stopped(cfg, failed) {
			break
		}
		for _, st := range cfg.Next(s) {
			res.Transitions++
			if _, ok := index[st.To]; ok {
				continue
			}
			if len(nodes) >= limit {
				res.States = len(nodes)
				res.Violations = ordered(cfg.Invariants, found)
				return res, fmt.Errorf("modelcheck: more than %d states: the model's bounds are too loose", limit)
			}
			index[st.To] = int32(len(nodes))
			nodes = append(nodes, node[S]{state: st.To, parent: int32(at), depth: depth + 1, label: st.Label})
		}
	}
	res.States = len(nodes)
	res.Violations = ordered(cfg.Invariants, found)
	return res, nil
}

// stopped reports whether every invariant cfg.StopWhen names has failed.
func stopped[S comparable](cfg Config[S], failed []bool) bool {
	if len(cfg.StopWhen) == 0 {
		return false
	}
	for _, name := range cfg.StopWhen {
		i := slices.IndexFunc(cfg.Invariants, func(inv Invariant[S]) bool { return inv.Name == name })
		if i < 0 || !failed[i] {
			return false
		}
	}
	return true
}

// trace rebuilds the labels of the steps from the start to nodes[at].
func trace[S comparable](nodes []node[S], at int) []string {
	var out []string
	for i := int32(at); nodes[i].parent >= 0; i = nodes[i].parent {
		out = append(out, nodes[i].label)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// ordered sorts found by the order of the invariants.
func ordered[S comparable](invs []Invariant[S], found []Violation[S]) []Violation[S] {
	var out []Violation[S]
	for _, inv := range invs {
		for _, v := range found {
			if v.Invariant == inv.Name {
				out = append(out, v)
			}
		}
	}
	return out
}

// Format renders v as a numbered trace and its final state, for a test's
// failure message.
func (v Violation[S]) Format(show func(S) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "invariant %s violated after %d steps:\n", v.Invariant, len(v.Trace))
	for i, l := range v.Trace {
		fmt.Fprintf(&b, "  %2d. %s\n", i+1, l)
	}
	if show == nil {
		show = func(s S) string { return fmt.Sprintf("%+v", s) }
	}
	fmt.Fprintf(&b, "  state: %s\n", show(v.State))
	return b.String()
}
