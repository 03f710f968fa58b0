package limiter

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func mustRatio(t testing.TB, spi float64, minSize int64, errorBuffer float64) Config {
	t.Helper()
	c, err := SampleToInsertRatio(spi, minSize, errorBuffer)
	if err != nil {
		t.Fatalf("SampleToInsertRatio(%v, %d, %v): %v", spi, minSize, errorBuffer, err)
	}
	return c
}

func TestPresets(t *testing.T) {
	inf := math.Inf(1)
	tests := []struct {
		name string
		got  Config
		want Config
	}{
		{"MinSize", MinSize(7), Config{1, 7, -inf, inf}},
		{"SampleToInsertRatio", mustRatio(t, 2, 10, 4), Config{2, 10, 16, 24}},
		{"SampleToInsertRatio spi<1", mustRatio(t, 0.5, 4, 2), Config{0.5, 4, 0, 4}},
		{"Queue", Queue(3), Config{1, 1, 0, 3}},
		{"Stack", Stack(3), Config{1, 1, 0, 3}},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %+v, want %+v", tt.name, tt.got, tt.want)
		}
		if err := tt.got.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", tt.name, err)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	ratio := func(spi float64, minSize int64, eb float64) func() error {
		return func() error { _, err := SampleToInsertRatio(spi, minSize, eb); return err }
	}
	validate := func(c Config) func() error { return c.Validate }
	tests := []struct {
		name string
		err  func() error
		want string
	}{
		{"spi zero", validate(Config{0, 1, 0, 1}), "samples_per_insert must be finite and > 0, got 0"},
		{"spi negative", validate(Config{-1, 1, 0, 1}), "samples_per_insert must be finite and > 0, got -1"},
		{"spi NaN", validate(Config{nan, 1, 0, 1}), "samples_per_insert must be finite and > 0, got NaN"},
		{"spi infinite", validate(Config{inf, 1, 0, 1}), "samples_per_insert must be finite and > 0, got +Inf"},
		{"min_size zero", validate(Config{1, 0, 0, 1}), "min_size must be >= 1, got 0"},
		{"min_size negative", validate(MinSize(-3)), "min_size must be >= 1, got -3"},
		{"min_diff NaN", validate(Config{1, 1, nan, 1}), "min_diff and max_diff must not be NaN"},
		{"max_diff NaN", validate(Config{1, 1, 0, nan}), "min_diff and max_diff must not be NaN"},
		{"min_diff above max_diff", validate(Queue(-1)), "min_diff (0) > max_diff (-1)"},
		{"min_diff above spi*min_size", validate(Config{1, 2, 3, 10}), "min_diff (3) > samples_per_insert*min_size (2)"},
		{"min_diff +inf", validate(Config{1, 2, inf, inf}), "min_diff (+Inf) > samples_per_insert*min_size (2)"},
		{"stalls at min_size", validate(Config{1, 1, 1, 1}), "once min_size (1) items are inserted neither a sample (needs min_diff <= 0) nor another insert (needs max_diff >= 2) is allowed"},
		{"stalls once sampled", validate(Config{1, 1, 0, 0}), "max_diff - min_diff (0) is too narrow for samples_per_insert 1: samples can bring inserts*samples_per_insert - samples to 0"},
		{"stalls at half steps", validate(Config{1.5, 1, 0, 1.5}), "max_diff - min_diff (1.5) is too narrow for samples_per_insert 1.5: samples can bring inserts*samples_per_insert - samples to 0.5"},
		{"stalls for a spi of no small denominator", validate(Config{0.1, 10, 0, 1.05}), "max_diff - min_diff (1.05) is too narrow for samples_per_insert 0.1"},
		{"ratio buffer too small", ratio(2, 10, 1.5), "error buffer 1.5 is too small for samples_per_insert 2: need 2*error_buffer >= 2*max(1, samples_per_insert) = 4"},
		{"ratio buffer too small spi<1", ratio(0.5, 1, 0.9), "error buffer 0.9 is too small for samples_per_insert 0.5: need 2*error_buffer >= 2*max(1, samples_per_insert) = 2"},
		{"ratio buffer negative", ratio(1, 1, -1), "error buffer must be finite and >= 0, got -1"},
		{"ratio buffer NaN", ratio(1, 1, nan), "error buffer must be finite and >= 0, got NaN"},
		{"ratio buffer infinite", ratio(1, 1, inf), "error buffer must be finite and >= 0, got +Inf"},
		{"ratio spi zero", ratio(0, 1, 1), "samples_per_insert must be finite and > 0, got 0"},
		{"ratio min_size zero", ratio(1, 0, 1), "min_size must be >= 1, got 0"},
	}
	for _, tt := range tests {
		err := tt.err()
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", tt.name, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %q, want it to contain %q", tt.name, err, tt.want)
		}
	}
}

func TestValidateAccepts(t *testing.T) {
	for _, c := range []Config{
		MinSize(1), Queue(1), Stack(10), mustRatio(t, 1, 1, 1), mustRatio(t, 3, 5, 3), mustRatio(t, 0.1, 100, 1),
		{SamplesPerInsert: 1, MinSize: 1, MinDiff: 1, MaxDiff: 2}, // first sample needs a second insert
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", c, err)
		}
	}
}

// TestValidateMatchesWalks: for configs of small dyadic parameters,
// Validate refuses a config as stalling exactly when learners that sample
// whenever they may, with actors inserting otherwise, bring the limiter to
// a state that allows neither; and from no config it accepts do random
// walks of allowed inserts and samples (fixed seeds) reach such a state.
func TestValidateMatchesWalks(t *testing.T) {
	stuck := func(s *State) bool { return !s.canSample(1) && !s.canInsert(1) }
	rng := rand.New(rand.NewPCG(7, 11))
	checked, refused := 0, 0
	for _, spi := range []float64{0.25, 0.5, 1, 1.5, 2, 3} {
		for _, minSize := range []int64{1, 2, 3} {
			for _, minDiff := range []float64{-2, -1, -0.5, 0, 0.5, 1} {
				for _, width := range []float64{0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 2.5, 3, 3.5, 4} {
					c := Config{SamplesPerInsert: spi, MinSize: minSize, MinDiff: minDiff, MaxDiff: minDiff + width}
					err := c.Validate()
					if err != nil && !strings.Contains(err.Error(), "too narrow") {
						continue // refused for another reason
					}
					checked++
					greedy := &State{Config: c}
					stalled := false
					for range 4000 {
						switch {
						case greedy.canSample(1):
							greedy.Samples++
						case greedy.canInsert(1):
							greedy.Inserts++
						default:
							stalled = true
						}
						if stalled {
							break
						}
					}
					name := fmt.Sprintf("%+v", c)
					if stalled != (err != nil) {
						t.Errorf("%s: Validate = %v, a learner-first walk stalled: %v", name, err, stalled)
					}
					if err != nil {
						refused++
						continue
					}
					for range 5 {
						s := &State{Config: c}
						for range 2000 {
							if stuck(s) {
								t.Fatalf("%s: accepted, but a random walk stalled at %+v", name, *s)
							}
							if s.canSample(1) && (!s.canInsert(1) || rng.IntN(2) == 0) {
								s.Samples++
							} else {
								s.Inserts++
							}
						}
					}
				}
			}
		}
	}
	if refused == 0 || refused == checked {
		t.Fatalf("%d of %d configs refused as stalling: the grid shows nothing", refused, checked)
	}
	t.Logf("%d configs walked, %d refused as stalling", checked, refused)
}

func TestConfigJSON(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string
	}{
		{MinSize(5), `{"samples_per_insert":1,"min_size":5,"min_diff":"-inf","max_diff":"inf"}`},
		{Queue(3), `{"samples_per_insert":1,"min_size":1,"min_diff":0,"max_diff":3}`},
		{mustRatio(t, 0.1, 3, 1.25), `{"samples_per_insert":0.1,"min_size":3,"min_diff":-0.95,"max_diff":1.55}`},
	}
	for _, tt := range tests {
		data, err := json.Marshal(tt.cfg)
		if err != nil {
			t.Fatalf("Marshal(%+v): %v", tt.cfg, err)
		}
		if string(data) != tt.want {
			t.Errorf("Marshal(%+v) = %s, want %s", tt.cfg, data, tt.want)
		}
		var back Config
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatalf("Unmarshal(%s): %v", data, err)
		}
		if back != tt.cfg {
			t.Errorf("round trip of %+v = %+v", tt.cfg, back)
		}
	}
}

func TestConfigUnmarshalJSON(t *testing.T) {
	var c Config
	if err := json.Unmarshal([]byte(`{"samples_per_insert":2,"min_size":1,"min_diff":"-inf","max_diff":"+inf"}`), &c); err != nil {
		t.Fatal(err)
	}
	if want := (Config{2, 1, math.Inf(-1), math.Inf(1)}); c != want {
		t.Errorf("got %+v, want %+v", c, want)
	}
	// Absent fields and null bounds keep their values, as encoding/json does
	// for plain fields.
	c = Queue(4)
	if err := json.Unmarshal([]byte(`{"min_size":2,"max_diff":null}`), &c); err != nil || c != (Config{1, 2, 0, 4}) {
		t.Errorf("partial JSON: got %+v, %v; want %+v", c, err, Config{1, 2, 0, 4})
	}
	for _, bad := range []string{
		`{"min_diff":"infinity"}`,
		`{"max_diff":true}`,
		`{"min_size":"1"}`,
	} {
		err := json.Unmarshal([]byte(bad), &c)
		if err == nil {
			t.Errorf("Unmarshal(%s) succeeded", bad)
		}
	}
	err := json.Unmarshal([]byte(`{"min_diff":"infinity"}`), &c)
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `"infinity"`) {
		t.Errorf("bad bound: err = %v, want ErrInvalidConfig naming the value", err)
	}
	if _, err := json.Marshal(Config{1, 1, math.NaN(), 1}); err == nil {
		t.Error("Marshal of a NaN bound succeeded")
	}
}

func TestStateJSON(t *testing.T) {
	s := State{Config: MinSize(2), Inserts: 10, Samples: 30, Deletes: 4}
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"config":{"samples_per_insert":1,"min_size":2,"min_diff":"-inf","max_diff":"inf"},"inserts":10,"samples":30,"deletes":4}`
	if string(data) != want {
		t.Errorf("Marshal = %s, want %s", data, want)
	}
	var back State
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back != s {
		t.Errorf("round trip = %+v, want %+v", back, s)
	}
}
