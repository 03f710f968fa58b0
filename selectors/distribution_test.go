package selectors

import (
	"math"
	"math/rand/v2"
	"testing"
)

// chiSquareCritical holds the chi-square critical values at p = 0.001 by
// degrees of freedom: a correct sampler fails a test once in a thousand
// seeds, and every seed here is fixed.
var chiSquareCritical = map[int]float64{
	4: 18.467, 6: 22.458, 7: 24.322, 9: 27.877,
}

// checkDistribution draws n samples from s and checks, key by key, the
// reported probability against want (within 1e-12) and the counts against
// want with a chi-square test over the keys of positive probability. Keys
// of probability 0 must never be drawn.
func checkDistribution(t *testing.T, s Selector, want map[Key]float64, n int) {
	t.Helper()
	counts := make(map[Key]int, len(want))
	for range n {
		k, p, err := s.Sample()
		if err != nil {
			t.Fatalf("Sample: %v", err)
		}
		w, ok := want[k]
		if !ok {
			t.Fatalf("Sample returned unknown key %d", k)
		}
		if w == 0 {
			t.Fatalf("Sample returned key %d, whose probability is 0", k)
		}
		if math.Abs(p-w) > 1e-12 {
			t.Fatalf("Sample reported probability %v for key %d, want %v", p, k, w)
		}
		counts[k]++
	}
	var chi2 float64
	categories := 0
	for k, w := range want {
		if w == 0 {
			continue
		}
		categories++
		expected := w * float64(n)
		d := float64(counts[k]) - expected
		chi2 += d * d / expected
	}
	df := categories - 1
	critical, ok := chiSquareCritical[df]
	if !ok {
		t.Fatalf("no critical value for %d degrees of freedom", df)
	}
	t.Logf("chi-square = %.2f (df %d, critical %.3f)", chi2, df, critical)
	if chi2 > critical {
		t.Errorf("chi-square = %.2f > %.3f (df %d, p = 0.001); counts %v, want probabilities %v", chi2, critical, df, counts, want)
	}
}

func TestUniformDistribution(t *testing.T) {
	s := NewUniform(rand.New(rand.NewPCG(11, 12)))
	want := map[Key]float64{}
	for k := Key(100); k < 112; k++ {
		if err := s.Insert(k, float64(k)); err != nil {
			t.Fatal(err)
		}
	}
	// Deleting from the middle moves the last key: the draw must not care.
	for _, k := range []Key{100, 105} {
		if err := s.Delete(k); err != nil {
			t.Fatal(err)
		}
	}
	for k := Key(101); k < 112; k++ {
		if k != 105 {
			want[k] = 1.0 / 10
		}
	}
	checkDistribution(t, s, want, 100_000) // 10 keys: df 9
}

// prioritizedWant is p^α / Σ p^α, with α = 0 weighing everything 1 and an
// all-zero total meaning uniform.
func prioritizedWant(priorities map[Key]float64, exponent float64) map[Key]float64 {
	weights := make(map[Key]float64, len(priorities))
	var total float64
	for k, p := range priorities {
		w := math.Pow(p, exponent)
		weights[k] = w
		total += w
	}
	for k, w := range weights {
		if total == 0 {
			weights[k] = 1 / float64(len(weights))
		} else {
			weights[k] = w / total
		}
	}
	return weights
}

func TestPrioritizedDistribution(t *testing.T) {
	const n = 100_000
	initial := map[Key]float64{0: 0, 1: 1, 2: 2, 3: 3, 4: 0, 5: 5, 6: 0.5, 7: 10, 8: 0, 9: 4}
	// Then one zero becomes positive and one positive becomes zero, keeping
	// 7 positive keys.
	updates := map[Key]float64{0: 6, 7: 0, 3: 0.25}
	for _, exponent := range []float64{0, 0.6, 1} {
		s, err := NewPrioritized(exponent, rand.New(rand.NewPCG(21, uint64(exponent*10))))
		if err != nil {
			t.Fatal(err)
		}
		priorities := map[Key]float64{}
		for k := range Key(len(initial)) { // in key order, so the seeded run is reproducible
			if err := s.Insert(k, initial[k]); err != nil {
				t.Fatal(err)
			}
			priorities[k] = initial[k]
		}
		// α = 0: 10 keys, df 9; otherwise 7 positive keys, df 6.
		checkDistribution(t, s, prioritizedWant(priorities, exponent), n)
		for k, p := range updates {
			if err := s.Update(k, p); err != nil {
				t.Fatal(err)
			}
			priorities[k] = p
		}
		checkDistribution(t, s, prioritizedWant(priorities, exponent), n)
	}
}

func TestPrioritizedAllZeroIsUniform(t *testing.T) {
	for _, exponent := range []float64{0.6, 1} {
		s, _ := NewPrioritized(exponent, rand.New(rand.NewPCG(31, 32)))
		want := map[Key]float64{}
		for k := range Key(8) {
			if err := s.Insert(k, 0); err != nil {
				t.Fatal(err)
			}
			want[k] = 1.0 / 8
		}
		checkDistribution(t, s, want, 80_000) // 8 keys: df 7

		// Dropping to all zero after having had weight must be uniform too.
		if err := s.Update(3, 2); err != nil {
			t.Fatal(err)
		}
		if k, p, _ := s.Sample(); k != 3 || p != 1 {
			t.Fatalf("exponent %v: only key 3 has weight, got (%d, %v)", exponent, k, p)
		}
		if err := s.Update(3, 0); err != nil {
			t.Fatal(err)
		}
		checkDistribution(t, s, want, 80_000)
	}
}
