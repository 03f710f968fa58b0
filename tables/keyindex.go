package tables

import "math/rand/v2"

// keyIndex finds things by their uint64 keys: an open-addressing table of
// the things' numbers, probed linearly and kept at most 3/4 full. Each slot
// holds a number with 32 bits of its key's hash, so that probes, moves and
// growth read no other memory than the slots; K reads a thing's key only
// to confirm a match, and to place a thing the index has not seen. It costs
// 11 to 22 bytes a thing, where a Go map from the keys to pointers costs 24
// to 38. A random seed keeps a client that picks keys from lining them up
// in one run of slots.
type keyIndex[K keySource] struct {
	keys  K
	slots []uint64 // hash<<32 | (number + 1); 0 is empty
	n     int
	seed  uint64
	// prefetched is where prefetch leaves its reads, which the compiler
	// would otherwise drop.
	prefetched uint64
}

// keySource gives the key of the thing numbered n.
type keySource interface{ keyOf(n uint32) uint64 }

func newKeyIndex[K keySource](keys K) keyIndex[K] {
	return keyIndex[K]{keys: keys, seed: rand.Uint64()}
}

// hash is splitmix64's finalizer of the seeded key, so that keys differing
// in any bits spread; its low 32 bits are kept, and place a thing.
func (x *keyIndex[K]) hash(key uint64) uint64 {
	z := key ^ x.seed
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return (z ^ z>>31) & 0xffffffff
}

// prefetch reads the slot where the search for each key starts, and keeps
// their sum so that the reads stay. The reads depend on nothing but the
// keys, so the CPU overlaps their cache misses; the searches for the same
// keys that follow then find those slots in cache instead of missing on
// each in turn. It changes nothing the index means.
func (x *keyIndex[K]) prefetch(keys []uint64) {
	var sum uint64
	for _, k := range keys {
		sum += x.touch(k)
	}
	x.prefetched = sum
}

// touch reads the slot where the search for key starts, for a caller that
// keeps the value (see prefetch).
func (x *keyIndex[K]) touch(key uint64) uint64 {
	if len(x.slots) == 0 {
		return 0
	}
	return x.slots[int(x.hash(key))&(len(x.slots)-1)]
}

// home is the slot where the search for a thing of slot value v starts.
func (x *keyIndex[K]) home(v uint64) int { return int(v>>32) & (len(x.slots) - 1) }

func (x *keyIndex[K]) len() int { return x.n }

// find is the number of the thing with key.
func (x *keyIndex[K]) find(key uint64) (uint32, bool) {
	if x.n == 0 {
		return 0, false
	}
	s, ok := x.slotOf(key)
	if !ok {
		return 0, false
	}
	return uint32(x.slots[s]) - 1, true
}

// slotOf is the slot of the thing with key.
func (x *keyIndex[K]) slotOf(key uint64) (int, bool) {
	h := x.hash(key)
	mask := len(x.slots) - 1
	for s := int(h) & mask; ; s = (s + 1) & mask {
		v := x.slots[s]
		if v == 0 {
			return 0, false
		}
		if v>>32 == h && x.keys.keyOf(uint32(v)-1) == key {
			return s, true
		}
	}
}

// insert records the thing numbered n (below 2^32 - 1), whose key the
// index does not hold.
func (x *keyIndex[K]) insert(n uint32) {
	if (x.n+1)*4 > len(x.slots)*3 {
		x.grow()
	}
	x.place(x.hash(x.keys.keyOf(n))<<32 | uint64(n+1))
	x.n++
}

func (x *keyIndex[K]) place(v uint64) {
	mask := len(x.slots) - 1
	s := x.home(v)
	for x.slots[s] != 0 {
		s = (s + 1) & mask
	}
	x.slots[s] = v
}

func (x *keyIndex[K]) grow() {
	old := x.slots
	x.slots = make([]uint64, max(8, 2*len(old)))
	for _, v := range old {
		if v != 0 {
			x.place(v)
		}
	}
}

// remove forgets the thing with key, if recorded. The slots after it that
// its removal would cut off from their home move back, so no search ever
// stops early at the hole: there are no tombstones to fill the table.
func (x *keyIndex[K]) remove(key uint64) {
	if x.n == 0 {
		return
	}
	hole, ok := x.slotOf(key)
	if !ok {
		return
	}
	mask := len(x.slots) - 1
	for s := (hole + 1) & mask; x.slots[s] != 0; s = (s + 1) & mask {
		// The thing in s may fill the hole unless its home lies after the
		// hole, up to s, going round.
		if h := x.home(x.slots[s]); (s-h)&mask >= (s-hole)&mask {
			x.slots[hole] = x.slots[s]
			hole = s
		}
	}
	x.slots[hole] = 0
	x.n--
}

// clear forgets everything, keeping the table for what comes next (a
// cleared table usually refills to its size).
func (x *keyIndex[K]) clear() {
	clear(x.slots)
	x.n = 0
}
