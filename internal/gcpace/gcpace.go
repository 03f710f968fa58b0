// Package gcpace paces the Go garbage collector of a process whose heap is
// mostly data it keeps, such as reprised's tables, and gives memory back to
// the operating system once the process rests.
//
// The collector's default, GOGC=100, lets the heap grow to twice the live
// data before it collects: a table service holding 10 GB of chunks may use
// 20 GB, and one holding 50 MB collects every 50 MB allocated, marking its
// whole table each time. Run sets GOGC from the live heap so that the
// heap's headroom over live data stays near a fixed amount (Headroom),
// never below MinPercent of it and never above MaxPercent. Collections get
// rarer per byte allocated as the heap grows, and cost little each: chunk
// bytes hold no pointers, so marking them is free. A process whose
// operator set GOGC keeps that setting.
//
// A burst of inserts leaves memory behind that nothing collects while the
// process is idle: the headroom the burst grew into, and the NATS server's
// cache of the stream blocks written in the last 10 seconds, which it lets
// go 10 seconds after the burst (nats-server's fixed cache expiry). Go
// collects only when something allocates and hands freed pages back to the
// system slowly, so a service that filled its tables in one go would keep
// the resident memory of the burst until the next one. Once the process has
// allocated next to nothing for RestAfter, Run collects and returns the
// free memory, once per rest, whatever GOGC says (GOGC=off too: two
// collections at rest cost an idle process nothing it would notice).
package gcpace

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

const (
	// Headroom is the garbage the heap may hold over its live data.
	Headroom = 256 << 20
	// MinPercent is the least GOGC Run sets: the headroom of a large heap.
	// Lower saves more memory and costs more collections, which measured
	// as up to a fifth of the throughput of 4 kB inserts at 20.
	MinPercent = 50
	// MaxPercent is the most GOGC Run sets: the headroom of a small heap.
	// It bounds how far the heap may outgrow its live data between two of
	// Run's readings while a fill makes that grow fast.
	MaxPercent = 400
	// RestAfter is how long the process allocates next to nothing before
	// Run returns its free memory: past the NATS server's 10-second cache
	// of recently written stream blocks, so that it is free by then.
	RestAfter = 12 * time.Second
	// restingRate is the most a resting process allocates, in bytes a
	// second: an idle reprised allocates a little for progress heartbeats,
	// leases and metrics.
	restingRate = 1 << 20
)

// Percent is the GOGC for a live heap of live bytes.
func Percent(live uint64) int {
	if live == 0 {
		return MaxPercent
	}
	return int(min(MaxPercent, max(MinPercent, 100*Headroom/live)))
}

// Run, every period until ctx ends, sets GOGC from the live heap (unless
// the GOGC environment variable is set) and returns free memory to the
// system once the process has rested for restAfter (reprised passes
// RestAfter). It restores the GOGC it found when it returns.
func Run(ctx context.Context, period, restAfter time.Duration) {
	pace := os.Getenv("GOGC") == ""
	if pace {
		initial := debug.SetGCPercent(100)
		defer debug.SetGCPercent(initial)
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/allocs:bytes"}}
	tick := time.NewTicker(period)
	defer tick.Stop()
	current := 100
	var (
		allocated uint64
		last      = time.Now()
		rest      restClock
	)
	for {
		metrics.Read(sample)
		live, allocs := sample[0].Value, sample[1].Value
		if pace && live.Kind() == metrics.KindUint64 {
			if p := Percent(live.Uint64()); p != current {
				debug.SetGCPercent(p)
				current = p
			}
		}
		if allocs.Kind() == metrics.KindUint64 {
			now := time.Now()
			if rest.tick(now, allocs.Uint64()-allocated, now.Sub(last), restAfter) {
				runtime.GC() // what sync.Pools held since the last collection goes in the next
				debug.FreeOSMemory()
			}
			allocated, last = allocs.Uint64(), now
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// restClock tells when a process has rested long enough to give memory
// back, once per rest.
type restClock struct {
	since    time.Time // start of the current rest; zero while busy
	released bool      // this rest's memory was given back
}

// tick records that allocated bytes were allocated in the elapsed time up
// to now, and reports whether to give memory back.
func (r *restClock) tick(now time.Time, allocated uint64, elapsed, restAfter time.Duration) bool {
	if elapsed <= 0 || float64(allocated) > restingRate*elapsed.Seconds() {
		r.since, r.released = time.Time{}, false
		return false
	}
	if r.since.IsZero() {
		r.since = now.Add(-elapsed)
	}
	if r.released || now.Sub(r.since) < restAfter {
		return false
	}
	r.released = true
	return true
}
