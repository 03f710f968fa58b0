// Package limiter holds a replay table's rate limiter: the samples-per-insert
// inequality that decides whether an insert or a sample may go ahead, and the
// presets (MinSize, SampleToInsertRatio, Queue, Stack) that are parameter sets
// of it. It has no clock: callers bound their waits with a context.
package limiter

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// ErrInvalidConfig is returned for parameters the limiter cannot honour.
var ErrInvalidConfig = errors.New("limiter: invalid config")

// Config is the inequality's parameters. Inserts, samples and deletes are
// counted since creation or reset; with size = inserts - deletes:
//
//	may sample n: size >= MinSize  and  inserts*SamplesPerInsert - samples - n >= MinDiff
//	may insert n: inserts + n - deletes <= MinSize  or  (inserts+n)*SamplesPerInsert - samples <= MaxDiff
type Config struct {
	SamplesPerInsert float64 `json:"samples_per_insert"`
	MinSize          int64   `json:"min_size"`
	MinDiff          float64 `json:"min_diff"`
	MaxDiff          float64 `json:"max_diff"`
}

// MinSize allows sampling once the table holds at least n items and never
// holds inserts.
func MinSize(n int64) Config {
	return Config{SamplesPerInsert: 1, MinSize: n, MinDiff: math.Inf(-1), MaxDiff: math.Inf(1)}
}

// SampleToInsertRatio keeps samples per insert near spi once the table holds
// minSize items: the running difference may stray errorBuffer either side.
func SampleToInsertRatio(spi float64, minSize int64, errorBuffer float64) (Config, error) {
	if math.IsNaN(errorBuffer) || math.IsInf(errorBuffer, 0) || errorBuffer < 0 {
		return Config{}, fmt.Errorf("%w: error buffer must be finite and >= 0, got %v", ErrInvalidConfig, errorBuffer)
	}
	offset := spi * float64(minSize)
	c := Config{SamplesPerInsert: spi, MinSize: minSize, MinDiff: offset - errorBuffer, MaxDiff: offset + errorBuffer}
	// A narrower window lets inserts and samples block each other forever
	// when several clients of each kind race for it (Validate finds a
	// stall only for narrower ones still).
	if need := 2 * math.Max(1, spi); spi > 0 && !math.IsInf(spi, 0) && 2*errorBuffer < need {
		return Config{}, fmt.Errorf("%w: error buffer %v is too small for samples_per_insert %v: need 2*error_buffer >= 2*max(1, samples_per_insert) = %v, or inserts and samples can block each other forever",
			ErrInvalidConfig, errorBuffer, spi, need)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Queue is the limiter of a FIFO queue of at most size items (pair it with
// Fifo selectors and max times sampled 1): every item is sampled once.
func Queue(size int64) Config {
	return Config{SamplesPerInsert: 1, MinSize: 1, MinDiff: 0, MaxDiff: float64(size)}
}

// Stack is Queue's LIFO twin (pair it with Lifo selectors).
func Stack(size int64) Config { return Queue(size) }

// Validate rejects parameters that are meaningless or that would stall a table
// for good: once MinSize items are inserted, a sample or another insert must be
// allowed.
func (c Config) Validate() error {
	// The first state past the free zone: MinSize inserts, nothing sampled or
	// deleted yet.
	atMinSize := State{Config: c, Inserts: c.MinSize}
	switch {
	case math.IsNaN(c.SamplesPerInsert) || math.IsInf(c.SamplesPerInsert, 0) || c.SamplesPerInsert <= 0:
		return fmt.Errorf("%w: samples_per_insert must be finite and > 0, got %v", ErrInvalidConfig, c.SamplesPerInsert)
	case c.MinSize < 1:
		return fmt.Errorf("%w: min_size must be >= 1, got %d", ErrInvalidConfig, c.MinSize)
	case math.IsNaN(c.MinDiff) || math.IsNaN(c.MaxDiff):
		return fmt.Errorf("%w: min_diff and max_diff must not be NaN", ErrInvalidConfig)
	case c.MinDiff > c.MaxDiff:
		return fmt.Errorf("%w: min_diff (%v) > max_diff (%v)", ErrInvalidConfig, c.MinDiff, c.MaxDiff)
	case c.MinDiff > c.SamplesPerInsert*float64(c.MinSize):
		return fmt.Errorf("%w: min_diff (%v) > samples_per_insert*min_size (%v): no sample could ever be allowed once min_size is reached; lower min_diff or raise min_size",
			ErrInvalidConfig, c.MinDiff, c.SamplesPerInsert*float64(c.MinSize))
	case !atMinSize.canSample(1) && !atMinSize.canInsert(1):
		return fmt.Errorf("%w: once min_size (%d) items are inserted neither a sample (needs min_diff <= %v) nor another insert (needs max_diff >= %v) is allowed",
			ErrInvalidConfig, c.MinSize, c.SamplesPerInsert*float64(c.MinSize)-1, c.SamplesPerInsert*(float64(c.MinSize)+1))
	}
	if at, ok := c.stall(); ok {
		return fmt.Errorf("%w: max_diff - min_diff (%v) is too narrow for samples_per_insert %v: samples can bring inserts*samples_per_insert - samples to %v, where neither a sample (needs it >= min_diff + 1) nor an insert (needs it <= max_diff - samples_per_insert) is allowed; max_diff - min_diff >= samples_per_insert + 1 never stalls",
			ErrInvalidConfig, c.MaxDiff-c.MinDiff, c.SamplesPerInsert, at)
	}
	return nil
}

// stall finds a difference d = inserts*SamplesPerInsert - samples the
// limiter can reach once MinSize items are inserted where neither a sample
// (d-1 >= MinDiff) nor an insert (d+spi <= MaxDiff) is allowed: a table
// stuck for good. Samples take 1 off d and inserts add spi, so learners
// sampling at full speed bring d into [MinDiff, MinDiff+1), and the values
// it takes there, as inserts go on, are MinDiff + frac(a*spi - MinDiff) for
// a = 0, 1, 2...: with spi = p/q in lowest terms, q a small power of two,
// MinDiff + g + j/q for every j < q, g = -MinDiff mod 1/q; with a larger
// denominator (spi = 0.1 is not 1/10 in binary) they come as close to
// MinDiff+1 as one likes. An insert from there needs d <= MaxDiff - spi.
func (c Config) stall() (float64, bool) {
	if math.IsInf(c.MinDiff, 0) || math.IsInf(c.MaxDiff, 0) {
		return 0, false
	}
	spi := c.SamplesPerInsert
	room := c.MaxDiff - c.MinDiff - spi // how far above MinDiff an insert is still allowed
	if room >= 1 {
		return 0, false
	}
	q := 1.0
	for q <= maxDenominator && spi*q != math.Trunc(spi*q) {
		q *= 2
	}
	if q > maxDenominator {
		return c.MinDiff + math.Max(room, 0) + (1-math.Max(room, 0))/2, true
	}
	g := math.Mod(-c.MinDiff, 1/q)
	if g < 0 {
		g += 1 / q
	}
	if highest := g + (q-1)/q; highest > room {
		return c.MinDiff + highest, true
	}
	return 0, false
}

// maxDenominator is the largest denominator of samples_per_insert that
// stall reads exactly; past it the differences are as good as dense.
const maxDenominator = 1 << 20

// configJSON spells infinite bounds as strings: JSON has no infinity.
type configJSON struct {
	SamplesPerInsert float64 `json:"samples_per_insert"`
	MinSize          int64   `json:"min_size"`
	MinDiff          bound   `json:"min_diff"`
	MaxDiff          bound   `json:"max_diff"`
}

type bound float64

func (b bound) MarshalJSON() ([]byte, error) {
	switch {
	case math.IsInf(float64(b), 1):
		return []byte(`"inf"`), nil
	case math.IsInf(float64(b), -1):
		return []byte(`"-inf"`), nil
	}
	return json.Marshal(float64(b))
}

func (b *bound) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil // encoding/json's convention: null leaves the value alone
	}
	var s string
	if json.Unmarshal(data, &s) == nil {
		switch s {
		case "inf", "+inf":
			*b = bound(math.Inf(1))
		case "-inf":
			*b = bound(math.Inf(-1))
		default:
			return fmt.Errorf("%w: bound %q is neither a number nor \"inf\"/\"-inf\"", ErrInvalidConfig, s)
		}
		return nil
	}
	var f float64
	if err := json.Unmarshal(data, &f); err != nil {
		return fmt.Errorf("%w: bound %s: %v", ErrInvalidConfig, data, err)
	}
	*b = bound(f)
	return nil
}

// MarshalJSON encodes infinite bounds as "inf" and "-inf".
func (c Config) MarshalJSON() ([]byte, error) {
	return json.Marshal(configJSON{c.SamplesPerInsert, c.MinSize, bound(c.MinDiff), bound(c.MaxDiff)})
}

// UnmarshalJSON accepts what MarshalJSON writes.
func (c *Config) UnmarshalJSON(data []byte) error {
	// Start from c so that absent fields keep their values, as they would for
	// a struct without a custom decoder.
	j := configJSON{c.SamplesPerInsert, c.MinSize, bound(c.MinDiff), bound(c.MaxDiff)}
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*c = Config{j.SamplesPerInsert, j.MinSize, float64(j.MinDiff), float64(j.MaxDiff)}
	return nil
}
