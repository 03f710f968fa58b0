package wire

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/tables"
)

// FuzzDecodeChunk feeds arbitrary bytes through protobuf into DecodeChunk,
// which must never panic, must return a consistent tensor when it accepts a
// chunk, and must not allocate beyond the chunk's declared raw size.
func FuzzDecodeChunk(f *testing.F) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, codec := range allCodecs {
		for _, delta := range []bool{false, true} {
			steps := []*Tensor{randomTensor(rng, "int16", []int64{3, 2}), randomTensor(rng, "int16", []int64{3, 2})}
			c, err := EncodeChunk(3, steps, ChunkOptions{Codec: codec, Delta: delta})
			if err != nil {
				f.Fatal(err)
			}
			b, err := proto.Marshal(c)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	f.Add([]byte{})
	// Warm the codecs up so their one-time set-up does not count as the
	// allocation of the first input.
	if _, err := zstdDecoder(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var c Chunk
		if proto.Unmarshal(b, &c) != nil {
			return
		}
		var out *Tensor
		var err error
		allocated := allocatedBytes(func() { out, err = DecodeChunk(&c) })
		// The decoder may allocate the raw size it has checked, plus
		// bookkeeping; a chunk whose raw size is over the limit must cost
		// next to nothing.
		budget := uint64(1 << 20)
		if c.RawSize <= MaxChunkRawSize {
			budget += c.RawSize
		}
		if allocated > budget {
			t.Fatalf("DecodeChunk allocated %d bytes for raw_size %d (%v)", allocated, c.RawSize, err)
		}
		if err != nil {
			return
		}
		if err := ValidateTensor(out); err != nil {
			t.Fatalf("decoded tensor invalid: %v", err)
		}
		if want := append([]int64{int64(c.Length)}, c.StepShape...); !slices.Equal(out.Shape, want) || out.Dtype != c.Dtype {
			t.Fatalf("decoded %s %v, chunk says %s %v", out.Dtype, out.Shape, c.Dtype, want)
		}
		if uint64(len(out.Data)) != c.RawSize {
			t.Fatalf("decoded %d bytes, raw_size %d", len(out.Data), c.RawSize)
		}
	})
}

// FuzzDecodeSampleResponse: whatever a server sends, the learner's decoder
// returns an error or tensors that hold exactly their shapes, and agrees
// with the long way (generated code, a record at a time, DecodeChunk)
// wherever that accepts the response too. DecodeBatchResponse gives a
// batch only of items that decode, and then their stack.
func FuzzDecodeSampleResponse(f *testing.F) {
	rng := rand.New(rand.NewPCG(9, 10))
	for range 8 {
		f.Add(pack(f, Code_CODE_OK, "", sampledFixture(f, rng), randomTableState(rng)))
		f.Add(packLayout(f, PackedLayout_PACKED_LAYOUT_UNIFORM, Code_CODE_OK, "", uniformFixture(f, rng), randomTableState(rng)))
		f.Add(packLayout(f, PackedLayout_PACKED_LAYOUT_UNIFORM, Code_CODE_OK, "", stackableFixture(f, rng), randomTableState(rng)))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		batch, batchErr := DecodeBatchResponse(slices.Clone(b))
		got, err := DecodeSampleResponse(slices.Clone(b))
		if err != nil {
			if batchErr == nil {
				t.Fatalf("a batch of items that do not decode (%v)", err)
			}
			return
		}
		// Items that stack by hand may still differ in a column's
		// squeezing where its shapes agree: only such items are refused.
		switch stacked, stackErr := stackByHand(got.Samples); {
		case batchErr == nil && stackErr != nil:
			t.Fatalf("a batch of items that do not stack (%v)", stackErr)
		case batchErr == nil && !equalBatches(batch.Batch, stacked):
			t.Fatalf("batch\n%+v\nstacked by hand\n%+v", batch.Batch, stacked)
		case batchErr != nil && stackErr == nil && !errors.Is(batchErr, ErrUnstackable):
			t.Fatalf("items that stack refused: %v", batchErr)
		}
		for _, s := range got.Samples {
			for _, c := range s.Columns {
				if err := ValidateTensor(&Tensor{Dtype: c.Dtype, Shape: c.Shape, Data: c.Data}); err != nil {
					t.Fatalf("column %q: %v", c.Name, err)
				}
			}
		}
		if want, err := referencePacked(b); err == nil && (!equalSamples(got.Samples, want.Samples) || !sameTableState(got.After, want.After)) {
			t.Fatalf("decoded\n%+v\nthe long way\n%+v", got, want)
		}
	})
}

// FuzzRoundTrip encodes arbitrary bytes as steps of each dtype and codec
// and checks that decoding gives them back exactly.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef"), uint8(3), uint8(4), uint8(0), true)
	f.Add([]byte{0xff, 0, 0xff, 0, 0x80, 0x7f}, uint8(1), uint8(2), uint8(1), true)
	f.Add([]byte{}, uint8(12), uint8(1), uint8(2), false)
	f.Fuzz(func(t *testing.T, data []byte, dtypeIndex, length, codec uint8, delta bool) {
		dtype := allDtypes[int(dtypeIndex)%len(allDtypes)]
		size, err := ElemSize(dtype)
		if err != nil {
			t.Fatal(err)
		}
		n := 1 + int(length)%16
		elems := len(data) / size / n
		stepBytes := elems * size
		steps := make([]*Tensor, n)
		for i := range steps {
			steps[i] = &Tensor{Dtype: dtype, Shape: []int64{int64(elems)}, Data: data[i*stepBytes : (i+1)*stepBytes]}
		}
		opts := ChunkOptions{Codec: allCodecs[int(codec)%len(allCodecs)], Delta: delta}
		c, err := EncodeChunk(1, steps, opts)
		if err != nil {
			t.Fatal(err)
		}
		b, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var got Chunk
		if err := proto.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		out, err := DecodeChunk(&got)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Data, data[:n*stepBytes]) || !slices.Equal(out.Shape, []int64{int64(n), int64(elems)}) {
			t.Fatalf("round trip changed %s steps (%v, delta %t)", dtype, opts.Codec, delta)
		}
	})
}

// FuzzReadStoredChunk: the packer's reading of a stored chunk's header
// with its store's Format never panics, and says what the full reader
// says of a header that reader accepts: codec, differences, raw size and
// payload.
func FuzzReadStoredChunk(f *testing.F) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, s := range uniformFixture(f, rng) {
		for _, ch := range s.Chunks {
			f.Add(ch.Data)
		}
	}
	f.Add([]byte{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x42, 0x02, 1, 2})
	f.Add([]byte{0xa0, 0x01, 0x05, 0x42, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		var p packer
		var got storedChunk
		err := p.readStoredChunk(&tables.Chunk{Key: 1, Length: 1, Format: &tables.Format{DType: "float32"}, Data: b}, &got)
		var want Chunk
		if _, werr := readChunkInto(&want, b, nil); werr != nil {
			return
		}
		if err != nil {
			t.Fatalf("a header the full reader accepts refused: %v", err)
		}
		if got.compression != want.Compression || got.delta != want.DeltaEncoded || got.rawSize != want.RawSize || !bytes.Equal(got.payload, want.Data) {
			t.Fatalf("read %+v, the full reader %+v", got, &want)
		}
		if want.Compression != Compression_COMPRESSION_NONE || len(want.Data) == 0 || want.RawSize != uint64(len(want.Data)) {
			return
		}
		// Where its format locates the steps, as the service's does for an
		// uncompressed chunk it accepted (its raw size that of its data),
		// the packer takes the same bytes from there.
		at := int32(cap(b) - cap(want.Data))
		f := &tables.Format{DType: "float32", StepBytes: int64(len(want.Data)), DataAt: at, Delta: want.DeltaEncoded}
		var located storedChunk
		if err := p.readStoredChunk(&tables.Chunk{Key: 1, Length: 1, Format: f, Data: b}, &located); err != nil {
			t.Fatal(err)
		}
		if located.compression != got.compression || located.delta != got.delta || located.rawSize != got.rawSize || !bytes.Equal(located.payload, got.payload) {
			t.Fatalf("read %+v from the format's location, %+v from the header", located, got)
		}
	})
}

// FuzzConsumeField: ConsumeField's one-byte shortcuts read every field as
// protowire's calls do, and fail where they fail, with the same error.
func FuzzConsumeField(f *testing.F) {
	for _, seed := range [][]byte{
		{0x08, 0x05}, {0x08, 0x96, 0x01}, {0x12, 0x02, 'h', 'i'}, {0x12, 0x03, 'h', 'i'},
		{0x12, 0x00}, {0x19, 1, 2, 3, 4, 5, 6, 7, 8}, {0x1d, 1, 2, 3, 4}, {0x00, 0x01},
		{0x0b, 0x08, 0x01, 0x0c}, {0x0c}, {0x0e}, {0x80, 0x01, 0x05}, {0x12, 0x80, 0x01},
		{0xfa, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x00}, {},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		num, typ, v, got, n := ConsumeField(b)
		wantNum, wantTyp, m := protowire.ConsumeTag(b)
		var (
			wantV     uint64
			wantBytes []byte
		)
		if m >= 0 {
			var k int
			switch wantTyp {
			case protowire.VarintType:
				wantV, k = protowire.ConsumeVarint(b[m:])
			case protowire.BytesType:
				wantBytes, k = protowire.ConsumeBytes(b[m:])
			case protowire.Fixed64Type:
				wantV, k = protowire.ConsumeFixed64(b[m:])
			case protowire.Fixed32Type:
				var v32 uint32
				v32, k = protowire.ConsumeFixed32(b[m:])
				wantV = uint64(v32)
			default:
				k = protowire.ConsumeFieldValue(wantNum, wantTyp, b[m:])
			}
			if k < 0 {
				m = k
			} else {
				m += k
			}
		}
		if m < 0 {
			if n >= 0 || protowire.ParseError(n).Error() != protowire.ParseError(m).Error() {
				t.Fatalf("ConsumeField(%x) = %d, want error %v", b, n, protowire.ParseError(m))
			}
			return
		}
		if n != m || num != wantNum || typ != wantTyp || v != wantV || !bytes.Equal(got, wantBytes) || (got == nil) != (wantBytes == nil) {
			t.Fatalf("ConsumeField(%x) = %d %d %d %x %d, want %d %d %d %x %d", b, num, typ, v, got, n, wantNum, wantTyp, wantV, wantBytes, m)
		}
	})
}
