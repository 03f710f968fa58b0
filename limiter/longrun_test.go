package limiter

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
)

// TestReconfigureRatioAfterLongRun changes samples_per_insert on a limiter
// that has run a balanced workload for a long time (as a config file does
// to a table restored from a days-old checkpoint). The new ratio must
// govern the traffic from now on: a pair of one actor and one learner, each
// doing what the limiter allows, must both make progress within a window's
// worth of operations, not be held off for as long as the run has lasted.
func TestReconfigureRatioAfterLongRun(t *testing.T) {
	const history = 1_000_000
	for _, tc := range []struct{ from, to float64 }{{1, 2}, {2, 1}, {1, 0.5}, {0.25, 4}} {
		from, err := SampleToInsertRatio(tc.from, 100, 10*max(1, tc.from))
		if err != nil {
			t.Fatal(err)
		}
		to, err := SampleToInsertRatio(tc.to, 100, 10*max(1, tc.to))
		if err != nil {
			t.Fatal(err)
		}
		// The counters of a long balanced run: what the limiter admits
		// when an actor and a learner alternate as fast as it lets them.
		l := newLimiter(t, from)
		if err := l.Restore(State{Config: from, Inserts: history, Samples: int64(float64(history)*tc.from) - int64(100*tc.from)}); err != nil {
			t.Fatal(err)
		}
		if !l.CanInsert(1) || !l.CanSample(1) {
			t.Fatalf("%v->%v: the balanced state %+v admits only one side", tc.from, tc.to, l.State())
		}
		if err := l.Reconfigure(to); err != nil {
			t.Fatal(err)
		}
		// Inserts and samples each get a turn; count the longest run of one
		// side alone. A window of width 2*error_buffer bounds it near
		// (2*error_buffer + min_size*spi) / min(1, spi).
		bound := int((2*10*max(1, tc.to) + 100*tc.to) / min(1, tc.to) * 2)
		alone, longest := 0, 0
		for step := 0; step < 4*history && (step < 4*bound || alone > 0); step++ {
			ins, _ := l.TryInsert(1)
			smp, _ := l.TrySample(1)
			switch {
			case ins && smp:
				alone = 0
			case ins || smp:
				alone++
				longest = max(longest, alone)
			default:
				t.Fatalf("%v->%v: stalled at %+v", tc.from, tc.to, l.State())
			}
		}
		if longest > bound {
			t.Errorf("%v->%v after %d inserts: one side was held off for %d rounds in a row (bound %d); state %+v",
				tc.from, tc.to, history, longest, bound, l.State())
		}
	}
}

// TestOffsetSurvivesRestore: the offset a change of ratio leaves is part of
// the state a checkpoint saves, and Restore refuses one that could not
// have come from Reconfigure.
func TestOffsetSurvivesRestore(t *testing.T) {
	from, _ := SampleToInsertRatio(1, 100, 10)
	to, _ := SampleToInsertRatio(0.1, 100, 10)
	l := newLimiter(t, from)
	if err := l.Restore(State{Config: from, Inserts: 1_000_003, Samples: 999_903}); err != nil {
		t.Fatal(err)
	}
	if err := l.Reconfigure(to); err != nil {
		t.Fatal(err)
	}
	st := l.State()
	if st.Offset == 0 || st.Offset != math.Trunc(st.Offset) {
		t.Fatalf("offset after a change of ratio: %v, want a nonzero whole number", st.Offset)
	}
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var back State
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	r := newLimiter(t, MinSize(1))
	if err := r.Restore(back); err != nil || r.State() != st {
		t.Fatalf("Restore(%s) = %v, state %+v; want %+v", data, err, r.State(), st)
	}
	for _, bad := range []float64{0.5, math.Inf(1), math.NaN()} {
		s := st
		s.Offset = bad
		if err := r.Restore(s); !errors.Is(err, ErrInvalidCount) {
			t.Errorf("Restore with offset %v = %v, want ErrInvalidCount", bad, err)
		}
	}
	r.Reset()
	if got := r.State(); got.Offset != 0 {
		t.Errorf("Reset kept offset %v", got.Offset)
	}
}
