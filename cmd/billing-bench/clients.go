package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// clientModes measure the two payment clients of BILLING_PAYMENT_CLIENT
// against the simulator over plain HTTP and over TLS (tlsProvider: a test
// CA, HTTP/2 offered as a real https provider offers it, connections kept
// alive), in the default mode otherwise: the measurement the default
// client is chosen by. With -baseline, the baseline binary (net/http
// only) is measured next to each nethttp mode, without the variable it
// does not know.
var clientModes = []mode{
	{name: "nethttp", env: []string{"BILLING_PAYMENT_CLIENT=nethttp"}},
	{name: "nethttp-tls", env: []string{"BILLING_PAYMENT_CLIENT=nethttp"}, tls: true},
	{name: "fasthttp", env: []string{"BILLING_PAYMENT_CLIENT=fasthttp"}},
	{name: "fasthttp-tls", env: []string{"BILLING_PAYMENT_CLIENT=fasthttp"}, tls: true},
}

// clientLatencies are the provider latencies of the client modes: at 0 ms
// the client's CPU is the largest share of the consumer's.
var clientLatencies = []time.Duration{0}

// clientVar is the variable the client modes set.
const clientVar = "BILLING_PAYMENT_CLIENT="

// measureClients runs every client mode that -only selects ("clients", a
// mode:latency pair, or nothing) unless -skip-clients, appending to rep.
func (b *bench) measureClients(ctx context.Context, rep *report) error {
	o := b.o
	if o.skipClients {
		return nil
	}
	for _, m := range clientModes {
		for _, l := range clientLatencies {
			if !o.selected("clients") && !o.selected(fmt.Sprintf("%s:%v", m.name, l)) {
				continue
			}
			// The baseline predates the variable: it runs beside the
			// nethttp modes only.
			if err := b.measureMode(ctx, rep, m, l, slices.Contains(m.env, clientVar+"nethttp")); err != nil {
				return err
			}
		}
	}
	return nil
}

// phaseEnv is the mode's own settings for a run of the binary under test
// or of the baseline, which predates BILLING_PAYMENT_CLIENT (its strict
// configuration would refuse it) and only has net/http.
func phaseEnv(m mode, baseline bool) []string {
	if !baseline {
		return m.env
	}
	return slices.DeleteFunc(slices.Clone(m.env), func(kv string) bool { return strings.HasPrefix(kv, clientVar) })
}
