package wire

import (
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

// SampleReply is a decoded SampleResponse.
type SampleReply struct {
	Code    Code
	Message string
	Samples []DecodedSample
	// After is the table once the sample was taken.
	After TableState
}

// DecodeSampleResponse decodes a SampleResponse: its status, the table's
// state after the sample, and its items with every column gathered from the
// response's chunks, each chunk decompressed once. The work is per
// response, not per item: the items' columns, their shapes and their data
// each live in one array, so a batch of small items costs a handful of
// allocations.
//
// No two columns share memory. A column that is exactly one chunk, which
// no other column of the response uses, is that chunk's bytes without a
// copy; for an uncompressed chunk those are b's, so b belongs to the result
// and the caller must not reuse it.
func DecodeSampleResponse(b []byte) (SampleReply, error) {
	d := decoders.Get().(*sampleDecoder)
	defer d.release()
	reply, err := d.split(b)
	if err != nil {
		return SampleReply{}, err
	}
	if err := d.readChunks(); err != nil {
		return SampleReply{}, err
	}
	if err := d.readItems(); err != nil {
		return SampleReply{}, err
	}
	reply.Samples = d.assemble()
	return reply, nil
}

// sampleDecoder holds a response's parts while DecodeSampleResponse reads
// them. Slices of the arenas are kept as offsets until the arenas stop
// growing. Decoders are pooled: their arrays, a few hundred bytes an item,
// were most of what a reply of small items allocated.
type sampleDecoder struct {
	rawItems  [][]byte
	rawChunks [][]byte
	reading   Chunk          // the chunk being read
	chunks    []sampledChunk // in the response's order
	keys      []uint64       // the chunks' keys, in the same order
	index     keyIndex       // of keys
	dims      []int64        // the chunks' step shapes
	items     []sampledItem
	columns   []sampledColumn
	slices    []sampledSlice
	names     []string // the previous item's column names
}

var decoders = sync.Pool{New: func() any { return new(sampleDecoder) }}

// maxPooledItems bounds the replies whose decoder goes back to the pool, so
// that one huge reply does not keep its arrays for good.
const maxPooledItems = 1 << 14

// release returns d to the pool, without the references into the reply it
// decoded (whose bytes now belong to the caller).
func (d *sampleDecoder) release() {
	if cap(d.rawItems) > maxPooledItems || cap(d.rawChunks) > maxPooledItems {
		return
	}
	clear(d.rawItems)
	clear(d.rawChunks)
	clear(d.chunks)
	clear(d.names)
	d.reading.Data = nil
	decoders.Put(d)
}

type sampledChunk struct {
	key         uint64
	dtype       string
	dims, ndims int // step shape: dims[dims:dims+ndims]
	steps       int64
	stepBytes   int64
	data        []byte
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

// split reads the top level: the status, the table's state, and where
// each item and chunk is. A field of an unexpected wire type is skipped, as
// the generated code keeps it as unknown.
func (d *sampleDecoder) split(b []byte) (reply SampleReply, err error) {
	items, chunks := CountMessages(b, 2, 3)
	d.rawItems, d.rawChunks = slices.Grow(d.rawItems[:0], items), slices.Grow(d.rawChunks[:0], chunks)
	err = EachField(b, func(num protowire.Number, typ protowire.Type, v uint64, bytes []byte) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			// A message field that repeats merges into the first, as in
			// protobuf.
			return readStatus(bytes, &reply.Code, &reply.Message)
		case num == 2 && typ == protowire.BytesType:
			d.rawItems = append(d.rawItems, bytes)
		case num == 3 && typ == protowire.BytesType:
			d.rawChunks = append(d.rawChunks, bytes)
		case num == 4 && typ == protowire.VarintType:
			reply.After.Size = int64(v)
		case num == 5 && typ == protowire.Fixed64Type:
			reply.After.Weight.Fraction = math.Float64frombits(v)
		case num == 6 && typ == protowire.VarintType:
			reply.After.Weight.Exponent = protowire.DecodeZigZag(v)
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrMalformed) {
		err = fmt.Errorf("%w: sample response: %v", ErrMalformed, err)
	}
	return reply, err
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
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var (
			v     uint64
			bytes []byte
		)
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(b)
		case protowire.Fixed32Type:
			var v32 uint32
			v32, n = protowire.ConsumeFixed32(b)
			v = uint64(v32)
		case protowire.BytesType:
			bytes, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
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

// readChunks checks and decodes every chunk, once, and sorts them by key.
func (d *sampleDecoder) readChunks() error {
	d.chunks = slices.Grow(d.chunks[:0], len(d.rawChunks))
	d.dims = slices.Grow(d.dims[:0], len(d.rawChunks)) // most steps are vectors
	c := &d.reading
	for i, raw := range d.rawChunks {
		start := len(d.dims)
		var err error
		if d.dims, err = readChunkInto(c, raw, d.dims); err != nil {
			return fmt.Errorf("chunk %d of the response: %w", i, err)
		}
		c.StepShape = d.dims[start:]
		rawSize, stepBytes, err := checkChunkHeader(c)
		if err != nil {
			return err
		}
		data := c.Data
		if c.Compression != Compression_COMPRESSION_NONE || c.DeltaEncoded || len(data) != rawSize {
			if data, err = decompress(c, rawSize, nil); err != nil {
				return err
			}
			if c.DeltaEncoded {
				deltaDecode(data, int(stepBytes), dtypes[c.Dtype].size)
			}
		}
		d.chunks = append(d.chunks, sampledChunk{key: c.Key, dtype: c.Dtype, dims: start, ndims: len(d.dims) - start,
			steps: int64(c.Length), stepBytes: stepBytes, data: data})
	}
	d.keys = d.keys[:0]
	for i := range d.chunks {
		d.keys = append(d.keys, d.chunks[i].key)
	}
	d.index.reset(len(d.keys))
	for i := range d.keys {
		if !d.index.add(d.keys, i) {
			return fmt.Errorf("%w: sample response carries chunk %d twice", ErrMalformed, d.chunks[i].key)
		}
	}
	return nil
}

func (d *sampleDecoder) chunk(key uint64) (int, bool) { return d.index.find(d.keys, key) }

func (d *sampleDecoder) stepShape(c *sampledChunk) []int64 { return d.dims[c.dims : c.dims+c.ndims] }

// readItems reads every item's info and columns and checks each column
// against the chunks it selects from.
func (d *sampleDecoder) readItems() error {
	// Cleared: an item's fields are set only when present.
	d.items = slices.Grow(d.items[:0], len(d.rawItems))[:len(d.rawItems)]
	clear(d.items)
	// Sized for one column of one slice an item; the first item tells more.
	d.columns = slices.Grow(d.columns[:0], len(d.rawItems))
	d.slices = slices.Grow(d.slices[:0], len(d.rawItems))
	names := d.names[:0] // the previous item's column names, to share their strings
	defer func() { d.names = names }()
	for i, raw := range d.rawItems {
		it := &d.items[i]
		it.first = len(d.columns)
		it.info.InsertedAt = time.Unix(0, 0) // what a zero field means
		err := EachField(raw, func(num protowire.Number, typ protowire.Type, v uint64, bytes []byte) error {
			switch {
			case num == 1 && typ == protowire.BytesType:
				return readSampleInfo(&it.info, bytes)
			case num == 2 && typ == protowire.BytesType:
				j := len(d.columns) - it.first
				var prev string
				if j < len(names) {
					prev = names[j]
				}
				return d.readColumn(bytes, prev)
			}
			return nil
		})
		if err != nil {
			if !errors.Is(err, ErrMissingChunk) {
				err = fmt.Errorf("%w: %v", ErrMalformed, err)
			}
			return fmt.Errorf("sample response item %d: %w", i, err)
		}
		it.ncol = len(d.columns) - it.first
		if i == 0 {
			d.columns = slices.Grow(d.columns, len(d.rawItems)*it.ncol-len(d.columns))
			d.slices = slices.Grow(d.slices, len(d.rawItems)*len(d.slices)-len(d.slices))
		}
		names = names[:0]
		for j := range it.ncol {
			c := &d.columns[it.first+j]
			names = append(names, c.name)
			if err := d.checkColumn(c); err != nil {
				return fmt.Errorf("item %d: %w", it.info.Key, err)
			}
		}
	}
	return nil
}

func readSampleInfo(in *tables.SampleInfo, b []byte) error {
	return EachField(b, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) error {
		// A field of another wire type than its declared one is an unknown
		// field to protobuf, and skipped.
		switch {
		case num == 1 && typ == protowire.VarintType:
			in.Key = v
		case num == 2 && typ == protowire.Fixed64Type:
			in.Probability = math.Float64frombits(v)
		case num == 3 && typ == protowire.VarintType:
			in.TableSize = int64(v)
		case num == 4 && typ == protowire.Fixed64Type:
			in.Priority = math.Float64frombits(v)
		case num == 5 && typ == protowire.VarintType:
			in.TimesSampled = int32(v)
		case num == 6 && typ == protowire.VarintType:
			in.InsertedAt = time.Unix(0, int64(v))
		case num == 7 && typ == protowire.VarintType:
			in.RateLimited = v != 0
		}
		return nil
	})
}

// readColumn reads one TrajectoryColumn; prev is the name the previous
// item's column at the same position had, shared when equal.
func (d *sampleDecoder) readColumn(b []byte, prev string) error {
	col := sampledColumn{first: len(d.slices)}
	var missing error
	err := EachField(b, func(num protowire.Number, typ protowire.Type, v uint64, bytes []byte) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			if string(bytes) == prev {
				col.name = prev
			} else {
				col.name = string(bytes)
			}
		case num == 2 && typ == protowire.BytesType:
			var key uint64
			var sl sampledSlice
			err := EachField(bytes, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) error {
				if typ != protowire.VarintType {
					return nil
				}
				switch num {
				case 1:
					key = v
				case 2:
					sl.offset = int32(v)
				case 3:
					sl.length = int32(v)
				}
				return nil
			})
			if err != nil {
				return err
			}
			var ok bool
			if sl.chunk, ok = d.chunk(key); !ok && missing == nil {
				missing = fmt.Errorf("%w: slice %d: chunk %d", ErrMissingChunk, len(d.slices)-col.first, key)
			}
			d.slices = append(d.slices, sl)
		case num == 3 && typ == protowire.VarintType:
			col.squeeze = v != 0
		}
		return nil
	})
	if err != nil {
		return err
	}
	col.nslice = len(d.slices) - col.first
	if missing != nil {
		return fmt.Errorf("column %q: %w", col.name, missing)
	}
	d.columns = append(d.columns, col)
	return nil
}

// checkColumn checks that a column's slices lie within their chunks and
// agree on dtype and step shape, and sizes it.
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

// assemble lays the checked columns out in their arrays.
func (d *sampleDecoder) assemble() []DecodedSample {
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
	var (
		out    = make([]DecodedSample, len(d.items))
		cols   = make([]SampledColumn, len(d.columns))
		shapes = make([]int64, 0, dims)
		data   = make([]byte, 0, size)
	)
	for i := range d.items {
		it := &d.items[i]
		out[i] = DecodedSample{Info: it.info, Columns: cols[it.first : it.first+it.ncol : it.first+it.ncol]}
	}
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
			start := len(data)
			for _, sl := range d.slices[col.first : col.first+col.nslice] {
				c := &d.chunks[sl.chunk]
				from := int64(sl.offset) * c.stepBytes
				data = append(data, c.data[from:from+int64(sl.length)*c.stepBytes]...)
			}
			sc.Data = data[start:len(data):len(data)]
		}
		cols[i] = sc
	}
	return out
}
