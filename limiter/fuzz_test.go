package limiter

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
)

// FuzzLimiter drives a limiter built from arbitrary parameters with an
// arbitrary sequence of operations, and a plain model of its counters next to
// it. Nothing may panic, New must agree with Validate, and every decision must
// be the one REFERENCE.md's inequality gives for the model's state.
//
// ops is read two bytes at a time: an operation and its argument.
func FuzzLimiter(f *testing.F) {
	inf := math.Inf(1)
	seeds := []Config{
		MinSize(3), Queue(2), Queue(0), mustRatio(f, 2, 10, 4), mustRatio(f, 0.5, 4, 2), mustRatio(f, 0.1, 7, 1),
		{1, 1, 1, 1}, {1, 1, 1, 2}, {math.NaN(), 1, 0, 1}, {1, 1, -inf, -inf}, {1, math.MaxInt64, 0, inf}, {1e300, 3, 0, 1e300},
	}
	ops := []byte{0, 3, 1, 1, 0, 5, 1, 2, 2, 1, 0, 9, 1, 4, 5, 1, 4, 200, 1, 1, 6, 3, 3, 0, 0, 1, 1, 1, 0, 9, 7, 12, 6, 0, 7, 250}
	for _, c := range seeds {
		f.Add(c.SamplesPerInsert, c.MinSize, c.MinDiff, c.MaxDiff, ops)
	}
	f.Fuzz(func(t *testing.T, spi float64, minSize int64, minDiff, maxDiff float64, ops []byte) {
		cfg := Config{spi, minSize, minDiff, maxDiff}
		verr := cfg.Validate()
		l, err := New(cfg)
		if (err == nil) != (verr == nil) || err != nil && (l != nil || !errors.Is(err, ErrInvalidConfig)) {
			t.Fatalf("New(%+v) = %v, %v; Validate = %v", cfg, l, err, verr)
		}
		// The same numbers read as SampleToInsertRatio's arguments.
		if rc, err := SampleToInsertRatio(spi, minSize, maxDiff); err == nil {
			if err := rc.Validate(); err != nil {
				t.Fatalf("SampleToInsertRatio(%v, %d, %v) = %+v, which Validate rejects: %v", spi, minSize, maxDiff, rc, err)
			}
		} else if !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("SampleToInsertRatio error %v is not ErrInvalidConfig", err)
		}
		if verr != nil {
			return
		}
		data, err := json.Marshal(cfg)
		if err != nil {
			t.Fatalf("Marshal(%+v): %v", cfg, err)
		}
		var back Config
		if err := json.Unmarshal(data, &back); err != nil || back != cfg {
			t.Fatalf("JSON round trip of %+v = %+v, %v (via %s)", cfg, back, err, data)
		}

		model := State{Config: cfg}
		for i := 0; i+1 < len(ops); i += 2 {
			n := int(int8(ops[i+1])) % 16 // mostly small, sometimes negative
			switch ops[i] % 8 {
			case 0:
				want := refCanInsert(model, int64(n))
				ok, ch := l.TryInsert(n)
				if ok != want || !ok && (ch == nil) != (n < 0) {
					t.Fatalf("at %+v: TryInsert(%d) = %v, %v; want %v", model, n, ok, ch, want)
				}
				if ok {
					model.Inserts += int64(n)
				}
			case 1:
				want := refCanSample(model, int64(n))
				ok, ch := l.TrySample(n)
				if ok != want || !ok && (ch == nil) != (n < 0) {
					t.Fatalf("at %+v: TrySample(%d) = %v, %v; want %v", model, n, ok, ch, want)
				}
				if ok {
					model.Samples += int64(n)
				}
			case 2:
				l.Delete(n)
				if n > 0 {
					model.Deletes += min(int64(n), model.Inserts-model.Deletes)
				}
			case 3:
				l.Reset()
				model = State{Config: model.Config}
			case 4:
				// Move one bound by n and keep it if it validates.
				next := model.Config
				if ops[i+1]&1 == 0 {
					next.MaxDiff += float64(n)
				} else {
					next.MinDiff += float64(n)
				}
				err := l.Reconfigure(next)
				if (err == nil) != (next.Validate() == nil) {
					t.Fatalf("Reconfigure(%+v) = %v, Validate = %v", next, err, next.Validate())
				}
				if err == nil {
					model.Config = next
				}
			case 5:
				next := model
				next.Samples = max(0, next.Samples+int64(n))
				next.Deletes = next.Deletes + int64(n)
				err := l.Restore(next)
				wantOK := next.Deletes >= 0 && next.Deletes <= next.Inserts
				if (err == nil) != wantOK || err != nil && !errors.Is(err, ErrInvalidCount) {
					t.Fatalf("Restore(%+v) = %v, want ok=%v", next, err, wantOK)
				}
				if err == nil {
					model = next
				}
			case 7:
				want := 0
				for want < n && refCanSample(model, 1) {
					model.Samples++
					want++
				}
				got, ch := l.TrySampleUpTo(n)
				if got != want || (ch == nil) != (got >= n) {
					t.Fatalf("at %+v: TrySampleUpTo(%d) = %d, %v; want %d, one sample at a time", model, n, got, ch, want)
				}
			case 6:
				if got := l.State(); got != model {
					t.Fatalf("State() = %+v, model %+v", got, model)
				}
			}
			for k := -1; k <= 3; k++ {
				if got, want := l.CanInsert(k), refCanInsert(model, int64(k)); got != want {
					t.Fatalf("at %+v: CanInsert(%d) = %v, inequality says %v", model, k, got, want)
				}
				if got, want := l.CanSample(k), refCanSample(model, int64(k)); got != want {
					t.Fatalf("at %+v: CanSample(%d) = %v, inequality says %v", model, k, got, want)
				}
			}
		}
		if got := l.State(); got != model {
			t.Fatalf("final State() = %+v, model %+v", got, model)
		}
	})
}
