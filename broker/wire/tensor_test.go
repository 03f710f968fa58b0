package wire

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"testing"
)

// TestTypedTensors pins the little-endian layout of every constructor and
// checks that the matching accessor returns the values.
func TestTypedTensors(t *testing.T) {
	shape := []int64{2}
	tests := []struct {
		t    *Tensor
		want []byte
		back func(*Tensor) (any, error)
		v    any
	}{
		{Bools(shape, []bool{true, false}), []byte{1, 0},
			func(t *Tensor) (any, error) { return t.AsBools() }, []bool{true, false}},
		{Int8s(shape, []int8{-1, 2}), []byte{0xff, 2},
			func(t *Tensor) (any, error) { return t.AsInt8s() }, []int8{-1, 2}},
		{Uint8s(shape, []uint8{200, 2}), []byte{200, 2},
			func(t *Tensor) (any, error) { return t.AsUint8s() }, []uint8{200, 2}},
		{Int16s(shape, []int16{-2, 0x102}), []byte{0xfe, 0xff, 2, 1},
			func(t *Tensor) (any, error) { return t.AsInt16s() }, []int16{-2, 0x102}},
		{Uint16s(shape, []uint16{0xfffe, 0x102}), []byte{0xfe, 0xff, 2, 1},
			func(t *Tensor) (any, error) { return t.AsUint16s() }, []uint16{0xfffe, 0x102}},
		{Int32s(shape, []int32{1, -2}), []byte{1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff},
			func(t *Tensor) (any, error) { return t.AsInt32s() }, []int32{1, -2}},
		{Uint32s(shape, []uint32{1, 0x01020304}), []byte{1, 0, 0, 0, 4, 3, 2, 1},
			func(t *Tensor) (any, error) { return t.AsUint32s() }, []uint32{1, 0x01020304}},
		{Int64s(shape, []int64{math.MinInt64, 1}), []byte{0, 0, 0, 0, 0, 0, 0, 0x80, 1, 0, 0, 0, 0, 0, 0, 0},
			func(t *Tensor) (any, error) { return t.AsInt64s() }, []int64{math.MinInt64, 1}},
		{Uint64s(shape, []uint64{math.MaxUint64, 0x0102}), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 1, 0, 0, 0, 0, 0, 0},
			func(t *Tensor) (any, error) { return t.AsUint64s() }, []uint64{math.MaxUint64, 0x0102}},
		{Float32s(shape, []float32{1, -2}), []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0},
			func(t *Tensor) (any, error) { return t.AsFloat32s() }, []float32{1, -2}},
		{Float64s(shape, []float64{1, -2}), []byte{0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0xc0},
			func(t *Tensor) (any, error) { return t.AsFloat64s() }, []float64{1, -2}},
		{Complex64s([]int64{1}, []complex64{complex(1, -2)}), []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0},
			func(t *Tensor) (any, error) { return t.AsComplex64s() }, []complex64{complex(1, -2)}},
		{Complex128s([]int64{1}, []complex128{complex(1, -2)}), []byte{0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0xc0},
			func(t *Tensor) (any, error) { return t.AsComplex128s() }, []complex128{complex(1, -2)}},
	}
	for _, tt := range tests {
		t.Run(tt.t.Dtype, func(t *testing.T) {
			if err := ValidateTensor(tt.t); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(tt.t.Data, tt.want) {
				t.Fatalf("data = %x, want %x", tt.t.Data, tt.want)
			}
			got, err := tt.back(tt.t)
			if err != nil {
				t.Fatal(err)
			}
			if !equalSlices(got, tt.v) {
				t.Fatalf("accessor = %v, want %v", got, tt.v)
			}
			other := &Tensor{Dtype: "uint16", Shape: []int64{int64(len(tt.t.Data) / 2)}, Data: tt.t.Data}
			if tt.t.Dtype == "uint16" {
				other.Dtype = "int16"
			}
			if _, err := tt.back(other); !errors.Is(err, ErrMismatch) {
				t.Errorf("accessor on %s tensor: err = %v, want ErrMismatch", other.Dtype, err)
			}
			if _, err := tt.back(&Tensor{Dtype: tt.t.Dtype, Shape: []int64{3}, Data: tt.t.Data}); !errors.Is(err, ErrInvalidTensor) {
				t.Errorf("accessor on invalid tensor: err = %v, want ErrInvalidTensor", err)
			}
		})
	}
}

func equalSlices(a, b any) bool {
	switch a := a.(type) {
	case []bool:
		return slices.Equal(a, b.([]bool))
	case []int8:
		return slices.Equal(a, b.([]int8))
	case []uint8:
		return slices.Equal(a, b.([]uint8))
	case []int16:
		return slices.Equal(a, b.([]int16))
	case []uint16:
		return slices.Equal(a, b.([]uint16))
	case []int32:
		return slices.Equal(a, b.([]int32))
	case []uint32:
		return slices.Equal(a, b.([]uint32))
	case []int64:
		return slices.Equal(a, b.([]int64))
	case []uint64:
		return slices.Equal(a, b.([]uint64))
	case []float32:
		return slices.Equal(a, b.([]float32))
	case []float64:
		return slices.Equal(a, b.([]float64))
	case []complex64:
		return slices.Equal(a, b.([]complex64))
	case []complex128:
		return slices.Equal(a, b.([]complex128))
	}
	return false
}

func TestConstructorsCopy(t *testing.T) {
	shape := []int64{2}
	v := []uint8{1, 2}
	tn := Uint8s(shape, v)
	v[0], shape[0] = 9, 7
	if tn.Data[0] != 1 || tn.Shape[0] != 2 {
		t.Fatal("Uint8s retained its arguments")
	}
	got, _ := tn.AsUint8s()
	got[1] = 9
	if tn.Data[1] != 2 {
		t.Fatal("AsUint8s returned the tensor's own bytes")
	}
}

func TestBoolsReadNonZeroAsTrue(t *testing.T) {
	v, err := (&Tensor{Dtype: "bool", Shape: []int64{3}, Data: []byte{0, 1, 7}}).AsBools()
	if err != nil || !slices.Equal(v, []bool{false, true, true}) {
		t.Fatalf("AsBools = %v, %v", v, err)
	}
}
