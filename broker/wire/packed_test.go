package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/tables"
)

// pack is AppendPackedSampleResponse, which must not fail on stored chunks.
func pack(t testing.TB, code Code, msg string, samples []tables.Sample, after TableState) []byte {
	t.Helper()
	b, err := AppendPackedSampleResponse(nil, code, msg, samples, after)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// referencePacked decodes a packed response the long way: the generated
// code, a record at a time, DecodeChunk for each chunk and a gather per
// column.
func referencePacked(b []byte) (SampleReply, error) {
	var resp SampleResponse
	if err := proto.Unmarshal(b, &resp); err != nil {
		return SampleReply{}, err
	}
	reply := SampleReply{Code: resp.GetStatus().GetCode(), Message: resp.GetStatus().GetMessage(),
		After: TableState{Size: resp.TableSize, Weight: tables.Weight{Fraction: resp.WeightFraction, Exponent: resp.WeightExponent}}}
	p := resp.GetPacked()
	if p == nil {
		return reply, nil
	}
	le := binary.LittleEndian
	var chunks []*Tensor
	for r := p.Chunks; len(r) >= packedChunkSize; r = r[packedChunkSize:] {
		at, size, format := le.Uint64(r[8:]), le.Uint64(r[16:]), le.Uint32(r[36:])
		if format >= uint32(len(p.Formats)) || at%8 != 0 || at > uint64(len(p.Data)) || size > uint64(len(p.Data))-at || le.Uint32(r[32:]) > math.MaxInt32 {
			return SampleReply{}, errors.New("chunk record out of range")
		}
		f := p.Formats[format]
		c := &Chunk{Key: le.Uint64(r), Dtype: f.Dtype, StepShape: f.StepShape, Length: int32(le.Uint32(r[32:])), Compression: Compression(r[40]),
			DeltaEncoded: r[41] != 0, RawSize: le.Uint64(r[24:]), Data: p.Data[at : at+size]}
		d, err := DecodeChunk(c)
		if err != nil {
			return SampleReply{}, err
		}
		chunks = append(chunks, d)
	}
	cols, sls := p.Columns, p.Slices
	for r := p.Infos; len(r) >= packedInfoSize; r = r[packedInfoSize:] {
		s := DecodedSample{Info: tables.SampleInfo{Key: le.Uint64(r), Probability: math.Float64frombits(le.Uint64(r[8:])), TableSize: int64(le.Uint64(r[16:])),
			Priority: math.Float64frombits(le.Uint64(r[24:])), InsertedAt: time.Unix(0, int64(le.Uint64(r[32:]))), TimesSampled: int32(le.Uint32(r[40:])), RateLimited: r[48] != 0}}
		for range le.Uint32(r[44:]) {
			if len(cols) < packedColumnSize {
				return SampleReply{}, errors.New("too few columns")
			}
			name, n, squeeze := le.Uint32(cols), le.Uint32(cols[4:]), le.Uint32(cols[8:]) != 0
			cols = cols[packedColumnSize:]
			if name >= uint32(len(p.Names)) || n == 0 {
				return SampleReply{}, errors.New("bad column")
			}
			var col SampledColumn
			var steps int64
			for range n {
				if len(sls) < packedSliceSize {
					return SampleReply{}, errors.New("too few slices")
				}
				ci, off, ln := le.Uint32(sls), int64(le.Uint32(sls[4:])), int64(le.Uint32(sls[8:]))
				sls = sls[packedSliceSize:]
				if ci >= uint32(len(chunks)) {
					return SampleReply{}, errors.New("bad chunk")
				}
				c := chunks[ci]
				if col.Dtype == "" {
					col.Dtype, col.Shape = c.Dtype, c.Shape[1:]
				} else if col.Dtype != c.Dtype || !slices.Equal(col.Shape, c.Shape[1:]) {
					return SampleReply{}, errors.New("mismatch")
				}
				if ln < 1 || off+ln > c.Shape[0] {
					return SampleReply{}, errors.New("past the chunk")
				}
				stepBytes := int64(len(c.Data)) / c.Shape[0]
				col.Data = append(col.Data, c.Data[off*stepBytes:(off+ln)*stepBytes]...)
				steps += ln
			}
			col.Name = p.Names[name]
			if squeeze {
				if steps != 1 {
					return SampleReply{}, errors.New("squeezed")
				}
			} else {
				col.Shape = append([]int64{steps}, col.Shape...)
			}
			col.Shape = slices.Clip(col.Shape)
			s.Columns = append(s.Columns, col)
		}
		reply.Samples = append(reply.Samples, s)
	}
	if len(cols) != 0 || len(sls) != 0 || len(p.Infos)%packedInfoSize != 0 || len(p.Columns)%packedColumnSize != 0 || len(p.Slices)%packedSliceSize != 0 || len(p.Chunks)%packedChunkSize != 0 {
		return SampleReply{}, errors.New("records left over")
	}
	return reply, nil
}

// TestAppendPackedSampleResponse: the packed encoding is what the generated
// code makes of the message it decodes to, to the byte; it says what the
// unpacked one says; and its chunks' bytes lie at multiples of 8.
func TestAppendPackedSampleResponse(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for trial := range 300 {
		samples := sampledFixture(t, rng)
		if trial%10 == 0 {
			samples = nil
		}
		code, msg := []Code{Code_CODE_OK, Code_CODE_PARTIAL}[trial%2], []string{"", "partial"}[trial%2]
		after := randomTableState(rng)
		b := pack(t, code, msg, samples, after)
		var m SampleResponse
		if err := proto.Unmarshal(b, &m); err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		again, err := proto.MarshalOptions{Deterministic: true}.Marshal(&m)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(again, b) {
			t.Fatalf("trial %d: the generated code encodes what it decoded in %d bytes, not the %d it was given", trial, len(again), len(b))
		}
		for r := m.GetPacked().GetChunks(); len(r) > 0; r = r[packedChunkSize:] {
			if at := binary.LittleEndian.Uint64(r[8:]); at%packedAlign != 0 {
				t.Fatalf("trial %d: a chunk at %d", trial, at)
			}
		}
		if formatted := pack(t, code, msg, withFormats(t, samples), after); !slices.Equal(formatted, b) {
			t.Fatalf("trial %d: chunks with their store's formats pack otherwise than chunks read from their headers", trial)
		}
		got, err := referencePacked(b)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		want := mustReferenceDecode(t, AppendSampleResponse(nil, code, msg, samples, after))
		if got.Code != want.Code || got.Message != want.Message || got.After != want.After || !equalSamples(got.Samples, want.Samples) {
			t.Fatalf("trial %d: packed\n%+v\nunpacked\n%+v", trial, got, want)
		}
	}
}

// withFormats is samples with their chunks' formats set, one *Format for
// each, as a store holds them.
func withFormats(t testing.TB, samples []tables.Sample) []tables.Sample {
	formats := map[string]*tables.Format{}
	copies := map[*tables.Chunk]*tables.Chunk{}
	out := slices.Clone(samples)
	for i := range out {
		out[i].Chunks = slices.Clone(out[i].Chunks)
		for j, ch := range out[i].Chunks {
			if c, ok := copies[ch]; ok {
				out[i].Chunks[j] = c
				continue
			}
			var wc Chunk
			if err := proto.Unmarshal(ch.Data, &wc); err != nil {
				t.Fatal(err)
			}
			id := fmt.Sprint(wc.Dtype, wc.StepShape)
			if formats[id] == nil {
				formats[id] = &tables.Format{DType: wc.Dtype, Shape: wc.StepShape}
			}
			c := *ch
			c.Format = formats[id]
			copies[ch], out[i].Chunks[j] = &c, &c
		}
	}
	return out
}

// TestAppendPackedSampleResponseRefusesBadChunks: a stored chunk that does
// not decode is an error, not a reply that would mislead the learner.
func TestAppendPackedSampleResponseRefusesBadChunks(t *testing.T) {
	samples := sampledFixture(t, rand.New(rand.NewPCG(1, 2)))
	bad := *samples[0].Chunks[0]
	bad.Data = bad.Data[:len(bad.Data)-1]
	samples[0].Chunks = append([]*tables.Chunk{&bad}, samples[0].Chunks[1:]...)
	if _, err := AppendPackedSampleResponse(nil, Code_CODE_OK, "", samples, TableState{}); !errors.Is(err, ErrInvalidChunk) {
		t.Fatalf("got %v, want ErrInvalidChunk", err)
	}
}

// TestDecodePackedSampleResponseErrors: what a reader cannot trust in a
// packed reply is refused with the error that names it.
func TestDecodePackedSampleResponseErrors(t *testing.T) {
	le := binary.LittleEndian
	info := func(columns uint32) []byte {
		r := make([]byte, packedInfoSize)
		le.PutUint64(r, 7)
		le.PutUint32(r[44:], columns)
		return r
	}
	rec := func(vs ...uint32) []byte {
		var b []byte
		for _, v := range vs {
			b = le.AppendUint32(b, v)
		}
		return b
	}
	chunk := func(key, at, size, raw uint64, steps, format uint32, compression byte) []byte {
		r := make([]byte, packedChunkSize)
		le.PutUint64(r, key)
		le.PutUint64(r[8:], at)
		le.PutUint64(r[16:], size)
		le.PutUint64(r[24:], raw)
		le.PutUint32(r[32:], steps)
		le.PutUint32(r[36:], format)
		r[40] = compression
		return r
	}
	floats := &StepFormat{Dtype: "float32", StepShape: []int64{2}}
	ints := &StepFormat{Dtype: "int32", StepShape: []int64{2}}
	// Two chunks: key 1, two steps of float32[2]; key 2, one step of int32[2].
	good := func() *PackedSamples {
		return &PackedSamples{
			Infos:   info(1),
			Columns: rec(0, 1, 0),
			Names:   []string{"obs"},
			Slices:  rec(0, 0, 2),
			Chunks:  slices.Concat(chunk(1, 0, 16, 16, 2, 0, 0), chunk(2, 16, 8, 8, 1, 1, 0)),
			Formats: []*StepFormat{floats, ints},
			Data:    make([]byte, 24),
		}
	}
	encode := func(change func(p *PackedSamples)) []byte {
		p := good()
		change(p)
		b, err := proto.Marshal(&SampleResponse{Packed: p})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := DecodeSampleResponse(encode(func(*PackedSamples) {})); err != nil {
		t.Fatalf("the good reply: %v", err)
	}
	unpacked, err := proto.Marshal(&SampleResponse{Items: []*SampledItem{{Info: &SampleInfo{Key: 7}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		b    []byte
		want error
		text string
	}{
		{"truncated", encode(func(*PackedSamples) {})[:20], ErrMalformed, "sample response"},
		{"unpacked items", unpacked, ErrMalformed, "older than this client"},
		{"a partial record", encode(func(p *PackedSamples) { p.Slices = p.Slices[:11] }), ErrMalformed, "slices holds 11 bytes"},
		{"name out of range", encode(func(p *PackedSamples) { p.Columns = rec(1, 1, 0) }), ErrMalformed, "name 1 of 1"},
		{"chunk out of range", encode(func(p *PackedSamples) { p.Slices = rec(2, 0, 1) }), ErrMissingChunk, "chunk 2 of 2"},
		{"format out of range", encode(func(p *PackedSamples) { p.Formats = p.Formats[:1] }), ErrInvalidChunk, "format 1 of 1"},
		{"unknown dtype", encode(func(p *PackedSamples) { p.Formats[1] = &StepFormat{Dtype: "float128"} }), ErrInvalidChunk, "float128"},
		{"misaligned", encode(func(p *PackedSamples) {
			p.Chunks = slices.Concat(chunk(1, 4, 16, 16, 2, 0, 0), chunk(2, 16, 8, 8, 1, 1, 0))
		}), ErrInvalidChunk, "multiple of 8"},
		{"past the data", encode(func(p *PackedSamples) { p.Data = p.Data[:20] }), ErrInvalidChunk, "of 20"},
		{"wrong raw size", encode(func(p *PackedSamples) {
			p.Chunks = slices.Concat(chunk(1, 0, 16, 12, 2, 0, 0), chunk(2, 16, 8, 8, 1, 1, 0))
		}), ErrInvalidChunk, "raw_size is 12"},
		{"unknown compression", encode(func(p *PackedSamples) {
			p.Chunks = slices.Concat(chunk(1, 0, 16, 16, 2, 0, 9), chunk(2, 16, 8, 8, 1, 1, 0))
		}), ErrInvalidChunk, "compression"},
		{"past the chunk", encode(func(p *PackedSamples) { p.Slices = rec(0, 1, 2) }), ErrInvalidColumn, "which has 2"},
		{"no slices", encode(func(p *PackedSamples) { p.Columns, p.Slices = rec(0, 0, 0), nil }), ErrInvalidColumn, "no slices"},
		{"squeezed two steps", encode(func(p *PackedSamples) { p.Columns = rec(0, 1, 1) }), ErrInvalidColumn, "squeezed"},
		{"mixed dtypes", encode(func(p *PackedSamples) { p.Columns, p.Slices = rec(0, 2, 0), rec(0, 0, 1, 1, 0, 1) }), ErrMismatch, "int32"},
		{"more columns than records", encode(func(p *PackedSamples) { p.Infos = info(2) }), ErrMalformed, "2 columns, 1 records left"},
		{"more slices than records", encode(func(p *PackedSamples) { p.Columns = rec(0, 2, 0) }), ErrMalformed, "2 slices, 1 records left"},
		{"records left over", encode(func(p *PackedSamples) { p.Infos = info(0) }), ErrMalformed, "0 of 1 column records"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeSampleResponse(tt.b)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("DecodeSampleResponse = %v, %v; want %v containing %q", got, err, tt.want, tt.text)
			}
		})
	}
}
