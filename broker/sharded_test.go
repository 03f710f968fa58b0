package broker

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
	"google.golang.org/protobuf/proto"
)

func prefixesOf(ds []*deployment) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.prefix
	}
	return out
}

func shardedClient(t testing.TB, ds []*deployment, prefixes []string) *ShardedClient {
	t.Helper()
	c, err := NewShardedClient(ds[0].connect(), prefixes, WithLogger(testutil.QuietLogger()))
	if err != nil {
		t.Fatalf("NewShardedClient: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// fillShard inserts one-step items of the given priorities into table t of
// shard i of len(ds), with keys of that shard, and waits until they are in.
func fillShard(t testing.TB, ds []*deployment, i int, priorities ...float64) {
	t.Helper()
	p := ds[i].producer(producerOption(func(o *producerOptions) error {
		o.shard = keyShard{index: uint64(i), count: uint64(len(ds))}
		return nil
	}))
	ctx := testutil.Context(t)
	for j, pr := range priorities {
		if err := p.Append(ctx, step(int64(j), 2)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", pr, LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
}

func ones(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

func prioritizedTable(name string, exponent float64) tables.Config {
	return tables.Config{Name: name, Sampler: selectors.Options{Kind: selectors.KindPrioritized, Exponent: exponent},
		Remover: selectors.Options{Kind: selectors.KindFifo}, MaxSize: 10_000, Limiter: limiter.MinSize(1)}
}

// sixSigma fails unless got is within 6 standard deviations of a binomial
// count of n draws of probability p: a false failure below 2e-9.
func sixSigma(t *testing.T, what string, got, n int, p float64) {
	t.Helper()
	mean, sd := float64(n)*p, math.Sqrt(float64(n)*p*(1-p))
	if math.Abs(float64(got)-mean) > 6*sd {
		t.Errorf("%s: %d of %d, want %.0f ± %.0f (6 sd)", what, got, n, mean, 6*sd)
	}
}

// TestShardedProducerRoutesByEpisode: episodes go to the shards in turn,
// all of an episode's items to one shard, each key naming its shard.
func TestShardedProducerRoutesByEpisode(t *testing.T) {
	ds := deployShards(t, []tables.Config{testutil.UniformTable("t", 1000)}, 2)
	ctx := testutil.Context(t)
	p, err := NewShardedProducer(ctx, ds[0].connect(), prefixesOf(ds), WithLogger(testutil.QuietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	const episodes, steps = 6, 5
	for e := range episodes {
		for s := range steps {
			if err := p.Append(ctx, step(int64(e*100+s), 2)); err != nil {
				t.Fatal(err)
			}
			if err := p.CreateItem(ctx, "t", 1, Last(2, "id")); err != nil && s > 0 {
				t.Fatal(err)
			}
		}
		if err := p.EndEpisode(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, d := range ds {
		info, err := d.client().Info(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		// Steps 1 to 4 of each episode make items (step 0 has no
		// predecessor); half the episodes are this shard's.
		if ti := info.Tables[0]; ti.Size != episodes/2*(steps-1) || ti.Episodes != episodes/2 {
			t.Errorf("shard %d holds %d items of %d episodes, want %d of %d", i, ti.Size, ti.Episodes, episodes/2*(steps-1), episodes/2)
		}
		list, err := d.client().Items(ctx, "t", 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range list.Items {
			if it.Key%2 != uint64(i) {
				t.Errorf("shard %d holds key %d", i, it.Key)
			}
		}
	}
	// Every sampled item's two steps are of one episode.
	c := shardedClient(t, ds, prefixesOf(ds))
	samples, err := c.Sample(ctx, "t", 64)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if id := ids(t, s); len(id) != 2 || id[0]/100 != id[1]/100 || id[1] != id[0]+1 {
			t.Fatalf("item %d holds steps %v", s.Info.Key, id)
		}
	}
}

// TestShardedSampleUniform: a uniform table of 30 + 90 items samples each
// shard in proportion to its size, and reports each item's probability and
// size in the whole table, item by item and in stacked batches (each
// place's item from the shard drawn for it, stacked as one shard's are).
func TestShardedSampleUniform(t *testing.T) {
	ds := deployShards(t, []tables.Config{testutil.UniformTable("t", 1000)}, 2)
	fillShard(t, ds, 0, ones(30)...)
	fillShard(t, ds, 1, ones(90)...)
	c := shardedClient(t, ds, prefixesOf(ds))
	ctx := testutil.Context(t)
	const batches, batch = 100, 100
	fromFirst := 0
	for i := range batches {
		if i%2 == 1 {
			b, err := c.SampleBatch(ctx, "t", batch)
			if err != nil {
				t.Fatal(err)
			}
			checkBatch(t, b, batch, 1, 2, 120)
			for _, k := range b.Info.Keys {
				fromFirst += int(1 - k%2)
			}
			continue
		}
		samples, err := c.Sample(ctx, "t", batch)
		if err != nil {
			t.Fatal(err)
		}
		if len(samples) != batch {
			t.Fatalf("%d samples, want %d", len(samples), batch)
		}
		for _, s := range samples {
			if s.Info.Key%2 == 0 {
				fromFirst++
			}
			if math.Abs(s.Info.Probability*120-1) > 1e-12 || s.Info.TableSize != 120 {
				t.Fatalf("item %d: probability %v, table size %d; want 1/120 and 120", s.Info.Key, s.Info.Probability, s.Info.TableSize)
			}
		}
	}
	sixSigma(t, "items from shard 0", fromFirst, batches*batch, 0.25)
}

// TestShardedSamplePrioritized: each item's reported probability is its
// weight over the whole table's, the shards are drawn by total weight, and
// a shard whose items all weigh 0 is never drawn while the other has
// weight.
func TestShardedSamplePrioritized(t *testing.T) {
	ds := deployShards(t, []tables.Config{prioritizedTable("t", 0.5)}, 2)
	var first, second []float64
	for i := range 20 {
		first = append(first, float64(i+1))
		second = append(second, float64(4*(i+1)))
	}
	fillShard(t, ds, 0, first...)
	fillShard(t, ds, 1, second...)
	c := shardedClient(t, ds, prefixesOf(ds))
	ctx := testutil.Context(t)
	weights := map[uint64]float64{}
	total := 0.0
	for _, d := range ds {
		list, err := d.client().Items(ctx, "t", 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range list.Items {
			weights[it.Key] = math.Sqrt(it.Priority)
			total += math.Sqrt(it.Priority)
		}
	}
	info, err := c.Info(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if w := info.Tables[0].Weight.Float64(); math.Abs(w/total-1) > 1e-12 {
		t.Errorf("info weight %v, want %v", w, total)
	}
	// Every priority of shard 1 is 4 times shard 0's: at exponent 0.5 it
	// weighs twice as much, so it holds 2/3 of the weight.
	const batches, batch = 60, 100
	fromFirst := 0
	for range batches {
		samples, err := c.Sample(ctx, "t", batch)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range samples {
			if s.Info.Key%2 == 0 {
				fromFirst++
			}
			if want := weights[s.Info.Key] / total; math.Abs(s.Info.Probability/want-1) > 1e-12 {
				t.Fatalf("item %d: probability %v, want %v", s.Info.Key, s.Info.Probability, want)
			}
		}
	}
	sixSigma(t, "items from shard 0", fromFirst, batches*batch, 1.0/3)

	// Shard 0's items weigh nothing now.
	zero := make([]tables.PriorityUpdate, 0, 20)
	for k := range weights {
		if k%2 == 0 {
			zero = append(zero, tables.PriorityUpdate{Key: k})
		}
	}
	if err := c.UpdatePriorities(ctx, "t", zero...); err != nil {
		t.Fatal(err)
	}
	samples, err := c.Sample(ctx, "t", 200)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		if s.Info.Key%2 == 0 {
			t.Fatalf("sampled item %d of weight 0 while shard 1 has weight", s.Info.Key)
		}
	}
}

// TestShardedMutationsReachTheirShard: priority updates and deletes go to
// the shard each key names; Get gathers items across shards in the order
// asked.
func TestShardedMutationsReachTheirShard(t *testing.T) {
	ds := deployShards(t, []tables.Config{prioritizedTable("t", 1)}, 3)
	for i := range ds {
		fillShard(t, ds, i, ones(4)...)
	}
	c := shardedClient(t, ds, prefixesOf(ds))
	ctx := testutil.Context(t)
	var keys []uint64
	for _, d := range ds {
		list, err := d.client().Items(ctx, "t", 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range list.Items {
			keys = append(keys, it.Key)
		}
	}
	slices.Reverse(keys)
	var updates []tables.PriorityUpdate
	for j, k := range keys {
		updates = append(updates, tables.PriorityUpdate{Key: k, Priority: float64(j + 10)})
	}
	if err := c.UpdatePriorities(ctx, "t", updates...); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, "t", append(keys, 12345)...)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Items) != len(keys) || got.TableSize != 12 {
		t.Fatalf("Get: %d items of a table of %d, want %d of 12", len(got.Items), got.TableSize, len(keys))
	}
	for j, it := range got.Items {
		if it.Key != keys[j] || it.Priority != float64(j+10) {
			t.Errorf("item %d: key %d priority %v, want key %d priority %d", j, it.Key, it.Priority, keys[j], j+10)
		}
	}
	// Delete one key of each shard.
	var gone []uint64
	for i := range ds {
		k := keys[slices.IndexFunc(keys, func(k uint64) bool { return k%3 == uint64(i) })]
		gone = append(gone, k)
	}
	if err := c.Delete(ctx, "t", gone...); err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if info.Tables[0].Size != 9 || info.Tables[0].Deletes != 3 {
		t.Errorf("after deleting 3: size %d, deletes %d; want 9 and 3", info.Tables[0].Size, info.Tables[0].Deletes)
	}
	for i, s := range info.Shards {
		if s.Tables[0].Size != 3 {
			t.Errorf("shard %d holds %d items, want 3", i, s.Tables[0].Size)
		}
	}
}

// TestShardedInfoAddsUp: the whole table's info is the sum of its shards'.
func TestShardedInfoAddsUp(t *testing.T) {
	ds := deployShards(t, []tables.Config{prioritizedTable("t", 1)}, 2)
	fillShard(t, ds, 0, 1, 2, 3)
	fillShard(t, ds, 1, 4, 5)
	c := shardedClient(t, ds, prefixesOf(ds))
	ctx := testutil.Context(t)
	if _, err := c.Sample(ctx, "t", 7); err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	ti := info.Tables[0]
	if ti.Size != 5 || ti.Inserts != 5 || ti.Samples != 7 || ti.MaxSize != 20_000 || ti.Limiter.Inserts != 5 || ti.Limiter.Samples != 7 {
		t.Errorf("sum: size %d inserts %d samples %d max size %d limiter %+v; want 5, 5, 7, 20000, 5 and 7", ti.Size, ti.Inserts, ti.Samples, ti.MaxSize, ti.Limiter)
	}
	if ti.Weight != (tables.Weight{Fraction: 15.0 / 16, Exponent: 4}) {
		t.Errorf("weight %+v, want 15 = 0.9375 × 2^4", ti.Weight)
	}
	if len(info.Shards) != 2 || info.Shards[0].Tables[0].Size != 3 || info.Shards[1].ShardIndex != 1 || info.ShardCount != 2 {
		t.Errorf("shards: %+v", info.Shards)
	}
}

// TestShardedClientChecksShards: prefixes out of shard order, or a service
// that is not a shard, fail a client's first call, and a producer's
// construction, with an error that says so.
func TestShardedClientChecksShards(t *testing.T) {
	ds := deployShards(t, []tables.Config{testutil.UniformTable("t", 100)}, 2)
	ctx := testutil.Context(t)
	reversed := shardedClient(t, ds, []string{ds[1].prefix, ds[0].prefix})
	if _, err := reversed.Sample(ctx, "t", 1); !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "give the prefixes in shard order") {
		t.Errorf("sampling with the prefixes reversed: %v", err)
	}
	plain := deployPrefix(t, []tables.Config{testutil.UniformTable("t", 100)}, ds[0].url, "plain")
	mixed := shardedClient(t, ds, []string{ds[0].prefix, plain.prefix})
	if _, err := mixed.Sample(ctx, "t", 1); !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "not a shard: start it with --shard 1/2") {
		t.Errorf("sampling with an unsharded service: %v", err)
	}
	// Keys routed by a wrong order would reach shards that skip them.
	if err := reversed.Delete(ctx, "t", 1); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("deleting with the prefixes reversed: %v", err)
	}
	if _, err := reversed.Get(ctx, "t", 1); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("Get with the prefixes reversed: %v", err)
	}
	if _, err := NewShardedClient(ds[0].connect(), []string{"s.0", "s-0"}); !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "share the stream") {
		t.Errorf("two prefixes of one stream: %v", err)
	}
	if _, err := NewShardedProducer(ctx, ds[0].connect(), []string{ds[1].prefix, ds[0].prefix}); !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "give the prefixes in shard order") {
		t.Errorf("a producer with the prefixes reversed: %v", err)
	}
	if _, err := NewShardedClient(ds[0].connect(), []string{"a", "a"}); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("the same prefix twice: %v", err)
	}
	if _, err := NewShardedClient(ds[0].connect(), []string{"a", "b"}, WithPrefix("c")); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("WithPrefix: %v", err)
	}
}

// TestShardedSampleWaitsForItems: a sample of an empty sharded table waits
// until a shard holds an item, and fails as rate limited when none comes.
func TestShardedSampleWaitsForItems(t *testing.T) {
	ds := deployShards(t, []tables.Config{testutil.UniformTable("t", 100)}, 2)
	c := shardedClient(t, ds, prefixesOf(ds))
	ctx := testutil.Context(t)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := c.Sample(short, "t", 1); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("sampling an empty table: %v, want ErrRateLimited", err)
	}
	type result struct {
		samples []Sample
		err     error
	}
	done := make(chan result, 1)
	go func() {
		s, err := c.Sample(ctx, "t", 3)
		done <- result{s, err}
	}()
	fillShard(t, ds, 1, 1)
	r := <-done
	if r.err != nil || len(r.samples) != 3 || r.samples[0].Info.Key%2 != 1 {
		t.Fatalf("sample once shard 1 holds an item: %v, %v", r.samples, r.err)
	}
}

// TestShardedSamplePartial: a shard whose rate limiter holds its items back
// leaves its places empty; the others' items come back with an error
// matching ErrRateLimited.
func TestShardedSamplePartial(t *testing.T) {
	cfg := testutil.UniformTable("t", 100)
	cfg.Limiter = limiter.MinSize(5)
	ds := deployShards(t, []tables.Config{cfg}, 2)
	fillShard(t, ds, 0, ones(10)...)
	fillShard(t, ds, 1, ones(2)...) // below its min size
	c := shardedClient(t, ds, prefixesOf(ds))
	ctx, cancel := context.WithTimeout(testutil.Context(t), 2*time.Second)
	defer cancel()
	// 200 draws miss shard 1 with probability (10/12)^200 < 1e-15.
	samples, err := c.Sample(ctx, "t", 200)
	if !errors.Is(err, ErrRateLimited) {
		t.Fatalf("err = %v, want ErrRateLimited", err)
	}
	if len(samples) == 0 || len(samples) == 200 {
		t.Fatalf("%d samples, want those of shard 0 only", len(samples))
	}
	for _, s := range samples {
		if s.Info.Key%2 != 0 {
			t.Fatalf("sample of key %d from the held-back shard", s.Info.Key)
		}
	}
	// Flexible: what came is the answer, as from one table.
	fctx, fcancel := context.WithTimeout(testutil.Context(t), 2*time.Second)
	defer fcancel()
	samples, err = c.Sample(fctx, "t", 200, Flexible())
	if err != nil || len(samples) == 0 {
		t.Fatalf("flexible sample: %d samples, %v; want shard 0's and no error", len(samples), err)
	}
	// A batch leaves the held-back shard's places out too.
	bctx, bcancel := context.WithTimeout(testutil.Context(t), 2*time.Second)
	defer bcancel()
	b, err := c.SampleBatch(bctx, "t", 200)
	if !errors.Is(err, ErrRateLimited) || b == nil || b.Len() == 0 || b.Len() == 200 {
		t.Fatalf("batch: %v, want ErrRateLimited with shard 0's items", err)
	}
	if obs, _ := b.Column("obs"); obs.Shape[0] != int64(b.Len()) || len(obs.Data) != b.Len()*2*4 || slices.ContainsFunc(b.Info.Keys, func(k uint64) bool { return k%2 != 0 }) {
		t.Fatalf("batch of %d: obs of shape %v and %d bytes, keys %v; want shard 0's items alone", b.Len(), obs.Shape, len(obs.Data), b.Info.Keys)
	}
}

// TestShardedSampleSkipsADownShard: while a shard's service is stopped,
// samples come from the others, with probabilities in what they hold; once
// it is back, from every shard again.
func TestShardedSampleSkipsADownShard(t *testing.T) {
	cfgs := []tables.Config{testutil.UniformTable("t", 100)}
	ds := deployShards(t, cfgs, 2)
	fillShard(t, ds, 0, ones(10)...)
	fillShard(t, ds, 1, ones(30)...)
	c := shardedClient(t, ds, prefixesOf(ds))
	ctx := testutil.Context(t)
	if _, err := c.Sample(ctx, "t", 8); err != nil {
		t.Fatal(err)
	}
	ds[1].stopService()
	// The first call after the stop may still draw from shard 1, and then
	// reports it; the next ones draw from shard 0 alone.
	if samples, err := c.Sample(ctx, "t", 100); err != nil && (!errors.Is(err, ErrServer) || !strings.Contains(err.Error(), `shard 1 (prefix "shard1")`)) {
		t.Fatalf("sampling as shard 1 stops: %d samples, %v", len(samples), err)
	}
	for range 5 {
		samples, err := c.Sample(ctx, "t", 50)
		if err != nil {
			t.Fatalf("sampling while shard 1 is down: %v", err)
		}
		for _, s := range samples {
			if s.Info.Key%2 != 0 || math.Abs(s.Info.Probability*10-1) > 1e-12 || s.Info.TableSize != 10 {
				t.Fatalf("while shard 1 is down: key %d, probability %v, table size %d; want shard 0's, 1/10, 10", s.Info.Key, s.Info.Probability, s.Info.TableSize)
			}
		}
	}
	deployPrefix(t, cfgs, ds[1].url, ds[1].prefix, service.WithShard(service.Shard{Index: 1, Count: 2}))
	testutil.WaitUntil(t, "samples from shard 1 again", func() bool {
		samples, err := c.Sample(ctx, "t", 50)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(samples, func(s Sample) bool { return s.Info.Key%2 == 1 && math.Abs(s.Info.Probability*40-1) < 1e-12 })
	})
}

// TestShardedClientStartedWhileAShardIsDown: a learner started (or
// restarted) while a shard is down samples the others, as one started
// before does, and the shard once it is back, checked then: a shard that
// comes back as another shard's place is refused. Every call of such a
// client used to fail until the shard came back.
func TestShardedClientStartedWhileAShardIsDown(t *testing.T) {
	cfgs := []tables.Config{testutil.UniformTable("t", 100)}
	ds := deployShards(t, cfgs, 2)
	fillShard(t, ds, 0, ones(10)...)
	fillShard(t, ds, 1, ones(30)...)
	ds[1].stopService()
	ctx := testutil.Context(t)
	c := shardedClient(t, ds, prefixesOf(ds))
	samples, err := c.Sample(ctx, "t", 50)
	if err != nil {
		t.Fatalf("a client started while shard 1 is down: %v", err)
	}
	for _, s := range samples {
		if s.Info.Key%2 != 0 || math.Abs(s.Info.Probability*10-1) > 1e-12 {
			t.Fatalf("while shard 1 is down: key %d, probability %v; want shard 0's, 1/10", s.Info.Key, s.Info.Probability)
		}
	}
	deployPrefix(t, cfgs, ds[1].url, ds[1].prefix, service.WithShard(service.Shard{Index: 1, Count: 2}))
	testutil.WaitUntil(t, "samples from shard 1 once it is back", func() bool {
		samples, err := c.Sample(ctx, "t", 50)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(samples, func(s Sample) bool { return s.Info.Key%2 == 1 && math.Abs(s.Info.Probability*40-1) < 1e-12 })
	})

	// Started while "shard1" is down, checked when it answers as shard 0.
	wrong := deployShards(t, cfgs, 2)
	fillShard(t, wrong, 0, ones(2)...)
	wrong[1].stopService()
	c2 := shardedClient(t, wrong, prefixesOf(wrong))
	if _, err := c2.Sample(ctx, "t", 1); err != nil {
		t.Fatal(err)
	}
	deployPrefix(t, cfgs, wrong[1].url, wrong[1].prefix, service.WithShard(service.Shard{Index: 0, Count: 2}))
	testutil.WaitUntil(t, "the misplaced shard is refused", func() bool {
		_, err := c2.Sample(ctx, "t", 1)
		return errors.Is(err, ErrInvalidOption) && strings.Contains(err.Error(), `shard 1 (prefix "shard1")`)
	})
}

// TestShardedSampleWithEveryShardDown: with no shard answering there is no
// item to wait for, so a sample fails with ErrServer naming the shards, as
// a Client's does when its service is gone, rather than wait out its
// deadline and blame the rate limiter; and a caller that cancels its wait
// for items gets its cancellation back.
func TestShardedSampleWithEveryShardDown(t *testing.T) {
	ds := deployShards(t, []tables.Config{testutil.UniformTable("t", 100)}, 2)
	c := shardedClient(t, ds, prefixesOf(ds))
	ctx := testutil.Context(t)
	cancelled, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel) // while it waits for the empty table
	if _, err := c.Sample(cancelled, "t", 1); !errors.Is(err, context.Canceled) || errors.Is(err, ErrRateLimited) {
		t.Fatalf("a cancelled wait for items: %v, want context.Canceled", err)
	}
	fillShard(t, ds, 0, ones(2)...)
	if _, err := c.Sample(ctx, "t", 1); err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		d.stopService()
	}
	// The first call after the stop may draw from shard 0 and report it;
	// the next ones know both down.
	if _, err := c.Sample(ctx, "t", 1); !errors.Is(err, ErrServer) {
		t.Fatalf("sampling as the shards stop: %v, want ErrServer", err)
	}
	for range 2 {
		_, err := c.Sample(ctx, "t", 1)
		if !errors.Is(err, ErrServer) || errors.Is(err, ErrRateLimited) || !strings.Contains(err.Error(), `no shard of table "t" answers`) || !strings.Contains(err.Error(), `shard 1 (prefix "shard1")`) {
			t.Fatalf("sampling with every shard down: %v, want ErrServer naming the shards", err)
		}
	}
}

// hangShard makes shard d hang, as a stopped or stuck process does: NATS
// still takes its requests (no "no responders"), and nobody answers. A
// subscriber that never answers listens before its service stops.
func hangShard(t testing.TB, d *deployment) {
	t.Helper()
	nc := d.connect()
	if _, err := nc.Subscribe(d.prefix+".api.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	d.stopService()
}

// shardDownNow reports whether c counts shard i of table down.
func shardDownNow(c *ShardedClient, table string, i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tables[table][i].down != nil
}

// TestShardedSampleWithAShortDeadlineWhileAShardHangs: with shard 1 hung,
// calls whose deadline is under the info requests' 2 s get shard 0's
// items, and shard 0 is never counted down. Each call used to spend its
// whole deadline on shard 1's info request and fail with it, so no call
// succeeded.
func TestShardedSampleWithAShortDeadlineWhileAShardHangs(t *testing.T) {
	ds := deployShards(t, []tables.Config{testutil.UniformTable("t", 100)}, 2)
	fillShard(t, ds, 0, ones(10)...)
	fillShard(t, ds, 1, ones(10)...)
	hangShard(t, ds[1])
	c := shardedClient(t, ds, prefixesOf(ds))
	evenKeys := func(what string, samples []Sample, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s while shard 1 hangs: %v", what, err)
		}
		for _, s := range samples {
			if s.Info.Key%2 != 0 {
				t.Fatalf("%s while shard 1 hangs: key %d, want shard 0's", what, s.Info.Key)
			}
		}
		if shardDownNow(c, "t", 0) {
			t.Fatalf("%s while shard 1 hangs: shard 0 counted down", what)
		}
	}
	for range 3 {
		ctx, cancel := context.WithTimeout(testutil.Context(t), 1500*time.Millisecond)
		samples, err := c.Sample(ctx, "t", 4)
		cancel()
		evenKeys("a sample", samples, err)
	}
	s, err := c.NewSampler("t", 4, WithInFlight(1), WithRateLimitTimeout(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 5 {
		batch, err := s.Next(testutil.Context(t))
		evenKeys("a sampler's batch", batch, err)
	}
}

// TestShardedSamplerGoesOnWhileAShardHangs: a sampler without a deadline
// goes on handing out batches of shard 0's items once shard 1 hangs
// mid-use, and counts shard 1 down. A draw that included shard 1 used to
// wait for its reply for DefaultSampleWait and a margin (70 s), and once
// it was down every draw waited for its info again, 2 s.
func TestShardedSamplerGoesOnWhileAShardHangs(t *testing.T) {
	ds := deployShards(t, []tables.Config{testutil.UniformTable("t", 100)}, 2)
	fillShard(t, ds, 0, ones(10)...)
	fillShard(t, ds, 1, ones(10)...)
	c := shardedClient(t, ds, prefixesOf(ds))
	s, err := c.NewSampler("t", 8)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Next(testutil.Context(t)); err != nil {
		t.Fatal(err)
	}
	hangShard(t, ds[1])
	// Far below the 70 s that one draw used to wait.
	ctx, cancel := context.WithTimeout(testutil.Context(t), 40*time.Second)
	defer cancel()
	const want = 30
	for got := 0; got < want; {
		batch, err := s.Next(ctx)
		switch {
		case ctx.Err() != nil:
			t.Fatalf("%d of %d batches of shard 0's items while shard 1 hangs: %v", got, want, ctx.Err())
		case err != nil && (!errors.Is(err, ErrServer) || !strings.Contains(err.Error(), `shard 1 (prefix "shard1")`)):
			t.Fatalf("a batch while shard 1 hangs: %v, want shard 1's ErrServer", err)
		case err == nil && len(batch) == 8 && !slices.ContainsFunc(batch, func(s Sample) bool { return s.Info.Key%2 != 0 }):
			got++
		}
	}
	if !shardDownNow(c, "t", 1) {
		t.Error("shard 1 hangs and is not counted down")
	}
}

// TestShardedSampler: a sharded client's sampler prefetches batches drawn
// from every shard.
func TestShardedSampler(t *testing.T) {
	ds := deployShards(t, []tables.Config{testutil.UniformTable("t", 100)}, 2)
	fillShard(t, ds, 0, ones(20)...)
	fillShard(t, ds, 1, ones(20)...)
	c := shardedClient(t, ds, prefixesOf(ds))
	s, err := c.NewSampler("t", 32, WithInFlight(3))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := testutil.Context(t)
	perShard := [2]int{}
	for range 10 {
		batch, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(batch) != 32 {
			t.Fatalf("batch of %d, want 32", len(batch))
		}
		for _, smp := range batch {
			perShard[smp.Info.Key%2]++
		}
	}
	// 320 fair draws: each shard gets 160 ± 6 sd (about 54).
	sixSigma(t, "items from shard 0", perShard[0], 320, 0.5)
}

// TestShardSharesDistrustReplies: weights and sizes a hostile or broken
// service could report (NaN, infinite or out-of-range fractions, extreme
// exponents, negative sizes) count as no weight, and never make a share
// that is NaN, infinite or negative.
func TestShardSharesDistrustReplies(t *testing.T) {
	now := time.Now()
	good := reported(10, tables.Weight{Fraction: 0.5, Exponent: 4}, now)
	for _, bad := range []shardState{
		reported(10, tables.Weight{Fraction: math.NaN(), Exponent: 1}, now),
		reported(10, tables.Weight{Fraction: math.Inf(1), Exponent: 1}, now),
		reported(10, tables.Weight{Fraction: -0.75, Exponent: 1}, now),
		reported(10, tables.Weight{Fraction: 2, Exponent: 1}, now),
		reported(10, tables.Weight{Fraction: 0.5, Exponent: math.MaxInt64}, now),
		reported(10, tables.Weight{Fraction: 0.5, Exponent: math.MinInt64}, now),
		reported(-5, tables.Weight{}, now),
	} {
		share, ok := shardShares([]shardState{good, bad})
		if !ok || share[0] <= 0 || share[1] != 0 {
			t.Errorf("shares of a good shard and %+v: %v, %v; want the good one's alone", bad, share, ok)
		}
	}
	if w := addWeights(tables.Weight{Fraction: 0.5, Exponent: math.MaxInt64}, tables.Weight{Fraction: 0.5, Exponent: math.MinInt64}); w.Fraction != 0.5 {
		t.Errorf("adding weights at int64's ends: %+v", w)
	}
}

// TestShardedClientSurvivesMalformedInfo: a shard whose info reply lists
// no table fails the call with ErrServer, naming it, instead of crashing
// the learner.
func TestShardedClientSurvivesMalformedInfo(t *testing.T) {
	ds := deployShards(t, []tables.Config{testutil.UniformTable("t", 100)}, 1)
	stand := ds[0].connect()
	reply, err := proto.Marshal(&wire.InfoResponse{Status: &wire.Status{}, ShardIndex: 1, ShardCount: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stand.Subscribe("evil.api.info", func(m *nats.Msg) { m.Respond(reply) }); err != nil {
		t.Fatal(err)
	}
	if err := stand.Flush(); err != nil {
		t.Fatal(err)
	}
	// Shard 0 is a real service of a 1-shard table: it fails the order
	// check or the malformed reply does, never a panic.
	c := shardedClient(t, ds, []string{ds[0].prefix, "evil"})
	ctx := testutil.Context(t)
	// A malformed reply counts as the shard's service being down, so the
	// order check is what fails here.
	if _, err := c.Sample(ctx, "t", 1); err == nil || !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "give the prefixes in shard order") {
		t.Errorf("sampling with a shard whose info lists no table: %v, want the order check's error", err)
	}
	// Alone, its malformed reply is the error.
	alone := shardedClient(t, ds, []string{"evil"})
	if _, err := alone.Sample(ctx, "t", 1); err == nil || !strings.Contains(err.Error(), `shard 0 (prefix "evil")`) || !errors.Is(err, ErrServer) {
		t.Errorf("sampling a table whose one shard's info lists no table: %v, want ErrServer naming it", err)
	}
}

// TestShardedProducerCalledAgainAfterAnEndedEpisodeStays: an EndEpisode
// whose episode ended and whose wait then timed out moved to the next
// shard; called again, as after any error, it finds an episode of no
// steps there and stays. It ended that empty episode and moved on again,
// so the actor's next episode skipped a shard.
func TestShardedProducerCalledAgainAfterAnEndedEpisodeStays(t *testing.T) {
	ds := deployShards(t, []tables.Config{tables.QueueConfig("q", 1)}, 2)
	ctx := testutil.Context(t)
	p, err := NewShardedProducer(ctx, ds[0].connect(), prefixesOf(ds), WithLogger(testutil.QuietLogger()), WithLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	shard := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.current
	}
	first := shard()
	for i := range int64(2) { // the queue holds the second
		if err := p.Append(ctx, step(i, 2)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "q", 1, LastStep("id")); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = p.EndEpisode(short)
	cancel()
	if !errors.Is(err, ErrNotApplied) || errors.Is(err, ErrEpisodeNotEnded) {
		t.Fatalf("EndEpisode waiting for a held item: %v, want ErrNotApplied and not ErrEpisodeNotEnded", err)
	}
	if got := shard(); got != (first+1)%2 {
		t.Fatalf("on shard %d after the episode on shard %d ended, want %d", got, first, (first+1)%2)
	}
	if err := p.EndEpisode(ctx); err != nil {
		t.Fatalf("EndEpisode again: %v", err)
	}
	if got := shard(); got != (first+1)%2 {
		t.Fatalf("on shard %d after EndEpisode was called again, want %d: it ended an empty episode", got, (first+1)%2)
	}
	if _, err := ds[first].client().Sample(ctx, "q", 1); err != nil {
		t.Fatal(err)
	}
}
