package wire

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// A ChunkReader reads what ReadChunk reads, chunk after chunk, each field
// reset between them, without allocating once its shape array has grown.
func TestChunkReader(t *testing.T) {
	chunks := []*Chunk{
		{Key: 1, Dtype: "float32", StepShape: []int64{2, 3}, Length: 2, RawSize: 48, Data: make([]byte, 48), EpisodeId: 9, EpisodeStep: 4},
		{Key: 2, Dtype: "int64", Length: 1, RawSize: 8, Data: make([]byte, 8)},
		{Key: 3, Dtype: "uint8", StepShape: []int64{5}, Length: 3, Compression: Compression_COMPRESSION_ZSTD, DeltaEncoded: true, RawSize: 15, Data: []byte{1, 2}},
		{Key: 4, Dtype: "int16", StepShape: []int64{7}, Length: 1, RawSize: 14, Data: make([]byte, 14)},
	}
	encoded := make([][]byte, len(chunks))
	for i, c := range chunks {
		b, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		encoded[i] = b
	}
	var r ChunkReader
	for round := range 2 {
		for i, b := range encoded {
			got, err := r.Read(b)
			if err != nil {
				t.Fatal(err)
			}
			want, err := ReadChunk(b)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, want) || !proto.Equal(got, chunks[i]) {
				t.Fatalf("round %d, chunk %d: read %v, want %v", round, i, got, chunks[i])
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		for _, b := range encoded {
			if _, err := r.Read(b); err != nil {
				t.Fatal(err)
			}
		}
	}); n != 0 {
		t.Fatalf("reading %d chunks allocated %v times", len(encoded), n)
	}
	if _, err := r.Read([]byte{0xff}); err == nil {
		t.Fatal("Read of a malformed chunk succeeded")
	}
}

func TestCountMessages(t *testing.T) {
	var m []byte
	m = protowire.AppendTag(m, 2, protowire.BytesType)
	m = protowire.AppendBytes(m, []byte("item"))
	m = protowire.AppendTag(m, 3, protowire.BytesType)
	m = protowire.AppendBytes(m, nil)
	m = protowire.AppendTag(m, 2, protowire.VarintType) // a 2 that is no message
	m = protowire.AppendVarint(m, 7)
	m = protowire.AppendTag(m, 4, protowire.BytesType)
	m = protowire.AppendBytes(m, []byte("other"))
	m = protowire.AppendTag(m, 2, protowire.BytesType)
	m = protowire.AppendBytes(m, []byte("item"))
	if a, b := CountMessages(m, 2, 3); a != 2 || b != 1 {
		t.Fatalf("CountMessages = %d, %d; want 2, 1", a, b)
	}
	// A field cut short ends the count at what came before it.
	if a, b := CountMessages(m[:len(m)-2], 2, 3); a != 1 || b != 1 {
		t.Fatalf("CountMessages of a truncated message = %d, %d; want 1, 1", a, b)
	}
}
