package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/klauspost/compress/s2"
	"google.golang.org/protobuf/encoding/protowire"
)

// zerosReply is a compact sample reply over nchunks chunks, each raw zero
// bytes of uint8 steps compressed with S2 (a few dozen bytes for 64 MiB),
// of one item whose columns are cols, each a list of slices: a hostile
// service's reply, small on the wire and huge decoded. No columns is a
// reply of no items.
func zerosReply(nchunks, raw int, cols ...[]sampledSlice) []byte {
	enc := s2.Encode(nil, make([]byte, raw))
	payloads := make([][]byte, nchunks)
	for i := range payloads {
		payloads[i] = enc
	}
	var items [][][]sampledSlice
	if len(cols) > 0 {
		items = append(items, cols)
	}
	return chunksReply(Compression_COMPRESSION_S2, raw, payloads, items...)
}

// chunksReply is a compact sample reply over chunks of raw uint8 steps
// each, stored as payloads compressed with compression, of items, each a
// list of columns (named ca, cb, ...), each a list of slices.
func chunksReply(compression Compression, raw int, payloads [][]byte, items ...[][]sampledSlice) []byte {
	le := binary.LittleEndian
	var format []byte
	format = protowire.AppendTag(format, fieldFormatDtype, protowire.BytesType)
	format = protowire.AppendString(format, "uint8")
	var chunks, data []byte
	for i, enc := range payloads {
		for len(data)%packedAlign != 0 {
			data = append(data, 0)
		}
		r := make([]byte, compactChunkSize)
		le.PutUint64(r, uint64(i+1))
		le.PutUint32(r[8:], uint32(len(enc)))
		le.PutUint32(r[12:], uint32(raw))
		r[20] = byte(compression)
		chunks = append(chunks, r...)
		data = append(data, enc...)
	}
	var infos, columns, slices []byte
	var names [][]byte
	for i, cols := range items {
		info := make([]byte, compactInfoSize)
		le.PutUint64(info, uint64(i+1))
		le.PutUint32(info[44:], uint32(len(cols)))
		infos = append(infos, info...)
		for j, col := range cols {
			if j == len(names) {
				names = append(names, []byte{'c', byte('a' + j)})
			}
			columns = le.AppendUint32(columns, uint32(j))
			columns = le.AppendUint32(columns, uint32(len(col)))
			for _, sl := range col {
				slices = le.AppendUint32(slices, uint32(sl.chunk))
				slices = le.AppendUint32(slices, uint32(sl.offset))
				slices = le.AppendUint32(slices, uint32(sl.length))
			}
		}
	}
	var packed []byte
	field := func(num protowire.Number, b []byte) {
		if b != nil {
			packed = protowire.AppendTag(packed, num, protowire.BytesType)
			packed = protowire.AppendBytes(packed, b)
		}
	}
	field(fieldCompactInfos, infos)
	field(fieldCompactColumns, columns)
	for _, n := range names {
		field(fieldPackedNames, n)
	}
	field(fieldPackedSlices, slices)
	field(fieldCompactChunks, chunks)
	field(fieldPackedFormats, format)
	field(fieldPackedData, data)
	var b []byte
	b = protowire.AppendTag(b, fieldResponsePacked, protowire.BytesType)
	return protowire.AppendBytes(b, packed)
}

// decodeBoth decodes b with DecodeSampleResponse and DecodeBatchResponse,
// each from its own copy, and reports the bytes each allocated (0 under
// the race detector).
func decodeBoth(t *testing.T, b []byte, check func(name string, err error, allocated uint64)) {
	t.Helper()
	for _, d := range []struct {
		name   string
		decode func([]byte) error
	}{
		{"DecodeSampleResponse", func(b []byte) error { _, err := DecodeSampleResponse(b); return err }},
		{"DecodeBatchResponse", func(b []byte) error { _, err := DecodeBatchResponse(b); return err }},
	} {
		c := append([]byte(nil), b...)
		var err error
		runtime.GC()
		n := allocatedBytes(func() { err = d.decode(c) })
		if raceEnabled {
			n = 0 // see raceEnabled
		}
		check(d.name, err, n)
	}
}

// TestDecodeSampleResponseDecompressesOnlyWhatItemsUse: chunks that no item
// uses are not decompressed. Each decoder used to decompress every chunk
// of a reply up front: a reply of a few hundred bytes and no items, four
// S2 chunks of 32 MiB of zeros, cost 128 MiB.
func TestDecodeSampleResponseDecompressesOnlyWhatItemsUse(t *testing.T) {
	for name, b := range map[string][]byte{
		"no items":         zerosReply(4, 32<<20),
		"an item of chunk": zerosReply(4, 32<<20, []sampledSlice{{chunk: 2, offset: 5, length: 3}}),
	} {
		decodeBoth(t, b, func(dec string, err error, n uint64) {
			// The item's one chunk is decompressed, the other three not.
			if err != nil || n > 33<<20 {
				t.Errorf("%s: %s: a reply of %d bytes: err %v, allocated %d MiB", name, dec, len(b), err, n>>20)
			}
		})
	}
}

// TestDecodeSampleResponseRefusesASliceBomb: a reply whose items decode to
// more than MaxReplyBytes is refused as malformed before anything is
// allocated for them. A reply of 4.8 MB (one S2 chunk of 64 MiB in a few
// dozen bytes, one item of one column of 400,000 slices of the whole
// chunk) used to make the decoders ask for 25 TiB at once: the runtime
// died of "out of memory", which no recover catches.
func TestDecodeSampleResponseRefusesASliceBomb(t *testing.T) {
	slices := make([]sampledSlice, 400_000)
	for i := range slices {
		slices[i] = sampledSlice{length: 64 << 20}
	}
	b := zerosReply(1, 64<<20, slices)
	decodeBoth(t, b, func(dec string, err error, n uint64) {
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: a reply of %d bytes that decodes to 25 TiB: err %v, want ErrMalformed", dec, len(b), err)
		}
		// The decoder's records of the reply's 400,000 slices.
		if n > 16<<20 {
			t.Errorf("%s: a reply of %d bytes that decodes to 25 TiB: allocated %d MiB", dec, len(b), n>>20)
		}
	})
}

// TestDecodeSampleResponseBoundsTheChunksItHolds: the slices of compressed
// chunks are copied out a chunk at a time, each chunk decompressed once
// into a buffer the next reuses, so a reply of one-byte slices of many
// large chunks holds one at a time, whatever the order its items use them
// in: chunks used in turn, or interleaved by columns that each take a byte
// of every chunk. Every chunk used to be held to the end, with no bound;
// then interleaved chunks past MaxReplyBytes (lowered here to 64 MiB) held
// at once were refused, although the items decode to a few bytes.
func TestDecodeSampleResponseBoundsTheChunksItHolds(t *testing.T) {
	defer func(m int64) { maxReplyBytes = m }(maxReplyBytes)
	maxReplyBytes = 64 << 20
	const chunks, raw = 3, 32 << 20
	var inTurn, interleaved [][]sampledSlice
	for c := range chunks {
		// Columns of one chunk each: the first ends with its second slice.
		inTurn = append(inTurn, []sampledSlice{{chunk: c, offset: 0, length: 1}, {chunk: c, offset: 1, length: 1}})
	}
	for s := range 2 {
		// Columns that each take a byte of every chunk.
		var col []sampledSlice
		for c := range chunks {
			col = append(col, sampledSlice{chunk: c, offset: int32(s), length: 1})
		}
		interleaved = append(interleaved, col)
	}
	for name, cols := range map[string][][]sampledSlice{"chunks used in turn": inTurn, "chunks interleaved": interleaved} {
		b := zerosReply(chunks, raw, cols...)
		decodeBoth(t, b, func(dec string, err error, n uint64) {
			if err != nil || n > raw+1<<20 {
				t.Errorf("%s: %s: err %v, allocated %d MiB, want one chunk's %d", name, dec, err, n>>20, raw>>20)
			}
		})
	}
}

// TestDecodeSampleResponseDecodesItemsThatShareChunksFarApart is the
// review's case: four chunks of 1 MiB, and items x, y, x of two steps
// each, x of chunks 0 and 1, y of chunks 2 and 3, with MaxReplyBytes
// lowered to 2.5 MiB. Copied item by item, chunks 0 and 1 were held until
// x's second copy, so y's chunks took them past the bound and the reply,
// whose items decode to 6 bytes, was refused as malformed.
func TestDecodeSampleResponseDecodesItemsThatShareChunksFarApart(t *testing.T) {
	defer func(m int64) { maxReplyBytes = m }(maxReplyBytes)
	maxReplyBytes = 5 << 19
	const raw = 1 << 20
	rng := rand.New(rand.NewPCG(1, 2))
	steps := make([][]byte, 4)
	for c := range steps {
		steps[c] = make([]byte, raw)
		for i := range steps[c] {
			steps[c][i] = byte(rng.Uint32())
		}
	}
	x := [][]sampledSlice{{{chunk: 0, offset: 1000, length: 1}, {chunk: 1, offset: raw - 1, length: 1}}}
	y := [][]sampledSlice{{{chunk: 2, offset: 0, length: 1}, {chunk: 3, offset: 777, length: 1}}}
	want := func(cols [][]sampledSlice) []byte {
		var b []byte
		for _, sl := range cols[0] {
			b = append(b, steps[sl.chunk][sl.offset:sl.offset+sl.length]...)
		}
		return b
	}
	rows := [][]byte{want(x), want(y), want(x)}
	enc, err := zstdEncoder()
	if err != nil {
		t.Fatal(err)
	}
	for _, codec := range []Compression{Compression_COMPRESSION_ZSTD, Compression_COMPRESSION_S2} {
		payloads := make([][]byte, len(steps))
		for c, s := range steps {
			if codec == Compression_COMPRESSION_ZSTD {
				payloads[c] = enc.EncodeAll(s, nil)
			} else {
				payloads[c] = s2.Encode(nil, s)
			}
		}
		b := chunksReply(codec, raw, payloads, x, y, x)
		reply, err := DecodeSampleResponse(bytes.Clone(b))
		if err != nil {
			t.Fatalf("%v: DecodeSampleResponse: %v", codec, err)
		}
		if len(reply.Samples) != len(rows) {
			t.Fatalf("%v: DecodeSampleResponse: %d items, want %d", codec, len(reply.Samples), len(rows))
		}
		for i, s := range reply.Samples {
			if c := s.Columns[0]; !bytes.Equal(c.Data, rows[i]) || !slices.Equal(c.Shape, []int64{2}) {
				t.Errorf("%v: DecodeSampleResponse: item %d: shape %v, data %v, want [2], %v", codec, i, c.Shape, c.Data, rows[i])
			}
		}
		batch, err := DecodeBatchResponse(bytes.Clone(b))
		if err != nil {
			t.Fatalf("%v: DecodeBatchResponse: %v", codec, err)
		}
		if c := batch.Batch.Columns[0]; !bytes.Equal(c.Data, bytes.Join(rows, nil)) || !slices.Equal(c.Shape, []int64{3, 2}) {
			t.Errorf("%v: DecodeBatchResponse: shape %v, data %v, want [3 2], %v", codec, c.Shape, c.Data, bytes.Join(rows, nil))
		}
		decodeBoth(t, b, func(dec string, err error, n uint64) {
			// One chunk decompressed at a time, into one buffer.
			if err != nil || n > raw+raw/8 {
				t.Errorf("%v: %s: err %v, allocated %d KiB, want about one chunk's %d", codec, dec, err, n>>10, raw>>10)
			}
		})
	}
}
