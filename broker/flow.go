package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// flow is a producer's window: messages published but not acknowledged by
// JetStream, and items acknowledged but not yet applied by the table
// service. A full window blocks the producer, which is how a table's rate
// limiter reaches the actors: items the limiter holds wait in their table's
// queue on the service, the service's progress says that table is applied
// only up to before them, and the window of every producer writing to that
// table fills, while producers writing to other tables go on.
type flow struct {
	maxInFlight  int
	maxUnapplied int

	mu           sync.Mutex
	changed      chan struct{} // closed at the next change; made only when someone waits
	inFlight     int           // messages awaiting their ack
	unackedItems int
	acked        []ackedBatch // acknowledged, not yet known to be applied
	ackedItems   int
	applied      uint64            // the service's last applied stream sequence
	held         map[string]uint64 // tables applied only up to an earlier one
	paced        int               // the service's bound on unapplied items while it paces inserts; 0: none
	errs         []error
	// failedItems counts the items of the messages that could not be
	// published, ever, and of those Close gave up on before publishing
	// them, and untakenFailed those whose errors are still in
	// errs: a call that waited for them learns of their loss even where
	// another call took their errors. unknownItems and untakenUnknown
	// count the items of the messages given up on that JetStream may have
	// stored (ErrOutcomeUnknown), and rejections and untakenRejections
	// the service's rejections, the same way.
	failedItems       uint64
	untakenFailed     uint64
	unknownItems      uint64
	untakenUnknown    uint64
	rejections        uint64
	untakenRejections uint64
	stopped           bool // the producer closed: no more acks or progress come
	// gapFills counts the gap fills (Producer.fillGap) sent and not yet
	// applied: the messages they free are in their tables only once they
	// are, though the service's progress passed those messages earlier.
	gapFills int
}

type ackedBatch struct {
	seq    uint64
	items  int
	tables []string // the tables its items are for
	// gapFill: the batch is a gap fill, and tables are those of the
	// messages it frees.
	gapFill bool
}

// appliedLocked reports whether the service applied every item of b.
func (f *flow) appliedLocked(b ackedBatch) bool {
	if b.seq > f.applied {
		return false
	}
	for _, t := range b.tables {
		if held, ok := f.held[t]; ok && b.seq > held {
			return false
		}
	}
	return true
}

func newFlow(maxInFlight, maxUnapplied int) *flow {
	return &flow{maxInFlight: maxInFlight, maxUnapplied: maxUnapplied}
}

func (f *flow) notifyLocked() {
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

func (f *flow) waitChanLocked() <-chan struct{} {
	if f.changed == nil {
		f.changed = make(chan struct{})
	}
	return f.changed
}

func (f *flow) unappliedLocked() int { return f.unackedItems + f.ackedItems }

// notApplied explains a wait for room in the window that ended with cause.
func (f *flow) notApplied(cause error) error {
	f.mu.Lock()
	u, inFlight := f.unappliedLocked(), f.inFlight
	f.mu.Unlock()
	return fmt.Errorf("%w: %d items published but not applied, %d messages awaiting JetStream (is the table service running? is a table's rate limiter holding inserts?): %w",
		ErrNotApplied, u, inFlight, cause)
}

// tryAcquire takes a place for a message of n items if there is room, or
// returns a channel closed at the window's next change.
func (f *flow) tryAcquire(n int) (bool, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	u, limit := f.unappliedLocked(), f.maxUnapplied
	if f.paced > 0 {
		limit = min(limit, f.paced)
	}
	if f.inFlight < f.maxInFlight && (u+n <= limit || u == 0) {
		f.inFlight++
		f.unackedItems += n
		return true, nil
	}
	return false, f.waitChanLocked()
}

// ack records that JetStream stored a message of n items for tables at
// seq.
func (f *flow) ack(seq uint64, n int, tables []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inFlight--
	f.unackedItems -= n
	if b := (ackedBatch{seq: seq, items: n, tables: tables}); n > 0 && !f.appliedLocked(b) {
		f.acked = append(f.acked, b)
		f.ackedItems += n
	}
	f.notifyLocked()
}

// fail records that a message of n items could not be published.
func (f *flow) fail(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inFlight--
	f.unackedItems -= n
	f.loseLocked(n, err)
}

// replace records that a message of n items could not be published and
// that a gap fill took its place in the window, in one step: a wait for
// the window to empty must not end between the two.
func (f *flow) replace(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unackedItems -= n
	f.gapFills++
	f.loseLocked(n, err)
}

// ackGapFill records that JetStream stored a gap fill at seq, freeing
// messages for tables.
func (f *flow) ackGapFill(seq uint64, tables []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inFlight--
	if b := (ackedBatch{seq: seq, tables: tables, gapFill: true}); f.appliedLocked(b) {
		f.gapFills--
	} else {
		f.acked = append(f.acked, b)
	}
	f.notifyLocked()
}

// dropGapFill records that a gap fill could not be published and that none
// takes its place: no message waits for it. It lost no items.
func (f *flow) dropGapFill() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inFlight--
	f.gapFills--
	f.notifyLocked()
}

// lose records n items the producer gave up on before publishing them.
func (f *flow) lose(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loseLocked(n, err)
}

// loseLocked records n items given up on with err: lost, or of unknown
// outcome where err says JetStream may have stored them.
func (f *flow) loseLocked(n int, err error) {
	f.errs = append(f.errs, err)
	if errors.Is(err, ErrOutcomeUnknown) {
		f.unknownItems += uint64(n)
		f.untakenUnknown += uint64(n)
	} else {
		f.failedItems += uint64(n)
		f.untakenFailed += uint64(n)
	}
	f.notifyLocked()
}

// failureMark is where a call that waits for messages starts counting the
// items lost or of unknown outcome and the rejections (withLost).
type failureMark struct{ failedItems, unknownItems, rejections uint64 }

func (f *flow) failureMark() failureMark {
	f.mu.Lock()
	defer f.mu.Unlock()
	return failureMark{f.failedItems, f.unknownItems, f.rejections}
}

// withLost is err, the outcome of a call that waited for the messages
// published, with the items lost or of unknown outcome and the rejections
// since mark added where another call took their errors (a concurrent
// Flush or Close, or the producer's own Close when its connection closed)
// and err does not report them: the waiting call would otherwise return
// nil for items that never reached their tables. Errors still untaken are
// left to the next call, which reports them.
func (f *flow) withLost(err error, mark failureMark) error {
	f.mu.Lock()
	lost, untakenLost := f.failedItems-mark.failedItems, f.untakenFailed
	unknown, untakenUnknown := f.unknownItems-mark.unknownItems, f.untakenUnknown
	rejected, untakenRejected := f.rejections-mark.rejections, f.untakenRejections
	stopped := f.stopped
	f.mu.Unlock()
	errs := []error{err}
	closed := func(err error) error {
		if stopped {
			return fmt.Errorf("%w: %w", err, ErrClosed)
		}
		return err
	}
	if lost > untakenLost && !errors.Is(err, ErrNotStored) {
		errs = append(errs, closed(fmt.Errorf("%w: %d of this producer's items were not stored while this call waited (another call on this producer reported why)", ErrNotStored, lost-untakenLost)))
	}
	if unknown > untakenUnknown && !errors.Is(err, ErrOutcomeUnknown) {
		errs = append(errs, closed(fmt.Errorf("%w: %d of this producer's items were given up on while this call waited, and may be stored and applied (another call on this producer reported why)", ErrOutcomeUnknown, unknown-untakenUnknown)))
	}
	if rejected > untakenRejected && !errors.Is(err, ErrRejected) {
		errs = append(errs, fmt.Errorf("%w: the service sent %d rejections while this call waited (another call on this producer reported them)", ErrRejected, rejected-untakenRejected))
	}
	if len(errs) == 1 {
		return err
	}
	return errors.Join(errs...)
}

// setApplied records the service's progress: applied, but for the tables
// held applied only up to their sequence, and the bound on unapplied items
// it sets while it paces inserts (0: none).
func (f *flow) setApplied(applied uint64, held map[string]uint64, paced int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if applied < f.applied {
		return // the service published it before what we have
	}
	f.applied, f.held, f.paced = applied, held, paced
	// Retries can store messages out of order, so filter rather than pop.
	kept := f.acked[:0]
	for _, b := range f.acked {
		if f.appliedLocked(b) {
			f.ackedItems -= b.items
			if b.gapFill {
				f.gapFills--
			}
		} else {
			kept = append(kept, b)
		}
	}
	f.acked = kept
	f.notifyLocked()
}

// wake wakes everyone waiting for the window to change.
func (f *flow) wake() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notifyLocked()
}

// stop ends the waits for acks and progress once nothing reads them any
// more: those still waiting return ErrClosed rather than wait for ever.
func (f *flow) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = true
	f.notifyLocked()
}

// reject records a rejection by the service.
func (f *flow) reject(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, err)
	f.rejections++
	f.untakenRejections++
	f.notifyLocked()
}

// report records an error for the producer's next call that is neither a
// loss of a message nor a rejection (an item over the max payload that a
// call which may not fail left behind).
func (f *flow) report(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, err)
	f.notifyLocked()
}

// takeErrors returns and forgets the asynchronous errors seen so far.
func (f *flow) takeErrors() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := errors.Join(f.errs...)
	f.errs, f.untakenFailed, f.untakenUnknown, f.untakenRejections = nil, 0, 0, 0
	return err
}

// waitFor blocks until cond holds (checked under the lock), ctx ends or
// the flow stops.
func (f *flow) waitFor(ctx context.Context, cond func() bool, what func() error) error {
	f.mu.Lock()
	for !cond() {
		if f.stopped {
			err := what()
			f.mu.Unlock()
			return fmt.Errorf("%w: %w", err, ErrClosed)
		}
		ch := f.waitChanLocked()
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			f.mu.Lock()
			err := what()
			f.mu.Unlock()
			return fmt.Errorf("%w: %w", err, ctx.Err())
		}
		f.mu.Lock()
	}
	f.mu.Unlock()
	return nil
}

// waitAcked waits until every published message is acknowledged or failed.
func (f *flow) waitAcked(ctx context.Context) error {
	return f.waitFor(ctx, func() bool { return f.inFlight == 0 }, func() error {
		return fmt.Errorf("%w: %d messages still awaiting JetStream's ack", ErrNotApplied, f.inFlight)
	})
}

// waitApplied waits until the service applied every acknowledged item,
// and every gap fill: the service's progress passes a message held behind
// one given up on before it applies it.
func (f *flow) waitApplied(ctx context.Context) error {
	return f.waitFor(ctx, func() bool { return f.unappliedLocked() == 0 && f.gapFills == 0 }, func() error {
		return fmt.Errorf("%w: %d items not applied, %d messages given up on still holding later ones in the service (applied sequence %d)", ErrNotApplied, f.unappliedLocked(), f.gapFills, f.applied)
	})
}
