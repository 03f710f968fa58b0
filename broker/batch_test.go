package broker

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
)

// checkBatch checks a batch of n items of steps steps each, from a table
// of size items: its columns' shapes, every row's obs against its ids, and
// the info of each item.
func checkBatch(t testing.TB, b *Batch, n, steps, obsLen int, size int64) {
	t.Helper()
	if b.Len() != n {
		t.Fatalf("a batch of %d, want %d", b.Len(), n)
	}
	wantObs, wantID := []int64{int64(n), int64(obsLen)}, []int64{int64(n)}
	if steps > 1 {
		wantObs, wantID = []int64{int64(n), int64(steps), int64(obsLen)}, []int64{int64(n), int64(steps)}
	}
	obsCol, ok1 := b.Column("obs")
	idCol, ok2 := b.Column("id")
	if !ok1 || !ok2 || !slices.Equal(obsCol.Shape, wantObs) || !slices.Equal(idCol.Shape, wantID) {
		t.Fatalf("columns %+v; want obs of shape %v and id of shape %v", b.Columns, wantObs, wantID)
	}
	ids, err := idCol.Int64s()
	if err != nil {
		t.Fatal(err)
	}
	obs, err := obsCol.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	testutil.CheckObs(t, ids, obs, obsLen)
	in := b.Info
	for i := range n {
		if in.Keys[i] == 0 || in.TableSizes[i] != size || math.Abs(in.Probabilities[i]*float64(size)-1) > 1e-12 ||
			in.TimesSampled[i] < 1 || in.InsertedAt[i].IsZero() || in.Priorities[i] != 1 {
			t.Fatalf("item %d: key %d, table size %d, probability %v, times sampled %d, inserted at %v, priority %v",
				i, in.Keys[i], in.TableSizes[i], in.Probabilities[i], in.TimesSampled[i], in.InsertedAt[i], in.Priorities[i])
		}
	}
}

// TestSampleBatch: a batch holds the sampled items stacked, row i of each
// column item i's, for one-step items (whose plain chunks decode without
// records an item) and items of two steps across chunks, compressed or
// not. A learner may write into a batch's tensors: no later batch changes.
func TestSampleBatch(t *testing.T) {
	for _, codec := range []wire.Codec{wire.Uncompressed, wire.Zstd} {
		t.Run(codec.String(), func(t *testing.T) {
			const obsLen, items = 8, 40
			d := deploy(t, []tables.Config{testutil.UniformTable("one", 100), testutil.UniformTable("two", 100)}, "")
			ctx := testutil.Context(t)
			p := d.producer(WithCompression(codec), WithChunkLength(1))
			q := d.producer(WithCompression(codec), WithChunkLength(3))
			for i := range int64(items) {
				if err := p.Append(ctx, step(i, obsLen)); err != nil {
					t.Fatal(err)
				}
				if err := p.CreateItem(ctx, "one", 1, LastStep("obs", "id")); err != nil {
					t.Fatal(err)
				}
				if err := q.Append(ctx, step(i, obsLen)); err != nil {
					t.Fatal(err)
				}
				if i > 0 {
					if err := q.CreateItem(ctx, "two", 1, Last(2, "obs", "id")); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, p := range []*Producer{p, q} {
				if err := p.WaitApplied(ctx); err != nil {
					t.Fatal(err)
				}
			}
			c := d.client()
			for range 3 {
				for _, tc := range []struct {
					table string
					steps int
					size  int64
				}{{"one", 1, items}, {"two", 2, items - 1}} {
					b, err := c.SampleBatch(ctx, tc.table, 64)
					if err != nil {
						t.Fatal(err)
					}
					checkBatch(t, b, 64, tc.steps, obsLen, tc.size)
					for _, col := range b.Columns {
						for i := range col.Tensor.Data {
							col.Tensor.Data[i] ^= 0x5a
						}
					}
				}
			}
		})
	}
}

// TestSampleBatchRefusesItemsThatDoNotStack: items of one and of two steps
// in one table make no batch; the error says so and how to sample them.
func TestSampleBatchRefusesItemsThatDoNotStack(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, "")
	ctx := testutil.Context(t)
	p := d.producer()
	for i := range int64(20) {
		if err := p.Append(ctx, step(i, 4)); err != nil {
			t.Fatal(err)
		}
		traj := LastStep("obs", "id")
		if i%2 == 1 {
			traj = Last(2, "obs", "id")
		}
		if err := p.CreateItem(ctx, "t", 1, traj); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	// 64 draws of the 10 items of each kind are all of one kind with
	// probability 2^-63.
	_, err := d.client().SampleBatch(ctx, "t", 64)
	if !errors.Is(err, ErrInvalidMessage) || !errors.Is(err, wire.ErrUnstackable) || !strings.Contains(err.Error(), "Sample returns such items one by one") {
		t.Fatalf("err = %v, want ErrInvalidMessage saying the items do not stack", err)
	}
	if samples, err := d.client().Sample(ctx, "t", 64); err != nil || len(samples) != 64 {
		t.Fatalf("Sample: %d items, %v", len(samples), err)
	}
}

// TestBatchSampler: a batch sampler prefetches stacked batches until
// Close, from one service and across shards.
func TestBatchSampler(t *testing.T) {
	ds := deployShards(t, []tables.Config{testutil.UniformTable("t", 100)}, 2)
	fillShard(t, ds, 0, ones(20)...)
	fillShard(t, ds, 1, ones(20)...)
	ctx := testutil.Context(t)
	one, err := ds[0].client().NewBatchSampler("t", 16, WithInFlight(3))
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		b, err := one.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkBatch(t, b, 16, 1, 2, 20)
	}
	one.Close()
	all, err := shardedClient(t, ds, prefixesOf(ds)).NewBatchSampler("t", 32, WithInFlight(2))
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	perShard := [2]int{}
	for range 10 {
		b, err := all.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkBatch(t, b, 32, 1, 2, 40)
		for _, k := range b.Info.Keys {
			perShard[k%2]++
		}
	}
	// 320 fair draws: each shard gets 160 ± 6 sd (about 54).
	sixSigma(t, "items from shard 0", perShard[0], 320, 0.5)
	if _, err := ds[0].client().NewBatchSampler("t", 0); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("a sampler of batches of 0: %v, want ErrInvalidOption", err)
	}
}

// TestShardedSampleBatchOneShard: a batch whose places all fall on one
// shard (of one, or a batch of one item of two) is that shard's, its
// probabilities and table sizes in the whole table.
func TestShardedSampleBatchOneShard(t *testing.T) {
	one := deployShards(t, []tables.Config{testutil.UniformTable("t", 100)}, 1)
	fillShard(t, one, 0, ones(25)...)
	two := deployShards(t, []tables.Config{testutil.UniformTable("t", 100)}, 2)
	fillShard(t, two, 0, ones(10)...)
	fillShard(t, two, 1, ones(30)...)
	ctx := testutil.Context(t)
	for _, tc := range []struct {
		ds          []*deployment
		batch, size int
	}{{one, 64, 25}, {two, 1, 40}} {
		c := shardedClient(t, tc.ds, prefixesOf(tc.ds))
		for range 20 {
			b, err := c.SampleBatch(ctx, "t", tc.batch)
			if err != nil {
				t.Fatal(err)
			}
			checkBatch(t, b, tc.batch, 1, 2, int64(tc.size))
		}
	}
}
