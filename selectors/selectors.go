// Package selectors holds the strategies a replay table uses to choose items:
// which item a sample returns (the sampler) and which item leaves when the
// table is full (the remover). Every strategy implements Selector, so any of
// them can serve in either role.
//
// Selectors know nothing of item contents, tables or I/O; they keep keys and
// priorities only. They are not safe for concurrent use: the owning table
// serialises access.
package selectors

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// Key identifies an item within a table.
type Key = uint64

// Errors returned by selectors. Match them with errors.Is.
var (
	// ErrKeyExists is returned by Insert for a key the selector already holds.
	ErrKeyExists = errors.New("selectors: key already present")
	// ErrKeyNotFound is returned by Update and Delete for an unknown key.
	ErrKeyNotFound = errors.New("selectors: key not found")
	// ErrEmpty is returned by Sample when the selector holds no keys.
	ErrEmpty = errors.New("selectors: empty")
	// ErrInvalidPriority is returned for NaN, infinite or negative
	// priorities, by every selector alike (see CheckPriority).
	ErrInvalidPriority = errors.New("selectors: invalid priority")
	// ErrInvalidOptions is returned by New for an unknown kind or a bad parameter.
	ErrInvalidOptions = errors.New("selectors: invalid options")
)

// Selector chooses keys. Sample returns a key and the probability with which
// it was chosen; deterministic strategies (Fifo, Lifo, heaps) report 1.
// Every strategy validates priorities, even those that ignore them, and an
// operation that returns an error leaves the selector as it was.
type Selector interface {
	Insert(key Key, priority float64) error
	Update(key Key, priority float64) error
	Delete(key Key) error
	Sample() (key Key, probability float64, err error)
	Clear()
	Len() int
	// Weight is the total weight Sample draws by, as a fraction in [0.5, 1)
	// times 2^exp (0 and 0 when nothing has weight): the sum of priority^α
	// for Prioritized, the number of keys for every other strategy. A table
	// spread over shards picks a shard in proportion to it; as a pair it
	// holds totals beyond float64's range, which Prioritized can reach.
	Weight() (frac float64, exp int64)
	// Options describes the selector so that an identical empty one can be
	// built again with New (for snapshots, info and config).
	Options() Options
}

// Kind names a selection strategy.
type Kind string

// The strategies.
const (
	KindFifo        Kind = "fifo"
	KindLifo        Kind = "lifo"
	KindUniform     Kind = "uniform"
	KindPrioritized Kind = "prioritized"
	KindMaxHeap     Kind = "max_heap"
	KindMinHeap     Kind = "min_heap"
)

// Options is the serialisable description of a selector.
type Options struct {
	Kind Kind `json:"kind"`
	// Exponent is the priority exponent α of Prioritized; ignored otherwise.
	Exponent float64 `json:"exponent,omitempty"`
}

// String gives the form used in logs and info output, e.g. "prioritized(0.6)".
func (o Options) String() string {
	if o.Kind == KindPrioritized {
		return fmt.Sprintf("%s(%g)", o.Kind, o.Exponent)
	}
	return string(o.Kind)
}

// Validate reports whether New would accept o.
func (o Options) Validate() error {
	switch o.Kind {
	case KindFifo, KindLifo, KindUniform, KindMaxHeap, KindMinHeap:
		return nil
	case KindPrioritized:
		if math.IsNaN(o.Exponent) || math.IsInf(o.Exponent, 0) || o.Exponent < 0 {
			return fmt.Errorf("%w: prioritized exponent must be finite and >= 0, got %v", ErrInvalidOptions, o.Exponent)
		}
		return nil
	case "":
		return fmt.Errorf("%w: kind is empty (want one of fifo, lifo, uniform, prioritized, max_heap, min_heap)", ErrInvalidOptions)
	default:
		return fmt.Errorf("%w: unknown kind %q (want one of fifo, lifo, uniform, prioritized, max_heap, min_heap)", ErrInvalidOptions, o.Kind)
	}
}

// New builds an empty selector from its description. rng drives the random
// strategies (Uniform, Prioritized); nil means a randomly seeded source.
// Tests pass a seeded source for reproducible draws.
func New(o Options, rng *rand.Rand) (Selector, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	switch o.Kind {
	case KindFifo:
		return NewFifo(), nil
	case KindLifo:
		return NewLifo(), nil
	case KindUniform:
		return NewUniform(rng), nil
	case KindPrioritized:
		return NewPrioritized(o.Exponent, rng)
	case KindMaxHeap:
		return NewMaxHeap(), nil
	default: // KindMinHeap; Validate rejected everything else.
		return NewMinHeap(), nil
	}
}

// CheckPriority returns an error wrapping ErrInvalidPriority for a priority
// that no selector accepts: NaN, infinite or negative. Every selector accepts
// every other priority.
func CheckPriority(p float64) error {
	if math.IsNaN(p) || math.IsInf(p, 0) || p < 0 {
		return fmt.Errorf("%w: %v (must be finite and >= 0)", ErrInvalidPriority, p)
	}
	return nil
}

// orRandom returns rng, or a randomly seeded source when rng is nil.
func orRandom(rng *rand.Rand) *rand.Rand {
	if rng == nil {
		return rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return rng
}

// countWeight is Weight for the strategies that weigh every key 1.
func countWeight(n int) (float64, int64) {
	frac, exp := math.Frexp(float64(n))
	return frac, int64(exp)
}

func errKeyExists(key Key) error { return fmt.Errorf("%w: %d", ErrKeyExists, key) }

func errKeyNotFound(key Key) error { return fmt.Errorf("%w: %d", ErrKeyNotFound, key) }
