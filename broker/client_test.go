package broker

import (
	"testing"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
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
