package wire

import "google.golang.org/protobuf/encoding/protowire"

// BatchBuilder encodes an InsertBatch as a producer fills it: each chunk
// and item is sized and encoded once, when added, and the chunks are
// copied once, into the buffer that becomes the message. Finish writes the
// fields known only at send time around them. The bytes are those
// proto.Marshal writes for the same message (fields in number order), so
// that the golden vectors hold for both.
//
// The producer id and sequence (fields 1 and 2) precede the chunks: the
// buffer starts with room for them, filled from its end by Finish.
type BatchBuilder struct {
	producerID string
	room       int    // bytes reserved for fields 1 and 2
	chunks     []byte // room, then the encoded chunks (field 3)
	items      []byte // the encoded items (field 4)
	n          int
}

// BatchMark is where a BatchBuilder stood, for Undo.
type BatchMark struct{ chunks, items, n int }

// NewBatchBuilder starts an empty message of producerID, in a buffer of
// sizeHint bytes: a producer's messages are alike, so the size of its last
// one saves growing (and copying) the buffer as the chunks come.
func NewBatchBuilder(producerID string, sizeHint int) *BatchBuilder {
	room := 1 + protowire.SizeBytes(len(producerID)) + 1 + protowire.SizeVarint(^uint64(0))
	return &BatchBuilder{producerID: producerID, room: room, chunks: make([]byte, room, room+max(sizeHint, 4096))}
}

// Reset starts the next message of the same producer in buf: the buffer of
// an earlier message that nothing reads any more, or nil for a new buffer
// of sizeHint bytes. A producer that recycles its messages this way
// allocates (and the runtime zeroes) no message buffer in steady state.
func (b *BatchBuilder) Reset(buf []byte, sizeHint int) {
	if cap(buf) < b.room+sizeHint/2 {
		buf = make([]byte, 0, b.room+max(sizeHint, 4096))
	}
	b.chunks, b.items, b.n = buf[:b.room], b.items[:0], 0
}

// Mark is the builder's state now.
func (b *BatchBuilder) Mark() BatchMark {
	return BatchMark{len(b.chunks), len(b.items), b.n}
}

// Undo drops what was added since m.
func (b *BatchBuilder) Undo(m BatchMark) {
	b.chunks, b.items, b.n = b.chunks[:m.chunks], b.items[:m.items], m.n
}

// AddChunk appends a chunk.
func (b *BatchBuilder) AddChunk(c *Chunk) {
	b.chunks = appendTag(b.chunks, FieldBatchChunks, protowire.BytesType)
	b.chunks = appendVarint(b.chunks, uint64(chunkSize(c)))
	b.chunks = appendChunk(b.chunks, c)
}

// AddItem appends an item.
func (b *BatchBuilder) AddItem(it *Item) {
	b.items = appendTag(b.items, FieldBatchItems, protowire.BytesType)
	b.items = appendVarint(b.items, uint64(itemSize(it)))
	b.items = appendItem(b.items, it)
	b.n++
}

// Items is the number of items added.
func (b *BatchBuilder) Items() int { return b.n }

// Size is the encoded size of the chunks and items added.
func (b *BatchBuilder) Size() int { return len(b.chunks) - b.room + len(b.items) }

// Finish returns the encoded message with the given remaining fields. The
// message shares the builder's buffer: the builder must not be used again
// until Reset gives it another.
func (b *BatchBuilder) Finish(sequence uint64, release []uint64, end bool, windowStart uint64, window uint32, notice string) []byte {
	var headBuf [64]byte
	head := headBuf[:0]
	if b.producerID != "" {
		head = appendTag(head, FieldBatchProducer, protowire.BytesType)
		head = appendString(head, b.producerID)
	}
	if sequence != 0 {
		head = appendTag(head, FieldBatchSequence, protowire.VarintType)
		head = appendVarint(head, sequence)
	}
	start := b.room - len(head)
	copy(b.chunks[start:], head)
	out := append(b.chunks[start:], b.items...)
	if len(release) > 0 {
		packed := 0
		for _, k := range release {
			packed += protowire.SizeVarint(k)
		}
		out = appendTag(out, FieldBatchRelease, protowire.BytesType)
		out = appendVarint(out, uint64(packed))
		for _, k := range release {
			out = appendVarint(out, k)
		}
	}
	if end {
		out = appendTag(out, FieldBatchEnd, protowire.VarintType)
		out = appendVarint(out, 1)
	}
	if windowStart != 0 {
		out = appendTag(out, FieldBatchWinStart, protowire.VarintType)
		out = appendVarint(out, windowStart)
	}
	if window != 0 {
		out = appendTag(out, FieldBatchWindow, protowire.VarintType)
		out = appendVarint(out, uint64(window))
	}
	if notice != "" {
		out = appendTag(out, FieldBatchNotice, protowire.BytesType)
		out = appendString(out, notice)
	}
	return out
}

// The encoders below write a Chunk and an Item as proto.Marshal does:
// fields in number order, proto3 zero values left out (a priority of -0 is
// not zero to proto3 and is written), packed step shapes. Every field
// number here is below 16, so each tag is one byte (as for the helpers
// they share with sample.go). Encoding by hand skips protobuf's
// reflection, a tenth of a producer's CPU per item in profiles.

func bytesField(n int) int {
	if n == 0 {
		return 0
	}
	return 1 + protowire.SizeBytes(n)
}

func boolField(v bool) int {
	if v {
		return 2
	}
	return 0
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return appendString(appendTag(b, num, protowire.BytesType), s)
}

func appendBoolField(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return append(appendTag(b, num, protowire.VarintType), 1)
}

// appendSubmessage writes a message field whose size is known.
func appendSubmessage(b []byte, num protowire.Number, size int) []byte {
	return appendVarint(appendTag(b, num, protowire.BytesType), uint64(size))
}

func packedSize(vs []int64) int {
	n := 0
	for _, v := range vs {
		n += protowire.SizeVarint(uint64(v))
	}
	return n
}

func chunkSize(c *Chunk) int {
	return varintField(c.Key) + bytesField(len(c.Dtype)) + bytesField(packedSize(c.StepShape)) +
		varintField(uint64(int64(c.Length))) + varintField(uint64(int64(c.Compression))) + boolField(c.DeltaEncoded) +
		varintField(c.RawSize) + bytesField(len(c.Data)) + varintField(c.EpisodeId) + varintField(uint64(c.EpisodeStep))
}

func appendChunk(b []byte, c *Chunk) []byte {
	b = appendVarintField(b, FieldChunkKey, c.Key)
	b = appendStringField(b, FieldChunkDtype, c.Dtype)
	if len(c.StepShape) > 0 {
		b = appendSubmessage(b, FieldChunkStepShape, packedSize(c.StepShape))
		for _, d := range c.StepShape {
			b = appendVarint(b, uint64(d))
		}
	}
	b = appendVarintField(b, FieldChunkLength, uint64(int64(c.Length)))
	b = appendVarintField(b, FieldChunkCompression, uint64(int64(c.Compression)))
	b = appendBoolField(b, FieldChunkDelta, c.DeltaEncoded)
	b = appendVarintField(b, FieldChunkRawSize, c.RawSize)
	if len(c.Data) > 0 {
		b = appendBytes(appendTag(b, FieldChunkData, protowire.BytesType), c.Data)
	}
	b = appendVarintField(b, FieldChunkEpisode, c.EpisodeId)
	return appendVarintField(b, FieldChunkEpisodeStep, uint64(c.EpisodeStep))
}

func sliceSize(s *ColumnSlice) int {
	return varintField(s.GetChunkKey()) + varintField(uint64(int64(s.GetOffset()))) + varintField(uint64(int64(s.GetLength())))
}

func columnSize(c *TrajectoryColumn) int {
	n := bytesField(len(c.GetName())) + boolField(c.GetSqueeze())
	for _, s := range c.GetSlices() {
		n += 1 + protowire.SizeBytes(sliceSize(s))
	}
	return n
}

func itemSize(it *Item) int {
	n := varintField(it.Key) + bytesField(len(it.Table)) + doubleField(it.Priority) + varintField(uint64(it.PolicyVersion))
	for _, c := range it.Columns {
		n += 1 + protowire.SizeBytes(columnSize(c))
	}
	return n
}

func appendItem(b []byte, it *Item) []byte {
	b = appendVarintField(b, FieldItemKey, it.Key)
	b = appendStringField(b, FieldItemTable, it.Table)
	b = appendDoubleField(b, FieldItemPriority, it.Priority)
	for _, c := range it.Columns {
		b = appendSubmessage(b, FieldItemColumns, columnSize(c))
		b = appendStringField(b, FieldColumnName, c.GetName())
		for _, s := range c.GetSlices() {
			b = appendSubmessage(b, FieldColumnSlices, sliceSize(s))
			b = appendVarintField(b, FieldSliceChunk, s.GetChunkKey())
			b = appendVarintField(b, FieldSliceOffset, uint64(int64(s.GetOffset())))
			b = appendVarintField(b, FieldSliceLength, uint64(int64(s.GetLength())))
		}
		b = appendBoolField(b, FieldColumnSqueeze, c.GetSqueeze())
	}
	return appendVarintField(b, FieldItemPolicyVersion, uint64(it.PolicyVersion))
}
