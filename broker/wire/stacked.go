package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/reprise-rl/reprise/tables"
)

// ErrUnstackable reports sampled items that do not stack into one batch:
// they differ in their columns, or in a column's steps, dtype or step
// shape. A table with a signature never gives such items.
var ErrUnstackable = errors.New("wire: sampled items do not stack")

// BatchInfo is the sample info of a batch's items, entry i item i's.
type BatchInfo struct {
	Keys          []uint64
	Probabilities []float64
	TableSizes    []int64
	Priorities    []float64
	TimesSampled  []int32 // including this sample
	InsertedAt    []time.Time
	RateLimited   []bool // the item had to wait for the rate limiter
}

// Len is the number of items.
func (in *BatchInfo) Len() int { return len(in.Keys) }

// SampledBatch is a sample response's items stacked: each column holds
// every item's steps of it, item i's in row i of a new first axis.
type SampledBatch struct {
	Info    BatchInfo
	Columns []SampledColumn
}

// BatchReply is a decoded SampleResponse, as DecodeBatchResponse gives it.
type BatchReply struct {
	Code    Code
	Message string
	Batch   SampledBatch
	// After is the table once the sample was taken.
	After TableState
}

// DecodeBatchResponse decodes a SampleResponse as DecodeSampleResponse
// does, but stacks its items: column j of the batch has shape [B, T,
// step_shape...] ([B, step_shape...] for a squeezed column), where B is the
// number of items and T the column's steps. The items must agree on their
// columns' names and order, squeezing, steps, dtypes and step shapes (the
// items of a table with a signature do); otherwise the error matches
// ErrUnstackable.
//
// A reply in the uniform form whose chunks are stored plain, the usual
// reply of a table of one-step items, is read without a record an item.
// Where such a reply has one column whose chunks need no padding (a
// multiple of 8 bytes each), the column is b's bytes without a copy, so b
// belongs to the result and the caller must not reuse it. No two columns
// share memory.
func DecodeBatchResponse(b []byte) (BatchReply, error) {
	d := decoders.Get().(*sampleDecoder)
	defer d.release()
	head, err := d.split(b)
	if err != nil {
		return BatchReply{}, err
	}
	reply := BatchReply{Code: head.Code, Message: head.Message, After: head.After}
	if d.uniformBatch(&reply.Batch) {
		return reply, nil
	}
	if err := d.expandUniform(); err != nil {
		return BatchReply{}, err
	}
	if err := d.readChunks(); err != nil {
		return BatchReply{}, err
	}
	if err := d.readItems(); err != nil {
		return BatchReply{}, err
	}
	if reply.Batch, err = d.stack(); err != nil {
		return BatchReply{}, err
	}
	return reply, nil
}

// MakeBatchInfo is the info of n items, each entry zero.
func MakeBatchInfo(n int) BatchInfo {
	return BatchInfo{
		Keys: make([]uint64, n), Probabilities: make([]float64, n), TableSizes: make([]int64, n), Priorities: make([]float64, n),
		TimesSampled: make([]int32, n), InsertedAt: make([]time.Time, n), RateLimited: make([]bool, n),
	}
}

func (in *BatchInfo) set(i int, s *tables.SampleInfo) {
	in.Keys[i], in.Probabilities[i], in.TableSizes[i], in.Priorities[i] = s.Key, s.Probability, s.TableSize, s.Priority
	in.TimesSampled[i], in.InsertedAt[i], in.RateLimited[i] = s.TimesSampled, s.InsertedAt, s.RateLimited
}

// uniformColumn is one column of a uniform reply, as uniformBatch reads it.
type uniformColumn struct {
	name    string
	squeeze bool
	format  *sampledFormat
	steps   int64
	size    int // bytes of one item's chunk
	start   int // where the chunk lies past the item's first
}

// uniformBatch stacks a reply in the uniform form whose chunks are stored
// plain (no compression, no differences to undo) and whose items each
// have the uniform columns, and reports whether it did; it leaves any
// other reply, sound or not, to the general path, which reads and checks
// every record, so that errors take one way. Item i's chunk of column j
// lies i strides past item 0's, so neither the records a uniform reply
// leaves out nor a column of each item is made.
func (d *sampleDecoder) uniformBatch(out *SampledBatch) bool {
	f := &d.packed
	n, items := len(f.uniform)/uniformColumnSize, len(f.infos)/compactInfoSize
	if n == 0 || items == 0 || len(f.columns) > 0 || len(f.slices) > 0 || len(f.chunks) > 0 {
		return false
	}
	if uint64(items)*uint64(n) > uint64(len(f.data))/packedAlign+1 || d.readFormats() != nil {
		return false
	}
	le := binary.LittleEndian
	cols := make([]uniformColumn, n)
	at := 0
	for j := range cols {
		r := f.uniform[j*uniformColumnSize:]
		name, nsl := le.Uint32(r), le.Uint32(r[4:])
		c := r[compactColumnSize:uniformColumnSize]
		size, steps, format := uint64(le.Uint32(c[8:])), uint64(le.Uint32(c[12:])), le.Uint32(c[16:])
		compression, delta := Compression(c[20]), c[21]
		if uint64(name) >= uint64(len(f.names)) || nsl&^compactFlag != 1 || steps == 0 || uint64(format) >= uint64(len(d.formats)) {
			return false
		}
		fm := &d.formats[format]
		squeeze := nsl&compactFlag != 0
		if compression != Compression_COMPRESSION_NONE || delta > 1 || (delta == 1 && steps != 1) || (squeeze && steps != 1) ||
			fm.stepBytes == 0 || size > MaxChunkRawSize || size != uint64(fm.stepBytes)*steps {
			return false
		}
		for _, prev := range cols[:j] {
			if prev.name == f.names[name] {
				return false
			}
		}
		cols[j] = uniformColumn{name: f.names[name], squeeze: squeeze, format: fm, steps: int64(steps), size: int(size), start: at}
		at += int(size) + -int(size)&(packedAlign-1)
	}
	stride := at
	last := cols[n-1]
	if uint64(items-1)*uint64(stride)+uint64(last.start+last.size) > uint64(len(f.data)) {
		return false
	}
	for i := range items {
		if le.Uint32(f.infos[i*compactInfoSize+44:])&^compactFlag != uint32(n) {
			return false
		}
	}
	out.Info = MakeBatchInfo(items)
	for i := range items {
		info, _ := readCompactInfo(f.infos[i*compactInfoSize:])
		out.Info.set(i, &info)
	}
	out.Columns = make([]SampledColumn, n)
	dims := 0
	for _, c := range cols {
		dims += 2 + c.format.ndims
	}
	shapes := make([]int64, 0, dims)
	for j, c := range cols {
		start := len(shapes)
		shapes = append(shapes, int64(items))
		if !c.squeeze {
			shapes = append(shapes, c.steps)
		}
		shapes = append(shapes, d.dims[c.format.dims:c.format.dims+c.format.ndims]...)
		col := SampledColumn{Name: c.name, Dtype: c.format.dtype, Shape: shapes[start:len(shapes):len(shapes)]}
		if total := items * c.size; n == 1 && (items == 1 || c.size == stride) {
			col.Data = f.data[:total:total]
		} else {
			col.Data = make([]byte, total)
			for i := range items {
				copy(col.Data[i*c.size:], f.data[i*stride+c.start:i*stride+c.start+c.size])
			}
		}
		out.Columns[j] = col
	}
	return true
}

// stack lays the items readItems read out as one batch, or says why they
// do not stack.
func (d *sampleDecoder) stack() (SampledBatch, error) {
	out := SampledBatch{Info: MakeBatchInfo(len(d.items))}
	for i := range d.items {
		out.Info.set(i, &d.items[i].info)
	}
	if len(d.items) == 0 {
		return out, nil
	}
	first := &d.items[0]
	width := first.ncol
	dims := 0
	for j := range width {
		col := &d.columns[first.first+j]
		for _, prev := range d.columns[first.first : first.first+j] {
			if prev.name == col.name {
				return SampledBatch{}, fmt.Errorf("%w: sample response item %d has column %q twice", ErrMalformed, first.info.Key, col.name)
			}
		}
		dims += 2 + d.chunks[d.slices[col.first].chunk].ndims
	}
	for i := range d.items {
		it := &d.items[i]
		if it.ncol != width {
			return SampledBatch{}, fmt.Errorf("%w: item %d has %d columns, item %d has %d", ErrUnstackable, it.info.Key, it.ncol, first.info.Key, width)
		}
		for j := range width {
			a, b := &d.columns[first.first+j], &d.columns[it.first+j]
			ca, cb := &d.chunks[d.slices[a.first].chunk], &d.chunks[d.slices[b.first].chunk]
			switch {
			case a.name != b.name:
				return SampledBatch{}, fmt.Errorf("%w: item %d's column %d is %q, item %d's %q", ErrUnstackable, it.info.Key, j, b.name, first.info.Key, a.name)
			case a.squeeze != b.squeeze:
				return SampledBatch{}, fmt.Errorf("%w: column %q is squeezed in some items only", ErrUnstackable, a.name)
			case a.steps != b.steps:
				return SampledBatch{}, fmt.Errorf("%w: column %q has %d steps in item %d, %d in item %d", ErrUnstackable, a.name, b.steps, it.info.Key, a.steps, first.info.Key)
			case ca.dtype != cb.dtype || !slices.Equal(d.stepShape(ca), d.stepShape(cb)):
				return SampledBatch{}, fmt.Errorf("%w: column %q holds %s steps of shape %v in item %d, %s of shape %v in item %d",
					ErrUnstackable, a.name, cb.dtype, d.stepShape(cb), it.info.Key, ca.dtype, d.stepShape(ca), first.info.Key)
			}
		}
	}
	out.Columns = make([]SampledColumn, width)
	shapes := make([]int64, 0, dims)
	d.outs, d.pending = d.outs[:0], d.pending[:0]
	// The slices of chunks stored plain are copied as they are met, those
	// of compressed chunks a chunk at a time (copyPending).
	for j := range width {
		col := &d.columns[first.first+j]
		c := &d.chunks[d.slices[col.first].chunk]
		if len(d.items) > math.MaxInt/max(col.size, 1) {
			return SampledBatch{}, fmt.Errorf("%w: column %q of %d items is larger than memory can hold", ErrInvalidColumn, col.name, len(d.items))
		}
		start := len(shapes)
		shapes = append(shapes, int64(len(d.items)))
		if !col.squeeze {
			shapes = append(shapes, col.steps)
		}
		shapes = append(shapes, d.stepShape(c)...)
		data := make([]byte, len(d.items)*col.size)
		d.outs = append(d.outs, data)
		at := 0
		for i := range d.items {
			item := &d.columns[d.items[i].first+j]
			for _, sl := range d.slices[item.first : item.first+item.nslice] {
				at += d.copySlice(sl, data, j, at)
			}
		}
		out.Columns[j] = SampledColumn{Name: col.name, Dtype: c.dtype, Shape: shapes[start:len(shapes):len(shapes)], Data: data}
	}
	if err := d.copyPending(); err != nil {
		return SampledBatch{}, err
	}
	return out, nil
}
