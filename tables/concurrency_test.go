package tables

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

// With several producers and consumers racing, the limiter keeps
// d = inserts*spi - samples within [min_diff, max_diff] = spi*min_size ± eb:
// every insert it admits leaves d <= max_diff (the first min_size inserts
// are free but add only spi*min_size <= max_diff), and every sample leaves
// d >= min_diff. So the achieved ratio strays from spi by at most eb samples
// (plus the spi*min_size offset) at every moment, not only on average.
func TestConcurrentSampleToInsertRatio(t *testing.T) {
	const (
		spi, minSize, eb = 2.0, 10, 8.0
		producers        = 3
		consumers        = 3
	)
	perProducer := 300
	if testing.Short() {
		perProducer = 100
	}
	lim, err := limiter.SampleToInsertRatio(spi, minSize, eb)
	if err != nil {
		t.Fatal(err)
	}
	store := NewChunkStore()
	putChunk(store, 1, 1, 1)
	tb := mustNew(t, config("ratio", selectors.KindUniform, selectors.KindFifo, 50, lim), store)

	check := func(who string) {
		st := tb.Info().Limiter
		d := float64(st.Inserts)*spi - float64(st.Samples)
		if d > lim.MaxDiff || (st.Samples > 0 && d < lim.MinDiff) {
			t.Errorf("%s: inserts %d, samples %d: d = %v outside [%v, %v]", who, st.Inserts, st.Samples, d, lim.MinDiff, lim.MaxDiff)
		}
	}
	ctx := testCtx(t)
	consumeCtx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	var prod, cons sync.WaitGroup
	var key atomic.Uint64
	for range producers {
		prod.Go(func() {
			for range perProducer {
				if err := tb.Insert(ctx, newItem(key.Add(1), 1, 1)); err != nil {
					t.Errorf("insert: %v", err)
					return
				}
				check("producer")
			}
		})
	}
	for c := range consumers {
		cons.Go(func() {
			for {
				_, err := tb.Sample(consumeCtx, 1+c)
				check("consumer")
				if err != nil {
					if !errors.Is(err, limiter.ErrRateLimited) || !errors.Is(err, context.Canceled) {
						t.Errorf("sample: %v", err)
					}
					return
				}
			}
		})
	}
	prod.Wait()
	stopConsumers()
	cons.Wait()
	check("end")
	info := tb.Info()
	if info.Limiter.Inserts != producers*int64(perProducer) {
		t.Fatalf("inserted %d of %d", info.Limiter.Inserts, producers*perProducer)
	}
	if info.Counters.InsertWaits == 0 || info.Counters.SampleWaits == 0 {
		t.Fatalf("neither side was ever held, the test proves nothing: %+v", info.Counters)
	}
	t.Logf("achieved %d samples for %d inserts (%.3f per insert), counters %+v",
		info.Limiter.Samples, info.Limiter.Inserts, float64(info.Limiter.Samples)/float64(info.Limiter.Inserts), info.Counters)
}

// A queue table hands every item to exactly one consumer, in the order it
// was inserted: each producer's items reach each consumer in the producer's
// order.
func TestConcurrentQueueExactlyOnceInOrder(t *testing.T) {
	const producers, consumers = 3, 3
	perProducer := uint64(400)
	if testing.Short() {
		perProducer = 100
	}
	total := int64(producers * perProducer)
	store := NewChunkStore()
	putChunk(store, 1, 1, 1)
	tb := mustNew(t, QueueConfig("queue", 8), store)

	ctx := testCtx(t)
	consumeCtx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	var received atomic.Int64
	allReceived := make(chan struct{})
	got := make([][]uint64, consumers)
	var prod, cons sync.WaitGroup
	for p := range uint64(producers) {
		prod.Go(func() {
			for i := range perProducer {
				if err := tb.Insert(ctx, newItem(p<<32|i, 1, 1)); err != nil {
					t.Errorf("insert: %v", err)
					return
				}
			}
		})
	}
	for c := range consumers {
		cons.Go(func() {
			for {
				ss, err := tb.SampleFlexible(consumeCtx, 1+c)
				for _, s := range ss {
					got[c] = append(got[c], s.Info.Key)
				}
				if received.Add(int64(len(ss))) == total && len(ss) > 0 {
					close(allReceived)
				}
				if err != nil {
					return
				}
			}
		})
	}
	prod.Wait()
	select {
	case <-allReceived:
	case <-ctx.Done():
		t.Fatalf("received %d of %d items", received.Load(), total)
	}
	stopConsumers()
	cons.Wait()

	seen := make(map[uint64]int)
	for c, keys := range got {
		last := map[uint64]int64{}
		for _, k := range keys {
			seen[k]++
			p, i := k>>32, int64(k&0xffffffff)
			if prev, ok := last[p]; ok && i <= prev {
				t.Fatalf("consumer %d got producer %d's item %d after item %d", c, p, i, prev)
			}
			last[p] = i
		}
	}
	for p := range uint64(producers) {
		for i := range perProducer {
			if n := seen[p<<32|i]; n != 1 {
				t.Fatalf("producer %d item %d delivered %d times", p, i, n)
			}
		}
	}
	if len(seen) != int(total) || tb.Size() != 0 {
		t.Fatalf("%d distinct keys delivered, %d left in the table", len(seen), tb.Size())
	}
	checkRefs(t, store, 1, tb)
}

// Every kind of call at once, for the race detector and the reference
// counts.
func TestConcurrentMixedOps(t *testing.T) {
	store := NewChunkStore()
	for k := range ChunkKey(8) {
		putChunk(store, k, 2, int(k)+1)
	}
	a := mustNew(t, config("a", selectors.KindPrioritized, selectors.KindMinHeap, 20, limiter.MinSize(2)), store)
	b := mustNew(t, config("b", selectors.KindFifo, selectors.KindLifo, 5, limiter.MinSize(1)), store)
	ops := 400
	if testing.Short() {
		ops = 100
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range ops {
				tb := a
				if rng.IntN(2) == 0 {
					tb = b
				}
				key := uint64(rng.IntN(40))
				switch rng.IntN(9) {
				case 0, 1, 2:
					it := newItem(key, rng.Float64(), ChunkKey(rng.IntN(8)), ChunkKey(rng.IntN(8)))
					if err := tb.Insert(expired(), it); err != nil && !errors.Is(err, limiter.ErrRateLimited) {
						t.Errorf("insert: %v", err)
					}
				case 3, 4:
					if _, err := tb.SampleFlexible(expired(), 3); err != nil && !errors.Is(err, limiter.ErrRateLimited) {
						t.Errorf("sample: %v", err)
					}
				case 5:
					if _, err := tb.Mutate([]Mutation{{Key: key, Priority: 2}, {Key: key + 1, Delete: true}}); err != nil {
						t.Errorf("mutate: %v", err)
					}
				case 6:
					tb.Info()
					if _, err := tb.List(1, 3); err != nil {
						t.Errorf("list: %v", err)
					}
					tb.Snapshot()
				case 7:
					if err := tb.Reconfigure(limiter.MinSize(int64(1+rng.IntN(3))), int32(rng.IntN(3))); err != nil {
						t.Errorf("reconfigure: %v", err)
					}
				default:
					if rng.IntN(10) == 0 {
						tb.Reset()
					}
				}
			}
		})
	}
	wg.Wait()
	for _, tb := range []*Table{a, b} {
		if info := tb.Info(); info.Size > tb.cfg.MaxSize || info.Size != info.Limiter.Inserts-info.Limiter.Deletes {
			t.Fatalf("%s: %+v", tb.Name(), info)
		}
	}
	checkRefs(t, store, 1, a, b)
}
