package tables

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

// TableSnapshot is a consistent copy of a table: everything NewFromSnapshot
// needs to rebuild it exactly, in a form that encodes to JSON as it is.
type TableSnapshot struct {
	Config Config `json:"config"`
	// Items are in insertion order.
	Items []ItemSnapshot `json:"items"`
	// Limiter holds the limiter's counters (its config is Config.Limiter).
	Limiter  limiter.State `json:"limiter"`
	Counters Counters      `json:"counters"`
	// PolicyVersion is the table's current policy version.
	PolicyVersion int64 `json:"policy_version"`
	// Chunks are the distinct chunks the items reference, by increasing
	// key. Snapshot fills it so that the caller can save the chunks however
	// the store changes after the snapshot; it is not encoded, and
	// NewFromSnapshot takes the chunks from the store instead.
	Chunks []*Chunk `json:"-"`
}

// ItemSnapshot is one item of a TableSnapshot.
type ItemSnapshot struct {
	Key          uint64    `json:"key"`
	Priority     float64   `json:"priority"`
	TimesSampled int32     `json:"times_sampled"`
	InsertedAt   time.Time `json:"inserted_at"`
	// Seq orders the items' latest inserts and priority updates, which is
	// how heap selectors break ties between equal priorities.
	Seq           uint64   `json:"seq"`
	Trajectory    []Column `json:"trajectory"`
	PolicyVersion int64    `json:"policy_version"`
}

// Snapshot copies the table's state. Under its lock it copies about 100
// bytes per item, and each item's trajectory is spelled out after.
func (t *Table) Snapshot() TableSnapshot {
	snap, shapes := t.snapshotLocked()
	for i := range snap.Items {
		snap.Items[i].Trajectory = shapes[i].layout.Trajectory(shapes[i].chunks)
	}
	return snap
}

type itemShape struct {
	layout Layout
	chunks []*Chunk
}

func (t *Table) snapshotLocked() (TableSnapshot, []itemShape) {
	t.mu.Lock()
	defer t.mu.Unlock()
	shapes := make([]itemShape, 0, t.items.len())
	snap := TableSnapshot{
		Config:   t.cfg,
		Items:    make([]ItemSnapshot, 0, t.items.len()),
		Limiter:  t.lim.State(),
		Counters: t.counters,
		Chunks:   t.store.heldChunks(t.held, make([]*Chunk, 0, t.heldChunks)),

		PolicyVersion: t.version,
	}
	snap.Config.Signature = cloneSignature(t.cfg.Signature)
	for e := t.head; e != nil; e = t.linked(e.next) {
		snap.Items = append(snap.Items, ItemSnapshot{
			Key:          e.key,
			Priority:     e.priority,
			TimesSampled: e.timesSampled,
			InsertedAt:   time.Unix(0, e.insertedAt).UTC(),
			Seq:          e.seq,

			PolicyVersion: e.version,
		})
		shapes = append(shapes, itemShape{layout: e.layout.Layout, chunks: e.chunks})
	}
	slices.SortFunc(snap.Chunks, func(a, b *Chunk) int { return cmp.Compare(a.Key, b.Key) })
	return snap, shapes
}

// SnapshotChunks returns the distinct chunks of the snapshots' Chunks, by
// increasing key: what a checkpoint saves once for all its tables.
func SnapshotChunks(snaps ...TableSnapshot) []*Chunk {
	var out []*Chunk
	for _, s := range snaps {
		out = append(out, s.Chunks...)
	}
	slices.SortFunc(out, func(a, b *Chunk) int { return cmp.Compare(a.Key, b.Key) })
	return slices.CompactFunc(out, func(a, b *Chunk) bool { return a.Key == b.Key })
}

// NewFromSnapshot rebuilds the table snap was taken of: its items, their
// order in the selectors (Fifo and Lifo order, heap ties) and the limiter's
// counters, so that it samples as the original would have. Uniform and
// Prioritized selectors get the same items and weights but draw afresh. The
// items' chunks must be in store already (the caller Puts them, then
// releases its own references once the tables are built); the table takes
// its references as Insert does. Errors wrap ErrInvalidConfig,
// ErrInvalidSnapshot, ErrChunkMissing, ErrInvalidItem or ErrSignature.
func NewFromSnapshot(snap TableSnapshot, store *ChunkStore, opts ...Option) (*Table, error) {
	t, err := New(snap.Config, store, opts...)
	if err != nil {
		return nil, err
	}
	st := snap.Limiter
	st.Config = t.cfg.Limiter
	if n := int64(len(snap.Items)); st.Inserts-st.Deletes != n || n > t.cfg.MaxSize {
		return nil, fmt.Errorf("%w: table %q: %d items, but the limiter counts %d inserts - %d deletes and max_size is %d",
			ErrInvalidSnapshot, t.name, n, st.Inserts, st.Deletes, t.cfg.MaxSize)
	}
	if err := t.lim.Restore(st); err != nil {
		return nil, fmt.Errorf("%w: table %q: limiter: %w", ErrInvalidSnapshot, t.name, err)
	}
	if err := t.restoreItems(snap.Items); err != nil {
		t.store.releaseHeld(t.held)
		return nil, fmt.Errorf("table %q: %w", t.name, err)
	}
	t.counters = snap.Counters
	t.version = snap.PolicyVersion
	t.rebuildVersionsLocked()
	return t, nil
}

// restoreItems links the items in and takes their chunk references, then
// feeds each selector in the order that recreates its state. On error the
// references taken so far are in t.held.
func (t *Table) restoreItems(items []ItemSnapshot) error {
	for i := range items {
		it := &items[i]
		if err := selectors.CheckPriority(it.Priority); err != nil {
			return fmt.Errorf("%w: item %d: %w", ErrInvalidSnapshot, it.Key, err)
		}
		if it.TimesSampled < 0 {
			return fmt.Errorf("%w: item %d: times_sampled %d is negative", ErrInvalidSnapshot, it.Key, it.TimesSampled)
		}
		if !inRange(it.InsertedAt) {
			return fmt.Errorf("%w: item %d: inserted_at %v is outside the years 1678-2262", ErrInvalidSnapshot, it.Key, it.InsertedAt)
		}
		if _, dup := t.lookup(it.Key); dup {
			return fmt.Errorf("%w: item %d appears twice", ErrInvalidSnapshot, it.Key)
		}
		if err := checkTrajectory(it.Trajectory, t.sig); err != nil {
			return fmt.Errorf("item %d: %w", it.Key, err)
		}
		chunks, decoded, err := t.store.acquire(it.Trajectory, t.sig)
		if err != nil {
			return fmt.Errorf("item %d: %w", it.Key, err)
		}
		t.raiseLargest(decoded, itemParts(it.Trajectory, chunks))
		t.holdLocked(chunks)
		e := t.newEntry()
		*e = entry{key: it.Key, priority: it.Priority, insertedAt: it.InsertedAt.UnixNano(), seq: it.Seq, timesSampled: it.TimesSampled,
			version: it.PolicyVersion, layout: t.layouts.intern(it.Trajectory, chunks), chunks: chunks, prev: link(t.tail), ref: e.ref}
		if t.tail == nil {
			t.head = e
		} else {
			t.tail.next = link(e)
		}
		t.tail = e
		t.items.insert(e.ref)
		t.seq = max(t.seq, it.Seq)
	}
	var bySeq []*entry
	for _, sel := range []order{t.sampler, t.remover} {
		switch sel.kind() {
		case selectors.KindMaxHeap, selectors.KindMinHeap:
			if bySeq == nil {
				bySeq = make([]*entry, 0, t.items.len())
				for e := t.head; e != nil; e = t.linked(e.next) {
					bySeq = append(bySeq, e)
				}
				slices.SortStableFunc(bySeq, func(a, b *entry) int { return cmp.Compare(a.seq, b.seq) })
			}
			for _, e := range bySeq {
				sel.insert(e)
			}
		default:
			for e := t.head; e != nil; e = t.linked(e.next) {
				sel.insert(e)
			}
		}
	}
	return nil
}
