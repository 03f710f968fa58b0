package service

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/reprise-rl/reprise/internal/testutil"

	"github.com/reprise-rl/reprise/broker"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// randomFloats is a step of random float32s of the given byte size, the
// Reverb paper's payload.
func randomFloats(rng *rand.Rand, bytes int) broker.Step {
	v := make([]float32, bytes/4)
	for i := range v {
		v[i] = rng.Float32()
	}
	return broker.Step{"x": broker.Float32s([]int64{int64(len(v))}, v)}
}

// BenchmarkInsertPath measures items/s from broker.Producer.CreateItem to applied
// in the table, through an embedded server over loopback TCP.
//
//	go test -run - -bench 'Path' -benchtime 20000x ./broker
func BenchmarkInsertPath(b *testing.B) {
	for _, size := range []int{400, 40_000} {
		b.Run(fmt.Sprintf("payload=%d", size), func(b *testing.B) {
			d := deploy(b, []tables.Config{testutil.UniformTable("t", 1_000_000)}, deployOptions{})
			p := d.producer(broker.WithCompression(wire.Uncompressed))
			ctx := context.Background()
			step := randomFloats(rand.New(rand.NewPCG(1, 2)), size)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for range b.N {
				if err := p.Append(ctx, step); err != nil {
					b.Fatal(err)
				}
				if err := p.CreateItem(ctx, "t", 1, broker.LastStep("x")); err != nil {
					b.Fatal(err)
				}
			}
			if err := p.WaitApplied(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
		})
	}
}

// BenchmarkSamplePath measures items/s of batches of 256 sampled, sent and
// decoded, through an embedded server over loopback TCP.
func BenchmarkSamplePath(b *testing.B) {
	for _, size := range []int{400, 40_000} {
		b.Run(fmt.Sprintf("payload=%d", size), func(b *testing.B) {
			d := deploy(b, []tables.Config{testutil.UniformTable("t", 1_000_000)}, deployOptions{})
			p := d.producer(broker.WithCompression(wire.Uncompressed))
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, 2))
			for range 1000 {
				if err := p.Append(ctx, randomFloats(rng, size)); err != nil {
					b.Fatal(err)
				}
				if err := p.CreateItem(ctx, "t", 1, broker.LastStep("x")); err != nil {
					b.Fatal(err)
				}
			}
			if err := p.WaitApplied(ctx); err != nil {
				b.Fatal(err)
			}
			c := d.client()
			const batch = 256
			b.SetBytes(int64(size * batch))
			b.ResetTimer()
			for range b.N {
				if _, err := c.Sample(ctx, "t", batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "items/s")
		})
	}
}
