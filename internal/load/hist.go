package load

import (
	"math"
	"time"
)

// histogram records durations in logarithmic buckets 1% wide, from 1µs to
// an hour, so percentiles are exact to 1% in constant memory however long
// a benchmark runs.
type histogram struct {
	counts []int64
	n      int64
	sum    time.Duration
	max    time.Duration
}

const (
	histMin    = time.Microsecond
	histGrowth = 1.01
)

var histBuckets = bucketOf(time.Hour) + 1

func newHistogram() *histogram { return &histogram{counts: make([]int64, histBuckets)} }

// bucketOf is the bucket of d: bucket i > 0 holds [histMin·g^(i-1), histMin·g^i).
func bucketOf(d time.Duration) int {
	if d < histMin {
		return 0
	}
	return int(math.Log(float64(d)/float64(histMin))/math.Log(histGrowth)) + 1
}

func (h *histogram) record(d time.Duration) {
	h.counts[min(bucketOf(d), len(h.counts)-1)]++
	h.n++
	h.sum += d
	h.max = max(h.max, d)
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// quantile is the smallest recorded duration (to 1%) with at least q of
// the records at or below it: the upper end of its bucket, capped at max.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank && i == len(h.counts)-1 {
			return h.max // the last bucket also holds everything longer
		}
		if seen >= rank {
			upper := time.Duration(float64(histMin) * math.Pow(histGrowth, float64(i)))
			return min(upper, h.max)
		}
	}
	return h.max
}

func (h *histogram) mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}

func (h *histogram) report() LatencyReport {
	return LatencyReport{
		Count: h.n, P50Ms: ms(h.quantile(0.5)), P90Ms: ms(h.quantile(0.9)), P99Ms: ms(h.quantile(0.99)),
		MaxMs: ms(h.max), MeanMs: ms(h.mean()),
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
