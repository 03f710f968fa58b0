package tables

import (
	"math"
	"testing"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

func TestNewRejectsBadConfig(t *testing.T) {
	good := config("t", selectors.KindUniform, selectors.KindFifo, 10, limiter.MinSize(1))
	cases := []struct {
		name  string
		edit  func(*Config)
		words []string
	}{
		{"no name", func(c *Config) { c.Name = "" }, []string{"name"}},
		{"bad sampler", func(c *Config) { c.Sampler.Kind = "random" }, []string{"sampler", "random"}},
		{"bad remover", func(c *Config) { c.Remover = selectors.Options{Kind: selectors.KindPrioritized, Exponent: math.NaN()} }, []string{"remover"}},
		{"max size", func(c *Config) { c.MaxSize = 0 }, []string{"max_size"}},
		{"max size over the bound", func(c *Config) { c.MaxSize = MaxTableSize + 1 }, []string{"max_size", "2147483647"}},
		{"limiter", func(c *Config) { c.Limiter.MinSize = 0 }, []string{"rate_limiter", "min_size"}},
		{"limiter above max size", func(c *Config) { c.Limiter = limiter.MinSize(11) }, []string{"rate_limiter", "min_size (11) > max_size (10)"}},
		{"signature name", func(c *Config) { c.Signature = Signature{{Name: "", DType: "int8"}} }, []string{"signature[0].name"}},
		{"signature dtype", func(c *Config) { c.Signature = Signature{{Name: "a"}} }, []string{"signature[0]", "dtype"}},
		{"signature duplicate", func(c *Config) {
			c.Signature = Signature{{Name: "a", DType: "int8"}, {Name: "a", DType: "int8"}}
		}, []string{"signature[1]", `"a"`}},
		{"signature shape", func(c *Config) { c.Signature = Signature{{Name: "a", DType: "int8", Shape: []int64{3, -2}}} }, []string{"signature[0]", "shape"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.edit(&cfg)
			_, err := New(cfg, NewChunkStore())
			wantErr(t, err, []error{ErrInvalidConfig}, c.words...)
		})
	}
	if _, err := New(good, nil); err == nil {
		t.Fatal("New accepted a nil store")
	}
	if _, err := New(good, NewChunkStore()); err != nil {
		t.Fatalf("New(good): %v", err)
	}
}

func TestPresets(t *testing.T) {
	for _, cfg := range []Config{QueueConfig("q", 5), StackConfig("s", 5)} {
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s: %v", cfg.Name, err)
		}
		if cfg.MaxSize != 5 || cfg.MaxTimesSampled != 1 || cfg.Limiter != limiter.Queue(5) {
			t.Fatalf("%s: %+v", cfg.Name, cfg)
		}
	}
	if k := QueueConfig("q", 5).Sampler.Kind; k != selectors.KindFifo {
		t.Fatalf("queue sampler %s", k)
	}
	if k := StackConfig("s", 5).Remover.Kind; k != selectors.KindLifo {
		t.Fatalf("stack remover %s", k)
	}
}

func TestSignatureErrorsNameTheColumn(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 4, 8) // float32, step shape [2]
	s.Put(&Chunk{Key: 2, Format: &Format{DType: "uint8", Shape: []int64{84, 84}}, Length: 4})
	cfg := config("t", selectors.KindFifo, selectors.KindFifo, 10, limiter.MinSize(1))
	cfg.Signature = Signature{
		{Name: "obs", DType: "uint8", Shape: []int64{-1, 84, 84}},
		{Name: "reward", DType: "float32", Shape: []int64{2}},
	}
	tb := mustNew(t, cfg, s)
	obs := func(steps int32) Column {
		return Column{Name: "obs", Slices: []Slice{{Chunk: 2, Offset: 0, Length: steps}}}
	}
	reward := Column{Name: "reward", Squeeze: true, Slices: []Slice{{Chunk: 1, Offset: 2, Length: 1}}}
	cases := []struct {
		name  string
		traj  []Column
		words []string
	}{
		{"column count", []Column{obs(3)}, []string{"1 columns", "signature has 2"}},
		{"name", []Column{obs(3), {Name: "rew", Squeeze: true, Slices: reward.Slices}}, []string{`"rew"`, `"reward"`}},
		{"dtype", []Column{{Name: "obs", Slices: []Slice{{Chunk: 1, Length: 1}}}, reward}, []string{`"obs"`, "float32", "uint8"}},
		{"shape unsqueezed", []Column{obs(3), {Name: "reward", Slices: reward.Slices}}, []string{`"reward"`, "[1 2]", "[2]"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := tb.Insert(expired(), Item{Key: 1, Priority: 1, Trajectory: c.traj})
			wantErr(t, err, []error{ErrSignature}, c.words...)
			if refs(s, 1) != 1 || refs(s, 2) != 1 {
				t.Fatal("a rejected item kept chunk references")
			}
		})
	}
	// The wildcard takes any number of steps.
	for k, steps := range []int32{1, 4} {
		if err := tb.Insert(expired(), Item{Key: uint64(k), Priority: 1, Trajectory: []Column{obs(steps), reward}}); err != nil {
			t.Fatalf("%d steps: %v", steps, err)
		}
	}
}
