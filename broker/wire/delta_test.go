package wire

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// referenceDelta computes deltaEncode element by element, the obvious way.
func referenceDelta(b []byte, stepBytes, width int) []byte {
	out := bytes.Clone(b)
	le := binary.LittleEndian
	for off := stepBytes; off < len(b); off += stepBytes {
		for i := 0; i < stepBytes; i += width {
			cur, prev := b[off+i:], b[off-stepBytes+i:]
			dst := out[off+i:]
			switch width {
			case 1:
				dst[0] = cur[0] - prev[0]
			case 2:
				le.PutUint16(dst, le.Uint16(cur)-le.Uint16(prev))
			case 4:
				le.PutUint32(dst, le.Uint32(cur)-le.Uint32(prev))
			case 8:
				le.PutUint64(dst, le.Uint64(cur)-le.Uint64(prev))
			}
		}
	}
	return out
}

// TestDeltaMatchesElementArithmetic checks the word-at-a-time delta coding
// against element arithmetic on random data, with step sizes that leave
// every possible tail after the last full word.
func TestDeltaMatchesElementArithmetic(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, width := range []int{1, 2, 4, 8} {
		for elems := 1; elems <= 17; elems++ {
			stepBytes := width * elems
			b := make([]byte, 5*stepBytes)
			for i := range b {
				b[i] = byte(rng.UintN(256))
			}
			want := referenceDelta(b, stepBytes, width)
			got := bytes.Clone(b)
			deltaEncode(got, stepBytes, width)
			if !bytes.Equal(got, want) {
				t.Fatalf("width %d, %d elements: deltaEncode = %x, want %x", width, elems, got, want)
			}
			deltaDecode(got, stepBytes, width)
			if !bytes.Equal(got, b) {
				t.Fatalf("width %d, %d elements: deltaDecode did not restore the input", width, elems)
			}
		}
	}
}
