package selectors

import (
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var allOptions = []Options{
	{Kind: KindFifo},
	{Kind: KindLifo},
	{Kind: KindUniform},
	{Kind: KindPrioritized, Exponent: 0.6},
	{Kind: KindPrioritized},
	{Kind: KindMaxHeap},
	{Kind: KindMinHeap},
}

func mustNew(t *testing.T, o Options, seed uint64) Selector {
	t.Helper()
	s, err := New(o, rand.New(rand.NewPCG(seed, seed)))
	if err != nil {
		t.Fatalf("New(%v): %v", o, err)
	}
	return s
}

type entry struct {
	key      Key
	priority float64
}

// drain samples and deletes until s is empty and returns the sampled keys.
func drain(t *testing.T, s Selector) []Key {
	t.Helper()
	var keys []Key
	for s.Len() > 0 {
		k, _, err := s.Sample()
		if err != nil {
			t.Fatalf("Sample: %v", err)
		}
		if err := s.Delete(k); err != nil {
			t.Fatalf("Delete(%d) of a sampled key: %v", k, err)
		}
		keys = append(keys, k)
	}
	return keys
}

func TestDeterministicOrder(t *testing.T) {
	inserts := []entry{{1, 5}, {2, 1}, {3, 5}, {4, 9}, {5, 1}, {6, 0}}
	tests := []struct {
		name    string
		sel     Selector
		updates []entry
		want    []Key
	}{
		{"fifo", NewFifo(), nil, []Key{1, 2, 3, 4, 5, 6}},
		{"fifo ignores updates", NewFifo(), []entry{{1, 100}, {4, 0}}, []Key{1, 2, 3, 4, 5, 6}},
		{"lifo", NewLifo(), nil, []Key{6, 5, 4, 3, 2, 1}},
		{"lifo ignores updates", NewLifo(), []entry{{6, 0}, {1, 100}}, []Key{6, 5, 4, 3, 2, 1}},
		// Ties go to the least recently inserted or updated key.
		{"max heap", NewMaxHeap(), nil, []Key{4, 1, 3, 2, 5, 6}},
		{"max heap update to equal priority", NewMaxHeap(), []entry{{1, 5}}, []Key{4, 3, 1, 2, 5, 6}},
		{"max heap updates", NewMaxHeap(), []entry{{6, 10}, {4, 1}, {3, 5}}, []Key{6, 1, 3, 2, 5, 4}},
		{"min heap", NewMinHeap(), nil, []Key{6, 2, 5, 1, 3, 4}},
		{"min heap update to equal priority", NewMinHeap(), []entry{{2, 1}}, []Key{6, 5, 2, 1, 3, 4}},
		{"min heap updates", NewMinHeap(), []entry{{6, 3}, {4, 0}, {1, 9}}, []Key{4, 2, 5, 6, 3, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, e := range inserts {
				if err := tt.sel.Insert(e.key, e.priority); err != nil {
					t.Fatalf("Insert(%d, %v): %v", e.key, e.priority, err)
				}
			}
			for _, e := range tt.updates {
				if err := tt.sel.Update(e.key, e.priority); err != nil {
					t.Fatalf("Update(%d, %v): %v", e.key, e.priority, err)
				}
			}
			if got := drain(t, tt.sel); !slices.Equal(got, tt.want) {
				t.Errorf("order %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDeterministicProbabilityIsOne(t *testing.T) {
	for _, sel := range []Selector{NewFifo(), NewLifo(), NewMaxHeap(), NewMinHeap()} {
		for k := range Key(5) {
			if err := sel.Insert(k, float64(k)); err != nil {
				t.Fatal(err)
			}
		}
		if _, p, err := sel.Sample(); err != nil || p != 1 {
			t.Errorf("%v: Sample probability %v, err %v; want 1, nil", sel.Options(), p, err)
		}
	}
}

func TestEmpty(t *testing.T) {
	for _, o := range allOptions {
		s := mustNew(t, o, 1)
		if _, _, err := s.Sample(); !errors.Is(err, ErrEmpty) {
			t.Errorf("%v: Sample on new selector: err = %v, want ErrEmpty", o, err)
		}
		if s.Len() != 0 {
			t.Errorf("%v: Len = %d on new selector", o, s.Len())
		}
	}
}

func TestClear(t *testing.T) {
	for _, o := range allOptions {
		s := mustNew(t, o, 1)
		for k := range Key(40) {
			if err := s.Insert(k, float64(k%3)); err != nil {
				t.Fatal(err)
			}
		}
		s.Clear()
		if s.Len() != 0 {
			t.Errorf("%v: Len = %d after Clear", o, s.Len())
		}
		if _, _, err := s.Sample(); !errors.Is(err, ErrEmpty) {
			t.Errorf("%v: Sample after Clear: err = %v, want ErrEmpty", o, err)
		}
		if err := s.Update(3, 1); !errors.Is(err, ErrKeyNotFound) {
			t.Errorf("%v: Update after Clear: err = %v, want ErrKeyNotFound", o, err)
		}
		// The cleared selector must behave like a new one.
		for k := Key(38); k < 42; k++ {
			if err := s.Insert(k, 2); err != nil {
				t.Fatalf("%v: Insert(%d) after Clear: %v", o, k, err)
			}
		}
		if err := checkInvariants(s); err != nil {
			t.Fatalf("%v: after Clear: %v", o, err)
		}
		k, p, err := s.Sample()
		if err != nil || k < 38 || k > 41 {
			t.Errorf("%v: Sample after refill = %d, %v; want a key in 38..41", o, k, err)
		}
		if o.Kind != KindFifo && o.Kind != KindLifo && o.Kind != KindMaxHeap && o.Kind != KindMinHeap && p != 0.25 {
			t.Errorf("%v: probability %v after refill with 4 equal keys, want 0.25", o, p)
		}
	}
}

// TestErrorsLeaveStateUnchanged applies failing operations to one of two
// identically seeded selectors and checks that both then behave alike.
func TestErrorsLeaveStateUnchanged(t *testing.T) {
	failing := []struct {
		name string
		do   func(Selector) error
		want error
	}{
		{"insert present key", func(s Selector) error { return s.Insert(2, 4) }, ErrKeyExists},
		{"insert present key with bad priority", func(s Selector) error { return s.Insert(2, -1) }, ErrInvalidPriority},
		{"insert NaN", func(s Selector) error { return s.Insert(100, math.NaN()) }, ErrInvalidPriority},
		{"insert +Inf", func(s Selector) error { return s.Insert(100, math.Inf(1)) }, ErrInvalidPriority},
		{"insert negative", func(s Selector) error { return s.Insert(100, -0.5) }, ErrInvalidPriority},
		{"update missing key", func(s Selector) error { return s.Update(100, 1) }, ErrKeyNotFound},
		{"update NaN", func(s Selector) error { return s.Update(2, math.NaN()) }, ErrInvalidPriority},
		{"update -Inf", func(s Selector) error { return s.Update(2, math.Inf(-1)) }, ErrInvalidPriority},
		{"update negative", func(s Selector) error { return s.Update(3, -1e-300) }, ErrInvalidPriority},
		{"delete missing key", func(s Selector) error { return s.Delete(100) }, ErrKeyNotFound},
	}
	for _, o := range allOptions {
		for _, f := range failing {
			a, b := mustNew(t, o, 5), mustNew(t, o, 5)
			for _, s := range []Selector{a, b} {
				for k := range Key(10) {
					if err := s.Insert(k, float64(k%4)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := f.do(a); !errors.Is(err, f.want) {
				t.Errorf("%v: %s: err = %v, want %v", o, f.name, err, f.want)
			}
			assertSameBehaviour(t, a, b)
		}
	}
}

// assertSameBehaviour compares draws and then the drain order of two
// selectors that should be in the same state.
func assertSameBehaviour(t *testing.T, a, b Selector) {
	t.Helper()
	if a.Len() != b.Len() {
		t.Fatalf("%v: Len %d, want %d", a.Options(), a.Len(), b.Len())
	}
	if err := checkInvariants(a); err != nil {
		t.Fatalf("%v: %v", a.Options(), err)
	}
	for range 100 {
		ka, pa, ea := a.Sample()
		kb, pb, eb := b.Sample()
		if ka != kb || pa != pb || ea != eb {
			t.Fatalf("%v: Sample = (%d, %v, %v), want (%d, %v, %v)", a.Options(), ka, pa, ea, kb, pb, eb)
		}
	}
	if da, db := drain(t, a), drain(t, b); !slices.Equal(da, db) {
		t.Fatalf("%v: drain order %v, want %v", a.Options(), da, db)
	}
}

// TestPrioritizedAcceptsEveryFinitePriority makes the weights and their sum
// overflow float64 in every way the selector once refused.
func TestPrioritizedAcceptsEveryFinitePriority(t *testing.T) {
	s, _ := NewPrioritized(1, rand.New(rand.NewPCG(1, 1)))
	priorities := map[Key]float64{}
	for k := range Key(16) { // fill the first tree so the next insert grows it
		if err := s.Insert(k, 1e307); err != nil {
			t.Fatal(err)
		}
		priorities[k] = 1e307
	}
	// 16e307 is finite; one more MaxFloat64 is not.
	if err := s.Insert(16, math.MaxFloat64); err != nil {
		t.Errorf("Insert making the sum overflow: %v", err)
	}
	priorities[16] = math.MaxFloat64
	if err := s.Update(3, math.MaxFloat64); err != nil {
		t.Errorf("Update making the sum overflow: %v", err)
	}
	priorities[3] = math.MaxFloat64
	checkExact(t, s, priorities)

	sq, _ := NewPrioritized(2, nil)
	if err := sq.Insert(1, 1e200); err != nil {
		t.Errorf("Insert(1, 1e200) with exponent 2: %v", err)
	}
	if err := sq.Insert(2, 1e-200); err != nil {
		t.Errorf("Insert(2, 1e-200) with exponent 2: %v", err)
	}
	checkExact(t, sq, map[Key]float64{1: 1e200, 2: 1e-200})
}

// fixedSource always yields the same word, to drive Sample to the extremes
// of its draw.
type fixedSource uint64

func (s fixedSource) Uint64() uint64 { return uint64(s) }

func TestPrioritizedExtremeDraws(t *testing.T) {
	tests := []struct {
		name    string
		src     fixedSource
		weights []float64
		want    Key
		prob    float64 // 0: the weight over the base band's total
	}{
		{"lowest draw skips leading zeros", 0, []float64{0, 0, 1e-200, 0, 3, 0, 1e-100}, 2, 0},
		// The draw just below 3.7, less 0.7, rounds to 3 or more, carrying
		// the descent past every leaf of the group: it must fall back on the
		// last positive leaf rather than an empty one past the last key.
		{"highest draw stays on the last positive leaf", fixedSource(math.MaxUint64), []float64{0.7, 0, 3}, 2, 0},
		// Across bands, the lowest draw lands in the top band, on its first
		// positive leaf; the tiny weights in lower bands are out of its reach.
		{"lowest draw starts in the top band", 0, []float64{0, 5e-324, 3, 0, 1e308}, 4, 1},
		// 2^767 is the largest weight of band 0 and 2^769 lies in band 1: the
		// highest draw goes past the top band into the one below.
		{"highest draw reaches the band below", fixedSource(math.MaxUint64), []float64{0x1p769, 0, 0x1p767}, 2, 0.2},
	}
	for _, tt := range tests {
		s, _ := NewPrioritized(1, rand.New(tt.src))
		for k, w := range tt.weights {
			if err := s.Insert(Key(k), w); err != nil {
				t.Fatal(err)
			}
		}
		if tt.prob == 0 {
			tt.prob = tt.weights[tt.want] / s.(*prioritized).base.total
		}
		k, p, err := s.Sample()
		if err != nil || k != tt.want || p != tt.prob {
			t.Errorf("%s: Sample = (%d, %v, %v), want (%d, %v)", tt.name, k, p, err, tt.want, tt.prob)
		}
	}
}

func TestErrorsNameTheKey(t *testing.T) {
	for _, o := range allOptions {
		s := mustNew(t, o, 1)
		if err := s.Insert(12345, 1); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			err error
			key string
		}{{s.Insert(12345, 1), "12345"}, {s.Update(777, 1), "777"}, {s.Delete(778), "778"}} {
			if !strings.Contains(c.err.Error(), c.key) {
				t.Errorf("%v: error %q does not name key %s", o, c.err, c.key)
			}
		}
		if err := s.Insert(1, -2); !strings.Contains(err.Error(), "-2") {
			t.Errorf("%v: error %q does not name the priority", o, err)
		}
	}
}

func TestOptionsRoundTrip(t *testing.T) {
	for _, o := range allOptions {
		s := mustNew(t, o, 1)
		if got := s.Options(); got != o {
			t.Errorf("New(%v).Options() = %v", o, got)
		}
		again := mustNew(t, s.Options(), 2)
		if reflect.TypeOf(again) != reflect.TypeOf(s) || again.Options() != o {
			t.Errorf("rebuilding %v gave %T %v", o, again, again.Options())
		}
	}
	if got := (Options{Kind: KindPrioritized, Exponent: 0.6}).String(); got != "prioritized(0.6)" {
		t.Errorf("String = %q", got)
	}
	if got := (Options{Kind: KindMaxHeap}).String(); got != "max_heap" {
		t.Errorf("String = %q", got)
	}
}

func TestInvalidOptions(t *testing.T) {
	for _, o := range []Options{
		{},
		{Kind: "random"},
		{Kind: "FIFO"},
		{Kind: KindPrioritized, Exponent: -0.1},
		{Kind: KindPrioritized, Exponent: math.NaN()},
		{Kind: KindPrioritized, Exponent: math.Inf(1)},
	} {
		if _, err := New(o, nil); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("New(%#v): err = %v, want ErrInvalidOptions", o, err)
		}
	}
	if _, err := NewPrioritized(-1, nil); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("NewPrioritized(-1): err = %v, want ErrInvalidOptions", err)
	}
}

func TestNilRandomSource(t *testing.T) {
	for _, o := range allOptions {
		s, err := New(o, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Insert(9, 1); err != nil {
			t.Fatal(err)
		}
		if k, p, err := s.Sample(); k != 9 || p != 1 || err != nil {
			t.Errorf("%v: Sample = (%d, %v, %v), want (9, 1, nil)", o, k, p, err)
		}
	}
	u := NewUniform(nil)
	_ = u.Insert(1, 0)
	if _, _, err := u.Sample(); err != nil {
		t.Errorf("NewUniform(nil): Sample: %v", err)
	}
}
