package tables

import (
	"errors"
	"slices"
	"testing"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

func versioned(key uint64, version int64) Item {
	it := newItem(key, 1, 1)
	it.PolicyVersion = version
	return it
}

func staleness(k int64) *int64 { return &k }

// boundedTable is a uniform table of up to 100 items, with max_staleness
// k, whose items may use chunk 1.
func boundedTable(t *testing.T, k int64) *Table {
	t.Helper()
	s := NewChunkStore()
	putChunk(s, 1, 1, 8)
	cfg := config("t", selectors.KindUniform, selectors.KindFifo, 100, limiter.MinSize(1))
	cfg.MaxStaleness = staleness(k)
	return mustNew(t, cfg, s)
}

func keysOf(t testing.TB, tb *Table) []uint64 {
	t.Helper()
	var keys []uint64
	for _, it := range mustList(t, tb, 0, 1<<20) {
		keys = append(keys, it.Key)
	}
	return keys
}

// TestStalenessBound: raising the policy version removes the items more
// than MaxStaleness versions behind, counts them apart and as deletes for
// the limiter, drops stale inserts, and ignores a lower version.
func TestStalenessBound(t *testing.T) {
	tb := boundedTable(t, 1)
	for key, version := range []int64{0, 1, 2, 0, 1} {
		mustInsert(t, tb, versioned(uint64(key+1), version))
	}
	if !tb.SetPolicyVersion(2) {
		t.Fatal("raising the version from 0 to 2 reported no change")
	}
	if got := keysOf(t, tb); !slices.Equal(got, []uint64{2, 3, 5}) {
		t.Fatalf("items %v after version 2 with max_staleness 1, want [2 3 5] (versions 1 and 2)", got)
	}
	info := tb.Info()
	if c := info.Counters; c.StaleEvictions != 2 || c.Deletes != 2 || info.Limiter.Deletes != 2 {
		t.Fatalf("counters %+v, limiter deletes %d: want 2 stale evictions counted as deletes", c, info.Limiter.Deletes)
	}
	if info.PolicyVersion != 2 || info.ItemVersions == nil || *info.ItemVersions != [2]int64{1, 2} {
		t.Fatalf("info versions: current %d, items %v; want 2 and [1 2]", info.PolicyVersion, info.ItemVersions)
	}
	// A stale item arriving is dropped; a fresh one lands.
	mustInsert(t, tb, versioned(6, 0))
	mustInsert(t, tb, versioned(7, 1))
	if got := keysOf(t, tb); !slices.Equal(got, []uint64{2, 3, 5, 7}) {
		t.Fatalf("items %v, want the stale insert 6 dropped", got)
	}
	if c := tb.Info().Counters; c.StaleEvictions != 3 || c.Inserts != 6 {
		t.Fatalf("counters %+v: want 3 stale evictions and 6 inserts", c)
	}
	if tb.SetPolicyVersion(1) || tb.Info().PolicyVersion != 2 {
		t.Fatal("a lower version changed the table: the highest set must win")
	}
	for range 50 {
		ss, err := tb.Sample(expired(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if k := ss[0].Info.Key; k == 1 || k == 4 || k == 6 {
			t.Fatalf("sampled stale item %d", k)
		}
	}
}

// TestResetStartsVersionsAgain: a reset table is at policy version 0, so
// a new run whose actors count versions from 0 again is not dropped as
// stale by a bound of the old run's versions.
func TestResetStartsVersionsAgain(t *testing.T) {
	tb := boundedTable(t, 0)
	tb.SetPolicyVersion(5)
	tb.Reset()
	mustInsert(t, tb, versioned(1, 0))
	if info := tb.Info(); info.Size != 1 || info.PolicyVersion != 0 || info.Counters.StaleEvictions != 0 {
		t.Fatalf("after a reset, an insert of version 0: size %d, policy version %d, %d stale; want 1, 0, 0", info.Size, info.PolicyVersion, info.Counters.StaleEvictions)
	}
	if !tb.SetPolicyVersion(1) {
		t.Fatal("raising the version after a reset reported no change")
	}
}

// TestStalenessOnPolicy: max_staleness 0 keeps only the current version:
// a FIFO table sampled once per item drops what the learner did not take
// before it moved on, and serves the new version's items in order.
func TestStalenessOnPolicy(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 8)
	cfg := config("q", selectors.KindFifo, selectors.KindFifo, 100, limiter.MinSize(1))
	cfg.MaxTimesSampled = 1
	cfg.MaxStaleness = staleness(0)
	tb := mustNew(t, cfg, s)
	for key := range uint64(3) {
		mustInsert(t, tb, versioned(key+1, 5))
	}
	if ss, err := tb.Sample(expired(), 1); err != nil || ss[0].Info.Key != 1 {
		t.Fatalf("first sample %v, %v; want item 1", ss, err)
	}
	tb.SetPolicyVersion(6)
	if tb.Size() != 0 {
		t.Fatalf("%d items of version 5 left at version 6 with max_staleness 0", tb.Size())
	}
	for key := range uint64(3) {
		mustInsert(t, tb, versioned(10+key, 6))
	}
	for want := uint64(10); want < 13; want++ {
		if ss, err := tb.Sample(expired(), 1); err != nil || ss[0].Info.Key != want {
			t.Fatalf("sample %v, %v; want item %d", ss, err, want)
		}
	}
}

// TestStalenessUnbounded: without MaxStaleness the version is recorded
// and nothing is removed.
func TestStalenessUnbounded(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 8)
	tb := mustNew(t, config("t", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1)), s)
	mustInsert(t, tb, versioned(1, 0))
	tb.SetPolicyVersion(100)
	if tb.Size() != 1 || tb.Info().Counters.StaleEvictions != 0 {
		t.Fatal("a table without max_staleness removed an item")
	}
}

// TestStalenessSnapshotAndReconfigure: a snapshot keeps the current
// version and the items' versions, so the bound holds after a restore;
// a tighter bound set at runtime removes what it makes stale.
func TestStalenessSnapshotAndReconfigure(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 8)
	cfg := config("t", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1))
	cfg.MaxStaleness = staleness(3)
	tb := mustNew(t, cfg, s)
	for key, version := range []int64{1, 2, 3, 4} {
		mustInsert(t, tb, versioned(uint64(key+1), version))
	}
	tb.SetPolicyVersion(4)
	restored, err := NewFromSnapshot(tb.Snapshot(), s)
	if err != nil {
		t.Fatal(err)
	}
	if v := restored.Info().PolicyVersion; v != 4 {
		t.Fatalf("restored version %d, want 4", v)
	}
	restored.SetPolicyVersion(5) // floor 2: version 1 goes
	if got := keysOf(t, restored); !slices.Equal(got, []uint64{2, 3, 4}) {
		t.Fatalf("restored items %v after version 5, want [2 3 4]", got)
	}
	if err := restored.ReconfigureStaleness(staleness(1)); err != nil { // floor 4
		t.Fatal(err)
	}
	if got := keysOf(t, restored); !slices.Equal(got, []uint64{4}) {
		t.Fatalf("items %v after tightening max_staleness to 1, want [4]", got)
	}
	if err := restored.ReconfigureStaleness(staleness(-1)); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("max_staleness -1: %v, want ErrInvalidConfig", err)
	}
	bad := cfg
	bad.MaxStaleness = staleness(-2)
	if _, err := New(bad, s); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with max_staleness -2: %v, want ErrInvalidConfig", err)
	}
}

// TestStalenessIndexBounded: with churn under one version (a full FIFO
// table evicting on every insert), the index of keys per version stays
// proportional to the items it holds.
func TestStalenessIndexBounded(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 8)
	cfg := config("t", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1))
	cfg.MaxStaleness = staleness(2)
	tb := mustNew(t, cfg, s)
	for key := range uint64(10_000) {
		mustInsert(t, tb, versioned(key+1, 7))
	}
	if n := len(tb.versions.keys[7]); n > 2*10+16+1 {
		t.Fatalf("the index holds %d keys for version 7, whose table holds 10 items", n)
	}
	tb.SetPolicyVersion(10)
	if tb.Size() != 0 || tb.Info().Counters.StaleEvictions != 10 {
		t.Fatalf("size %d, stale evictions %d after version 10: want 0 and 10", tb.Size(), tb.Info().Counters.StaleEvictions)
	}
}

// TestEpisodeAndUniqueSampleCounts: Reverb's num_episodes counts the
// episodes the items hold steps of, num_deleted_episodes those whose last
// item left, and num_unique_samples the items sampled at least once.
func TestEpisodeAndUniqueSampleCounts(t *testing.T) {
	s := NewChunkStore()
	for key, episode := range map[ChunkKey]uint64{1: 100, 2: 100, 3: 200} {
		s.Put(&Chunk{Key: key, Format: &Format{DType: "float32", Shape: []int64{2}}, Length: 1, Data: make([]byte, 8), Episode: episode})
	}
	tb := mustNew(t, config("t", selectors.KindUniform, selectors.KindFifo, 10, limiter.MinSize(1)), s)
	mustInsert(t, tb, newItem(1, 1, 1, 2)) // episode 100, two chunks
	mustInsert(t, tb, newItem(2, 1, 2))    // episode 100
	mustInsert(t, tb, newItem(3, 1, 3))    // episode 200
	if n := tb.Info().Episodes; n != 2 {
		t.Fatalf("%d episodes, want 2", n)
	}
	seen := map[uint64]bool{}
	for range 4 {
		ss, err := tb.Sample(expired(), 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ss {
			seen[s.Info.Key] = true
		}
	}
	if c := tb.Info().Counters; c.UniqueSamples != int64(len(seen)) || c.Samples != 8 {
		t.Fatalf("counters %+v: want %d unique samples of 8", c, len(seen))
	}
	tb.Delete(3)
	info := tb.Info()
	if info.Episodes != 1 || info.Counters.DeletedEpisodes != 1 {
		t.Fatalf("after deleting episode 200's only item: %d episodes, %d deleted; want 1 and 1", info.Episodes, info.Counters.DeletedEpisodes)
	}
	tb.Delete(1)
	if info := tb.Info(); info.Episodes != 1 || info.Counters.DeletedEpisodes != 1 {
		t.Fatalf("episode 100 still has item 2: %d episodes, %d deleted", info.Episodes, info.Counters.DeletedEpisodes)
	}
	restored, err := NewFromSnapshot(tb.Snapshot(), s)
	if err != nil {
		t.Fatal(err)
	}
	if info := restored.Info(); info.Episodes != 1 || info.Counters.DeletedEpisodes != 1 {
		t.Fatalf("restored: %d episodes, %d deleted; want 1 and 1", info.Episodes, info.Counters.DeletedEpisodes)
	}
}
