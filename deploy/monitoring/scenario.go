package monitoring

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/common/model"

	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// Phase is one step of the scenario: a fault applied (or undone), the
// alerts that must then fire — exactly those — and what the dashboard's
// panels must show.
type Phase struct {
	Name string
	// Fault says what the phase does, for the report.
	Fault string
	// Start applies the phase's fault.
	Start func(ctx context.Context, r *Rig) error
	// Alerts are the names of the alerts that must fire once the phase has
	// settled, and no other.
	Alerts []string
	// Checks are the values some panels must show, by panel title; every
	// other query must return series.
	Checks map[string]Check
	// MinDuration keeps a phase going at least this long (a healthy phase
	// must stay silent for a while, not just at one evaluation).
	MinDuration time.Duration
	// Hold keeps the fault on this long after the phase has settled, the
	// expected alerts firing throughout: an alert that flaps fails.
	Hold time.Duration
	// End undoes the fault once the phase has settled (and held).
	End func(ctx context.Context, r *Rig) error
}

// normal is the simulator's behaviour outside the storm.
var normal = paysim.Faults{Latency: 2 * time.Millisecond}

// Phases is the scenario on replicas[0] and replicas[1] of a rig, for
// rules scaled so that their shortest window is window (10s): healthy
// traffic, one replica SIGKILLed (and restarted, as its pod would be),
// one replica SIGSTOPped (its partitions stall), a provider 5xx storm (30%
// of requests answered 500), Postgres unreachable, and recovery.
func Phases(window time.Duration) []Phase {
	victim := "billing-consumer-1"
	return []Phase{{
		Name: "healthy", Fault: "none: 20 orders/s",
		Start:  func(_ context.Context, r *Rig) error { return r.Produce() },
		Alerts: nil,
		Checks: map[string]Check{
			"Events / s":                   someAbove(0),
			"Events by result":             series("result", "charged", someAbove(0)),
			"Payment error ratio":          allEqual(0),
			"Replicas up":                  allEqual(2),
			"Scrape up per replica":        allEqual(1),
			"Partitions owned per replica": allEqual(2),
			"Operator pause":               allEqual(0),
			"Parked events (the completer owns their claim)": allEqual(0),
		},
		MinDuration: 2 * window,
	}, {
		Name: "replica killed", Fault: "SIGKILL " + victim + " (restarted once Prometheus saw it down)",
		Start:  func(_ context.Context, r *Rig) error { r.Replicas[1].Kill(); return nil },
		Alerts: nil,
		Checks: map[string]Check{
			"Scrape up per replica": series("pod", victim, allEqual(0)),
			"Replicas up":           allEqual(1),
		},
		End: func(ctx context.Context, r *Rig) error {
			if err := r.Replicas[1].Start(ctx); err != nil {
				return err
			}
			if err := r.WaitBalanced(ctx); err != nil {
				return err
			}
			return r.WaitCommitting(ctx, window/2)
		},
	}, {
		Name: "partition stalled", Fault: "SIGSTOP " + victim + ": its partitions are held, nothing on them is committed",
		Start:  func(_ context.Context, r *Rig) error { return r.Replicas[1].Freeze() },
		Alerts: []string{"BillingConsumerStalled"},
		Checks: map[string]Check{
			"Consumer lag per partition": someAbove(0),
			"Commit rate per partition":  someEqual(0),
			"Scrape up per replica":      series("pod", victim, allEqual(0)),
		},
		Hold: window,
		End:  func(_ context.Context, r *Rig) error { return r.Replicas[1].Thaw() },
	}, {
		Name: "provider 5xx storm", Fault: "the provider answers 500 to 30% of new charges",
		Start:  storm,
		Alerts: []string{"BillingPaymentErrorRate"},
		Checks: map[string]Check{
			"Payment error ratio":      someAbove(0.05),
			"Payment requests by code": series("code", "500", someAbove(0)),
			"Retries by kind":          someAbove(0),
		},
		Hold: window,
		End:  func(_ context.Context, r *Rig) error { r.Sim.SetFaults(normal); return nil },
	}, {
		Name: "Postgres down", Fault: "Postgres unreachable: open connections cut, new ones refused",
		Start:  func(_ context.Context, r *Rig) error { r.SetDatabaseDown(true); return nil },
		Alerts: []string{"BillingConsumerStalled"},
		Checks: map[string]Check{
			"Events / s":                 allEqual(0),
			"Total consumer lag":         someAbove(0),
			"Consumer lag per partition": someAbove(0),
		},
		Hold: window,
		End:  func(_ context.Context, r *Rig) error { r.SetDatabaseDown(false); return nil },
	}, {
		Name: "recovered", Fault: "none; the traffic stops so that the backlog drains to 0",
		Start:  func(_ context.Context, r *Rig) error { r.StopProducing(); return nil },
		Alerts: nil,
		Checks: map[string]Check{
			"Total consumer lag":         allEqual(0),
			"Consumer lag per partition": allEqual(0),
			"Payment error ratio":        notAbove(0),
			"Replicas up":                allEqual(2),
			"Scrape up per replica":      allEqual(1),
		},
		MinDuration: 2 * window,
	}}
}

// storm makes the simulator answer 500 to 30% of the charges it processes.
func storm(_ context.Context, r *Rig) error {
	f := normal
	f.ErrorRate = 0.3
	r.Sim.SetFaults(f)
	return nil
}

// PhaseResult is what Prometheus reported when a phase had settled.
type PhaseResult struct {
	Phase               Phase
	Start, Settled, End time.Time
	// Firing is the alerts firing when the phase settled.
	Firing []Alert
	// Values are the checked panels' series at that moment.
	Values map[string]string
	// Queries is the number of dashboard queries evaluated, each with
	// series.
	Queries int
}

// Runner runs phases on a rig and checks them through Prometheus' API.
type Runner struct {
	Rig       *Rig
	Queries   []PanelQuery
	Namespace string
	// NamespaceVar is the dashboard's namespace variable query
	// (label_values(selector, namespace)).
	NamespaceVar string
	// Timeout bounds each phase's wait to settle.
	Timeout time.Duration
	Logf    func(format string, args ...any)
	begin   time.Time
}

// Run runs the phases in order and returns what each showed; it stops at
// the first phase that does not settle as expected within r.Timeout, or
// in which an alert fires that neither it nor the phase before expects.
func (r *Runner) Run(ctx context.Context, phases []Phase) ([]PhaseResult, error) {
	r.begin = time.Now()
	var out []PhaseResult
	var linger []string
	for _, p := range phases {
		res, err := r.phase(ctx, p, linger)
		if err != nil {
			return out, fmt.Errorf("phase %q: %w", p.Name, err)
		}
		out = append(out, res)
		linger = p.Alerts
	}
	return out, nil
}

func (r *Runner) phase(ctx context.Context, p Phase, linger []string) (PhaseResult, error) {
	res := PhaseResult{Phase: p, Start: time.Now()}
	r.Logf("phase %s: %s", p.Name, p.Fault)
	if err := p.Start(ctx, r.Rig); err != nil {
		return res, err
	}
	deadline := time.Now().Add(r.Timeout)
	var why string
	for {
		firing, err := r.Rig.Prom.Firing(ctx)
		if err != nil {
			return res, err
		}
		for _, a := range firing {
			if !slices.Contains(p.Alerts, a.Name) && !slices.Contains(linger, a.Name) {
				return res, fmt.Errorf("%s fires, not expected (firing: %v)", a, firing)
			}
		}
		why = alertsMismatch(p.Alerts, firing)
		if why == "" {
			values, n, problem, err := r.checkPanels(ctx, p)
			if err != nil {
				return res, err
			}
			why = problem
			if why == "" && time.Since(res.Start) >= p.MinDuration {
				res.Settled, res.Firing, res.Values, res.Queries = time.Now(), firing, values, n
				break
			}
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("not settled after %v: %s", r.Timeout, why)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	r.Logf("phase %s settled after %v: firing %v", p.Name, res.Settled.Sub(res.Start).Round(time.Second), res.Firing)
	if err := r.hold(ctx, p); err != nil {
		return res, err
	}
	if p.End != nil {
		if err := p.End(ctx, r.Rig); err != nil {
			return res, err
		}
	}
	res.End = time.Now()
	return res, nil
}

// hold keeps p's fault on for p.Hold, failing as soon as the alerts
// firing differ from those p expects.
func (r *Runner) hold(ctx context.Context, p Phase) error {
	for end := time.Now().Add(p.Hold); time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		firing, err := r.Rig.Prom.Firing(ctx)
		if err != nil {
			return err
		}
		if why := alertsMismatch(p.Alerts, firing); why != "" {
			return fmt.Errorf("while the fault holds: %s", why)
		}
	}
	return nil
}

// alertsMismatch says how the names of firing differ from want ("" when
// they are the same set).
func alertsMismatch(want []string, firing []Alert) string {
	var got []string
	for _, a := range firing {
		if !slices.Contains(got, a.Name) {
			got = append(got, a.Name)
		}
	}
	slices.Sort(got)
	w := slices.Clone(want)
	slices.Sort(w)
	if slices.Equal(got, w) {
		return ""
	}
	return fmt.Sprintf("alerts firing %v, want %v", got, w)
}

// checkPanels evaluates every dashboard query (variables substituted):
// each must return series, and the panels p checks must show what it
// wants. It returns the checked panels' values, the number of queries
// evaluated and the first problem ("" when none).
func (r *Runner) checkPanels(ctx context.Context, p Phase) (map[string]string, int, string, error) {
	vars := Variables{Namespace: r.Namespace, RateInterval: 4 * r.Rig.cfg.Interval, Range: time.Since(r.begin)}
	ns, _, _, err := r.Rig.Prom.API.LabelValues(ctx, "namespace", []string{namespaceSelector(r.NamespaceVar)}, time.Now().Add(-time.Minute), time.Now())
	if err != nil {
		return nil, 0, "", fmt.Errorf("namespace variable: %w", err)
	}
	if !slices.ContainsFunc(ns, func(v model.LabelValue) bool { return string(v) == r.Namespace }) {
		return nil, 0, fmt.Sprintf("the namespace variable (%s) offers %v, not %s", r.NamespaceVar, ns, r.Namespace), nil
	}
	values := map[string]string{}
	seen := map[string]bool{}
	for _, q := range r.Queries {
		v, err := r.Rig.Prom.Query(ctx, vars.Substitute(q.Expr))
		if err != nil {
			return nil, 0, "", fmt.Errorf("%s: %w", q, err)
		}
		if len(v) == 0 {
			return nil, 0, fmt.Sprintf("%s returns nothing: %s", q, vars.Substitute(q.Expr)), nil
		}
		c, ok := p.Checks[q.Panel]
		if !ok || q.RefID != "A" {
			continue
		}
		seen[q.Panel] = true
		values[q.Panel] = show(v)
		if !c.OK(v) {
			return nil, 0, fmt.Sprintf("%s shows %s, want %s", q, show(v), c.Want), nil
		}
	}
	for title := range p.Checks {
		if !seen[title] {
			return nil, 0, "", fmt.Errorf("the dashboard has no panel %q to check", title)
		}
	}
	return values, len(r.Queries), "", nil
}

// namespaceSelector is the selector of a label_values(selector, label)
// query.
func namespaceSelector(q string) string {
	s := strings.TrimSuffix(strings.TrimPrefix(q, "label_values("), ")")
	if i := strings.LastIndex(s, ","); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}
