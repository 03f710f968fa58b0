package tables

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

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
