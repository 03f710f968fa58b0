package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestQuickSuite runs the smoke version of the suite, as CI does, so that
// the suite cannot rot: reprised and reprisectl build, every section runs
// against them, and the results and plots it writes are well formed.
func TestQuickSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the benchmark suite's smoke version (about 1.5 min)")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command to build reprised and reprisectl")
	}
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	res, err := run(ctx, options{out: out, quick: true, repo: "."}, log)
	if err != nil {
		t.Fatal(err)
	}

	plan := quickPlan()
	for _, sys := range []string{sysReprise, sysJetStream} {
		for _, mode := range []string{"insert", "sample"} {
			for _, c := range plan.clients {
				p := find(res.Throughput, sys, mode, plan.payloads[0], c)
				if p == nil || !(p.ItemsPerSec > 0) || !(p.BytesPerSec >= p.ItemsPerSec*float64(p.Payload)*0.99) {
					t.Errorf("%s %s with %d clients: point %+v, want items/s > 0 and bytes/s = items/s × payload", sys, mode, c, p)
				}
			}
		}
	}
	for _, c := range plan.clients {
		if p := find(res.Throughput, sysJetStreamConsumed, "insert", plan.payloads[0], c); p == nil || !(p.ItemsPerSec > 0) {
			t.Errorf("raw JetStream consumed, inserts with %d clients: point %+v, want items/s > 0", c, p)
		}
	}
	if len(res.Mixed) != len(plan.mixedClients) || res.Mixed[0].InsertItemsPerSec <= 0 || res.Mixed[0].SampleItemsPerSec <= 0 {
		t.Errorf("mixed: %+v, want inserts and samples", res.Mixed)
	}
	// The limiter keeps samples within the error buffer of 4 per insert.
	if m := res.Mixed[0]; m.Achieved > mixedSamplesPerInsert*1.5 {
		t.Errorf("mixed: %.2f samples per insert, want near %d", m.Achieved, mixedSamplesPerInsert)
	}
	if a := res.Atari; a == nil || a.CompressionRatio <= 2 || a.Sample.ItemsPerSec <= 0 {
		t.Errorf("atari: %+v, want frames compressed more than 2x and sampled", a)
	}
	if l := res.latencyOf(sysReprise); l == nil || l.SampleP50Us <= 0 || l.InsertToSampledP50Us <= 0 || l.SampleP99Us < l.SampleP50Us {
		t.Errorf("latency: %+v, want positive percentiles in order", l)
	}
	if _, err := os.Stat("/proc/self/status"); err == nil {
		if len(res.Memory) != 2 {
			t.Errorf("memory: %d points, want 2", len(res.Memory))
		}
		for _, m := range res.Memory {
			if m.RSSBytes <= m.BaseRSSBytes || m.PayloadBytes <= 0 {
				t.Errorf("memory: %+v, want resident memory above the base after a fill", m)
			}
			// Resting gives memory back (gcpace) or at least takes none.
			if m.RestRSSBytes <= m.BaseRSSBytes || m.RestRSSBytes > m.RSSBytes+m.RSSBytes/10 {
				t.Errorf("memory: %+v, want resident memory at rest above the base and not above the figure after the fill", m)
			}
		}
	}
	if len(res.Actors) != len(plan.actorProducers) {
		t.Errorf("actors: %d runs, want %d", len(res.Actors), len(plan.actorProducers))
	}
	for _, a := range res.Actors {
		if a.LearnerItemsPerSec <= 0 || a.ProducerItemsPerSec <= 0 || a.LearnerP99Ms < a.LearnerP50Ms {
			t.Errorf("actors: %+v, want learners and producers at work, percentiles in order", a)
		}
	}
	// Shards: inserts and samples at every shard count, through the
	// sharded clients, and on one shard through the plain ones too.
	for _, n := range plan.shardCounts {
		for _, mode := range []string{"insert", "sample"} {
			for _, sharded := range []bool{true, false} {
				if !sharded && n > 1 {
					continue
				}
				i := slices.IndexFunc(res.ShardSummary, func(p ShardPoint) bool {
					return p.Shards == n && p.Sharded == sharded && p.Mode == mode && p.Payload == plan.shardPayloads[0]
				})
				if i < 0 {
					t.Errorf("shards: no row for %d shards, sharded %v, %s", n, sharded, mode)
					continue
				}
				p := res.ShardSummary[i]
				if !(p.ItemsPerSec > 0) || !(p.BytesPerSec >= p.ItemsPerSec*float64(p.Payload)*0.99) || !(p.OverOneShard > 0) {
					t.Errorf("shards: row %+v, want items/s > 0, bytes/s = items/s × payload, a ratio to 1 shard", p)
				}
				if n == 1 && sharded && p.OverOneShard != 1 {
					t.Errorf("shards: the 1-shard row %+v is %v × itself", p, p.OverOneShard)
				}
			}
		}
	}
	if len(res.Targets) != len(rawTargets)+6 {
		t.Errorf("%d targets, want the issue's %d", len(res.Targets), len(rawTargets)+6)
	}

	var back Results
	data, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	if len(back.Throughput) != len(res.Throughput) || len(back.Summary) != 2 {
		t.Errorf("results.json: %d points and %d summary rows, want %d and 2", len(back.Throughput), len(back.Summary), len(res.Throughput))
	}
	if len(back.Shards) != len(res.Shards) || len(back.ShardSummary) != len(res.ShardSummary) {
		t.Errorf("results.json: %d shard points and %d shard rows, want %d and %d", len(back.Shards), len(back.ShardSummary), len(res.Shards), len(res.ShardSummary))
	}
	f, err := os.Open(filepath.Join(out, "throughput.csv"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(f).ReadAll()
	f.Close()
	if err != nil || len(rows) != len(res.Throughput)+1 {
		t.Errorf("throughput.csv: %d rows (%v), want a header and %d points", len(rows), err, len(res.Throughput))
	}
	for _, name := range []string{"insert.png", "sample.png", "memory.png"} {
		f, err := os.Open(filepath.Join(out, name))
		if err != nil {
			t.Error(err)
			continue
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil || img.Bounds().Dx() < 600 {
			t.Errorf("%s: %v, want a PNG at least 600 px wide", name, err)
		}
	}
	summary, err := os.ReadFile(filepath.Join(out, "summary.md"))
	if err != nil || !strings.Contains(string(summary), "| insert | 400 B |") || !strings.Contains(string(summary), "| sample | 400 B | 256 | 2 |") {
		t.Errorf("summary.md lacks the insert row or the 2-shard sample row: %v\n%s", err, summary)
	}
	for _, s := range []Speed{res.Machine.SpeedStart, res.Machine.SpeedEnd} {
		if !(s.SHA256MBps > 0 && s.CopyGBps > 0 && s.MissNs > 0) || math.IsInf(s.SHA256MBps+s.CopyGBps+s.MissNs, 0) {
			t.Errorf("machine speed %+v, want every figure finite and above zero", s)
		}
	}
	if want := "one core: " + res.Machine.SpeedStart.String() + " at the start"; !strings.Contains(string(summary), want) {
		t.Errorf("summary.md does not say %q:\n%s", want, summary)
	}
}

func TestShardSummary(t *testing.T) {
	insert := func(n int, sharded bool, clients int, items float64) ShardPoint {
		return ShardPoint{Shards: n, Sharded: sharded, Mode: "insert", Payload: 400, Clients: clients, ItemsPerSec: items}
	}
	sample := func(n int, items float64) ShardPoint {
		return ShardPoint{Shards: n, Sharded: true, Mode: "sample", Payload: 400, Clients: 4, ItemsPerSec: items}
	}
	// In the order the section runs: samples after inserts, plain beside
	// sharded on 1 shard, then 2 shards.
	r := &Results{Shards: []ShardPoint{
		insert(1, true, 4, 100e3), insert(1, false, 4, 110e3), insert(1, true, 16, 120e3), insert(1, false, 16, 90e3),
		sample(1, 200e3),
		insert(2, true, 4, 150e3), insert(2, true, 16, 130e3),
		sample(2, 100e3),
	}}
	r.summarize()
	for i, want := range []float64{1, 1.1, 1, 0.75, 1, 1.5, 130.0 / 120, 0.5} {
		if got := r.Shards[i].OverOneShard; math.Abs(got-want) > 1e-9 {
			t.Errorf("point %+v: %v × the sharded 1-shard point with as many clients, want %v", r.Shards[i], got, want)
		}
	}
	want := []struct {
		shards, clients int
		sharded         bool
		mode            string
		over            float64
	}{
		{1, 4, false, "insert", 110.0 / 120}, // the plain clients' best beside the sharded best on 1 shard
		{1, 16, true, "insert", 1},
		{2, 4, true, "insert", 1.25},
		{1, 4, true, "sample", 1},
		{2, 4, true, "sample", 0.5},
	}
	if len(r.ShardSummary) != len(want) {
		t.Fatalf("%d summary rows, want %d: %+v", len(r.ShardSummary), len(want), r.ShardSummary)
	}
	for i, w := range want {
		got := r.ShardSummary[i]
		if got.Shards != w.shards || got.Clients != w.clients || got.Sharded != w.sharded || got.Mode != w.mode || math.Abs(got.OverOneShard-w.over) > 1e-9 {
			t.Errorf("row %d: %+v, want %d shards, best at %d clients, sharded %v, %s, %.3f × 1 shard", i, got, w.shards, w.clients, w.sharded, w.mode, w.over)
		}
	}
	var md strings.Builder
	r.markdown(&md)
	for _, row := range []string{"| insert | 400 B | 0 | 1 (plain Producer/Client) | 4 | 110.0k |", "| insert | 400 B | 0 | 2 | 4 | 150.0k | 0B/s | 1.25 |"} {
		if !strings.Contains(md.String(), row) {
			t.Errorf("markdown lacks %q:\n%s", row, md.String())
		}
	}
}

func TestSampleBatchFitsMaxPayload(t *testing.T) {
	for _, p := range paperPayloads {
		b := sampleBatch(p)
		// Items carry about 100 bytes of sample info and slices besides
		// their payload; the default max payload is 1 MiB.
		if b < 1 || b > 256 || b*(p+100) > 1<<20-1024 {
			t.Errorf("sampleBatch(%d) = %d: want 1..256 items in a reply under 1 MiB", p, b)
		}
	}
	if sampleBatch(400) != 256 {
		t.Errorf("sampleBatch(400) = %d, want the issue's 256", sampleBatch(400))
	}
}

func TestTargetsAndRatios(t *testing.T) {
	r := &Results{
		Throughput: []Point{
			{System: sysReprise, Mode: "insert", Payload: 400, Clients: 1, ItemsPerSec: 100e3, BytesPerSec: 40e6},
			{System: sysReprise, Mode: "insert", Payload: 400, Clients: 4, ItemsPerSec: 250e3, BytesPerSec: 100e6},
			{System: sysJetStream, Mode: "insert", Payload: 400, Clients: 4, ItemsPerSec: 500e3, BytesPerSec: 200e6},
			{System: sysReverb, Mode: "insert", Payload: 400, Clients: 1, ItemsPerSec: 300e3, BytesPerSec: 120e6},
			{System: sysJetStreamConsumed, Mode: "insert", Payload: 400, Clients: 1, ItemsPerSec: 200e3, BytesPerSec: 80e6},
			{System: sysJetStreamConsumed, Mode: "insert", Payload: 400, Clients: 4, ItemsPerSec: 320e3, BytesPerSec: 128e6},
			{System: sysReprise, Mode: "insert", Payload: 40000, Clients: 2, ItemsPerSec: 10e3, BytesPerSec: 400e6},
			{System: sysJetStream, Mode: "insert", Payload: 40000, Clients: 2, ItemsPerSec: 25e3, BytesPerSec: 1000e6},
			{System: sysReverb, Mode: "insert", Payload: 40000, Clients: 2, ItemsPerSec: 30e3, BytesPerSec: 1200e6},
			{System: sysReprise, Mode: "sample", Payload: 400, Clients: 8, ItemsPerSec: 900e3, BytesPerSec: 360e6},
			{System: sysJetStream, Mode: "sample", Payload: 400, Clients: 8, ItemsPerSec: 1e6, BytesPerSec: 400e6},
			{System: sysReverb, Mode: "sample", Payload: 400, Clients: 8, ItemsPerSec: 80e3, BytesPerSec: 32e6},
			{System: sysReprise, Mode: "sample", Payload: 4000, Clients: 8, ItemsPerSec: 95e3, BytesPerSec: 380e6},
			{System: sysJetStream, Mode: "sample", Payload: 4000, Clients: 8, ItemsPerSec: 100e3, BytesPerSec: 400e6},
			{System: sysReverb, Mode: "sample", Payload: 4000, Clients: 8, ItemsPerSec: 120e3, BytesPerSec: 480e6},
		},
		Memory: []MemoryPoint{
			{System: sysReprise, Series: "payload", Payload: 4000, Items: 1000, PayloadBytes: 4e6, RSSBytes: 30e6, BaseRSSBytes: 20e6},
			// Over the goals right after the fill, within them at rest.
			{System: sysReprise, Series: "payload", Payload: 4000, Items: 10000, PayloadBytes: 40e6, RSSBytes: 80e6, BaseRSSBytes: 20e6, RestRSSBytes: 64e6},
			{System: sysReprise, Series: "per-item", Payload: 16, Items: 100000, PayloadBytes: 1.6e6, RSSBytes: 51.7e6, BaseRSSBytes: 20e6, RestRSSBytes: 41.7e6},
		},
		Latency: []Latency{{System: sysReprise, SampleP50Us: 270}, {System: sysJetStream, SampleP50Us: 240}},
		Actors: []ActorLoad{
			{Producers: 200, LearnerItemsPerSec: 1.5e3},
			{Producers: 16, LearnerItemsPerSec: 26e3},
		},
	}
	r.summarize()
	if len(r.Summary) != 4 {
		t.Fatalf("%d summary rows, want inserts of 400 B and 40 kB, samples of 400 B and 4 kB", len(r.Summary))
	}
	row := r.Summary[0]
	if row.Reprise.Clients != 4 || math.Abs(row.VsJetStream-0.5) > 1e-9 || math.Abs(row.VsReverb-250.0/300) > 1e-9 {
		t.Errorf("insert 400 B row: %+v, want the 4-client point, 0.5 of raw and 0.83 of Reverb", row)
	}
	if row.Consumed == nil || row.Consumed.Clients != 4 || math.Abs(row.VsConsumed-250.0/320) > 1e-9 {
		t.Errorf("insert 400 B row: %+v, want 0.78 of raw JetStream consumed (its 4-client point)", row)
	}
	if r.Summary[1].Consumed != nil || r.Summary[1].VsConsumed != 0 {
		t.Errorf("insert 40 kB row: %+v, want no consumed baseline where none ran", r.Summary[1])
	}
	want := map[string]bool{
		"inserts, 400 B items, batch 64":       false, // 0.5 × raw
		"inserts, 40 kB items, batch 16":       false, // 0.4 × raw
		"samples, 400 B items, batch 256":      true,  // 0.9 × raw
		"samples, 4 kB items, batch 230":       true,  // 0.95 × raw
		"memory per payload byte held":         true,  // at rest 44 MB over base for 40 MB: 1.1 (1.5 after the fill)
		"memory per item beyond its payload":   true,  // at rest 201 B over 16 B of payload (301 B after the fill)
		"single-item sample p50, loopback TCP": false, // 1.125 × raw
		"learners under actor load":            false, // 1.5k vs 26k
		// Behind Reverb where raw is ahead (inserts of 400 B) and under
		// 0.9 × raw where raw trails Reverb (inserts of 40 kB); samples of
		// 400 B are ahead, samples of 4 kB within 0.95 × raw.
		"against Reverb": false,
	}
	for _, tg := range r.Targets {
		w, ok := want[tg.Name]
		if !ok {
			if tg.Met != nil {
				t.Errorf("target %q met %v with nothing measured: %s", tg.Name, *tg.Met, tg.Measured)
			}
			continue
		}
		delete(want, tg.Name)
		if tg.Met == nil || *tg.Met != w {
			t.Errorf("target %q: met %v (%s), want %v", tg.Name, tg.Met, tg.Measured, w)
		}
		if tg.Name == "against Reverb" && !strings.Contains(tg.Measured, "met on 2 of 4") {
			t.Errorf("target %q: %s, want met on 2 of 4 workloads", tg.Name, tg.Measured)
		}
	}
	if len(want) > 0 {
		t.Errorf("targets missing: %v", want)
	}
	if math.Abs(r.ActorsLearnerRatio-1.5/26) > 1e-9 {
		t.Errorf("actors learner ratio %v, want 1.5k ÷ 26k", r.ActorsLearnerRatio)
	}
	m := memoryFigures(r.Memory, sysReprise)
	if math.Abs(m.perByte-1.5) > 1e-9 || math.Abs(m.perItem-301) > 1e-9 || math.Abs(m.restPerByte-1.1) > 1e-9 || math.Abs(m.restPerItem-201) > 1e-9 {
		t.Errorf("memory figures %+v, want 1.5 per byte and 301 B per item after the fill, 1.1 and 201 B at rest", m)
	}
}

// testWriter sends the suite's progress log to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestInsertBatchStaysUnderIngestQueue(t *testing.T) {
	want := map[int]int{400: 64, 4000: 64, 40000: 16, 400000: 2}
	for p, w := range want {
		if b := insertBatch(p); b != w || 64*b*p > 64<<20 {
			t.Errorf("insertBatch(%d) = %d, want %d (64 clients under 64 MiB)", p, b, w)
		}
	}
}

// TestGridFlags: --payloads and --clients narrow the throughput grid to
// sizes the suite's reprised has tables for and to positive counts.
func TestGridFlags(t *testing.T) {
	o, err := parseFlags([]string{"--payloads", "400, 40000", "--clients", "16,64"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.payloads, []int{400, 40000}) || !slices.Equal(o.clients, []int{16, 64}) {
		t.Fatalf("payloads %v, clients %v; want [400 40000] and [16 64]", o.payloads, o.clients)
	}
	for _, args := range [][]string{{"--payloads", "500"}, {"--payloads", "400,"}, {"--clients", "0"}, {"--clients", "four"}} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted it", args)
		}
	}
}

// TestPrebuiltBinaries runs a section with --bin from a directory that is
// not a Go module: the suite must neither look for the repository nor
// build, as on a machine without Go.
func TestPrebuiltBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds reprised and reprisectl, then runs the quick latency section")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command to build the binaries it hands to --bin")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	repo, err := moduleRoot(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if _, err := build(ctx, repo, bin, false); err != nil {
		t.Fatal(err)
	}
	nowhere := filepath.Join(t.TempDir(), "no-repository")
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	res, err := run(ctx, options{out: t.TempDir(), quick: true, repo: nowhere, bin: bin, only: []string{"latency"}}, log)
	if err != nil {
		t.Fatal(err)
	}
	if l := res.latencyOf(sysReprise); l == nil || l.SampleP50Us <= 0 {
		t.Errorf("latency with --bin: %+v, want a single-item sample p50", l)
	}

	// The shards section also needs nats-server, which bin lacks.
	_, err = run(ctx, options{out: t.TempDir(), quick: true, repo: nowhere, bin: bin, only: []string{"shards"}}, log)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(bin, "nats-server")) {
		t.Errorf("shards with --bin lacking nats-server: %v, want an error naming %s", err, filepath.Join(bin, "nats-server"))
	}
	if err := os.Chmod(filepath.Join(bin, "reprisectl"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = run(ctx, options{out: t.TempDir(), quick: true, repo: nowhere, bin: bin, only: []string{"latency"}}, log)
	if err == nil || !strings.Contains(err.Error(), "not an executable") {
		t.Errorf("latency with a reprisectl that cannot run: %v, want an error saying so", err)
	}
}

// A Reverb driver that hangs, here one that prints a point, starts a child
// that holds its output, and sleeps, is stopped once it has printed nothing
// for the plan's reverbQuiet, child and all; what it printed before stays
// in the results, and the summary says that Reverb stopped early.
func TestReverbHangIsStopped(t *testing.T) {
	venv := t.TempDir()
	if err := os.MkdirAll(filepath.Join(venv, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(venv, "child.pid")
	script := `#!/bin/sh
echo '{"kind":"version","version":"0.14.0"}'
echo '{"kind":"throughput","mode":"sample","payload_bytes":400,"clients":1,"batch":256,"items_per_sec":1000,"bytes_per_sec":400000}'
sleep 600 &
echo $! > ` + pidFile + `
wait
`
	if err := os.WriteFile(filepath.Join(venv, "bin", "python"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	s := &suite{opts: options{venv: venv}, plan: quickPlan(), log: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
		repo: ".", work: t.TempDir(), res: &Results{}}
	s.plan.reverbQuiet = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.runReverb(ctx); err != nil {
		t.Fatal(err)
	}
	if s.res.Reverb.Ran || !strings.Contains(s.res.Reverb.Error, "printed nothing for too long") {
		t.Errorf("Reverb ran %v, error %q; want it stopped as hung", s.res.Reverb.Ran, s.res.Reverb.Error)
	}
	if p := find(s.res.Throughput, sysReverb, "sample", 400, 1); p == nil || p.ItemsPerSec != 1000 {
		t.Errorf("the point printed before the hang: %+v, want it kept", p)
	}
	pid, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(pid)))
	// Killed, it may linger a moment as a zombie until it is reaped.
	for deadline := time.Now().Add(10 * time.Second); running(n); {
		if time.Now().After(deadline) {
			t.Errorf("the driver's child %d still runs", n)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var b strings.Builder
	s.res.summarize()
	s.res.markdown(&b)
	if !strings.Contains(b.String(), "Reverb stopped before the end") {
		t.Errorf("summary does not say Reverb stopped early:\n%s", b.String())
	}
}

// running says whether process pid exists and is no zombie.
func running(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no /proc: the signal's answer is all there is
	}
	// The state follows the command's closing parenthesis.
	rest := stat[bytes.LastIndexByte(stat, ')')+1:]
	return !bytes.HasPrefix(bytes.TrimSpace(rest), []byte("Z"))
}
