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
// limiter reaches the actors: a held insert stops the service's apply loop,
// applied stops advancing, and the window fills.
type flow struct {
	maxInFlight  int
	maxUnapplied int

	mu           sync.Mutex
	changed      chan struct{} // closed at the next change; made only when someone waits
	inFlight     int           // messages awaiting their ack
	unackedItems int
	acked        []ackedBatch // acknowledged, not yet known to be applied
	ackedItems   int
	applied      uint64 // the service's last applied stream sequence
	errs         []error
}

type ackedBatch struct {
	seq   uint64
	items int
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
	u := f.unappliedLocked()
	if f.inFlight < f.maxInFlight && (u+n <= f.maxUnapplied || u == 0) {
		f.inFlight++
		f.unackedItems += n
		return true, nil
	}
	return false, f.waitChanLocked()
}

// ack records that JetStream stored a message of n items at seq.
func (f *flow) ack(seq uint64, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inFlight--
	f.unackedItems -= n
	if seq > f.applied && n > 0 {
		f.acked = append(f.acked, ackedBatch{seq, n})
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
	f.errs = append(f.errs, err)
	f.notifyLocked()
}

// setApplied records the service's progress.
func (f *flow) setApplied(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if seq <= f.applied {
		return
	}
	f.applied = seq
	// Retries can store messages out of order, so filter rather than pop.
	kept := f.acked[:0]
	for _, b := range f.acked {
		if b.seq > seq {
			kept = append(kept, b)
		} else {
			f.ackedItems -= b.items
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

func (f *flow) addError(err error) {
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
	f.errs = nil
	return err
}

// waitFor blocks until cond holds (checked under the lock) or ctx ends.
func (f *flow) waitFor(ctx context.Context, cond func() bool, what func() error) error {
	f.mu.Lock()
	for !cond() {
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
		return fmt.Errorf("broker: %d messages still awaiting JetStream's ack", f.inFlight)
	})
}

// waitApplied waits until the service applied every acknowledged item.
func (f *flow) waitApplied(ctx context.Context) error {
	return f.waitFor(ctx, func() bool { return f.unappliedLocked() == 0 }, func() error {
		return fmt.Errorf("%w: %d items not applied (applied sequence %d)", ErrNotApplied, f.unappliedLocked(), f.applied)
	})
}
