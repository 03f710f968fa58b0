package service

import (
	"errors"
	"strings"
	"testing"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// TestShardRefusesForeignKeys: shard 1 of 2 keeps the items whose key is
// odd, refuses the others with an error naming their shard, and says which
// shard it is.
func TestShardRefusesForeignKeys(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 1000)}, deployOptions{service: []Option{WithShard(Shard{Index: 1, Count: 2})}})
	p := d.producer() // a plain producer: its keys fall on either shard
	ctx := testutil.Context(t)
	const items = 40
	// A rejection may come back from any later call, after the step was
	// appended and the item queued: every item is still written, so the
	// count below covers all of them.
	var errs []error
	for i := int64(0); i < items; i++ {
		errs = append(errs, p.Append(ctx, step(i, 4)), p.CreateItem(ctx, "t", 1, broker.LastStep("obs", "id")))
	}
	err := errors.Join(append(errs, p.WaitApplied(ctx))...)
	if !errors.Is(err, protocol.ErrRejected) || !strings.Contains(err.Error(), "belongs to shard 0 of 2, and this service is shard 1/2") {
		t.Fatalf("inserting random keys into shard 1/2: %v, want a rejection naming shard 0", err)
	}
	c := d.client()
	testutil.WaitUntil(t, "every item is applied or rejected", func() bool {
		info, err := c.Info(ctx, "t")
		return err == nil && info.Tables[0].Size+d.svc.Rejected() == items
	})
	info, err := c.Info(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if info.ShardIndex != 1 || info.ShardCount != 2 {
		t.Errorf("info says shard %d/%d, want 1/2", info.ShardIndex, info.ShardCount)
	}
	list, err := c.Items(ctx, "t", 0, items)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) == 0 || len(list.Items) == items {
		t.Fatalf("%d of %d random keys kept: the shard should keep about half", len(list.Items), items)
	}
	for _, it := range list.Items {
		if it.Key%2 != 1 {
			t.Errorf("shard 1/2 holds key %d", it.Key)
		}
	}
}

// TestInfoReportsWeight: info gives the total weight a table's sampler
// draws by, the sum of priority^exponent or the item count.
func TestInfoReportsWeight(t *testing.T) {
	prioritized := tables.Config{Name: "p", Sampler: selectors.Options{Kind: selectors.KindPrioritized, Exponent: 2},
		Remover: selectors.Options{Kind: selectors.KindFifo}, MaxSize: 100, Limiter: limiter.MinSize(1)}
	d := deploy(t, []tables.Config{prioritized, testutil.UniformTable("u", 100)}, deployOptions{})
	p := d.producer()
	ctx := testutil.Context(t)
	for i, priority := range []float64{1, 2, 3} {
		if err := p.Append(ctx, step(int64(i), 4)); err != nil {
			t.Fatal(err)
		}
		for _, table := range []string{"p", "u"} {
			if err := p.CreateItem(ctx, table, priority, broker.LastStep("obs", "id")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := d.client().Info(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	// 1 + 4 + 9 = 14 = 0.875 × 2^4, and 3 items = 0.75 × 2^2.
	want := map[string]tables.Weight{"p": {Fraction: 0.875, Exponent: 4}, "u": {Fraction: 0.75, Exponent: 2}}
	for _, ti := range info.Tables {
		if ti.Weight != want[ti.Name] {
			t.Errorf("table %s: weight %+v, want %+v", ti.Name, ti.Weight, want[ti.Name])
		}
	}
}
