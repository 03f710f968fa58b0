// Command engine applies the differential harness's scenarios to Reprise's
// engine in-process (tables, selectors, limiter: no NATS) and prints what it
// observed, in the form the Reverb runner prints it, so that
// bench/reverbdiff/run.py can compare the two.
//
//	go run ./bench/reverbdiff/engine < scenarios.json > observations.json
//
// The input is a JSON list of scenarios (see bench/reverbdiff/scenarios.py);
// the output a JSON object of scenario name to its list of observations, one
// per operation. Non-finite numbers travel as the strings "nan", "inf" and
// "-inf", which JSON cannot spell otherwise.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "engine:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	var scenarios []Scenario
	if err := json.NewDecoder(in).Decode(&scenarios); err != nil {
		return fmt.Errorf("reading scenarios: %w", err)
	}
	results := make(map[string][]Obs, len(scenarios))
	for _, s := range scenarios {
		results[s.Name] = apply(s)
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", " ")
	return enc.Encode(results)
}

// Num is a float64 that JSON carries as a number, or as "nan", "inf" or
// "-inf".
type Num float64

func (n *Num) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("number %q: %w", s, err)
		}
		*n = Num(f)
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*n = Num(f)
	return nil
}

func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	switch {
	case math.IsNaN(f):
		return []byte(`"nan"`), nil
	case math.IsInf(f, 1):
		return []byte(`"inf"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-inf"`), nil
	}
	return json.Marshal(f)
}

// Scenario is one table and the operations applied to it in order.
type Scenario struct {
	Name  string    `json:"name"`
	Table TableSpec `json:"table"`
	Ops   []Op      `json:"ops"`
	Seed  uint64    `json:"seed"`
}

// TableSpec is a table as Reverb's Python API builds one.
type TableSpec struct {
	Sampler         SelectorSpec `json:"sampler"`
	Remover         SelectorSpec `json:"remover"`
	MaxSize         int64        `json:"max_size"`
	MaxTimesSampled int32        `json:"max_times_sampled"`
	Limiter         LimiterSpec  `json:"limiter"`
}

// SelectorSpec names a selector; Exponent is Prioritized's.
type SelectorSpec struct {
	Kind     string `json:"kind"`
	Exponent Num    `json:"exponent"`
}

// LimiterSpec is a rate limiter preset and its parameters: min_size,
// sample_to_insert_ratio (spi, min_size, error_buffer), queue (size) or
// custom (spi, min_size, min_diff, max_diff).
type LimiterSpec struct {
	Preset      string `json:"preset"`
	SPI         Num    `json:"spi"`
	MinSize     int64  `json:"min_size"`
	ErrorBuffer Num    `json:"error_buffer"`
	MinDiff     Num    `json:"min_diff"`
	MaxDiff     Num    `json:"max_diff"`
	Size        int64  `json:"size"`
}

// Op is one operation: insert (ID, Priority), sample (N), mutate (Updates,
// Deletes), reset, info, contents or dist (N samples, counted per item).
// TimeoutMS bounds an insert's or sample's wait for the rate limiter; 0
// waits as long as it takes.
type Op struct {
	Op        string   `json:"op"`
	ID        uint64   `json:"id"`
	Priority  Num      `json:"priority"`
	N         int      `json:"n"`
	TimeoutMS int      `json:"timeout_ms"`
	Updates   [][2]Num `json:"updates"`
	Deletes   []uint64 `json:"deletes"`
}

// Obs is what one operation observed: "op", "error" (null, or one of the
// classes errorClass returns) and the operation's own fields.
type Obs map[string]any

func apply(s Scenario) []Obs {
	cfg, err := tableConfig(s.Table)
	if err != nil {
		return []Obs{{"op": "create", "error": "invalid_argument", "message": err.Error()}}
	}
	store := tables.NewChunkStore()
	t, err := tables.New(cfg, store, tables.WithRand(rand.New(rand.NewPCG(s.Seed, s.Seed))))
	if err != nil {
		return []Obs{{"op": "create", "error": "invalid_argument", "message": err.Error()}}
	}
	defer t.Close()
	out := []Obs{{"op": "create", "error": nil}}
	for _, op := range s.Ops {
		out = append(out, applyOp(t, store, op))
	}
	return out
}

func tableConfig(ts TableSpec) (tables.Config, error) {
	lim, err := limiterConfig(ts.Limiter)
	if err != nil {
		return tables.Config{}, err
	}
	cfg := tables.Config{
		Name:            "t",
		Sampler:         selectors.Options{Kind: selectors.Kind(ts.Sampler.Kind), Exponent: float64(ts.Sampler.Exponent)},
		Remover:         selectors.Options{Kind: selectors.Kind(ts.Remover.Kind), Exponent: float64(ts.Remover.Exponent)},
		MaxSize:         ts.MaxSize,
		MaxTimesSampled: ts.MaxTimesSampled,
		Limiter:         lim,
	}
	return cfg, cfg.Validate()
}

func limiterConfig(l LimiterSpec) (limiter.Config, error) {
	switch l.Preset {
	case "min_size":
		return limiter.MinSize(l.MinSize), nil
	case "sample_to_insert_ratio":
		return limiter.SampleToInsertRatio(float64(l.SPI), l.MinSize, float64(l.ErrorBuffer))
	case "queue":
		return limiter.Queue(l.Size), nil
	case "custom":
		return limiter.Config{SamplesPerInsert: float64(l.SPI), MinSize: l.MinSize, MinDiff: float64(l.MinDiff), MaxDiff: float64(l.MaxDiff)}, nil
	}
	return limiter.Config{}, fmt.Errorf("unknown rate limiter preset %q", l.Preset)
}

// waitContext bounds an operation's wait as TimeoutMS says, or by
// unboundedWait: Reverb would wait for ever, and run.py reports a runner
// that stalls that long as hung.
func (op Op) waitContext() (context.Context, context.CancelFunc) {
	d := unboundedWait
	if op.TimeoutMS > 0 {
		d = time.Duration(op.TimeoutMS) * time.Millisecond
	}
	return context.WithTimeout(context.Background(), d)
}

const unboundedWait = 10 * time.Second

// int64Step is the format of the items' chunks: one int64 a step.
var int64Step = &tables.Format{DType: "int64", StepBytes: 8}

func applyOp(t *tables.Table, store *tables.ChunkStore, op Op) Obs {
	o := Obs{"op": op.Op, "error": nil}
	switch op.Op {
	case "insert":
		// The item's one chunk holds its id, as the Reverb runner's does.
		c := store.Put(&tables.Chunk{Key: op.ID, Format: int64Step, Length: 1, Data: binaryID(op.ID)})
		ctx, cancel := op.waitContext()
		err := t.Insert(ctx, tables.Item{Key: op.ID, Priority: float64(op.Priority),
			Trajectory: []tables.Column{{Name: "id", Slices: []tables.Slice{{Chunk: c.Key, Length: 1}}, Squeeze: true}}})
		cancel()
		if err := store.Release(c.Key); err != nil {
			panic(err) // the runner's own reference: always there
		}
		o["error"] = errorClass(err)
	case "sample", "dist":
		ctx, cancel := op.waitContext()
		samples, err := t.Sample(ctx, op.N)
		cancel()
		o["error"] = errorClass(err)
		if op.Op == "dist" {
			o["n"] = len(samples)
			o["counts"], o["probabilities"] = distribution(samples)
			break
		}
		items := make([]Obs, len(samples))
		for i, s := range samples {
			items[i] = Obs{"id": s.Info.Key, "probability": Num(s.Info.Probability), "priority": Num(s.Info.Priority),
				"times_sampled": s.Info.TimesSampled, "table_size": s.Info.TableSize}
		}
		o["items"] = items
	case "mutate":
		// Reverb applies a call's deletes before its updates.
		var muts []tables.Mutation
		for _, k := range op.Deletes {
			muts = append(muts, tables.Mutation{Key: k, Delete: true})
		}
		for _, u := range op.Updates {
			muts = append(muts, tables.Mutation{Key: uint64(u[0]), Priority: float64(u[1])})
		}
		_, err := t.Mutate(muts)
		o["error"] = errorClass(err)
	case "reset":
		t.Reset()
	case "info":
		info := t.Info()
		st := info.Limiter
		o["size"] = info.Size
		o["max_size"] = info.Config.MaxSize
		o["max_times_sampled"] = info.Config.MaxTimesSampled
		o["limiter"] = Obs{"samples_per_insert": Num(st.Config.SamplesPerInsert), "min_size": st.Config.MinSize,
			"min_diff": Num(st.Config.MinDiff), "max_diff": Num(st.Config.MaxDiff),
			"inserts": st.Inserts, "samples": st.Samples, "deletes": st.Deletes}
		// Reverb's completed inserts and samples count since the last
		// reset, as the limiter's do; the table's Counters are lifetime
		// counts with no Reverb field to compare with.
		o["insert_completed"] = st.Inserts
		o["sample_completed"] = st.Samples
	case "contents":
		items, err := t.List(0, math.MaxInt32)
		o["error"] = errorClass(err)
		sort.Slice(items, func(i, j int) bool { return items[i].Key < items[j].Key })
		list := make([]Obs, len(items))
		for i, it := range items {
			list[i] = Obs{"id": it.Key, "priority": Num(it.Priority), "times_sampled": it.TimesSampled}
		}
		o["items"] = list
	default:
		o["error"] = "other"
		o["message"] = fmt.Sprintf("unknown op %q", op.Op)
	}
	return o
}

// distribution counts samples per item and keeps the probability each
// reported, keyed by the item's id in decimal (JSON object keys are
// strings).
func distribution(samples []tables.Sample) (map[string]int, map[string]Num) {
	counts := make(map[string]int)
	probs := make(map[string]Num)
	for _, s := range samples {
		id := strconv.FormatUint(s.Info.Key, 10)
		counts[id]++
		probs[id] = Num(s.Info.Probability)
	}
	return counts, probs
}

func binaryID(id uint64) []byte {
	b := make([]byte, 8)
	for i := range b {
		b[i] = byte(id >> (8 * i))
	}
	return b
}

// errorClass names an error as run.py compares it across systems.
func errorClass(err error) any {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, limiter.ErrRateLimited):
		return "rate_limited"
	case errors.Is(err, tables.ErrInvalidPriority), errors.Is(err, tables.ErrInvalidArgument):
		return "invalid_argument"
	}
	return "other: " + err.Error()
}
