package selectors

import (
	"math"
	"math/rand/v2"
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
