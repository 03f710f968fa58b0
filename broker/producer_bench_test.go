package broker_test

import (
	"context"
	"testing"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"
)

// BenchmarkProducerAppend measures an actor's own cost per item, what
// raw JetStream publishing does not pay: a one-step item of 400 bytes
// appended and created (chunk length 1, uncompressed, as in the suite's
// inserts), through an embedded server and table service. Only Append and
// CreateItem are timed; the Flush every 64 items, a round trip, is not,
// nor are its allocations counted.
//
//	go test -run - -bench ProducerAppend -benchmem ./broker
func BenchmarkProducerAppend(b *testing.B) {
	nc, stop := startReprise()
	defer stop()
	ctx := context.Background()
	p, err := broker.NewProducer(ctx, nc, broker.WithCompression(wire.Uncompressed))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(ctx)
	step := broker.Step{"payload": broker.Float32s([]int64{100}, make([]float32, 100))}
	traj := broker.LastStep("payload")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := p.Append(ctx, step); err != nil {
			b.Fatal(err)
		}
		if err := p.CreateItem(ctx, "replay", 1, traj); err != nil {
			b.Fatal(err)
		}
		if i++; i%64 == 0 {
			b.StopTimer()
			if err := p.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
}
