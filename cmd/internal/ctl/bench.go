package ctl

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/cmd/internal/cli"
	"github.com/reprise-rl/reprise/internal/load"
	"github.com/reprise-rl/reprise/internal/natsconn"
)

const benchAbout = `Loads a table the way actors and learners do, in the spirit of the Reverb
paper's benchmarks, and reports items/s, bytes/s and latency percentiles.
Progress goes to stderr once a second; results to stdout.

Modes:
  insert  --clients producers, each on its own connection, append steps of
          one column "payload" (random float32s, --payload bytes, chunk
          length 1) and create one item per step, ending their episode every
          --episode items if given. Latency is per batch of --batch items:
          from the batch's first Append until Flush returns (EndEpisode after
          an episode's last batch), when JetStream has stored them all.
  sample  --clients learners, each on its own connection, sample --batch
          items per request, each reply decoded as one stacked batch
          (SampleBatch; item by item with --per-item). Latency is per
          request: from sending it until its items are decoded, including
          any wait for the rate limiter. With --in-flight N, each learner is
          a sampler keeping N requests open, and latency is the wait for
          each next batch.
  mixed   --clients inserters and --clients samplers at once (--learners
          samplers, asking for --sample-batch items, if given); the totals
          add both, and their latency percentiles are over both kinds of
          operation.

A sharded table: give --prefix once per shard, in shard order (the --shard
INDEX/COUNT of each reprised). Inserters are then sharded producers, whose
episodes (one per batch unless --episode says otherwise) go to the shards
in turn, and samplers sharded clients, which draw each batch across the
shards by their weights. --sharded takes that path with one --prefix, a
table of one shard (reprised --shard 0/1), to compare with more shards on
the same code. Ending an episode right after a full batch costs a
JetStream message of its own (the release of the episode's chunks), so
compare runs with the same --episode.

Operations that end during --warmup are not counted. Items inserted stay in
the table; "reprisectl reset TABLE" empties it.
`

type benchOptions struct {
	target
	mode        string
	table       string
	clients     int
	learners    int
	payload     int
	batch       int
	sampleBatch int
	inFlight    int
	perItem     bool
	episode     int
	// sharded loads through the sharded producer and client, as more than
	// one --prefix does.
	sharded     bool
	duration    time.Duration
	warmup      time.Duration
	compression string
	asJSON      bool
}

var codecs = map[string]wire.Codec{"none": wire.Uncompressed, "zstd": wire.Zstd, "s2": wire.S2}

func parseBench(args []string, stderr io.Writer) (benchOptions, error) {
	var o benchOptions
	fs := newFlagSet("bench", "bench [flags]", benchAbout, stderr)
	o.registerShards(fs)
	fs.BoolVar(&o.sharded, "sharded", false, "load through the sharded producer and client with one --prefix too (a table of one shard: reprised --shard 0/1)")
	fs.StringVar(&o.mode, "mode", "insert", "what to load (`mode`): insert, sample or mixed")
	fs.StringVar(&o.table, "table", "replay", "`name` of the table to load; a table without a signature, or whose only column is payload float32[N]")
	fs.IntVar(&o.clients, "clients", 4, "`N` concurrent clients, each with its own NATS connection (in mixed mode, this many of each kind)")
	fs.IntVar(&o.payload, "payload", 400, "`bytes` of random float32 data per inserted item (a multiple of 4)")
	fs.IntVar(&o.batch, "batch", 64, "`N` items per insert batch (and per producer message) and per sample request")
	fs.IntVar(&o.learners, "learners", 0, "in mixed mode, `N` samplers beside the --clients inserters (default: --clients)")
	fs.IntVar(&o.sampleBatch, "sample-batch", 0, "in mixed mode, `N` items per sample request (default: --batch)")
	fs.IntVar(&o.inFlight, "in-flight", 0, "`N` sample requests each sampler keeps open, through a prefetching Sampler as a training loop would use (default: one Sample call at a time)")
	fs.BoolVar(&o.perItem, "per-item", false, "samplers decode each reply item by item (Client.Sample), not as one stacked batch (Client.SampleBatch), the form a learner trains on")
	fs.IntVar(&o.episode, "episode", 0, "`N` items per episode, a multiple of --batch: inserters end their episode every N items, and a sharded producer moves to the next shard (default: --batch with sharded clients, else one episode per inserter)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long to measure, after the warmup")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "how long to run before measuring")
	fs.StringVar(&o.compression, "compression", "none", "chunk compression (`codec`) of inserted items: none, zstd or s2 (random floats do not compress)")
	fs.BoolVar(&o.asJSON, "json", false, "print the results as one JSON object")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return o, err
	}
	o.finishShards()
	o.sharded = o.sharded || len(o.shards) > 1
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
	case o.inFlight < 0:
		return o, cli.Usagef("--in-flight must be >= 1 when given, got %d", o.inFlight)
	case o.inFlight > 0 && o.mode == "insert":
		return o, cli.Usagef("--in-flight is for samplers: --mode sample or mixed")
	case o.perItem && o.mode == "insert":
		return o, cli.Usagef("--per-item is for samplers: --mode sample or mixed")
	case o.learners < 0 || o.sampleBatch < 0:
		return o, cli.Usagef("--learners and --sample-batch must be >= 1 when given, got %d and %d", o.learners, o.sampleBatch)
	case (o.learners > 0 || o.sampleBatch > 0) && o.mode != "mixed":
		return o, cli.Usagef("--learners and --sample-batch are for --mode mixed (in sample mode, use --clients and --batch)")
	case o.episode < 0 || o.episode%o.batch != 0:
		return o, cli.Usagef("--episode must be a multiple of --batch (%d), got %d", o.batch, o.episode)
	case o.episode > 0 && o.mode == "sample":
		return o, cli.Usagef("--episode is for inserters: --mode insert or mixed")
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
	for i, p := range o.shards {
		if j := slices.Index(o.shards, p); j != i {
			return o, cli.Usagef("--prefix %q is given for shards %d and %d: each shard has its own", p, j, i)
		}
	}
	if o.episode == 0 && o.sharded && o.mode != "sample" {
		// Else each sharded producer would write to one shard only.
		o.episode = o.batch
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
	cfg := load.BenchConfig{
		URL: o.conn.URL, Prefix: o.prefix, Table: o.table,
		// Every client connects as reprisectl, with the user's credentials.
		Connect: func(string) (*nats.Conn, error) { return o.connect() },
		Payload: o.payload, Batch: o.batch, Episode: o.episode, Compression: codecs[o.compression],
		Warmup: o.warmup, Duration: o.duration,
		Log:      slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Progress: func(p load.Progress) { writeProgress(stderr, p) },
	}
	if o.sharded {
		cfg.Shards = o.shards
	}
	if o.mode != "sample" {
		cfg.Inserters = o.clients
	}
	if o.mode != "insert" {
		cfg.Samplers = cmp.Or(o.learners, o.clients)
		cfg.SampleBatch = o.sampleBatch
		cfg.InFlight = o.inFlight
		cfg.PerItem = o.perItem
	}
	res, err := load.Bench(ctx, cfg)
	if err != nil {
		return o.explain(ctx, err)
	}
	rep := o.report(res)
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
	nc, rctx, hangUp, err := o.dialConn(ctx)
	if err != nil {
		return err
	}
	defer hangUp()
	ti, err := o.tableInfo(rctx, nc)
	if err != nil {
		return o.explain(rctx, err)
	}
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

// tableInfo describes the table: the whole table over its shards when
// sharded, having checked that each --prefix is the shard its place says.
// The sharded producer does not check that, and a shard refuses every item
// of a producer given the prefixes out of order, after JetStream stored
// them, which inserts counted when stored would not show.
func (o benchOptions) tableInfo(ctx context.Context, nc *nats.Conn) (*broker.TableInfo, error) {
	if !o.sharded {
		c, err := o.client(nc)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		info, err := c.Info(ctx, o.table)
		if err != nil {
			return nil, err
		}
		return &info.Tables[0], nil
	}
	sc, err := broker.NewShardedClient(nc, o.shards)
	if err != nil {
		return nil, err
	}
	defer sc.Close()
	info, err := sc.Info(ctx, o.table)
	if err != nil {
		return nil, err
	}
	n := len(o.shards)
	for i, s := range info.Shards {
		switch {
		case s.ShardCount == 0:
			return nil, fmt.Errorf("--prefix %q is not a shard: start its reprised with --shard %d/%d", o.shards[i], i, n)
		case s.ShardIndex != i || s.ShardCount != n:
			return nil, fmt.Errorf("--prefix %q is shard %d/%d (reprised --shard) but comes as shard %d/%d: give --prefix once per shard, in shard order", o.shards[i], s.ShardIndex, s.ShardCount, i, n)
		}
	}
	return &info.Tables[0], nil
}

// writeProgress writes the line that shows, once a second on stderr, that
// the run goes on and how fast.
func writeProgress(w io.Writer, p load.Progress) {
	phase := "measuring"
	if p.Warmup {
		phase = "warmup"
	}
	line := fmt.Sprintf("bench %4.0fs %-9s", p.Elapsed.Seconds(), phase)
	for _, op := range []struct {
		name string
		r    *load.Rate
	}{{"insert", p.Insert}, {"sample", p.Sample}} {
		if op.r != nil {
			line += fmt.Sprintf("  %s %8.0f items/s %10s/s", op.name, op.r.ItemsPerSec, formatBytes(op.r.BytesPerSec))
		}
	}
	fmt.Fprintln(w, line)
}

// benchReport is what bench prints; its JSON form is --json's output.
type benchReport struct {
	Mode   string `json:"mode"`
	URL    string `json:"url"`
	Prefix string `json:"prefix"`
	// Shards counts the table's shards; Sharded says whether the clients
	// were sharded producers and clients (always, for more than one), and
	// Prefixes names the shards where there are several.
	Shards       int      `json:"shards"`
	Sharded      bool     `json:"sharded"`
	Prefixes     []string `json:"prefixes,omitempty"`
	Table        string   `json:"table"`
	Clients      int      `json:"clients"`
	PayloadBytes int      `json:"payload_bytes,omitempty"` // of inserted items
	Batch        int      `json:"batch"`
	// Episode is the items of an inserter's episode; 0, one episode for
	// the run.
	Episode int `json:"episode,omitempty"`
	// Learners and SampleBatch are the samplers of a mixed run, where
	// they differ from Clients and Batch.
	Learners    int `json:"learners,omitempty"`
	SampleBatch int `json:"sample_batch,omitempty"`
	// InFlight is the requests each sampler kept open (0: one at a time).
	InFlight    int     `json:"in_flight,omitempty"`
	Compression string  `json:"compression"`
	WarmupSec   float64 `json:"warmup_sec"`
	DurationSec float64 `json:"duration_sec"`
	// The totals over every kind of operation.
	Items       int64              `json:"items"`
	ItemsPerSec float64            `json:"items_per_sec"`
	BytesPerSec float64            `json:"bytes_per_sec"`
	Latency     load.LatencyReport `json:"latency"`
	Insert      *opReport          `json:"insert,omitempty"`
	Sample      *opReport          `json:"sample,omitempty"`
}

type opReport struct {
	Items           int64              `json:"items"`
	Bytes           int64              `json:"bytes"`
	ItemsPerSec     float64            `json:"items_per_sec"`
	BytesPerSec     float64            `json:"bytes_per_sec"`
	RateLimited     int64              `json:"rate_limited_requests,omitempty"`
	LatencyMeasures string             `json:"latency_measures"`
	Latency         load.LatencyReport `json:"latency"`
}

func (o benchOptions) report(r load.BenchResult) benchReport {
	rep := benchReport{
		Mode: o.mode, URL: natsconn.Redact(o.conn.URL), Prefix: o.prefix, Shards: len(o.shards), Sharded: o.sharded, Table: o.table, Clients: o.clients,
		Batch: o.batch, Learners: o.learners, SampleBatch: o.sampleBatch, InFlight: o.inFlight, Compression: o.compression,
		WarmupSec: o.warmup.Seconds(), DurationSec: r.Total.Seconds,
		Items: r.Total.Items, ItemsPerSec: r.Total.ItemsPerSec, BytesPerSec: r.Total.BytesPerSec, Latency: r.Total.Latency,
	}
	op := func(t *load.Throughput, measures string) *opReport {
		if t == nil {
			return nil
		}
		return &opReport{
			Items: t.Items, Bytes: t.Bytes, ItemsPerSec: t.ItemsPerSec, BytesPerSec: t.BytesPerSec,
			RateLimited: t.RateLimited, LatencyMeasures: measures, Latency: t.Latency,
		}
	}
	if len(o.shards) > 1 {
		rep.Prefixes = o.shards
	}
	rep.Insert = op(r.Insert, fmt.Sprintf("per batch of %d items, from its first Append until Flush (EndEpisode at an episode's end) returned (stored in JetStream)", o.batch))
	measures := fmt.Sprintf("per Sample request of %d items, from sending it until its items were decoded", cmp.Or(o.sampleBatch, o.batch))
	if o.inFlight > 0 {
		measures = fmt.Sprintf("per batch of %d items, from asking the Sampler (%d requests open) for it until it was there", cmp.Or(o.sampleBatch, o.batch), o.inFlight)
	}
	rep.Sample = op(r.Sample, measures)
	if rep.Insert != nil {
		rep.PayloadBytes = o.payload
		rep.Episode = o.episode
	}
	return rep
}

func (r benchReport) write(w io.Writer) {
	switch {
	case r.Shards > 1:
		fmt.Fprintf(w, "bench %s: table %s at %s, %d shards (prefixes %s), sharded clients\n", r.Mode, r.Table, r.URL, r.Shards, strings.Join(r.Prefixes, ", "))
	case r.Sharded:
		fmt.Fprintf(w, "bench %s: table %s at %s (prefix %s), one shard, sharded clients\n", r.Mode, r.Table, r.URL, r.Prefix)
	default:
		fmt.Fprintf(w, "bench %s: table %s at %s (prefix %s)\n", r.Mode, r.Table, r.URL, r.Prefix)
	}
	payload := ""
	if r.Insert != nil {
		episodes := "one episode each, "
		if r.Episode > 0 {
			episodes = fmt.Sprintf("episodes of %d, ", r.Episode)
		}
		payload = fmt.Sprintf("%d-byte float32 payloads, compression %s, %s", r.PayloadBytes, r.Compression, episodes)
	}
	fmt.Fprintf(w, "  %d clients, %sbatches of %d, %.1fs measured after %.1fs warmup\n",
		r.Clients, payload, r.Batch, r.DurationSec, r.WarmupSec)
	if r.Learners > 0 || r.SampleBatch > 0 {
		fmt.Fprintf(w, "  samplers: %d, %d items per request\n", cmp.Or(r.Learners, r.Clients), cmp.Or(r.SampleBatch, r.Batch))
	}
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
