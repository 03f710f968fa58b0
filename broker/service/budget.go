package service

import (
	"context"
	"slices"
	"sync"
)

// replyBudget bounds the bytes of replies the service builds and hands to
// its connections at once (Limits.MaxReplyBytesInFlight). Each request's
// reply may take up to MaxReplyBytes, and up to its table's request slots
// of them are served at once: without a bound over all of them, a few
// learners asking for large batches of large items (or one asking many at
// once) ran the service out of memory. A reply takes its bytes before it is
// built and gives them back once its connection has copied them. Takers
// are served in order, so a large reply is not passed over for ever by
// small ones; one larger than the whole budget waits for all of it.
type replyBudget struct {
	mu      sync.Mutex
	size    int64
	free    int64
	waiting []*budgetWaiter // in arrival order
	peak    int64           // the most taken at once
}

type budgetWaiter struct {
	n     int64
	ready chan struct{} // closed once the bytes are taken for it
}

func newReplyBudget(size int64) *replyBudget {
	return &replyBudget{size: size, free: size}
}

// take waits until n bytes (at most the whole budget) are free and takes
// them, returning what it took, which the caller gives back. It fails only
// when ctx ends first.
func (b *replyBudget) take(ctx context.Context, n int64) (int64, error) {
	n = max(0, min(n, b.size))
	b.mu.Lock()
	if b.tryTakeLocked(n) {
		b.mu.Unlock()
		return n, nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	b.waiting = append(b.waiting, w)
	b.mu.Unlock()
	select {
	case <-w.ready:
		return n, nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready:
		// Granted as ctx ended: given back, for the next in line.
		b.free += n
	default:
		b.waiting = slices.DeleteFunc(b.waiting, func(o *budgetWaiter) bool { return o == w })
	}
	b.grantLocked()
	return 0, ctx.Err()
}

// tryTake takes n bytes (at most the whole budget) if they are free and
// no taker waits before it, returning what it took and whether it did.
func (b *replyBudget) tryTake(n int64) (int64, bool) {
	n = max(0, min(n, b.size))
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.tryTakeLocked(n) {
		return 0, false
	}
	return n, true
}

func (b *replyBudget) tryTakeLocked(n int64) bool {
	if len(b.waiting) > 0 || b.free < n {
		return false
	}
	b.takeLocked(n)
	return true
}

// give returns n bytes taken with take.
func (b *replyBudget) give(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.free += n
	b.grantLocked()
}

func (b *replyBudget) takeLocked(n int64) {
	b.free -= n
	b.peak = max(b.peak, b.size-b.free)
}

// grantLocked takes the bytes of the waiters at the front of the line
// while they fit.
func (b *replyBudget) grantLocked() {
	for len(b.waiting) > 0 && b.free >= b.waiting[0].n {
		w := b.waiting[0]
		b.waiting[0] = nil
		b.waiting = b.waiting[1:]
		b.takeLocked(w.n)
		close(w.ready)
	}
}
