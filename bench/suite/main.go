// Command suite runs Reprise's benchmark suite and writes its results:
// results.json, throughput.csv, memory.csv, summary.md and the plots
// insert.png, sample.png and memory.png.
//
// It builds reprised and reprisectl from this checkout and measures them
// as users run them: reprised with its embedded NATS server on a loopback
// port, loaded by reprisectl bench with the Reverb paper's workloads
// (random float32 payloads of 400 B to 400 kB, chunk and sequence length
// 1, insert-only and sample-only, 1 to 64 clients). On the same server it
// measures raw JetStream (async publish of the same bytes, the same again
// while one consumer receives every message, request-reply of the same
// reply sizes), then a mixed actor/learner run under
// SampleToInsertRatio, an Atari-like run, single-item latencies and
// resident memory. Its shards section spreads a table over 1, 2 and 4
// reprised on one nats-server (built from the module go.mod requires) and
// loads it through the sharded producer and client. With --reverb it runs
// the same workloads against DeepMind Reverb through
// bench/reverb/driver.py.
//
// Usage:
//
//	go run ./bench/suite --out bench/results            # about 10 minutes
//	go run ./bench/suite --out /tmp/smoke --quick       # under a minute
//	go run ./bench/suite --out bench/results --reverb   # with Reverb (bash bench/reverb/setup.sh first)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/load"
)

// The suite's sections, in the order they run; --only picks some.
var sections = []string{"throughput", "mixed", "actors", "atari", "latency", "memory", "shards", "reverb"}

type options struct {
	out    string
	quick  bool
	reverb bool
	venv   string
	repo   string
	only   []string
	keep   bool
	// bin, when set, holds prebuilt programs: the suite runs them
	// instead of building, on a machine without Go.
	bin string
	// payloads and clients, when set, narrow the throughput grid: one
	// point rerun in a minute instead of the whole suite.
	payloads []int
	clients  []int
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("suite", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var only, payloads, clients string
	fs.StringVar(&o.out, "out", "bench/results", "`directory` for the results and plots (created if missing)")
	fs.BoolVar(&o.quick, "quick", false, "smoke version: one payload, two client counts, under a second per point (memory rests 15 s per reading)")
	fs.BoolVar(&o.reverb, "reverb", false, "also run DeepMind Reverb (needs the venv of bench/reverb/setup.sh)")
	fs.StringVar(&o.venv, "reverb-venv", defaultVenv(), "`directory` of Reverb's virtual environment")
	fs.StringVar(&o.repo, "repo", ".", "`directory` inside the Reprise repository to build from")
	fs.StringVar(&only, "only", "", "comma-separated `sections` to run, of "+strings.Join(sections, ", ")+" (default: all; reverb needs --reverb)")
	fs.StringVar(&o.bin, "bin", "", "`directory` of prebuilt reprised and reprisectl (and nats-server, for the shards section) to run instead of building them, on a machine without Go")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (binaries, JetStream data, logs) and print where it is")
	fs.StringVar(&payloads, "payloads", "", "comma-separated item `sizes` in bytes the throughput grid runs, of "+joinInts(paperPayloads)+" (default: all)")
	fs.StringVar(&clients, "clients", "", "comma-separated client `counts` the throughput grid runs (default: the plan's)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: go run ./bench/suite [--out DIR] [--quick] [--reverb] [--only SECTIONS] [--payloads SIZES] [--clients COUNTS]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q: the suite takes only flags", fs.Arg(0))
	}
	if only != "" {
		for name := range strings.SplitSeq(only, ",") {
			name = strings.TrimSpace(name)
			if !slices.Contains(sections, name) {
				return o, fmt.Errorf("--only: unknown section %q (want some of %s)", name, strings.Join(sections, ", "))
			}
			o.only = append(o.only, name)
		}
	}
	var err error
	if o.payloads, err = parseInts("--payloads", payloads); err != nil {
		return o, err
	}
	for _, p := range o.payloads {
		if !slices.Contains(paperPayloads, p) {
			return o, fmt.Errorf("--payloads: %d bytes has no table in the suite's reprised (want some of %s)", p, joinInts(paperPayloads))
		}
	}
	if o.clients, err = parseInts("--clients", clients); err != nil {
		return o, err
	}
	return o, nil
}

// parseInts reads a comma-separated list of positive integers; an empty
// list is none.
func parseInts(flagName, list string) ([]int, error) {
	if list == "" {
		return nil, nil
	}
	var out []int
	for field := range strings.SplitSeq(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s: %q is not a positive integer", flagName, field)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

func main() {
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "suite:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	res, err := run(ctx, opts, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "suite:", err)
		os.Exit(1)
	}
	res.markdown(os.Stdout)
}

// suite is one run: its plan, where it works, what it found.
type suite struct {
	opts options
	plan plan
	log  *slog.Logger
	repo string
	work string
	bins binaries
	res  *Results
}

// run runs the suite and writes the results into opts.out.
func run(ctx context.Context, opts options, log *slog.Logger) (*Results, error) {
	s := &suite{opts: opts, plan: fullPlan(), log: log}
	if opts.quick {
		s.plan = quickPlan()
	}
	if len(opts.payloads) > 0 {
		s.plan.payloads = opts.payloads
	}
	if len(opts.clients) > 0 {
		s.plan.clients = opts.clients
	}
	start := time.Now()
	s.res = &Results{Machine: describeMachine(), Quick: opts.quick, Started: start,
		WarmupSec: s.plan.warmup.Seconds(), PointSec: s.plan.duration.Seconds()}
	var err error
	runsReverb := opts.reverb && s.wants("reverb")
	if opts.bin == "" || runsReverb {
		if s.repo, err = moduleRoot(ctx, opts.repo); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(opts.out, 0o755); err != nil {
		return nil, fmt.Errorf("creating --out %s: %w", opts.out, err)
	}
	if s.work, err = os.MkdirTemp("", "reprise-bench-"); err != nil {
		return nil, err
	}
	if opts.keep {
		log.Info("work directory kept", "dir", s.work)
	} else {
		defer os.RemoveAll(s.work)
	}
	if opts.bin != "" {
		if s.bins, err = prebuilt(opts.bin, s.wants("shards")); err != nil {
			return nil, err
		}
	} else {
		log.Info("building reprised and reprisectl (and nats-server, for the shards section)", "repo", s.repo)
		if s.bins, err = build(ctx, s.repo, s.work, s.wants("shards")); err != nil {
			return nil, err
		}
	}

	if s.wants("throughput", "mixed", "actors", "atari", "latency") {
		if err := s.withDaemon(ctx, "reprised", false, s.mainSections); err != nil {
			return nil, err
		}
	}
	if s.wants("memory") {
		if err := s.memory(ctx); err != nil {
			return nil, fmt.Errorf("memory: %w", err)
		}
	}
	if s.wants("shards") {
		if err := s.shards(ctx); err != nil {
			return nil, fmt.Errorf("shards: %w", err)
		}
	}
	if runsReverb {
		if err := s.runReverb(ctx); err != nil {
			return nil, fmt.Errorf("reverb: %w", err)
		}
	}

	s.res.Machine.LoadEnd, s.res.Machine.SpeedEnd = loadAvg(), measureSpeed()
	s.res.Seconds = time.Since(start).Seconds()
	s.res.summarize()
	if err := s.res.write(opts.out); err != nil {
		return nil, fmt.Errorf("writing results: %w", err)
	}
	for _, mode := range []string{"insert", "sample"} {
		if !slices.ContainsFunc(s.res.Throughput, func(p Point) bool { return p.Mode == mode }) {
			continue
		}
		if err := plotThroughput(filepath.Join(opts.out, mode+".png"), mode, s.res.Throughput); err != nil {
			return nil, err
		}
	}
	if len(s.res.Memory) > 0 {
		if err := plotMemory(filepath.Join(opts.out, "memory.png"), s.res.Memory); err != nil {
			return nil, err
		}
	}
	log.Info("suite done", "out", opts.out, "seconds", int(s.res.Seconds))
	return s.res, nil
}

func (s *suite) wants(names ...string) bool {
	if len(s.opts.only) == 0 {
		return true
	}
	for _, n := range names {
		if slices.Contains(s.opts.only, n) {
			return true
		}
	}
	return false
}

// withDaemon runs f against a fresh reprised, then stops it.
func (s *suite) withDaemon(ctx context.Context, name string, memory bool, f func(context.Context, *daemon) error) (err error) {
	config := filepath.Join(s.work, name+".yaml")
	if err := writeConfig(config, memory); err != nil {
		return err
	}
	d, err := startDaemon(ctx, s.bins.reprised, s.work, name, embeddedArgs(config, s.work, name)...)
	if err != nil {
		return err
	}
	s.log.Info("reprised ready", "name", name, "url", d.url, "pid", d.pid())
	defer func() {
		if serr := d.stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	if err := f(ctx, d); err != nil {
		// A crash of reprised explains the failure better than the
		// client's view of it.
		return errors.Join(err, d.alive())
	}
	return d.alive()
}

func (s *suite) mainSections(ctx context.Context, d *daemon) error {
	for _, sec := range []struct {
		name string
		f    func(context.Context, *daemon) error
	}{{"throughput", s.throughput}, {"mixed", s.mixed}, {"actors", s.actors}, {"atari", s.atari}, {"latency", s.latency}} {
		if !s.wants(sec.name) {
			continue
		}
		if err := sec.f(ctx, d); err != nil {
			return fmt.Errorf("%s: %w", sec.name, err)
		}
	}
	return load.DeleteRawStream(ctx, d.url)
}

// throughput runs the paper's grid on Reprise and on raw JetStream, point
// by point, so that both see the same state of the machine. For each
// payload the insert points run first: they fill the table the sample
// points read.
func (s *suite) throughput(ctx context.Context, d *daemon) error {
	p := s.plan
	for _, payload := range p.payloads {
		for _, mode := range []string{"insert", "sample"} {
			batch := insertBatch(payload)
			if mode == "sample" {
				batch = sampleBatch(payload)
			}
			for _, clients := range p.clients {
				load1 := loadAvg()[0]
				r, err := ctlBench(ctx, s.bins.reprisectl, d.url, ctlArgs{mode: mode, table: benchTable(payload),
					clients: clients, payload: payload, batch: batch, warmup: p.warmup, duration: p.duration})
				if err != nil {
					return err
				}
				rp := Point{System: sysReprise, Mode: mode, Payload: payload, Clients: clients, Batch: batch,
					ItemsPerSec: r.ItemsPerSec, BytesPerSec: r.BytesPerSec, P50Ms: r.Latency.P50Ms, P99Ms: r.Latency.P99Ms, Load1: load1}
				if err := d.alive(); err != nil {
					return err
				}
				rawCfg := load.RawConfig{URL: d.url, Clients: clients, Payload: payload, Batch: batch, Warmup: p.warmup, Duration: p.duration}
				raw := load.RawPublish
				if mode == "sample" {
					raw = load.RawRequest
				}
				load1 = loadAvg()[0]
				t, err := raw(ctx, rawCfg)
				if err != nil {
					return fmt.Errorf("raw JetStream %s, %d clients, %d-byte items: %w", mode, clients, payload, err)
				}
				jp := Point{System: sysJetStream, Mode: mode, Payload: payload, Clients: clients, Batch: batch,
					ItemsPerSec: t.ItemsPerSec, BytesPerSec: t.BytesPerSec, P50Ms: t.Latency.P50Ms, P99Ms: t.Latency.P99Ms, Load1: load1}
				s.res.Throughput = append(s.res.Throughput, rp, jp)
				attrs := []any{"payload", payload, "clients", clients, "batch", batch,
					"reprise", si(rp.ItemsPerSec) + " items/s " + si(rp.BytesPerSec) + "B/s", "jetstream", si(jp.ItemsPerSec) + " items/s",
					"ratio", fmt.Sprintf("%.2f", ratio(&rp, &jp))}
				if mode == "insert" {
					load1 = loadAvg()[0]
					t, err := load.RawPublishConsumed(ctx, rawCfg)
					if err != nil {
						return fmt.Errorf("raw JetStream consumed, %d clients, %d-byte items: %w", clients, payload, err)
					}
					cp := Point{System: sysJetStreamConsumed, Mode: mode, Payload: payload, Clients: clients, Batch: batch,
						ItemsPerSec: t.ItemsPerSec, BytesPerSec: t.BytesPerSec, P50Ms: t.Latency.P50Ms, P99Ms: t.Latency.P99Ms, Load1: load1}
					s.res.Throughput = append(s.res.Throughput, cp)
					attrs = append(attrs, "consumed", si(cp.ItemsPerSec)+" items/s", "consumed÷raw", fmt.Sprintf("%.2f", ratio(&cp, &jp)),
						"reprise÷consumed", fmt.Sprintf("%.2f", ratio(&rp, &cp)))
				}
				s.log.Info(mode, attrs...)
			}
		}
	}
	return nil
}

// mixed runs actors and learners at once on a table whose limiter keeps
// samples per insert near mixedSamplesPerInsert.
func (s *suite) mixed(ctx context.Context, d *daemon) error {
	p := s.plan
	for _, clients := range p.mixedClients {
		// Each run starts from an empty table and a zeroed limiter.
		if err := resetTable(ctx, d.url, mixedTable); err != nil {
			return err
		}
		r, rates, err := s.mixedRun(ctx, d, clients)
		if err != nil {
			return err
		}
		if r.Insert == nil || r.Sample == nil {
			return errors.New("reprisectl bench --mode mixed reported no inserts or no samples")
		}
		m := Mixed{System: sysReprise, Payload: p.mixedPayload, Clients: clients, Batch: p.mixedBatch, SamplesPerInsert: mixedSamplesPerInsert,
			InsertItemsPerSec: r.Insert.ItemsPerSec, AppliedPerSec: rates.inserts, SampleItemsPerSec: r.Sample.ItemsPerSec,
			InsertP50Ms: r.Insert.Latency.P50Ms, SampleP50Ms: r.Sample.Latency.P50Ms}
		if rates.inserts > 0 {
			m.Achieved = rates.samples / rates.inserts
		}
		s.res.Mixed = append(s.res.Mixed, m)
		s.log.Info("mixed", "payload", p.mixedPayload, "clients", clients, "stored/s", si(m.InsertItemsPerSec), "applied/s", si(m.AppliedPerSec),
			"samples/s", si(m.SampleItemsPerSec), "achieved", fmt.Sprintf("%.2f", m.Achieved))
	}
	return nil
}

// mixedRun runs reprisectl bench --mode mixed and reads the table's own
// insert and sample counters inside its measured window. Its learners stop
// when the window ends, while its actors still publish their last items
// on closing, which the limiter holds until they are sampled: a drain
// learner takes over once the window is over, until the service has
// applied them all.
func (s *suite) mixedRun(ctx context.Context, d *daemon, clients int) (ctlReport, tableRates, error) {
	p := s.plan
	launched := time.Now()
	drainCtx, stopDrain := context.WithCancel(ctx)
	var bg sync.WaitGroup
	var drainErr, rateErr error
	var rates tableRates
	bg.Go(func() {
		// reprisectl's window starts after its own start-up; this one
		// starts a little later and ends no later, inside it.
		rates, rateErr = measureTable(drainCtx, d.url, mixedTable, launched.Add(p.warmup+200*time.Millisecond), launched.Add(p.warmup+p.duration))
	})
	bg.Go(func() {
		if sleepUntil(drainCtx, launched.Add(p.warmup+p.duration+500*time.Millisecond)) == nil {
			drainErr = load.Drain(drainCtx, d.url, broker.DefaultPrefix, mixedTable)
		}
	})
	r, err := ctlBench(ctx, s.bins.reprisectl, d.url, ctlArgs{mode: "mixed", table: mixedTable,
		clients: clients, payload: p.mixedPayload, batch: p.mixedBatch, warmup: p.warmup, duration: p.duration})
	if err == nil {
		// Items the actors published last may still wait for the limiter;
		// while they do, the service applies nothing else.
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = load.CaughtUp(cctx, d.url, broker.DefaultPrefix)
		cancel()
	}
	stopDrain()
	bg.Wait()
	return r, rates, errors.Join(err, drainErr, rateErr)
}

// tableRates are a table's inserts and samples per second as its own
// counters saw them.
type tableRates struct {
	inserts, samples float64
}

// measureTable reads a table's counters at from and at to.
func measureTable(ctx context.Context, url, table string, from, to time.Time) (tableRates, error) {
	var at [2]time.Time
	var ins, smp [2]int64
	for i, t := range []time.Time{from, to} {
		if err := sleepUntil(ctx, t); err != nil {
			return tableRates{}, err
		}
		var err error
		at[i] = time.Now()
		ins[i], smp[i], err = withClient(ctx, url, func(ctx context.Context, c *broker.Client) (int64, int64, error) {
			info, err := c.Info(ctx, table)
			if err != nil {
				return 0, 0, err
			}
			return info.Tables[0].Inserts, info.Tables[0].Samples, nil
		})
		if err != nil {
			return tableRates{}, err
		}
	}
	secs := at[1].Sub(at[0]).Seconds()
	return tableRates{inserts: float64(ins[1]-ins[0]) / secs, samples: float64(smp[1]-smp[0]) / secs}, nil
}

func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// actors runs learners beside few and then many unthrottled producers on
// a table that lets every sample through: whether learners keep their
// pace when actors crowd the service.
func (s *suite) actors(ctx context.Context, d *daemon) error {
	p := s.plan
	for _, producers := range p.actorProducers {
		if err := resetTable(ctx, d.url, actorsTable); err != nil {
			return err
		}
		load1 := loadAvg()[0]
		r, err := load.Bench(ctx, load.BenchConfig{URL: d.url, Prefix: broker.DefaultPrefix, Table: actorsTable,
			Inserters: producers, Samplers: p.actorLearners, Payload: actorPayload, Batch: actorInsertBatch, SampleBatch: actorSampleBatch,
			Compression: wire.Uncompressed, Warmup: p.actorWarmup, Duration: p.duration, Log: s.log})
		if err != nil {
			return fmt.Errorf("%d producers beside %d learners: %w", producers, p.actorLearners, err)
		}
		if err := d.alive(); err != nil {
			return err
		}
		a := ActorLoad{Producers: producers, Learners: p.actorLearners, Payload: actorPayload, InsertBatch: actorInsertBatch, SampleBatch: actorSampleBatch,
			LearnerItemsPerSec: r.Sample.ItemsPerSec, LearnerP50Ms: r.Sample.Latency.P50Ms, LearnerP99Ms: r.Sample.Latency.P99Ms,
			ProducerItemsPerSec: r.Insert.ItemsPerSec, Load1: load1}
		s.res.Actors = append(s.res.Actors, a)
		s.log.Info("actors", "producers", producers, "learners", p.actorLearners, "learner items/s", si(a.LearnerItemsPerSec),
			"batch p50 ms", fmt.Sprintf("%.1f", a.LearnerP50Ms), "p99 ms", fmt.Sprintf("%.1f", a.LearnerP99Ms), "producer items/s", si(a.ProducerItemsPerSec))
	}
	return nil
}

func (s *suite) atari(ctx context.Context, d *daemon) error {
	p := s.plan
	r, err := load.Atari(ctx, load.AtariConfig{URL: d.url, Prefix: broker.DefaultPrefix, Table: atariTable,
		Actors: p.atariActors, Learners: p.atariLearners, ChunkLength: 16, SequenceLength: 16, Period: 8, EpisodeLength: 400,
		SampleBatch: p.atariBatch, Warmup: p.warmup, Duration: p.duration})
	if err != nil {
		return err
	}
	s.res.Atari = &r
	s.log.Info("atari", "steps/s", si(r.StepsPerSec), "compression", fmt.Sprintf("%.1fx", r.CompressionRatio), "samples/s", si(r.Sample.ItemsPerSec))
	return nil
}

// latency measures single-item samples with reprisectl bench, and
// insert-to-sampleable with a learner waiting on a queue table.
func (s *suite) latency(ctx context.Context, d *daemon) error {
	p := s.plan
	const payload = 400
	if err := load.Fill(ctx, load.FillConfig{URL: d.url, Prefix: broker.DefaultPrefix, Table: benchTable(payload), Items: 1000, Payload: payload, Clients: 1}); err != nil {
		return err
	}
	r, err := ctlBench(ctx, s.bins.reprisectl, d.url, ctlArgs{mode: "sample", table: benchTable(payload),
		clients: 1, payload: payload, batch: 1, warmup: p.warmup, duration: p.latencyPoint})
	if err != nil {
		return err
	}
	il, err := load.InsertToSampleable(ctx, load.LatencyConfig{URL: d.url, Prefix: broker.DefaultPrefix, Table: latencyTable, Payload: payload, Inserts: p.latencyInserts})
	if err != nil {
		return err
	}
	l := Latency{System: sysReprise, SampleP50Us: r.Latency.P50Ms * 1e3, SampleP99Us: r.Latency.P99Ms * 1e3,
		InsertToSampledP50Us: il.ToSampled.P50Ms * 1e3, InsertToSampledP99Us: il.ToSampled.P99Ms * 1e3,
		InsertToDurableP50Us: il.ToDurable.P50Ms * 1e3, InsertToDurableP99Us: il.ToDurable.P99Ms * 1e3}
	s.res.Latency = append(s.res.Latency, l)
	s.log.Info("latency", "sample p50 µs", int(l.SampleP50Us), "p99 µs", int(l.SampleP99Us),
		"insert→sampled p50 µs", int(l.InsertToSampledP50Us), "p99 µs", int(l.InsertToSampledP99Us))

	// The floors on the same server: a request answered at once with one
	// item's bytes, and a publish that waits for its ack.
	raw := load.RawConfig{URL: d.url, Clients: 1, Payload: payload, Batch: 1, Warmup: p.warmup, Duration: p.latencyPoint}
	req, err := load.RawRequest(ctx, raw)
	if err != nil {
		return err
	}
	pub, err := load.RawPublishSync(ctx, raw)
	if err != nil {
		return err
	}
	s.res.Latency = append(s.res.Latency, Latency{System: sysJetStream,
		SampleP50Us: req.Latency.P50Ms * 1e3, SampleP99Us: req.Latency.P99Ms * 1e3,
		InsertToDurableP50Us: pub.Latency.P50Ms * 1e3, InsertToDurableP99Us: pub.Latency.P99Ms * 1e3})
	return nil
}

// memory fills a fresh reprised per series and reads its resident memory
// at each step.
func (s *suite) memory(ctx context.Context) error {
	for _, series := range s.plan.memory {
		err := s.withDaemon(ctx, "reprised-mem-"+series.Name, true, func(ctx context.Context, d *daemon) error {
			// The base at rest too: resting gives back the garbage of
			// reprised's start as well as the fill's, which would
			// otherwise count as the fill's memory saved.
			base, err := restedRSS(ctx, d.pid(), s.plan)
			if errors.Is(err, errNoProc) {
				s.log.Warn("skipping memory", "reason", err)
				return nil
			}
			if err != nil {
				return err
			}
			held := 0
			for _, items := range series.Items {
				if err := load.Fill(ctx, load.FillConfig{URL: d.url, Prefix: broker.DefaultPrefix, Table: memoryTable,
					Items: items - held, Payload: series.Payload, Clients: 4}); err != nil {
					return err
				}
				held = items
				stored, size, err := tableBytes(ctx, d.url, memoryTable)
				if err != nil {
					return err
				}
				if size != int64(held) {
					return fmt.Errorf("table %s holds %d items after a fill of %d", memoryTable, size, held)
				}
				r, err := settledRSS(ctx, d.pid(), s.plan.settle)
				if err != nil {
					return err
				}
				rest, err := restedRSS(ctx, d.pid(), s.plan)
				if err != nil {
					return err
				}
				m := MemoryPoint{System: sysReprise, Series: series.Name, Payload: series.Payload, Items: size,
					PayloadBytes: size * int64(series.Payload), StoredBytes: stored, RSSBytes: r, BaseRSSBytes: base, RestRSSBytes: rest}
				s.res.Memory = append(s.res.Memory, m)
				s.log.Info("memory", "series", series.Name, "items", size, "payload held", si(float64(m.PayloadBytes))+"B",
					"rss", si(float64(r))+"B", "at rest", si(float64(rest))+"B", "base", si(float64(base))+"B")
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// restedRSS is the resident memory of pid at rest: p.rest after its last
// work, which is what at rest means, so the wait is a fixed one.
func restedRSS(ctx context.Context, pid int, p plan) (int64, error) {
	select {
	case <-time.After(p.rest):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return settledRSS(ctx, pid, p.settle)
}

// tableBytes asks the service what a table holds: chunk bytes and items.
func tableBytes(ctx context.Context, url, table string) (int64, int64, error) {
	return withClient(ctx, url, func(ctx context.Context, c *broker.Client) (int64, int64, error) {
		info, err := c.Info(ctx, table)
		if err != nil {
			return 0, 0, err
		}
		return info.ChunkBytes, info.Tables[0].Size, nil
	})
}

func resetTable(ctx context.Context, url, table string) error {
	_, _, err := withClient(ctx, url, func(ctx context.Context, c *broker.Client) (int64, int64, error) {
		return 0, 0, c.Reset(ctx, table)
	})
	return err
}

func withClient(ctx context.Context, url string, f func(context.Context, *broker.Client) (int64, int64, error)) (int64, int64, error) {
	nc, err := nats.Connect(url, nats.Name("reprise-bench suite"))
	if err != nil {
		return 0, 0, err
	}
	defer nc.Close()
	c, err := broker.NewClient(nc, broker.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return f(ctx, c)
}
