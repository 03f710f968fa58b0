package service

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
)

// heldProgress is the applied sequence the service publishes for table,
// and whether it publishes one (the table has waiting items).
func heldProgress(d *deployment, table string) (uint64, bool) {
	for _, h := range d.svc.progress.message().Held {
		if h.Table == table {
			return h.AppliedSequence, true
		}
	}
	return 0, false
}

// TestHeldProgressCoversOnlyAppliedItems: a message a producer's reorder
// buffer held behind a missing one joins a table's queue behind items of
// later stream sequences; the progress the service publishes for the table
// must stay below every waiting item's message, also when one comes from
// stream sequence 1, or producers would count it applied (and Flush
// return) while it waits.
func TestHeldProgressCoversOnlyAppliedItems(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1), tables.QueueConfig("a", 10)}, deployOptions{})
	first := publishRaw(t, d, "p", 2, rawItem{2, "t"}) // stream sequence 1: waits for p's 1
	publishRaw(t, d, "x", 1, rawItem{100, "t"})        // fills t
	publishRaw(t, d, "q", 1, rawItem{3, "t"})          // waits in t's queue
	last := publishRaw(t, d, "p", 1, rawItem{1, "a"})  // applies p's 1, then 2, whose item joins t's queue behind 3
	testutil.WaitUntil(t, "everything applied or queued", func() bool { return d.svc.Applied() >= last })
	if n := d.svc.pendingLen("t"); n != 2 {
		t.Fatalf("%d items wait in t, want 2", n)
	}
	held, ok := heldProgress(d, "t")
	if !ok || held >= first {
		t.Fatalf("progress for t = %d (published: %v): it covers item 2's message at stream sequence %d, which still waits", held, ok, first)
	}
}

// TestResetDropsQueuedItems: items that waited for the limiter when a
// reset came were inserted before it, so the reset empties them too.
func TestResetDropsQueuedItems(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1)}, deployOptions{})
	publishRaw(t, d, "p", 1, rawItem{1, "t"})
	last := publishRaw(t, d, "p", 2, rawItem{2, "t"}, rawItem{3, "t"})
	testutil.WaitUntil(t, "items 2 and 3 wait", func() bool { return d.svc.Applied() >= last && d.svc.pendingLen("t") == 2 })
	c := d.client()
	if err := c.Reset(testutil.Context(t), "t"); err != nil {
		t.Fatal(err)
	}
	if n := tableSize(t, c, "t"); n != 0 {
		t.Fatalf("after Reset the table holds %d items inserted before it", n)
	}
	if n := d.svc.pendingLen("t"); n != 0 {
		t.Fatalf("after Reset %d items still wait", n)
	}
	if _, ok := heldProgress(d, "t"); ok {
		t.Fatal("progress still holds t back after its queue was reset")
	}
}

// TestMutationsReachQueuedItems: a delete or priority update applies to a
// queued copy of the key too, so a later sample never returns a deleted
// key or an old priority.
func TestMutationsReachQueuedItems(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1)}, deployOptions{})
	c := d.client()
	publishRaw(t, d, "p", 1, rawItem{1, "t"})                          // in the table
	publishRaw(t, d, "p", 2, rawItem{2, "t"})                          // waits
	last := publishRaw(t, d, "p", 3, rawItem{1, "t"}, rawItem{4, "t"}) // key 1 again, and 4: wait
	testutil.WaitUntil(t, "three items wait", func() bool { return d.svc.Applied() >= last && d.svc.pendingLen("t") == 3 })
	ctx := testutil.Context(t)
	if err := c.Delete(ctx, "t", 1); err != nil {
		t.Fatal(err)
	}
	if err := c.UpdatePriorities(ctx, "t", tables.PriorityUpdate{Key: 4, Priority: 7}); err != nil {
		t.Fatal(err)
	}
	s, err := c.Sample(ctx, "t", 1)
	if err != nil || ids(t, s[0])[0] != 2 {
		t.Fatalf("first sample after the delete: %v, %v; want item 2", s, err)
	}
	s, err = c.Sample(ctx, "t", 1)
	if err != nil || s[0].Info.Key != 4 || s[0].Info.Priority != 7 {
		t.Fatalf("second sample: %+v, %v; want item 4 at priority 7 (the deleted key 1 must not come back)", s, err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if s, err := c.Sample(short, "t", 1); err == nil {
		t.Fatalf("sampled key %d after the queue should be empty", s[0].Info.Key)
	}
}

// TestInsertWaitsCountsQueuedItems: every item the limiter held counts
// once, including those queued behind another without being tried.
func TestInsertWaitsCountsQueuedItems(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1)}, deployOptions{})
	last := publishRaw(t, d, "p", 1, rawItem{1, "t"}, rawItem{2, "t"}, rawItem{3, "t"}, rawItem{4, "t"})
	testutil.WaitUntil(t, "applied", func() bool { return d.svc.Applied() >= last })
	drainQueue(t, d.client(), "t", 4)
	tb, _ := d.svc.Table("t")
	if w := tb.Info().Counters.InsertWaits; w != 3 {
		t.Fatalf("InsertWaits = %d, want 3 (items 2, 3 and 4 were held)", w)
	}
}

// TestInsertedAtIsWhenItemsWentIn: the items of a message that go straight
// into their table went in when the service took the message up, all at
// one reading of the clock; an item the limiter held went in when room
// came, after that.
func TestInsertedAtIsWhenItemsWentIn(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1), tables.QueueConfig("a", 10)}, deployOptions{})
	c := d.client()
	before := time.Now()
	last := publishRaw(t, d, "p", 1, rawItem{1, "a"}, rawItem{2, "a"}, rawItem{3, "t"}, rawItem{4, "t"})
	testutil.WaitUntil(t, "items 1-3 in, 4 waiting", func() bool { return d.svc.Applied() >= last && d.svc.pendingLen("t") == 1 })
	applied := time.Now()
	ctx := testutil.Context(t)
	inserted := map[int64]time.Time{}
	for _, table := range []string{"a", "a", "t", "t"} {
		s, err := c.Sample(ctx, table, 1)
		if err != nil {
			t.Fatal(err)
		}
		inserted[ids(t, s[0])[0]] = s[0].Info.InsertedAt
	}
	at := inserted[1]
	if at.Before(before) || at.After(applied) {
		t.Fatalf("item 1 went in at %v, not between the publish (%v) and the message's apply (%v)", at, before, applied)
	}
	for _, id := range []int64{2, 3} {
		if !inserted[id].Equal(at) {
			t.Fatalf("item %d went in at %v, item 1 of the same message at %v", id, inserted[id], at)
		}
	}
	if !inserted[4].After(applied) {
		t.Fatalf("item 4, held until item 3 was sampled, went in at %v, not after its message was applied (%v)", inserted[4], applied)
	}
}

// TestPendingBytesBounded: waiting items hold their chunks after their
// producer lets go, so their bytes are bounded too: past
// limits.max_pending_bytes the stream waits, and nothing is lost.
func TestPendingBytesBounded(t *testing.T) {
	const chunkBytes = 128 << 10
	lim := DefaultLimits()
	lim.MaxHeldChunkBytes = 3 * chunkBytes
	lim.MaxPendingBytes = 3*chunkBytes + 3<<10 // three chunks and their headers
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1)}, deployOptions{service: []Option{WithLimits(lim)}})
	values := make([]int64, chunkBytes/8)
	for i := range 12 {
		for j := range values {
			values[j] = int64(i*7919+j) * 2654435761
		}
		ch, err := wire.EncodeChunk(uint64(9000+i), []*wire.Tensor{wire.Int64s([]int64{int64(len(values))}, values)}, wire.ChunkOptions{})
		if err != nil {
			t.Fatal(err)
		}
		publishBatch(t, d, &wire.InsertBatch{ProducerId: "h", Sequence: uint64(i + 1), WindowStart: uint64(i + 1), Window: 8,
			Chunks: []*wire.Chunk{ch}, ReleaseChunkKeys: []uint64{ch.Key},
			Items: []*wire.Item{{Key: uint64(i + 1), Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{{Name: "v", Squeeze: true, Slices: []*wire.ColumnSlice{{ChunkKey: ch.Key, Length: 1}}}}}}}, "")
	}
	// One item in the table, three waiting (the bound), the fifth message's
	// chunk held by its producer while the stream waits.
	testutil.WaitUntil(t, "the stream waits on the full queue", func() bool { return d.svc.Applied() == 4 && d.svc.pendingLen("t") == 3 })
	if n, b := d.svc.store.Len(), d.svc.store.Bytes(); n > 5 || b > 5*chunkBytes+5*1024 {
		t.Fatalf("the store holds %d chunks, %d bytes: waiting items escape the bound of %d bytes", n, b, lim.MaxPendingBytes)
	}
	c := d.client()
	var got []uint64
	for range 12 {
		s, err := c.Sample(testutil.Context(t), "t", 1)
		if err != nil {
			t.Fatalf("after %v: applied %d, pending %d: %v", got, d.svc.Applied(), d.svc.pendingLen("t"), err)
		}
		got = append(got, s[0].Info.Key)
	}
	if want := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}; !slices.Equal(got, want) {
		t.Fatalf("sampled %v, want %v: each item once, in order", got, want)
	}
}

// TestFullQueueHalfAppliedAcrossCrash: a full queue holds up a message half
// way through its items across a checkpoint; more messages come after it,
// and the service stops without a final checkpoint. After recovery every
// item arrives exactly once, in order per table.
func TestFullQueueHalfAppliedAcrossCrash(t *testing.T) {
	cs, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	lim := DefaultLimits()
	lim.MaxPendingItems = 2
	cfgs := []tables.Config{tables.QueueConfig("t", 1), tables.QueueConfig("a", 100)}
	opts := []Option{WithCheckpoints(cs), WithoutFinalCheckpoint(), WithLimits(lim)}
	d := deploy(t, cfgs, deployOptions{service: opts})
	ctx := testutil.Context(t)
	// t: 1 goes in, 2 and 3 wait (the bound), 4 holds up the message.
	publishRaw(t, d, "p", 1, rawItem{11, "a"}, rawItem{1, "t"}, rawItem{2, "t"}, rawItem{12, "a"}, rawItem{3, "t"}, rawItem{4, "t"}, rawItem{13, "a"}, rawItem{5, "t"})
	publishRaw(t, d, "q", 1, rawItem{14, "a"})
	testutil.WaitUntil(t, "the message is held up", func() bool { return d.svc.pendingLen("t") == 2 })
	if _, err := d.svc.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	publishRaw(t, d, "q", 2, rawItem{15, "a"})
	if got := drainQueue(t, d.client(), "t", 1); got[0] != 1 {
		t.Fatalf("first item of t: %v", got)
	}
	tb, _ := d.svc.Table("t")
	testutil.WaitUntil(t, "item 2 went in and 4 joined the queue", func() bool {
		return tb.Info().Counters.Inserts == 2 && d.svc.pendingLen("t") == 2
	})
	d.stop()
	d.startService(cfgs, opts[:2]...)
	c := d.client()
	// Item 1 was sampled after the checkpoint: sampling is not logged, so it
	// comes back, as README says.
	gotT, gotA := drainQueue(t, c, "t", 5), drainQueue(t, c, "a", 5)
	if !slices.Equal(gotT, []int64{1, 2, 3, 4, 5}) || !slices.Equal(gotA, []int64{11, 12, 13, 14, 15}) {
		t.Fatalf("t delivered %v, a %v", gotT, gotA)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if s, err := c.Sample(short, "t", 1); err == nil {
		t.Fatalf("an extra item %v", ids(t, s[0]))
	}
}

// TestQueuedItemKeepsItsChunks: a waiting item holds its chunks after its
// producer released them and ended, across a checkpoint and a restart, and
// lets go of them once it is in.
func TestQueuedItemKeepsItsChunks(t *testing.T) {
	cs, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := []tables.Config{tables.QueueConfig("t", 1)}
	opts := []Option{WithCheckpoints(cs), WithoutFinalCheckpoint()}
	d := deploy(t, cfgs, deployOptions{service: opts})
	publishBatch(t, d, &wire.InsertBatch{ProducerId: "p", Sequence: 1, WindowStart: 1, Window: 8,
		Chunks:           []*wire.Chunk{int64Chunk(t, 501, 1), int64Chunk(t, 502, 2)},
		Items:            []*wire.Item{oneStepItem(1, "t", 501), oneStepItem(2, "t", 502), oneStepItem(3, "t", 502)},
		ReleaseChunkKeys: []uint64{501, 502}, EndOfStream: true}, "")
	testutil.WaitUntil(t, "two items wait", func() bool { return d.svc.pendingLen("t") == 2 })
	if _, err := d.svc.Checkpoint(testutil.Context(t)); err != nil {
		t.Fatal(err)
	}
	d.stop()
	svc, _ := d.startService(cfgs, opts...)
	if got := drainQueue(t, d.client(), "t", 3); !slices.Equal(got, []int64{1, 2, 2}) {
		t.Fatalf("delivered %v, want [1 2 2]", got)
	}
	testutil.WaitUntil(t, "every chunk released", func() bool { return svc.store.Len() == 0 })
}

// TestResetFreesAFullQueue: a reset of a table whose full queue holds up
// the stream is applied, and the stream goes on, though the reset lies in
// the stream behind the held insert: the service finds it there and drops
// the table's items before it, as applying it drops them. It waited
// before for a sample that would never come (the reset timed out, and
// another table's item after it never went in), and replaying the stream
// after a restart does the same.
func TestResetFreesAFullQueue(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxPendingItems = 2
	cfgs := []tables.Config{tables.QueueConfig("t", 1), tables.QueueConfig("b", 10)}
	opts := []Option{WithLimits(lim), WithMaxSampleWait(10 * time.Second)}
	d := deploy(t, cfgs, deployOptions{service: opts})
	publishRaw(t, d, "p", 1, rawItem{1, "t"})                  // fills the Queue(1)
	publishRaw(t, d, "p", 2, rawItem{2, "t"}, rawItem{3, "t"}) // fill t's queue
	held := publishRaw(t, d, "q", 1, rawItem{4, "t"})          // holds up the stream
	publishRaw(t, d, "r", 1, rawItem{5, "b"})
	testutil.WaitUntil(t, "t's queue is full", func() bool { return d.svc.Applied() == held-1 && d.svc.pendingLen("t") == 2 })
	c := d.client()
	ctx := testutil.Context(t)
	if err := c.Reset(ctx, "t"); err != nil {
		t.Fatalf("Reset of the table whose full queue holds up the stream: %v", err)
	}
	check := func(svc *Service, when string) {
		t.Helper()
		if n, q := tableSize(t, c, "t"), svc.pendingLen("t"); n != 0 || q != 0 {
			t.Fatalf("%s: t holds %d items and %d wait, want none", when, n, q)
		}
		if n := tableSize(t, c, "b"); n != 1 {
			t.Fatalf("%s: b holds %d items, want its item stored after t's", when, n)
		}
		if _, ok := heldProgress(d, "t"); ok {
			t.Fatalf("%s: progress still holds t back", when)
		}
	}
	testutil.WaitUntil(t, "b's item applied", func() bool { return d.svc.Applied() > held+1 })
	check(d.svc, "after the reset")
	// t goes on taking items after the reset.
	last := publishRaw(t, d, "q", 2, rawItem{6, "t"})
	testutil.WaitUntil(t, "a new item of t", func() bool { return d.svc.Applied() >= last && tableSize(t, c, "t") == 1 })
	d.stop()
	// Replayed from the start, no request to say that a reset lies ahead.
	svc, _ := d.startService(cfgs, opts...)
	testutil.WaitUntil(t, "the stream replayed", func() bool { return svc.Applied() >= last })
	if got := stateOf(t, svc, "t").order; len(got) != 1 || got[0] != 6 {
		t.Fatalf("after replaying the stream t holds %v, want [6]", got)
	}
	if n := tableSize(t, c, "b"); n != 1 {
		t.Fatalf("after replaying the stream b holds %d items, want 1", n)
	}
}

// TestResetFoundBehindManyOtherResets: the lookup for a reset of a table
// whose full queue holds up the stream goes on from where the last one
// stopped; it scanned at most 64 resets from the held message each time,
// and one behind 64 resets of another table was never found.
func TestResetFoundBehindManyOtherResets(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxPendingItems = 2
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1), tables.QueueConfig("b", 10)},
		deployOptions{service: []Option{WithLimits(lim), WithMaxSampleWait(10 * time.Second)}})
	publishRaw(t, d, "p", 1, rawItem{1, "t"})
	publishRaw(t, d, "p", 2, rawItem{2, "t"}, rawItem{3, "t"})
	held := publishRaw(t, d, "q", 1, rawItem{4, "t"})
	testutil.WaitUntil(t, "t's queue is full", func() bool { return d.svc.Applied() == held-1 && d.svc.pendingLen("t") == 2 })
	ctx := testutil.Context(t)
	for range 100 {
		if _, err := d.svc.js.Publish(ctx, d.svc.subj.Reset(), mustMarshal(t, &wire.ResetRequest{Table: "b"})); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.client().Reset(ctx, "t"); err != nil {
		t.Fatalf("Reset of t behind 100 resets of b: %v", err)
	}
}

// TestFullQueueAsksTheStreamOnce: items that meet a full queue one after
// another, as samples make room, do not each ask the stream for a reset
// ahead: each did, a round trip on the apply loop (up to 2 s when the
// stream's leader does not answer) for every item.
func TestFullQueueAsksTheStreamOnce(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxPendingItems = 2
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1)}, deployOptions{service: []Option{WithLimits(lim)}})
	nc := d.connect()
	var lookups atomic.Int64
	for _, subj := range []string{"$JS.API.STREAM.MSG.GET.>", "$JS.API.DIRECT.GET.>"} {
		if _, err := nc.Subscribe(subj, func(*nats.Msg) { lookups.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const n = 40
	var last uint64
	for i := range int64(n + 3) {
		last = publishRaw(t, d, "p", uint64(i+1), rawItem{i + 1, "t"})
	}
	start := time.Now()
	drainQueue(t, d.client(), "t", n)
	testutil.WaitUntil(t, "the stream applied", func() bool { return d.svc.Applied() >= last })
	// One a resetLookPeriod at most, and one on entering.
	if got, most := lookups.Load(), 2+int64(time.Since(start)/resetLookPeriod); got > most {
		t.Fatalf("%d items through the full queue asked the stream %d times, want at most %d", n, got, most)
	}
}

// TestQueuedItemOfAnUnconfiguredTableIsRejected: an item that waited for
// its table's limiter at a checkpoint, restored by a service whose config
// no longer has the table, is dropped, and its producer is told: its
// progress no longer holds the table back, so the producer took it as
// applied, and only a log line said otherwise.
func TestQueuedItemOfAnUnconfiguredTableIsRejected(t *testing.T) {
	cs, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opts := []Option{WithCheckpoints(cs), WithoutFinalCheckpoint()}
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1), tables.QueueConfig("a", 10)}, deployOptions{service: opts})
	ctx := testutil.Context(t)
	inbox, notes := notices(t, d)
	batch := &wire.InsertBatch{ProducerId: "unconfigured0unconfigured0uncon", Sequence: 1, WindowStart: 1, Window: 4, NoticeSubject: inbox}
	for key := uint64(1); key <= 2; key++ {
		ch := int64Chunk(t, key, int64(key))
		batch.Chunks = append(batch.Chunks, ch)
		batch.Items = append(batch.Items, oneStepItem(key, "t", key))
	}
	publishBatch(t, d, batch, "")
	testutil.WaitUntil(t, "item 2 waits for t's limiter", func() bool { return d.svc.pendingLen("t") == 1 })
	if _, err := d.svc.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	d.stop()
	d.startService([]tables.Config{tables.QueueConfig("a", 10)}, opts...)
	r := waitNotice(t, notes, wire.Code_CODE_NOT_FOUND, `for table "t", which the config no longer defines`)
	if r.ItemKey != 2 || r.Sequence != 1 || r.Table != "t" {
		t.Fatalf("rejection %v, want item 2 of message 1 for table t", r)
	}
}

// TestQueuedItemOfAnUnconfiguredTableIsRejectedByAStandby: a standby whose
// config no longer has table t restores a checkpoint in which an item
// waits for t. Its refusal is withheld while the active service (which
// still has t, and holds t below the item) publishes progress past the
// checkpoint. That progress does not cover the refusal: the active
// service never refused the item. At takeover the standby must send it
// before its own progress, which holds no table back, tells the producer
// the item went in.
func TestQueuedItemOfAnUnconfiguredTableIsRejectedByAStandby(t *testing.T) {
	cs, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opts := []Option{WithCheckpoints(cs), WithoutFinalCheckpoint(), WithStandby(time.Second)}
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1), tables.QueueConfig("a", 10)}, deployOptions{service: opts})
	ctx := testutil.Context(t)
	var last atomic.Uint64
	w := watchOrder(t, d, coveredPast(&last, true))
	batch := &wire.InsertBatch{ProducerId: "unconfigured1unconfigured1uncon", Sequence: 1, WindowStart: 1, Window: 4, NoticeSubject: w.notice}
	for key := uint64(1); key <= 2; key++ {
		ch := int64Chunk(t, key, int64(key))
		batch.Chunks = append(batch.Chunks, ch)
		batch.Items = append(batch.Items, oneStepItem(key, "t", key))
	}
	ack := publishBatch(t, d, batch, "")
	testutil.WaitUntil(t, "item 2 waits for t's limiter", func() bool { return d.svc.pendingLen("t") == 1 })
	if _, err := d.svc.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	b, _ := d.startService([]tables.Config{tables.QueueConfig("a", 10)}, opts...)
	testutil.WaitUntil(t, "the standby hears the active service's progress past the checkpoint", func() bool {
		return b.coveredUpTo() >= ack.Sequence && b.Applied() >= ack.Sequence
	})
	last.Store(ack.Sequence)
	d.stop() // the standby takes over
	w.noticeFirst(t, 1, "item 2")
}

// TestReplayedItemOfAnUnconfiguredTableIsRejectedByAStandby: a standby
// whose config lacks table t applies, from the stream, an insert the
// active service (which has t) queues, t being full. The standby refuses
// it as it applies it, and withholds the refusal; the active service
// publishes progress past the message that holds t below it. Keyed by the
// message alone, that progress counted as having sent the refusal: at
// takeover the standby dropped it, and its own progress, which holds no
// table back, told the producer the item went in.
func TestReplayedItemOfAnUnconfiguredTableIsRejectedByAStandby(t *testing.T) {
	opts := []Option{WithoutFinalCheckpoint(), WithStandby(time.Second)}
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1), tables.QueueConfig("a", 10)}, deployOptions{service: opts})
	var last atomic.Uint64
	w := watchOrder(t, d, coveredPast(&last, true))
	b, _ := d.startService([]tables.Config{tables.QueueConfig("a", 10)}, opts...)
	batch := &wire.InsertBatch{ProducerId: "unconfigured2unconfigured2uncon", Sequence: 1, WindowStart: 1, Window: 4, NoticeSubject: w.notice}
	for key := uint64(1); key <= 2; key++ {
		batch.Chunks = append(batch.Chunks, int64Chunk(t, key, int64(key)))
		batch.Items = append(batch.Items, oneStepItem(key, "t", key))
	}
	ack := publishBatch(t, d, batch, "")
	testutil.WaitUntil(t, "item 2 waits for t's limiter", func() bool { return d.svc.pendingLen("t") == 1 })
	testutil.WaitUntil(t, "the standby applied the message and heard progress past it", func() bool {
		return b.coveredUpTo() >= ack.Sequence && b.Applied() >= ack.Sequence
	})
	last.Store(ack.Sequence)
	d.stop() // the standby takes over
	w.noticeFirst(t, 1, "item 2")
}

// gateObserver holds the service's apply loop in its first ItemInserted
// until release is closed, so that a test can order what the service
// hears against what it applies.
type gateObserver struct {
	once    sync.Once
	release chan struct{}
}

func (g *gateObserver) SampleServed(string, int, time.Duration, Code) {}
func (g *gateObserver) Rejected(string, Code)                         {}
func (g *gateObserver) ItemInserted(string, time.Duration) {
	g.once.Do(func() { <-g.release })
}

// TestReplayedItemRefusedByBothIsRefusedOnce: neither the active service
// nor the standby has table t. The active service refuses an item of t
// and publishes progress past its message, which the standby hears before
// it applies that message (it lags). The standby's refusal, keyed by t,
// must count as sent: it followed t only from its refusal on, from 0, and
// at takeover sent the producer a second notice of the same item, which
// Go's and Python's producers count as a second rejection.
func TestReplayedItemRefusedByBothIsRefusedOnce(t *testing.T) {
	cfgs := []tables.Config{tables.QueueConfig("a", 10)}
	opts := []Option{WithoutFinalCheckpoint(), WithStandby(time.Second)}
	d := deploy(t, cfgs, deployOptions{service: opts})
	var last atomic.Uint64
	w := watchOrder(t, d, coveredPast(&last, false))
	gate := &gateObserver{release: make(chan struct{})}
	b, _ := d.startService(cfgs, append(opts, WithObserver(gate))...)
	const producer = "refusedbyboth0refusedbyboth0ref"
	batch := &wire.InsertBatch{ProducerId: producer, Sequence: 1, WindowStart: 1, Window: 4, NoticeSubject: w.notice,
		Chunks: []*wire.Chunk{int64Chunk(t, 1, 1), int64Chunk(t, 2, 2)},
		// The standby waits in item 1's insert, before it refuses item 2.
		Items: []*wire.Item{oneStepItem(1, "a", 1), oneStepItem(2, "t", 2)}}
	ack := publishBatch(t, d, batch, "")
	testutil.WaitUntil(t, "the standby hears progress past the message before it applies it", func() bool {
		return b.coveredUpTo() >= ack.Sequence
	})
	close(gate.release)
	testutil.WaitUntil(t, "the standby applied the message", func() bool { return b.Applied() >= ack.Sequence })
	d.stop() // the standby takes over
	next := publishBatch(t, d, &wire.InsertBatch{ProducerId: producer, Sequence: 2, WindowStart: 1, Window: 4, NoticeSubject: w.notice,
		Chunks: []*wire.Chunk{int64Chunk(t, 3, 3)}, Items: []*wire.Item{oneStepItem(3, "a", 3)}}, "")
	last.Store(next.Sequence)
	// The standby sends what it withheld before its first progress.
	refusals := 0
	deadline := time.After(30 * time.Second)
	for {
		select {
		case e := <-w.events:
			if e.refusal == 1 {
				refusals++
			}
			if !e.covers {
				continue
			}
			if refusals != 1 {
				t.Fatalf("item 2 of message 1 refused %d times, want once", refusals)
			}
			return
		case <-deadline:
			t.Fatal("no progress from the service that took over")
		}
	}
}
