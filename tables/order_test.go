package tables

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

// TestUniformDrawsAsSelectorsUniform checks that a table's own Uniform
// sampler and remover draw, key for key, what selectors.NewUniform draws
// from the same random source, through inserts, evictions, samples of up
// to 4 items, deletes and a reset: with max_times_sampled, where a sample
// may remove its item before the next draw, and without, where a request
// draws all its items before it reads any.
func TestUniformDrawsAsSelectorsUniform(t *testing.T) {
	for _, maxTimes := range []int32{3, 0} {
		t.Run(fmt.Sprintf("max_times_sampled=%d", maxTimes), func(t *testing.T) { testUniformDraws(t, maxTimes) })
	}
}

func testUniformDraws(t *testing.T, maxTimes int32) {
	const maxSize = 20
	store := NewChunkStore()
	putChunk(store, 1, 1, 8)
	cfg := config("u", selectors.KindUniform, selectors.KindUniform, maxSize, limiter.MinSize(1))
	cfg.MaxTimesSampled = maxTimes
	tb := mustNew(t, cfg, store, WithRand(rand.New(rand.NewPCG(3, 4))))

	shared := rand.New(rand.NewPCG(3, 4))
	sampler, remover := selectors.NewUniform(shared), selectors.NewUniform(shared)
	times := map[uint64]int32{}
	remove := func(key uint64) {
		if err := sampler.Delete(key); err != nil {
			t.Fatal(err)
		}
		if err := remover.Delete(key); err != nil {
			t.Fatal(err)
		}
		delete(times, key)
	}
	present := func(key uint64) bool { _, ok := times[key]; return ok }
	ops := rand.New(rand.NewPCG(5, 6))
	next := uint64(0)
	for step := range 5000 {
		switch r := ops.IntN(100); {
		case r < 55:
			next++
			mustInsert(t, tb, newItem(next, 1, 1))
			if err := sampler.Insert(next, 1); err != nil {
				t.Fatal(err)
			}
			if err := remover.Insert(next, 1); err != nil {
				t.Fatal(err)
			}
			times[next] = 0
			if len(times) > maxSize {
				victim, _, err := remover.Sample()
				if err != nil {
					t.Fatal(err)
				}
				remove(victim)
			}
		case r < 90:
			if len(times) == 0 {
				continue
			}
			n := 1 + ops.IntN(4)
			got, err := tb.Sample(expired(), n)
			i := 0
			for ; i < n && len(times) > 0; i++ {
				if i >= len(got) {
					t.Fatalf("step %d: %d of %d samples, the table holds %d items", step, len(got), n, len(times))
				}
				key, prob, err := sampler.Sample()
				if err != nil {
					t.Fatal(err)
				}
				times[key]++
				if g := got[i].Info; g.Key != key || g.Probability != prob || g.TimesSampled != times[key] {
					t.Fatalf("step %d: sample %d of %d is key %d with probability %v, sampled %d times; selectors.NewUniform draws %d with %v, sampled %d times",
						step, i, n, g.Key, g.Probability, g.TimesSampled, key, prob, times[key])
				}
				if maxTimes > 0 && times[key] >= maxTimes {
					remove(key)
				}
			}
			if len(got) != i || (i == n) != (err == nil) {
				t.Fatalf("step %d: %d of %d samples (%v), want %d", step, len(got), n, err, i)
			}
		case r < 99:
			if len(times) == 0 {
				continue
			}
			key := next
			for !present(key) {
				key = 1 + ops.Uint64N(next)
			}
			if missing := tb.Delete(key); len(missing) > 0 {
				t.Fatalf("step %d: delete %d: missing", step, key)
			}
			remove(key)
		default:
			tb.Reset()
			for key := range times {
				remove(key)
			}
		}
		if got := tb.Size(); got != int64(len(times)) {
			t.Fatalf("step %d: table holds %d items, the model %d", step, got, len(times))
		}
	}
}

// TestAppendSamplesReportsStateAfter: the state AppendSamples returns is
// the table's right after its samples, items that reached
// max_times_sampled gone, as a later Weight reads it.
func TestAppendSamplesReportsStateAfter(t *testing.T) {
	store := NewChunkStore()
	putChunk(store, 1, 1, 8)
	cfg := config("s", selectors.KindPrioritized, selectors.KindFifo, 100, limiter.MinSize(1))
	cfg.MaxTimesSampled = 1
	tb := mustNew(t, cfg, store)
	for k := range uint64(10) {
		mustInsert(t, tb, newItem(k+1, float64(k+1), 1))
	}
	got, state, err := tb.AppendSamples(testCtx(t), nil, 3, 3)
	if err != nil || len(got) != 3 {
		t.Fatalf("AppendSamples(nil, 3, 3): %d samples, %v", len(got), err)
	}
	weight, size := tb.Weight()
	if state.Size != 7 || size != 7 || state.Weight != weight {
		t.Errorf("state %+v, table size %d and weight %+v after: want 7 items and the same weight", state, size, weight)
	}
	var left float64
	for _, it := range mustList(t, tb, 0, 100) {
		left += it.Priority
	}
	if w := state.Weight.Float64(); w != left {
		t.Errorf("state weight %v, want the sum of the priorities left, %v", w, left)
	}
	first := []SampleInfo{got[0].Info, got[1].Info, got[2].Info}
	more, state, err := tb.AppendSamples(testCtx(t), got, 2, 2)
	if err != nil || len(more) != 5 || more[0].Info != first[0] || more[1].Info != first[1] || more[2].Info != first[2] {
		t.Fatalf("AppendSamples(3 samples, 2, 2) = %d samples, %v: want the 3 given, then 2 more", len(more), err)
	}
	if state.Size != 5 {
		t.Errorf("state %+v after 2 more samples, want 5 items", state)
	}
	for _, c := range [][2]int{{0, 1}, {2, 1}} {
		_, _, err := tb.AppendSamples(testCtx(t), nil, c[0], c[1])
		wantErr(t, err, []error{ErrInvalidArgument}, "least", "most")
	}
}

// TestAppendSamplesWithinAsksWhenItTakes: the caller's bound is asked
// before every round of samples, with the largest item the table holds
// then: a request that waited is held to the items that came meanwhile,
// and one refused takes nothing.
func TestAppendSamplesWithinAsksWhenItTakes(t *testing.T) {
	store := NewChunkStore()
	putChunk(store, 1, 1, 8)
	store.Put(&Chunk{Key: 2, Format: &Format{DType: "float32", Shape: []int64{200}, StepBytes: 800}, Length: 1, Data: make([]byte, 800)})
	tb := mustNew(t, config("s", selectors.KindUniform, selectors.KindFifo, 100, limiter.MinSize(2)), store)
	fits := func(largestBytes, _ int64) bool { return largestBytes < 800 }
	mustInsert(t, tb, newItem(1, 1, 1))
	done := make(chan error, 1)
	go func() {
		_, _, err := tb.AppendSamplesWithin(testCtx(t), nil, 2, 2, fits)
		done <- err
	}()
	waitFor(t, "the request waits for the limiter", func() bool { return tb.Counters().SampleWaits > 0 })
	mustInsert(t, tb, newItem(2, 1, 2))
	if err := <-done; !errors.Is(err, ErrTooMany) {
		t.Fatalf("a request that waited for an item over its bound: %v, want ErrTooMany", err)
	}
	if n := tb.Counters().Samples; n != 0 {
		t.Errorf("the table counted %d samples, want none", n)
	}
}
