// Package gcpace paces the Go garbage collector of a process whose heap is
// mostly data it keeps, such as reprised's tables.
//
// The collector's default, GOGC=100, lets the heap grow to twice the live
// data before it collects: a table service holding 10 GB of chunks may use
// 20 GB. Run lowers GOGC as the live heap grows, so that the heap's headroom
// over live data stays near a fixed amount (Headroom) and never below
// MinPercent of it. Collections get rarer per byte allocated as the heap
// grows, and cost little each: chunk bytes hold no pointers, so marking
// them is free. A process whose operator set GOGC keeps that setting.
package gcpace

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

const (
	// Headroom is the garbage the heap may hold over its live data while
	// that stays below Headroom itself (GOGC 100 there).
	Headroom = 256 << 20
	// MinPercent is the least GOGC Run sets: the headroom of a large heap.
	// Lower saves more memory and costs more collections, which measured
	// as up to a fifth of the throughput of 4 kB inserts at 20.
	MinPercent = 50
)

// Percent is the GOGC for a live heap of live bytes.
func Percent(live uint64) int {
	if live <= Headroom {
		return 100
	}
	return max(MinPercent, int(100*Headroom/live))
}

// Run sets GOGC from the live heap every period until ctx ends, unless the
// GOGC environment variable is set. It restores the setting it found when
// it returns.
func Run(ctx context.Context, period time.Duration) {
	if os.Getenv("GOGC") != "" {
		return
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	initial := debug.SetGCPercent(100)
	defer debug.SetGCPercent(initial)
	tick := time.NewTicker(period)
	defer tick.Stop()
	current := 100
	for {
		metrics.Read(sample)
		if sample[0].Value.Kind() == metrics.KindUint64 {
			if p := Percent(sample[0].Value.Uint64()); p != current {
				debug.SetGCPercent(p)
				current = p
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}
