package wire

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

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

// Mark is the builder's state now.
func (b *BatchBuilder) Mark() BatchMark {
	return BatchMark{len(b.chunks), len(b.items), b.n}
}

// Undo drops what was added since m.
func (b *BatchBuilder) Undo(m BatchMark) {
	b.chunks, b.items, b.n = b.chunks[:m.chunks], b.items[:m.items], m.n
}

// AddChunk appends a chunk.
func (b *BatchBuilder) AddChunk(c *Chunk) { b.chunks = appendMessage(b.chunks, FieldBatchChunks, c) }

// AddItem appends an item.
func (b *BatchBuilder) AddItem(it *Item) {
	b.items = appendMessage(b.items, FieldBatchItems, it)
	b.n++
}

// Items is the number of items added.
func (b *BatchBuilder) Items() int { return b.n }

// Size is the encoded size of the chunks and items added.
func (b *BatchBuilder) Size() int { return len(b.chunks) - b.room + len(b.items) }

func appendMessage(buf []byte, num protowire.Number, m proto.Message) []byte {
	size := proto.Size(m)
	buf = protowire.AppendTag(buf, num, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(size))
	// Size cached the sizes of m's parts: encoding does not take them again.
	buf, _ = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(buf, m)
	return buf
}

// Finish returns the encoded message with the given remaining fields. The
// builder must not be used afterwards: the message shares its buffer.
func (b *BatchBuilder) Finish(sequence uint64, release []uint64, end bool, windowStart uint64, window uint32, notice string) []byte {
	head := make([]byte, 0, b.room)
	if b.producerID != "" {
		head = protowire.AppendTag(head, FieldBatchProducer, protowire.BytesType)
		head = protowire.AppendString(head, b.producerID)
	}
	if sequence != 0 {
		head = protowire.AppendTag(head, FieldBatchSequence, protowire.VarintType)
		head = protowire.AppendVarint(head, sequence)
	}
	start := b.room - len(head)
	copy(b.chunks[start:], head)
	out := append(b.chunks[start:], b.items...)
	if len(release) > 0 {
		packed := 0
		for _, k := range release {
			packed += protowire.SizeVarint(k)
		}
		out = protowire.AppendTag(out, FieldBatchRelease, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(packed))
		for _, k := range release {
			out = protowire.AppendVarint(out, k)
		}
	}
	if end {
		out = protowire.AppendTag(out, FieldBatchEnd, protowire.VarintType)
		out = protowire.AppendVarint(out, 1)
	}
	if windowStart != 0 {
		out = protowire.AppendTag(out, FieldBatchWinStart, protowire.VarintType)
		out = protowire.AppendVarint(out, windowStart)
	}
	if window != 0 {
		out = protowire.AppendTag(out, FieldBatchWindow, protowire.VarintType)
		out = protowire.AppendVarint(out, uint64(window))
	}
	if notice != "" {
		out = protowire.AppendTag(out, FieldBatchNotice, protowire.BytesType)
		out = protowire.AppendString(out, notice)
	}
	return out
}
