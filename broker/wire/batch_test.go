package wire

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"
)

// TestBatchBuilder: the builder writes what proto.Marshal writes for the
// same message, to the byte, whatever fields are set or empty; Undo leaves
// no trace of what it drops, and a builder Reset into the buffer of its
// last message none of that message.
func TestBatchBuilder(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	var last *BatchBuilder
	var lastID string
	var lastMsg []byte
	for trial := range 300 {
		id := []string{"", "0123456789abcdef0123456789abcdef"}[min(trial%4, 1)]
		want := &InsertBatch{ProducerId: id, Sequence: []uint64{0, 1, 300, math.MaxUint64}[rng.IntN(4)]}
		var b *BatchBuilder
		if last != nil && lastID == id && rng.IntN(2) == 0 {
			b = last
			b.Reset(lastMsg, rng.IntN(2)*1<<16)
		} else {
			b = NewBatchBuilder(id, rng.IntN(2)*1<<16)
		}
		for range rng.IntN(5) {
			c, err := EncodeChunk(rng.Uint64(), []*Tensor{randomTensor(rng, "int16", []int64{int64(rng.IntN(40))})}, ChunkOptions{Codec: allCodecs[rng.IntN(len(allCodecs))]})
			if err != nil {
				t.Fatal(err)
			}
			if rng.IntN(4) == 0 {
				c = randomChunk(rng)
			}
			it := randomItem(rng, c.Key)
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
		last, lastID, lastMsg = b, id, got
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

// randomChunk is a chunk with every field zero, set or at its extremes,
// as a hand-made chunk (not EncodeChunk's) could have them.
func randomChunk(rng *rand.Rand) *Chunk {
	pick := func(vs ...uint64) uint64 { return vs[rng.IntN(len(vs))] }
	c := &Chunk{
		Key:          pick(0, 1, rng.Uint64()),
		Dtype:        []string{"", "float32", "uint8"}[rng.IntN(3)],
		Length:       int32(pick(0, 1, 1<<31-1, 1<<31)), // 1<<31 wraps to MinInt32
		Compression:  Compression(pick(0, 1, 2, 1<<31)),
		DeltaEncoded: rng.IntN(2) == 0,
		RawSize:      pick(0, 300, ^uint64(0)),
		EpisodeId:    pick(0, rng.Uint64()),
		EpisodeStep:  int64(pick(0, 5, 1<<63)),
	}
	for range rng.IntN(4) {
		c.StepShape = append(c.StepShape, int64(pick(0, 3, 1<<40, ^uint64(0))))
	}
	if rng.IntN(3) > 0 {
		c.Data = make([]byte, rng.IntN(300))
	}
	return c
}

// randomItem is an item naming chunk key, with every field zero, set or at
// its extremes: priorities of 0, -0 and NaN, no columns or several, empty
// names, negative offsets.
func randomItem(rng *rand.Rand, key uint64) *Item {
	priorities := []float64{0, math.Copysign(0, -1), math.NaN(), math.Inf(1), -2.5, rng.Float64()}
	it := &Item{
		Key:           []uint64{0, key, rng.Uint64()}[rng.IntN(3)],
		Table:         []string{"", "t", "a table"}[rng.IntN(3)],
		Priority:      priorities[rng.IntN(len(priorities))],
		PolicyVersion: []int64{0, -1, 1, math.MinInt64, math.MaxInt64}[rng.IntN(5)],
	}
	for range rng.IntN(4) {
		col := &TrajectoryColumn{Name: []string{"", "x", "obs/pixels"}[rng.IntN(3)], Squeeze: rng.IntN(2) == 0}
		for range rng.IntN(4) {
			col.Slices = append(col.Slices, &ColumnSlice{ChunkKey: []uint64{0, key}[rng.IntN(2)],
				Offset: []int32{0, 3, -1, math.MinInt32}[rng.IntN(4)], Length: []int32{0, 1, math.MaxInt32}[rng.IntN(3)]})
		}
		it.Columns = append(it.Columns, col)
	}
	return it
}
