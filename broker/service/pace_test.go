package service

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// TestPaceController walks the controller through a paced spell: it paces
// only while learners sample and goroutines wait past the target, starts
// from what the actors applied, never goes below a tenth of it, rises again
// as the delay falls, and stops when learners stop, wait for inserts on
// their rate limiter, or actors no longer reach the pace.
func TestPaceController(t *testing.T) {
	const target = 4 * time.Millisecond
	c := paceController{target: target}
	slow, fast := 50*time.Millisecond, time.Millisecond
	steps := []struct {
		name string
		obs  paceObservation
		want float64
	}{
		{"no learners", paceObservation{learners: false, delay: slow, applied: 100_000}, 0},
		{"no delay", paceObservation{learners: true, delay: fast, applied: 100_000}, 0},
		{"too few inserts to matter", paceObservation{learners: true, delay: slow, applied: paceMinRate - 1}, 0},
		{"learners wait", paceObservation{learners: true, delay: slow, applied: 100_000}, 70_000},
		{"still", paceObservation{learners: true, delay: slow, applied: 70_000}, 49_000},
		{"actors below the pace", paceObservation{learners: true, delay: slow, applied: 20_000}, 14_000},
		{"at the floor", paceObservation{learners: true, delay: slow, applied: 14_000}, 10_000},
		{"held at the floor", paceObservation{learners: true, delay: slow, applied: 10_000}, 10_000},
		{"delay falls", paceObservation{learners: true, delay: fast, applied: 10_000}, 11_000},
		{"rises", paceObservation{learners: true, delay: fast, applied: 11_000}, 12_100},
		{"learners stop", paceObservation{learners: false, delay: fast, applied: 12_100}, 0},
		{"again", paceObservation{learners: true, delay: slow, applied: 50_000}, 35_000},
		{"learners wait for inserts", paceObservation{learners: true, limited: true, delay: slow, applied: 35_000}, 0},
		{"not while they do", paceObservation{learners: true, limited: true, delay: slow, applied: 50_000}, 0},
		{"and again", paceObservation{learners: true, delay: slow, applied: 50_000}, 35_000},
		{"actors stop", paceObservation{learners: true, delay: fast, applied: 0}, 0},
	}
	for _, s := range steps {
		got := c.step(s.obs)
		if math.Abs(got-s.want) > 1e-6*s.want {
			t.Fatalf("%s: pace %v, want %v", s.name, got, s.want)
		}
	}
}

// TestPacerHoldsItsPace: the apply loop waits as long as the items it
// applied take at the pace, catches up a short burst at full speed, and
// never waits while unpaced.
func TestPacerHoldsItsPace(t *testing.T) {
	var p pacer
	t0 := time.Unix(1000, 0)
	p.took(t0, 100)
	if d := p.wait(t0); d != 0 {
		t.Fatalf("unpaced: wait %v", d)
	}
	p.rate.Store(math.Float64bits(1000)) // items a second
	p.took(t0, 100)
	if d, want := p.wait(t0), 100*time.Millisecond-paceBurst; d != want {
		t.Fatalf("after 100 items at 1000/s: wait %v, want %v", d, want)
	}
	at := t0.Add(90 * time.Millisecond)
	p.took(at, 100)
	if d := p.wait(at); d != 100*time.Millisecond {
		t.Fatalf("after 100 more: wait %v, want 100ms", d)
	}
	idle := t0.Add(10 * time.Second)
	p.took(idle, 5)
	if d := p.wait(idle); d != 0 {
		t.Fatalf("after an idle spell, 5 items (within the burst): wait %v, want 0", d)
	}
	p.rate.Store(0)
	p.took(idle, 1_000_000)
	if d := p.wait(idle); d != 0 {
		t.Fatalf("unpaced again: wait %v", d)
	}
	if got := p.applied.Load(); got != 1_000_305 {
		t.Errorf("applied %d, want 1000305", got)
	}
}

func TestP90(t *testing.T) {
	buckets := []float64{math.Inf(-1), 0.001, 0.002, 0.004, math.Inf(1)}
	for _, c := range []struct {
		counts []uint64
		want   time.Duration
	}{
		{[]uint64{0, 10, 5, 0}, 0},                              // too few to tell
		{[]uint64{90, 5, 5, 0}, 0},                              // the first bucket's lower bound is -Inf: 0
		{[]uint64{0, 89, 11, 0}, 2 * time.Millisecond},          // 89% below 2 ms
		{[]uint64{0, 90, 10, 0}, time.Millisecond},              // exactly 90% in the first
		{[]uint64{0, 0, 0, 100}, 4 * time.Millisecond},          // all in the open bucket
		{[]uint64{10, 10, 10, 70}, 4 * time.Millisecond},        // spread
		{[]uint64{40, 40, 15, 5}, 2 * time.Millisecond},         // p90 in the third
		{[]uint64{1000, 0, 0, 0}, time.Duration(0)},             // idle waits
		{[]uint64{0, 0, paceMinWaits, 0}, 2 * time.Millisecond}, // just enough
	} {
		if got := p90(buckets, c.counts); got != c.want {
			t.Errorf("p90(%v) = %v, want %v", c.counts, got, c.want)
		}
	}
}

// TestSchedDelayReadsTheRuntime: the runtime has the histogram the probe
// reads (a misspelt name reads as nothing, and inserts would never be
// paced), and a reading covers only the waits since the last one.
func TestSchedDelayReadsTheRuntime(t *testing.T) {
	d := newSchedDelay()
	if len(d.last) == 0 {
		t.Fatalf("%s: no histogram (kind %v)", d.sample[0].Name, d.sample[0].Value.Kind())
	}
	if got := d.read(); got != 0 {
		t.Errorf("read again at once: %v, want 0 (too few waits since)", got)
	}
}

// TestPacingPutsLearnersFirst runs a service whose goroutines (as a stand-in
// probe reports) wait too long to run, beside an actor inserting as fast as
// it can: inserts are paced once a learner samples, producers are told a
// window, items still go in, pacing ends when the learner stops, and every
// acknowledged item is in the table.
func TestPacingPutsLearnersFirst(t *testing.T) {
	var delay atomic.Int64
	delay.Store(int64(50 * time.Millisecond))
	probe := serviceOption(func(o *serviceOptions) error {
		o.schedProbe = func() time.Duration { return time.Duration(delay.Load()) }
		return nil
	})
	cfg := pacedTable(10_000_000, limiter.MinSize(1))
	d := deploy(t, []tables.Config{cfg}, deployOptions{service: []Option{WithSamplePriority(time.Millisecond), probe}})
	ctx := testutil.Context(t)

	// The window producers are told, as the service publishes it.
	var window atomic.Int64
	window.Store(-1)
	nc := d.connect()
	sub, err := nc.Subscribe(d.prefix+".applied", func(m *nats.Msg) {
		var p wire.Progress
		if proto.Unmarshal(m.Data, &p) == nil {
			window.Store(int64(p.MaxUnapplied))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	p := d.producer()
	actx, stopActor := context.WithCancel(ctx)
	var acked atomic.Int64
	actor := runActor(actx, p, &acked)

	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 20s (pace %v, window %d)", what, d.svc.InsertPace(), window.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	table, _ := d.svc.Table("t")
	waitUntil("items applied", func() bool { return table.Size() > 10_000 })
	if pace := d.svc.InsertPace(); pace != 0 {
		t.Fatalf("paced at %v with no learner", pace)
	}

	c := d.client()
	lctx, stopLearner := context.WithCancel(ctx)
	learner := make(chan error, 1)
	go func() {
		for lctx.Err() == nil {
			if _, err := c.Sample(lctx, "t", 8); err != nil && lctx.Err() == nil {
				learner <- err
				return
			}
		}
		learner <- nil
	}()
	waitUntil("pace", func() bool { return d.svc.InsertPace() > 0 })
	waitUntil("window in the progress", func() bool { return window.Load() > 0 })
	pacedAt := table.Size()
	waitUntil("items applied while paced", func() bool { return table.Size() > pacedAt+1000 })

	stopLearner()
	if err := <-learner; err != nil {
		t.Fatalf("learner: %v", err)
	}
	waitUntil("the end of pacing", func() bool { return d.svc.InsertPace() == 0 })
	waitUntil("the window's end in the progress", func() bool { return window.Load() == 0 })

	stopActor()
	if err := <-actor; actx.Err() == nil {
		t.Fatalf("actor: %v", err)
	}
	// Items appended when the actor stopped may or may not have gone out;
	// those acknowledged must all be in.
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := table.Size(), acked.Load(); got < want {
		t.Fatalf("table holds %d items, %d were acknowledged", got, want)
	}
}

// pacedTable is table "t" of the pacing tests: uniform, fifo, with max
// size and limiter as given.
func pacedTable(maxSize int64, lim limiter.Config) tables.Config {
	return tables.Config{
		Name:    "t",
		Sampler: selectors.Options{Kind: selectors.KindUniform},
		Remover: selectors.Options{Kind: selectors.KindFifo},
		MaxSize: maxSize,
		Limiter: lim,
	}
}

// runActor inserts one step with 64 items on it into table "t", flushes,
// and goes on as fast as it can until ctx ends or an insert fails, counting
// the items acknowledged. The channel gets the error that stopped it.
func runActor(ctx context.Context, p *broker.Producer, acked *atomic.Int64) <-chan error {
	stopped := make(chan error, 1)
	go func() {
		for i := int64(0); ; i++ {
			if err := p.Append(ctx, step(i, 4)); err != nil {
				stopped <- err
				return
			}
			for range 64 {
				if err := p.CreateItem(ctx, "t", 1, broker.LastStep("obs", "id")); err != nil {
					stopped <- err
					return
				}
			}
			if err := p.Flush(ctx); err != nil {
				stopped <- err
				return
			}
			acked.Add(64)
		}
	}()
	return stopped
}

// TestPacingLeavesLearnersWaitingForInserts: learners whose samples wait
// for their table's rate limiter wait on inserts, not on the CPU, so
// inserts are not paced for them however long goroutines wait to run. A
// period can see a request served whose wait was counted in the one
// before, so the pace may flicker for a period; without the rule it holds
// in every one.
func TestPacingLeavesLearnersWaitingForInserts(t *testing.T) {
	var periods, paced atomic.Int64
	var svc atomic.Pointer[Service]
	probe := serviceOption(func(o *serviceOptions) error {
		o.schedProbe = func() time.Duration {
			// Called once a period, before the pace is revised: the pace
			// read here is the last period's.
			if s := svc.Load(); s != nil && s.InsertPace() > 0 {
				paced.Add(1)
			}
			periods.Add(1)
			return 50 * time.Millisecond
		}
		return nil
	})
	// A sample for every hundred inserts, and inserts never held: learners
	// are served, each after waiting for inserts.
	cfg := pacedTable(10_000_000, limiter.Config{SamplesPerInsert: 0.01, MinSize: 1, MaxDiff: math.Inf(1)})
	d := deploy(t, []tables.Config{cfg}, deployOptions{service: []Option{WithSamplePriority(time.Millisecond), probe}})
	svc.Store(d.svc)
	ctx := testutil.Context(t)

	actx, stopActor := context.WithCancel(ctx)
	var acked atomic.Int64
	actor := runActor(actx, d.producer(), &acked)
	c := d.client()
	lctx, stopLearners := context.WithCancel(ctx)
	var learners sync.WaitGroup
	var served atomic.Int64
	for range 4 {
		learners.Go(func() {
			for lctx.Err() == nil {
				if _, err := c.Sample(lctx, "t", 1); err == nil {
					served.Add(1)
				}
			}
		})
	}
	start := periods.Load()
	deadline := time.Now().Add(30 * time.Second)
	for periods.Load() < start+20 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stopLearners()
	learners.Wait()
	stopActor()
	<-actor
	n := periods.Load() - start
	if n < 20 {
		t.Fatalf("only %d pace periods within 30s", n)
	}
	if d.svc.limiterWaits() == 0 || served.Load() == 0 {
		t.Fatalf("%d samples waited for the limiter, %d were served: the test needs both", d.svc.limiterWaits(), served.Load())
	}
	if acked.Load() == 0 {
		t.Fatal("the actor inserted nothing: nothing to pace")
	}
	if p := paced.Load(); p > n/2 {
		t.Fatalf("paced in %d of %d periods while every learner waited for inserts", p, n)
	}
}

// TestLimiterWaitsCountInserts: inserts a table's rate limiter holds count
// as limiter waits too (then the limiter, not pacing, balances actors and
// learners), as well as samples it holds.
func TestLimiterWaitsCountInserts(t *testing.T) {
	// With no samples, inserts past the first few wait.
	lim, err := limiter.SampleToInsertRatio(1, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg := pacedTable(1000, lim)
	d := deploy(t, []tables.Config{cfg}, deployOptions{service: []Option{WithSamplePriority(0)}})
	ctx := testutil.Context(t)
	// Stored, not applied: the limiter holds most of them.
	p := d.producer(broker.WithReturnOnStore())
	if err := p.Append(ctx, step(0, 4)); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		if err := p.CreateItem(ctx, "t", 1, broker.LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for d.svc.limiterWaits() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no limiter wait counted within 20s for inserts the limiter holds")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRefusedSamplesAreNoLearners: a sample request tells the pace
// controller that learners sample once it reaches a request slot with a
// size in range. Requests refused before that (malformed, for an unknown
// table, for a size out of range or over limits.max_reply_bytes, with no
// request slot free) counted too:
// any client sending them on a busy machine held the actors' inserts at
// the paced minimum.
func TestRefusedSamplesAreNoLearners(t *testing.T) {
	limits := DefaultLimits()
	limits.MaxItemBytes, limits.MaxReplyBytes = 4096, 4096
	empty := pacedTable(1000, limiter.MinSize(1))
	empty.Name = "empty"
	d := deploy(t, []tables.Config{pacedTable(1000, limiter.MinSize(1)), empty}, deployOptions{service: []Option{
		WithLimits(limits),
		// With two tables each has one slot of its own while the other is
		// in use.
		WithMaxConcurrentSamples(2),
	}})
	insertSteps(t, d.producer(), 0, 10, 4)
	nc := d.connect()
	subj := d.svc.subj.Sample()
	// ask sends data once the last request's slot is given back, which it
	// is only after its reply went out, and returns the reply's code.
	ask := func(data []byte) wire.Code {
		t.Helper()
		testutil.WaitUntil(t, "no request holds a slot", func() bool { return d.svc.slots.used() == 0 })
		m, err := nc.RequestWithContext(testutil.Context(t), subj, data)
		if err != nil {
			t.Fatal(err)
		}
		var resp wire.SampleResponse
		if err := proto.Unmarshal(m.Data, &resp); err != nil {
			t.Fatal(err)
		}
		return resp.GetStatus().GetCode()
	}
	learners := func(what string, want int64) {
		t.Helper()
		if got := d.svc.pace.samples.Load(); got != want {
			t.Fatalf("after %s: %d sample requests count as learners, want %d", what, got, want)
		}
	}
	if code := ask(mustMarshal(t, &wire.SampleRequest{Table: "t", NumSamples: 2, Packed: true, TimeoutMs: 10_000})); code != wire.Code_CODE_OK {
		t.Fatalf("a request to serve: %v", code)
	}
	learners("a request served", 1)

	for _, c := range []struct {
		name string
		data []byte
		want wire.Code
	}{
		{"malformed", []byte{0xff, 0xff, 0xff}, wire.Code_CODE_INVALID_ARGUMENT},
		{"unknown table", mustMarshal(t, &wire.SampleRequest{Table: "nope", NumSamples: 1}), wire.Code_CODE_NOT_FOUND},
		{"no samples", mustMarshal(t, &wire.SampleRequest{Table: "t", NumSamples: 0, TimeoutMs: 10_000}), wire.Code_CODE_INVALID_ARGUMENT},
		{"over the largest batch", mustMarshal(t, &wire.SampleRequest{Table: "t", NumSamples: 1 << 20, TimeoutMs: 10_000}), wire.Code_CODE_INVALID_ARGUMENT},
		{"over max_reply_bytes", mustMarshal(t, &wire.SampleRequest{Table: "t", NumSamples: 10_000, TimeoutMs: 10_000}), wire.Code_CODE_RESOURCE_EXHAUSTED},
	} {
		if code := ask(c.data); code != c.want {
			t.Fatalf("%s: %v, want %v", c.name, code, c.want)
		}
		learners(c.name, 1)
	}

	// One request waits for the empty table's limiter in its slot, as
	// long as the service runs; the next for that table finds none free.
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	waits := d.svc.limiterWaits()
	testutil.WaitUntil(t, "no request holds a slot", func() bool { return d.svc.slots.used() == 0 })
	if err := nc.PublishRequest(subj, inbox, mustMarshal(t, &wire.SampleRequest{Table: "empty", NumSamples: 1, TimeoutMs: 600_000})); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "a request waits for the limiter", func() bool { return d.svc.limiterWaits() > waits })
	// A request waiting for its limiter is a learner: the period's limiter
	// wait, not its count, leaves inserts unpaced.
	learners("a request that waits for the limiter", 2)
	m, err := nc.RequestWithContext(testutil.Context(t), subj, mustMarshal(t, &wire.SampleRequest{Table: "empty", NumSamples: 1, TimeoutMs: 0}))
	if err != nil {
		t.Fatal(err)
	}
	var resp wire.SampleResponse
	if err := proto.Unmarshal(m.Data, &resp); err != nil {
		t.Fatal(err)
	}
	if code := resp.GetStatus().GetCode(); code != wire.Code_CODE_RESOURCE_EXHAUSTED {
		t.Fatalf("with the table's slot taken: %v (%s), want %v", code, resp.GetStatus().GetMessage(), wire.Code_CODE_RESOURCE_EXHAUSTED)
	}
	learners("a request refused for want of a slot", 2)
}
