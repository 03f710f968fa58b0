package wire

import (
	"math"
	"slices"
	"sync/atomic"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/reprise-rl/reprise/tables"
)

// AppendSampleResponse appends the encoding of a SampleResponse straight from the table's
// samples: no intermediate messages per item, every size computed once, the
// buffer grown once, and each chunk appended once, as stored. It encodes
// what the generated code would for the same message
// (TestAppendSampleResponse checks).
//
// after is the table once the sample was taken: its size and sampling
// weight, which a client of a sharded table picks shards by.
func AppendSampleResponse(b []byte, code Code, msg string, samples []tables.Sample, after TableState) []byte {
	// A message's length prefix needs its size, which needs its parts': the
	// sizes are taken first, in the order they are written.
	columns, refs := 0, 0
	for i := range samples {
		columns += len(samples[i].Layout)
		refs += len(samples[i].Chunks)
	}
	sizes := make([]int, 0, 2*len(samples)+columns) // per item: its size, its info's, then its columns'
	st := sizeStatus(code, msg)
	total := 1 + protowire.SizeBytes(st)
	// The chunks go once each, in order of first use.
	keys := make([]uint64, 0, refs)
	seen := newKeyIndex(refs)
	distinct := make([][]byte, 0, refs)
	for i := range samples {
		smp := &samples[i]
		info := sizeSampleInfo(&smp.Info)
		at := len(sizes)
		sizes = append(sizes, 0, info)
		n := 1 + protowire.SizeBytes(info)
		for j := range smp.Layout {
			c := sizeColumn(&smp.Layout[j], smp.Chunks)
			sizes = append(sizes, c)
			n += 1 + protowire.SizeBytes(c)
		}
		sizes[at] = n
		total += 1 + protowire.SizeBytes(n)
		for _, ch := range smp.Chunks {
			keys = append(keys, ch.Key)
			if !seen.add(keys, len(keys)-1) {
				keys = keys[:len(keys)-1]
				continue
			}
			distinct = append(distinct, ch.Data)
			total += 1 + protowire.SizeBytes(len(ch.Data))
		}
	}
	total += sizeTableState(after)
	touch(distinct)
	b = slices.Grow(b, total)
	// The status is always set, even when empty (OK).
	b = appendTag(b, 1, protowire.BytesType)
	b = appendVarint(b, uint64(st))
	b = appendStatus(b, code, msg)
	for i := range samples {
		smp := &samples[i]
		b = appendTag(b, 2, protowire.BytesType)
		b = appendVarint(b, uint64(sizes[0]))
		b = appendTag(b, 1, protowire.BytesType)
		b = appendVarint(b, uint64(sizes[1]))
		b = appendSampleInfo(b, &smp.Info)
		sizes = sizes[2:]
		for j := range smp.Layout {
			b = appendTag(b, 2, protowire.BytesType)
			b = appendVarint(b, uint64(sizes[j]))
			b = appendColumn(b, &smp.Layout[j], smp.Chunks)
		}
		sizes = sizes[len(smp.Layout):]
	}
	for _, data := range distinct {
		b = appendTag(b, 3, protowire.BytesType)
		b = appendBytes(b, data)
	}
	return appendTableState(b, after)
}

// touch reads the first bytes of every chunk a reply copies, one cache line
// apart, before the copying starts. Sampled chunks lie anywhere in memory:
// read like this, their cache misses overlap, where the copies, one after
// the other, would take them in turn. The copies find the rest of a large
// chunk by the CPU's own prefetching once they stream through it.
func touch(chunks [][]byte) {
	var sum uint64
	for _, c := range chunks {
		sum += touchLines(c)
	}
	touched.Add(sum)
}

// touchLines reads the first lines of c, as touch does, and sums what it
// read.
func touchLines(c []byte) uint64 {
	const lines, lineBytes = 16, 64
	var sum uint64
	for i := 0; i < len(c) && i < lines*lineBytes; i += lineBytes {
		sum += uint64(c[i])
	}
	return sum
}

// touched keeps touch's reads, which the compiler would otherwise drop.
var touched atomic.Uint64

// TableState is a table's size and sampling weight (see TableInfo's
// weight_fraction), as a sample response reports them.
type TableState = tables.State

// sizeTableState and appendTableState write SampleResponse's fields 4 to 6,
// each left out when zero, as proto3 does.
func sizeTableState(s TableState) int {
	return varintField(uint64(s.Size)) + doubleField(s.Weight.Fraction) + varintField(protowire.EncodeZigZag(s.Weight.Exponent))
}

func appendTableState(b []byte, s TableState) []byte {
	b = appendVarintField(b, 4, uint64(s.Size))
	b = appendDoubleField(b, 5, s.Weight.Fraction)
	return appendVarintField(b, 6, protowire.EncodeZigZag(s.Weight.Exponent))
}

func sizeStatus(code Code, msg string) int {
	n := 0
	if code != 0 {
		n += 1 + protowire.SizeVarint(uint64(code))
	}
	if msg != "" {
		n += 1 + protowire.SizeBytes(len(msg))
	}
	return n
}

func appendStatus(b []byte, code Code, msg string) []byte {
	if code != 0 {
		b = appendTag(b, 1, protowire.VarintType)
		b = appendVarint(b, uint64(code))
	}
	if msg != "" {
		b = appendTag(b, 2, protowire.BytesType)
		b = appendString(b, msg)
	}
	return b
}

func sizeSampledItem(smp *tables.Sample) int {
	n := 1 + protowire.SizeBytes(sizeSampleInfo(&smp.Info))
	for j := range smp.Layout {
		n += 1 + protowire.SizeBytes(sizeColumn(&smp.Layout[j], smp.Chunks))
	}
	return n
}

// varintField and doubleField size one non-zero scalar field of a low
// field number (one-byte tag); zero values are not encoded in proto3.
func varintField(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

func doubleField(v float64) int {
	if v == 0 && !math.Signbit(v) {
		return 0
	}
	return 1 + 8
}

func sizeSampleInfo(in *tables.SampleInfo) int {
	n := varintField(in.Key) + doubleField(in.Probability) + varintField(uint64(in.TableSize)) +
		doubleField(in.Priority) + varintField(uint64(int64(in.TimesSampled))) + varintField(uint64(in.InsertedAt.UnixNano()))
	if in.RateLimited {
		n += 2
	}
	return n
}

// appendVarint is protowire.AppendVarint with its one-byte case inline:
// every tag Reprise writes and most of its values take one byte, and
// protowire's call for each was a tenth of a producer's CPU.
func appendVarint(b []byte, v uint64) []byte {
	if v < 0x80 {
		return append(b, byte(v))
	}
	return protowire.AppendVarint(b, v)
}

func appendTag(b []byte, num protowire.Number, typ protowire.Type) []byte {
	return appendVarint(b, uint64(num)<<3|uint64(typ))
}

func appendString(b []byte, s string) []byte {
	return append(appendVarint(b, uint64(len(s))), s...)
}

func appendBytes(b, v []byte) []byte {
	return append(appendVarint(b, uint64(len(v))), v...)
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, num, protowire.VarintType)
	return appendVarint(b, v)
}

func appendDoubleField(b []byte, num protowire.Number, v float64) []byte {
	if v == 0 && !math.Signbit(v) {
		return b
	}
	b = appendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, math.Float64bits(v))
}

func appendSampleInfo(b []byte, in *tables.SampleInfo) []byte {
	b = appendVarintField(b, 1, in.Key)
	b = appendDoubleField(b, 2, in.Probability)
	b = appendVarintField(b, 3, uint64(in.TableSize))
	b = appendDoubleField(b, 4, in.Priority)
	b = appendVarintField(b, 5, uint64(int64(in.TimesSampled)))
	b = appendVarintField(b, 6, uint64(in.InsertedAt.UnixNano()))
	if in.RateLimited {
		b = appendVarintField(b, 7, 1)
	}
	return b
}

// sizeSlice, sizeColumn and appendColumn write a column with the keys of
// its slices' chunks, which the layout gives by their place in chunks.
func sizeSlice(sl *tables.LayoutSlice, chunks []*tables.Chunk) int {
	return varintField(chunks[sl.Chunk].Key) + varintField(uint64(int64(sl.Offset))) + varintField(uint64(int64(sl.Length)))
}

func sizeColumn(c *tables.LayoutColumn, chunks []*tables.Chunk) int {
	n := 0
	if c.Name != "" {
		n += 1 + protowire.SizeBytes(len(c.Name))
	}
	for k := range c.Slices {
		n += 1 + protowire.SizeBytes(sizeSlice(&c.Slices[k], chunks))
	}
	if c.Squeeze {
		n += 2
	}
	return n
}

func appendColumn(b []byte, c *tables.LayoutColumn, chunks []*tables.Chunk) []byte {
	if c.Name != "" {
		b = appendTag(b, 1, protowire.BytesType)
		b = appendString(b, c.Name)
	}
	for k := range c.Slices {
		sl := &c.Slices[k]
		b = appendTag(b, 2, protowire.BytesType)
		b = appendVarint(b, uint64(sizeSlice(sl, chunks)))
		b = appendVarintField(b, 1, chunks[sl.Chunk].Key)
		b = appendVarintField(b, 2, uint64(int64(sl.Offset)))
		b = appendVarintField(b, 3, uint64(int64(sl.Length)))
	}
	if c.Squeeze {
		b = appendVarintField(b, 3, 1)
	}
	return b
}

// FromTableColumns is an item's trajectory as the wire carries it.
func FromTableColumns(cols []tables.Column) []*TrajectoryColumn {
	out := make([]*TrajectoryColumn, len(cols))
	for i, c := range cols {
		tc := &TrajectoryColumn{Name: c.Name, Squeeze: c.Squeeze, Slices: make([]*ColumnSlice, len(c.Slices))}
		for j, sl := range c.Slices {
			tc.Slices[j] = &ColumnSlice{ChunkKey: sl.Chunk, Offset: sl.Offset, Length: sl.Length}
		}
		out[i] = tc
	}
	return out
}

// ToTableColumns is a trajectory from the wire as the tables hold it.
func ToTableColumns(cols []*TrajectoryColumn) []tables.Column {
	out := make([]tables.Column, len(cols))
	for i, c := range cols {
		col := tables.Column{Name: c.Name, Squeeze: c.Squeeze, Slices: make([]tables.Slice, len(c.Slices))}
		for j, sl := range c.Slices {
			col.Slices[j] = tables.Slice{Chunk: sl.ChunkKey, Offset: sl.Offset, Length: sl.Length}
		}
		out[i] = col
	}
	return out
}
