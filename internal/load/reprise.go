package load

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"
)

// closeTimeout bounds how long a producer may take to send what it holds
// when its run ends.
const closeTimeout = 30 * time.Second

// BenchConfig describes a run of reprisectl bench: inserters, samplers or
// both at once on one table, each client on its own connection.
type BenchConfig struct {
	URL, Prefix, Table string
	// Shards, if set, are the prefixes of a sharded table's shards, in
	// shard order, and Prefix is unused: inserters are ShardedProducers and
	// samplers ShardedClients. One prefix is a table of one shard (reprised
	// --shard 0/1): the sharded code path with nothing to spread, which
	// more shards are compared with.
	Shards []string
	// Connect, if set, opens each client's connection instead of a plain
	// one to URL: reprisectl's, with the user's credentials and TLS.
	Connect func(name string) (*nats.Conn, error)
	// Inserters append steps of one column "payload" (Payload bytes of
	// random float32s, chunk length 1) and create one item per step,
	// Batch items per Flush. Samplers ask for SampleBatch items per
	// request, Batch if it is 0: actors and learners rarely batch alike.
	Inserters, Samplers int
	Payload, Batch      int
	SampleBatch         int
	// InFlight, if above 0, makes each sampler a broker.BatchSampler
	// (Sampler with PerItem) keeping that many requests open, as a
	// training loop's learner would; 0 asks with one call at a time, which
	// measures a request's round trip.
	InFlight int
	// PerItem makes each sampler decode its replies item by item
	// (Client.Sample) instead of as one stacked batch (SampleBatch), the
	// form a learner trains on. A sampler whose items do not stack (a
	// table without a signature holding items of other layouts) goes item
	// by item from then on.
	PerItem bool
	// Episode is the items of an inserter's episode, a multiple of Batch,
	// or 0 for one episode for the whole run. An inserter ends its episode
	// instead of flushing after the episode's last batch: EndEpisode waits
	// for the items as Flush does, and a sharded producer sends the next
	// episode to the next shard, so with Shards it spreads the items only
	// when set.
	Episode int
	// Compression of the inserted chunks; as in package broker, the zero
	// value is zstd.
	Compression      wire.Codec
	Warmup, Duration time.Duration
	// Log gets the warnings of the clients' producers and clients; nil
	// discards them.
	Log *slog.Logger
	// Progress, if set, is called once a second while the run lasts.
	Progress func(Progress)
}

func (c BenchConfig) validate() error {
	err := errors.Join(check("Inserters", c.Inserters, 0), check("Samplers", c.Samplers, 0),
		check("Payload", c.Payload, 4), check("Batch", c.Batch, 1), check("SampleBatch", c.SampleBatch, 0), check("Episode", c.Episode, 0), check("InFlight", c.InFlight, 0))
	if c.Batch > 0 && c.Episode%c.Batch != 0 {
		err = errors.Join(err, fmt.Errorf("%w: Episode must be a multiple of Batch (%d), got %d", ErrConfig, c.Batch, c.Episode))
	}
	if c.Inserters+c.Samplers == 0 {
		err = errors.Join(err, fmt.Errorf("%w: no Inserters and no Samplers", ErrConfig))
	}
	if c.Payload%4 != 0 {
		err = errors.Join(err, fmt.Errorf("%w: Payload must be a multiple of 4 (float32s), got %d", ErrConfig, c.Payload))
	}
	if c.Duration <= 0 || c.Warmup < 0 {
		err = errors.Join(err, fmt.Errorf("%w: want Duration > 0 and Warmup >= 0, got %v and %v", ErrConfig, c.Duration, c.Warmup))
	}
	return err
}

func (c BenchConfig) sampleBatch() int {
	if c.SampleBatch > 0 {
		return c.SampleBatch
	}
	return c.Batch
}

func (c BenchConfig) dialer() dialer {
	if c.Connect != nil {
		return c.Connect
	}
	return dialURL(c.URL)
}

// BenchResult is what a Bench run measured. Insert and Sample are nil for
// a kind of client the run did not have; Total adds them up, its latency
// over both kinds of operation.
type BenchResult struct {
	Insert, Sample *Throughput
	Total          Throughput
}

// Progress is a run's last second, warmup included, for a live display.
type Progress struct {
	// Elapsed is the time since the run started.
	Elapsed time.Duration
	// Warmup is whether the second began before the measured window.
	Warmup bool
	// Insert and Sample are nil for a kind of client the run does not
	// have.
	Insert, Sample *Rate
}

// Rate is how fast one kind of operation went.
type Rate struct {
	ItemsPerSec, BytesPerSec float64
}

// Bench runs the inserters and samplers of cfg for cfg.Warmup, then
// measures them for cfg.Duration. Operations that end outside that window
// are not counted. When ctx ends after the warmup, the result covers what
// was measured until then.
func Bench(ctx context.Context, cfg BenchConfig) (BenchResult, error) {
	if err := cfg.validate(); err != nil {
		return BenchResult{}, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	w := NewWindow(cfg.Warmup, cfg.Duration)
	start := w.Start.Add(-cfg.Warmup)
	var ins, smp *meter
	if cfg.Inserters > 0 {
		ins = newMeter(w)
	}
	if cfg.Samplers > 0 {
		smp = newMeter(w)
	}
	// Every operation is cut short at the window's end, so that one the
	// rate limiter holds does not stretch the run.
	rctx, cancel := context.WithDeadline(ctx, w.End)
	defer cancel()
	// With inserters, the samplers go on until the inserters have closed
	// their producers: closing sends the last items, which a rate limiter
	// lets in only as samples are taken.
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	if ins == nil {
		sctx = rctx
	}
	r := crew{stop: []context.CancelFunc{cancel, scancel}}
	var inserters, samplers, progress sync.WaitGroup
	r.launch(rctx, &inserters, cfg.Inserters, ins, cfg.inserter)
	r.launch(sctx, &samplers, cfg.Samplers, smp, cfg.sampler)
	if cfg.Progress != nil {
		progress.Go(func() { cfg.progress(rctx, start, w, ins, smp) })
	}
	inserters.Wait()
	scancel()
	samplers.Wait()
	cancel()
	progress.Wait()
	if r.err != nil {
		return BenchResult{}, r.err
	}
	stop := time.Now()
	if stop.After(w.End) {
		stop = w.End
	}
	if !stop.After(w.Start) {
		return BenchResult{}, errors.New("interrupted during the warmup: nothing measured")
	}
	secs := stop.Sub(w.Start).Seconds()
	all := newMeter(w)
	result := func(m *meter) *Throughput {
		if m == nil {
			return nil
		}
		all.add(m)
		t := m.result(secs)
		return &t
	}
	res := BenchResult{Insert: result(ins), Sample: result(smp)}
	res.Total = all.result(secs)
	return res, nil
}

// ended reports whether err is only the end of the run.
func ended(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, broker.ErrRateLimited))
}

func clientErr(ctx context.Context, kind string, client int, err error) error {
	if ended(ctx, err) {
		return nil
	}
	return fmt.Errorf("%s client %d: %w", kind, client, err)
}

func (cfg BenchConfig) newProducer(ctx context.Context, nc *nats.Conn) (broker.Writer, error) {
	opts := []broker.ProducerOption{
		broker.WithLogger(cfg.Log),
		broker.WithCompression(cfg.Compression),
		broker.WithBatch(cfg.Batch, max(256<<10, cfg.Batch*(cfg.Payload+256))),
		// Insert throughput counts items once durable, as raw JetStream's
		// does; the producer's window still bounds what the service has not
		// applied.
		broker.WithReturnOnStore(),
	}
	if cfg.Shards == nil {
		return broker.NewProducer(ctx, nc, append(opts, broker.WithPrefix(cfg.Prefix))...)
	}
	sp, err := broker.NewShardedProducer(ctx, nc, cfg.Shards, opts...)
	if err != nil {
		// Not a nil *ShardedProducer in a non-nil interface.
		return nil, err
	}
	return sp, nil
}

func (cfg BenchConfig) inserter(ctx context.Context, client int, c *counter) (err error) {
	nc, err := cfg.dialer()(fmt.Sprintf("inserter %d", client))
	if err != nil {
		return err
	}
	defer nc.Close()
	p, err := cfg.newProducer(ctx, nc)
	if err != nil {
		return clientErr(ctx, "insert", client, err)
	}
	defer func() {
		// Items created when the run ended are sent now; they are not
		// counted, but a failure to send them is still a failure.
		cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		if cerr := p.Close(cctx); cerr != nil && err == nil {
			err = fmt.Errorf("insert client %d: closing its producer: %w", client, cerr)
		}
	}()
	payloads := randomPayloads(uint64(client), 0x5eed, cfg.Payload)
	traj := broker.LastStep("payload")
	bytes := int64(cfg.Batch * cfg.Payload)
	// One map for every step, as an actor in a loop would keep it: a map
	// literal per step cost a tenth of the machine's CPU in profiles.
	next := broker.Step{}
	for step := 0; ; {
		t0 := time.Now()
		for range cfg.Batch {
			next["payload"] = payloads[step%len(payloads)]
			if err := p.Append(ctx, next); err != nil {
				return clientErr(ctx, "insert", client, err)
			}
			if err := p.CreateItem(ctx, cfg.Table, 1, traj); err != nil {
				return clientErr(ctx, "insert", client, err)
			}
			step++
		}
		end := p.Flush
		if cfg.Episode > 0 && step%cfg.Episode == 0 {
			end = p.EndEpisode
		}
		if err := end(ctx); err != nil {
			return clientErr(ctx, "insert", client, err)
		}
		c.record(t0, time.Now(), int64(cfg.Batch), bytes)
	}
}

func (cfg BenchConfig) sampler(ctx context.Context, client int, c *counter) error {
	cl, hangUp, err := cfg.dialSampler(fmt.Sprintf("sampler %d", client))
	if err != nil {
		return err
	}
	defer hangUp()
	perItem := cfg.PerItem
	next, stop, err := cfg.sampleCalls(cl, perItem)
	if err != nil {
		return clientErr(ctx, "sample", client, err)
	}
	defer func() { stop() }()
	for ctx.Err() == nil {
		t0 := time.Now()
		items, bytes, err := next(ctx)
		t1 := time.Now()
		if items > 0 {
			c.record(t0, t1, int64(items), bytes)
		}
		switch {
		case err == nil:
		case ended(ctx, err):
			return nil
		case errors.Is(err, broker.ErrRateLimited):
			if c.w.Contains(t1) {
				c.m.rateLimited.Add(1)
			}
		case errors.Is(err, wire.ErrUnstackable) && !perItem:
			// A table without a signature may hold items of other
			// layouts, which come one by one.
			stop()
			perItem = true
			if next, stop, err = cfg.sampleCalls(cl, perItem); err != nil {
				stop = func() {}
				return clientErr(ctx, "sample", client, err)
			}
		default:
			return clientErr(ctx, "sample", client, err)
		}
	}
	return nil
}

// sampleCalls is how a sampler takes its next batch of cl: one call at a
// time or through a broker sampler, as the config says, stacked or item by
// item. next gives the items and the bytes of their decoded columns; stop
// ends the broker sampler.
func (cfg BenchConfig) sampleCalls(cl sampleSource, perItem bool) (next func(context.Context) (int, int64, error), stop func(), err error) {
	n := cfg.sampleBatch()
	opts := []broker.SamplerOption{broker.WithInFlight(cfg.InFlight)}
	if perItem {
		return takeCalls(cfg.InFlight,
			func(ctx context.Context) ([]broker.Sample, error) { return cl.Sample(ctx, cfg.Table, n) },
			func() (*broker.Sampler, error) { return cl.NewSampler(cfg.Table, n, opts...) },
			func(s []broker.Sample) (int, int64) { return len(s), sampledBytes(s) })
	}
	return takeCalls(cfg.InFlight,
		func(ctx context.Context) (*broker.Batch, error) { return cl.SampleBatch(ctx, cfg.Table, n) },
		func() (*broker.BatchSampler, error) { return cl.NewBatchSampler(cfg.Table, n, opts...) },
		batchBytes)
}

// takeCalls takes batches with call, one at a time, or from the sampler
// start makes when inFlight is above 0; size gives a batch's items and
// bytes.
func takeCalls[B any, S interface {
	Next(context.Context) (B, error)
	Close()
}](inFlight int, call func(context.Context) (B, error), start func() (S, error), size func(B) (int, int64)) (next func(context.Context) (int, int64, error), stop func(), err error) {
	take, stop := call, func() {}
	if inFlight > 0 {
		s, err := start()
		if err != nil {
			return nil, nil, err
		}
		take, stop = s.Next, s.Close
	}
	return func(ctx context.Context) (int, int64, error) {
		b, err := take(ctx)
		items, bytes := size(b)
		return items, bytes, err
	}, stop, nil
}

// batchBytes is a batch's items and the size of its columns.
func batchBytes(b *broker.Batch) (int, int64) {
	if b == nil {
		return 0, 0
	}
	var bytes int64
	for _, col := range b.Columns {
		bytes += int64(len(col.Tensor.Data))
	}
	return b.Len(), bytes
}

// progress calls cfg.Progress once a second until ctx ends.
func (cfg BenchConfig) progress(ctx context.Context, start time.Time, w Window, ins, smp *meter) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := map[*meter][2]int64{}
	lastAt := start
	rate := func(m *meter, secs float64) *Rate {
		if m == nil {
			return nil
		}
		items, bytes := m.liveItems.Load(), m.liveBytes.Load()
		prev := last[m]
		last[m] = [2]int64{items, bytes}
		return &Rate{ItemsPerSec: float64(items-prev[0]) / secs, BytesPerSec: float64(bytes-prev[1]) / secs}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			secs := now.Sub(lastAt).Seconds()
			cfg.Progress(Progress{Elapsed: now.Sub(start), Warmup: lastAt.Before(w.Start), Insert: rate(ins, secs), Sample: rate(smp, secs)})
			lastAt = now
		}
	}
}

// randomPayloads makes 8 payloads of random float32s for one client to
// cycle through: random, so that compression cannot shrink them.
func randomPayloads(client, seed uint64, bytes int) []broker.Tensor {
	rng := rand.New(rand.NewPCG(client, seed))
	payloads := make([]broker.Tensor, 8)
	for k := range payloads {
		v := make([]float32, bytes/4)
		for j := range v {
			v[j] = rng.Float32()
		}
		payloads[k] = broker.Float32s([]int64{int64(len(v))}, v)
	}
	return payloads
}

// sampledBytes is the size of the decoded columns of samples.
func sampledBytes(samples []broker.Sample) int64 {
	var bytes int64
	for _, s := range samples {
		for _, col := range s.Columns {
			bytes += int64(len(col.Tensor.Data))
		}
	}
	return bytes
}

// sampleSource is what a sampler samples from: a Client, or a
// ShardedClient over the shards.
type sampleSource interface {
	Sample(ctx context.Context, table string, n int, opts ...broker.SampleOption) ([]broker.Sample, error)
	NewSampler(table string, size int, opts ...broker.SamplerOption) (*broker.Sampler, error)
	SampleBatch(ctx context.Context, table string, n int, opts ...broker.SampleOption) (*broker.Batch, error)
	NewBatchSampler(table string, size int, opts ...broker.SamplerOption) (*broker.BatchSampler, error)
}

// dialSampler connects a sampler's client; hangUp closes it and its
// connection.
func (cfg BenchConfig) dialSampler(name string) (cl sampleSource, hangUp func(), err error) {
	if cfg.Shards == nil {
		return dialClient(cfg.dialer(), name, cfg.Prefix, cfg.Log)
	}
	nc, err := cfg.dialer()(name)
	if err != nil {
		return nil, nil, err
	}
	sc, err := broker.NewShardedClient(nc, cfg.Shards, broker.WithLogger(cfg.Log))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return sc, func() { sc.Close(); nc.Close() }, nil
}

// dialClient connects a learner; hangUp closes the client and connection.
func dialClient(dial dialer, name, prefix string, log *slog.Logger) (cl *broker.Client, hangUp func(), err error) {
	nc, err := dial(name)
	if err != nil {
		return nil, nil, err
	}
	if cl, err = broker.NewClient(nc, broker.WithPrefix(prefix), broker.WithLogger(log)); err != nil {
		nc.Close()
		return nil, nil, err
	}
	return cl, func() { cl.Close(); nc.Close() }, nil
}
