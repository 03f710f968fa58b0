package wire

// keyIndex finds keys by value in a list its user keeps (a sample
// response's chunk keys): an open-addressing table of positions in the
// list, sized once for at most n keys and never more than half full. A
// response has few keys, each looked up a few times: a map would cost
// allocations per bucket group, sorting more than all the lookups.
type keyIndex struct {
	slots []int32 // position + 1; 0 is empty
	shift uint
}

func newKeyIndex(n int) keyIndex {
	var x keyIndex
	x.reset(n)
	return x
}

// reset empties the index and sizes it for n keys, in the slots it has
// when they suffice.
func (x *keyIndex) reset(n int) {
	bits := uint(1)
	for 1<<bits < 2*n {
		bits++
	}
	if cap(x.slots) >= 1<<bits {
		x.slots = x.slots[:1<<bits]
		clear(x.slots)
	} else {
		x.slots = make([]int32, 1<<bits)
	}
	x.shift = 64 - bits
}

// slot is where the search for key starts: Fibonacci hashing spreads keys
// that differ only in their low or high bits.
func (x *keyIndex) slot(key uint64) int { return int((key * 0x9E3779B97F4A7C15) >> x.shift) }

// add records that keys[i] is at i, and reports false when an equal key is
// recorded already.
func (x *keyIndex) add(keys []uint64, i int) bool {
	mask := len(x.slots) - 1
	for s := x.slot(keys[i]); ; s = (s + 1) & mask {
		switch p := x.slots[s]; {
		case p == 0:
			x.slots[s] = int32(i + 1)
			return true
		case keys[p-1] == keys[i]:
			return false
		}
	}
}

// find is the position of key in keys, if recorded.
func (x *keyIndex) find(keys []uint64, key uint64) (int, bool) {
	mask := len(x.slots) - 1
	for s := x.slot(key); ; s = (s + 1) & mask {
		p := x.slots[s]
		if p == 0 {
			return 0, false
		}
		if keys[p-1] == key {
			return int(p - 1), true
		}
	}
}
