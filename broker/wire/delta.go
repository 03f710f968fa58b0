package wire

import "encoding/binary"

// Delta coding works on the little-endian bytes of a chunk, one element of
// width bytes at a time. Two's-complement wrapping makes the same unsigned
// arithmetic right for signed and unsigned integers of a width.

// deltaEncode replaces every step of b but the first with its difference
// from the previous step. It walks backwards so each step still sees the
// original previous step.
func deltaEncode(b []byte, stepBytes, width int) {
	if stepBytes == 0 {
		return
	}
	for off := len(b) - stepBytes; off >= stepBytes; off -= stepBytes {
		sub(b[off:off+stepBytes], b[off-stepBytes:off], width)
	}
}

// deltaDecode undoes deltaEncode with a running sum along the step axis.
func deltaDecode(b []byte, stepBytes, width int) {
	if stepBytes == 0 {
		return
	}
	for off := stepBytes; off < len(b); off += stepBytes {
		add(b[off:off+stepBytes], b[off-stepBytes:off], width)
	}
}

// sub sets dst[i] -= src[i] for each element.
func sub(dst, src []byte, width int) {
	le := binary.LittleEndian
	switch width {
	case 1:
		for i := range dst {
			dst[i] -= src[i]
		}
	case 2:
		for i := 0; i+2 <= len(dst); i += 2 {
			le.PutUint16(dst[i:], le.Uint16(dst[i:])-le.Uint16(src[i:]))
		}
	case 4:
		for i := 0; i+4 <= len(dst); i += 4 {
			le.PutUint32(dst[i:], le.Uint32(dst[i:])-le.Uint32(src[i:]))
		}
	case 8:
		for i := 0; i+8 <= len(dst); i += 8 {
			le.PutUint64(dst[i:], le.Uint64(dst[i:])-le.Uint64(src[i:]))
		}
	}
}

// add sets dst[i] += src[i] for each element.
func add(dst, src []byte, width int) {
	le := binary.LittleEndian
	switch width {
	case 1:
		for i := range dst {
			dst[i] += src[i]
		}
	case 2:
		for i := 0; i+2 <= len(dst); i += 2 {
			le.PutUint16(dst[i:], le.Uint16(dst[i:])+le.Uint16(src[i:]))
		}
	case 4:
		for i := 0; i+4 <= len(dst); i += 4 {
			le.PutUint32(dst[i:], le.Uint32(dst[i:])+le.Uint32(src[i:]))
		}
	case 8:
		for i := 0; i+8 <= len(dst); i += 8 {
			le.PutUint64(dst[i:], le.Uint64(dst[i:])+le.Uint64(src[i:]))
		}
	}
}
