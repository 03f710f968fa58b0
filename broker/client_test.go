package broker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
	"google.golang.org/protobuf/proto"
)

// TestSampledTensorsAreTheLearners: a learner may write into the tensors
// it sampled. Writing into every one changes no other sample of the same
// batch (which repeats items and shares chunks), nothing the table holds,
// and no later reply; for every codec, since uncompressed chunks are
// handed over without a copy.
func TestSampledTensorsAreTheLearners(t *testing.T) {
	for _, codec := range []wire.Codec{wire.Uncompressed, wire.Zstd} {
		t.Run(codec.String(), func(t *testing.T) {
			const obsLen = 8
			d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, "")
			ctx := testutil.Context(t)
			p := d.producer(WithCompression(codec), WithChunkLength(2))
			for i := range int64(4) {
				if err := p.Append(ctx, step(i, obsLen)); err != nil {
					t.Fatal(err)
				}
				// One-step items whose chunks they share with a neighbour,
				// and two-step items across a chunk boundary.
				if err := p.CreateItem(ctx, "t", 1, LastStep("obs", "id")); err != nil {
					t.Fatal(err)
				}
				if i > 0 {
					if err := p.CreateItem(ctx, "t", 1, Last(2, "obs", "id")); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := p.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			c := d.client()
			for range 3 {
				batch, err := c.Sample(ctx, "t", 64)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range batch {
					checkObs(t, s, obsLen)
				}
				for _, s := range batch {
					for _, col := range s.Columns {
						for i := range col.Tensor.Data {
							col.Tensor.Data[i] ^= 0x5a
						}
					}
				}
				for _, s := range batch {
					for _, col := range s.Columns {
						for i := range col.Tensor.Data {
							col.Tensor.Data[i] ^= 0x5a
						}
					}
					// Scrambled once by its own writer and unscrambled once:
					// intact only if no other sample's writes reached it.
					checkObs(t, s, obsLen)
				}
			}
		})
	}
}

// TestSampleFailsWhenTheServiceDies: a sample whose service takes the
// request and then dies, never answering, fails with ErrServer soon after,
// instead of waiting without end. A subscriber that swallows sample
// requests stands in for the dead service (a killed reprised does the same
// in internal/crashtest): nothing listens for info.
func TestSampleFailsWhenTheServiceDies(t *testing.T) {
	url := testutil.StartEmbedded(t, 0)
	d := &deployment{t: t, url: url, prefix: "gone"}
	swallowed := make(chan struct{}, 1)
	stand := d.connect()
	if _, err := stand.Subscribe("gone.api.sample", func(*nats.Msg) {
		select {
		case swallowed <- struct{}{}:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	// The server knows the subscription before the request comes.
	if err := stand.Flush(); err != nil {
		t.Fatal(err)
	}
	c := d.client()
	_, err := c.Sample(context.Background(), "t", 1) // no deadline
	if !errors.Is(err, ErrServer) || !strings.Contains(err.Error(), "stopped while the sample waited") {
		t.Fatalf("sample of a service that never answers: %v, want ErrServer saying it stopped", err)
	}
	select {
	case <-swallowed:
	default:
		t.Fatal("the request never reached the stand-in")
	}
}

// TestRequestsOfCallersGoneAreNotSent: a call whose context already ended
// sends nothing, since the service would act on it (a sample takes its
// items, a reset empties the table) for a caller that is not listening. A
// stand-in subscriber sees every request the client's connection sends,
// in order, and the first it sees is a marker sent after the calls.
func TestRequestsOfCallersGoneAreNotSent(t *testing.T) {
	url := testutil.StartEmbedded(t, 0)
	d := &deployment{t: t, url: url, prefix: "gone"}
	seen := make(chan string, 16)
	stand := d.connect()
	if _, err := stand.Subscribe("gone.api.>", func(m *nats.Msg) { seen <- string(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := stand.Flush(); err != nil {
		t.Fatal(err)
	}
	nc := d.connect()
	c, err := NewClient(nc, WithPrefix("gone"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if _, err := c.Sample(cancelled, "t", 1); !errors.Is(err, context.Canceled) {
		t.Errorf("sample with a cancelled context: %v, want context.Canceled", err)
	}
	if _, err := c.Sample(expired, "t", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("sample with an expired context: %v, want context.DeadlineExceeded", err)
	}
	if err := c.Reset(cancelled, "t"); !errors.Is(err, context.Canceled) {
		t.Errorf("reset with a cancelled context: %v, want context.Canceled", err)
	}
	if err := nc.Publish("gone.api.sample", []byte("marker")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-seen:
		if got != "marker" {
			t.Fatalf("the stand-in got a request before the marker: %q", got)
		}
	case <-testutil.Context(t).Done():
		t.Fatal("the marker never reached the stand-in")
	}
}

// TestSamplerNextEndsAtClose: a Next waiting on a sampler whose requests
// the rate limiter holds returns ErrClosed when the sampler closes, and so
// does every Next after.
func TestSamplerNextEndsAtClose(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 4)}, "")
	ctx := testutil.Context(t)
	s, err := d.client().NewSampler("queue", 1, WithInFlight(1))
	if err != nil {
		t.Fatal(err)
	}
	next := make(chan error, 1)
	go func() {
		_, err := s.Next(context.Background())
		next <- err
	}()
	q, _ := d.svc.Table("queue")
	testutil.WaitUntil(t, "the sampler's request waits on the empty queue", func() bool { return q.Info().Counters.SampleWaits > 0 })
	s.Close()
	select {
	case err := <-next:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("the waiting Next: %v, want ErrClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("Next still waits after Close")
	}
	if _, err := s.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close: %v, want ErrClosed", err)
	}
}

// TestCallsEndWithTheirConnection: a connection closed for good ends the
// calls waiting for their replies at once, with an error that says so: a
// sample held by the rate limiter waited out its deadline (70 s), and a
// call whose deadline is the caller's, as long as that. A
// sampler on it ends itself: Next says why, then ErrClosed, and its
// requests stop (a learner that dropped its sampler with its connection
// left them blocked, two a sampler, in a soak test's driver).
func TestCallsEndWithTheirConnection(t *testing.T) {
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 4)}, "")
	ctx := testutil.Context(t)
	nc := d.connect()
	c, err := NewClient(nc, WithPrefix(d.prefix))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.NewSampler("queue", 1, WithInFlight(2))
	if err != nil {
		t.Fatal(err)
	}
	sampled := make(chan error, 1)
	go func() {
		_, err := c.Sample(context.Background(), "queue", 1)
		sampled <- err
	}()
	q, _ := d.svc.Table("queue")
	testutil.WaitUntil(t, "the requests wait on the empty queue", func() bool { return q.Info().Counters.SampleWaits >= 3 })
	nc.Close()
	select {
	case err := <-sampled:
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("the waiting Sample: %v, want nats.ErrConnectionClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("Sample still waits after its connection closed")
	}
	for {
		_, err := s.Next(ctx)
		if errors.Is(err, ErrClosed) {
			break
		}
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("Next after the connection closed: %v, want nats.ErrConnectionClosed, then ErrClosed", err)
		}
	}
	stopped := make(chan struct{})
	go func() {
		s.p.wg.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("the sampler's requests go on after its connection closed")
	}
}

// deleteWaitingForTheService starts a Delete on c of a table "t" that the
// deployment's service, stopped first, never applies (the stream keeps
// it), and returns its outcome once it waits for the service.
func deleteWaitingForTheService(t *testing.T, d *deployment, c *Client) <-chan error {
	t.Helper()
	if err := c.Delete(testutil.Context(t), "t", 1); err != nil { // learns the table
		t.Fatal(err)
	}
	d.stopService()
	done := make(chan error, 1)
	go func() { done <- c.Delete(context.Background(), "t", 2) }()
	testutil.WaitUntil(t, "the delete waits for the service", func() bool {
		c.applied.mu.Lock()
		defer c.applied.mu.Unlock()
		return c.applied.changed != nil
	})
	return done
}

// TestMutationWaitEndsWithItsConnection: a mutation JetStream stored,
// waiting for the service to apply it, ends once its connection is closed
// for good, as the calls waiting for replies do, since no progress can
// come then; it waited for ever. It says the mutation is not known to be
// applied (ErrNotApplied), not that it is lost: the stream holds it.
func TestMutationWaitEndsWithItsConnection(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	nc := d.connect()
	c, err := NewClient(nc, WithPrefix(d.prefix))
	if err != nil {
		t.Fatal(err)
	}
	done := deleteWaitingForTheService(t, d, c)
	nc.Close()
	select {
	case err := <-done:
		if !errors.Is(err, nats.ErrConnectionClosed) || !errors.Is(err, ErrNotApplied) {
			t.Fatalf("the waiting Delete: %v, want nats.ErrConnectionClosed and ErrNotApplied", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Delete still waits after its connection closed")
	}
}

// TestNoMutationFromAClosedClient: a mutation is durable once published,
// so a closed client refuses it at once (ErrClosed, and not ErrNotApplied,
// which would say it went out).
func TestNoMutationFromAClosedClient(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	ctx := testutil.Context(t)
	c := d.client()
	if err := c.Delete(ctx, "t", 1); err != nil {
		t.Fatal(err)
	}
	c.Close()
	for name, call := range map[string]func() error{
		"Delete":           func() error { return c.Delete(ctx, "t", 2) },
		"SetPolicyVersion": func() error { return c.SetPolicyVersion(ctx, "t", 3) },
	} {
		if err := call(); !errors.Is(err, ErrClosed) || errors.Is(err, ErrNotApplied) {
			t.Errorf("%s after Close: %v, want ErrClosed alone", name, err)
		}
	}
}

// TestMutationsOfManyKeysAreApplied: a mutation of more ops than the
// service's limits.max_mutation_ops, and larger than NATS's max payload, is
// sent in parts and applied. Delete of 100,000 keys failed with "maximum
// payload exceeded", and one of 70,000 returned nil while the service
// refused it whole: the items it deleted were all still there.
func TestMutationsOfManyKeysAreApplied(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, "")
	ctx := testutil.Context(t)
	p := d.producer()
	for i := range int64(3) {
		if err := p.Append(ctx, step(i, 4)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c := d.client()
	items, err := c.Items(ctx, "t", 0, 10)
	if err != nil || len(items.Items) != 3 {
		t.Fatalf("items %v, %v; want 3", items, err)
	}
	for _, n := range []int{70_000, 100_000} {
		keys := make([]uint64, n)
		for i := range keys {
			keys[i] = uint64(1<<40 + i)
		}
		ups := make([]tables.PriorityUpdate, len(keys))
		for i, k := range keys {
			ups[i] = tables.PriorityUpdate{Key: k, Priority: 1}
		}
		if err := c.UpdatePriorities(ctx, "t", ups...); err != nil {
			t.Fatalf("UpdatePriorities of %d keys: %v", n, err)
		}
	}
	keys := make([]uint64, 70_000)
	for i := range keys {
		keys[i] = uint64(1<<40 + i)
	}
	for i, it := range items.Items {
		keys[len(keys)-1-i] = it.Key // in the last part
	}
	if err := c.Delete(ctx, "t", keys...); err != nil {
		t.Fatalf("Delete of %d keys: %v", len(keys), err)
	}
	if after, err := c.Items(ctx, "t", 0, 10); err != nil || len(after.Items) != 0 {
		t.Fatalf("after Delete of %d keys the table holds %v (%v), want none", len(keys), after, err)
	}
}

// TestCloseTwice: a second Close (a deferred one after an explicit one)
// does nothing, as Python's close; it returned "nats: invalid
// subscription".
func TestCloseTwice(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	c := d.client()
	for i := range 2 {
		if err := c.Close(); err != nil {
			t.Fatalf("Close %d: %v", i+1, err)
		}
	}
}

// TestSamplerRefusesANonPositiveTimeout: WithRateLimitTimeout of 0 or less
// is refused, as Python's sampler refuses it: a port of Reverb's
// rate_limiter_timeout_ms=0 ("do not wait") waited the service's minute.
func TestSamplerRefusesANonPositiveTimeout(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, "")
	c := d.client()
	for _, timeout := range []time.Duration{-time.Second, 0} {
		s, err := c.NewSampler("t", 1, WithRateLimitTimeout(timeout))
		if err == nil {
			s.Close()
		}
		if !errors.Is(err, ErrInvalidOption) {
			t.Errorf("WithRateLimitTimeout(%v): %v, want ErrInvalidOption", timeout, err)
		}
	}
}

// TestCallsToAHungServiceEnd: Info, and a first mutation of a table (which
// asks Info first), end on a service that never answers though their ctx
// has no deadline: they waited for ever.
func TestCallsToAHungServiceEnd(t *testing.T) {
	d := &deployment{t: t, url: testutil.StartEmbedded(t, 0), prefix: "hung"}
	stand := d.connect()
	if _, err := stand.Subscribe("hung.api.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := stand.Flush(); err != nil {
		t.Fatal(err)
	}
	c := d.client()
	done := make(chan error, 2)
	go func() { _, err := c.Info(context.Background(), "t"); done <- err }()
	go func() { done <- c.Delete(context.Background(), "t", 1) }()
	limit := time.After(DefaultInfoWait + time.Minute) // ample: the wait is DefaultInfoWait
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("a call to a hung service: %v, want its default wait's end", err)
			}
		case <-limit:
			t.Fatal("Info or Delete of a service that never answers still waits")
		}
	}
}

// insertedKeys has p write n single-step items to table and returns their
// keys, as the service lists them.
func insertedKeys(t *testing.T, d *deployment, table string, n int) []uint64 {
	t.Helper()
	ctx := testutil.Context(t)
	p := d.producer()
	for i := range int64(n) {
		if err := p.Append(ctx, step(i, 4)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, table, 1, LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	items, err := d.client().Items(ctx, table, 0, int32(n+1))
	if err != nil || len(items.Items) != n {
		t.Fatalf("items %v, %v; want %d", items, err, n)
	}
	keys := make([]uint64, n)
	for i, it := range items.Items {
		keys[i] = it.Key
	}
	return keys
}

// TestMutationsFollowTheServicesLimit: a service whose
// limits.max_mutation_ops is below the default gets a large mutation in
// parts it takes. Delete of 25 keys from a service taking 10 ops returned
// nil and deleted nothing: the service refused the one message whole.
func TestMutationsFollowTheServicesLimit(t *testing.T) {
	l := service.DefaultLimits()
	l.MaxMutationOps = 10
	d := deployPrefix(t, []tables.Config{testutil.UniformTable("t", 100)}, testutil.StartEmbedded(t, 0), "test", service.WithLimits(l))
	keys := append(make([]uint64, 22), insertedKeys(t, d, "t", 3)...)
	for i := range 22 {
		keys[i] = uint64(1<<40 + i)
	}
	ctx := testutil.Context(t)
	c := d.client()
	if err := c.Delete(ctx, "t", keys...); err != nil {
		t.Fatalf("Delete of %d keys: %v", len(keys), err)
	}
	if after, err := c.Items(ctx, "t", 0, 10); err != nil || len(after.Items) != 0 {
		t.Fatalf("after Delete the table holds %v (%v), want none", after, err)
	}
	if info, err := c.Info(ctx, "t"); err != nil || info.MaxMutationOps != 10 {
		t.Fatalf("Info gives max mutation ops %v (%v), want 10", info, err)
	}
}

// TestRefusedMutationsAreReported: a mutation the service refuses returns
// an error that says so, with the service's code, rather than nil. Here
// the service restarted without the client's table, and then with a lower
// limits.max_mutation_ops than the client learned.
func TestRefusedMutationsAreReported(t *testing.T) {
	url := testutil.StartEmbedded(t, 0)
	l := service.DefaultLimits()
	l.MaxMutationOps = 10
	d := deployPrefix(t, []tables.Config{testutil.UniformTable("t", 100), testutil.UniformTable("u", 100)}, url, "test", service.WithLimits(l))
	ctx := testutil.Context(t)
	c := d.client()
	if err := c.Delete(ctx, "t", 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "u", 1); err != nil {
		t.Fatal(err)
	}
	d.stopService()
	l.MaxMutationOps = 5
	d = deployPrefix(t, []tables.Config{testutil.UniformTable("u", 100)}, url, "test", service.WithLimits(l))

	err := c.Delete(ctx, "t", 1)
	var se *StatusError
	if !errors.Is(err, ErrRejected) || !errors.Is(err, ErrUnknownTable) || !errors.As(err, &se) || se.Code != CodeNotFound {
		t.Fatalf("Delete on a table the service no longer has: %v, want ErrRejected with CodeNotFound", err)
	}
	if err := c.Delete(ctx, "t", 1); errors.Is(err, ErrRejected) || !errors.Is(err, ErrUnknownTable) {
		t.Fatalf("a second Delete on that table: %v, want ErrUnknownTable before anything is sent", err)
	}
	keys := insertedKeys(t, d, "u", 2)
	ups := make([]tables.PriorityUpdate, 12)
	for i := range ups {
		ups[i] = tables.PriorityUpdate{Key: uint64(1<<40 + i), Priority: 1}
	}
	ups[0].Key, ups[11].Key = keys[0], keys[1]
	ups[0].Priority, ups[11].Priority = 3, 7
	err = c.UpdatePriorities(ctx, "u", ups...)
	if !errors.Is(err, ErrRejected) || !errors.Is(err, ErrResourceExhausted) || !strings.Contains(err.Error(), "ops 0 to 9 of 12, of 2 parts sent apart; the other parts were applied") {
		t.Fatalf("UpdatePriorities over the service's new limit: %v, want ErrRejected, ErrResourceExhausted, naming ops 0 to 9 of 12", err)
	}
	// The part the service took was applied, the other not.
	got, err := c.Get(ctx, "u", keys...)
	if err != nil || len(got.Items) != 2 || got.Items[0].Priority != 1 || got.Items[1].Priority != 7 {
		t.Fatalf("the items: %+v, %v; want priorities 1 (refused) and 7 (applied)", got, err)
	}
	// After a refusal the client asks the service again, and learns its
	// new limit: the same call now goes in parts it takes.
	if err := c.UpdatePriorities(ctx, "u", ups...); err != nil {
		t.Fatalf("UpdatePriorities after the refusal: %v", err)
	}
	if got, err := c.Get(ctx, "u", keys[0]); err != nil || got.Items[0].Priority != 3 {
		t.Fatalf("after the update in parts: %+v, %v; want priority 3", got, err)
	}
}

// TestStaleRefusalsDoNotFailLaterMutations: a service that replays the
// stream (a restart from an older checkpoint, a standby that takes over)
// sends again the refusals of mutations whose callers took theirs long
// ago. The client kept each, never to be taken; past maxKeptRefusals it
// counted the oldest as lost, and a mutation in flight then failed with
// ErrRejected ("this may be one of them") though the service applied it.
func TestStaleRefusalsDoNotFailLaterMutations(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, testutil.StartEmbedded(t, 0))
	ctx := testutil.Context(t)
	c := d.client()
	const n = maxKeptRefusals + 100
	empty, err := proto.Marshal(&wire.Mutation{Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for range n {
		ack, err := c.js.Publish(ctx, c.subj.Mutate(), empty)
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Sequence
	}
	if err := c.applied.waitFor(ctx, last); err != nil {
		t.Fatal(err)
	}
	// What a replay resends: refusals of sequences the client's progress
	// passed long ago.
	nc := d.connect()
	for seq := uint64(1); seq <= n; seq++ {
		data, _ := proto.Marshal(&wire.Rejection{Sequence: seq, Table: "gone", Code: wire.Code_CODE_NOT_FOUND, Message: "replayed"})
		if err := nc.Publish(c.notice, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := c.Delete(ctx, "t", 1); err != nil {
			t.Fatalf("Delete the service applied, after %d stale refusals: %v", n, err)
		}
	}
}

// TestAbandonedRefusalsDoNotFailLaterMutations: refusals whose callers gave
// up before the service applied their mutations are never taken. Past the
// bound on those kept, each pushed out counted as lost, and a mutation in
// flight then failed with ErrRejected though the service applied it. Only
// a refusal that progress has not passed may still be waited for.
func TestAbandonedRefusalsDoNotFailLaterMutations(t *testing.T) {
	w, progress, refuse := refusalFeed(t)
	refuse(1, maxKeptRefusals-24) // taken while their mutations wait; their callers then give up
	progress(maxKeptRefusals - 24)
	progress(maxKeptRefusals - 23)
	lost := w.lostRefusals()
	refuse(1_000_000, 100) // of mutations far ahead
	progress(maxKeptRefusals - 22)
	if err := w.refusal("t", []uint64{maxKeptRefusals - 22}, 1, 1, lost); err != nil {
		t.Fatalf("a mutation the service applied, after abandoned refusals: %v", err)
	}
}

// TestPassedRefusalPushedOutBeforeTakenIsLost: a caller takes its refusal
// only after progress passed its mutation, so a refusal the latest progress
// passed may still be waited for. Pushed out before its caller took it, it
// counts as lost, or the caller would see its refused mutation as applied.
func TestPassedRefusalPushedOutBeforeTakenIsLost(t *testing.T) {
	w, progress, refuse := refusalFeed(t)
	lost := w.lostRefusals()
	refuse(1, 1)
	progress(1) // the caller's wait returns; it has not taken its refusal yet
	// Other callers' mutations, refused, before the next progress.
	refuse(1_000, maxKeptRefusals)
	progress(2)
	if err := w.refusal("t", []uint64{1}, 1, 1, lost); !errors.Is(err, ErrRejected) {
		t.Fatalf("a refused mutation whose refusal was pushed out: %v; want ErrRejected", err)
	}
}

// refusalFeed is an appliedWatch fed by a real connection: progress hands
// it a progress message, refuse sends it n refusals from sequence from and
// waits until they are queued.
func refusalFeed(t *testing.T) (w *appliedWatch, progress func(seq uint64), refuse func(from, n uint64)) {
	t.Helper()
	nc, err := nats.Connect(testutil.StartEmbedded(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync("refusals")
	if err != nil {
		t.Fatal(err)
	}
	w = &appliedWatch{notices: sub}
	progress = func(seq uint64) {
		data, _ := proto.Marshal(&wire.Progress{AppliedSequence: seq})
		w.onProgress(&nats.Msg{Data: data})
	}
	refuse = func(from, n uint64) {
		t.Helper()
		for seq := from; seq < from+n; seq++ {
			data, _ := proto.Marshal(&wire.Rejection{Sequence: seq, Table: "t", Code: wire.Code_CODE_NOT_FOUND, Message: "refused"})
			if err := nc.Publish("refusals", data); err != nil {
				t.Fatal(err)
			}
		}
		testutil.WaitUntil(t, "the refusals arrive", func() bool {
			queued, _, err := sub.Pending()
			return err == nil && uint64(queued) == n
		})
	}
	return w, progress, refuse
}
