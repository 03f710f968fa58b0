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

// orderWatch follows, in the order the server delivered them, the
// rejections sent to a new inbox (notice) and the progress the services
// publish, judging each progress with covers as it arrives.
type orderWatch struct {
	notice string
	events chan orderEvent
}

type orderEvent struct {
	refusal uint64 // the refused sequence, or 0
	covers  bool   // progress that takes the refused message as applied
}

func watchOrder(t *testing.T, d *deployment, covers func(*wire.Progress) bool) *orderWatch {
	t.Helper()
	nc := d.connect()
	w := &orderWatch{notice: nc.NewInbox(), events: make(chan orderEvent, 1024)}
	// One channel for both, fed by one connection: their order is the order
	// the server delivered them in.
	msgs := make(chan *nats.Msg, 1024)
	for _, subject := range []string{w.notice, d.svc.subj.Applied()} {
		sub, err := nc.ChanSubscribe(subject, msgs)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range msgs {
			if m.Subject == w.notice {
				var r wire.Rejection
				if proto.Unmarshal(m.Data, &r) == nil {
					w.events <- orderEvent{refusal: r.Sequence}
				}
				continue
			}
			var p wire.Progress
			if proto.Unmarshal(m.Data, &p) == nil && covers(&p) {
				w.events <- orderEvent{covers: true}
			}
		}
	}()
	return w
}

// noticeFirst waits for the rejection of sequence seq, failing when
// progress that covers its message comes first.
func (w *orderWatch) noticeFirst(t *testing.T, seq uint64, what string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case e := <-w.events:
			if e.refusal == seq {
				return
			}
			if e.covers {
				t.Fatalf("progress covers the refused %s, and no rejection came before it", what)
			}
		case <-deadline:
			t.Fatal("neither a refusal nor progress came")
		}
	}
}

// coveredPast is a covers for watchOrder: progress at or past the stream
// sequence last holds, once it is set (0 until then), and, with
// whole, holds no table back.
func coveredPast(last *atomic.Uint64, whole bool) func(*wire.Progress) bool {
	return func(p *wire.Progress) bool {
		at := last.Load()
		return at > 0 && p.AppliedSequence >= at && p.AppliedSequence != math.MaxUint64 && (!whole || len(p.Held) == 0)
	}
}

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
	var last atomic.Uint64
	w := watchOrder(t, d, coveredPast(&last, false))

	a.lease.until.Store(1) // lapsed, by its own clock
	ack, err := a.js.Publish(testutil.Context(t), a.subj.Mutate(), mustMarshal(t, &wire.Mutation{Table: "gone", NoticeSubject: w.notice, PolicyVersion: 1}))
	if err != nil {
		t.Fatal(err)
	}
	last.Store(ack.Sequence)
	testutil.WaitUntil(t, "the mutation is applied", func() bool { return a.Applied() >= ack.Sequence })
	a.lease.until.Store(int64(time.Since(a.lease.base) + time.Hour))

	w.noticeFirst(t, ack.Sequence, "mutation")
}

// TestInsertRefusalWithheldWhileLapsedComesBeforeProgress: as for a
// mutation, a producer takes progress past its message with no rejection
// before it as its items applied: an item refused while the service may
// not act must be told before progress covering it.
func TestInsertRefusalWithheldWhileLapsedComesBeforeProgress(t *testing.T) {
	cfgs := []tables.Config{testutil.UniformTable("t", 100)}
	d := deploy(t, cfgs, deployOptions{service: []Option{WithStandby(time.Minute)}})
	a := d.svc
	var last atomic.Uint64
	w := watchOrder(t, d, coveredPast(&last, false))

	a.lease.until.Store(1) // lapsed, by its own clock
	ack, err := a.js.Publish(testutil.Context(t), a.subj.Insert(), mustMarshal(t, &wire.InsertBatch{ProducerId: "p", Sequence: 1, WindowStart: 1, Window: 4,
		NoticeSubject: w.notice, Items: []*wire.Item{{Key: 2, Table: "gone", Priority: 1}}}))
	if err != nil {
		t.Fatal(err)
	}
	last.Store(ack.Sequence)
	testutil.WaitUntil(t, "the insert is applied", func() bool { return a.Applied() >= ack.Sequence })
	a.lease.until.Store(int64(time.Since(a.lease.base) + time.Hour))

	w.noticeFirst(t, 1, "insert") // the producer's sequence
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

// lapsedQueue is a standby service's queue table t of one item, whose
// items of producer "p" may take 4 KiB; big is a chunk of a step over
// that.
type lapsedQueue struct {
	d    *deployment
	w    *orderWatch
	last atomic.Uint64 // the message progress must not pass unheld before the refusal
	big  *wire.Chunk
}

func newLapsedQueue(t *testing.T) *lapsedQueue {
	t.Helper()
	lim := DefaultLimits()
	lim.MaxItemBytes = 4 << 10
	q := &lapsedQueue{d: deploy(t, []tables.Config{tables.QueueConfig("t", 1)}, deployOptions{service: []Option{WithStandby(time.Minute), WithLimits(lim)}})}
	q.w = watchOrder(t, q.d, coveredPast(&q.last, true))
	large := make([]int64, 1024) // 8 KiB
	var err error
	if q.big, err = wire.EncodeChunk(3, []*wire.Tensor{wire.Int64s([]int64{int64(len(large))}, large)}, wire.ChunkOptions{}); err != nil {
		t.Fatal(err)
	}
	return q
}

// send publishes p's message seq, of one item of table t on ch.
func (q *lapsedQueue) send(t *testing.T, seq uint64, ch *wire.Chunk) *jetstream.PubAck {
	t.Helper()
	item := oneStepItem(seq, "t", ch.Key)
	if ch == q.big {
		item.Columns[0].Squeeze = false
	}
	return publishBatch(t, q.d, &wire.InsertBatch{ProducerId: "p", Sequence: seq, WindowStart: 1, Window: 8, NoticeSubject: q.w.notice,
		Chunks: []*wire.Chunk{ch}, ReleaseChunkKeys: []uint64{ch.Key}, Items: []*wire.Item{item}}, "")
}

// drainLapsed waits until two items wait and progress covered the message
// at last, then, with the lease lapsed, has a sample make room: the second
// item goes in, the third is refused as too large. The sample's reply is
// withheld; the lease then comes back.
func (q *lapsedQueue) drainLapsed(t *testing.T, last uint64) {
	t.Helper()
	a := q.d.svc
	testutil.WaitUntil(t, "two items wait", func() bool { return a.Applied() >= last && a.pendingLen("t") == 2 })
	testutil.WaitUntil(t, "progress covers the last message", func() bool { return a.coveredUpTo() >= last })
	a.lease.until.Store(1) // lapsed, by its own clock
	q.last.Store(last)
	if _, err := a.tables["t"].Sample(testutil.Context(t), 1); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "the queue drains", func() bool { return a.pendingLen("t") == 0 })
	a.lease.until.Store(int64(time.Since(a.lease.base) + time.Hour))
}

// TestHeldItemRefusedWhileLapsedComesBeforeProgress: an item that waited
// in its table's queue is refused when it leaves the queue, long after
// its message was applied. Refused while the service may not act, the
// notice was withheld under the sequence being applied then, which the
// service's own earlier progress already covered (progress that still
// held the table below the item): it was never sent, and the progress
// that released the table told the producer its item went in.
func TestHeldItemRefusedWhileLapsedComesBeforeProgress(t *testing.T) {
	q := newLapsedQueue(t)
	q.send(t, 1, int64Chunk(t, 1, 1)) // fills the table
	q.send(t, 2, int64Chunk(t, 2, 2))
	ack := q.send(t, 3, q.big)
	q.drainLapsed(t, ack.Sequence)
	q.w.noticeFirst(t, 3, "item 3")
}

// TestReorderedItemRefusedWhileLapsedComesBeforeProgress: an item whose
// message a producer's reorder buffer held (an earlier message of the
// producer missing) joins its table's queue long after progress passed
// its message with the table not held. Refused as it leaves the queue
// while the service may not act, its notice was withheld under its
// message's sequence, which that earlier progress covered: never sent.
func TestReorderedItemRefusedWhileLapsedComesBeforeProgress(t *testing.T) {
	q := newLapsedQueue(t)
	q.send(t, 1, int64Chunk(t, 1, 1)) // fills the table
	ack3 := q.send(t, 3, q.big)       // waits for 2 in the reorder buffer
	testutil.WaitUntil(t, "progress passes message 3, the table not held", func() bool { return q.d.svc.coveredUpTo() >= ack3.Sequence })
	ack2 := q.send(t, 2, int64Chunk(t, 2, 2)) // 2 and then 3 join the queue
	q.drainLapsed(t, ack2.Sequence)
	q.w.noticeFirst(t, 3, "item 3")
}
