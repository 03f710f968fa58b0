package selectors

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// prioritized samples key k with probability w(k)/Σw where w(k) = p(k)^α.
//
// The weights sit in the leaves of a complete binary sum tree stored as an
// array: the root is tree[1], node i has children 2i and 2i+1, and leaf i of
// capacity leaves is tree[capacity+i]. Keys occupy leaves 0..n-1 densely, so a
// delete moves the last key into the hole, and the leaves past n weigh 0.
//
// Every internal node is recomputed as left+right from its children whenever
// a leaf below it changes; nothing is ever added or subtracted as a delta.
// Each node is therefore a pure function of the current leaves, the root is
// exactly the tree-ordered sum of the weights, and no rounding error
// accumulates however many updates are made (Reverb adds deltas and has to
// rebuild its tree when drift exceeds a threshold).
type prioritized struct {
	exponent float64
	rng      *rand.Rand
	keys     []Key       // keys[i] owns leaf i
	index    map[Key]int // key -> leaf
	tree     []float64   // len 2*capacity; tree[0] is unused
}

// minCapacity is the number of leaves of the first tree.
const minCapacity = 16

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

func (s *prioritized) capacity() int { return len(s.tree) / 2 }

// set stores w in leaf i and recomputes the path above it.
func (s *prioritized) set(i int, w float64) {
	t := s.tree
	p := s.capacity() + i
	t[p] = w
	for p > 1 {
		p >>= 1
		t[p] = t[2*p] + t[2*p+1]
	}
}

// grow doubles the number of leaves. Rebuilding every internal node from its
// children yields the values incremental updates would have, and the new root
// is the old root plus an empty subtree: the total does not change.
func (s *prioritized) grow() {
	c := max(minCapacity, 2*s.capacity())
	t := make([]float64, 2*c)
	copy(t[c:], s.tree[s.capacity():])
	for p := c - 1; p >= 1; p-- {
		t[p] = t[2*p] + t[2*p+1]
	}
	s.tree = t
}

func (s *prioritized) overflow(priority float64) error {
	return fmt.Errorf("%w: %v makes the sum of priority^%v overflow float64", ErrInvalidPriority, priority, s.exponent)
}

func (s *prioritized) Insert(key Key, priority float64) error {
	if err := checkPriority(priority); err != nil {
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
	if math.IsInf(s.tree[1], 0) {
		s.set(i, 0)
		return s.overflow(priority)
	}
	s.keys = append(s.keys, key)
	s.index[key] = i
	return nil
}

func (s *prioritized) Update(key Key, priority float64) error {
	if err := checkPriority(priority); err != nil {
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
	old := s.tree[s.capacity()+i]
	s.set(i, w)
	if math.IsInf(s.tree[1], 0) {
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
		s.set(i, s.tree[s.capacity()+last])
	}
	s.set(last, 0)
	s.keys = s.keys[:last]
	delete(s.index, key)
	return nil
}

// Sample descends from the root, going left when the draw falls within the
// left subtree's sum. It only ever enters a subtree of positive sum: a node is
// positive only if one of its children is, and the descent turns to the other
// child whenever one of them is 0. So the walk ends on a positive leaf below n
// whatever the rounding of the draw and the subtractions.
func (s *prioritized) Sample() (Key, float64, error) {
	n := len(s.keys)
	if n == 0 {
		return 0, 0, ErrEmpty
	}
	t := s.tree
	total := t[1]
	if total == 0 {
		return s.keys[s.rng.IntN(n)], 1 / float64(n), nil
	}
	u := s.rng.Float64() * total
	c := s.capacity()
	p := 1
	for p < c {
		p *= 2
		l, r := t[p], t[p+1]
		if u >= l && r > 0 {
			u -= l
			p++
		}
	}
	return s.keys[p-c], t[p] / total, nil
}

// Clear keeps the tree, the slice and the map's storage: a cleared table
// usually refills to the same size.
func (s *prioritized) Clear() {
	clear(s.tree)
	s.keys = s.keys[:0]
	clear(s.index)
}

func (s *prioritized) Len() int { return len(s.keys) }

func (s *prioritized) Options() Options {
	return Options{Kind: KindPrioritized, Exponent: s.exponent}
}
