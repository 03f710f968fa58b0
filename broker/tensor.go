package broker

import (
	"slices"

	"github.com/reprise-rl/reprise/broker/wire"
)

// Tensor is an n-dimensional array: its dtype ("float32", "int64", "uint8",
// "bool", "float16", "bfloat16", "complex64"... as numpy names them), its
// shape, and its elements in C order as little-endian bytes, whatever the
// host's byte order. A step's column is one Tensor; a sampled column stacks
// its steps along a new first axis (unless squeezed).
//
// The typed constructors copy their arguments; the typed accessors check
// the dtype and the size (an error wrapping wire.ErrMismatch or
// wire.ErrInvalidTensor otherwise) and return a copy. float16 and bfloat16
// have no Go type: build and read those through Data.
type Tensor struct {
	DType string
	Shape []int64
	Data  []byte
}

// Step is one time step of an episode: column name to tensor. A step may
// leave columns out; an item that references a missing cell is an error.
type Step map[string]Tensor

func fromWire(t *wire.Tensor) Tensor { return Tensor{DType: t.Dtype, Shape: t.Shape, Data: t.Data} }

// wire views t as the wire's tensor, sharing its shape and data.
func (t Tensor) wire() *wire.Tensor {
	return &wire.Tensor{Dtype: t.DType, Shape: t.Shape, Data: t.Data}
}

// Validate checks that the dtype is known and that Data holds exactly the
// elements of Shape.
func (t Tensor) Validate() error { return wire.ValidateTensor(t.wire()) }

// Clone returns a deep copy.
func (t Tensor) Clone() Tensor {
	return Tensor{DType: t.DType, Shape: slices.Clone(t.Shape), Data: slices.Clone(t.Data)}
}

// Bools returns a bool tensor; each element is one byte, 0 or 1.
func Bools(shape []int64, v []bool) Tensor { return fromWire(wire.Bools(shape, v)) }

// Int8s returns an int8 tensor.
func Int8s(shape []int64, v []int8) Tensor { return fromWire(wire.Int8s(shape, v)) }

// Uint8s returns a uint8 tensor.
func Uint8s(shape []int64, v []uint8) Tensor { return fromWire(wire.Uint8s(shape, v)) }

// Int16s returns an int16 tensor.
func Int16s(shape []int64, v []int16) Tensor { return fromWire(wire.Int16s(shape, v)) }

// Uint16s returns a uint16 tensor.
func Uint16s(shape []int64, v []uint16) Tensor { return fromWire(wire.Uint16s(shape, v)) }

// Int32s returns an int32 tensor.
func Int32s(shape []int64, v []int32) Tensor { return fromWire(wire.Int32s(shape, v)) }

// Uint32s returns a uint32 tensor.
func Uint32s(shape []int64, v []uint32) Tensor { return fromWire(wire.Uint32s(shape, v)) }

// Int64s returns an int64 tensor.
func Int64s(shape []int64, v []int64) Tensor { return fromWire(wire.Int64s(shape, v)) }

// Uint64s returns a uint64 tensor.
func Uint64s(shape []int64, v []uint64) Tensor { return fromWire(wire.Uint64s(shape, v)) }

// Float32s returns a float32 tensor.
func Float32s(shape []int64, v []float32) Tensor { return fromWire(wire.Float32s(shape, v)) }

// Float64s returns a float64 tensor.
func Float64s(shape []int64, v []float64) Tensor { return fromWire(wire.Float64s(shape, v)) }

// Complex64s returns a complex64 tensor.
func Complex64s(shape []int64, v []complex64) Tensor { return fromWire(wire.Complex64s(shape, v)) }

// Complex128s returns a complex128 tensor.
func Complex128s(shape []int64, v []complex128) Tensor {
	return fromWire(wire.Complex128s(shape, v))
}

// Bools returns the elements of a bool tensor.
func (t Tensor) Bools() ([]bool, error) { return t.wire().AsBools() }

// Int8s returns the elements of an int8 tensor.
func (t Tensor) Int8s() ([]int8, error) { return t.wire().AsInt8s() }

// Uint8s returns the elements of a uint8 tensor.
func (t Tensor) Uint8s() ([]uint8, error) { return t.wire().AsUint8s() }

// Int16s returns the elements of an int16 tensor.
func (t Tensor) Int16s() ([]int16, error) { return t.wire().AsInt16s() }

// Uint16s returns the elements of a uint16 tensor.
func (t Tensor) Uint16s() ([]uint16, error) { return t.wire().AsUint16s() }

// Int32s returns the elements of an int32 tensor.
func (t Tensor) Int32s() ([]int32, error) { return t.wire().AsInt32s() }

// Uint32s returns the elements of a uint32 tensor.
func (t Tensor) Uint32s() ([]uint32, error) { return t.wire().AsUint32s() }

// Int64s returns the elements of an int64 tensor.
func (t Tensor) Int64s() ([]int64, error) { return t.wire().AsInt64s() }

// Uint64s returns the elements of a uint64 tensor.
func (t Tensor) Uint64s() ([]uint64, error) { return t.wire().AsUint64s() }

// Float32s returns the elements of a float32 tensor.
func (t Tensor) Float32s() ([]float32, error) { return t.wire().AsFloat32s() }

// Float64s returns the elements of a float64 tensor.
func (t Tensor) Float64s() ([]float64, error) { return t.wire().AsFloat64s() }

// Complex64s returns the elements of a complex64 tensor.
func (t Tensor) Complex64s() ([]complex64, error) { return t.wire().AsComplex64s() }

// Complex128s returns the elements of a complex128 tensor.
func (t Tensor) Complex128s() ([]complex128, error) { return t.wire().AsComplex128s() }
