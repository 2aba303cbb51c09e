package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"time"
)

// Series is one line of a timeline plot: a step function.
type Series struct {
	Name   string  `json:"name"`
	Color  string  `json:"color"`
	Points []Point `json:"points"`
}

// Panel is one plot: its series share the axes. Marker, when non-zero, draws
// a dashed vertical line at that time labelled MarkerLabel (e.g. the lower
// bound).
type Panel struct {
	Title       string        `json:"title"`
	YLabel      string        `json:"yLabel"`
	Series      []Series      `json:"series"`
	Marker      time.Duration `json:"marker,omitempty"`
	MarkerLabel string        `json:"markerLabel,omitempty"`
}

const (
	panelW, panelH   = 720, 300
	marginL, marginR = 60, 20
	marginT, marginB = 40, 45
)

// WriteTimelineSVG writes the panels one below the other as an SVG image:
// step lines, axes with ticks, and a legend per panel.
func WriteTimelineSVG(w io.Writer, title string, panels []Panel) error {
	height := 40 + len(panels)*panelH
	ew := &errWriter{w: w}
	ew.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		panelW, height, panelW, height)
	ew.printf(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	ew.printf(`<text x="%d" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", marginL, html.EscapeString(title))
	for i, p := range panels {
		writePanel(ew, p, 40+i*panelH)
	}
	ew.printf("</svg>\n")
	return ew.err
}

func writePanel(ew *errWriter, p Panel, top int) {
	var maxT time.Duration
	maxV := 1
	for _, s := range p.Series {
		for _, pt := range s.Points {
			maxT = max(maxT, pt.T)
			maxV = max(maxV, pt.V)
		}
	}
	maxT = max(maxT, p.Marker)
	xMax := niceCeil(max(maxT.Seconds(), 1))
	yMax := niceCeil(float64(maxV))
	x0, y0 := float64(marginL), float64(top+panelH-marginB)
	pw, ph := float64(panelW-marginL-marginR), float64(panelH-marginT-marginB)
	x := func(t time.Duration) float64 { return x0 + t.Seconds()/xMax*pw }
	y := func(v int) float64 { return y0 - float64(v)/yMax*ph }

	ew.printf(`<text x="%d" y="%d" font-size="14">%s</text>`+"\n", marginL, top+marginT-14, html.EscapeString(p.Title))
	// Grid, ticks and axes.
	for i := 0; i <= 5; i++ {
		tv := xMax * float64(i) / 5
		xx := x0 + pw*float64(i)/5
		ew.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", xx, y0, xx, y0-ph)
		ew.printf(`<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", xx, y0+16, trimFloat(tv))
		vv := yMax * float64(i) / 5
		yy := y0 - ph*float64(i)/5
		ew.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", x0, yy, x0+pw, yy)
		ew.printf(`<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-6, yy+4, trimFloat(vv))
	}
	ew.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x0, y0, x0+pw, y0)
	ew.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x0, y0, x0, y0-ph)
	ew.printf(`<text x="%.1f" y="%.1f" text-anchor="middle">seconds</text>`+"\n", x0+pw/2, y0+34)
	ew.printf(`<text x="14" y="%.1f" text-anchor="middle" transform="rotate(-90 14 %.1f)">%s</text>`+"\n",
		y0-ph/2, y0-ph/2, html.EscapeString(p.YLabel))
	if p.Marker > 0 {
		mx := x(p.Marker)
		ew.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="gray" stroke-dasharray="4 3"/>`+"\n", mx, y0, mx, y0-ph)
		ew.printf(`<text x="%.1f" y="%.1f" fill="gray">%s</text>`+"\n", mx+4, y0-ph+12, html.EscapeString(p.MarkerLabel))
	}
	for i, s := range p.Series {
		if len(s.Points) > 0 {
			ew.printf(`<polyline fill="none" stroke="%s" stroke-width="2" points="`, html.EscapeString(s.Color))
			prev := s.Points[0]
			ew.printf("%.1f,%.1f", x(prev.T), y(prev.V))
			for _, pt := range s.Points[1:] {
				ew.printf(" %.1f,%.1f %.1f,%.1f", x(pt.T), y(prev.V), x(pt.T), y(pt.V))
				prev = pt
			}
			ew.printf("\"/>\n")
		}
		ly := float64(top+marginT) + float64(i)*16
		ew.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n",
			x0+pw-170, ly, x0+pw-150, ly, html.EscapeString(s.Color))
		ew.printf(`<text x="%.1f" y="%.1f">%s</text>`+"\n", x0+pw-145, ly+4, html.EscapeString(s.Name))
	}
}

// niceCeil rounds v up to 1, 2, 2.5 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	exp := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*exp >= v {
			return m * exp
		}
	}
	return 10 * exp
}

func trimFloat(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}
