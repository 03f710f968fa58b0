package tables

import (
	"math/rand/v2"
	"testing"
)

// numberedKeys is a keySource over a slice: the thing numbered n has key
// (*k)[n].
type numberedKeys struct{ k *[]uint64 }

func (k numberedKeys) keyOf(n uint32) uint64 { return (*k.k)[n] }

// keyIndex against a map, through random inserts and removes at every
// fill of small tables, where runs of slots wrap round the end.
func TestKeyIndexModel(t *testing.T) {
	for _, seed := range []uint64{0, 1, 2, 3} {
		rng := rand.New(rand.NewPCG(seed, 9))
		var keys []uint64
		x := newKeyIndex(numberedKeys{&keys})
		x.seed = seed // reproducible
		want := map[uint64]uint32{}
		var free []uint32
		// Few distinct keys, so that removes and re-inserts meet.
		keyspace := uint64(50 + rng.IntN(500))
		for step := range 20000 {
			key := rng.Uint64N(keyspace) * 0x100000001 // high and low bits alike
			if rng.IntN(8) == 0 {
				// Prefetching, even before the first insert, changes nothing.
				x.prefetch([]uint64{key, rng.Uint64(), key + 1})
			}
			n, ok := x.find(key)
			wn, wok := want[key]
			if ok != wok || (ok && n != wn) {
				t.Fatalf("seed %d step %d: find(%d) = %d, %v; want %d, %v", seed, step, key, n, ok, wn, wok)
			}
			switch {
			case ok && rng.IntN(2) == 0:
				x.remove(key)
				delete(want, key)
				free = append(free, n)
			case !ok:
				var num uint32
				if len(free) > 0 {
					num, free = free[len(free)-1], free[:len(free)-1]
					keys[num] = key
				} else {
					num = uint32(len(keys))
					keys = append(keys, key)
				}
				x.insert(num)
				want[key] = num
			}
			if x.len() != len(want) {
				t.Fatalf("seed %d step %d: len %d, want %d", seed, step, x.len(), len(want))
			}
			if x.len()*4 > len(x.slots)*3 {
				t.Fatalf("seed %d step %d: %d things in %d slots", seed, step, x.len(), len(x.slots))
			}
		}
		for key, wn := range want {
			if n, ok := x.find(key); !ok || n != wn {
				t.Fatalf("seed %d: find(%d) = %d, %v at the end; want %d", seed, key, n, ok, wn)
			}
		}
		x.remove(keyspace * 0x100000001) // never inserted: a no-op
		if x.len() != len(want) {
			t.Fatalf("seed %d: removing an absent key changed len to %d", seed, x.len())
		}
		x.clear()
		if _, ok := x.find(keys[0]); ok || x.len() != 0 {
			t.Fatalf("seed %d: clear left things behind", seed)
		}
	}
}
