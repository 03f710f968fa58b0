package tables

import (
	"fmt"
	"math"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

// QueueConfig describes a FIFO queue of at most size items: every item is
// sampled exactly once, in insertion order, and inserts wait while the queue
// is full.
func QueueConfig(name string, size int64) Config {
	return Config{
		Name:            name,
		Sampler:         selectors.Options{Kind: selectors.KindFifo},
		Remover:         selectors.Options{Kind: selectors.KindFifo},
		MaxSize:         size,
		MaxTimesSampled: 1,
		Limiter:         limiter.Queue(size),
	}
}

// StackConfig is QueueConfig's LIFO twin: the newest item is sampled first.
func StackConfig(name string, size int64) Config {
	return Config{
		Name:            name,
		Sampler:         selectors.Options{Kind: selectors.KindLifo},
		Remover:         selectors.Options{Kind: selectors.KindLifo},
		MaxSize:         size,
		MaxTimesSampled: 1,
		Limiter:         limiter.Stack(size),
	}
}

// MaxTableSize is the most items a table may hold: 2^31 - 1, which a
// table's Uniform selectors index with 32 bits to keep entries small (at
// about 600 bytes of bookkeeping an item, it is over a terabyte).
const MaxTableSize = math.MaxInt32

// Validate reports whether New would accept c, with an error wrapping
// ErrInvalidConfig that names the offending field.
func (c Config) Validate() error {
	if c.Name == "" {
		return fmt.Errorf("%w: name is empty", ErrInvalidConfig)
	}
	if err := c.Sampler.Validate(); err != nil {
		return fmt.Errorf("%w: table %q: sampler: %w", ErrInvalidConfig, c.Name, err)
	}
	if err := c.Remover.Validate(); err != nil {
		return fmt.Errorf("%w: table %q: remover: %w", ErrInvalidConfig, c.Name, err)
	}
	if c.MaxSize < 1 || c.MaxSize > MaxTableSize {
		return fmt.Errorf("%w: table %q: max_size must be between 1 and %d, got %d", ErrInvalidConfig, c.Name, MaxTableSize, c.MaxSize)
	}
	if err := checkLimiter(c.Limiter, c.MaxSize); err != nil {
		return fmt.Errorf("%w: table %q: %w", ErrInvalidConfig, c.Name, err)
	}
	if err := c.Signature.Validate(); err != nil {
		return fmt.Errorf("%w: table %q: %w", ErrInvalidConfig, c.Name, err)
	}
	if c.MaxStaleness != nil && *c.MaxStaleness < 0 {
		return fmt.Errorf("%w: table %q: max_staleness must be >= 0 (0 keeps only the current policy version), got %d", ErrInvalidConfig, c.Name, *c.MaxStaleness)
	}
	return nil
}

// checkLimiter rejects a limiter the table could not honour.
func checkLimiter(lim limiter.Config, maxSize int64) error {
	if err := lim.Validate(); err != nil {
		return fmt.Errorf("rate_limiter: %w", err)
	}
	if lim.MinSize > maxSize {
		return fmt.Errorf("rate_limiter: min_size (%d) > max_size (%d): the table could never hold enough items to sample", lim.MinSize, maxSize)
	}
	return nil
}

// Validate checks that every column has a distinct non-empty name, a dtype
// and a shape whose sizes are >= 0 or the wildcard -1.
func (s Signature) Validate() error {
	for i, c := range s {
		switch {
		case c.Name == "":
			return fmt.Errorf("signature[%d].name is empty", i)
		case c.DType == "":
			return fmt.Errorf("signature[%d] (%q): dtype is empty", i, c.Name)
		}
		for j := range i {
			if s[j].Name == c.Name {
				return fmt.Errorf("signature[%d] and signature[%d] are both named %q", j, i, c.Name)
			}
		}
		for _, d := range c.Shape {
			if d < -1 {
				return fmt.Errorf("signature[%d] (%q): shape %v has a size below -1", i, c.Name, c.Shape)
			}
		}
	}
	return nil
}

// match checks one column of an item against its spec. The column's shape
// is the chunks' step shape, preceded by the number of steps unless the
// column is squeezed (as in Reverb, where a signature of [T, ...] describes
// T-step columns).
func (cs *ColumnSpec) match(name string, c *Chunk, steps int64, squeeze bool) error {
	if name != cs.Name {
		return fmt.Errorf("%w: column %q is where the signature has %q", ErrSignature, name, cs.Name)
	}
	if c.DType != cs.DType {
		return fmt.Errorf("%w: column %q has dtype %s, signature wants %s", ErrSignature, name, c.DType, cs.DType)
	}
	lead := 1
	if squeeze {
		lead = 0
	}
	ok := len(cs.Shape) == lead+len(c.Shape)
	for i := 0; ok && i < len(cs.Shape); i++ {
		d := steps
		if i >= lead {
			d = c.Shape[i-lead]
		}
		ok = cs.Shape[i] == -1 || cs.Shape[i] == d
	}
	if !ok {
		shape := c.Shape
		if !squeeze {
			shape = append([]int64{steps}, c.Shape...)
		}
		return fmt.Errorf("%w: column %q has shape %v, signature wants %v", ErrSignature, name, shape, cs.Shape)
	}
	return nil
}

// checkTrajectory does the checks of an item's trajectory that need no
// chunk: the store's acquire does the rest.
func checkTrajectory(traj []Column, sig Signature) error {
	if len(traj) == 0 {
		return fmt.Errorf("%w: trajectory has no columns", ErrInvalidItem)
	}
	if sig != nil && len(traj) != len(sig) {
		return fmt.Errorf("%w: item has %d columns, signature has %d", ErrSignature, len(traj), len(sig))
	}
	for i := range traj {
		c := &traj[i]
		if c.Name == "" {
			return fmt.Errorf("%w: column %d has no name", ErrInvalidItem, i)
		}
		if len(c.Slices) == 0 {
			return fmt.Errorf("%w: column %q has no slices", ErrInvalidItem, c.Name)
		}
	}
	return checkDistinctNames(traj)
}

// checkDistinctNames finds a repeated column name in linear time: an item
// may come from a hostile client with tens of thousands of columns.
func checkDistinctNames(traj []Column) error {
	if len(traj) <= 16 {
		// Small items, the usual case, compare pairwise without allocating.
		for i := range traj {
			for j := range i {
				if traj[j].Name == traj[i].Name {
					return fmt.Errorf("%w: columns %d and %d are both named %q", ErrInvalidItem, j, i, traj[i].Name)
				}
			}
		}
		return nil
	}
	seen := make(map[string]int, len(traj))
	for i := range traj {
		if j, dup := seen[traj[i].Name]; dup {
			return fmt.Errorf("%w: columns %d and %d are both named %q", ErrInvalidItem, j, i, traj[i].Name)
		}
		seen[traj[i].Name] = i
	}
	return nil
}
