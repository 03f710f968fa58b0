package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/cmd/internal/cli"
	"github.com/reprise-rl/reprise/internal/natsconn"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/tables"
)

// infoReport is what info prints; its JSON form is --json's output.
type infoReport struct {
	URL             string        `json:"url"`
	Prefix          string        `json:"prefix"`
	AppliedSequence uint64        `json:"applied_sequence"`
	Chunks          int64         `json:"chunks"`
	ChunkBytes      int64         `json:"chunk_bytes"`
	Rejected        int64         `json:"rejected_messages"`
	Tables          []tableReport `json:"tables"`
	// Shards are the shards' own reports when this one sums a sharded
	// deployment's.
	Shards []infoReport `json:"shards,omitempty"`
}

type tableReport struct {
	Name            string           `json:"name"`
	Sampler         string           `json:"sampler"`
	Remover         string           `json:"remover"`
	MaxSize         int64            `json:"max_size"`
	MaxTimesSampled int32            `json:"max_times_sampled"`
	RateLimiter     limiterReport    `json:"rate_limiter"`
	Signature       tables.Signature `json:"signature,omitempty"`
	Size            int64            `json:"size"`
	BytesHeld       int64            `json:"bytes_held"`
	Inserts         int64            `json:"inserts"`
	Samples         int64            `json:"samples"`
	Deletes         int64            `json:"deletes"`
	Evictions       int64            `json:"evictions"`
	InsertWaits     int64            `json:"insert_waits"`
	SampleWaits     int64            `json:"sample_waits"`
	// The policy versions: the table's current one, its staleness bound,
	// the span its items cover and the items dropped as stale.
	PolicyVersion  int64  `json:"policy_version"`
	MaxStaleness   *int64 `json:"max_staleness,omitempty"`
	MinItemVersion int64  `json:"min_item_version"`
	MaxItemVersion int64  `json:"max_item_version"`
	StaleEvictions int64  `json:"stale_evictions"`
	// Reverb's episode and unique sample counts.
	Episodes        int64 `json:"num_episodes"`
	DeletedEpisodes int64 `json:"num_deleted_episodes"`
	UniqueSamples   int64 `json:"num_unique_samples"`
}

// limiterReport is a table's rate limiter: its parameters, the preset they
// match, and its counts since the table's creation or last reset.
type limiterReport struct {
	Preset  string         `json:"preset"`
	Config  limiter.Config `json:"config"`
	Inserts int64          `json:"inserts"`
	Samples int64          `json:"samples"`
	Deletes int64          `json:"deletes"`
}

func runInfo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		t      target
		asJSON bool
	)
	fs := newFlagSet("info", "info [flags] [TABLE]",
		"Shows every table (or only TABLE) of the deployment: size, selectors, rate\nlimiter and its counts, lifetime counters and bytes held. With --prefix once\nper shard, the tables of a sharded deployment: their sums, and each shard.\n", stderr)
	t.registerShards(fs)
	fs.BoolVar(&asJSON, "json", false, "print one JSON object instead of a table")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return cli.Usagef("info takes at most one table name, got %q", pos)
	}
	t.finishShards()
	if err := t.check(); err != nil {
		return err
	}
	table := ""
	if len(pos) == 1 {
		table = pos[0]
	}
	if len(t.shards) > 1 {
		rep, err := shardedInfoReport(ctx, &t, table)
		if err != nil {
			return err
		}
		return writeInfo(stdout, rep, asJSON)
	}
	c, rctx, hangUp, err := t.dial(ctx)
	if err != nil {
		return err
	}
	defer hangUp()
	resp, err := c.Info(rctx, table)
	if err != nil {
		return t.explain(rctx, err)
	}
	return writeInfo(stdout, newInfoReport(natsconn.Redact(t.conn.URL), t.prefix, resp), asJSON)
}

func writeInfo(w io.Writer, rep infoReport, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.write(w)
}

// shardedInfoReport is the info of a table sharded over t.shards: the sums
// over the shards, and each shard's own.
func shardedInfoReport(ctx context.Context, t *target, table string) (infoReport, error) {
	nc, rctx, hangUp, err := t.dialConn(ctx)
	if err != nil {
		return infoReport{}, err
	}
	defer hangUp()
	sc, err := broker.NewShardedClient(nc, t.shards)
	if err != nil {
		return infoReport{}, err
	}
	defer sc.Close()
	info, err := sc.Info(rctx, table)
	if err != nil {
		return infoReport{}, t.explain(rctx, err)
	}
	rep := newInfoReport(natsconn.Redact(t.conn.URL), strings.Join(t.shards, ","), &info.Info)
	for i, s := range info.Shards {
		rep.Shards = append(rep.Shards, newInfoReport(natsconn.Redact(t.conn.URL), t.shards[i], s))
	}
	return rep, nil
}

func newInfoReport(url, prefix string, resp *broker.Info) infoReport {
	rep := infoReport{
		URL: url, Prefix: prefix,
		AppliedSequence: resp.AppliedSequence, Chunks: resp.Chunks, ChunkBytes: resp.ChunkBytes, Rejected: resp.RejectedMessages,
		Tables: make([]tableReport, 0, len(resp.Tables)),
	}
	for _, ti := range resp.Tables {
		l := ti.Limiter
		cfg := limiterConfig(l)
		tr := tableReport{
			Name: ti.Name, Sampler: ti.Sampler, Remover: ti.Remover, MaxSize: ti.MaxSize, MaxTimesSampled: ti.MaxTimesSampled,
			RateLimiter: limiterReport{Preset: describeLimiter(cfg, ti.Sampler), Config: cfg, Inserts: l.Inserts, Samples: l.Samples, Deletes: l.Deletes},
			Size:        ti.Size, BytesHeld: ti.BytesHeld, Inserts: ti.Inserts, Samples: ti.Samples, Deletes: ti.Deletes,
			Evictions: ti.Evictions, InsertWaits: ti.InsertWaits, SampleWaits: ti.SampleWaits,

			PolicyVersion: ti.PolicyVersion, MaxStaleness: ti.MaxStaleness,
			MinItemVersion: ti.MinItemVersion, MaxItemVersion: ti.MaxItemVersion, StaleEvictions: ti.StaleEvictions,
			Episodes: ti.Episodes, DeletedEpisodes: ti.DeletedEpisodes, UniqueSamples: ti.UniqueSamples,
		}
		tr.Signature = ti.Signature
		rep.Tables = append(rep.Tables, tr)
	}
	return rep
}

func limiterConfig(l broker.LimiterInfo) limiter.Config {
	return limiter.Config{SamplesPerInsert: l.SamplesPerInsert, MinSize: l.MinSize, MinDiff: l.MinDiff, MaxDiff: l.MaxDiff}
}

// describeLimiter names the preset a limiter's parameters match, with the
// preset's own parameters, as reprise.example.yaml writes them.
func describeLimiter(c limiter.Config, sampler string) string {
	offset := c.SamplesPerInsert * float64(c.MinSize)
	switch {
	case c.SamplesPerInsert == 1 && math.IsInf(c.MinDiff, -1) && math.IsInf(c.MaxDiff, 1):
		return fmt.Sprintf("min_size(%d)", c.MinSize)
	case c.SamplesPerInsert == 1 && c.MinSize == 1 && c.MinDiff == 0 && !math.IsInf(c.MaxDiff, 0):
		kind := "queue"
		if sampler == "lifo" {
			kind = "stack"
		}
		return fmt.Sprintf("%s(%g)", kind, c.MaxDiff)
	case !math.IsInf(c.MinDiff, 0) && !math.IsInf(c.MaxDiff, 0) && math.Abs((offset-c.MinDiff)-(c.MaxDiff-offset)) < 1e-9*math.Max(1, math.Abs(offset)):
		return fmt.Sprintf("ratio(spi=%g, min_size=%d, error_buffer=%g)", c.SamplesPerInsert, c.MinSize, c.MaxDiff-offset)
	}
	return fmt.Sprintf("custom(spi=%g, min_size=%d, min_diff=%s, max_diff=%s)", c.SamplesPerInsert, c.MinSize, formatBound(c.MinDiff), formatBound(c.MaxDiff))
}

// formatBound writes a limiter bound as the configuration does, with inf
// for infinity.
func formatBound(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	return fmt.Sprintf("%g", f)
}

func (r infoReport) write(w io.Writer) error {
	if len(r.Shards) > 0 {
		fmt.Fprintf(w, "Reprise at %s, %d shards (prefixes %s): %d chunks held (%s), %d messages rejected, over all shards\n",
			r.URL, len(r.Shards), r.Prefix, r.Chunks, formatBytes(float64(r.ChunkBytes)), r.Rejected)
		for i, s := range r.Shards {
			sizes := make([]string, len(s.Tables))
			for j, t := range s.Tables {
				sizes[j] = fmt.Sprintf("%s %d", t.Name, t.Size)
			}
			fmt.Fprintf(w, "  shard %d, prefix %s: stream applied up to sequence %d, %d chunks held (%s); items: %s\n",
				i, s.Prefix, s.AppliedSequence, s.Chunks, formatBytes(float64(s.ChunkBytes)), strings.Join(sizes, ", "))
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "Reprise at %s, prefix %s: stream applied up to sequence %d, %d chunks held (%s), %d messages rejected\n\n",
			r.URL, r.Prefix, r.AppliedSequence, r.Chunks, formatBytes(float64(r.ChunkBytes)), r.Rejected)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tSIZE\tMAX SIZE\tSAMPLER\tREMOVER\tMAX SAMPLED\tRATE LIMITER\tINSERTS\tSAMPLES\tDELETES\tEVICTIONS\tHELD\tINSERT WAITS\tSAMPLE WAITS")
	for _, t := range r.Tables {
		maxSampled := "unlimited"
		if t.MaxTimesSampled > 0 {
			maxSampled = fmt.Sprint(t.MaxTimesSampled)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d\t%d\n",
			t.Name, t.Size, t.MaxSize, t.Sampler, t.Remover, maxSampled, t.RateLimiter.Preset,
			t.Inserts, t.Samples, t.Deletes, t.Evictions, formatBytes(float64(t.BytesHeld)), t.InsertWaits, t.SampleWaits)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var sigs []string
	for _, t := range r.Tables {
		if len(t.Signature) == 0 {
			continue
		}
		cols := make([]string, len(t.Signature))
		for i, c := range t.Signature {
			cols[i] = fmt.Sprintf("%s %s%v", c.Name, c.DType, c.Shape)
		}
		sigs = append(sigs, fmt.Sprintf("  %s: %s", t.Name, strings.Join(cols, ", ")))
	}
	if len(sigs) > 0 {
		fmt.Fprintf(w, "\nSignatures:\n%s\n", strings.Join(sigs, "\n"))
	}
	var versions []string
	for _, t := range r.Tables {
		if t.MaxStaleness == nil && t.PolicyVersion == 0 && t.MaxItemVersion == 0 {
			continue
		}
		bound := "no staleness bound"
		if t.MaxStaleness != nil {
			bound = fmt.Sprintf("max_staleness %d, %d items dropped as stale", *t.MaxStaleness, t.StaleEvictions)
		}
		versions = append(versions, fmt.Sprintf("  %s: current %d, items of versions %d..%d, %s", t.Name, t.PolicyVersion, t.MinItemVersion, t.MaxItemVersion, bound))
	}
	if len(versions) > 0 {
		fmt.Fprintf(w, "\nPolicy versions:\n%s\n", strings.Join(versions, "\n"))
	}
	return nil
}

// formatBytes writes a byte count with a binary unit: 0 B, 512 B, 1.5 KiB.
func formatBytes(b float64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%.0f B", b)
	}
	exp := 0
	for b >= unit && exp < 5 {
		b /= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", b, "KMGTP"[exp-1])
}

func runReset(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		t   target
		all bool
	)
	fs := newFlagSet("reset", "reset [flags] TABLE | --all",
		"Empties TABLE (or, with --all, every table) and zeroes its rate limiter's\ncounts. The reset goes through the stream, in order with the inserts around\nit; lifetime counters (inserts, samples, ...) keep counting.\n", stderr)
	t.register(fs)
	fs.BoolVar(&all, "all", false, "reset every table")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	switch {
	case all && len(pos) > 0:
		return cli.Usagef("give a table or --all, not both")
	case !all && len(pos) != 1:
		return cli.Usagef("reset needs one table name (or --all to reset every table)")
	}
	if err := t.check(); err != nil {
		return err
	}
	table := ""
	if !all {
		table = pos[0]
	}
	c, rctx, hangUp, err := t.dial(ctx)
	if err != nil {
		return err
	}
	defer hangUp()
	if err := c.Reset(rctx, table); err != nil {
		return t.explain(rctx, err)
	}
	if all {
		fmt.Fprintln(stdout, "reset every table")
	} else {
		fmt.Fprintf(stdout, "reset table %s\n", table)
	}
	return nil
}

// checkpointTimeout is reprisectl checkpoint's default --timeout: writing
// large tables takes minutes (the service allows itself 30 s plus 1 s per 4
// MiB), and the 10 s of other commands made a checkpoint of 650 MiB under
// load look like a service that never answered.
const checkpointTimeout = 10 * time.Minute

func runCheckpoint(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		t      = target{timeout: checkpointTimeout}
		asJSON bool
	)
	fs := newFlagSet("checkpoint", "checkpoint [flags]",
		"Writes a checkpoint of every table now, then trims the stream below what\nthe kept checkpoints need. Inserts and samples go on while it is written;\nthey pause only while the state is copied (the pause it reports).\n", stderr)
	t.register(fs)
	fs.BoolVar(&asJSON, "json", false, "print the result as one JSON object")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return cli.Usagef("checkpoint takes no arguments, got %q", pos[0])
	}
	if err := t.check(); err != nil {
		return err
	}
	c, rctx, hangUp, err := t.dial(ctx)
	if err != nil {
		return err
	}
	defer hangUp()
	res, err := c.Checkpoint(rctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("no answer within --timeout %v: %w\nA checkpoint the service started goes on without this command: reprised logs \"checkpoint written\" once it is stored (give a longer --timeout to wait for it)", t.timeout, err)
	}
	if err != nil {
		return t.explain(rctx, err)
	}
	pause, write := res.Pause, res.Write
	if asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{
			"name": res.Name, "applied_sequence": res.AppliedSequence, "items": res.Items, "bytes": res.Bytes,
			"pause_ms": float64(pause) / float64(time.Millisecond), "write_ms": float64(write) / float64(time.Millisecond),
		})
	}
	fmt.Fprintf(stdout, "checkpoint %s: %d items, %s, through stream sequence %d; paused %v, written in %v\n",
		res.Name, res.Items, formatBytes(float64(res.Bytes)), res.AppliedSequence, pause.Round(time.Microsecond), write.Round(time.Millisecond))
	return nil
}
