package tables

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

// expired is a context that is already done: Insert and Sample with it try
// once and never wait.
func expired() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// testCtx bounds a test's blocking calls so that a bug fails the test instead
// of hanging it.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// putChunk puts a float32 chunk of the given steps with step shape [2] and
// len(data) = size bytes, keeping the caller's reference.
func putChunk(s *ChunkStore, key ChunkKey, steps int32, size int) *Chunk {
	return s.Put(&Chunk{Key: key, Format: &Format{DType: "float32", Shape: []int64{2}}, Length: steps, Data: make([]byte, size)})
}

// col is a column named name covering one step of each chunk in keys.
func col(name string, keys ...ChunkKey) Column {
	c := Column{Name: name}
	for _, k := range keys {
		c.Slices = append(c.Slices, Slice{Chunk: k, Offset: 0, Length: 1})
	}
	return c
}

// newItem is an item with one column "obs" over the first step of each chunk.
func newItem(key uint64, priority float64, chunks ...ChunkKey) Item {
	return Item{Key: key, Priority: priority, Trajectory: []Column{col("obs", chunks...)}}
}

func config(name string, sampler, remover selectors.Kind, maxSize int64, lim limiter.Config) Config {
	return Config{
		Name:    name,
		Sampler: selectors.Options{Kind: sampler, Exponent: 1},
		Remover: selectors.Options{Kind: remover, Exponent: 1},
		MaxSize: maxSize,
		Limiter: lim,
	}
}

func mustNew(t testing.TB, cfg Config, store *ChunkStore, opts ...Option) *Table {
	t.Helper()
	tb, err := New(cfg, store, append([]Option{WithRand(rand.New(rand.NewPCG(1, 2)))}, opts...)...)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return tb
}

func mustInsert(t testing.TB, tb *Table, it Item) {
	t.Helper()
	if err := tb.Insert(expired(), it); err != nil {
		t.Fatalf("Insert(%d): %v", it.Key, err)
	}
}

func sampleKeys(t testing.TB, tb *Table, n int) []uint64 {
	t.Helper()
	ss, err := tb.Sample(expired(), n)
	if err != nil {
		t.Fatalf("Sample(%d): got %d samples, error %v", n, len(ss), err)
	}
	keys := make([]uint64, len(ss))
	for i, s := range ss {
		keys[i] = s.Info.Key
	}
	return keys
}

func listKeys(t testing.TB, tb *Table) []uint64 {
	t.Helper()
	var keys []uint64
	for _, it := range mustList(t, tb, 0, 1<<30) {
		keys = append(keys, it.Key)
	}
	return keys
}

func mustList(t testing.TB, tb *Table, offset, limit int) []Item {
	t.Helper()
	items, err := tb.List(offset, limit)
	if err != nil {
		t.Fatalf("List(%d, %d): %v", offset, limit, err)
	}
	return items
}

func refs(s *ChunkStore, key ChunkKey) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sc, ok := s.lookupLocked(key); ok {
		return int64(sc.refs)
	}
	return 0
}

// wantErr checks that err matches every target and mentions every word.
func wantErr(t testing.TB, err error, targets []error, words ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", targets)
	}
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Errorf("error %q does not match %v", err, target)
		}
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

// waitFor polls cond until it holds, failing the test after a deadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
