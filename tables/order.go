package tables

import (
	"math"
	"math/rand/v2"

	"github.com/reprise-rl/reprise/selectors"
)

// listOrder is the Fifo or Lifo selector of a table, read off the list in
// which the table links its items in insertion order. A selector of its own
// would keep the same order in a second list and an index by key, which
// costs two map operations on every insert and eviction: the bulk of a
// Fifo-evicted table's work per item. Like selectors.NewFifo and NewLifo,
// it ignores priorities after checking them, and an update does not move
// an item. It is used under the table's lock, as every selector is.
type listOrder struct {
	t    *Table
	lifo bool
}

// orderSelector returns the selector for o: Fifo and Lifo come from the
// table's own list, the others from the selectors package.
func (t *Table) orderSelector(o selectors.Options, rng *rand.Rand) (selectors.Selector, error) {
	switch o.Kind {
	case selectors.KindFifo, selectors.KindLifo:
		if err := o.Validate(); err != nil {
			return nil, err
		}
		return listOrder{t: t, lifo: o.Kind == selectors.KindLifo}, nil
	}
	return selectors.New(o, rng)
}

func (l listOrder) Insert(_ selectors.Key, priority float64) error {
	return selectors.CheckPriority(priority)
}

func (l listOrder) Update(_ selectors.Key, priority float64) error {
	return selectors.CheckPriority(priority)
}

func (l listOrder) Delete(selectors.Key) error { return nil }

func (l listOrder) Sample() (selectors.Key, float64, error) {
	e := l.t.head
	if l.lifo {
		e = l.t.tail
	}
	if e == nil {
		return 0, 0, selectors.ErrEmpty
	}
	return e.key, 1, nil
}

func (l listOrder) Clear() {}

func (l listOrder) Len() int { return len(l.t.items) }

func (l listOrder) Weight() (float64, int64) {
	frac, exp := math.Frexp(float64(len(l.t.items)))
	return frac, int64(exp)
}

func (l listOrder) Options() selectors.Options {
	if l.lifo {
		return selectors.Options{Kind: selectors.KindLifo}
	}
	return selectors.Options{Kind: selectors.KindFifo}
}
