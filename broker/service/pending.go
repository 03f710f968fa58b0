package service

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/tables"
)

// Items whose table's rate limiter holds them wait in that table's queue
// while the apply loop goes on with the stream, so one blocked table does
// not hold up the others (Reverb holds only the writer of the blocked
// table). An item in a queue has been applied from the stream: it is never
// applied again, checkpoints carry it, and it holds its chunks until it is
// in its table or refused. A table's items go in in stream order: while its
// queue is not empty, every new item joins the queue.

// pendingItem is an item that waits for its table's rate limiter.
type pendingItem struct {
	item   tables.Item
	chunks []uint64 // the distinct chunks it references, which it holds
	arrival
}

// arrival is where an item came from: its message in the stream and its
// producer.
type arrival struct {
	streamSeq uint64
	storedAt  time.Time
	to        noticeTo // who is told if it is refused
	sequence  uint64   // its producer's message
}

// pendingQueue is one table's waiting items, oldest first.
type pendingQueue struct {
	items   []*pendingItem // items[head:] wait
	head    int
	watched bool // a goroutine waits for the table's limiter to change
}

func (q *pendingQueue) len() int { return len(q.items) - q.head }

func (q *pendingQueue) front() *pendingItem { return q.items[q.head] }

func (q *pendingQueue) pop() {
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head > 1024 && q.head > len(q.items)/2 {
		q.items, q.head = append(q.items[:0], q.items[q.head:]...), 0
	}
}

// watcher wakes the apply loop when a waiting table's limiter changes.
// Its goroutines end with the apply loop.
type watcher struct {
	ctx  context.Context
	wake chan string
	wg   sync.WaitGroup
}

// chunkKeys are the distinct chunks a trajectory references.
func chunkKeys(traj []tables.Column) []uint64 {
	var keys []uint64
	for _, c := range traj {
		for _, sl := range c.Slices {
			found := false
			for _, k := range keys {
				if k == sl.Chunk {
					found = true
					break
				}
			}
			if !found {
				keys = append(keys, sl.Chunk)
			}
		}
	}
	return keys
}

// enqueue adds an item to its table's queue, taking a hold on its chunks.
func (s *Service) enqueue(table string, p *pendingItem) error {
	p.chunks = chunkKeys(p.item.Trajectory)
	if err := s.store.Retain(p.chunks...); err != nil {
		return err
	}
	q := s.pending[table]
	q.items = append(q.items, p)
	if q.len() == 1 {
		s.progress.hold(table, p.streamSeq-1)
	}
	return nil
}

// settle takes an item out of the front of its queue: it went in, or was
// refused (err), which its producer is told.
func (s *Service) settle(table string, q *pendingQueue, err error) {
	p := q.front()
	if err != nil {
		s.reject(p.to, p.sequence, p.item.Key, table, codeOf(err), err.Error())
	} else if s.o.observer != nil {
		s.o.observer.ItemInserted(table, time.Since(p.storedAt))
	}
	_ = s.store.Release(p.chunks...)
	q.pop()
	if q.len() == 0 {
		s.progress.hold(table, 0)
	} else {
		s.progress.hold(table, q.front().streamSeq-1)
	}
}

// drainPending inserts a table's waiting items while its limiter allows,
// and watches the limiter when it stops.
func (s *Service) drainPending(table string) {
	q, t := s.pending[table], s.tables[table]
	q.watched = false
	for q.len() > 0 {
		ok, changed, err := t.TryInsert(q.front().item, true)
		if !ok && err == nil {
			s.watch(table, q, changed)
			return
		}
		s.settle(table, q, err)
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

// makeRoom waits until the table's oldest waiting item goes in (or is
// refused), holding up the stream: the table's queue is full. It returns
// an error only when ctx ends.
func (s *Service) makeRoom(ctx context.Context, table string) error {
	q, t := s.pending[table], s.tables[table]
	for {
		ok, changed, err := t.TryInsert(q.front().item, true)
		if ok || err != nil {
			s.settle(table, q, err)
			return nil
		}
		// A checkpoint request interrupts the wait; the state it copies
		// has the item still waiting.
		ictx := s.intr.context(ctx)
		select {
		case <-changed:
		case <-ictx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.serveCaptures()
		}
	}
}

// insertNow inserts an item that arrived from the stream, or queues it
// while its table's limiter holds it. It returns an error only when ctx
// ended while a full queue held up the stream.
func (s *Service) insertNow(ctx context.Context, t *tables.Table, item tables.Item, from arrival) error {
	table := t.Name()
	q := s.pending[table]
	if q.len() == 0 {
		ok, changed, err := t.TryInsert(item, false)
		switch {
		case err != nil:
			s.reject(from.to, from.sequence, item.Key, table, codeOf(err), tooLarge(err))
			return nil
		case ok:
			if s.o.observer != nil {
				s.o.observer.ItemInserted(table, time.Since(from.storedAt))
			}
			return nil
		}
		s.watch(table, q, changed)
	} else if q.len() >= s.o.limits.MaxPendingItems {
		if err := s.makeRoom(ctx, table); err != nil {
			return err
		}
	}
	p := &pendingItem{item: item, arrival: from}
	if err := s.enqueue(table, p); err != nil {
		s.reject(p.to, p.sequence, p.item.Key, table, protocol.CodeInvalidArgument, fmt.Sprintf("item %d: %v", p.item.Key, err))
	}
	return nil
}
