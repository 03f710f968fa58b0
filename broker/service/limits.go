package service

import (
	"fmt"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
)

// Limits bound what one client can make the table service spend. Every
// message's cost is checked against them before it is paid; a message or
// item over a limit is rejected (counted, logged, reported to its producer)
// and changes nothing. The defaults are far above what an RL workload
// sends; raise them only for a workload that needs it.
type Limits struct {
	// MaxChunkBytes bounds one chunk's decompressed size (declared size and
	// actual). At most wire.MaxChunkRawSize.
	MaxChunkBytes int64
	// MaxChunksPerMessage and MaxItemsPerMessage bound one insert message.
	MaxChunksPerMessage int
	MaxItemsPerMessage  int
	// MaxColumnsPerItem and MaxSlicesPerItem bound one item's trajectory
	// (slices counted over all its columns).
	MaxColumnsPerItem int
	MaxSlicesPerItem  int
	// MaxItemBytes bounds the bytes one item expands to when a learner
	// decodes it: its steps times their size, however few chunks they
	// share.
	MaxItemBytes int64
	// MaxReplyBytes bounds the bytes one sample reply may expand to: what
	// its items decode to, and the records that describe them (a few dozen
	// bytes for each column, slice and chunk of an item). A request for more
	// items than fit at the size of the largest item the table took since
	// its last reset (held or not), when its samples are taken (larger
	// items may come while it waits for the rate limiter), is refused
	// before anything is sampled; one item is always served. At least
	// MaxItemBytes. It also bounds an items reply's bytes, which never take
	// more than 64 MiB. Learners, Go and Python, refuse a reply whose items
	// decode to more than its default, wire.MaxReplyBytes, whatever it is.
	MaxReplyBytes int64
	// MaxReplyBytesInFlight bounds the bytes of the sample replies the
	// service builds and hands to its connections at once, over every
	// request: a reply waits for room (its samples taken, it is not
	// refused) until its request's timeout and half the margin its client
	// listens past it, and is then answered CodeRateLimited. A reply may always take MaxReplyBytes, which stands
	// in for a smaller value.
	MaxReplyBytesInFlight int64
	// MaxMutationOps bounds the priority updates and deletes of one
	// mutation message.
	MaxMutationOps int
	// MaxProducers bounds the producers the service keeps a record of (to
	// apply each message exactly once). A new producer beyond it is
	// refused; a known one is never forgotten early.
	MaxProducers int
	// MaxProducerWindow bounds the messages a producer may have in flight
	// (its WithMaxInFlight), and so the messages the service holds for it
	// while an earlier one is missing.
	MaxProducerWindow int
	// MaxHeldChunkBytes bounds the chunks producers keep on the service for
	// later items (their history), over all producers. Past it the oldest
	// are released, and their producers told.
	MaxHeldChunkBytes int64
	// MaxHeldMessageBytes bounds the messages held back behind a missing
	// earlier message of the same producer, over all producers. Past it
	// the oldest are rejected, and their producers told.
	MaxHeldMessageBytes int64
	// MaxPendingItems bounds, per table, the items waiting for the table's
	// rate limiter while the service goes on applying other tables' items.
	// A table whose queue is full holds up the whole stream until its
	// limiter lets the oldest in.
	MaxPendingItems int
	// MaxPendingBytes bounds, per table, the chunk bytes its waiting items
	// hold (a chunk counted once per item that references it). Like a full
	// queue, going over it holds up the stream.
	MaxPendingBytes int64
}

// DefaultLimits returns the limits a service has unless WithLimits changes
// them.
func DefaultLimits() Limits {
	return Limits{
		MaxChunkBytes:         wire.MaxChunkRawSize,
		MaxChunksPerMessage:   1 << 16,
		MaxItemsPerMessage:    1 << 16,
		MaxColumnsPerItem:     1024,
		MaxSlicesPerItem:      1 << 14,
		MaxItemBytes:          256 << 20,
		MaxReplyBytes:         wire.MaxReplyBytes,
		MaxReplyBytesInFlight: 2 * wire.MaxReplyBytes,
		MaxMutationOps:        1 << 16,
		MaxProducers:          100_000,
		MaxProducerWindow:     1024,
		MaxHeldChunkBytes:     8 << 30,
		MaxHeldMessageBytes:   1 << 30,
		MaxPendingItems:       1 << 16,
		MaxPendingBytes:       1 << 30,
	}
}

func (l Limits) validate() error {
	for _, c := range []struct {
		name string
		v    int64
	}{
		{"max chunk bytes", l.MaxChunkBytes},
		{"max chunks per message", int64(l.MaxChunksPerMessage)},
		{"max items per message", int64(l.MaxItemsPerMessage)},
		{"max columns per item", int64(l.MaxColumnsPerItem)},
		{"max slices per item", int64(l.MaxSlicesPerItem)},
		{"max item bytes", l.MaxItemBytes},
		{"max reply bytes", l.MaxReplyBytes},
		{"max reply bytes in flight", l.MaxReplyBytesInFlight},
		{"max mutation ops", int64(l.MaxMutationOps)},
		{"max producers", int64(l.MaxProducers)},
		{"max producer window", int64(l.MaxProducerWindow)},
		{"max held chunk bytes", l.MaxHeldChunkBytes},
		{"max held message bytes", l.MaxHeldMessageBytes},
		{"max pending items", int64(l.MaxPendingItems)},
		{"max pending bytes", l.MaxPendingBytes},
	} {
		if c.v < 1 {
			return fmt.Errorf("%w: limits: %s must be >= 1, got %d", protocol.ErrInvalidOption, c.name, c.v)
		}
	}
	if l.MaxChunkBytes > wire.MaxChunkRawSize {
		return fmt.Errorf("%w: limits: max chunk bytes %d exceeds the wire's %d", protocol.ErrInvalidOption, l.MaxChunkBytes, int64(wire.MaxChunkRawSize))
	}
	if l.MaxReplyBytes < l.MaxItemBytes {
		return fmt.Errorf("%w: limits: max reply bytes %d is below max item bytes %d: an item that large could never be sampled", protocol.ErrInvalidOption, l.MaxReplyBytes, l.MaxItemBytes)
	}
	if l.MaxProducerWindow > protocol.MaxProducerWindow {
		return fmt.Errorf("%w: limits: max producer window %d exceeds %d", protocol.ErrInvalidOption, l.MaxProducerWindow, protocol.MaxProducerWindow)
	}
	return nil
}

// MaxProducerWindow is the largest window a producer may ask for
// (WithMaxInFlight), and so the largest the service may allow.
const MaxProducerWindow = protocol.MaxProducerWindow

// WithLimits replaces the service's limits (see DefaultLimits).
func WithLimits(l Limits) Option {
	return serviceOption(func(o *serviceOptions) error {
		if err := l.validate(); err != nil {
			return err
		}
		o.limits = l
		return nil
	})
}
