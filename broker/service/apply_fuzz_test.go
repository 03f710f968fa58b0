package service

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/internal/testutil"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// FuzzApply drives the whole apply path with arbitrary bytes: the message
// parser, the prepare step and the apply of the result to real tables and
// a real chunk store, between two valid messages of a live producer. After
// each input the service must not have panicked, its tables must respect
// their bounds, the live producer's items must all be in (but one a staleness
// bound set by the input drops, and counts), and every item a
// learner can sample must encode into a reply that the client decodes.
// The corpus lives in testdata/fuzz/FuzzApply; `go test` replays it, and
// `go test -run - -fuzz FuzzApply ./broker` searches for more.
func FuzzApply(f *testing.F) {
	for _, seed := range applySeeds(f) {
		f.Add(seed.kind, seed.data)
	}
	nc := fuzzConn(f)
	limits := DefaultLimits()
	limits.MaxHeldChunkBytes, limits.MaxHeldMessageBytes = 1<<20, 1<<20
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		cfgs := []tables.Config{
			testutil.TableConfig("u", selectors.Options{Kind: selectors.KindUniform}, selectors.Options{Kind: selectors.KindFifo}, 8, limiter.MinSize(1)),
			testutil.TableConfig("p", selectors.Options{Kind: selectors.KindPrioritized, Exponent: 1}, selectors.Options{Kind: selectors.KindMinHeap}, 8, limiter.MinSize(1)),
			// Its limiter holds every insert past the second: items wait in
			// its queue.
			tables.QueueConfig("q", 2),
		}
		s, err := New(nc, cfgs, WithPrefix("fuzz"), WithLogger(testutil.QuietLogger()), WithLimits(limits))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s.watcher = &watcher{ctx: ctx, wake: make(chan string, len(cfgs))}
		defer s.watcher.wg.Wait()
		defer cancel()
		subject := []string{s.subj.Insert(), s.subj.Mutate(), s.subj.Reset(), "fuzz.data.other"}[int(kind)%4]
		at := time.Unix(1_700_000_000, 0)
		var seq uint64
		apply := func(subject string, data []byte) {
			seq++
			m := &streamMsg{subject: subject, data: data, seq: seq, at: at.Add(time.Duration(seq) * time.Second)}
			if subject == s.subj.Insert() {
				m.insert, m.err = parseInsertBatch(data, &s.o.limits)
			}
			if err := s.apply(ctx, m); err != nil {
				t.Fatalf("apply of message %d: %v", seq, err)
			}
		}
		apply(s.subj.Insert(), liveBatch(t, 1, 1))
		apply(subject, data)
		u := s.tables["u"]
		staleBefore := u.Counters().StaleEvictions
		apply(s.subj.Insert(), liveBatch(t, 2, 2))
		// A mutation may have set a staleness bound the live item (of
		// policy version 0) falls below: then it is dropped, and counted.
		droppedStale := u.Counters().StaleEvictions > staleBefore
		for name, tb := range s.tables {
			info := tb.Info()
			if info.Size > info.Config.MaxSize {
				t.Fatalf("table %s holds %d items, over its max size %d", name, info.Size, info.Config.MaxSize)
			}
			// The progress published for a table never covers an item
			// that still waits in its queue.
			if q := s.pending[name]; q.len() > 0 {
				held, ok := s.progress.message(), false
				for _, h := range held.Held {
					if h.Table == name {
						ok = true
						for _, p := range q.items[q.head:] {
							if !p.dropped && p.streamSeq <= h.AppliedSequence {
								t.Fatalf("table %s: progress %d covers a waiting item of stream sequence %d", name, h.AppliedSequence, p.streamSeq)
							}
						}
					}
				}
				if !ok {
					t.Fatalf("table %s has %d waiting items and no progress of its own", name, q.len())
				}
			}
			if name == "u" && len(tb.Get(liveKey(2))) != 1 && !droppedStale {
				t.Fatalf("the live producer's message after the input did not land in table u")
			}
			if info.Size == 0 {
				continue
			}
			samples, err := tb.SampleFlexible(ctx, 4)
			if err != nil {
				t.Fatalf("sampling %s: %v", name, err)
			}
			weight, size := tb.Weight()
			packed, err := wire.AppendPackedSampleResponse(nil, wire.PackedLayout_PACKED_LAYOUT_COMPACT, wire.Code_CODE_OK, "", samples, wire.TableState{Size: size, Weight: weight})
			if err != nil {
				t.Fatalf("the service cannot answer a sample of %s: %v", name, err)
			}
			reply, err := wire.DecodeSampleResponse(packed)
			if err != nil || reply.Code != wire.Code_CODE_OK {
				t.Fatalf("a learner cannot decode a sample of %s: %v %v", name, reply.Code, err)
			}
		}
	})
}

// liveKey is the key of the live producer's item in message seq.
func liveKey(seq uint64) uint64 { return 1<<62 | seq }

// liveProducer is the well-behaved producer's id. Real ids are 128 random
// bits that only their producer knows (whoever knows one can pass for it,
// README "Exactly once, even against forged ids"), so the fuzzer must not
// be able to guess it either: a short id such as "live" is a few mutations
// of a seed's, and a message from it ahead of the live one's sequence
// rightly makes the service drop the live message as a resend.
const liveProducer = "7f3c9a51e08b42d6a1c5f0e9b3d87a24"

// liveBatch is message seq of a well-behaved producer: a float32 chunk and
// an item of it in each table.
func liveBatch(t testing.TB, seq uint64, v float32) []byte {
	ch, err := wire.EncodeChunk(1<<62|seq, []*wire.Tensor{wire.Float32s([]int64{2}, []float32{v, -v})}, wire.ChunkOptions{Codec: wire.Zstd})
	if err != nil {
		t.Fatal(err)
	}
	item := func(table string) *wire.Item {
		return &wire.Item{Key: liveKey(seq), Table: table, Priority: 1,
			Columns: []*wire.TrajectoryColumn{{Name: "obs", Squeeze: true, Slices: []*wire.ColumnSlice{{ChunkKey: ch.Key, Length: 1}}}}}
	}
	data, err := proto.Marshal(&wire.InsertBatch{ProducerId: liveProducer, Sequence: seq, WindowStart: seq, Window: 4,
		Chunks: []*wire.Chunk{ch}, Items: []*wire.Item{item("u"), item("p")}, ReleaseChunkKeys: []uint64{ch.Key}})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

type applySeed struct {
	kind uint8
	data []byte
}

// applySeeds are valid messages of every kind, and a few that exercise
// the limits: the fuzzer mutates them.
func applySeeds(f *testing.F) []applySeed {
	chunk := func(key uint64, steps ...*wire.Tensor) *wire.Chunk {
		c, err := wire.EncodeChunk(key, steps, wire.ChunkOptions{Codec: wire.Zstd, Delta: true})
		if err != nil {
			f.Fatal(err)
		}
		return c
	}
	ints := chunk(11, wire.Int64s([]int64{3}, []int64{1, 2, 3}), wire.Int64s([]int64{3}, []int64{4, 5, 6}))
	bytes := chunk(12, wire.Uint8s([]int64{2, 2}, []uint8{1, 2, 3, 4}), wire.Uint8s([]int64{2, 2}, []uint8{5, 6, 7, 8}))
	insert := &wire.InsertBatch{ProducerId: "seed", Sequence: 1, WindowStart: 1, Window: 8, Chunks: []*wire.Chunk{ints, bytes},
		Items: []*wire.Item{
			{Key: 1, Table: "u", Priority: 1, Columns: []*wire.TrajectoryColumn{
				{Name: "a", Slices: []*wire.ColumnSlice{{ChunkKey: 11, Offset: 0, Length: 2}}},
				{Name: "b", Slices: []*wire.ColumnSlice{{ChunkKey: 12, Offset: 1, Length: 1}, {ChunkKey: 12, Offset: 0, Length: 1}}},
			}},
			{Key: 2, Table: "p", Priority: math.MaxFloat64, Columns: []*wire.TrajectoryColumn{{Name: "a", Squeeze: true, Slices: []*wire.ColumnSlice{{ChunkKey: 11, Offset: 1, Length: 1}}}}},
			{Key: 3, Table: "p", Priority: 5e-324, Columns: []*wire.TrajectoryColumn{{Name: "a", Squeeze: true, Slices: []*wire.ColumnSlice{{ChunkKey: 11, Offset: 0, Length: 1}}}}},
		},
		ReleaseChunkKeys: []uint64{11}, EndOfStream: true,
	}
	// Four items for the queue table, whose limiter lets two in: two wait,
	// one of them a key already in it.
	queued := &wire.InsertBatch{ProducerId: "seedq", Sequence: 1, WindowStart: 1, Window: 8, Chunks: []*wire.Chunk{ints}}
	for _, key := range []uint64{21, 22, 23, 21} {
		queued.Items = append(queued.Items, &wire.Item{Key: key, Table: "q", Priority: 1, Columns: []*wire.TrajectoryColumn{{Name: "a", Squeeze: true, Slices: []*wire.ColumnSlice{{ChunkKey: 11, Offset: 2, Length: 1}}}}})
	}
	mutation := &wire.Mutation{Table: "u", Ops: []*wire.MutationOp{{Key: liveKey(1), Priority: 2}, {Key: liveKey(1), Delete: true}, {Key: 77, Priority: 1e308}}}
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	return []applySeed{
		{0, marshal(insert)},
		{0, marshal(queued)},
		{1, marshal(mutation)},
		{1, marshal(&wire.Mutation{Table: "q", Ops: []*wire.MutationOp{{Key: 21, Delete: true}, {Key: 23, Priority: 3}}})},
		{2, marshal(&wire.ResetRequest{Table: "q"})},
		{1, marshal(&wire.Mutation{Table: "p", Ops: []*wire.MutationOp{{Key: liveKey(1), Priority: math.MaxFloat64}}})},
		{2, marshal(&wire.ResetRequest{Table: "u"})},
		{2, marshal(&wire.ResetRequest{})},
		{0, []byte{0x1a, 0xff, 0xff, 0xff, 0xff, 0x0f}},
		{3, []byte("x")},
	}
}

// fuzzConn connects to an in-process NATS server for the fuzz target's
// process (each fuzz worker runs the target's setup anew): rejections are
// published on it.
func fuzzConn(f testing.TB) *nats.Conn {
	srv, err := embeddednats.Start(context.Background(), embeddednats.WithStoreDir(f.TempDir()), embeddednats.WithoutListener(), embeddednats.WithLogger(testutil.QuietLogger()))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	nc, err := srv.Connect()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(nc.Close)
	return nc
}
