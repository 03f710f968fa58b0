package tables

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

// BenchmarkInsertSample measures one insert followed by one sample of one
// item, split over g goroutines: "uniform" is a full table where every
// insert evicts, "queue" a queue table where every sample removes.
func BenchmarkInsertSample(b *testing.B) {
	configs := []Config{
		config("uniform", selectors.KindUniform, selectors.KindFifo, 10_000, limiter.MinSize(1)),
		QueueConfig("queue", 1024),
	}
	for _, cfg := range configs {
		for _, g := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", cfg.Name, g), func(b *testing.B) {
				benchInsertSample(b, cfg, g)
			})
		}
	}
}

func benchInsertSample(b *testing.B, cfg Config, goroutines int) {
	store := NewChunkStore()
	putChunk(store, 1, 4, 1024)
	putChunk(store, 2, 4, 1024)
	tb := mustNew(b, cfg, store)
	// Items share one trajectory: the table keeps it without copying.
	traj := []Column{col("obs", 1), col("action", 2)}
	ctx := context.Background()
	var next atomic.Uint64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	for w := range goroutines {
		n := b.N / goroutines
		if w < b.N%goroutines {
			n++
		}
		wg.Go(func() {
			for range n {
				if err := tb.Insert(ctx, Item{Key: next.Add(1), Priority: 1, Trajectory: traj}); err != nil {
					b.Error(err)
					return
				}
				if _, err := tb.Sample(ctx, 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkSampleBatches draws batches of 256 from a uniform table of
// 100,000 items, each with a chunk of its own, from parallel goroutines:
// the learners of one table. Run with -cpu 1,2,... to see how they scale;
// a request draws its whole batch under the table's lock.
func BenchmarkSampleBatches(b *testing.B) {
	const size, batch = 100_000, 256
	store := NewChunkStore()
	tb := mustNew(b, config("uniform", selectors.KindUniform, selectors.KindFifo, size, limiter.MinSize(1)), store)
	ctx := context.Background()
	for k := range uint64(size) {
		putChunk(store, ChunkKey(k+1), 1, 400)
		if err := tb.Insert(ctx, newItem(k+1, 1, ChunkKey(k+1))); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var dst []Sample
		for pb.Next() {
			var err error
			if dst, _, err = tb.AppendSamples(ctx, dst[:0], batch, batch); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)*batch/b.Elapsed().Seconds(), "items/s")
}

// BenchmarkSampleLocked measures the part of a batch of 256 draws from a
// uniform table that holds the table's lock, alone: with many learners on
// one table that part runs one batch at a time, so it bounds them all.
func BenchmarkSampleLocked(b *testing.B) {
	for _, size := range []int{10_000, 500_000} {
		b.Run(fmt.Sprintf("table=%d", size), func(b *testing.B) {
			const batch = 256
			store := NewChunkStore()
			tb := mustNew(b, config("uniform", selectors.KindUniform, selectors.KindFifo, int64(size), limiter.MinSize(1)), store)
			ctx := context.Background()
			for k := range uint64(size) {
				putChunk(store, ChunkKey(k+1), 1, 400)
				if err := tb.Insert(ctx, newItem(k+1, 1, ChunkKey(k+1))); err != nil {
					b.Fatal(err)
				}
			}
			dst := make([]Sample, 0, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				tb.mu.Lock()
				dst, _ = tb.sampleManyLocked(dst[:0], batch, false)
				tb.mu.Unlock()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/item")
		})
	}
}

// BenchmarkRetainItem measures holding the chunks of a waiting item of n
// slices of distinct chunks: the time per slice stays flat as n grows.
func BenchmarkRetainItem(b *testing.B) {
	for _, n := range []int{1 << 10, 1 << 14} {
		b.Run(fmt.Sprintf("slices=%d", n), func(b *testing.B) {
			s := NewChunkStore()
			c := Column{Name: "x"}
			for i := range n {
				putChunk(s, ChunkKey(i+1), 1, 8)
				c.Slices = append(c.Slices, Slice{Chunk: ChunkKey(i + 1), Length: 1})
			}
			traj := []Column{c}
			b.ResetTimer()
			for range b.N {
				keys, _, err := s.RetainItem(traj)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Release(keys...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/slice")
		})
	}
}

// BenchmarkPageFar takes a page of one item at offset 900,000 of
// 1,000,000, and reports how long the table's lock was held in one step
// of it, on average: what an insert or a sample waits behind a page at
// most, give or take the machine.
func BenchmarkPageFar(b *testing.B) {
	const size = 1_000_000
	store := NewChunkStore()
	putChunk(store, 1, 1, 8)
	tb := mustNew(b, config("uniform", selectors.KindUniform, selectors.KindFifo, size, limiter.MinSize(1)), store)
	ctx := context.Background()
	for k := range uint64(size) {
		if err := tb.Insert(ctx, newItem(k+1, 1, 1)); err != nil {
			b.Fatal(err)
		}
	}
	saved := pageYield
	b.Cleanup(func() { pageYield = saved })
	var last time.Time
	var held time.Duration
	holds := 0
	pageYield = func() {
		held += time.Since(last)
		holds++
		last = time.Now()
	}
	b.ResetTimer()
	for range b.N {
		last = time.Now()
		page, err := tb.Page(900_000, 1)
		if err != nil || len(page) != 1 || page[0].Key != 900_001 {
			b.Fatalf("Page(900000, 1) = %v, %v", page, err)
		}
		held += time.Since(last)
		holds++
	}
	b.ReportMetric(float64(held.Nanoseconds())/float64(holds), "ns/hold")
}
