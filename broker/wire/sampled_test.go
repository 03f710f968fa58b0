package wire

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/tables"
)

// sampledFixture is a batch of samples over real encoded chunks (every
// codec, delta-encoded integers, several step shapes), with items that
// share chunks, repeat, select parts of chunks and squeeze.
func sampledFixture(t testing.TB, rng *rand.Rand) []tables.Sample {
	t.Helper()
	type kind struct {
		dtype string
		shape []int64
	}
	kinds := []kind{{"float32", []int64{3}}, {"uint8", []int64{2, 2}}, {"int64", nil}}
	byKind := map[int][]*tables.Chunk{}
	for i := range 9 {
		k := i % len(kinds)
		steps := make([]*Tensor, 1+rng.IntN(4))
		for s := range steps {
			steps[s] = randomTensor(rng, kinds[k].dtype, kinds[k].shape)
		}
		c, err := EncodeChunk(uint64(100+i), steps, ChunkOptions{Codec: allCodecs[i%len(allCodecs)], Delta: kinds[k].dtype != "float32" && i%2 == 0})
		if err != nil {
			t.Fatal(err)
		}
		data, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		ch := &tables.Chunk{Key: c.Key, Length: c.Length, Data: data}
		byKind[k] = append(byKind[k], ch)
	}
	var samples []tables.Sample
	for i := range 1 + rng.IntN(12) {
		if i > 0 && rng.IntN(4) == 0 {
			samples = append(samples, samples[rng.IntN(len(samples))]) // sampled twice
			continue
		}
		smp := tables.Sample{Info: tables.SampleInfo{Key: rng.Uint64(), Probability: rng.Float64(), TableSize: int64(rng.IntN(100)),
			Priority: rng.Float64(), TimesSampled: int32(rng.IntN(5)), InsertedAt: time.Unix(0, rng.Int64()), RateLimited: rng.IntN(2) == 0}}
		var traj []tables.Column
		for k := range kinds {
			col := tables.Column{Name: []string{"obs", "frame", "step"}[k]}
			for range 1 + rng.IntN(3) {
				ch := byKind[k][rng.IntN(len(byKind[k]))]
				off := rng.Int32N(ch.Length)
				col.Slices = append(col.Slices, tables.Slice{Chunk: ch.Key, Offset: off, Length: 1 + rng.Int32N(ch.Length-off)})
				if !slices.Contains(smp.Chunks, ch) {
					smp.Chunks = append(smp.Chunks, ch)
				}
			}
			if len(col.Slices) == 1 && col.Slices[0].Length == 1 && rng.IntN(2) == 0 {
				col.Squeeze = true
			}
			traj = append(traj, col)
		}
		var err error
		if smp.Layout, err = tables.NewLayout(traj, smp.Chunks); err != nil {
			panic(err)
		}
		samples = append(samples, smp)
	}
	return samples
}

// referenceDecode decodes a response the long way: the generated code,
// DecodeChunk and GatherColumn.
func referenceDecode(b []byte) (SampleReply, error) {
	var resp SampleResponse
	if err := proto.Unmarshal(b, &resp); err != nil {
		return SampleReply{}, err
	}
	reply := SampleReply{Code: resp.GetStatus().GetCode(), Message: resp.GetStatus().GetMessage(),
		After: TableState{Size: resp.TableSize, Weight: tables.Weight{Fraction: resp.WeightFraction, Exponent: resp.WeightExponent}}}
	decoded := map[uint64]*Tensor{}
	for _, raw := range resp.Chunks {
		var c Chunk
		if err := proto.Unmarshal(raw, &c); err != nil {
			return SampleReply{}, err
		}
		d, err := DecodeChunk(&c)
		if err != nil {
			return SampleReply{}, err
		}
		decoded[c.Key] = d
	}
	var out []DecodedSample
	for _, it := range resp.Items {
		in := it.GetInfo()
		s := DecodedSample{Info: tables.SampleInfo{Key: in.GetKey(), Probability: in.GetProbability(), TableSize: in.GetTableSize(), Priority: in.GetPriority(),
			TimesSampled: in.GetTimesSampled(), InsertedAt: time.Unix(0, in.GetInsertedAtUnixNano()), RateLimited: in.GetRateLimited()}}
		for _, col := range it.Columns {
			g, err := GatherColumn(col, func(k uint64) (*Tensor, bool) { d, ok := decoded[k]; return d, ok })
			if err != nil {
				return SampleReply{}, err
			}
			s.Columns = append(s.Columns, SampledColumn{Name: col.Name, Dtype: g.Dtype, Shape: g.Shape, Data: g.Data})
		}
		out = append(out, s)
	}
	reply.Samples = out
	return reply, nil
}

func mustReferenceDecode(t testing.TB, b []byte) SampleReply {
	t.Helper()
	out, err := referenceDecode(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sameFloat compares bit for bit: a hostile reply may carry NaNs.
func sameFloat(a, b float64) bool { return math.Float64bits(a) == math.Float64bits(b) }

func sameTableState(a, b TableState) bool {
	return a.Size == b.Size && sameFloat(a.Weight.Fraction, b.Weight.Fraction) && a.Weight.Exponent == b.Weight.Exponent
}

func equalSamples(a, b []DecodedSample) bool {
	return slices.EqualFunc(a, b, func(x, y DecodedSample) bool {
		same := sameFloat
		return x.Info.Key == y.Info.Key && same(x.Info.Probability, y.Info.Probability) && x.Info.TableSize == y.Info.TableSize &&
			same(x.Info.Priority, y.Info.Priority) && x.Info.TimesSampled == y.Info.TimesSampled && x.Info.InsertedAt.Equal(y.Info.InsertedAt) &&
			x.Info.RateLimited == y.Info.RateLimited &&
			slices.EqualFunc(x.Columns, y.Columns, func(p, q SampledColumn) bool {
				return p.Name == q.Name && p.Dtype == q.Dtype && slices.Equal(p.Shape, q.Shape) && bytes.Equal(p.Data, q.Data)
			})
	})
}

// TestDecodeSampleResponse: the one-pass decoder of packed responses and
// the long way through unpacked ones agree on random samples over every
// codec.
func TestDecodeSampleResponse(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for trial := range 300 {
		samples := sampledFixture(t, rng)
		code, msg := []Code{Code_CODE_OK, Code_CODE_PARTIAL}[trial%2], []string{"", "partial"}[trial%2]
		after := randomTableState(rng)
		want := mustReferenceDecode(t, AppendSampleResponse(nil, code, msg, samples, after))
		got, err := DecodeSampleResponse(pack(t, code, msg, samples, after))
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if got.Code != code || got.Message != msg || got.After != after || want.After != after {
			t.Fatalf("trial %d: status %v %q, table %+v; want %v %q, %+v", trial, got.Code, got.Message, got.After, code, msg, after)
		}
		if !equalSamples(got.Samples, want.Samples) {
			t.Fatalf("trial %d: decoded\n%v\nwant\n%v", trial, got.Samples, want.Samples)
		}
	}
}

// TestDecodeSamples: a caller's own types of item and column get what
// DecodeSampleResponse gives, each column built once and each item of its
// own columns, in order.
func TestDecodeSamples(t *testing.T) {
	type column struct {
		name string
		data []byte
	}
	type item struct {
		key     uint64
		columns []column
	}
	rng := rand.New(rand.NewPCG(13, 14))
	for trial := range 100 {
		samples := sampledFixture(t, rng)
		after := randomTableState(rng)
		b := pack(t, Code_CODE_PARTIAL, "partial", samples, after)
		want, err := DecodeSampleResponse(bytes.Clone(b))
		if err != nil {
			t.Fatal(err)
		}
		var columns, items int
		got, err := DecodeSamples(b, func(c SampledColumn) column { columns++; return column{c.Name, c.Data} },
			func(info tables.SampleInfo, cols []column) item { items++; return item{info.Key, cols} })
		if err != nil {
			t.Fatal(err)
		}
		if got.Code != want.Code || got.Message != want.Message || got.After != want.After || len(got.Samples) != len(want.Samples) || items != len(want.Samples) {
			t.Fatalf("trial %d: %v %q %+v, %d items (%d built); want %v %q %+v, %d", trial, got.Code, got.Message, got.After, len(got.Samples), items,
				want.Code, want.Message, want.After, len(want.Samples))
		}
		wantColumns := 0
		for i, w := range want.Samples {
			g := got.Samples[i]
			wantColumns += len(w.Columns)
			if g.key != w.Info.Key || len(g.columns) != len(w.Columns) {
				t.Fatalf("trial %d item %d: key %d with %d columns, want %d with %d", trial, i, g.key, len(g.columns), w.Info.Key, len(w.Columns))
			}
			for j, c := range w.Columns {
				if g.columns[j].name != c.Name || !bytes.Equal(g.columns[j].data, c.Data) {
					t.Fatalf("trial %d item %d column %d: %q, want %q", trial, i, j, g.columns[j].name, c.Name)
				}
			}
		}
		if columns != wantColumns {
			t.Fatalf("trial %d: %d columns built, want %d", trial, columns, wantColumns)
		}
	}
}

// TestDecodeSampleResponseSharesNoMemory: no two columns of a response
// share a byte, even an item sampled twice or two items of one chunk, so
// writing into one sampled tensor changes no other; and the response's
// bytes back only what was moved out of them.
func TestDecodeSampleResponseSharesNoMemory(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for trial := range 200 {
		samples := sampledFixture(t, rng)
		reply, err := DecodeSampleResponse(pack(t, Code_CODE_OK, "", samples, TableState{}))
		if err != nil {
			t.Fatal(err)
		}
		got := reply.Samples
		var all [][]byte
		for _, s := range got {
			for _, c := range s.Columns {
				all = append(all, c.Data)
			}
		}
		for i, x := range all {
			for _, y := range all[i+1:] {
				if overlap(x, y) {
					t.Fatalf("trial %d: two columns share memory", trial)
				}
			}
		}
		for _, x := range all {
			for i := range x {
				x[i] ^= 0xff
			}
		}
		want := mustReferenceDecode(t, AppendSampleResponse(nil, Code_CODE_OK, "", samples, TableState{}))
		for i, s := range got {
			for j, c := range s.Columns {
				for k := range c.Data {
					if c.Data[k] != want.Samples[i].Columns[j].Data[k]^0xff {
						t.Fatalf("trial %d: item %d column %d changed by a write to another column", trial, i, j)
					}
				}
			}
		}
	}
}

func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}

// TestDecodeSampleResponseAllocations: a batch costs a fixed number of
// allocations, whatever its size, for uncompressed chunks.
func TestDecodeSampleResponseAllocations(t *testing.T) {
	response := func(n int) []byte {
		var samples []tables.Sample
		for i := range n {
			c, err := EncodeChunk(uint64(i), []*Tensor{Float32s([]int64{100}, make([]float32, 100))}, ChunkOptions{Codec: Uncompressed})
			if err != nil {
				t.Fatal(err)
			}
			data, err := proto.Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			ch := &tables.Chunk{Key: c.Key, Length: 1, Data: data}
			samples = append(samples, tables.Sample{Info: tables.SampleInfo{Key: uint64(i)}, Chunks: []*tables.Chunk{ch},
				Layout: tables.Layout{{Name: "x", Squeeze: true, Slices: []tables.LayoutSlice{{Chunk: 0, Length: 1}}}}})
		}
		return pack(t, Code_CODE_OK, "", samples, TableState{})
	}
	allocs := func(b []byte) float64 {
		return testing.AllocsPerRun(20, func() {
			if _, err := DecodeSampleResponse(b); err != nil {
				t.Fatal(err)
			}
		})
	}
	// A handful per reply: the arrays of the result, and the decoder's own
	// when its pool has none (the race detector empties pools at random).
	// An allocation per item would make 256.
	const bound = 24
	small, large := allocs(response(8)), allocs(response(256))
	if large > bound {
		t.Fatalf("%v allocations for 256 items (%v for 8), over %d: the decoder allocates per item", large, small, bound)
	}
}
