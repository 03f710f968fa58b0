package selectors

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// prioritized samples key k with probability w(k)/Σw where w(k) = p(k)^α.
//
// The weights are the leaves of a sum tree of fanout 8, stored level by
// level: levels[0] holds the leaves and levels[l+1][j] is the sum of the
// group levels[l][8j:8j+8]. The root, total, is the sum of the top level, which
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
type prioritized struct {
	exponent float64
	rng      *rand.Rand
	keys     []Key       // keys[i] owns leaf i
	index    map[Key]int // key -> leaf
	levels   [][]float64 // leaves first; every level a power of two >= 8 long
	total    float64
}

const fanout = 8

// sumGroup adds a group of siblings in a fixed order.
func sumGroup(g *[fanout]float64) float64 {
	return ((g[0] + g[1]) + (g[2] + g[3])) + ((g[4] + g[5]) + (g[6] + g[7]))
}

// group returns the j-th group of siblings of a level.
func group(level []float64, j int) *[fanout]float64 {
	return (*[fanout]float64)(level[j*fanout:])
}

// NewPrioritized returns a selector that picks a key with probability
// proportional to its priority raised to exponent: 0 makes every key equally
// likely (priority 0 included), 1 is proportional to priority. For exponent > 0
// a key of priority 0 is never picked unless every key has priority 0, in
// which case the pick is uniform. rng drives the draws; nil means a randomly
// seeded source.
//
// Insert and Update return ErrInvalidPriority when priority^exponent, or the
// sum of all of them, would not fit in a float64.
func NewPrioritized(exponent float64, rng *rand.Rand) (Selector, error) {
	if err := (Options{Kind: KindPrioritized, Exponent: exponent}).Validate(); err != nil {
		return nil, err
	}
	return &prioritized{exponent: exponent, rng: orRandom(rng), index: make(map[Key]int)}, nil
}

// weight is priority^exponent, with exponent 0 weighing every key 1.
func (s *prioritized) weight(priority float64) (float64, error) {
	switch {
	case s.exponent == 0:
		return 1, nil
	case priority == 0:
		return 0, nil // also turns -0 into +0
	case s.exponent == 1:
		return priority, nil
	}
	w := math.Pow(priority, s.exponent)
	if math.IsInf(w, 0) {
		return 0, fmt.Errorf("%w: %v^%v overflows float64", ErrInvalidPriority, priority, s.exponent)
	}
	return w, nil
}

func (s *prioritized) capacity() int {
	if len(s.levels) == 0 {
		return 0
	}
	return len(s.levels[0])
}

// set stores w in leaf i and recomputes the path above it.
func (s *prioritized) set(i int, w float64) {
	s.levels[0][i] = w
	for l := 1; l < len(s.levels); l++ {
		i /= fanout
		s.levels[l][i] = sumGroup(group(s.levels[l-1], i))
	}
	s.total = sumGroup(group(s.levels[len(s.levels)-1], 0))
}

// grow doubles the number of leaves and rebuilds the levels above them, which
// yields the values incremental updates would have.
func (s *prioritized) grow() {
	leaves := make([]float64, max(fanout, 2*s.capacity()))
	if s.capacity() > 0 {
		copy(leaves, s.levels[0])
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
	s.levels = levels
}

func (s *prioritized) overflow(priority float64) error {
	return fmt.Errorf("%w: %v makes the sum of priority^%v overflow float64", ErrInvalidPriority, priority, s.exponent)
}

func (s *prioritized) Insert(key Key, priority float64) error {
	if err := CheckPriority(priority); err != nil {
		return err
	}
	if _, ok := s.index[key]; ok {
		return errKeyExists(key)
	}
	w, err := s.weight(priority)
	if err != nil {
		return err
	}
	i := len(s.keys)
	if i == s.capacity() {
		s.grow()
	}
	s.set(i, w)
	if math.IsInf(s.total, 0) {
		s.set(i, 0)
		return s.overflow(priority)
	}
	s.keys = append(s.keys, key)
	s.index[key] = i
	return nil
}

func (s *prioritized) Update(key Key, priority float64) error {
	if err := CheckPriority(priority); err != nil {
		return err
	}
	i, ok := s.index[key]
	if !ok {
		return errKeyNotFound(key)
	}
	w, err := s.weight(priority)
	if err != nil {
		return err
	}
	old := s.levels[0][i]
	s.set(i, w)
	if math.IsInf(s.total, 0) {
		// Recomputing from the restored leaf restores every node bit for bit.
		s.set(i, old)
		return s.overflow(priority)
	}
	return nil
}

func (s *prioritized) Delete(key Key) error {
	i, ok := s.index[key]
	if !ok {
		return errKeyNotFound(key)
	}
	last := len(s.keys) - 1
	if i != last {
		moved := s.keys[last]
		s.keys[i] = moved
		s.index[moved] = i
		s.set(i, s.levels[0][last])
	}
	s.set(last, 0)
	s.keys = s.keys[:last]
	delete(s.index, key)
	return nil
}

// Sample descends from the root, at each level entering the child within
// whose sum the remaining draw falls. It only ever enters a child of positive
// sum, and when rounding of the draw or of the subtractions carries it past
// every child of a group, it takes the last positive one. So the walk ends on
// a positive leaf below n however the floats round.
func (s *prioritized) Sample() (Key, float64, error) {
	n := len(s.keys)
	if n == 0 {
		return 0, 0, ErrEmpty
	}
	if s.total == 0 {
		return s.keys[s.rng.IntN(n)], 1 / float64(n), nil
	}
	u := s.rng.Float64() * s.total
	i := 0
	for l := len(s.levels) - 1; l >= 0; l-- {
		g := group(s.levels[l], i)
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
	return s.keys[i], s.levels[0][i] / s.total, nil
}

// Clear keeps the levels, the slice and the map's storage: a cleared table
// usually refills to the same size.
func (s *prioritized) Clear() {
	for _, level := range s.levels {
		clear(level)
	}
	s.total = 0
	s.keys = s.keys[:0]
	clear(s.index)
}

func (s *prioritized) Len() int { return len(s.keys) }

func (s *prioritized) Options() Options {
	return Options{Kind: KindPrioritized, Exponent: s.exponent}
}
