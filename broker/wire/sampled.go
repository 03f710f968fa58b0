package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/reprise-rl/reprise/tables"
)

// SampledColumn is one column of a sampled item, decoded: the steps its
// slices select, stacked along a new first axis unless the column is
// squeezed.
type SampledColumn struct {
	Name  string
	Dtype string
	Shape []int64
	Data  []byte
}

// DecodedSample is one item of a sample response.
type DecodedSample struct {
	Info    tables.SampleInfo
	Columns []SampledColumn
}

// Reply is a decoded SampleResponse whose items are of type S.
type Reply[S any] struct {
	Code    Code
	Message string
	Samples []S
	// After is the table once the sample was taken.
	After TableState
}

// SampleReply is a decoded SampleResponse, as DecodeSampleResponse gives it.
type SampleReply = Reply[DecodedSample]

// DecodeSampleResponse decodes a SampleResponse whose items are packed in
// the compact or uniform layout (SampleRequest.packed and layout): its
// status, the table's state after the sample, and its items with every
// column gathered from the response's chunks, each chunk an item uses
// decompressed once (a reply whose items decode to more than
// MaxReplyBytes is refused, as ErrMalformed, before it costs that). The
// work is per response, not per item: the items' columns, their
// shapes and their data each live in one array, so a batch of small items
// costs a handful of allocations. A response with items that are not
// packed, or packed in the wide layout, comes from a service older than
// this client, and is refused as such.
//
// No two columns share memory. A column that is exactly one chunk, which
// no other column of the response uses, is that chunk's bytes without a
// copy; for an uncompressed chunk those are b's, so b belongs to the result
// and the caller must not reuse it.
func DecodeSampleResponse(b []byte) (SampleReply, error) {
	return DecodeSamples(b, func(c SampledColumn) SampledColumn { return c },
		func(info tables.SampleInfo, cols []SampledColumn) DecodedSample {
			return DecodedSample{Info: info, Columns: cols}
		})
}

// DecodeSamples is DecodeSampleResponse for a caller with its own types of
// item and column, which it builds the reply's items of directly rather
// than converting them afterwards: a second copy of every item and column
// was a third of what decoding a batch of small items cost. column makes
// one column; item makes one item of its info and its columns, a
// sub-slice of one array of all the reply's columns.
func DecodeSamples[S, C any](b []byte, column func(SampledColumn) C, item func(tables.SampleInfo, []C) S) (Reply[S], error) {
	d := decoders.Get().(*sampleDecoder)
	defer d.release()
	reply, err := d.split(b)
	if err != nil {
		return Reply[S]{}, err
	}
	if err := d.expandUniform(); err != nil {
		return Reply[S]{}, err
	}
	if err := d.readChunks(); err != nil {
		return Reply[S]{}, err
	}
	if err := d.readItems(); err != nil {
		return Reply[S]{}, err
	}
	samples, err := assemble(d, column, item)
	if err != nil {
		return Reply[S]{}, err
	}
	return Reply[S]{Code: reply.Code, Message: reply.Message, After: reply.After, Samples: samples}, nil
}

// MaxReplyBytes bounds what decoding one sample reply may allocate for its
// items (DecodeSampleResponse, DecodeSamples, DecodeBatchResponse): the
// bytes its items' columns decode to, counted before any is allocated.
// Besides them, a decode holds at most one decompressed chunk at a time
// (and a buffer for the next), whatever the order in which its items use
// the chunks. It is the service's default limits.max_reply_bytes, the
// most a service with that default sends: a reply over it is refused as
// malformed (ErrMalformed), so that a hostile or broken reply of a few
// megabytes (one S2 chunk of zeros, sliced a million times) costs an error
// rather than the learner's process. A service whose max_reply_bytes is
// raised above it can send replies this package refuses.
const MaxReplyBytes = 2 << 30

// maxReplyBytes is MaxReplyBytes, lowered by tests.
var maxReplyBytes int64 = MaxReplyBytes

// sampleDecoder holds a response's parts while DecodeSampleResponse reads
// them. Slices of the arenas are kept as offsets until the arenas stop
// growing. Decoders are pooled: their arrays, a few dozen bytes an item,
// were most of what a reply of small items allocated.
type sampleDecoder struct {
	packed  packedFields
	formats []sampledFormat
	chunks  []sampledChunk // in the response's order
	dims    []int64        // the formats' step shapes
	items   []sampledItem
	columns []sampledColumn
	slices  []sampledSlice
	// expanded holds the records a uniform reply leaves out.
	expanded []byte
	// size is what the items' columns decode to, bounded by maxReplyBytes.
	size int64
	// While the items are laid out: outs are the arrays they are copied
	// into, pending the copies out of compressed chunks, done a chunk at a
	// time (copyPending), and starts and order group them by chunk.
	outs    [][]byte
	pending []pendingCopy
	starts  []int
	order   []int
}

// pendingCopy is a copy out of a compressed chunk, made once the chunk is
// decompressed: n bytes from byte from of chunks[chunk] to outs[out][at:].
type pendingCopy struct {
	chunk, out  int
	from, at, n int
}

// packedFields are a PackedSamples' fields, undecoded.
type packedFields struct {
	infos, columns, slices, chunks, data []byte
	uniform                              []byte
	names                                []string
	formats                              [][]byte
}

var decoders = sync.Pool{New: func() any { return new(sampleDecoder) }}

// maxPooledItems bounds the replies whose decoder goes back to the pool, so
// that one huge reply does not keep its arrays for good.
const maxPooledItems = 1 << 14

// release returns d to the pool, without the references into the reply it
// decoded (whose bytes now belong to the caller).
func (d *sampleDecoder) release() {
	if cap(d.items) > maxPooledItems || cap(d.chunks) > maxPooledItems {
		return
	}
	clear(d.chunks)
	clear(d.packed.formats)
	clear(d.packed.names)
	d.packed = packedFields{names: d.packed.names[:0], formats: d.packed.formats[:0]}
	clear(d.outs)
	d.size, d.outs, d.pending = 0, d.outs[:0], d.pending[:0]
	decoders.Put(d)
}

type sampledFormat struct {
	dtype       string
	dims, ndims int // step shape: dims[dims:dims+ndims]
	stepBytes   int64
}

type sampledChunk struct {
	key         uint64
	dtype       string
	dims, ndims int // step shape: dims[dims:dims+ndims]
	steps       int64
	stepBytes   int64
	// data is the chunk's steps where they are stored plain (payload's
	// bytes), or where the chunk is a column whole, decompressed.
	// Otherwise its slices are copied out of payload decompressed, a chunk
	// at a time (copyPending).
	data        []byte
	plain       bool
	payload     []byte
	compression Compression
	delta       bool
	uses        int // slices of the response that select from it
}

type sampledItem struct {
	info        tables.SampleInfo
	first, ncol int // columns[first:first+ncol]
}

type sampledColumn struct {
	name          string
	first, nslice int // slices[first:first+nslice]
	squeeze       bool
	steps         int64
	size          int
}

type sampledSlice struct {
	chunk          int // index into chunks
	offset, length int32
}

// split reads the top level: the status, the table's state and the packed
// fields. A field of an unexpected wire type is skipped, as the generated
// code keeps it as unknown.
func (d *sampleDecoder) split(b []byte) (reply Reply[struct{}], err error) {
	packed := false
	err = EachField(b, func(num protowire.Number, typ protowire.Type, v uint64, bytes []byte) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			// A message field that repeats merges into the first, as in
			// protobuf.
			return readStatus(bytes, &reply.Code, &reply.Message)
		case (num == 2 || num == 3) && typ == protowire.BytesType:
			return fmt.Errorf("%w: the service sent items unpacked: it is older than this client", ErrMalformed)
		case num == 4 && typ == protowire.VarintType:
			reply.After.Size = int64(v)
		case num == 5 && typ == protowire.Fixed64Type:
			reply.After.Weight.Fraction = math.Float64frombits(v)
		case num == 6 && typ == protowire.VarintType:
			reply.After.Weight.Exponent = protowire.DecodeZigZag(v)
		case num == fieldResponsePacked && typ == protowire.BytesType:
			if packed {
				return fmt.Errorf("%w: sample response: packed items twice", ErrMalformed)
			}
			packed = true
			return d.packed.read(bytes)
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrMalformed) {
		err = fmt.Errorf("%w: sample response: %v", ErrMalformed, err)
	}
	return reply, err
}

// read reads a PackedSamples' fields; a bytes field that repeats is its
// last value, as in protobuf.
func (f *packedFields) read(b []byte) error {
	err := EachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, bytes []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case fieldPackedInfos, fieldPackedColumns, fieldPackedChunks:
			return fmt.Errorf("%w: the service sent items in the wide packed layout: it predates SampleRequest.layout, which this client needs; upgrade reprised", ErrMalformed)
		case fieldCompactInfos:
			f.infos = bytes
		case fieldCompactColumns:
			f.columns = bytes
		case fieldPackedNames:
			f.names = append(f.names, string(bytes))
		case fieldPackedSlices:
			f.slices = bytes
		case fieldCompactChunks:
			f.chunks = bytes
		case fieldPackedFormats:
			f.formats = append(f.formats, bytes)
		case fieldPackedData:
			f.data = bytes
		case fieldUniformColumns:
			f.uniform = bytes
		}
		return nil
	})
	if errors.Is(err, ErrMalformed) {
		return err
	}
	if err != nil {
		return fmt.Errorf("%w: packed samples: %v", ErrMalformed, err)
	}
	for _, r := range []struct {
		name string
		b    []byte
		size int
	}{{"infos", f.infos, compactInfoSize}, {"columns", f.columns, compactColumnSize}, {"slices", f.slices, packedSliceSize}, {"chunks", f.chunks, compactChunkSize}, {"uniform columns", f.uniform, uniformColumnSize}} {
		if len(r.b)%r.size != 0 {
			return fmt.Errorf("%w: packed samples: %s holds %d bytes, not a whole number of %d-byte records", ErrMalformed, r.name, len(r.b), r.size)
		}
	}
	return nil
}

func readStatus(b []byte, code *Code, msg *string) error {
	err := EachField(b, func(num protowire.Number, typ protowire.Type, v uint64, bytes []byte) error {
		switch {
		case num == 1 && typ == protowire.VarintType:
			*code = Code(int32(v))
		case num == 2 && typ == protowire.BytesType:
			*msg = string(bytes)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: sample response status: %v", ErrMalformed, err)
	}
	return nil
}

// EachField calls f with every field of the message b, in order: the value
// of a varint or fixed field in v, the bytes of a length-delimited one in
// bytes (a sub-slice of b). It stops at the first error, its own (b is not
// a valid message) or f's. A hand-written reader built on it reads what
// the generated code would, without its allocations.
func EachField(b []byte, f func(num protowire.Number, typ protowire.Type, v uint64, bytes []byte) error) error {
	for len(b) > 0 {
		num, typ, v, bytes, n := ConsumeField(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, typ, v, bytes); err != nil {
			return err
		}
	}
	return nil
}

// ConsumeField reads the field that b starts with: its number and type, and
// its value, a varint or fixed one in v, a length-delimited one in bytes (a
// sub-slice of b); a group is skipped whole. n is the length of the field,
// or negative, as protowire's Consume functions give it, when b does not
// start with a well-formed field. Tags, varints and lengths of one byte,
// nearly all of Reprise's, are read without calling protowire: its calls
// were most of the time spent reading an insert message's items.
func ConsumeField(b []byte) (num protowire.Number, typ protowire.Type, v uint64, bytes []byte, n int) {
	if len(b) > 0 && b[0] < 0x80 && b[0] >= 1<<3 {
		num, typ, n = protowire.Number(b[0]>>3), protowire.Type(b[0]&7), 1
	} else if num, typ, n = protowire.ConsumeTag(b); n < 0 {
		return 0, 0, 0, nil, n
	}
	rest := b[n:]
	var m int
	switch typ {
	case protowire.VarintType:
		if len(rest) > 0 && rest[0] < 0x80 {
			v, m = uint64(rest[0]), 1
		} else {
			v, m = protowire.ConsumeVarint(rest)
		}
	case protowire.BytesType:
		if len(rest) > 0 && rest[0] < 0x80 && int(rest[0]) < len(rest) {
			l := int(rest[0])
			bytes, m = rest[1:1+l:1+l], 1+l
		} else {
			bytes, m = protowire.ConsumeBytes(rest)
		}
	case protowire.Fixed64Type:
		v, m = protowire.ConsumeFixed64(rest)
	case protowire.Fixed32Type:
		var v32 uint32
		v32, m = protowire.ConsumeFixed32(rest)
		v = uint64(v32)
	default:
		m = protowire.ConsumeFieldValue(num, typ, rest)
	}
	if m < 0 {
		return 0, 0, 0, nil, m
	}
	return num, typ, v, bytes, n + m
}

// expandUniform writes out the column, slice and chunk records that a
// reply's uniform columns stand for, so that it is read and checked as a
// compact reply is.
func (d *sampleDecoder) expandUniform() error {
	f := &d.packed
	if len(f.uniform) == 0 {
		return nil
	}
	if len(f.columns) > 0 || len(f.slices) > 0 || len(f.chunks) > 0 {
		return fmt.Errorf("%w: packed samples: uniform columns beside column, slice or chunk records", ErrMalformed)
	}
	n, items := len(f.uniform)/uniformColumnSize, len(f.infos)/compactInfoSize
	// Each chunk of a uniform reply holds a byte or more, so each but the
	// last takes 8 bytes of data or more: what the records written here
	// take is bounded by the reply's size.
	if uint64(items)*uint64(n) > uint64(len(f.data))/packedAlign+1 {
		return fmt.Errorf("%w: packed samples: %d items of %d uniform columns, each a chunk of its own, in %d bytes of data", ErrMalformed, items, n, len(f.data))
	}
	le := binary.LittleEndian
	for j := range n {
		if nsl := le.Uint32(f.uniform[j*uniformColumnSize+4:]) &^ compactFlag; nsl != 1 {
			return fmt.Errorf("%w: packed samples: uniform column %d has %d slices, not 1", ErrMalformed, j, nsl)
		}
	}
	total := items * n
	cols, slcs := total*compactColumnSize, total*packedSliceSize
	buf := slices.Grow(d.expanded[:0], cols+slcs+total*compactChunkSize)[:cols+slcs]
	for i := range items {
		for j := range n {
			k := i*n + j
			r := f.uniform[j*uniformColumnSize:]
			copy(buf[k*compactColumnSize:], r[:compactColumnSize])
			chunk := r[compactColumnSize:uniformColumnSize]
			sl := buf[cols+k*packedSliceSize:]
			le.PutUint32(sl, uint32(k))
			le.PutUint32(sl[4:], 0)
			le.PutUint32(sl[8:], le.Uint32(chunk[12:]))
			buf = append(buf, chunk...)
		}
	}
	d.expanded = buf
	f.columns, f.slices, f.chunks = buf[:cols], buf[cols:cols+slcs], buf[cols+slcs:]
	return nil
}

// readFormats checks every step format once: its dtype and shape, and the
// bytes a step of it decodes to.
func (d *sampleDecoder) readFormats() error {
	d.formats = slices.Grow(d.formats[:0], len(d.packed.formats))
	d.dims = d.dims[:0]
	for i, raw := range d.packed.formats {
		start := len(d.dims)
		var dtype string
		err := func() error {
			for b := raw; len(b) > 0; {
				num, typ, n := protowire.ConsumeTag(b)
				if n < 0 {
					return protowire.ParseError(n)
				}
				b = b[n:]
				switch {
				case num == fieldFormatShape:
					var err error
					if d.dims, b, err = consumeVarints(b, typ, d.dims); err != nil {
						return err
					}
					continue
				case num == fieldFormatDtype && typ == protowire.BytesType:
					var s []byte
					s, n = protowire.ConsumeBytes(b)
					dtype = dtypeName(s)
				default:
					n = protowire.ConsumeFieldValue(num, typ, b)
				}
				if n < 0 {
					return protowire.ParseError(n)
				}
				b = b[n:]
			}
			return nil
		}()
		if err != nil {
			return fmt.Errorf("%w: packed samples: format %d: %v", ErrMalformed, i, err)
		}
		info, ok := dtypes[dtype]
		if !ok {
			return fmt.Errorf("%w: format %d: unknown dtype %q", ErrInvalidChunk, i, dtype)
		}
		elems, err := numElements(d.dims[start:], MaxChunkRawSize/int64(info.size))
		if err != nil {
			return fmt.Errorf("%w: format %d: step_shape %v: %v", ErrInvalidChunk, i, d.dims[start:], err)
		}
		d.formats = append(d.formats, sampledFormat{dtype: info.name, dims: start, ndims: len(d.dims) - start, stepBytes: elems * int64(info.size)})
	}
	return nil
}

// readChunks checks every chunk record against its format and the data it
// points at, and the compressed ones' data as far as it can be without
// decompressing it: a chunk is decompressed only once a slice needs it
// (decompressed), so a chunk no item uses costs nothing.
func (d *sampleDecoder) readChunks() error {
	if err := d.readFormats(); err != nil {
		return err
	}
	le := binary.LittleEndian
	recs, data := d.packed.chunks, d.packed.data
	n := len(recs) / compactChunkSize
	d.chunks = slices.Grow(d.chunks[:0], n)
	// Each chunk starts where the one before ends, rounded up to a multiple
	// of 8. The check below keeps at within data, so it cannot wrap.
	var at uint64
	for i := range n {
		r := recs[i*compactChunkSize : (i+1)*compactChunkSize]
		key, size, steps, format := le.Uint64(r), uint64(le.Uint32(r[8:])), le.Uint32(r[12:]), le.Uint32(r[16:])
		compression, delta := Compression(r[20]), r[21] != 0
		at += -at & (packedAlign - 1)
		if uint64(format) >= uint64(len(d.formats)) {
			return fmt.Errorf("%w: chunk %d: format %d of %d", ErrInvalidChunk, key, format, len(d.formats))
		}
		f := &d.formats[format]
		// As CheckChunkHeader: differences of floats or bools are not
		// their values, and undoing them for 16-byte elements panicked.
		if delta && !dtypes[f.dtype].integer {
			return fmt.Errorf("%w: chunk %d: delta encoding of %s steps (only integer steps are delta-encoded)", ErrInvalidChunk, key, f.dtype)
		}
		if steps > math.MaxInt32 || (f.stepBytes > 0 && int64(steps) > MaxChunkRawSize/f.stepBytes) {
			return fmt.Errorf("%w: chunk %d: %d steps of %d bytes exceed MaxChunkRawSize (%d bytes)", ErrInvalidChunk, key, steps, f.stepBytes, MaxChunkRawSize)
		}
		want := f.stepBytes * int64(steps)
		if at > uint64(len(data)) || size > uint64(len(data))-at {
			return fmt.Errorf("%w: chunk %d: bytes [%d, %d+%d) lie beyond the %d bytes of data", ErrInvalidChunk, key, at, at, size, len(data))
		}
		payload := data[at : at+size : at+size]
		at += size
		c := sampledChunk{key: key, dtype: f.dtype, dims: f.dims, ndims: f.ndims, steps: int64(steps), stepBytes: f.stepBytes}
		// Differences of one step are the step: its bytes are the payload's.
		if compression != Compression_COMPRESSION_NONE || (delta && steps > 1) || len(payload) != int(want) {
			if err := checkCompressed(d.chunkMessage(&c, compression, payload), int(want)); err != nil {
				return err
			}
			c.payload, c.compression, c.delta = payload, compression, delta
		} else {
			c.data, c.plain = payload, true
		}
		d.chunks = append(d.chunks, c)
	}
	return nil
}

// chunkMessage is what decompress needs of a chunk.
func (d *sampleDecoder) chunkMessage(c *sampledChunk, compression Compression, payload []byte) *Chunk {
	return &Chunk{Key: c.key, Dtype: c.dtype, Length: int32(c.steps), Compression: compression, RawSize: uint64(c.steps * c.stepBytes), Data: payload}
}

// decompressed is compressed chunk c's steps, decompressed into dst where
// it has room, and their differences undone.
func (d *sampleDecoder) decompressed(c *sampledChunk, dst []byte) ([]byte, error) {
	raw := c.steps * c.stepBytes
	data, err := decompressChecked(d.chunkMessage(c, c.compression, c.payload), int(raw), dst)
	if err != nil {
		return nil, err
	}
	if c.delta {
		deltaDecode(data, int(c.stepBytes), dtypes[c.dtype].size)
	}
	return data, nil
}

// copySlice copies the steps slice sl selects into out, which is outs[o],
// from byte at, and returns their bytes: at once where its chunk is stored
// plain, or else once the chunk is decompressed (copyPending).
func (d *sampleDecoder) copySlice(sl sampledSlice, out []byte, o, at int) int {
	c := &d.chunks[sl.chunk]
	from, n := int(int64(sl.offset)*c.stepBytes), int(int64(sl.length)*c.stepBytes)
	if c.plain {
		copy(out[at:at+n], c.data[from:from+n])
	} else {
		d.pending = append(d.pending, pendingCopy{chunk: sl.chunk, out: o, from: from, at: at, n: n})
	}
	return n
}

// copyPending makes the copies out of compressed chunks, chunk by chunk:
// each chunk is decompressed once, all its copies made, and its buffer
// reused by the next, so that one chunk is held at a time however the
// items interleave their chunks. The copies are grouped by chunk with a
// counting sort.
func (d *sampleDecoder) copyPending() error {
	if len(d.pending) == 0 {
		return nil
	}
	n := len(d.chunks)
	starts := slices.Grow(d.starts[:0], n+1)[:n+1]
	clear(starts)
	for _, p := range d.pending {
		starts[p.chunk+1]++
	}
	var most int64
	for c := range n {
		if starts[c+1] > 0 {
			most = max(most, d.chunks[c].steps*d.chunks[c].stepBytes)
		}
		starts[c+1] += starts[c]
	}
	// Placed, each chunk's copies end where the next chunk's start.
	order := slices.Grow(d.order[:0], len(d.pending))[:len(d.pending)]
	for k, p := range d.pending {
		order[starts[p.chunk]] = k
		starts[p.chunk]++
	}
	d.starts, d.order = starts, order
	buf := make([]byte, 0, most)
	from := 0
	for c := range n {
		to := starts[c]
		if from == to {
			continue
		}
		ch := &d.chunks[c]
		raw := ch.steps * ch.stepBytes
		data, err := d.decompressed(ch, buf[:0:raw])
		if err != nil {
			return err
		}
		for _, k := range order[from:to] {
			p := &d.pending[k]
			copy(d.outs[p.out][p.at:p.at+p.n], data[p.from:p.from+p.n])
		}
		from = to
	}
	return nil
}

func (d *sampleDecoder) stepShape(c *sampledChunk) []int64 { return d.dims[c.dims : c.dims+c.ndims] }

// readItems reads every item's info, columns and slices, and checks each
// column against the chunks it selects from.
func (d *sampleDecoder) readItems() error {
	le := binary.LittleEndian
	infos, colRecs, sliceRecs := d.packed.infos, d.packed.columns, d.packed.slices
	nitems, ncols, nslices := len(infos)/compactInfoSize, len(colRecs)/compactColumnSize, len(sliceRecs)/packedSliceSize
	d.items = slices.Grow(d.items[:0], nitems)[:nitems]
	d.columns = slices.Grow(d.columns[:0], ncols)[:0]
	d.slices = slices.Grow(d.slices[:0], nslices)[:0]
	d.size = 0
	for i := range nitems {
		r := infos[i*compactInfoSize : (i+1)*compactInfoSize]
		it := &d.items[i]
		var cols uint32
		it.info, cols = readCompactInfo(r)
		it.first = len(d.columns)
		if uint64(cols) > uint64(ncols-len(d.columns)) {
			return fmt.Errorf("%w: sample response item %d: %d columns, %d records left", ErrMalformed, i, cols, ncols-len(d.columns))
		}
		it.ncol = int(cols)
		for j := range it.ncol {
			r := colRecs[(it.first+j)*compactColumnSize:]
			name, nsl := le.Uint32(r), le.Uint32(r[4:])
			squeeze := nsl&compactFlag != 0
			nsl &^= compactFlag
			if uint64(name) >= uint64(len(d.packed.names)) {
				return fmt.Errorf("%w: sample response item %d: column %d: name %d of %d", ErrMalformed, i, j, name, len(d.packed.names))
			}
			col := sampledColumn{name: d.packed.names[name], first: len(d.slices), nslice: int(nsl), squeeze: squeeze}
			if uint64(nsl) > uint64(nslices-len(d.slices)) {
				return fmt.Errorf("%w: sample response item %d: column %q: %d slices, %d records left", ErrMalformed, i, col.name, nsl, nslices-len(d.slices))
			}
			for k := range col.nslice {
				r := sliceRecs[(col.first+k)*packedSliceSize:]
				chunk, offset, length := le.Uint32(r), le.Uint32(r[4:]), le.Uint32(r[8:])
				if uint64(chunk) >= uint64(len(d.chunks)) {
					return fmt.Errorf("%w: sample response item %d: column %q: slice %d: chunk %d of %d", ErrMissingChunk, i, col.name, k, chunk, len(d.chunks))
				}
				if offset > math.MaxInt32 || length > math.MaxInt32 {
					return fmt.Errorf("%w: item %d: column %q: slice %d: steps [%d, %d+%d)", ErrInvalidColumn, it.info.Key, col.name, k, offset, offset, length)
				}
				d.slices = append(d.slices, sampledSlice{chunk: int(chunk), offset: int32(offset), length: int32(length)})
			}
			d.columns = append(d.columns, col)
			if err := d.checkColumn(&d.columns[len(d.columns)-1]); err != nil {
				return fmt.Errorf("item %d: %w", it.info.Key, err)
			}
		}
	}
	if len(d.columns) != ncols || len(d.slices) != nslices {
		return fmt.Errorf("%w: sample response: its items use %d of %d column records and %d of %d slice records", ErrMalformed, len(d.columns), ncols, len(d.slices), nslices)
	}
	return nil
}

// readCompactInfo reads a compact info record: the item's info and its
// number of columns.
func readCompactInfo(r []byte) (tables.SampleInfo, uint32) {
	le := binary.LittleEndian
	cols := le.Uint32(r[44:])
	return tables.SampleInfo{Key: le.Uint64(r), Probability: math.Float64frombits(le.Uint64(r[8:])), TableSize: int64(le.Uint64(r[16:])),
		Priority: math.Float64frombits(le.Uint64(r[24:])), InsertedAt: time.Unix(0, int64(le.Uint64(r[32:]))),
		TimesSampled: int32(le.Uint32(r[40:])), RateLimited: cols&compactFlag != 0}, cols &^ compactFlag
}

// checkColumn checks that a column's slices lie within their chunks and
// agree on dtype and step shape, and sizes it: the columns of a reply
// together decode to at most maxReplyBytes.
func (d *sampleDecoder) checkColumn(col *sampledColumn) error {
	if col.nslice == 0 {
		return fmt.Errorf("%w: column %q has no slices", ErrInvalidColumn, col.name)
	}
	first := &d.chunks[d.slices[col.first].chunk]
	for i, sl := range d.slices[col.first : col.first+col.nslice] {
		c := &d.chunks[sl.chunk]
		if c.dtype != first.dtype || !slices.Equal(d.stepShape(c), d.stepShape(first)) {
			return fmt.Errorf("%w: column %q: chunk %d holds %s steps of shape %v, chunk %d holds %s steps of shape %v",
				ErrMismatch, col.name, c.key, c.dtype, d.stepShape(c), first.key, first.dtype, d.stepShape(first))
		}
		if sl.offset < 0 || sl.length < 1 || int64(sl.offset)+int64(sl.length) > c.steps {
			return fmt.Errorf("%w: column %q: slice %d wants steps [%d, %d+%d) of chunk %d, which has %d",
				ErrInvalidColumn, col.name, i, sl.offset, sl.offset, sl.length, c.key, c.steps)
		}
		// At most len(c.data), since the slice lies within the chunk.
		n := int(c.stepBytes * int64(sl.length))
		if n > math.MaxInt-col.size {
			return fmt.Errorf("%w: column %q is larger than memory can hold", ErrInvalidColumn, col.name)
		}
		col.size += n
		col.steps += int64(sl.length)
		c.uses++
	}
	if col.squeeze && col.steps != 1 {
		return fmt.Errorf("%w: column %q is squeezed but its slices select %d steps, not 1", ErrInvalidColumn, col.name, col.steps)
	}
	if int64(col.size) > maxReplyBytes-d.size {
		return fmt.Errorf("%w: sample response: column %q takes its items to more than the %d bytes a reply may decode to", ErrMalformed, col.name, maxReplyBytes)
	}
	d.size += int64(col.size)
	return nil
}

// whole is the chunk a column is, in full and alone, or nil.
func (d *sampleDecoder) whole(col *sampledColumn) *sampledChunk {
	if col.nslice != 1 {
		return nil
	}
	sl := d.slices[col.first]
	c := &d.chunks[sl.chunk]
	if c.uses != 1 || sl.offset != 0 || int64(sl.length) != c.steps {
		return nil
	}
	return c
}

// assemble lays the checked columns out in their arrays: the slices of
// chunks stored plain as it meets them, those of compressed chunks a
// chunk at a time (copyPending), before it makes the columns.
func assemble[S, C any](d *sampleDecoder, column func(SampledColumn) C, item func(tables.SampleInfo, []C) S) ([]S, error) {
	var dims, size int
	for i := range d.columns {
		col := &d.columns[i]
		c := &d.chunks[d.slices[col.first].chunk]
		dims += c.ndims
		if !col.squeeze {
			dims++
		}
		if d.whole(col) == nil {
			size += col.size
		}
	}
	data := make([]byte, size)
	d.outs, d.pending = append(d.outs[:0], data), d.pending[:0]
	at := 0
	for i := range d.columns {
		col := &d.columns[i]
		if c := d.whole(col); c != nil {
			if !c.plain {
				// A column of its own: it is the chunk's buffer.
				b, err := d.decompressed(c, nil)
				if err != nil {
					return nil, err
				}
				c.data = b
			}
			continue
		}
		for _, sl := range d.slices[col.first : col.first+col.nslice] {
			at += d.copySlice(sl, data, 0, at)
		}
	}
	if err := d.copyPending(); err != nil {
		return nil, err
	}
	var (
		out    = make([]S, len(d.items))
		cols   = make([]C, len(d.columns))
		shapes = make([]int64, 0, dims)
	)
	at = 0
	for i := range d.columns {
		col := &d.columns[i]
		first := &d.chunks[d.slices[col.first].chunk]
		start := len(shapes)
		if !col.squeeze {
			shapes = append(shapes, col.steps)
		}
		shapes = append(shapes, d.stepShape(first)...)
		sc := SampledColumn{Name: col.name, Dtype: first.dtype, Shape: shapes[start:len(shapes):len(shapes)]}
		if c := d.whole(col); c != nil {
			sc.Data = c.data
		} else {
			sc.Data = data[at : at+col.size : at+col.size]
			at += col.size
		}
		cols[i] = column(sc)
	}
	for i := range d.items {
		it := &d.items[i]
		out[i] = item(it.info, cols[it.first:it.first+it.ncol:it.first+it.ncol])
	}
	return out, nil
}
