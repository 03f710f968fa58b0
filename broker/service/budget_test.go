package service

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/tables"
)

// TestReplyBudgetServesInOrder: a taker that does not fit waits, and those
// behind it wait too even where they would fit, so a large reply is not
// passed over for ever by small ones; one larger than the budget takes all
// of it; a taker whose ctx ends leaves the line to the next.
// waiters is how many takers wait in the budget's line.
func (b *replyBudget) waiters() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.waiting)
}

// used is how many request slots are taken.
func (rs *requestSlots) used() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.inUse
}

func TestReplyBudgetServesInOrder(t *testing.T) {
	ctx := testutil.Context(t)
	b := newReplyBudget(100)
	first, err := b.take(ctx, 60)
	if err != nil || first != 60 {
		t.Fatalf("take 60 of 100: %d, %v", first, err)
	}
	order := make(chan string, 3)
	var wg sync.WaitGroup
	waitFor := func(name string, n int64) {
		wg.Go(func() {
			got, err := b.take(ctx, n)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			order <- name
			b.give(got)
		})
		testutil.WaitUntil(t, name+" waits", func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.waiting) > 0 && b.waiting[len(b.waiting)-1].n == min(n, b.size)
		})
	}
	waitFor("large", 1000) // more than the budget: waits for all of it
	waitFor("small", 10)   // would fit now, but comes after the large one
	cctx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := b.take(cctx, 5)
		gaveUp <- err
	}()
	testutil.WaitUntil(t, "the third waits", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.waiting) == 3
	})
	cancel()
	if err := <-gaveUp; err == nil {
		t.Fatal("a take whose ctx ended took its bytes")
	}
	select {
	case name := <-order:
		t.Fatalf("%s took its bytes while 60 of 100 were taken and the large one waited", name)
	case <-time.After(10 * time.Millisecond):
	}
	b.give(first)
	wg.Wait()
	close(order)
	var got []string
	for name := range order {
		got = append(got, name)
	}
	if len(got) != 2 || got[0] != "large" || got[1] != "small" {
		t.Fatalf("served %v, want large then small", got)
	}
	if b.free != b.size || b.peak != b.size {
		t.Fatalf("free %d and peak %d of %d, want all free and a peak of all", b.free, b.peak, b.size)
	}
}

// TestRepliesShareTheirBudget: learners asking at once for replies of large
// items are served within limits.max_reply_bytes_in_flight, over all their
// requests, each in full. Each request could take limits.max_reply_bytes,
// for as many requests as the table's slots allow: a few learners asking
// for large batches of large items could run the service out of memory.
func TestRepliesShareTheirBudget(t *testing.T) {
	limits := DefaultLimits()
	limits.MaxItemBytes, limits.MaxReplyBytes, limits.MaxReplyBytesInFlight = 200_000, 300_000, 300_000
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{service: []Option{WithLimits(limits)}})
	batch := &wire.InsertBatch{ProducerId: "budgetbudgetbudgetbudgetbudgetbu", Sequence: 1, WindowStart: 1, Window: 1}
	for key := uint64(1); key <= 6; key++ {
		data := make([]uint8, 100_000)
		for i := range data {
			data[i] = uint8(key + uint64(i))
		}
		ch, err := wire.EncodeChunk(key, []*wire.Tensor{wire.Uint8s([]int64{100_000}, data)}, wire.ChunkOptions{Codec: wire.Uncompressed})
		if err != nil {
			t.Fatal(err)
		}
		batch.Chunks = append(batch.Chunks, ch)
		batch.Items = append(batch.Items, &wire.Item{Key: key, Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{
			{Name: "x", Squeeze: true, Slices: []*wire.ColumnSlice{{ChunkKey: key, Length: 1}}}}})
	}
	ack := publishBatch(t, d, batch, "")
	testutil.WaitUntil(t, "the items land", func() bool { return d.svc.Applied() >= ack.Sequence })
	ctx := testutil.Context(t)
	c := d.client()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 4 {
				b, err := c.SampleBatch(ctx, "t", 2)
				if err != nil {
					t.Errorf("SampleBatch: %v", err)
					return
				}
				if b.Len() != 2 {
					t.Errorf("a batch of %d items, want 2", b.Len())
				}
			}
		})
	}
	wg.Wait()
	b := d.svc.replyBudget
	// A reply's bytes are given back once its handler returns, which may
	// be after the learner has the reply.
	testutil.WaitUntil(t, "every reply's bytes are given back", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.free == b.size
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.peak < 200_000 || b.peak > limits.MaxReplyBytesInFlight {
		t.Fatalf("replies took at most %d bytes at once, want 200,000 (one reply) to %d (the budget)", b.peak, limits.MaxReplyBytesInFlight)
	}
}

// TestReplyWaitEndsWithTheRequest: a reply waiting for room in
// limits.max_reply_bytes_in_flight waits no longer than its request's
// timeout, the learner is told then, and the request leaves the budget's
// line and its slot. It waited as long as the service ran, for a learner
// long gone, holding its slot and, once granted, bytes others waited for.
func TestReplyWaitEndsWithTheRequest(t *testing.T) {
	limits := DefaultLimits()
	limits.MaxItemBytes, limits.MaxReplyBytes, limits.MaxReplyBytesInFlight = 100_000, 100_000, 100_000
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{service: []Option{WithLimits(limits)}})
	insertSteps(t, d.producer(), 0, 10, 4)
	ctx := testutil.Context(t)
	b := d.svc.replyBudget
	// Another learner's reply holds the whole budget, as one a slow
	// connection has not yet copied would.
	held, err := b.take(ctx, b.size)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			b.give(held)
		}
	}
	defer release()

	const timeout = 200 * time.Millisecond
	nc := d.connect()
	start := time.Now()
	// The learner waits well past the request's timeout.
	m, err := nc.Request(d.svc.subj.Sample(), mustMarshal(t, &wire.SampleRequest{Table: "t", NumSamples: 2, Packed: true, TimeoutMs: timeout.Milliseconds()}), 20*time.Second)
	if err != nil {
		t.Fatalf("no answer while another reply held the budget: %v (%d wait for it)", err, b.waiters())
	}
	elapsed := time.Since(start)
	var resp wire.SampleResponse
	if err := proto.Unmarshal(m.Data, &resp); err != nil {
		t.Fatal(err)
	}
	if code := resp.GetStatus().GetCode(); code != wire.Code_CODE_RATE_LIMITED {
		t.Fatalf("answered %v (%s), want %v", code, resp.GetStatus().GetMessage(), wire.Code_CODE_RATE_LIMITED)
	}
	if elapsed < timeout {
		t.Fatalf("answered after %v, before the request's timeout of %v", elapsed, timeout)
	}
	testutil.WaitUntil(t, "the request leaves the budget's line and its slot", func() bool { return b.waiters() == 0 && d.svc.slots.used() == 0 })

	// The Go client's deadline reaches the service as the request's
	// timeout: it is told the table is rate limited, not left to its own
	// deadline.
	sctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	if _, err := d.client().Sample(sctx, "t", 2); !errors.Is(err, broker.ErrRateLimited) || sctx.Err() != nil {
		t.Fatalf("Sample with a deadline while the budget was held: %v, want ErrRateLimited before the deadline", err)
	}
	testutil.WaitUntil(t, "the client's request leaves the budget's line", func() bool { return b.waiters() == 0 && d.svc.slots.used() == 0 })

	release()
	if _, err := d.client().Sample(ctx, "t", 2); err != nil {
		t.Fatalf("Sample once the budget was free: %v", err)
	}
	testutil.WaitUntil(t, "every byte is given back", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.free == b.size
	})

	// One whose request may wait longer than the service runs is told it
	// stops.
	if held, err = b.take(ctx, b.size); err != nil {
		t.Fatal(err)
	}
	released = false
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(d.svc.subj.Sample(), inbox, mustMarshal(t, &wire.SampleRequest{Table: "t", NumSamples: 2, Packed: true, TimeoutMs: 60_000})); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "a reply waits for room", func() bool { return b.waiters() == 1 })
	d.stop()
	if m, err = sub.NextMsg(20 * time.Second); err != nil {
		t.Fatalf("no answer as the service stopped: %v", err)
	}
	if err := proto.Unmarshal(m.Data, &resp); err != nil {
		t.Fatal(err)
	}
	if code := resp.GetStatus().GetCode(); code != wire.Code_CODE_UNAVAILABLE {
		t.Fatalf("a reply waiting for room as the service stopped: %v (%s), want %v", code, resp.GetStatus().GetMessage(), wire.Code_CODE_UNAVAILABLE)
	}
}

// TestReplyTakenAtTheDeadlineWaitsForRoom: a reply whose samples were
// taken as its request's timeout came (here the one sample of a partial
// reply) may still wait for room in limits.max_reply_bytes_in_flight a
// while, as its learner still listens for a margin past the timeout, and
// reaches the learner once room comes. It had no time at all: behind
// another reply it was answered rate limited at once, its samples taken
// and lost.
func TestReplyTakenAtTheDeadlineWaitsForRoom(t *testing.T) {
	limits := DefaultLimits()
	limits.MaxItemBytes, limits.MaxReplyBytes, limits.MaxReplyBytesInFlight = 100_000, 100_000, 100_000
	cfg := testutil.UniformTable("t", 100)
	// One item in: one sample, and a request for two waits for the second
	// until its timeout.
	cfg.Limiter = limiter.Queue(100)
	d := deploy(t, []tables.Config{cfg}, deployOptions{service: []Option{WithLimits(limits)}})
	insertSteps(t, d.producer(), 0, 1, 4)
	ctx := testutil.Context(t)
	b := d.svc.replyBudget
	// Another learner's reply holds the whole budget, as one a slow
	// connection has not yet copied would.
	held, err := b.take(ctx, b.size)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release := func() { once.Do(func() { b.give(held) }) }
	defer release()

	// A deadline of 5 s: the request's timeout is 4.5 s, and the client
	// listens 500 ms past it.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	type result struct {
		samples []broker.Sample
		err     error
	}
	answer := make(chan result, 1)
	c := d.client()
	go func() {
		s, err := c.Sample(sctx, "t", 2)
		answer <- result{s, err}
	}()
	var got result
	answered := false
	testutil.WaitUntil(t, "the reply waits for room, or the learner is answered", func() bool {
		select {
		case got = <-answer:
			answered = true
			return true
		default:
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.waiting) > 0
	})
	release()
	if !answered {
		got = <-answer
	}
	if len(got.samples) != 1 || !errors.Is(got.err, broker.ErrRateLimited) {
		t.Fatalf("the reply of a partial sample, room given once it waited: %d samples, %v; want the one taken, with ErrRateLimited for the other", len(got.samples), got.err)
	}
	testutil.WaitUntil(t, "every byte is given back", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.free == b.size
	})
}

// TestWithdrawnReplyWaitGivesItsRoomBackOnce: a reply waiting in line for
// room (whileListened) whose request is withdrawn as the room comes, in
// either order, takes the bytes and gives them back, leaves the line with
// none, or is granted them as it leaves and gives them back: every byte is
// free at the end, and the line is empty. One that begins after the
// withdrawal does not wait.
func TestWithdrawnReplyWaitGivesItsRoomBackOnce(t *testing.T) {
	ctx := testutil.Context(t)
	b := newReplyBudget(100)
	inLine := func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.waiting) == 1
	}
	for i := range 300 {
		held, err := b.take(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		l := &lazyDeadline{parent: ctx, at: time.Now().Add(time.Hour)}
		waited := make(chan struct{})
		go func() {
			defer close(waited)
			rctx, unbind := l.whileListened(ctx)
			defer unbind()
			taken, _ := b.take(rctx, 60)
			b.give(taken)
		}()
		testutil.WaitUntil(t, "the reply waits in line", inLine)
		switch i % 3 {
		case 0:
			b.give(held)
			l.withdraw()
		case 1:
			l.withdraw()
			b.give(held)
		case 2:
			l.withdraw()
			<-waited
			b.give(held)
		}
		<-waited
		l.stop()
		b.mu.Lock()
		free, waiting := b.free, len(b.waiting)
		b.mu.Unlock()
		if free != b.size || waiting != 0 {
			t.Fatalf("%d of %d bytes free and %d waiting, want all free and none", free, b.size, waiting)
		}
	}
	l := &lazyDeadline{parent: ctx, at: time.Now().Add(time.Hour)}
	l.withdraw()
	rctx, unbind := l.whileListened(ctx)
	defer unbind()
	if rctx.Err() == nil {
		t.Fatal("a wait that began after its withdrawal has not ended")
	}
}
