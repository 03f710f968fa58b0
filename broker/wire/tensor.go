package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// Typed constructors and accessors convert between Go slices and tensors
// (elements in C order, little-endian, whatever the host's byte order).
//
// Constructors copy v and shape and do not check that len(v) matches the
// shape: ValidateTensor does, and so does EncodeChunk. Accessors validate
// the tensor, check its dtype (ErrMismatch otherwise) and return a copy of
// its elements. float16 and bfloat16 have no Go type: build and read their
// tensors through Data.

// Bools returns a bool tensor; each element is stored as one byte, 0 or 1.
func Bools(shape []int64, v []bool) *Tensor {
	b := make([]byte, len(v))
	for i, x := range v {
		if x {
			b[i] = 1
		}
	}
	return newTensor("bool", shape, b)
}

// Int8s returns an int8 tensor.
func Int8s(shape []int64, v []int8) *Tensor {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return newTensor("int8", shape, b)
}

// Uint8s returns a uint8 tensor.
func Uint8s(shape []int64, v []uint8) *Tensor {
	b := make([]byte, len(v))
	copy(b, v)
	return newTensor("uint8", shape, b)
}

// Int16s returns an int16 tensor.
func Int16s(shape []int64, v []int16) *Tensor { return newTensor("int16", shape, put16(v)) }

// Uint16s returns a uint16 tensor.
func Uint16s(shape []int64, v []uint16) *Tensor { return newTensor("uint16", shape, put16(v)) }

// Int32s returns an int32 tensor.
func Int32s(shape []int64, v []int32) *Tensor { return newTensor("int32", shape, put32(v)) }

// Uint32s returns a uint32 tensor.
func Uint32s(shape []int64, v []uint32) *Tensor { return newTensor("uint32", shape, put32(v)) }

// Int64s returns an int64 tensor.
func Int64s(shape []int64, v []int64) *Tensor { return newTensor("int64", shape, put64(v)) }

// Uint64s returns a uint64 tensor.
func Uint64s(shape []int64, v []uint64) *Tensor { return newTensor("uint64", shape, put64(v)) }

// Float32s returns a float32 tensor.
func Float32s(shape []int64, v []float32) *Tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return newTensor("float32", shape, b)
}

// Float64s returns a float64 tensor.
func Float64s(shape []int64, v []float64) *Tensor {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
	}
	return newTensor("float64", shape, b)
}

// Complex64s returns a complex64 tensor: each element is its real then its
// imaginary part, as float32s.
func Complex64s(shape []int64, v []complex64) *Tensor {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[8*i:], math.Float32bits(real(x)))
		binary.LittleEndian.PutUint32(b[8*i+4:], math.Float32bits(imag(x)))
	}
	return newTensor("complex64", shape, b)
}

// Complex128s returns a complex128 tensor: each element is its real then
// its imaginary part, as float64s.
func Complex128s(shape []int64, v []complex128) *Tensor {
	b := make([]byte, 16*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[16*i:], math.Float64bits(real(x)))
		binary.LittleEndian.PutUint64(b[16*i+8:], math.Float64bits(imag(x)))
	}
	return newTensor("complex128", shape, b)
}

// AsBools returns the elements of a bool tensor; any non-zero byte is true.
func (t *Tensor) AsBools() ([]bool, error) {
	if err := t.expect("bool"); err != nil {
		return nil, err
	}
	v := make([]bool, len(t.Data))
	for i, x := range t.Data {
		v[i] = x != 0
	}
	return v, nil
}

// AsInt8s returns the elements of an int8 tensor.
func (t *Tensor) AsInt8s() ([]int8, error) {
	if err := t.expect("int8"); err != nil {
		return nil, err
	}
	v := make([]int8, len(t.Data))
	for i, x := range t.Data {
		v[i] = int8(x)
	}
	return v, nil
}

// AsUint8s returns the elements of a uint8 tensor.
func (t *Tensor) AsUint8s() ([]uint8, error) {
	if err := t.expect("uint8"); err != nil {
		return nil, err
	}
	return slices.Clone(t.Data), nil
}

// AsInt16s returns the elements of an int16 tensor.
func (t *Tensor) AsInt16s() ([]int16, error) { return get16[int16](t, "int16") }

// AsUint16s returns the elements of a uint16 tensor.
func (t *Tensor) AsUint16s() ([]uint16, error) { return get16[uint16](t, "uint16") }

// AsInt32s returns the elements of an int32 tensor.
func (t *Tensor) AsInt32s() ([]int32, error) { return get32[int32](t, "int32") }

// AsUint32s returns the elements of a uint32 tensor.
func (t *Tensor) AsUint32s() ([]uint32, error) { return get32[uint32](t, "uint32") }

// AsInt64s returns the elements of an int64 tensor.
func (t *Tensor) AsInt64s() ([]int64, error) { return get64[int64](t, "int64") }

// AsUint64s returns the elements of a uint64 tensor.
func (t *Tensor) AsUint64s() ([]uint64, error) { return get64[uint64](t, "uint64") }

// AsFloat32s returns the elements of a float32 tensor.
func (t *Tensor) AsFloat32s() ([]float32, error) {
	if err := t.expect("float32"); err != nil {
		return nil, err
	}
	v := make([]float32, len(t.Data)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return v, nil
}

// AsFloat64s returns the elements of a float64 tensor.
func (t *Tensor) AsFloat64s() ([]float64, error) {
	if err := t.expect("float64"); err != nil {
		return nil, err
	}
	v := make([]float64, len(t.Data)/8)
	for i := range v {
		v[i] = math.Float64frombits(binary.LittleEndian.Uint64(t.Data[8*i:]))
	}
	return v, nil
}

// AsComplex64s returns the elements of a complex64 tensor.
func (t *Tensor) AsComplex64s() ([]complex64, error) {
	if err := t.expect("complex64"); err != nil {
		return nil, err
	}
	v := make([]complex64, len(t.Data)/8)
	for i := range v {
		re := math.Float32frombits(binary.LittleEndian.Uint32(t.Data[8*i:]))
		im := math.Float32frombits(binary.LittleEndian.Uint32(t.Data[8*i+4:]))
		v[i] = complex(re, im)
	}
	return v, nil
}

// AsComplex128s returns the elements of a complex128 tensor.
func (t *Tensor) AsComplex128s() ([]complex128, error) {
	if err := t.expect("complex128"); err != nil {
		return nil, err
	}
	v := make([]complex128, len(t.Data)/16)
	for i := range v {
		re := math.Float64frombits(binary.LittleEndian.Uint64(t.Data[16*i:]))
		im := math.Float64frombits(binary.LittleEndian.Uint64(t.Data[16*i+8:]))
		v[i] = complex(re, im)
	}
	return v, nil
}

func newTensor(dtype string, shape []int64, data []byte) *Tensor {
	return &Tensor{Dtype: dtype, Shape: slices.Clone(shape), Data: data}
}

// expect checks that t is valid and of the given dtype.
func (t *Tensor) expect(dtype string) error {
	if err := ValidateTensor(t); err != nil {
		return err
	}
	if t.Dtype != dtype {
		return fmt.Errorf("%w: tensor is %s, not %s", ErrMismatch, t.Dtype, dtype)
	}
	return nil
}

func put16[T ~int16 | ~uint16](v []T) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(x))
	}
	return b
}

func put32[T ~int32 | ~uint32](v []T) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

func put64[T ~int64 | ~uint64](v []T) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}

func get16[T ~int16 | ~uint16](t *Tensor, dtype string) ([]T, error) {
	if err := t.expect(dtype); err != nil {
		return nil, err
	}
	v := make([]T, len(t.Data)/2)
	for i := range v {
		v[i] = T(binary.LittleEndian.Uint16(t.Data[2*i:]))
	}
	return v, nil
}

func get32[T ~int32 | ~uint32](t *Tensor, dtype string) ([]T, error) {
	if err := t.expect(dtype); err != nil {
		return nil, err
	}
	v := make([]T, len(t.Data)/4)
	for i := range v {
		v[i] = T(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return v, nil
}

func get64[T ~int64 | ~uint64](t *Tensor, dtype string) ([]T, error) {
	if err := t.expect(dtype); err != nil {
		return nil, err
	}
	v := make([]T, len(t.Data)/8)
	for i := range v {
		v[i] = T(binary.LittleEndian.Uint64(t.Data[8*i:]))
	}
	return v, nil
}
