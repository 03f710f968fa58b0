package wire

import (
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/tables"
)

// AppendSampleResponse appends the encoding of a SampleResponse straight from the table's
// samples: no intermediate messages per item, sizes computed exactly, and
// each chunk appended once, as stored. It encodes what the generated code
// would for the same message (TestAppendSampleResponse checks).
func AppendSampleResponse(b []byte, code Code, msg string, samples []tables.Sample) []byte {
	// The status is always set, even when empty (OK).
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(sizeStatus(code, msg)))
	b = appendStatus(b, code, msg)
	for i := range samples {
		smp := &samples[i]
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeSampledItem(smp)))
		info := sizeSampleInfo(&smp.Info)
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(info))
		b = appendSampleInfo(b, &smp.Info)
		for j := range smp.Trajectory {
			c := &smp.Trajectory[j]
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(sizeColumn(c)))
			b = appendColumn(b, c)
		}
	}
	seen := make(map[uint64]struct{}, len(samples))
	for i := range samples {
		for _, ch := range samples[i].Chunks {
			if _, dup := seen[ch.Key]; dup {
				continue
			}
			seen[ch.Key] = struct{}{}
			b = protowire.AppendTag(b, 3, protowire.BytesType)
			b = protowire.AppendBytes(b, ch.Data)
		}
	}
	return b
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
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(code))
	}
	if msg != "" {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, msg)
	}
	return b
}

func sizeSampledItem(smp *tables.Sample) int {
	n := 1 + protowire.SizeBytes(sizeSampleInfo(&smp.Info))
	for j := range smp.Trajectory {
		n += 1 + protowire.SizeBytes(sizeColumn(&smp.Trajectory[j]))
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

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendDoubleField(b []byte, num protowire.Number, v float64) []byte {
	if v == 0 && !math.Signbit(v) {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
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

func sizeSlice(sl *tables.Slice) int {
	return varintField(sl.Chunk) + varintField(uint64(int64(sl.Offset))) + varintField(uint64(int64(sl.Length)))
}

func sizeColumn(c *tables.Column) int {
	n := 0
	if c.Name != "" {
		n += 1 + protowire.SizeBytes(len(c.Name))
	}
	for k := range c.Slices {
		n += 1 + protowire.SizeBytes(sizeSlice(&c.Slices[k]))
	}
	if c.Squeeze {
		n += 2
	}
	return n
}

func appendColumn(b []byte, c *tables.Column) []byte {
	if c.Name != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, c.Name)
	}
	for k := range c.Slices {
		sl := &c.Slices[k]
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeSlice(sl)))
		b = appendVarintField(b, 1, sl.Chunk)
		b = appendVarintField(b, 2, uint64(int64(sl.Offset)))
		b = appendVarintField(b, 3, uint64(int64(sl.Length)))
	}
	if c.Squeeze {
		b = appendVarintField(b, 3, 1)
	}
	return b
}

// ReadSampleResponse splits a SampleResponse into its status, its items
// and its chunks, which stay sub-slices of b: a chunk's bytes are read in
// place, not copied first.
func ReadSampleResponse(b []byte) (status *Status, items []*SampledItem, chunks [][]byte, err error) {
	status = &Status{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, nil, fmt.Errorf("%w: sample response: %v", ErrMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType || num < 1 || num > 3 {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil, nil, nil, fmt.Errorf("%w: sample response: %v", ErrMalformed, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, nil, nil, fmt.Errorf("%w: sample response: %v", ErrMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		switch num {
		case 1:
			err = proto.Unmarshal(v, status)
		case 2:
			it := &SampledItem{}
			err = proto.Unmarshal(v, it)
			items = append(items, it)
		case 3:
			chunks = append(chunks, v)
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%w: sample response: %v", ErrMalformed, err)
		}
	}
	return status, items, chunks, nil
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

// DecodeSampled decodes a sample response's chunks, once each, and gathers
// every item's columns from them: columns[i][j] is column j of items[i].
func DecodeSampled(items []*SampledItem, chunks [][]byte) (columns [][]*Tensor, err error) {
	decoded := make(map[uint64]*Tensor, len(chunks))
	for i, raw := range chunks {
		ch, err := ReadChunk(raw)
		if err != nil {
			return nil, fmt.Errorf("chunk %d of the response: %w", i, err)
		}
		t, err := DecodeChunk(ch)
		if err != nil {
			return nil, fmt.Errorf("chunk %d: %w", ch.Key, err)
		}
		decoded[ch.Key] = t
	}
	lookup := func(key uint64) (*Tensor, bool) {
		t, ok := decoded[key]
		return t, ok
	}
	columns = make([][]*Tensor, len(items))
	total := 0
	for _, it := range items {
		total += len(it.Columns)
	}
	// One backing array for every item's columns: one allocation a reply.
	flat := make([]*Tensor, total)
	for i, it := range items {
		columns[i], flat = flat[:len(it.Columns):len(it.Columns)], flat[len(it.Columns):]
		for j, col := range it.Columns {
			if columns[i][j], err = GatherColumn(col, lookup); err != nil {
				return nil, fmt.Errorf("item %d: %w", it.GetInfo().GetKey(), err)
			}
		}
	}
	return columns, nil
}
