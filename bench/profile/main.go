// Command profile runs one of the suite's workloads with the NATS server,
// the table service and the clients in one process, and writes a CPU
// profile of all of them: the view pprof needs to find where a workload's
// time goes. The server and service are set up as reprised sets them up
// (embedded server with file storage, one table service, requests on a
// connection apart from the stream's); the clients connect over loopback
// TCP as reprisectl's do.
//
//	go run ./bench/profile --mode sample --payload 400 --batch 256 --clients 4 --cpu /tmp/sample.pprof
//	go tool pprof -top /tmp/sample.pprof
//
// --mode mixed runs the suite's actor-load run: --clients producers and
// --learners learners (batch --sample-batch) at once. --block and --mutex
// add those profiles; the server's slow-consumer count, the service's
// connection stats and the runtime's scheduling latencies are printed at
// the end.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/internal/gcpace"
	"github.com/reprise-rl/reprise/internal/load"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

func main() {
	var (
		mode     = flag.String("mode", "insert", "workload: insert, sample or mixed")
		payload  = flag.Int("payload", 400, "`bytes` of random float32s per item")
		batch    = flag.Int("batch", 64, "items per insert flush or per sample request")
		clients  = flag.Int("clients", 4, "concurrent clients (producers in mixed mode), each with its own connection")
		learners = flag.Int("learners", 16, "learners beside the producers (mixed mode)")
		sbatch   = flag.Int("sample-batch", 32, "items per learner's sample request (mixed mode)")
		inFlight = flag.Int("in-flight", 0, "requests each sampler or learner keeps open through a broker.BatchSampler (0: one SampleBatch call at a time)")
		perItem  = flag.Bool("per-item", false, "samplers and learners decode each reply item by item (Client.Sample), not as one batch (Client.SampleBatch)")
		block    = flag.String("block", "", "`file` for a blocking profile (optional)")
		mutex    = flag.String("mutex", "", "`file` for a mutex profile (optional)")
		warmup   = flag.Duration("warmup", time.Second, "time before measuring and profiling")
		duration = flag.Duration("duration", 5*time.Second, "time measured and profiled")
		fill     = flag.Int("fill", 10000, "items inserted before a sample run")
		cpu      = flag.String("cpu", "cpu.pprof", "`file` for the CPU profile")
		heap     = flag.String("heap", "", "`file` for a heap profile taken at the end (optional)")
		priority = flag.Duration("sample-priority", service.DefaultSamplePriority, "the service's sample priority (0: inserts never paced)")
		codec    = flag.String("compression", "none", "the inserters' chunk compression: none (reprisectl bench's and the suite's), zstd or s2")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	codecs := map[string]wire.Codec{"zstd": wire.Zstd, "s2": wire.S2, "none": wire.Uncompressed}
	compression, ok := codecs[*codec]
	if !ok {
		fmt.Fprintf(os.Stderr, "profile: --compression %q: want zstd, s2 or none\n", *codec)
		os.Exit(2)
	}
	w := workload{mode: *mode, payload: *payload, batch: *batch, clients: *clients, learners: *learners, sampleBatch: *sbatch, inFlight: *inFlight, perItem: *perItem, fill: *fill,
		samplePriority: *priority, compression: compression}
	prof := profiles{cpu: *cpu, heap: *heap, block: *block, mutex: *mutex}
	if err := run(ctx, w, *warmup, *duration, prof); err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		os.Exit(1)
	}
}

// workload is what one profile run loads the service with.
type workload struct {
	mode                          string
	payload, batch, clients, fill int
	learners, sampleBatch         int
	inFlight                      int
	perItem                       bool
	samplePriority                time.Duration
	compression                   wire.Codec
}

// profiles are the files to write; empty ones are skipped, but for cpu.
type profiles struct {
	cpu, heap, block, mutex string
}

func run(ctx context.Context, w workload, warmup, duration time.Duration, prof profiles) error {
	if w.mode != "insert" && w.mode != "sample" && w.mode != "mixed" {
		return fmt.Errorf("--mode %q: want insert, sample or mixed", w.mode)
	}
	dir, err := os.MkdirTemp("", "reprise-profile-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := embeddednats.Start(ctx, embeddednats.WithStoreDir(dir), embeddednats.WithListen("127.0.0.1:-1"))
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	nc, err := srv.Connect(nats.Name("reprise service"))
	if err != nil {
		return err
	}
	defer nc.Close()
	cfg := tables.Config{
		Name:    "bench",
		Sampler: selectors.Options{Kind: selectors.KindUniform},
		Remover: selectors.Options{Kind: selectors.KindFifo},
		MaxSize: int64(min(100000, max(100, (200<<20)/w.payload))),
		Limiter: limiter.MinSize(1),
	}
	if w.mode == "mixed" {
		cfg.MaxSize = 200000
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// Requests on a connection of their own, and replies spread over as
	// many as reprised opens, as reprised serves them.
	rc, err := srv.Connect(nats.Name("reprise service requests"))
	if err != nil {
		return err
	}
	defer rc.Close()
	replies := []*nats.Conn{rc}
	for i := 1; i < service.DefaultReplyConns(runtime.GOMAXPROCS(0)); i++ {
		c, err := srv.Connect(nats.Name(fmt.Sprintf("reprise service replies %d", i)))
		if err != nil {
			return err
		}
		defer c.Close()
		replies = append(replies, c)
	}
	svc, err := service.New(nc, []tables.Config{cfg}, service.WithLogger(log),
		service.WithStream(service.StreamOptions{MaxBytes: 2 << 30}), service.WithRequestConn(rc),
		service.WithReplyConns(replies...), service.WithSamplePriority(w.samplePriority))
	if err != nil {
		return err
	}
	sctx, stopService := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- svc.Run(sctx) }()
	// The collector paced as reprised paces it (the clients' allocations
	// count too, in this one process).
	paced := make(chan struct{})
	go func() {
		defer close(paced)
		gcpace.Run(sctx, 250*time.Millisecond, gcpace.RestAfter)
	}()
	defer func() {
		stopService()
		<-served
		<-paced
	}()

	if err := waitReady(ctx, nc, served); err != nil {
		return err
	}
	url := srv.ClientURL()
	bc := load.BenchConfig{URL: url, Prefix: broker.DefaultPrefix, Table: cfg.Name, Payload: w.payload, Batch: w.batch, InFlight: w.inFlight, PerItem: w.perItem,
		Compression: w.compression, Warmup: warmup, Duration: duration}
	switch w.mode {
	case "insert":
		bc.Inserters = w.clients
	case "sample":
		bc.Samplers = w.clients
		if err := load.Fill(ctx, load.FillConfig{URL: url, Prefix: broker.DefaultPrefix, Table: cfg.Name, Items: w.fill, Payload: w.payload, Clients: 2}); err != nil {
			return err
		}
	case "mixed":
		bc.Inserters, bc.Samplers, bc.SampleBatch = w.clients, w.learners, w.sampleBatch
	}
	f, err := os.Create(prof.cpu)
	if err != nil {
		return err
	}
	defer f.Close()
	if prof.block != "" {
		runtime.SetBlockProfileRate(int(10 * time.Microsecond))
	}
	if prof.mutex != "" {
		runtime.SetMutexProfileFraction(10)
	}
	// The profiles and the scheduler's figures cover the measured window
	// only.
	profiling := make(chan error, 1)
	schedAtStart := make(chan []metrics.Sample, 1)
	go func() {
		select {
		case <-time.After(warmup):
			schedAtStart <- readSched()
			profiling <- pprof.StartCPUProfile(f)
		case <-ctx.Done():
			schedAtStart <- nil
			profiling <- ctx.Err()
		}
	}()
	res, err := load.Bench(ctx, bc)
	sched := schedStats{before: <-schedAtStart, after: readSched()}
	perr := <-profiling
	if perr == nil {
		pprof.StopCPUProfile()
	}
	if err := errors.Join(err, perr); err != nil {
		return err
	}
	report := func(kind string, t *load.Throughput, clients, batch int) {
		fmt.Printf("%s: %d clients, %d-byte items, batch %d: %.0f items/s, %.1f MB/s, p50 %.3f ms, p99 %.3f ms\n",
			kind, clients, w.payload, batch, t.ItemsPerSec, t.BytesPerSec/1e6, t.Latency.P50Ms, t.Latency.P99Ms)
	}
	if res.Insert != nil {
		report("insert", res.Insert, bc.Inserters, bc.Batch)
	}
	if res.Sample != nil {
		report("sample", res.Sample, bc.Samplers, cmp.Or(bc.SampleBatch, bc.Batch))
	}
	printServerStats(srv, nc)
	sched.print()
	fmt.Printf("CPU profile: %s (go tool pprof -top %s)\n", prof.cpu, prof.cpu)
	for _, p := range []struct{ name, path string }{{"block", prof.block}, {"mutex", prof.mutex}} {
		if p.path != "" {
			if err := writeProfile(p.name, p.path); err != nil {
				return err
			}
		}
	}
	if prof.heap != "" {
		runtime.GC()
		return writeProfile("heap", prof.heap)
	}
	return nil
}

func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// schedStats reads the runtime's scheduling latencies (how long goroutines
// wait runnable before they run) and the time they spend blocked on
// mutexes, over the measured window: what a request waits for besides the
// work it asks for.
type schedStats struct {
	before, after []metrics.Sample
}

var schedMetrics = []string{"/sched/latencies:seconds", "/sync/mutex/wait/total:seconds", "/sched/goroutines:goroutines"}

func readSched() []metrics.Sample {
	s := make([]metrics.Sample, len(schedMetrics))
	for i, name := range schedMetrics {
		s[i].Name = name
	}
	metrics.Read(s)
	return s
}

func (s schedStats) print() {
	h0, h1 := s.before[0].Value.Float64Histogram(), s.after[0].Value.Float64Histogram()
	counts := make([]uint64, len(h1.Counts))
	var n uint64
	for i := range counts {
		counts[i] = h1.Counts[i] - h0.Counts[i]
		n += counts[i]
	}
	q := func(f float64) time.Duration {
		var seen uint64
		for i, c := range counts {
			if seen += c; float64(seen) >= f*float64(n) {
				return time.Duration(h1.Buckets[i+1] * 1e9)
			}
		}
		return 0
	}
	fmt.Printf("scheduler: %d goroutines at the end; %d waits to run, p50 %v, p90 %v, p99 %v (bucket upper bounds); goroutines blocked on mutexes %.2fs in all\n",
		s.after[2].Value.Uint64(), n, q(0.5), q(0.9), q(0.99), s.after[1].Value.Float64()-s.before[1].Value.Float64())
}

// printServerStats prints what the NATS server saw: slow consumers cut
// off, and the service connection's traffic and pending bytes.
func printServerStats(srv *embeddednats.Server, nc *nats.Conn) {
	ns := srv.NATSServer()
	v, err := ns.Varz(nil)
	if err != nil {
		fmt.Println("varz:", err)
		return
	}
	fmt.Printf("server: %d slow consumers, %d msgs in, %d msgs out, %d connections\n", v.SlowConsumers, v.InMsgs, v.OutMsgs, v.Connections)
	st := nc.Stats()
	fmt.Printf("service connection: %d msgs in (%d MB), %d msgs out (%d MB)\n", st.InMsgs, st.InBytes>>20, st.OutMsgs, st.OutBytes>>20)
}

// waitReady waits until the service answers an info request, or fails
// with the error Run returned.
func waitReady(ctx context.Context, nc *nats.Conn, served <-chan error) error {
	c, err := broker.NewClient(nc, broker.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Info(rctx, "")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case err := <-served:
			return fmt.Errorf("table service stopped: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("table service not ready within 30s: %w", err)
		}
	}
}
