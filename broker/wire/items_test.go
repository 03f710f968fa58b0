package wire

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/tables"
)

// TestAppendItemsResponse: the hand-written encoder of an items reply
// writes the bytes the generated code does, on random items with edge
// values (zeros, negative times and versions, huge keys, shared chunks),
// and SizeItemInfo sums to its size.
func TestAppendItemsResponse(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	chunks := make([]*tables.Chunk, 6)
	for i := range chunks {
		chunks[i] = &tables.Chunk{Key: uint64(i) * math.MaxUint64 / 5}
	}
	for trial := range 200 {
		var items []tables.ItemView
		want := &ItemsResponse{Status: &Status{}, TableSize: []int64{0, 1, math.MaxInt64}[rng.IntN(3)]}
		for range rng.IntN(5) {
			layout, used := randomLayout(t, rng, chunks)
			it := tables.ItemView{
				Key: rng.Uint64() >> rng.UintN(64), Priority: []float64{0, math.Copysign(0, -1), 3.5, 1e300}[rng.IntN(4)],
				TimesSampled: int32(rng.IntN(3)), InsertedAt: time.Unix(0, []int64{0, -5, 1_700_000_000_000_000_000}[rng.IntN(3)]),
				PolicyVersion: []int64{0, -1, 7, math.MaxInt64}[rng.IntN(4)], Layout: layout, Chunks: used,
			}
			items = append(items, it)
			want.Items = append(want.Items, &ItemInfo{Key: it.Key, Priority: it.Priority, TimesSampled: it.TimesSampled,
				InsertedAtUnixNano: it.InsertedAt.UnixNano(), Columns: FromTableColumns(layout.Trajectory(used)), PolicyVersion: it.PolicyVersion})
		}
		got := AppendItemsResponse([]byte("prefix"), want.TableSize, items)
		ref, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[len("prefix"):], ref) {
			t.Fatalf("trial %d: encoded\n%x\nthe generated code encodes\n%x", trial, got[len("prefix"):], ref)
		}
		sum := 0
		for i := range items {
			sum += SizeItemInfo(&items[i])
		}
		if sum != proto.Size(want)-proto.Size(&ItemsResponse{Status: &Status{}, TableSize: want.TableSize}) {
			t.Fatalf("trial %d: SizeItemInfo sums to %d bytes, the generated code's items take %d", trial, sum, proto.Size(want))
		}
	}
}
