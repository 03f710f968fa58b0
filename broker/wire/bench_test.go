package wire

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/tables"
)

const frameSide = 84

// atariFrames returns n consecutive 84x84 grayscale frames of a
// Breakout-like game: a static playfield and brick wall, a moving ball and
// paddle, and bricks disappearing now and then, so consecutive frames
// differ in a few small regions as preprocessed Atari observations do.
func atariFrames(rng *rand.Rand, n int) []*Tensor {
	field := make([]byte, frameSide*frameSide)
	for y := range frameSide {
		for x := range frameSide {
			switch {
			case y < 8:
				field[y*frameSide+x] = 0 // score band
			case x < 4 || x >= frameSide-4 || y < 12:
				field[y*frameSide+x] = 142 // walls
			case y >= 20 && y < 32:
				field[y*frameSide+x] = byte(60 + 20*((y-20)/2)) // brick rows
			default:
				field[y*frameSide+x] = 0
			}
		}
	}
	bx, by, vx, vy := 40.0, 50.0, 1.3, -1.1
	paddle := 40
	frames := make([]*Tensor, n)
	for i := range frames {
		if rng.IntN(4) == 0 {
			// A brick is knocked out.
			bxs, bys := 4+8*rng.IntN(9), 20+2*rng.IntN(6)
			for y := bys; y < bys+2; y++ {
				for x := bxs; x < bxs+8; x++ {
					field[y*frameSide+x] = 0
				}
			}
		}
		bx, by = bx+vx, by+vy
		if bx < 5 || bx > frameSide-7 {
			vx = -vx
		}
		if by < 13 || by > frameSide-6 {
			vy = -vy
		}
		paddle = min(max(paddle+rng.IntN(5)-2, 4), frameSide-12)
		f := make([]byte, len(field))
		copy(f, field)
		for y := int(by); y < int(by)+2; y++ {
			for x := int(bx); x < int(bx)+2; x++ {
				f[y*frameSide+x] = 200
			}
		}
		for y := frameSide - 4; y < frameSide-2; y++ {
			for x := paddle; x < paddle+8; x++ {
				f[y*frameSide+x] = 200
			}
		}
		frames[i] = Uint8s([]int64{frameSide, frameSide}, f)
	}
	return frames
}

func randomFloats(rng *rand.Rand, n int) *Tensor {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return Float32s([]int64{int64(n)}, v)
}

type payload struct {
	name  string
	steps []*Tensor
	opts  ChunkOptions
}

func payloads() []payload {
	rng := rand.New(rand.NewPCG(11, 12))
	frames := atariFrames(rng, 16)
	var ps []payload
	for _, codec := range allCodecs {
		for _, delta := range []bool{false, true} {
			ps = append(ps, payload{fmt.Sprintf("frames16/%v/delta=%t", codec, delta), frames, ChunkOptions{Codec: codec, Delta: delta}})
		}
	}
	for _, n := range []int{100, 10000} {
		floats := []*Tensor{randomFloats(rng, n)}
		for _, codec := range allCodecs {
			ps = append(ps, payload{fmt.Sprintf("float32x%dB/%v", 4*n, codec), floats, ChunkOptions{Codec: codec}})
		}
	}
	return ps
}

func rawBytes(steps []*Tensor) int64 {
	return int64(len(steps) * len(steps[0].Data))
}

// BenchmarkEncodeChunk reports encode throughput of raw bytes and the
// compression ratio (raw/compressed) for each payload and codec.
func BenchmarkEncodeChunk(b *testing.B) {
	for _, p := range payloads() {
		b.Run(p.name, func(b *testing.B) {
			b.SetBytes(rawBytes(p.steps))
			b.ReportAllocs()
			var c *Chunk
			for b.Loop() {
				var err error
				if c, err = EncodeChunk(1, p.steps, p.opts); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(c.RawSize)/math.Max(1, float64(len(c.Data))), "ratio")
		})
	}
}

// BenchmarkDecodeChunk reports decode throughput of raw bytes.
func BenchmarkDecodeChunk(b *testing.B) {
	for _, p := range payloads() {
		b.Run(p.name, func(b *testing.B) {
			c, err := EncodeChunk(1, p.steps, p.opts)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(rawBytes(p.steps))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeChunk(c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkBatchBuilder encodes a producer's message of 64 one-step items
// of 400 bytes, each with its own uncompressed chunk, in the buffer of the
// message before as a producer does in steady state: the encoder's cost
// per item.
func BenchmarkBatchBuilder(b *testing.B) {
	const items = 64
	rng := rand.New(rand.NewPCG(1, 2))
	chunks := make([]*Chunk, items)
	its := make([]*Item, items)
	for i := range items {
		c, err := EncodeChunk(rng.Uint64(), []*Tensor{randomTensor(rng, "float32", []int64{100})}, ChunkOptions{Codec: Uncompressed, EpisodeID: 7, EpisodeStep: int64(i)})
		if err != nil {
			b.Fatal(err)
		}
		chunks[i] = c
		its[i] = &Item{Key: rng.Uint64(), Table: "replay", Priority: 1,
			Columns: []*TrajectoryColumn{{Name: "payload", Squeeze: true, Slices: []*ColumnSlice{{ChunkKey: c.Key, Length: 1}}}}}
	}
	bb := NewBatchBuilder("0123456789abcdef0123456789abcdef", 30_000)
	var last []byte
	b.ReportAllocs()
	for b.Loop() {
		bb.Reset(last, 30_000)
		for i := range items {
			bb.AddChunk(chunks[i])
			bb.AddItem(its[i])
		}
		last = bb.Finish(1, nil, false, 1, 256, "")
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*items), "ns/item")
}

// BenchmarkDecodeSampleResponse decodes a learner's reply of 256 one-step
// items of 400 bytes, each with its own uncompressed chunk: the suite's
// sample workload of small items, whose cost is per item. The reply comes
// in the compact layout and in the uniform one, which the service sends
// such items in.
//
//	go test -run - -bench DecodeSampleResponse -benchmem ./broker/wire
func BenchmarkDecodeSampleResponse(b *testing.B) {
	const items = 256
	var samples []tables.Sample
	for i := range items {
		c, err := EncodeChunk(uint64(i)+1, []*Tensor{Float32s([]int64{100}, make([]float32, 100))}, ChunkOptions{Codec: Uncompressed})
		if err != nil {
			b.Fatal(err)
		}
		data, err := proto.Marshal(c)
		if err != nil {
			b.Fatal(err)
		}
		samples = append(samples, tables.Sample{
			Info:   tables.SampleInfo{Key: uint64(i) + 1, Probability: 1e-5, TableSize: 100_000, Priority: 1, TimesSampled: 3, InsertedAt: time.Unix(1, 0)},
			Chunks: []*tables.Chunk{{Key: c.Key, Length: 1, Data: data}},
			Layout: tables.Layout{{Name: "payload", Squeeze: true, Slices: []tables.LayoutSlice{{Chunk: 0, Length: 1}}}},
		})
	}
	for _, layout := range []PackedLayout{PackedLayout_PACKED_LAYOUT_COMPACT, PackedLayout_PACKED_LAYOUT_UNIFORM} {
		reply := packLayout(b, layout, Code_CODE_OK, "", samples, TableState{Size: 100_000})
		b.Run(layout.String(), func(b *testing.B) {
			b.SetBytes(int64(len(reply)))
			b.ReportAllocs()
			for b.Loop() {
				// The decoded reply owns its bytes: each learner's reply is new.
				if _, err := DecodeSampleResponse(bytes.Clone(reply)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*items), "ns/item")
			b.ReportMetric(float64(len(reply)), "bytes/reply")
		})
	}
}

// BenchmarkDecodeBatchResponse is BenchmarkDecodeSampleResponse's reply
// stacked into a batch.
func BenchmarkDecodeBatchResponse(b *testing.B) {
	const items = 256
	samples := benchSamples(b, items)
	reply := packLayout(b, PackedLayout_PACKED_LAYOUT_UNIFORM, Code_CODE_OK, "", samples, TableState{Size: 100_000})
	b.SetBytes(int64(len(reply)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeBatchResponse(bytes.Clone(reply)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*items), "ns/item")
}

// BenchmarkAppendPackedSampleResponse packs replies of 256 one-step items
// of 400 B drawn from 10,000 stored chunks with their store's formats, as
// the table service packs a learner's batch.
//
//	go test -run - -bench AppendPacked ./broker/wire
//
// With steps=header, the formats do not say where the steps lie (as for a
// chunk stored compressed), and the packer reads each chunk's header.
func BenchmarkAppendPackedSampleResponse(b *testing.B) {
	const items, stored = 256, 10_000
	located := benchSamples(b, stored)
	inHeader := make([]tables.Sample, stored)
	unlocated := map[*tables.Format]*tables.Format{}
	for i, s := range located {
		f := s.Chunks[0].Format
		if unlocated[f] == nil {
			g := *f
			g.DataAt = 0
			unlocated[f] = &g
		}
		ch := *s.Chunks[0]
		ch.Format = unlocated[f]
		s.Chunks = []*tables.Chunk{&ch}
		inHeader[i] = s
	}
	for _, bc := range []struct {
		name string
		all  []tables.Sample
	}{{"steps=located", located}, {"steps=header", inHeader}} {
		b.Run(bc.name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(5, 6))
			batches := make([][]tables.Sample, 64)
			for i := range batches {
				for range items {
					batches[i] = append(batches[i], bc.all[rng.IntN(stored)])
				}
			}
			var buf []byte
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				var err error
				if buf, err = AppendPackedSampleResponse(buf[:0], PackedLayout_PACKED_LAYOUT_UNIFORM, Code_CODE_OK, "", batches[i%len(batches)], TableState{Size: stored}); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*items), "ns/item")
		})
	}
}

// benchSamples is n one-step items of 400 B of float32s, each in an
// uncompressed chunk of its own as a producer makes them (random keys and
// episode ids), with the format its store would give it.
func benchSamples(b *testing.B, n int) []tables.Sample {
	formats := map[int32]*tables.Format{}
	rng := rand.New(rand.NewPCG(7, 8))
	out := make([]tables.Sample, n)
	for i := range out {
		v := make([]float32, 100)
		for j := range v {
			v[j] = rng.Float32()
		}
		c, err := EncodeChunk(rng.Uint64()|1, []*Tensor{Float32s([]int64{100}, v)}, ChunkOptions{Codec: Uncompressed, EpisodeID: rng.Uint64(), EpisodeStep: int64(i)})
		if err != nil {
			b.Fatal(err)
		}
		data, err := proto.Marshal(c)
		if err != nil {
			b.Fatal(err)
		}
		at := int32(bytes.Index(data, c.Data))
		format := formats[at]
		if format == nil {
			format = &tables.Format{DType: "float32", Shape: []int64{100}, StepBytes: 400, DataAt: at}
			formats[at] = format
		}
		out[i] = tables.Sample{
			Info:   tables.SampleInfo{Key: uint64(i) + 1, Probability: 1e-4, TableSize: int64(n), Priority: 1, TimesSampled: 3, InsertedAt: time.Unix(1, 0)},
			Chunks: []*tables.Chunk{{Key: c.Key, Format: format, Length: 1, Data: data}},
			Layout: tables.Layout{{Name: "payload", Squeeze: true, Slices: []tables.LayoutSlice{{Chunk: 0, Length: 1}}}},
		}
	}
	return out
}
