package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/reprise-rl/reprise/tables"
)

// Record sizes and the data alignment of PackedSamples (reprise.proto),
// in its wide and compact layouts.
const (
	packedInfoSize    = 56
	packedColumnSize  = 12
	packedSliceSize   = 12
	packedChunkSize   = 48
	compactInfoSize   = 48
	compactColumnSize = 8
	compactChunkSize  = 24
	uniformColumnSize = compactColumnSize + compactChunkSize
	packedAlign       = 8
)

// SampleItemBytes and SamplePartBytes bound what a sample reply, in any
// layout, spends describing an item beside its chunks' bytes: on the item
// itself (a packed info record, or an unpacked item with every field at
// its longest) and on each of its parts (tables.Table.LargestItemParts),
// the widest of which is a packed chunk record with its payload's padding.
// An item of many slices of empty steps decodes to nothing, yet takes a
// reply of a dozen bytes or more a slice.
const (
	SampleItemBytes = 80
	SamplePartBytes = packedChunkSize + packedAlign - 1
)

// compactFlag is the bit of a compact info's column count that says the
// sample was rate limited, and of a compact column's slice count that says
// it is squeezed; the counts are the other 31 bits.
const compactFlag = 1 << 31

// Field numbers of SampleResponse and PackedSamples.
const (
	fieldResponsePacked = 7

	fieldPackedInfos   = 1
	fieldPackedColumns = 2
	fieldPackedNames   = 3
	fieldPackedSlices  = 4
	fieldPackedChunks  = 5
	fieldPackedFormats = 6
	fieldPackedData    = 7

	fieldCompactInfos   = 8
	fieldCompactColumns = 9
	fieldCompactChunks  = 10
	fieldUniformColumns = 11

	fieldFormatDtype = 1
	fieldFormatShape = 2
)

// storedChunk is what a packed reply says of a chunk: its header, read
// from the chunk as stored, its payload (a slice of the stored bytes) and
// where the payload goes in the reply.
type storedChunk struct {
	key         uint64
	steps       uint32
	compression Compression
	delta       bool
	rawSize     uint64
	payload     []byte
	format      uint32
	at          int // in the reply's data
}

// readStoredChunk reads what a packed reply says of a stored chunk: its
// format from the store's Format when it has one, and its codec, raw size
// and payload from there too when the Format locates its steps, or else
// from its header.
func (p *packer) readStoredChunk(ch *tables.Chunk, c *storedChunk) error {
	*c = storedChunk{key: ch.Key, steps: uint32(ch.Length)}
	if ch.Length < 0 {
		return fmt.Errorf("%w: chunk %d length %d", ErrInvalidChunk, ch.Key, ch.Length)
	}
	if ch.Format == nil {
		var wc Chunk
		dims, err := readChunkInto(&wc, ch.Data, p.dims[:0])
		if err != nil {
			return err
		}
		p.dims = dims
		c.compression, c.delta, c.rawSize, c.payload = wc.Compression, wc.DeltaEncoded, wc.RawSize, wc.Data
		c.format = p.format(wc.Dtype, dims)
		return nil
	}
	// The rest of the header was checked when the chunk came in, and made
	// its Format.
	if f := ch.Format; f.DataAt > 0 {
		n := int64(ch.Length) * f.StepBytes
		if int64(f.DataAt)+n > int64(len(ch.Data)) {
			return fmt.Errorf("%w: chunk %d: %d bytes of steps from byte %d of %d", ErrInvalidChunk, ch.Key, n, f.DataAt, len(ch.Data))
		}
		c.delta, c.rawSize, c.payload = f.Delta, uint64(n), ch.Data[f.DataAt:int64(f.DataAt)+n]
	} else if err := p.readHeader(ch, c); err != nil {
		return err
	}
	if ch.Format != p.lastFormat {
		p.lastFormat, p.lastIndex = ch.Format, p.format(ch.Format.DType, ch.Format.Shape)
	}
	c.format = p.lastIndex
	return nil
}

// readHeader reads a stored chunk's codec, raw size and payload from its
// header.
func (p *packer) readHeader(ch *tables.Chunk, c *storedChunk) error {
	// Its tags and most of its values are a byte each, read here without
	// protowire's calls, which took a third of this loop. This is
	// ConsumeField written out: calling it for each field cost 6% of
	// BenchmarkAppendPackedSampleResponse (medians of five alternating
	// runs, 149 -> 159 ns an item).
	for b := ch.Data; len(b) > 0; {
		num, typ, n := protowire.Number(b[0]>>3), protowire.Type(b[0]&7), 1
		if b[0] >= 0x80 || num == 0 {
			if num, typ, n = protowire.ConsumeTag(b); n < 0 {
				return fmt.Errorf("%w: chunk %d: %v", ErrInvalidChunk, ch.Key, protowire.ParseError(n))
			}
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType:
			var v uint64
			if len(b) > 0 && b[0] < 0x80 {
				v, n = uint64(b[0]), 1
			} else if v, n = protowire.ConsumeVarint(b); n < 0 {
				break
			}
			switch num {
			case FieldChunkCompression:
				c.compression = Compression(min(v, math.MaxInt32))
			case FieldChunkDelta:
				c.delta = v != 0
			case FieldChunkRawSize:
				c.rawSize = v
			}
		case num == FieldChunkData && typ == protowire.BytesType:
			c.payload, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%w: chunk %d field %d: %v", ErrInvalidChunk, ch.Key, num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return nil
}

// packer holds the arrays AppendPackedSampleResponse builds a reply from.
type packer struct {
	keys    []uint64 // the distinct chunks' keys, in order of first use
	seen    keyIndex
	stored  []*tables.Chunk // the distinct chunks
	chunks  []storedChunk
	local   []uint32 // each sample's chunks as indices into chunks, sample after sample
	names   []string
	colName []uint32 // each column's name, as an index into names
	dtypes  []string // the distinct formats
	shapes  [][]int64
	dims    []int64
	// The format of the chunk before, which the next one usually shares.
	lastFormat *tables.Format
	lastIndex  uint32
	columns    int
	slices     int
	// The uniform form's check: which chunks a column took, and the chunks
	// in the form's order, a chunk once for each column that takes it
	// (which becomes chunks, and chunks' array this).
	used  []bool
	spare []storedChunk
}

// packers keeps packers between replies, so that a reply of small items
// does not allocate their arrays, a few dozen bytes a chunk, each time.
var packers = sync.Pool{New: func() any { return new(packer) }}

// release returns p to the pool, without its references into the store's
// chunks, unless one huge reply made its arrays large.
func (p *packer) release() {
	if cap(p.chunks) > maxPooledItems || cap(p.colName) > maxPooledItems {
		return
	}
	clear(p.stored)
	clear(p.chunks)
	clear(p.spare)
	clear(p.names)
	clear(p.dtypes)
	clear(p.shapes)
	*p = packer{keys: p.keys[:0], seen: p.seen, stored: p.stored[:0], chunks: p.chunks[:0], local: p.local[:0],
		names: p.names[:0], colName: p.colName[:0], dtypes: p.dtypes[:0], shapes: p.shapes[:0], dims: p.dims[:0],
		used: p.used[:0], spare: p.spare[:0]}
	packers.Put(p)
}

// AppendPackedSampleResponse appends the encoding of a SampleResponse with
// its samples laid out in a PackedSamples (see reprise.proto), in the
// records of layout, which a learner decodes per reply rather than per
// item; a layout newer than PACKED_LAYOUT_UNIFORM is taken as that one.
// Each chunk's header is read from its stored bytes; a chunk that does not
// decode is an error, since the store holds only chunks that did when they
// were inserted.
//
// after is the table once the sample was taken, as in
// AppendSampleResponse.
func AppendPackedSampleResponse(b []byte, layout PackedLayout, code Code, msg string, samples []tables.Sample, after TableState) ([]byte, error) {
	return AppendPackedSampleResponseWithin(b, layout, code, msg, samples, after, nil)
}

// AppendPackedSampleResponseWithin is AppendPackedSampleResponse for a
// caller that bounds the memory its replies take: once the reply's size is
// known, and before anything is allocated for it, reserve (when not nil) is
// asked for that many bytes, and its error is returned as it is.
func AppendPackedSampleResponseWithin(b []byte, layout PackedLayout, code Code, msg string, samples []tables.Sample, after TableState, reserve func(bytes int) error) ([]byte, error) {
	p := packers.Get().(*packer)
	defer p.release()
	if err := p.gather(samples); err != nil {
		return b, err
	}
	compact := layout != PackedLayout_PACKED_LAYOUT_WIDE
	uniform := compact && layout != PackedLayout_PACKED_LAYOUT_COMPACT && p.uniform(samples)
	infoSize, columnSize, chunkSize := packedInfoSize, packedColumnSize, packedChunkSize
	infosField, columnsField, chunksField := protowire.Number(fieldPackedInfos), protowire.Number(fieldPackedColumns), protowire.Number(fieldPackedChunks)
	if compact {
		infoSize, columnSize, chunkSize = compactInfoSize, compactColumnSize, compactChunkSize
		infosField, columnsField, chunksField = fieldCompactInfos, fieldCompactColumns, fieldCompactChunks
		if err := p.fitsCompact(); err != nil {
			return b, err
		}
	}
	data := 0
	for i := range p.chunks {
		c := &p.chunks[i]
		c.at = data
		data += len(c.payload)
		data += -data & (packedAlign - 1)
	}
	formats := 0
	for i := range p.dtypes {
		formats += 1 + protowire.SizeBytes(sizeFormat(p.dtypes[i], p.shapes[i]))
	}
	names := 0
	for _, n := range p.names {
		names += 1 + protowire.SizeBytes(len(n))
	}
	sizes := [...]int{
		len(samples) * infoSize,
		p.columns * columnSize,
		p.slices * packedSliceSize,
		len(p.chunks) * chunkSize,
		data,
		0,
	}
	if uniform {
		sizes[1], sizes[2], sizes[3], sizes[5] = 0, 0, 0, len(samples[0].Layout)*uniformColumnSize
	}
	packed := names + formats
	for _, n := range sizes {
		packed += bytesField(n)
	}
	st := sizeStatus(code, msg)
	total := 1 + protowire.SizeBytes(st) + sizeTableState(after)
	if len(samples) > 0 {
		total += 1 + protowire.SizeBytes(packed)
	}
	if reserve != nil {
		if err := reserve(total); err != nil {
			return b, err
		}
	}
	b = slices.Grow(b, total)
	b = appendTag(b, 1, protowire.BytesType)
	b = appendVarint(b, uint64(st))
	b = appendStatus(b, code, msg)
	b = appendTableState(b, after)
	if len(samples) == 0 {
		return b, nil
	}
	b = appendSubmessage(b, fieldResponsePacked, packed)

	infos := func(b []byte) []byte {
		if sizes[0] == 0 {
			return b
		}
		b = appendSubmessage(b, infosField, sizes[0])
		for i := range samples {
			if compact {
				b = appendCompactInfo(b, &samples[i].Info, len(samples[i].Layout))
			} else {
				b = appendInfoRecord(b, &samples[i].Info, len(samples[i].Layout))
			}
		}
		return b
	}
	columns := func(b []byte) []byte {
		if sizes[1] == 0 {
			return b
		}
		return p.appendColumns(appendSubmessage(b, columnsField, sizes[1]), samples, compact)
	}
	chunks := func(b []byte) []byte {
		if sizes[3] == 0 {
			return b
		}
		b = appendSubmessage(b, chunksField, sizes[3])
		for i := range p.chunks {
			if compact {
				b = appendCompactChunk(b, &p.chunks[i])
			} else {
				b = appendChunkRecord(b, &p.chunks[i])
			}
		}
		return b
	}
	// Fields in the order of their numbers, as protobuf writes them.
	if !compact {
		b = columns(infos(b))
	}
	for _, n := range p.names {
		b = appendTag(b, fieldPackedNames, protowire.BytesType)
		b = appendString(b, n)
	}
	if sizes[2] > 0 {
		b = p.appendSlices(appendSubmessage(b, fieldPackedSlices, sizes[2]), samples)
	}
	if !compact {
		b = chunks(b)
	}
	for i := range p.dtypes {
		b = appendSubmessage(b, fieldPackedFormats, sizeFormat(p.dtypes[i], p.shapes[i]))
		b = appendFormat(b, p.dtypes[i], p.shapes[i])
	}
	if sizes[4] > 0 {
		b = appendSubmessage(b, fieldPackedData, sizes[4])
		start := len(b)
		for i := range p.chunks {
			c := &p.chunks[i]
			b = append(b, make([]byte, start+c.at-len(b))...)
			b = append(b, c.payload...)
		}
		b = append(b, make([]byte, start+data-len(b))...)
	}
	if compact {
		b = chunks(columns(infos(b)))
	}
	if uniform {
		b = p.appendUniform(appendSubmessage(b, fieldUniformColumns, sizes[5]), &samples[0])
	}
	return b, nil
}

// uniform reports whether samples fit PackedSamples.uniform_columns, and
// are smaller in it, and if so puts the chunks in the order the uniform
// form sends them. They fit when every item has the columns the first has,
// each one slice of all the steps of a chunk, and the chunks of one column
// are alike but for their keys, each of at least one byte. A chunk that
// several columns take, as an item sampled twice has, is sent for each:
// the form is smaller while those copies cost less than the records it
// leaves out.
func (p *packer) uniform(samples []tables.Sample) bool {
	if len(samples) == 0 {
		return false
	}
	n := len(samples[0].Layout)
	if n == 0 || p.columns != len(samples)*n || p.slices != p.columns {
		return false
	}
	// The records left out: each column's and slice's, and each distinct
	// chunk's, for the pattern's.
	saved := p.columns*(compactColumnSize+packedSliceSize) + len(p.chunks)*compactChunkSize - n*uniformColumnSize
	used := slices.Grow(p.used[:0], len(p.chunks))[:len(p.chunks)]
	clear(used)
	p.used = used
	order := p.spare[:0]
	local := p.local
	for i := range samples {
		s := &samples[i]
		if len(s.Layout) != n {
			return false
		}
		for j := range s.Layout {
			col, pattern := &s.Layout[j], &samples[0].Layout[j]
			if len(col.Slices) != 1 || col.Squeeze != pattern.Squeeze || p.colName[i*n+j] != p.colName[j] {
				return false
			}
			sl := col.Slices[0]
			if sl.Chunk < 0 || int(sl.Chunk) >= len(s.Chunks) {
				return false
			}
			at := local[sl.Chunk]
			c := &p.chunks[at]
			if sl.Offset != 0 || int64(sl.Length) != int64(c.steps) || len(c.payload) == 0 {
				return false
			}
			if i > 0 {
				like := &order[j]
				if len(c.payload) != len(like.payload) || c.steps != like.steps || c.format != like.format ||
					c.compression != like.compression || c.delta != like.delta {
					return false
				}
			}
			if used[at] {
				if saved -= len(c.payload) + -len(c.payload)&(packedAlign-1); saved <= 0 {
					return false
				}
			}
			used[at] = true
			order = append(order, *c)
		}
		local = local[len(s.Chunks):]
	}
	p.chunks, p.spare = order, p.chunks
	return true
}

// appendUniform appends the uniform columns, the first item's column and
// chunk records, without the chunks' keys.
func (p *packer) appendUniform(b []byte, first *tables.Sample) []byte {
	for j := range first.Layout {
		slices := uint32(1)
		if first.Layout[j].Squeeze {
			slices |= compactFlag
		}
		b = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(b, p.colName[j]), slices)
		c := p.chunks[j]
		c.key = 0
		b = appendCompactChunk(b, &c)
	}
	return b
}

// gather finds the distinct chunks, formats and names of samples, and
// counts their columns and slices.
func (p *packer) gather(samples []tables.Sample) error {
	// The chunks' headers are read here, all at once, so that their cache
	// misses overlap: the table draws without reading them, to hold its
	// lock, which every learner of the table waits on, for less time.
	refs := 0
	var sum uint64
	for i := range samples {
		refs += len(samples[i].Chunks)
		for _, ch := range samples[i].Chunks {
			sum += uint64(ch.Key)
		}
		p.columns += len(samples[i].Layout)
		for j := range samples[i].Layout {
			p.slices += len(samples[i].Layout[j].Slices)
		}
	}
	if p.columns > math.MaxUint32 || p.slices > math.MaxUint32 {
		return fmt.Errorf("%w: %d columns and %d slices do not fit a packed reply", ErrMalformed, p.columns, p.slices)
	}
	p.keys = slices.Grow(p.keys[:0], refs)
	p.seen.reset(refs)
	p.local = slices.Grow(p.local[:0], refs)
	stored := slices.Grow(p.stored[:0], refs)
	defer func() { p.stored = stored }()
	for i := range samples {
		for _, ch := range samples[i].Chunks {
			p.keys = append(p.keys, ch.Key)
			if at, ok := p.seen.find(p.keys[:len(p.keys)-1], ch.Key); ok {
				p.keys = p.keys[:len(p.keys)-1]
				p.local = append(p.local, uint32(at))
				continue
			}
			p.seen.add(p.keys, len(p.keys)-1)
			p.local = append(p.local, uint32(len(stored)))
			stored = append(stored, ch)
		}
	}
	// Read one after the other, the headers would take their cache misses
	// in turn.
	for _, ch := range stored {
		sum += touchLines(ch.Data)
	}
	touched.Add(sum)
	p.chunks = slices.Grow(p.chunks[:0], len(stored))[:len(stored)]
	for i, ch := range stored {
		if err := p.readStoredChunk(ch, &p.chunks[i]); err != nil {
			return fmt.Errorf("stored chunk %d: %w", ch.Key, err)
		}
	}
	p.colName = slices.Grow(p.colName[:0], p.columns)
	prev := 0 // where the previous item's names start in colName
	for i := range samples {
		start := len(p.colName)
		for j := range samples[i].Layout {
			at := -1
			if prev+j < start {
				at = int(p.colName[prev+j])
			}
			p.colName = append(p.colName, p.name(samples[i].Layout[j].Name, at))
		}
		prev = start
	}
	return nil
}

// format is the index of a chunk format, added when new. A reply has a few
// formats, usually one a column: the last one found is tried first.
func (p *packer) format(dtype string, shape []int64) uint32 {
	for i := len(p.dtypes) - 1; i >= 0; i-- {
		if p.dtypes[i] == dtype && slices.Equal(p.shapes[i], shape) {
			return uint32(i)
		}
	}
	p.dtypes = append(p.dtypes, dtype)
	p.shapes = append(p.shapes, slices.Clone(shape))
	return uint32(len(p.dtypes) - 1)
}

// name is the index of a column name, added when new; at is the index of
// the name the previous item's column at the same position had, which the
// items of a table with a signature all share.
func (p *packer) name(n string, at int) uint32 {
	if at >= 0 && at < len(p.names) && p.names[at] == n {
		return uint32(at)
	}
	if i := slices.Index(p.names, n); i >= 0 {
		return uint32(i)
	}
	p.names = append(p.names, n)
	return uint32(len(p.names) - 1)
}

// fitsCompact checks what the compact layout holds in fewer bits than the
// wide one: counts of 31 bits, which the reply's totals bound, and chunk
// sizes of 32. Neither limit is reached by what a service stores; the check
// keeps a reply from saying something other than the table holds if one
// ever is.
func (p *packer) fitsCompact() error {
	if p.columns >= compactFlag || p.slices >= compactFlag {
		return fmt.Errorf("%w: %d columns and %d slices do not fit a compact reply", ErrMalformed, p.columns, p.slices)
	}
	for i := range p.chunks {
		if c := &p.chunks[i]; len(c.payload) > math.MaxUint32 {
			return fmt.Errorf("%w: chunk %d holds %d bytes, more than a compact reply holds", ErrInvalidChunk, c.key, len(c.payload))
		}
	}
	return nil
}

func (p *packer) appendColumns(b []byte, samples []tables.Sample, compact bool) []byte {
	le := binary.LittleEndian
	names := p.colName
	for i := range samples {
		for j := range samples[i].Layout {
			col := &samples[i].Layout[j]
			b = le.AppendUint32(b, names[j])
			slices := uint32(len(col.Slices))
			switch {
			case !compact:
				var squeeze uint32
				if col.Squeeze {
					squeeze = 1
				}
				b = le.AppendUint32(le.AppendUint32(b, slices), squeeze)
			case col.Squeeze:
				b = le.AppendUint32(b, slices|compactFlag)
			default:
				b = le.AppendUint32(b, slices)
			}
		}
		names = names[len(samples[i].Layout):]
	}
	return b
}

func (p *packer) appendSlices(b []byte, samples []tables.Sample) []byte {
	local := p.local
	for i := range samples {
		smp := &samples[i]
		for j := range smp.Layout {
			for _, sl := range smp.Layout[j].Slices {
				b = binary.LittleEndian.AppendUint32(b, local[sl.Chunk])
				b = binary.LittleEndian.AppendUint32(b, uint32(sl.Offset))
				b = binary.LittleEndian.AppendUint32(b, uint32(sl.Length))
			}
		}
		local = local[len(smp.Chunks):]
	}
	return b
}

// appendInfoFields appends the fields that both layouts' info records
// begin with, in 44 bytes.
func appendInfoFields(b []byte, in *tables.SampleInfo) []byte {
	le := binary.LittleEndian
	b = le.AppendUint64(b, in.Key)
	b = le.AppendUint64(b, math.Float64bits(in.Probability))
	b = le.AppendUint64(b, uint64(in.TableSize))
	b = le.AppendUint64(b, math.Float64bits(in.Priority))
	b = le.AppendUint64(b, uint64(in.InsertedAt.UnixNano()))
	return le.AppendUint32(b, uint32(in.TimesSampled))
}

func appendInfoRecord(b []byte, in *tables.SampleInfo, columns int) []byte {
	b = binary.LittleEndian.AppendUint32(appendInfoFields(b, in), uint32(columns))
	var limited byte
	if in.RateLimited {
		limited = 1
	}
	return append(b, limited, 0, 0, 0, 0, 0, 0, 0)
}

func appendCompactInfo(b []byte, in *tables.SampleInfo, columns int) []byte {
	cols := uint32(columns)
	if in.RateLimited {
		cols |= compactFlag
	}
	return binary.LittleEndian.AppendUint32(appendInfoFields(b, in), cols)
}

// appendCompactChunk leaves out the chunk's place in data and its raw
// size, which a reader derives from the sizes before it and its format.
func appendCompactChunk(b []byte, c *storedChunk) []byte {
	le := binary.LittleEndian
	b = le.AppendUint64(b, c.key)
	b = le.AppendUint32(b, uint32(len(c.payload)))
	b = le.AppendUint32(b, c.steps)
	b = le.AppendUint32(b, c.format)
	var delta byte
	if c.delta {
		delta = 1
	}
	return append(b, byte(c.compression), delta, 0, 0)
}

func appendChunkRecord(b []byte, c *storedChunk) []byte {
	le := binary.LittleEndian
	b = le.AppendUint64(b, c.key)
	b = le.AppendUint64(b, uint64(c.at))
	b = le.AppendUint64(b, uint64(len(c.payload)))
	b = le.AppendUint64(b, c.rawSize)
	b = le.AppendUint32(b, c.steps)
	b = le.AppendUint32(b, c.format)
	var delta byte
	if c.delta {
		delta = 1
	}
	return append(b, byte(c.compression), delta, 0, 0, 0, 0, 0, 0)
}

func sizeFormat(dtype string, shape []int64) int {
	return bytesField(len(dtype)) + bytesField(packedSize(shape))
}

func appendFormat(b []byte, dtype string, shape []int64) []byte {
	b = appendStringField(b, fieldFormatDtype, dtype)
	if len(shape) > 0 {
		b = appendSubmessage(b, fieldFormatShape, packedSize(shape))
		for _, d := range shape {
			b = appendVarint(b, uint64(d))
		}
	}
	return b
}
