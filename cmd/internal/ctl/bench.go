package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/cmd/internal/cli"
)

const benchAbout = `Loads a table the way actors and learners do, in the spirit of the Reverb
paper's benchmarks, and reports items/s, bytes/s and latency percentiles.
Progress goes to stderr once a second; results to stdout.

Modes:
  insert  --clients producers, each on its own connection, append steps of
          one column "payload" (random float32s, --payload bytes, chunk
          length 1) and create one item per step. Latency is per batch of
          --batch items: from the batch's first Append until Flush returns,
          when JetStream has stored them all.
  sample  --clients learners, each on its own connection, sample --batch
          items per request. Latency is per request: from sending it until
          its items are decoded, including any wait for the rate limiter.
  mixed   --clients inserters and --clients samplers at once; the totals
          add both, and their latency percentiles are over both kinds of
          operation.

Operations that end during --warmup are not counted. Items inserted stay in
the table; "reprisectl reset TABLE" empties it.
`

type benchOptions struct {
	target
	mode        string
	table       string
	clients     int
	payload     int
	batch       int
	duration    time.Duration
	warmup      time.Duration
	compression string
	asJSON      bool
}

var codecs = map[string]wire.Codec{"none": wire.Uncompressed, "zstd": wire.Zstd, "s2": wire.S2}

func parseBench(args []string, stderr io.Writer) (benchOptions, error) {
	var o benchOptions
	fs := newFlagSet("bench", "bench [flags]", benchAbout, stderr)
	o.register(fs)
	fs.StringVar(&o.mode, "mode", "insert", "what to load (`mode`): insert, sample or mixed")
	fs.StringVar(&o.table, "table", "replay", "`name` of the table to load; a table without a signature, or whose only column is payload float32[N]")
	fs.IntVar(&o.clients, "clients", 4, "`N` concurrent clients, each with its own NATS connection (in mixed mode, this many of each kind)")
	fs.IntVar(&o.payload, "payload", 400, "`bytes` of random float32 data per inserted item (a multiple of 4)")
	fs.IntVar(&o.batch, "batch", 64, "`N` items per insert batch (and per producer message) and per sample request")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long to measure, after the warmup")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "how long to run before measuring")
	fs.StringVar(&o.compression, "compression", "none", "chunk compression (`codec`) of inserted items: none, zstd or s2 (random floats do not compress)")
	fs.BoolVar(&o.asJSON, "json", false, "print the results as one JSON object")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return o, err
	}
	switch {
	case len(pos) > 0:
		return o, cli.Usagef("bench takes no arguments, got %q (the table is --table)", pos)
	case o.mode != "insert" && o.mode != "sample" && o.mode != "mixed":
		return o, cli.Usagef("--mode %q: want insert, sample or mixed", o.mode)
	case o.clients < 1:
		return o, cli.Usagef("--clients must be >= 1, got %d", o.clients)
	case o.payload < 4 || o.payload%4 != 0:
		return o, cli.Usagef("--payload must be a positive multiple of 4 (bytes of float32s), got %d", o.payload)
	case o.batch < 1:
		return o, cli.Usagef("--batch must be >= 1, got %d", o.batch)
	case o.duration <= 0:
		return o, cli.Usagef("--duration must be > 0, got %v", o.duration)
	case o.warmup < 0:
		return o, cli.Usagef("--warmup must be >= 0, got %v", o.warmup)
	case o.table == "":
		return o, cli.Usagef("--table is empty")
	}
	if _, ok := codecs[o.compression]; !ok {
		return o, cli.Usagef("--compression %q: want none, zstd or s2", o.compression)
	}
	return o, o.check()
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseBench(args, stderr)
	if err != nil {
		return err
	}
	if err := o.preflight(ctx, stderr); err != nil {
		return err
	}
	b := newBench(o, stderr)
	rep, err := b.run(ctx)
	if err != nil {
		return err
	}
	if o.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.write(stdout)
	}
	return rep.problem()
}

// preflight checks that the table exists and can take the benchmark's
// items, so that a mistake shows at once rather than after the run.
func (o benchOptions) preflight(ctx context.Context, stderr io.Writer) error {
	c, rctx, hangUp, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer hangUp()
	info, err := c.Info(rctx, o.table)
	if err != nil {
		return o.explain(rctx, err)
	}
	ti := info.Tables[0]
	if sig := ti.Signature; len(sig) > 0 {
		n := int64(o.payload / 4)
		ok := len(sig) == 1 && sig[0].Name == "payload" && sig[0].DType == "float32" && len(sig[0].Shape) == 1 && (sig[0].Shape[0] == n || sig[0].Shape[0] == -1)
		if !ok {
			return fmt.Errorf("table %q has a signature its items must match, and bench's items have one column payload float32[%d]: bench a table without a signature", o.table, n)
		}
	}
	if o.mode == "sample" && ti.Size == 0 {
		return fmt.Errorf("table %q is empty: nothing to sample. Insert first (reprisectl bench --mode insert --table %s) or use --mode mixed", o.table, o.table)
	}
	if l := ti.Limiter; o.mode == "insert" && !math.IsInf(l.MaxDiff, 1) {
		fmt.Fprintf(stderr, "note: the rate limiter of table %q holds inserts that outrun samples (%s); without learners, inserts stop once it is full\n", o.table, describeLimiter(limiterConfig(l), ti.Sampler))
	}
	return nil
}

// opStats accumulates one kind of operation across its clients.
type opStats struct {
	name     string
	measures string
	// Everything done, warmup included, for the progress line.
	liveItems, liveBytes atomic.Int64
	// What ended inside the measured window.
	items, bytes, rateLimited atomic.Int64
	mu                        sync.Mutex
	hist                      *histogram
}

type bench struct {
	o      benchOptions
	stderr io.Writer
	log    *slog.Logger
	// measureFrom and end bound the measured window.
	measureFrom, end time.Time
	insert, sample   *opStats
}

func newBench(o benchOptions, stderr io.Writer) *bench {
	b := &bench{o: o, stderr: stderr, log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if o.mode != "sample" {
		b.insert = &opStats{name: "insert", hist: newHistogram(),
			measures: fmt.Sprintf("per batch of %d items, from its first Append until Flush returned (stored in JetStream)", o.batch)}
	}
	if o.mode != "insert" {
		b.sample = &opStats{name: "sample", hist: newHistogram(),
			measures: fmt.Sprintf("per Sample request of %d items, from sending it until its items were decoded", o.batch)}
	}
	return b
}

// record counts an operation that ran from t0 to t1 in the client's
// histogram h, if it ended inside the measured window.
func (b *bench) record(s *opStats, h *histogram, t0, t1 time.Time, items, bytes int64) {
	s.liveItems.Add(items)
	s.liveBytes.Add(bytes)
	if t1.Before(b.measureFrom) || t1.After(b.end) {
		return
	}
	s.items.Add(items)
	s.bytes.Add(bytes)
	h.record(t1.Sub(t0))
}

func (s *opStats) merge(h *histogram) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hist.merge(h)
}

func (b *bench) run(ctx context.Context) (benchReport, error) {
	start := time.Now()
	b.measureFrom = start.Add(b.o.warmup)
	b.end = b.measureFrom.Add(b.o.duration)
	rctx, cancel := context.WithDeadline(ctx, b.end)
	defer cancel()

	// In mixed mode the samplers go on until the inserters have closed
	// their producers: closing sends the last items, which a rate limiter
	// lets in only as samples are taken.
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	if b.insert == nil {
		sctx = rctx
	}
	var (
		inserters, samplers sync.WaitGroup
		errOnce             sync.Once
		firstErr            error
	)
	launch := func(wg *sync.WaitGroup, ctx context.Context, f func(context.Context, int) error) {
		for i := range b.o.clients {
			wg.Go(func() {
				if err := f(ctx, i); err != nil {
					errOnce.Do(func() { firstErr = err })
					cancel()
					scancel()
				}
			})
		}
	}
	if b.insert != nil {
		launch(&inserters, rctx, b.inserter)
	}
	if b.sample != nil {
		launch(&samplers, sctx, b.sampler)
	}
	var progress sync.WaitGroup
	progress.Go(func() { b.progress(rctx, start) })
	inserters.Wait()
	scancel()
	samplers.Wait()
	cancel()
	progress.Wait()
	if firstErr != nil {
		return benchReport{}, firstErr
	}
	stop := time.Now()
	if stop.After(b.end) {
		stop = b.end
	}
	if !stop.After(b.measureFrom) {
		return benchReport{}, fmt.Errorf("interrupted during the warmup: nothing measured")
	}
	return b.report(stop.Sub(b.measureFrom)), nil
}

// payloads returns a few random payloads for one client to cycle through:
// random floats, so that compression cannot shrink them.
func (b *bench) payloads(client int) []broker.Tensor {
	rng := rand.New(rand.NewPCG(uint64(client), 0x5eed))
	n := b.o.payload / 4
	out := make([]broker.Tensor, 8)
	for i := range out {
		v := make([]float32, n)
		for j := range v {
			v[j] = rng.Float32()
		}
		out[i] = broker.Float32s([]int64{int64(n)}, v)
	}
	return out
}

// ended reports whether err is only the end of the run.
func ended(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, broker.ErrRateLimited))
}

func (b *bench) inserter(ctx context.Context, client int) (err error) {
	nc, err := b.o.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	p, err := broker.NewProducer(ctx, nc,
		broker.WithPrefix(b.o.prefix),
		broker.WithLogger(b.log),
		broker.WithCompression(codecs[b.o.compression]),
		broker.WithBatch(b.o.batch, max(256<<10, b.o.batch*(b.o.payload+256))),
	)
	if err != nil {
		if ended(ctx, err) {
			return nil
		}
		return fmt.Errorf("insert client %d: %w", client, err)
	}
	defer func() {
		// Items created when the run ended are sent now; they are not
		// counted, but a failure to send them is still a failure.
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if cerr := p.Close(cctx); cerr != nil && err == nil {
			err = fmt.Errorf("insert client %d: closing its producer: %w", client, cerr)
		}
	}()
	h := newHistogram()
	defer b.insert.merge(h)
	payloads := b.payloads(client)
	traj := broker.LastStep("payload")
	bytes := int64(b.o.batch * b.o.payload)
	for step := 0; ; {
		t0 := time.Now()
		for range b.o.batch {
			if err := p.Append(ctx, broker.Step{"payload": payloads[step%len(payloads)]}); err != nil {
				return b.clientErr(ctx, "insert", client, err)
			}
			if err := p.CreateItem(ctx, b.o.table, 1, traj); err != nil {
				return b.clientErr(ctx, "insert", client, err)
			}
			step++
		}
		if err := p.Flush(ctx); err != nil {
			return b.clientErr(ctx, "insert", client, err)
		}
		b.record(b.insert, h, t0, time.Now(), int64(b.o.batch), bytes)
	}
}

func (b *bench) clientErr(ctx context.Context, kind string, client int, err error) error {
	if ended(ctx, err) {
		return nil
	}
	return fmt.Errorf("%s client %d: %w", kind, client, b.o.explain(ctx, err))
}

func (b *bench) sampler(ctx context.Context, client int) error {
	nc, err := b.o.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := b.o.client(nc)
	if err != nil {
		return err
	}
	defer c.Close()
	h := newHistogram()
	defer b.sample.merge(h)
	for ctx.Err() == nil {
		t0 := time.Now()
		samples, err := c.Sample(ctx, b.o.table, b.o.batch)
		t1 := time.Now()
		if len(samples) > 0 {
			var bytes int64
			for _, s := range samples {
				for _, col := range s.Columns {
					bytes += int64(len(col.Tensor.Data))
				}
			}
			b.record(b.sample, h, t0, t1, int64(len(samples)), bytes)
		}
		switch {
		case err == nil:
		case ended(ctx, err):
			return nil
		case errors.Is(err, broker.ErrRateLimited):
			if !t1.Before(b.measureFrom) {
				b.sample.rateLimited.Add(1)
			}
		default:
			return b.clientErr(ctx, "sample", client, err)
		}
	}
	return nil
}

// progress writes one line a second to stderr until ctx ends.
func (b *bench) progress(ctx context.Context, start time.Time) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := map[*opStats][2]int64{}
	lastAt := start
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			phase := "measuring"
			if lastAt.Before(b.measureFrom) {
				phase = "warmup"
			}
			line := fmt.Sprintf("bench %4.0fs %-9s", now.Sub(start).Seconds(), phase)
			secs := now.Sub(lastAt).Seconds()
			for _, s := range []*opStats{b.insert, b.sample} {
				if s == nil {
					continue
				}
				items, bytes := s.liveItems.Load(), s.liveBytes.Load()
				prev := last[s]
				line += fmt.Sprintf("  %s %8.0f items/s %10s/s", s.name, float64(items-prev[0])/secs, formatBytes(float64(bytes-prev[1])/secs))
				last[s] = [2]int64{items, bytes}
			}
			lastAt = now
			fmt.Fprintln(b.stderr, line)
		}
	}
}

// benchReport is what bench prints; its JSON form is --json's output.
type benchReport struct {
	Mode         string  `json:"mode"`
	URL          string  `json:"url"`
	Prefix       string  `json:"prefix"`
	Table        string  `json:"table"`
	Clients      int     `json:"clients"`
	PayloadBytes int     `json:"payload_bytes,omitempty"` // of inserted items
	Batch        int     `json:"batch"`
	Compression  string  `json:"compression"`
	WarmupSec    float64 `json:"warmup_sec"`
	DurationSec  float64 `json:"duration_sec"`
	// The totals over every kind of operation.
	Items       int64         `json:"items"`
	ItemsPerSec float64       `json:"items_per_sec"`
	BytesPerSec float64       `json:"bytes_per_sec"`
	Latency     latencyReport `json:"latency"`
	Insert      *opReport     `json:"insert,omitempty"`
	Sample      *opReport     `json:"sample,omitempty"`
}

type opReport struct {
	Items           int64         `json:"items"`
	Bytes           int64         `json:"bytes"`
	ItemsPerSec     float64       `json:"items_per_sec"`
	BytesPerSec     float64       `json:"bytes_per_sec"`
	RateLimited     int64         `json:"rate_limited_requests,omitempty"`
	LatencyMeasures string        `json:"latency_measures"`
	Latency         latencyReport `json:"latency"`
}

// latencyReport gives percentiles in milliseconds, exact to 1%.
type latencyReport struct {
	Count  int64   `json:"count"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
	MeanMs float64 `json:"mean_ms"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func newLatencyReport(h *histogram) latencyReport {
	return latencyReport{
		Count: h.n, P50Ms: ms(h.quantile(0.5)), P90Ms: ms(h.quantile(0.9)), P99Ms: ms(h.quantile(0.99)),
		MaxMs: ms(h.max), MeanMs: ms(h.mean()),
	}
}

func (b *bench) report(elapsed time.Duration) benchReport {
	secs := elapsed.Seconds()
	rep := benchReport{
		Mode: b.o.mode, URL: b.o.conn.URL, Prefix: b.o.prefix, Table: b.o.table, Clients: b.o.clients,
		Batch: b.o.batch, Compression: b.o.compression,
		WarmupSec: b.o.warmup.Seconds(), DurationSec: secs,
	}
	all := newHistogram()
	var bytes int64
	op := func(s *opStats) *opReport {
		if s == nil {
			return nil
		}
		all.merge(s.hist)
		items, by := s.items.Load(), s.bytes.Load()
		rep.Items += items
		bytes += by
		return &opReport{
			Items: items, Bytes: by, ItemsPerSec: float64(items) / secs, BytesPerSec: float64(by) / secs,
			RateLimited: s.rateLimited.Load(), LatencyMeasures: s.measures, Latency: newLatencyReport(s.hist),
		}
	}
	rep.Insert, rep.Sample = op(b.insert), op(b.sample)
	if rep.Insert != nil {
		rep.PayloadBytes = b.o.payload
	}
	rep.ItemsPerSec = float64(rep.Items) / secs
	rep.BytesPerSec = float64(bytes) / secs
	rep.Latency = newLatencyReport(all)
	return rep
}

func (r benchReport) write(w io.Writer) {
	fmt.Fprintf(w, "bench %s: table %s at %s (prefix %s)\n", r.Mode, r.Table, r.URL, r.Prefix)
	payload := ""
	if r.Insert != nil {
		payload = fmt.Sprintf("%d-byte float32 payloads, compression %s, ", r.PayloadBytes, r.Compression)
	}
	fmt.Fprintf(w, "  %d clients, %sbatches of %d, %.1fs measured after %.1fs warmup\n",
		r.Clients, payload, r.Batch, r.DurationSec, r.WarmupSec)
	for _, op := range []struct {
		name string
		r    *opReport
		unit string
	}{{"insert", r.Insert, "batches"}, {"sample", r.Sample, "requests"}} {
		if op.r == nil {
			continue
		}
		l := op.r.Latency
		fmt.Fprintf(w, "\n%s: %d items, %.0f items/s, %s/s\n", op.name, op.r.Items, op.r.ItemsPerSec, formatBytes(op.r.BytesPerSec))
		fmt.Fprintf(w, "  latency %s; %d %s", op.r.LatencyMeasures, l.Count, op.unit)
		if op.r.RateLimited > 0 {
			fmt.Fprintf(w, " (%d cut short by the rate limiter)", op.r.RateLimited)
		}
		fmt.Fprintf(w, ":\n  p50 %.3f ms   p90 %.3f ms   p99 %.3f ms   max %.3f ms   mean %.3f ms\n", l.P50Ms, l.P90Ms, l.P99Ms, l.MaxMs, l.MeanMs)
	}
	if r.Insert != nil {
		fmt.Fprintf(w, "\nThe items stay in table %s; empty it with: reprisectl reset %s\n", r.Table, r.Table)
	}
}

// problem explains a run in which an operation got nothing done.
func (r benchReport) problem() error {
	if r.Insert != nil && r.Insert.Items == 0 {
		return fmt.Errorf("no insert batch was stored in %.1fs: the rate limiter of table %q may hold inserts (a full queue?), see reprisectl info", r.DurationSec, r.Table)
	}
	if r.Sample != nil && r.Sample.Items == 0 {
		return fmt.Errorf("nothing was sampled in %.1fs: the rate limiter of table %q allowed no sample (below its min size, or ahead of inserts?), see reprisectl info", r.DurationSec, r.Table)
	}
	return nil
}
