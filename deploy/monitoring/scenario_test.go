package monitoring

import (
	"testing"
	"time"

	"github.com/prometheus/common/model"
)

func TestAlertsMismatch(t *testing.T) {
	stalled := []Alert{{Name: "BillingConsumerStalled", Labels: "partition=0"}, {Name: "BillingConsumerStalled", Labels: "partition=1"}}
	for _, c := range []struct {
		want   []string
		firing []Alert
		same   bool
	}{
		{nil, nil, true},
		{[]string{"BillingConsumerStalled"}, stalled, true}, // instances of one alert count once
		{nil, stalled, false},
		{[]string{"BillingConsumerStalled"}, nil, false},
		{[]string{"BillingConsumerStalled", "BillingPaymentErrorRate"}, stalled, false},
	} {
		if got := alertsMismatch(c.want, c.firing) == ""; got != c.same {
			t.Errorf("alertsMismatch(%v, %v) same = %v, want %v", c.want, c.firing, got, c.same)
		}
	}
}

func TestSubstitute(t *testing.T) {
	v := Variables{Namespace: "billing-live", RateInterval: 4 * time.Second, Range: 95*time.Second + 300*time.Millisecond}
	got := v.Substitute(`sum(rate(x{namespace=~"$namespace"}[$__rate_interval])) + sum(increase(y[$__range])) + z[$__interval]`)
	want := `sum(rate(x{namespace=~"billing-live"}[4s])) + sum(increase(y[1m35s])) + z[4s]`
	if got != want {
		t.Errorf("Substitute:\n got %s\nwant %s", got, want)
	}
}

func TestNamespaceSelector(t *testing.T) {
	if got := namespaceSelector(`label_values(billing_events_total{job="billing-consumer"}, namespace)`); got != `billing_events_total{job="billing-consumer"}` {
		t.Errorf("namespaceSelector = %q", got)
	}
}

func TestChecks(t *testing.T) {
	vec := func(vals ...float64) model.Vector {
		var v model.Vector
		for i, x := range vals {
			v = append(v, &model.Sample{Metric: model.Metric{"pod": model.LabelValue([]string{"a", "b"}[i])}, Value: model.SampleValue(x)})
		}
		return v
	}
	for _, c := range []struct {
		name string
		c    Check
		v    model.Vector
		ok   bool
	}{
		{"someAbove", someAbove(0), vec(0, 3), true},
		{"someAbove none", someAbove(0), vec(0, 0), false},
		{"allEqual", allEqual(1), vec(1, 1), true},
		{"allEqual one off", allEqual(1), vec(1, 0), false},
		{"allEqual empty", allEqual(0), nil, false},
		{"someEqual", someEqual(0), vec(2, 0), true},
		{"notAbove", notAbove(0.05), vec(0.01, 0), true},
		{"notAbove over", notAbove(0.05), vec(0.2, 0), false},
		{"series", series("pod", "b", allEqual(0)), vec(1, 0), true},
		{"series other", series("pod", "a", allEqual(0)), vec(1, 0), false},
		{"series missing", series("pod", "c", allEqual(0)), vec(1, 0), false},
	} {
		if got := c.c.OK(c.v); got != c.ok {
			t.Errorf("%s (%s) on %s = %v, want %v", c.name, c.c.Want, show(c.v), got, c.ok)
		}
	}
}

func TestLegend(t *testing.T) {
	m := model.Metric{"topic": "orders", "partition": "3"}
	if got := legend("{{topic}}/{{ partition }}", m); got != "orders/3" {
		t.Errorf("legend = %q", got)
	}
}
