package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/internal/testutil"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// fill appends n steps and creates one item per step in each table, then
// waits until the service applied them.
func fill(t testing.TB, p *broker.Producer, from, n int64, tbls ...string) {
	t.Helper()
	ctx := testutil.Context(t)
	for i := from; i < from+n; i++ {
		if err := p.Append(ctx, broker.Step{"id": broker.Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		for _, tb := range tbls {
			if err := p.CreateItem(ctx, tb, float64(i%10), broker.LastStep("id")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
}

type tableState struct {
	priorities map[uint64]float64
	times      map[uint64]int32
	order      []uint64
	limiter    limiter.State
}

func stateOf(t testing.TB, svc *Service, name string) tableState {
	t.Helper()
	tb, ok := svc.Table(name)
	if !ok {
		t.Fatalf("no table %q", name)
	}
	snap := tb.Snapshot()
	st := tableState{priorities: map[uint64]float64{}, times: map[uint64]int32{}, limiter: snap.Limiter}
	for _, it := range snap.Items {
		st.priorities[it.Key] = it.Priority
		st.times[it.Key] = it.TimesSampled
		st.order = append(st.order, it.Key)
	}
	return st
}

func sameState(t testing.TB, what string, got, want tableState) {
	t.Helper()
	if len(got.order) != len(want.order) {
		t.Fatalf("%s: %d items, want %d", what, len(got.order), len(want.order))
	}
	if !slices.Equal(got.order, want.order) {
		t.Fatalf("%s: items not in the same insertion order", what)
	}
	for k, p := range want.priorities {
		if gp := got.priorities[k]; gp != p {
			t.Fatalf("%s: item %d priority %v, want %v", what, k, gp, p)
		}
		if got.times[k] != want.times[k] {
			t.Fatalf("%s: item %d times sampled %d, want %d", what, k, got.times[k], want.times[k])
		}
	}
	if got.limiter != want.limiter {
		t.Fatalf("%s: limiter %+v, want %+v", what, got.limiter, want.limiter)
	}
}

func checkpointTables(n int64) []tables.Config {
	return []tables.Config{
		testutil.TableConfig("uniform", selectors.Options{Kind: selectors.KindUniform}, selectors.Options{Kind: selectors.KindFifo}, 2*n, limiter.MinSize(1)),
		testutil.TableConfig("heap", selectors.Options{Kind: selectors.KindMaxHeap}, selectors.Options{Kind: selectors.KindFifo}, n/2, limiter.MinSize(1)),
	}
}

// TestRecoveryFromCheckpointAndTail: a service that stops without a final
// checkpoint comes back, from its last checkpoint plus a long stream tail,
// with every item, priority, times-sampled count and limiter counter it had.
func TestRecoveryFromCheckpointAndTail(t *testing.T) {
	n := int64(100_000)
	if testing.Short() {
		n = 4_000
	}
	cs, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := checkpointTables(n)
	d := deploy(t, cfgs, deployOptions{service: []Option{WithCheckpoints(cs), WithoutFinalCheckpoint()}})
	ctx := testutil.Context(t)
	p := d.producer(broker.WithBatch(512, 1<<20), broker.WithMaxUnapplied(1<<16))
	c := d.client()

	fill(t, p, 0, n/4, "uniform", "heap")
	if _, err := c.Sample(ctx, "heap", 100); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sample(ctx, "uniform", 1000); err != nil {
		t.Fatal(err)
	}
	first, _ := d.svc.Table("uniform")
	keys, err := first.List(0, 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UpdatePriorities(ctx, "uniform", tables.PriorityUpdate{Key: keys[0].Key, Priority: 42}); err != nil {
		t.Fatal(err)
	}
	fill(t, p, n/4, 1, "uniform")
	cp, err := d.svc.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cp.Items != n/4+1+n/4 {
		t.Fatalf("checkpoint holds %d items, want %d", cp.Items, n/4+1+n/4)
	}
	t.Logf("checkpoint of %d items: %d bytes, pause %v, write %v", cp.Items, cp.Bytes, cp.Pause, cp.Write)

	// The tail: more inserts (evicting from heap), mutations, a delete.
	fill(t, p, n/4+1, 3*n/4, "uniform", "heap")
	if err := c.Mutate(ctx, "uniform", tables.Mutation{Key: keys[1].Key, Delete: true}, tables.Mutation{Key: keys[2].Key, Priority: 7}); err != nil {
		t.Fatal(err)
	}
	fill(t, p, n+1, 10, "uniform")
	want := map[string]tableState{"uniform": stateOf(t, d.svc, "uniform"), "heap": stateOf(t, d.svc, "heap")}
	if _, ok := want["uniform"].priorities[keys[1].Key]; ok {
		t.Fatal("deleted item still present before the restart")
	}
	d.stop()

	var rep RecoveryResult
	start := time.Now()
	svc, _ := d.startService(cfgs, WithCheckpoints(cs), WithRecoveryReport(func(r RecoveryResult) { rep = r }))
	testutil.WaitUntil(t, "the tail is replayed", func() bool { return svc.Applied() >= d.svc.Applied() })
	t.Logf("recovered %d items from %s in %v, replayed the tail in %v", rep.Items, rep.Checkpoint, rep.Duration, time.Since(start))
	if rep.Checkpoint != cp.Name || rep.Applied != cp.Applied || len(rep.Skipped) != 0 {
		t.Fatalf("recovery %+v, want checkpoint %s at %d", rep, cp.Name, cp.Applied)
	}
	for name, w := range want {
		sameState(t, name, stateOf(t, svc, name), w)
	}
	// Sampling resumes.
	if _, err := d.client().Sample(ctx, "heap", 10); err != nil {
		t.Fatal(err)
	}
}

// TestCorruptCheckpointFallsBack: a damaged newest checkpoint is skipped,
// with a reason, for the previous one, and the stream still holds what that
// one needs.
func TestCorruptCheckpointFallsBack(t *testing.T) {
	dir := t.TempDir()
	cs, err := NewFileCheckpoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfgs := checkpointTables(1000)
	d := deploy(t, cfgs, deployOptions{service: []Option{WithCheckpoints(cs), WithoutFinalCheckpoint()}})
	ctx := testutil.Context(t)
	p := d.producer()
	fill(t, p, 0, 100, "uniform", "heap")
	older, err := d.svc.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, p, 100, 100, "uniform", "heap")
	newer, err := d.svc.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, p, 200, 50, "uniform", "heap")
	want := stateOf(t, d.svc, "uniform")
	d.stop()

	path := filepath.Join(dir, newer.Name)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var rep RecoveryResult
	svc, _ := d.startService(cfgs, WithCheckpoints(cs), WithRecoveryReport(func(r RecoveryResult) { rep = r }))
	if rep.Checkpoint != older.Name || len(rep.Skipped) != 1 {
		t.Fatalf("recovery %+v, want %s after skipping %s", rep, older.Name, newer.Name)
	}
	testutil.WaitUntil(t, "the tail is replayed", func() bool { return svc.Applied() >= d.svc.Applied() })
	sameState(t, "uniform", stateOf(t, svc, "uniform"), want)

	// The damaged checkpoint is gone, and the next ones are kept.
	next, err := svc.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names, err := cs.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{older.Name, next.Name}) {
		t.Fatalf("checkpoints %v, want [%s %s]", names, older.Name, next.Name)
	}
}

// failingLoads is a checkpoint store whose next loads fail with err.
type failingLoads struct {
	*FileCheckpoints
	fails atomic.Int32
	err   error
}

func (f *failingLoads) Load(ctx context.Context, name string) (io.ReadCloser, error) {
	if f.fails.Add(-1) >= 0 {
		return nil, fmt.Errorf("loading checkpoint %s: %w", name, f.err)
	}
	return f.FileCheckpoints.Load(ctx, name)
}

// trimmedDeployment has 100 items in a checkpoint, which trimmed the stream
// below it, and 10 after it, in table "uniform"; its service is stopped.
func trimmedDeployment(t *testing.T) (*deployment, *FileCheckpoints, []tables.Config) {
	fc, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := checkpointTables(1000)
	d := deploy(t, cfgs, deployOptions{service: []Option{WithCheckpoints(fc), WithoutFinalCheckpoint()}})
	p := d.producer()
	fill(t, p, 0, 100, "uniform")
	if _, err := d.svc.Checkpoint(testutil.Context(t)); err != nil {
		t.Fatal(err)
	}
	fill(t, p, 100, 10, "uniform")
	d.stop()
	return d, fc, cfgs
}

// TestRecoveryWaitsForCheckpointStore: a checkpoint store that does not
// answer in time at start (a bucket electing its leader) is waited for. The
// service used to skip the checkpoint for it and start empty, over a stream
// trimmed below that checkpoint: 10 of 110 items.
func TestRecoveryWaitsForCheckpointStore(t *testing.T) {
	d, fc, cfgs := trimmedDeployment(t)
	slow := &failingLoads{FileCheckpoints: fc, err: nats.ErrTimeout}
	slow.fails.Store(2)
	var rep RecoveryResult
	svc, _ := d.startService(cfgs, WithCheckpoints(slow), WithRecoveryReport(func(r RecoveryResult) { rep = r }))
	if rep.Checkpoint == "" || len(rep.Skipped) > 0 {
		t.Fatalf("recovery %+v, want the checkpoint loaded once the store answers", rep)
	}
	tb, _ := svc.Table("uniform")
	testutil.WaitUntil(t, "the tail is replayed", func() bool { return tb.Size() == 110 })
}

// TestStopWhileRecoveryWaits: a service stopped while it waits for its
// checkpoint store at start returns nil, as after any shutdown through its
// context. It returned "recovery: context canceled".
func TestStopWhileRecoveryWaits(t *testing.T) {
	d, fc, cfgs := trimmedDeployment(t)
	slow := &failingLoads{FileCheckpoints: fc, err: nats.ErrTimeout}
	slow.fails.Store(math.MaxInt32)
	svc, err := New(d.connect(), cfgs, WithPrefix(d.prefix), WithLogger(testutil.QuietLogger()), WithCheckpoints(slow))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testutil.Context(t))
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	testutil.WaitUntil(t, "recovery tries the checkpoint again", func() bool { return slow.fails.Load() < math.MaxInt32-1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after a shutdown during recovery: %v, want nil", err)
	}
}

// TestRecoveryRefusesToLoseTrimmedMessages: a checkpoint that cannot be
// loaded for a cause outside it stops the start where the stream no longer
// holds what it covers, and is kept; once the cause is gone, the next start
// recovers everything. Starting without it lost the trimmed items, and the
// next checkpoints deleted it.
func TestRecoveryRefusesToLoseTrimmedMessages(t *testing.T) {
	d, fc, cfgs := trimmedDeployment(t)
	ctx := testutil.Context(t)
	names, err := fc.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	denied := &failingLoads{FileCheckpoints: fc, err: os.ErrPermission}
	denied.fails.Store(1)
	svc, err := New(d.connect(), cfgs, WithPrefix(d.prefix), WithLogger(testutil.QuietLogger()), WithCheckpoints(denied))
	if err != nil {
		t.Fatal(err)
	}
	err = svc.Run(ctx)
	if !errors.Is(err, broker.ErrStreamLost) || !strings.Contains(err.Error(), names[0]) || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("Run: %v, want ErrStreamLost naming the checkpoint %s and why it failed", err, names[0])
	}
	if after, err := fc.List(ctx); err != nil || !slices.Equal(after, names) {
		t.Fatalf("checkpoints %v (%v), want %v kept", after, err, names)
	}
	// A run that ended at start ends waits on its tables too: this one
	// waits for an item.
	failed, _ := svc.Table("uniform")
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := failed.Sample(sctx, 1); !errors.Is(err, tables.ErrClosed) {
		t.Fatalf("Sample on a table of a run that failed at start: %v, want ErrClosed", err)
	}
	svc2, _ := d.startService(cfgs, WithCheckpoints(fc))
	tb, _ := svc2.Table("uniform")
	testutil.WaitUntil(t, "the tail is replayed", func() bool { return tb.Size() == 110 })
}

// oneFails is a checkpoint store whose loads of one checkpoint fail.
type oneFails struct {
	*FileCheckpoints
	name string
	err  error
}

func (f *oneFails) Load(ctx context.Context, name string) (io.ReadCloser, error) {
	if name == f.name {
		return nil, fmt.Errorf("loading checkpoint %s: %w", name, f.err)
	}
	return f.FileCheckpoints.Load(ctx, name)
}

// TestRecoveryStartsPastKeptCheckpointsBelowTheGap: a checkpoint that
// fails to load, and holds nothing the stream lacks, does not stop the
// start. Here it sorts first (a newer epoch) but applied less than the one
// recovery falls back to, and the stream lost messages after both.
func TestRecoveryStartsPastKeptCheckpointsBelowTheGap(t *testing.T) {
	d, fc, cfgs := trimmedDeployment(t)
	ctx := testutil.Context(t)
	names, err := fc.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	good := names[len(names)-1]
	_, applied, _ := parseCheckpointName(good)
	r, err := fc.Load(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	low := checkpointName(1, applied-1)
	if err := fc.Save(ctx, low, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(d.connect())
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, d.svc.subj.Stream())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSequence(applied+2)); err != nil {
		t.Fatal(err)
	}
	var rep RecoveryResult
	svc, _ := d.startService(cfgs, WithCheckpoints(&oneFails{FileCheckpoints: fc, name: low, err: os.ErrPermission}),
		WithRecoveryReport(func(r RecoveryResult) { rep = r }))
	if rep.Checkpoint != good || len(rep.Skipped) != 1 {
		t.Fatalf("recovery %+v, want %s after skipping %s", rep, good, low)
	}
	if tb, _ := svc.Table("uniform"); tb.Size() < 100 {
		t.Fatalf("%d items, want the checkpoint's 100 at least", tb.Size())
	}
}

// TestRecoveryGivesUpOnCheckpointThatNeverLoads: a checkpoint whose load
// times out every time (an object whose parts are gone) is skipped once
// checkpointLoadPatience has passed, for the previous one, which the stream
// still covers: every item comes back. Recovery used to wait on it forever.
func TestRecoveryGivesUpOnCheckpointThatNeverLoads(t *testing.T) {
	patience := checkpointLoadPatience
	checkpointLoadPatience = 300 * time.Millisecond
	t.Cleanup(func() { checkpointLoadPatience = patience })
	d, fc, cfgs := trimmedDeployment(t)
	ctx := testutil.Context(t)
	svc, stop := d.startService(cfgs, WithCheckpoints(fc), WithoutFinalCheckpoint())
	fill(t, d.producer(), 200, 5, "uniform")
	newest, err := svc.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	var rep RecoveryResult
	svc2, _ := d.startService(cfgs, WithCheckpoints(&oneFails{FileCheckpoints: fc, name: newest.Name, err: nats.ErrTimeout}),
		WithRecoveryReport(func(r RecoveryResult) { rep = r }))
	if rep.Checkpoint == "" || rep.Checkpoint == newest.Name || len(rep.Skipped) != 1 {
		t.Fatalf("recovery %+v, want the checkpoint before %s", rep, newest.Name)
	}
	tb, _ := svc2.Table("uniform")
	testutil.WaitUntil(t, "the tail is replayed", func() bool { return tb.Size() == 115 })
}

// TestTrimmingBoundsStream: with a checkpoint after every batch of inserts,
// the stream keeps only what the kept checkpoints need.
func TestTrimmingBoundsStream(t *testing.T) {
	dir := t.TempDir()
	cs, err := NewFileCheckpoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := deploy(t, checkpointTables(100), deployOptions{service: []Option{WithCheckpoints(cs)}})
	ctx := testutil.Context(t)
	p := d.producer(broker.WithLinger(0))
	const rounds, perRound = 12, 50
	var maxMsgs uint64
	for r := range int64(rounds) {
		fill(t, p, r*perRound, perRound, "uniform")
		if _, err := d.svc.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
		info, err := d.svc.stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		maxMsgs = max(maxMsgs, info.State.Msgs)
	}
	// Each round publishes about perRound messages; two kept checkpoints
	// need at most the last two rounds.
	if maxMsgs > 3*perRound {
		t.Fatalf("stream held up to %d messages, want at most %d", maxMsgs, 3*perRound)
	}
	names, err := cs.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 2 {
		t.Fatalf("%d checkpoints kept, want 2: %v", len(names), names)
	}
}

// TestConfigOverridesCheckpoint: on restore the config file's rate limiter
// and max times sampled win; a table dropped from the config stays dropped.
func TestConfigOverridesCheckpoint(t *testing.T) {
	cs, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := checkpointTables(1000)
	d := deploy(t, cfgs, deployOptions{service: []Option{WithCheckpoints(cs)}})
	p := d.producer()
	fill(t, p, 0, 30, "uniform", "heap")
	d.stop() // graceful: writes a final checkpoint

	changed := []tables.Config{cfgs[0]}
	changed[0].Limiter = limiter.MinSize(7)
	changed[0].MaxTimesSampled = 3
	svc, _ := d.startService(changed, WithCheckpoints(cs))
	info, err := d.client().Info(testutil.Context(t), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Tables) != 1 || info.Tables[0].Name != "uniform" {
		t.Fatalf("tables after restore: %v, want only uniform", info.Tables)
	}
	ti := info.Tables[0]
	if ti.Size != 30 || ti.Limiter.MinSize != 7 || ti.MaxTimesSampled != 3 || ti.Limiter.Inserts != 30 {
		t.Fatalf("restored table: size %d, min size %d, max times sampled %d, limiter inserts %d; want 30, 7, 3, 30",
			ti.Size, ti.Limiter.MinSize, ti.MaxTimesSampled, ti.Limiter.Inserts)
	}
	if _, ok := svc.Table("heap"); ok {
		t.Fatal("table dropped from the config was restored")
	}
}

// refusedLimiter is a rate limiter earlier releases accepted and this one
// refuses (it can stall its table).
var refusedLimiter = limiter.Config{SamplesPerInsert: 1, MinSize: 1, MinDiff: 0, MaxDiff: 0}

// restoreRefusedLimiter restores a checkpoint of table t, whose config is
// cfg but for refusedLimiter, with the limiter state saved (counted under
// refusedLimiter), into a service configured with cfg; it returns the
// restored table's limiter state.
func restoreRefusedLimiter(t *testing.T, cfg tables.Config, saved limiter.State) limiter.State {
	t.Helper()
	if refusedLimiter.Validate() == nil {
		t.Fatal("the old limiter is accepted: the test shows nothing")
	}
	nc, err := nats.Connect(testutil.StartEmbedded(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	svc, err := New(nc, []tables.Config{cfg}, WithLogger(testutil.QuietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	old := cfg
	old.Limiter = refusedLimiter
	cfgJSON, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	saved.Config = refusedLimiter
	limJSON, err := json.Marshal(saved)
	if err != nil {
		t.Fatal(err)
	}
	cp := &wire.Checkpoint{Version: checkpointVersion, Tables: []*wire.TableCheckpoint{{
		ConfigJson: cfgJSON, LimiterJson: limJSON, CountersJson: []byte(`{}`),
	}}}
	if err := svc.restore(cp); err != nil {
		t.Fatalf("restore: %v", err)
	}
	tb, ok := svc.Table(cfg.Name)
	if !ok {
		t.Fatalf("table %s not restored", cfg.Name)
	}
	return tb.Info().Limiter
}

// TestRestoreReplacesARefusedLimiter: a checkpoint whose table has a rate
// limiter this release refuses (one that can stall the table, accepted by
// earlier ones) restores the table and its counters, with the config
// file's limiter in its place.
func TestRestoreReplacesARefusedLimiter(t *testing.T) {
	cfg := testutil.UniformTable("t", 10)
	st := restoreRefusedLimiter(t, cfg, limiter.State{Inserts: 2, Samples: 1, Deletes: 2})
	if st.Config != cfg.Limiter || st.Inserts != 2 || st.Samples != 1 || st.Deletes != 2 {
		t.Fatalf("restored limiter %+v; want the config's, with the checkpoint's 2 inserts, 1 sample and 2 deletes", st)
	}
}

// TestRestoreReplacingARefusedLimiterKeepsTheDifference: a checkpoint's
// rate limiter this release refuses is replaced by the config file's, which
// is a change of samples_per_insert like any other: the new ratio must
// weigh the inserts to come, as Reconfigure makes it, not the checkpoint's
// whole history. The counters were read with the new ratio: after 1e6
// inserts at 1 sample each, a config of 2 held inserts off for ~1e6 samples.
func TestRestoreReplacingARefusedLimiterKeepsTheDifference(t *testing.T) {
	cfg := testutil.UniformTable("t", 10)
	var err error
	if cfg.Limiter, err = limiter.SampleToInsertRatio(2, 1, 20); err != nil {
		t.Fatal(err)
	}
	const history = 1_000_000
	saved := limiter.State{Config: refusedLimiter, Inserts: history, Samples: history, Deletes: history}
	st := restoreRefusedLimiter(t, cfg, saved)
	diff := func(s limiter.State) float64 {
		return float64(s.Inserts)*s.Config.SamplesPerInsert - float64(s.Samples) + s.Offset
	}
	if st.Config != cfg.Limiter || st.Inserts != history || math.Abs(diff(st)-diff(saved)) > 0.5 {
		t.Fatalf("restored limiter %+v: inserts*samples_per_insert - samples + offset = %v, want the config's limiter going on from the checkpoint's %v",
			st, diff(st), diff(saved))
	}
}

// TestCheckpointWhileInsertHeld: a checkpoint taken while a rate limiter
// holds an insert does not wait for the limiter, and after a crash the held
// items come back: the queue still delivers every item once, in order.
func TestCheckpointWhileInsertHeld(t *testing.T) {
	cs, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := []tables.Config{tables.QueueConfig("queue", 5)}
	d := deploy(t, cfgs, deployOptions{service: []Option{WithCheckpoints(cs), WithoutFinalCheckpoint()}})
	ctx := testutil.Context(t)
	// Flush returns once the items are stored: the queue holds most of them.
	p := d.producer(broker.WithLinger(0), broker.WithReturnOnStore())
	for i := range int64(12) {
		if err := p.Append(ctx, broker.Step{"id": broker.Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "queue", 1, broker.LastStep("id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	q, _ := d.svc.Table("queue")
	testutil.WaitUntil(t, "the queue is full and an insert held", func() bool { return q.Size() == 5 && q.Info().Counters.InsertWaits > 0 })
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := d.client().Checkpoint(cctx)
	if err != nil {
		t.Fatalf("checkpoint while an insert is held: %v", err)
	}
	if resp.Items != 5 {
		t.Fatalf("checkpoint holds %d items, want 5", resp.Items)
	}
	d.stop()

	d.startService(cfgs, WithCheckpoints(cs))
	c := d.client()
	for want := range int64(12) {
		s, err := c.Sample(ctx, "queue", 1)
		if err != nil {
			t.Fatalf("item %d: %v", want, err)
		}
		if got := ids(t, s[0])[0]; got != want {
			t.Fatalf("queue delivered %d, want %d", got, want)
		}
	}
}

// TestObjectStoreCheckpointsSetTheirOwnDeadlines: a checkpoint moves under
// a deadline of its own, not nats.go's default timeout, which bounded the
// read of a whole checkpoint by 5 s (the default here is 1 ns: any call
// that falls back on it fails). And its messages are small enough that
// nats.go's 4000 in flight stay within the server's ingest queue.
func TestObjectStoreCheckpointsSetTheirOwnDeadlines(t *testing.T) {
	url := testutil.StartEmbedded(t, 0)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(time.Nanosecond))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := NewObjectStoreCheckpoints(testutil.Context(t), js, "DEADLINES", 1)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 8<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	// The service's own calls carry no deadline.
	ctx := context.Background()
	name := checkpointName(0, 1)
	if err := cs.Save(ctx, name, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	r, err := cs.Load(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("loaded %d bytes that differ from the %d saved", len(got), len(data))
	}
	info, err := cs.store().GetInfo(testutil.Context(t), name)
	if err != nil {
		t.Fatal(err)
	}
	if in := 4000 * int64(info.Opts.ChunkSize); in > 64<<20 {
		t.Errorf("checkpoint stored in messages of %d bytes: 4000 in flight make %d bytes, over half the server's 128 MiB ingest queue", info.Opts.ChunkSize, in)
	}
	if _, err := cs.Load(ctx, checkpointName(0, 2)); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("loading a checkpoint never saved: %v, want ErrNoCheckpoint", err)
	}
}

// TestObjectStoreCheckpoints: the default store, a JetStream object store
// bucket on the same server, round-trips a checkpoint.
func TestObjectStoreCheckpoints(t *testing.T) {
	cfgs := checkpointTables(1000)
	d := deploy(t, cfgs, deployOptions{service: []Option{WithObjectStoreCheckpoints(), WithoutFinalCheckpoint()}})
	ctx := testutil.Context(t)
	p := d.producer()
	fill(t, p, 0, 200, "uniform", "heap")
	res, err := d.svc.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Stored in messages of the chunk size asked, not one a piece of the
	// file (a chunk's header, its data): 400 pieces here.
	cs := d.svc.o.checkpoints.(*ObjectStoreCheckpoints)
	info, err := cs.store().GetInfo(ctx, res.Name)
	if err != nil {
		t.Fatal(err)
	}
	if want := info.Size/objectChunkSize + 1; uint64(info.Chunks) > want {
		t.Errorf("a checkpoint of %d bytes stored in %d messages, want at most %d of %d bytes", info.Size, info.Chunks, want, objectChunkSize)
	}
	want := stateOf(t, d.svc, "heap")
	d.stop()
	var rep RecoveryResult
	svc, _ := d.startService(cfgs, WithObjectStoreCheckpoints(), WithRecoveryReport(func(r RecoveryResult) { rep = r }))
	if rep.Checkpoint == "" || rep.Items != 2*200 {
		t.Fatalf("recovery %+v, want a checkpoint with 400 items", rep)
	}
	sameState(t, "heap", stateOf(t, svc, "heap"), want)
}

// TestCheckpointsLeaveNoDeleteMarkers: the object store keeps a marker
// under the name of each object deleted, and each checkpoint has a name of
// its own; the service purges them, so that what the bucket holds, and
// what every listing reads, stays as many objects as are kept, however
// long it runs. Markers it did not purge (an older version's) go a few at
// a listing.
func TestCheckpointsLeaveNoDeleteMarkers(t *testing.T) {
	d := deploy(t, checkpointTables(1000), deployOptions{service: []Option{WithObjectStoreCheckpoints(), WithoutFinalCheckpoint()}})
	ctx := testutil.Context(t)
	p := d.producer()
	for i := range int64(6) {
		fill(t, p, 10*i, 10, "uniform")
		if _, err := d.svc.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cs := d.svc.o.checkpoints.(*ObjectStoreCheckpoints)
	bucket := cs.config.Bucket
	metaSubjects := func() int {
		st, err := d.svc.js.Stream(ctx, "OBJ_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter("$O."+bucket+".M.>"))
		if err != nil {
			t.Fatal(err)
		}
		return len(info.State.Subjects)
	}
	names, err := cs.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := metaSubjects(); len(names) != d.svc.o.checkpointKeep || n != len(names) {
		t.Fatalf("after 6 checkpoints: %d listed, %d names in the bucket; want %d of each", len(names), n, d.svc.o.checkpointKeep)
	}
	for i := range 20 { // as an older version deleted them
		name := checkpointName(0, uint64(1000+i)) // none of the service's
		if _, err := cs.store().PutBytes(ctx, name, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := cs.store().Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := cs.List(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := metaSubjects(); n != len(names) {
		t.Fatalf("20 markers and two listings later the bucket holds %d names, want %d", n, len(names))
	}
	// A name written again after its delete, before the marker was
	// purged, is a checkpoint: it stays.
	again := checkpointName(0, 2000)
	for _, step := range []func() error{
		func() error { _, err := cs.store().PutBytes(ctx, again, []byte("x")); return err },
		func() error { return cs.store().Delete(ctx, again) },
		func() error { _, err := cs.store().PutBytes(ctx, again, []byte("y")); return err },
		func() error { return cs.forget(ctx, again) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := cs.store().GetBytes(ctx, again); err != nil || string(b) != "y" {
		t.Fatalf("a checkpoint written again after its delete, once its marker was purged: %q, %v", b, err)
	}
}

// TestIdleServiceWritesNoPeriodicCheckpoints: a period in which nothing
// was applied or sampled writes no checkpoint; one after an insert or a
// sample does.
func TestIdleServiceWritesNoPeriodicCheckpoints(t *testing.T) {
	fc, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := deploy(t, checkpointTables(100), deployOptions{service: []Option{WithCheckpoints(fc), WithoutFinalCheckpoint()}})
	ctx := testutil.Context(t)
	p := d.producer()
	c := d.client()
	fill(t, p, 0, 10, "uniform")
	var mark stateMark
	var wrote []bool
	tick := func() {
		var w bool
		mark, w = d.svc.periodicCheckpoint(ctx, mark)
		wrote = append(wrote, w)
	}
	tick()
	tick() // idle
	if _, err := c.Sample(ctx, "uniform", 2); err != nil {
		t.Fatal(err)
	}
	tick()
	tick() // idle
	fill(t, p, 10, 1, "uniform")
	tick()
	if want := []bool{true, false, true, false, true}; !slices.Equal(wrote, want) {
		t.Fatalf("periods wrote checkpoints %v, want %v (after: inserts, nothing, a sample, nothing, an insert)", wrote, want)
	}
}

// TestCheckpointFileStreams: the checkpoint file is read out piece by
// piece, the tables' chunks as they are held: the same bytes whatever the
// reads' sizes, as long as Size says, decoding to every chunk and item,
// and without copying the chunks (encoding them into one message, then
// into the file's, made two copies of every table).
func TestCheckpointFileStreams(t *testing.T) {
	const items, payload = 64, 256 << 10
	cfgs := []tables.Config{testutil.UniformTable("big", items)}
	d := deploy(t, cfgs, deployOptions{service: []Option{WithoutFinalCheckpoint()}})
	ctx := testutil.Context(t)
	p := d.producer(broker.WithCompression(wire.Uncompressed))
	rng := rand.New(rand.NewPCG(3, 4))
	for range items {
		frame := make([]uint8, payload)
		for i := range frame {
			frame[i] = uint8(rng.Uint32())
		}
		if err := p.Append(ctx, broker.Step{"frame": broker.Uint8s([]int64{payload}, frame)}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "big", 1, broker.LastStep("frame")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	var c *captured
	select {
	case c = <-d.svc.intr.request():
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if len(c.chunks) != items {
		t.Fatalf("captured %d chunks, want %d", len(c.chunks), items)
	}

	r, err := c.encode()
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n, err := io.Copy(io.Discard, r)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if n != r.Size() {
		t.Errorf("read %d bytes, Size says %d", n, r.Size())
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > items*payload/8 {
		t.Errorf("reading out %d MiB of chunks allocated %d bytes: a copy of them", items*payload>>20, alloc)
	}

	whole, err := c.encode()
	if err != nil {
		t.Fatal(err)
	}
	want, err := io.ReadAll(whole)
	if err != nil {
		t.Fatal(err)
	}
	bits, err := c.encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(iotest.OneByteReader(bits))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("reading one byte at a time gives other bytes than reading all at once")
	}
	checkReadCheckpoint(t, want, c)
}

// checkReadCheckpoint: readCheckpoint decodes file, a checkpoint of c, as
// the generated code does, holding it once (one copy of the chunks, not
// the file whole and then the chunks), whatever the reads' sizes; it finds
// the damage in a file cut short, or with a bit flipped, and passes the
// store's errors on as they are.
func checkReadCheckpoint(t *testing.T, file []byte, c *captured) {
	t.Helper()
	var ref wire.CheckpointFile
	if err := proto.Unmarshal(file, &ref); err != nil {
		t.Fatal(err)
	}
	var want wire.Checkpoint
	if err := proto.Unmarshal(ref.Checkpoint, &want); err != nil {
		t.Fatal(err)
	}
	if len(want.Chunks) != len(c.chunks) {
		t.Fatalf("the file holds %d chunks, want %d", len(want.Chunks), len(c.chunks))
	}
	for i, ch := range c.chunks {
		if !bytes.Equal(want.Chunks[i], ch.Data) {
			t.Fatalf("chunk %d decodes to other bytes than it holds", i)
		}
	}
	var chunkBytes uint64
	for _, ch := range want.Chunks {
		chunkBytes += uint64(len(ch))
	}

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got, err := readCheckpoint(bytes.NewReader(file))
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, &want) {
		t.Fatal("readCheckpoint decodes another checkpoint than the generated code")
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > chunkBytes+chunkBytes/4+checkpointReadBuffer {
		t.Errorf("decoding %d bytes of chunks allocated %d bytes: more than one copy of them", chunkBytes, alloc)
	}
	for name, r := range map[string]io.Reader{
		"one byte at a time": iotest.OneByteReader(bytes.NewReader(file)),
		"half reads":         iotest.HalfReader(bytes.NewReader(file)),
		"EOF with the data":  iotest.DataErrReader(bytes.NewReader(file)),
	} {
		if got, err := readCheckpoint(r); err != nil || !proto.Equal(got, &want) {
			t.Errorf("%s: %v, or another checkpoint", name, err)
		}
	}

	rng := rand.New(rand.NewPCG(5, 6))
	for range 64 {
		cut := rng.IntN(len(file))
		if _, err := readCheckpoint(bytes.NewReader(file[:cut])); !errors.Is(err, ErrCorruptCheckpoint) {
			t.Fatalf("the first %d bytes of %d: %v, want ErrCorruptCheckpoint", cut, len(file), err)
		}
	}
	for range 64 {
		damaged := bytes.Clone(file)
		damaged[rng.IntN(len(file))] ^= 1 << rng.IntN(8)
		if _, err := readCheckpoint(bytes.NewReader(damaged)); !errors.Is(err, ErrCorruptCheckpoint) {
			t.Fatalf("a flipped bit: %v, want ErrCorruptCheckpoint", err)
		}
	}
	broken := io.MultiReader(bytes.NewReader(file[:len(file)/2]), iotest.ErrReader(errStoreBroke))
	if _, err := readCheckpoint(broken); !errors.Is(err, errStoreBroke) || errors.Is(err, ErrCorruptCheckpoint) {
		t.Errorf("the store failing half way: %v, want its error and not ErrCorruptCheckpoint", err)
	}
}

var errStoreBroke = errors.New("the store broke")

// stallingStore fails its first stalls writes halfway through, the way
// nats.go's object store gives up on a server that acknowledges too slowly.
type stallingStore struct {
	*FileCheckpoints
	stalls int
	saves  int
}

func (s *stallingStore) Save(ctx context.Context, name string, r io.Reader) error {
	s.saves++
	if s.saves > s.stalls {
		return s.FileCheckpoints.Save(ctx, name, r)
	}
	if _, err := io.CopyN(io.Discard, r, r.(interface{ Size() int64 }).Size()/2); err != nil {
		return err
	}
	return fmt.Errorf("broker: saving checkpoint %s: %w", name, jetstream.ErrTooManyStalledMsgs)
}

// TestCheckpointWriteStalls: a checkpoint whose write stalls is written
// again, whole, and recovery loads it; one that stalls past the bound
// fails with the store's error.
func TestCheckpointWriteStalls(t *testing.T) {
	fc, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cs := &stallingStore{FileCheckpoints: fc, stalls: 3}
	cfgs := checkpointTables(200)
	d := deploy(t, cfgs, deployOptions{service: []Option{WithCheckpoints(cs), WithoutFinalCheckpoint()}})
	ctx := testutil.Context(t)
	fill(t, d.producer(), 0, 200, "uniform", "heap")
	cp, err := d.svc.Checkpoint(ctx)
	if err != nil {
		t.Fatalf("checkpoint after %d stalled writes: %v", cs.stalls, err)
	}
	if cs.saves != cs.stalls+1 {
		t.Fatalf("%d writes, want %d", cs.saves, cs.stalls+1)
	}
	want := map[string]tableState{"uniform": stateOf(t, d.svc, "uniform"), "heap": stateOf(t, d.svc, "heap")}

	cs.saves, cs.stalls = 0, checkpointStalls+1
	if _, err := d.svc.Checkpoint(ctx); !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
		t.Fatalf("checkpoint stalled %d times: %v, want the stall", cs.stalls, err)
	}
	if cs.saves != checkpointStalls+1 {
		t.Fatalf("%d writes of a checkpoint that kept stalling, want %d", cs.saves, checkpointStalls+1)
	}
	d.stop()

	var rep RecoveryResult
	svc, _ := d.startService(cfgs, WithCheckpoints(fc), WithRecoveryReport(func(r RecoveryResult) { rep = r }))
	testutil.WaitUntil(t, "the stream is replayed", func() bool { return svc.Applied() >= d.svc.Applied() })
	if rep.Checkpoint != cp.Name || len(rep.Skipped) != 0 {
		t.Fatalf("recovery %+v, want checkpoint %s", rep, cp.Name)
	}
	for name, w := range want {
		sameState(t, name, stateOf(t, svc, name), w)
	}
}

// TestRecreatedStreamIsNotReadFromTheCheckpoint: a stream deleted and
// created again numbers its messages from 1, and the service, restarted,
// refuses to read it from the checkpoint's sequence on while it holds
// messages below that sequence, however far it has grown: it told the
// streams apart only while the new one ended before the checkpoint, and
// once producers had stored past it, started there and skipped every
// acknowledged insert below. Purged below the sequence after the
// checkpoint's, as the error says, it is read from there.
func TestRecreatedStreamIsNotReadFromTheCheckpoint(t *testing.T) {
	fc, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := []tables.Config{testutil.UniformTable("t", 10_000)}
	d := deploy(t, cfgs, deployOptions{service: []Option{WithCheckpoints(fc)}})
	ctx := testutil.Context(t)
	p := d.producer(broker.WithLinger(0))
	for i := range int64(20) {
		insertSteps(t, p, i, i+1, 2) // a message each
	}
	d.stop() // the final checkpoint
	names, err := fc.List(ctx)
	if err != nil || len(names) == 0 {
		t.Fatalf("checkpoints %v, %v", names, err)
	}
	_, applied, _ := parseCheckpointName(names[len(names)-1])
	if err := d.svc.js.DeleteStream(ctx, d.svc.subj.Stream()); err != nil {
		t.Fatal(err)
	}
	run := func() error {
		svc, err := New(d.connect(), cfgs, WithPrefix(d.prefix), WithLogger(testutil.QuietLogger()), WithCheckpoints(fc))
		if err != nil {
			t.Fatal(err)
		}
		return svc.Run(ctx)
	}
	// It creates the stream again, and stops.
	if err := run(); !errors.Is(err, broker.ErrStreamLost) {
		t.Fatalf("a restart after the stream was deleted: %v, want ErrStreamLost", err)
	}
	// Producers store in the new stream meanwhile, past the checkpoint's
	// sequence.
	p2 := d.producer(broker.WithLinger(0), broker.WithReturnOnStore())
	stream, err := d.svc.js.Stream(ctx, d.svc.subj.Stream())
	if err != nil {
		t.Fatal(err)
	}
	for i := int64(1000); stream.CachedInfo().State.LastSeq < applied+5; i++ {
		if err := p2.Append(ctx, step(i, 2)); err != nil {
			t.Fatal(err)
		}
		if err := p2.CreateItem(ctx, "t", 1, broker.LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
		if err := p2.Flush(ctx); err != nil { // stored: no service applies it
			t.Fatal(err)
		}
		if _, err := stream.Info(ctx); err != nil {
			t.Fatal(err)
		}
	}
	last := stream.CachedInfo().State.LastSeq
	if err := run(); !errors.Is(err, broker.ErrStreamLost) || !strings.Contains(err.Error(), "created again") {
		t.Fatalf("a restart once the new stream passed the checkpoint's sequence %d: %v, want ErrStreamLost", applied, err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(applied+1)); err != nil {
		t.Fatal(err)
	}
	svc, _ := d.startService(cfgs, WithCheckpoints(fc))
	testutil.WaitUntil(t, "the new stream read", func() bool { return svc.Applied() >= last })
	tb, _ := svc.Table("t")
	if got, want := tb.Size(), int64(20)+int64(last-applied); got != want {
		t.Fatalf("after the purge the table holds %d items, want the checkpoint's 20 and the %d stored after its sequence", got, last-applied)
	}
}

// TestFileCheckpointsListHonoursItsContext: listing a checkpoint directory
// ignored its context, so a recovery or a trim that was given up on still
// waited for the whole directory to be read.
func TestFileCheckpointsListHonoursItsContext(t *testing.T) {
	dir := t.TempDir()
	fc, err := NewFileCheckpoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	// More than one batch of entries, among files that are no checkpoints.
	var want []string
	for i := range 2*listBatch + 1 {
		name := checkpointName(1, uint64(i))
		want = append(want, name)
		for _, n := range []string{name, fmt.Sprintf(".tmp-%s-%d", name, i)} {
			if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := fc.List(testutil.Context(t))
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("List = %d names, %v; want the %d checkpoints in order", len(got), err, len(want))
	}
	ctx, cancel := context.WithCancel(testutil.Context(t))
	cancel()
	if got, err := fc.List(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("List with an ended context = %d names, %v; want context.Canceled", len(got), err)
	}
}

// TestFileCheckpointsSaveLoadAndDeleteHonourTheirContext: a checkpoint
// file's save, load and delete ignored their context, so a shutdown whose
// deadline passed still waited for many GiB to reach a slow disk, and a
// recovery given up on read a whole checkpoint.
func TestFileCheckpointsSaveLoadAndDeleteHonourTheirContext(t *testing.T) {
	dir := t.TempDir()
	fc, err := NewFileCheckpoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	name := checkpointName(1, 7)

	// A save whose context ends while it writes leaves neither the
	// checkpoint nor its temporary file.
	ctx, cancel := context.WithCancel(testutil.Context(t))
	body := io.MultiReader(bytes.NewReader(make([]byte, 1<<20)), cancelingReader(cancel), bytes.NewReader(make([]byte, 1<<20)))
	if err := fc.Save(ctx, name, body); !errors.Is(err, context.Canceled) {
		t.Fatalf("Save whose context ended while writing = %v, want context.Canceled", err)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("after a cancelled save the directory holds %v (%v), want nothing", entries, err)
	}

	want := bytes.Repeat([]byte("checkpoint"), 100_000)
	if err := fc.Save(testutil.Context(t), name, bytes.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(testutil.Context(t))
	r, err := fc.Load(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 10)
	if _, err := io.ReadFull(r, head); err != nil || !bytes.Equal(head, want[:10]) {
		t.Fatalf("first bytes %q, %v; want %q", head, err, want[:10])
	}
	cancel()
	if n, err := io.Copy(io.Discard, r); !errors.Is(err, context.Canceled) {
		t.Fatalf("reading on after the load's context ended: %d bytes, %v; want context.Canceled", n, err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Load(ctx, name); !errors.Is(err, context.Canceled) {
		t.Fatalf("Load with an ended context = %v, want context.Canceled", err)
	}
	if err := fc.Delete(ctx, name); !errors.Is(err, context.Canceled) {
		t.Fatalf("Delete with an ended context = %v, want context.Canceled", err)
	}
	if names, err := fc.List(testutil.Context(t)); err != nil || !slices.Equal(names, []string{name}) {
		t.Fatalf("List = %v, %v; want the checkpoint a cancelled delete left", names, err)
	}
	if err := fc.Delete(testutil.Context(t), name); err != nil {
		t.Fatal(err)
	}
}

// cancelingReader cancels when first read, and reads nothing.
type cancelingReader context.CancelFunc

func (c cancelingReader) Read([]byte) (int, error) {
	c()
	return 0, io.EOF
}

// cutSaves is a checkpoint store whose saves, once cut is set, end as a
// save whose context ends partway does: after some of the checkpoint is
// written, with the context's error.
type cutSaves struct {
	*FileCheckpoints
	cut atomic.Bool
}

func (c *cutSaves) Save(ctx context.Context, name string, r io.Reader) error {
	if !c.cut.Load() {
		return c.FileCheckpoints.Save(ctx, name, r)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	return c.FileCheckpoints.Save(ctx, name, io.MultiReader(io.LimitReader(r, 64<<10), cancelingReader(cancel), r))
}

// TestFinalCheckpointCutShortRecoversFromThePreviousOne: a shutdown whose
// final checkpoint its budget cuts short (a slow disk, a large state)
// leaves no part of it, and says so; the next start recovers from the
// previous checkpoint and the stream, which was trimmed only below that
// one, with every item.
func TestFinalCheckpointCutShortRecoversFromThePreviousOne(t *testing.T) {
	dir := t.TempDir()
	fc, err := NewFileCheckpoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	cs := &cutSaves{FileCheckpoints: fc}
	cfgs := checkpointTables(1000)
	d := &deployment{t: t, url: testutil.StartEmbedded(t, 0), prefix: "test"}
	d.connect = func() *nats.Conn {
		nc, err := nats.Connect(d.url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	svc, err := New(d.connect(), cfgs, WithPrefix(d.prefix), WithLogger(testutil.QuietLogger()), WithCheckpoints(cs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(testutil.Context(t))
	defer stop()
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	c := d.client()
	testutil.WaitUntil(t, "service answers info", func() bool {
		ictx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := c.Info(ictx, "")
		return err == nil
	})
	p := d.producer(broker.WithLinger(0))
	fill(t, p, 0, 100, "uniform")
	previous, err := svc.Checkpoint(testutil.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	fill(t, p, 100, 50, "uniform")

	cs.cut.Store(true)
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run whose final checkpoint was cut short = %v, want its context.Canceled", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if !slices.Equal(left, []string{previous.Name}) {
		t.Fatalf("the directory holds %v, want only the previous checkpoint %s", left, previous.Name)
	}

	var rep RecoveryResult
	svc2, _ := d.startService(cfgs, WithCheckpoints(fc), WithRecoveryReport(func(r RecoveryResult) { rep = r }))
	if rep.Checkpoint != previous.Name || len(rep.Skipped) != 0 {
		t.Fatalf("recovery %+v, want %s", rep, previous.Name)
	}
	tb, _ := svc2.Table("uniform")
	testutil.WaitUntil(t, "the stream after the previous checkpoint is replayed", func() bool { return tb.Size() == 150 })
}

// TestFileCheckpointsDeleteRemovesWhatKilledSavesLeft: a save that never
// returned (reprised killed while it wrote, as one whose final checkpoint
// outlasts its SIGTERM grace period is) leaves its temporary file, as
// large as the checkpoint; nothing removed them, and every such stop left
// another until the disk filled. Deleting a checkpoint removes those of
// its save and older ones, and keeps a newer one's, which may be writing.
func TestFileCheckpointsDeleteRemovesWhatKilledSavesLeft(t *testing.T) {
	dir := t.TempDir()
	fc, err := NewFileCheckpoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t)
	old, older, deleted, newer := checkpointName(0, 100), checkpointName(1, 5), checkpointName(1, 7), checkpointName(1, 9)
	for _, name := range []string{older, deleted, newer} {
		if err := fc.Save(ctx, name, strings.NewReader(name)); err != nil {
			t.Fatal(err)
		}
	}
	killed := []string{".tmp-" + old + "-1", ".tmp-" + older + "-22", ".tmp-" + deleted + "-333"}
	kept := []string{".tmp-" + newer + "-4444", ".tmp-notes-5", "prefix"}
	for _, file := range slices.Concat(killed, kept) {
		if err := os.WriteFile(filepath.Join(dir, file), []byte("part of a checkpoint"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := fc.Delete(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	want := slices.Concat([]string{older, newer}, kept)
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("after deleting %s the directory holds %v, want %v", deleted, left, want)
	}
}
