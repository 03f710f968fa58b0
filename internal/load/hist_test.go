package load

import (
	"math"
	"testing"
	"time"
)

func TestHistogram(t *testing.T) {
	h := newHistogram()
	if h.quantile(0.5) != 0 || h.mean() != 0 {
		t.Error("an empty histogram reports a latency")
	}
	// 1ms, 2ms, ..., 1000ms: the p-quantile is p·1000 ms, within 1%.
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Millisecond)
	}
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Millisecond}, {0.9, 900 * time.Millisecond}, {0.99, 990 * time.Millisecond}, {1, time.Second}} {
		got := h.quantile(tt.q)
		if math.Abs(float64(got-tt.want)) > 0.01*float64(tt.want) {
			t.Errorf("quantile(%v) = %v, want %v within 1%%", tt.q, got, tt.want)
		}
	}
	if got, want := h.mean(), 500500*time.Microsecond; got != want {
		t.Errorf("mean = %v, want %v", got, want)
	}
	other := newHistogram()
	other.record(2 * time.Hour) // beyond the last bucket: counted there, max exact
	h.merge(other)
	if h.quantile(1) != 2*time.Hour || h.max != 2*time.Hour || h.n != 1001 {
		t.Errorf("after merging: max %v, quantile(1) %v, count %d; want 2h, 2h, 1001", h.max, h.quantile(1), h.n)
	}
	small := newHistogram()
	small.record(100 * time.Nanosecond)
	if got := small.quantile(0.5); got != 100*time.Nanosecond {
		t.Errorf("quantile of one sub-microsecond record = %v, want it exactly (capped at max)", got)
	}
}

func BenchmarkHistogramRecord(b *testing.B) {
	h := newHistogram()
	b.ReportAllocs()
	d := time.Duration(0)
	for b.Loop() {
		d = (d + 7919*time.Nanosecond) % time.Second
		h.record(d)
	}
}
