package service

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
)

// queueInfo is the info of d's table "q".
func queueInfo(t *testing.T, c *broker.Client) broker.TableInfo {
	t.Helper()
	info, err := c.Info(testutil.Context(t), "q")
	if err != nil {
		t.Fatal(err)
	}
	return info.Tables[0]
}

// barrier returns once the service has taken every message c sent on the
// sample subject before it: it answers a sample request that cannot wait
// (the table is empty) only after its subscription took them, withdrawals
// included.
func barrier(t *testing.T, c *broker.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(testutil.Context(t), time.Second)
	defer cancel()
	if _, err := c.Sample(ctx, "q", 1); !errors.Is(err, protocol.ErrRateLimited) {
		t.Fatalf("a sample of the empty queue: %v, want ErrRateLimited", err)
	}
}

// insertAndRead inserts n items into the empty queue q and reads them with a
// fresh client, failing unless every one arrives, once, and the table
// counts each as sampled once.
func insertAndRead(t *testing.T, d *deployment, n int) {
	t.Helper()
	ctx := testutil.Context(t)
	p := d.producer()
	insertStepsInto(t, p, "q", 0, int64(n), 4)
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c := d.client()
	seen := map[int64]bool{}
	for len(seen) < n {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		samples, err := c.Sample(sctx, "q", 1)
		cancel()
		if err != nil {
			t.Fatalf("after %d of %d items: %v (an abandoned request took the others)", len(seen), n, err)
		}
		for _, s := range samples {
			if s.Info.TimesSampled != 1 {
				t.Errorf("item %d sampled %d times", s.Info.Key, s.Info.TimesSampled)
			}
			seen[ids(t, s)[0]] = true
		}
	}
	// Every sample the table and its limiter counted is one this reader
	// got: the withdrawn requests took none.
	if ti := queueInfo(t, c); ti.Samples != int64(n) || ti.Limiter.Samples != int64(n) || ti.Size != 0 {
		t.Errorf("table counts %d samples, its limiter %d, and holds %d items; want %d, %d and 0", ti.Samples, ti.Limiter.Samples, ti.Size, n, n)
	}
}

// TestCancelledSampleTakesNothing: a Sample whose ctx ends while it waits
// for the limiter of an empty queue withdraws its request; the items
// inserted afterwards all reach the next reader.
func TestCancelledSampleTakesNothing(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("q", 100)}, deployOptions{})
	c := d.client()
	ctx, cancel := context.WithTimeout(testutil.Context(t), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Sample(ctx, "q", 1)
		done <- err
	}()
	testutil.WaitUntil(t, "the sample waits", func() bool { return queueInfo(t, c).SampleWaits == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sample: %v, want context.Canceled", err)
	}
	barrier(t, c)
	insertAndRead(t, d, 8)
	testutil.WaitUntil(t, "no request registered", func() bool { return d.svc.waits.len() == 0 })
}

// TestClosedSamplerTakesNothing: a Sampler (and a BatchSampler) with 4
// requests in flight, closed while the queue is empty, withdraws them all.
func TestClosedSamplerTakesNothing(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			d := deploy(t, []tables.Config{tables.QueueConfig("q", 100)}, deployOptions{})
			c := d.client()
			var closeIt func()
			if batch {
				s, err := c.NewBatchSampler("q", 1, broker.WithInFlight(4))
				if err != nil {
					t.Fatal(err)
				}
				closeIt = s.Close
			} else {
				s, err := c.NewSampler("q", 1, broker.WithInFlight(4))
				if err != nil {
					t.Fatal(err)
				}
				closeIt = s.Close
			}
			testutil.WaitUntil(t, "4 requests wait", func() bool { return queueInfo(t, c).SampleWaits == 4 })
			closeIt()
			barrier(t, c)
			insertAndRead(t, d, 8)
		})
	}
}

// TestClientCloseWithdraws: closing the Client ends the samples waiting
// on it with ErrClosed, and withdraws their requests.
func TestClientCloseWithdraws(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("q", 100)}, deployOptions{})
	nc := d.connect()
	c, err := broker.NewClient(nc, broker.WithPrefix(d.prefix))
	if err != nil {
		t.Fatal(err)
	}
	watch := d.client()
	done := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := c.Sample(testutil.Context(t), "q", 1)
			done <- err
		}()
	}
	testutil.WaitUntil(t, "2 samples wait", func() bool { return queueInfo(t, watch).SampleWaits == 2 })
	c.Close()
	for range 2 {
		if err := <-done; !errors.Is(err, broker.ErrClosed) {
			t.Fatalf("sample of a closed client: %v, want ErrClosed", err)
		}
	}
	// The withdrawals went out on nc before Close returned: a request on
	// it after them is taken after them.
	c2, err := broker.NewClient(nc, broker.WithPrefix(d.prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	barrier(t, c2)
	insertAndRead(t, d, 4)
}

// TestClientCloseRacingSamples: a Close that ends a Sample between the
// registration of its call and the publish of its request withdraws it
// after the request. Close withdrew it first, then the request went out
// and waited for the limiter, to take the next item for nobody. The
// moment is short: Closes land anywhere in the calls, many times.
func TestClientCloseRacingSamples(t *testing.T) {
	// Longer than WaitUntil waits: a request left waiting fails the test.
	d := deploy(t, []tables.Config{tables.QueueConfig("q", 100)}, deployOptions{service: []Option{WithMaxSampleWait(5 * time.Minute)}})
	nc := d.connect()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		c, err := broker.NewClient(nc, broker.WithPrefix(d.prefix))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := c.Sample(testutil.Context(t), "q", 1)
			done <- err
		}()
		for range rng.IntN(2000) {
			runtime.Gosched()
		}
		c.Close()
		if err := <-done; !errors.Is(err, broker.ErrClosed) {
			t.Fatalf("sample of a closed client: %v, want ErrClosed", err)
		}
	}
	c, err := broker.NewClient(nc, broker.WithPrefix(d.prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	barrier(t, c)
	testutil.WaitUntil(t, "no request waits", func() bool { return d.svc.waits.len() == 0 })
}

// TestWithdrawnPartialBatch: a request for more items than the queue
// holds takes those it can and waits for the rest; withdrawn then, it
// ends with what it took, answered to nobody, and the queue lost them (as
// Reverb's sampler loses the items it streamed). Only a request that took
// nothing takes nothing.
func TestWithdrawnPartialBatch(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("q", 100)}, deployOptions{})
	c := d.client()
	p := d.producer()
	insertStepsInto(t, p, "q", 0, 2, 4)
	ctx, cancel := context.WithTimeout(testutil.Context(t), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Sample(ctx, "q", 4)
		done <- err
	}()
	testutil.WaitUntil(t, "the sample waits for the rest", func() bool { return queueInfo(t, c).SampleWaits == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sample: %v, want context.Canceled", err)
	}
	barrier(t, c)
	if ti := queueInfo(t, c); ti.Samples != 2 || ti.Size != 0 {
		t.Errorf("the queue counts %d samples and holds %d items; want the 2 items taken", ti.Samples, ti.Size)
	}
}

// TestHostileWithdrawals: withdrawals of subjects nobody waits on, of
// malformed bytes, with reply subjects, and withdrawals racing their
// requests (before and after them) leave the service serving, and its
// registry empty once the requests end.
func TestHostileWithdrawals(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("q", 100)}, deployOptions{})
	nc := d.connect()
	subj, err := protocol.NewSubjects(d.prefix)
	if err != nil {
		t.Fatal(err)
	}
	subject := subj.Sample()
	rng := rand.New(rand.NewPCG(1, 2))
	withdrawal := func(reply string) []byte {
		data, err := proto.Marshal(&wire.SampleRequest{Withdraw: reply})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	for i := range 2000 {
		var data []byte
		switch i % 4 {
		case 0:
			data = withdrawal(fmt.Sprintf("_INBOX.%x", rng.Uint64()))
		case 1:
			data = withdrawal(string(make([]byte, rng.IntN(4096))))
		case 2:
			data = []byte{0xff, 0xff, 0x07} // malformed
		case 3:
			// A withdrawal that names a request and fields it ignores.
			req := &wire.SampleRequest{Table: "q", NumSamples: 1 << 30, TimeoutMs: -1, Withdraw: "x"}
			data, _ = proto.Marshal(req)
		}
		if err := nc.Publish(subject, data); err != nil {
			t.Fatal(err)
		}
	}
	// A withdrawal sent as a request is refused, not served.
	m, err := nc.Request(subject, withdrawal("_INBOX.x"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get("Nats-Service-Error-Code") != "400" {
		t.Errorf("withdrawal with a reply subject: answered %q, want an invalid argument", m.Header.Get("Nats-Service-Error-Code"))
	}
	// Requests raced by their own withdrawals, published before and after
	// them, and requests of one reply subject withdrawn together.
	sub, err := nc.SubscribeSync("_INBOX.hostile.>")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	req, _ := proto.Marshal(&wire.SampleRequest{Table: "q", NumSamples: 1, TimeoutMs: 2000})
	answers := 0
	for i := range 60 {
		// Requests of one reply subject are withdrawn together.
		reply := fmt.Sprintf("_INBOX.hostile.shared%d", i%5)
		if i%3 == 0 {
			reply = fmt.Sprintf("_INBOX.hostile.%d", i)
			// Before its request: the request is not withdrawn, and
			// answers once its wait ends.
			_ = nc.Publish(subject, withdrawal(reply))
			answers++
		}
		if err := nc.PublishRequest(subject, reply, req); err != nil {
			t.Fatal(err)
		}
		if i%3 != 0 {
			_ = nc.Publish(subject, withdrawal(reply))
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	c := d.client()
	barrier(t, c)
	for range answers {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("a request withdrawn before it was sent is still answered: %v", err)
		}
		var resp wire.SampleResponse
		if proto.Unmarshal(m.Data, &resp) != nil || resp.GetStatus().GetCode() != wire.Code(protocol.CodeRateLimited) {
			t.Errorf("answer %v, want rate limited", resp.GetStatus())
		}
	}
	testutil.WaitUntil(t, "no request registered", func() bool { return d.svc.waits.len() == 0 })
	// The service answers on one connection, in order: what it answered
	// before this comes before it.
	last, _ := proto.Marshal(&wire.SampleRequest{Table: "q", NumSamples: 1})
	if err := nc.PublishRequest(subject, "_INBOX.hostile.last", last); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(10 * time.Second); err != nil || m.Subject != "_INBOX.hostile.last" {
		t.Errorf("a withdrawn request was answered: %v %v", m, err)
	}
	insertAndRead(t, d, 4)
}

// TestWithdrawnReplyLeavesTheBudgetsLine: a request that sampled and waits
// for room in limits.max_reply_bytes_in_flight stops waiting once its
// learner withdraws it, and leaves the line and its slot. It waited on to
// its timeout and the grace past it (a minute and more by default),
// holding its slot, and once room came took bytes that learners still
// listening waited for, for a reply nobody read.
func TestWithdrawnReplyLeavesTheBudgetsLine(t *testing.T) {
	limits := DefaultLimits()
	limits.MaxItemBytes, limits.MaxReplyBytes, limits.MaxReplyBytesInFlight = 100_000, 100_000, 100_000
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{service: []Option{WithLimits(limits)}})
	insertSteps(t, d.producer(), 0, 10, 4)
	b := d.svc.replyBudget
	// Another learner's reply holds the whole budget, as one a slow
	// connection has not yet copied would.
	held, err := b.take(testutil.Context(t), b.size)
	if err != nil {
		t.Fatal(err)
	}
	defer b.give(held)

	ctx, cancel := context.WithTimeout(testutil.Context(t), 50*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := d.client().Sample(ctx, "t", 2)
		done <- err
	}()
	testutil.WaitUntil(t, "the reply waits for room", func() bool { return b.waiters() == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled sample: %v, want context.Canceled", err)
	}
	// Well within the request's timeout of about 45 s.
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for b.waiters() != 0 || d.svc.slots.used() != 0 || d.svc.waits.len() != 0 {
		select {
		case <-deadline:
			t.Fatalf("10 s after its withdrawal: %d replies wait for room, %d slots in use, %d requests registered; want none", b.waiters(), d.svc.slots.used(), d.svc.waits.len())
		case <-tick.C:
		}
	}
}
