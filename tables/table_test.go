package tables

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

func TestInsertSampleInfo(t *testing.T) {
	s := NewChunkStore()
	c1 := putChunk(s, 1, 2, 10)
	c2 := putChunk(s, 2, 2, 20)
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	tb := mustNew(t, config("t", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(2)), s,
		WithClock(func() time.Time { return now }))
	it := Item{Key: 7, Priority: 2.5, Trajectory: []Column{col("obs", 1, 2), col("act", 2)}}
	mustInsert(t, tb, it)
	if _, err := tb.Sample(expired(), 1); err == nil {
		t.Fatal("sampled below min_size")
	}
	now = now.Add(time.Second)
	mustInsert(t, tb, newItem(8, 1, 1))
	ss, err := tb.Sample(expired(), 2)
	if err != nil {
		t.Fatal(err)
	}
	want := SampleInfo{Key: 7, Probability: 1, TableSize: 2, Priority: 2.5, TimesSampled: 1, InsertedAt: now.Add(-time.Second)}
	if ss[0].Info != want || ss[1].Info.TimesSampled != 2 {
		t.Fatalf("infos %+v, %+v; want first %+v and the second sampled twice", ss[0].Info, ss[1].Info, want)
	}
	if !slices.Equal(ss[0].Chunks, []*Chunk{c1, c2}) {
		t.Fatalf("chunks %v, want the two distinct chunks in order of use", ss[0].Chunks)
	}
	if got := ss[0].Trajectory(); !reflect.DeepEqual(got, it.Trajectory) {
		t.Fatalf("trajectory %+v, want %+v", got, it.Trajectory)
	}
	// The caller's InsertedAt, when set, is kept.
	at := time.Date(2020, 1, 1, 0, 0, 0, 5, time.UTC)
	mustInsert(t, tb, Item{Key: 9, Priority: 1, InsertedAt: at, Trajectory: []Column{col("obs", 1)}})
	if got := tb.Get(9)[0].InsertedAt; !got.Equal(at) {
		t.Fatalf("InsertedAt %v, want %v", got, at)
	}
}

func TestInsertRejectsBadItems(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 2, 10)
	tb := mustNew(t, config("t", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1)), s)
	cases := []struct {
		name    string
		item    Item
		targets []error
		words   []string
	}{
		{"NaN priority", newItem(1, math.NaN(), 1), []error{ErrInvalidPriority}, []string{"item 1", "NaN"}},
		{"negative priority", newItem(2, -1, 1), []error{ErrInvalidPriority}, []string{"item 2"}},
		{"infinite priority", newItem(3, math.Inf(1), 1), []error{ErrInvalidPriority}, []string{"item 3"}},
		{"no columns", Item{Key: 4, Priority: 1}, []error{ErrInvalidItem}, []string{"item 4", "no columns"}},
		{"no slices", Item{Key: 5, Priority: 1, Trajectory: []Column{{Name: "obs"}}}, []error{ErrInvalidItem}, []string{`"obs"`}},
		{"unnamed column", Item{Key: 6, Priority: 1, Trajectory: []Column{col("", 1)}}, []error{ErrInvalidItem}, []string{"column 0"}},
		{"duplicate columns", Item{Key: 7, Priority: 1, Trajectory: []Column{col("a", 1), col("a", 1)}}, []error{ErrInvalidItem}, []string{`"a"`}},
		{"missing chunk", newItem(8, 1, 1, 42), []error{ErrChunkMissing}, []string{"item 8", "chunk 42"}},
		{"slice out of range", Item{Key: 9, Priority: 1, Trajectory: []Column{{Name: "obs", Slices: []Slice{{Chunk: 1, Offset: 1, Length: 2}}}}}, []error{ErrInvalidItem}, []string{"item 9", `"obs"`}},
		{"time out of range", Item{Key: 10, Priority: 1, InsertedAt: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), Trajectory: []Column{col("obs", 1)}}, []error{ErrInvalidItem}, []string{"inserted_at"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantErr(t, tb.Insert(expired(), c.item), c.targets, c.words...)
		})
	}
	if tb.Size() != 0 || refs(s, 1) != 1 || tb.Info().Limiter.Inserts != 0 {
		t.Fatalf("rejected items changed the table: size %d, refs %d, %+v", tb.Size(), refs(s, 1), tb.Info().Limiter)
	}
}

func TestEvictionWithFifoRemover(t *testing.T) {
	s := NewChunkStore()
	for k := range ChunkKey(5) {
		putChunk(s, k, 1, 1)
	}
	tb := mustNew(t, config("t", selectors.KindUniform, selectors.KindFifo, 3, limiter.MinSize(1)), s)
	for k := range uint64(5) {
		mustInsert(t, tb, newItem(k, 1, k))
	}
	if got := listKeys(t, tb); !slices.Equal(got, []uint64{2, 3, 4}) {
		t.Fatalf("keys %v, want the 3 newest", got)
	}
	for k := range ChunkKey(5) {
		if want := map[bool]int64{true: 1, false: 2}[k < 2]; refs(s, k) != want {
			t.Fatalf("chunk %d has %d refs, want %d", k, refs(s, k), want)
		}
	}
	info := tb.Info()
	if info.Counters.Evictions != 2 || info.Counters.Deletes != 2 || info.Limiter.Deletes != 2 || info.Limiter.Inserts != 5 {
		t.Fatalf("counters %+v limiter %+v", info.Counters, info.Limiter)
	}
}

// Prefetch reads what inserts and a Fifo remover's evictions will read and
// changes nothing: a table that prefetched before each round of inserts
// ends like one that did not, whatever the round's size against the
// table's (none, some or more than all of its items evicted, and an empty
// table), and with removers whose victims it cannot know.
func TestPrefetchChangesNothing(t *testing.T) {
	for _, remover := range []selectors.Kind{selectors.KindFifo, selectors.KindLifo, selectors.KindUniform} {
		s := NewChunkStore()
		for k := range ChunkKey(40) {
			putChunk(s, k, 1, 1)
		}
		cfg := func(name string) Config {
			return config(name, selectors.KindFifo, remover, 4, limiter.MinSize(1))
		}
		plain, prefetching := mustNew(t, cfg("plain"), s), mustNew(t, cfg("prefetching"), s)
		next := uint64(0)
		for _, round := range []int{0, 2, 3, 1, 6, 4, 9} {
			keys := make([]uint64, round)
			for i := range keys {
				keys[i] = next + uint64(i)
			}
			prefetching.Prefetch(keys)
			prefetching.Prefetch(nil)
			for _, k := range keys {
				// Two chunks an item, one shared with the item before.
				it := newItem(k, 1, ChunkKey(k%40), ChunkKey((k+1)%40))
				mustInsert(t, plain, it)
				mustInsert(t, prefetching, it)
			}
			next += uint64(round)
			if a, b := listKeys(t, plain), listKeys(t, prefetching); !slices.Equal(a, b) {
				t.Fatalf("remover %v, after a round of %d: items %v, want %v as without Prefetch", remover, round, b, a)
			}
			if a, b := plain.Info().Counters, prefetching.Info().Counters; a.Evictions != b.Evictions || a.Inserts != b.Inserts {
				t.Fatalf("remover %v, after a round of %d: counters %+v, want %+v", remover, round, b, a)
			}
		}
		for k := range ChunkKey(40) {
			// Each table holds a reference to a chunk per item that uses it,
			// and putChunk's own: the two tables hold the same.
			if r := refs(s, k); (r-1)%2 != 0 {
				t.Fatalf("remover %v: chunk %d has %d references, want the tables' equal shares and putChunk's", remover, k, r)
			}
		}
	}
}

// As in Reverb the new item goes in before the remover chooses, so it can
// be its own victim.
func TestEvictionOwnVictim(t *testing.T) {
	s := NewChunkStore()
	for k := range ChunkKey(3) {
		putChunk(s, k, 1, 1)
	}
	tb := mustNew(t, config("t", selectors.KindUniform, selectors.KindMinHeap, 2, limiter.MinSize(1)), s)
	mustInsert(t, tb, newItem(0, 5, 0))
	mustInsert(t, tb, newItem(1, 6, 1))
	mustInsert(t, tb, newItem(2, 1, 2))
	if err := s.Release(0, 1, 2); err != nil {
		t.Fatal(err)
	}
	if got := listKeys(t, tb); !slices.Equal(got, []uint64{0, 1}) {
		t.Fatalf("keys %v, want the new lowest-priority item evicted at once", got)
	}
	if _, ok := s.Get(2); ok {
		t.Fatal("the evicted item's chunk is still held")
	}
	if c := tb.Info().Counters; c.Inserts != 3 || c.Evictions != 1 {
		t.Fatalf("counters %+v", c)
	}
}

// As in Reverb, inserting a present key only updates its priority.
func TestReinsertUpdatesPriorityOnly(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	putChunk(s, 2, 1, 1)
	// Queue(1): a second new item would have to wait.
	cfg := config("t", selectors.KindMaxHeap, selectors.KindFifo, 10, limiter.Queue(1))
	tb := mustNew(t, cfg, s)
	mustInsert(t, tb, newItem(1, 1, 1))
	mustInsert(t, tb, newItem(1, 9, 2))
	got := tb.Get(1)
	if len(got) != 1 || got[0].Priority != 9 || got[0].Trajectory[0].Slices[0].Chunk != 1 {
		t.Fatalf("Get(1) = %+v, want priority 9 and the first trajectory", got)
	}
	if refs(s, 2) != 1 {
		t.Fatalf("dropped trajectory kept its chunk: %d refs", refs(s, 2))
	}
	if st := tb.Info().Limiter; st.Inserts != 1 {
		t.Fatalf("limiter counted the re-insert: %+v", st)
	}
	if ss, err := tb.Sample(expired(), 1); err != nil || ss[0].Info.Priority != 9 {
		t.Fatalf("sample %+v, %v", ss, err)
	}
}

func TestMaxTimesSampled(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	cfg := config("t", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1))
	cfg.MaxTimesSampled = 3
	tb := mustNew(t, cfg, s)
	mustInsert(t, tb, newItem(1, 1, 1))
	mustInsert(t, tb, newItem(2, 1, 1))
	if err := s.Release(1); err != nil {
		t.Fatal(err)
	}
	ss, err := tb.Sample(expired(), 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range ss {
		if s.Info.Key != 1 || s.Info.TimesSampled != int32(i+1) || s.Info.TableSize != 2 {
			t.Fatalf("sample %d: %+v", i, s.Info)
		}
	}
	if got := listKeys(t, tb); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("keys %v: item 1 not removed on its last sample", got)
	}
	ss, err = tb.Sample(expired(), 3)
	if err != nil || ss[2].Info.TableSize != 1 {
		t.Fatalf("%+v, %v", ss, err)
	}
	if _, ok := s.Get(1); ok || tb.Size() != 0 {
		t.Fatal("chunk still held after both items were sampled out")
	}
	if st := tb.Info().Limiter; st.Deletes != 2 || st.Samples != 6 {
		t.Fatalf("limiter %+v", st)
	}
}

func TestChunksSharedAcrossTables(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 2, 100)
	putChunk(s, 2, 2, 10)
	a := mustNew(t, config("a", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1)), s)
	b := mustNew(t, config("b", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1)), s)
	mustInsert(t, a, newItem(1, 1, 1, 2))
	mustInsert(t, a, newItem(2, 1, 1))
	mustInsert(t, b, newItem(1, 1, 1))
	if err := s.Release(1, 2); err != nil { // the caller's own references
		t.Fatal(err)
	}
	if ia, ib := a.Info(), b.Info(); ia.BytesHeld != 110 || ia.Chunks != 2 || ib.BytesHeld != 100 || ib.Chunks != 1 {
		t.Fatalf("held: a %d bytes in %d chunks, b %d bytes in %d chunks", ia.BytesHeld, ia.Chunks, ib.BytesHeld, ib.Chunks)
	}
	steps := []struct {
		op      func()
		present []ChunkKey
	}{
		{func() { a.Delete(1) }, []ChunkKey{1}},
		{func() { b.Delete(1) }, []ChunkKey{1}},
		{func() { a.Delete(2) }, nil},
	}
	for i, st := range steps {
		st.op()
		for k := ChunkKey(1); k <= 2; k++ {
			_, ok := s.Get(k)
			if want := slices.Contains(st.present, k); ok != want {
				t.Fatalf("after step %d: chunk %d present = %v, want %v", i, k, ok, want)
			}
		}
	}
	if s.Bytes() != 0 || a.Info().BytesHeld != 0 {
		t.Fatalf("store bytes %d, a holds %d", s.Bytes(), a.Info().BytesHeld)
	}
}

func TestResetAndInfo(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 8)
	cfg := config("t", selectors.KindFifo, selectors.KindFifo, 2, limiter.MinSize(1))
	cfg.MaxTimesSampled = 2
	tb := mustNew(t, cfg, s)
	for k := range uint64(3) {
		mustInsert(t, tb, newItem(k, 1, 1))
	}
	sampleKeys(t, tb, 2) // item 1 twice: removed
	tb.Delete(2)
	info := tb.Info()
	// One item sampled (twice); the one episode (chunks without an id)
	// left with the last item.
	wantCounters := Counters{Inserts: 3, Samples: 2, Deletes: 3, Evictions: 1, UniqueSamples: 1, DeletedEpisodes: 1}
	if info.Counters != wantCounters || info.Size != 0 || info.Limiter.Inserts != 3 || info.Limiter.Deletes != 3 || info.Limiter.Samples != 2 {
		t.Fatalf("info %+v, want counters %+v", info, wantCounters)
	}
	mustInsert(t, tb, newItem(5, 1, 1))
	mustInsert(t, tb, newItem(6, 1, 1))
	if err := s.Release(1); err != nil {
		t.Fatal(err)
	}
	tb.Reset()
	info = tb.Info()
	if info.Size != 0 || info.Limiter != (limiter.State{Config: cfg.Limiter}) || info.BytesHeld != 0 || info.Chunks != 0 {
		t.Fatalf("after Reset: %+v", info)
	}
	if info.Counters.Inserts != 5 {
		t.Fatalf("Reset cleared lifetime counters: %+v", info.Counters)
	}
	if s.Len() != 0 {
		t.Fatal("Reset kept chunk references")
	}
	putChunk(s, 1, 1, 8)
	mustInsert(t, tb, newItem(5, 1, 1))
	if got := sampleKeys(t, tb, 1); got[0] != 5 {
		t.Fatalf("after Reset sampled %v", got)
	}
}

func TestMutateInOrder(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	tb := mustNew(t, config("t", selectors.KindMaxHeap, selectors.KindMinHeap, 10, limiter.MinSize(1)), s)
	for k := range uint64(4) {
		mustInsert(t, tb, newItem(k, float64(k), 1))
	}
	missing, err := tb.Mutate([]Mutation{{Key: 1, Priority: 10}, {Key: 1, Delete: true}})
	if err != nil || missing != nil {
		t.Fatalf("update then delete: missing %v, %v", missing, err)
	}
	missing, err = tb.Mutate([]Mutation{{Key: 2, Delete: true}, {Key: 2, Priority: 10}, {Key: 9, Delete: true}})
	if err != nil || !slices.Equal(missing, []uint64{2, 9}) {
		t.Fatalf("delete then update: missing %v, %v; want [2 9]", missing, err)
	}
	if got := listKeys(t, tb); !slices.Equal(got, []uint64{0, 3}) {
		t.Fatalf("keys %v", got)
	}
	// Updates reach both selectors: the max-heap sampler and the min-heap
	// remover both see item 0 as the highest now.
	if _, err := tb.Mutate([]Mutation{{Key: 0, Priority: 7}}); err != nil {
		t.Fatal(err)
	}
	if got := sampleKeys(t, tb, 1); got[0] != 0 {
		t.Fatalf("sampler picked %v, want 0 after its update", got)
	}
	// One bad priority: nothing applies, and the error names the key.
	_, err = tb.Mutate([]Mutation{{Key: 3, Delete: true}, {Key: 0, Priority: math.NaN()}})
	wantErr(t, err, []error{ErrInvalidPriority}, "key 0", "mutation 1")
	if got := listKeys(t, tb); !slices.Equal(got, []uint64{0, 3}) {
		t.Fatalf("a rejected batch applied its delete: keys %v", got)
	}
	if missing := tb.Delete(3, 3); !slices.Equal(missing, []uint64{3}) {
		t.Fatalf("Delete(3, 3) missing %v", missing)
	}
	if got := sampleKeys(t, tb, 1); got[0] != 0 {
		t.Fatalf("sampled %v", got)
	}
}

func TestGetAndList(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	tb := mustNew(t, config("t", selectors.KindUniform, selectors.KindFifo, 10, limiter.MinSize(1)), s)
	for _, k := range []uint64{5, 3, 9, 1} {
		mustInsert(t, tb, newItem(k, float64(k), 1))
	}
	tb.Delete(3)
	mustInsert(t, tb, newItem(3, 1, 1))
	if got := listKeys(t, tb); !slices.Equal(got, []uint64{5, 9, 1, 3}) {
		t.Fatalf("List order %v, want insertion order", got)
	}
	var page []uint64
	for _, it := range mustList(t, tb, 1, 2) {
		page = append(page, it.Key)
	}
	if !slices.Equal(page, []uint64{9, 1}) {
		t.Fatalf("List(1, 2) = %v", page)
	}
	if mustList(t, tb, -3, 1)[0].Key != 5 || mustList(t, tb, 0, 0) != nil || mustList(t, tb, 10, 5) != nil {
		t.Fatal("List clamps badly")
	}
	got := tb.Get(1, 42, 9)
	if len(got) != 2 || got[0].Key != 1 || got[1].Key != 9 || got[1].Priority != 9 {
		t.Fatalf("Get = %+v", got)
	}
}

func TestSampleWaitsAndTimesOut(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	tb := mustNew(t, QueueConfig("q", 4), s)
	for k := range uint64(2) {
		mustInsert(t, tb, newItem(k, 1, 1))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	ss, err := tb.Sample(ctx, 3)
	wantErr(t, err, []error{limiter.ErrRateLimited, context.DeadlineExceeded}, `"q"`)
	// The two items taken before the wait come back: a queue loses none.
	if len(ss) != 2 || ss[0].Info.Key != 0 || ss[1].Info.Key != 1 {
		t.Fatalf("partial samples %+v", ss)
	}
	if c := tb.Info().Counters; c.SampleWaits != 1 || c.Samples != 2 {
		t.Fatalf("counters %+v", c)
	}
	if _, err := tb.Sample(context.Background(), 0); err == nil {
		t.Fatal("Sample(0) succeeded")
	}
}

// endedOnWake is a context that ends as its waiter wakes: Done never
// closes, so the wait ends only by the table's change, and Err says the
// context ended by then, as when a request is withdrawn just as an item
// comes (select takes either).
type endedOnWake struct{ context.Context }

func (endedOnWake) Err() error { return context.Canceled }

// TestSampleTakesNothingOnceCtxEnded: a sample woken by an insert whose
// context ended meanwhile takes nothing: its caller stopped waiting (a
// withdrawn request), and a queue would lose the item.
func TestSampleTakesNothingOnceCtxEnded(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	tb := mustNew(t, QueueConfig("q", 4), s)
	done := make(chan error, 1)
	go func() {
		ss, err := tb.Sample(endedOnWake{context.Background()}, 1)
		if len(ss) != 0 {
			t.Errorf("took %d samples", len(ss))
		}
		done <- err
	}()
	waitFor(t, "the sampler to wait", func() bool { return tb.Info().Counters.SampleWaits == 1 })
	mustInsert(t, tb, newItem(1, 1, 1))
	wantErr(t, <-done, []error{limiter.ErrRateLimited, context.Canceled}, `"q"`)
	if got := sampleKeys(t, tb, 1); len(got) != 1 || got[0] != 1 {
		t.Fatalf("then sampled %v, want the item", got)
	}
}

// passedOnWake is a context whose deadline passes as its waiter wakes:
// Done never closes, and Err says the deadline passed by then.
type passedOnWake struct{ context.Context }

func (passedOnWake) Err() error { return context.DeadlineExceeded }

// TestSampleWokenAtItsDeadlineTakesTheItem: a sample woken by an insert
// whose deadline passed meanwhile (the lock it wakes to was held) takes
// the item, as Reverb's does (a signalled wait is no timeout): its caller
// still listens, which a learner's margin past its timeout_ms is for. It
// got ErrRateLimited, which ends a Python sampler with a timeout though
// the item came in time.
func TestSampleWokenAtItsDeadlineTakesTheItem(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	tb := mustNew(t, QueueConfig("q", 4), s)
	type result struct {
		ss  []Sample
		err error
	}
	done := make(chan result, 1)
	go func() {
		ss, err := tb.Sample(passedOnWake{context.Background()}, 1)
		done <- result{ss, err}
	}()
	waitFor(t, "the sampler to wait", func() bool { return tb.Info().Counters.SampleWaits == 1 })
	mustInsert(t, tb, newItem(1, 1, 1))
	if r := <-done; r.err != nil || len(r.ss) != 1 || r.ss[0].Info.Key != 1 {
		t.Fatalf("sampled %d items (%v), want the item", len(r.ss), r.err)
	}
}

// TestSampleWakeCountsOnlyWhatItTakes: on both ways a table takes samples
// (one at a time, for max_times_sampled; all at once, without), a wait
// woken by an insert as its context was cancelled leaves the item, the
// limiter and the counters as they were; one woken as its deadline passed
// takes the item and counts it once, as rate limited.
func TestSampleWakeCountsOnlyWhatItTakes(t *testing.T) {
	uniform := Config{
		Name: "u", Sampler: selectors.Options{Kind: selectors.KindUniform}, Remover: selectors.Options{Kind: selectors.KindFifo},
		MaxSize: 4, Limiter: limiter.MinSize(1),
	}
	for _, cfg := range []Config{QueueConfig("q", 4), uniform} {
		for _, ctx := range []context.Context{endedOnWake{context.Background()}, passedOnWake{context.Background()}} {
			takes := ctx.Err() == context.DeadlineExceeded
			t.Run(fmt.Sprintf("%s/%v", cfg.Name, ctx.Err()), func(t *testing.T) {
				s := NewChunkStore()
				putChunk(s, 1, 1, 1)
				tb := mustNew(t, cfg, s)
				type result struct {
					ss  []Sample
					err error
				}
				done := make(chan result, 1)
				go func() {
					ss, err := tb.Sample(ctx, 1)
					done <- result{ss, err}
				}()
				waitFor(t, "the sampler to wait", func() bool { return tb.Info().Counters.SampleWaits == 1 })
				mustInsert(t, tb, newItem(1, 1, 1))
				r := <-done
				info := tb.Info()
				var want int64
				if takes {
					want = 1
					if r.err != nil || len(r.ss) != 1 || r.ss[0].Info.Key != 1 || r.ss[0].Info.TimesSampled != 1 || !r.ss[0].Info.RateLimited {
						t.Fatalf("sampled %+v (%v), want the item, sampled once after a wait", r.ss, r.err)
					}
				} else if r.err == nil || len(r.ss) != 0 {
					t.Fatalf("sampled %d items (%v), want none and an error", len(r.ss), r.err)
				}
				c := info.Counters
				if c.Samples != want || c.UniqueSamples != want || info.Limiter.Samples != want || c.SampleWaits != 1 {
					t.Fatalf("samples %d, unique %d, limiter's %d, waits %d; want %d, %d, %d, 1", c.Samples, c.UniqueSamples, info.Limiter.Samples, c.SampleWaits, want, want, want)
				}
				items := tb.Get(1)
				switch {
				case cfg.MaxTimesSampled == 1 && takes:
					if len(items) != 0 {
						t.Fatalf("the queue still holds %+v after its sample", items)
					}
				case len(items) != 1 || int64(items[0].TimesSampled) != want:
					t.Fatalf("the table holds %+v, want the item sampled %d times", items, want)
				}
			})
		}
	}
}

func TestSampleFlexible(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	tb := mustNew(t, QueueConfig("q", 10), s)
	done := make(chan []Sample)
	go func() {
		ss, err := tb.SampleFlexible(testCtx(t), 5)
		if err != nil {
			t.Error(err)
		}
		done <- ss
	}()
	waitFor(t, "the sampler to wait", func() bool { return tb.Info().Counters.SampleWaits == 1 })
	mustInsert(t, tb, newItem(1, 1, 1))
	ss := <-done
	if len(ss) != 1 || !ss[0].Info.RateLimited {
		t.Fatalf("flexible after wait: %+v", ss)
	}
	for k := uint64(2); k < 5; k++ {
		mustInsert(t, tb, newItem(k, 1, 1))
	}
	ss, err := tb.SampleFlexible(expired(), 5)
	if err != nil || len(ss) != 3 || ss[0].Info.RateLimited {
		t.Fatalf("flexible: %d samples, %v", len(ss), err)
	}
}

func TestReconfigureUnblocksInsert(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	cfg := config("t", selectors.KindFifo, selectors.KindFifo, 10, limiter.Queue(1))
	tb := mustNew(t, cfg, s)
	mustInsert(t, tb, newItem(1, 1, 1))
	done := make(chan error)
	go func() { done <- tb.Insert(testCtx(t), newItem(2, 1, 1)) }()
	waitFor(t, "the insert to wait", func() bool { return tb.Info().Counters.InsertWaits == 1 })
	if err := tb.Reconfigure(limiter.Queue(5), 3); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	info := tb.Info()
	if info.Size != 2 || info.Config.Limiter != limiter.Queue(5) || info.Config.MaxTimesSampled != 3 || info.Limiter.Inserts != 2 {
		t.Fatalf("info after Reconfigure %+v", info)
	}
	err := tb.Reconfigure(limiter.Config{}, 1)
	wantErr(t, err, []error{ErrInvalidConfig}, "rate_limiter")
	err = tb.Reconfigure(limiter.MinSize(11), 1)
	wantErr(t, err, []error{ErrInvalidConfig}, "max_size")
	if got := tb.Info().Config.Limiter; got != limiter.Queue(5) {
		t.Fatalf("a rejected Reconfigure changed the limiter to %+v", got)
	}
}

// Lowering max_times_sampled below an item's count removes it on its next
// sample, which still returns it.
func TestReconfigureLowersMaxTimesSampled(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	tb := mustNew(t, config("t", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1)), s)
	mustInsert(t, tb, newItem(1, 1, 1))
	mustInsert(t, tb, newItem(2, 1, 1))
	sampleKeys(t, tb, 3)
	if err := tb.Reconfigure(limiter.MinSize(1), 2); err != nil {
		t.Fatal(err)
	}
	ss, err := tb.Sample(expired(), 2)
	if err != nil || ss[0].Info.Key != 1 || ss[0].Info.TimesSampled != 4 || ss[1].Info.Key != 2 {
		t.Fatalf("samples %+v, %v", ss, err)
	}
	if got := listKeys(t, tb); !slices.Equal(got, []uint64{2}) {
		t.Fatalf("keys %v", got)
	}
}

func TestCloseWakesWaiters(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	putChunk(s, 2, 1, 1)
	full := mustNew(t, QueueConfig("full", 1), s)
	mustInsert(t, full, newItem(1, 1, 1))
	empty := mustNew(t, QueueConfig("empty", 1), s)
	errs := make(chan error, 2)
	go func() { errs <- full.Insert(testCtx(t), newItem(2, 1, 2)) }()
	go func() {
		_, err := empty.Sample(testCtx(t), 1)
		errs <- err
	}()
	waitFor(t, "both calls to wait", func() bool {
		return full.Info().Counters.InsertWaits == 1 && empty.Info().Counters.SampleWaits == 1
	})
	full.Close()
	empty.Close()
	empty.Close()
	for range 2 {
		wantErr(t, <-errs, []error{ErrClosed})
	}
	if refs(s, 2) != 1 {
		t.Fatal("the closed insert kept its chunk")
	}
	wantErr(t, full.Insert(expired(), newItem(3, 1, 1)), []error{ErrClosed})
	_, err := full.Sample(expired(), 1)
	wantErr(t, err, []error{ErrClosed})
	if full.Size() != 1 || full.Snapshot().Items[0].Key != 1 {
		t.Fatal("Close dropped the items")
	}
}

// TestExtremePriorities gives a prioritized sampler and remover priorities
// whose powers, or the sums of them, overflow float64, through every path a
// priority takes: insert, re-insert, Mutate, eviction, sampling and a
// snapshot. Selectors once refused them, and the table panicked.
func TestExtremePriorities(t *testing.T) {
	for _, tt := range []struct {
		exponent, huge float64
	}{{1, 1e308}, {1, math.MaxFloat64}, {1.5, 1e300}, {3, 1e308}} {
		s := NewChunkStore()
		putChunk(s, 1, 1, 1)
		cfg := config("t", selectors.KindPrioritized, selectors.KindPrioritized, 3, limiter.MinSize(1))
		cfg.Sampler.Exponent, cfg.Remover.Exponent = tt.exponent, tt.exponent
		tb := mustNew(t, cfg, s)
		mustInsert(t, tb, newItem(1, tt.huge, 1))
		mustInsert(t, tb, newItem(2, tt.huge, 1))
		mustInsert(t, tb, newItem(3, 1, 1))
		mustInsert(t, tb, newItem(1, tt.huge, 1)) // present: an update
		if missing, err := tb.Mutate([]Mutation{{Key: 3, Priority: tt.huge}}); err != nil || missing != nil {
			t.Fatalf("exponent %v: Mutate to %v: missing %v, %v", tt.exponent, tt.huge, missing, err)
		}
		if info := tb.Info(); info.Size != 3 || info.Counters.Inserts != 3 || info.Limiter.Inserts != 3 {
			t.Fatalf("exponent %v: size %d, counters %+v, limiter %+v; want 3 items inserted", tt.exponent, info.Size, info.Counters, info.Limiter)
		}
		// Three equal weights: a third each, and every item drawn.
		ss, err := tb.Sample(expired(), 3000)
		if err != nil {
			t.Fatal(err)
		}
		counts := map[uint64]int{}
		for _, smp := range ss {
			if d := math.Abs(smp.Info.Probability - 1.0/3); d > 1e-15 || smp.Info.TableSize != 3 {
				t.Fatalf("exponent %v: sample info %+v, want probability 1/3 of 3 items", tt.exponent, smp.Info)
			}
			counts[smp.Info.Key]++
		}
		if len(counts) != 3 || counts[1] < 850 || counts[2] < 850 || counts[3] < 850 {
			t.Fatalf("exponent %v: counts %v, want about 1000 each", tt.exponent, counts)
		}
		// A fourth huge item makes the prioritized remover evict one.
		mustInsert(t, tb, newItem(4, tt.huge, 1))
		if info := tb.Info(); info.Size != 3 || info.Counters.Evictions != 1 || info.Limiter.Inserts-info.Limiter.Deletes != 3 {
			t.Fatalf("exponent %v: size %d, counters %+v, limiter %+v after an eviction", tt.exponent, info.Size, info.Counters, info.Limiter)
		}
		restored, err := NewFromSnapshot(tb.Snapshot(), s)
		if err != nil {
			t.Fatal(err)
		}
		if got := sampleKeys(t, restored, 10); len(got) != 10 {
			t.Fatalf("exponent %v: restored table sampled %v", tt.exponent, got)
		}
	}
}

// TestNegativeMaxTimesSampled checks Reverb's rule that any max_times_sampled
// below 1 means unlimited.
func TestNegativeMaxTimesSampled(t *testing.T) {
	for _, m := range []int32{0, -1, math.MinInt32} {
		s := NewChunkStore()
		putChunk(s, 1, 1, 1)
		cfg := config("t", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1))
		cfg.MaxTimesSampled = m
		tb := mustNew(t, cfg, s)
		mustInsert(t, tb, newItem(1, 1, 1))
		ss, err := tb.Sample(expired(), 5)
		if err != nil || len(ss) != 5 || ss[4].Info.TimesSampled != 5 || tb.Size() != 1 {
			t.Fatalf("max_times_sampled %d: %d samples, %v, size %d", m, len(ss), err, tb.Size())
		}
	}
}
