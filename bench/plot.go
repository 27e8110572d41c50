package bench

import (
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Save renders the plot as a PNG (the file's extension picks the format).
// Series named "... p95" are dashed in the colour of their "... p50".
func (p Plot) Save(path string) error {
	pl := plot.New()
	pl.Title.Text = p.Title
	pl.X.Label.Text = p.XLabel
	pl.Y.Label.Text = p.YLabel
	if p.LogX {
		pl.X.Scale, pl.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	if p.LogY {
		pl.Y.Scale, pl.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	pl.Legend.Top = true
	pl.Legend.Left = true
	colour := map[string]int{}
	for _, s := range p.Series {
		xys := plotter.XYs{}
		for i := range s.X {
			if (p.LogX && s.X[i] <= 0) || (p.LogY && s.Y[i] <= 0) {
				continue // nothing to draw on a log axis
			}
			xys = append(xys, plotter.XY{X: s.X[i], Y: s.Y[i]})
		}
		if len(xys) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return err
		}
		key := strings.TrimSuffix(strings.TrimSuffix(s.Name, " p95"), " p50")
		c, ok := colour[key]
		if !ok {
			c = len(colour)
			colour[key] = c
		}
		line.Color, points.Color = plotutil.Color(c), plotutil.Color(c)
		points.Shape = plotutil.Shape(c)
		if strings.HasSuffix(s.Name, " p95") {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		pl.Add(line, points)
		pl.Legend.Add(s.Name, line, points)
	}
	// One value on a log axis (a run of one level): gonum would widen the
	// range by ±1, to 0, which a log scale cannot draw.
	for _, ax := range []*plot.Axis{&pl.X, &pl.Y} {
		if _, isLog := ax.Scale.(plot.LogScale); isLog && ax.Min == ax.Max && ax.Min > 0 {
			ax.Min, ax.Max = ax.Min/2, ax.Max*2
		}
	}
	return pl.Save(9*vg.Inch, 6*vg.Inch, path)
}
