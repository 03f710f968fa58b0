package service

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
)

// TestMessageLargerThanPullBytes: a message the server accepts but larger
// than the reader's pull bytes (max_payload raised past the default
// service.pull_bytes) must still be applied. JetStream refuses to deliver
// it to a pull of fewer bytes, and the reader, recreating its consumer
// from the same sequence, stalled the service for good.
func TestMessageLargerThanPullBytes(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 10)}, deployOptions{maxPayload: 4 << 20, service: []Option{WithPullBytes(1 << 20)}})
	p := d.producer(broker.WithCompression(wire.Uncompressed))
	obs := make([]float32, 512<<10) // 2 MiB
	for i := range obs {
		obs[i] = rand.Float32()
	}
	ctx, cancel := context.WithTimeout(testutil.Context(t), 20*time.Second)
	defer cancel()
	if err := p.Append(ctx, broker.Step{"obs": broker.Float32s([]int64{int64(len(obs))}, obs)}); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "t", 1, broker.LastStep("obs")); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("flush of an item of 2 MiB with pull bytes of 1 MiB: %v", err)
	}
}
