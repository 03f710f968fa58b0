package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/tables"
)

// pack is AppendPackedSampleResponse in the compact layout, which must not
// fail on stored chunks.
func pack(t testing.TB, code Code, msg string, samples []tables.Sample, after TableState) []byte {
	t.Helper()
	return packLayout(t, PackedLayout_PACKED_LAYOUT_COMPACT, code, msg, samples, after)
}

func packLayout(t testing.TB, layout PackedLayout, code Code, msg string, samples []tables.Sample, after TableState) []byte {
	t.Helper()
	b, err := AppendPackedSampleResponse(nil, layout, code, msg, samples, after)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// refRecords are a packed reply's records in either layout, each field
// read or derived as reprise.proto says.
type refRecords struct {
	infos   []tables.SampleInfo
	ncols   []uint32
	columns []refColumn
	slices  []byte
	chunks  []refChunk
}

type refColumn struct {
	name, slices uint32
	squeeze      bool
}

type refChunk struct {
	key, at, size, raw uint64
	steps, format      uint32
	compression        Compression
	delta              bool
}

// readRecords reads a PackedSamples' records the long way, in the layout
// whose fields it holds.
func readRecords(p *PackedSamples) (refRecords, error) {
	le := binary.LittleEndian
	var r refRecords
	wide := len(p.Infos)+len(p.Columns)+len(p.Chunks) > 0
	infoSize, columnSize, chunkSize := compactInfoSize, compactColumnSize, compactChunkSize
	infos, columns, chunks := p.CompactInfos, p.CompactColumns, p.CompactChunks
	r.slices = p.Slices
	if len(p.UniformColumns) > 0 {
		// Every item has the pattern's columns, each a chunk of its own.
		if len(p.UniformColumns)%uniformColumnSize != 0 || len(columns)+len(p.Slices)+len(chunks) > 0 {
			return r, errors.New("a partial uniform record, or records beside uniform ones")
		}
		n := len(p.UniformColumns) / uniformColumnSize
		columns, chunks = nil, nil
		for i := range len(infos) / infoSize {
			for j := range n {
				u := p.UniformColumns[j*uniformColumnSize : (j+1)*uniformColumnSize]
				columns = append(columns, u[:compactColumnSize]...)
				chunks = append(chunks, u[compactColumnSize:]...)
				r.slices = le.AppendUint32(le.AppendUint32(le.AppendUint32(r.slices, uint32(i*n+j)), 0), le.Uint32(u[compactColumnSize+12:]))
			}
		}
	}
	if wide {
		infoSize, columnSize, chunkSize = packedInfoSize, packedColumnSize, packedChunkSize
		infos, columns, chunks = p.Infos, p.Columns, p.Chunks
	}
	if len(infos)%infoSize != 0 || len(columns)%columnSize != 0 || len(p.Slices)%packedSliceSize != 0 || len(chunks)%chunkSize != 0 {
		return r, errors.New("a partial record")
	}
	for b := infos; len(b) > 0; b = b[infoSize:] {
		in := tables.SampleInfo{Key: le.Uint64(b), Probability: math.Float64frombits(le.Uint64(b[8:])), TableSize: int64(le.Uint64(b[16:])),
			Priority: math.Float64frombits(le.Uint64(b[24:])), InsertedAt: time.Unix(0, int64(le.Uint64(b[32:]))), TimesSampled: int32(le.Uint32(b[40:]))}
		n := le.Uint32(b[44:])
		if wide {
			in.RateLimited = b[48] != 0
		} else {
			in.RateLimited, n = n>>31 != 0, n&(1<<31-1)
		}
		r.infos, r.ncols = append(r.infos, in), append(r.ncols, n)
	}
	for b := columns; len(b) > 0; b = b[columnSize:] {
		c := refColumn{name: le.Uint32(b), slices: le.Uint32(b[4:])}
		if wide {
			c.squeeze = le.Uint32(b[8:]) != 0
		} else {
			c.squeeze, c.slices = c.slices>>31 != 0, c.slices&(1<<31-1)
		}
		r.columns = append(r.columns, c)
	}
	var next uint64 // a compact chunk's place in data
	for b := chunks; len(b) > 0; b = b[chunkSize:] {
		c := refChunk{key: le.Uint64(b)}
		if wide {
			c.at, c.size, c.raw = le.Uint64(b[8:]), le.Uint64(b[16:]), le.Uint64(b[24:])
			c.steps, c.format, c.compression, c.delta = le.Uint32(b[32:]), le.Uint32(b[36:]), Compression(b[40]), b[41] != 0
		} else {
			c.size, c.steps, c.format, c.compression, c.delta = uint64(le.Uint32(b[8:])), le.Uint32(b[12:]), le.Uint32(b[16:]), Compression(b[20]), b[21] != 0
			c.at = (next + 7) / 8 * 8
			next = c.at + c.size
			if c.format < uint32(len(p.Formats)) {
				f := p.Formats[c.format]
				elem, err := ElemSize(f.Dtype)
				if err != nil {
					return r, err
				}
				c.raw = uint64(elem) * uint64(c.steps)
				for _, d := range f.StepShape {
					c.raw *= uint64(d)
				}
			}
		}
		r.chunks = append(r.chunks, c)
	}
	return r, nil
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
	recs, err := readRecords(p)
	if err != nil {
		return SampleReply{}, err
	}
	var chunks []*Tensor
	for _, rc := range recs.chunks {
		if rc.format >= uint32(len(p.Formats)) || rc.at%8 != 0 || rc.at > uint64(len(p.Data)) || rc.size > uint64(len(p.Data))-rc.at || rc.steps > math.MaxInt32 {
			return SampleReply{}, errors.New("chunk record out of range")
		}
		f := p.Formats[rc.format]
		c := &Chunk{Key: rc.key, Dtype: f.Dtype, StepShape: f.StepShape, Length: int32(rc.steps), Compression: rc.compression,
			DeltaEncoded: rc.delta, RawSize: rc.raw, Data: p.Data[rc.at : rc.at+rc.size]}
		d, err := DecodeChunk(c)
		if err != nil {
			return SampleReply{}, err
		}
		chunks = append(chunks, d)
	}
	cols, sls := recs.columns, recs.slices
	for i, info := range recs.infos {
		s := DecodedSample{Info: info}
		for range recs.ncols[i] {
			if len(cols) == 0 {
				return SampleReply{}, errors.New("too few columns")
			}
			rc := cols[0]
			cols = cols[1:]
			if rc.name >= uint32(len(p.Names)) || rc.slices == 0 {
				return SampleReply{}, errors.New("bad column")
			}
			var col SampledColumn
			var steps int64
			for range rc.slices {
				if len(sls) < packedSliceSize {
					return SampleReply{}, errors.New("too few slices")
				}
				le := binary.LittleEndian
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
			col.Name = p.Names[rc.name]
			if rc.squeeze {
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
	if len(cols) != 0 || len(sls) != 0 {
		return SampleReply{}, errors.New("records left over")
	}
	return reply, nil
}

// TestAppendPackedSampleResponse: in either layout, the packed encoding is
// what the generated code makes of the message it decodes to, to the byte;
// it says what the unpacked one says; its chunks' bytes lie at multiples of
// 8; and the compact layout is smaller by at least its records' savings.
func TestAppendPackedSampleResponse(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for trial := range 300 {
		samples := sampledFixture(t, rng)
		if trial%10 == 0 {
			samples = nil
		}
		code, msg := []Code{Code_CODE_OK, Code_CODE_PARTIAL}[trial%2], []string{"", "partial"}[trial%2]
		after := randomTableState(rng)
		want := mustReferenceDecode(t, AppendSampleResponse(nil, code, msg, samples, after))
		sizes := map[PackedLayout]int{}
		var compact refRecords
		for _, layout := range []PackedLayout{PackedLayout_PACKED_LAYOUT_WIDE, PackedLayout_PACKED_LAYOUT_COMPACT, PackedLayout_PACKED_LAYOUT_UNIFORM} {
			b := packLayout(t, layout, code, msg, samples, after)
			sizes[layout] = len(b)
			var m SampleResponse
			if err := proto.Unmarshal(b, &m); err != nil {
				t.Fatalf("trial %d %v: %v", trial, layout, err)
			}
			again, err := proto.MarshalOptions{Deterministic: true}.Marshal(&m)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(again, b) {
				t.Fatalf("trial %d %v: the generated code encodes what it decoded in %d bytes, not the %d it was given", trial, layout, len(again), len(b))
			}
			if p := m.GetPacked(); p != nil {
				wide := len(p.Infos) > 0 && len(p.Columns) > 0 && len(p.Chunks) > 0
				compactFields := len(p.CompactInfos) > 0 && (len(p.CompactColumns) > 0 && len(p.CompactChunks) > 0) != (len(p.UniformColumns) > 0)
				if wide == compactFields || wide != (layout == PackedLayout_PACKED_LAYOUT_WIDE) {
					t.Fatalf("trial %d %v: wide fields %v, compact fields %v", trial, layout, wide, compactFields)
				}
				if len(p.UniformColumns) > 0 && layout != PackedLayout_PACKED_LAYOUT_UNIFORM {
					t.Fatalf("trial %d %v: uniform columns", trial, layout)
				}
				recs, err := readRecords(p)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range recs.chunks {
					if c.at%packedAlign != 0 {
						t.Fatalf("trial %d %v: a chunk at %d", trial, layout, c.at)
					}
				}
				if layout == PackedLayout_PACKED_LAYOUT_COMPACT {
					compact = recs
				}
			}
			if formatted := packLayout(t, layout, code, msg, withFormats(t, samples), after); !slices.Equal(formatted, b) {
				t.Fatalf("trial %d %v: chunks with their store's formats pack otherwise than chunks read from their headers", trial, layout)
			}
			got, err := referencePacked(b)
			if err != nil {
				t.Fatalf("trial %d %v: %v", trial, layout, err)
			}
			if got.Code != want.Code || got.Message != want.Message || got.After != want.After || !equalSamples(got.Samples, want.Samples) {
				t.Fatalf("trial %d %v: packed\n%+v\nunpacked\n%+v", trial, layout, got, want)
			}
		}
		saved := len(compact.infos)*(packedInfoSize-compactInfoSize) + len(compact.columns)*(packedColumnSize-compactColumnSize) +
			len(compact.chunks)*(packedChunkSize-compactChunkSize)
		if d := sizes[PackedLayout_PACKED_LAYOUT_WIDE] - sizes[PackedLayout_PACKED_LAYOUT_COMPACT]; d < saved {
			t.Fatalf("trial %d: the compact reply is %d bytes smaller, its records %d", trial, d, saved)
		}
	}
}

// uniformFixture makes samples that fit the uniform form: 1 to 12 items
// of the same 1 to 3 columns, each column one slice of all the steps of a
// chunk of its own, alike for every item but for its bytes.
func uniformFixture(t testing.TB, rng *rand.Rand) []tables.Sample {
	t.Helper()
	type column struct {
		name, dtype string
		shape       []int64
		steps       int
		squeeze     bool
		delta       bool
	}
	kinds := []column{{"obs", "float32", []int64{3}, 0, false, false}, {"frame", "uint8", []int64{2, 2}, 0, false, true}, {"step", "int64", nil, 0, false, false}}
	cols := kinds[:1+rng.IntN(len(kinds))]
	for j := range cols {
		cols[j].steps = 1 + rng.IntN(3)
		cols[j].squeeze = cols[j].steps == 1 && rng.IntN(2) == 0
	}
	var samples []tables.Sample
	key := uint64(1000)
	for range 1 + rng.IntN(12) {
		smp := tables.Sample{Info: tables.SampleInfo{Key: rng.Uint64(), Probability: rng.Float64(), TableSize: int64(rng.IntN(100)),
			Priority: rng.Float64(), TimesSampled: int32(rng.IntN(5)), InsertedAt: time.Unix(0, rng.Int64()), RateLimited: rng.IntN(2) == 0}}
		var traj []tables.Column
		for _, c := range cols {
			steps := make([]*Tensor, c.steps)
			for s := range steps {
				steps[s] = randomTensor(rng, c.dtype, c.shape)
			}
			key++
			ch, err := EncodeChunk(key, steps, ChunkOptions{Codec: Uncompressed, Delta: c.delta})
			if err != nil {
				t.Fatal(err)
			}
			data, err := proto.Marshal(ch)
			if err != nil {
				t.Fatal(err)
			}
			smp.Chunks = append(smp.Chunks, &tables.Chunk{Key: key, Length: ch.Length, Data: data})
			traj = append(traj, tables.Column{Name: c.name, Squeeze: c.squeeze, Slices: []tables.Slice{{Chunk: key, Length: int32(c.steps)}}})
		}
		var err error
		if smp.Layout, err = tables.NewLayout(traj, smp.Chunks); err != nil {
			t.Fatal(err)
		}
		samples = append(samples, smp)
	}
	return samples
}

// TestPackedLocatedSteps: a reply packed from chunks whose formats say
// where their steps lie (as the service's store gives uncompressed ones)
// is byte for byte the reply packed by reading their headers.
func TestPackedLocatedSteps(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	for range 50 {
		samples := uniformFixture(t, rng)
		located := make([]tables.Sample, len(samples))
		inHeader := make([]tables.Sample, len(samples))
		for i, s := range samples {
			located[i], inHeader[i] = s, s
			located[i].Chunks, inHeader[i].Chunks = nil, nil
			for _, ch := range s.Chunks {
				var wc Chunk
				if _, err := readChunkInto(&wc, ch.Data, nil); err != nil {
					t.Fatal(err)
				}
				f := tables.Format{DType: wc.Dtype, Shape: wc.StepShape, StepBytes: int64(wc.RawSize) / int64(wc.Length)}
				plain := *ch
				plain.Format = &f
				inHeader[i].Chunks = append(inHeader[i].Chunks, &plain)
				g := f
				g.DataAt, g.Delta = int32(cap(ch.Data)-cap(wc.Data)), wc.DeltaEncoded
				loc := *ch
				loc.Format = &g
				located[i].Chunks = append(located[i].Chunks, &loc)
			}
		}
		after := randomTableState(rng)
		for _, layout := range []PackedLayout{PackedLayout_PACKED_LAYOUT_UNIFORM, PackedLayout_PACKED_LAYOUT_COMPACT} {
			want := packLayout(t, layout, Code_CODE_OK, "", inHeader, after)
			if got := packLayout(t, layout, Code_CODE_OK, "", located, after); !bytes.Equal(got, want) {
				t.Fatalf("%v: %d bytes packed from located steps differ from the %d packed from headers", layout, len(got), len(want))
			}
		}
	}
}

// TestUniformLayout: asked for the uniform layout, a reply whose items fit
// it holds uniform columns instead of column, slice and chunk records, 44
// bytes fewer for each column of each item, and says what the unpacked
// reply says, to the reference reader and to DecodeSampleResponse, also
// when an item lists its chunks in another order than its columns take
// them, or is sampled twice. Items that miss the pattern in any way, or
// whose chunks sent once for each time they are taken would cost more than
// the records the form leaves out, get the compact records, byte for byte.
func TestUniformLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	uniformFields := func(t *testing.T, b []byte) bool {
		var m SampleResponse
		if err := proto.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		again, err := proto.MarshalOptions{Deterministic: true}.Marshal(&m)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(again, b) {
			t.Fatalf("the generated code encodes what it decoded in %d bytes, not the %d it was given", len(again), len(b))
		}
		p := m.GetPacked()
		uniform := len(p.UniformColumns) > 0
		if uniform && len(p.CompactColumns)+len(p.Slices)+len(p.CompactChunks) > 0 {
			t.Fatal("uniform columns beside column, slice or chunk records")
		}
		return uniform
	}
	check := func(t *testing.T, samples []tables.Sample, wantUniform bool) {
		t.Helper()
		after := randomTableState(rng)
		want := mustReferenceDecode(t, AppendSampleResponse(nil, Code_CODE_OK, "", samples, after))
		b := packLayout(t, PackedLayout_PACKED_LAYOUT_UNIFORM, Code_CODE_OK, "", samples, after)
		compact := packLayout(t, PackedLayout_PACKED_LAYOUT_COMPACT, Code_CODE_OK, "", samples, after)
		if got := uniformFields(t, b); got != wantUniform {
			t.Fatalf("uniform columns %v, want %v", got, wantUniform)
		}
		if !wantUniform && !slices.Equal(b, compact) {
			t.Fatal("items that miss the pattern are not packed as the compact layout packs them")
		}
		if wantUniform {
			n := len(samples[0].Layout)
			// The records left out, less the bytes of chunks sent again,
			// which may also lengthen the varint lengths of data and of
			// the packed message by a byte each.
			copies := 2
			seen := map[*tables.Chunk]bool{}
			for _, smp := range samples {
				for _, ch := range smp.Chunks {
					if seen[ch] {
						var c Chunk
						if err := proto.Unmarshal(ch.Data, &c); err != nil {
							t.Fatal(err)
						}
						copies += (len(c.Data) + 7) / 8 * 8
					}
					seen[ch] = true
				}
			}
			want := (compactColumnSize+packedSliceSize)*len(samples)*n + compactChunkSize*len(seen) - uniformColumnSize*n - copies
			if saved := len(compact) - len(b); saved < want {
				t.Fatalf("%d items of %d columns: the uniform reply is %d bytes smaller, want %d", len(samples), n, saved, want)
			}
			if formatted := packLayout(t, PackedLayout_PACKED_LAYOUT_UNIFORM, Code_CODE_OK, "", withFormats(t, samples), after); !slices.Equal(formatted, b) {
				t.Fatal("chunks with their store's formats pack otherwise than chunks read from their headers")
			}
		}
		ref, err := referencePacked(b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeSampleResponse(b)
		if err != nil {
			t.Fatal(err)
		}
		if !equalSamples(ref.Samples, want.Samples) || !equalSamples(got.Samples, want.Samples) || got.After != after {
			t.Fatalf("packed\n%+v\ndecoded\n%+v\nunpacked\n%+v", ref, got, want)
		}
	}
	// A newer layout than this service knows gets the newest it has.
	samples := uniformFixture(t, rng)
	if !slices.Equal(packLayout(t, PackedLayout(7), Code_CODE_OK, "", samples, TableState{}), packLayout(t, PackedLayout_PACKED_LAYOUT_UNIFORM, Code_CODE_OK, "", samples, TableState{})) {
		t.Fatal("layout 7 is not packed as the uniform layout")
	}
	variants := []struct {
		name string
		fits bool
		vary func(s []tables.Sample) []tables.Sample
	}{
		// An item sampled twice sends its chunks twice: small ones cost
		// less than the records left out (at most 40 bytes a column here,
		// against 44 for each column of the other items).
		{"sampled twice", true, func(s []tables.Sample) []tables.Sample {
			if len(s) < 4 {
				return nil
			}
			return append(s, s[0])
		}},
		{"an item without its last column", false, func(s []tables.Sample) []tables.Sample {
			if len(s) < 2 {
				return nil // the one item is the pattern
			}
			last := &s[len(s)-1]
			last.Layout = last.Layout[:len(last.Layout)-1]
			last.Chunks = last.Chunks[:len(last.Chunks)-1]
			return s
		}},
		{"a column named otherwise", false, func(s []tables.Sample) []tables.Sample {
			if len(s) < 2 {
				return nil
			}
			s[len(s)-1].Layout[0].Name = "other"
			return s
		}},
		{"a column squeezed otherwise", false, func(s []tables.Sample) []tables.Sample {
			if len(s) < 2 {
				return nil
			}
			l := &s[len(s)-1].Layout[0]
			if l.Squeeze {
				l.Squeeze = false
				return s
			}
			if l.Slices[0].Length != 1 {
				return nil
			}
			l.Squeeze = true
			return s
		}},
		{"part of a chunk", false, func(s []tables.Sample) []tables.Sample {
			sl := &s[len(s)-1].Layout[0].Slices[0]
			if sl.Length == 1 {
				return nil
			}
			sl.Offset, sl.Length = 1, sl.Length-1
			return s
		}},
		{"a chunk of another step shape", false, func(s []tables.Sample) []tables.Sample {
			if len(s) < 2 {
				return nil
			}
			last := &s[len(s)-1]
			var c Chunk
			if err := proto.Unmarshal(last.Chunks[0].Data, &c); err != nil {
				t.Fatal(err)
			}
			c.StepShape = append(c.StepShape, 1)
			data, err := proto.Marshal(&c)
			if err != nil {
				t.Fatal(err)
			}
			last.Chunks[0] = &tables.Chunk{Key: c.Key, Length: c.Length, Data: data}
			return s
		}},
		// The uniform form sends chunks in the order of their columns,
		// whatever the order of the item's chunks.
		{"the chunks in another order", true, func(s []tables.Sample) []tables.Sample {
			last := &s[len(s)-1]
			if len(last.Chunks) < 2 {
				return nil
			}
			last.Chunks[0], last.Chunks[1] = last.Chunks[1], last.Chunks[0]
			last.Layout[0].Slices[0].Chunk, last.Layout[1].Slices[0].Chunk = 1, 0
			return s
		}},
	}
	// Items sampled again and again: their copies cost more than the
	// records the uniform form leaves out. One item of 400 bytes ten times;
	// two of 40 bytes three times each, where the form would leave out 232
	// bytes of records if each column's chunk record counted, but only 136
	// do (a compact reply sends two chunk records, not six) against 160
	// bytes of copies.
	item := func(key uint64, floats int64) tables.Sample {
		c, err := EncodeChunk(key, []*Tensor{randomTensor(rng, "float32", []int64{floats})}, ChunkOptions{Codec: Uncompressed})
		if err != nil {
			t.Fatal(err)
		}
		stored := &tables.Chunk{Key: key, Length: 1, Data: mustMarshalChunk(t, c)}
		layout, err := tables.NewLayout([]tables.Column{{Name: "obs", Slices: []tables.Slice{{Chunk: key, Length: 1}}}}, []*tables.Chunk{stored})
		if err != nil {
			t.Fatal(err)
		}
		return tables.Sample{Info: tables.SampleInfo{Key: key}, Layout: layout, Chunks: []*tables.Chunk{stored}}
	}
	check(t, slices.Repeat([]tables.Sample{item(1, 100)}, 10), false)
	check(t, slices.Repeat([]tables.Sample{item(2, 10), item(3, 10)}, 3), false)
	for trial := range 200 {
		check(t, uniformFixture(t, rng), true)
		v := variants[trial%len(variants)]
		t.Run(v.name, func(t *testing.T) {
			if s := v.vary(uniformFixture(t, rng)); s != nil {
				check(t, s, v.fits)
			}
		})
	}
}

func mustMarshalChunk(t testing.TB, c *Chunk) []byte {
	t.Helper()
	b, err := proto.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
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
	for _, layout := range []PackedLayout{PackedLayout_PACKED_LAYOUT_WIDE, PackedLayout_PACKED_LAYOUT_COMPACT} {
		if _, err := AppendPackedSampleResponse(nil, layout, Code_CODE_OK, "", samples, TableState{}); !errors.Is(err, ErrInvalidChunk) {
			t.Fatalf("%v: got %v, want ErrInvalidChunk", layout, err)
		}
	}
}

// TestPackedStoredHeaders: a stored chunk's header is read alike with and
// without its store's Format, whatever its fields' encodings: unknown
// fields before and after the data, tags of two bytes, values of several
// (compression and raw size written long), and it is refused alike where
// it does not parse.
func TestPackedStoredHeaders(t *testing.T) {
	samples := uniformFixture(t, rand.New(rand.NewPCG(3, 4)))
	for i := range samples {
		for j, ch := range samples[i].Chunks {
			var c Chunk
			if err := proto.Unmarshal(ch.Data, &c); err != nil {
				t.Fatal(err)
			}
			var b []byte
			b = protowire.AppendTag(b, 20, protowire.VarintType) // unknown, a two-byte tag
			b = protowire.AppendVarint(b, 300)
			b = protowire.AppendTag(b, FieldChunkCompression, protowire.VarintType)
			b = append(b, 0x80, 0x80, 0x00) // 0, in three bytes
			b = protowire.AppendTag(b, FieldChunkRawSize, protowire.VarintType)
			b = protowire.AppendVarint(b, c.RawSize|1<<40) // overwritten by the last below
			b = append(b, mustMarshalChunk(t, &c)...)
			b = protowire.AppendTag(b, 17, protowire.BytesType)
			b = protowire.AppendBytes(b, []byte("after"))
			samples[i].Chunks[j] = &tables.Chunk{Key: ch.Key, Length: ch.Length, Data: b}
		}
	}
	for _, layout := range []PackedLayout{PackedLayout_PACKED_LAYOUT_COMPACT, PackedLayout_PACKED_LAYOUT_UNIFORM} {
		want := packLayout(t, layout, Code_CODE_OK, "", samples, TableState{})
		if got := packLayout(t, layout, Code_CODE_OK, "", withFormats(t, samples), TableState{}); !slices.Equal(got, want) {
			t.Fatalf("%v: chunks with formats pack otherwise than chunks read from their headers", layout)
		}
		ref, err := referencePacked(want)
		if err != nil {
			t.Fatal(err)
		}
		plain := mustReferenceDecode(t, AppendSampleResponse(nil, Code_CODE_OK, "", samples, TableState{}))
		if !equalSamples(ref.Samples, plain.Samples) {
			t.Fatalf("%v: the packed reply says otherwise than the unpacked one", layout)
		}
	}
	for _, bad := range [][]byte{{0x00, 0x01}, {0x80}, {0x08, 0x80}, {0x42, 0x05, 1, 2}} {
		s := withFormats(t, samples[:1])
		c := *s[0].Chunks[0]
		c.Data = append(slices.Clone(c.Data), bad...)
		s[0].Chunks = []*tables.Chunk{&c}
		if _, err := AppendPackedSampleResponse(nil, PackedLayout_PACKED_LAYOUT_UNIFORM, Code_CODE_OK, "", s, TableState{}); !errors.Is(err, ErrInvalidChunk) {
			t.Fatalf("a header ending in % x: %v, want ErrInvalidChunk", bad, err)
		}
	}
}

// TestDecodePackedSampleResponseErrors: what a reader cannot trust in a
// packed reply is refused with the error that names it.
func TestDecodePackedSampleResponseErrors(t *testing.T) {
	le := binary.LittleEndian
	info := func(columns uint32) []byte {
		r := make([]byte, compactInfoSize)
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
	chunk := func(key uint64, size, steps, format uint32, compression byte) []byte {
		r := make([]byte, compactChunkSize)
		le.PutUint64(r, key)
		le.PutUint32(r[8:], size)
		le.PutUint32(r[12:], steps)
		le.PutUint32(r[16:], format)
		r[20] = compression
		return r
	}
	floats := &StepFormat{Dtype: "float32", StepShape: []int64{2}}
	ints := &StepFormat{Dtype: "int32", StepShape: []int64{2}}
	// Two chunks: key 1, two steps of float32[2] at 0; key 2, one step of
	// int32[2] at 16.
	good := func() *PackedSamples {
		return &PackedSamples{
			CompactInfos:   info(1),
			CompactColumns: rec(0, 1),
			Names:          []string{"obs"},
			Slices:         rec(0, 0, 2),
			CompactChunks:  slices.Concat(chunk(1, 16, 2, 0, 0), chunk(2, 8, 1, 1, 0)),
			Formats:        []*StepFormat{floats, ints},
			Data:           make([]byte, 24),
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
	uniform := func(change func(p *PackedSamples)) []byte {
		data := make([]byte, 16)
		data[8] = 9
		p := &PackedSamples{
			CompactInfos:   slices.Concat(info(1), info(1)),
			Names:          []string{"obs"},
			Formats:        []*StepFormat{floats},
			Data:           data,
			UniformColumns: slices.Concat(rec(0, 1), chunk(0, 8, 1, 0, 0)),
		}
		change(p)
		b, err := proto.Marshal(&SampleResponse{Packed: p})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	unpacked, err := proto.Marshal(&SampleResponse{Items: []*SampledItem{{Info: &SampleInfo{Key: 7}}}})
	if err != nil {
		t.Fatal(err)
	}
	squeezed := uint32(compactFlag | 1)
	for _, tt := range []struct {
		name string
		b    []byte
		want error
		text string
	}{
		{"truncated", encode(func(*PackedSamples) {})[:20], ErrMalformed, "sample response"},
		{"unpacked items", unpacked, ErrMalformed, "older than this client"},
		{"the wide layout", encode(func(p *PackedSamples) {
			p.Infos, p.Columns, p.Chunks, p.CompactInfos, p.CompactColumns, p.CompactChunks = p.CompactInfos, p.CompactColumns, p.CompactChunks, nil, nil, nil
		}), ErrMalformed, "predates SampleRequest.layout"},
		{"a partial record", encode(func(p *PackedSamples) { p.Slices = p.Slices[:11] }), ErrMalformed, "slices holds 11 bytes"},
		{"a partial chunk record", encode(func(p *PackedSamples) { p.CompactChunks = p.CompactChunks[:30] }), ErrMalformed, "chunks holds 30 bytes"},
		{"name out of range", encode(func(p *PackedSamples) { p.CompactColumns = rec(1, 1) }), ErrMalformed, "name 1 of 1"},
		{"chunk out of range", encode(func(p *PackedSamples) { p.Slices = rec(2, 0, 1) }), ErrMissingChunk, "chunk 2 of 2"},
		{"format out of range", encode(func(p *PackedSamples) { p.Formats = p.Formats[:1] }), ErrInvalidChunk, "format 1 of 1"},
		{"unknown dtype", encode(func(p *PackedSamples) { p.Formats[1] = &StepFormat{Dtype: "float128"} }), ErrInvalidChunk, "float128"},
		{"past the data", encode(func(p *PackedSamples) { p.Data = p.Data[:20] }), ErrInvalidChunk, "[16, 16+8) lie beyond the 20 bytes"},
		{"a size past the data", encode(func(p *PackedSamples) {
			p.CompactChunks = slices.Concat(chunk(1, math.MaxUint32, 2, 0, 0), chunk(2, 8, 1, 1, 0))
		}), ErrInvalidChunk, "lie beyond the 24 bytes"},
		{"padding pushes a chunk past the data", encode(func(p *PackedSamples) {
			p.Formats = append(p.Formats, &StepFormat{Dtype: "uint8"})
			p.CompactChunks, p.Data = slices.Concat(chunk(1, 3, 3, 2, 0), chunk(2, 8, 1, 1, 0)), make([]byte, 15)
		}), ErrInvalidChunk, "[8, 8+8) lie beyond the 15 bytes"},
		{"uncompressed bytes short of the steps", encode(func(p *PackedSamples) {
			p.CompactChunks = slices.Concat(chunk(1, 12, 2, 0, 0), chunk(2, 8, 1, 1, 0))
		}), ErrInvalidChunk, "chunk 1"},
		{"unknown compression", encode(func(p *PackedSamples) {
			p.CompactChunks = slices.Concat(chunk(1, 16, 2, 0, 9), chunk(2, 8, 1, 1, 0))
		}), ErrInvalidChunk, "compression"},
		{"past the chunk", encode(func(p *PackedSamples) { p.Slices = rec(0, 1, 2) }), ErrInvalidColumn, "which has 2"},
		{"no slices", encode(func(p *PackedSamples) { p.CompactColumns, p.Slices = rec(0, 0), nil }), ErrInvalidColumn, "no slices"},
		{"no slices but the squeeze bit", encode(func(p *PackedSamples) { p.CompactColumns, p.Slices = rec(0, compactFlag), nil }), ErrInvalidColumn, "no slices"},
		{"squeezed two steps", encode(func(p *PackedSamples) { p.CompactColumns = rec(0, squeezed) }), ErrInvalidColumn, "squeezed"},
		{"mixed dtypes", encode(func(p *PackedSamples) { p.CompactColumns, p.Slices = rec(0, 2), rec(0, 0, 1, 1, 0, 1) }), ErrMismatch, "int32"},
		{"more columns than records", encode(func(p *PackedSamples) { p.CompactInfos = info(2) }), ErrMalformed, "2 columns, 1 records left"},
		{"more columns than records, rate limited", encode(func(p *PackedSamples) { p.CompactInfos = info(compactFlag | 2) }), ErrMalformed, "2 columns, 1 records left"},
		{"more slices than records", encode(func(p *PackedSamples) { p.CompactColumns = rec(0, 2) }), ErrMalformed, "2 slices, 1 records left"},
		{"records left over", encode(func(p *PackedSamples) { p.CompactInfos = info(0) }), ErrMalformed, "0 of 1 column records"},
		// Uniform: two items of one column, each a step of float32[2].
		{"the good uniform reply", uniform(func(*PackedSamples) {}), nil, ""},
		{"uniform columns beside column records", uniform(func(p *PackedSamples) { p.CompactColumns = rec(0, 1) }), ErrMalformed, "uniform columns beside"},
		{"uniform columns beside slice records", uniform(func(p *PackedSamples) { p.Slices = rec(0, 0, 1) }), ErrMalformed, "uniform columns beside"},
		{"a partial uniform record", uniform(func(p *PackedSamples) { p.UniformColumns = p.UniformColumns[:31] }), ErrMalformed, "uniform columns holds 31 bytes"},
		{"a uniform column of two slices", uniform(func(p *PackedSamples) { copy(p.UniformColumns, rec(0, 2)) }), ErrMalformed, "uniform column 0 has 2 slices"},
		{"more uniform chunks than data holds", uniform(func(p *PackedSamples) { p.CompactInfos = slices.Concat(info(1), info(1), info(1), info(1)) }), ErrMalformed, "4 items of 1 uniform columns"},
		{"a uniform chunk past the data", uniform(func(p *PackedSamples) { p.Data = p.Data[:12] }), ErrInvalidChunk, "[8, 8+8) lie beyond the 12 bytes"},
		{"an item of more columns than the pattern", uniform(func(p *PackedSamples) { p.CompactInfos = slices.Concat(info(2), info(1)) }), ErrMalformed, "1 columns, 0 records left"},
		{"a uniform format out of range", uniform(func(p *PackedSamples) { p.Formats = nil }), ErrInvalidChunk, "format 0 of 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeSampleResponse(tt.b)
			if tt.want == nil {
				if err != nil || len(got.Samples) != 2 || got.Samples[1].Columns[0].Data[0] != 9 {
					t.Fatalf("DecodeSampleResponse = %+v, %v; want two items, the second's data from byte 8", got, err)
				}
				return
			}
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("DecodeSampleResponse = %v, %v; want %v containing %q", got, err, tt.want, tt.text)
			}
		})
	}
}

// TestDecodeCompactFlags: the flags in the compact records' top bits come
// out as the sample's rate limiting and the column's squeeze, and leave
// the counts beside them whole.
func TestDecodeCompactFlags(t *testing.T) {
	le := binary.LittleEndian
	infos := make([]byte, 2*compactInfoSize)
	le.PutUint64(infos, 1)
	le.PutUint32(infos[44:], compactFlag|2)
	le.PutUint64(infos[compactInfoSize:], 2)
	le.PutUint32(infos[compactInfoSize+44:], 1)
	var columns, sls []byte
	for _, c := range [][2]uint32{{0, compactFlag | 1}, {1, 2}, {1, 1}} {
		columns = le.AppendUint32(le.AppendUint32(columns, c[0]), c[1])
	}
	for _, s := range [][3]uint32{{0, 1, 1}, {1, 0, 1}, {0, 0, 2}, {1, 0, 1}} {
		sls = le.AppendUint32(le.AppendUint32(le.AppendUint32(sls, s[0]), s[1]), s[2])
	}
	// Chunk 0: three steps of one byte, so chunk 1 starts at 8, not 3.
	chunks := make([]byte, 2*compactChunkSize)
	le.PutUint64(chunks, 10)
	le.PutUint32(chunks[8:], 3)
	le.PutUint32(chunks[12:], 3)
	le.PutUint64(chunks[compactChunkSize:], 11)
	le.PutUint32(chunks[compactChunkSize+8:], 1)
	le.PutUint32(chunks[compactChunkSize+12:], 1)
	data := []byte{'a', 'b', 'c', 0, 0, 0, 0, 0, 'z'}
	b, err := proto.Marshal(&SampleResponse{Packed: &PackedSamples{CompactInfos: infos, CompactColumns: columns, Names: []string{"r", "x"}, Slices: sls,
		CompactChunks: chunks, Formats: []*StepFormat{{Dtype: "uint8"}}, Data: data}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSampleResponse(b)
	if err != nil {
		t.Fatal(err)
	}
	want := []DecodedSample{
		{Info: tables.SampleInfo{Key: 1, RateLimited: true, InsertedAt: time.Unix(0, 0)}, Columns: []SampledColumn{
			{Name: "r", Dtype: "uint8", Shape: []int64{}, Data: []byte("b")},
			{Name: "x", Dtype: "uint8", Shape: []int64{3}, Data: []byte("zab")},
		}},
		{Info: tables.SampleInfo{Key: 2, InsertedAt: time.Unix(0, 0)}, Columns: []SampledColumn{
			{Name: "x", Dtype: "uint8", Shape: []int64{1}, Data: []byte("z")},
		}},
	}
	if !equalSamples(got.Samples, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got.Samples, want)
	}
}

// TestSampleReplyWithinItsBound: a sample reply, in every layout, takes
// no more than its chunks' bytes, what an empty reply takes, and
// SampleItemBytes and SamplePartBytes for each item and each of its parts,
// counted as tables.Table.LargestItemParts counts them.
func TestSampleReplyWithinItsBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	for trial := range 300 {
		samples := sampledFixture(t, rng)
		if trial%2 == 0 {
			samples = uniformFixture(t, rng)
		}
		after := randomTableState(rng)
		bound := 0
		seen := map[uint64]bool{}
		for i := range samples {
			smp := &samples[i]
			parts := len(smp.Layout) + len(smp.Chunks)
			for _, c := range smp.Layout {
				parts += len(c.Slices) + len(c.Name)
			}
			bound += SampleItemBytes + SamplePartBytes*parts
			for _, ch := range smp.Chunks {
				if !seen[ch.Key] {
					seen[ch.Key] = true
					bound += len(ch.Data)
				}
			}
		}
		replies := map[string][2][]byte{
			"unpacked": {AppendSampleResponse(nil, Code_CODE_PARTIAL, "partial", samples, after), AppendSampleResponse(nil, Code_CODE_PARTIAL, "partial", nil, after)},
		}
		for _, layout := range []PackedLayout{PackedLayout_PACKED_LAYOUT_WIDE, PackedLayout_PACKED_LAYOUT_COMPACT, PackedLayout_PACKED_LAYOUT_UNIFORM} {
			replies[layout.String()] = [2][]byte{packLayout(t, layout, Code_CODE_PARTIAL, "partial", samples, after), packLayout(t, layout, Code_CODE_PARTIAL, "partial", nil, after)}
		}
		for name, r := range replies {
			if len(r[0]) > len(r[1])+bound {
				t.Fatalf("trial %d %s: a reply of %d items takes %d bytes, over the bound of %d", trial, name, len(samples), len(r[0]), len(r[1])+bound)
			}
		}
	}
}
