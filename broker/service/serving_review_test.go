package service

import (
	"errors"
	"strings"
	"testing"

	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// TestReplyBoundHeldForARequestThatWaited: a sample request is measured
// against limits.max_reply_bytes at the table's largest item when its
// samples are taken, not only when it arrives. A learner that asked an
// empty table for 11 items (any number fits a table of no items) was
// served 11 items of 10,000 bytes once they came, a reply over the bound
// of 10 such items, counted against the limiter.
func TestReplyBoundHeldForARequestThatWaited(t *testing.T) {
	limits := DefaultLimits()
	limits.MaxItemBytes, limits.MaxReplyBytes = 20_000, 110_000
	cfg := testutil.TableConfig("t", selectors.Options{Kind: selectors.KindUniform}, selectors.Options{Kind: selectors.KindFifo}, 100, limiter.MinSize(10))
	d := deploy(t, []tables.Config{cfg}, deployOptions{service: []Option{WithLimits(limits)}})
	ctx := testutil.Context(t)
	c := d.client()
	tb, _ := d.svc.Table("t")
	done := make(chan error, 1)
	go func() {
		_, err := c.Sample(ctx, "t", 11)
		done <- err
	}()
	testutil.WaitUntil(t, "the request waits for the table's limiter", func() bool { return tb.Counters().SampleWaits > 0 })
	insertSteps(t, d.producer(), 0, 10, 2498) // 10,000 bytes a step
	if err := <-done; !errors.Is(err, protocol.ErrResourceExhausted) || !strings.Contains(err.Error(), "ask for at most 10") {
		t.Fatalf("a sample of 11 that waited for items of 10,000 bytes: %v, want ErrResourceExhausted saying at most 10", err)
	}
	if n := tb.Counters().Samples; n != 0 {
		t.Fatalf("the table counted %d samples for a refused request, want 0", n)
	}
}

// TestSampleWaitingAtShutdownIsUnavailable: a sample waiting for a table's
// rate limiter when the service stops is told the service is shutting
// down (CodeUnavailable: a sharded learner then samples the other shards),
// not that the limiter allowed nothing within the request's whole wait.
func TestSampleWaitingAtShutdownIsUnavailable(t *testing.T) {
	cfg := testutil.TableConfig("t", selectors.Options{Kind: selectors.KindUniform}, selectors.Options{Kind: selectors.KindFifo}, 100, limiter.MinSize(10))
	d := deploy(t, []tables.Config{cfg}, deployOptions{})
	c := d.client()
	tb, _ := d.svc.Table("t")
	done := make(chan error, 1)
	go func() {
		_, err := c.Sample(testutil.Context(t), "t", 1)
		done <- err
	}()
	testutil.WaitUntil(t, "the request waits for the table's limiter", func() bool { return tb.Counters().SampleWaits > 0 })
	d.stop()
	err := <-done
	var se *protocol.StatusError
	if !errors.As(err, &se) || se.Code != protocol.CodeUnavailable || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("a sample waiting as the service stops: %v, want CodeUnavailable saying it is shutting down", err)
	}
}

// TestWildcardReplySubjectIgnored: a request whose reply subject holds
// a wildcard gets no answer. Published there, the answer reached the
// subscriptions the wildcard matched: a reply subject "other.data.>"
// stored an info reply in the stream of the deployment of prefix
// "other", whose service rejects it as a message of no known subject.
func TestWildcardReplySubjectIgnored(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{})
	ctx := testutil.Context(t)
	js, err := jetstream.New(d.connect())
	if err != nil {
		t.Fatal(err)
	}
	victim, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "VICTIM", Subjects: []string{"other.data.>", "events.*"}})
	if err != nil {
		t.Fatal(err)
	}
	nc := d.connect()
	for _, reply := range []string{"other.data.>", "other.data.*", "events.*", "events.>", ">", "*"} {
		if err := nc.PublishRequest(d.svc.subj.Info(), reply, mustMarshal(t, &wire.TableRequest{})); err != nil {
			t.Fatal(err)
		}
	}
	// The endpoint serves its requests in order.
	if _, err := nc.RequestWithContext(ctx, d.svc.subj.Info(), mustMarshal(t, &wire.TableRequest{})); err != nil {
		t.Fatal(err)
	}
	info, err := victim.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		m, _ := victim.GetMsg(ctx, 1)
		t.Fatalf("another stream stored %d messages the service published on a client's wildcard reply subject (the first on %q)", info.State.Msgs, m.Subject)
	}
}

// TestSampleWithoutReplyTakesNothing: a sample request that names no reply
// subject (published, not requested) takes no items: nobody would receive
// them, and a queue's items would be gone.
func TestSampleWithoutReplyTakesNothing(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100), tables.QueueConfig("q", 10)}, deployOptions{})
	p := d.producer()
	insertSteps(t, p, 0, 1, 2)
	insertStepsInto(t, p, "q", 10, 12, 2)
	ctx := testutil.Context(t)
	nc := d.connect()
	if err := nc.Publish(d.svc.subj.Sample(), mustMarshal(t, &wire.SampleRequest{Table: "q", NumSamples: 2, Packed: true})); err != nil {
		t.Fatal(err)
	}
	// The endpoint takes its requests' slots in order, and gives them
	// back once they are served.
	if _, err := nc.RequestWithContext(ctx, d.svc.subj.Sample(), mustMarshal(t, &wire.SampleRequest{Table: "t", NumSamples: 1, Packed: true})); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "every request served", func() bool { return d.svc.slots.used() == 0 })
	if got := tableSize(t, d.client(), "q"); got != 2 {
		t.Fatalf("queue q holds %d items, want its 2: a sample request with no reply subject took them", got)
	}
}

// TestSmallestMaxPayloadServes: a server whose max payload is 1 KiB, the
// least reprised's config takes, left no room for a reply's data beside
// the headroom kept for its headers: every info request divided by zero
// and took the service down. Replies now go out, in parts where they must.
func TestSmallestMaxPayloadServes(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{maxPayload: 1 << 10})
	ctx := testutil.Context(t)
	col := &wire.TrajectoryColumn{Name: "x", Slices: []*wire.ColumnSlice{{ChunkKey: 7, Length: 1}}}
	ack := publishBatch(t, d, &wire.InsertBatch{ProducerId: "payloadpayloadpayloadpayloadpayl", Sequence: 1, WindowStart: 1, Window: 1,
		Chunks: []*wire.Chunk{int64Chunk(t, 7, 7)}, Items: []*wire.Item{{Key: 1, Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{col}}}}, "")
	testutil.WaitUntil(t, "the item lands", func() bool { return d.svc.Applied() >= ack.Sequence })
	c := d.client()
	info, err := c.Info(ctx, "t")
	if err != nil || info.Tables[0].Size != 1 {
		t.Fatalf("info: %v, %v; want a table of 1 item", info, err)
	}
	// Each item's record takes more than the half of a message left to
	// the data: the reply comes in parts.
	got, err := c.Sample(ctx, "t", 32)
	if err != nil || len(got) != 32 {
		t.Fatalf("a sample of 32: %d items, %v", len(got), err)
	}
	for _, s := range got {
		if v, err := column(t, s, "x").Int64s(); err != nil || len(v) != 1 || v[0] != 7 {
			t.Fatalf("sampled item's column x: %v, %v; want [7]", v, err)
		}
	}
}
