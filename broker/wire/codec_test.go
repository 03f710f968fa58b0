package wire

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
)

var allDtypes = []string{
	"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
	"float16", "bfloat16", "float32", "float64", "complex64", "complex128",
}

var integerDtypes = []string{"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}

var allCodecs = []Codec{Zstd, S2, Uncompressed}

// randomTensor returns a tensor of the given dtype and shape holding random
// bytes; the codec works on bytes, so any bit pattern must survive.
func randomTensor(rng *rand.Rand, dtype string, shape []int64) *Tensor {
	size, err := ElemSize(dtype)
	if err != nil {
		panic(err)
	}
	n := int64(size)
	for _, d := range shape {
		n *= d
	}
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(rng.UintN(256))
	}
	return &Tensor{Dtype: dtype, Shape: slices.Clone(shape), Data: data}
}

// roundTrip encodes steps, sends the chunk through protobuf, and decodes it.
func roundTrip(t *testing.T, key uint64, steps []*Tensor, opts ChunkOptions) (*Chunk, *Tensor) {
	t.Helper()
	c, err := EncodeChunk(key, steps, opts)
	if err != nil {
		t.Fatalf("EncodeChunk: %v", err)
	}
	b, err := proto.Marshal(c)
	if err != nil {
		t.Fatalf("proto.Marshal: %v", err)
	}
	var got Chunk
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatalf("proto.Unmarshal: %v", err)
	}
	out, err := DecodeChunk(&got)
	if err != nil {
		t.Fatalf("DecodeChunk: %v", err)
	}
	return c, out
}

func checkBatch(t *testing.T, out *Tensor, steps []*Tensor) {
	t.Helper()
	wantShape := append([]int64{int64(len(steps))}, steps[0].Shape...)
	if out.Dtype != steps[0].Dtype || !slices.Equal(out.Shape, wantShape) {
		t.Fatalf("decoded %s %v, want %s %v", out.Dtype, out.Shape, steps[0].Dtype, wantShape)
	}
	var want []byte
	for _, s := range steps {
		want = append(want, s.Data...)
	}
	if !bytes.Equal(out.Data, want) {
		t.Fatalf("decoded data differs from the steps")
	}
	if err := ValidateTensor(out); err != nil {
		t.Fatalf("decoded tensor: %v", err)
	}
}

func TestChunkRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	shapes := [][]int64{{}, {3}, {2, 3, 4}, {0}, {2, 0, 3}}
	for _, dtype := range allDtypes {
		for _, shape := range shapes {
			for _, length := range []int{1, 7} {
				for _, codec := range allCodecs {
					for _, delta := range []bool{false, true} {
						name := fmt.Sprintf("%s/%v/len%d/%v/delta=%t", dtype, shape, length, codec, delta)
						t.Run(name, func(t *testing.T) {
							steps := make([]*Tensor, length)
							for i := range steps {
								steps[i] = randomTensor(rng, dtype, shape)
							}
							opts := ChunkOptions{Codec: codec, Delta: delta, EpisodeID: 9, EpisodeStep: 40}
							c, out := roundTrip(t, 42, steps, opts)
							checkBatch(t, out, steps)
							integer := slices.Contains(integerDtypes, dtype)
							if c.DeltaEncoded != (delta && integer) {
								t.Errorf("DeltaEncoded = %t, want %t", c.DeltaEncoded, delta && integer)
							}
							if c.Key != 42 || c.EpisodeId != 9 || c.EpisodeStep != 40 || c.Length != int32(length) {
								t.Errorf("chunk header = key %d episode %d/%d length %d", c.Key, c.EpisodeId, c.EpisodeStep, c.Length)
							}
							if c.RawSize != uint64(len(out.Data)) {
								t.Errorf("RawSize = %d, decoded %d bytes", c.RawSize, len(out.Data))
							}
						})
					}
				}
			}
		}
	}
}

// TestDeltaWrapsAround checks delta coding on the extreme values of every
// integer dtype, where differences overflow and must wrap.
func TestDeltaWrapsAround(t *testing.T) {
	extremes := map[string][]*Tensor{
		"int8":   {Int8s([]int64{2}, []int8{math.MinInt8, math.MaxInt8}), Int8s([]int64{2}, []int8{math.MaxInt8, math.MinInt8}), Int8s([]int64{2}, []int8{-1, 0})},
		"int16":  {Int16s([]int64{2}, []int16{math.MinInt16, math.MaxInt16}), Int16s([]int64{2}, []int16{math.MaxInt16, math.MinInt16}), Int16s([]int64{2}, []int16{-1, 0})},
		"int32":  {Int32s([]int64{2}, []int32{math.MinInt32, math.MaxInt32}), Int32s([]int64{2}, []int32{math.MaxInt32, math.MinInt32}), Int32s([]int64{2}, []int32{-1, 0})},
		"int64":  {Int64s([]int64{2}, []int64{math.MinInt64, math.MaxInt64}), Int64s([]int64{2}, []int64{math.MaxInt64, math.MinInt64}), Int64s([]int64{2}, []int64{-1, 0})},
		"uint8":  {Uint8s([]int64{2}, []uint8{0, math.MaxUint8}), Uint8s([]int64{2}, []uint8{math.MaxUint8, 0}), Uint8s([]int64{2}, []uint8{1, 1})},
		"uint16": {Uint16s([]int64{2}, []uint16{0, math.MaxUint16}), Uint16s([]int64{2}, []uint16{math.MaxUint16, 0}), Uint16s([]int64{2}, []uint16{1, 1})},
		"uint32": {Uint32s([]int64{2}, []uint32{0, math.MaxUint32}), Uint32s([]int64{2}, []uint32{math.MaxUint32, 0}), Uint32s([]int64{2}, []uint32{1, 1})},
		"uint64": {Uint64s([]int64{2}, []uint64{0, math.MaxUint64}), Uint64s([]int64{2}, []uint64{math.MaxUint64, 0}), Uint64s([]int64{2}, []uint64{1, 1})},
	}
	for _, dtype := range integerDtypes {
		steps := extremes[dtype]
		for _, codec := range allCodecs {
			t.Run(dtype+"/"+codec.String(), func(t *testing.T) {
				c, out := roundTrip(t, 1, steps, ChunkOptions{Codec: codec, Delta: true})
				if !c.DeltaEncoded {
					t.Fatal("DeltaEncoded = false")
				}
				checkBatch(t, out, steps)
			})
		}
	}
}

// TestDeltaFormat pins the stored bytes, which readers in other languages
// must undo: each step minus the previous one, wrapping, little-endian.
func TestDeltaFormat(t *testing.T) {
	steps := []*Tensor{
		Uint16s([]int64{2}, []uint16{0xffff, 5}),
		Uint16s([]int64{2}, []uint16{0x0001, 7}),
		Uint16s([]int64{2}, []uint16{0x0003, 7}),
	}
	c, err := EncodeChunk(1, steps, ChunkOptions{Codec: Uncompressed, Delta: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0xff, 0xff, 5, 0, 2, 0, 2, 0, 2, 0, 0, 0}
	if !bytes.Equal(c.Data, want) {
		t.Fatalf("delta bytes = %x, want %x", c.Data, want)
	}
}

func TestDeltaIgnoredForNonIntegers(t *testing.T) {
	for _, dtype := range []string{"bool", "float16", "bfloat16", "float32", "float64", "complex64", "complex128"} {
		rng := rand.New(rand.NewPCG(3, 4))
		steps := []*Tensor{randomTensor(rng, dtype, []int64{4}), randomTensor(rng, dtype, []int64{4})}
		c, err := EncodeChunk(1, steps, ChunkOptions{Codec: Uncompressed, Delta: true})
		if err != nil {
			t.Fatalf("%s: %v", dtype, err)
		}
		if c.DeltaEncoded {
			t.Errorf("%s: DeltaEncoded = true", dtype)
		}
		if !bytes.Equal(c.Data, append(slices.Clone(steps[0].Data), steps[1].Data...)) {
			t.Errorf("%s: data was transformed", dtype)
		}
	}
}

func TestEncodeChunkDoesNotModifySteps(t *testing.T) {
	steps := []*Tensor{Int32s([]int64{2}, []int32{1, 2}), Int32s([]int64{2}, []int32{5, 9})}
	before := slices.Clone(steps[1].Data)
	c, err := EncodeChunk(1, steps, ChunkOptions{Codec: Uncompressed, Delta: true})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(steps[1].Data, before) {
		t.Fatal("EncodeChunk modified a step")
	}
	c.Data[0] = 0xee
	if steps[0].Data[0] == 0xee {
		t.Fatal("chunk shares memory with a step")
	}
}

func TestEncodeChunkErrors(t *testing.T) {
	f := Float32s([]int64{2}, []float32{1, 2})
	big := &Tensor{Dtype: "uint8", Shape: []int64{1 << 20}, Data: make([]byte, 1<<20)}
	tests := []struct {
		name  string
		steps []*Tensor
		opts  ChunkOptions
		want  error
		text  string
	}{
		{"no steps", nil, ChunkOptions{}, ErrInvalidChunk, "no steps"},
		{"nil step", []*Tensor{f, nil}, ChunkOptions{}, ErrInvalidTensor, "step 1"},
		{"bad step data", []*Tensor{f, {Dtype: "float32", Shape: []int64{2}, Data: make([]byte, 7)}}, ChunkOptions{}, ErrInvalidTensor, "step 1: data has 7 bytes"},
		{"dtype differs", []*Tensor{f, f, Int32s([]int64{2}, []int32{1, 2})}, ChunkOptions{}, ErrMismatch, "step 2 has dtype int32, step 0 has float32"},
		{"shape differs", []*Tensor{f, Float32s([]int64{1, 2}, []float32{1, 2})}, ChunkOptions{}, ErrMismatch, "step 1 has shape [1 2], step 0 has [2]"},
		{"unknown codec", []*Tensor{f}, ChunkOptions{Codec: 9}, ErrInvalidChunk, "unknown codec Codec(9)"},
		{"too large", slices.Repeat([]*Tensor{big}, MaxChunkRawSize>>20+1), ChunkOptions{}, ErrInvalidChunk, "exceed MaxChunkRawSize"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := EncodeChunk(5, tt.steps, tt.opts)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("err = %v, want %v containing %q", err, tt.want, tt.text)
			}
		})
	}
}

func validChunk(t *testing.T, codec Codec) *Chunk {
	t.Helper()
	steps := []*Tensor{
		Int32s([]int64{2, 2}, []int32{1, 2, 3, 4}),
		Int32s([]int64{2, 2}, []int32{5, 6, 7, 8}),
		Int32s([]int64{2, 2}, []int32{5, 6, 7, 9}),
	}
	c, err := EncodeChunk(77, steps, ChunkOptions{Codec: codec, Delta: true})
	if err != nil {
		t.Fatal(err)
	}
	if c.Compression != codec.proto() {
		t.Fatalf("chunk compressed with %v, want %v", c.Compression, codec.proto())
	}
	return c
}

func TestDecodeChunkRejectsHostileInput(t *testing.T) {
	tests := []struct {
		name   string
		codec  Codec
		mutate func(c *Chunk)
		text   string
	}{
		{"unknown dtype", Zstd, func(c *Chunk) { c.Dtype = "float128" }, `unknown dtype "float128"`},
		{"zero length", Zstd, func(c *Chunk) { c.Length = 0 }, "length 0"},
		{"negative length", Zstd, func(c *Chunk) { c.Length = -3 }, "length -3"},
		{"negative dimension", Zstd, func(c *Chunk) { c.StepShape = []int64{2, -2} }, "dimension 1 is -2"},
		{"overflowing shape", Zstd, func(c *Chunk) { c.StepShape = []int64{1 << 40, 1 << 40} }, "step_shape"},
		{"steps exceed limit", S2, func(c *Chunk) { c.StepShape = []int64{1 << 20}; c.Length = 1 << 10 }, "exceed MaxChunkRawSize"},
		{"wrong raw size", Zstd, func(c *Chunk) { c.RawSize++ }, "raw_size is 49"},
		{"huge raw size", Zstd, func(c *Chunk) { c.RawSize = 1 << 62 }, "raw_size"},
		{"bad compression", Zstd, func(c *Chunk) { c.Compression = 7 }, "unknown compression 7"},
		{"delta on floats", Uncompressed, func(c *Chunk) { c.Dtype = "float32" }, "delta_encoded"},
		{"truncated zstd", Zstd, func(c *Chunk) { c.Data = c.Data[:len(c.Data)-4] }, "zstd"},
		{"truncated s2", S2, func(c *Chunk) { c.Data = c.Data[:len(c.Data)-2] }, "s2"},
		{"truncated raw", Uncompressed, func(c *Chunk) { c.Data = c.Data[:len(c.Data)-1] }, "uncompressed data has 47 bytes"},
		{"garbage zstd", Zstd, func(c *Chunk) { c.Data = []byte("this is not zstd at all, not even close") }, "zstd"},
		{"garbage s2", S2, func(c *Chunk) { c.Data = []byte{48, 0xff, 0xff, 0xff, 0xff, 0xff} }, "s2"},
		{"s2 claims other size", S2, func(c *Chunk) { c.Data[0]++ }, "s2 data decodes to 49 bytes"},
		{"codec mislabeled", S2, func(c *Chunk) { c.Compression = Compression_COMPRESSION_ZSTD }, "zstd"},
		{"data for empty chunk", Uncompressed, func(c *Chunk) { c.StepShape = []int64{0}; c.RawSize = 0 }, "raw_size is 0 but data has 48 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validChunk(t, tt.codec)
			tt.mutate(c)
			out, err := DecodeChunk(c)
			if !errors.Is(err, ErrInvalidChunk) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("DecodeChunk = %v, %v; want ErrInvalidChunk containing %q", out, err, tt.text)
			}
			if !strings.Contains(err.Error(), "chunk 77") {
				t.Errorf("error %q does not name the chunk", err)
			}
		})
	}
	if _, err := DecodeChunk(nil); !errors.Is(err, ErrInvalidChunk) {
		t.Errorf("DecodeChunk(nil) = %v", err)
	}
}

// TestDecodeChunkBoundsMemory sends small chunks that claim a large raw
// size and checks that the decoder does not allocate it.
func TestDecodeChunkBoundsMemory(t *testing.T) {
	claim := func(codec Compression, data []byte) *Chunk {
		return &Chunk{Key: 1, Dtype: "uint8", StepShape: []int64{MaxChunkRawSize}, Length: 1,
			Compression: codec, RawSize: MaxChunkRawSize, Data: data}
	}
	for _, c := range []*Chunk{
		claim(Compression_COMPRESSION_ZSTD, []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0}),
		claim(Compression_COMPRESSION_S2, []byte{1, 2, 3}),
		claim(Compression_COMPRESSION_NONE, []byte{1, 2, 3}),
	} {
		var err error
		if n := allocatedBytes(func() { _, err = DecodeChunk(c) }); n > 1<<20 {
			t.Errorf("%v: allocated %d bytes", c.Compression, n)
		}
		if !errors.Is(err, ErrInvalidChunk) {
			t.Errorf("%v: err = %v", c.Compression, err)
		}
	}
}

func allocatedBytes(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestDecodeChunkDoesNotAliasInput(t *testing.T) {
	c := validChunk(t, Uncompressed)
	c.DeltaEncoded = false
	before := slices.Clone(c.Data)
	out, err := DecodeChunk(c)
	if err != nil {
		t.Fatal(err)
	}
	out.Data[0]++
	if !bytes.Equal(c.Data, before) {
		t.Fatal("decoded tensor shares memory with the chunk")
	}
}

func TestValidateTensor(t *testing.T) {
	tests := []struct {
		name string
		t    *Tensor
		text string
	}{
		{"nil", nil, "nil"},
		{"unknown dtype", &Tensor{Dtype: "float8"}, `unknown dtype "float8"`},
		{"empty dtype", &Tensor{Dtype: ""}, `unknown dtype ""`},
		{"negative dim", &Tensor{Dtype: "int8", Shape: []int64{3, -1}}, "dimension 1 is -1"},
		{"overflow", &Tensor{Dtype: "int64", Shape: []int64{1 << 31, 1 << 31, 1 << 2}}, "more than"},
		{"short data", &Tensor{Dtype: "int16", Shape: []int64{2, 2}, Data: make([]byte, 7)}, "data has 7 bytes, shape [2 2] of int16 needs 8"},
		{"data for empty", &Tensor{Dtype: "int16", Shape: []int64{1 << 62, 0}, Data: make([]byte, 2)}, "needs 0"},
	}
	for _, tt := range tests {
		err := ValidateTensor(tt.t)
		if !errors.Is(err, ErrInvalidTensor) || !strings.Contains(err.Error(), tt.text) {
			t.Errorf("%s: err = %v, want ErrInvalidTensor containing %q", tt.name, err, tt.text)
		}
	}
	for _, ok := range []*Tensor{
		{Dtype: "float64", Data: make([]byte, 8)},
		{Dtype: "complex128", Shape: []int64{2, 3}, Data: make([]byte, 96)},
		{Dtype: "bool", Shape: []int64{1 << 62, 0}},
	} {
		if err := ValidateTensor(ok); err != nil {
			t.Errorf("ValidateTensor(%v) = %v", ok, err)
		}
	}
}

func TestElemSize(t *testing.T) {
	want := map[string]int{
		"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
		"int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8,
		"complex64": 8, "complex128": 16,
	}
	for _, dtype := range allDtypes {
		got, err := ElemSize(dtype)
		if err != nil || got != want[dtype] {
			t.Errorf("ElemSize(%q) = %d, %v; want %d", dtype, got, err, want[dtype])
		}
	}
	if _, err := ElemSize("object"); !errors.Is(err, ErrInvalidTensor) {
		t.Errorf("ElemSize(object) err = %v", err)
	}
}

func TestGatherColumn(t *testing.T) {
	seq := func(from, n int32) []int32 {
		v := make([]int32, 2*n)
		for i := range v {
			v[i] = from*2 + int32(i)
		}
		return v
	}
	chunks := map[uint64]*Tensor{
		10: Int32s([]int64{5, 2}, seq(0, 5)),
		11: Int32s([]int64{5, 2}, seq(5, 5)),
		12: Float32s([]int64{2, 2}, []float32{1, 2, 3, 4}),
		13: Int32s([]int64{3, 3}, make([]int32, 9)),
	}
	lookup := func(key uint64) (*Tensor, bool) { t, ok := chunks[key]; return t, ok }

	got, err := GatherColumn(&TrajectoryColumn{Name: "obs", Slices: []*ColumnSlice{
		{ChunkKey: 10, Offset: 3, Length: 2}, {ChunkKey: 11, Offset: 0, Length: 3},
	}}, lookup)
	if err != nil {
		t.Fatal(err)
	}
	v, err := got.AsInt32s()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Shape, []int64{5, 2}) || !slices.Equal(v, seq(3, 5)) {
		t.Fatalf("gathered %v %v, want [5 2] %v", got.Shape, v, seq(3, 5))
	}
	v[0] = -1
	if chunks[10].Data[6*4] == 0xff {
		t.Fatal("gathered column shares memory with a chunk")
	}

	squeezed, err := GatherColumn(&TrajectoryColumn{Name: "action", Squeeze: true, Slices: []*ColumnSlice{
		{ChunkKey: 11, Offset: 4, Length: 1},
	}}, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := squeezed.AsInt32s(); !slices.Equal(squeezed.Shape, []int64{2}) || !slices.Equal(v, seq(9, 1)) {
		t.Fatalf("squeezed %v %v, want [2] %v", squeezed.Shape, v, seq(9, 1))
	}

	scalar, err := GatherColumn(&TrajectoryColumn{Name: "reward", Squeeze: true, Slices: []*ColumnSlice{{ChunkKey: 20, Offset: 1, Length: 1}}},
		func(uint64) (*Tensor, bool) { return Float64s([]int64{2}, []float64{0.5, 1.5}), true })
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := scalar.AsFloat64s(); len(scalar.Shape) != 0 || !slices.Equal(v, []float64{1.5}) {
		t.Fatalf("squeezed scalar %v %v, want [] [1.5]", scalar.Shape, v)
	}
}

func TestGatherColumnErrors(t *testing.T) {
	chunks := map[uint64]*Tensor{
		10: Int32s([]int64{5, 2}, make([]int32, 10)),
		12: Float32s([]int64{2, 2}, make([]float32, 4)),
		13: Int32s([]int64{3, 3}, make([]int32, 9)),
		14: Int32s(nil, []int32{1}),
		15: {Dtype: "int32", Shape: []int64{2}},
	}
	lookup := func(key uint64) (*Tensor, bool) { t, ok := chunks[key]; return t, ok }
	col := func(squeeze bool, slices ...*ColumnSlice) *TrajectoryColumn {
		return &TrajectoryColumn{Name: "obs", Squeeze: squeeze, Slices: slices}
	}
	tests := []struct {
		name string
		col  *TrajectoryColumn
		want error
		text string
	}{
		{"nil column", nil, ErrInvalidColumn, "nil"},
		{"no slices", col(false), ErrInvalidColumn, `column "obs" has no slices`},
		{"nil slice", col(false, nil), ErrInvalidColumn, "slice 0 is nil"},
		{"missing chunk", col(false, &ColumnSlice{ChunkKey: 10, Length: 1}, &ColumnSlice{ChunkKey: 99, Length: 1}), ErrMissingChunk, `column "obs": slice 1: chunk 99`},
		{"past the end", col(false, &ColumnSlice{ChunkKey: 10, Offset: 4, Length: 2}), ErrInvalidColumn, "steps [4, 4+2) of chunk 10, which has 5"},
		{"negative offset", col(false, &ColumnSlice{ChunkKey: 10, Offset: -1, Length: 1}), ErrInvalidColumn, "chunk 10"},
		{"zero length", col(false, &ColumnSlice{ChunkKey: 10, Offset: 0, Length: 0}), ErrInvalidColumn, "chunk 10"},
		{"dtype differs", col(false, &ColumnSlice{ChunkKey: 10, Length: 1}, &ColumnSlice{ChunkKey: 12, Length: 1}), ErrMismatch, "chunk 12 holds float32 steps of shape [2], chunk 10 holds int32"},
		{"shape differs", col(false, &ColumnSlice{ChunkKey: 10, Length: 1}, &ColumnSlice{ChunkKey: 13, Length: 1}), ErrMismatch, "chunk 13 holds int32 steps of shape [3]"},
		{"squeeze two steps", col(true, &ColumnSlice{ChunkKey: 10, Offset: 1, Length: 2}), ErrInvalidColumn, "squeezed but its slices select 2 steps"},
		{"scalar chunk", col(false, &ColumnSlice{ChunkKey: 14, Length: 1}), ErrInvalidTensor, "chunk 14 is a scalar"},
		{"invalid chunk tensor", col(false, &ColumnSlice{ChunkKey: 15, Length: 1}), ErrInvalidTensor, "chunk 15: data has 0 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := GatherColumn(tt.col, lookup)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("GatherColumn = %v, %v; want %v containing %q", got, err, tt.want, tt.text)
			}
		})
	}
}

// TestGatherColumnFromDecodedChunks runs the reader's path end to end:
// steps → chunks → protobuf → decoded chunks → an item column spanning a
// chunk boundary.
func TestGatherColumnFromDecodedChunks(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var steps []*Tensor
	for range 8 {
		steps = append(steps, randomTensor(rng, "uint8", []int64{4, 4}))
	}
	decoded := map[uint64]*Tensor{}
	for i, key := range []uint64{100, 101} {
		_, out := roundTrip(t, key, steps[4*i:4*i+4], ChunkOptions{Delta: true})
		decoded[key] = out
	}
	col := &TrajectoryColumn{Name: "frames", Slices: []*ColumnSlice{
		{ChunkKey: 100, Offset: 2, Length: 2}, {ChunkKey: 101, Offset: 0, Length: 3},
	}}
	got, err := GatherColumn(col, func(k uint64) (*Tensor, bool) { t, ok := decoded[k]; return t, ok })
	if err != nil {
		t.Fatal(err)
	}
	checkBatch(t, got, steps[2:7])
}

func TestIncompressibleDataIsStoredRaw(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	noise := []*Tensor{randomTensor(rng, "float32", []int64{100})}
	zeros := []*Tensor{Float32s([]int64{100}, make([]float32, 100))}
	for _, codec := range []Codec{Zstd, S2} {
		c, out := roundTrip(t, 1, noise, ChunkOptions{Codec: codec})
		if c.Compression != Compression_COMPRESSION_NONE || len(c.Data) != 400 {
			t.Errorf("%v on random floats: stored %v, %d bytes; want raw 400 bytes", codec, c.Compression, len(c.Data))
		}
		checkBatch(t, out, noise)
		c, out = roundTrip(t, 1, zeros, ChunkOptions{Codec: codec})
		if c.Compression != codec.proto() || len(c.Data) >= 400 {
			t.Errorf("%v on zeros: stored %v, %d bytes; want compressed", codec, c.Compression, len(c.Data))
		}
		checkBatch(t, out, zeros)
	}
}

// TestChunksDoNotShareBuffers checks that recycled working buffers never
// end up in two chunks.
func TestChunksDoNotShareBuffers(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for _, codec := range allCodecs {
		var chunks []*Chunk
		var steps [][]*Tensor
		for i := range 20 {
			s := []*Tensor{randomTensor(rng, "uint8", []int64{64}), Uint8s([]int64{64}, make([]uint8, 64))}
			c, err := EncodeChunk(uint64(i), s, ChunkOptions{Codec: codec})
			if err != nil {
				t.Fatal(err)
			}
			chunks, steps = append(chunks, c), append(steps, s)
		}
		for i, c := range chunks {
			out, err := DecodeChunk(c)
			if err != nil {
				t.Fatal(err)
			}
			checkBatch(t, out, steps[i])
		}
	}
}

// TestEncodeChunkIntoBuffer: a chunk encoded into a dirty Buffer is the
// chunk encoded without one, in the Buffer's storage when it has room and
// in fresh storage when it has not, for every codec and for data that
// compresses and data that does not.
func TestEncodeChunkIntoBuffer(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	for _, codec := range allCodecs {
		for _, steps := range [][]*Tensor{
			{randomTensor(rng, "float32", []int64{100}), randomTensor(rng, "float32", []int64{100})},
			{Uint8s([]int64{64}, make([]uint8, 64)), Uint8s([]int64{64}, make([]uint8, 64))},
		} {
			want, err := EncodeChunk(7, steps, ChunkOptions{Codec: codec, Delta: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, room := range []int{len(want.Data) - 1, len(want.Data), 4096} {
				buf := make([]byte, room)
				for i := range buf {
					buf[i] = 0xa5
				}
				got, err := EncodeChunk(7, steps, ChunkOptions{Codec: codec, Delta: true, Buffer: buf[:rng.IntN(room+1)]})
				if err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(got, want) {
					t.Fatalf("%v, buffer of %d: encoded %v, want %v", codec, room, got, want)
				}
				inBuffer := len(got.Data) > 0 && &got.Data[0] == &buf[0]
				if inBuffer != (room >= len(want.Data)) {
					t.Errorf("%v, %d bytes into a buffer of %d: in the buffer %t", codec, len(want.Data), room, inBuffer)
				}
			}
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	frames := atariFrames(rand.New(rand.NewPCG(17, 18)), 8)
	var wg sync.WaitGroup
	errs := make(chan error, 4*len(allCodecs))
	for _, codec := range allCodecs {
		for range 4 {
			wg.Go(func() {
				for i := range 20 {
					c, err := EncodeChunk(uint64(i), frames, ChunkOptions{Codec: codec, Delta: i%2 == 0})
					if err != nil {
						errs <- err
						return
					}
					out, err := DecodeChunk(c)
					if err != nil {
						errs <- err
						return
					}
					for j, f := range frames {
						if !bytes.Equal(out.Data[j*len(f.Data):(j+1)*len(f.Data)], f.Data) {
							errs <- fmt.Errorf("%v: frame %d differs after a concurrent round trip", codec, j)
							return
						}
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
