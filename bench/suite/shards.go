package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/reprise-rl/reprise/internal/load"
)

// ShardPoint is one point of the shards section: a table spread over
// Shards reprised on one nats-server, loaded by reprisectl bench through
// the sharded producer and client, or (Sharded false) through the plain
// Producer and Client over the one shard of a 1-shard table.
type ShardPoint struct {
	Shards  int    `json:"shards"`
	Sharded bool   `json:"sharded"`
	Mode    string `json:"mode"`
	Payload int    `json:"payload_bytes"`
	Clients int    `json:"clients"`
	Batch   int    `json:"batch"`
	// Episode is the items of an inserter's episode: its producer's next
	// episode goes to the next shard.
	Episode     int     `json:"episode,omitempty"`
	ItemsPerSec float64 `json:"items_per_sec"`
	BytesPerSec float64 `json:"bytes_per_sec"`
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	// Load1 is the machine's 1-minute load average as the point started.
	Load1 float64 `json:"load1"`
	// OverOneShard is items/s over those of the sharded 1-shard point of
	// the same mode, payload and clients (in Results.ShardSummary, over
	// the sharded 1-shard best); 0 where there is none.
	OverOneShard float64 `json:"over_one_shard,omitempty"`
}

// shardPrefix is the prefix of shard i in the shards section.
func shardPrefix(i int) string { return fmt.Sprintf("bench%d", i) }

// shards runs the shards section: for each shard count, a fresh
// nats-server and one reprised per shard, loaded with inserts then samples.
func (s *suite) shards(ctx context.Context) error {
	for _, n := range s.plan.shardCounts {
		if err := s.withShards(ctx, n, s.shardPoints); err != nil {
			return fmt.Errorf("%d shards: %w", n, err)
		}
	}
	return nil
}

// withShards starts one nats-server and n reprised on it, shard i of n with
// prefix shardPrefix(i) and the suite's tables, runs f, then stops them
// all, whatever f did. alive reports any of them that exited.
func (s *suite) withShards(ctx context.Context, n int, f func(ctx context.Context, url string, prefixes []string, alive func() error) error) (err error) {
	dir := filepath.Join(s.work, fmt.Sprintf("shards-%d", n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	config := filepath.Join(dir, "reprised.yaml")
	if err := writeConfig(config, false); err != nil {
		return err
	}
	ns, err := startNATS(ctx, s.bins.natsServer, dir)
	if err != nil {
		return err
	}
	s.log.Info("nats-server ready", "shards", n, "url", ns.url, "pid", ns.pid())
	var procs []*daemon
	defer func() {
		// The services first, while their server still answers.
		for _, d := range slices.Backward(procs) {
			err = errors.Join(err, d.stop())
		}
		err = errors.Join(err, ns.stop())
		if !s.opts.keep {
			// Each shard count's streams are of no use to the next.
			err = errors.Join(err, os.RemoveAll(filepath.Join(dir, "nats-server-store")))
		}
	}()
	var prefixes []string
	for i := range n {
		prefix := shardPrefix(i)
		d, err := startDaemon(ctx, s.bins.reprised, dir, "reprised-"+prefix,
			"--config", config, "--nats", ns.url, "--prefix", prefix, "--shard", fmt.Sprintf("%d/%d", i, n))
		if err != nil {
			return err
		}
		procs = append(procs, d)
		prefixes = append(prefixes, prefix)
		s.log.Info("reprised ready", "shard", fmt.Sprintf("%d/%d", i, n), "prefix", prefix, "pid", d.pid())
	}
	alive := func() error {
		errs := []error{ns.alive()}
		for _, d := range procs {
			errs = append(errs, d.alive())
		}
		return errors.Join(errs...)
	}
	if err := f(ctx, ns.url, prefixes, alive); err != nil {
		// A crash explains the failure better than the client's view.
		return errors.Join(err, alive())
	}
	return alive()
}

// shardPoints runs reprisectl bench on a table of len(prefixes) shards:
// inserts, which fill the table, then samples, at each payload and client
// count. Every run goes through the sharded producer and client; on one
// shard the plain ones run too, alternating with them point by point so
// that both see the same machine. Inserters end an episode every batch,
// plain ones too, so that the runs differ only in the shards and the
// clients. After each insert point the services apply what it left in
// their streams before the next point starts: inserts count once stored,
// and the next point would compete with that work.
func (s *suite) shardPoints(ctx context.Context, url string, prefixes []string, alive func() error) error {
	p := s.plan
	n := len(prefixes)
	kinds := []bool{true}
	if n == 1 {
		kinds = append(kinds, false)
	}
	for _, payload := range p.shardPayloads {
		for _, mode := range []string{"insert", "sample"} {
			batch, episode := insertBatch(payload), insertBatch(payload)
			if mode == "sample" {
				batch, episode = sampleBatch(payload), 0
			}
			for _, clients := range p.shardClients {
				for _, sharded := range kinds {
					load1 := loadAvg()[0]
					r, err := ctlBench(ctx, s.bins.reprisectl, url, ctlArgs{mode: mode, table: benchTable(payload),
						clients: clients, payload: payload, batch: batch, warmup: p.warmup, duration: p.duration,
						prefixes: prefixes, sharded: sharded, episode: episode})
					if err != nil {
						return err
					}
					if err := alive(); err != nil {
						return err
					}
					if mode == "insert" {
						if err := caughtUp(ctx, url, prefixes); err != nil {
							return err
						}
					}
					pt := ShardPoint{Shards: n, Sharded: sharded, Mode: mode, Payload: payload, Clients: clients, Batch: batch, Episode: episode,
						ItemsPerSec: r.ItemsPerSec, BytesPerSec: r.BytesPerSec, P50Ms: r.Latency.P50Ms, P99Ms: r.Latency.P99Ms, Load1: load1}
					s.res.Shards = append(s.res.Shards, pt)
					s.log.Info("shards", "shards", n, "client", shardClientName(sharded), "mode", mode, "payload", payload, "clients", clients,
						"batch", batch, "items/s", si(pt.ItemsPerSec), "bytes/s", si(pt.BytesPerSec)+"B/s", "load", fmt.Sprintf("%.1f", load1))
				}
			}
		}
	}
	return nil
}

// caughtUp waits until every shard's service has applied its stream.
func caughtUp(ctx context.Context, url string, prefixes []string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, prefix := range prefixes {
		if err := load.CaughtUp(ctx, url, prefix); err != nil {
			return fmt.Errorf("shard %s after inserts: %w", prefix, err)
		}
	}
	return nil
}

func shardClientName(sharded bool) string {
	if sharded {
		return "sharded"
	}
	return "plain"
}

// summarizeShards computes each point's ratio to the sharded 1-shard point
// like it, and the best of each shard count, kind of client, mode and
// payload over client counts, with its ratio to the sharded 1-shard best.
func (r *Results) summarizeShards() {
	oneShard := func(points []ShardPoint, p ShardPoint, sameClients bool) *ShardPoint {
		for i := range points {
			q := &points[i]
			if q.Shards == 1 && q.Sharded && q.Mode == p.Mode && q.Payload == p.Payload && (!sameClients || q.Clients == p.Clients) {
				return q
			}
		}
		return nil
	}
	over := func(p ShardPoint, base *ShardPoint) float64 {
		if base == nil || base.ItemsPerSec == 0 {
			return 0
		}
		return p.ItemsPerSec / base.ItemsPerSec
	}
	for i := range r.Shards {
		r.Shards[i].OverOneShard = over(r.Shards[i], oneShard(r.Shards, r.Shards[i], true))
	}
	r.ShardSummary = nil
	for _, p := range r.Shards {
		i := slices.IndexFunc(r.ShardSummary, func(b ShardPoint) bool {
			return b.Shards == p.Shards && b.Sharded == p.Sharded && b.Mode == p.Mode && b.Payload == p.Payload
		})
		switch {
		case i < 0:
			r.ShardSummary = append(r.ShardSummary, p)
		case p.ItemsPerSec > r.ShardSummary[i].ItemsPerSec:
			r.ShardSummary[i] = p
		}
	}
	sharded := func(p ShardPoint) int {
		if p.Sharded {
			return 1
		}
		return 0
	}
	slices.SortFunc(r.ShardSummary, func(a, b ShardPoint) int {
		// Inserts before samples (by name), then by payload; the plain
		// clients first, beside the sharded 1-shard row that shows what
		// the wrapper costs, then by shard count.
		return cmp.Or(cmp.Compare(a.Mode, b.Mode), cmp.Compare(a.Payload, b.Payload),
			cmp.Compare(sharded(a), sharded(b)), cmp.Compare(a.Shards, b.Shards))
	})
	for i := range r.ShardSummary {
		r.ShardSummary[i].OverOneShard = over(r.ShardSummary[i], oneShard(r.ShardSummary, r.ShardSummary[i], false))
	}
}

// shardsMarkdown writes the shards section's table.
func (r *Results) shardsMarkdown(w io.Writer) {
	if len(r.ShardSummary) == 0 {
		return
	}
	fmt.Fprintln(w, "\nShards (Reprise; one table spread over N reprised on one nats-server, loaded through the sharded producer and client; inserters end an episode every batch, which goes to the next shard; best over client counts):")
	fmt.Fprintln(w, "\n| mode | payload | batch | shards | clients | items/s | bytes/s | ÷ sharded, 1 shard | p50 | load average |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, row := range r.ShardSummary {
		shards := fmt.Sprint(row.Shards)
		if !row.Sharded {
			shards += " (plain Producer/Client)"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %d | %s | %sB/s | %.2f | %.1f ms | %.1f |\n", row.Mode, sizeName(row.Payload), row.Batch, shards,
			row.Clients, si(row.ItemsPerSec), si(row.BytesPerSec), row.OverOneShard, row.P50Ms, row.Load1)
	}
}
