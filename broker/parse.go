package broker

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// insertBatch is an InsertBatch whose chunks are kept as the exact bytes
// they arrived in. The chunk store holds those bytes and sample responses
// send them on as they are: a chunk is neither copied nor re-encoded on its
// way from actor to learner.
type insertBatch struct {
	producerID string
	sequence   uint64
	chunks     []rawChunk
	items      []*wire.Item
	release    []uint64
	end        bool

	storedAt time.Time // when the stream stored it
	raw      []byte    // the message as published, for checkpoints
	done     int       // items already applied
}

type rawChunk struct {
	chunk *tables.Chunk // nil when the chunk's header is invalid
	key   uint64
	err   error
}

// Field numbers of InsertBatch and Chunk in reprise.proto.
const (
	fieldBatchProducer = 1
	fieldBatchSequence = 2
	fieldBatchChunks   = 3
	fieldBatchItems    = 4
	fieldBatchRelease  = 5
	fieldBatchEnd      = 6

	fieldChunkKey         = 1
	fieldChunkDtype       = 2
	fieldChunkStepShape   = 3
	fieldChunkLength      = 4
	fieldChunkCompression = 5
	fieldChunkDelta       = 6
	fieldChunkRawSize     = 7
	fieldChunkData        = 8
	fieldChunkEpisode     = 9
	fieldChunkEpisodeStep = 10
)

func parseInsertBatch(b []byte) (*insertBatch, error) {
	out := &insertBatch{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("%w: insert batch: %v", ErrInvalidMessage, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == fieldBatchProducer && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch producer id: %v", ErrInvalidMessage, protowire.ParseError(n))
			}
			out.producerID, b = string(v), b[n:]
		case num == fieldBatchSequence && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch sequence: %v", ErrInvalidMessage, protowire.ParseError(n))
			}
			out.sequence, b = v, b[n:]
		case num == fieldBatchChunks && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch chunk %d: %v", ErrInvalidMessage, len(out.chunks), protowire.ParseError(n))
			}
			c, err := parseChunk(v)
			out.chunks, b = append(out.chunks, rawChunk{chunk: c, key: chunkKeyOf(c), err: err}), b[n:]
		case num == fieldBatchItems && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch item %d: %v", ErrInvalidMessage, len(out.items), protowire.ParseError(n))
			}
			item := &wire.Item{}
			if err := proto.Unmarshal(v, item); err != nil {
				return nil, fmt.Errorf("%w: insert batch item %d: %v", ErrInvalidMessage, len(out.items), err)
			}
			out.items, b = append(out.items, item), b[n:]
		case num == fieldBatchRelease:
			var err error
			if out.release, b, err = consumeUint64s(b, typ, out.release); err != nil {
				return nil, fmt.Errorf("%w: insert batch release keys: %v", ErrInvalidMessage, err)
			}
		case num == fieldBatchEnd && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch end flag: %v", ErrInvalidMessage, protowire.ParseError(n))
			}
			out.end, b = v != 0, b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, fmt.Errorf("%w: insert batch field %d: %v", ErrInvalidMessage, num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	if out.producerID == "" {
		return nil, fmt.Errorf("%w: insert batch without a producer id", ErrInvalidMessage)
	}
	return out, nil
}

func chunkKeyOf(c *tables.Chunk) uint64 {
	if c == nil {
		return 0
	}
	return c.Key
}

// consumeUint64s reads a repeated uint64 field, packed or not.
func consumeUint64s(b []byte, typ protowire.Type, dst []uint64) ([]uint64, []byte, error) {
	switch typ {
	case protowire.VarintType:
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return nil, nil, protowire.ParseError(n)
		}
		return append(dst, v), b[n:], nil
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
			dst, packed = append(dst, v), packed[m:]
		}
		return dst, b[n:], nil
	}
	return nil, nil, fmt.Errorf("wire type %d for a repeated uint64", typ)
}

// readChunk decodes an encoded Chunk without copying its data: the
// returned chunk's Data is a sub-slice of b.
func readChunk(b []byte) (*wire.Chunk, error) {
	c := &wire.Chunk{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("%w: chunk: %v", ErrInvalidMessage, protowire.ParseError(n))
		}
		b = b[n:]
		var (
			v   uint64
			err error
		)
		switch {
		case num == fieldChunkStepShape:
			var dims []uint64
			if dims, b, err = consumeUint64s(b, typ, nil); err != nil {
				return nil, fmt.Errorf("%w: chunk %d step shape: %v", ErrInvalidMessage, c.Key, err)
			}
			for _, d := range dims {
				c.StepShape = append(c.StepShape, int64(d))
			}
			continue
		case typ == protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case num == fieldChunkDtype && typ == protowire.BytesType:
			var s []byte
			s, n = protowire.ConsumeBytes(b)
			c.Dtype = string(s)
		case num == fieldChunkData && typ == protowire.BytesType:
			c.Data, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return nil, fmt.Errorf("%w: chunk %d field %d: %v", ErrInvalidMessage, c.Key, num, protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.VarintType {
			continue
		}
		switch num {
		case fieldChunkKey:
			c.Key = v
		case fieldChunkLength:
			if v > math.MaxInt32 {
				return nil, fmt.Errorf("%w: chunk %d length %d", ErrInvalidMessage, c.Key, v)
			}
			c.Length = int32(v)
		case fieldChunkCompression:
			if v > math.MaxInt32 {
				return nil, fmt.Errorf("%w: chunk %d: unknown compression %d", ErrInvalidMessage, c.Key, v)
			}
			c.Compression = wire.Compression(v)
		case fieldChunkDelta:
			c.DeltaEncoded = v != 0
		case fieldChunkRawSize:
			c.RawSize = v
		case fieldChunkEpisode:
			c.EpisodeId = v
		case fieldChunkEpisodeStep:
			c.EpisodeStep = int64(v)
		}
	}
	return c, nil
}

// parseChunk reads a chunk's header and checks that it describes a
// well-formed tensor: known dtype, non-negative shape, a raw size that
// matches and fits MaxChunkRawSize. The returned chunk's Data is b, the
// whole encoded chunk, which is what the store keeps and sends on.
func parseChunk(b []byte) (*tables.Chunk, error) {
	wc, err := readChunk(b)
	if err != nil {
		return nil, err
	}
	c := &tables.Chunk{Key: wc.Key, DType: wc.Dtype, Shape: wc.StepShape, Length: wc.Length, Data: b}
	compression, rawSize, dataLen := wc.Compression, wc.RawSize, len(wc.Data)
	if _, ok := wire.Compression_name[int32(compression)]; !ok {
		return nil, fmt.Errorf("%w: chunk %d: unknown compression %d", ErrInvalidMessage, c.Key, compression)
	}
	if dataLen == 0 && rawSize > 0 {
		return nil, fmt.Errorf("%w: chunk %d has no data", ErrInvalidMessage, c.Key)
	}
	if c.Key == 0 {
		return nil, fmt.Errorf("%w: chunk without a key", ErrInvalidMessage)
	}
	if c.Length < 1 {
		return nil, fmt.Errorf("%w: chunk %d: length %d (must be >= 1)", ErrInvalidMessage, c.Key, c.Length)
	}
	// The header must describe exactly raw_size bytes of a known dtype; the
	// codec checks the same again when a learner decodes.
	want, err := tensorBytes(c.DType, int64(c.Length), c.Shape)
	if err != nil {
		return nil, fmt.Errorf("%w: chunk %d: %v", ErrInvalidMessage, c.Key, err)
	}
	if want != rawSize {
		return nil, fmt.Errorf("%w: chunk %d: raw size %d, but %d steps of %s%v take %d bytes", ErrInvalidMessage, c.Key, rawSize, c.Length, c.DType, c.Shape, want)
	}
	return c, nil
}

// tensorBytes is the size of steps cells of dtype and shape, refusing
// anything over wire.MaxChunkRawSize (which also rules out overflow).
func tensorBytes(dtype string, steps int64, shape []int64) (uint64, error) {
	elem, err := wire.ElemSize(dtype)
	if err != nil {
		return 0, err
	}
	total := uint64(steps) * uint64(elem)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		if d != 0 && total > wire.MaxChunkRawSize/uint64(d) {
			return 0, fmt.Errorf("%d steps of %s%v exceed the %d-byte chunk limit", steps, dtype, shape, uint64(wire.MaxChunkRawSize))
		}
		total *= uint64(d)
	}
	if total > wire.MaxChunkRawSize {
		return 0, fmt.Errorf("%d steps of %s%v exceed the %d-byte chunk limit", steps, dtype, shape, uint64(wire.MaxChunkRawSize))
	}
	return total, nil
}
