package service

import (
	"encoding/binary"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
)

// TestRefusalWithheldWhileLapsedComesBeforeProgress: a service that
// applies a mutation while it may not act (its lease lapsed in a pause, or
// a standby about to take over) must still tell the mutation's client of
// its refusal before it publishes progress that covers the mutation, since
// a client takes progress past its mutation with no refusal before it as
// the mutation applied. It sent no refusal at all, ever: the client's
// Mutate returned nil for a mutation that was refused.
func TestRefusalWithheldWhileLapsedComesBeforeProgress(t *testing.T) {
	cfgs := []tables.Config{testutil.UniformTable("t", 100)}
	d := deploy(t, cfgs, deployOptions{service: []Option{WithStandby(time.Minute)}})
	a := d.svc
	nc := d.connect()
	type event struct {
		refusal  uint64 // the refused sequence, or 0
		progress uint64
	}
	events := make(chan event, 1024)
	notice := nc.NewInbox()
	// One channel for both, fed by one connection: their order is the order
	// the server delivered them in.
	msgs := make(chan *nats.Msg, 1024)
	for _, subject := range []string{notice, a.subj.Applied()} {
		sub, err := nc.ChanSubscribe(subject, msgs)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range msgs {
			if m.Subject == notice {
				var r wire.Rejection
				if proto.Unmarshal(m.Data, &r) == nil {
					events <- event{refusal: r.Sequence}
				}
				continue
			}
			var p wire.Progress
			if proto.Unmarshal(m.Data, &p) == nil {
				events <- event{progress: p.AppliedSequence}
			}
		}
	}()

	a.lease.until.Store(1) // lapsed, by its own clock
	ack, err := a.js.Publish(testutil.Context(t), a.subj.Mutate(), mustMarshal(t, &wire.Mutation{Table: "gone", NoticeSubject: notice, PolicyVersion: 1}))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "the mutation is applied", func() bool { return a.Applied() >= ack.Sequence })
	a.lease.until.Store(int64(time.Since(a.lease.base) + time.Hour))

	deadline := time.After(30 * time.Second)
	for {
		select {
		case e := <-events:
			if e.refusal == ack.Sequence {
				return
			}
			if e.progress >= ack.Sequence && e.progress != math.MaxUint64 {
				t.Fatalf("progress %d covers the refused mutation %d, and no refusal came before it", e.progress, ack.Sequence)
			}
		case <-deadline:
			t.Fatal("neither a refusal nor progress came")
		}
	}
}

// TestInsertRefusalWithheldWhileLapsedComesBeforeProgress: as for a
// mutation, a producer takes progress past its message with no rejection
// before it as its items applied: an item refused while the service may
// not act must be told before progress covering it.
func TestInsertRefusalWithheldWhileLapsedComesBeforeProgress(t *testing.T) {
	cfgs := []tables.Config{testutil.UniformTable("t", 100)}
	d := deploy(t, cfgs, deployOptions{service: []Option{WithStandby(time.Minute)}})
	a := d.svc
	nc := d.connect()
	type event struct {
		refusal  uint64 // the refused sequence, or 0
		progress uint64
	}
	events := make(chan event, 1024)
	notice := nc.NewInbox()
	// One channel for both, fed by one connection: their order is the order
	// the server delivered them in.
	msgs := make(chan *nats.Msg, 1024)
	for _, subject := range []string{notice, a.subj.Applied()} {
		sub, err := nc.ChanSubscribe(subject, msgs)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range msgs {
			if m.Subject == notice {
				var r wire.Rejection
				if proto.Unmarshal(m.Data, &r) == nil {
					events <- event{refusal: r.Sequence}
				}
				continue
			}
			var p wire.Progress
			if proto.Unmarshal(m.Data, &p) == nil {
				events <- event{progress: p.AppliedSequence}
			}
		}
	}()

	a.lease.until.Store(1) // lapsed, by its own clock
	ack, err := a.js.Publish(testutil.Context(t), a.subj.Insert(), mustMarshal(t, &wire.InsertBatch{ProducerId: "p", Sequence: 1, WindowStart: 1, Window: 4,
		NoticeSubject: notice, Items: []*wire.Item{{Key: 2, Table: "gone", Priority: 1}}}))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "the insert is applied", func() bool { return a.Applied() >= ack.Sequence })
	a.lease.until.Store(int64(time.Since(a.lease.base) + time.Hour))

	deadline := time.After(30 * time.Second)
	for {
		select {
		case e := <-events:
			if e.refusal == 1 { // the producer's sequence
				return
			}
			if e.progress >= ack.Sequence && e.progress != math.MaxUint64 {
				t.Fatalf("progress %d covers the refused insert %d, and no rejection came before it", e.progress, ack.Sequence)
			}
		case <-deadline:
			t.Fatal("neither a refusal nor progress came")
		}
	}
}

// TestWithheldNoticesCoveredAreNotSentAgain: a notice withheld for a
// message that another service's progress covered was sent by that
// service; sent again at a takeover, a producer would report the same
// rejection twice, long after its call that reported it.
func TestWithheldNoticesCoveredAreNotSentAgain(t *testing.T) {
	nc, err := nats.Connect(testutil.StartEmbedded(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync("notices")
	if err != nil {
		t.Fatal(err)
	}
	var w withheldNotices
	const n = maxWithheldNotices + 10
	for at := uint64(1); at <= n; at++ {
		w.add(noticeAt{seq: at}, "notices", binary.AppendUvarint(nil, at))
	}
	w.send(nc, func(at noticeAt) bool { return at.seq <= n-5 })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "the notices arrive", func() bool {
		queued, _, err := sub.Pending()
		return err == nil && queued >= 5
	})
	for want := uint64(n - 4); want <= n; want++ {
		m, err := sub.NextMsg(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if at, _ := binary.Uvarint(m.Data); at != want {
			t.Fatalf("the notice withheld at %d came, want the one at %d", at, want)
		}
	}
	if n, _, _ := sub.Pending(); n != 0 {
		t.Fatalf("%d more notices sent, of messages already covered", n)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.msgs) != 0 || len(w.at) != 0 {
		t.Fatalf("%d notices still withheld after they were sent", len(w.msgs))
	}
}

// TestHeldItemRefusedWhileLapsedComesBeforeProgress: an item that waited
// in its table's queue is refused when it leaves the queue, long after
// its message was applied. Refused while the service may not act, the
// notice was withheld under the sequence being applied then, which the
// service's own earlier progress already covered (progress that still
// held the table below the item): it was never sent, and the progress
// that released the table told the producer its item went in.
func TestHeldItemRefusedWhileLapsedComesBeforeProgress(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxItemBytes = 4 << 10
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1)}, deployOptions{service: []Option{WithStandby(time.Minute), WithLimits(lim)}})
	a := d.svc
	nc := d.connect()
	type event struct {
		refusal uint64 // the refused producer sequence, or 0
		covers  bool   // progress that no longer holds table t
	}
	events := make(chan event, 1024)
	notice := nc.NewInbox()
	msgs := make(chan *nats.Msg, 1024)
	for _, subject := range []string{notice, a.subj.Applied()} {
		sub, err := nc.ChanSubscribe(subject, msgs)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var last uint64
	go func() {
		for m := range msgs {
			if m.Subject == notice {
				var r wire.Rejection
				if proto.Unmarshal(m.Data, &r) == nil {
					events <- event{refusal: r.Sequence}
				}
				continue
			}
			var p wire.Progress
			if proto.Unmarshal(m.Data, &p) == nil && p.AppliedSequence >= atomic.LoadUint64(&last) && atomic.LoadUint64(&last) > 0 && len(p.Held) == 0 {
				events <- event{covers: true}
			}
		}
	}()

	large := make([]int64, 1024) // 8 KiB, over max_item_bytes
	big, err := wire.EncodeChunk(3, []*wire.Tensor{wire.Int64s([]int64{int64(len(large))}, large)}, wire.ChunkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ack *jetstream.PubAck
	for i, ch := range []*wire.Chunk{int64Chunk(t, 1, 1), int64Chunk(t, 2, 2), big} {
		key := uint64(i + 1)
		item := oneStepItem(key, "t", ch.Key)
		if ch == big {
			item.Columns[0].Squeeze = false
		}
		ack = publishBatch(t, d, &wire.InsertBatch{ProducerId: "p", Sequence: key, WindowStart: 1, Window: 8, NoticeSubject: notice,
			Chunks: []*wire.Chunk{ch}, ReleaseChunkKeys: []uint64{ch.Key}, Items: []*wire.Item{item}}, "")
	}
	// The first in the table, the others waiting; progress published that
	// holds the table below the second.
	testutil.WaitUntil(t, "two items wait", func() bool { return a.Applied() >= ack.Sequence && a.pendingLen("t") == 2 })
	testutil.WaitUntil(t, "progress covers the last message", func() bool { return a.covered.Load() >= ack.Sequence })

	a.lease.until.Store(1) // lapsed, by its own clock
	atomic.StoreUint64(&last, ack.Sequence)
	// A sample taken as the lease lapsed (its reply is withheld) makes room:
	// the second item goes in, the third is refused as too large.
	if _, err := a.tables["t"].Sample(testutil.Context(t), 1); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "the queue drains", func() bool { return a.pendingLen("t") == 0 })
	a.lease.until.Store(int64(time.Since(a.lease.base) + time.Hour))

	deadline := time.After(30 * time.Second)
	for {
		select {
		case e := <-events:
			if e.refusal == 3 {
				return
			}
			if e.covers {
				t.Fatal("progress released the table past the refused item 3, and no rejection came before it")
			}
		case <-deadline:
			t.Fatal("neither a refusal nor progress came")
		}
	}
}

// TestReorderedItemRefusedWhileLapsedComesBeforeProgress: an item whose
// message a producer's reorder buffer held (an earlier message of the
// producer missing) joins its table's queue long after progress passed
// its message with the table not held. Refused as it leaves the queue
// while the service may not act, its notice was withheld under its
// message's sequence, which that earlier progress covered: never sent.
func TestReorderedItemRefusedWhileLapsedComesBeforeProgress(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxItemBytes = 4 << 10
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 1)}, deployOptions{service: []Option{WithStandby(time.Minute), WithLimits(lim)}})
	a := d.svc
	nc := d.connect()
	type event struct {
		refusal uint64
		covers  bool
	}
	events := make(chan event, 1024)
	notice := nc.NewInbox()
	msgs := make(chan *nats.Msg, 1024)
	for _, subject := range []string{notice, a.subj.Applied()} {
		sub, err := nc.ChanSubscribe(subject, msgs)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var last uint64
	go func() {
		for m := range msgs {
			if m.Subject == notice {
				var r wire.Rejection
				if proto.Unmarshal(m.Data, &r) == nil {
					events <- event{refusal: r.Sequence}
				}
				continue
			}
			var p wire.Progress
			if proto.Unmarshal(m.Data, &p) == nil && p.AppliedSequence >= atomic.LoadUint64(&last) && atomic.LoadUint64(&last) > 0 && len(p.Held) == 0 {
				events <- event{covers: true}
			}
		}
	}()

	large := make([]int64, 1024) // 8 KiB, over max_item_bytes
	big, err := wire.EncodeChunk(3, []*wire.Tensor{wire.Int64s([]int64{int64(len(large))}, large)}, wire.ChunkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	send := func(seq uint64, ch *wire.Chunk) *jetstream.PubAck {
		item := oneStepItem(seq, "t", ch.Key)
		if ch == big {
			item.Columns[0].Squeeze = false
		}
		return publishBatch(t, d, &wire.InsertBatch{ProducerId: "p", Sequence: seq, WindowStart: 1, Window: 8, NoticeSubject: notice,
			Chunks: []*wire.Chunk{ch}, ReleaseChunkKeys: []uint64{ch.Key}, Items: []*wire.Item{item}}, "")
	}
	send(1, int64Chunk(t, 1, 1)) // fills the table
	ack3 := send(3, big)         // waits for 2 in the reorder buffer
	testutil.WaitUntil(t, "progress passes message 3, the table not held", func() bool { return a.covered.Load() >= ack3.Sequence })
	ack2 := send(2, int64Chunk(t, 2, 2)) // 2 and then 3 join the queue
	testutil.WaitUntil(t, "two items wait", func() bool { return a.Applied() >= ack2.Sequence && a.pendingLen("t") == 2 })
	testutil.WaitUntil(t, "progress covers the last message", func() bool { return a.covered.Load() >= ack2.Sequence })

	a.lease.until.Store(1) // lapsed, by its own clock
	atomic.StoreUint64(&last, ack2.Sequence)
	if _, err := a.tables["t"].Sample(testutil.Context(t), 1); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "the queue drains", func() bool { return a.pendingLen("t") == 0 })
	a.lease.until.Store(int64(time.Since(a.lease.base) + time.Hour))

	deadline := time.After(30 * time.Second)
	for {
		select {
		case e := <-events:
			if e.refusal == 3 {
				return
			}
			if e.covers {
				t.Fatal("progress released the table past the refused item 3, and no rejection came before it")
			}
		case <-deadline:
			t.Fatal("neither a refusal nor progress came")
		}
	}
}
