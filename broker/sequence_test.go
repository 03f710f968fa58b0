package broker

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

type rawItem struct {
	id    int64
	table string
}

// publishRaw publishes one InsertBatch of producer at seq, holding for each
// rawItem a one-step chunk and an item (key = id) in its table, as a
// producer whose messages the stream stored out of order would have.
func publishRaw(t *testing.T, d *deployment, producer string, seq uint64, items ...rawItem) uint64 {
	t.Helper()
	m := &wire.InsertBatch{ProducerId: producer, Sequence: seq, WindowStart: 1, Window: 1024}
	for _, it := range items {
		ch, err := wire.EncodeChunk(uint64(1000+it.id), []*wire.Tensor{wire.Int64s(nil, []int64{it.id})}, wire.ChunkOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m.Chunks = append(m.Chunks, ch)
		m.Items = append(m.Items, &wire.Item{Key: uint64(it.id), Table: it.table, Priority: 1,
			Columns: []*wire.TrajectoryColumn{{Name: "id", Squeeze: true, Slices: []*wire.ColumnSlice{{ChunkKey: ch.Key, Length: 1}}}}})
	}
	ack, err := d.svc.js.Publish(testContext(t), d.svc.subj.insert(), mustMarshal(t, m))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func drainQueue(t *testing.T, c *Client, table string, n int) []int64 {
	t.Helper()
	var got []int64
	for range n {
		ctx, cancel := context.WithTimeout(testContext(t), 5*time.Second)
		s, err := c.Sample(ctx, table, 1)
		cancel()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, ids(t, s[0])[0])
	}
	return got
}

// TestFirstMessagesReordered: a producer's message 1 stored after its
// message 2 (a retry) is applied, first.
func TestFirstMessagesReordered(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("q", 10)}, deployOptions{})
	publishRaw(t, d, "p", 2, rawItem{2, "q"})
	publishRaw(t, d, "p", 1, rawItem{1, "q"})
	if got := drainQueue(t, d.client(), "q", 2); !slices.Equal(got, []int64{1, 2}) {
		t.Fatalf("queue delivered %v, want [1 2]", got)
	}
}

// TestHeldMessagesSurviveCheckpoint: messages of a producer that arrived out
// of order, one of them half applied because a rate limiter holds its
// second item, are in a checkpoint (crash) and in the final one (graceful
// stop): after either, the queue delivers everything once, in order.
func TestHeldMessagesSurviveCheckpoint(t *testing.T) {
	for _, graceful := range []bool{false, true} {
		t.Run(map[bool]string{false: "crash", true: "graceful"}[graceful], func(t *testing.T) {
			cs, err := NewFileCheckpoints(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			opts := []ServiceOption{WithCheckpoints(cs)}
			if !graceful {
				opts = append(opts, WithoutFinalCheckpoint())
			}
			cfgs := []tables.Config{tables.QueueConfig("queue", 2)}
			d := deploy(t, cfgs, deployOptions{service: opts})
			publishRaw(t, d, "p", 1, rawItem{1, "queue"})
			publishRaw(t, d, "p", 3, rawItem{3, "queue"}, rawItem{4, "queue"})
			publishRaw(t, d, "p", 2, rawItem{2, "queue"})
			q, _ := d.svc.Table("queue")
			waitUntil(t, "queue full, insert held", func() bool { return q.Size() == 2 && q.Info().Counters.InsertWaits > 0 })
			if !graceful {
				if _, err := d.svc.Checkpoint(testContext(t)); err != nil {
					t.Fatal(err)
				}
			}
			d.stop()
			d.startService(cfgs, WithCheckpoints(cs))
			c := d.client()
			if got := drainQueue(t, c, "queue", 4); !slices.Equal(got, []int64{1, 2, 3, 4}) {
				t.Fatalf("queue delivered %v, want [1 2 3 4]", got)
			}
			ctx, cancel := context.WithTimeout(testContext(t), 500*time.Millisecond)
			defer cancel()
			if s, err := c.Sample(ctx, "queue", 1); !errors.Is(err, ErrRateLimited) {
				t.Fatalf("a fifth item %v (%v): something was delivered twice", s, err)
			}
		})
	}
}

// TestPartialBatchNotReinserted: the items of a half-applied message that
// were applied (and then sampled out) before a checkpoint are not inserted
// again by recovery.
func TestPartialBatchNotReinserted(t *testing.T) {
	cs, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := []tables.Config{tables.QueueConfig("q", 10), tables.QueueConfig("full", 1)}
	d := deploy(t, cfgs, deployOptions{service: []ServiceOption{WithCheckpoints(cs), WithoutFinalCheckpoint()}})
	ctx := testContext(t)
	publishRaw(t, d, "p", 1, rawItem{100, "full"})
	publishRaw(t, d, "p", 2, rawItem{1, "q"}, rawItem{2, "full"})
	full, _ := d.svc.Table("full")
	waitUntil(t, "item 2 held", func() bool { return full.Info().Counters.InsertWaits > 0 })
	if got := drainQueue(t, d.client(), "q", 1); got[0] != 1 {
		t.Fatalf("q delivered %v, want [1]", got)
	}
	if _, err := d.svc.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	d.stop()
	d.startService(cfgs, WithCheckpoints(cs))
	c := d.client()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if s, err := c.Sample(short, "q", 1); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("q after recovery: %v (%v), want nothing: item 1 was sampled out before the checkpoint", s, err)
	}
	// The held item 2 goes in once the full table makes room.
	if got := drainQueue(t, c, "full", 2); !slices.Equal(got, []int64{100, 2}) {
		t.Fatalf("full delivered %v, want [100 2]", got)
	}
}

// TestCloseNotStuckBehindWaitingAppend: a call waiting for room in the
// window (with a context that allows it to wait forever) does not keep
// Close, or another call with a deadline, from returning in time.
func TestCloseNotStuckBehindWaitingAppend(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 1)}, deployOptions{})
	ctx := testContext(t)
	p := d.producer(WithLinger(0), WithMaxUnapplied(1))
	add := func(ctx context.Context, i int64) error {
		if err := p.Append(ctx, Step{"id": wire.Int64s(nil, []int64{i})}); err != nil {
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
	waitUntil(t, "an insert is held", func() bool { return q.Info().Counters.InsertWaits > 0 })
	blocked := make(chan error, 1)
	go func() { blocked <- add(context.Background(), 2) }()
	waitUntil(t, "the third item waits for the window", func() bool {
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
