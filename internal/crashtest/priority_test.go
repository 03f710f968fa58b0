package crashtest

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/tables"
)

// TestExtremePrioritiesNoCrashLoop: priorities whose sum or power overflows
// float64 once made the apply loop panic, and every restart replayed the
// same message into the same panic. Now they are ordinary priorities: the
// service stays up, and after a kill -9 it restarts on the same store with
// every item in.
func TestExtremePrioritiesNoCrashLoop(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "reprise.yaml")
	if err := os.WriteFile(cfg, []byte(`tables:
  - name: linear
    sampler: {kind: prioritized, exponent: 1}
    max_size: 100
  - name: power
    sampler: {kind: prioritized, exponent: 1.5}
    max_size: 100
`), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	r := startReprised(t, "--config", cfg, "--store", t.TempDir(), "--listen", addr)
	url := "nats://" + addr
	c := readyClient(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := broker.NewProducer(ctx, connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	priorities := map[string][]float64{"linear": {1e308, math.MaxFloat64, 1}, "power": {1e300, 1e200, 5e-324}}
	for id := range int64(3) {
		if err := p.Append(ctx, broker.Step{"id": broker.Int64s(nil, []int64{id})}); err != nil {
			t.Fatal(err)
		}
		for name, prios := range priorities {
			if err := p.CreateItem(ctx, name, prios[id], broker.LastStep("id")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatalf("inserting extreme priorities: %v", err)
	}
	items, err := c.Items(ctx, "linear", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var updates []tables.PriorityUpdate
	for _, it := range items.Items {
		updates = append(updates, tables.PriorityUpdate{Key: it.Key, Priority: math.MaxFloat64})
	}
	if err := c.UpdatePriorities(ctx, "linear", updates...); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for name := range priorities {
			info, err := c.Info(ctx, name)
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			if info.Tables[0].Size != 3 {
				t.Fatalf("%s: table %s holds %d items, want 3", when, name, info.Tables[0].Size)
			}
			if _, err := c.Sample(ctx, name, 16); err != nil {
				t.Fatalf("%s: sampling %s: %v", when, name, err)
			}
		}
	}
	waitFor(t, "the priority updates are applied", func() bool {
		items, err := c.Items(ctx, "linear", 0, 10)
		if err != nil {
			return false
		}
		for _, it := range items.Items {
			if it.Priority != math.MaxFloat64 {
				return false
			}
		}
		return true
	})
	check("running")
	if ended, err := r.ended(); ended {
		t.Fatalf("reprised exited: %v", err)
	}
	r.kill()
	r.start()
	waitReady(t, c)
	check("after kill -9 and restart")
}
