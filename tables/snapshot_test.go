package tables

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

// snapshotOps drives a table through inserts (with evictions), priority
// updates with many ties, deletes and samples, recording the sampled keys.
func snapshotOps(t *testing.T, tb *Table, rng *rand.Rand, firstKey uint64, n int) []uint64 {
	t.Helper()
	var sampled []uint64
	for i := range n {
		key := firstKey + uint64(i)
		switch r := rng.IntN(10); {
		case r < 5:
			mustInsert(t, tb, newItem(key, float64(rng.IntN(2)), ChunkKey(key%7)))
		case r < 7:
			if keys := listKeys(t, tb); len(keys) > 0 {
				key := keys[rng.IntN(len(keys))]
				if _, err := tb.Mutate([]Mutation{{Key: key, Priority: float64(rng.IntN(2))}}); err != nil {
					t.Fatal(err)
				}
			}
		case r < 8:
			tb.Delete(firstKey + uint64(rng.IntN(i+1)))
		default:
			if tb.Size() > 0 {
				sampled = append(sampled, sampleKeys(t, tb, 1)...)
			}
		}
	}
	return sampled
}

func TestSnapshotRoundTrip(t *testing.T) {
	pairs := [][2]selectors.Kind{
		{selectors.KindFifo, selectors.KindFifo},
		{selectors.KindLifo, selectors.KindLifo},
		{selectors.KindMaxHeap, selectors.KindMinHeap},
		{selectors.KindMinHeap, selectors.KindMaxHeap},
		{selectors.KindFifo, selectors.KindMinHeap},
	}
	for _, p := range pairs {
		t.Run(fmt.Sprintf("%s-%s", p[0], p[1]), func(t *testing.T) {
			store := NewChunkStore()
			for k := range ChunkKey(7) {
				putChunk(store, k, 1, int(k)+1)
			}
			cfg := config("t", p[0], p[1], 12, limiter.MinSize(1))
			cfg.MaxTimesSampled = 3
			cfg.Signature = Signature{{Name: "obs", DType: "float32", Shape: []int64{-1, 2}}}
			clock := time.Unix(1700000000, 0)
			tick := WithClock(func() time.Time { clock = clock.Add(time.Millisecond); return clock })
			orig := mustNew(t, cfg, store, tick)
			snapshotOps(t, orig, rand.New(rand.NewPCG(3, 4)), 0, 200)

			snap := orig.Snapshot()
			data, err := json.Marshal(snap)
			if err != nil {
				t.Fatal(err)
			}
			var decoded TableSnapshot
			if err := json.Unmarshal(data, &decoded); err != nil {
				t.Fatal(err)
			}

			// Rebuild in a fresh store from the chunks the snapshot kept.
			store2 := NewChunkStore()
			var keys []ChunkKey
			for _, c := range SnapshotChunks(snap) {
				store2.Put(c)
				keys = append(keys, c.Key)
			}
			restored, err := NewFromSnapshot(decoded, store2, tick)
			if err != nil {
				t.Fatal(err)
			}
			if err := store2.Release(keys...); err != nil {
				t.Fatal(err)
			}
			if again := restored.Snapshot(); !sameSnapshot(again, snap) {
				t.Fatalf("restored snapshot differs:\n got %+v\nwant %+v", again, snap)
			}
			if a, b := orig.Info(), restored.Info(); !reflect.DeepEqual(a, b) {
				t.Fatalf("info differs:\n got %+v\nwant %+v", b, a)
			}
			checkRefs(t, store2, 0, restored)

			// Both now evolve identically: same samples, same evictions.
			for k := range ChunkKey(7) {
				c, _ := store.Get(k)
				store2.Put(c)
			}
			want := snapshotOps(t, orig, rand.New(rand.NewPCG(5, 6)), 1000, 200)
			got := snapshotOps(t, restored, rand.New(rand.NewPCG(5, 6)), 1000, 200)
			if !slices.Equal(got, want) {
				t.Fatalf("sampled after restore %v, original %v", got, want)
			}
			if a, b := listKeys(t, orig), listKeys(t, restored); !slices.Equal(a, b) {
				t.Fatalf("keys after restore %v, original %v", b, a)
			}
		})
	}
}

// sameSnapshot compares snapshots of tables in different stores: their
// chunks agree in every field the caller sees, not in the store's own
// numbering.
func sameSnapshot(a, b TableSnapshot) bool {
	unslotted := func(cs []*Chunk) []Chunk {
		out := make([]Chunk, len(cs))
		for i, c := range cs {
			out[i] = *c
			out[i].slot = 0
		}
		return out
	}
	ac, bc := unslotted(a.Chunks), unslotted(b.Chunks)
	a.Chunks, b.Chunks = nil, nil
	return reflect.DeepEqual(a, b) && reflect.DeepEqual(ac, bc)
}

// checkRefs verifies that every chunk's reference count in the store is
// callerRefs plus the number of items of the tables that reference it, and
// that the store holds nothing else.
func checkRefs(t testing.TB, s *ChunkStore, callerRefs int64, tables ...*Table) {
	t.Helper()
	want := make(map[ChunkKey]int64)
	for _, tb := range tables {
		inTable := map[ChunkKey]bool{}
		for _, it := range tb.Snapshot().Items {
			seen := map[ChunkKey]bool{}
			for _, c := range it.Trajectory {
				for _, sl := range c.Slices {
					if !seen[sl.Chunk] {
						seen[sl.Chunk] = true
						inTable[sl.Chunk] = true
						want[sl.Chunk]++
					}
				}
			}
		}
		var bytes int64
		for k := range inTable {
			c, ok := s.Get(k)
			if !ok {
				t.Fatalf("chunk %d is referenced by items of %q but gone from the store", k, tb.Name())
			}
			bytes += int64(len(c.Data))
		}
		if info := tb.Info(); info.BytesHeld != bytes || info.Chunks != len(inTable) {
			t.Fatalf("table %q reports %d bytes in %d chunks, its items reference %d bytes in %d", tb.Name(), info.BytesHeld, info.Chunks, bytes, len(inTable))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sc := range s.slots {
		if sc == nil {
			continue
		}
		if k := sc.chunk.Key; int64(sc.refs) != want[k]+callerRefs {
			t.Fatalf("chunk %d has %d references, want %d from items and %d from the caller", k, sc.refs, want[k], callerRefs)
		}
	}
	for k := range want {
		if _, ok := s.lookupLocked(k); !ok {
			t.Fatalf("chunk %d is referenced by items but gone from the store", k)
		}
	}
}

// Heaps break ties by the latest insert or update, not by insertion order;
// a restored heap must too.
func TestSnapshotKeepsHeapTies(t *testing.T) {
	store := NewChunkStore()
	putChunk(store, 1, 1, 1)
	cfg := config("t", selectors.KindMaxHeap, selectors.KindMinHeap, 4, limiter.MinSize(1))
	cfg.MaxTimesSampled = 1
	tb := mustNew(t, cfg, store)
	for k := uint64(1); k <= 4; k++ {
		mustInsert(t, tb, newItem(k, 1, 1))
	}
	// Tie order is now 3, 4, 2, 1.
	if _, err := tb.Mutate([]Mutation{{Key: 2, Priority: 1}, {Key: 1, Priority: 1}}); err != nil {
		t.Fatal(err)
	}
	restored, err := NewFromSnapshot(tb.Snapshot(), store)
	if err != nil {
		t.Fatal(err)
	}
	for name, tbl := range map[string]*Table{"original": tb, "restored": restored} {
		// The min-heap remover evicts the first of the ties, item 3; the
		// max-heap sampler takes item 5, then the ties in order.
		mustInsert(t, tbl, newItem(5, 2, 1))
		if got := sampleKeys(t, tbl, 4); !slices.Equal(got, []uint64{5, 4, 2, 1}) {
			t.Fatalf("%s: sampled %v, want [5 4 2 1]", name, got)
		}
	}
}

func TestNewFromSnapshotRejects(t *testing.T) {
	store := NewChunkStore()
	putChunk(store, 1, 1, 1)
	putChunk(store, 2, 1, 1)
	tb := mustNew(t, config("t", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1)), store)
	mustInsert(t, tb, newItem(1, 1, 1))
	mustInsert(t, tb, newItem(2, 1, 2))
	good := tb.Snapshot()
	cases := []struct {
		name    string
		edit    func(*TableSnapshot)
		targets []error
		words   []string
	}{
		{"config", func(s *TableSnapshot) { s.Config.MaxSize = 0 }, []error{ErrInvalidConfig}, []string{"max_size"}},
		{"counts", func(s *TableSnapshot) { s.Limiter.Inserts = 5 }, []error{ErrInvalidSnapshot}, []string{"2 items"}},
		{"too many items", func(s *TableSnapshot) { s.Config.MaxSize = 1 }, []error{ErrInvalidSnapshot}, []string{"max_size is 1"}},
		{"duplicate", func(s *TableSnapshot) { s.Items[1].Key = 1 }, []error{ErrInvalidSnapshot}, []string{"item 1 appears twice"}},
		{"priority", func(s *TableSnapshot) { s.Items[1].Priority = -2 }, []error{ErrInvalidSnapshot, ErrInvalidPriority}, []string{"item 2"}},
		{"times sampled", func(s *TableSnapshot) { s.Items[1].TimesSampled = -1 }, []error{ErrInvalidSnapshot}, []string{"item 2"}},
		{"missing chunk", func(s *TableSnapshot) {
			s.Items[1].Trajectory = []Column{col("obs", 9)}
		}, []error{ErrChunkMissing}, []string{"item 2", "chunk 9"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			snap := good
			snap.Items = slices.Clone(good.Items)
			c.edit(&snap)
			_, err := NewFromSnapshot(snap, store)
			wantErr(t, err, c.targets, c.words...)
			if refs(store, 1) != 2 || refs(store, 2) != 2 {
				t.Fatalf("failed restore leaked references: %d, %d", refs(store, 1), refs(store, 2))
			}
		})
	}
}

func TestSnapshotChunksOnceAcrossTables(t *testing.T) {
	store := NewChunkStore()
	for k := ChunkKey(1); k <= 3; k++ {
		putChunk(store, k, 1, 1)
	}
	a := mustNew(t, config("a", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1)), store)
	b := mustNew(t, config("b", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1)), store)
	mustInsert(t, a, newItem(1, 1, 3, 1))
	mustInsert(t, a, newItem(2, 1, 1))
	mustInsert(t, b, newItem(1, 1, 3, 2))
	var keys []ChunkKey
	for _, c := range SnapshotChunks(a.Snapshot(), b.Snapshot()) {
		keys = append(keys, c.Key)
	}
	if !slices.Equal(keys, []ChunkKey{1, 2, 3}) {
		t.Fatalf("SnapshotChunks keys %v", keys)
	}
	// The snapshot keeps its chunks readable after the table lets go.
	snap := a.Snapshot()
	a.Reset()
	if len(snap.Chunks) != 2 || snap.Chunks[0].Key != 1 || snap.Chunks[0].Length != 1 {
		t.Fatalf("snapshot chunks %+v", snap.Chunks)
	}
}

// TestLargestItemParts: a table keeps the most parts an item has (columns,
// slices, distinct chunks, bytes of column names) through a snapshot, and
// forgets it on Reset.
func TestLargestItemParts(t *testing.T) {
	store := NewChunkStore()
	putChunk(store, 1, 1, 1)
	putChunk(store, 2, 1, 1)
	tb := mustNew(t, config("t", selectors.KindUniform, selectors.KindFifo, 10, limiter.MinSize(1)), store)
	mustInsert(t, tb, newItem(1, 1, 1, 2, 1)) // 1 column, 3 slices, 2 chunks, 3 bytes of name
	mustInsert(t, tb, newItem(2, 1, 1))
	if got := tb.LargestItemParts(); got != 9 {
		t.Fatalf("LargestItemParts = %d, want 9", got)
	}
	restored, err := NewFromSnapshot(tb.Snapshot(), store)
	if err != nil {
		t.Fatal(err)
	}
	if got := restored.LargestItemParts(); got != 9 {
		t.Fatalf("restored LargestItemParts = %d, want 9", got)
	}
	restored.Reset()
	if got := restored.LargestItemParts(); got != 0 {
		t.Fatalf("LargestItemParts after Reset = %d, want 0", got)
	}
}

// TestTimesSampledSaturates: an item sampled 2^31 times (a heap sampler
// returns the same item every time, hours at full rate) reports the most an
// int32 holds, and the table's snapshot still restores. The count wrapped
// negative before, and NewFromSnapshot then refused the table's own state.
func TestTimesSampledSaturates(t *testing.T) {
	store := NewChunkStore()
	putChunk(store, 1, 1, 8)
	tb := mustNew(t, config("t", selectors.KindMaxHeap, selectors.KindFifo, 10, limiter.MinSize(1)), store)
	mustInsert(t, tb, newItem(7, 1, 1))
	// The state after 2^31-1 samples, built rather than sampled.
	snap := tb.Snapshot()
	snap.Items[0].TimesSampled = math.MaxInt32
	snap.Limiter.Samples = math.MaxInt32
	tb, err := NewFromSnapshot(snap, store)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		ss, err := tb.Sample(expired(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if got := ss[0].Info.TimesSampled; got != math.MaxInt32 {
			t.Fatalf("a sample past 2^31-1 reports times_sampled %d, want %d", got, int32(math.MaxInt32))
		}
	}
	if _, err := NewFromSnapshot(tb.Snapshot(), store); err != nil {
		t.Fatalf("the table's snapshot after it does not restore: %v", err)
	}
}
