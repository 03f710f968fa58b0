package tables

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

// Items of one shape share one layout whatever their chunks; a layout
// idles after its last item, comes back for the next of its shape, and
// Reset forgets them all.
func TestLayoutsShared(t *testing.T) {
	s := NewChunkStore()
	for k := range ChunkKey(6) {
		putChunk(s, k+1, 4, 8)
	}
	tb := mustNew(t, config("t", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1)), s)
	mustInsert(t, tb, Item{Key: 1, Priority: 1, Trajectory: []Column{col("obs", 1, 2)}})
	mustInsert(t, tb, Item{Key: 2, Priority: 1, Trajectory: []Column{col("obs", 3, 4)}})
	// Other chunks, in other orders, still the same shape; then a repeated
	// chunk, another offset, another name, a squeeze: four more shapes.
	mustInsert(t, tb, Item{Key: 3, Priority: 1, Trajectory: []Column{col("obs", 4, 3)}})
	mustInsert(t, tb, Item{Key: 4, Priority: 1, Trajectory: []Column{col("obs", 5, 5)}})
	mustInsert(t, tb, Item{Key: 5, Priority: 1, Trajectory: []Column{{Name: "obs", Slices: []Slice{{Chunk: 5, Offset: 1, Length: 1}, {Chunk: 6, Length: 1}}}}})
	mustInsert(t, tb, Item{Key: 6, Priority: 1, Trajectory: []Column{col("act", 1, 2)}})
	mustInsert(t, tb, Item{Key: 7, Priority: 1, Trajectory: []Column{{Name: "obs", Squeeze: true, Slices: []Slice{{Chunk: 1, Length: 1}}}}})
	if n := len(tb.layouts.byKey); n != 5 {
		t.Fatalf("%d layouts for 7 items of 5 shapes", n)
	}
	e1, _ := tb.lookup(1)
	e2, _ := tb.lookup(2)
	e3, _ := tb.lookup(3)
	if e1.layout != e2.layout || e1.layout != e3.layout {
		t.Fatal("items 1 to 3 have one shape but not one layout")
	}
	shared := e1.layout
	if got := tb.Get(2)[0].Trajectory; !reflect.DeepEqual(got, []Column{col("obs", 3, 4)}) {
		t.Fatalf("item 2's trajectory %+v", got)
	}
	if got := tb.Get(3)[0].Trajectory; !reflect.DeepEqual(got, []Column{col("obs", 4, 3)}) {
		t.Fatalf("item 3's trajectory %+v", got)
	}
	tb.Delete(1)
	if n, idle := len(tb.layouts.byKey), tb.layouts.idle; n != 5 || idle != 0 {
		t.Fatalf("%d layouts, %d idle, after deleting one of three items of a shape; want 5, none idle", n, idle)
	}
	tb.Delete(2, 3, 4)
	if n, idle := len(tb.layouts.byKey), tb.layouts.idle; n != 5 || idle != 2 {
		t.Fatalf("%d layouts, %d idle, after deleting the items of two shapes; want 5, 2 idle", n, idle)
	}
	mustInsert(t, tb, Item{Key: 8, Priority: 1, Trajectory: []Column{col("obs", 5, 6)}})
	e8, _ := tb.lookup(8)
	if e8.layout != shared || tb.layouts.idle != 1 {
		t.Fatalf("an item of an idle shape got a new layout, or the layout still counts as idle (%d idle)", tb.layouts.idle)
	}
	tb.Reset()
	if n := len(tb.layouts.byKey); n != 0 || tb.layouts.idle != 0 {
		t.Fatalf("%d layouts after Reset", n)
	}
}

// Items of ever new shapes leave at most idleLayouts more idle layouts
// than layouts in use.
func TestLayoutsBounded(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1<<20, 8)
	const held = 10
	tb := mustNew(t, config("t", selectors.KindFifo, selectors.KindFifo, held, limiter.MinSize(1)), s)
	for key := range uint64(5000) {
		// Each its own offset: a shape of its own. The table evicts the
		// oldest beyond held.
		mustInsert(t, tb, Item{Key: key, Priority: 1, Trajectory: []Column{{Name: "obs", Slices: []Slice{{Chunk: 1, Offset: int32(key), Length: 1}}}}})
		inUse := len(tb.layouts.byKey) - tb.layouts.idle
		if inUse != int(tb.Size()) || tb.layouts.idle > inUse+idleLayouts {
			t.Fatalf("after %d inserts: %d layouts in use for %d items, %d idle", key+1, inUse, tb.Size(), tb.layouts.idle)
		}
	}
}

// Every item's trajectory comes back as inserted, through Get, Sample and
// Snapshot, whatever the order, repetition and number of its chunks (past
// searchedChunks too).
func TestLayoutsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	s := NewChunkStore()
	const chunks = 200
	for k := range ChunkKey(chunks) {
		putChunk(s, k+1, 8, 8)
	}
	tb := mustNew(t, config("t", selectors.KindUniform, selectors.KindFifo, 1000, limiter.MinSize(1)), s)
	want := map[uint64][]Column{}
	for key := range uint64(300) {
		var traj []Column
		spread := []int{2, 8, chunks}[rng.IntN(3)] // few chunks, some, many
		for c := range 1 + rng.IntN(3) {
			column := Column{Name: []string{"obs", "act", "rew"}[c]}
			for range 1 + rng.IntN(60) {
				off := rng.Int32N(8)
				column.Slices = append(column.Slices, Slice{Chunk: ChunkKey(1 + rng.IntN(spread)), Offset: off, Length: 1 + rng.Int32N(8-off)})
			}
			traj = append(traj, column)
		}
		mustInsert(t, tb, Item{Key: key, Priority: 1, Trajectory: traj})
		want[key] = traj
	}
	for key, traj := range want {
		if got := tb.Get(key)[0].Trajectory; !reflect.DeepEqual(got, traj) {
			t.Fatalf("item %d: Get gives %+v, want %+v", key, got, traj)
		}
	}
	ss, err := tb.Sample(expired(), 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, smp := range ss {
		if got := smp.Trajectory(); !reflect.DeepEqual(got, want[smp.Info.Key]) {
			t.Fatalf("item %d: sampled %+v, want %+v", smp.Info.Key, got, want[smp.Info.Key])
		}
		for i, c := range smp.Chunks {
			for _, d := range smp.Chunks[:i] {
				if c == d {
					t.Fatalf("item %d: chunk %d listed twice", smp.Info.Key, c.Key)
				}
			}
		}
	}
	for _, it := range tb.Snapshot().Items {
		if !reflect.DeepEqual(it.Trajectory, want[it.Key]) {
			t.Fatalf("item %d: snapshot has %+v, want %+v", it.Key, it.Trajectory, want[it.Key])
		}
	}
}

func TestNewLayout(t *testing.T) {
	s := NewChunkStore()
	a, b := putChunk(s, 1, 4, 8), putChunk(s, 2, 4, 8)
	traj := []Column{{Name: "obs", Slices: []Slice{{Chunk: 2, Offset: 1, Length: 2}, {Chunk: 1, Length: 1}}}, {Name: "act", Squeeze: true, Slices: []Slice{{Chunk: 2, Length: 1}}}}
	l, err := NewLayout(traj, []*Chunk{a, b})
	if err != nil {
		t.Fatal(err)
	}
	want := Layout{{Name: "obs", Slices: []LayoutSlice{{Chunk: 1, Offset: 1, Length: 2}, {Chunk: 0, Length: 1}}}, {Name: "act", Squeeze: true, Slices: []LayoutSlice{{Chunk: 1, Length: 1}}}}
	if !reflect.DeepEqual(l, want) {
		t.Fatalf("NewLayout = %+v, want %+v", l, want)
	}
	if got := l.Trajectory([]*Chunk{a, b}); !reflect.DeepEqual(got, traj) {
		t.Fatalf("Trajectory = %+v, want %+v", got, traj)
	}
	if _, err := NewLayout(traj, []*Chunk{b}); !errors.Is(err, ErrChunkMissing) {
		t.Fatalf("NewLayout without chunk 1: %v, want ErrChunkMissing", err)
	}
}
