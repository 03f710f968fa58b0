package service

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/reprise-rl/reprise/internal/testutil"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// BenchmarkRecovery measures loading a checkpoint of n small items (one
// 8-byte chunk each, as in the Reverb paper's smallest workload): decoding
// plus rebuilding the tables, selectors and chunk store. Report: ns/op is
// one whole recovery; items/s is the rate.
//
//	go test -run - -bench Recovery -benchtime 3x ./broker
func BenchmarkRecovery(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("items=%d", n), func(b *testing.B) {
			cfgs := []tables.Config{testutil.UniformTable("t", int64(n))}
			url := testutil.StartEmbedded(b, 0)
			nc, err := nats.Connect(url)
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			svc, err := New(nc, cfgs, WithPrefix("bench"), WithLogger(testutil.QuietLogger()))
			if err != nil {
				b.Fatal(err)
			}
			t := svc.tables["t"]
			ctx := context.Background()
			for i := range n {
				ch, err := wire.EncodeChunk(uint64(i+1), []*wire.Tensor{wire.Int64s(nil, []int64{int64(i)})}, wire.ChunkOptions{})
				if err != nil {
					b.Fatal(err)
				}
				raw := mustMarshal(b, ch)
				c, _, err := new(chunkParser).parse(raw)
				if err != nil {
					b.Fatal(err)
				}
				svc.store.Put(&c)
				if err := t.Insert(ctx, tables.Item{Key: uint64(i + 1), Priority: 1, Trajectory: []tables.Column{{Name: "id", Squeeze: true, Slices: []tables.Slice{{Chunk: c.Key, Length: 1}}}}}); err != nil {
					b.Fatal(err)
				}
				svc.store.Release(c.Key)
			}
			r, err := svc.capture().encode()
			if err != nil {
				b.Fatal(err)
			}
			data, err := io.ReadAll(r)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for range b.N {
				fresh, err := New(nc, cfgs, WithPrefix("bench"), WithLogger(testutil.QuietLogger()))
				if err != nil {
					b.Fatal(err)
				}
				cp, err := readCheckpoint(bytes.NewReader(data))
				if err != nil {
					b.Fatal(err)
				}
				if err := fresh.restore(cp); err != nil {
					b.Fatal(err)
				}
				if got := fresh.tables["t"].Size(); got != int64(n) {
					b.Fatalf("restored %d items, want %d", got, n)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "items/s")
		})
	}
}
