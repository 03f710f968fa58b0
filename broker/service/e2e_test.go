package service

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/internal/testutil"

	"github.com/reprise-rl/reprise/broker"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// TestRoundTrip: what an actor appends is what a learner samples, bit for
// bit, for sequences that span chunks and for squeezed single steps.
func TestRoundTrip(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("seq", 1000), testutil.UniformTable("single", 1000)}, deployOptions{})
	ctx := testutil.Context(t)
	p := d.producer(broker.WithChunkLength(4))
	const obsLen = 5
	for i := range int64(20) {
		if err := p.Append(ctx, step(i, obsLen)); err != nil {
			t.Fatal(err)
		}
		if i >= 2 {
			if err := p.CreateItem(ctx, "seq", 1, broker.Last(3, "obs", "id")); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.CreateItem(ctx, "single", 1, broker.LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	c := d.client()
	info, err := c.Info(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int64{}
	for _, ti := range info.Tables {
		sizes[ti.Name] = ti.Size
	}
	if sizes["seq"] != 18 || sizes["single"] != 20 {
		t.Fatalf("table sizes %v, want seq 18 and single 20", sizes)
	}

	samples, err := c.Sample(ctx, "seq", 50)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		idv := ids(t, s)
		if len(idv) != 3 || idv[1] != idv[0]+1 || idv[2] != idv[1]+1 {
			t.Fatalf("seq item has steps %v, want 3 consecutive", idv)
		}
		if got := column(t, s, "obs").Shape; !slices.Equal(got, []int64{3, obsLen}) {
			t.Fatalf("seq obs shape %v, want [3 %d]", got, obsLen)
		}
		checkObs(t, s, obsLen)
		if s.Info.TableSize != 18 || math.Abs(s.Info.Probability-1.0/18) > 1e-12 {
			t.Fatalf("sample info %+v: want table size 18, probability 1/18", s.Info)
		}
	}
	samples, err = c.Sample(ctx, "single", 50)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if got := column(t, s, "obs").Shape; !slices.Equal(got, []int64{obsLen}) {
			t.Fatalf("squeezed obs shape %v, want [%d]", got, obsLen)
		}
		if got := column(t, s, "id").Shape; len(got) != 0 {
			t.Fatalf("squeezed id shape %v, want scalar", got)
		}
		checkObs(t, s, obsLen)
	}
}

// TestSharedChunks: overlapping items in two tables reference the same
// chunks, which the service stores once (Reverb paper §4).
func TestSharedChunks(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("two", 1000), testutil.UniformTable("three", 1000)}, deployOptions{})
	ctx := testutil.Context(t)
	p := d.producer()
	const steps = 30
	for i := range int64(steps) {
		if err := p.Append(ctx, step(i, 100)); err != nil {
			t.Fatal(err)
		}
		if i >= 1 {
			if err := p.CreateItem(ctx, "two", 1, broker.Last(2, "obs", "id")); err != nil {
				t.Fatal(err)
			}
		}
		if i >= 2 {
			if err := p.CreateItem(ctx, "three", 1, broker.Last(3, "obs", "id")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.EndEpisode(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := d.client().Info(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	// Two columns, one chunk per step each: every step stored once.
	if info.Chunks != 2*steps {
		t.Fatalf("service holds %d chunks, want %d (each step's two cells once)", info.Chunks, 2*steps)
	}
	var held int64
	for _, ti := range info.Tables {
		held += ti.BytesHeld
	}
	if held <= info.ChunkBytes {
		t.Fatalf("tables hold %d bytes in all, store %d: the tables should share chunks", held, info.ChunkBytes)
	}
}

// TestEverySelector: each selector serves as sampler over the network and
// returns what its semantics say.
func TestEverySelector(t *testing.T) {
	kinds := []selectors.Options{
		{Kind: selectors.KindFifo}, {Kind: selectors.KindLifo}, {Kind: selectors.KindUniform},
		{Kind: selectors.KindPrioritized, Exponent: 1}, {Kind: selectors.KindMaxHeap}, {Kind: selectors.KindMinHeap},
	}
	var cfgs []tables.Config
	for _, k := range kinds {
		cfgs = append(cfgs, testutil.TableConfig(string(k.Kind), k, selectors.Options{Kind: selectors.KindFifo}, 100, limiter.MinSize(1)))
	}
	d := deploy(t, cfgs, deployOptions{})
	ctx := testutil.Context(t)
	p := d.producer()
	for i := range int64(10) {
		if err := p.Append(ctx, step(i, 1)); err != nil {
			t.Fatal(err)
		}
		for _, k := range kinds {
			// Priority i: the heaps see 9 as max and 0 as min; prioritized
			// never returns the zero-priority item 0.
			if err := p.CreateItem(ctx, string(k.Kind), float64(i), broker.LastStep("id")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	c := d.client()
	want := map[selectors.Kind]int64{selectors.KindFifo: 0, selectors.KindLifo: 9, selectors.KindMaxHeap: 9, selectors.KindMinHeap: 0}
	for _, k := range kinds {
		samples, err := c.Sample(ctx, string(k.Kind), 20)
		if err != nil {
			t.Fatalf("%s: %v", k.Kind, err)
		}
		for _, s := range samples {
			id := ids(t, s)[0]
			if w, ok := want[k.Kind]; ok && id != w {
				t.Fatalf("%s sampled step %d, want %d", k.Kind, id, w)
			}
			if k.Kind == selectors.KindPrioritized {
				if id == 0 {
					t.Fatalf("prioritized sampled the zero-priority item")
				}
				if w := float64(id) / 45; math.Abs(s.Info.Probability-w) > 1e-12 {
					t.Fatalf("prioritized probability of step %d = %v, want %v", id, s.Info.Probability, w)
				}
			}
		}
	}
}

// TestQueueExactlyOnceInOrder: several actors feed a Queue table while a
// learner drains it: every item arrives exactly once, and each actor's
// items arrive in the order it created them.
func TestQueueExactlyOnceInOrder(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 50)}, deployOptions{})
	ctx := testutil.Context(t)
	const actors, perActor = 3, 200
	var wg sync.WaitGroup
	errc := make(chan error, actors)
	for a := range actors {
		p := d.producer(broker.WithMaxUnapplied(16))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range int64(perActor) {
				if err := p.Append(ctx, broker.Step{"id": broker.Int64s(nil, []int64{int64(a)*1_000_000 + i})}); err != nil {
					errc <- err
					return
				}
				if err := p.CreateItem(ctx, "queue", 1, broker.LastStep("id")); err != nil {
					errc <- err
					return
				}
			}
			errc <- p.Flush(ctx)
		}()
	}
	c := d.client()
	seen := make(map[int64]bool)
	last := make([]int64, actors)
	for a := range last {
		last[a] = -1
	}
	for len(seen) < actors*perActor {
		samples, err := c.Sample(ctx, "queue", 1+len(seen)%7, broker.Flexible())
		if err != nil {
			t.Fatalf("after %d items: %v", len(seen), err)
		}
		for _, s := range samples {
			id := ids(t, s)[0]
			if seen[id] {
				t.Fatalf("item %d delivered twice", id)
			}
			seen[id] = true
			a, i := id/1_000_000, id%1_000_000
			if i <= last[a] {
				t.Fatalf("actor %d: item %d after item %d", a, i, last[a])
			}
			last[a] = i
		}
	}
	wg.Wait()
	for range actors {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	// Nothing left: a further sample is rate limited.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := c.Sample(short, "queue", 1); !errors.Is(err, protocol.ErrRateLimited) {
		t.Fatalf("sample from the drained queue: %v, want protocol.ErrRateLimited", err)
	}
}

// TestSampleToInsertRatio: concurrent actors and learners under a ratio
// limiter; the achieved samples per insert stays within the error buffer.
func TestSampleToInsertRatio(t *testing.T) {
	const spi, minSize, buffer = 4.0, 20, 40.0
	lim, err := limiter.SampleToInsertRatio(spi, minSize, buffer)
	if err != nil {
		t.Fatal(err)
	}
	d := deploy(t, []tables.Config{testutil.TableConfig("ratio", selectors.Options{Kind: selectors.KindUniform}, selectors.Options{Kind: selectors.KindFifo}, 1000, lim)}, deployOptions{})
	ctx := testutil.Context(t)
	const actors, perActor = 2, 300
	stop := make(chan struct{})
	var actorsDone sync.WaitGroup
	for a := range actors {
		p := d.producer(broker.WithMaxUnapplied(8))
		actorsDone.Add(1)
		go func() {
			defer actorsDone.Done()
			for i := range int64(perActor) {
				if err := p.Append(ctx, broker.Step{"id": broker.Int64s(nil, []int64{int64(a)<<32 | i})}); err != nil {
					t.Error(err)
					return
				}
				if err := p.CreateItem(ctx, "ratio", 1, broker.LastStep("id")); err != nil {
					t.Error(err)
					return
				}
			}
			if err := p.Flush(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	c := d.client()
	var learners sync.WaitGroup
	for range 2 {
		learners.Add(1)
		go func() {
			defer learners.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				short, cancel := context.WithTimeout(ctx, time.Second)
				_, err := c.Sample(short, "ratio", 3, broker.Flexible())
				cancel()
				if err != nil && !errors.Is(err, protocol.ErrRateLimited) {
					t.Error(err)
					return
				}
			}
		}()
	}
	check := func() {
		info, err := c.Info(ctx, "ratio")
		if err != nil {
			t.Fatal(err)
		}
		l := info.Tables[0].Limiter
		if l.Inserts < minSize {
			return
		}
		diff := float64(l.Inserts)*spi - float64(l.Samples)
		if diff < lim.MinDiff-3 || diff > lim.MaxDiff {
			t.Fatalf("inserts %d samples %d: inserts*spi - samples = %v outside [%v, %v]", l.Inserts, l.Samples, diff, lim.MinDiff-3, lim.MaxDiff)
		}
	}
	testutil.WaitUntil(t, "all inserts applied", func() bool {
		check()
		info, err := c.Info(ctx, "ratio")
		return err == nil && info.Tables[0].Inserts == actors*perActor
	})
	actorsDone.Wait()
	close(stop)
	learners.Wait()
	check()
}

// TestLimiterHoldsProducers: while a table's limiter holds inserts, the
// producer's window fills and its calls block until their deadline; once
// a learner samples, they resume and nothing was dropped.
func TestLimiterHoldsProducers(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 5)}, deployOptions{})
	ctx := testutil.Context(t)
	p := d.producer(broker.WithMaxUnapplied(4), broker.WithLinger(0))
	created := 0
	var blockedErr error
	for i := range int64(100) {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := p.Append(short, broker.Step{"id": broker.Int64s(nil, []int64{i})})
		if err == nil {
			err = p.CreateItem(short, "queue", 1, broker.LastStep("id"))
		}
		cancel()
		if err != nil {
			blockedErr = err
			break
		}
		created++
	}
	if !errors.Is(blockedErr, protocol.ErrNotApplied) || !errors.Is(blockedErr, context.DeadlineExceeded) {
		t.Fatalf("after %d items the producer said %v, want protocol.ErrNotApplied and DeadlineExceeded", created, blockedErr)
	}
	// Queue(5) holds 5 items, the window 4 more, give or take one in the
	// batch being sent.
	if created < 5 || created > 11 {
		t.Fatalf("producer created %d items before blocking, want 5..11", created)
	}
	c := d.client()
	var got []int64
	done := make(chan error, 1)
	go func() {
		for len(got) < created {
			s, err := c.Sample(ctx, "queue", 1)
			if err != nil {
				done <- err
				return
			}
			got = append(got, ids(t, s[0])[0])
		}
		done <- nil
	}()
	// The call that failed kept nothing of its step (an Append) or created
	// nothing (a CreateItem); Flush sends the items created once the
	// learner makes room.
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i, id := range got {
		if id != int64(i) {
			t.Fatalf("queue delivered %v, want 0..%d in order", got, created)
		}
	}
}

// TestLargeSample: a response larger than the max payload arrives whole.
func TestLargeSample(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("big", 100)}, deployOptions{maxPayload: 64 << 10})
	ctx := testutil.Context(t)
	p := d.producer(broker.WithCompression(wire.Uncompressed))
	const obsLen = 4000 // 16 kB per item
	insertStepsInto(t, p, "big", 0, 40, obsLen)
	samples, err := d.client().Sample(ctx, "big", 64) // ~1 MB, 16 parts
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 64 {
		t.Fatalf("got %d samples, want 64", len(samples))
	}
	for _, s := range samples {
		checkObs(t, s, obsLen)
	}
}

// TestGarbageRejected: bytes published straight onto the data protocol.Subjects are
// rejected and counted while valid traffic goes on.
func TestGarbageRejected(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 1000)}, deployOptions{})
	ctx := testutil.Context(t)
	nc := d.connect()
	p := d.producer()
	garbage := [][]byte{
		{0xff, 0xff, 0xff},
		[]byte("hello"),
		{},
		// A batch whose chunk claims a gigantic raw size.
		mustMarshal(t, &wire.InsertBatch{ProducerId: "evil", Sequence: 1, WindowStart: 1, Window: 4, Chunks: []*wire.Chunk{{Key: 7, Dtype: "float32", StepShape: []int64{1 << 40}, Length: 1, RawSize: 4 << 40}},
			Items: []*wire.Item{{Key: 1, Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{{Name: "x", Slices: []*wire.ColumnSlice{{ChunkKey: 7, Length: 1}}}}}}}),
		// An item for an unknown table, one with a negative priority, one
		// with a NaN priority, one referencing a chunk nobody sent.
		mustMarshal(t, &wire.InsertBatch{ProducerId: "evil", Sequence: 2, WindowStart: 1, Window: 4, Items: []*wire.Item{
			{Key: 2, Table: "nope", Priority: 1},
			{Key: 3, Table: "t", Priority: -1},
			{Key: 4, Table: "t", Priority: math.NaN()},
			{Key: 5, Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{{Name: "x", Slices: []*wire.ColumnSlice{{ChunkKey: 99, Length: 1}}}}},
		}}),
	}
	for i := range int64(50) {
		if err := p.Append(ctx, step(i, 3)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, broker.LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			g := garbage[i/10]
			if _, err := d.svc.js.Publish(ctx, d.svc.subj.Insert(), g); err != nil {
				t.Fatal(err)
			}
			if _, err := d.svc.js.Publish(ctx, d.svc.subj.Mutate(), g); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := nc.Publish(d.svc.subj.Prefix+".data.insert", []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := d.client().Info(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if info.Tables[0].Size != 50 {
		t.Fatalf("table holds %d items, want the 50 valid ones", info.Tables[0].Size)
	}
	if info.RejectedMessages < 8 {
		t.Fatalf("service counted %d rejections, want at least 8", info.RejectedMessages)
	}
	samples, err := d.client().Sample(ctx, "t", 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		checkObs(t, s, 3)
	}
}

// TestRejectionsReachProducer: the service tells a producer what it
// refused and why; the producer returns it from its next Flush.
func TestRejectionsReachProducer(t *testing.T) {
	sig := tables.Signature{{Name: "obs", DType: "float32", Shape: []int64{3}}}
	cfg := testutil.UniformTable("typed", 100)
	cfg.Signature = sig
	d := deploy(t, []tables.Config{cfg}, deployOptions{})
	ctx := testutil.Context(t)
	p := d.producer()
	if err := p.Append(ctx, broker.Step{"obs": broker.Float32s([]int64{4}, make([]float32, 4)), "id": broker.Int64s(nil, []int64{1})}); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "typed", 1, broker.LastStep("obs")); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "missing", 1, broker.LastStep("obs")); err != nil {
		t.Fatal(err)
	}
	err := p.WaitApplied(ctx)
	if !errors.Is(err, protocol.ErrRejected) {
		t.Fatalf("WaitApplied = %v, want protocol.ErrRejected", err)
	}
	for _, want := range []string{`"obs"`, `"missing"`} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("rejection %q does not name %s", err, want)
		}
	}
	// broker.Producer-side checks fail at once.
	if err := p.Append(ctx, broker.Step{"obs": broker.Int32s([]int64{4}, make([]int32, 4))}); !errors.Is(err, protocol.ErrSignature) {
		t.Fatalf("append with a changed dtype: %v, want protocol.ErrSignature", err)
	}
	if err := p.CreateItem(ctx, "typed", math.Inf(1), broker.LastStep("obs")); !errors.Is(err, protocol.ErrInvalidMessage) {
		t.Fatalf("infinite priority: %v, want protocol.ErrInvalidMessage", err)
	}
	if err := p.CreateItem(ctx, "typed", 1, broker.Last(5, "obs")); !errors.Is(err, protocol.ErrHistory) {
		t.Fatalf("item longer than the episode: %v, want protocol.ErrHistory", err)
	}
}

// TestMutationsAndReset: priority updates and deletes travel through the
// stream and apply in order; reset empties a table.
func TestMutationsAndReset(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.TableConfig("heap", selectors.Options{Kind: selectors.KindMaxHeap}, selectors.Options{Kind: selectors.KindFifo}, 100, limiter.MinSize(1))}, deployOptions{})
	ctx := testutil.Context(t)
	p := d.producer()
	for i := range int64(5) {
		if err := p.Append(ctx, broker.Step{"id": broker.Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "heap", float64(i), broker.LastStep("id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	c := d.client()
	top := func() broker.Sample {
		t.Helper()
		s, err := c.Sample(ctx, "heap", 1)
		if err != nil {
			t.Fatal(err)
		}
		return s[0]
	}
	first := top()
	if ids(t, first)[0] != 4 {
		t.Fatalf("max heap top is step %d, want 4", ids(t, first)[0])
	}
	// Delete the top; raise step 1 above the rest; a missing key is skipped.
	var key1 uint64
	for range 50 {
		// Find step 1's key by lowering everything else.
		s := top()
		if ids(t, s)[0] == 1 {
			key1 = s.Info.Key
			break
		}
		if err := c.Mutate(ctx, "heap", tables.Mutation{Key: s.Info.Key, Priority: 0}); err != nil {
			t.Fatal(err)
		}
		testutil.WaitUntil(t, "priority update applied", func() bool { return top().Info.Key != s.Info.Key })
	}
	if key1 == 0 {
		t.Fatal("never saw step 1 at the top")
	}
	if err := c.Mutate(ctx, "heap", tables.Mutation{Key: 12345, Delete: true}, tables.Mutation{Key: key1, Delete: true}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitUntil(t, "delete applied", func() bool { return ids(t, top())[0] != 1 })
	if err := c.Mutate(ctx, "heap", tables.Mutation{Key: 1, Priority: math.NaN()}); !errors.Is(err, protocol.ErrInvalidMessage) {
		t.Fatalf("NaN priority update: %v, want protocol.ErrInvalidMessage", err)
	}
	if err := c.Reset(ctx, "heap"); err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx, "heap")
	if err != nil {
		t.Fatal(err)
	}
	if ti := info.Tables[0]; ti.Size != 0 || ti.Limiter.Inserts != 0 {
		t.Fatalf("after reset: size %d, limiter inserts %d; want 0 and 0", ti.Size, ti.Limiter.Inserts)
	}
	if err := c.Reset(ctx, "nope"); !errors.Is(err, protocol.ErrUnknownTable) {
		t.Fatalf("reset of an unknown table: %v, want protocol.ErrUnknownTable", err)
	}
	if _, err := c.Sample(ctx, "nope", 1); !errors.Is(err, protocol.ErrUnknownTable) {
		t.Fatalf("sample of an unknown table: %v, want protocol.ErrUnknownTable", err)
	}
}

// TestManyActorsAndLearners: several actors and prefetching learners at
// once on a prioritized table; every sample decodes to the data appended.
func TestManyActorsAndLearners(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.TableConfig("per", selectors.Options{Kind: selectors.KindPrioritized, Exponent: 0.6}, selectors.Options{Kind: selectors.KindFifo}, 500, limiter.MinSize(10))}, deployOptions{})
	ctx := testutil.Context(t)
	const actors, steps = 4, 150
	var wg sync.WaitGroup
	for a := range actors {
		p := d.producer(broker.WithChunkLength(5))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range int64(steps) {
				if err := p.Append(ctx, step(int64(a)*10_000+i, 8)); err != nil {
					t.Error(err)
					return
				}
				if i >= 4 {
					if err := p.CreateItem(ctx, "per", float64(i%7), broker.Last(5, "obs", "id")); err != nil {
						t.Error(err)
						return
					}
				}
			}
			if err := p.EndEpisode(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	c := d.client()
	var learners sync.WaitGroup
	for range 3 {
		s, err := c.NewSampler("per", 16, broker.WithInFlight(3))
		if err != nil {
			t.Fatal(err)
		}
		learners.Add(1)
		go func() {
			defer learners.Done()
			defer s.Close()
			for range 20 {
				batch, err := s.Next(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				for _, smp := range batch {
					idv := ids(t, smp)
					for k := 1; k < len(idv); k++ {
						if idv[k] != idv[k-1]+1 {
							t.Errorf("item steps %v not consecutive", idv)
						}
					}
					checkObs(t, smp, 8)
				}
			}
		}()
	}
	wg.Wait()
	learners.Wait()
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	data, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestProducerGap: messages of one producer that the stream stored out of
// order (a retry after a lost publish) are applied in the producer's order;
// when the missing message never comes, the service gives up on it after
// the gap timeout and applies the rest.
func TestProducerGap(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 100)}, deployOptions{service: []Option{WithGapTimeout(200 * time.Millisecond)}})
	ctx := testutil.Context(t)
	publish := func(producer string, seq uint64, id int64) {
		t.Helper()
		ch, err := wire.EncodeChunk(uint64(1000+id), []*wire.Tensor{wire.Int64s(nil, []int64{id})}, wire.ChunkOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := &wire.InsertBatch{ProducerId: producer, Sequence: seq, WindowStart: 1, Window: 1024, Chunks: []*wire.Chunk{ch},
			Items: []*wire.Item{{Key: uint64(id), Table: "queue", Priority: 1, Columns: []*wire.TrajectoryColumn{{Name: "id", Squeeze: true, Slices: []*wire.ColumnSlice{{ChunkKey: ch.Key, Length: 1}}}}}}}
		if _, err := d.svc.js.Publish(ctx, d.svc.subj.Insert(), mustMarshal(t, m)); err != nil {
			t.Fatal(err)
		}
	}
	c := d.client()
	drain := func(n int) []int64 {
		t.Helper()
		var got []int64
		for len(got) < n {
			s, err := c.Sample(ctx, "queue", 1)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, ids(t, s[0])[0])
		}
		return got
	}
	publish("a", 1, 1)
	publish("a", 3, 3)
	publish("a", 4, 4)
	publish("a", 2, 2)
	publish("a", 2, 2) // a duplicate the dedupe window did not catch
	if got := drain(4); !slices.Equal(got, []int64{1, 2, 3, 4}) {
		t.Fatalf("queue order %v, want [1 2 3 4]", got)
	}
	// Message 6 arrives, 5 never does: 6 waits for the gap timeout.
	publish("b", 1, 10)
	publish("b", 3, 12)
	if got := drain(1); got[0] != 10 {
		t.Fatalf("got %v, want 10 first", got)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := c.Sample(short, "queue", 1); !errors.Is(err, protocol.ErrRateLimited) {
		t.Fatalf("sample while message 2 is missing: %v, want protocol.ErrRateLimited (message 3 held)", err)
	}
	// Stream time moves on with any later message.
	testutil.WaitUntil(t, "gap timeout passes", func() bool {
		publish("c", 1, 20)
		info, err := c.Info(ctx, "queue")
		return err == nil && info.Tables[0].Size >= 2 && slices.Contains(drainAll(t, c, ctx), int64(12))
	})
}

func drainAll(t *testing.T, c *broker.Client, ctx context.Context) []int64 {
	var out []int64
	for {
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		s, err := c.Sample(short, "queue", 1)
		cancel()
		if err != nil {
			return out
		}
		out = append(out, ids(t, s[0])[0])
	}
}

// TestItems: items are listed by page in insertion order and fetched by key.
func TestItems(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{})
	ctx := testutil.Context(t)
	p := d.producer()
	fill(t, p, 0, 25, "t")
	c := d.client()
	page, err := c.Items(ctx, "t", 20, 10)
	if err != nil {
		t.Fatal(err)
	}
	if page.TableSize != 25 || len(page.Items) != 5 {
		t.Fatalf("page after 20: %d items of %d, want 5 of 25", len(page.Items), page.TableSize)
	}
	for i, it := range page.Items {
		if it.Priority != float64((20+i)%10) {
			t.Fatalf("item %d has priority %v, want %d (insertion order)", 20+i, it.Priority, (20+i)%10)
		}
	}
	byKey, err := c.Get(ctx, "t", page.Items[3].Key, 999, page.Items[1].Key)
	if err != nil {
		t.Fatal(err)
	}
	if len(byKey.Items) != 2 || byKey.Items[0].Key != page.Items[3].Key || byKey.Items[1].Key != page.Items[1].Key {
		t.Fatalf("by key: %v", byKey.Items)
	}
	if _, err := c.Items(ctx, "t", 0, 1_000_000); !errors.Is(err, protocol.ErrInvalidMessage) {
		t.Fatalf("oversized page: %v, want protocol.ErrInvalidMessage", err)
	}
}

// TestItemsReplyBounded: an items request whose reply would take more than
// limits.max_reply_bytes is refused, by keys (one long item asked for
// 10,000 times, 150 MB of reply) and by page (15 MB), having built little;
// a smaller one of the same items is served. The service used to build and
// send it all.
func TestItemsReplyBounded(t *testing.T) {
	limits := DefaultLimits()
	limits.MaxItemBytes, limits.MaxReplyBytes = 1<<20, 4<<20
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10_000)}, deployOptions{service: []Option{WithLimits(limits)}})
	ctx := testutil.Context(t)
	const steps = 1024
	p := d.producer(broker.WithChunkLength(1), broker.WithHistory(steps))
	for i := range int64(steps) {
		if err := p.Append(ctx, broker.Step{"id": broker.Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
	}
	// 1024 items of 1024 slices each: about 15 kB apiece to describe.
	for range steps {
		if err := p.CreateItem(ctx, "t", 1, broker.Last(steps, "id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	c := d.client()
	first, err := c.Items(ctx, "t", 0, 100)
	if err != nil || len(first.Items) != 100 || len(first.Items[0].Trajectory[0].Slices) != steps {
		t.Fatalf("a page of 100: %v, %v", first, err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = c.Get(ctx, "t", slices.Repeat([]uint64{first.Items[0].Key}, maxListItems)...)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, protocol.ErrResourceExhausted) || !strings.Contains(err.Error(), "ask for fewer") {
		t.Fatalf("10,000 keys of a long item: %v, want ErrResourceExhausted", err)
	}
	if built := after.TotalAlloc - before.TotalAlloc; built > 64<<20 {
		t.Errorf("refusing it allocated %d MiB", built>>20)
	}
	if _, err := c.Items(ctx, "t", 0, maxListItems); !errors.Is(err, protocol.ErrResourceExhausted) {
		t.Fatalf("a page of every long item: %v, want ErrResourceExhausted", err)
	}
}

// TestBlockedTableHoldsOnlyItsOwn: a table whose rate limiter holds its
// items does not hold up another table's. Every item written to the free
// table lands and can be sampled while the held one is full; only the
// producer writing to the held table waits, and its items land, exactly
// once and in order, as a learner makes room.
func TestBlockedTableHoldsOnlyItsOwn(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("held", 2), testutil.UniformTable("free", 1000)}, deployOptions{})
	ctx := testutil.Context(t)
	blocked := d.producer(broker.WithLinger(0), broker.WithMaxUnapplied(100), broker.WithReturnOnStore())
	for i := range int64(8) {
		if err := blocked.Append(ctx, broker.Step{"id": broker.Int64s(nil, []int64{i})}); err != nil {
			t.Fatal(err)
		}
		if err := blocked.CreateItem(ctx, "held", 1, broker.LastStep("id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := blocked.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	held, _ := d.svc.Table("held")
	testutil.WaitUntil(t, "the held table is full and its other items wait", func() bool {
		return held.Size() == 2 && d.svc.Applied() > 0 && d.svc.pendingLen("held") == 6
	})

	// Another producer's items for the free table land meanwhile; its
	// WaitApplied returns.
	free := d.producer(broker.WithLinger(0))
	for i := range int64(20) {
		if err := free.Append(ctx, step(i, 2)); err != nil {
			t.Fatal(err)
		}
		if err := free.CreateItem(ctx, "free", 1, broker.LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := free.WaitApplied(ctx); err != nil {
		t.Fatalf("the free table's producer: %v", err)
	}
	c := d.client()
	if info, err := c.Info(ctx, "free"); err != nil || info.Tables[0].Size != 20 {
		t.Fatalf("free table info %+v, %v: want 20 items", info, err)
	}
	if _, err := c.Sample(ctx, "free", 20); err != nil {
		t.Fatal(err)
	}
	// The held table's producer has not had its items applied.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := blocked.WaitApplied(short); !errors.Is(err, broker.ErrNotApplied) {
		t.Fatalf("WaitApplied of the held table's producer = %v, want ErrNotApplied while 6 items wait", err)
	}

	// A learner makes room: all 8 arrive once each, in order.
	for want := range int64(8) {
		s, err := c.Sample(ctx, "held", 1)
		if err != nil {
			t.Fatalf("item %d: %v", want, err)
		}
		if got := ids(t, s[0])[0]; got != want {
			t.Fatalf("held table delivered %d, want %d", got, want)
		}
	}
	if err := blocked.WaitApplied(ctx); err != nil {
		t.Fatalf("once the items landed: %v", err)
	}
	if n := d.svc.pendingLen("held"); n != 0 {
		t.Fatalf("%d items still wait", n)
	}
}

// TestReadYourWrites: once Flush or a mutation returns, a sample, info or
// Get from the same process sees it, round after round (before, 1 or 2
// rounds in 50 did not); with WithReturnOnStore they return once stored.
func TestReadYourWrites(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10_000)}, deployOptions{})
	ctx := testutil.Context(t)
	p := d.producer(broker.WithLinger(time.Hour))
	c := d.client()
	for round := range int64(50) {
		if err := p.Append(ctx, step(round, 2)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, broker.LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
		if err := p.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctx, "t")
		if err != nil || info.Tables[0].Size != round+1 {
			t.Fatalf("round %d: after Flush, info = %+v, %v; want %d items", round, info, err, round+1)
		}
		s, err := c.Sample(ctx, "t", 1)
		if err != nil {
			t.Fatal(err)
		}
		key, prio := s[0].Info.Key, float64(round+2)
		if err := c.UpdatePriorities(ctx, "t", tables.PriorityUpdate{Key: key, Priority: prio}); err != nil {
			t.Fatal(err)
		}
		got, err := c.Get(ctx, "t", key)
		if err != nil || len(got.Items) != 1 || got.Items[0].Priority != prio {
			t.Fatalf("round %d: after UpdatePriorities, item %d = %+v, %v; want priority %v", round, key, got, err, prio)
		}
	}
}

// TestStalenessEndToEnd: items carry their producer's policy version; a
// learner raises the table's version through the stream; with
// max_staleness 1 the items two versions behind are removed, stale
// inserts dropped, info says so, and the version survives a restart.
func TestStalenessEndToEnd(t *testing.T) {
	cs, err := NewFileCheckpoints(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	one := int64(1)
	cfg := testutil.UniformTable("t", 100)
	cfg.MaxStaleness = &one
	cfgs := []tables.Config{cfg}
	d := deploy(t, cfgs, deployOptions{service: []Option{WithCheckpoints(cs)}})
	ctx := testutil.Context(t)
	p := d.producer(broker.WithLinger(0))
	c := d.client()
	write := func(version int64, ids ...int64) {
		t.Helper()
		p.SetPolicyVersion(version)
		for _, i := range ids {
			if err := p.Append(ctx, step(i, 2)); err != nil {
				t.Fatal(err)
			}
			if err := p.CreateItem(ctx, "t", 1, broker.LastStep("obs", "id")); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	write(0, 0, 1)
	write(1, 10, 11)
	write(2, 20)
	if err := c.SetPolicyVersion(ctx, "t", 2); err != nil {
		t.Fatal(err)
	}
	write(0, 2) // stale on arrival
	info, err := c.Info(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	ti := info.Tables[0]
	if ti.Size != 3 || ti.PolicyVersion != 2 || ti.StaleEvictions != 3 || ti.MinItemVersion != 1 || ti.MaxItemVersion != 2 ||
		ti.MaxStaleness == nil || *ti.MaxStaleness != 1 {
		t.Fatalf("info %+v: want 3 items of versions 1..2 at version 2, 3 stale evictions, max_staleness 1", ti)
	}
	for range 20 {
		s, err := c.Sample(ctx, "t", 1)
		if err != nil {
			t.Fatal(err)
		}
		if id := ids(t, s[0])[0]; id < 10 {
			t.Fatalf("sampled item %d of version 0 at version 2 with max_staleness 1", id)
		}
	}
	list, err := c.Items(ctx, "t", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range list.Items {
		if it.PolicyVersion < 1 {
			t.Fatalf("listed item %d of version %d", it.Key, it.PolicyVersion)
		}
	}
	d.stop()
	d.startService(cfgs, WithCheckpoints(cs))
	if err := c.SetPolicyVersion(ctx, "t", 1); err != nil { // lower: no change
		t.Fatal(err)
	}
	info, err = d.client().Info(ctx, "t")
	if err != nil || info.Tables[0].PolicyVersion != 2 || info.Tables[0].Size != 3 {
		t.Fatalf("after a restart: %+v, %v; want version 2 and 3 items", info, err)
	}
	// The bound changes at runtime: 0 keeps only version 2; then none.
	if err := c.SetMaxStaleness(ctx, "t", 0); err != nil {
		t.Fatal(err)
	}
	info, err = c.Info(ctx, "t")
	if ti := info.Tables[0]; err != nil || ti.Size != 1 || ti.MaxStaleness == nil || *ti.MaxStaleness != 0 {
		t.Fatalf("after max_staleness 0: %+v, %v; want the one item of version 2", ti, err)
	}
	if err := c.SetMaxStaleness(ctx, "t", -1); err != nil {
		t.Fatal(err)
	}
	write(0, 3)
	info, err = c.Info(ctx, "t")
	if ti := info.Tables[0]; err != nil || ti.Size != 2 || ti.MaxStaleness != nil {
		t.Fatalf("without a bound: %+v, %v; want the old version's item kept", ti, err)
	}
}

// TestUnpackedSampleRequests: a request without packed, as clients older
// than packed replies send, gets the items one message each with their
// chunks whole, and they say what a packed reply says; a request without
// a layout, as clients older than the compact layout send, gets the wide
// one.
func TestUnpackedSampleRequests(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 1000)}, deployOptions{})
	insertSteps(t, d.producer(), 0, 1, 8)
	nc := d.connect()
	ask := func(packed bool, layout wire.PackedLayout) []byte {
		return requestSample(t, nc, d.prefix, &wire.SampleRequest{Table: "t", NumSamples: 3, TimeoutMs: 5000, Packed: packed, Layout: layout})
	}
	var old wire.SampleResponse
	if err := proto.Unmarshal(ask(false, wire.PackedLayout_PACKED_LAYOUT_COMPACT), &old); err != nil {
		t.Fatal(err)
	}
	if len(old.Items) != 3 || len(old.Chunks) != 2 || old.Packed != nil {
		t.Fatalf("unpacked reply: %d items, %d chunks, packed %v; want 3 items of 2 chunks (obs and id), nothing packed", len(old.Items), len(old.Chunks), old.Packed != nil)
	}
	var wide wire.SampleResponse
	if err := proto.Unmarshal(ask(true, wire.PackedLayout_PACKED_LAYOUT_WIDE), &wide); err != nil {
		t.Fatal(err)
	}
	if p := wide.GetPacked(); len(p.GetInfos()) != 3*56 || len(p.GetCompactInfos()) != 0 || binary.LittleEndian.Uint64(p.GetInfos()) != old.Items[0].Info.Key {
		t.Fatalf("a request without a layout: %d bytes of wide infos, %d of compact ones; want three 56-byte records of item %d", len(p.GetInfos()), len(p.GetCompactInfos()), old.Items[0].Info.Key)
	}
	if _, err := wire.DecodeSampleResponse(ask(true, wire.PackedLayout_PACKED_LAYOUT_WIDE)); !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("this client decoding the wide layout: %v, want it refused", err)
	}
	packed, err := wire.DecodeSampleResponse(ask(true, wire.PackedLayout_PACKED_LAYOUT_COMPACT))
	if err != nil {
		t.Fatal(err)
	}
	if len(packed.Samples) != 3 {
		t.Fatalf("packed reply: %d items, want 3", len(packed.Samples))
	}
	decoded := map[uint64]*wire.Tensor{}
	for _, raw := range old.Chunks {
		var c wire.Chunk
		if err := proto.Unmarshal(raw, &c); err != nil {
			t.Fatal(err)
		}
		if decoded[c.Key], err = wire.DecodeChunk(&c); err != nil {
			t.Fatal(err)
		}
	}
	for i, it := range old.Items {
		got := packed.Samples[i]
		if it.Info.Key != got.Info.Key || len(it.Columns) != len(got.Columns) {
			t.Fatalf("item %d: unpacked key %d with %d columns, packed %d with %d", i, it.Info.Key, len(it.Columns), got.Info.Key, len(got.Columns))
		}
		for j, col := range it.Columns {
			g, err := wire.GatherColumn(col, func(k uint64) (*wire.Tensor, bool) { c, ok := decoded[k]; return c, ok })
			if err != nil {
				t.Fatal(err)
			}
			if pc := got.Columns[j]; pc.Name != col.Name || !slices.Equal(pc.Shape, g.Shape) || string(pc.Data) != string(g.Data) {
				t.Fatalf("item %d column %q: unpacked %v %x, packed %q %v %x", i, col.Name, g.Shape, g.Data, pc.Name, pc.Shape, pc.Data)
			}
		}
	}
}

// requestSample sends req to the sample subject of the service with
// prefix, as a client would, and returns the reply's bytes.
func requestSample(t *testing.T, nc *nats.Conn, prefix string, req *wire.SampleRequest) []byte {
	t.Helper()
	subj, err := protocol.NewSubjects(prefix)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	m, err := nc.RequestWithContext(testutil.Context(t), subj.Sample(), b)
	if err != nil {
		t.Fatal(err)
	}
	return m.Data
}

// TestUniformReplies: reprised answers a request for the uniform layout
// with uniform columns when the items sampled are distinct, each column one
// step of a chunk of its own, and with the compact records when items
// share chunks; Client.Sample decodes both.
func TestUniformReplies(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("t", 100)}, deployOptions{})
	insertSteps(t, d.producer(), 0, 6, 8)
	nc := d.connect()
	ask := func(layout wire.PackedLayout) *wire.PackedSamples {
		b := requestSample(t, nc, d.prefix, &wire.SampleRequest{Table: "t", NumSamples: 3, TimeoutMs: 5000, Packed: true, Layout: layout})
		var r wire.SampleResponse
		if err := proto.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		return r.GetPacked()
	}
	// Items of one step of obs and id, each a chunk of its own.
	c, u := ask(wire.PackedLayout_PACKED_LAYOUT_COMPACT), ask(wire.PackedLayout_PACKED_LAYOUT_UNIFORM)
	if len(c.GetCompactColumns()) != 3*2*8 || len(c.GetUniformColumns()) != 0 ||
		len(u.GetUniformColumns()) != 2*32 || len(u.GetCompactColumns())+len(u.GetSlices())+len(u.GetCompactChunks()) != 0 {
		t.Fatalf("compact reply: %d bytes of column records, %d of uniform ones; uniform reply: %d and %d; want 48 and 0, 0 and 64",
			len(c.GetCompactColumns()), len(c.GetUniformColumns()), len(u.GetCompactColumns()), len(u.GetUniformColumns()))
	}
	// Items of two steps share the chunk of the step between.
	p := d.producer()
	for i := int64(6); i < 9; i++ {
		if err := p.Append(testutil.Context(t), step(i, 8)); err != nil {
			t.Fatal(err)
		}
		if i > 6 {
			if err := p.CreateItem(testutil.Context(t), "t", 1, broker.Last(2, "obs", "id")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.WaitApplied(testutil.Context(t)); err != nil {
		t.Fatal(err)
	}
	got, err := d.client().Sample(testutil.Context(t), "t", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !slices.Equal(ids(t, got[0]), []int64{6, 7}) || !slices.Equal(ids(t, got[1]), []int64{7, 8}) {
		t.Fatalf("sampled %d items, want the items of steps 6-7 and 7-8", len(got))
	}
	if u := ask(wire.PackedLayout_PACKED_LAYOUT_UNIFORM); u != nil {
		t.Fatalf("the queue still holds items: %d bytes of infos", len(u.GetCompactInfos()))
	}
}
