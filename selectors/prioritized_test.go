package selectors

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSumTreeDoesNotDrift makes millions of updates with weights spanning
// many orders of magnitude, the workload under which a tree maintained by
// adding deltas loses its small weights to rounding, and then requires the
// root to equal a fresh recomputation bit for bit.
func TestSumTreeDoesNotDrift(t *testing.T) {
	const keys = 1000
	updates := 2_000_000
	if testing.Short() {
		updates = 200_000
	}
	const exponent = 0.6
	rng := rand.New(rand.NewPCG(41, 42))
	sel, _ := NewPrioritized(exponent, rand.New(rand.NewPCG(43, 44)))
	s := sel.(*prioritized)
	priorities := make(map[Key]float64, keys)
	randomPriority := func() float64 {
		if rng.IntN(10) == 0 {
			return 0
		}
		return math.Exp(rng.Float64()*80 - 40)
	}
	for k := range Key(keys) {
		p := randomPriority()
		if err := s.Insert(k, p); err != nil {
			t.Fatal(err)
		}
		priorities[k] = p
	}
	for i := range updates {
		k := Key(rng.IntN(keys))
		p := randomPriority()
		// Some churn, so that keys also move between leaves.
		if i%100 == 0 {
			if err := s.Delete(k); err != nil {
				t.Fatal(err)
			}
			if err := s.Insert(k, p); err != nil {
				t.Fatal(err)
			}
		} else if err := s.Update(k, p); err != nil {
			t.Fatal(err)
		}
		priorities[k] = p
	}
	// Finish with every key tiny: drift would now dwarf the true total.
	for k := range Key(keys) {
		p := 1e-30 * float64(k+1)
		if err := s.Update(k, p); err != nil {
			t.Fatal(err)
		}
		priorities[k] = p
	}

	if err := checkSumTree(s); err != nil {
		t.Fatal(err)
	}
	// A new selector fed the same weights in the same leaf order.
	fresh, _ := NewPrioritized(exponent, nil)
	for _, k := range s.base.keys {
		if err := fresh.Insert(k, priorities[k]); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := s.base.total, fresh.(*prioritized).base.total; math.Float64bits(got) != math.Float64bits(want) {
		t.Fatalf("root %v after updates, fresh tree %v", got, want)
	}
	// And independently of the tree's order of summation.
	var total float64
	for _, p := range priorities {
		total += math.Pow(p, exponent)
	}
	if math.Abs(s.base.total-total) > 1e-12*total {
		t.Fatalf("root %v, sum of weights %v", s.base.total, total)
	}
	for range 10_000 {
		k, p, err := s.Sample()
		if err != nil {
			t.Fatal(err)
		}
		if want := math.Pow(priorities[k], exponent) / total; math.Abs(p-want) > 1e-12*want {
			t.Fatalf("probability of key %d = %v, want %v", k, p, want)
		}
	}
}

// TestBandsDoNotDrift is TestSumTreeDoesNotDrift over priorities spanning
// all of float64, so that keys keep moving between bands: every band must
// end up bit for bit what a new selector builds from the same leaves.
func TestBandsDoNotDrift(t *testing.T) {
	const keys = 300
	updates := 300_000
	if testing.Short() {
		updates = 30_000
	}
	const exponent = 1.5
	rng := rand.New(rand.NewPCG(45, 46))
	sel, _ := NewPrioritized(exponent, rand.New(rand.NewPCG(47, 48)))
	s := sel.(*prioritized)
	priorities := make(map[Key]float64, keys)
	randomPriority := func() float64 {
		if rng.IntN(10) == 0 {
			return 0
		}
		return math.Ldexp(1+rng.Float64(), rng.IntN(2098)-1074)
	}
	for k := range Key(keys) {
		p := randomPriority()
		if err := s.Insert(k, p); err != nil {
			t.Fatal(err)
		}
		priorities[k] = p
	}
	for i := range updates {
		k := Key(rng.IntN(keys))
		p := randomPriority()
		if i%100 == 0 {
			if err := s.Delete(k); err != nil {
				t.Fatal(err)
			}
			if err := s.Insert(k, p); err != nil {
				t.Fatal(err)
			}
		} else if err := s.Update(k, p); err != nil {
			t.Fatal(err)
		}
		priorities[k] = p
	}
	if len(s.order) < 2 {
		t.Fatalf("%d bands besides the base band: the test no longer spans bands", len(s.order))
	}
	checkExact(t, s, priorities)

	f, _ := NewPrioritized(exponent, nil)
	fresh := f.(*prioritized)
	bands := append([]*band{&s.base}, s.order...)
	for _, b := range bands {
		for _, k := range b.keys {
			if err := fresh.Insert(k, priorities[k]); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, b := range bands {
		fb := &fresh.base
		if b.id != 0 {
			fb = fresh.bands[b.id]
		}
		if !slices.Equal(b.keys, fb.keys) || math.Float64bits(b.total) != math.Float64bits(fb.total) {
			t.Fatalf("band %d: total %v after updates, fresh tree %v", b.id, b.total, fb.total)
		}
	}
}

// TestPrioritizedHugeOutlierIsLocal alternates inserting and deleting a
// priority whose weight is 2^3072 times the others'. No operation may touch
// the other keys' tree (a rescaled tree would cost O(n) each time), and the
// alternation must not allocate.
func TestPrioritizedHugeOutlierIsLocal(t *testing.T) {
	const n = 10_000
	sel, _ := NewPrioritized(3, rand.New(rand.NewPCG(49, 50)))
	s := sel.(*prioritized)
	for k := range Key(n) {
		if err := s.Insert(k, priorityOf(int(k))); err != nil {
			t.Fatal(err)
		}
	}
	before := make([][]float64, len(s.base.levels))
	for l, level := range s.base.levels {
		before[l] = slices.Clone(level)
	}
	alternate := func() {
		if err := s.Insert(n, 1e308); err != nil {
			t.Fatal(err)
		}
		if k, p, err := s.Sample(); err != nil || k != n || p != 1 {
			t.Fatalf("Sample = (%d, %v, %v), want (%d, 1)", k, p, err, n)
		}
		if err := s.Delete(n); err != nil {
			t.Fatal(err)
		}
	}
	if allocs := testing.AllocsPerRun(1000, alternate); allocs != 0 {
		t.Errorf("%v allocations per insert, sample and delete of the outlier", allocs)
	}
	for l := range before {
		if !slices.Equal(s.base.levels[l], before[l]) {
			t.Fatalf("level %d of the base band changed", l)
		}
	}
	if err := checkSumTree(s); err != nil {
		t.Fatal(err)
	}
}
