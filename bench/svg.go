package bench

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// The SVG plots are written by hand, with no dependency: a chart is a frame with two axes (linear or log10), ticks,
// grid lines, labelled units, a title, a legend and polylines. Every series is a <g class="series"
// data-name="..."> element, so tests and scripts can find it.

const (
	svgW, svgH                     = 1000, 640
	padL, padR, padT, padB float64 = 90, 220, 70, 70
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

type axis struct {
	lo, hi float64
	log    bool
	label  string
}

// scale maps v to [0, 1] along the axis.
func (a axis) scale(v float64) float64 {
	if a.log {
		v = math.Max(v, a.lo)
		return (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	}
	return (v - a.lo) / (a.hi - a.lo)
}

// ticks returns tick values: 1-2-5 steps for a linear axis, 1-2-5 per decade for a log axis (just decades when
// the axis spans more than three).
func (a axis) ticks() []float64 {
	var out []float64
	if a.log {
		d0, d1 := int(math.Floor(math.Log10(a.lo))), int(math.Ceil(math.Log10(a.hi)))
		mult := []float64{1, 2, 5}
		if d1-d0 > 3 {
			mult = []float64{1}
		}
		for d := d0; d <= d1; d++ {
			for _, m := range mult {
				v := m * math.Pow(10, float64(d))
				if v >= a.lo*(1-1e-9) && v <= a.hi*(1+1e-9) {
					out = append(out, v)
				}
			}
		}
		return out
	}
	step := niceStep((a.hi - a.lo) / 6)
	for v := math.Ceil(a.lo/step) * step; v <= a.hi+step*1e-9; v += step {
		out = append(out, v)
	}
	return out
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// logRange widens [lo, hi] to whole 1-2-5 steps for a log axis.
func logRange(lo, hi float64) (float64, float64) {
	if lo <= 0 {
		lo = hi / 1000
	}
	if lo <= 0 {
		return 0.1, 1
	}
	down := math.Pow(10, math.Floor(math.Log10(lo)))
	up := math.Pow(10, math.Ceil(math.Log10(hi)))
	for _, m := range []float64{5, 2} {
		if m*down <= lo {
			down *= m
			break
		}
	}
	for _, m := range []float64{0.2, 0.5} {
		if m*up >= hi {
			up *= m
			break
		}
	}
	if up <= down {
		up = down * 10
	}
	return down, up
}

type chart struct {
	b      bytes.Buffer
	x, y   axis
	title  string
	legend []legendEntry
}

type legendEntry struct {
	name, color, dash string
}

func (c *chart) px(v float64) float64 { return padL + c.x.scale(v)*(svgW-padL-padR) }
func (c *chart) py(v float64) float64 { return svgH - padB - c.y.scale(v)*(svgH-padT-padB) }

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func tickLabel(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 1000 && math.Mod(v, 1000) == 0:
		return strconv.FormatFloat(v/1000, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

func (c *chart) begin(subtitle string) {
	fmt.Fprintf(&c.b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Arial, sans-serif" font-size="13">`+"\n",
		svgW, svgH, svgW, svgH)
	fmt.Fprintf(&c.b, `<title>%s</title>`+"\n", esc(c.title))
	fmt.Fprintf(&c.b, `<rect x="0" y="0" width="%d" height="%d" fill="white"/>`+"\n", svgW, svgH)
	fmt.Fprintf(&c.b, `<text x="%s" y="30" font-size="18" font-weight="bold">%s</text>`+"\n", num(padL), esc(c.title))
	if subtitle != "" {
		fmt.Fprintf(&c.b, `<text x="%s" y="50" font-size="12" fill="#555">%s</text>`+"\n", num(padL), esc(subtitle))
	}
	x0, x1, y0, y1 := padL, float64(svgW)-padR, float64(svgH)-padB, padT
	c.b.WriteString(`<g class="grid" stroke="#e3e3e3" stroke-width="1">` + "\n")
	for _, t := range c.x.ticks() {
		fmt.Fprintf(&c.b, `<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(c.px(t)), num(y0), num(c.px(t)), num(y1))
	}
	for _, t := range c.y.ticks() {
		fmt.Fprintf(&c.b, `<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(x0), num(c.py(t)), num(x1), num(c.py(t)))
	}
	c.b.WriteString("</g>\n")
	c.b.WriteString(`<g class="axes" stroke="black" stroke-width="1.2" fill="none">` + "\n")
	fmt.Fprintf(&c.b, `<polyline points="%s,%s %s,%s %s,%s"/>`+"\n", num(x0), num(y1), num(x0), num(y0), num(x1), num(y0))
	c.b.WriteString("</g>\n")
	c.b.WriteString(`<g class="ticks" font-size="12">` + "\n")
	for _, t := range c.x.ticks() {
		fmt.Fprintf(&c.b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="black"/><text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n",
			num(c.px(t)), num(y0), num(c.px(t)), num(y0+5), num(c.px(t)), num(y0+20), tickLabel(t))
	}
	for _, t := range c.y.ticks() {
		fmt.Fprintf(&c.b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="black"/><text x="%s" y="%s" text-anchor="end">%s</text>`+"\n",
			num(x0-5), num(c.py(t)), num(x0), num(c.py(t)), num(x0-8), num(c.py(t)+4), tickLabel(t))
	}
	c.b.WriteString("</g>\n")
	fmt.Fprintf(&c.b, `<text class="xlabel" x="%s" y="%s" text-anchor="middle" font-size="14">%s</text>`+"\n",
		num((x0+x1)/2), num(float64(svgH)-20), esc(c.x.label))
	fmt.Fprintf(&c.b, `<text class="ylabel" x="%s" y="%s" text-anchor="middle" font-size="14" transform="rotate(-90 %s %s)">%s</text>`+"\n",
		num(25), num((y0+y1)/2), num(25), num((y0+y1)/2), esc(c.y.label))
}

// line draws one series as a polyline of (x, y) data points; points outside the y axis are clamped.
func (c *chart) line(name, color, dash string, xs, ys []float64) {
	fmt.Fprintf(&c.b, `<g class="series" data-name="%s" fill="none" stroke="%s" stroke-width="2"`, esc(name), color)
	if dash != "" {
		fmt.Fprintf(&c.b, ` stroke-dasharray="%s"`, dash)
	}
	c.b.WriteString(">\n")
	var pts []string
	flush := func() {
		if len(pts) == 1 {
			p := strings.Split(pts[0], ",")
			fmt.Fprintf(&c.b, `<circle cx="%s" cy="%s" r="2.5" fill="%s"/>`+"\n", p[0], p[1], color)
		} else if len(pts) > 1 {
			fmt.Fprintf(&c.b, `<polyline points="%s"/>`+"\n", strings.Join(pts, " "))
		}
		pts = pts[:0]
	}
	for i := range xs {
		if math.IsNaN(ys[i]) { // a gap in the series
			flush()
			continue
		}
		y := math.Min(math.Max(ys[i], c.y.lo), c.y.hi)
		pts = append(pts, num(c.px(xs[i]))+","+num(c.py(y)))
	}
	flush()
	c.b.WriteString("</g>\n")
	c.legend = append(c.legend, legendEntry{name, color, dash})
}

// vmark draws a labelled vertical line at data x, the label running down beside it.
func (c *chart) vmark(x float64, label string) {
	px := c.px(x)
	fmt.Fprintf(&c.b, `<g class="event" data-label="%s"><line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#444" stroke-width="1.2" stroke-dasharray="2,3"/>`,
		esc(label), num(px), num(padT), num(px), num(float64(svgH)-padB))
	fmt.Fprintf(&c.b, `<text x="%s" y="%s" font-size="11" fill="#222" transform="rotate(90 %s %s)">%s</text></g>`+"\n",
		num(px+3), num(padT+4), num(px+3), num(padT+4), esc(label))
}

// band shades [x0, x1] with a label (the warm-up).
func (c *chart) band(x0, x1 float64, label string) {
	fmt.Fprintf(&c.b, `<g class="band"><rect x="%s" y="%s" width="%s" height="%s" fill="#f0f0f0"/><text x="%s" y="%s" font-size="11" fill="#777">%s</text></g>`+"\n",
		num(c.px(x0)), num(padT), num(c.px(x1)-c.px(x0)), num(float64(svgH)-padB-padT), num(c.px(x0)+4), num(float64(svgH)-padB-6), esc(label))
}

func (c *chart) end() []byte {
	x := float64(svgW) - padR + 20
	c.b.WriteString(`<g class="legend" font-size="12">` + "\n")
	for i, e := range c.legend {
		y := padT + 10 + float64(i)*20
		fmt.Fprintf(&c.b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2.5"`, num(x), num(y), num(x+28), num(y), e.color)
		if e.dash != "" {
			fmt.Fprintf(&c.b, ` stroke-dasharray="%s"`, e.dash)
		}
		fmt.Fprintf(&c.b, `/><text x="%s" y="%s">%s</text>`+"\n", num(x+34), num(y+4), esc(e.name))
	}
	c.b.WriteString("</g>\n</svg>\n")
	return c.b.Bytes()
}

// TTFTCDFSVG plots the cumulative distribution of TTFT of each run on a log time axis, with guides at p50, p90
// and p99.
func TTFTCDFSVG(title string, runs []*RunReport) []byte {
	lo, hi := math.Inf(1), 0.0
	for _, r := range runs {
		if len(r.ttft) > 0 {
			lo, hi = math.Min(lo, r.ttft[0]), math.Max(hi, r.ttft[len(r.ttft)-1])
		}
	}
	if hi == 0 {
		lo, hi = 1, 1000
	}
	lo, hi = logRange(lo, hi)
	c := &chart{title: title, x: axis{lo: lo, hi: hi, log: true, label: "time to first token (ms, log scale)"},
		y: axis{lo: 0, hi: 100, label: "requests with TTFT <= x (%)"}}
	c.begin("cumulative distribution over successful streamed requests; dotted guides at p50, p90, p99")
	for _, p := range []float64{50, 90, 99} {
		fmt.Fprintf(&c.b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#999" stroke-dasharray="1,3"/><text x="%s" y="%s" font-size="10" fill="#777">p%g</text>`+"\n",
			num(padL), num(c.py(p)), num(float64(svgW)-padR), num(c.py(p)), num(float64(svgW)-padR-24), num(c.py(p)-3), p)
	}
	for i, r := range runs {
		n := len(r.ttft)
		if n == 0 {
			c.legend = append(c.legend, legendEntry{r.Name + " (no data)", palette[i%len(palette)], ""})
			continue
		}
		// At most ~600 steps: enough to look continuous, small enough to stay a small file.
		stride := max(1, n/600)
		var xs, ys []float64
		for k := 0; k < n; k += stride {
			xs = append(xs, r.ttft[k])
			ys = append(ys, 100*float64(k+1)/float64(n))
		}
		if xs[len(xs)-1] != r.ttft[n-1] || ys[len(ys)-1] != 100 {
			xs, ys = append(xs, r.ttft[n-1]), append(ys, 100)
		}
		c.line(fmt.Sprintf("%s (p99 %s ms)", r.Name, f3(r.TTFT.P99)), palette[i%len(palette)], "", xs, ys)
	}
	return c.end()
}

// TimelineSVG plots TTFT p50 (solid) and p99 (dashed) of each one-second window for each run, with the warm-up
// shaded and the scenario's events as labelled vertical lines.
func TimelineSVG(title string, runs []*RunReport, events []EventRecord) []byte {
	lo, hi, span := math.Inf(1), 0.0, 1.0
	for _, r := range runs {
		for _, w := range r.Series {
			if w.TTFTP50 > 0 {
				lo, hi = math.Min(lo, w.TTFTP50), math.Max(hi, w.TTFTP99)
			}
			span = math.Max(span, w.T+1)
		}
	}
	if hi == 0 {
		lo, hi = 1, 1000
	}
	lo, hi = logRange(lo, hi)
	c := &chart{title: title, x: axis{lo: 0, hi: span, label: "time since start of load (s)"},
		y: axis{lo: lo, hi: hi, log: true, label: "time to first token (ms, log scale)"}}
	c.begin("per one-second window of send time: p50 solid, p99 dashed; events as dotted vertical lines")
	if len(runs) > 0 && runs[0].WarmupS > 0 {
		c.band(0, runs[0].WarmupS, "warm-up")
	}
	for _, e := range events {
		c.vmark(e.At.Seconds(), e.Label)
	}
	for i, r := range runs {
		color := palette[i%len(palette)]
		var xs, p50, p99 []float64
		for _, w := range r.Series {
			xs = append(xs, w.T+0.5)
			if w.TTFTP50 > 0 {
				p50, p99 = append(p50, w.TTFTP50), append(p99, w.TTFTP99)
			} else {
				p50, p99 = append(p50, math.NaN()), append(p99, math.NaN())
			}
		}
		c.line(r.Name+" p50", color, "", xs, p50)
		c.line(r.Name+" p99", color, "6,4", xs, p99)
	}
	return c.end()
}
