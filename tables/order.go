package tables

import (
	"math"
	"math/rand/v2"

	"github.com/reprise-rl/reprise/selectors"
)

// order is a table's sampler or remover, driven by the table's entries
// under its lock. The table has checked every priority and key before it
// calls one, so none of them fails.
//
// Fifo, Lifo and Uniform are the table's own (listOrder, uniformOrder): a
// selector of the selectors package keeps its own index by key, which costs
// map operations on every insert and eviction, and a lookup of the picked
// key in the table's items after every draw; those were the bulk of a
// table's work per item. The others wrap the package's selector (keyed).
// Each draws exactly as its selectors-package namesake does, from the same
// random source.
type order interface {
	insert(e *entry)
	// update is called before e.priority changes to priority.
	update(e *entry, priority float64)
	delete(e *entry)
	// pick draws an entry and its probability; the table is not empty.
	pick() (*entry, float64)
	clear()
	weight() (fraction float64, exponent int64)
	kind() selectors.Kind
}

// orderFor returns the order for o in role (a table's sampler and remover
// have roles 0 and 1: an entry keeps a uniform position for each).
func (t *Table) orderFor(o selectors.Options, role int, rng *rand.Rand) (order, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	switch o.Kind {
	case selectors.KindFifo, selectors.KindLifo:
		return listOrder{t: t, lifo: o.Kind == selectors.KindLifo}, nil
	case selectors.KindUniform:
		if rng == nil {
			rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
		}
		return &uniformOrder{t: t, role: role, rng: rng}, nil
	}
	sel, err := selectors.New(o, rng)
	if err != nil {
		return nil, err
	}
	return keyed{sel: sel, t: t}, nil
}

// listOrder is Fifo or Lifo, read off the list in which the table links its
// items in insertion order. Like selectors.NewFifo and NewLifo, an update
// does not move an item.
type listOrder struct {
	t    *Table
	lifo bool
}

func (listOrder) insert(*entry)          {}
func (listOrder) update(*entry, float64) {}
func (listOrder) delete(*entry)          {}
func (listOrder) clear()                 {}

func (l listOrder) pick() (*entry, float64) {
	if l.lifo {
		return l.t.tail, 1
	}
	return l.t.head, 1
}

func (l listOrder) weight() (float64, int64) { return countWeight(l.t.items.len()) }

func (l listOrder) kind() selectors.Kind {
	if l.lifo {
		return selectors.KindLifo
	}
	return selectors.KindFifo
}

// uniformOrder is Uniform: the entries in an array (by ref, half the size
// of pointers), each knowing its place, so that a delete moves the last
// entry into the hole.
type uniformOrder struct {
	t       *Table
	role    int
	rng     *rand.Rand
	entries []uint32
}

func (u *uniformOrder) insert(e *entry) {
	e.pos[u.role] = int32(len(u.entries))
	u.entries = append(u.entries, e.ref)
}

func (u *uniformOrder) update(*entry, float64) {}

func (u *uniformOrder) delete(e *entry) {
	i, last := e.pos[u.role], len(u.entries)-1
	if int(i) != last {
		moved := u.entries[last]
		u.entries[i] = moved
		u.t.entryAt(moved).pos[u.role] = i
	}
	u.entries = u.entries[:last]
}

func (u *uniformOrder) pick() (*entry, float64) {
	n := len(u.entries)
	return u.t.entryAt(u.entries[u.rng.IntN(n)]), 1 / float64(n)
}

// clear keeps the array: a cleared table usually refills to the same size.
func (u *uniformOrder) clear() { u.entries = u.entries[:0] }

func (u *uniformOrder) weight() (float64, int64) { return countWeight(len(u.entries)) }

func (u *uniformOrder) kind() selectors.Kind { return selectors.KindUniform }

// keyed is a selector of the selectors package (Prioritized and the heaps).
type keyed struct {
	sel selectors.Selector
	t   *Table
}

func (k keyed) insert(e *entry) { must(k.sel.Insert(e.key, e.priority)) }

func (k keyed) update(e *entry, priority float64) { must(k.sel.Update(e.key, priority)) }

func (k keyed) delete(e *entry) { must(k.sel.Delete(e.key)) }

func (k keyed) pick() (*entry, float64) {
	key, prob, err := k.sel.Sample()
	must(err)
	e, _ := k.t.lookup(key)
	return e, prob
}

func (k keyed) clear() { k.sel.Clear() }

func (k keyed) weight() (float64, int64) { return k.sel.Weight() }

func (k keyed) kind() selectors.Kind { return k.sel.Options().Kind }

// countWeight is the weight of n items that weigh 1 each, as the selectors
// package reports it.
func countWeight(n int) (float64, int64) {
	frac, exp := math.Frexp(float64(n))
	return frac, int64(exp)
}
