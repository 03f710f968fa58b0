package service

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// insertBatch is an InsertBatch whose chunks are kept as the exact bytes
// they arrived in. The chunk store holds those bytes and sample responses
// send them on as they are: a chunk is neither copied nor re-encoded on its
// way from actor to learner.
type insertBatch struct {
	producerID  string
	sequence    uint64
	windowStart uint64
	window      uint64
	chunks      []rawChunk
	items       []preparedItem
	release     []uint64
	end         bool
	notice      string // where rejections go; empty for none

	storedAt  time.Time // when the stream stored it
	appliedAt time.Time // when applyBatch last took it up
	streamSeq uint64
	raw       []byte // the message as published, for checkpoints
	done      int    // items already applied
}

// toTombstone drops the message's chunks and items, keeping its place in
// its producer's sequence and its chunk releases; raw becomes the encoding
// of what is left, so that checkpoints carry the tombstone.
func (b *insertBatch) toTombstone() {
	b.chunks, b.items, b.done = nil, nil, 0
	b.raw, _ = proto.Marshal(&wire.InsertBatch{
		ProducerId: b.producerID, Sequence: b.sequence, WindowStart: b.windowStart, Window: uint32(b.window),
		ReleaseChunkKeys: b.release, EndOfStream: b.end, NoticeSubject: b.notice,
	})
}

// rawChunk is a chunk of an insert message; it holds the chunk by value,
// which the store copies, so that a message's chunks cost one allocation.
type rawChunk struct {
	chunk tables.Chunk // valid when err is nil
	key   uint64
	err   error
	// compressed marks a chunk whose data parse could not check by its size
	// alone: checkDecodes decompresses it.
	compressed bool
}

// preparedItem is an item of an insert message as the table takes it, or
// why it cannot be taken.
type preparedItem struct {
	table string
	item  tables.Item
	err   error // an item-level rejection: over a limit
}

// parseInsertBatch reads an insert message and checks everything about it
// that does not depend on the service's state: its limits, its window, and
// that every chunk decodes to its declared size (so that no learner ever
// receives one that does not). It is the costly part of an insert, and runs
// on the service's prepare workers, off the apply loop. A message that fails
// as a whole returns an error; a bad chunk or item is marked for rejection
// on its own.
func parseInsertBatch(b []byte, l *Limits) (*insertBatch, error) {
	var chunks chunkParser
	out, err := readInsertBatch(b, l, &chunks)
	if err != nil {
		return nil, err
	}
	for i := range out.chunks {
		rc := &out.chunks[i]
		if rc.err == nil {
			rc.err = chunks.checkDecodes(&rc.chunk, rc.compressed, l.MaxChunkBytes)
		}
		if rc.err != nil {
			rc.chunk = tables.Chunk{}
		}
	}
	return out, nil
}

func readInsertBatch(b []byte, l *Limits, chunks *chunkParser) (*insertBatch, error) {
	// Sized once: growing them took a quarter of the time spent reading a
	// message of 64 items.
	nchunks, nitems := wire.CountMessages(b, wire.FieldBatchChunks, wire.FieldBatchItems)
	out := &insertBatch{
		chunks: make([]rawChunk, 0, min(nchunks, l.MaxChunksPerMessage)),
		items:  make([]preparedItem, 0, min(nitems, l.MaxItemsPerMessage)),
	}
	items := newItemReader(cap(out.items))
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("%w: insert batch: %v", protocol.ErrInvalidMessage, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == wire.FieldBatchProducer && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch producer id: %v", protocol.ErrInvalidMessage, protowire.ParseError(n))
			}
			out.producerID, b = string(v), b[n:]
		case num == wire.FieldBatchSequence && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch sequence: %v", protocol.ErrInvalidMessage, protowire.ParseError(n))
			}
			out.sequence, b = v, b[n:]
		case num == wire.FieldBatchChunks && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch chunk %d: %v", protocol.ErrInvalidMessage, len(out.chunks), protowire.ParseError(n))
			}
			if len(out.chunks) == l.MaxChunksPerMessage {
				return nil, fmt.Errorf("%w: insert batch has more than %d chunks (limits.max_chunks_per_message)", protocol.ErrResourceExhausted, l.MaxChunksPerMessage)
			}
			c, compressed, err := chunks.parse(v)
			if err == nil && len(v) <= copiedChunkBytes {
				c.Data = bytes.Clone(v)
			}
			out.chunks, b = append(out.chunks, rawChunk{chunk: c, key: c.Key, err: err, compressed: compressed}), b[n:]
		case num == wire.FieldBatchItems && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch item %d: %v", protocol.ErrInvalidMessage, len(out.items), protowire.ParseError(n))
			}
			if len(out.items) == l.MaxItemsPerMessage {
				return nil, fmt.Errorf("%w: insert batch has more than %d items (limits.max_items_per_message)", protocol.ErrResourceExhausted, l.MaxItemsPerMessage)
			}
			item, err := items.readItem(v, l)
			if err != nil {
				return nil, fmt.Errorf("%w: insert batch item %d: %v", protocol.ErrInvalidMessage, len(out.items), err)
			}
			out.items, b = append(out.items, item), b[n:]
		case num == wire.FieldBatchNotice && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch notice subject: %v", protocol.ErrInvalidMessage, protowire.ParseError(n))
			}
			out.notice, b = string(v), b[n:]
		case num == wire.FieldBatchRelease:
			var err error
			if out.release, b, err = wire.ConsumeUint64s(b, typ, out.release); err != nil {
				return nil, fmt.Errorf("%w: insert batch release keys: %v", protocol.ErrInvalidMessage, err)
			}
		case num == wire.FieldBatchEnd && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch end flag: %v", protocol.ErrInvalidMessage, protowire.ParseError(n))
			}
			out.end, b = v != 0, b[n:]
		case (num == wire.FieldBatchWinStart || num == wire.FieldBatchWindow) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch window: %v", protocol.ErrInvalidMessage, protowire.ParseError(n))
			}
			if num == wire.FieldBatchWinStart {
				out.windowStart = v
			} else {
				out.window = v
			}
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch field %d: %v", protocol.ErrInvalidMessage, num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	if err := checkSender(out); err != nil {
		return nil, err
	}
	if err := checkSequence(out, l); err != nil {
		return nil, err
	}
	return out, nil
}

// checkSender checks what names an insert message's producer: its id and
// where its rejections go.
func checkSender(b *insertBatch) error {
	if b.producerID == "" || len(b.producerID) > maxProducerIDLen {
		return fmt.Errorf("%w: insert batch producer id of %d bytes (want 1 to %d)", protocol.ErrInvalidMessage, len(b.producerID), maxProducerIDLen)
	}
	// Both are kept in checkpoints as protobuf strings, which must be
	// UTF-8: one that is not made every checkpoint fail to encode.
	if !utf8.ValidString(b.producerID) {
		return fmt.Errorf("%w: insert batch producer id %.64q is not UTF-8", protocol.ErrInvalidMessage, b.producerID)
	}
	return checkNoticeSubject("insert batch", b.notice)
}

// checkSequence checks an insert message's place in its producer's
// sequence. A producer never has more than window messages unsettled, so
// its sequence lies in [window_start, window_start+window); a sequence
// outside is forged or corrupt, and must not make the service wait.
func checkSequence(b *insertBatch, l *Limits) error {
	switch {
	case b.sequence == 0:
		return fmt.Errorf("%w: insert batch sequence 0 (producers number their messages from 1)", protocol.ErrInvalidMessage)
	case b.window == 0 || b.window > uint64(l.MaxProducerWindow):
		return fmt.Errorf("%w: insert batch window %d (want 1 to %d, limits.max_producer_window; the producer's WithMaxInFlight)", protocol.ErrInvalidMessage, b.window, l.MaxProducerWindow)
	case b.windowStart == 0 || b.sequence < b.windowStart || b.sequence-b.windowStart >= b.window:
		return fmt.Errorf("%w: insert batch sequence %d outside its window [%d, %d+%d)", protocol.ErrInvalidMessage, b.sequence, b.windowStart, b.windowStart, b.window)
	}
	return nil
}

// refusedBatch reads what an insert message that the service refuses whole
// says of its producer, skipping the rest: where the rejection goes, and,
// when its place in the producer's sequence is sound, a tombstone that
// keeps that place and the message's chunk releases and end, so that the
// producer's later messages apply in order without waiting for this one
// and the chunks it let go of are not held for it. Unless told, a producer whose messages
// exceed the service's limits (more items than max_items_per_message, a
// larger window than max_producer_window) would see the service's
// progress pass them and take them for applied.
func refusedBatch(b []byte, l *Limits) (to noticeTo, sequence uint64, tomb *insertBatch) {
	var h insertBatch
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if num == wire.FieldBatchRelease {
			var err error
			if h.release, b, err = wire.ConsumeUint64s(b, typ, h.release); err != nil {
				break
			}
			continue
		}
		var v uint64
		var bs []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			bs, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			break
		}
		b = b[n:]
		switch {
		case num == wire.FieldBatchProducer && typ == protowire.BytesType:
			h.producerID = string(bs)
		case num == wire.FieldBatchNotice && typ == protowire.BytesType:
			h.notice = string(bs)
		case num == wire.FieldBatchSequence && typ == protowire.VarintType:
			h.sequence = v
		case num == wire.FieldBatchWinStart && typ == protowire.VarintType:
			h.windowStart = v
		case num == wire.FieldBatchWindow && typ == protowire.VarintType:
			h.window = v
		case num == wire.FieldBatchEnd && typ == protowire.VarintType:
			h.end = v != 0
		}
	}
	if checkSender(&h) != nil {
		return noticeTo{}, 0, nil
	}
	to = noticeTo{h.producerID, h.notice}
	if checkSequence(&h, l) != nil {
		return to, h.sequence, nil
	}
	h.toTombstone()
	return to, h.sequence, &h
}

// maxProducerIDLen bounds a producer id (ours are 32 hex digits).
const maxProducerIDLen = 128

// maxNoticeSubjectLen bounds a notice subject (ours are an inbox: the
// prefix, a dot and 22 characters).
const maxNoticeSubjectLen = 256

// checkNoticeSubject accepts an empty subject (no notices) or a literal one
// the service may publish to: dot-separated tokens of printable characters
// without wildcards, and none that answerSubjectError refuses.
func checkNoticeSubject(of, s string) error {
	if s == "" {
		return nil
	}
	bad := func(why string) error {
		return fmt.Errorf("%w: %s notice subject %.64q: %s", protocol.ErrInvalidMessage, of, s, why)
	}
	if len(s) > maxNoticeSubjectLen {
		return bad(fmt.Sprintf("%d bytes, over %d", len(s), maxNoticeSubjectLen))
	}
	if !utf8.ValidString(s) {
		return bad("not UTF-8")
	}
	if why := cmp.Or(answerSubjectError(s), literalSubjectError(s)); why != "" {
		return bad(why)
	}
	return nil
}

// literalSubjectError says why subject is not one literal subject, or
// returns "". Published on a wildcard, an answer reaches every
// subscription it matches, a stream's of another prefix among them.
func literalSubjectError(subject string) string {
	for tok := range strings.SplitSeq(subject, ".") {
		switch {
		case tok == "":
			return "empty token"
		case tok == "*" || tok == ">":
			return "wildcard (want a literal subject)"
		}
		for _, r := range tok {
			if r <= ' ' || r == 0x7f {
				return "whitespace or control character"
			}
		}
	}
	return ""
}

// answerSubjectError says why the service must not publish a client's
// answer (a reply, a rejection notice) on subject, a subject the client
// chose, or returns "". NATS checks what a client may publish on the
// subject it sends to, never on the reply subject it names, and the
// service may publish where clients may not: its stream's reset subject
// and its progress; with a service user that shards share, every shard's;
// and JetStream's API and the buckets of the lease and the checkpoints.
// An answer there would be taken for the service's own message: an info
// reply on a reset subject decodes as a reset of every table. Clients
// answer to inboxes, whose last token is random or a call's number in
// hex, and never has a Reprise subject's shape.
func answerSubjectError(subject string) string {
	if strings.HasPrefix(subject, "$") {
		return "a $ subject is the server's"
	}
	for _, suffix := range reprisePaths {
		if strings.HasSuffix(subject, suffix) {
			return "the shape of a Reprise subject, not of an inbox"
		}
	}
	return ""
}

// reprisePaths are what follows the prefix in every subject of a prefix
// that the service, or a client, publishes to.
var reprisePaths = func() []string {
	s := protocol.Subjects{Prefix: "p"}
	var out []string
	for _, subject := range []string{s.Insert(), s.Mutate(), s.Reset(), s.Applied(), s.Sample(), s.Info(), s.ResetAPI(), s.Checkpoint(), s.Items(), s.Standby()} {
		out = append(out, strings.TrimPrefix(subject, s.Prefix))
	}
	return out
}()

// readItem reads an encoded Item into the table's form, or marks it for
// rejection when it is over a limit; an item that is not a valid Item is an
// error. It reads what proto.Unmarshal would (a field of an unexpected wire
// type is skipped as unknown; strings must be UTF-8), without the generated
// structs, in one pass. Its columns and slices go into arrays r keeps for
// the whole message, which nothing writes once the message is read: a
// table keeps none of an item's trajectory, and an item its rate limiter
// holds keeps its message's arrays only until it is inserted. Item-level
// checks that need the chunks (they may have come in earlier messages)
// happen at apply.
func (r *itemReader) readItem(b []byte, l *Limits) (preparedItem, error) {
	var p preparedItem
	firstColumn, firstSlice := len(r.columns), len(r.slices)
	var columns, nslices int
	for len(b) > 0 {
		num, typ, v, field, n := wire.ConsumeField(b)
		if n < 0 {
			return p, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			p.item.Key = v
		case num == 2 && typ == protowire.BytesType:
			name, err := r.names.get(field)
			if err != nil {
				return p, err
			}
			p.table = name
		case num == 3 && typ == protowire.Fixed64Type:
			p.item.Priority = math.Float64frombits(v)
		case num == 5 && typ == protowire.VarintType:
			p.item.PolicyVersion = int64(v)
		case num == 4 && typ == protowire.BytesType:
			col, err := r.readColumn(field, &nslices, l.MaxSlicesPerItem)
			if err != nil {
				return p, err
			}
			// Past a limit the item is only checked, not kept.
			if columns < l.MaxColumnsPerItem {
				r.columns = append(r.columns, col)
			}
			columns++
		}
	}
	switch {
	case columns > l.MaxColumnsPerItem:
		p.err = fmt.Errorf("%w: item %d has %d columns, over the limit of %d (limits.max_columns_per_item)", protocol.ErrResourceExhausted, p.item.Key, columns, l.MaxColumnsPerItem)
	case nslices > l.MaxSlicesPerItem:
		p.err = fmt.Errorf("%w: item %d has %d slices, over the limit of %d (limits.max_slices_per_item)", protocol.ErrResourceExhausted, p.item.Key, nslices, l.MaxSlicesPerItem)
	}
	if p.err != nil {
		clear(r.columns[firstColumn:])
		r.columns, r.slices = r.columns[:firstColumn], r.slices[:firstSlice]
		return p, nil
	}
	p.item.Trajectory = r.columns[firstColumn:len(r.columns):len(r.columns)]
	return p, nil
}

// itemReader reads the items of one message: the names they share, and
// the arrays their columns and slices are read into.
type itemReader struct {
	names   nameCache
	columns []tables.Column
	slices  []tables.Slice
}

// newItemReader returns a reader for a message of n items, its arrays
// sized for items of one column of one slice.
func newItemReader(n int) itemReader {
	return itemReader{columns: make([]tables.Column, 0, n), slices: make([]tables.Slice, 0, n)}
}

// readColumn reads a TrajectoryColumn, its slices counted in nslices and
// appended to r.slices while there are at most maxSlices.
func (r *itemReader) readColumn(b []byte, nslices *int, maxSlices int) (tables.Column, error) {
	var col tables.Column
	from := len(r.slices)
	for len(b) > 0 {
		num, typ, v, field, n := wire.ConsumeField(b)
		if n < 0 {
			return col, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			name, err := r.names.get(field)
			if err != nil {
				return col, err
			}
			col.Name = name
		case num == 2 && typ == protowire.BytesType:
			sl, err := readSlice(field)
			if err != nil {
				return col, err
			}
			if *nslices < maxSlices {
				r.slices = append(r.slices, sl)
			}
			*nslices++
		case num == 3 && typ == protowire.VarintType:
			col.Squeeze = v != 0
		}
	}
	// A slice of the array as it is now: should a later append move the
	// array, this column keeps the old one, which nothing writes again.
	col.Slices = r.slices[from:len(r.slices):len(r.slices)]
	return col, nil
}

// readSlice reads a ColumnSlice.
func readSlice(b []byte) (tables.Slice, error) {
	var sl tables.Slice
	for len(b) > 0 {
		num, typ, v, _, n := wire.ConsumeField(b)
		if n < 0 {
			return sl, protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.VarintType {
			continue
		}
		switch num {
		case 1:
			sl.Chunk = v
		case 2:
			sl.Offset = int32(v)
		case 3:
			sl.Length = int32(v)
		}
	}
	return sl, nil
}

// nameCache shares the strings of the table and column names a message
// repeats for every item: one copy a message, not one an item.
type nameCache []string

// maxCachedNames bounds a message's name cache: a message with more
// distinct names gets a copy of each further one.
const maxCachedNames = 32

func (c *nameCache) get(b []byte) (string, error) {
	for _, s := range *c {
		if s == string(b) {
			return s, nil
		}
	}
	if !utf8.Valid(b) {
		return "", errors.New("name is not UTF-8")
	}
	s := string(b)
	if len(*c) < maxCachedNames {
		*c = append(*c, s)
	}
	return s, nil
}

// formatCache gives the chunks of a message that share a format one
// tables.Format, as nameCache does names: a message of one-step chunks of
// one column makes two or three Formats (where the steps start moves with
// the length of a chunk's key), not one a chunk. A Format has its own copy
// of the shape it is made from.
type formatCache []*tables.Format

// maxCachedFormats bounds a message's format cache: a message with more
// distinct formats (a dozen columns) gets a Format of its own for each
// further chunk.
const maxCachedFormats = 32

func (c *formatCache) get(dtype string, shape []int64, stepBytes int64, dataAt int32, delta bool) *tables.Format {
	for _, f := range *c {
		if f.DType == dtype && f.StepBytes == stepBytes && f.DataAt == dataAt && f.Delta == delta && slices.Equal(f.Shape, shape) {
			return f
		}
	}
	f := &tables.Format{DType: dtype, Shape: slices.Clone(shape), StepBytes: stepBytes, DataAt: dataAt, Delta: delta}
	if len(*c) < maxCachedFormats {
		*c = append(*c, f)
	}
	return f
}

// checkDecodes holds c to the limit on a chunk's decoded size and, when it
// is compressed, decompresses it to prove it holds what its header says;
// the result is dropped (the store keeps the chunk as it came).
func (p *chunkParser) checkDecodes(c *tables.Chunk, compressed bool, maxBytes int64) error {
	if int64(c.Length)*c.StepBytes > maxBytes {
		return fmt.Errorf("%w: chunk %d decodes to %d bytes, over the limit of %d (limits.max_chunk_bytes)", protocol.ErrResourceExhausted, c.Key, int64(c.Length)*c.StepBytes, maxBytes)
	}
	if !compressed {
		return nil
	}
	wc, err := p.reader.Read(c.Data)
	if err != nil {
		return fmt.Errorf("%w: %w", protocol.ErrInvalidMessage, err)
	}
	if err := wire.CheckChunk(wc); err != nil {
		return fmt.Errorf("%w: %v", protocol.ErrInvalidMessage, err)
	}
	return nil
}

// copiedChunkBytes is the largest chunk copied out of its insert message
// rather than kept as a slice of it. A slice keeps the whole message alive
// while the chunk is held: the framing of every item and chunk in it, which
// for small items is more than the chunks themselves (16-byte items: about
// 110 B of a message per item beside chunks of about 45 B). Larger chunks
// make up nearly all of their messages, and copying them would cost more
// than it frees.
const copiedChunkBytes = 1024

// chunkParser reads the chunks of one message, or of one checkpoint: its
// headers all into one wire.Chunk, its formats shared (formatCache).
type chunkParser struct {
	reader  wire.ChunkReader
	formats formatCache
}

// parse reads a chunk's header and checks that it describes a well-formed
// tensor: known dtype, non-negative shape, a raw size that matches and fits
// MaxChunkRawSize. An uncompressed chunk is checked whole, its data against
// its raw size; a compressed one is left to checkDecodes, which compressed
// reports. The returned chunk's Data is b, the whole encoded chunk, which
// is what the store keeps and sends on.
func (p *chunkParser) parse(b []byte) (_ tables.Chunk, compressed bool, _ error) {
	wc, err := p.reader.Read(b)
	if err != nil {
		return tables.Chunk{}, false, fmt.Errorf("%w: %w", protocol.ErrInvalidMessage, err)
	}
	if _, ok := wire.Compression_name[int32(wc.Compression)]; !ok {
		return tables.Chunk{}, false, fmt.Errorf("%w: chunk %d: unknown compression %d", protocol.ErrInvalidMessage, wc.Key, wc.Compression)
	}
	if wc.Key == 0 {
		return tables.Chunk{}, false, fmt.Errorf("%w: chunk without a key", protocol.ErrInvalidMessage)
	}
	// The header must describe exactly raw_size bytes of a known dtype; the
	// codec checks the same again when a learner decodes.
	rawSize, stepBytes, err := wire.CheckChunkHeader(wc)
	if err != nil {
		return tables.Chunk{}, false, fmt.Errorf("%w: %v", protocol.ErrInvalidMessage, err)
	}
	if len(wc.Data) == 0 && rawSize > 0 {
		return tables.Chunk{}, false, fmt.Errorf("%w: chunk %d has no data", protocol.ErrInvalidMessage, wc.Key)
	}
	// An uncompressed chunk is proved here, while its header is at hand:
	// reading it again in checkDecodes only to compare its size took a
	// fifth of the time spent reading an insert message of small items.
	compressed = wc.Compression != wire.Compression_COMPRESSION_NONE
	if !compressed && len(wc.Data) != rawSize {
		return tables.Chunk{}, false, fmt.Errorf("%w: chunk %d: uncompressed data has %d bytes, raw_size is %d", protocol.ErrInvalidMessage, wc.Key, len(wc.Data), rawSize)
	}
	format := p.formats.get(wc.Dtype, wc.StepShape, stepBytes, dataAt(b, wc), wc.DeltaEncoded)
	return tables.Chunk{Key: wc.Key, Format: format, Length: wc.Length, Data: b, Episode: wc.EpisodeId}, compressed, nil
}

// dataAt is where the steps of wc, read from b, lie in b when they are
// stored uncompressed (tables.Format.DataAt), or 0. A sample reply then
// takes them from there rather than reading the chunk's header again for
// each item, which cost a third of packing one of 400 B.
func dataAt(b []byte, wc *wire.Chunk) int32 {
	if wc.Compression != wire.Compression_COMPRESSION_NONE || len(wc.Data) == 0 {
		return 0
	}
	// The reader's Data is a sub-slice of b; the last data field, if the
	// chunk repeats it, as protobuf reads it.
	at := cap(b) - cap(wc.Data)
	if at <= 0 || at > math.MaxInt32 || at+len(wc.Data) > len(b) || &b[at] != &wc.Data[0] {
		return 0
	}
	return int32(at)
}
