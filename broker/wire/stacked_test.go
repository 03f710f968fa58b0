package wire

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/tables"
)

// stackByHand stacks items decoded one by one: the batch DecodeBatchResponse
// should give, or an error matching ErrUnstackable where the items'
// columns differ in name, order, dtype or shape (squeezing shows in the
// shape), or ErrMalformed where an item has a column twice.
func stackByHand(samples []DecodedSample) (SampledBatch, error) {
	out := SampledBatch{Info: MakeBatchInfo(len(samples))}
	for i := range samples {
		out.Info.set(i, &samples[i].Info)
	}
	if len(samples) == 0 {
		return out, nil
	}
	first := samples[0].Columns
	for j, c := range first {
		if slices.ContainsFunc(first[:j], func(p SampledColumn) bool { return p.Name == c.Name }) {
			return SampledBatch{}, fmt.Errorf("%w: column %q twice", ErrMalformed, c.Name)
		}
	}
	for _, s := range samples {
		if len(s.Columns) != len(first) {
			return SampledBatch{}, ErrUnstackable
		}
		for j, c := range s.Columns {
			if c.Name != first[j].Name || c.Dtype != first[j].Dtype || !slices.Equal(c.Shape, first[j].Shape) {
				return SampledBatch{}, ErrUnstackable
			}
		}
	}
	for j, c := range first {
		col := SampledColumn{Name: c.Name, Dtype: c.Dtype, Shape: append([]int64{int64(len(samples))}, c.Shape...), Data: []byte{}}
		for _, s := range samples {
			col.Data = append(col.Data, s.Columns[j].Data...)
		}
		out.Columns = append(out.Columns, col)
	}
	return out, nil
}

func equalBatches(a, b SampledBatch) bool {
	x, y := a.Info, b.Info
	if !slices.Equal(x.Keys, y.Keys) || !slices.EqualFunc(x.Probabilities, y.Probabilities, sameFloat) || !slices.Equal(x.TableSizes, y.TableSizes) ||
		!slices.EqualFunc(x.Priorities, y.Priorities, sameFloat) || !slices.Equal(x.TimesSampled, y.TimesSampled) ||
		!slices.EqualFunc(x.InsertedAt, y.InsertedAt, time.Time.Equal) || !slices.Equal(x.RateLimited, y.RateLimited) {
		return false
	}
	return slices.EqualFunc(a.Columns, b.Columns, func(p, q SampledColumn) bool {
		return p.Name == q.Name && p.Dtype == q.Dtype && slices.Equal(p.Shape, q.Shape) && slices.Equal(p.Data, q.Data)
	})
}

// stackableFixture is uniformFixture's items, some of them changed so that
// the reply is no longer uniform or its chunks not plain, but the items
// still stack: chunks compressed, an item sampled twice, a column that
// takes part of a longer chunk, a column of two chunks.
func stackableFixture(t testing.TB, rng *rand.Rand) []tables.Sample {
	t.Helper()
	samples := uniformFixture(t, rng)
	switch rng.IntN(5) {
	case 0:
		samples = append(samples, samples[rng.IntN(len(samples))])
	case 1:
		for i := range samples {
			for k, ch := range samples[i].Chunks {
				var c Chunk
				if err := proto.Unmarshal(ch.Data, &c); err != nil {
					t.Fatal(err)
				}
				steps := chunkSteps(t, &c)
				enc, err := EncodeChunk(c.Key, steps, ChunkOptions{Codec: allCodecs[rng.IntN(len(allCodecs))]})
				if err != nil {
					t.Fatal(err)
				}
				samples[i].Chunks[k] = &tables.Chunk{Key: c.Key, Length: c.Length, Data: mustMarshalChunk(t, enc)}
			}
		}
	case 2, 3:
		// Column 0 of each item becomes its steps within a chunk one step
		// longer (at offset 0 or 1), or (case 3) those steps split
		// between two chunks.
		for i := range samples {
			s := &samples[i]
			var c Chunk
			if err := proto.Unmarshal(s.Chunks[s.Layout[0].Slices[0].Chunk].Data, &c); err != nil {
				t.Fatal(err)
			}
			steps := chunkSteps(t, &c)
			extra := randomTensor(rng, c.Dtype, c.StepShape)
			off := rng.IntN(2)
			var parts [][]*Tensor
			if off == 0 {
				parts = [][]*Tensor{append(slices.Clone(steps), extra)}
			} else {
				parts = [][]*Tensor{append([]*Tensor{extra}, steps...)}
			}
			if len(steps) > 1 && rng.IntN(2) == 0 {
				parts, off = [][]*Tensor{steps[:1], steps[1:]}, 0
			}
			var chunks []*tables.Chunk
			var sls []tables.Slice
			for k, p := range parts {
				key := c.Key<<8 | uint64(k+1)
				enc, err := EncodeChunk(key, p, ChunkOptions{Codec: Uncompressed})
				if err != nil {
					t.Fatal(err)
				}
				chunks = append(chunks, &tables.Chunk{Key: key, Length: int32(len(p)), Data: mustMarshalChunk(t, enc)})
				n := len(p)
				if len(parts) == 1 {
					n = len(steps)
				}
				sls = append(sls, tables.Slice{Chunk: key, Offset: int32(off), Length: int32(n)})
			}
			traj := s.Trajectory()
			traj[0].Slices = sls
			// The chunk column 0 took is taken by no other column.
			s.Chunks = append(slices.DeleteFunc(s.Chunks, func(ch *tables.Chunk) bool { return ch.Key == c.Key }), chunks...)
			var err error
			if s.Layout, err = tables.NewLayout(traj, s.Chunks); err != nil {
				t.Fatal(err)
			}
		}
	}
	return samples
}

// chunkSteps is c's steps, each a tensor of its own.
func chunkSteps(t testing.TB, c *Chunk) []*Tensor {
	t.Helper()
	all, err := DecodeChunk(c)
	if err != nil {
		t.Fatal(err)
	}
	size := len(all.Data) / int(c.Length)
	steps := make([]*Tensor, c.Length)
	for i := range steps {
		steps[i] = &Tensor{Dtype: all.Dtype, Shape: c.StepShape, Data: all.Data[i*size : (i+1)*size]}
	}
	return steps
}

// TestDecodeBatchResponse: a reply's items stacked are the items
// DecodeSampleResponse gives, stacked by hand, in the uniform and the
// compact layout, for plain uniform replies (read without records an
// item) and the others alike; so is the status and the table's state.
func TestDecodeBatchResponse(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	for trial := range 400 {
		samples := stackableFixture(t, rng)
		after := randomTableState(rng)
		for _, layout := range []PackedLayout{PackedLayout_PACKED_LAYOUT_UNIFORM, PackedLayout_PACKED_LAYOUT_COMPACT} {
			code, msg := Code_CODE_OK, ""
			if trial%7 == 0 {
				code, msg = Code_CODE_PARTIAL, "some"
			}
			b := packLayout(t, layout, code, msg, samples, after)
			items, err := DecodeSampleResponse(slices.Clone(b))
			if err != nil {
				t.Fatal(err)
			}
			want, err := stackByHand(items.Samples)
			if err != nil {
				t.Fatalf("trial %d: the fixture does not stack: %v", trial, err)
			}
			got, err := DecodeBatchResponse(b)
			if err != nil {
				t.Fatalf("trial %d, %v: %v", trial, layout, err)
			}
			if got.Code != code || got.Message != msg || !sameTableState(got.After, after) {
				t.Fatalf("trial %d: status %v %q, state %+v; want %v %q, %+v", trial, got.Code, got.Message, got.After, code, msg, after)
			}
			if !equalBatches(got.Batch, want) {
				t.Fatalf("trial %d, %v: batch\n%+v\nstacked by hand\n%+v", trial, layout, got.Batch, want)
			}
		}
	}
}

// TestDecodeBatchResponseMemory: the one column of a plain uniform reply
// whose chunks need no padding is the reply's bytes; any other column is a
// fresh array; no two columns share memory, and a write to one changes no
// other.
func TestDecodeBatchResponseMemory(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 44))
	views := 0
	for trial := range 300 {
		samples := stackableFixture(t, rng)
		b := packLayout(t, PackedLayout_PACKED_LAYOUT_UNIFORM, Code_CODE_OK, "", samples, TableState{})
		reply, err := DecodeBatchResponse(b)
		if err != nil {
			t.Fatal(err)
		}
		cols := reply.Batch.Columns
		for i, c := range cols {
			for _, d := range cols[i+1:] {
				if overlap(c.Data, d.Data) {
					t.Fatalf("trial %d: columns %q and %q share memory", trial, c.Name, d.Name)
				}
			}
			if overlap(c.Data, b) {
				views++
				if len(cols) > 1 {
					t.Fatalf("trial %d: column %q of %d is a view of the reply", trial, c.Name, len(cols))
				}
			}
		}
		want := make([][]byte, len(cols))
		for i, c := range cols {
			want[i] = slices.Clone(c.Data)
		}
		for i, c := range cols {
			for k := range c.Data {
				c.Data[k] ^= 0xff
			}
			for j, d := range cols {
				if j != i && !slices.Equal(d.Data, want[j]) {
					t.Fatalf("trial %d: a write to column %q changed column %q", trial, c.Name, d.Name)
				}
			}
			copy(c.Data, want[i])
		}
	}
	if views == 0 {
		t.Fatal("no reply's column was a view of it")
	}
}

// TestDecodeBatchResponseRefusesUnstackable: items that differ in their
// columns are refused with ErrUnstackable, naming what differs; an item
// with a column twice is malformed.
func TestDecodeBatchResponseRefusesUnstackable(t *testing.T) {
	rng := rand.New(rand.NewPCG(45, 46))
	refused := 0
	for range 300 {
		samples := sampledFixture(t, rng)
		b := pack(t, Code_CODE_OK, "", samples, TableState{})
		items, err := DecodeSampleResponse(slices.Clone(b))
		if err != nil {
			t.Fatal(err)
		}
		want, wantErr := stackByHand(items.Samples)
		got, err := DecodeBatchResponse(b)
		switch {
		case wantErr != nil && !errors.Is(err, ErrUnstackable) && !errors.Is(err, ErrMalformed):
			t.Fatalf("items that do not stack (%v) decoded as a batch: %v", wantErr, err)
		case wantErr != nil:
			refused++
		case err != nil:
			t.Fatalf("items that stack refused: %v", err)
		case !equalBatches(got.Batch, want):
			t.Fatalf("batch\n%+v\nstacked by hand\n%+v", got.Batch, want)
		}
	}
	if refused == 0 {
		t.Fatal("no fixture failed to stack")
	}
	samples := uniformFixture(t, rng)
	for len(samples) < 2 {
		samples = uniformFixture(t, rng)
	}
	for _, tc := range []struct {
		name, says string
		vary       func(s []tables.Sample)
	}{
		{"renamed", `column 0 is "other"`, func(s []tables.Sample) { s[1].Layout[0].Name = "other" }},
		{"one column fewer", "columns", func(s []tables.Sample) {
			if len(s[1].Layout) == 1 {
				s[1].Layout = append(s[1].Layout, tables.LayoutColumn{Name: "more", Slices: s[1].Layout[0].Slices})
				return
			}
			s[1].Layout = s[1].Layout[:len(s[1].Layout)-1]
		}},
		{"twice", "twice", func(s []tables.Sample) {
			for i := range s {
				s[i].Layout = append(s[i].Layout, s[i].Layout[0])
			}
		}},
	} {
		s := slices.Clone(samples)
		for i := range s {
			s[i].Layout = slices.Clone(s[i].Layout)
		}
		tc.vary(s)
		for _, layout := range []PackedLayout{PackedLayout_PACKED_LAYOUT_UNIFORM, PackedLayout_PACKED_LAYOUT_COMPACT} {
			_, err := DecodeBatchResponse(packLayout(t, layout, Code_CODE_OK, "", s, TableState{}))
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("%s, %v: %v, want an error saying %q", tc.name, layout, err, tc.says)
			}
		}
	}
}

// TestDecodeBatchResponseEmpty: a reply without items, such as an error's,
// is an empty batch with its status.
func TestDecodeBatchResponseEmpty(t *testing.T) {
	b := packLayout(t, PackedLayout_PACKED_LAYOUT_UNIFORM, Code_CODE_RATE_LIMITED, "later", nil, TableState{})
	got, err := DecodeBatchResponse(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Code != Code_CODE_RATE_LIMITED || got.Message != "later" || got.Batch.Info.Len() != 0 || len(got.Batch.Columns) != 0 {
		t.Fatalf("%+v", got)
	}
}
