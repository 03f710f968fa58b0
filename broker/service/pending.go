package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// Items whose table's rate limiter holds them wait in that table's queue
// while the apply loop goes on with the stream, so one blocked table does
// not hold up the others (Reverb holds only the writer of the blocked
// table). An item in a queue has been applied from the stream: it is never
// applied again, checkpoints carry it, and it holds its chunks until it is
// in its table, refused, deleted or reset. A table's items go in in the
// order the service applied them (stream order, but for a message a
// producer's reorder buffer held behind a missing one): while its queue is
// not empty, every new item joins the queue. A mutation or reset applies to
// the queued items too, so it stays ordered with the inserts before it.

// pendingItem is an item that waits for its table's rate limiter.
type pendingItem struct {
	item    tables.Item
	chunks  []uint64 // the distinct chunks it references, which it holds
	bytes   int64    // of those chunks
	dropped bool     // deleted or reset while it waited
	arrival
	// queuedAt is the stream sequence being applied when it joined the
	// queue, at or past its own message's: past it where a producer's
	// reorder buffer held that message, after progress passed it with the
	// table not held. Progress covers its refusal only once the table is
	// applied past queuedAt.
	queuedAt uint64
}

// arrival is where an item came from: its message in the stream and its
// producer.
type arrival struct {
	streamSeq uint64
	storedAt  time.Time
	to        noticeTo // who is told if it is refused
	sequence  uint64   // its producer's message
	// appliedAt is when the service took up its message (zero: unknown).
	// The items that go straight into their tables take it as the time
	// they went in: a clock read for each item was a tenth of the apply
	// loop. An item that waits takes the clock when it goes in.
	appliedAt time.Time
}

// pendingQueue is one table's waiting items, in the order they go in.
type pendingQueue struct {
	items []*pendingItem // items[head:] wait; dropped ones are skipped
	head  int
	// lows are the stream sequences of the queue's items that are lower
	// than every later item's (a monotonic queue): lows[0] is the lowest
	// sequence waiting, which bounds what the table has applied.
	lows    []uint64
	byKey   map[uint64][]*pendingItem // the live items, for mutations
	bytes   int64                     // of the live items' chunks
	watched bool                      // a goroutine waits for the table's limiter to change
}

func newPendingQueue() *pendingQueue {
	return &pendingQueue{byKey: make(map[uint64][]*pendingItem)}
}

func (q *pendingQueue) len() int { return len(q.items) - q.head }

func (q *pendingQueue) front() *pendingItem { return q.items[q.head] }

func (q *pendingQueue) push(p *pendingItem) {
	q.items = append(q.items, p)
	n := len(q.lows)
	for n > 0 && q.lows[n-1] > p.streamSeq {
		n--
	}
	q.lows = append(q.lows[:n], p.streamSeq)
	q.byKey[p.item.Key] = append(q.byKey[p.item.Key], p)
	q.bytes += p.bytes
}

// forget takes a live item out of the key index and the byte count.
func (q *pendingQueue) forget(p *pendingItem) {
	same := q.byKey[p.item.Key]
	for i, o := range same {
		if o == p {
			same = append(same[:i], same[i+1:]...)
			break
		}
	}
	if len(same) == 0 {
		delete(q.byKey, p.item.Key)
	} else {
		q.byKey[p.item.Key] = same
	}
	q.bytes -= p.bytes
}

// pop takes the front item out of the queue.
func (q *pendingQueue) pop() *pendingItem {
	p := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head > 1024 && q.head > len(q.items)/2 {
		q.items, q.head = append(q.items[:0], q.items[q.head:]...), 0
	}
	if q.lows[0] == p.streamSeq {
		q.lows = q.lows[1:]
	}
	if !p.dropped {
		q.forget(p)
	}
	return p
}

// watcher wakes the apply loop when a waiting table's limiter changes.
// Its goroutines end with the apply loop.
type watcher struct {
	ctx  context.Context
	wake chan string
	wg   sync.WaitGroup
}

// noteHeld publishes how far table is applied: up to before its lowest
// waiting item, or entirely.
func (s *Service) noteHeld(table string, q *pendingQueue) {
	if q.len() == 0 {
		s.progress.release(table)
	} else {
		s.progress.hold(table, q.lows[0]-1)
	}
}

// popFront takes the front item out of its queue and lets go of its
// chunks: it went in, or was refused (err, which its producer is told), or
// was dropped while it waited.
func (s *Service) popFront(table string, q *pendingQueue, err error) {
	p := q.pop()
	if !p.dropped {
		if err != nil {
			s.rejectAt(noticeAt{seq: p.queuedAt, table: table}, p.to, p.sequence, p.item.Key, table, codeOf(err), tooLarge(err))
		} else if s.o.observer != nil {
			s.o.observer.ItemInserted(table, time.Since(p.storedAt))
		}
		_ = s.store.Release(p.chunks...)
	}
	s.noteHeld(table, q)
}

// skipDropped pops the dropped items at the front of a queue.
func (s *Service) skipDropped(table string, q *pendingQueue) {
	for q.len() > 0 && q.front().dropped {
		s.popFront(table, q, nil)
	}
}

// drainPending inserts a table's waiting items while its limiter allows,
// and watches the limiter when it stops.
func (s *Service) drainPending(table string) {
	q, t := s.pending[table], s.tables[table]
	q.watched = false
	for s.skipDropped(table, q); q.len() > 0; s.skipDropped(table, q) {
		ok, changed, err := t.TryInsert(q.front().item, true)
		if !ok && err == nil {
			s.watch(table, q, changed)
			return
		}
		s.popFront(table, q, err)
	}
}

// watch wakes the apply loop at the table's limiter's next change.
func (s *Service) watch(table string, q *pendingQueue, changed <-chan struct{}) {
	if q.watched {
		return
	}
	q.watched = true
	w := s.watcher
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		select {
		case <-changed:
			select {
			case w.wake <- table:
			case <-w.ctx.Done():
			}
		case <-w.ctx.Done():
		}
	}()
}

// makeRoom waits until the table's queue can take an item of need bytes:
// fewer than limits.max_pending_items items, and need more bytes within
// limits.max_pending_bytes (an empty queue takes any item). It holds up
// the stream meanwhile, but still lets other tables' waiting items in. It
// returns an error only when ctx ends.
//
// Only a sample (or a deletion, reset or eviction of the table's waiting
// items) makes room, and a reset of the table in the stream behind the
// held message would never be read: while it waits it looks for one
// (findResetAhead), on entering, when a reset is stored and every
// resetLookPeriod, and drops the queue as that reset will.
func (s *Service) makeRoom(ctx context.Context, table string, need int64) error {
	q, t := s.pending[table], s.tables[table]
	look, force := true, false
	var every *time.Ticker
	defer func() {
		if every != nil {
			every.Stop()
		}
	}()
	for s.skipDropped(table, q); q.len() > 0 && (q.len() >= s.o.limits.MaxPendingItems || q.bytes+need > s.o.limits.MaxPendingBytes); s.skipDropped(table, q) {
		ok, changed, err := t.TryInsert(q.front().item, true)
		if ok || err != nil {
			s.popFront(table, q, err)
			continue
		}
		if look {
			if s.findResetAhead(ctx, table, force) {
				s.resetPending(table)
				continue
			}
			look, force = false, false
		}
		if every == nil {
			every = time.NewTicker(resetLookPeriod)
		}
		// A checkpoint request interrupts the wait; the state it copies
		// has the item still waiting.
		ictx := s.intr.context(ctx)
		select {
		case <-changed:
		case other := <-s.watcher.wake:
			if other == table {
				q.watched = false // its watcher is spent: this loop tries again
			} else {
				s.drainPending(other)
			}
		case <-s.resetStored:
			look, force = true, true
		case <-every.C:
			look = true
		case <-ictx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.serveCaptures()
		}
	}
	return nil
}

// resetLookPeriod is how often a full queue that holds up the stream looks
// for a reset of its table that no request of this service's stored (a
// standby's, or one stored before a restart), and bounds one lookup.
const resetLookPeriod = 2 * time.Second

// resetScan is where the lookup for a reset of a table (findResetAhead)
// goes on from, and when it may look again unless a reset was stored.
type resetScan struct {
	from uint64
	next time.Time
}

// findResetAhead reports whether the stream holds a reset of table after
// the message being applied, and notes the first in s.resetAhead. Items
// of the table from before it are then dropped rather than queued: the
// reset would drop them from the queue or the table when applied, and
// leaves the same state whether they were dropped early or not. A lookup
// goes on from where the last one stopped, at most once a resetLookPeriod
// (each item that meets the full queue would ask the stream again) unless
// forced; a failed one reports none, and the next tries again.
func (s *Service) findResetAhead(ctx context.Context, table string, force bool) bool {
	if _, ok := s.resetAhead[table]; ok {
		return true
	}
	scan := s.resetScans[table]
	if scan == nil {
		scan = &resetScan{}
		s.resetScans[table] = scan
	}
	now := time.Now()
	if !force && now.Before(scan.next) {
		return false
	}
	scan.next = now.Add(resetLookPeriod)
	scan.from = max(scan.from, s.applying+1)
	ctx, cancel := context.WithTimeout(ctx, resetLookPeriod)
	defer cancel()
	for {
		m, err := s.stream.GetMsg(ctx, scan.from, jetstream.WithGetMsgSubject(s.subj.Reset()))
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgNotFound) && ctx.Err() == nil {
				s.log.Warn("reprise service: looking for a reset in the stream", "table", table, "from_sequence", scan.from, "error", err)
			}
			return false
		}
		var r wire.ResetRequest
		if proto.Unmarshal(m.Data, &r) == nil && (r.Table == "" || r.Table == table) {
			s.resetAhead[table] = m.Sequence
			s.log.Info("reprise service: a full queue held up the stream; dropping the table's items that a reset in the stream drops", "table", table, "reset_sequence", m.Sequence)
			return true
		}
		scan.from = m.Sequence + 1
	}
}

// resetDrops reports whether a reset found ahead (findResetAhead) drops an
// item of table from the message at stream sequence seq.
func (s *Service) resetDrops(table string, seq uint64) bool {
	if len(s.resetAhead) == 0 {
		return false // the apply loop's case: no lookup of table for each item
	}
	at, ok := s.resetAhead[table]
	return ok && seq < at
}

// insertNow inserts an item that arrived from the stream, or queues it
// while its table's limiter holds it. It returns an error only when ctx
// ended while a full queue held up the stream.
func (s *Service) insertNow(ctx context.Context, t *tables.Table, item tables.Item, from arrival) error {
	table := t.Name()
	q := s.pending[table]
	var p *pendingItem // made once the item is to wait
	held := false
	for {
		if s.resetDrops(table, from.streamSeq) {
			if p != nil {
				_ = s.store.Release(p.chunks...)
			}
			return nil
		}
		s.skipDropped(table, q)
		if q.len() == 0 {
			try, at := item, time.Time{}
			if !held {
				at = from.appliedAt
				if try.InsertedAt.IsZero() {
					try.InsertedAt = at
				}
			}
			ok, changed, err := t.TryInsert(try, held)
			if ok || err != nil {
				if p != nil {
					_ = s.store.Release(p.chunks...)
				}
				if err != nil {
					s.reject(from.to, from.sequence, item.Key, table, codeOf(err), tooLarge(err))
				} else if s.o.observer != nil {
					if at.IsZero() {
						at = time.Now()
					}
					s.o.observer.ItemInserted(table, at.Sub(from.storedAt))
				}
				return nil
			}
			s.watch(table, q, changed)
		} else if !held {
			t.CountHeldInsert()
		}
		held = true
		if p == nil {
			p = &pendingItem{item: item, arrival: from, queuedAt: s.applying}
			var err error
			// It holds its chunks for as long as it waits.
			if p.chunks, p.bytes, err = s.store.RetainItem(item.Trajectory); err != nil {
				s.reject(from.to, from.sequence, item.Key, table, codeOf(err), fmt.Sprintf("table %q: item %d: %v", table, item.Key, err))
				return nil
			}
		}
		if q.len() == 0 || q.len() < s.o.limits.MaxPendingItems && q.bytes+p.bytes <= s.o.limits.MaxPendingBytes {
			q.push(p)
			s.noteHeld(table, q)
			if !q.watched {
				// makeRoom spent the watcher: the queue needs one to drain.
				s.drainPending(table)
			}
			return nil
		}
		if err := s.makeRoom(ctx, table, p.bytes); err != nil {
			_ = s.store.Release(p.chunks...)
			return err
		}
	}
}

// resetPending drops a table's waiting items: they were applied before the
// reset, which empties the table.
func (s *Service) resetPending(table string) {
	q := s.pending[table]
	for _, p := range q.items[q.head:] {
		if !p.dropped {
			s.dropPending(q, p)
		}
	}
	s.skipDropped(table, q)
}

// dropPending lets go of a waiting item that was deleted or reset; it
// leaves the queue when it reaches the front.
func (s *Service) dropPending(q *pendingQueue, p *pendingItem) {
	p.dropped = true
	q.forget(p)
	_ = s.store.Release(p.chunks...)
}

// mutatePending applies a mutation's ops to a table's waiting items, as to
// items already in the table, and returns the keys it found there.
func (s *Service) mutatePending(table string, muts []tables.Mutation) map[uint64]bool {
	q := s.pending[table]
	if len(q.byKey) == 0 {
		return nil
	}
	found := make(map[uint64]bool)
	for _, m := range muts {
		same := q.byKey[m.Key]
		if len(same) == 0 {
			continue
		}
		found[m.Key] = true
		if m.Delete {
			for _, p := range append([]*pendingItem(nil), same...) {
				s.dropPending(q, p)
			}
			continue
		}
		for _, p := range same {
			p.item.Priority = m.Priority
		}
	}
	s.skipDropped(table, q)
	return found
}

// dropStalePending drops the waiting items the table's new policy version
// makes stale, as the table removed its own.
func (s *Service) dropStalePending(table string, t *tables.Table) {
	floor, ok := t.StaleBefore()
	if !ok {
		return
	}
	q := s.pending[table]
	for _, p := range q.items[q.head:] {
		if !p.dropped && p.item.PolicyVersion < floor {
			s.dropPending(q, p)
			t.CountStaleEviction()
		}
	}
	s.skipDropped(table, q)
}
