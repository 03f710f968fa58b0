package service

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// Golden vectors keep the Go and Python sides of the wire in step. The Go
// side writes encoded chunks, an insert batch and sample responses with
// what they must decode to (python/tests/golden/go_*.json, read by pytest);
// the Python writer's insert batches (python/tests/golden/python_*.json,
// written by pytest) are decoded here. Regenerate the Go files with
//
//	go test ./broker/service -run TestGolden -update
//
// and the Python files with scripts/test.sh --update-golden.
var updateGolden = flag.Bool("update", false, "rewrite the golden vectors in python/tests/golden")

const goldenDir = "../../python/tests/golden"

// goldenTensor is a decoded tensor in a golden file: dtype, shape and its
// little-endian bytes.
type goldenTensor struct {
	Dtype string  `json:"dtype"`
	Shape []int64 `json:"shape"`
	Raw   []byte  `json:"raw"`
}

type goldenChunk struct {
	Name        string       `json:"name"`
	Chunk       []byte       `json:"chunk"` // an encoded wire.Chunk
	Compression string       `json:"compression"`
	Delta       bool         `json:"delta"`
	Want        goldenTensor `json:"want"`
	// Error, when set, is a word the decoder's error must contain.
	Error string `json:"error,omitempty"`
}

// goldenSteps makes length steps of dtype with step shape shape: slowly
// changing values (so delta encoding matters) with edge values mixed in.
func goldenSteps(dtype string, shape []int64, length int) []*wire.Tensor {
	size, _ := wire.ElemSize(dtype)
	n := 1
	for _, d := range shape {
		n *= int(d)
	}
	steps := make([]*wire.Tensor, length)
	for s := range length {
		data := make([]byte, n*size)
		for i := range data {
			// Small steps between consecutive frames, wrapping around.
			data[i] = byte(i*7 + s*3 + (i%size)*11)
		}
		if dtype == "bool" {
			for i := range data {
				data[i] &= 1
			}
		}
		if dtype == "float32" && n >= 3 {
			// NaN, -0 and +Inf must survive bit for bit.
			copy(data[0:4], []byte{0, 0, 0xc0, 0x7f})
			copy(data[4:8], []byte{0, 0, 0, 0x80})
			copy(data[8:12], []byte{0, 0, 0x80, 0x7f})
		}
		steps[s] = &wire.Tensor{Dtype: dtype, Shape: shape, Data: data}
	}
	return steps
}

func concatSteps(steps []*wire.Tensor) goldenTensor {
	var raw []byte
	for _, s := range steps {
		raw = append(raw, s.Data...)
	}
	return goldenTensor{Dtype: steps[0].Dtype, Shape: append([]int64{int64(len(steps))}, steps[0].Shape...), Raw: raw}
}

func goldenMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func goldenChunks(t *testing.T) []goldenChunk {
	dtypes := []string{"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
		"float16", "bfloat16", "float32", "float64", "complex64", "complex128"}
	codecs := []wire.Codec{wire.Zstd, wire.Uncompressed}
	var out []goldenChunk
	key := uint64(1)
	for _, dt := range dtypes {
		for _, codec := range codecs {
			for _, delta := range []bool{false, true} {
				steps := goldenSteps(dt, []int64{3, 5}, 4)
				ch, err := wire.EncodeChunk(key, steps, wire.ChunkOptions{Codec: codec, Delta: delta, EpisodeID: 7, EpisodeStep: 9})
				if err != nil {
					t.Fatal(err)
				}
				key++
				out = append(out, goldenChunk{
					Name: fmt.Sprintf("%s/%s/delta=%v", dt, codec, delta), Chunk: goldenMarshal(t, ch),
					Compression: ch.Compression.String(), Delta: ch.DeltaEncoded, Want: concatSteps(steps),
				})
			}
		}
	}
	// Shapes: a scalar step, a zero-size step, a long chunk, large keys.
	extra := []struct {
		name  string
		dtype string
		shape []int64
		n     int
		key   uint64
	}{
		{"scalar int64", "int64", nil, 5, math.MaxUint64},
		{"empty step", "float32", []int64{0, 4}, 3, 1 << 63},
		{"uint8 frames 84x84", "uint8", []int64{84, 84}, 16, 12345},
		// Floats zstd shrinks by more than an eighth, with NaN, -0 and +Inf.
		{"float32 frames 16x16", "float32", []int64{16, 16}, 4, 777},
	}
	for _, e := range extra {
		steps := goldenSteps(e.dtype, e.shape, e.n)
		ch, err := wire.EncodeChunk(e.key, steps, wire.ChunkOptions{Codec: wire.Zstd, Delta: true})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, goldenChunk{Name: e.name, Chunk: goldenMarshal(t, ch), Compression: ch.Compression.String(), Delta: ch.DeltaEncoded, Want: concatSteps(steps)})
	}
	// s2 chunks do not decode in Python: the error must name the codec.
	steps := goldenSteps("uint8", []int64{64}, 8)
	ch, err := wire.EncodeChunk(99, steps, wire.ChunkOptions{Codec: wire.S2})
	if err != nil {
		t.Fatal(err)
	}
	if ch.Compression != wire.Compression_COMPRESSION_S2 {
		t.Fatalf("s2 chunk stored as %v", ch.Compression)
	}
	out = append(out, goldenChunk{Name: "s2", Chunk: goldenMarshal(t, ch), Compression: ch.Compression.String(), Want: concatSteps(steps), Error: "s2"})
	return out
}

type goldenInfo struct {
	Key          uint64  `json:"key"`
	Probability  float64 `json:"probability"`
	TableSize    int64   `json:"table_size"`
	Priority     float64 `json:"priority"`
	TimesSampled int32   `json:"times_sampled"`
	InsertedAt   int64   `json:"inserted_at_unix_nano"`
	RateLimited  bool    `json:"rate_limited"`
}

type goldenColumn struct {
	Name    string       `json:"name"`
	Squeeze bool         `json:"squeeze"`
	Want    goldenTensor `json:"want"`
}

type goldenSampleItem struct {
	Info    goldenInfo     `json:"info"`
	Columns []goldenColumn `json:"columns"`
}

type goldenResponse struct {
	Name     string             `json:"name"`
	Response []byte             `json:"response"` // an encoded SampleResponse, its items packed
	Code     int32              `json:"code"`
	Message  string             `json:"message"`
	Items    []goldenSampleItem `json:"items"`
	// Batchable: the items share their layout, so they stack.
	Batchable bool             `json:"batchable"`
	Table     goldenTableState `json:"table"`
}

// goldenTableState is a response's table_size, weight_fraction and
// weight_exponent.
type goldenTableState struct {
	Size           int64   `json:"size"`
	WeightFraction float64 `json:"weight_fraction"`
	WeightExponent int64   `json:"weight_exponent"`
}

// goldenResponses encodes sample responses as the service does for a
// request of packed items (AppendPackedSampleResponse) from chunks the
// producer's codec made.
func goldenResponses(t *testing.T) []goldenResponse {
	type col struct {
		name    string
		dtype   string
		shape   []int64
		chunkN  int
		codec   wire.Codec
		delta   bool
		squeeze bool
		// slices picked per item: (chunk index, offset, length).
		slices [][]int
	}
	build := func(name string, code wire.Code, msg string, batchable bool, cols []col, items int) goldenResponse {
		// Chunks per column, keyed from a base so every key is distinct.
		decoded := map[uint64]*wire.Tensor{}
		stored := map[uint64]*tables.Chunk{}
		keys := make([][]uint64, len(cols))
		for ci, c := range cols {
			for k := range c.chunkN {
				key := uint64(1000*(ci+1)+k) * 0x9e3779b97f4a7c15
				steps := goldenSteps(c.dtype, c.shape, 4)
				for s := range steps {
					steps[s].Data[0] ^= byte(k*16 + s) // chunks differ
				}
				ch, err := wire.EncodeChunk(key, steps, wire.ChunkOptions{Codec: c.codec, Delta: c.delta})
				if err != nil {
					t.Fatal(err)
				}
				dec, err := wire.DecodeChunk(ch)
				if err != nil {
					t.Fatal(err)
				}
				decoded[key] = dec
				stored[key] = &tables.Chunk{Key: key, Format: &tables.Format{DType: c.dtype, Shape: c.shape}, Length: ch.Length, Data: goldenMarshal(t, ch)}
				keys[ci] = append(keys[ci], key)
			}
		}
		var samples []tables.Sample
		var want []goldenSampleItem
		for i := range items {
			info := tables.SampleInfo{Key: math.MaxUint64 - uint64(i)*0x1234567, Probability: 1 / float64(i+3), TableSize: int64(1000 + i),
				Priority: float64(i) * 0.5, TimesSampled: int32(i + 1), InsertedAt: time.Unix(1_700_000_000, int64(i)), RateLimited: i%2 == 1}
			smp := tables.Sample{Info: info}
			gi := goldenSampleItem{Info: goldenInfo{info.Key, info.Probability, info.TableSize, info.Priority, info.TimesSampled, info.InsertedAt.UnixNano(), info.RateLimited}}
			var traj []tables.Column
			for ci, c := range cols {
				tc := tables.Column{Name: c.name, Squeeze: c.squeeze}
				wc := &wire.TrajectoryColumn{Name: c.name, Squeeze: c.squeeze}
				pick := c.slices[i%len(c.slices)]
				for s := 0; s < len(pick); s += 3 {
					key := keys[ci][(pick[s]+i)%c.chunkN]
					tc.Slices = append(tc.Slices, tables.Slice{Chunk: key, Offset: int32(pick[s+1]), Length: int32(pick[s+2])})
					wc.Slices = append(wc.Slices, &wire.ColumnSlice{ChunkKey: key, Offset: int32(pick[s+1]), Length: int32(pick[s+2])})
					if !slices.ContainsFunc(smp.Chunks, func(ch *tables.Chunk) bool { return ch.Key == key }) {
						smp.Chunks = append(smp.Chunks, stored[key])
					}
				}
				traj = append(traj, tc)
				g, err := wire.GatherColumn(wc, func(k uint64) (*wire.Tensor, bool) { d, ok := decoded[k]; return d, ok })
				if err != nil {
					t.Fatal(err)
				}
				gi.Columns = append(gi.Columns, goldenColumn{Name: c.name, Squeeze: c.squeeze, Want: goldenTensor{Dtype: g.Dtype, Shape: g.Shape, Raw: g.Data}})
			}
			var err error
			if smp.Layout, err = tables.NewLayout(traj, smp.Chunks); err != nil {
				t.Fatal(err)
			}
			samples = append(samples, smp)
			want = append(want, gi)
		}
		// The table's state after the sample: none with a refusal, and
		// weights above and below a double's range otherwise.
		var after wire.TableState
		if items > 0 {
			after = wire.TableState{Size: int64(1000 + items), Weight: tables.Weight{Fraction: 0.5 + 1/float64(items+4), Exponent: int64(items)*700 - 1500}}
		}
		response, err := wire.AppendPackedSampleResponse(nil, wire.PackedLayout_PACKED_LAYOUT_UNIFORM, code, msg, samples, after)
		if err != nil {
			t.Fatal(err)
		}
		var m wire.SampleResponse
		if err := proto.Unmarshal(response, &m); err != nil {
			t.Fatal(err)
		}
		if uniform := len(m.GetPacked().GetUniformColumns()) > 0; uniform != strings.HasPrefix(name, "uniform") {
			t.Fatalf("golden response %q: uniform columns %v", name, uniform)
		}
		return goldenResponse{Name: name, Response: response, Code: int32(code), Message: msg, Items: want, Batchable: batchable,
			Table: goldenTableState{Size: after.Size, WeightFraction: after.Weight.Fraction, WeightExponent: after.Weight.Exponent}}
	}
	return []goldenResponse{
		build("trajectories: 3-step columns, a squeezed column, shared chunks", wire.Code_CODE_OK, "", true, []col{
			{name: "obs", dtype: "uint8", shape: []int64{4, 4}, chunkN: 3, codec: wire.Zstd, delta: true, slices: [][]int{{0, 1, 3}}},
			{name: "action", dtype: "int32", shape: nil, chunkN: 2, codec: wire.Uncompressed, slices: [][]int{{0, 0, 3}}},
			{name: "reward", dtype: "float32", shape: nil, chunkN: 2, codec: wire.Zstd, squeeze: true, slices: [][]int{{1, 2, 1}}},
		}, 6),
		build("columns spanning two chunks", wire.Code_CODE_OK, "", true, []col{
			{name: "obs", dtype: "float64", shape: []int64{2}, chunkN: 3, codec: wire.Zstd, slices: [][]int{{0, 2, 2, 1, 0, 3}}},
			{name: "done", dtype: "bool", shape: nil, chunkN: 2, codec: wire.Uncompressed, slices: [][]int{{0, 3, 1, 1, 0, 4}}},
		}, 4),
		build("items of different lengths (not batchable)", wire.Code_CODE_OK, "", false, []col{
			{name: "x", dtype: "int64", shape: []int64{3}, chunkN: 2, codec: wire.Zstd, delta: true, slices: [][]int{{0, 0, 2}, {0, 1, 3}}},
		}, 3),
		build("partial", wire.Code_CODE_PARTIAL, "2 of 5 samples before the timeout", true, []col{
			{name: "x", dtype: "float32", shape: []int64{5}, chunkN: 1, codec: wire.Uncompressed, squeeze: true, slices: [][]int{{0, 0, 1}}},
		}, 2),
		build("uniform: every item's columns whole chunks of their own", wire.Code_CODE_OK, "", true, []col{
			{name: "obs", dtype: "uint8", shape: []int64{4, 4}, chunkN: 5, codec: wire.Uncompressed, slices: [][]int{{0, 0, 4}}},
			{name: "action", dtype: "int32", shape: nil, chunkN: 5, codec: wire.Uncompressed, delta: true, slices: [][]int{{0, 0, 4}}},
			{name: "reward", dtype: "float32", shape: nil, chunkN: 5, codec: wire.Uncompressed, slices: [][]int{{0, 0, 4}}},
		}, 5),
		build("uniform: item 3 is item 0 again, its chunks sent twice", wire.Code_CODE_OK, "", true, []col{
			{name: "obs", dtype: "float32", shape: []int64{2}, chunkN: 3, codec: wire.Uncompressed, slices: [][]int{{0, 0, 4}}},
			{name: "done", dtype: "bool", shape: nil, chunkN: 3, codec: wire.Uncompressed, slices: [][]int{{0, 0, 4}}},
		}, 4),
		build("rate limited", wire.Code_CODE_RATE_LIMITED, `table "t": rate limiter allowed no sample within 1s`, true, nil, 0),
		build("unknown table", wire.Code_CODE_NOT_FOUND, `unknown table "nope" (tables: replay)`, true, nil, 0),
		build("signature", wire.Code_CODE_SIGNATURE_MISMATCH, "signature mismatch", true, nil, 0),
		build("exhausted", wire.Code_CODE_RESOURCE_EXHAUSTED, "too many", true, nil, 0),
	}
}

// goldenInsert is an insert batch as the Go producer builds it.
type goldenInsert struct {
	Batch []byte       `json:"batch"` // an encoded InsertBatch
	Items []goldenItem `json:"items"`
}

type goldenItem struct {
	Key           uint64         `json:"key"`
	Table         string         `json:"table"`
	Priority      float64        `json:"priority"`
	PolicyVersion int64          `json:"policy_version,omitempty"`
	Columns       []goldenColumn `json:"columns"`
}

func goldenGoInsert(t *testing.T) goldenInsert {
	steps := goldenSteps("int16", []int64{3}, 4)
	obs, err := wire.EncodeChunk(11, steps, wire.ChunkOptions{Codec: wire.Zstd, Delta: true})
	if err != nil {
		t.Fatal(err)
	}
	act, err := wire.EncodeChunk(12, goldenSteps("float32", nil, 4), wire.ChunkOptions{Codec: wire.Uncompressed})
	if err != nil {
		t.Fatal(err)
	}
	items := []*wire.Item{
		{Key: 21, Table: "replay", Priority: 1.5, Columns: []*wire.TrajectoryColumn{
			{Name: "obs", Slices: []*wire.ColumnSlice{{ChunkKey: 11, Offset: 1, Length: 3}}},
			{Name: "act", Slices: []*wire.ColumnSlice{{ChunkKey: 12, Offset: 3, Length: 1}}, Squeeze: true},
		}},
		{Key: math.MaxUint64, Table: "other", Priority: 0, Columns: []*wire.TrajectoryColumn{
			{Name: "o", Slices: []*wire.ColumnSlice{{ChunkKey: 11, Offset: 0, Length: 4}}},
		}},
	}
	b := &wire.InsertBatch{ProducerId: "0123456789abcdef0123456789abcdef", Sequence: 7, Chunks: []*wire.Chunk{obs, act}, Items: items,
		ReleaseChunkKeys: []uint64{3, 4}, WindowStart: 5, Window: 256, NoticeSubject: "_INBOX.actor.notice1"}
	decoded := map[uint64]*wire.Tensor{}
	for _, c := range b.Chunks {
		d, err := wire.DecodeChunk(c)
		if err != nil {
			t.Fatal(err)
		}
		decoded[c.Key] = d
	}
	out := goldenInsert{Batch: goldenMarshal(t, b)}
	for _, it := range items {
		gi := goldenItem{Key: it.Key, Table: it.Table, Priority: it.Priority}
		for _, c := range it.Columns {
			g, err := wire.GatherColumn(c, func(k uint64) (*wire.Tensor, bool) { d, ok := decoded[k]; return d, ok })
			if err != nil {
				t.Fatal(err)
			}
			gi.Columns = append(gi.Columns, goldenColumn{Name: c.Name, Squeeze: c.Squeeze, Want: goldenTensor{Dtype: g.Dtype, Shape: g.Shape, Raw: g.Data}})
		}
		out.Items = append(out.Items, gi)
	}
	return out
}

func checkGolden(t *testing.T, name string, v any) {
	t.Helper()
	got, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join(goldenDir, name)
	if *updateGolden {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (write the golden files with: go test ./broker/service -run TestGolden -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is out of date: the Go encoding changed. If that is intended, regenerate it with `go test ./broker/service -run TestGolden -update` and make sure pytest python/tests/test_golden.py passes", path)
	}
}

// goldenProgress is a progress message as the service publishes it, with
// what a producer must read from it.
type goldenProgress struct {
	Name         string            `json:"name"`
	Data         []byte            `json:"data"`
	Applied      uint64            `json:"applied"`
	Held         map[string]uint64 `json:"held"`
	MaxUnapplied uint32            `json:"max_unapplied"`
}

// goldenProgresses are the service's progress messages: unpaced, paced,
// and with tables whose rate limiters hold items.
func goldenProgresses(t *testing.T) []goldenProgress {
	var out []goldenProgress
	for _, c := range []struct {
		name   string
		held   map[string]uint64
		window uint32
	}{
		{"unpaced", nil, 0},
		{"paced", nil, 37},
		{"held and paced", map[string]uint64{"a": 30, "b": 12}, 4096},
	} {
		p := &progress{seq: 41}
		for table, seq := range c.held {
			p.hold(table, seq)
		}
		p.setWindow(c.window)
		out = append(out, goldenProgress{Name: c.name, Data: goldenMarshal(t, p.message()), Applied: 41, Held: c.held, MaxUnapplied: c.window})
	}
	return out
}

// goldenSampleRequest is a sample request or a withdrawal, as both
// clients send them (python/reprise/aio.py sample_request and
// sample_withdrawal, broker.Client's sampleRequest and withdraw), with its
// fields.
type goldenSampleRequest struct {
	Name       string `json:"name"`
	Data       []byte `json:"data"`
	Table      string `json:"table"`
	NumSamples int32  `json:"num_samples"`
	TimeoutMs  int64  `json:"timeout_ms"`
	Flexible   bool   `json:"flexible"`
	Packed     bool   `json:"packed"`
	Layout     int32  `json:"layout"`
	Withdraw   string `json:"withdraw"`
}

func (g goldenSampleRequest) message() *wire.SampleRequest {
	return &wire.SampleRequest{Table: g.Table, NumSamples: g.NumSamples, TimeoutMs: g.TimeoutMs, Flexible: g.Flexible, Packed: g.Packed, Layout: wire.PackedLayout(g.Layout), Withdraw: g.Withdraw}
}

// goldenSampleRequests are the Go client's sample requests and a
// withdrawal.
func goldenSampleRequests(t *testing.T) []goldenSampleRequest {
	uniform := int32(wire.PackedLayout_PACKED_LAYOUT_UNIFORM)
	out := []goldenSampleRequest{
		{Name: "request", Table: "replay", NumSamples: 256, TimeoutMs: 60000, Packed: true, Layout: uniform},
		{Name: "flexible request", Table: "q", NumSamples: 1, TimeoutMs: 900, Flexible: true, Packed: true, Layout: uniform},
		{Name: "withdrawal", Withdraw: "_INBOX.KF3Gq9XWcCN1u1O2pF4HnZ.1f"},
	}
	for i := range out {
		out[i].Data = goldenMarshal(t, out[i].message())
	}
	return out
}

// TestGoldenPythonSampleRequests decodes the Python client's sample
// requests and withdrawal (written by pytest, test_golden.py).
func TestGoldenPythonSampleRequests(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(goldenDir, "python_sample_requests.json"))
	if err != nil {
		t.Fatalf("%v (write them with: scripts/test.sh --update-golden)", err)
	}
	var reqs []goldenSampleRequest
	if err := json.Unmarshal(raw, &reqs); err != nil {
		t.Fatal(err)
	}
	withdrawals := 0
	for _, g := range reqs {
		var got wire.SampleRequest
		if err := proto.Unmarshal(g.Data, &got); err != nil {
			t.Fatalf("%s: %v", g.Name, err)
		}
		if !proto.Equal(&got, g.message()) {
			t.Errorf("%s: decodes to %v, want %v", g.Name, &got, g.message())
		}
		if got.Withdraw != "" {
			withdrawals++
		}
	}
	if withdrawals == 0 || withdrawals == len(reqs) {
		t.Errorf("%d withdrawals of %d messages: want requests and withdrawals", withdrawals, len(reqs))
	}
}

// TestGoldenGoVectors writes (with -update) or checks the vectors pytest
// decodes.
func TestGoldenGoVectors(t *testing.T) {
	checkGolden(t, "go_chunks.json", goldenChunks(t))
	checkGolden(t, "go_sample_responses.json", goldenResponses(t))
	checkGolden(t, "go_insert_batch.json", goldenGoInsert(t))
	checkGolden(t, "go_progress.json", goldenProgresses(t))
	checkGolden(t, "go_sample_requests.json", goldenSampleRequests(t))
}

// TestGoldenBatches decodes the golden sample responses as stacked batches,
// as python/tests/test_golden.py does with decode_batch: each batchable
// response's columns are its items' stacked, its info theirs; the others
// are refused as items that do not stack.
func TestGoldenBatches(t *testing.T) {
	for _, g := range goldenResponses(t) {
		got, err := wire.DecodeBatchResponse(slices.Clone(g.Response))
		switch {
		case !g.Batchable:
			if !errors.Is(err, wire.ErrUnstackable) {
				t.Errorf("%s: %v, want ErrUnstackable", g.Name, err)
			}
			continue
		case err != nil:
			t.Errorf("%s: %v", g.Name, err)
			continue
		}
		b := got.Batch
		if int32(got.Code) != g.Code || got.Message != g.Message || b.Info.Len() != len(g.Items) {
			t.Errorf("%s: code %v %q, %d items; want %d %q, %d", g.Name, got.Code, got.Message, b.Info.Len(), g.Code, g.Message, len(g.Items))
			continue
		}
		for i, it := range g.Items {
			in := goldenInfo{b.Info.Keys[i], b.Info.Probabilities[i], b.Info.TableSizes[i], b.Info.Priorities[i], b.Info.TimesSampled[i], b.Info.InsertedAt[i].UnixNano(), b.Info.RateLimited[i]}
			if in != it.Info {
				t.Errorf("%s: item %d's info %+v, want %+v", g.Name, i, in, it.Info)
			}
		}
		if len(g.Items) == 0 {
			continue
		}
		for j, c := range g.Items[0].Columns {
			col := b.Columns[j]
			want := goldenTensor{Dtype: c.Want.Dtype, Shape: append([]int64{int64(len(g.Items))}, c.Want.Shape...)}
			for _, it := range g.Items {
				want.Raw = append(want.Raw, it.Columns[j].Want.Raw...)
			}
			if col.Name != c.Name || col.Dtype != want.Dtype || !slices.Equal(col.Shape, want.Shape) || !bytes.Equal(col.Data, want.Raw) {
				t.Errorf("%s: column %d is %q %s%v, want %q %s%v (or its bytes differ)", g.Name, j, col.Name, col.Dtype, col.Shape, c.Name, want.Dtype, want.Shape)
			}
		}
	}
}

// pythonInsert is one message the Python writer published, as pytest wrote
// it, with what it must decode to.
type pythonInsert struct {
	Name        string       `json:"name"`
	Data        []byte       `json:"data"`
	MsgID       string       `json:"msg_id"`
	NoticeToken string       `json:"notice_token"`
	Notice      string       `json:"notice_subject"`
	ProducerID  string       `json:"producer_id"`
	Sequence    uint64       `json:"sequence"`
	WindowStart uint64       `json:"window_start"`
	Window      uint32       `json:"window"`
	Release     []uint64     `json:"release"`
	End         bool         `json:"end"`
	Chunks      []uint64     `json:"chunks"` // keys of the chunks the message carries
	Items       []goldenItem `json:"items"`
}

var hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestGoldenPythonVectors decodes the Python writer's messages with the
// generated code and with the service's own parser, and checks every item
// column, the dedupe id, the notice token and the window fields.
func TestGoldenPythonVectors(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(goldenDir, "python_insert_batches.json"))
	if err != nil {
		t.Fatalf("%v (write them with: scripts/test.sh --update-golden)", err)
	}
	var msgs []pythonInsert
	if err := json.Unmarshal(raw, &msgs); err != nil {
		t.Fatal(err)
	}
	if len(msgs) < 3 {
		t.Fatalf("only %d python messages", len(msgs))
	}
	// Chunks are held across messages of a producer, as the service does.
	held := map[uint64]*wire.Tensor{}
	for _, m := range msgs {
		t.Run(m.Name, func(t *testing.T) {
			var b wire.InsertBatch
			if err := proto.Unmarshal(m.Data, &b); err != nil {
				t.Fatal(err)
			}
			if !hex32.MatchString(b.ProducerId) {
				t.Errorf("producer id %q is not 32 lowercase hex digits", b.ProducerId)
			}
			if b.ProducerId != m.ProducerID || b.Sequence != m.Sequence || b.WindowStart != m.WindowStart || b.Window != m.Window || b.EndOfStream != m.End || b.NoticeSubject != m.Notice {
				t.Errorf("header fields: got id %s seq %d window [%d,+%d) end %v notice %q, want %s %d [%d,+%d) %v %q",
					b.ProducerId, b.Sequence, b.WindowStart, b.Window, b.EndOfStream, b.NoticeSubject, m.ProducerID, m.Sequence, m.WindowStart, m.Window, m.End, m.Notice)
			}
			if b.Sequence < b.WindowStart || b.Sequence >= b.WindowStart+uint64(b.Window) {
				t.Errorf("sequence %d outside the window [%d, %d)", b.Sequence, b.WindowStart, b.WindowStart+uint64(b.Window))
			}
			if want := b.ProducerId + "-" + fmt.Sprint(b.Sequence); m.MsgID != want {
				t.Errorf("dedupe id %q, the Go producer sets %q", m.MsgID, want)
			}
			if tok := protocol.NoticeToken(b.ProducerId); m.NoticeToken != tok {
				t.Errorf("notice token %q, Go computes %q", m.NoticeToken, tok)
			}
			if !slices.Equal(b.ReleaseChunkKeys, m.Release) {
				t.Errorf("release keys %v, want %v", b.ReleaseChunkKeys, m.Release)
			}
			// The service's own parser reads it the same way.
			limits := DefaultLimits()
			pb, err := parseInsertBatch(m.Data, &limits)
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range pb.items {
				if it.err != nil {
					t.Errorf("service rejects item %d: %v", it.item.Key, it.err)
				}
			}
			if pb.producerID != b.ProducerId || pb.sequence != b.Sequence || len(pb.items) != len(b.Items) || len(pb.chunks) != len(b.Chunks) || !slices.Equal(pb.release, b.ReleaseChunkKeys) || pb.notice != b.NoticeSubject {
				t.Errorf("parseInsertBatch disagrees with proto.Unmarshal")
			}
			var keys []uint64
			for i, c := range b.Chunks {
				if pb.chunks[i].err != nil {
					t.Errorf("service rejects chunk %d: %v", c.Key, pb.chunks[i].err)
				}
				d, err := wire.DecodeChunk(c)
				if err != nil {
					t.Fatalf("chunk %d: %v", c.Key, err)
				}
				held[c.Key] = d
				keys = append(keys, c.Key)
			}
			if !slices.Equal(keys, m.Chunks) {
				t.Errorf("chunk keys %v, want %v", keys, m.Chunks)
			}
			if len(b.Items) != len(m.Items) {
				t.Fatalf("%d items, want %d", len(b.Items), len(m.Items))
			}
			for i, it := range b.Items {
				w := m.Items[i]
				if it.Key != w.Key || it.Table != w.Table || it.Priority != w.Priority || it.PolicyVersion != w.PolicyVersion || len(it.Columns) != len(w.Columns) {
					t.Fatalf("item %d: got key %d table %q priority %v version %d with %d columns, want %d %q %v %d with %d",
						i, it.Key, it.Table, it.Priority, it.PolicyVersion, len(it.Columns), w.Key, w.Table, w.Priority, w.PolicyVersion, len(w.Columns))
				}
				for j, c := range it.Columns {
					wc := w.Columns[j]
					g, err := wire.GatherColumn(c, func(k uint64) (*wire.Tensor, bool) { d, ok := held[k]; return d, ok })
					if err != nil {
						t.Fatalf("item %d column %q: %v", i, c.Name, err)
					}
					if c.Name != wc.Name || c.Squeeze != wc.Squeeze || g.Dtype != wc.Want.Dtype || !slices.Equal(g.Shape, wc.Want.Shape) || !bytes.Equal(g.Data, wc.Want.Raw) {
						t.Errorf("item %d column %q: got %s%v squeeze %v, want %q %s%v squeeze %v (or its bytes differ)",
							i, c.Name, g.Dtype, g.Shape, c.Squeeze, wc.Name, wc.Want.Dtype, wc.Want.Shape, wc.Squeeze)
					}
				}
			}
		})
	}
}
