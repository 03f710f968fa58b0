package selectors

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

var (
	benchOptions = []Options{
		{Kind: KindFifo},
		{Kind: KindLifo},
		{Kind: KindUniform},
		{Kind: KindPrioritized, Exponent: 0.6},
		{Kind: KindMaxHeap},
		{Kind: KindMinHeap},
	}
	benchSizes = []int{1_000, 100_000, 1_000_000}
)

// benchPriorities is a cycle of random priorities, drawn ahead so that the
// draws are not measured.
var benchPriorities = func() []float64 {
	rng := rand.New(rand.NewPCG(1, 2))
	p := make([]float64, 1<<16)
	for i := range p {
		p[i] = rng.Float64() * 100
	}
	return p
}()

func priorityOf(i int) float64 { return benchPriorities[i%len(benchPriorities)] }

// runSized runs bench for every selector and size on a selector holding keys
// 0..n-1.
func runSized(b *testing.B, bench func(b *testing.B, s Selector, n int)) {
	for _, o := range benchOptions {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("%v/n=%d", o, n), func(b *testing.B) {
				s, err := New(o, rand.New(rand.NewPCG(3, 4)))
				if err != nil {
					b.Fatal(err)
				}
				for i := range n {
					if err := s.Insert(Key(i), priorityOf(i)); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				bench(b, s, n)
			})
		}
	}
}

// permutation is a random order of the keys 0..n-1.
func permutation(n int) []Key {
	keys := make([]Key, n)
	for i, j := range rand.New(rand.NewPCG(5, 6)).Perm(n) {
		keys[i] = Key(j)
	}
	return keys
}

// BenchmarkInsert inserts new keys into a selector holding n to 1.1n keys;
// the timer stops while every tenth-of-n batch is deleted again.
func BenchmarkInsert(b *testing.B) {
	runSized(b, func(b *testing.B, s Selector, n int) {
		batch := n / 10
		next, pending := n, 0
		for b.Loop() {
			if pending == batch {
				b.StopTimer()
				for k := next - batch; k < next; k++ {
					if err := s.Delete(Key(k)); err != nil {
						b.Fatal(err)
					}
				}
				pending = 0
				b.StartTimer()
			}
			if err := s.Insert(Key(next), priorityOf(next)); err != nil {
				b.Fatal(err)
			}
			next++
			pending++
		}
	})
}

// BenchmarkDelete deletes keys in random order from a selector holding 0.9n
// to n keys; the timer stops while every tenth-of-n batch is inserted again.
func BenchmarkDelete(b *testing.B) {
	runSized(b, func(b *testing.B, s Selector, n int) {
		order := permutation(n)
		batch := n / 10
		i, pending := 0, 0
		for b.Loop() {
			if pending == batch {
				b.StopTimer()
				for j := i - batch; j < i; j++ {
					k := order[j%n]
					if err := s.Insert(k, priorityOf(int(k))); err != nil {
						b.Fatal(err)
					}
				}
				pending = 0
				b.StartTimer()
			}
			if err := s.Delete(order[i%n]); err != nil {
				b.Fatal(err)
			}
			i++
			pending++
		}
	})
}

// BenchmarkUpdate gives random keys new random priorities.
func BenchmarkUpdate(b *testing.B) {
	runSized(b, func(b *testing.B, s Selector, n int) {
		order := permutation(n)
		i := 0
		for b.Loop() {
			if err := s.Update(order[i%n], priorityOf(i+n)); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

func BenchmarkSample(b *testing.B) {
	runSized(b, func(b *testing.B, s Selector, _ int) {
		for b.Loop() {
			if _, _, err := s.Sample(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPrioritizedHostile alternates inserting and deleting a key of
// priority 1e308 in a selector of n ordinary keys, one operation per
// iteration: the pattern that would rescale every leaf each time if all
// leaves shared one scale. Its cost must not grow with n.
func BenchmarkPrioritizedHostile(b *testing.B) {
	for _, exponent := range []float64{1, 3} {
		for _, n := range []int{10_000, 1_000_000} {
			b.Run(fmt.Sprintf("exponent=%g/n=%d", exponent, n), func(b *testing.B) {
				s, err := NewPrioritized(exponent, rand.New(rand.NewPCG(3, 4)))
				if err != nil {
					b.Fatal(err)
				}
				for i := range n {
					if err := s.Insert(Key(i), priorityOf(i)); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				huge, i := Key(n), 0
				for b.Loop() {
					if i%2 == 0 {
						err = s.Insert(huge, 1e308)
					} else {
						err = s.Delete(huge)
					}
					if err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
	}
}
