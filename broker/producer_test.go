package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
	"google.golang.org/protobuf/proto"
)

// TestCloseNotStuckBehindWaitingAppend: a call waiting for room in the
// window (with a context that allows it to wait forever) does not keep
// Close, or another call with a deadline, from returning in time.
func TestCloseNotStuckBehindWaitingAppend(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 1)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(0), WithMaxUnapplied(1))
	add := func(ctx context.Context, i int64) error {
		if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{i})}); err != nil {
			return err
		}
		return p.CreateItem(ctx, "queue", 1, LastStep("id"))
	}
	for i := range int64(2) {
		if err := add(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	q, _ := d.svc.Table("queue")
	testutil.WaitUntil(t, "an insert is held", func() bool { return q.Info().Counters.InsertWaits > 0 })
	blocked := make(chan error, 1)
	go func() { blocked <- add(context.Background(), 2) }()
	testutil.WaitUntil(t, "the third item waits for the window", func() bool {
		p.flow.mu.Lock()
		defer p.flow.mu.Unlock()
		return p.flow.changed != nil
	})
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := add(short, 3); !errors.Is(err, ErrNotApplied) {
		t.Fatalf("a call with a deadline behind the waiting one: %v, want ErrNotApplied", err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer ccancel()
	closed := make(chan error, 1)
	go func() { closed <- p.Close(cctx) }()
	select {
	case err := <-closed:
		if err == nil {
			t.Fatal("Close with items it could not send returned nil")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close is stuck behind a call waiting for the window")
	}
	// The learner makes room: the waiting call ends (sent, or closed).
	c := d.client()
	for range 2 {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c.Sample(sctx, "queue", 1)
		cancel()
	}
	if err := <-blocked; err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("the waiting call: %v, want nil or ErrClosed", err)
	}
}

// holdInQueue creates two one-step items (column col) for table, a queue
// of one item, and waits until its rate limiter holds the second.
func holdInQueue(t *testing.T, d *deployment, p *Producer, table, col string) {
	t.Helper()
	ctx := testutil.Context(t)
	for i := range int64(2) {
		if err := p.Append(ctx, Step{col: Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, table, 1, LastStep(col)); err != nil {
			t.Fatal(err)
		}
	}
	q, _ := d.svc.Table(table)
	testutil.WaitUntil(t, "an insert is held", func() bool { return q.Info().Counters.InsertWaits > 0 })
}

// TestFlushWaitingAtCloseEndsWithIt: a Flush waiting for items a table's
// rate limiter holds ends with ErrClosed once the producer closes, since
// no progress comes after that, rather than wait for ever.
func TestFlushWaitingAtCloseEndsWithIt(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 1)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(0))
	holdInQueue(t, d, p, "queue", "id")
	flushed := make(chan error, 1)
	go func() { flushed <- p.Flush(context.Background()) }()
	testutil.WaitUntil(t, "the flush waits for the held item", func() bool {
		p.flow.mu.Lock()
		defer p.flow.mu.Unlock()
		return p.flow.changed != nil
	})
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-flushed:
		if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrNotApplied) {
			t.Fatalf("the waiting flush: %v, want ErrClosed and ErrNotApplied", err)
		}
	case <-ctx.Done():
		t.Fatal("the flush still waits after Close returned")
	}
}

// holdInQueueFlushed is holdInQueue for a producer whose batches linger:
// each of the two items of queue "q" is flushed, the first until it is
// applied, the second until the queue's rate limiter holds it. appendItem
// appends item i's steps (column "id").
func holdInQueueFlushed(t *testing.T, d *deployment, p *Producer, appendItem func(i int64)) {
	t.Helper()
	ctx := testutil.Context(t)
	for i := range int64(2) {
		appendItem(i)
		if err := p.CreateItem(ctx, "q", 1, LastStep("id")); err != nil {
			t.Fatal(err)
		}
		fctx, cancel := context.WithTimeout(ctx, map[int64]time.Duration{0: 10 * time.Second, 1: 300 * time.Millisecond}[i])
		if err := p.Flush(fctx); (i == 0) != (err == nil) {
			t.Fatalf("flush %d: %v", i, err) // the second waits for the held item
		}
		cancel()
	}
	q, _ := d.svc.Table("q")
	testutil.WaitUntil(t, "an insert is held", func() bool { return q.Info().Counters.InsertWaits > 0 })
}

// stageBehindHeldItem stages item i for "queue" in a batch that waits for
// room in the window, which holdInQueue filled (WithMaxUnapplied(1)).
func stageBehindHeldItem(t *testing.T, p *Producer, i int64) {
	t.Helper()
	ctx := testutil.Context(t)
	if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{i})}); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "queue", 1, LastStep("id")); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := p.batch.items(); n != 1 {
		t.Fatalf("%d items staged behind the full window, want 1", n)
	}
}

// TestCloseReportsStagedItemsNotStored: an item still staged when Close
// gives up waiting for room in the window is never published, and Close
// reports it with ErrNotStored, counted as lost for the calls waiting
// beside it. It reported only ErrNotApplied, for the items published
// before, so a caller counting its losses by ErrNotStored and ErrRejected
// saw none.
func TestCloseReportsStagedItemsNotStored(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 1)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(0), WithMaxUnapplied(1))
	holdInQueue(t, d, p, "queue", "id")
	stageBehindHeldItem(t, p, 2)
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err := p.Close(cctx)
	if !errors.Is(err, ErrNotStored) || !errors.Is(err, ErrNotApplied) {
		t.Fatalf("Close that gave up on a staged item: %v, want ErrNotStored (and ErrNotApplied for the held one)", err)
	}
	if lost := p.flow.failureMark().failedItems; lost != 1 {
		t.Fatalf("%d items counted lost, want 1", lost)
	}
}

// TestCloseWaitingForTheWindowEndsWithItsConnection: a Close waiting for
// room in the window, with no deadline, returns once the producer's
// connection is closed for good, since no room can come then: with
// ErrClosed, and ErrNotStored for the item it could not publish, and none
// of the producer's goroutines left. The producer closing itself with its
// connection found this Close under way and left it, and the ack loop,
// waiting for ever.
func TestCloseWaitingForTheWindowEndsWithItsConnection(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 1)}, "")
	ctx := testutil.Context(t)
	nc := d.connect()
	p, err := NewProducer(ctx, nc, WithPrefix(d.prefix), WithLogger(testutil.QuietLogger()), WithLinger(0), WithMaxUnapplied(1))
	if err != nil {
		t.Fatal(err)
	}
	holdInQueue(t, d, p, "queue", "id")
	stageBehindHeldItem(t, p, 2)
	closed := make(chan error, 1)
	go func() { closed <- p.Close(context.Background()) }()
	// Close releases the lock only to wait for the window.
	testutil.WaitUntil(t, "Close waits for the window", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.closing && !p.closed
	})
	nc.Close()
	select {
	case err := <-closed:
		if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrNotStored) {
			t.Fatalf("Close whose connection closed while it waited with an item staged: %v, want ErrClosed and ErrNotStored", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close still waits for the window after its connection closed")
	}
	for name, done := range map[string]chan struct{}{"ack loop": p.ackDone, "notes reader": p.notesDone} {
		select {
		case <-done:
		default:
			t.Errorf("the producer's %s runs on after Close returned", name)
		}
	}
}

// TestClosedProducersLeaveNoSubscriptions: a producer closed on a
// connection that goes on leaves none of its subscriptions there, its
// JetStream context's included. (The first request on a connection opens
// the connection's own reply subscription, which stays.)
func TestClosedProducersLeaveNoSubscriptions(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	ctx := testutil.Context(t)
	nc := d.connect()
	before := -1
	for i := range int64(4) {
		if i == 1 {
			before = nc.NumSubscriptions()
		}
		p, err := NewProducer(ctx, nc, WithPrefix(d.prefix), WithLogger(testutil.QuietLogger()))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, LastStep("id")); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if after := nc.NumSubscriptions(); after != before {
		t.Fatalf("%d subscriptions after three more producers opened and closed, %d before", after, before)
	}
}

// TestProducerEndsWithItsConnection: an actor that closes its connection
// without closing its producer (or loses it for good) leaves none of the
// producer's goroutines behind; they waited for acks and notices that
// could not come, two an actor, in a soak test's driver. Its calls then
// fail with ErrClosed, and its Close says what was lost.
func TestProducerEndsWithItsConnection(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, "")
	ctx := testutil.Context(t)
	nc := d.connect()
	p, err := NewProducer(ctx, nc, WithPrefix(d.prefix), WithLogger(testutil.QuietLogger()), WithBatch(1000, 1<<20), WithLinger(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for i := range int64(20) {
		if i == 10 { // the first 10 stored; the rest staged in a batch
			if err := p.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, LastStep("id")); err != nil {
			t.Fatal(err)
		}
	}
	nc.Close()
	ended := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	testutil.WaitUntil(t, "the producer's goroutines end", func() bool { return ended(p.ackDone) && ended(p.notesDone) })
	if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{20})}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append on a producer whose connection closed: %v, want ErrClosed", err)
	}
	if err := p.Close(ctx); !errors.Is(err, ErrClosed) || !errors.Is(err, ErrNotStored) {
		t.Fatalf("Close of a producer whose connection closed with 10 items staged: %v, want ErrClosed and ErrNotStored", err)
	}
}

// TestFlushFailsWhenItsConnectionCloses: a Flush waiting for JetStream's
// acks when the producer's connection is closed for good reports its
// messages given up on, as of unknown outcome: sent, unanswered, they may
// be stored. The producer closes itself then, and its Close took the
// errors of the messages it gave up on: the waiting Flush found none
// left, every message settled, and returned nil for items never stored
// (a cluster soak lost 24 acknowledged inserts so).
func TestFlushFailsWhenItsConnectionCloses(t *testing.T) {
	ctx := testutil.Context(t)
	srv, err := embeddednats.Start(ctx, embeddednats.WithStoreDir(t.TempDir()), embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithLogger(testutil.QuietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	down := sync.OnceValue(func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	t.Cleanup(func() { _ = down() })
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, srv.ClientURL())
	err = closedDuringFlush(t, d, func() {
		// No ack can come now: the message waits in the connection's
		// reconnect buffer. (The service goes first, while it can stop
		// cleanly.)
		d.stopService()
		if err := down(); err != nil {
			t.Fatal(err)
		}
	}, func(f *flow) bool { return f.inFlight > 0 })
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Flush whose connection closed before JetStream acknowledged its message: %v, want ErrOutcomeUnknown", err)
	}
}

// TestFlushOfStoredItemsReportsNoLoss: a Flush whose items JetStream
// stored, waiting for the service when the connection closes, reports
// that it could not see them applied, not that they were lost: the
// producer's closing message (a release of chunks, no items) fails on the
// closed connection, and counting it as a loss would tell a caller that
// resends lost items to insert them twice.
func TestFlushOfStoredItemsReportsNoLoss(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, "")
	err := closedDuringFlush(t, d, d.stopService, // JetStream stores; nobody applies
		func(f *flow) bool { return f.inFlight == 0 && f.ackedItems == 10 })
	if !errors.Is(err, ErrClosed) || errors.Is(err, ErrNotStored) {
		t.Fatalf("Flush of stored items whose connection closed: %v, want ErrClosed and not ErrNotStored", err)
	}
}

// closedDuringFlush stages 10 items on a producer of a connection of its
// own, calls before, and flushes them; it closes the connection once the
// Flush waits and waiting holds, and returns what the Flush returned.
func closedDuringFlush(t *testing.T, d *deployment, before func(), waiting func(*flow) bool) error {
	t.Helper()
	ctx := testutil.Context(t)
	nc := d.connect()
	p, err := NewProducer(ctx, nc, WithPrefix(d.prefix), WithLogger(testutil.QuietLogger()), WithBatch(1000, 1<<20), WithLinger(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for i := range int64(10) {
		if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, LastStep("id")); err != nil {
			t.Fatal(err)
		}
	}
	before()
	flushed := make(chan error, 1)
	go func() { flushed <- p.Flush(ctx) }()
	testutil.WaitUntil(t, "Flush waits", func() bool {
		p.flow.mu.Lock()
		defer p.flow.mu.Unlock()
		return p.flow.changed != nil && waiting(p.flow)
	})
	nc.Close()
	return <-flushed
}

// TestLingerWaitsForRoomOnce: while a lingered batch waits for room in a
// full window, items staged behind it start no timers of their own, so
// no goroutine piles up per linger time: the one waiting publishes them
// all when room comes.
func TestLingerWaitsForRoomOnce(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 1)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(time.Millisecond), WithMaxUnapplied(1))
	add := func(i int64) {
		if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "queue", 1, LastStep("id")); err != nil {
			t.Fatal(err)
		}
	}
	idle := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.linger == nil
	}
	add(0)
	testutil.WaitUntil(t, "the first item published", idle)
	add(1)
	q, _ := d.svc.Table("queue")
	testutil.WaitUntil(t, "an insert is held", func() bool { return q.Info().Counters.InsertWaits > 0 })
	base := runtime.NumGoroutine()
	for i := int64(2); i < 42; i++ {
		add(i)
		testutil.WaitUntil(t, "no linger timer pending", idle)
	}
	if n := runtime.NumGoroutine() - base; n > 20 {
		t.Fatalf("%d more goroutines after 40 items staged behind a full window", n)
	}
	c := d.client()
	for want := range int64(42) {
		s, err := c.Sample(ctx, "queue", 1)
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(t, s[0]); got[0] != want {
			t.Fatalf("sample %d: id %d", want, got[0])
		}
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// producerWithoutAStream is a producer with opts, retrying for 300 ms,
// whose stream was deleted: JetStream stores none of its messages.
func producerWithoutAStream(t *testing.T, opts ...ProducerOption) *Producer {
	t.Helper()
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	p := d.producer(append(opts, WithRetryFor(300*time.Millisecond))...)
	d.stopService() // which would end on its stream's loss
	js, err := jetstream.New(d.connect())
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(testutil.Context(t), p.subj.Stream()); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMessageGivenUpIsNotStored: a message JetStream does not store within
// the producer's retry time (its stream is gone) is reported as lost,
// ErrNotStored wrapping the last failure, not as a flush that is late.
func TestMessageGivenUpIsNotStored(t *testing.T) {
	ctx := testutil.Context(t)
	p := producerWithoutAStream(t, WithLinger(0))
	err := p.Append(ctx, Step{"id": Int64s(nil, []int64{1})})
	if err == nil {
		err = p.CreateItem(ctx, "t", 1, LastStep("id"))
	}
	if err == nil {
		err = p.Flush(ctx)
	}
	if !errors.Is(err, ErrNotStored) || errors.Is(err, ErrNotApplied) || !strings.Contains(err.Error(), "message 1 (1 items)") {
		t.Fatalf("a message to a deleted stream: %v, want ErrNotStored naming message 1", err)
	}
}

// TestMessagesGivenUpInAnOutageEndTheFlush: when JetStream takes nothing
// for longer than retryFor, every message in flight is given up on; no
// message was stored, so none waits in the service behind them, and the
// gap fills sent meanwhile are not replaced once they fail too: Flush
// reports the loss. (Gap fills sent after one another kept each other
// going for as long as JetStream took nothing, and Flush waited out its
// context.)
func TestMessagesGivenUpInAnOutageEndTheFlush(t *testing.T) {
	ctx := testutil.Context(t)
	p := producerWithoutAStream(t, WithLinger(time.Hour), WithBatch(1, 1<<20))
	for i := range int64(2) { // two messages of one item
		if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, LastStep("id")); err != nil {
			t.Fatal(err)
		}
	}
	err := p.Flush(ctx)
	if !errors.Is(err, ErrNotStored) || errors.Is(err, ErrNotApplied) || !strings.Contains(err.Error(), "message 1 (1 items)") || !strings.Contains(err.Error(), "message 2 (1 items)") {
		t.Fatalf("Flush through an outage: %v, want ErrNotStored naming messages 1 and 2", err)
	}
}

// TestAMessageStoredWithoutAnAckIsNotReportedNotStored: a message whose
// every attempt went unanswered (a stream that stores without acking,
// NoAck) may have been stored: the producer gives up on it with
// ErrOutcomeUnknown, never ErrNotStored, which said its items were lost
// while the service applied them (an actor that resent them on
// ErrNotStored inserted them twice).
func TestAMessageStoredWithoutAnAckIsNotReportedNotStored(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(0), WithRetryFor(300*time.Millisecond))
	js, err := jetstream.New(p.nc, jetstream.WithPublishAsyncTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	p.js = js // before the first publish: acks time out in 100 ms
	admin, err := jetstream.New(d.connect())
	if err != nil {
		t.Fatal(err)
	}
	s, err := admin.Stream(ctx, p.subj.Stream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.NoAck = true
	if _, err := admin.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{1})}); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "t", 1, LastStep("id")); err != nil {
		t.Fatal(err)
	}
	err = p.Flush(ctx)
	if !errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrNotStored) || !strings.Contains(err.Error(), "message 1 (1 items)") {
		t.Fatalf("Flush of a message stored without an ack: %v, want ErrOutcomeUnknown naming message 1 and not ErrNotStored", err)
	}
	tt, _ := d.svc.Table("t")
	testutil.WaitUntil(t, "the service applies the stored item", func() bool { return tt.Info().Size == 1 })
	if lost, unknown := p.flow.failureMark().failedItems, p.flow.failureMark().unknownItems; lost != 0 || unknown != 1 {
		t.Fatalf("%d items counted lost and %d of unknown outcome, want 0 and 1", lost, unknown)
	}
	cfg.NoAck = false // for the producer's closing message
	if _, err := admin.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// failingJetStream refuses the publishes of the messages fail names (by
// the producer's sequence, from the dedupe id) with its error.
type failingJetStream struct {
	jetstream.JetStream
	fail func(seq uint64) error
}

func (f failingJetStream) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	id := m.Header.Get(jetstream.MsgIDHeader)
	seq, _ := strconv.ParseUint(id[strings.LastIndexByte(id, '-')+1:], 10, 64)
	if err := f.fail(seq); err != nil {
		return nil, err
	}
	return f.JetStream.PublishMsgAsync(m, opts...)
}

// TestAGapFillGivenUpIsReplacedForAMessageSentAfterIt: message 1 is given
// up on after retrying, message 2 refused at once, so gap fills 3 and 4
// take their places; gap fill 3 is given up on too, after message 5, which
// is stored, went out stating a window that includes 3. The service holds
// 5 until a message states a later window start: gap fill 3 is replaced,
// though nothing stored before it was held, and Flush returns with 5's
// item in its table. (It returned nil with the item held.)
func TestAGapFillGivenUpIsReplacedForAMessageSentAfterIt(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(time.Hour), WithBatch(1, 1<<20), WithRetryFor(300*time.Millisecond))
	p.js = failingJetStream{JetStream: p.js, fail: func(seq uint64) error {
		switch seq {
		case 1, 3:
			return errors.New("test: no ack, for now") // retried until retryFor
		case 2:
			return nats.ErrMaxPayload // refused at once
		}
		return nil
	}}
	// A CreateItem returns the losses seen before it, those of messages 1
	// and 2, and then created nothing: it is called again.
	insert := func(i int64) {
		if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		for {
			err := p.CreateItem(ctx, "t", 1, LastStep("id"))
			if err == nil {
				return
			}
			if !errors.Is(err, ErrNotStored) {
				t.Fatal(err)
			}
		}
	}
	insert(0)
	insert(1)
	testutil.WaitUntil(t, "gap fills 3 and 4 sent", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.seq >= 4
	})
	insert(2) // message 5
	if err := p.Flush(ctx); err != nil && !errors.Is(err, ErrNotStored) {
		t.Fatalf("Flush: %v", err)
	}
	q, _ := d.svc.Table("t")
	if size := q.Info().Size; size != 1 {
		t.Fatalf("Flush returned with %d items in the table, want message 5's", size)
	}
}

// TestAGivenUpMessageHoldsNoLaterOneBack: message N is refused by
// JetStream for good (over the stream's max message size) after message
// N+1, stored, went out stating a window that includes N. The service
// holds N+1 until a message states a later window start, and its progress
// passes N+1 meanwhile; a Flush that reports N lost still returns only
// when N+1's item is in its table, though the producer sends nothing more.
func TestAGivenUpMessageHoldsNoLaterOneBack(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, testutil.StartEmbedded(t, 16<<10))
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(time.Hour), WithChunkLength(2), WithCompression(wire.Uncompressed), WithDelta(false))
	js, err := jetstream.New(d.connect())
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, p.subj.Stream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgSize = 9000
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// Item N takes column a (10 kB, over the stream's max message size),
	// item N+1 column b (7 kB). Both wait for their 2-step chunks until
	// Flush, which sends them as two messages back to back: together they
	// exceed the server's max payload.
	s := Step{
		"a": Tensor{DType: "uint8", Shape: []int64{10000}, Data: make([]byte, 10000)},
		"b": Tensor{DType: "uint8", Shape: []int64{7000}, Data: make([]byte, 7000)},
	}
	if err := p.Append(ctx, s); err != nil {
		t.Fatal(err)
	}
	for _, col := range []string{"a", "b"} {
		if err := p.CreateItem(ctx, "t", 1, LastStep(col)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); !errors.Is(err, ErrNotStored) || !strings.Contains(err.Error(), "message 1 (1 items)") {
		t.Fatalf("Flush: %v, want ErrNotStored for message 1", err)
	}
	// Flush reports the loss once the rest is applied.
	q, _ := d.svc.Table("t")
	if size := q.Info().Size; size != 1 {
		t.Fatalf("Flush returned with %d items in the table, want message 2's", size)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatalf("WaitApplied: %v", err)
	}
	if lost := p.flow.failureMark().failedItems; lost != 1 {
		t.Fatalf("%d items reported lost, want message 1's only", lost)
	}
}

// TestReleasesWaitingBesideAFullBatchNeverOverflowIt: chunks released
// while a batch near the server's max payload waits for the window go
// with a later message when they do not fit beside it, rather than push
// the message over the max payload, which would lose its items.
func TestReleasesWaitingBesideAFullBatchNeverOverflowIt(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 1000), tables.QueueConfig("q", 1)}, testutil.StartEmbedded(t, 16<<10))
	ctx := testutil.Context(t)
	const steps = 150
	// Batches wait for Flush, so that steps can come while one is staged:
	// an Append waits for a batch that is due and has no room.
	p := d.producer(WithLinger(time.Hour), WithMaxUnapplied(1), WithHistory(steps), WithCompression(wire.Uncompressed), WithDelta(false))
	small := func(i int64) Step { return Step{"a": Int64s(nil, []int64{i}), "b": Int64s(nil, []int64{i})} }
	// Items on every step: their chunks are sent, so leaving the history
	// releases them.
	for i := range int64(steps) {
		if err := p.Append(ctx, small(i)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, LastStep("a", "b")); err != nil {
			t.Fatal(err)
		}
	}
	// The queue holds its second item, so the window (one unapplied item)
	// is full.
	for i, wait := range []time.Duration{time.Minute, 300 * time.Millisecond} {
		if err := p.Append(ctx, small(int64(i))); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "q", 1, LastStep("a")); err != nil {
			t.Fatal(err)
		}
		fctx, cancel := context.WithTimeout(ctx, wait)
		if err := p.Flush(fctx); (i == 0) != (err == nil) {
			t.Fatalf("flush %d: %v", i, err) // the second waits for the held item
		}
		cancel()
	}
	q, _ := d.svc.Table("q")
	testutil.WaitUntil(t, "an insert is held", func() bool { return q.Info().Counters.InsertWaits > 0 })
	big := make([]byte, 14000)
	if err := p.Append(ctx, Step{"big": Tensor{DType: "uint8", Shape: []int64{int64(len(big))}, Data: big}}); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "t", 1, LastStep("big")); err != nil {
		t.Fatal(err)
	}
	// Steps without items push the sent chunks out of the history while
	// the big item's batch waits.
	for i := range int64(steps) {
		if err := p.Append(ctx, small(i)); err != nil {
			t.Fatal(err)
		}
	}
	p.mu.Lock()
	released, batched := len(p.release), p.batch.msg.Size()
	p.mu.Unlock()
	if batched+10*released < 16<<10 {
		t.Fatalf("%d releases beside a batch of %d bytes fit in a message: the test shows nothing", released, batched)
	}
	c := d.client()
	for range 2 {
		if _, err := c.Sample(ctx, "q", 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if info, err := c.Info(ctx, "t"); err != nil || info.Tables[0].Size != steps+1 {
		t.Fatalf("table t: %+v, %v; want %d items", info, err, steps+1)
	}
}

// TestEndEpisodeWaitsForAnItemBeingAdded: an EndEpisode that comes while
// another call adds an item (an Append publishing what earlier calls left,
// waiting for room in the window, since the item does not fit beside the
// batch) lets that item be built from the episode's chunks first: ended
// under it, the item went out with no steps.
func TestEndEpisodeWaitsForAnItemBeingAdded(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10), tables.QueueConfig("q", 1)}, testutil.StartEmbedded(t, 16<<10))
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(time.Hour), WithMaxUnapplied(1), WithCompression(wire.Uncompressed), WithDelta(false))
	bytesOf := func(v byte) Step {
		return Step{"x": Tensor{DType: "uint8", Shape: []int64{8000}, Data: bytes.Repeat([]byte{v}, 8000)}}
	}
	// The queue holds its second item, so the window stays full.
	for i := range int64(2) {
		if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "q", 1, LastStep("id")); err != nil {
			t.Fatal(err)
		}
		wait := 10 * time.Second
		if i == 1 {
			wait = 300 * time.Millisecond
		}
		fctx, cancel := context.WithTimeout(ctx, wait)
		if err := p.Flush(fctx); (i == 0) != (err == nil) {
			t.Fatalf("flush %d: %v", i, err) // the second waits for the held item
		}
		cancel()
	}
	q, _ := d.svc.Table("q")
	testutil.WaitUntil(t, "an insert is held", func() bool { return q.Info().Counters.InsertWaits > 0 })
	// One item staged; the next does not fit beside it and is left
	// pending, and the next Append waits for room to add it.
	for v := range byte(2) {
		if err := p.Append(ctx, bytesOf(v+1)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, LastStep("x")); err != nil {
			t.Fatal(err)
		}
	}
	adding := make(chan error, 1)
	go func() { adding <- p.Append(ctx, bytesOf(3)) }()
	testutil.WaitUntil(t, "the second item waits for room", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.pending) == 1 && p.pending[0].adding
	})
	ended := make(chan error, 1)
	go func() { ended <- p.EndEpisode(ctx) }()
	testutil.WaitUntil(t, "EndEpisode waits for it", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.added != nil
	})
	c := d.client()
	for range 2 {
		if _, err := c.Sample(ctx, "q", 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-adding; err != nil {
		t.Fatalf("Append: %v", err)
	}
	if err := <-ended; err != nil {
		t.Fatalf("EndEpisode: %v", err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	seen := map[byte]bool{}
	for range 20 {
		samples, err := c.Sample(ctx, "t", 4)
		if err != nil {
			t.Fatal(err)
		}
		for _, smp := range samples {
			x, ok := smp.Column("x")
			if !ok || len(x.Data) != 8000 || !bytes.Equal(x.Data, bytes.Repeat(x.Data[:1], 8000)) {
				t.Fatalf("item %d: column x %v, want 8000 equal bytes", smp.Info.Key, x.Shape)
			}
			seen[x.Data[0]] = true
		}
	}
	if !seen[1] || !seen[2] || len(seen) != 2 {
		t.Fatalf("items of steps %v, want 1 and 2", seen)
	}
}

// TestEndEpisodeErrorSaysWhetherTheEpisodeEnded: an EndEpisode whose
// context ends while it waits for room in the window has not ended the
// episode, and says so (ErrEpisodeNotEnded); called again, it ends it. One
// that ended the episode and then timed out waiting for its items says
// nothing of the kind, and called again ends no empty episode. Both
// returned the same ErrNotApplied, and an actor that took the first for
// the second appended the next episode's steps to the old one.
func TestEndEpisodeErrorSaysWhetherTheEpisodeEnded(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10), tables.QueueConfig("q", 1)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(0), WithMaxUnapplied(1))
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	steps := func() (int64, uint64) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.step, p.episode
	}
	holdInQueue(t, d, p, "q", "id") // steps 0 and 1; the window stays full
	if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{2})}); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "t", 1, Last(3, "id")); err != nil {
		t.Fatal(err)
	}
	err := p.EndEpisode(short())
	if !errors.Is(err, ErrEpisodeNotEnded) || !errors.Is(err, ErrNotApplied) {
		t.Fatalf("EndEpisode with no room in the window: %v, want ErrEpisodeNotEnded and ErrNotApplied", err)
	}
	if n, _ := steps(); n != 3 {
		t.Fatalf("the episode has %d steps after an EndEpisode that did not end it, want 3", n)
	}
	c := d.client()
	if _, err := c.Sample(ctx, "q", 1); err != nil { // makes room
		t.Fatal(err)
	}
	if err := p.EndEpisode(ctx); err != nil {
		t.Fatalf("EndEpisode again: %v", err)
	}
	if n, _ := steps(); n != 0 {
		t.Fatalf("the episode has %d steps after EndEpisode, want 0", n)
	}
	samples, err := c.Sample(ctx, "t", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(t, samples[0]); !slices.Equal(got, []int64{0, 1, 2}) {
		t.Fatalf("the episode's item holds steps %v, want [0 1 2]", got)
	}

	// The queue is full again: its next item is held.
	if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{10})}); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "q", 1, LastStep("id")); err != nil {
		t.Fatal(err)
	}
	err = p.EndEpisode(short())
	if !errors.Is(err, ErrNotApplied) || errors.Is(err, ErrEpisodeNotEnded) {
		t.Fatalf("EndEpisode waiting for a held item: %v, want ErrNotApplied and not ErrEpisodeNotEnded", err)
	}
	n, episode := steps()
	if n != 0 {
		t.Fatalf("the episode has %d steps after EndEpisode, want 0", n)
	}
	if err := p.EndEpisode(short()); !errors.Is(err, ErrNotApplied) || errors.Is(err, ErrEpisodeNotEnded) {
		t.Fatalf("EndEpisode again: %v, want ErrNotApplied and not ErrEpisodeNotEnded", err)
	}
	if _, again := steps(); again != episode {
		t.Fatal("EndEpisode called again ended the empty episode after the one it ended")
	}
	for range 2 {
		if _, err := c.Sample(ctx, "q", 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestProducerIDsUnguessable: ids are 128 random bits, and what the service
// publishes names a producer only by its notice token.
func TestProducerIDsUnguessable(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	a, b := d.producer(), d.producer()
	if len(a.ID()) != 32 || a.ID() == b.ID() || strings.HasPrefix(b.ID(), a.ID()[:8]) {
		t.Fatalf("producer ids %q and %q: want 32 independent hex digits", a.ID(), b.ID())
	}
	if tok := a.NoticeToken(); tok == a.ID() || strings.Contains(a.notice, a.ID()) {
		t.Fatalf("notice token %q or subject %q gives the id away", tok, a.notice)
	}
}

// TestErrorsCarryCodes: what the service refuses reaches the caller as a
// StatusError with the service's code, matched by errors.Is and errors.As,
// from a client's request and from a producer's rejected item alike.
func TestErrorsCarryCodes(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	ctx := testutil.Context(t)
	_, err := d.client().Sample(ctx, "nope", 1)
	var se *StatusError
	if !errors.Is(err, ErrUnknownTable) || !errors.As(err, &se) || se.Code != CodeNotFound || !strings.Contains(se.Message, `"nope"`) {
		t.Fatalf("sampling an unknown table: %v (%+v), want a StatusError with CodeNotFound", err, se)
	}
	p := d.producer(WithLinger(0))
	if err := p.Append(ctx, step(1, 2)); err != nil {
		t.Fatal(err)
	}
	// The rejection surfaces from whichever call comes next, WaitApplied at
	// the latest.
	if err = p.CreateItem(ctx, "nope", 1, LastStep("id")); err == nil {
		err = p.WaitApplied(ctx)
	}
	se = nil
	if !errors.Is(err, ErrRejected) || !errors.Is(err, ErrUnknownTable) || !errors.As(err, &se) || se.Code != CodeNotFound {
		t.Fatalf("an item for an unknown table: %v (%+v), want a rejection with CodeNotFound", err, se)
	}
}

// rejectBurst creates n items for a table the service does not have, in
// messages of 64, and returns what the calls up to Flush reported: every
// item is rejected at once, faster than readNotes takes the notices.
func rejectBurst(t *testing.T, n int) (*Producer, error) {
	t.Helper()
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	ctx := testutil.Context(t)
	p := d.producer()
	var errs []error
	for range n {
		if err := p.Append(ctx, step(1, 2)); err != nil {
			t.Fatal(err)
		}
		// A CreateItem that reports earlier rejections created nothing:
		// it is called again.
		for {
			err := p.CreateItem(ctx, "nope", 1, LastStep("id"))
			if err == nil {
				break
			}
			if !errors.Is(err, ErrRejected) {
				t.Fatal(err)
			}
			errs = append(errs, err)
		}
	}
	return p, errors.Join(append(errs, p.Flush(ctx))...)
}

// itemRejections counts the item rejections in a joined error.
func itemRejections(err error) int {
	n := 0
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			n += itemRejections(e)
		}
		return n
	}
	var se *StatusError
	if errors.As(err, &se) && se.Code == CodeNotFound {
		return 1
	}
	return 0
}

// TestEveryRejectionOfABurstIsReported: a window of items all rejected at
// once reaches the caller whole. Progress and rejections shared one channel
// of 256, which the connection dropped notices from: 611 of 4000 rejections
// were reported.
func TestEveryRejectionOfABurstIsReported(t *testing.T) {
	const n = 4000
	p, err := rejectBurst(t, n)
	if got := itemRejections(err); !errors.Is(err, ErrRejected) || got != n || p.droppedRejections != 0 {
		t.Fatalf("Flush after %d rejected items: %d rejections reported, %d dropped; want all %d and none dropped", n, got, p.droppedRejections, n)
	}
}

// TestDroppedRejectionsAreReported: rejections past the channel's room,
// which the connection drops, are counted in the error of the wait that
// covers them, so none vanishes.
func TestDroppedRejectionsAreReported(t *testing.T) {
	defer func(n int) { maxRejectionNotes = n }(maxRejectionNotes)
	maxRejectionNotes = 4
	const n = 4000
	p, err := rejectBurst(t, n)
	got := itemRejections(err)
	t.Logf("%d rejections reported, %d dropped", got, p.droppedRejections)
	if !errors.Is(err, ErrRejected) || got+p.droppedRejections != n {
		t.Fatalf("Flush after %d rejected items: %d reported and %d dropped, want %d in all", n, got, p.droppedRejections, n)
	}
	if p.droppedRejections > 0 && !strings.Contains(err.Error(), "dropped unread") {
		t.Fatalf("Flush's error %.300q does not say that rejections were dropped", err)
	}
}

// TestProgressBeforeTheConnectionClosedCounts: progress the connection
// delivered before it closed counts, though no later progress comes to say
// it again. Once rejections had a channel of their own, readNotes drained
// only that one at the close, and took the close over a waiting progress
// message half the time: a Flush waiting for items the service applied
// failed with ErrNotApplied.
func TestProgressBeforeTheConnectionClosedCounts(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, "")
	d.stopService() // the test publishes the progress
	pub := d.connect()
	progress := func(p *Producer, seq uint64) {
		data, _ := proto.Marshal(&wire.Progress{AppliedSequence: seq})
		if err := pub.Publish(p.subj.Applied(), data); err != nil {
			t.Fatal(err)
		}
	}
	for trial := range 12 {
		p := d.producer()
		ctx := testutil.Context(t)
		if err := p.Append(ctx, step(1, 2)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, LastStep("id")); err != nil {
			t.Fatal(err)
		}
		flushed := make(chan error, 1)
		go func() { flushed <- p.Flush(ctx) }()
		var seq uint64
		testutil.WaitUntil(t, "the message stored and Flush waiting for the service", func() bool {
			p.flow.mu.Lock()
			defer p.flow.mu.Unlock()
			if len(p.flow.acked) == 1 && p.flow.changed != nil {
				seq = p.flow.acked[0].seq
				return true
			}
			return false
		})
		// readNotes takes a first progress message and waits for the lock
		// to apply it, while the one for the message arrives and the
		// connection closes.
		p.flow.mu.Lock()
		progress(p, 0)
		testutil.WaitUntil(t, "the first progress taken", func() bool { return len(p.progress) == 0 })
		progress(p, seq)
		testutil.WaitUntil(t, "the second progress delivered", func() bool { return len(p.progress) == 1 })
		p.nc.Close()
		p.flow.mu.Unlock()
		<-p.notesDone
		if err := <-flushed; errors.Is(err, ErrNotApplied) {
			t.Fatalf("trial %d: the progress for stream message %d came before the connection closed, and Flush says: %v", trial, seq, err)
		}
	}
}

// TestWaitReportsRejectionsAnotherCallTook: a WaitApplied that waits while
// the service rejects an item reports the rejection even where another call
// on the producer took its error first; it returned nil before, as if the
// item were in its table.
func TestWaitReportsRejectionsAnotherCallTook(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 1)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithBatch(1, 1<<20), WithLinger(time.Hour)) // each item its own message, published at once
	create := func(i int64, table string) error {
		if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		return p.CreateItem(ctx, table, 1, LastStep("id"))
	}
	add := func(i int64, table string) {
		if err := create(i, table); err != nil {
			t.Fatal(err)
		}
	}
	q, _ := d.svc.Table("queue")
	add(0, "queue")
	testutil.WaitUntil(t, "the queue is full", func() bool { return q.Info().Size == 1 })
	add(1, "queue")
	testutil.WaitUntil(t, "the second insert is held", func() bool { return q.Info().Counters.InsertWaits > 0 })
	waited := make(chan error, 1)
	go func() { waited <- p.WaitApplied(ctx) }()
	testutil.WaitUntil(t, "WaitApplied waits", func() bool {
		p.flow.mu.Lock()
		defer p.flow.mu.Unlock()
		return p.flow.changed != nil
	})
	// The rejection's error goes to the next call: CreateItem itself where
	// the rejection comes before it returns, else a second WaitApplied.
	err := create(2, "nope")
	testutil.WaitUntil(t, "the service rejects the item", func() bool {
		p.flow.mu.Lock()
		defer p.flow.mu.Unlock()
		return p.flow.rejections == 1
	})
	if err == nil {
		short, cancel := context.WithTimeout(ctx, time.Millisecond)
		defer cancel()
		err = p.WaitApplied(short)
	}
	if !errors.Is(err, ErrRejected) {
		t.Fatalf("the call after the rejected item's: %v, want the rejection", err)
	}
	if _, err := d.client().Sample(ctx, "queue", 1); err != nil { // makes room for the held insert
		t.Fatal(err)
	}
	if err := <-waited; !errors.Is(err, ErrRejected) {
		t.Fatalf("WaitApplied during which an item was rejected: %v, want ErrRejected", err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatalf("Close: %v (the rejection was reported)", err)
	}
}

// TestCloseEndsMutationWaits: a mutation waiting for the service to apply
// it fails with ErrClosed when the client closes, as every call in
// progress does.
func TestCloseEndsMutationWaits(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	c := d.client()
	done := deleteWaitingForTheService(t, d, c)
	c.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Delete after Close = %v, want ErrClosed", err)
	}
}

// TestEndEpisodeIsOneMessage: ending an episode publishes the items still
// in its batch and the release of its chunks in one message, not two; and
// the release reaches the service, which then drops the chunks of items it
// evicted.
func TestEndEpisodeIsOneMessage(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	ctx := testutil.Context(t)
	// Batches of up to 64 items that wait for their episode's end.
	p := d.producer(WithBatch(64, 1<<20), WithLinger(time.Hour))
	js, err := jetstream.New(d.connect())
	if err != nil {
		t.Fatal(err)
	}
	lastSeq := func() uint64 {
		s, err := js.Stream(ctx, "REPRISE_TEST")
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	before := lastSeq()
	const episodes = 10
	for e := range int64(episodes) {
		for i := range int64(50) {
			if err := p.Append(ctx, step(e*100+i, 4)); err != nil {
				t.Fatal(err)
			}
			if err := p.CreateItem(ctx, "t", 1, LastStep("obs", "id")); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.EndEpisode(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := lastSeq() - before; got != episodes {
		t.Errorf("%d episodes of 50 items took %d messages, want %d", episodes, got, episodes)
	}
	info, err := d.client().Info(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	// The 10 items left hold a chunk of each column; every other chunk was
	// released by its episode's end and dropped with its evicted item.
	if info.Chunks != 2*10 {
		t.Errorf("the service holds %d chunks, want 20", info.Chunks)
	}
}

// TestProducerRecyclesBuffersSafely: a producer refills the buffers of
// chunks it has sent and of messages JetStream acknowledged. Through many
// small batches in a small window, from an actor that reuses its own step
// buffer, the table gets every item exactly once with the data of its own
// steps: no buffer was refilled while a message or chunk still needed it.
func TestProducerRecyclesBuffersSafely(t *testing.T) {
	const steps, obsLen = 300, 512
	for _, codec := range []wire.Codec{wire.Uncompressed, wire.Zstd} {
		t.Run(codec.String(), func(t *testing.T) {
			d := deploy(t, []tables.Config{tables.QueueConfig("q", 2*steps)}, "")
			ctx := testutil.Context(t)
			p := d.producer(WithCompression(codec), WithChunkLength(2), WithBatch(3, 1<<20), WithMaxInFlight(2), WithLinger(0))
			obs := make([]float32, obsLen)
			id := make([]int64, 1)
			next := Step{}
			want := map[string]int{}
			for i := range int64(steps) {
				copy(obs, testutil.Obs(i, obsLen))
				id[0] = i
				next["obs"], next["id"] = Float32s([]int64{obsLen}, obs), Int64s(nil, id)
				if err := p.Append(ctx, next); err != nil {
					t.Fatal(err)
				}
				if err := p.CreateItem(ctx, "q", 1, LastStep("obs", "id")); err != nil {
					t.Fatal(err)
				}
				want[fmt.Sprint([]int64{i})]++
				if i > 0 {
					// Across a chunk boundary on every other step.
					if err := p.CreateItem(ctx, "q", 1, Last(2, "obs", "id")); err != nil {
						t.Fatal(err)
					}
					want[fmt.Sprint([]int64{i - 1, i})]++
				}
			}
			if err := p.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			c := d.client()
			got := map[string]int{}
			for n := 0; n < 2*steps-1; {
				batch, err := c.Sample(ctx, "q", min(64, 2*steps-1-n))
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range batch {
					checkObs(t, s, obsLen)
					got[fmt.Sprint(ids(t, s))]++
				}
				n += len(batch)
			}
			if !maps.Equal(got, want) {
				t.Fatalf("the table got items of steps %v, want %v", got, want)
			}
		})
	}
}

// TestColumnOverlapping: the binary search finds exactly the chunks a
// linear scan finds, over histories with gaps (steps where the column was
// missing) and ranges before, inside, across and after them.
func TestColumnOverlapping(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 2000 {
		c := &column{}
		next := int64(rng.IntN(5))
		for range rng.IntN(12) {
			length := int64(1 + rng.IntN(4))
			c.chunks = append(c.chunks, &sealedChunk{start: next, length: length})
			next += length + int64(rng.IntN(3)) // a gap, sometimes
		}
		from := int64(rng.IntN(int(next) + 3))
		to := from + int64(rng.IntN(8))
		var want []*sealedChunk
		for _, ch := range c.chunks {
			if ch.start < to && from < ch.start+ch.length {
				want = append(want, ch)
			}
		}
		if got := c.overlapping(from, to); !slices.Equal(got, want) {
			t.Fatalf("trial %d: steps %d..%d of chunks %v: got %v, want %v", trial, from, to, c.chunks, got, want)
		}
	}
}

// TestCompressionBackoffSchedule: a column whose chunks never shrink tries
// its codec on chunks 0, 2, 5, 10, ... (after 1, 2, 4, ... skipped) up to
// stretches of maxCompressionBackoff, and one that shrinks is tried on the
// very next chunk.
func TestCompressionBackoffSchedule(t *testing.T) {
	var b compressionBackoff
	var tried []int
	for chunk := range 400 {
		if !b.skipping() {
			tried = append(tried, chunk)
			b.record(false)
		}
	}
	want := []int{0, 2, 5, 10, 19, 36, 69, 134, 199, 264, 329, 394}
	if !slices.Equal(tried, want) {
		t.Errorf("a column that never shrinks tried chunks %v, want %v", tried, want)
	}
	b.record(true)
	if b.skipping() {
		t.Error("the chunk after one that shrank is skipped")
	}
}

// TestCompressionBacksOff: after a long stretch of incompressible steps, a
// producer stores a column's next chunks uncompressed without trying, even
// zeros; within maxCompressionBackoff chunks it tries again and compresses
// from then on. The stream's messages show what each chunk was stored as,
// and the table gets every step intact.
func TestCompressionBacksOff(t *testing.T) {
	const noise, zeros, obsLen = 200, 150, 256
	d := deploy(t, []tables.Config{tables.QueueConfig("q", noise+zeros)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithBatch(16, 1<<20), WithLinger(0))
	rng := rand.New(rand.NewPCG(1, 2))
	obs := make([]float32, obsLen)
	for i := range int64(noise + zeros) {
		for j := range obs {
			obs[j] = 0
			if i < noise {
				obs[j] = rng.Float32()
			}
		}
		if err := p.Append(ctx, Step{"obs": Float32s([]int64{obsLen}, obs), "id": Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "q", 1, LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(d.connect())
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.OrderedConsumer(ctx, "REPRISE_TEST", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	stored := map[int64]wire.Compression{} // obs chunks by step
	for len(stored) < noise+zeros {
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			t.Fatalf("reading the stream with %d of %d obs chunks seen: %v", len(stored), noise+zeros, err)
		}
		var b wire.InsertBatch
		if err := proto.Unmarshal(msg.Data(), &b); err != nil {
			t.Fatal(err)
		}
		for _, c := range b.Chunks {
			if c.Dtype == "float32" {
				stored[c.EpisodeStep] = c.Compression
			}
		}
	}
	for i := range int64(noise) {
		if stored[i] != wire.Compression_COMPRESSION_NONE {
			t.Fatalf("random step %d stored %v", i, stored[i])
		}
	}
	if stored[noise] != wire.Compression_COMPRESSION_NONE {
		t.Errorf("the first zero step, right after %d random ones, was compressed: the codec was not backed off", noise)
	}
	first := int64(noise)
	for first < noise+zeros && stored[first] == wire.Compression_COMPRESSION_NONE {
		first++
	}
	if first > noise+maxCompressionBackoff {
		t.Fatalf("zero steps from %d on stored uncompressed until step %d, more than %d chunks", noise, first, maxCompressionBackoff)
	}
	for i := first; i < noise+zeros; i++ {
		if stored[i] != wire.Compression_COMPRESSION_ZSTD {
			t.Errorf("zero step %d stored %v after step %d was compressed", i, stored[i], first)
		}
	}
	got := map[int64]bool{}
	for len(got) < noise+zeros {
		batch, err := d.client().Sample(ctx, "q", min(64, noise+zeros-len(got)))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range batch {
			id := ids(t, s)[0]
			o, _ := s.Column("obs")
			v, err := o.Float32s()
			if err != nil {
				t.Fatal(err)
			}
			if (id < noise) == slices.ContainsFunc(v, func(f float32) bool { return f == 0 }) || len(v) != obsLen {
				t.Fatalf("step %d sampled with obs %v", id, v[:4])
			}
			got[id] = true
		}
	}
}

// TestMissingColumnEndsItsChunkEveryEpisode: a column missing from a step
// ends its open chunk, in a later episode as in the first, so that an item
// of a later step gets that step's data.
func TestMissingColumnEndsItsChunkEveryEpisode(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("q", 10)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithChunkLength(4))
	both := func(i int64) Step { return Step{"a": Int64s(nil, []int64{i}), "b": Int64s(nil, []int64{100 + i})} }
	for _, s := range []Step{both(0), both(1)} {
		if err := p.Append(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.EndEpisode(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range []Step{both(10), {"a": Int64s(nil, []int64{11})}, both(12)} {
		if err := p.Append(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.CreateItem(ctx, "q", 1, LastStep("a", "b")); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := d.client().Sample(ctx, "q", 1)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := got[0].Column("b")
	if v, err := b.Int64s(); err != nil || !slices.Equal(v, []int64{112}) {
		t.Fatalf("column b of step 2 of the second episode: %v, %v; want [112]", v, err)
	}
}

// TestAppendThatFailsKeepsNothingOfTheStep: an Append that returns an
// error kept nothing of its step, so an actor may append it again. Append
// kept the step, then waited for room to publish the item the step
// completed and failed when its context ended: an actor that appended the
// step again had it twice in its episode.
func TestAppendThatFailsKeepsNothingOfTheStep(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10), tables.QueueConfig("q", 1)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(0), WithMaxUnapplied(1), WithChunkLength(2))
	id := func(i int64) Step { return Step{"id": Int64s(nil, []int64{i})} }
	// The queue holds its second item, so the window (one item) stays full.
	for i := range int64(4) {
		if err := p.Append(ctx, id(i)); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			if err := p.CreateItem(ctx, "q", 1, LastStep("id")); err != nil {
				t.Fatal(err)
			}
		}
	}
	q, _ := d.svc.Table("q")
	testutil.WaitUntil(t, "an insert is held", func() bool { return q.Info().Counters.InsertWaits > 0 })
	if err := p.Append(ctx, id(4)); err != nil {
		t.Fatal(err)
	}
	// Its chunk is open: it waits for step 5.
	if err := p.CreateItem(ctx, "t", 1, LastStep("id")); err != nil {
		t.Fatal(err)
	}
	c := d.client()
	failed := 0
	for i := int64(5); i < 8; i++ {
		for {
			short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			err := p.Append(short, id(i))
			cancel()
			p.mu.Lock()
			steps := p.step
			p.mu.Unlock()
			if err == nil {
				break
			}
			if !errors.Is(err, ErrNotApplied) {
				t.Fatalf("append of step %d: %v, want ErrNotApplied", i, err)
			}
			if steps != i {
				t.Fatalf("append of step %d failed (%v) with the episode at %d steps, want %d: the step was kept", i, err, steps, i)
			}
			failed++
			// The learner makes room; the actor appends the step again.
			if _, err := c.Sample(ctx, "q", 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if failed == 0 {
		t.Fatal("no Append waited for the window: the test no longer tests")
	}
	if err := p.CreateItem(ctx, "t", 1, Last(4, "id")); err != nil {
		t.Fatal(err)
	}
	for q.Info().Size > 0 {
		if _, err := c.Sample(ctx, "q", 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	samples, err := c.Sample(ctx, "t", 20)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if got := ids(t, s); len(got) == 4 && !slices.Equal(got, []int64{4, 5, 6, 7}) {
			t.Fatalf("the episode's last four steps: %v, want [4 5 6 7]", got)
		}
	}
}

// TestAppendRefusesAColumnItsChunksCannotHold: a column whose full chunk
// would exceed wire.MaxChunkRawSize is refused by the Append of its first
// step. It was kept, and the Append that completed the chunk failed to
// seal it, with the step kept and the chunk's steps lost.
func TestAppendRefusesAColumnItsChunksCannotHold(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithChunkLength(wire.MaxChunkRawSize/512 + 1))
	err := p.Append(ctx, Step{"id": Int64s(nil, []int64{0}), "x": Tensor{DType: "uint8", Shape: []int64{512}, Data: make([]byte, 512)}})
	if !errors.Is(err, ErrInvalidMessage) || !strings.Contains(err.Error(), `column "x"`) {
		t.Fatalf("a column of 512-byte steps in chunks over the limit: %v, want ErrInvalidMessage naming it", err)
	}
	p.mu.Lock()
	steps, cols := p.step, len(p.cols)
	p.mu.Unlock()
	if steps != 0 || cols != 0 {
		t.Fatalf("after the refused step: %d steps, %d columns; want none", steps, cols)
	}
}

// TestCreateItemThatFailsCreatesNothing: a CreateItem that returns an
// error created nothing, so an actor may create the item again.
// CreateItem queued the item, then waited for room in the window and
// failed when its context ended, with the item published later: an actor
// that created it again had it twice in its table.
func TestCreateItemThatFailsCreatesNothing(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10), tables.QueueConfig("q", 1)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(0), WithMaxUnapplied(1))
	// The queue holds its second item, so the window (one item) is full.
	holdInQueue(t, d, p, "q", "id")
	if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{2})}); err != nil {
		t.Fatal(err)
	}
	kept := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.pending) + p.batch.items()
	}
	c := d.client()
	var created, failed int64
	for created < 2 {
		before := kept()
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := p.CreateItem(short, "t", 1, LastStep("id"))
		cancel()
		if err == nil {
			created++
			continue
		}
		if !errors.Is(err, ErrNotApplied) {
			t.Fatalf("an item behind a full window: %v, want ErrNotApplied", err)
		}
		if after := kept(); after != before {
			t.Fatalf("a CreateItem failed (%v) with %d items staged or pending, %d before it: the item was kept", err, after, before)
		}
		failed++
		// The learner makes room; the actor creates the item again.
		if _, err := c.Sample(ctx, "q", 1); err != nil {
			t.Fatal(err)
		}
	}
	if failed == 0 {
		t.Fatal("no CreateItem waited for the window: the test no longer tests")
	}
	flushHolds(t, ctx, d, p, created)
}

// TestCreateItemReportsEarlierErrorsWithoutCreating: the errors of earlier
// messages (here a rejection) are returned by the next CreateItem before
// it creates its item, so that its error always means that its item was
// not created. It returned them after it queued its item, which was then
// published: an actor that created the item again had it twice.
func TestCreateItemReportsEarlierErrorsWithoutCreating(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(0))
	if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{0})}); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "nope", 1, LastStep("id")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "the service rejects the item", func() bool {
		p.flow.mu.Lock()
		defer p.flow.mu.Unlock()
		return p.flow.rejections == 1
	})
	var created int64
	for range 2 {
		err := p.CreateItem(ctx, "t", 1, LastStep("id"))
		if err == nil {
			created++
		} else if !errors.Is(err, ErrRejected) {
			t.Fatal(err)
		}
	}
	if created != 1 {
		t.Fatalf("%d of two CreateItems after a rejection returned nil, want 1 (the first reports the rejection)", created)
	}
	flushHolds(t, ctx, d, p, created)
}

// TestFlushPublishesAnItemAnotherCallGaveUpAdding: item X, created
// (CreateItem returned nil) while its 2-step chunk was open, is being added
// by another call, an Append that waits for room in the window before it
// keeps its step, since X does not fit beside the staged batch (the Append
// before it sealed X's chunk and left X pending). A Flush comes
// meanwhile and waits for room too; the Append's context then ends. Flush
// must still publish X: it went past X while the Append held it and
// returned nil with X never published, a loss of an acknowledged insert.
func TestFlushPublishesAnItemAnotherCallGaveUpAdding(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10), tables.QueueConfig("q", 1)}, testutil.StartEmbedded(t, 16<<10))
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(time.Hour), WithMaxUnapplied(1), WithChunkLength(2), WithCompression(wire.Uncompressed), WithDelta(false))
	// The queue holds its second item, so the window (one item) stays full.
	holdInQueueFlushed(t, d, p, func(i int64) {
		for j := range int64(2) {
			if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{2*i + j})}); err != nil {
				t.Fatal(err)
			}
		}
	})
	// W staged in the batch (linger: an hour); X created, its chunk open.
	x := stageBatchAndItem(t, ctx, p)
	// Another call seals X's chunk, and leaves X pending: W has to go
	// first, and the window has no room.
	s := x(2)
	s["z"] = Int64s(nil, []int64{0}) // left open, for Flush to seal
	if err := p.Append(ctx, s); err != nil {
		t.Fatal(err)
	}
	// The next Append waits for room to add X before it keeps its step.
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	appended := make(chan error, 1)
	go func() { appended <- p.Append(actx, x(3)) }()
	testutil.WaitUntil(t, "the Append waits to add X", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.pending) == 1 && p.pending[0].adding
	})
	flushed := make(chan error, 1)
	go func() { flushed <- p.Flush(ctx) }()
	// Flush seals z and goes on holding the lock until it waits for room.
	testutil.WaitUntil(t, "Flush waits for room", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.cols["z"].open) == 0
	})
	acancel()
	if err := <-appended; !errors.Is(err, ErrNotApplied) {
		t.Fatalf("the Append whose context ended: %v, want ErrNotApplied", err)
	}
	if _, err := d.client().Sample(ctx, "q", 1); err != nil { // room
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatalf("Flush: %v", err)
	}
	tq, _ := d.svc.Table("t")
	if size := tq.Info().Size; size != 2 {
		p.mu.Lock()
		pending, staged := len(p.pending), p.batch.items()
		p.mu.Unlock()
		t.Fatalf("Flush returned nil with %d items in table t, want 2 (%d still pending, %d staged)", size, pending, staged)
	}
}

// TestAppendLeavesNoItemForACallThatNeverComes: the Append that completes
// item X, which does not fit beside the staged batch W while the window
// is full, returns at once with X pending. Once the window moves, W and
// then X are published with no other call of the actor's: an actor whose
// episode's last step completed X and that then appended nothing for a
// while (or ever, before a crash) had X pending for as long. Before
// Append stopped waiting after it keeps its step, that Append waited for
// room and published both.
func TestAppendLeavesNoItemForACallThatNeverComes(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10), tables.QueueConfig("q", 1)}, testutil.StartEmbedded(t, 16<<10))
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(time.Millisecond), WithMaxUnapplied(1), WithChunkLength(2), WithCompression(wire.Uncompressed), WithDelta(false))
	// The queue holds its second item, so the window (one item) is full.
	holdInQueue(t, d, p, "q", "id")
	// W staged, lingering for room; X created, its chunk open.
	x := stageBatchAndItem(t, ctx, p)
	// The actor's last call: it seals X's chunk.
	appended := make(chan error, 1)
	go func() { appended <- p.Append(ctx, x(2)) }()
	testutil.WaitUntil(t, "X's chunk is sealed", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.cols["x"].open) == 0
	})
	makeRoomAndWait(t, ctx, d, p, appended, "an item waited for a call that never came")
}

// TestAppendPublishesAFullBatchOnceTheWindowMoves: the Append that fills
// the staged batch while the window is full returns at once, and the batch
// goes out once the window moves, not when its linger time (an hour here)
// ends. Its first item had armed the linger timer, so the Append left the
// full batch to that timer. Before Append stopped waiting after it keeps
// its step, it waited for room and published the batch.
func TestAppendPublishesAFullBatchOnceTheWindowMoves(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10), tables.QueueConfig("q", 1)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(time.Hour), WithBatch(2, 1<<20), WithMaxUnapplied(1), WithChunkLength(2))
	id := func(i int64) Step { return Step{"id": Int64s(nil, []int64{i})} }
	// The queue holds its second item, so the window (one item) is full.
	holdInQueueFlushed(t, d, p, func(i int64) {
		if err := p.Append(ctx, id(i)); err != nil {
			t.Fatal(err)
		}
	})
	// Two items, each completed by the Append that seals its chunk: the
	// first arms the linger timer, the second fills the batch.
	for i := int64(2); i < 5; i++ {
		if err := p.Append(ctx, id(i)); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := p.CreateItem(ctx, "t", 1, LastStep("id")); err != nil {
				t.Fatal(err)
			}
		}
	}
	appended := make(chan error, 1)
	go func() { appended <- p.Append(ctx, id(5)) }()
	testutil.WaitUntil(t, "the batch is full", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.batch.items() == 2 || p.step == 6
	})
	makeRoomAndWait(t, ctx, d, p, appended, "a full batch waited out its linger time")
}

// TestAppendIsSlowedByAFullWindow: an actor that appends a step and
// creates an item on it, again and again, is held back by a full window
// though Append no longer waits once it keeps its step: the items it
// leaves pending or staged stay within a chunk and a batch, and its calls
// fail with ErrNotApplied rather than let the producer grow.
func TestAppendIsSlowedByAFullWindow(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("q", 1)}, "")
	ctx := testutil.Context(t)
	const chunk, batchItems = 4, 8
	p := d.producer(WithLinger(time.Millisecond), WithMaxUnapplied(4), WithChunkLength(chunk), WithBatch(batchItems, 1<<20))
	// The queue holds its second item and every later one.
	for i := range int64(2) {
		if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "q", 1, LastStep("id")); err != nil {
			t.Fatal(err)
		}
		fctx, cancel := context.WithTimeout(ctx, map[int64]time.Duration{0: 10 * time.Second, 1: 300 * time.Millisecond}[i])
		if err := p.Flush(fctx); (i == 0) != (err == nil) {
			t.Fatalf("flush %d: %v", i, err) // the second waits for the held item
		}
		cancel()
	}
	most, refused := 0, 0
	for i := range int64(40) {
		short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
		err := p.Append(short, Step{"id": Int64s(nil, []int64{i})})
		if err == nil {
			err = p.CreateItem(short, "q", 1, LastStep("id"))
		}
		cancel()
		if errors.Is(err, ErrNotApplied) {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
		p.mu.Lock()
		most = max(most, len(p.pending)+p.batch.items())
		p.mu.Unlock()
	}
	if bound := chunk + batchItems; most > bound {
		t.Fatalf("up to %d items pending or staged behind a full window, want at most %d", most, bound)
	}
	if refused == 0 {
		t.Fatal("no call waited for the full window")
	}
	// The held items would keep Close waiting for room: they are lost with
	// the test.
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	p.Close(cctx)
}

// TestCloseAfterALongEpisodeLosesNothing: Close of a producer whose
// history holds more sent chunks than a message's release list can name
// stores its closing message and reports no loss. It put every chunk's
// release beside the end mark in one message, over the server's max
// payload: JetStream refused it, Close reported ErrNotStored for a
// producer that had lost nothing, and the service held its chunks on.
func TestCloseAfterALongEpisodeLosesNothing(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 1000)}, testutil.StartEmbedded(t, 16<<10))
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(0))
	var cols []string
	for c := range 20 {
		cols = append(cols, fmt.Sprint("c", c))
	}
	for i := range int64(128) {
		s := Step{}
		for _, c := range cols {
			s[c] = Int64s(nil, []int64{i})
		}
		if err := p.Append(ctx, s); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, LastStep(cols...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatalf("Close after everything was applied: %v", err)
	}
	// The end reached the service: once the items are gone, so are their
	// chunks.
	c := d.client()
	if err := c.Reset(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	if info, err := c.Info(ctx, ""); err != nil || info.Chunks != 0 {
		t.Fatalf("after a reset of the only table: %+v, %v; want no chunks held", info, err)
	}
}

// TestInsertsRefusedByPermissionsFailClearly: a producer whose user may
// not publish inserts (a deployment's permissions set up wrong) fails its
// Flush with the server's permissions violation, as the Python writer
// does (at once; here after the first ack timeout). It resent into the
// refusal for the whole retry time (a minute), and a Flush that gave up
// before said only that messages await JetStream's ack.
func TestInsertsRefusedByPermissionsFailClearly(t *testing.T) {
	const prefix = "denied"
	perms, err := RolePermissions(RoleActor, prefix, "actor")
	if err != nil {
		t.Fatal(err)
	}
	perms.Publish.Deny = append(perms.Publish.Deny, prefix+".data.insert")
	url := testutil.StartEmbedded(t, 0,
		embeddednats.WithUser("actor", "pw", embeddednats.Permissions{
			Publish:   embeddednats.SubjectPermissions{Allow: perms.Publish.Allow, Deny: perms.Publish.Deny},
			Subscribe: embeddednats.SubjectPermissions{Allow: perms.Subscribe.Allow, Deny: perms.Subscribe.Deny},
		}),
		embeddednats.WithUser("service", "pw", embeddednats.Permissions{
			Publish:   embeddednats.SubjectPermissions{Allow: []string{">"}},
			Subscribe: embeddednats.SubjectPermissions{Allow: []string{">"}},
		}))
	svcConn, err := nats.Connect(url, nats.UserInfo("service", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svcConn.Close)
	svc, err := service.New(svcConn, []tables.Config{testutil.UniformTable("t", 10)}, service.WithPrefix(prefix), service.WithLogger(testutil.QuietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(sctx) }()
	t.Cleanup(func() { cancel(); <-done })
	ctx := testutil.Context(t)
	nc, err := nats.Connect(url, nats.UserInfo("actor", "pw"), nats.CustomInboxPrefix(InboxPrefix("actor")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	p, err := NewProducer(ctx, nc, WithPrefix(prefix), WithLogger(testutil.QuietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{1})}); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "t", 1, LastStep("id")); err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second) // past one ack timeout (5 s)
	defer fcancel()
	err = p.Flush(fctx)
	if !errors.Is(err, ErrNotStored) || !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
		t.Fatalf("Flush of an insert the server refuses to take from this user: %v, want ErrNotStored naming the permissions violation", err)
	}
}

// unansweredJetStream publishes every message but the first, whose attempts
// it leaves unanswered for ever: a message JetStream may have stored whose
// acks were all lost. published counts the messages it published.
type unansweredJetStream struct {
	jetstream.JetStream
	published *atomic.Int64
}

func (u unansweredJetStream) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if strings.HasSuffix(m.Header.Get(jetstream.MsgIDHeader), "-1") {
		return unansweredFuture{m}, nil
	}
	u.published.Add(1)
	return u.JetStream.PublishMsgAsync(m, opts...)
}

type unansweredFuture struct{ m *nats.Msg }

func (unansweredFuture) Ok() <-chan *jetstream.PubAck { return nil }
func (unansweredFuture) Err() <-chan error            { return nil }
func (f unansweredFuture) Msg() *nats.Msg             { return f.m }

// TestCloseReportsNoAcknowledgedMessageGivenUp: a Close whose ctx ends while
// message 1 goes unanswered gives up on it (ErrOutcomeUnknown) and on
// nothing else: the messages behind it in the ack loop, whose acks came
// before Close gave up, are stored and counted so. Their await chose at
// random between the ack in hand and the producer's closing, and reported
// about half of them ErrOutcomeUnknown, items JetStream had acknowledged
// (Python's writer takes an answer in hand first).
func TestCloseReportsNoAcknowledgedMessageGivenUp(t *testing.T) {
	const messages = 20
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, "")
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(0))
	real, published := p.js, new(atomic.Int64)
	p.js = unansweredJetStream{JetStream: real, published: published}
	for i := range int64(messages) {
		if err := p.Append(ctx, Step{"id": Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, LastStep("id")); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitUntil(t, "JetStream acknowledges messages 2 to 20", func() bool {
		return published.Load() == messages-1 && real.PublishAsyncPending() == 0
	})
	closeCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err := p.Close(closeCtx)
	if !errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "message 1 (1 items)") {
		t.Fatalf("Close with message 1 unanswered: %v, want ErrOutcomeUnknown for message 1", err)
	}
	if m := p.flow.failureMark(); m.unknownItems != 1 || m.failedItems != 0 {
		t.Fatalf("Close: %v; %d items of unknown outcome and %d lost, want message 1's alone of unknown outcome", err, m.unknownItems, m.failedItems)
	}
}

// stageBatchAndItem stages batch W (an item of table t over two steps of
// 4000 bytes) and creates item X of t on a third step, whose chunk (of two
// steps) it leaves open. It returns the steps' maker.
func stageBatchAndItem(t *testing.T, ctx context.Context, p *Producer) func(v byte) Step {
	t.Helper()
	x := func(v byte) Step {
		return Step{"x": Tensor{DType: "uint8", Shape: []int64{4000}, Data: bytes.Repeat([]byte{v}, 4000)}}
	}
	for range 2 {
		if err := p.Append(ctx, x(1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.CreateItem(ctx, "t", 1, LastStep("x")); err != nil {
		t.Fatal(err)
	}
	if err := p.Append(ctx, x(2)); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "t", 1, LastStep("x")); err != nil {
		t.Fatal(err)
	}
	return x
}

// flushHolds flushes p and checks that table t holds the items of the
// CreateItems that returned nil, created, and no more.
func flushHolds(t *testing.T, ctx context.Context, d *deployment, p *Producer, created int64) {
	t.Helper()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	tt, _ := d.svc.Table("t")
	if n := tt.Info().Size; n != created {
		t.Fatalf("table t holds %d items after %d CreateItems returned nil", n, created)
	}
}

// makeRoomAndWait takes the item queue q holds, which moves p's window,
// waits for the Append that reports on appended to return nil, and then
// for table t to hold 2 items with no other call of p's; failing, it says
// what p still holds, and why as the cause.
func makeRoomAndWait(t *testing.T, ctx context.Context, d *deployment, p *Producer, appended <-chan error, why string) {
	t.Helper()
	if _, err := d.client().Sample(ctx, "q", 1); err != nil {
		t.Fatal(err)
	}
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	tt, _ := d.svc.Table("t")
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for tt.Info().Size < 2 {
		if time.Now().After(deadline) {
			p.mu.Lock()
			pending, staged := len(p.pending), p.batch.items()
			p.mu.Unlock()
			t.Fatalf("%d items in table t after 10 s, want 2 (%d pending, %d staged): %s", tt.Info().Size, pending, staged, why)
		}
		<-tick.C
	}
}

// TestFlushAndEndEpisodeGoPastAnItemOverTheMaxPayload: an item over the
// server's max payload, waiting for its chunk when Flush or EndEpisode
// comes, is dropped and reported once the rest is waited for, as Python's
// flush and end_episode do. Flush returned its error at once, with an
// item a queue held still unapplied though its doc says it returns once
// what was not lost is applied; EndEpisode returned ErrEpisodeNotEnded
// and left the episode open, where Python's ended it.
func TestFlushAndEndEpisodeGoPastAnItemOverTheMaxPayload(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10), tables.QueueConfig("q", 1)}, testutil.StartEmbedded(t, 16<<10))
	ctx := testutil.Context(t)
	p := d.producer(WithLinger(0), WithChunkLength(2), WithCompression(wire.Uncompressed))
	holdInQueue(t, d, p, "q", "id") // a Flush waits for the held item
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	oversize := func() {
		t.Helper()
		big := Tensor{DType: "uint8", Shape: []int64{20 << 10}, Data: make([]byte, 20<<10)}
		if err := p.Append(ctx, Step{"big": big}); err != nil {
			t.Fatal(err)
		}
		// Its chunk stays open: the item is still pending at the next call.
		if err := p.CreateItem(ctx, "t", 1, LastStep("big")); err != nil {
			t.Fatal(err)
		}
	}
	oversize()
	if err := p.Flush(short()); !errors.Is(err, ErrInvalidMessage) || !errors.Is(err, ErrNotApplied) {
		t.Fatalf("Flush past an item over the max payload: %v, want ErrInvalidMessage once it waited for the held item (ErrNotApplied)", err)
	}
	oversize()
	err := p.EndEpisode(short())
	if !errors.Is(err, ErrInvalidMessage) || !errors.Is(err, ErrNotApplied) || errors.Is(err, ErrEpisodeNotEnded) {
		t.Fatalf("EndEpisode past an item over the max payload: %v, want ErrInvalidMessage and ErrNotApplied, not ErrEpisodeNotEnded", err)
	}
	p.mu.Lock()
	steps := p.step
	p.mu.Unlock()
	if steps != 0 {
		t.Fatalf("the episode has %d steps after EndEpisode, want 0", steps)
	}
	for range 2 {
		if _, err := d.client().Sample(ctx, "q", 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestEndEpisodeThatEndedReportsWhatItWentPast: an EndEpisode that went
// past an item over the max payload, ended the episode and then found no
// room in the window for the episode's last message returns the item's
// error with its ErrNotApplied, as a Flush whose wait ended does and as
// the README says ("reported with them"). It returned ErrNotApplied
// alone and left the item's error to whichever call came next.
func TestEndEpisodeThatEndedReportsWhatItWentPast(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10), tables.QueueConfig("q", 1)}, testutil.StartEmbedded(t, 16<<10))
	ctx := testutil.Context(t)
	// A linger keeps the small item staged past EndEpisode's first
	// advance, so that the episode ends before its last message waits for
	// room; WithMaxUnapplied(1) leaves no room while the queue holds one.
	p := d.producer(WithLinger(20*time.Millisecond), WithChunkLength(2), WithCompression(wire.Uncompressed), WithMaxUnapplied(1))
	holdInQueue(t, d, p, "q", "id")
	big := Tensor{DType: "uint8", Shape: []int64{20 << 10}, Data: make([]byte, 20<<10)}
	if err := p.Append(ctx, Step{"big": big, "id": Int64s(nil, []int64{2})}); err != nil {
		t.Fatal(err)
	}
	// Their chunks stay open: both items are still pending at EndEpisode.
	if err := p.CreateItem(ctx, "t", 1, LastStep("big")); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "t", 1, LastStep("id")); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err := p.EndEpisode(short)
	p.mu.Lock()
	steps := p.step
	p.mu.Unlock()
	if steps != 0 {
		t.Fatalf("the episode has %d steps after EndEpisode, want 0 (the scenario needs one that ends): %v", steps, err)
	}
	if !errors.Is(err, ErrNotApplied) || errors.Is(err, ErrEpisodeNotEnded) || !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("EndEpisode that ended the episode, then found no room: %v, want ErrNotApplied and the item's ErrInvalidMessage, not ErrEpisodeNotEnded", err)
	}
	for range 2 {
		if _, err := d.client().Sample(ctx, "q", 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("Flush after the EndEpisode reported the item: %v, want nil (reported once)", err)
	}
}
