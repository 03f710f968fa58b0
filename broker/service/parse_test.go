package service

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

func encodedChunk(t testing.TB, key uint64) *wire.Chunk {
	t.Helper()
	c, err := wire.EncodeChunk(key, []*wire.Tensor{wire.Float32s([]int64{2, 3}, make([]float32, 6)), wire.Float32s([]int64{2, 3}, []float32{1, 2, 3, 4, 5, 6})}, wire.ChunkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// parsedBatch encodes in and parses it under the default limits, returning
// the batch and the message it was parsed from.
func parsedBatch(t *testing.T, in *wire.InsertBatch) (*insertBatch, []byte) {
	t.Helper()
	data, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	limits := DefaultLimits()
	b, err := parseInsertBatch(data, &limits)
	if err != nil {
		t.Fatal(err)
	}
	return b, data
}

// TestParseInsertBatch: the hand-rolled parser agrees with the generated
// code, and a stored chunk is exactly the chunk's encoding.
func TestParseInsertBatch(t *testing.T) {
	c1, c2 := encodedChunk(t, 11), encodedChunk(t, 12)
	in := &wire.InsertBatch{
		ProducerId: "p", Sequence: 42, WindowStart: 40, Window: 8, Chunks: []*wire.Chunk{c1, c2},
		Items:            []*wire.Item{{Key: 1, Table: "t", Priority: 0.5, Columns: []*wire.TrajectoryColumn{{Name: "x", Slices: []*wire.ColumnSlice{{ChunkKey: 11, Length: 2}}}}}},
		ReleaseChunkKeys: []uint64{3, 4, 1 << 60}, EndOfStream: true,
	}
	b, _ := parsedBatch(t, in)
	if b.producerID != "p" || b.sequence != 42 || b.windowStart != 40 || b.window != 8 || !b.end || !slices.Equal(b.release, in.ReleaseChunkKeys) || len(b.items) != 1 {
		t.Fatalf("parsed %+v, want %v", b, in)
	}
	it := b.items[0]
	want := tables.Item{Key: 1, Priority: 0.5, Trajectory: []tables.Column{{Name: "x", Slices: []tables.Slice{{Chunk: 11, Length: 2}}}}}
	if it.err != nil || it.table != "t" || !reflect.DeepEqual(it.item, want) {
		t.Fatalf("parsed item %+v, want %+v in table t", it, want)
	}
	for i, want := range []*wire.Chunk{c1, c2} {
		rc := b.chunks[i]
		if rc.err != nil {
			t.Fatal(rc.err)
		}
		var got wire.Chunk
		if err := proto.Unmarshal(rc.chunk.Data, &got); err != nil || !proto.Equal(&got, want) {
			t.Fatalf("chunk %d stored bytes decode to %v (%v), want %v", i, &got, err, want)
		}
		if rc.chunk.Key != want.Key || rc.chunk.DType != "float32" || rc.chunk.Length != 2 || !slices.Equal(rc.chunk.Shape, []int64{2, 3}) {
			t.Fatalf("chunk %d header %+v", i, rc.chunk)
		}
	}
}

// TestSmallChunksLeaveTheirMessage: a small chunk is held as a copy, so
// that the message it came in can go once parsed; a large one is held as a
// slice of the message, whose bytes it makes up. Either way the bytes held
// are the chunk's encoding.
func TestSmallChunksLeaveTheirMessage(t *testing.T) {
	small := encodedChunk(t, 11)
	large, err := wire.EncodeChunk(12, []*wire.Tensor{wire.Float32s([]int64{copiedChunkBytes}, make([]float32, copiedChunkBytes))}, wire.ChunkOptions{Codec: wire.Uncompressed})
	if err != nil {
		t.Fatal(err)
	}
	b, data := parsedBatch(t, &wire.InsertBatch{ProducerId: "p", Sequence: 1, WindowStart: 1, Window: 1, Chunks: []*wire.Chunk{small, large}})
	inMessage := func(d []byte) bool {
		for i := range data {
			if &data[i] == &d[0] {
				return true
			}
		}
		return false
	}
	for i, want := range []struct {
		chunk     *wire.Chunk
		inMessage bool
	}{{small, false}, {large, true}} {
		rc := b.chunks[i]
		if rc.err != nil {
			t.Fatal(rc.err)
		}
		var got wire.Chunk
		if err := proto.Unmarshal(rc.chunk.Data, &got); err != nil || !proto.Equal(&got, want.chunk) {
			t.Fatalf("chunk %d: stored bytes decode to %v (%v)", i, &got, err)
		}
		if in := inMessage(rc.chunk.Data); in != want.inMessage {
			t.Errorf("chunk %d of %d bytes: a slice of its message %v, want %v", i, len(rc.chunk.Data), in, want.inMessage)
		}
	}
}

func TestChunksOfAMessageShareFormats(t *testing.T) {
	m := &wire.InsertBatch{ProducerId: "p", Sequence: 1, WindowStart: 1, Window: 1}
	for i := range uint64(6) {
		tensor := wire.Float32s([]int64{4}, make([]float32, 4))
		if i%2 == 1 {
			tensor = wire.Int64s(nil, []int64{int64(i)})
		}
		ch, err := wire.EncodeChunk(i+1, []*wire.Tensor{tensor}, wire.ChunkOptions{Codec: wire.Uncompressed})
		if err != nil {
			t.Fatal(err)
		}
		m.Chunks = append(m.Chunks, ch)
	}
	b, _ := parsedBatch(t, m)
	for i, rc := range b.chunks {
		if rc.err != nil {
			t.Fatal(rc.err)
		}
		first := b.chunks[i%2].chunk.Format
		if rc.chunk.Format != first {
			t.Errorf("chunk %d (%s%v) has a Format of its own, not chunk %d's", i, rc.chunk.DType, rc.chunk.Shape, i%2)
		}
	}
	obs, id := b.chunks[0].chunk, b.chunks[1].chunk
	if obs.Format == id.Format || obs.DType != "float32" || !slices.Equal(obs.Shape, []int64{4}) || obs.StepBytes != 16 ||
		id.DType != "int64" || len(id.Shape) != 0 || id.StepBytes != 8 {
		t.Fatalf("formats: %+v and %+v", *obs.Format, *id.Format)
	}
}

func TestParseChunkRejects(t *testing.T) {
	good := encodedChunk(t, 5)
	cases := map[string]func(c *wire.Chunk){
		"no key":         func(c *wire.Chunk) { c.Key = 0 },
		"unknown dtype":  func(c *wire.Chunk) { c.Dtype = "float128" },
		"zero length":    func(c *wire.Chunk) { c.Length = 0 },
		"raw size lies":  func(c *wire.Chunk) { c.RawSize++ },
		"negative dim":   func(c *wire.Chunk) { c.StepShape = []int64{-2, -3} },
		"huge shape":     func(c *wire.Chunk) { c.StepShape = []int64{1 << 40, 1 << 40}; c.RawSize = 0 },
		"bad compressor": func(c *wire.Chunk) { c.Compression = 9 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			c := proto.Clone(good).(*wire.Chunk)
			mutate(c)
			data, _ := proto.Marshal(c)
			if _, _, err := new(chunkParser).parse(data); !errors.Is(err, protocol.ErrInvalidMessage) {
				t.Fatalf("parse = %v, want protocol.ErrInvalidMessage", err)
			}
		})
	}
}

// TestParseUncompressedChunkWhole: parse proves an uncompressed chunk
// whole, since checkDecodes no longer reads it again; a compressed one it
// leaves to checkDecodes.
func TestParseUncompressedChunkWhole(t *testing.T) {
	steps := []*wire.Tensor{wire.Float32s([]int64{2, 3}, []float32{1, 2, 3, 4, 5, 6})}
	plain, err := wire.EncodeChunk(7, steps, wire.ChunkOptions{Codec: wire.Uncompressed})
	if err != nil {
		t.Fatal(err)
	}
	if _, compressed, err := new(chunkParser).parse(mustMarshal(t, plain)); err != nil || compressed {
		t.Fatalf("parse of a good uncompressed chunk = compressed %v, %v", compressed, err)
	}
	cases := map[string]func(c *wire.Chunk){
		"short data":     func(c *wire.Chunk) { c.Data = c.Data[:len(c.Data)-4] },
		"long data":      func(c *wire.Chunk) { c.Data = append(c.Data, 0, 0, 0, 0) },
		"delta on float": func(c *wire.Chunk) { c.DeltaEncoded = true },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			c := proto.Clone(plain).(*wire.Chunk)
			mutate(c)
			if _, _, err := new(chunkParser).parse(mustMarshal(t, c)); !errors.Is(err, protocol.ErrInvalidMessage) {
				t.Fatalf("parse = %v, want protocol.ErrInvalidMessage", err)
			}
		})
	}
	zeros := []*wire.Tensor{wire.Float32s([]int64{64}, make([]float32, 64))}
	packed, err := wire.EncodeChunk(8, zeros, wire.ChunkOptions{Codec: wire.Zstd})
	if err != nil || packed.Compression == wire.Compression_COMPRESSION_NONE {
		t.Fatalf("EncodeChunk left 256 zero bytes uncompressed (%v)", err)
	}
	packed.Data = packed.Data[:len(packed.Data)-1]
	c, compressed, err := new(chunkParser).parse(mustMarshal(t, packed))
	if err != nil || !compressed {
		t.Fatalf("parse of a compressed chunk = compressed %v, %v; want it left to checkDecodes", compressed, err)
	}
	if err := new(chunkParser).checkDecodes(&c, compressed, DefaultLimits().MaxChunkBytes); !errors.Is(err, protocol.ErrInvalidMessage) {
		t.Fatalf("checkDecodes of a truncated zstd chunk = %v, want protocol.ErrInvalidMessage", err)
	}
}

// TestParseLocatesSteps: the format of an uncompressed chunk says where
// its steps lie in the chunk as stored (the episode fields a producer
// writes after them included), and whether they are delta-encoded; that
// of a compressed one says nothing. A chunk that repeats its data field
// is read as protobuf reads it, by the last.
func TestParseLocatesSteps(t *testing.T) {
	floats := []*wire.Tensor{wire.Float32s([]int64{2, 3}, []float32{1, 2, 3, 4, 5, 6})}
	ints := []*wire.Tensor{wire.Int64s([]int64{2}, []int64{1, 5}), wire.Int64s([]int64{2}, []int64{3, 9})}
	zeros := []*wire.Tensor{wire.Float32s([]int64{64}, make([]float32, 64))}
	encode := func(key uint64, steps []*wire.Tensor, opts wire.ChunkOptions) *wire.Chunk {
		t.Helper()
		c, err := wire.EncodeChunk(key, steps, opts)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	plain := encode(1<<63|7, floats, wire.ChunkOptions{Codec: wire.Uncompressed, EpisodeID: 1<<62 | 3, EpisodeStep: 400})
	delta := encode(8, ints, wire.ChunkOptions{Codec: wire.Uncompressed, Delta: true})
	repeated := mustMarshal(t, plain)
	last := bytes.Repeat([]byte{0xab}, len(plain.Data))
	repeated = protowire.AppendBytes(protowire.AppendTag(repeated, 8, protowire.BytesType), last)
	for name, tc := range map[string]struct {
		data  []byte
		steps []byte
		delta bool
	}{
		"uncompressed":  {mustMarshal(t, plain), plain.Data, false},
		"delta":         {mustMarshal(t, delta), delta.Data, true},
		"repeated data": {repeated, last, false},
		"compressed":    {mustMarshal(t, encode(9, zeros, wire.ChunkOptions{Codec: wire.Zstd})), nil, false},
	} {
		t.Run(name, func(t *testing.T) {
			c, _, err := new(chunkParser).parse(tc.data)
			if err != nil {
				t.Fatal(err)
			}
			f := c.Format
			if tc.steps == nil {
				if f.DataAt != 0 {
					t.Fatalf("a compressed chunk's format has DataAt %d", f.DataAt)
				}
				return
			}
			end := int64(f.DataAt) + int64(c.Length)*f.StepBytes
			if f.DataAt <= 0 || end > int64(len(c.Data)) {
				t.Fatalf("format %+v locates no steps in %d bytes", f, len(c.Data))
			}
			if got := c.Data[f.DataAt:end]; !bytes.Equal(got, tc.steps) || f.Delta != tc.delta {
				t.Fatalf("format %+v locates % x, delta %v; want % x, delta %v", f, got, f.Delta, tc.steps, tc.delta)
			}
		})
	}
}

// TestParseNoticeSubject: the service publishes rejections to the subject a
// message names, so only a literal subject outside the server's $ APIs is
// accepted.
func TestParseNoticeSubject(t *testing.T) {
	limits := DefaultLimits()
	parse := func(notice string) error {
		data, _ := proto.Marshal(&wire.InsertBatch{ProducerId: "p", Sequence: 1, WindowStart: 1, Window: 1, NoticeSubject: notice})
		_, err := parseInsertBatch(data, &limits)
		return err
	}
	for _, ok := range []string{"", "_INBOX.actor1.AbC123", "my-inbox.x"} {
		if err := parse(ok); err != nil {
			t.Errorf("notice subject %q: %v", ok, err)
		}
	}
	for notice, why := range map[string]string{
		"_INBOX.*":                "wildcard",
		"_INBOX.>":                "wildcard",
		"_INBOX..x":               "empty token",
		"_INBOX.x.":               "empty token",
		"_INBOX. x":               "whitespace",
		"$JS.API.STREAM.DELETE.X": "$ subject",
		strings.Repeat("a", 300):  "over 256",
	} {
		if err := parse(notice); !errors.Is(err, protocol.ErrInvalidMessage) || !strings.Contains(err.Error(), why) {
			t.Errorf("notice subject %q: %v, want protocol.ErrInvalidMessage naming %q", notice, err, why)
		}
	}
}

// TestParseRefusesNonUTF8Sender: a producer id or notice subject that is
// not UTF-8 is refused; both are kept in checkpoints as protobuf strings,
// which proto.Marshal refuses, so one such message made every checkpoint
// fail (TestNonUTF8SenderLeavesCheckpointsAlone).
func TestParseRefusesNonUTF8Sender(t *testing.T) {
	limits := DefaultLimits()
	for _, tc := range []struct{ producer, notice, why string }{
		{"p\xf0", "", "producer id"},
		{"p", "_INBOX.\xff", "notice subject"},
	} {
		data := protowire.AppendTag(nil, wire.FieldBatchProducer, protowire.BytesType)
		data = protowire.AppendString(data, tc.producer)
		for _, f := range []struct {
			num protowire.Number
			v   uint64
		}{{wire.FieldBatchSequence, 1}, {wire.FieldBatchWinStart, 1}, {wire.FieldBatchWindow, 1}} {
			data = protowire.AppendVarint(protowire.AppendTag(data, f.num, protowire.VarintType), f.v)
		}
		if tc.notice != "" {
			data = protowire.AppendString(protowire.AppendTag(data, wire.FieldBatchNotice, protowire.BytesType), tc.notice)
		}
		_, err := parseInsertBatch(data, &limits)
		if !errors.Is(err, protocol.ErrInvalidMessage) || !strings.Contains(err.Error(), tc.why) || !strings.Contains(err.Error(), "UTF-8") {
			t.Errorf("%s %q: %v, want protocol.ErrInvalidMessage saying it is not UTF-8", tc.why, tc.producer+tc.notice, err)
		}
		if to, _, tomb := refusedBatch(data, &limits); to != (noticeTo{}) || tomb != nil {
			t.Errorf("%s %q: the refused message is told to %+v, tombstone %v; want neither", tc.why, tc.producer+tc.notice, to, tomb)
		}
	}
}

// FuzzParseInsertBatch: arbitrary bytes never panic the parser, and whatever
// it accepts has a producer id and chunks with consistent headers.
func FuzzParseInsertBatch(f *testing.F) {
	c := encodedChunk(f, 9)
	for _, m := range []*wire.InsertBatch{
		{ProducerId: "p", Sequence: 1, WindowStart: 1, Window: 4, Chunks: []*wire.Chunk{c}, Items: []*wire.Item{{Key: 1, Table: "t"}}},
		{ProducerId: "p", Sequence: 3, WindowStart: 2, Window: 2, ReleaseChunkKeys: []uint64{1, 2}, EndOfStream: true},
		{ProducerId: "p", Sequence: 2, WindowStart: 1, Window: 4, Items: []*wire.Item{
			{Key: 7, Table: "t", Priority: 0.5, PolicyVersion: -3, Columns: []*wire.TrajectoryColumn{
				{Name: "obs", Slices: []*wire.ColumnSlice{{ChunkKey: 9, Offset: 1, Length: 2}, {ChunkKey: 10, Length: 1}}},
				{Name: "a", Squeeze: true, Slices: []*wire.ColumnSlice{{ChunkKey: 9, Length: 1}}},
			}},
			{Key: 8, Table: "u", Columns: []*wire.TrajectoryColumn{{Name: "obs"}}},
			{Key: 9, Table: "t", Priority: math.NaN()},
		}},
	} {
		data, _ := proto.Marshal(m)
		f.Add(data)
	}
	f.Add([]byte{0x1a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	limits := DefaultLimits()
	limits.MaxChunksPerMessage, limits.MaxItemsPerMessage = 8, 8
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := parseInsertBatch(data, &limits)
		if err != nil {
			if !errors.Is(err, protocol.ErrInvalidMessage) && !errors.Is(err, protocol.ErrResourceExhausted) {
				t.Fatalf("error %v matches neither protocol.ErrInvalidMessage nor protocol.ErrResourceExhausted", err)
			}
			return
		}
		if b.producerID == "" || b.sequence < b.windowStart || b.sequence-b.windowStart >= b.window {
			t.Fatalf("accepted a batch without a producer id or outside its window: %+v", b)
		}
		// Checkpoints keep both as protobuf strings.
		if !utf8.ValidString(b.producerID) || !utf8.ValidString(b.notice) {
			t.Fatalf("accepted a producer id %q or notice subject %q that is not UTF-8", b.producerID, b.notice)
		}
		var ref wire.InsertBatch
		if proto.Unmarshal(data, &ref) == nil {
			if len(ref.Items) != len(b.items) {
				t.Fatalf("read %d items, proto.Unmarshal %d", len(b.items), len(ref.Items))
			}
			for i, w := range ref.Items {
				got, want := b.items[i], referenceItem(w, &limits)
				// Priorities bit for bit (a hostile one may be NaN), the
				// rest as values.
				samePriority := math.Float64bits(got.item.Priority) == math.Float64bits(want.item.Priority)
				got.item.Priority, want.item.Priority = 0, 0
				if !samePriority || !reflect.DeepEqual(got.item, want.item) || got.table != want.table || (got.err == nil) != (want.err == nil) {
					t.Fatalf("item %d read as %+v, proto.Unmarshal gives %+v", i, b.items[i], referenceItem(w, &limits))
				}
			}
		}
		for _, rc := range b.chunks {
			if rc.err == nil && (rc.chunk.Key == 0 || rc.chunk.Length < 1) {
				t.Fatalf("accepted chunk header %+v", rc.chunk)
			}
			if rc.err == nil {
				// Accepted chunks decode, so no learner ever gets one that
				// does not.
				wc, err := wire.ReadChunk(rc.chunk.Data)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := wire.DecodeChunk(wc); err != nil {
					t.Fatalf("accepted chunk %d does not decode: %v", rc.key, err)
				}
				// Its format locates the steps of an uncompressed chunk,
				// those the reader finds, and only those of one.
				f := rc.chunk.Format
				located := wc.Compression == wire.Compression_COMPRESSION_NONE && len(wc.Data) > 0
				switch {
				case located != (f.DataAt > 0):
					t.Fatalf("chunk %d (%v, %d bytes of data) has DataAt %d", rc.key, wc.Compression, len(wc.Data), f.DataAt)
				case located:
					end := int64(f.DataAt) + int64(rc.chunk.Length)*f.StepBytes
					if end > int64(len(rc.chunk.Data)) || !bytes.Equal(rc.chunk.Data[f.DataAt:end], wc.Data) || f.Delta != wc.DeltaEncoded {
						t.Fatalf("chunk %d: format %+v does not locate its %d bytes of steps", rc.key, f, len(wc.Data))
					}
				}
			}
		}
	})
}

// referenceItem is an item as the generated code reads it, in the table's
// form, with the limits applied.
func referenceItem(w *wire.Item, l *Limits) preparedItem {
	p := preparedItem{table: w.Table}
	n := 0
	for _, c := range w.Columns {
		n += len(c.Slices)
	}
	if len(w.Columns) > l.MaxColumnsPerItem || n > l.MaxSlicesPerItem {
		p.err = protocol.ErrResourceExhausted
		return p
	}
	p.item = tables.Item{Key: w.Key, Priority: w.Priority, PolicyVersion: w.PolicyVersion, Trajectory: wire.ToTableColumns(w.Columns)}
	return p
}

// TestParseItemsOverLimits: the items of a message share arrays for their
// columns and slices; an item over a limit is rejected and gives back what
// it took, and the items around it keep exactly their own trajectories.
func TestParseItemsOverLimits(t *testing.T) {
	col := func(name string, keys ...uint64) *wire.TrajectoryColumn {
		c := &wire.TrajectoryColumn{Name: name}
		for _, k := range keys {
			c.Slices = append(c.Slices, &wire.ColumnSlice{ChunkKey: k, Offset: int32(k % 3), Length: 1})
		}
		return c
	}
	in := &wire.InsertBatch{ProducerId: "p", Sequence: 1, WindowStart: 1, Window: 1, Items: []*wire.Item{
		{Key: 1, Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{col("a", 10)}},
		{Key: 2, Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{col("a", 20), col("b", 21), col("c", 22)}}, // 3 columns
		{Key: 3, Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{col("a", 30, 31), col("b", 32)}},
		{Key: 4, Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{col("a", 40, 41, 42, 43)}}, // 4 slices
		{Key: 5, Table: "t", Priority: 1, Columns: []*wire.TrajectoryColumn{col("a", 50), col("b")}},
	}}
	data := mustMarshal(t, in)
	limits := DefaultLimits()
	limits.MaxColumnsPerItem, limits.MaxSlicesPerItem = 2, 3
	b, err := parseInsertBatch(data, &limits)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range in.Items {
		got := b.items[i]
		over := w.Key == 2 || w.Key == 4
		if over {
			if !errors.Is(got.err, protocol.ErrResourceExhausted) || got.item.Trajectory != nil {
				t.Errorf("item %d over a limit: err %v, trajectory %v; want ErrResourceExhausted and none", w.Key, got.err, got.item.Trajectory)
			}
			continue
		}
		if want := wire.ToTableColumns(w.Columns); got.err != nil || !reflect.DeepEqual(got.item.Trajectory, want) {
			t.Errorf("item %d: %v, %+v; want %+v", w.Key, got.err, got.item.Trajectory, want)
		}
	}
	// Growing one item's slices must not write into another's.
	first := b.items[0].item.Trajectory
	first[0].Slices = append(first[0].Slices, tables.Slice{Chunk: 99})
	_ = append(b.items[0].item.Trajectory, tables.Column{Name: "z"})
	if got := b.items[2].item.Trajectory; got[0].Slices[0].Chunk != 30 || got[0].Name != "a" {
		t.Errorf("item 3 changed when item 1 grew: %+v", got)
	}
}

// TestRefusedBatchKeepsItsPlaceAndReleases: what the service keeps of a
// message it refuses whole (here, over max_items_per_message): where the
// rejection goes, and a tombstone with its place in the producer's
// sequence, its chunk releases and its end; nothing when the message does
// not name its producer, and no tombstone when its sequence is unsound.
func TestRefusedBatchKeepsItsPlaceAndReleases(t *testing.T) {
	limits := DefaultLimits()
	limits.MaxItemsPerMessage = 1
	items := []*wire.Item{{Key: 1, Table: "t", Priority: 1}, {Key: 2, Table: "t", Priority: 1}}
	m := &wire.InsertBatch{ProducerId: "p", Sequence: 3, WindowStart: 2, Window: 4, NoticeSubject: "_INBOX.x",
		Items: items, ReleaseChunkKeys: []uint64{11, 12}, EndOfStream: true}
	data := mustMarshal(t, m)
	if _, err := parseInsertBatch(data, &limits); !errors.Is(err, protocol.ErrResourceExhausted) {
		t.Fatalf("parse: %v, want the message refused whole", err)
	}
	to, seq, tomb := refusedBatch(data, &limits)
	if to != (noticeTo{"p", "_INBOX.x"}) || seq != 3 || tomb == nil {
		t.Fatalf("refusedBatch = %+v, %d, %v; want the producer told of message 3, and a tombstone", to, seq, tomb)
	}
	if tomb.sequence != 3 || tomb.windowStart != 2 || tomb.window != 4 || !slices.Equal(tomb.release, []uint64{11, 12}) || !tomb.end || len(tomb.items)+len(tomb.chunks) != 0 {
		t.Errorf("tombstone %+v: want sequence 3 in window [2, 2+4), releases [11 12], the end, and nothing else", tomb)
	}
	m.Window = 1 // sequence 3 lies outside [2, 2+1)
	if to, _, tomb := refusedBatch(mustMarshal(t, m), &limits); to.producer != "p" || tomb != nil {
		t.Errorf("unsound sequence: told %+v, tombstone %v; want the producer told, no tombstone", to, tomb)
	}
	m.ProducerId = ""
	if to, _, tomb := refusedBatch(mustMarshal(t, m), &limits); to != (noticeTo{}) || tomb != nil {
		t.Errorf("no producer: told %+v, tombstone %v; want neither", to, tomb)
	}
}
