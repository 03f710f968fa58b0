package selectors

import "math/rand/v2"

// uniform keeps its keys densely in a slice so that a draw is one random
// index; deleting moves the last key into the hole.
type uniform struct {
	rng   *rand.Rand
	keys  []Key
	index map[Key]int // key -> position in keys
}

// NewUniform returns a selector that picks every key with probability 1/n.
// Priorities are validated but otherwise ignored. rng drives the draws; nil
// means a randomly seeded source.
func NewUniform(rng *rand.Rand) Selector {
	return &uniform{rng: orRandom(rng), index: make(map[Key]int)}
}

func (u *uniform) Insert(key Key, priority float64) error {
	if err := CheckPriority(priority); err != nil {
		return err
	}
	if _, ok := u.index[key]; ok {
		return errKeyExists(key)
	}
	u.index[key] = len(u.keys)
	u.keys = append(u.keys, key)
	return nil
}

func (u *uniform) Update(key Key, priority float64) error {
	if err := CheckPriority(priority); err != nil {
		return err
	}
	if _, ok := u.index[key]; !ok {
		return errKeyNotFound(key)
	}
	return nil
}

func (u *uniform) Delete(key Key) error {
	i, ok := u.index[key]
	if !ok {
		return errKeyNotFound(key)
	}
	last := len(u.keys) - 1
	if i != last {
		moved := u.keys[last]
		u.keys[i] = moved
		u.index[moved] = i
	}
	u.keys = u.keys[:last]
	delete(u.index, key)
	return nil
}

func (u *uniform) Sample() (Key, float64, error) {
	n := len(u.keys)
	if n == 0 {
		return 0, 0, ErrEmpty
	}
	return u.keys[u.rng.IntN(n)], 1 / float64(n), nil
}

// Clear keeps the slice and the map's storage: a cleared table usually
// refills to the same size.
func (u *uniform) Clear() {
	u.keys = u.keys[:0]
	clear(u.index)
}

func (u *uniform) Len() int { return len(u.keys) }

func (u *uniform) Options() Options { return Options{Kind: KindUniform} }

func (u *uniform) Weight() (float64, int64) { return countWeight(len(u.keys)) }
