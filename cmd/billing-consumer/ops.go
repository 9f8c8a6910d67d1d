package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// opsHandler serves /metrics from reg, /healthz (the process answers:
// never a dependency check, or a database outage would restart every pod)
// and /readyz (ready() == nil, else 503 with the reason), each answer
// followed by detail() on a line of its own when it is not empty: what an
// operator should know whether or not this instance is ready (partitions
// with lag that no member of the group owns).
func opsHandler(reg *prometheus.Registry, ready func(context.Context) error, detail func() string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		body, code := "ready", http.StatusOK
		if err := ready(ctx); err != nil {
			body, code = "not ready: "+err.Error(), http.StatusServiceUnavailable
		}
		if d := detail(); d != "" {
			body += "\n" + d
		}
		if code != http.StatusOK {
			http.Error(w, body, code)
			return
		}
		fmt.Fprintln(w, body)
	})
	return mux
}

// pprofHandler serves net/http/pprof under /debug/pprof/ on its own mux,
// for the opt-in BILLING_PPROF_ADDR listener: profiles never share the
// metrics port that Prometheus (and the NetworkPolicy) open.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
