package service

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/internal/testutil"

	"github.com/reprise-rl/reprise/broker"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
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
	ack, err := d.svc.js.Publish(testutil.Context(t), d.svc.subj.Insert(), mustMarshal(t, m))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func drainQueue(t *testing.T, c *broker.Client, table string, n int) []int64 {
	t.Helper()
	var got []int64
	for range n {
		ctx, cancel := context.WithTimeout(testutil.Context(t), 5*time.Second)
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
			opts := []Option{WithCheckpoints(cs)}
			if !graceful {
				opts = append(opts, WithoutFinalCheckpoint())
			}
			cfgs := []tables.Config{tables.QueueConfig("queue", 2)}
			d := deploy(t, cfgs, deployOptions{service: opts})
			publishRaw(t, d, "p", 1, rawItem{1, "queue"})
			publishRaw(t, d, "p", 3, rawItem{3, "queue"}, rawItem{4, "queue"})
			publishRaw(t, d, "p", 2, rawItem{2, "queue"})
			q, _ := d.svc.Table("queue")
			testutil.WaitUntil(t, "queue full, insert held", func() bool { return q.Size() == 2 && q.Info().Counters.InsertWaits > 0 })
			if !graceful {
				if _, err := d.svc.Checkpoint(testutil.Context(t)); err != nil {
					t.Fatal(err)
				}
			}
			d.stop()
			d.startService(cfgs, WithCheckpoints(cs))
			c := d.client()
			if got := drainQueue(t, c, "queue", 4); !slices.Equal(got, []int64{1, 2, 3, 4}) {
				t.Fatalf("queue delivered %v, want [1 2 3 4]", got)
			}
			ctx, cancel := context.WithTimeout(testutil.Context(t), 500*time.Millisecond)
			defer cancel()
			if s, err := c.Sample(ctx, "queue", 1); !errors.Is(err, protocol.ErrRateLimited) {
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
	d := deploy(t, cfgs, deployOptions{service: []Option{WithCheckpoints(cs), WithoutFinalCheckpoint()}})
	ctx := testutil.Context(t)
	publishRaw(t, d, "p", 1, rawItem{100, "full"})
	publishRaw(t, d, "p", 2, rawItem{1, "q"}, rawItem{2, "full"})
	full, _ := d.svc.Table("full")
	testutil.WaitUntil(t, "item 2 held", func() bool { return full.Info().Counters.InsertWaits > 0 })
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
	if s, err := c.Sample(short, "q", 1); !errors.Is(err, protocol.ErrRateLimited) {
		t.Fatalf("q after recovery: %v (%v), want nothing: item 1 was sampled out before the checkpoint", s, err)
	}
	// The held item 2 goes in once the full table makes room.
	if got := drainQueue(t, c, "full", 2); !slices.Equal(got, []int64{100, 2}) {
		t.Fatalf("full delivered %v, want [100 2]", got)
	}
}
