package broker

import (
	"fmt"
)

// ColumnRef picks steps of one column from the producer's recent history:
// the Length steps that end Skip steps before the newest one. Squeeze (only
// with Length 1) drops the step axis, so the learner sees the step's own
// shape.
type ColumnRef struct {
	// Name is the column's name in the item; empty means the same as
	// Column.
	Name    string
	Column  string
	Length  int
	Skip    int
	Squeeze bool
}

// Trajectory is the list of columns an item holds, in order.
type Trajectory []ColumnRef

// Last is the last n steps of each named column.
func Last(n int, columns ...string) Trajectory {
	t := make(Trajectory, len(columns))
	for i, c := range columns {
		t[i] = ColumnRef{Column: c, Length: n}
	}
	return t
}

// LastStep is the newest step of each named column, squeezed: a learner sees
// each cell with its own shape.
func LastStep(columns ...string) Trajectory {
	t := make(Trajectory, len(columns))
	for i, c := range columns {
		t[i] = ColumnRef{Column: c, Length: 1, Squeeze: true}
	}
	return t
}

func (r ColumnRef) name() string {
	if r.Name != "" {
		return r.Name
	}
	return r.Column
}

func (r ColumnRef) validate() error {
	switch {
	case r.Column == "":
		return fmt.Errorf("%w: column ref without a column name", ErrHistory)
	case r.Length < 1:
		return fmt.Errorf("%w: column %q: length %d (must be >= 1)", ErrHistory, r.Column, r.Length)
	case r.Skip < 0:
		return fmt.Errorf("%w: column %q: skip %d (must be >= 0)", ErrHistory, r.Column, r.Skip)
	case r.Squeeze && r.Length != 1:
		return fmt.Errorf("%w: column %q: squeeze needs length 1, got %d", ErrHistory, r.Column, r.Length)
	}
	return nil
}
