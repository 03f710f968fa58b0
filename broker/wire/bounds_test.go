package wire

import (
	"encoding/binary"
	"errors"
	"runtime"
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
	le := binary.LittleEndian
	enc := s2.Encode(nil, make([]byte, raw))
	var format []byte
	format = protowire.AppendTag(format, fieldFormatDtype, protowire.BytesType)
	format = protowire.AppendString(format, "uint8")
	var chunks, data []byte
	for i := range nchunks {
		for len(data)%packedAlign != 0 {
			data = append(data, 0)
		}
		r := make([]byte, compactChunkSize)
		le.PutUint64(r, uint64(i+1))
		le.PutUint32(r[8:], uint32(len(enc)))
		le.PutUint32(r[12:], uint32(raw))
		r[20] = byte(Compression_COMPRESSION_S2)
		chunks = append(chunks, r...)
		data = append(data, enc...)
	}
	var infos, columns, slices []byte
	if len(cols) > 0 {
		infos = make([]byte, compactInfoSize)
		le.PutUint64(infos, 1)
		le.PutUint32(infos[44:], uint32(len(cols)))
	}
	var names [][]byte
	for j, col := range cols {
		names = append(names, []byte{'c', byte('a' + j)})
		columns = le.AppendUint32(columns, uint32(j))
		columns = le.AppendUint32(columns, uint32(len(col)))
		for _, sl := range col {
			slices = le.AppendUint32(slices, uint32(sl.chunk))
			slices = le.AppendUint32(slices, uint32(sl.offset))
			slices = le.AppendUint32(slices, uint32(sl.length))
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

// TestDecodeSampleResponseBoundsTheChunksItHolds: a chunk whose slices
// are copied out is let go, and its buffer reused by the next one, so a
// reply of one-byte slices of many large chunks holds one at a time; one
// that holds more than MaxReplyBytes of chunks at once (lowered here to
// 64 MiB) is refused. Every chunk was held to the end, with no bound.
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
		// Columns that each take a byte of every chunk: all are held at once.
		var col []sampledSlice
		for c := range chunks {
			col = append(col, sampledSlice{chunk: c, offset: int32(s), length: 1})
		}
		interleaved = append(interleaved, col)
	}
	b := zerosReply(chunks, raw, inTurn...)
	decodeBoth(t, b, func(dec string, err error, n uint64) {
		if err != nil || n > raw+1<<20 {
			t.Errorf("%s: chunks used in turn: err %v, allocated %d MiB, want one chunk's %d", dec, err, n>>20, raw>>20)
		}
	})
	b = zerosReply(chunks, raw, interleaved...)
	decodeBoth(t, b, func(dec string, err error, n uint64) {
		if !errors.Is(err, ErrMalformed) || n > 2*raw+1<<20 {
			t.Errorf("%s: %d chunks of %d MiB held at once, over %d MiB: err %v, allocated %d MiB", dec, chunks, raw>>20, maxReplyBytes>>20, err, n>>20)
		}
	})
}
