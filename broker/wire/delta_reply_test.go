package wire

import (
	"encoding/binary"
	"errors"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// deltaReply is a compact reply of one uncompressed chunk of steps scalar
// steps of dtype whose record says it is delta-encoded, and one item of one
// column of the chunk whole.
func deltaReply(dtype string, steps int, payload []byte) []byte {
	le := binary.LittleEndian
	var format []byte
	format = protowire.AppendTag(format, fieldFormatDtype, protowire.BytesType)
	format = protowire.AppendString(format, dtype)
	chunk := make([]byte, compactChunkSize)
	le.PutUint64(chunk, 1)
	le.PutUint32(chunk[8:], uint32(len(payload)))
	le.PutUint32(chunk[12:], uint32(steps))
	chunk[21] = 1
	info := make([]byte, compactInfoSize)
	le.PutUint64(info, 1)
	le.PutUint32(info[44:], 1)
	columns := le.AppendUint32(le.AppendUint32(nil, 0), 1)
	slices := le.AppendUint32(le.AppendUint32(le.AppendUint32(nil, 0), 0), uint32(steps))
	var packed []byte
	for _, f := range []struct {
		num protowire.Number
		b   []byte
	}{{fieldCompactInfos, info}, {fieldCompactColumns, columns}, {fieldPackedNames, []byte("x")},
		{fieldPackedSlices, slices}, {fieldCompactChunks, chunk}, {fieldPackedFormats, format}, {fieldPackedData, payload}} {
		packed = protowire.AppendBytes(protowire.AppendTag(packed, f.num, protowire.BytesType), f.b)
	}
	return protowire.AppendBytes(protowire.AppendTag(nil, fieldResponsePacked, protowire.BytesType), packed)
}

// TestDeltaOfNonIntegerStepsIsRefused: a reply whose chunk of float,
// bool or complex steps says it is delta-encoded is refused, as
// DecodeChunk refuses it. The packed decoders undid the differences
// anyway: complex128 steps (16-byte elements) panicked, float32 ones came
// back changed.
func TestDeltaOfNonIntegerStepsIsRefused(t *testing.T) {
	for dtype, size := range map[string]int{"complex128": 16, "float32": 4, "bool": 1, "float16": 2} {
		b := deltaReply(dtype, 2, make([]byte, 2*size))
		for name, decode := range map[string]func([]byte) error{
			"DecodeSampleResponse": func(b []byte) error { _, err := DecodeSampleResponse(b); return err },
			"DecodeBatchResponse":  func(b []byte) error { _, err := DecodeBatchResponse(b); return err },
		} {
			if err := decode(b); !errors.Is(err, ErrInvalidChunk) {
				t.Errorf("%s of a delta-encoded %s chunk: %v, want ErrInvalidChunk", name, dtype, err)
			}
		}
	}
	// Integers stay delta-encoded: steps 5 and 5+2.
	b := deltaReply("int32", 2, []byte{5, 0, 0, 0, 2, 0, 0, 0})
	got, err := DecodeBatchResponse(b)
	if err != nil || len(got.Batch.Columns) != 1 || binary.LittleEndian.Uint32(got.Batch.Columns[0].Data[4:]) != 7 {
		t.Fatalf("a delta-encoded int32 chunk: %+v, %v; want steps 5 and 7", got, err)
	}
}
