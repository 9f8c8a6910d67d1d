package monitoring

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
	"time"
)

// line is one series of a chart.
type line struct {
	name   string
	points []point
}

type point struct {
	t time.Time
	v float64
}

// band is a phase drawn behind a chart.
type band struct {
	name     string
	from, to time.Time
}

var palette = []string{"#2b6cb0", "#c05621", "#2f855a", "#9b2c2c", "#6b46c1", "#b7791f", "#2c7a7b", "#97266d"}

const (
	chartW, chartH         = 900, 360
	padL, padR, padT, padB = 70, 190, 50, 40
	plotW, plotH           = chartW - padL - padR, chartH - padT - padB
)

// svgHead opens a chart: title, phase bands and their names, time axis.
func svgHead(b *strings.Builder, title string, bands []band, t0, t1 time.Time) func(time.Time) float64 {
	x := func(t time.Time) float64 {
		return padL + float64(plotW)*t.Sub(t0).Seconds()/math.Max(t1.Sub(t0).Seconds(), 1)
	}
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="11">`+"\n", chartW, chartH, chartW, chartH)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(b, `<text x="%d" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(title))
	for i, p := range bands {
		fill := "#f7fafc"
		if i%2 == 1 {
			fill = "#edf2f7"
		}
		fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x(p.from), padT, x(p.to)-x(p.from), plotH, fill)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" fill="#4a5568" font-size="10">%s</text>`+"\n", x(p.from)+2, padT-4-(i%2)*11, html.EscapeString(p.name))
	}
	for s := 0.0; s <= t1.Sub(t0).Seconds(); s += 30 {
		xs := x(t0.Add(time.Duration(s) * time.Second))
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#a0aec0"/>`+"\n", xs, xs, padT+plotH, padT+plotH+4)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%.0fs</text>`+"\n", xs, padT+plotH+16, s)
	}
	fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#333"/>`+"\n", padL, padL+plotW, padT+plotH, padT+plotH)
	return x
}

// lineChart draws lines over time (seconds from t0) with the phases
// behind them; unit names the y axis.
func lineChart(title, unit string, lines []line, bands []band, t0, t1 time.Time) string {
	var b strings.Builder
	x := svgHead(&b, title, bands, t0, t1)
	top := 0.0
	for _, l := range lines {
		for _, p := range l.points {
			if !math.IsNaN(p.v) && !math.IsInf(p.v, 0) {
				top = math.Max(top, p.v)
			}
		}
	}
	top = niceCeil(top)
	y := func(v float64) float64 { return padT + float64(plotH)*(1-v/top) }
	for i := 0; i <= 4; i++ {
		v := top * float64(i) / 4
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e2e8f0"/>`+"\n", padL, padL+plotW, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", padL-6, y(v), short(v))
	}
	fmt.Fprintf(&b, `<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", padT+plotH/2, html.EscapeString(unit))
	for i, l := range lines {
		c := palette[i%len(palette)]
		var d strings.Builder
		pen := "M"
		for _, p := range l.points {
			if math.IsNaN(p.v) || math.IsInf(p.v, 0) {
				pen = "M"
				continue
			}
			fmt.Fprintf(&d, "%s%.1f %.1f ", pen, x(p.t), y(p.v))
			pen = "L"
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", strings.TrimSpace(d.String()), c)
		ly := padT + 14*i
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			padL+plotW+12, ly, c, padL+plotW+26, ly+9, html.EscapeString(l.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// spansChart draws one row per alert instance, a bar while it fired.
func spansChart(title string, spans []span, bands []band, t0, t1 time.Time) string {
	var b strings.Builder
	x := svgHead(&b, title, bands, t0, t1)
	var rows []string
	for _, s := range spans {
		if !slices.Contains(rows, s.alert) {
			rows = append(rows, s.alert)
		}
	}
	rowH := float64(plotH) / float64(max(len(rows), 1))
	for i, s := range spans {
		r := slices.Index(rows, s.alert)
		c := palette[i%len(palette)]
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" opacity="0.85"/>`+"\n",
			x(s.from), padT+rowH*float64(r)+rowH*0.2, math.Max(x(s.to)-x(s.from), 1), rowH*0.6, c)
	}
	for r, name := range rows {
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" dominant-baseline="middle">%s</text>`+"\n",
			padL+plotW+8, padT+rowH*float64(r)+rowH/2, html.EscapeString(name))
	}
	if len(rows) == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d">no alert fired</text>`+"\n", padL+10, padT+plotH/2)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for 0).
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// short formats an axis value: 1.5, 20, 3k.
func short(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%gk", math.Round(v/100)/10)
	}
	return fmt.Sprintf("%g", math.Round(v*100)/100)
}
