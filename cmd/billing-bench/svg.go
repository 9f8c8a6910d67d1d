package main

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// targetRate is the events/s target of the default mode per provider
// latency, drawn on the chart.
var targetRate = map[time.Duration]float64{0: 5000, 20 * time.Millisecond: 3000, 100 * time.Millisecond: 1000}

// chartSVG draws events/s per provider latency as grouped bars, sequential
// next to default, on a logarithmic y axis, with the default mode's
// targets as dashed marks. Plain SVG written by hand: no chart library.
func chartSVG(results []result) string {
	const (
		width, height            = 760, 440
		left, right, top, bottom = 80, 150, 56, 64
		plotW, plotH             = width - left - right, height - top - bottom
	)
	colors := map[string]string{"sequential": "#9aa5b1", "default": "#2b6cb0"}

	y, minDec, maxDec := logScale(results, top, plotH)

	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	p(`<text x="%d" y="24" font-size="15" font-weight="bold">billing-consumer throughput by payment-provider latency</text>`+"\n", left)
	p(`<text x="%d" y="42" fill="#555">events/s draining a backlog; real Kafka and Postgres (fsync on) on the same machine</text>`+"\n", left)

	// Decade gridlines and labels, with faint lines at 2..9 of each decade.
	for d := minDec; d <= maxDec; d++ {
		v := math.Pow(10, d)
		p(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#cccccc"/>`+"\n", left, left+plotW, y(v), y(v))
		p(`<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-8, y(v), thousands(v))
		for k := 2.0; k < 10 && d < maxDec; k++ {
			p(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#f0f0f0"/>`+"\n", left, left+plotW, y(k*v), y(k*v))
		}
	}
	p(`<text transform="translate(22 %d) rotate(-90)" text-anchor="middle">events/s (log scale)</text>`+"\n", top+plotH/2)
	p(`<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#333"/>`+"\n", left, left+plotW, top+plotH, top+plotH)
	p(`<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#333"/>`+"\n", left, left, top, top+plotH)

	groupW := float64(plotW) / float64(len(latencies))
	barW := groupW * 0.28
	for i, l := range latencies {
		gx := float64(left) + groupW*float64(i)
		for j, m := range modes {
			var r *result
			for k := range results {
				if results[k].Mode == m.name && results[k].Latency == l {
					r = &results[k]
				}
			}
			if r == nil {
				continue
			}
			x := gx + groupW/2 - barW + float64(j)*barW
			barTop := y(r.TP.Rate)
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %s: %.0f events/s</title></rect>`+"\n",
				x+2, barTop, barW-4, float64(height-bottom)-barTop, colors[m.name], m.name, ms(l), r.TP.Rate)
			// The value goes inside the bar's top, clear of the target mark,
			// unless the bar is too short to hold it.
			if float64(height-bottom)-barTop > 24 {
				p(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#ffffff" font-weight="bold">%s</text>`+"\n", x+barW/2, barTop+16, thousands(r.TP.Rate))
			} else {
				p(`<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x+barW/2, barTop-6, thousands(r.TP.Rate))
			}
			if t, ok := targetRate[l]; ok && m.name == "default" {
				p(`<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#c53030" stroke-width="2" stroke-dasharray="5 3"/>`+"\n",
					x-4, x+barW+4, y(t), y(t))
			}
		}
		p(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", gx+groupW/2, top+plotH+20, ms(l))
	}
	p(`<text x="%d" y="%d" text-anchor="middle">payment-provider latency</text>`+"\n", left+plotW/2, height-18)

	lx := left + plotW + 20
	for i, m := range modes {
		p(`<rect x="%d" y="%d" width="14" height="14" fill="%s"/>`+"\n", lx, top+i*22, colors[m.name])
		p(`<text x="%d" y="%d" dominant-baseline="middle">%s</text>`+"\n", lx+20, top+i*22+7, m.name)
	}
	p(`<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#c53030" stroke-width="2" stroke-dasharray="5 3"/>`+"\n", lx, lx+14, top+2*22+7, top+2*22+7)
	p(`<text x="%d" y="%d" dominant-baseline="middle">target (default)</text>`+"\n", lx+20, top+2*22+7)
	p("</svg>\n")
	return b.String()
}

// logScale returns the y coordinate of a value on a logarithmic axis of
// whole decades from top to top+plotH that holds every rate of results
// and every target, and the axis' first and last decades (exponents).
func logScale(results []result, top, plotH float64) (y func(float64) float64, minDec, maxDec float64) {
	hi := 1.0
	lo := math.Inf(1)
	for _, r := range results {
		hi = max(hi, r.TP.Rate, targetRate[r.Latency])
		if r.TP.Rate > 0 {
			lo = min(lo, r.TP.Rate)
		}
	}
	minDec = math.Floor(math.Log10(max(1, min(lo, hi))))
	maxDec = math.Ceil(math.Log10(hi))
	if maxDec <= minDec {
		maxDec = minDec + 1
	}
	y = func(v float64) float64 {
		if v <= 0 {
			return top + plotH
		}
		f := (math.Log10(v) - minDec) / (maxDec - minDec)
		return top + plotH - math.Max(0, math.Min(1, f))*plotH
	}
	return y, minDec, maxDec
}

// thousands formats v as an integer with comma separators.
func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
