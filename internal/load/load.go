// Package load generates the workloads of Reprise's benchmarks: reprisectl
// bench's inserts and samples (Bench), and those of the benchmark suite
// that reprisectl bench does not run: the raw JetStream baselines (the
// limits of the server Reprise runs on), the Atari-like run,
// insert-to-sampleable latency and the fills behind the memory figures.
// Every client has its own connection over TCP, as a separate program
// would.
package load

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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

// Throughput is what one kind of operation did inside a run's window.
type Throughput struct {
	Items       int64   `json:"items"`
	Bytes       int64   `json:"bytes"`
	Seconds     float64 `json:"seconds"`
	ItemsPerSec float64 `json:"items_per_sec"`
	BytesPerSec float64 `json:"bytes_per_sec"`
	// RateLimited counts sample requests that the table's rate limiter
	// cut short: a learner that outruns the actors is a result, not a
	// failure.
	RateLimited int64         `json:"rate_limited_requests,omitempty"`
	Latency     LatencyReport `json:"latency"`
}

// LatencyReport summarises operation latencies in milliseconds, exact to
// 1%.
type LatencyReport struct {
	Count  int64   `json:"count"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
	MeanMs float64 `json:"mean_ms"`
}

// meter counts one kind of operation across its clients.
type meter struct {
	w Window
	// Everything done, warmup included, for progress.
	liveItems, liveBytes atomic.Int64
	// What ended inside the window.
	items, bytes, rateLimited atomic.Int64
	mu                        sync.Mutex
	hist                      *histogram
}

func newMeter(w Window) *meter { return &meter{w: w, hist: newHistogram()} }

// counter is one client's share of a meter. Its latencies go to a
// histogram of its own, merged when the client ends, so that recording an
// operation takes no lock that the other clients wait on.
type counter struct {
	w Window
	m *meter
	h *histogram
}

func (m *meter) counter() *counter { return &counter{w: m.w, m: m, h: newHistogram()} }

// record counts an operation that ran from t0 to t1, in the results only
// if it ended inside the window.
func (c *counter) record(t0, t1 time.Time, items, bytes int64) {
	c.m.liveItems.Add(items)
	c.m.liveBytes.Add(bytes)
	if !c.w.Contains(t1) {
		return
	}
	c.m.items.Add(items)
	c.m.bytes.Add(bytes)
	c.h.record(t1.Sub(t0))
}

// done hands the client's latencies to its meter.
func (c *counter) done() {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.m.hist.merge(c.h)
}

// add counts what o counted as well: the totals over several kinds of
// operation.
func (m *meter) add(o *meter) {
	m.items.Add(o.items.Load())
	m.bytes.Add(o.bytes.Load())
	m.rateLimited.Add(o.rateLimited.Load())
	m.hist.merge(o.hist)
}

// result is what the meter counted over secs seconds measured.
func (m *meter) result(secs float64) Throughput {
	items, bytes := m.items.Load(), m.bytes.Load()
	return Throughput{
		Items: items, Bytes: bytes, Seconds: secs,
		ItemsPerSec: float64(items) / secs, BytesPerSec: float64(bytes) / secs,
		RateLimited: m.rateLimited.Load(), Latency: m.hist.report(),
	}
}

// clientFunc is one client of a run: i numbers it among its kind, and c
// counts what it does.
type clientFunc func(ctx context.Context, i int, c *counter) error

// crew runs the clients of one run. The first error a client returns is
// the run's, and stops it: the errors of the clients stopped because of it
// would only repeat it.
type crew struct {
	once sync.Once
	err  error
	stop []context.CancelFunc
}

// launch starts n clients on wg, each counting into m.
func (r *crew) launch(ctx context.Context, wg *sync.WaitGroup, n int, m *meter, client clientFunc) {
	for i := range n {
		wg.Go(func() {
			c := m.counter()
			defer c.done()
			if err := client(ctx, i, c); err != nil {
				r.once.Do(func() { r.err = err })
				for _, stop := range r.stop {
					stop()
				}
			}
		})
	}
}

// runClients runs n clients until the window ends or one fails, and
// returns what they counted inside the window. Each client stops by itself
// at the window's end, so that its last operation completes.
func runClients(ctx context.Context, n int, warmup, duration time.Duration, client clientFunc) (Throughput, error) {
	w := NewWindow(warmup, duration)
	m := newMeter(w)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := crew{stop: []context.CancelFunc{cancel}}
	var wg sync.WaitGroup
	r.launch(ctx, &wg, n, m, client)
	wg.Wait()
	if r.err != nil {
		return Throughput{}, r.err
	}
	if err := ctx.Err(); err != nil {
		return Throughput{}, err
	}
	return m.result(w.End.Sub(w.Start).Seconds()), nil
}

// dialer opens one client's connection; name says which client it is.
type dialer func(name string) (*nats.Conn, error)

// dialURL is the dialer of the workloads that connect to a URL with no
// credentials.
func dialURL(url string) dialer {
	return func(name string) (*nats.Conn, error) { return connect(url, name) }
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
