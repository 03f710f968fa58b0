package limiter

import (
	"runtime"
	"sync"
	"testing"
)

// benchConfigs never refuse the insert-then-sample pair, even with eight
// goroutines interleaving, so the benchmarks measure the admitted path.
func benchConfigs(b *testing.B) []struct {
	name string
	cfg  Config
} {
	return []struct {
		name string
		cfg  Config
	}{
		{"MinSize", MinSize(1)},
		{"SampleToInsertRatio", mustRatio(b, 1, 1, 64)},
	}
}

func BenchmarkTryInsertTrySample(b *testing.B) {
	for _, bc := range benchConfigs(b) {
		b.Run(bc.name, func(b *testing.B) {
			l := newLimiter(b, bc.cfg)
			b.ReportAllocs()
			for b.Loop() {
				if ok, _ := l.TryInsert(1); !ok {
					b.Fatal("insert refused")
				}
				if ok, _ := l.TrySample(1); !ok {
					b.Fatal("sample refused")
				}
			}
		})
	}
}

func BenchmarkTryInsertTrySampleParallel8(b *testing.B) {
	for _, bc := range benchConfigs(b) {
		b.Run(bc.name, func(b *testing.B) {
			l := newLimiter(b, bc.cfg)
			// RunParallel starts parallelism*GOMAXPROCS goroutines.
			b.SetParallelism((8 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if ok, _ := l.TryInsert(1); !ok {
						b.Error("insert refused")
						return
					}
					if ok, _ := l.TrySample(1); !ok {
						b.Error("sample refused")
						return
					}
				}
			})
		})
	}
}

// BenchmarkWaitHandoff is the blocking path: a producer and a consumer hand
// items through Queue(1), so nearly every operation waits for the other side.
func BenchmarkWaitHandoff(b *testing.B) {
	l := newLimiter(b, Queue(1))
	ctx := b.Context()
	b.ReportAllocs()
	var wg sync.WaitGroup
	wg.Go(func() {
		for range b.N {
			if err := l.WaitInsert(ctx, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
	for range b.N {
		if err := l.WaitSample(ctx, 1); err != nil {
			b.Error(err)
			break
		}
		l.Delete(1)
	}
	wg.Wait()
}
