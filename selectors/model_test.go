package selectors

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// reference is a deliberately naive model of every selector: a slice in
// insertion order, scanned in full by every operation.
type reference struct {
	opts    Options
	items   []refItem
	seq     uint64
	samples int
}

type refItem struct {
	key      Key
	priority float64
	seq      uint64 // when last inserted or updated
}

func (r *reference) find(key Key) int {
	return slices.IndexFunc(r.items, func(it refItem) bool { return it.key == key })
}

func (r *reference) validPriority(p float64) bool {
	return !math.IsNaN(p) && !math.IsInf(p, 0) && p >= 0
}

// priorities is the priority of every key held.
func (r *reference) priorities() map[Key]float64 {
	m := make(map[Key]float64, len(r.items))
	for _, it := range r.items {
		m[it.key] = it.priority
	}
	return m
}

func (r *reference) insert(key Key, p float64) error {
	switch {
	case !r.validPriority(p):
		return ErrInvalidPriority
	case r.find(key) >= 0:
		return ErrKeyExists
	}
	r.seq++
	r.items = append(r.items, refItem{key: key, priority: p, seq: r.seq})
	return nil
}

func (r *reference) update(key Key, p float64) error {
	i := r.find(key)
	switch {
	case !r.validPriority(p):
		return ErrInvalidPriority
	case i < 0:
		return ErrKeyNotFound
	}
	r.seq++
	r.items[i].priority = p
	r.items[i].seq = r.seq
	return nil
}

func (r *reference) delete(key Key) error {
	i := r.find(key)
	if i < 0 {
		return ErrKeyNotFound
	}
	r.items = slices.Delete(r.items, i, i+1)
	return nil
}

// next is the key a deterministic selector must sample.
func (r *reference) next() Key {
	switch r.opts.Kind {
	case KindFifo:
		return r.items[0].key
	case KindLifo:
		return r.items[len(r.items)-1].key
	}
	best := r.items[0]
	for _, it := range r.items[1:] {
		better := it.priority > best.priority
		if r.opts.Kind == KindMinHeap {
			better = it.priority < best.priority
		}
		if better || it.priority == best.priority && it.seq < best.seq {
			best = it
		}
	}
	return best.key
}

// checkSample checks one draw of sel against the model.
func (r *reference) checkSample(key Key, prob float64, err error) error {
	n := len(r.items)
	if n == 0 {
		if !errors.Is(err, ErrEmpty) {
			return fmt.Errorf("Sample on empty: err = %v, want ErrEmpty", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("Sample: %v", err)
	}
	switch r.opts.Kind {
	case KindFifo, KindLifo, KindMaxHeap, KindMinHeap:
		if want := r.next(); key != want || prob != 1 {
			return fmt.Errorf("Sample = (%d, %v), want (%d, 1)", key, prob, want)
		}
		return nil
	}
	i := r.find(key)
	if i < 0 {
		return fmt.Errorf("Sample returned key %d, which is not held", key)
	}
	uniform := 1 / float64(n)
	if r.opts.Kind == KindUniform {
		if prob != uniform {
			return fmt.Errorf("Sample probability %v, want 1/%d", prob, n)
		}
		return nil
	}
	if r.opts.Exponent > 0 && r.items[i].priority == 0 && slices.ContainsFunc(r.items, func(it refItem) bool { return it.priority > 0 }) {
		return fmt.Errorf("Sample returned key %d of priority 0 while others have weight", key)
	}
	// The spec of Prioritized, computed exactly: for every draw from a small
	// selector, for some from a large one (the sum is slow).
	if r.samples++; n > 64 && r.samples%16 != 0 {
		return nil
	}
	total := newExact()
	for _, it := range r.items {
		total.Add(total, cachedWeight(it.priority, r.opts.Exponent))
	}
	want := 1 / float64(n)
	if total.Sign() > 0 {
		want, _ = newExact().Quo(cachedWeight(r.items[i].priority, r.opts.Exponent), total).Float64()
	}
	if d := ulpsApart(prob, want); d > probabilityUlps {
		return fmt.Errorf("Sample probability of key %d = %v, want %v (%.1f ulps apart)", key, prob, want, d)
	}
	return nil
}

// checkWeight compares sel's total weight with the model's, computed
// exactly for Prioritized. The sum trees add rounded leaves, so the total
// may differ from the exact one in its last bits, far less than 1e-12 of it
// for the sizes tested.
func (r *reference) checkWeight(sel Selector) error {
	frac, exp := sel.Weight()
	if r.opts.Kind != KindPrioritized {
		if wantFrac, wantExp := countWeight(len(r.items)); frac != wantFrac || exp != wantExp {
			return fmt.Errorf("Weight = %v×2^%d, want %v×2^%d", frac, exp, wantFrac, wantExp)
		}
		return nil
	}
	total := newExact()
	for _, it := range r.items {
		total.Add(total, cachedWeight(it.priority, r.opts.Exponent))
	}
	if total.Sign() == 0 {
		if frac != 0 || exp != 0 {
			return fmt.Errorf("Weight = %v×2^%d, want 0", frac, exp)
		}
		return nil
	}
	if frac < 0.5 || frac >= 1 {
		return fmt.Errorf("Weight fraction %v, want it in [0.5, 1)", frac)
	}
	got := newExact().SetMantExp(newExact().SetFloat64(frac), int(exp))
	diff := newExact().Sub(got, total)
	if rel, _ := diff.Quo(diff.Abs(diff), total).Float64(); rel > 1e-12 {
		return fmt.Errorf("Weight = %v×2^%d, %g of the exact total away", frac, exp, rel)
	}
	return nil
}

type opKind uint8

const (
	opInsert opKind = iota
	opUpdate
	opDelete
	opSample
	opClear
)

type op struct {
	kind     opKind
	key      Key
	priority float64
}

func (o op) String() string {
	switch o.kind {
	case opInsert:
		return fmt.Sprintf("Insert(%d, %v)", o.key, o.priority)
	case opUpdate:
		return fmt.Sprintf("Update(%d, %v)", o.key, o.priority)
	case opDelete:
		return fmt.Sprintf("Delete(%d)", o.key)
	case opSample:
		return "Sample()"
	default:
		return "Clear()"
	}
}

func sameError(got, want error) error {
	if want == nil && got != nil || want != nil && !errors.Is(got, want) {
		return fmt.Errorf("err = %v, want %v", got, want)
	}
	return nil
}

// runModel applies ops to sel and to a reference and reports the first
// disagreement, or a broken internal invariant of sel.
func runModel(sel Selector, ops []op) error {
	ref := &reference{opts: sel.Options()}
	for i, o := range ops {
		var err error
		switch o.kind {
		case opInsert:
			err = sameError(sel.Insert(o.key, o.priority), ref.insert(o.key, o.priority))
		case opUpdate:
			err = sameError(sel.Update(o.key, o.priority), ref.update(o.key, o.priority))
		case opDelete:
			err = sameError(sel.Delete(o.key), ref.delete(o.key))
		case opSample:
			err = ref.checkSample(sel.Sample())
		case opClear:
			sel.Clear()
			ref.items = ref.items[:0]
		}
		if err == nil && sel.Len() != len(ref.items) {
			err = fmt.Errorf("Len = %d, want %d", sel.Len(), len(ref.items))
		}
		if err == nil {
			err = checkInvariants(sel)
		}
		if err == nil && (len(ref.items) <= 16 || i%64 == 0) {
			err = ref.checkWeight(sel)
		}
		// The whole distribution, exactly, as often as is cheap enough.
		if p, ok := sel.(*prioritized); ok && err == nil && (len(ref.items) <= 16 || i%64 == 0) {
			err = checkProbabilities(p, ref.priorities())
		}
		if err != nil {
			return fmt.Errorf("%v: op %d %v: %w", sel.Options(), i, o, err)
		}
	}
	return nil
}

// checkInvariants inspects a selector's internals.
func checkInvariants(sel Selector) error {
	switch s := sel.(type) {
	case *queue:
		var keys []Key
		prev := none
		for i := s.head; i != none; i = s.nodes[i].next {
			if s.nodes[i].prev != prev {
				return fmt.Errorf("node %d: prev %d, want %d", i, s.nodes[i].prev, prev)
			}
			if s.index[s.nodes[i].key] != i {
				return fmt.Errorf("index of key %d is %d, want %d", s.nodes[i].key, s.index[s.nodes[i].key], i)
			}
			keys = append(keys, s.nodes[i].key)
			prev = i
		}
		if prev != s.tail || len(keys) != len(s.index) {
			return fmt.Errorf("list of %d keys ending at %d; tail %d, index of %d", len(keys), prev, s.tail, len(s.index))
		}
	case *uniform:
		if len(s.keys) != len(s.index) {
			return fmt.Errorf("%d keys, index of %d", len(s.keys), len(s.index))
		}
		for i, k := range s.keys {
			if s.index[k] != i {
				return fmt.Errorf("index of key %d is %d, want %d", k, s.index[k], i)
			}
		}
	case *prioritized:
		if err := checkSumTree(s); err != nil {
			return err
		}
	case *priorityHeap:
		if len(s.heap) != len(s.index) {
			return fmt.Errorf("%d entries, index of %d", len(s.heap), len(s.index))
		}
		for i := range s.heap {
			if s.slots[s.heap[i].slot].pos != i {
				return fmt.Errorf("entry %d: its slot says position %d", i, s.slots[s.heap[i].slot].pos)
			}
			if s.index[s.slots[s.heap[i].slot].key] != s.heap[i].slot {
				return fmt.Errorf("entry %d: index disagrees with slot", i)
			}
			if i > 0 && s.above(&s.heap[i], &s.heap[(i-1)/2]) {
				return fmt.Errorf("entry %d belongs above its parent", i)
			}
		}
	}
	return nil
}

// checkSumTree verifies every band of s: each node above the leaves is
// exactly the sum of its group, as is the total, unused leaves weigh 0, used
// ones lie in the band's range (positive outside the base band), and the
// indexes and the heap of bands agree with the bands.
func checkSumTree(s *prioritized) error {
	if err := checkBand(&s.base, true); err != nil {
		return fmt.Errorf("base band: %w", err)
	}
	if len(s.base.keys) != len(s.index) {
		return fmt.Errorf("%d keys in the base band, index of %d", len(s.base.keys), len(s.index))
	}
	for i, k := range s.base.keys {
		if j, ok := s.index[k]; !ok || j != i {
			return fmt.Errorf("index of key %d is %d (present %v), want %d", k, j, ok, i)
		}
	}
	if len(s.order) != len(s.bands) {
		return fmt.Errorf("heap of %d bands, map of %d", len(s.order), len(s.bands))
	}
	far := 0
	for i, b := range s.order {
		if err := checkBand(b, false); err != nil {
			return fmt.Errorf("band %d: %w", b.id, err)
		}
		switch {
		case b.id == 0:
			return fmt.Errorf("band 0 in the heap at %d", i)
		case b.pos != i:
			return fmt.Errorf("band %d at %d in the heap says %d", b.id, i, b.pos)
		case s.bands[b.id] != b:
			return fmt.Errorf("band %d at %d in the heap is not the map's", b.id, i)
		case len(b.keys) == 0:
			return fmt.Errorf("band %d is empty", b.id)
		case i > 0 && s.order[(i-1)/2].id < b.id:
			return fmt.Errorf("band %d is below band %d in the heap", b.id, s.order[(i-1)/2].id)
		}
		for j, k := range b.keys {
			if f := s.far[k]; f.band != b || f.leaf != j {
				return fmt.Errorf("key %d is at leaf %d of band %d, the index says %d of %v", k, j, b.id, f.leaf, f.band)
			}
		}
		far += len(b.keys)
	}
	if far != len(s.far) {
		return fmt.Errorf("%d keys outside the base band, index of %d", far, len(s.far))
	}
	return nil
}

func checkBand(b *band, base bool) error {
	for l := 1; l < len(b.levels); l++ {
		for j := range b.levels[l] {
			var sum float64
			if j*fanout < len(b.levels[l-1]) {
				sum = sumGroup(group(b.levels[l-1], j))
			}
			if math.Float64bits(b.levels[l][j]) != math.Float64bits(sum) {
				return fmt.Errorf("level %d node %d = %v, its group sums to %v", l, j, b.levels[l][j], sum)
			}
		}
	}
	if len(b.levels) == 0 {
		if len(b.keys) > 0 || b.total != 0 {
			return fmt.Errorf("%d keys and total %v without leaves", len(b.keys), b.total)
		}
		return nil
	}
	if top := b.levels[len(b.levels)-1]; len(top) != fanout || math.Float64bits(b.total) != math.Float64bits(sumGroup(group(top, 0))) {
		return fmt.Errorf("total %v, top level %v", b.total, top)
	}
	if math.IsInf(b.total, 0) || math.IsNaN(b.total) || b.total >= 0x1p831 {
		return fmt.Errorf("total %v", b.total)
	}
	for i, w := range b.levels[0] {
		switch {
		case i >= len(b.keys) && w != 0:
			return fmt.Errorf("unused leaf %d weighs %v", i, w)
		case i < len(b.keys) && !(w >= 0x1p-768 && w < 0x1p768) && !(base && w == 0):
			return fmt.Errorf("leaf %d weighs %v, outside the band", i, w)
		}
	}
	return nil
}

// modelPriorities mixes the ordinary, the tied, the extreme (whose powers
// and sums overflow or underflow float64) and the invalid.
var modelPriorities = []float64{
	0, 0.5, 1, 1, 2, 3, 7.25, 10, 1e-300, 1e100, 1e200,
	1e300, 1e308, 1e308, math.MaxFloat64, 0x1p-1022, 5e-324, 1e-323,
	math.Copysign(0, -1), -1, math.NaN(), math.Inf(1), math.Inf(-1),
}

var modelExponents = []float64{0, 0.5, 0.6, 1, 1.5, 2, 3}

// allSelectors builds one selector of every kind, one Prioritized for each
// exponent, the random ones seeded.
func allSelectors(t testing.TB, seed uint64, exponents ...float64) []Selector {
	t.Helper()
	sels := []Selector{
		NewFifo(), NewLifo(), NewMaxHeap(), NewMinHeap(),
		NewUniform(rand.New(rand.NewPCG(seed, 1))),
	}
	for _, e := range exponents {
		p, err := NewPrioritized(e, rand.New(rand.NewPCG(seed, 2)))
		if err != nil {
			t.Fatal(err)
		}
		sels = append(sels, p)
	}
	return sels
}

// randomOps draws n operations on keys 0..keys-1, Clear with probability
// clearPerMille/1000.
func randomOps(rng *rand.Rand, n, keys, clearPerMille int) []op {
	ops := make([]op, n)
	for i := range ops {
		o := op{key: Key(rng.IntN(keys))}
		switch r := rng.IntN(1000); {
		case r < 350:
			o.kind = opInsert
		case r < 550:
			o.kind = opUpdate
		case r < 750:
			o.kind = opDelete
		case r < 1000-clearPerMille:
			o.kind = opSample
		default:
			o.kind = opClear
		}
		if rng.IntN(2) == 0 {
			o.priority = modelPriorities[rng.IntN(len(modelPriorities))]
		} else {
			o.priority = rng.Float64() * 10
		}
		ops[i] = o
	}
	return ops
}

func TestModel(t *testing.T) {
	tests := []struct {
		name                      string
		runs, length, keys, clear int
	}{
		// Few keys: frequent collisions, empty selectors, ties.
		{"48 keys", 8, 2000, 48, 10},
		// Never cleared, the selectors settle near 450 keys: a sum tree of
		// three levels and deep heaps.
		{"700 keys", 1, 6000, 700, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runs := tt.runs
			if testing.Short() {
				runs = 1
			}
			for run := range runs {
				seed := uint64(run)
				ops := randomOps(rand.New(rand.NewPCG(seed, 99)), tt.length, tt.keys, tt.clear)
				for _, sel := range allSelectors(t, seed, modelExponents...) {
					if err := runModel(sel, ops); err != nil {
						t.Fatalf("seed %d: %v", seed, err)
					}
				}
			}
		})
	}
}

// decodeOps turns fuzz input into an exponent and operations: the first byte
// picks the exponent, then every 3 bytes are (operation, key, priority). 96
// keys are enough for a sum tree of three levels and few enough to collide.
// A priority byte below 128 picks one of modelPriorities, and one above
// picks a power of two times 1, 1.25, 1.5 or 1.75 anywhere in float64's
// range (from rounding to 0, through the subnormals, to overflowing to +Inf).
func decodeOps(data []byte) (float64, []op) {
	if len(data) == 0 {
		return 1, nil
	}
	exponent := modelExponents[int(data[0])%len(modelExponents)]
	data = data[1:]
	ops := make([]op, 0, len(data)/3)
	for ; len(data) >= 3; data = data[3:] {
		o := op{key: Key(data[1] % 96), priority: fuzzPriority(data[2])}
		switch k := data[0] % 16; {
		case k < 5:
			o.kind = opInsert
		case k < 8:
			o.kind = opUpdate
		case k < 11:
			o.kind = opDelete
		case k < 15:
			o.kind = opSample
		default:
			o.kind = opClear
		}
		ops = append(ops, o)
	}
	return exponent, ops
}

func fuzzPriority(b byte) float64 {
	if b < 128 {
		return modelPriorities[int(b)%len(modelPriorities)]
	}
	b -= 128
	return math.Ldexp(1+float64(b%4)/4, int(b/4)*68-1076)
}

func FuzzSelectors(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{3, 0, 1, 2, 0, 2, 2, 0, 3, 0, 11, 0, 0, 8, 1, 0, 11, 0, 0})
	f.Add([]byte{1, 0, 1, 0, 0, 2, 0, 11, 0, 0, 5, 1, 7, 11, 0, 0, 15, 0, 0, 11, 0, 0})
	f.Add([]byte{4, 0, 1, 10, 0, 2, 10, 0, 3, 6, 11, 0, 0, 5, 1, 13, 0, 4, 12, 11, 0, 0})
	f.Add([]byte{2, 0, 7, 8, 0, 8, 1, 0, 9, 2, 11, 0, 0, 8, 7, 3, 11, 0, 0, 12, 8, 4})
	// Extremes: MaxFloat64 and twice 1e308 at exponent 1, then subnormals and
	// powers across the range at exponent 3, with updates between them.
	f.Add([]byte{3, 0, 1, 14, 0, 2, 12, 0, 3, 13, 11, 0, 0, 5, 1, 16, 11, 0, 0, 9, 2, 0, 11, 0, 0})
	f.Add([]byte{6, 0, 1, 16, 0, 2, 17, 0, 3, 130, 0, 4, 250, 11, 0, 0, 5, 3, 12, 11, 0, 0, 10, 4, 0, 11, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		exponent, ops := decodeOps(data)
		for _, sel := range allSelectors(t, 7, exponent) {
			if err := runModel(sel, ops); err != nil {
				t.Fatal(err)
			}
		}
	})
}
