// Package load generates the workloads of Reprise's benchmark suite that
// reprisectl bench does not: the raw JetStream baselines (the limits of the
// server Reprise runs on), the Atari-like run, insert-to-sampleable latency
// and the fills behind the memory figures. Every workload connects to a
// NATS URL over TCP with its own connections, as a separate program would.
package load

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// ErrConfig reports a workload configuration that cannot run; the error
// names the field at fault.
var ErrConfig = errors.New("load: invalid configuration")

// Window is a measured run: operations that end before Start (the warmup)
// or after End are not counted.
type Window struct {
	Start, End time.Time
}

// NewWindow starts a window now: warmup first, then duration measured.
func NewWindow(warmup, duration time.Duration) Window {
	start := time.Now().Add(warmup)
	return Window{Start: start, End: start.Add(duration)}
}

// Contains reports whether an operation that ended at t counts.
func (w Window) Contains(t time.Time) bool { return !t.Before(w.Start) && !t.After(w.End) }

// Throughput is what a throughput workload measured inside its window.
type Throughput struct {
	Items       int64         `json:"items"`
	Bytes       int64         `json:"bytes"`
	Seconds     float64       `json:"seconds"`
	ItemsPerSec float64       `json:"items_per_sec"`
	BytesPerSec float64       `json:"bytes_per_sec"`
	Latency     LatencyReport `json:"latency"`
}

// LatencyReport summarises operation latencies in milliseconds.
type LatencyReport struct {
	Count int     `json:"count"`
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

// Latencies collects durations from several goroutines.
type Latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

// Add records one duration.
func (l *Latencies) Add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// Report sorts what was recorded and summarises it.
func (l *Latencies) Report() LatencyReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return LatencyReport{}
	}
	slices.Sort(l.d)
	q := func(p float64) float64 {
		return ms(l.d[min(len(l.d)-1, int(p*float64(len(l.d))))])
	}
	return LatencyReport{Count: len(l.d), P50Ms: q(0.50), P99Ms: q(0.99), MaxMs: ms(l.d[len(l.d)-1])}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// counter accumulates items and bytes from several goroutines, keeping
// only operations that end inside the window.
type counter struct {
	w     Window
	mu    sync.Mutex
	items int64
	bytes int64
	lat   Latencies
}

func (c *counter) record(t0, t1 time.Time, items, bytes int64) {
	if !c.w.Contains(t1) {
		return
	}
	c.mu.Lock()
	c.items += items
	c.bytes += bytes
	c.mu.Unlock()
	c.lat.Add(t1.Sub(t0))
}

func (c *counter) result() Throughput {
	secs := c.w.End.Sub(c.w.Start).Seconds()
	c.mu.Lock()
	defer c.mu.Unlock()
	return Throughput{
		Items: c.items, Bytes: c.bytes, Seconds: secs,
		ItemsPerSec: float64(c.items) / secs, BytesPerSec: float64(c.bytes) / secs,
		Latency: c.lat.Report(),
	}
}

// connect opens one client connection named after its role, failing fast
// when nothing listens at url.
func connect(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name("reprise-bench "+name), nats.Timeout(5*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return nil, fmt.Errorf("load: connecting %s to %s: %w", name, url, err)
	}
	return nc, nil
}

func check(field string, v, least int) error {
	if v < least {
		return fmt.Errorf("%w: %s must be >= %d, got %d", ErrConfig, field, least, v)
	}
	return nil
}
