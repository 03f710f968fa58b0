package selectors

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"sync"
	"testing"
)

// exactPrec is the precision of the reference's arithmetic: far beyond
// float64's 53 bits, so that its rounding never shows in a comparison.
const exactPrec = 192

func newExact() *big.Float { return new(big.Float).SetPrec(exactPrec) }

// exactWeights caches exactWeight, whose series are slow: the model and
// fuzz tests draw their priorities from short lists.
var exactWeights = struct {
	sync.Mutex
	m map[[2]float64]*big.Float
}{m: map[[2]float64]*big.Float{}}

func cachedWeight(p, a float64) *big.Float {
	exactWeights.Lock()
	defer exactWeights.Unlock()
	w, ok := exactWeights.m[[2]float64{p, a}]
	if !ok {
		w = exactWeight(p, a)
		exactWeights.m[[2]float64{p, a}] = w
	}
	return w
}

// exactWeight is the spec of Prioritized's weight, p^a, with 0 weighing 0
// even when a = 0 (so a = 0 weighs every positive priority 1), computed in math/big: exactly for a whole a, from square roots
// (to 192 bits) for a multiple of 1/4, and otherwise as e^(a·ln p) from
// series (to about 180 bits).
func exactWeight(p, a float64) *big.Float {
	x := newExact().SetFloat64(p)
	switch {
	case p == 0:
		return newExact()
	case a == 0:
		return newExact().SetInt64(1)
	case a*4 != math.Trunc(a*4) || a > 16:
		return bigExp(newExact().Mul(newExact().SetFloat64(a), bigLog(x)))
	}
	w := newExact().SetInt64(1)
	for range int(a) {
		w.Mul(w, x)
	}
	half := newExact().Sqrt(x)
	quarter := newExact().Sqrt(half)
	switch math.Mod(a, 1) {
	case 0.25:
		w.Mul(w, quarter)
	case 0.5:
		w.Mul(w, half)
	case 0.75:
		w.Mul(w, half).Mul(w, quarter)
	}
	return w
}

// bigLn2 is ln 2 = 2·atanh(1/3).
var bigLn2 = bigAtanh2(newExact().Quo(newExact().SetInt64(1), newExact().SetInt64(3)))

// bigAtanh2 is 2·atanh(z) = 2·Σ z^(2j+1)/(2j+1), for |z| <= 1/3.
func bigAtanh2(z *big.Float) *big.Float {
	sum, term, z2 := newExact(), newExact().Set(z), newExact().Mul(z, z)
	eps := newExact().SetMantExp(big.NewFloat(1), -exactPrec)
	for j := int64(0); ; j++ {
		t := newExact().Quo(term, newExact().SetInt64(2*j+1))
		sum.Add(sum, t)
		if t.Abs(t).Cmp(eps) < 0 {
			return sum.Mul(sum, newExact().SetInt64(2))
		}
		term.Mul(term, z2)
	}
}

// bigLog is ln x for x > 0: x = m·2^e with m in [0.5, 1), and
// ln m = 2·atanh((m-1)/(m+1)), whose argument lies in [-1/3, 0).
func bigLog(x *big.Float) *big.Float {
	m := newExact()
	e := x.MantExp(m)
	z := newExact().Quo(newExact().Sub(m, big.NewFloat(1)), newExact().Add(m, big.NewFloat(1)))
	return newExact().Add(bigAtanh2(z), newExact().Mul(newExact().SetInt64(int64(e)), bigLn2))
}

// bigExp is e^y: y = n·ln 2 + r with r in [0, ln 2), and e^r = Σ r^j/j!.
func bigExp(y *big.Float) *big.Float {
	n, _ := newExact().Quo(y, bigLn2).Int64()
	if newExact().Quo(y, bigLn2).Sign() < 0 {
		n-- // Int64 truncates toward 0
	}
	r := newExact().Sub(y, newExact().Mul(newExact().SetInt64(n), bigLn2))
	sum, term := newExact().SetInt64(1), newExact().SetInt64(1)
	eps := newExact().SetMantExp(big.NewFloat(1), -exactPrec)
	for j := int64(1); term.Cmp(eps) >= 0; j++ {
		term.Mul(term, r).Quo(term, newExact().SetInt64(j))
		sum.Add(sum, term)
	}
	return sum.SetMantExp(sum, int(n))
}

// exactProbabilities is each key's probability, p^a/Σp^a (uniform when the
// sum is 0), computed in math/big and then rounded to a float64.
func exactProbabilities(priorities map[Key]float64, a float64) map[Key]float64 {
	weights := make(map[Key]*big.Float, len(priorities))
	total := newExact()
	for k, p := range priorities {
		w := cachedWeight(p, a)
		weights[k] = w
		total.Add(total, w)
	}
	probs := make(map[Key]float64, len(priorities))
	for k, w := range weights {
		if total.Sign() == 0 {
			probs[k] = 1 / float64(len(weights))
			continue
		}
		probs[k], _ = newExact().Quo(w, total).Float64()
	}
	return probs
}

// probabilityUlps is how far a probability may be from the exact one: the
// weight's own rounding (math.Pow, or the logarithm beyond its range), the
// tree's sums and the division each add an ulp or two.
const probabilityUlps = 8

// ulpsApart is the distance from got to want in units of the last place of
// want, the subnormals' spacing counting as the unit below them.
func ulpsApart(got, want float64) float64 {
	ulp := math.Nextafter(math.Abs(want), math.Inf(1)) - math.Abs(want)
	return math.Abs(got-want) / ulp
}

// probabilities is the probability with which s draws each key, as Sample
// reports it.
func probabilities(s *prioritized) map[Key]float64 {
	probs := make(map[Key]float64, s.Len())
	v := s.view()
	if v.top == nil {
		for _, k := range s.base.keys {
			probs[k] = 1 / float64(len(s.base.keys))
		}
		return probs
	}
	for i, k := range s.base.keys {
		probs[k] = v.probability(&s.base, i)
	}
	for _, b := range s.order {
		for i, k := range b.keys {
			probs[k] = v.probability(b, i)
		}
	}
	return probs
}

// checkExact compares every key's probability in s with the exact one, and
// their sum with 1.
func checkExact(t *testing.T, sel Selector, priorities map[Key]float64) {
	t.Helper()
	if err := checkProbabilities(sel.(*prioritized), priorities); err != nil {
		t.Fatal(err)
	}
}

// checkProbabilities checks the internals of s, that each key's leaf is what
// its priority alone makes it, that each key's probability is within
// probabilityUlps of the exact one, and that they add up to 1.
func checkProbabilities(s *prioritized, priorities map[Key]float64) error {
	if err := checkSumTree(s); err != nil {
		return err
	}
	if s.Len() != len(priorities) {
		return fmt.Errorf("Len = %d, want %d", s.Len(), len(priorities))
	}
	for k, p := range priorities {
		id, leaf := s.place(p)
		var got float64
		if i, ok := s.index[k]; ok && id == 0 {
			got = s.base.levels[0][i]
		} else if f, ok := s.far[k]; ok && f.band.id == id {
			got = f.band.levels[0][f.leaf]
		} else {
			return fmt.Errorf("key %d of priority %v is not in band %d", k, p, id)
		}
		if math.Float64bits(got) != math.Float64bits(leaf) {
			return fmt.Errorf("key %d of priority %v has leaf %v, want %v", k, p, got, leaf)
		}
	}
	want := exactProbabilities(priorities, s.exponent)
	got := probabilities(s)
	var sum float64
	for k, w := range want {
		g := got[k]
		if d := ulpsApart(g, w); d > probabilityUlps {
			return fmt.Errorf("probability of key %d (priority %v^%v) = %v, want %v: %.1f ulps apart", k, priorities[k], s.exponent, g, w, d)
		}
		sum += g
	}
	if len(want) > 0 && math.Abs(sum-1) > float64(len(want)+1)*probabilityUlps*0x1p-53 {
		return fmt.Errorf("probabilities of %d keys add up to %v", len(want), sum)
	}
	return nil
}

// TestExactReference checks the reference's series against its square roots.
func TestExactReference(t *testing.T) {
	for _, p := range []float64{5e-324, 1e-300, 0.3, 1, 2, 7.25, 1e200, math.MaxFloat64} {
		for _, a := range []float64{0.5, 1.5, 3} {
			series := bigExp(newExact().Mul(newExact().SetFloat64(a), bigLog(newExact().SetFloat64(p))))
			roots := exactWeight(p, a)
			d := newExact().Quo(newExact().Sub(series, roots), roots)
			if d.Abs(d).Cmp(newExact().SetMantExp(big.NewFloat(1), -170)) > 0 {
				t.Errorf("%v^%v: series %v, square roots %v", p, a, series, roots)
			}
		}
	}
}

// TestZeroPriorityAtExponentZero pins Reverb's rule that a priority of 0 has
// probability 0 at every exponent, 0 included: at exponent 0 the positive
// priorities share the draw equally, and only an all-zero table is uniform.
func TestZeroPriorityAtExponentZero(t *testing.T) {
	s, err := NewPrioritized(0, rand.New(rand.NewPCG(3, 4)))
	if err != nil {
		t.Fatal(err)
	}
	priorities := map[Key]float64{1: 0, 2: 1, 3: 2e300, 4: 0, 5: 5e-324}
	for k := Key(1); k <= 5; k++ {
		if err := s.Insert(k, priorities[k]); err != nil {
			t.Fatal(err)
		}
	}
	checkExact(t, s, priorities)
	for range 1000 {
		k, p, err := s.Sample()
		if err != nil || priorities[k] == 0 || p != 1.0/3 {
			t.Fatalf("Sample = key %d (priority %v), probability %v, %v; want a positive priority at exactly 1/3", k, priorities[k], p, err)
		}
	}
	for _, k := range []Key{2, 3, 5} {
		if err := s.Update(k, 0); err != nil {
			t.Fatal(err)
		}
		priorities[k] = 0
	}
	checkExact(t, s, priorities)
	if _, p, err := s.Sample(); err != nil || p != 1.0/5 {
		t.Fatalf("all zero: probability %v, %v; want uniform 1/5", p, err)
	}
}
