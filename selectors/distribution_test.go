package selectors

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// chiSquareCritical holds the chi-square critical values at p = 0.001 by
// degrees of freedom: a correct sampler fails a test once in a thousand
// seeds, and every seed here is fixed.
var chiSquareCritical = map[int]float64{
	1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 6: 22.458, 7: 24.322, 9: 27.877,
}

// checkDistribution draws n samples from s and checks, key by key, the
// reported probability against want (within 1e-12) and the counts against
// want with a chi-square test over the keys of positive probability. Keys
// of probability 0 must never be drawn; with one key of positive probability
// every draw must be that key.
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
	if df == 0 {
		return
	}
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

// prioritizedWant is p^α / Σ p^α, with a zero priority weighing 0 at every
// α (α = 0 weighs the others 1) and an all-zero total meaning uniform.
func prioritizedWant(priorities map[Key]float64, exponent float64) map[Key]float64 {
	weights := make(map[Key]float64, len(priorities))
	var total float64
	for k, p := range priorities {
		var w float64
		if p != 0 {
			w = math.Pow(p, exponent) // math.Pow(0, 0) is 1
		}
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
		// 7 positive keys, df 6, at every α.
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

// observable is want with the probabilities no run of n draws can tell from
// 0 set to 0: those keys must then never be drawn.
func observable(want map[Key]float64, n int) map[Key]float64 {
	out := make(map[Key]float64, len(want))
	for k, w := range want {
		if w*float64(n) >= 1e-6 {
			out[k] = w
		}
	}
	return out
}

// TestPrioritizedExtremeDistribution draws from selectors whose weights, or
// their sums, lie beyond float64's range, and from some whose keys span two
// bands. Every key's probability, drawn or not, must be within a few ulps
// of the exact one.
func TestPrioritizedExtremeDistribution(t *testing.T) {
	tests := []struct {
		name       string
		exponent   float64
		priorities map[Key]float64
	}{
		// 1 has probability 5e-309: positive, but never drawn.
		{"twice 1e308 and 1", 1, map[Key]float64{0: 1e308, 1: 1e308, 2: 1}},
		{"1e300 at 1.5", 1.5, map[Key]float64{0: 1e300, 1: 2e300, 2: 1, 3: 0}},
		{"1e308 at 3", 3, map[Key]float64{0: 1e308, 1: 1e-300, 2: 1, 3: 2, 4: 0}},
		{"subnormals", 1, map[Key]float64{0: 5e-324, 1: 1e-323, 2: 0}},
		{"subnormals at 1.5", 1.5, map[Key]float64{0: 5e-324, 1: 1e-323, 2: 0}},
		{"subnormals at 3", 3, map[Key]float64{0: 5e-324, 1: 1e-323, 2: 0, 3: 0x1p-1050}},
		// Two keys on each side of the boundary between bands 0 and 1,
		// with shares 4, 3, 1 and 1.5 in 9.5.
		{"across two bands", 1, map[Key]float64{0: 0x1p769, 1: 0x1.8p768, 2: 0x1p767, 3: 0x1.8p767}},
		// Bands 1, 0 and -1: only the top one is ever drawn from.
		{"across three bands", 1, map[Key]float64{0: math.MaxFloat64, 1: 1, 2: 5e-324, 3: 1e-300, 4: 1e300}},
	}
	const n = 100_000
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := NewPrioritized(tt.exponent, rand.New(rand.NewPCG(51, uint64(i))))
			for k := range Key(len(tt.priorities)) {
				if err := s.Insert(k, tt.priorities[k]); err != nil {
					t.Fatal(err)
				}
			}
			checkExact(t, s, tt.priorities)
			checkDistribution(t, s, observable(exactProbabilities(tt.priorities, tt.exponent), n), n)
		})
	}
}

// TestPrioritizedHugeComesAndGoes gives a key a priority whose weight swamps
// every other and takes it back, by update and by delete: the small keys'
// probabilities must come back exactly as they were.
func TestPrioritizedHugeComesAndGoes(t *testing.T) {
	const n = 100_000
	small := map[Key]float64{0: 1, 1: 2, 2: 3, 3: 4}
	for _, exponent := range []float64{1, 1.5, 3} {
		s, _ := NewPrioritized(exponent, rand.New(rand.NewPCG(61, uint64(exponent*2))))
		priorities := map[Key]float64{}
		for k := range Key(len(small)) {
			if err := s.Insert(k, small[k]); err != nil {
				t.Fatal(err)
			}
			priorities[k] = small[k]
		}
		want := exactProbabilities(priorities, exponent)

		if err := s.Update(1, 1e308); err != nil {
			t.Fatal(err)
		}
		priorities[1] = 1e308
		checkExact(t, s, priorities)
		checkDistribution(t, s, observable(exactProbabilities(priorities, exponent), n), n)
		if err := s.Update(1, 2); err != nil {
			t.Fatal(err)
		}
		priorities[1] = 2
		checkExact(t, s, priorities)
		checkDistribution(t, s, want, n)
		assertFreshTree(t, s, priorities)

		// A huge key and a tiny one (1e-900 at exponent 3) come in, and the
		// huge one leaves.
		for k, p := range map[Key]float64{4: 1e308, 5: 1e-300} {
			if err := s.Insert(k, p); err != nil {
				t.Fatal(err)
			}
			priorities[k] = p
		}
		checkExact(t, s, priorities)
		checkDistribution(t, s, observable(exactProbabilities(priorities, exponent), n), n)
		if err := s.Delete(4); err != nil {
			t.Fatal(err)
		}
		delete(priorities, 4)
		checkExact(t, s, priorities)
		checkDistribution(t, s, observable(exactProbabilities(priorities, exponent), n), n)
		if err := s.Delete(5); err != nil {
			t.Fatal(err)
		}
		delete(priorities, 5)
		checkDistribution(t, s, want, n)
		assertFreshTree(t, s, priorities)
	}
}

// assertFreshTree requires sel to hold nothing outside its base band, and
// that band's nodes to be, bit for bit, those of a new selector given the
// same priorities in the same leaf order.
func assertFreshTree(t *testing.T, sel Selector, priorities map[Key]float64) {
	t.Helper()
	s := sel.(*prioritized)
	if len(s.order) != 0 {
		t.Fatalf("%d bands besides the base band", len(s.order))
	}
	f, _ := NewPrioritized(s.exponent, nil)
	fresh := f.(*prioritized)
	for _, k := range s.base.keys {
		if err := fresh.Insert(k, priorities[k]); err != nil {
			t.Fatal(err)
		}
	}
	same := func(x, y float64) bool { return math.Float64bits(x) == math.Float64bits(y) }
	if !same(s.base.total, fresh.base.total) {
		t.Fatalf("total %v, fresh tree %v", s.base.total, fresh.base.total)
	}
	for l := range s.base.levels {
		if !slices.EqualFunc(s.base.levels[l], fresh.base.levels[l], same) {
			t.Fatalf("level %d: %v, fresh tree %v", l, s.base.levels[l], fresh.base.levels[l])
		}
	}
}

// TestPrioritizedSampleProbabilityUlps checks the probability Sample reports
// against the exact one, for random mixes of priorities over the whole of
// float64's range, subnormals and zeros included.
func TestPrioritizedSampleProbabilityUlps(t *testing.T) {
	rng := rand.New(rand.NewPCG(71, 72))
	worst := 0.0
	for _, exponent := range []float64{0.6, 1, 1.5, 3} {
		for run := range 20 {
			s, _ := NewPrioritized(exponent, rand.New(rand.NewPCG(73, uint64(run))))
			priorities := map[Key]float64{}
			// Priorities spread over a span of 2^span, so that some runs
			// sit in one band and others straddle several.
			span := 1 + rng.IntN(2100)
			low := -1074 + rng.IntN(2098-span+1)
			for k := range Key(1 + rng.IntN(60)) {
				p := math.Ldexp(1+rng.Float64(), low+rng.IntN(span))
				if rng.IntN(8) == 0 {
					p = 0
				}
				if err := s.Insert(k, p); err != nil {
					t.Fatal(err)
				}
				priorities[k] = p
			}
			want := exactProbabilities(priorities, exponent)
			for range 2000 {
				k, p, err := s.Sample()
				if err != nil {
					t.Fatal(err)
				}
				d := ulpsApart(p, want[k])
				if d > probabilityUlps {
					t.Fatalf("exponent %v, priorities %v: Sample = (%d, %v), want probability %v: %.1f ulps apart", exponent, priorities, k, p, want[k], d)
				}
				worst = max(worst, d)
			}
		}
	}
	t.Logf("worst: %.2f ulps", worst)
}
