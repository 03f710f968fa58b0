package service

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/internal/testutil"

	"github.com/reprise-rl/reprise/broker"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// Tests of what a hostile or broken client can send: each is a finding of
// the hardening review, kept as a regression test.

// publishBatch publishes m on the insert subject as a client with publish
// rights could, with a dedupe id when msgID is set.
func publishBatch(t *testing.T, d *deployment, m *wire.InsertBatch, msgID string) *jetstream.PubAck {
	t.Helper()
	msg := nats.NewMsg(d.svc.subj.Insert())
	msg.Data = mustMarshal(t, m)
	if msgID != "" {
		msg.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	ack, err := d.svc.js.PublishMsg(testutil.Context(t), msg)
	if err != nil {
		t.Fatal(err)
	}
	return ack
}

// oneStepItem is an item of table holding the one-step chunk key.
func oneStepItem(key uint64, table string, chunk uint64) *wire.Item {
	return &wire.Item{Key: key, Table: table, Priority: 1,
		Columns: []*wire.TrajectoryColumn{{Name: "id", Squeeze: true, Slices: []*wire.ColumnSlice{{ChunkKey: chunk, Length: 1}}}}}
}

func int64Chunk(t *testing.T, key uint64, v int64) *wire.Chunk {
	t.Helper()
	ch, err := wire.EncodeChunk(key, []*wire.Tensor{wire.Int64s(nil, []int64{v})}, wire.ChunkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// notices subscribes to a new inbox for rejections: messages that name it
// as their notice subject get their notices there.
func notices(t *testing.T, d *deployment) (string, <-chan *wire.Rejection) {
	t.Helper()
	out := make(chan *wire.Rejection, 1024)
	nc := d.connect()
	inbox := nc.NewInbox()
	sub, err := nc.Subscribe(inbox, func(m *nats.Msg) {
		var r wire.Rejection
		if proto.Unmarshal(m.Data, &r) == nil {
			out <- &r
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// The server must have the subscription before the service answers:
	// a notice published earlier reaches no one.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return inbox, out
}

func waitNotice(t *testing.T, ch <-chan *wire.Rejection, code wire.Code, text string) *wire.Rejection {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case r := <-ch:
			if r.Code == code && strings.Contains(r.Message, text) {
				return r
			}
		case <-deadline:
			t.Fatalf("no %v notice containing %q", code, text)
		}
	}
}

func tableSize(t *testing.T, c *broker.Client, table string) int64 {
	t.Helper()
	info, err := c.Info(testutil.Context(t), table)
	if err != nil {
		t.Fatal(err)
	}
	return info.Tables[0].Size
}

// TestForgedDedupeIDsFailFlush: messages stored under a producer's next
// dedupe ids make JetStream drop the producer's own as duplicates; the
// producer must report that, never return nil from Flush.
func TestForgedDedupeIDsFailFlush(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 1000)}, deployOptions{})
	ctx := testutil.Context(t)
	p := d.producer(broker.WithLinger(0), broker.WithBatch(1, 1<<20))
	for seq := uint64(1); seq <= 3; seq++ {
		publishBatch(t, d, &wire.InsertBatch{ProducerId: "forger", Sequence: seq, WindowStart: seq, Window: 4}, p.ID()+"-"+strconv.FormatUint(seq, 10))
	}
	// The failure surfaces from whichever call comes next, Flush at the
	// latest.
	var err error
	for i := int64(0); i < 6 && err == nil; i++ {
		if err = p.Append(ctx, step(i, 2)); err == nil {
			err = p.CreateItem(ctx, "t", 1, broker.LastStep("obs", "id"))
		}
	}
	if err == nil {
		err = p.Flush(ctx)
	}
	if !errors.Is(err, protocol.ErrRejected) || !errors.Is(err, broker.ErrNotStored) || !strings.Contains(err.Error(), "never sent") {
		t.Fatalf("producer calls after forged dedupe ids = %v, want ErrRejected and ErrNotStored naming a duplicate never sent", err)
	}
}

// TestSequenceOutsideWindowRejected: a forged sequence near 2^64 under a
// live producer's id is rejected instead of making the service wait on
// it, and the producer's later messages all apply.
func TestSequenceOutsideWindowRejected(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 1000)}, deployOptions{})
	p := d.producer(broker.WithLinger(0), broker.WithBatch(1, 1<<20))
	insertSteps(t, p, 0, 5, 2)
	rejected := d.svc.Rejected()
	for _, m := range []*wire.InsertBatch{
		{ProducerId: p.ID(), Sequence: 1<<64 - 2, WindowStart: 1<<64 - 2, Window: 1 << 20, Items: []*wire.Item{oneStepItem(999, "t", 1)}},
		{ProducerId: p.ID(), Sequence: 1<<64 - 2, WindowStart: 1, Window: 1024},
		{ProducerId: p.ID(), Sequence: 10, WindowStart: 11, Window: 8},
		{ProducerId: p.ID(), Sequence: 0, WindowStart: 0, Window: 8},
	} {
		publishBatch(t, d, m, "")
	}
	insertSteps(t, p, 5, 20, 2)
	if got := tableSize(t, d.client(), "t"); got != 20 {
		t.Fatalf("table holds %d items, want all 20 of the live producer", got)
	}
	if got := d.svc.Rejected() - rejected; got != 4 {
		t.Fatalf("%d messages rejected, want the 4 forged ones", got)
	}
}

// TestWindowStartClosesGap: a message whose window starts past a missing
// sequence tells the service the missing one will never come: the held
// messages apply at once, without waiting for the gap timeout.
func TestWindowStartClosesGap(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("q", 100)}, deployOptions{service: []Option{WithGapTimeout(time.Hour)}})
	batch := func(seq, ws uint64, id int64) *wire.InsertBatch {
		ch := int64Chunk(t, uint64(1000+id), id)
		return &wire.InsertBatch{ProducerId: "p", Sequence: seq, WindowStart: ws, Window: 16, Chunks: []*wire.Chunk{ch}, Items: []*wire.Item{oneStepItem(uint64(id), "q", ch.Key)}}
	}
	publishBatch(t, d, batch(1, 1, 1), "")
	publishBatch(t, d, batch(3, 2, 3), "") // 2 is in flight
	c := d.client()
	if got := drainQueue(t, c, "q", 1); got[0] != 1 {
		t.Fatalf("got %v, want 1", got)
	}
	// 2 was given up (settled without being stored); 4 says so.
	publishBatch(t, d, batch(4, 3, 4), "")
	if got := drainQueue(t, c, "q", 2); got[0] != 3 || got[1] != 4 {
		t.Fatalf("got %v, want [3 4] without waiting for the gap timeout", got)
	}
}

// TestItemLimits: an item with 40,000 columns (whose check was quadratic,
// stalling the apply loop for 50 s) and an item of 2,000 slices of a 1 MiB
// chunk (2 GB for a learner to decode) are rejected, with notices naming
// the limit; the message's other items land.
func TestItemLimits(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{maxPayload: 8 << 20})
	id := "0123456789abcdef0123456789abcdef"
	inbox, ch := notices(t, d)
	big, err := wire.EncodeChunk(7, []*wire.Tensor{wire.Uint8s([]int64{1 << 20}, make([]uint8, 1<<20))}, wire.ChunkOptions{Codec: wire.Zstd})
	if err != nil {
		t.Fatal(err)
	}
	small := int64Chunk(t, 8, 42)
	wide := &wire.Item{Key: 1, Table: "t", Priority: 1}
	for i := range 40_000 {
		wide.Columns = append(wide.Columns, &wire.TrajectoryColumn{Name: fmt.Sprint("c", i), Slices: []*wire.ColumnSlice{{ChunkKey: 8, Length: 1}}})
	}
	long := &wire.Item{Key: 2, Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{{Name: "x"}}}
	for range 2000 {
		long.Columns[0].Slices = append(long.Columns[0].Slices, &wire.ColumnSlice{ChunkKey: 7, Length: 1})
	}
	publishBatch(t, d, &wire.InsertBatch{ProducerId: id, Sequence: 1, WindowStart: 1, Window: 4, NoticeSubject: inbox, Chunks: []*wire.Chunk{big, small},
		Items: []*wire.Item{wide, long, oneStepItem(3, "t", 8)}}, "")
	waitNotice(t, ch, wire.Code_CODE_RESOURCE_EXHAUSTED, "max_columns_per_item")
	waitNotice(t, ch, wire.Code_CODE_RESOURCE_EXHAUSTED, "over the limit of")
	testutil.WaitUntil(t, "the valid item lands", func() bool { return tableSize(t, d.client(), "t") == 1 })
}

// TestCorruptChunkRejectedOnArrival: a chunk whose header is right but
// whose compressed data is not, and a zstd frame declaring another size
// than the chunk (a bomb), are rejected when they arrive, so no learner's
// batch ever fails on them.
func TestCorruptChunkRejectedOnArrival(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{})
	id := "corrupt0corrupt0corrupt0corrupt0"
	inbox, ch := notices(t, d)
	bad := int64Chunk(t, 5, 5)
	bad.Compression, bad.Data = wire.Compression_COMPRESSION_ZSTD, []byte{0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x08, 0x41, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef}
	bomb, err := wire.EncodeChunk(6, []*wire.Tensor{wire.Uint8s([]int64{64 << 10}, make([]uint8, 64<<10))}, wire.ChunkOptions{Codec: wire.Zstd})
	if err != nil {
		t.Fatal(err)
	}
	bomb.StepShape, bomb.RawSize = []int64{8}, 8 // the frame still says 64 KiB
	var items []*wire.Item
	var chunks []*wire.Chunk
	for i := range int64(20) {
		c := int64Chunk(t, uint64(100+i), i)
		chunks = append(chunks, c)
		items = append(items, oneStepItem(uint64(100+i), "t", c.Key))
	}
	items = append(items, oneStepItem(5, "t", 5), oneStepItem(6, "t", 6))
	publishBatch(t, d, &wire.InsertBatch{ProducerId: id, Sequence: 1, WindowStart: 1, Window: 4, NoticeSubject: inbox, Chunks: append(chunks, bad, bomb), Items: items}, "")
	waitNotice(t, ch, wire.Code_CODE_INVALID_ARGUMENT, "chunk 5")
	waitNotice(t, ch, wire.Code_CODE_INVALID_ARGUMENT, "declares")
	c := d.client()
	testutil.WaitUntil(t, "the good items land", func() bool { return tableSize(t, c, "t") == 20 })
	for range 50 {
		if _, err := c.Sample(testutil.Context(t), "t", 32); err != nil {
			t.Fatalf("a batch failed: %v", err)
		}
	}
}

// TestHeldChunksBounded: chunks sent without items are held for later
// items, but only up to the bound: past it the oldest go, and their
// producer is told.
func TestHeldChunksBounded(t *testing.T) {
	limits := DefaultLimits()
	limits.MaxHeldChunkBytes = 64 << 10
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{service: []Option{WithLimits(limits)}})
	id := "hoarder0hoarder0hoarder0hoarder0"
	inbox, ch := notices(t, d)
	for seq := uint64(1); seq <= 40; seq++ {
		noise := make([]uint8, 16<<10)
		rand.Read(noise)
		c, err := wire.EncodeChunk(seq, []*wire.Tensor{wire.Uint8s([]int64{16 << 10}, noise)}, wire.ChunkOptions{Codec: wire.Uncompressed})
		if err != nil {
			t.Fatal(err)
		}
		publishBatch(t, d, &wire.InsertBatch{ProducerId: id, Sequence: seq, WindowStart: seq, Window: 4, NoticeSubject: inbox, Chunks: []*wire.Chunk{c}}, "")
	}
	testutil.WaitUntil(t, "all 40 messages applied", func() bool { return d.svc.Applied() >= 40 })
	waitNotice(t, ch, wire.Code_CODE_RESOURCE_EXHAUSTED, "max_held_chunk_bytes")
	info, err := d.client().Info(testutil.Context(t), "")
	if err != nil {
		t.Fatal(err)
	}
	if info.ChunkBytes > limits.MaxHeldChunkBytes {
		t.Fatalf("the service holds %d bytes of chunks, over the %d-byte bound", info.ChunkBytes, limits.MaxHeldChunkBytes)
	}
}

// TestMaxProducersRefusesNew: at the bound on producer records a new
// producer is refused (and told), and the known ones are not forgotten.
func TestMaxProducersRefusesNew(t *testing.T) {
	limits := DefaultLimits()
	limits.MaxProducers = 2
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{service: []Option{WithLimits(limits)}})
	ctx := testutil.Context(t)
	var errs []error
	for i := range int64(3) {
		p := d.producer(broker.WithLinger(0))
		if err := p.Append(ctx, step(i, 2)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, broker.LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
		errs = append(errs, p.WaitApplied(ctx))
	}
	if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], protocol.ErrRejected) || !strings.Contains(errs[2].Error(), "max_producers") {
		t.Fatalf("WaitApplied of three producers = %v; want nil, nil and a rejection naming max_producers", errs)
	}
	if got := tableSize(t, d.client(), "t"); got != 2 {
		t.Fatalf("table holds %d items, want the first two producers' 2", got)
	}
}

// TestSampleSlotsShared: requests waiting on an empty table cannot take
// every request slot: learners of another table are still served.
func TestSampleSlotsShared(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("empty", 10), testutil.UniformTable("full", 10)}, deployOptions{service: []Option{WithMaxConcurrentSamples(16)}})
	ctx := testutil.Context(t)
	p := d.producer()
	if err := p.Append(ctx, step(1, 2)); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "full", 1, broker.LastStep("obs", "id")); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	c := d.client()
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	busy := make(chan struct{}, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Sample(wctx, "empty", 1); errors.Is(err, protocol.ErrResourceExhausted) {
				busy <- struct{}{}
			}
		}()
	}
	// Once some are refused as over their share, the rest hold their slots.
	<-busy
	if _, err := c.Sample(ctx, "full", 1); err != nil {
		t.Fatalf("sample of another table while one table's requests wait: %v", err)
	}
	cancel()
	wg.Wait()
}

// TestReplyBytesBounded: a request whose items could decode to more than
// the reply bound, with the records that describe them, is refused before
// anything is sampled.
func TestReplyBytesBounded(t *testing.T) {
	limits := DefaultLimits()
	limits.MaxReplyBytes = 1000
	bad := limits
	if err := bad.validate(); !errors.Is(err, protocol.ErrInvalidOption) || !strings.Contains(err.Error(), "below max item bytes") {
		t.Fatalf("a reply bound below the item bound: %v, want ErrInvalidOption: an item that large could never be sampled", err)
	}
	// Items of 10,000 bytes, and a dozen parts of at most 55 bytes: 10 fit.
	limits.MaxItemBytes, limits.MaxReplyBytes = 20_000, 110_000
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{service: []Option{WithLimits(limits)}})
	ctx := testutil.Context(t)
	p := d.producer()
	insertSteps(t, p, 0, 10, 2498) // 10,000 bytes a step
	c := d.client()
	if _, err := c.Sample(ctx, "t", 11); !errors.Is(err, protocol.ErrResourceExhausted) || !strings.Contains(err.Error(), "ask for at most 10") {
		t.Fatalf("sample of 11 = %v, want protocol.ErrResourceExhausted saying at most 10", err)
	}
	if _, err := c.Sample(ctx, "t", 10); err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if info.Tables[0].Samples != 10 {
		t.Fatalf("table counted %d samples, want the 10 served (the refused request took none)", info.Tables[0].Samples)
	}
}

// TestSilentNoOpsReport: a reset of an unknown table through the stream is
// a counted rejection; a delete on an unknown table is an error.
func TestSilentNoOpsReport(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, deployOptions{})
	ctx := testutil.Context(t)
	rejected := d.svc.Rejected()
	ack, err := d.svc.js.Publish(ctx, d.svc.subj.Reset(), mustMarshal(t, &wire.ResetRequest{Table: "nope"}))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "reset applied", func() bool { return d.svc.Applied() >= ack.Sequence })
	if d.svc.Rejected() != rejected+1 {
		t.Fatalf("reset of an unknown table: rejected %d → %d, want one more", rejected, d.svc.Rejected())
	}
	if err := d.client().Delete(ctx, "nope", 1); !errors.Is(err, protocol.ErrUnknownTable) {
		t.Fatalf("Delete on an unknown table = %v, want protocol.ErrUnknownTable", err)
	}
}

// TestStreamDeletedStopsService: a deleted stream ends the service with
// protocol.ErrStreamLost instead of leaving it answering from a log that is gone.
func TestStreamDeletedStopsService(t *testing.T) {
	url := testutil.StartEmbedded(t, 0)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	svc, err := New(nc, []tables.Config{testutil.UniformTable("t", 10)}, WithPrefix("gone"), WithLogger(testutil.QuietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := broker.NewClient(nc, broker.WithPrefix("gone"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testutil.WaitUntil(t, "the service answers", func() bool {
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := c.Info(short, "")
		return err == nil
	})
	if err := js.DeleteStream(ctx, svc.subj.Stream()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, protocol.ErrStreamLost) {
			t.Fatalf("Run = %v, want protocol.ErrStreamLost", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the service kept running on a deleted stream")
	}
}

// TestCheckpointBucketDeletedIsRecreated: the service notices its
// checkpoint bucket deleted, recreates it and writes a checkpoint at once,
// so a crash soon after still finds what the stream was trimmed below.
func TestCheckpointBucketDeletedIsRecreated(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{service: []Option{WithObjectStoreCheckpoints()}})
	ctx := testutil.Context(t)
	p := d.producer()
	insertSteps(t, p, 0, 10, 2)
	if _, err := d.client().Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	bucket := checkpointBucket(d.svc.subj)
	if err := d.svc.js.DeleteObjectStore(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "a checkpoint in the recreated bucket", func() bool {
		obs, err := d.svc.js.ObjectStore(ctx, bucket)
		if err != nil {
			return false
		}
		infos, err := obs.List(ctx)
		return err == nil && len(infos) > 0
	})
}

// TestNoticeSubjectUnderPrefixIgnored: a message may name where its
// rejections go, but the service never publishes them onto its own
// protocol.Subjects (a hostile producer's way to inject messages there). The
// service publishes its applied progress after the notices of the messages
// it covers, so once the progress covers the message, a notice would have
// arrived.
func TestNoticeSubjectUnderPrefixIgnored(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, deployOptions{})
	nc := d.connect()
	target := d.svc.subj.Prefix + ".notices.x"
	got := make(chan *nats.Msg, 64)
	for _, subject := range []string{target, d.svc.subj.Applied()} {
		if _, err := nc.ChanSubscribe(subject, got); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	c := int64Chunk(t, 1, 1)
	ack := publishBatch(t, d, &wire.InsertBatch{ProducerId: "prefixed0prefixed0prefixed0prefi", Sequence: 1, WindowStart: 1, Window: 1,
		NoticeSubject: target, Chunks: []*wire.Chunk{c}, Items: []*wire.Item{oneStepItem(1, "missing", 1)}}, "")
	deadline := time.After(time.Minute)
	for {
		select {
		case m := <-got:
			if m.Subject == target {
				t.Fatalf("the service published a notice on its own subject %s", target)
			}
			var prog wire.Progress
			if err := proto.Unmarshal(m.Data, &prog); err == nil && prog.AppliedSequence >= ack.Sequence {
				if d.svc.Rejected() != 1 {
					t.Fatalf("%d rejections counted, want the item's 1", d.svc.Rejected())
				}
				return
			}
		case <-deadline:
			t.Fatal("the service's progress never covered the message")
		}
	}
}

// TestRepliesNeverLandOnServiceSubjects: NATS checks a client's rights on
// the subject it sends to, not on the reply subject it names, and the
// service may publish where clients may not. A request whose reply subject
// is a stream subject, the progress subject, a request subject (of this
// prefix or of another shard's) or a $ subject is not acted on and gets no
// answer: an info reply published on the reset subject would be stored and
// decode as a reset of every table.
func TestRepliesNeverLandOnServiceSubjects(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100), tables.QueueConfig("q", 10), testutil.UniformTable("spare", 10)}, deployOptions{})
	p := d.producer()
	insertSteps(t, p, 0, 10, 2)
	insertStepsInto(t, p, "q", 10, 12, 2)
	c := d.client()
	subj := d.svc.subj
	forbidden := []string{subj.Reset(), subj.Insert(), subj.Applied(), subj.Info(), subj.Standby(), "shard1.data.reset", "shard1.applied", "shard1.api.sample",
		"$KV." + subj.LeaseBucket() + ".lease", "$O." + subj.CheckpointBucket() + ".M.x"}
	spy := d.connect()
	landed := make(chan *nats.Msg, 1024)
	for _, s := range forbidden {
		if s == subj.Applied() {
			continue // the service's progress goes there
		}
		if _, err := spy.ChanSubscribe(s, landed); err != nil {
			t.Fatal(err)
		}
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	nc := d.connect()
	ctx := testutil.Context(t)
	// Each endpoint serves its requests in order, and one refused is
	// refused before the next is served: the answer to a request sent
	// after the hostile ones on the same endpoint proves they were seen.
	probes := []struct {
		endpoint, hostile string
		req, probe        proto.Message
	}{
		{subj.Info(), "info", &wire.TableRequest{}, &wire.TableRequest{Table: "spare"}},
		{subj.Sample(), "sample", &wire.SampleRequest{Table: "q", NumSamples: 2}, &wire.SampleRequest{Table: "t", NumSamples: 1, Packed: true}},
		{subj.ResetAPI(), "reset", &wire.ResetRequest{}, &wire.ResetRequest{Table: "spare"}},
		{subj.Items(), "items", &wire.ItemsRequest{Table: "t", Limit: 10}, &wire.ItemsRequest{Table: "spare", Limit: 1}},
	}
	for _, pr := range probes {
		for _, reply := range forbidden {
			if err := nc.PublishRequest(pr.endpoint, reply, mustMarshal(t, pr.req)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := nc.RequestWithContext(ctx, pr.endpoint, mustMarshal(t, pr.probe)); err != nil {
			t.Fatalf("%s: the request sent after the hostile ones: %v", pr.hostile, err)
		}
	}
	// Anything that reached the stream was applied once a later insert
	// is.
	insertStepsInto(t, p, "spare", 20, 21, 2)
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	for len(landed) > 0 {
		// The requests themselves name a reply; what the service
		// publishes does not.
		if m := <-landed; m.Reply == "" {
			t.Fatalf("the service published %d bytes on %s, a reply subject a client named", len(m.Data), m.Subject)
		}
	}
	if got := tableSize(t, c, "t"); got != 10 {
		t.Errorf("table t holds %d items, want its 10", got)
	}
	if got := tableSize(t, c, "q"); got != 2 {
		t.Errorf("queue q holds %d items, want its 2: a sample whose answer could not go out took them", got)
	}
}

// TestAnswerSubjects: inboxes, the Go client's and nats-py's with a
// custom prefix included, are answered; a Reprise subject of any prefix,
// or a $ subject, is not.
func TestAnswerSubjects(t *testing.T) {
	for _, ok := range []string{"_INBOX.abc123", "_INBOX.abc123.ff", "_INBOX.alice.abc123.1a", "myorg.api.abc123", "myorg.data.abc123.7", "applied.x"} {
		if why := answerSubjectError(ok); why != "" {
			t.Errorf("%s refused: %s", ok, why)
		}
	}
	for _, bad := range []string{"$JS.API.INFO", "$KV.B.k", "p.data.insert", "a.b.data.reset", "x.data.mutate", "p.applied", "p.api.sample", "q.api.standby", "q.api.reset"} {
		if answerSubjectError(bad) == "" {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestARefusedMessageTellsItsProducer: a message refused whole, here for
// exceeding a limit of the service's that the producer's options do not,
// is reported to its producer, whose wait fails with ErrRejected rather
// than take the service's progress past it for its items applied; its
// later messages apply without waiting for it.
func TestARefusedMessageTellsItsProducer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits func(*Limits)
		opts   []broker.ProducerOption
		why    string
	}{
		{"items", func(l *Limits) { l.MaxItemsPerMessage = 4 }, []broker.ProducerOption{broker.WithBatch(8, 1<<20), broker.WithLinger(time.Hour)}, "max_items_per_message"},
		{"window", func(l *Limits) { l.MaxProducerWindow = 8 }, nil, "max_producer_window"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limits := DefaultLimits()
			tc.limits(&limits)
			d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{service: []Option{WithLimits(limits)}})
			ctx := testutil.Context(t)
			p := d.producer(tc.opts...)
			insert := func(from, to int64) {
				for i := from; i < to; i++ {
					if err := p.Append(ctx, step(i, 2)); err != nil {
						t.Fatal(err)
					}
					if err := p.CreateItem(ctx, "t", 1, broker.LastStep("obs", "id")); err != nil {
						t.Fatal(err)
					}
				}
			}
			insert(0, 8)
			err := p.WaitApplied(ctx)
			if !errors.Is(err, broker.ErrRejected) || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("WaitApplied = %v, want ErrRejected naming %s", err, tc.why)
			}
			if tc.name == "window" {
				return // every message of this producer is refused
			}
			insert(8, 11)
			if err := p.Flush(ctx); err != nil {
				t.Fatalf("Flush of the next message: %v", err)
			}
			if err := p.WaitApplied(ctx); err != nil {
				t.Fatalf("WaitApplied of the next message: %v", err)
			}
			if got := tableSize(t, d.client(), "t"); got != 3 {
				t.Fatalf("table holds %d items, want the next message's 3", got)
			}
		})
	}
}

// TestQueuedItemOfMissingChunksRefusedAtItsFirstSlice: an item that joins
// a table's queue of waiting items has its chunks found and held in one
// pass that stops at the first missing one. An item of
// limits.max_slices_per_item slices of distinct missing chunks used to
// have its keys deduped pairwise first, holding up every table's inserts;
// now it is refused, naming the first slice's chunk, and the message's
// item for another table lands.
func TestQueuedItemOfMissingChunksRefusedAtItsFirstSlice(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("held", 2), testutil.UniformTable("free", 100)}, deployOptions{})
	inbox, notes := notices(t, d)
	const producer = "queuedqueuedqueuedqueuedqueuedqu"
	var chunks []*wire.Chunk
	var items []*wire.Item
	for i := range uint64(3) {
		ch := int64Chunk(t, 100+i, int64(i))
		chunks = append(chunks, ch)
		items = append(items, oneStepItem(i+1, "held", ch.Key))
	}
	publishBatch(t, d, &wire.InsertBatch{ProducerId: producer, Sequence: 1, WindowStart: 1, Window: 8, NoticeSubject: inbox, Chunks: chunks, Items: items}, "")
	testutil.WaitUntil(t, "the third item waits", func() bool { return d.svc.pendingLen("held") == 1 })

	wide := &wire.Item{Key: 10, Table: "held", Priority: 1, Columns: []*wire.TrajectoryColumn{{Name: "x"}}}
	for i := range DefaultLimits().MaxSlicesPerItem {
		wide.Columns[0].Slices = append(wide.Columns[0].Slices, &wire.ColumnSlice{ChunkKey: uint64(1_000_000 + i), Length: 1})
	}
	free := int64Chunk(t, 999, 999)
	ack := publishBatch(t, d, &wire.InsertBatch{ProducerId: producer, Sequence: 2, WindowStart: 2, Window: 8, NoticeSubject: inbox,
		Chunks: []*wire.Chunk{free}, Items: []*wire.Item{wide, oneStepItem(11, "free", free.Key)}}, "")
	testutil.WaitUntil(t, "the message is applied", func() bool { return d.svc.Applied() >= ack.Sequence })
	var r *wire.Rejection
	deadline := time.After(time.Minute)
	for r == nil || r.ItemKey != wide.Key {
		select {
		case r = <-notes:
		case <-deadline:
			t.Fatal("the item of missing chunks was not refused")
		}
	}
	if want := wire.Code(codeOf(tables.ErrChunkMissing)); r.Code != want || !strings.Contains(r.Message, `chunk 1000000 (column "x", slice 0)`) {
		t.Errorf("refusal %v %q, want %v naming chunk 1000000 of column \"x\", slice 0", r.Code, r.Message, want)
	}
	if n := d.svc.pendingLen("held"); n != 1 {
		t.Errorf("held table's queue holds %d items, want the 1 that waited before", n)
	}
	if n := tableSize(t, d.client(), "free"); n != 1 {
		t.Errorf("free table holds %d items, want the message's other item", n)
	}
}

// TestItemsRequestSizedBeforeAnythingIsBuilt: an items request is sized
// from the items as the table holds them before any of its reply is
// built. Asking 10,000 times for an item of limits.max_slices_per_item
// slices is refused having allocated a fraction of the reply bound; it
// used to build generated messages of ten times the bytes they would take
// in the reply, over 900 MiB, before it compared their size with the
// bound. A request that fits is served whole.
func TestItemsRequestSizedBeforeAnythingIsBuilt(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{})
	n := DefaultLimits().MaxSlicesPerItem
	col := &wire.TrajectoryColumn{Name: "x"}
	for range n {
		col.Slices = append(col.Slices, &wire.ColumnSlice{ChunkKey: 7, Length: 1})
	}
	ch := int64Chunk(t, 7, 7)
	ack := publishBatch(t, d, &wire.InsertBatch{ProducerId: "itemsitemsitemsitemsitemsitemsit", Sequence: 1, WindowStart: 1, Window: 1,
		Chunks: []*wire.Chunk{ch}, Items: []*wire.Item{{Key: 1, Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{col}}}}, "")
	testutil.WaitUntil(t, "the item lands", func() bool { return d.svc.Applied() >= ack.Sequence })
	c := d.client()
	ctx := testutil.Context(t)
	got, err := c.Get(ctx, "t", 1, 1)
	if err != nil || len(got.Items) != 2 || len(got.Items[1].Trajectory) != 1 || len(got.Items[1].Trajectory[0].Slices) != n {
		t.Fatalf("two keys of the item: %v, %v; want it twice, with its %d slices", got, err, n)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = c.Get(ctx, "t", slices.Repeat([]uint64{1}, maxListItems)...)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, protocol.ErrResourceExhausted) || !strings.Contains(err.Error(), "ask for fewer") {
		t.Fatalf("%d keys of the item: %v, want ErrResourceExhausted", maxListItems, err)
	}
	if built := after.TotalAlloc - before.TotalAlloc; built > maxItemsReplyBytes/4 {
		t.Errorf("refusing it allocated %d MiB, against a reply bound of %d MiB", built>>20, maxItemsReplyBytes>>20)
	}
}

// sampleReplyBytes sends a packed sample request for n items of table and
// returns the bytes of every part of its reply, and its status when the
// reply is one message.
func sampleReplyBytes(t *testing.T, d *deployment, table string, n int32) (int, *wire.Status) {
	t.Helper()
	nc := d.connect()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	req := mustMarshal(t, &wire.SampleRequest{Table: table, NumSamples: n, Packed: true, TimeoutMs: 10_000})
	if err := nc.PublishRequest(d.svc.subj.Sample(), inbox, req); err != nil {
		t.Fatal(err)
	}
	total := 0
	for i := 0; ; i++ {
		m, err := sub.NextMsg(time.Minute)
		if err != nil {
			t.Fatalf("part %d of the reply: %v", i, err)
		}
		total += len(m.Data)
		parts := m.Header.Get(protocol.HeaderParts)
		if parts == "" {
			var resp wire.SampleResponse
			if err := proto.Unmarshal(m.Data, &resp); err != nil {
				t.Fatal(err)
			}
			return total, resp.Status
		}
		if np, _ := strconv.Atoi(parts); i == np-1 {
			return total, nil
		}
	}
}

// TestSampleReplyOfManySlicesWithinLimit: limits.max_reply_bytes bounds
// the records that describe a reply's items as well as the bytes their
// steps decode to. Items of max_slices_per_item one-step slices of one
// chunk decode to 16 KiB and took 200 KiB of records each; items of
// zero-byte steps decode to nothing, and no bound applied at all: a
// request made a reply 12 and 96 times the limit. Now such a request is
// refused, saying how many fit, and that many make a reply within it.
func TestSampleReplyOfManySlicesWithinLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		shape []int64
		data  []uint8
		n     int32
	}{
		{"one-byte steps", nil, []uint8{1}, 64},
		{"zero-byte steps", []int64{0}, nil, 512},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limits := DefaultLimits()
			limits.MaxItemBytes, limits.MaxReplyBytes = 1<<20, 1<<20
			d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{service: []Option{WithLimits(limits)}})
			ch, err := wire.EncodeChunk(7, []*wire.Tensor{wire.Uint8s(tc.shape, tc.data)}, wire.ChunkOptions{Codec: wire.Uncompressed})
			if err != nil {
				t.Fatal(err)
			}
			col := &wire.TrajectoryColumn{Name: "x"}
			for range limits.MaxSlicesPerItem {
				col.Slices = append(col.Slices, &wire.ColumnSlice{ChunkKey: 7, Length: 1})
			}
			ack := publishBatch(t, d, &wire.InsertBatch{ProducerId: "slicesslicesslicesslicesslicessl", Sequence: 1, WindowStart: 1, Window: 1,
				Chunks: []*wire.Chunk{ch}, Items: []*wire.Item{{Key: 1, Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{col}}}}, "")
			testutil.WaitUntil(t, "the item lands", func() bool { return d.svc.Applied() >= ack.Sequence })
			_, status := sampleReplyBytes(t, d, "t", tc.n)
			if status.GetCode() != wire.Code_CODE_RESOURCE_EXHAUSTED || !strings.Contains(status.GetMessage(), "limits.max_reply_bytes") {
				t.Fatalf("a sample of %d: %v, want %v naming limits.max_reply_bytes", tc.n, status, wire.Code_CODE_RESOURCE_EXHAUSTED)
			}
			_, most, ok := strings.Cut(status.GetMessage(), "ask for at most ")
			fit, err := strconv.Atoi(most)
			if !ok || err != nil || fit < 1 || fit >= int(tc.n) {
				t.Fatalf("refusal %q: want it to say how many fit, from 1 to %d", status.GetMessage(), tc.n-1)
			}
			got, status := sampleReplyBytes(t, d, "t", int32(fit))
			if status.GetCode() != wire.Code_CODE_OK {
				t.Fatalf("a sample of the %d that fit: %v", fit, status)
			}
			if int64(got) > limits.MaxReplyBytes {
				t.Errorf("a sample of %d made a reply of %d bytes, over limits.max_reply_bytes (%d)", fit, got, limits.MaxReplyBytes)
			}
		})
	}
}

// TestNonUTF8SenderLeavesCheckpointsAlone: an insert message whose producer
// id is not UTF-8 is refused, and checkpoints go on: it was taken, and
// every later checkpoint, the final one included, failed to encode the
// producer's record (a protobuf string), so the stream was never trimmed.
func TestNonUTF8SenderLeavesCheckpointsAlone(t *testing.T) {
	fc, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 1000)}, deployOptions{service: []Option{WithCheckpoints(fc)}})
	ctx := testutil.Context(t)
	// Producer "0000000\xf00000000000", sequence 1, window start 1, window 48.
	ack, err := d.svc.js.Publish(ctx, d.svc.subj.Insert(), []byte("\n\x120000000\xf00000000000\x10\x018\x01@0"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "the message is applied", func() bool { return d.svc.Applied() >= ack.Sequence })
	if d.svc.Rejected() != 1 {
		t.Fatalf("%d rejections, want the message's", d.svc.Rejected())
	}
	insertSteps(t, d.producer(), 0, 10, 2)
	if _, err := d.svc.Checkpoint(ctx); err != nil {
		t.Fatalf("a checkpoint after the message: %v", err)
	}
}

// TestMutationNoticeSubjects: a mutation names where its refusal goes, as
// an insert batch does; one naming a subject the service may not publish
// to is refused whole (nobody could be told), and a refusal reaches a
// literal one, with the mutation's stream sequence.
func TestMutationNoticeSubjects(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, deployOptions{})
	ctx := testutil.Context(t)
	c := d.client()
	publishBatch(t, d, &wire.InsertBatch{ProducerId: "mutnotice0mutnotice0mutnotice012", Sequence: 1, WindowStart: 1, Window: 1,
		Chunks: []*wire.Chunk{int64Chunk(t, 1, 1)}, Items: []*wire.Item{oneStepItem(5, "t", 1)}}, "")
	mutate := func(m *wire.Mutation) uint64 {
		t.Helper()
		ack, err := d.svc.js.Publish(ctx, d.svc.subj.Mutate(), mustMarshal(t, m))
		if err != nil {
			t.Fatal(err)
		}
		testutil.WaitUntil(t, "the mutation is applied", func() bool { return d.svc.Applied() >= ack.Sequence })
		return ack.Sequence
	}
	for i, subject := range []string{"a.*", "a..b", "$JS.API.x", "a b"} {
		mutate(&wire.Mutation{Table: "t", Ops: []*wire.MutationOp{{Key: 5, Delete: true}}, NoticeSubject: subject})
		if got := d.svc.Rejected(); got != int64(i+1) {
			t.Fatalf("notice subject %q: %d rejections counted, want %d", subject, got, i+1)
		}
		if n := tableSize(t, c, "t"); n != 1 {
			t.Fatalf("notice subject %q: the delete was applied (%d items left)", subject, n)
		}
	}
	inbox, ch := notices(t, d)
	seq := mutate(&wire.Mutation{Table: "gone", Ops: []*wire.MutationOp{{Key: 5, Delete: true}}, NoticeSubject: inbox})
	if r := waitNotice(t, ch, wire.Code_CODE_NOT_FOUND, `unknown table "gone"`); r.Sequence != seq || r.Table != "gone" || r.Producer != "" {
		t.Fatalf("refusal %v, want sequence %d, table gone, no producer", r, seq)
	}
	mutate(&wire.Mutation{Table: "t", Ops: []*wire.MutationOp{{Key: 5, Delete: true}}, NoticeSubject: inbox})
	if n := tableSize(t, c, "t"); n != 0 {
		t.Fatalf("a mutation with an inbox for its notices was not applied (%d items left)", n)
	}
}
