package wire

import (
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of InsertBatch, Chunk and Item in reprise.proto, for the
// hand-written encoder and parsers.
const (
	FieldBatchProducer = 1
	FieldBatchSequence = 2
	FieldBatchChunks   = 3
	FieldBatchItems    = 4
	FieldBatchRelease  = 5
	FieldBatchEnd      = 6
	FieldBatchWinStart = 7
	FieldBatchWindow   = 8
	FieldBatchNotice   = 9

	FieldChunkKey         = 1
	FieldChunkDtype       = 2
	FieldChunkStepShape   = 3
	FieldChunkLength      = 4
	FieldChunkCompression = 5
	FieldChunkDelta       = 6
	FieldChunkRawSize     = 7
	FieldChunkData        = 8
	FieldChunkEpisode     = 9
	FieldChunkEpisodeStep = 10

	FieldItemKey           = 1
	FieldItemTable         = 2
	FieldItemPriority      = 3
	FieldItemColumns       = 4
	FieldItemPolicyVersion = 5

	FieldColumnName    = 1
	FieldColumnSlices  = 2
	FieldColumnSqueeze = 3

	FieldSliceChunk  = 1
	FieldSliceOffset = 2
	FieldSliceLength = 3
)

// ConsumeUint64s appends the values of one repeated uint64 field, packed
// or not, to dst and returns the rest of b.
func ConsumeUint64s(b []byte, typ protowire.Type, dst []uint64) ([]uint64, []byte, error) {
	return consumeVarints(b, typ, dst)
}

// consumeVarints appends the values of one repeated varint field of a
// 64-bit type, packed or not, to dst and returns the rest of b.
func consumeVarints[T ~int64 | ~uint64](b []byte, typ protowire.Type, dst []T) ([]T, []byte, error) {
	switch typ {
	case protowire.VarintType:
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return nil, nil, protowire.ParseError(n)
		}
		return append(dst, T(v)), b[n:], nil
	case protowire.BytesType:
		packed, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, nil, protowire.ParseError(n)
		}
		for len(packed) > 0 {
			v, m := protowire.ConsumeVarint(packed)
			if m < 0 {
				return nil, nil, protowire.ParseError(m)
			}
			dst, packed = append(dst, T(v)), packed[m:]
		}
		return dst, b[n:], nil
	}
	return nil, nil, fmt.Errorf("wire type %d for a repeated 64-bit integer", typ)
}

// ReadChunk decodes an encoded Chunk without copying its data: the
// returned chunk's Data is a sub-slice of b.
func ReadChunk(b []byte) (*Chunk, error) {
	c := &Chunk{}
	shape, err := readChunkInto(c, b, nil)
	if err != nil {
		return nil, err
	}
	if len(shape) > 0 {
		c.StepShape = shape
	}
	return c, nil
}

// CountMessages counts the length-delimited fields numbered a and b at the
// top level of an encoded message: how many of each of two repeated
// message fields it holds, so that a reader can size its lists once. It
// stops at the first malformed field, which the reader then reports.
func CountMessages(m []byte, a, b protowire.Number) (na, nb int) {
	for len(m) > 0 {
		num, typ, n := protowire.ConsumeTag(m)
		if n < 0 {
			break
		}
		m = m[n:]
		if n = protowire.ConsumeFieldValue(num, typ, m); n < 0 {
			break
		}
		m = m[n:]
		switch {
		case typ != protowire.BytesType:
		case num == a:
			na++
		case num == b:
			nb++
		}
	}
	return na, nb
}

// A ChunkReader decodes encoded Chunks one after another into one Chunk,
// reusing its step shape's array, so that reading many allocates nothing
// (ReadChunk allocates a Chunk each time). The zero ChunkReader is ready to
// use; it is not safe for concurrent use.
type ChunkReader struct {
	c    Chunk
	dims []int64
}

// Read decodes b as ReadChunk does. The returned Chunk is the reader's own,
// valid until the next Read; its Data is a sub-slice of b.
func (r *ChunkReader) Read(b []byte) (*Chunk, error) {
	dims, err := readChunkInto(&r.c, b, r.dims[:0])
	if err != nil {
		return nil, err
	}
	r.dims = dims
	if len(dims) > 0 {
		r.c.StepShape = dims
	}
	return &r.c, nil
}

// readChunkInto decodes an encoded Chunk into c, whose fields it sets all
// of but StepShape: it appends the step shape to dims instead, so that a
// reader of many chunks keeps their shapes in one array. Data is a
// sub-slice of b.
func readChunkInto(c *Chunk, b []byte, dims []int64) ([]int64, error) {
	c.Key, c.Dtype, c.StepShape, c.Length, c.Compression = 0, "", nil, 0, 0
	c.DeltaEncoded, c.RawSize, c.Data, c.EpisodeId, c.EpisodeStep = false, 0, nil, 0, 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("%w: chunk: %v", ErrInvalidChunk, protowire.ParseError(n))
		}
		b = b[n:]
		var v uint64
		switch {
		case num == FieldChunkStepShape:
			var err error
			if dims, b, err = consumeVarints(b, typ, dims); err != nil {
				return nil, fmt.Errorf("%w: chunk %d step shape: %v", ErrInvalidChunk, c.Key, err)
			}
			continue
		case typ == protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case num == FieldChunkDtype && typ == protowire.BytesType:
			var s []byte
			s, n = protowire.ConsumeBytes(b)
			c.Dtype = dtypeName(s)
		case num == FieldChunkData && typ == protowire.BytesType:
			c.Data, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return nil, fmt.Errorf("%w: chunk %d field %d: %v", ErrInvalidChunk, c.Key, num, protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.VarintType {
			continue
		}
		switch num {
		case FieldChunkKey:
			c.Key = v
		case FieldChunkLength:
			if v > math.MaxInt32 {
				return nil, fmt.Errorf("%w: chunk %d length %d", ErrInvalidChunk, c.Key, v)
			}
			c.Length = int32(v)
		case FieldChunkCompression:
			if v > math.MaxInt32 {
				return nil, fmt.Errorf("%w: chunk %d: unknown compression %d", ErrInvalidChunk, c.Key, v)
			}
			c.Compression = Compression(v)
		case FieldChunkDelta:
			c.DeltaEncoded = v != 0
		case FieldChunkRawSize:
			c.RawSize = v
		case FieldChunkEpisode:
			c.EpisodeId = v
		case FieldChunkEpisodeStep:
			c.EpisodeStep = int64(v)
		}
	}
	return dims, nil
}
