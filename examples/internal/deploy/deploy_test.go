package deploy

import (
	"context"
	"strings"
	"testing"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/internal/natsconn"
	"github.com/reprise-rl/reprise/tables"
)

func TestDifferences(t *testing.T) {
	q := tables.QueueConfig("q", 16)
	served := broker.TableInfo{
		Name: "q", Sampler: "fifo", Remover: "fifo", MaxSize: 16, MaxTimesSampled: 1,
		Limiter: broker.LimiterInfo{SamplesPerInsert: 1, MinSize: 1, MinDiff: 0, MaxDiff: 16},
	}
	if d := differences(served, q); d != "" {
		t.Errorf("a matching table differs: %s", d)
	}
	served.Sampler, served.MaxSize, served.Limiter.MaxDiff = "uniform", 8, 8
	d := differences(served, q)
	for _, want := range []string{"sampler uniform, want fifo", "max_size 8, want 16", "max_diff 8, want 16"} {
		if !strings.Contains(d, want) {
			t.Errorf("differences = %q, lacks %q", d, want)
		}
	}
}

func TestEmbeddedServesAndResets(t *testing.T) {
	ctx := context.Background()
	d, err := Start(ctx, Flags{Prefix: "deploy.test", Embedded: true}, []tables.Config{tables.QueueConfig("q", 4)})
	if err != nil {
		t.Fatal(err)
	}
	if d.Where != "an embedded NATS server" {
		t.Errorf("Where = %q", d.Where)
	}
	if _, err := d.Connect(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func TestNoReprised(t *testing.T) {
	_, err := Start(context.Background(), Flags{Conn: natsconn.Config{URL: "nats://127.0.0.1:1"}, Prefix: "x"}, nil)
	if err == nil || !strings.Contains(err.Error(), "go run ./cmd/reprised --config examples/reprise.yaml") || !strings.Contains(err.Error(), "--embedded") {
		t.Errorf("Start without a server: %v, want the commands that fix it", err)
	}
}
