package tables

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

var fuzzKinds = []selectors.Kind{selectors.KindFifo, selectors.KindLifo, selectors.KindUniform,
	selectors.KindPrioritized, selectors.KindMaxHeap, selectors.KindMinHeap}

// fuzzPriorities mixes the ordinary, the invalid and the extreme: powers
// and sums of these overflow or underflow float64.
var fuzzPriorities = []float64{0, 1, 2, 0.5, 7, math.NaN(), -1, math.Inf(1),
	1e308, math.MaxFloat64, 1e300, 1e-300, 5e-324, 1e-323, 3, math.Copysign(0, -1)}

var fuzzExponents = []float64{0.8, 1, 3}

// FuzzTable runs byte-coded operations, valid and not, on a small table and
// checks after each that nothing panicked, the table stays within max_size,
// the limiter's count matches its size, and the store's reference counts are
// exactly what the items hold. At the end a snapshot must restore to an
// identical table.
func FuzzTable(f *testing.F) {
	f.Add([]byte{0, 0, 3, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{4, 5, 2, 0, 2, 0, 9, 0, 8, 1, 7, 2, 30, 3, 1, 4, 2, 5, 6, 6, 0, 7})
	f.Add([]byte{2, 0, 5, 2, 3, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130})
	// Prioritized sampler and remover at exponent 1, max_size 3: inserts of
	// MaxFloat64 and 1e308, a Mutate to MaxFloat64, samples, an eviction.
	f.Add([]byte{9, 9, 2, 0, 63, 1, 56, 9, 63, 2, 3, 9, 2, 3, 56, 15, 2, 3})
	f.Fuzz(fuzzTable)
}

func fuzzTable(t *testing.T, data []byte) {
	if len(data) < 4 {
		return
	}
	limiters := []limiter.Config{limiter.MinSize(1), limiter.MinSize(3), limiter.Queue(4), {SamplesPerInsert: 1.5, MinSize: 2, MinDiff: 0, MaxDiff: 4}}
	cfg := Config{
		Name:            "fuzz",
		Sampler:         selectors.Options{Kind: fuzzKinds[int(data[0])%len(fuzzKinds)], Exponent: fuzzExponents[int(data[0]/6)%len(fuzzExponents)]},
		Remover:         selectors.Options{Kind: fuzzKinds[int(data[1])%len(fuzzKinds)], Exponent: fuzzExponents[int(data[1]/6)%len(fuzzExponents)]},
		MaxSize:         1 + int64(data[2]%6),
		MaxTimesSampled: int32(data[3] % 4),
		Limiter:         limiters[int(data[3]/4)%len(limiters)],
	}
	store := NewChunkStore()
	for k := range ChunkKey(5) {
		putChunk(store, k, 3, int(k)+1)
	}
	tb, err := New(cfg, store, WithRand(rand.New(rand.NewPCG(1, 1))))
	if cfg.Limiter.MinSize > cfg.MaxSize {
		if !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("New accepted min_size %d > max_size %d: %v", cfg.Limiter.MinSize, cfg.MaxSize, err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	ops := data[4:]
	for i := 0; i+1 < len(ops); i += 2 {
		op, arg := ops[i], ops[i+1]
		key := uint64(arg % 16)
		switch op % 7 {
		case 0, 1:
			// Chunk keys 5 and 6 are missing; offsets and lengths
			// may fall outside the 3-step chunks.
			it := Item{Key: key, Priority: fuzzPriorities[op/7%16], Trajectory: []Column{{
				Name:   "obs",
				Slices: []Slice{{Chunk: ChunkKey(arg % 7), Offset: int32(op/56) - 1, Length: int32(arg/7%4) + int32(op%2)}},
			}}}
			err := tb.Insert(expired(), it)
			if err != nil && !errors.Is(err, limiter.ErrRateLimited) && !errors.Is(err, ErrInvalidItem) &&
				!errors.Is(err, ErrChunkMissing) && !errors.Is(err, ErrInvalidPriority) {
				t.Fatalf("insert %+v: unexpected error %v", it, err)
			}
		case 2:
			ss, err := tb.Sample(expired(), int(arg%4))
			if err != nil && !errors.Is(err, limiter.ErrRateLimited) && !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("sample: unexpected error %v", err)
			}
			for _, s := range ss {
				if m := tb.Info().Config.MaxTimesSampled; m > 0 && s.Info.TimesSampled >= m && len(tb.Get(s.Info.Key)) > 0 {
					t.Fatalf("item %d sampled %d times is still in the table (max %d)", s.Info.Key, s.Info.TimesSampled, m)
				}
			}
		case 3:
			if _, err := tb.Mutate([]Mutation{{Key: key, Priority: fuzzPriorities[arg%16]}, {Key: key + 1, Delete: arg&8 != 0}}); err != nil && !errors.Is(err, ErrInvalidPriority) {
				t.Fatalf("mutate: %v", err)
			}
		case 4:
			tb.Delete(key)
		case 5:
			lim := limiters[arg%4]
			if err := tb.Reconfigure(lim, int32(arg/4%4)); (err != nil) != (lim.MinSize > cfg.MaxSize) {
				t.Fatalf("Reconfigure(%+v) with max_size %d: %v", lim, cfg.MaxSize, err)
			}
		default:
			if arg%8 == 0 {
				tb.Reset()
			}
		}
		info := tb.Info()
		if info.Size > cfg.MaxSize || info.Size != info.Limiter.Inserts-info.Limiter.Deletes {
			t.Fatalf("after op %d/%d: size %d, max %d, limiter %+v", op, arg, info.Size, cfg.MaxSize, info.Limiter)
		}
		checkRefs(t, store, 1, tb)
	}
	snap := tb.Snapshot()
	restored, err := NewFromSnapshot(snap, store)
	if err != nil {
		t.Fatal(err)
	}
	if again := restored.Snapshot(); !sameSnapshot(again, snap) {
		t.Fatalf("restored snapshot differs:\n got %+v\nwant %+v", again, snap)
	}
	checkRefs(t, store, 1, tb, restored)
}
