package service

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/embeddednats"
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

// TestMessageStoredUnderALargerMaxPayload: the stream keeps messages that
// a server with a larger max_payload took (an operator lowering
// --max-payload across a restart, or another node of a cluster). Raising
// pull bytes to the current connection's max payload does not cover them:
// JetStream answers every pull of fewer bytes "Message Size Exceeds
// MaxBytes", which nats.go swallows and pulls again, and the service never
// applied the message nor anything after it, logging nothing.
func TestMessageStoredUnderALargerMaxPayload(t *testing.T) {
	store := t.TempDir()
	ctx := testutil.Context(t)
	startServer := func(maxPayload int32) *embeddednats.Server {
		srv, err := embeddednats.Start(ctx, embeddednats.WithStoreDir(store), embeddednats.WithListen("127.0.0.1:-1"),
			embeddednats.WithMaxPayload(maxPayload), embeddednats.WithLogger(testutil.QuietLogger()))
		if err != nil {
			t.Fatal(err)
		}
		return srv
	}
	cfgs := []tables.Config{testutil.UniformTable("t", 10)}
	big := startServer(4 << 20)
	d := deploy(t, cfgs, deployOptions{url: big.ClientURL(), service: []Option{WithPullBytes(1 << 20)}})
	p := d.producer(broker.WithCompression(wire.Uncompressed))
	obs := make([]float32, 512<<10) // 2 MiB
	for i := range obs {
		obs[i] = rand.Float32()
	}
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := p.Append(fctx, broker.Step{"obs": broker.Float32s([]int64{int64(len(obs))}, obs)}); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(fctx, "t", 1, broker.LastStep("obs")); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	applied := d.svc.Applied()
	if err := p.Close(fctx); err != nil {
		t.Fatal(err)
	}
	d.stop()
	if err := big.Shutdown(fctx); err != nil {
		t.Fatal(err)
	}

	small := startServer(1 << 20)
	defer small.Shutdown(context.Background())
	d2 := deploy(t, cfgs, deployOptions{url: small.ClientURL(), service: []Option{WithPullBytes(1 << 20)}})
	testutil.WaitUntil(t, "a service restarted on a server of a 1 MiB max payload applies the 2 MiB message stored before", func() bool {
		return d2.svc.Applied() >= applied
	})
}
