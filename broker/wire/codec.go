package wire

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// Errors returned by the codec. They are wrapped with details naming the
// offending field, step, column or chunk; match them with errors.Is.
var (
	// ErrInvalidTensor: a tensor's dtype is unknown, a dimension is
	// negative, or its data does not hold exactly prod(shape) elements.
	ErrInvalidTensor = errors.New("wire: invalid tensor")
	// ErrInvalidChunk: a chunk cannot be encoded or decoded as asked.
	ErrInvalidChunk = errors.New("wire: invalid chunk")
	// ErrInvalidColumn: a trajectory column's slices do not fit its chunks.
	ErrInvalidColumn = errors.New("wire: invalid trajectory column")
	// ErrMismatch: tensors that must agree on dtype and shape do not, or a
	// typed accessor was called on a tensor of another dtype.
	ErrMismatch = errors.New("wire: dtype or shape mismatch")
	// ErrMissingChunk: a trajectory column references a chunk the caller
	// does not have.
	ErrMissingChunk = errors.New("wire: missing chunk")
	// ErrMalformed: bytes that do not parse as the message they should be.
	ErrMalformed = errors.New("wire: malformed message")
)

// MaxChunkRawSize bounds the decompressed size of one chunk, in bytes.
// DecodeChunk checks a chunk's declared size against it before allocating,
// so a hostile message costs a reader at most this much memory, and
// EncodeChunk refuses to build chunks that readers would reject. Useful
// chunks are far smaller: a chunk travels whole with every sample that
// touches it, and a JetStream message is limited to the server's
// max_payload (1 MiB by default).
const MaxChunkRawSize = 256 << 20

// zstdLevel trades encode speed for ratio. Measured on chunks of 16
// similar 84x84 uint8 frames (the package benchmarks, 2 cores):
// SpeedFastest takes ~75 µs a chunk for a ratio of 123 (206 with delta);
// SpeedDefault is about as fast for 152 (239); SpeedBetterCompression is
// 1.5x slower (8x with delta) for 129 (269). Decoding speed hardly depends
// on the level.
const zstdLevel = zstd.SpeedDefault

// zstdMaxBlockSize is the largest output of one zstd block (RFC 8878,
// Block_Maximum_Size). Every block costs at least 3 header bytes, so n bytes
// of zstd data can never decode to more than n/3 such blocks.
const zstdMaxBlockSize = 128 << 10

type dtypeInfo struct {
	name    string
	size    int
	integer bool
}

func init() {
	for name, info := range dtypes {
		info.name = name
		dtypes[name] = info
	}
}

// dtypeName is the dtype named by b, as a string shared by every reader of
// it: chunk headers repeat a handful of names, which need no copy each.
func dtypeName(b []byte) string {
	if info, ok := dtypes[string(b)]; ok {
		return info.name
	}
	return string(b)
}

// dtypes lists the supported element types by their numpy names.
var dtypes = map[string]dtypeInfo{
	"bool":       {size: 1},
	"int8":       {size: 1, integer: true},
	"int16":      {size: 2, integer: true},
	"int32":      {size: 4, integer: true},
	"int64":      {size: 8, integer: true},
	"uint8":      {size: 1, integer: true},
	"uint16":     {size: 2, integer: true},
	"uint32":     {size: 4, integer: true},
	"uint64":     {size: 8, integer: true},
	"float16":    {size: 2},
	"bfloat16":   {size: 2},
	"float32":    {size: 4},
	"float64":    {size: 8},
	"complex64":  {size: 8},
	"complex128": {size: 16},
}

// ElemSize returns the size in bytes of one element of dtype, a numpy
// dtype name: bool, int8, int16, int32, int64, uint8, uint16, uint32,
// uint64, float16, bfloat16, float32, float64, complex64 or complex128.
func ElemSize(dtype string) (int, error) {
	info, ok := dtypes[dtype]
	if !ok {
		return 0, fmt.Errorf("%w: unknown dtype %q", ErrInvalidTensor, dtype)
	}
	return info.size, nil
}

// ValidateTensor reports whether t is well formed: a known dtype, no
// negative dimension, and exactly prod(shape) elements of data.
func ValidateTensor(t *Tensor) error {
	if err := validate(t); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidTensor, err)
	}
	return nil
}

// validate is ValidateTensor without the sentinel, for callers that add
// their own context before wrapping.
func validate(t *Tensor) error {
	if t == nil {
		return errors.New("tensor is nil")
	}
	info, ok := dtypes[t.Dtype]
	if !ok {
		return fmt.Errorf("unknown dtype %q", t.Dtype)
	}
	n, err := numElements(t.Shape, math.MaxInt64/int64(info.size))
	if err != nil {
		return fmt.Errorf("shape %v: %v", t.Shape, err)
	}
	if want := n * int64(info.size); int64(len(t.Data)) != want {
		return fmt.Errorf("data has %d bytes, shape %v of %s needs %d", len(t.Data), t.Shape, t.Dtype, want)
	}
	return nil
}

// numElements returns prod(shape), or an error if a dimension is negative
// or the product exceeds limit. A zero dimension makes the product zero
// whatever the others are, as in numpy.
func numElements(shape []int64, limit int64) (int64, error) {
	zero := false
	for i, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("dimension %d is %d", i, d)
		}
		zero = zero || d == 0
	}
	if zero {
		return 0, nil
	}
	n := int64(1)
	for _, d := range shape {
		if n > limit/d {
			return 0, fmt.Errorf("more than %d elements", limit)
		}
		n *= d
	}
	return n, nil
}

// Codec is the compression EncodeChunk applies. The zero value is Zstd.
type Codec uint8

const (
	// Zstd compresses well at a few hundred MB/s; the default.
	Zstd Codec = iota
	// S2 is faster than Zstd and compresses less.
	S2
	// Uncompressed stores the raw bytes; best for incompressible data such
	// as random floats.
	Uncompressed
)

func (c Codec) String() string {
	switch c {
	case Zstd:
		return "zstd"
	case S2:
		return "s2"
	case Uncompressed:
		return "none"
	}
	return fmt.Sprintf("Codec(%d)", uint8(c))
}

// ChunkOptions control EncodeChunk. The zero value compresses with zstd
// and does not delta-encode.
type ChunkOptions struct {
	// Codec compresses the chunk's bytes. When compression would not save
	// at least an eighth of them, as with random floats, the chunk is
	// stored uncompressed instead, sparing every learner that samples it a
	// decompression for a few bytes (ZFS keeps a compressed block on the
	// same terms); Chunk.Compression tells which.
	Codec Codec
	// Delta stores every step but the first as its element-wise difference
	// from the previous step (wrapping), which makes slowly changing
	// integer data such as video frames compress much better. It applies to
	// integer dtypes only and is ignored for the others, as in Reverb:
	// float differences do not round-trip exactly and bool differences are
	// not numbers. Chunk.DeltaEncoded tells whether it was applied.
	Delta bool
	// EpisodeID and EpisodeStep are copied into the chunk for readers that
	// care where it came from.
	EpisodeID   uint64
	EpisodeStep int64
	// Buffer, when large enough, holds the chunk's Data instead of a new
	// allocation: a producer passes the Data of a chunk it sent and will
	// not read again, and so encodes large steps without allocating (and
	// zeroing) their bytes once more.
	Buffer []byte
}

var (
	zstdEncoder = sync.OnceValues(func() (*zstd.Encoder, error) {
		return zstd.NewWriter(nil, zstd.WithEncoderLevel(zstdLevel))
	})
	// The decoder caps every DecodeAll at the capacity of its destination,
	// which DecodeChunk sizes to the chunk's checked raw size.
	zstdDecoder = sync.OnceValues(func() (*zstd.Decoder, error) {
		return zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(0),
			zstd.WithDecodeAllCapLimit(true),
			zstd.WithDecoderMaxMemory(MaxChunkRawSize),
			zstd.WithDecoderMaxWindow(MaxChunkRawSize),
		)
	})
)

// EncodeChunk batches steps, which must all have the same dtype and shape,
// along a new leading axis into a chunk with the given key, delta-encodes
// and compresses it as opts say. The steps are not modified or retained.
// It is safe for concurrent use.
func EncodeChunk(key uint64, steps []*Tensor, opts ChunkOptions) (*Chunk, error) {
	if opts.Codec > Uncompressed {
		return nil, fmt.Errorf("%w: chunk %d: unknown codec %v", ErrInvalidChunk, key, opts.Codec)
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("%w: chunk %d has no steps", ErrInvalidChunk, key)
	}
	if len(steps) > math.MaxInt32 {
		return nil, fmt.Errorf("%w: chunk %d has %d steps, more than %d", ErrInvalidChunk, key, len(steps), math.MaxInt32)
	}
	first := steps[0]
	for i, s := range steps {
		if err := validate(s); err != nil {
			return nil, fmt.Errorf("%w: chunk %d: step %d: %v", ErrInvalidTensor, key, i, err)
		}
		if s.Dtype != first.Dtype {
			return nil, fmt.Errorf("%w: chunk %d: step %d has dtype %s, step 0 has %s", ErrMismatch, key, i, s.Dtype, first.Dtype)
		}
		if !slices.Equal(s.Shape, first.Shape) {
			return nil, fmt.Errorf("%w: chunk %d: step %d has shape %v, step 0 has %v", ErrMismatch, key, i, s.Shape, first.Shape)
		}
	}
	stepBytes := len(first.Data)
	if stepBytes > 0 && len(steps) > MaxChunkRawSize/stepBytes {
		return nil, fmt.Errorf("%w: chunk %d: %d steps of %d bytes exceed MaxChunkRawSize (%d)", ErrInvalidChunk, key, len(steps), stepBytes, MaxChunkRawSize)
	}
	rawSize := stepBytes * len(steps)
	var raw []byte
	if opts.Codec == Uncompressed {
		raw = opts.data(rawSize)
	} else {
		buf := getScratch(rawSize)
		defer putScratch(buf)
		raw = (*buf)[:0]
	}
	for _, s := range steps {
		raw = append(raw, s.Data...)
	}
	info := dtypes[first.Dtype]
	delta := opts.Delta && info.integer
	if delta {
		deltaEncode(raw, stepBytes, info.size)
	}
	c := &Chunk{
		Key:          key,
		Dtype:        first.Dtype,
		StepShape:    slices.Clone(first.Shape),
		Length:       int32(len(steps)),
		Compression:  Compression_COMPRESSION_NONE,
		DeltaEncoded: delta,
		RawSize:      uint64(rawSize),
		EpisodeId:    opts.EpisodeID,
		EpisodeStep:  opts.EpisodeStep,
	}
	switch {
	case opts.Codec == Uncompressed:
		c.Data = raw
	case rawSize == 0:
		// Nothing to compress; DecodeChunk expects no bytes.
	default:
		buf := getScratch(s2.MaxEncodedLen(len(raw)))
		defer putScratch(buf)
		data, err := compress(opts.Codec, raw, buf)
		if err != nil {
			return nil, err
		}
		if len(data) <= rawSize-rawSize/8 {
			c.Compression = opts.Codec.proto()
		} else {
			data = raw
		}
		c.Data = append(opts.data(len(data)), data...)
	}
	return c, nil
}

// data is an empty slice with room for n bytes: Buffer when it has room.
func (o ChunkOptions) data(n int) []byte {
	if cap(o.Buffer) >= n {
		return o.Buffer[:0]
	}
	return make([]byte, 0, n)
}

func (c Codec) proto() Compression {
	switch c {
	case Zstd:
		return Compression_COMPRESSION_ZSTD
	case S2:
		return Compression_COMPRESSION_S2
	}
	return Compression_COMPRESSION_NONE
}

// compress writes raw compressed with codec (Zstd or S2) into buf's
// storage, which the result shares, and keeps buf as grown.
func compress(codec Codec, raw []byte, buf *[]byte) ([]byte, error) {
	var out []byte
	if codec == Zstd {
		enc, err := zstdEncoder()
		if err != nil {
			return nil, fmt.Errorf("wire: zstd encoder: %w", err)
		}
		out = enc.EncodeAll(raw, (*buf)[:0])
	} else {
		out = s2.Encode((*buf)[:cap(*buf)], raw)
	}
	*buf = out[:0]
	return out, nil
}

// scratch recycles EncodeChunk's working buffers, which hold a chunk only
// until it is compressed. Buffers over maxPooledScratch are left to the
// garbage collector so that a few huge chunks do not pin memory.
var scratch sync.Pool

const maxPooledScratch = 4 << 20

func getScratch(size int) *[]byte {
	if b, ok := scratch.Get().(*[]byte); ok && cap(*b) >= size {
		return b
	}
	b := make([]byte, 0, size)
	return &b
}

func putScratch(b *[]byte) {
	if cap(*b) <= maxPooledScratch {
		scratch.Put(b)
	}
}

// DecodeChunk reverses EncodeChunk: it returns the chunk's steps as one
// tensor of shape [Length, *StepShape]. It checks every field before
// allocating, never allocates more than the chunk's declared raw size
// (itself at most MaxChunkRawSize), and does not retain or modify c. It is
// safe for concurrent use.
func DecodeChunk(c *Chunk) (*Tensor, error) {
	rawSize, stepBytes, err := CheckChunkHeader(c)
	if err != nil {
		return nil, err
	}
	raw, err := decompress(c, rawSize, nil)
	if err != nil {
		return nil, err
	}
	if c.DeltaEncoded {
		deltaDecode(raw, int(stepBytes), dtypes[c.Dtype].size)
	}
	shape := make([]int64, 0, 1+len(c.StepShape))
	shape = append(shape, int64(c.Length))
	shape = append(shape, c.StepShape...)
	return &Tensor{Dtype: c.Dtype, Shape: shape, Data: raw}, nil
}

// CheckChunk makes every check DecodeChunk makes, decompressing the data
// into a recycled buffer that it drops: it proves a chunk decodes, to its
// declared size, without keeping the result. Safe for concurrent use.
func CheckChunk(c *Chunk) error {
	rawSize, _, err := CheckChunkHeader(c)
	if err != nil {
		return err
	}
	if c.Compression == Compression_COMPRESSION_NONE {
		// Nothing to decompress: the size is the whole proof.
		return checkUncompressed(c, rawSize)
	}
	buf := getScratch(0)
	out, err := decompress(c, rawSize, (*buf)[:0])
	if cap(out) > cap(*buf) {
		*buf = out[:0]
	}
	putScratch(buf)
	return err
}

// CheckChunkHeader checks every header field of c, the fields CheckChunk
// checks before it looks at the data, and returns the chunk's decoded size
// and the size of one of its steps.
func CheckChunkHeader(c *Chunk) (rawSize int, stepBytes int64, err error) {
	if c == nil {
		return 0, 0, fmt.Errorf("%w: chunk is nil", ErrInvalidChunk)
	}
	info, ok := dtypes[c.Dtype]
	if !ok {
		return 0, 0, fmt.Errorf("%w: chunk %d: unknown dtype %q", ErrInvalidChunk, c.Key, c.Dtype)
	}
	if c.Length < 1 {
		return 0, 0, fmt.Errorf("%w: chunk %d: length %d is not positive", ErrInvalidChunk, c.Key, c.Length)
	}
	stepElems, err := numElements(c.StepShape, MaxChunkRawSize/int64(info.size))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: chunk %d: step_shape %v: %v", ErrInvalidChunk, c.Key, c.StepShape, err)
	}
	stepBytes = stepElems * int64(info.size)
	if stepBytes > 0 && int64(c.Length) > MaxChunkRawSize/stepBytes {
		return 0, 0, fmt.Errorf("%w: chunk %d: %d steps of shape %v exceed MaxChunkRawSize (%d bytes)", ErrInvalidChunk, c.Key, c.Length, c.StepShape, MaxChunkRawSize)
	}
	total := stepBytes * int64(c.Length)
	if c.RawSize != uint64(total) {
		return 0, 0, fmt.Errorf("%w: chunk %d: raw_size is %d, %d steps of shape %v of %s need %d", ErrInvalidChunk, c.Key, c.RawSize, c.Length, c.StepShape, c.Dtype, total)
	}
	if c.DeltaEncoded && !info.integer {
		return 0, 0, fmt.Errorf("%w: chunk %d: delta_encoded is set on non-integer dtype %s", ErrInvalidChunk, c.Key, c.Dtype)
	}
	return int(total), stepBytes, nil
}

// decompress writes the chunk's decompressed data, exactly rawSize bytes,
// into dst's storage, growing it only once the data has passed the checks
// that can be made before decompressing (checkCompressed's).
func decompress(c *Chunk, rawSize int, dst []byte) ([]byte, error) {
	if err := checkCompressed(c, rawSize); err != nil {
		return nil, err
	}
	return decompressChecked(c, rawSize, dst)
}

// checkCompressed makes the checks of a chunk's data that need no
// decompressing: its codec is known, and its data can decode to rawSize
// bytes and no more (a zstd frame's declared size, an S2 block's decoded
// length). A caller that has bounded rawSize (by MaxChunkRawSize, and by
// what a reply may decode to) so bounds what decompressing costs.
func checkCompressed(c *Chunk, rawSize int) error {
	switch c.Compression {
	case Compression_COMPRESSION_NONE, Compression_COMPRESSION_ZSTD, Compression_COMPRESSION_S2:
	default:
		return fmt.Errorf("%w: chunk %d: unknown compression %v", ErrInvalidChunk, c.Key, c.Compression)
	}
	if rawSize == 0 {
		// Encoders store no bytes for an empty chunk, whatever the codec.
		if len(c.Data) != 0 {
			return fmt.Errorf("%w: chunk %d: raw_size is 0 but data has %d bytes", ErrInvalidChunk, c.Key, len(c.Data))
		}
		return nil
	}
	switch c.Compression {
	case Compression_COMPRESSION_ZSTD:
		if int64(rawSize) > int64(len(c.Data)/3)*zstdMaxBlockSize {
			return fmt.Errorf("%w: chunk %d: %d bytes of zstd data cannot hold raw_size %d", ErrInvalidChunk, c.Key, len(c.Data), rawSize)
		}
		// A frame that states its size must state the declared one: a bomb
		// is refused before a byte is decompressed.
		var h zstd.Header
		if err := h.Decode(c.Data); err != nil {
			return fmt.Errorf("%w: chunk %d: zstd frame header: %v", ErrInvalidChunk, c.Key, err)
		}
		if h.HasFCS && h.FrameContentSize != uint64(rawSize) {
			return fmt.Errorf("%w: chunk %d: zstd frame declares %d bytes, raw_size is %d", ErrInvalidChunk, c.Key, h.FrameContentSize, rawSize)
		}
	case Compression_COMPRESSION_S2:
		// S2 has no ratio to check (a run of zeros takes a few bytes a
		// megabyte), but a block states its decoded length up front.
		n, err := s2.DecodedLen(c.Data)
		if err != nil {
			return fmt.Errorf("%w: chunk %d: s2 data: %v", ErrInvalidChunk, c.Key, err)
		}
		if n != rawSize {
			return fmt.Errorf("%w: chunk %d: s2 data decodes to %d bytes, raw_size is %d", ErrInvalidChunk, c.Key, n, rawSize)
		}
	default:
		return checkUncompressed(c, rawSize)
	}
	return nil
}

// decompressChecked is decompress for a chunk that passed checkCompressed.
func decompressChecked(c *Chunk, rawSize int, dst []byte) ([]byte, error) {
	if rawSize == 0 {
		return dst[:0], nil
	}
	switch c.Compression {
	case Compression_COMPRESSION_ZSTD:
		dec, err := zstdDecoder()
		if err != nil {
			return nil, fmt.Errorf("wire: zstd decoder: %w", err)
		}
		raw, err := dec.DecodeAll(c.Data, slices.Grow(dst[:0], rawSize))
		if err != nil {
			return nil, fmt.Errorf("%w: chunk %d: zstd data: %v", ErrInvalidChunk, c.Key, err)
		}
		if len(raw) != rawSize {
			return nil, fmt.Errorf("%w: chunk %d: zstd data decodes to %d bytes, raw_size is %d", ErrInvalidChunk, c.Key, len(raw), rawSize)
		}
		return raw, nil
	case Compression_COMPRESSION_S2:
		raw, err := s2.Decode(slices.Grow(dst[:0], rawSize)[:rawSize], c.Data)
		if err != nil {
			return nil, fmt.Errorf("%w: chunk %d: s2 data: %v", ErrInvalidChunk, c.Key, err)
		}
		return raw, nil
	default:
		return append(dst[:0], c.Data...), nil
	}
}

func checkUncompressed(c *Chunk, rawSize int) error {
	if len(c.Data) != rawSize {
		return fmt.Errorf("%w: chunk %d: uncompressed data has %d bytes, raw_size is %d", ErrInvalidChunk, c.Key, len(c.Data), rawSize)
	}
	return nil
}

// GatherColumn assembles one column of an item from decoded chunks: the
// steps its slices select, concatenated in order into a tensor of shape
// [steps, *step_shape], or of shape step_shape when the column is squeezed
// (which requires exactly one step). chunks returns the decoded tensor of a
// chunk key, as DecodeChunk made it. The result shares no memory with the
// chunks.
func GatherColumn(col *TrajectoryColumn, chunks func(key uint64) (*Tensor, bool)) (*Tensor, error) {
	if col == nil {
		return nil, fmt.Errorf("%w: column is nil", ErrInvalidColumn)
	}
	if len(col.Slices) == 0 {
		return nil, fmt.Errorf("%w: column %q has no slices", ErrInvalidColumn, col.Name)
	}
	var buf [4]*Tensor
	sources := buf[:0]
	var first *Tensor
	var steps int64
	var size int
	for i, s := range col.Slices {
		if s == nil {
			return nil, fmt.Errorf("%w: column %q: slice %d is nil", ErrInvalidColumn, col.Name, i)
		}
		t, ok := chunks(s.ChunkKey)
		if !ok {
			return nil, fmt.Errorf("%w: column %q: slice %d: chunk %d", ErrMissingChunk, col.Name, i, s.ChunkKey)
		}
		if err := validate(t); err != nil {
			return nil, fmt.Errorf("%w: column %q: chunk %d: %v", ErrInvalidTensor, col.Name, s.ChunkKey, err)
		}
		if len(t.Shape) == 0 {
			return nil, fmt.Errorf("%w: column %q: chunk %d is a scalar, not a batch of steps", ErrInvalidTensor, col.Name, s.ChunkKey)
		}
		if first == nil {
			first = t
		} else if t.Dtype != first.Dtype || !slices.Equal(t.Shape[1:], first.Shape[1:]) {
			return nil, fmt.Errorf("%w: column %q: chunk %d holds %s steps of shape %v, chunk %d holds %s steps of shape %v",
				ErrMismatch, col.Name, s.ChunkKey, t.Dtype, t.Shape[1:], col.Slices[0].ChunkKey, first.Dtype, first.Shape[1:])
		}
		if s.Offset < 0 || s.Length < 1 || int64(s.Offset)+int64(s.Length) > t.Shape[0] {
			return nil, fmt.Errorf("%w: column %q: slice %d wants steps [%d, %d+%d) of chunk %d, which has %d",
				ErrInvalidColumn, col.Name, i, s.Offset, s.Offset, s.Length, s.ChunkKey, t.Shape[0])
		}
		// At most len(t.Data), since the slice lies within the chunk.
		n := int(int64(len(t.Data)) / t.Shape[0] * int64(s.Length))
		if n > math.MaxInt-size {
			return nil, fmt.Errorf("%w: column %q is larger than memory can hold", ErrInvalidColumn, col.Name)
		}
		size += n
		steps += int64(s.Length)
		sources = append(sources, t)
	}
	if col.Squeeze && steps != 1 {
		return nil, fmt.Errorf("%w: column %q is squeezed but its slices select %d steps, not 1", ErrInvalidColumn, col.Name, steps)
	}
	data := make([]byte, 0, size)
	for i, s := range col.Slices {
		t := sources[i]
		stepBytes := int(int64(len(t.Data)) / t.Shape[0])
		start := int(s.Offset) * stepBytes
		data = append(data, t.Data[start:start+int(s.Length)*stepBytes]...)
	}
	stepShape := first.Shape[1:]
	shape := make([]int64, 0, 1+len(stepShape))
	if !col.Squeeze {
		shape = append(shape, steps)
	}
	shape = append(shape, stepShape...)
	return &Tensor{Dtype: first.Dtype, Shape: shape, Data: data}, nil
}
