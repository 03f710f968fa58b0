package selectors

import (
	"math"
	"math/rand/v2"
)

// prioritized samples key k with probability w(k)/Σw where w(k) = p(k)^α.
//
// # Sum trees
//
// Weights are the leaves of sum trees of fanout 8, stored level by level:
// levels[0] holds the leaves and levels[l+1][j] is the sum of the group
// levels[l][8j:8j+8]. The root, total, is the sum of the top level, which
// has exactly 8 entries. Keys occupy leaves 0..n-1 densely, so a delete moves
// the last key into the hole, and the leaves past n weigh 0. A fanout of 8
// puts each group in one cache line and makes a tree of a million leaves 7
// levels deep instead of 20; at that size the levels outgrow the caches and
// recomputing a path costs half what it does in a binary tree (measured).
//
// Every node on the path above a changed leaf is recomputed as the sum of its
// children, always added in the same order; nothing is ever added or
// subtracted as a delta. Each node is therefore a pure function of the
// current leaves, the root is exactly the tree-ordered sum of the weights, and
// no rounding error accumulates however many updates are made (Reverb adds
// deltas and has to rebuild its tree when drift exceeds a threshold). Because
// groups are aligned from leaf 0 and padding adds exact zeros, the root does
// not depend on the capacity either.
//
// # Bands
//
// Every finite priority >= 0 is valid, but its weight need not be a float64:
// 1e308^3 overflows, 5e-324^1.5 underflows, and a sum of weights near
// MaxFloat64 overflows even where each one fits. So the keys are split into
// bands by the binary exponent of their weight, each band with its own tree:
// band b holds the weights in [2^(1536b-768), 2^(1536b+768)) and stores each
// one scaled by 2^(-1536b), so every leaf of every band lies in
// [2^-768, 2^768). That keeps every leaf a normal float64, with all 53 bits of
// its weight, and every sum below 2^831 for any number of leaves. Band 0
// holds the weights near 1 as they are (at α = 1, the priorities from 1e-231
// to 1e231) and every weight 0, so ordinary tables use one tree, whose
// leaves are the weights themselves, exactly as if there were no bands.
//
// A key's leaf depends on its own priority only, so no operation ever
// touches another key's leaf: there is no rescaling, and every operation is
// O(log n) plus O(log B) to keep the B non-empty bands in a heap, whatever
// the sequence. One scale shared by all leaves would instead have to be
// moved, and every leaf recomputed, whenever the largest weight crossed its
// range: a client inserting and deleting a priority of 1e308 at α = 3 in
// turn would make every operation O(n), or leave the small weights rounded
// to 0 for a while after each delete. A band emptied by such a client is kept
// as the spare and reused, so the alternation does not allocate either.
//
// Only the two highest bands with weight can be drawn from. A key two bands
// below the top weighs less than 2^768·2^(1536(top-2)), and the top band
// alone weighs at least 2^-768·2^(1536·top), so the key's probability is
// below 2^-1536: as a float64 that is 0, and so it is here. The two bands are
// brought to one frame for a draw (see view).
type prioritized struct {
	exponent float64
	rng      *rand.Rand
	base     band            // band 0, which also holds every weight 0
	index    map[Key]int     // key -> leaf, for the keys of base
	far      map[Key]farLeaf // the keys of every other band
	bands    map[int64]*band // the bands other than base, none of them empty
	order    []*band         // the same bands, a max-heap by id
	spare    *band           // an emptied band kept for reuse
}

// farLeaf locates a key outside the base band.
type farLeaf struct {
	band *band
	leaf int
}

// band is one sum tree, over the weights scaled by 2^(-bandWidth·id).
type band struct {
	id     int64
	pos    int         // in prioritized.order; unused by the base band
	keys   []Key       // keys[i] owns leaf i
	levels [][]float64 // leaves first; every level a power of two >= 8 long
	total  float64
}

const (
	fanout = 8
	// bandWidth is the span of a band in binary orders of magnitude: as wide
	// as it can be while a band's sums stay far below MaxFloat64 and its
	// leaves far above the subnormals, so that few bands are ever needed.
	bandWidth = 1536
	// maxExponent bounds the binary exponent of a weight. A weight beyond
	// 2^(±2^60) needs α above 1e15, where no float64 computation of p^α is
	// within a few percent anyway (see pow), so such weights saturate.
	maxExponent = 1 << 60
	// spareLeaves is the largest band kept for reuse once empty: enough to
	// make a hostile alternation free, small enough not to hold memory.
	spareLeaves = 256
)

// sumGroup adds a group of siblings in a fixed order.
func sumGroup(g *[fanout]float64) float64 {
	return ((g[0] + g[1]) + (g[2] + g[3])) + ((g[4] + g[5]) + (g[6] + g[7]))
}

// group returns the j-th group of siblings of a level.
func group(level []float64, j int) *[fanout]float64 {
	return (*[fanout]float64)(level[j*fanout:])
}

// NewPrioritized returns a selector that picks a key with probability
// proportional to its priority raised to exponent: 0 makes every key of
// positive priority equally likely, 1 is proportional to priority. For every
// exponent, 0 included, a key of priority 0 is never picked unless every key
// has priority 0, in which case the pick is uniform (Reverb's rule). rng drives the draws; nil means a randomly
// seeded source.
//
// Every finite priority >= 0 is accepted with any exponent, including those
// whose power or sum of powers would not fit in a float64 (1e308 at exponent
// 1.5, or twice 1e308 at 1): weights keep a float64's precision however
// large or small, so probabilities are right to a few ulps. Sample reports
// the probability as a float64: a key whose share of the total is below
// 2^-1074 reports 0.
func NewPrioritized(exponent float64, rng *rand.Rand) (Selector, error) {
	if err := (Options{Kind: KindPrioritized, Exponent: exponent}).Validate(); err != nil {
		return nil, err
	}
	return &prioritized{
		exponent: exponent,
		rng:      orRandom(rng),
		index:    make(map[Key]int),
		far:      make(map[Key]farLeaf),
		bands:    make(map[int64]*band),
	}, nil
}

// place returns the band of priority's weight and the weight as that band
// stores it.
func (s *prioritized) place(priority float64) (id int64, leaf float64) {
	var frac float64
	var exp int64
	switch {
	case priority == 0:
		// Before the exponent: as in Reverb, a priority of 0 is never
		// drawn, even at exponent 0. Also turns -0 into +0.
		return 0, 0
	case s.exponent == 0:
		return 0, 1
	case s.exponent == 1:
		if priority >= 0x1p-768 && priority < 0x1p768 {
			return 0, priority
		}
		f, e := math.Frexp(priority) // exact, subnormals included
		frac, exp = f, int64(e)
	default:
		frac, exp = pow(priority, s.exponent)
	}
	// frac·2^exp lies in [2^(exp-1), 2^exp): band 0 takes exp in [-767, 768].
	if exp >= 1-bandWidth/2 && exp <= bandWidth/2 {
		return 0, scale(frac, exp)
	}
	id = floorDiv(exp+bandWidth/2-1, bandWidth)
	return id, scale(frac, exp-id*bandWidth)
}

// scale returns frac·2^e for frac in [0.5, 1) and e in [-767, 768]: the
// result is a normal float64, so adding e to frac's exponent bits is exact.
func scale(frac float64, e int64) float64 {
	return math.Float64frombits(math.Float64bits(frac) + uint64(e)<<52)
}

// pow returns p^a as frac·2^exp with frac in [0.5, 1), for p > 0 and a > 0.
//
// math.Pow computes e^(a·ln p), so the rounding of ln p, however large, is
// magnified by a: 1e200^1.5 comes out 75 ulps high, and beyond float64's
// range there is no result at all. Here only a fraction near 1 goes through
// the logarithm. With p = f·2^k, f in [√½, √2),
//
//	p^a = 2^(k·a) · e^(a·ln f),  k·a = whole + rest (FMA: one rounding),
//	p^a = 2^whole · e^x,         x = rest·ln 2 + a·ln f,
//
// and |a·ln f| <= 0.35a, so x carries an error of a few units of 2^-53,
// growing with a but not with p: the weight is within 2.5 ulps at a = 1.5
// and 3.6 at a = 3 (measured over the whole range of p). For a above 1e3 or
// so x can leave Exp's range, so it is reduced by a whole number n of ln 2
// first. A priority of 1 weighs exactly 1.
func pow(p, a float64) (float64, int64) {
	f, k := math.Frexp(p)
	if f < math.Sqrt2/2 {
		f, k = 2*f, k-1
	}
	kf := float64(k)
	// |log2 p| >= |k|/2 for k != 0, so a huge k·a means a huge weight
	// exponent: saturate before whole overflows an int64.
	if ka := kf * a; !(math.Abs(ka) < 2*maxExponent) {
		if k > 0 {
			return 0.5, maxExponent
		}
		return 0.5, -maxExponent
	}
	whole := math.Floor(kf * a)
	x := math.FMA(kf, a, -whole)*math.Ln2 + a*math.Log(f)
	n := math.Floor(x * (1 / math.Ln2))
	if !(math.Abs(n) < 2*maxExponent) {
		if n > 0 {
			return 0.5, maxExponent
		}
		return 0.5, -maxExponent
	}
	frac, e := math.Frexp(math.Exp(math.FMA(-n, math.Ln2, x)))
	exp := int64(whole) + int64(n) + int64(e)
	return frac, min(max(exp, -maxExponent), maxExponent)
}

// floorDiv is a/b rounded toward -Inf, for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func (b *band) capacity() int {
	if len(b.levels) == 0 {
		return 0
	}
	return len(b.levels[0])
}

// set stores w in leaf i and recomputes the path above it.
func (b *band) set(i int, w float64) {
	b.levels[0][i] = w
	for l := 1; l < len(b.levels); l++ {
		i /= fanout
		b.levels[l][i] = sumGroup(group(b.levels[l-1], i))
	}
	b.total = sumGroup(group(b.levels[len(b.levels)-1], 0))
}

// grow doubles the number of leaves and rebuilds the levels above them, which
// yields the values incremental updates would have.
func (b *band) grow() {
	leaves := make([]float64, max(fanout, 2*b.capacity()))
	if b.capacity() > 0 {
		copy(leaves, b.levels[0])
	}
	levels := [][]float64{leaves}
	for below := leaves; len(below) > fanout; {
		above := make([]float64, max(fanout, len(below)/fanout))
		for j := range len(below) / fanout {
			above[j] = sumGroup(group(below, j))
		}
		levels = append(levels, above)
		below = above
	}
	b.levels = levels
}

// push gives key the next leaf and returns it.
func (b *band) push(key Key, w float64) int {
	i := len(b.keys)
	if i == b.capacity() {
		b.grow()
	}
	b.set(i, w)
	b.keys = append(b.keys, key)
	return i
}

// remove frees leaf i by moving the last key into it.
func (b *band) remove(i int) {
	last := len(b.keys) - 1
	if i != last {
		b.keys[i] = b.keys[last]
		b.set(i, b.levels[0][last])
	}
	b.set(last, 0)
	b.keys = b.keys[:last]
}

// descend walks from the root to a leaf, at each level entering the child
// within whose sum the remaining draw u falls. It only ever enters a child of
// positive sum, and when rounding of the draw or of the subtractions carries
// it past every child of a group, it takes the last positive one. So the walk
// ends on a positive leaf below n however the floats round, provided the
// total is positive.
func (b *band) descend(u float64) int {
	i := 0
	for l := len(b.levels) - 1; l >= 0; l-- {
		g := group(b.levels[l], i)
		j, last := 0, 0
		for ; j < fanout; j++ {
			if c := g[j]; c > 0 {
				if u < c {
					break
				}
				u -= c
				last = j
			}
		}
		if j == fanout {
			j = last
		}
		i = i*fanout + j
	}
	return i
}

func (s *prioritized) Insert(key Key, priority float64) error {
	if err := CheckPriority(priority); err != nil {
		return err
	}
	_, ok := s.index[key]
	if !ok && len(s.far) > 0 { // ordinary tables have no far keys: skip the lookup
		_, ok = s.far[key]
	}
	if ok {
		return errKeyExists(key)
	}
	id, leaf := s.place(priority)
	s.add(key, id, leaf)
	return nil
}

func (s *prioritized) Update(key Key, priority float64) error {
	if err := CheckPriority(priority); err != nil {
		return err
	}
	id, leaf := s.place(priority)
	if i, ok := s.index[key]; ok {
		if id == 0 {
			s.base.set(i, leaf)
			return nil
		}
		s.removeBase(key, i)
	} else if f, ok := s.far[key]; ok {
		if id == f.band.id {
			f.band.set(f.leaf, leaf)
			return nil
		}
		s.removeFar(key, f)
	} else {
		return errKeyNotFound(key)
	}
	s.add(key, id, leaf)
	return nil
}

func (s *prioritized) Delete(key Key) error {
	if i, ok := s.index[key]; ok {
		s.removeBase(key, i)
	} else if f, ok := s.far[key]; ok {
		s.removeFar(key, f)
	} else {
		return errKeyNotFound(key)
	}
	return nil
}

// add gives key, which the selector does not hold, a leaf in band id.
func (s *prioritized) add(key Key, id int64, leaf float64) {
	if id == 0 {
		s.index[key] = s.base.push(key, leaf)
		return
	}
	b := s.bands[id]
	if b == nil {
		b = s.newBand(id)
	}
	s.far[key] = farLeaf{band: b, leaf: b.push(key, leaf)}
}

// removeBase and removeFar update the index before the tree: in a large
// table both miss the cache, and issued first the map's misses overlap the
// tree's (a quarter off a delete at a million keys, measured).
func (s *prioritized) removeBase(key Key, i int) {
	if last := len(s.base.keys) - 1; i != last {
		s.index[s.base.keys[last]] = i
	}
	delete(s.index, key)
	s.base.remove(i)
}

func (s *prioritized) removeFar(key Key, f farLeaf) {
	b := f.band
	if last := len(b.keys) - 1; f.leaf != last {
		s.far[b.keys[last]] = f
	}
	delete(s.far, key)
	b.remove(f.leaf)
	if len(b.keys) == 0 {
		s.dropBand(b)
	}
}

func (s *prioritized) newBand(id int64) *band {
	b := s.spare
	if b == nil {
		b = new(band)
	} else {
		s.spare = nil
	}
	b.id, b.pos = id, len(s.order)
	s.order = append(s.order, b)
	s.up(b.pos)
	s.bands[id] = b
	return b
}

// dropBand forgets an empty band. Its leaves are all 0 again, so a small
// one can serve as the next new band as it is.
func (s *prioritized) dropBand(b *band) {
	delete(s.bands, b.id)
	last := len(s.order) - 1
	i := b.pos
	s.swap(i, last)
	s.order[last] = nil
	s.order = s.order[:last]
	if i < last {
		s.down(i)
		s.up(i)
	}
	if b.capacity() <= spareLeaves {
		s.spare = b
	}
}

func (s *prioritized) swap(i, j int) {
	s.order[i], s.order[j] = s.order[j], s.order[i]
	s.order[i].pos, s.order[j].pos = i, j
}

func (s *prioritized) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if s.order[p].id >= s.order[i].id {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *prioritized) down(i int) {
	for {
		c := 2*i + 1
		if c >= len(s.order) {
			return
		}
		if c+1 < len(s.order) && s.order[c+1].id > s.order[c].id {
			c++
		}
		if s.order[i].id >= s.order[c].id {
			return
		}
		s.swap(i, c)
		i = c
	}
}

// view is what a draw needs: the highest band with weight, top, and the band
// just below it, next, if that has weight too. With both, total is their sum
// in a frame where top's total is its fraction in [0.5, 1) (so 2^shift times
// top's own frame) and next's is at most 2^62: no leaf of either then
// overflows or loses a bit to the division by total.
type view struct {
	top, next *band
	shift     int
	total     float64
}

func (s *prioritized) view() view {
	var top, next *band
	if len(s.order) > 0 {
		top = s.order[0]
		if len(s.order) > 1 {
			next = s.order[1]
			if len(s.order) > 2 && s.order[2].id > next.id {
				next = s.order[2]
			}
		}
	}
	if s.base.total > 0 {
		switch {
		case top == nil || top.id < 0:
			top, next = &s.base, top
		case next == nil || next.id < 0:
			next = &s.base
		}
	}
	if top == nil || next == nil || next.id != top.id-1 {
		return view{top: top}
	}
	frac, e := math.Frexp(top.total)
	return view{top: top, next: next, shift: -e, total: frac + math.Ldexp(next.total, -bandWidth-e)}
}

// probability is the chance of drawing leaf i of band b.
func (v *view) probability(b *band, i int) float64 {
	switch {
	case b == v.top && v.next == nil:
		return b.levels[0][i] / b.total
	case b == v.top:
		return math.Ldexp(b.levels[0][i]/v.total, v.shift)
	case b == v.next:
		return math.Ldexp(b.levels[0][i]/v.total, v.shift-bandWidth)
	}
	return 0
}

func (s *prioritized) Sample() (Key, float64, error) {
	if b := &s.base; len(s.order) == 0 && b.total > 0 {
		// Every ordinary table: one band, so no view to build.
		i := b.descend(s.rng.Float64() * b.total)
		return b.keys[i], b.levels[0][i] / b.total, nil
	}
	v := s.view()
	b := v.top
	if b == nil {
		// No weight anywhere, so every key is in the base band.
		n := len(s.base.keys)
		if n == 0 {
			return 0, 0, ErrEmpty
		}
		return s.base.keys[s.rng.IntN(n)], 1 / float64(n), nil
	}
	var i int
	if v.next == nil {
		i = b.descend(s.rng.Float64() * b.total)
	} else if u, top := s.rng.Float64()*v.total, math.Ldexp(b.total, v.shift); u < top {
		i = b.descend(math.Ldexp(u, -v.shift))
	} else {
		b = v.next
		i = b.descend(math.Ldexp(u-top, bandWidth-v.shift))
	}
	return b.keys[i], v.probability(b, i), nil
}

// Clear keeps the base band's levels, the slices and the maps' storage: a
// cleared table usually refills to the same size.
func (s *prioritized) Clear() {
	for _, level := range s.base.levels {
		clear(level)
	}
	s.base.total = 0
	s.base.keys = s.base.keys[:0]
	clear(s.index)
	clear(s.far)
	clear(s.bands)
	clear(s.order)
	s.order = s.order[:0]
}

func (s *prioritized) Len() int { return len(s.index) + len(s.far) }

func (s *prioritized) Options() Options {
	return Options{Kind: KindPrioritized, Exponent: s.exponent}
}

// Weight leaves out the bands below the two it draws from, as Sample does:
// their share of the total is below 2^-1536.
func (s *prioritized) Weight() (float64, int64) {
	v := s.view()
	if v.top == nil {
		return 0, 0
	}
	scale := bandWidth * v.top.id
	if v.next == nil {
		frac, exp := math.Frexp(v.top.total)
		return frac, int64(exp) + scale
	}
	frac, exp := math.Frexp(v.total)
	return frac, int64(exp-v.shift) + scale
}
