package wire

import "encoding/binary"

// Delta coding works on the little-endian bytes of a chunk. Two's-complement
// wrapping makes the same unsigned arithmetic right for signed and unsigned
// integers of a width. The arithmetic is SIMD-within-a-register: eight bytes
// at a time, with the carries kept from crossing element boundaries, which
// is several times faster than an element loop for 1- and 2-byte elements.

// laneHigh[width] has the top bit of every width-byte lane of a uint64 set.
var laneHigh = [...]uint64{
	1: 0x8080_8080_8080_8080,
	2: 0x8000_8000_8000_8000,
	4: 0x8000_0000_8000_0000,
	8: 0x8000_0000_0000_0000,
}

// deltaEncode replaces every step of b but the first with its difference
// from the previous step. It walks backwards so each step still sees the
// original previous step.
func deltaEncode(b []byte, stepBytes, width int) {
	if stepBytes == 0 {
		return
	}
	h := laneHigh[width]
	for off := len(b) - stepBytes; off >= stepBytes; off -= stepBytes {
		subLanes(b[off:off+stepBytes], b[off-stepBytes:off], h)
	}
}

// deltaDecode undoes deltaEncode with a running sum along the step axis.
func deltaDecode(b []byte, stepBytes, width int) {
	if stepBytes == 0 {
		return
	}
	h := laneHigh[width]
	for off := stepBytes; off < len(b); off += stepBytes {
		addLanes(b[off:off+stepBytes], b[off-stepBytes:off], h)
	}
}

// subLanes sets dst -= src lane by lane, wrapping within each lane
// (Hacker's Delight, 2-18); len(src) ≥ len(dst).
func subLanes(dst, src []byte, h uint64) {
	le := binary.LittleEndian
	src = src[:len(dst)]
	n := len(dst) &^ 7
	for i := 0; i < n; i += 8 {
		x, y := le.Uint64(dst[i:]), le.Uint64(src[i:])
		le.PutUint64(dst[i:], ((x|h)-(y&^h))^((x^^y)&h))
	}
	if n < len(dst) {
		// The tail holds whole elements; zero lanes pad it to a word.
		var xb, yb [8]byte
		copy(xb[:], dst[n:])
		copy(yb[:], src[n:])
		subLanes(xb[:], yb[:], h)
		copy(dst[n:], xb[:])
	}
}

// addLanes sets dst += src lane by lane, wrapping within each lane;
// len(src) ≥ len(dst).
func addLanes(dst, src []byte, h uint64) {
	le := binary.LittleEndian
	src = src[:len(dst)]
	n := len(dst) &^ 7
	for i := 0; i < n; i += 8 {
		x, y := le.Uint64(dst[i:]), le.Uint64(src[i:])
		le.PutUint64(dst[i:], ((x&^h)+(y&^h))^((x^y)&h))
	}
	if n < len(dst) {
		var xb, yb [8]byte
		copy(xb[:], dst[n:])
		copy(yb[:], src[n:])
		addLanes(xb[:], yb[:], h)
		copy(dst[n:], xb[:])
	}
}
