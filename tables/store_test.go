package tables

import (
	"sync"
	"testing"
)

func TestChunkStorePutGetRelease(t *testing.T) {
	s := NewChunkStore()
	a := putChunk(s, 1, 4, 100)
	putChunk(s, 2, 4, 30)
	if s.Len() != 2 || s.Bytes() != 130 {
		t.Fatalf("Len, Bytes = %d, %d; want 2, 130", s.Len(), s.Bytes())
	}
	// A second Put of the same key returns the chunk already there and
	// takes a reference to it; its own data is ignored.
	again := s.Put(&Chunk{Key: 1, Data: make([]byte, 7)})
	if again != a {
		t.Fatalf("Put of a present key returned %p, want the present chunk %p", again, a)
	}
	if refs(s, 1) != 2 || s.Bytes() != 130 {
		t.Fatalf("after second Put: refs %d bytes %d; want 2, 130", refs(s, 1), s.Bytes())
	}
	if c, ok := s.Get(1); !ok || c != a {
		t.Fatalf("Get(1) = %p, %v", c, ok)
	}
	if err := s.Release(1); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get(1); !ok {
		t.Fatal("chunk 1 dropped while a reference remains")
	}
	if err := s.Release(1, 2); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 0 || s.Bytes() != 0 {
		t.Fatalf("after releasing everything: Len, Bytes = %d, %d", s.Len(), s.Bytes())
	}
	if _, ok := s.Get(1); ok {
		t.Fatal("chunk 1 still present after its last release")
	}
	if s.Put(nil) != nil || s.Len() != 0 {
		t.Fatal("Put(nil) stored something")
	}
}

func TestChunkStoreRetainIsAllOrNothing(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	putChunk(s, 2, 1, 1)
	err := s.Retain(1, 2, 9, 1)
	wantErr(t, err, []error{ErrChunkMissing}, "chunk 9")
	if refs(s, 1) != 1 || refs(s, 2) != 1 {
		t.Fatalf("failed Retain took references: %d, %d", refs(s, 1), refs(s, 2))
	}
	if err := s.Retain(1, 1, 2); err != nil {
		t.Fatal(err)
	}
	if refs(s, 1) != 3 || refs(s, 2) != 2 {
		t.Fatalf("refs after Retain(1, 1, 2) = %d, %d; want 3, 2", refs(s, 1), refs(s, 2))
	}
}

func TestChunkStoreReleaseUnknownKey(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 1)
	err := s.Release(5, 1, 6)
	wantErr(t, err, []error{ErrChunkMissing}, "[5 6]")
	if s.Len() != 0 {
		t.Fatal("the held key in the same call was not released")
	}
}

func TestChunkStoreAcquireChecks(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 4, 8)
	putChunk(s, 2, 4, 8)
	s.Put(&Chunk{Key: 3, DType: "int64", Shape: []int64{2}, Length: 4})
	s.Put(&Chunk{Key: 4, DType: "float32", Shape: []int64{3}, Length: 4})
	cases := []struct {
		name   string
		traj   []Column
		target error
		words  []string
	}{
		{"missing", []Column{col("a", 1), col("b", 7)}, ErrChunkMissing, []string{"chunk 7", `"b"`}},
		{"offset past end", []Column{{Name: "a", Slices: []Slice{{Chunk: 1, Offset: 3, Length: 2}}}}, ErrInvalidItem, []string{`"a"`, "[3, 5)", "4 steps"}},
		{"negative offset", []Column{{Name: "a", Slices: []Slice{{Chunk: 1, Offset: -1, Length: 1}}}}, ErrInvalidItem, []string{`"a"`}},
		{"zero length", []Column{{Name: "a", Slices: []Slice{{Chunk: 1, Offset: 0, Length: 0}}}}, ErrInvalidItem, []string{`"a"`}},
		{"mixed dtypes", []Column{col("a", 1, 3)}, ErrInvalidItem, []string{`"a"`, "int64"}},
		{"mixed shapes", []Column{col("a", 1, 4)}, ErrInvalidItem, []string{`"a"`, "[3]"}},
		{"squeezed two steps", []Column{{Name: "a", Squeeze: true, Slices: []Slice{{Chunk: 1, Offset: 0, Length: 2}}}}, ErrInvalidItem, []string{`"a"`, "squeezed"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := s.acquire(c.traj, nil)
			wantErr(t, err, []error{c.target}, c.words...)
			for k := ChunkKey(1); k <= 4; k++ {
				if refs(s, k) != 1 {
					t.Fatalf("failed acquire left chunk %d with %d refs", k, refs(s, k))
				}
			}
		})
	}
	// Distinct chunks in order of first use, one reference each.
	got, _, err := s.acquire([]Column{col("a", 2, 1, 2), col("b", 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Key != 2 || got[1].Key != 1 {
		t.Fatalf("acquire returned %v, want chunks 2, 1", got)
	}
	if refs(s, 1) != 2 || refs(s, 2) != 2 {
		t.Fatalf("refs after acquire = %d, %d; want 2, 2", refs(s, 1), refs(s, 2))
	}
}

func TestChunkStoreConcurrent(t *testing.T) {
	s := NewChunkStore()
	const workers, rounds = 4, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				k := ChunkKey(i % 10)
				putChunk(s, k, 1, 3)
				if err := s.Retain(k); err != nil {
					t.Errorf("worker %d: Retain(%d) after Put: %v", w, k, err)
					return
				}
				if err := s.Release(k, k); err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if s.Len() != 0 || s.Bytes() != 0 {
		t.Fatalf("balanced Put/Retain/Release left Len %d Bytes %d", s.Len(), s.Bytes())
	}
}
