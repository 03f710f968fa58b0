package wire

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/tables"
)

// referenceSampleResponse builds the response with the generated code.
func referenceSampleResponse(code Code, msg string, samples []tables.Sample, after TableState) *SampleResponse {
	resp := &SampleResponse{Status: &Status{Code: code, Message: msg},
		TableSize: after.Size, WeightFraction: after.Weight.Fraction, WeightExponent: after.Weight.Exponent}
	seen := map[uint64]bool{}
	for _, smp := range samples {
		in := smp.Info
		resp.Items = append(resp.Items, &SampledItem{
			Info: &SampleInfo{Key: in.Key, Probability: in.Probability, TableSize: in.TableSize, Priority: in.Priority,
				TimesSampled: in.TimesSampled, InsertedAtUnixNano: in.InsertedAt.UnixNano(), RateLimited: in.RateLimited},
			Columns: FromTableColumns(smp.Trajectory()),
		})
		for _, ch := range smp.Chunks {
			if !seen[ch.Key] {
				seen[ch.Key] = true
				resp.Chunks = append(resp.Chunks, ch.Data)
			}
		}
	}
	return resp
}

// randomLayout is a layout of up to two columns of up to two slices each
// over chunks, named "", "obs" or "a" and squeezed or not at random, and
// the chunks it uses, repeats included.
func randomLayout(t *testing.T, rng *rand.Rand, chunks []*tables.Chunk) (tables.Layout, []*tables.Chunk) {
	t.Helper()
	var traj []tables.Column
	var used []*tables.Chunk
	for c := range rng.IntN(3) {
		col := tables.Column{Name: []string{"", "obs", "a"}[c], Squeeze: rng.IntN(2) == 0}
		for range rng.IntN(3) {
			ch := chunks[rng.IntN(len(chunks))]
			used = append(used, ch)
			col.Slices = append(col.Slices, tables.Slice{Chunk: ch.Key, Offset: int32(rng.IntN(3)), Length: int32(rng.IntN(4))})
		}
		traj = append(traj, col)
	}
	layout, err := tables.NewLayout(traj, used)
	if err != nil {
		t.Fatal(err)
	}
	return layout, used
}

// TestAppendSampleResponse: the hand-written encoder and the generated code
// agree, on random samples with edge values (zeros, negative times, huge
// keys, shared chunks), to the byte once decoded.
func TestAppendSampleResponse(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	chunks := make([]*tables.Chunk, 6)
	for i := range chunks {
		chunks[i] = &tables.Chunk{Key: uint64(i) * math.MaxUint64 / 5, Data: []byte{byte(i), 1, 2}}
	}
	for trial := range 200 {
		var samples []tables.Sample
		for range rng.IntN(5) {
			layout, used := randomLayout(t, rng, chunks)
			samples = append(samples, tables.Sample{
				Info: tables.SampleInfo{
					Key: rng.Uint64() >> rng.UintN(64), Probability: []float64{0, 1, 0.25, math.SmallestNonzeroFloat64}[rng.IntN(4)],
					TableSize: int64(rng.IntN(3)), Priority: []float64{0, 3.5, 1e300}[rng.IntN(3)], TimesSampled: int32(rng.IntN(3)),
					InsertedAt: time.Unix(0, []int64{0, -5, 1_700_000_000_000_000_000}[rng.IntN(3)]), RateLimited: rng.IntN(2) == 0,
				},
				Layout: layout,
				Chunks: used,
			})
		}
		code, msg := []Code{0, Code_CODE_PARTIAL}[trial%2], []string{"", "partial"}[trial%2]
		after := randomTableState(rng)
		var got SampleResponse
		if err := proto.Unmarshal(AppendSampleResponse(nil, code, msg, samples, after), &got); err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		want := referenceSampleResponse(code, msg, samples, after)
		if !proto.Equal(&got, want) {
			t.Fatalf("trial %d: decoded %v, want %v", trial, &got, want)
		}
		if n := len(AppendSampleResponse(nil, code, msg, samples, after)); n != proto.Size(want) {
			t.Fatalf("trial %d: %d bytes, the generated code makes %d", trial, n, proto.Size(want))
		}
	}
}

// randomTableState draws a table's state with edge values: zeros, the
// largest size, and weights far beyond a double's range either way.
func randomTableState(rng *rand.Rand) TableState {
	return TableState{
		Size: []int64{0, 1, 1 << 40, math.MaxInt64}[rng.IntN(4)],
		Weight: tables.Weight{
			Fraction: []float64{0, 0.5, 0.75, math.Nextafter(1, 0)}[rng.IntN(4)],
			Exponent: []int64{0, 1, -1, 1 << 60, -(1 << 60)}[rng.IntN(5)],
		},
	}
}
