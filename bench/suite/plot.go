package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Line styles tell the systems apart; colours tell the payload sizes
// apart.
var systemDashes = map[string][]vg.Length{
	sysReprise:   nil,
	sysJetStream: {vg.Points(6), vg.Points(3)},
	sysReverb:    {vg.Points(1.5), vg.Points(2.5)},
}

var systemShapes = map[string]draw.GlyphDrawer{
	sysReprise:   draw.CircleGlyph{},
	sysJetStream: draw.SquareGlyph{},
	sysReverb:    draw.TriangleGlyph{},
}

// plotThroughput draws one mode's figure, like the Reverb paper's Figures
// 5 and 6: items/s and bytes/s against clients, one line per system and
// payload size.
func plotThroughput(path, mode string, points []Point) error {
	title := map[string]string{"insert": "Inserts", "sample": "Samples"}[mode]
	items, bytes := newLogPlot(title+": items/s", "items/s"), newLogPlot(title+": bytes/s", "bytes/s")
	var clients []int
	for _, p := range points {
		if p.Mode == mode && !slices.Contains(clients, p.Clients) {
			clients = append(clients, p.Clients)
		}
	}
	slices.Sort(clients)
	for _, pl := range []*plot.Plot{items, bytes} {
		pl.X.Tick.Marker = intTicks(clients)
	}
	legend := plot.NewLegend()
	legend.Top, legend.Left = true, true
	payloads := payloadsIn(points)
	drawn := 0
	for _, sys := range []string{sysReprise, sysJetStream, sysReverb} {
		for i, payload := range payloads {
			var xyItems, xyBytes plotter.XYs
			for _, c := range clients {
				if p := find(points, sys, mode, payload, c); p != nil && p.ItemsPerSec > 0 {
					xyItems = append(xyItems, plotter.XY{X: float64(c), Y: p.ItemsPerSec})
					xyBytes = append(xyBytes, plotter.XY{X: float64(c), Y: p.BytesPerSec})
				}
			}
			if len(xyItems) == 0 {
				continue
			}
			for j, target := range []struct {
				pl  *plot.Plot
				xys plotter.XYs
			}{{items, xyItems}, {bytes, xyBytes}} {
				line, pts, err := plotter.NewLinePoints(target.xys)
				if err != nil {
					return err
				}
				c := plotutil.Color(i)
				line.Color, line.Dashes, line.Width = c, systemDashes[sys], vg.Points(1.5)
				pts.Color, pts.Shape, pts.Radius = c, systemShapes[sys], vg.Points(2.5)
				target.pl.Add(line, pts)
				if j == 0 {
					legend.Add(fmt.Sprintf("%s %s", systemNames[sys], sizeName(payload)), line, pts)
				}
			}
			drawn++
		}
	}
	if drawn == 0 {
		return fmt.Errorf("plot %s: no %s points", path, mode)
	}
	return savePNG(path, 1250, 480, []*plot.Plot{items, bytes}, &legend)
}

// restLine is the payload series of sys at rest, from its base; nil where
// not measured.
func restLine(points []MemoryPoint, sys string, base int64) plotter.XYs {
	xys := plotter.XYs{{X: 0, Y: float64(base) / 1e6}}
	for _, p := range points {
		if p.System == sys && p.Series == "payload" && p.RestRSSBytes > 0 {
			xys = append(xys, plotter.XY{X: float64(p.PayloadBytes) / 1e6, Y: float64(p.RestRSSBytes) / 1e6})
		}
	}
	if len(xys) < 2 {
		return nil
	}
	return xys
}

// plotMemory draws resident memory against payload bytes held, right after
// each fill and at rest where measured, with the bound.
func plotMemory(path string, points []MemoryPoint) error {
	pl := plot.New()
	pl.Title.Text = "Resident memory against payload held"
	pl.X.Label.Text = "payload bytes held (MB)"
	pl.Y.Label.Text = "resident memory (MB)"
	pl.Add(plotter.NewGrid())
	drawn := 0
	for i, sys := range []string{sysReprise, sysReverb} {
		var xys plotter.XYs
		var base int64
		for _, p := range points {
			if p.System == sys && p.Series == "payload" {
				if len(xys) == 0 {
					base = p.BaseRSSBytes
					xys = append(xys, plotter.XY{X: 0, Y: float64(base) / 1e6})
				}
				xys = append(xys, plotter.XY{X: float64(p.PayloadBytes) / 1e6, Y: float64(p.RSSBytes) / 1e6})
			}
		}
		if len(xys) < 2 {
			continue
		}
		line, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return err
		}
		c := plotutil.Color(i)
		line.Color, line.Width = c, vg.Points(1.5)
		pts.Color, pts.Shape = c, systemShapes[sys]
		pl.Add(line, pts)
		pl.Legend.Add(fmt.Sprintf("%s (%s items)", systemNames[sys], sizeName(pointsPayload(points, sys))), line, pts)
		if rest := restLine(points, sys, base); rest != nil {
			line, pts, err := plotter.NewLinePoints(rest)
			if err != nil {
				return err
			}
			line.Color, line.Width, line.Dashes = c, vg.Points(1.5), []vg.Length{vg.Points(1), vg.Points(2)}
			pts.Color, pts.Shape = c, systemShapes[sys]
			pl.Add(line, pts)
			pl.Legend.Add(fmt.Sprintf("%s at rest", systemNames[sys]), line, pts)
		}
		bound := plotter.NewFunction(func(x float64) float64 { return float64(base)/1e6 + memoryPerByteGoal*x })
		bound.Color, bound.Dashes = c, []vg.Length{vg.Points(4), vg.Points(3)}
		pl.Add(bound)
		pl.Legend.Add(fmt.Sprintf("%s base + %.1f × payload (target)", systemNames[sys], memoryPerByteGoal), bound)
		drawn++
	}
	if drawn == 0 {
		return fmt.Errorf("plot %s: no memory points", path)
	}
	pl.Legend.Top, pl.Legend.Left = true, true
	pl.X.Tick.Marker, pl.Y.Tick.Marker = plainTicks{}, plainTicks{}
	return savePNG(path, 700, 500, []*plot.Plot{pl}, nil)
}

func pointsPayload(points []MemoryPoint, sys string) int {
	for _, p := range points {
		if p.System == sys && p.Series == "payload" {
			return p.Payload
		}
	}
	return 0
}

func newLogPlot(title, y string) *plot.Plot {
	pl := plot.New()
	pl.Title.Text = title
	pl.X.Label.Text, pl.Y.Label.Text = "clients", y
	pl.X.Scale, pl.Y.Scale = plot.LogScale{}, plot.LogScale{}
	pl.Y.Tick.Marker = siLogTicks{}
	pl.Add(plotter.NewGrid())
	return pl
}

// intTicks labels the client counts measured.
type intTicks []int

func (t intTicks) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for _, v := range t {
		out = append(out, plot.Tick{Value: float64(v), Label: fmt.Sprint(v)})
	}
	return out
}

// siLogTicks labels 1, 2 and 5 times each power of ten (only the powers
// when the range spans more than three decades) with SI prefixes.
type siLogTicks struct{}

func (siLogTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= lo {
		return nil
	}
	first, last := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	wide := last-first > 3
	var out []plot.Tick
	for e := first; e <= last; e++ {
		decade := math.Pow(10, e)
		for _, m := range []float64{1, 2, 5} {
			v := m * decade
			if v < lo || v > hi {
				continue
			}
			label := siTick(v)
			if wide && m != 1 {
				label = ""
			}
			out = append(out, plot.Tick{Value: v, Label: label})
		}
	}
	return out
}

// siTick formats a tick value with an SI prefix and no trailing zeros.
func siTick(v float64) string {
	for _, p := range []struct {
		scale  float64
		suffix string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if v >= p.scale {
			return strconv.FormatFloat(v/p.scale, 'g', 3, 64) + p.suffix
		}
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// plainTicks are gonum's default ticks with labels in %g, not %.2f.
type plainTicks struct{}

func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ticks {
		if t.Label != "" {
			ticks[i].Label = strconv.FormatFloat(t.Value, 'g', -1, 64)
		}
	}
	return ticks
}

// legendWidth is the column on the right of a figure that holds its
// legend.
const legendWidth = 170

// savePNG draws plots side by side into one PNG of w×h points at 96 dpi,
// with the legend, if any, in a column of its own on the right.
func savePNG(path string, w, h vg.Length, plots []*plot.Plot, legend *plot.Legend) error {
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(96), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	area := dc
	if legend != nil {
		area = draw.Crop(dc, 0, -legendWidth, 0, 0)
		legend.Draw(draw.Crop(dc, w-legendWidth+10, 0, 0, -30))
	}
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Points(30),
		PadTop: vg.Points(10), PadBottom: vg.Points(10), PadLeft: vg.Points(10), PadRight: vg.Points(10)}
	canvases := plot.Align([][]*plot.Plot{plots}, tiles, area)
	for j, pl := range plots {
		pl.Draw(canvases[0][j])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
