package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/internal/syncbuf"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// answerer is the service that answers an info request now ("" if none).
func answerer(t *testing.T, nc *nats.Conn, d *deployment) string {
	t.Helper()
	msg, err := nc.Request(d.svc.subj.Info(), mustMarshal(t, &wire.TableRequest{}), time.Second)
	if err != nil || msg.Header.Get(micro.ErrorCodeHeader) != "" {
		return ""
	}
	return msg.Header.Get(HeaderService)
}

// Two services on one prefix: one answers, the other follows the stream
// and answers once the first stops, with every item and checkpoints of a
// newer epoch.
func TestStandbyTakesOver(t *testing.T) {
	cfgs := []tables.Config{testutil.UniformTable("t", 1000)}
	opts := []Option{WithStandby(time.Second), WithObjectStoreCheckpoints()}
	d := deploy(t, cfgs, deployOptions{service: opts})
	a := d.svc
	b, _ := d.startService(cfgs, opts...)
	nc := d.connect()
	if got := answerer(t, nc, d); got != a.id {
		t.Fatalf("answered by %q, want the first service %q", got, a.id)
	}
	ctx := testutil.Context(t)
	p := d.producer()
	for i := range int64(20) {
		if err := p.Append(ctx, step(i, 1)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, broker.LastStep("id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The checkpoint trims the stream: a standby behind it would stop
	// (streamGap).
	testutil.WaitUntil(t, "the standby applied the stream", func() bool { return b.Applied() >= a.Applied() })
	c := d.client()
	cpA, err := c.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if got := answerer(t, nc, d); got != a.id {
			t.Fatalf("answered by %q while the first service is active", got)
		}
	}

	start := time.Now()
	d.stop() // releases the lease
	testutil.WaitUntil(t, "the standby answers", func() bool { return answerer(t, nc, d) == b.id })
	t.Logf("standby answered %v after the active service's graceful stop", time.Since(start).Round(time.Millisecond))
	info, err := c.Info(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if size := info.Tables[0].Size; size != 20 {
		t.Fatalf("standby holds %d items, want 20", size)
	}
	cpB, err := c.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cpB.Name <= cpA.Name || !strings.HasPrefix(cpB.Name, checkpointPrefix+"e") {
		t.Fatalf("checkpoint %q after the take-over does not sort after %q", cpB.Name, cpA.Name)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.Sample(sctx, "t", 4); err != nil {
		t.Fatalf("sampling from the standby: %v", err)
	}
}

// A service whose lease lapsed without its lease loop noticing yet (a
// pause) refuses every request with CodeUnavailable, publishes no progress
// and writes no checkpoint; once the lease counts as held again it answers,
// publishes and writes.
func TestStandbyFencesLapsedLease(t *testing.T) {
	cfgs := []tables.Config{testutil.UniformTable("t", 1000)}
	// A long TTL keeps the lease loop from renewing during the test.
	d := deploy(t, cfgs, deployOptions{service: []Option{WithStandby(time.Minute), WithObjectStoreCheckpoints()}})
	a := d.svc
	nc := d.connect()
	progress := make(chan uint64, 1024)
	sub, err := nc.Subscribe(a.subj.Applied(), func(m *nats.Msg) {
		var p wire.Progress
		if proto.Unmarshal(m.Data, &p) == nil {
			progress <- p.AppliedSequence
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	a.lease.until.Store(1) // lapsed, by its own clock
	ctx := testutil.Context(t)
	seq := publishRaw(t, d, "p", 1, rawItem{id: 1, table: "t"})
	testutil.WaitUntil(t, "the insert is applied", func() bool { return a.Applied() >= seq })
	c := d.client()
	for _, call := range []struct {
		name string
		do   func() error
	}{
		{"info", func() error { _, err := c.Info(ctx, "t"); return err }},
		{"sample", func() error { _, err := c.Sample(ctx, "t", 1); return err }},
		{"checkpoint", func() error { _, err := c.Checkpoint(ctx); return err }},
	} {
		var st *broker.StatusError
		if err := call.do(); !errors.As(err, &st) || st.Code != broker.CodeUnavailable || !strings.Contains(st.Message, a.id) {
			t.Fatalf("%s from a service whose lease lapsed: %v, want a refusal with CodeUnavailable naming %s", call.name, err, a.id)
		}
	}
	if _, err := a.Checkpoint(ctx); !errors.Is(err, errNotActive) {
		t.Fatalf("checkpoint with a lapsed lease: %v, want errNotActive", err)
	}

	// A marker from the service's own connection: whatever it published
	// while the lease was lapsed arrives before it.
	const marker = math.MaxUint64
	if err := a.nc.Publish(a.subj.Applied(), mustMarshal(t, &wire.Progress{AppliedSequence: marker})); err != nil {
		t.Fatal(err)
	}
	for got := range progress {
		if got == marker {
			break
		}
		if got >= seq {
			t.Fatalf("progress %d published while the lease was lapsed", got)
		}
	}
	a.lease.until.Store(int64(time.Since(a.lease.base) + time.Hour))
	for got := range progress {
		if got >= seq {
			break
		}
	}
	if answerer(t, nc, d) != a.id {
		t.Fatal("no answer once the lease is held again")
	}
	if _, err := a.Checkpoint(ctx); err != nil {
		t.Fatalf("checkpoint once the lease is held again: %v", err)
	}
}

// A service whose lease lapses while it serves a request withholds its
// answer: it sends one refusal that says the request may have taken effect,
// neither its reply nor the rest of a reply in parts.
func TestStandbyLapseWhileServing(t *testing.T) {
	cfg := testutil.TableConfig("t", selectors.Options{Kind: selectors.KindUniform}, selectors.Options{Kind: selectors.KindFifo}, 100, limiter.MinSize(1))
	// Each item is sampled at most once: 8 distinct items of 40 kB make a
	// reply of 5 parts of at most 64 KiB.
	cfg.MaxTimesSampled = 1
	d := deploy(t, []tables.Config{cfg}, deployOptions{maxPayload: 64 << 10, service: []Option{WithStandby(time.Minute)}})
	a := d.svc
	if len(a.o.replyConns) != 0 {
		t.Fatal("the service replies over connections of its own; the marker below needs its replies on one")
	}
	nc := d.connect()
	inbox := nats.NewInbox()
	got := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(inbox+".*", got)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	req := &wire.SampleRequest{Table: "t", NumSamples: 8, Packed: true, Layout: wire.PackedLayout_PACKED_LAYOUT_UNIFORM, TimeoutMs: 60_000}
	if err := nc.PublishRequest(a.subj.Sample(), inbox+".sample", mustMarshal(t, req)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "the sample waits for the rate limiter", func() bool {
		a.slots.mu.Lock()
		defer a.slots.mu.Unlock()
		return a.slots.inUse == 1
	})
	a.lease.until.Store(1) // lapsed, by its own clock
	// Held again at the end, so that the producer's close sees its items
	// applied.
	defer func() { a.lease.until.Store(int64(time.Since(a.lease.base) + time.Hour)) }()

	// A standby still applies the stream, which lets the sample draw.
	ctx := testutil.Context(t)
	p := d.producer(broker.WithReturnOnStore(), broker.WithCompression(wire.Uncompressed))
	for i := range int64(8) {
		if err := p.Append(ctx, broker.Step{"obs": broker.Float32s([]int64{10_000}, testutil.Obs(i, 10_000))}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, broker.LastStep("obs")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	next := func() *nats.Msg {
		t.Helper()
		select {
		case m := <-got:
			return m
		case <-ctx.Done():
			t.Fatal("no reply")
			return nil
		}
	}
	first := next()
	// Whatever the service sent after the first reply comes before the
	// refusal of a request sent now, on the same connection.
	if err := nc.PublishRequest(a.subj.Info(), inbox+".marker", mustMarshal(t, &wire.TableRequest{})); err != nil {
		t.Fatal(err)
	}
	replies := []*nats.Msg{first}
	for m := next(); m.Subject != inbox+".marker"; m = next() {
		replies = append(replies, m)
	}
	if len(replies) != 1 || first.Subject != inbox+".sample" {
		t.Fatalf("%d messages before the marker's reply, want the sample's refusal alone", len(replies))
	}
	var resp wire.SampleResponse
	if err := proto.Unmarshal(first.Data, &resp); err != nil {
		t.Fatal(err)
	}
	msg := resp.GetStatus().GetMessage()
	if resp.GetStatus().GetCode() != wire.Code_CODE_UNAVAILABLE || first.Header.Get(HeaderService) != a.id ||
		first.Header.Get(protocol.HeaderParts) != "" || !strings.Contains(msg, "withheld its answer") || strings.Contains(msg, "try again") {
		t.Fatalf("sample answered %v %q (headers %v), want one refusal by %s that withholds the answer", resp.GetStatus().GetCode(), msg, first.Header, a.id)
	}
}

// TestStandbyBehindTrimDoesNotServeWithoutIt: a standby whose rate limiter
// held its inserts (no learner samples a standby) falls behind, and the
// active service checkpoints, trims the stream past it and stops. The
// standby must not serve without what only the checkpoint holds: it stops
// (ErrStreamLost) and, restarted, recovers every acknowledged item. It used
// to take over, skip the trimmed messages with a log line, and serve 760
// of 2000 items; its checkpoints then trimmed the one that held the rest.
func TestStandbyBehindTrimDoesNotServeWithoutIt(t *testing.T) {
	bt := standbyBehindTrim(t, "", nil)
	d, b, c := bt.d, bt.b, bt.c
	ctx := testutil.Context(t)
	size := func() int64 {
		info, err := c.Info(ctx, "q")
		if err != nil {
			return -1
		}
		return info.Tables[0].Size
	}
	var stopped error
	testutil.WaitUntil(t, "the standby stops, or serves every item", func() bool {
		select {
		case <-bt.exited:
			stopped = bt.err
			return true
		default:
			return answerer(t, bt.nc, d) == b.id && size() == behindTrimItems
		}
	})
	if stopped == nil {
		return // its reader had read past the trim before it: nothing was missing
	}
	if !errors.Is(stopped, protocol.ErrStreamLost) {
		t.Fatalf("the standby stopped with %v, want ErrStreamLost", stopped)
	}
	t.Logf("the standby stopped: %v", stopped)
	d.startService(bt.cfgs, bt.opts...)
	testutil.WaitUntil(t, "the restarted service holds every item", func() bool { return size() == behindTrimItems })
}

// TestStandbyBehindTrimThatCannotCheckDoesNotServe: as the test above, but
// the standby may not read the stream's state (on a cluster, a stream
// electing its leader answers no one, and that is when active services
// lose their lease). It took the failed read for "not behind" and served;
// a checkpoint it wrote then became the newest, without the trimmed
// messages, and they were lost for good. It must give the lease up.
func TestStandbyBehindTrimThatCannotCheckDoesNotServe(t *testing.T) {
	url := testutil.StartEmbedded(t, 0,
		embeddednats.WithUser("a", "pa", embeddednats.Permissions{}),
		embeddednats.WithUser("b", "pb", embeddednats.Permissions{Publish: embeddednats.SubjectPermissions{Deny: []string{"$JS.API.STREAM.INFO.REPRISE_TEST"}}}))
	var logB syncbuf.Buffer
	bt := standbyBehindTrim(t, url, slog.New(slog.NewTextHandler(&logB, nil)))
	testutil.WaitUntil(t, "the standby gives the lease up, or stops", func() bool {
		if got := answerer(t, bt.nc, bt.d); got == bt.b.id {
			t.Fatal("the standby serves, unable to tell whether it is behind the trim")
		}
		select {
		case <-bt.exited:
			if !errors.Is(bt.err, protocol.ErrStreamLost) {
				t.Fatalf("the standby stopped with %v, want ErrStreamLost", bt.err)
			}
			return true
		default:
			return strings.Contains(logB.String(), "giving the lease up")
		}
	})
}

// behindTrimItems is what standbyBehindTrim's producer inserts.
const behindTrimItems = 2000

// behindTrim is an active service that trimmed the stream past a standby
// that fell behind, and then stopped.
type behindTrim struct {
	d      *deployment
	b      *Service
	exited chan struct{} // closed once b's Run returned err
	err    error
	c      *broker.Client
	nc     *nats.Conn
	cfgs   []tables.Config
	opts   []Option
}

// standbyBehindTrim starts an active service and a standby whose rate
// limiter holds its inserts (a standby sees no samples), on the server at
// url (an embedded one if empty; users a and b, the standby's, with
// passwords pa and pb, if not), inserts behindTrimItems items, has the
// active one checkpoint twice, trimming the stream past the standby, and
// stops it. It skips the test if the standby did not fall behind.
func standbyBehindTrim(t *testing.T, url string, logB *slog.Logger) *behindTrim {
	t.Helper()
	q := testutil.TableConfig("q", selectors.Options{Kind: selectors.KindUniform}, selectors.Options{Kind: selectors.KindFifo}, 10000, limiter.Queue(8))
	bt := &behindTrim{cfgs: []tables.Config{q}}
	limits := DefaultLimits()
	limits.MaxPendingItems = 4
	bt.opts = []Option{WithStandby(3 * time.Second), WithObjectStoreCheckpoints(), WithPullBytes(16 << 10), WithLimits(limits)}
	var ncB *nats.Conn
	if url == "" {
		bt.d = deploy(t, bt.cfgs, deployOptions{service: bt.opts})
		ncB = bt.d.connect()
	} else {
		bt.d = deploy(t, bt.cfgs, deployOptions{url: strings.Replace(url, "nats://", "nats://a:pa@", 1), service: bt.opts})
		var err error
		if ncB, err = nats.Connect(strings.Replace(url, "nats://", "nats://b:pb@", 1)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ncB.Close)
	}
	if logB == nil {
		logB = testutil.QuietLogger()
	}
	d := bt.d
	a := d.svc
	b, err := New(ncB, bt.cfgs, append([]Option{WithPrefix(d.prefix), WithLogger(logB)}, bt.opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	bctx, stopB := context.WithCancel(context.Background())
	bt.b, bt.exited = b, make(chan struct{})
	go func() {
		defer close(bt.exited)
		bt.err = b.Run(bctx)
	}()
	t.Cleanup(func() {
		stopB()
		select {
		case <-bt.exited:
		case <-time.After(30 * time.Second):
			t.Error("the standby did not stop within 30 s")
		}
	})
	bt.nc = d.connect()
	testutil.WaitUntil(t, "the first service answers", func() bool { return answerer(t, bt.nc, d) == a.id })

	ctx := testutil.Context(t)
	bt.c = d.client()
	learning, stopLearner := context.WithCancel(ctx)
	learner := make(chan struct{})
	go func() { // samples the active service, so that its queue moves
		defer close(learner)
		for learning.Err() == nil {
			sctx, cancel := context.WithTimeout(learning, 300*time.Millisecond)
			_, _ = bt.c.Sample(sctx, "q", 8, broker.Flexible())
			cancel()
		}
	}()
	p := d.producer()
	for i := range int64(behindTrimItems) {
		if err := p.Append(ctx, step(i, 64)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "q", 1, broker.LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
		if i%10 == 9 {
			if err := p.EndEpisode(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	stopLearner()
	<-learner
	if b.Applied() >= a.Applied()/2 {
		t.Skipf("the standby did not fall behind (applied %d of %d): nothing to check", b.Applied(), a.Applied())
	}
	for range 2 { // the second trims the stream past the standby
		if _, err := bt.c.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d.stop()
	return bt
}

// checkpointed deploys a service with opts and one uniform table, "t"
// (cfgs), inserts 10 items and checkpoints them.
func checkpointed(t *testing.T, opts ...Option) (d *deployment, cfgs []tables.Config, c *broker.Client, p *broker.Producer) {
	t.Helper()
	cfgs = []tables.Config{testutil.UniformTable("t", 1000)}
	d = deploy(t, cfgs, deployOptions{service: opts})
	c, p = d.client(), d.producer()
	fill(t, p, 0, 10, "t")
	if _, err := c.Checkpoint(testutil.Context(t)); err != nil {
		t.Fatal(err)
	}
	return d, cfgs, c, p
}

// TestStandbyTrimmedWhileStartingStops: while a standby starts (on a
// cluster it can wait seconds for the lease bucket), the active service
// checkpoints and trims the stream past the checkpoint the standby
// recovered from. The standby must stop (ErrStreamLost), to be restarted
// from the newer checkpoint, rather than read on from the first message
// left: it used to, since a gap before the reader's first message went
// unreported, and then took over without what the newer checkpoint held.
func TestStandbyTrimmedWhileStartingStops(t *testing.T) {
	opts := []Option{WithStandby(time.Second), WithObjectStoreCheckpoints()}
	d, cfgs, c, p := checkpointed(t, opts...)
	ctx := testutil.Context(t)
	recovered := make(chan RecoveryResult, 1)
	trimmed := make(chan struct{})
	hold := WithRecoveryReport(func(r RecoveryResult) {
		recovered <- r
		<-trimmed
	})
	b, err := New(d.connect(), cfgs, append([]Option{WithPrefix(d.prefix), WithLogger(testutil.QuietLogger()), hold}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	bctx, stopB := context.WithCancel(context.Background())
	defer stopB()
	bDone := make(chan error, 1)
	go func() { bDone <- b.Run(bctx) }()
	var res RecoveryResult
	select {
	case res = <-recovered:
	case <-time.After(time.Minute):
		t.Fatal("the standby did not recover within a minute")
	}

	// The stream is trimmed below the older of the two newest checkpoints.
	for i := range int64(3) {
		fill(t, p, 10+10*i, 10, "t")
		if _, err := c.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
	}
	info, err := d.svc.stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.FirstSeq <= res.Applied+1 {
		t.Fatalf("the stream holds messages from %d on, the standby needs them from %d: not trimmed past it", info.State.FirstSeq, res.Applied+1)
	}
	close(trimmed)
	select {
	case err := <-bDone:
		if !errors.Is(err, protocol.ErrStreamLost) {
			t.Fatalf("the standby stopped with %v, want ErrStreamLost", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the standby runs on, from stream message %d, without messages %d to %d that a checkpoint holds", info.State.FirstSeq, res.Applied+1, info.State.FirstSeq-1)
	}
}

// TestStandbyStartsPastMessagesNoCheckpointHolds: every service of a
// prefix stopped without a final checkpoint (kill -9), and the stream lost
// what came after the newest checkpoint (its limits, or a purge) before
// one started again. No restart can bring those messages back, so a
// standby starts without them, as a service without --standby does; it
// used to stop with ErrStreamLost at every start, and nobody served.
func TestStandbyStartsPastMessagesNoCheckpointHolds(t *testing.T) {
	opts := []Option{WithStandby(time.Second), WithObjectStoreCheckpoints(), WithoutFinalCheckpoint()}
	d, cfgs, c, p := checkpointed(t, opts...)
	ctx := testutil.Context(t)
	fill(t, p, 10, 10, "t")
	d.stop()
	if err := d.svc.stream.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	d.startService(cfgs, opts...) // fails the test if Run returns
	testutil.WaitUntil(t, "the standby serves the checkpoint's items", func() bool {
		info, err := c.Info(ctx, "t")
		return err == nil && info.Tables[0].Size == 10
	})
}

// TestGapHeldOnlyByAnOlderEpochGoesOn: a gap in the stream stops the
// service only where the checkpoint a restart would load, the newest,
// holds the missing messages. An older epoch's checkpoint may reach
// further (a former active service's, written late); a restart would not
// load it, and would stop at the same gap again, for good.
func TestGapHeldOnlyByAnOlderEpochGoesOn(t *testing.T) {
	dir := t.TempDir()
	fc, err := NewFileCheckpoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := deploy(t, checkpointTables(1000), deployOptions{service: []Option{WithCheckpoints(fc), WithoutFinalCheckpoint()}})
	for _, name := range []string{checkpointName(1, 50), checkpointName(2, 20)} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.svc.streamGap(t.Context(), 30, 40); err != nil || d.svc.missedTrim.Load() {
		t.Fatalf("a gap only an older epoch's checkpoint holds: %v, missed a trim %v; want the service to go on", err, d.svc.missedTrim.Load())
	}
	if err := d.svc.streamGap(t.Context(), 10, 40); !errors.Is(err, protocol.ErrStreamLost) || !strings.Contains(err.Error(), checkpointName(2, 20)) {
		t.Fatalf("a gap the newest checkpoint holds: %v; want ErrStreamLost naming it", err)
	}
}

// TestFinalCheckpointOutlastsTheLease: an active service stopped gracefully
// writes its final checkpoint under its lease, which nothing renewed once
// the active role's work stopped: copying large tables took longer than
// what was left of it (here, 100,000 items against a TTL of 150 ms; with
// the default 3 s, a few million items), the write found the lease lapsed,
// and Run failed ("not the active service") with nobody else about.
func TestFinalCheckpointOutlastsTheLease(t *testing.T) {
	const n = 100_000
	cfgs := []tables.Config{testutil.UniformTable("t", n)}
	d := deploy(t, cfgs, deployOptions{service: []Option{WithStandby(150 * time.Millisecond), WithObjectStoreCheckpoints()}})
	fill(t, d.producer(), 0, n, "t")
	var final RecoveryResult
	d.stop() // fails the test if Run returns an error
	d.startService(cfgs, WithObjectStoreCheckpoints(), WithRecoveryReport(func(r RecoveryResult) { final = r }))
	if final.Items != n {
		t.Fatalf("recovered %+v after the graceful stop, want the final checkpoint's %d items", final, n)
	}
}

// TestLeaseOutlastsStoppingTheActiveRole: stopping the active role's work
// waits for a periodic checkpoint being written, which a slow store can
// make last longer than the lease; the lease was renewed only from the
// final checkpoint on, found lapsed by then, and Run failed ("not the
// active service") with nobody else about. (CI met it with a TTL of
// 150 ms and 100,000 items under the race detector.)
func TestLeaseOutlastsStoppingTheActiveRole(t *testing.T) {
	const ttl = 150 * time.Millisecond
	fc, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := &slowSaves{FileCheckpoints: fc, delay: 3 * ttl, saving: make(chan struct{}, 1)}
	cfgs := []tables.Config{testutil.UniformTable("t", 100)}
	d := deploy(t, cfgs, deployOptions{service: []Option{WithStandby(ttl), WithCheckpoints(store), WithCheckpointEvery(10 * time.Millisecond)}})
	p := d.producer()
	fill(t, p, 0, 10, "t")
	<-store.saving // a periodic checkpoint of 10 items is being written
	fill(t, p, 10, 10, "t")
	d.stop() // fails the test if Run returns an error
	names, err := fc.List(testutil.Context(t))
	if err != nil || len(names) == 0 || !strings.HasSuffix(names[len(names)-1], fmt.Sprintf("%020d", d.svc.Applied())) {
		t.Fatalf("checkpoints %v (%v) after the graceful stop, want the final one, at %d", names, err, d.svc.Applied())
	}
}

// TestStopHandsOverToAStandby: an active service stopped gracefully with a
// standby beside it releases the lease without writing a final checkpoint,
// which would hold every producer's progress for as long as copying the
// tables takes; the standby takes over with every item, and the stream,
// untrimmed, still holds what the last checkpoint does not. The last
// service to stop, with no standby left, writes its final checkpoint.
func TestStopHandsOverToAStandby(t *testing.T) {
	fc, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := []tables.Config{testutil.UniformTable("t", 100)}
	// The default TTL: one short enough to lapse under load would let the
	// standby lose the lease it just took.
	opts := []Option{WithStandby(DefaultLeaseTTL), WithCheckpoints(fc), WithCheckpointEvery(time.Hour)}
	d := deploy(t, cfgs, deployOptions{service: opts})
	a := d.svc
	b, stopB := d.startService(cfgs, opts...)
	fill(t, d.producer(), 0, 20, "t")
	testutil.WaitUntil(t, "the standby applied the stream", func() bool { return b.Applied() >= a.Applied() })
	d.stop() // returns once the standby serves
	if !b.mayAct() {
		t.Fatal("the stopped service returned before the standby served")
	}
	names, err := fc.List(testutil.Context(t))
	if err != nil || len(names) != 0 {
		t.Fatalf("checkpoints %v (%v) after a stop beside a standby, want none", names, err)
	}
	if size := b.tables["t"].Size(); size != 20 {
		t.Fatalf("the standby holds %d items, want 20", size)
	}
	stopB()
	var final RecoveryResult
	d.startService(cfgs, WithCheckpoints(fc), WithRecoveryReport(func(r RecoveryResult) { final = r }))
	if final.Items != 20 {
		t.Fatalf("recovered %+v after the last service's stop, want its final checkpoint's 20 items", final)
	}
}

// TestStopWritesTheFinalCheckpointWhenNoStandbyTakesOver: a standby that
// answers the stopping service but never serves (it was stopped too, or
// cannot take over) leaves the newest state to the final checkpoint after
// all: the stopping service takes the lease back and writes it, rather
// than leave what it applied since the last checkpoint only in the
// stream, whose limits may drop it before any service runs again. Not
// where another service wrote a checkpoint of a newer epoch meanwhile:
// recovery ranks that one higher, and a trim by the older epoch would not
// see what it needs.
func TestStopWritesTheFinalCheckpointWhenNoStandbyTakesOver(t *testing.T) {
	for _, tc := range []struct {
		name       string
		takesLease bool // the ghost takes the lease and lets it lapse
		newerEpoch bool // and writes a checkpoint of a newer epoch
	}{
		{name: "never takes the lease"},
		{name: "takes the lease and never serves", takesLease: true},
		{name: "was active meanwhile", takesLease: true, newerEpoch: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc, err := NewFileCheckpoints(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			cfgs := []tables.Config{testutil.UniformTable("t", 100)}
			d := deploy(t, cfgs, deployOptions{service: []Option{WithStandby(time.Second), WithCheckpoints(fc), WithCheckpointEvery(time.Hour)}})
			a := d.svc
			ctx := testutil.Context(t)
			ghostCheckpoint := checkpointName(a.epoch.Load()+1, 1)
			var answered atomic.Int32
			ghosted := make(chan error, 1)
			nc := d.connect()
			ghost, err := nc.Subscribe(a.subj.Standby(), func(m *nats.Msg) {
				if answered.Add(1) > 1 {
					return
				}
				m.Respond([]byte(`{"service":"ghost","applied_sequence":1}`))
				if !tc.takesLease {
					ghosted <- nil
					return
				}
				go func() {
					ghosted <- func() error {
						// Once the stopping service releases the lease.
						for {
							if _, err := a.lease.kv.Create(ctx, leaseKey, []byte("ghost")); err == nil {
								break
							}
							select {
							case <-ctx.Done():
								return ctx.Err()
							case <-time.After(10 * time.Millisecond):
							}
						}
						if tc.newerEpoch {
							return fc.Save(ctx, ghostCheckpoint, strings.NewReader("the ghost's tables"))
						}
						return nil
					}()
				}()
			})
			if err != nil {
				t.Fatal(err)
			}
			defer ghost.Unsubscribe()
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			fill(t, d.producer(), 0, 10, "t")
			d.stop() // fails the test if Run returns an error
			select {
			case err := <-ghosted:
				if err != nil {
					t.Fatalf("the ghost: %v", err)
				}
			case <-ctx.Done():
				t.Fatal("the stopping service never asked for a standby")
			}
			names, err := fc.List(ctx)
			want := []string{checkpointName(a.epoch.Load(), a.Applied())}
			if tc.newerEpoch {
				want = []string{ghostCheckpoint}
			}
			if err != nil || !slices.Equal(names, want) {
				t.Fatalf("checkpoints %v (%v) after a stop that no standby took over, want %v", names, err, want)
			}
			if holder, err := a.leaseHolder(ctx); err != nil || holder != "" {
				t.Fatalf("the lease is held by %q (%v) after the stop, want it released", holder, err)
			}
		})
	}
}

// TestStreamLostWritesTheFinalCheckpointBesideAStandby: a service that
// stops because its stream was deleted writes its final checkpoint even
// with a standby beside it: the checkpoint is then all that holds what it
// applied since the last one, and the standby cannot take over without
// the stream.
func TestStreamLostWritesTheFinalCheckpointBesideAStandby(t *testing.T) {
	fc, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := []tables.Config{testutil.UniformTable("t", 100)}
	opts := []Option{WithStandby(time.Second), WithCheckpoints(fc), WithCheckpointEvery(time.Hour)}
	d := deploy(t, cfgs, deployOptions{service: opts})
	ctx := testutil.Context(t)
	run := func() (*Service, <-chan error) {
		svc, err := New(d.connect(), cfgs, append([]Option{WithPrefix(d.prefix), WithLogger(testutil.QuietLogger())}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- svc.Run(ctx) }()
		return svc, done
	}
	d.stop() // the deployment's service is not the one under test: it would fail the test as the stream goes
	a, aDone := run()
	// Asked, not read: Run sets what mayAct reads as it starts.
	nc := d.connect()
	testutil.WaitUntil(t, "the first service serves", func() bool { return answerer(t, nc, d) == a.id })
	b, bDone := run()
	fill(t, d.producer(), 0, 10, "t")
	testutil.WaitUntil(t, "the standby applied the stream", func() bool { return b.Applied() >= a.Applied() })
	js, err := jetstream.New(d.connect())
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, a.subj.Stream()); err != nil {
		t.Fatal(err)
	}
	for name, done := range map[string]<-chan error{"active": aDone, "standby": bDone} {
		if err := <-done; !errors.Is(err, protocol.ErrStreamLost) {
			t.Fatalf("the %s service's Run: %v, want ErrStreamLost", name, err)
		}
	}
	// Whichever service was active then (a lease that lapsed under load
	// moves it) wrote the final checkpoint, of everything applied.
	names, err := fc.List(ctx)
	final := slices.ContainsFunc(names, func(name string) bool {
		_, applied, ok := parseCheckpointName(name)
		return ok && applied == a.Applied()
	})
	if err != nil || !final {
		t.Fatalf("checkpoints %v (%v) after the stream was lost, want the final one at %d", names, err, a.Applied())
	}
}

// slowSaves is a checkpoint store whose saves take delay, whatever their
// context says, as a file system's do; it tells saving of each.
type slowSaves struct {
	*FileCheckpoints
	delay  time.Duration
	saving chan struct{}
}

func (s *slowSaves) Save(ctx context.Context, name string, r io.Reader) error {
	select {
	case s.saving <- struct{}{}:
	default:
	}
	time.Sleep(s.delay)
	return s.FileCheckpoints.Save(ctx, name, r)
}

// TestGapBelowCheckpointStopsActive: the active service's reader finding
// stream messages gone that a checkpoint holds stops it, and it writes no
// checkpoint of the tables that lack them; messages only the stream's
// limits dropped (beyond every checkpoint) are lost to it, and it goes on.
func TestGapBelowCheckpointStopsActive(t *testing.T) {
	fc, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := deploy(t, checkpointTables(1000), deployOptions{service: []Option{WithCheckpoints(fc), WithoutFinalCheckpoint()}})
	fill(t, d.producer(), 0, 10, "uniform")
	svc := d.svc
	cp, err := svc.Checkpoint(testutil.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.streamGap(t.Context(), cp.Applied+1, cp.Applied+10); err != nil || svc.missedTrim.Load() {
		t.Fatalf("a gap past every checkpoint: %v, missed a trim %v; want the service to go on", err, svc.missedTrim.Load())
	}
	if err := svc.streamGap(t.Context(), cp.Applied, cp.Applied+10); !errors.Is(err, protocol.ErrStreamLost) || !strings.Contains(err.Error(), cp.Name) || !svc.missedTrim.Load() {
		t.Fatalf("a gap below checkpoint %s: %v, missed a trim %v; want ErrStreamLost naming it", cp.Name, err, svc.missedTrim.Load())
	}
	// Stopping while it asks: no final checkpoint of tables that may lack
	// what the checkpoint holds.
	svc.missedTrim.Store(false)
	stopping, cancel := context.WithCancel(t.Context())
	cancel()
	if err := svc.streamGap(stopping, cp.Applied, cp.Applied+10); !errors.Is(err, context.Canceled) || !svc.missedTrim.Load() {
		t.Fatalf("a gap below checkpoint %s found while stopping: %v, missed a trim %v; want context.Canceled, and a missed trim", cp.Name, err, svc.missedTrim.Load())
	}
}

// TestStopWhileAGapIsChecked: a service stopped while it asks its
// checkpoint store what a gap in the stream means stops at once, and
// returns nil as after any shutdown. The listing ran on a context of its
// own, so a store that did not answer held the shutdown for 30 s.
func TestStopWhileAGapIsChecked(t *testing.T) {
	fc, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := checkpointTables(1000)
	d := deploy(t, cfgs, deployOptions{service: []Option{WithCheckpoints(fc), WithoutFinalCheckpoint()}})
	fill(t, d.producer(), 0, 10, "uniform")
	d.stop()
	if err := d.svc.stream.Purge(testutil.Context(t)); err != nil {
		t.Fatal(err)
	}
	// Recovery lists the store first; the gap's listing is the second.
	stuck := &stuckListing{FileCheckpoints: fc, after: 1, listing: make(chan struct{})}
	svc, err := New(d.connect(), cfgs, WithPrefix(d.prefix), WithLogger(testutil.QuietLogger()), WithCheckpoints(stuck))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testutil.Context(t))
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case <-stuck.listing:
	case err := <-done:
		t.Fatalf("Run returned %v before the gap was checked", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the gap at the stream's start was not checked within 10 s")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after a shutdown while checking a gap: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of its context ending while the gap's listing waited")
	}
}

// stuckListing is a checkpoint store whose listings, after the first
// after, never answer: they wait for their context to end.
type stuckListing struct {
	*FileCheckpoints
	after   int32
	calls   atomic.Int32
	listing chan struct{} // closed when the first stuck listing starts
}

func (s *stuckListing) List(ctx context.Context) ([]string, error) {
	call := s.calls.Add(1)
	if call <= s.after {
		return s.FileCheckpoints.List(ctx)
	}
	if call == s.after+1 {
		close(s.listing)
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestSlowTakeoverChecksStillTakeOver: a standby that takes the lease asks
// its checkpoint store for the epochs before it serves. A store that takes
// longer than a renewal period to answer (a slow or electing cluster) used
// to run past the check's deadline, a sixth of the TTL: the standby gave
// the lease up and asked again, for good, and nobody served. It now renews
// the lease while it waits.
func TestSlowTakeoverChecksStillTakeOver(t *testing.T) {
	const ttl = time.Second
	// Past the whole TTL: the lease would lapse unrenewed.
	takeOverThrough(t, ttl, func(fc *FileCheckpoints) CheckpointStore {
		return &slowListing{FileCheckpoints: fc, delay: 3 * ttl / 2}
	})
}

// takeOverThrough has a standby whose checkpoint store is wrap's, with
// lease TTL ttl, take over from an active service once that one stops
// gracefully, and returns the standby.
func takeOverThrough(t *testing.T, ttl time.Duration, wrap func(*FileCheckpoints) CheckpointStore, extra ...Option) *Service {
	t.Helper()
	fc, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := []tables.Config{testutil.UniformTable("t", 1000)}
	d := deploy(t, cfgs, deployOptions{service: []Option{WithStandby(ttl), WithCheckpoints(fc)}})
	fill(t, d.producer(), 0, 10, "t")
	b, _ := d.startService(cfgs, append([]Option{WithStandby(ttl), WithCheckpoints(wrap(fc))}, extra...)...)
	nc := d.connect()
	if got := answerer(t, nc, d); got != d.svc.id {
		t.Fatalf("answered by %q, want the first service %q", got, d.svc.id)
	}
	// Before the final checkpoint trims the stream, which the standby
	// would otherwise find gone past it.
	testutil.WaitUntil(t, "the standby applied the items", func() bool { return b.Applied() >= d.svc.Applied() })
	d.stop()
	testutil.WaitUntil(t, "the standby answers", func() bool { return answerer(t, nc, d) == b.id })
	return b
}

// slowListing is a checkpoint store that answers a listing only after
// delay.
type slowListing struct {
	*FileCheckpoints
	delay time.Duration
}

func (s *slowListing) List(ctx context.Context) ([]string, error) {
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return s.FileCheckpoints.List(ctx)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestTakeoverAsksAgainAfterADroppedCall: a question a standby asks before
// it acts that the cluster drops (a call taken while it elects a leader)
// is asked again after a few seconds, rather than waited out to the
// check's deadline and the lease given up: a cluster soak paused inserts
// 15.6 s so, 10 s of them waiting for one stream info.
func TestTakeoverAsksAgainAfterADroppedCall(t *testing.T) {
	// Recovery lists first; the standby's listing of the epochs when it
	// takes the lease is the second.
	var dropped *droppedListing
	var logB syncbuf.Buffer
	takeOverThrough(t, time.Second, func(fc *FileCheckpoints) CheckpointStore {
		dropped = &droppedListing{FileCheckpoints: fc, drop: 2}
		return dropped
	}, WithLogger(slog.New(slog.NewTextHandler(&logB, nil))))
	if dropped.calls.Load() < 3 {
		t.Fatalf("%d listings, want the dropped one asked again", dropped.calls.Load())
	}
	if strings.Contains(logB.String(), "giving the lease up") {
		t.Fatalf("the standby gave the lease up over one dropped call:\n%s", logB.String())
	}
}

// droppedListing is a checkpoint store that never answers the listing
// numbered drop (from 1): it waits for its context to end.
type droppedListing struct {
	*FileCheckpoints
	drop  int32
	calls atomic.Int32
}

func (s *droppedListing) List(ctx context.Context) ([]string, error) {
	if s.calls.Add(1) == s.drop {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.FileCheckpoints.List(ctx)
}

// TestStandbyThatCannotReadTheActiveCheckpointsStops: a standby whose
// checkpoint store lacks the checkpoints the active service writes (each
// machine with its own directory) stops at once, saying so. It used to
// take the messages the active one trimmed below its checkpoints for ones
// the stream's limits dropped, and took over without them. A standby that
// shares the store starts.
func TestStandbyThatCannotReadTheActiveCheckpointsStops(t *testing.T) {
	shared, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	own, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := []tables.Config{testutil.UniformTable("t", 1000)}
	d := deploy(t, cfgs, deployOptions{service: []Option{WithStandby(time.Second), WithCheckpoints(shared)}})
	ctx := testutil.Context(t)
	insertSteps(t, d.producer(), 0, 50, 2)
	res, err := d.svc.Checkpoint(ctx) // and trims the stream below it
	if err != nil {
		t.Fatal(err)
	}
	leaseNames(t, d.svc, res.Name)
	b, err := New(d.connect(), cfgs, WithPrefix(d.prefix), WithLogger(testutil.QuietLogger()), WithStandby(time.Second), WithCheckpoints(own))
	if err != nil {
		t.Fatal(err)
	}
	err = b.Run(ctx)
	if !errors.Is(err, protocol.ErrInvalidOption) || !strings.Contains(err.Error(), res.Name) {
		t.Fatalf("a standby with its own checkpoint directory: Run = %v, want ErrInvalidOption naming %s", err, res.Name)
	}
	ok, _ := d.startService(cfgs, WithStandby(time.Second), WithCheckpoints(shared))
	testutil.WaitUntil(t, "the standby that shares them follows", func() bool { return ok.Applied() >= d.svc.Applied() })
}

// TestStandbyThatDeletedADamagedNewestCheckpointRuns: a standby sharing the
// active service's checkpoints, whose recovery found the newest damaged
// and deleted it, while the lease still names that one, goes on: it
// stopped as if it read other checkpoints than the active service's.
func TestStandbyThatDeletedADamagedNewestCheckpointRuns(t *testing.T) {
	dir := t.TempDir()
	shared, err := NewFileCheckpoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfgs := []tables.Config{testutil.UniformTable("t", 1000)}
	d := deploy(t, cfgs, deployOptions{service: []Option{WithStandby(time.Second), WithCheckpoints(shared)}})
	ctx := testutil.Context(t)
	insertSteps(t, d.producer(), 0, 20, 2)
	if _, err := d.svc.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	insertSteps(t, d.producer(), 20, 40, 2)
	res, err := d.svc.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leaseNames(t, d.svc, res.Name)
	path := filepath.Join(dir, res.Name)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	b, stopB := d.startService(cfgs, WithStandby(time.Second), WithCheckpoints(shared))
	testutil.WaitUntil(t, "the standby follows the stream", func() bool { return b.Applied() >= d.svc.Applied() })
	if !b.damaged[res.Name] {
		t.Fatalf("the standby did not find %s damaged", res.Name)
	}
	// Restarted, it finds the damaged one gone already, and the other
	// checkpoint of the active one's epoch.
	stopB()
	b, err = New(d.connect(), cfgs, WithPrefix(d.prefix), WithLogger(testutil.QuietLogger()), WithStandby(time.Second), WithCheckpoints(shared))
	if err != nil {
		t.Fatal(err)
	}
	if b.lease, err = openLease(ctx, b.js, b.subj.LeaseBucket(), 1, time.Second, b.id, b.log); err != nil {
		t.Fatal(err)
	}
	if err := b.checkSharedCheckpoints(ctx); err != nil {
		t.Fatalf("the restarted standby, sharing the store: %v", err)
	}
}

// leaseNames waits until the lease svc holds names checkpoint name.
func leaseNames(t *testing.T, svc *Service, name string) {
	t.Helper()
	ctx := testutil.Context(t)
	testutil.WaitUntil(t, "the lease names checkpoint "+name, func() bool {
		e, err := svc.lease.kv.Get(ctx, leaseKey)
		if err != nil {
			return false
		}
		_, newest := leaseValue(e.Value())
		return newest == name
	})
}
