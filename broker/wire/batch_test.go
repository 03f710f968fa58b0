package wire

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"
)

// TestBatchBuilder: the builder writes what proto.Marshal writes for the
// same message, to the byte, whatever fields are set or empty, and Undo
// leaves no trace of what it drops.
func TestBatchBuilder(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for trial := range 300 {
		id := []string{"", "0123456789abcdef0123456789abcdef"}[min(trial%4, 1)]
		want := &InsertBatch{ProducerId: id, Sequence: []uint64{0, 1, 300, math.MaxUint64}[rng.IntN(4)]}
		b := NewBatchBuilder(id, rng.IntN(2)*1<<16)
		for range rng.IntN(5) {
			c, err := EncodeChunk(rng.Uint64(), []*Tensor{randomTensor(rng, "int16", []int64{int64(rng.IntN(40))})}, ChunkOptions{Codec: allCodecs[rng.IntN(len(allCodecs))]})
			if err != nil {
				t.Fatal(err)
			}
			it := &Item{Key: rng.Uint64(), Table: "t", Priority: rng.Float64(), PolicyVersion: rng.Int64N(3) - 1,
				Columns: []*TrajectoryColumn{{Name: "x", Squeeze: rng.IntN(2) == 0, Slices: []*ColumnSlice{{ChunkKey: c.Key, Length: 1}}}}}
			if rng.IntN(3) == 0 {
				// Added, then dropped: as when an item does not fit.
				m := b.Mark()
				b.AddChunk(c)
				b.AddItem(it)
				b.Undo(m)
			}
			b.AddChunk(c)
			b.AddItem(it)
			want.Chunks, want.Items = append(want.Chunks, c), append(want.Items, it)
		}
		for range rng.IntN(4) {
			want.ReleaseChunkKeys = append(want.ReleaseChunkKeys, rng.Uint64()>>rng.UintN(64))
		}
		want.EndOfStream = rng.IntN(2) == 0
		want.WindowStart = []uint64{0, 1, 1 << 40}[rng.IntN(3)]
		want.Window = []uint32{0, 64}[rng.IntN(2)]
		want.NoticeSubject = []string{"", "_INBOX.x.y"}[rng.IntN(2)]
		if b.Items() != len(want.Items) {
			t.Fatalf("trial %d: %d items, want %d", trial, b.Items(), len(want.Items))
		}
		wantSize := 0
		for _, c := range want.Chunks {
			wantSize += len(mustMarshal(t, &InsertBatch{Chunks: []*Chunk{c}}))
		}
		for _, it := range want.Items {
			wantSize += len(mustMarshal(t, &InsertBatch{Items: []*Item{it}}))
		}
		if b.Size() != wantSize {
			t.Fatalf("trial %d: Size %d, want %d", trial, b.Size(), wantSize)
		}
		got := b.Finish(want.Sequence, want.ReleaseChunkKeys, want.EndOfStream, want.WindowStart, want.Window, want.NoticeSubject)
		if exp := mustMarshal(t, want); !bytes.Equal(got, exp) {
			t.Fatalf("trial %d: builder wrote\n%x\nproto.Marshal writes\n%x", trial, got, exp)
		}
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
