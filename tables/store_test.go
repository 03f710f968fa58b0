package tables

import (
	"math"
	"sync"
	"testing"
	"unsafe"
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

func TestChunkStoreRetainItemHoldsEachDistinctChunkOnce(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 4, 10)
	putChunk(s, 2, 4, 30)
	keys, bytes, err := s.RetainItem([]Column{col("a", 2, 1, 2), col("b", 1, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0] != 2 || keys[1] != 1 || bytes != 40 {
		t.Fatalf("RetainItem = %v, %d bytes; want chunks 2, 1 in order of first use, 40 bytes", keys, bytes)
	}
	if refs(s, 1) != 2 || refs(s, 2) != 2 {
		t.Fatalf("refs after RetainItem = %d, %d; want 2, 2: one more each, however often the item names them", refs(s, 1), refs(s, 2))
	}
	_, _, err = s.RetainItem([]Column{col("a", 1, 2), col("b", 2, 9, 1)})
	wantErr(t, err, []error{ErrChunkMissing}, "chunk 9", `column "b"`, "slice 1")
	if refs(s, 1) != 2 || refs(s, 2) != 2 {
		t.Fatalf("a failed RetainItem took references: %d, %d", refs(s, 1), refs(s, 2))
	}
	sc, _ := s.lookupLocked(1)
	sc.refs = maxRefs
	_, _, err = s.RetainItem([]Column{col("a", 2, 1)})
	wantErr(t, err, []error{ErrInvalidArgument}, "chunk 1", "references")
	if refs(s, 2) != 2 {
		t.Fatalf("a refused RetainItem took a reference to chunk 2: %d", refs(s, 2))
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
	s.Put(&Chunk{Key: 3, Format: &Format{DType: "int64", Shape: []int64{2}}, Length: 4})
	s.Put(&Chunk{Key: 4, Format: &Format{DType: "float32", Shape: []int64{3}}, Length: 4})
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

func TestChunkStoreSharesFormats(t *testing.T) {
	s := NewChunkStore()
	mine := &Format{DType: "float32", Shape: []int64{2}, StepBytes: 8}
	a := s.Put(&Chunk{Key: 1, Format: mine, Length: 1})
	b := s.Put(&Chunk{Key: 2, Format: &Format{DType: "float32", Shape: []int64{2}, StepBytes: 8}, Length: 1})
	other := s.Put(&Chunk{Key: 3, Format: &Format{DType: "float32", Shape: []int64{3}, StepBytes: 12}, Length: 1})
	bare := s.Put(&Chunk{Key: 4, Length: 1})
	if a.Format != b.Format {
		t.Fatal("two chunks of one format were given different Formats")
	}
	if a.Format == mine {
		t.Fatal("the store kept the caller's Format rather than a copy of its own")
	}
	if other.Format == a.Format || other.Shape[0] != 3 || other.StepBytes != 12 {
		t.Fatalf("a chunk of shape [3] got Format %+v", *other.Format)
	}
	if bare.Format == nil || bare.DType != "" || bare.Shape != nil || bare.StepBytes != 0 {
		t.Fatalf("a chunk without a Format got %+v, want the zero Format", bare.Format)
	}
	// The caller's Format is theirs: changing it changes no stored chunk.
	mine.Shape[0], mine.DType = 9, "int8"
	if a.Shape[0] != 2 || a.DType != "float32" {
		t.Fatalf("stored chunk's format followed the caller's: %s%v", a.DType, a.Shape)
	}
	// A Format lives while a chunk has it, and a later chunk of a format
	// whose chunks all went gets a fresh one.
	if err := s.Release(1); err != nil {
		t.Fatal(err)
	}
	if len(s.formats) != 3 {
		t.Fatalf("store holds %d formats, want 3 (chunk 2 still has float32[2])", len(s.formats))
	}
	if err := s.Release(2, 3, 4); err != nil {
		t.Fatal(err)
	}
	if len(s.formats) != 0 {
		t.Fatalf("store holds %d formats with no chunks", len(s.formats))
	}
	// Formats that differ only in StepBytes (a caller that knows it and one
	// that does not) are distinct Formats, and a column may mix them.
	putChunk(s, 5, 1, 8)
	s.Put(&Chunk{Key: 6, Format: &Format{DType: "float32", Shape: []int64{2}, StepBytes: 8}, Length: 1})
	if _, _, err := s.acquire([]Column{col("a", 5, 6)}, nil); err != nil {
		t.Fatalf("column of float32[2] chunks with and without StepBytes: %v", err)
	}
	// So are Formats that locate their chunks' steps at different places,
	// or delta-encoded ones; the store's copy keeps both.
	at9 := s.Put(&Chunk{Key: 7, Format: &Format{DType: "float32", Shape: []int64{2}, StepBytes: 8, DataAt: 9}, Length: 1})
	at9again := s.Put(&Chunk{Key: 8, Format: &Format{DType: "float32", Shape: []int64{2}, StepBytes: 8, DataAt: 9}, Length: 1})
	at10 := s.Put(&Chunk{Key: 9, Format: &Format{DType: "float32", Shape: []int64{2}, StepBytes: 8, DataAt: 10}, Length: 1})
	delta := s.Put(&Chunk{Key: 10, Format: &Format{DType: "float32", Shape: []int64{2}, StepBytes: 8, DataAt: 9, Delta: true}, Length: 1})
	if at9.Format != at9again.Format || at9.Format == at10.Format || at9.Format == delta.Format {
		t.Fatal("Formats that locate steps alike or not were shared or kept apart wrongly")
	}
	if at9.DataAt != 9 || at10.DataAt != 10 || !delta.Delta || at9.Delta {
		t.Fatalf("stored Formats %+v, %+v, %+v lost where their steps lie", *at9.Format, *at10.Format, *delta.Format)
	}
}

// TestChunkStoreFormatsPutInTurn: chunks put one after another, as a
// message's are, with one Format the caller changes between them, or
// whose last chunk went between them, get the store's Format of what the
// caller's says at each Put.
func TestChunkStoreFormatsPutInTurn(t *testing.T) {
	s := NewChunkStore()
	mine := &Format{DType: "float32", Shape: []int64{2}, StepBytes: 8}
	s.PutAll([]*Chunk{{Key: 1, Format: mine, Length: 1}, nil, {Key: 2, Format: mine, Length: 1}})
	mine.Shape[0], mine.StepBytes = 3, 12
	s.PutAll([]*Chunk{{Key: 3, Format: mine, Length: 1}})
	one, _ := s.Get(1)
	two, _ := s.Get(2)
	three, _ := s.Get(3)
	if one.Format != two.Format || one.Shape[0] != 2 || three.Format == one.Format || three.Shape[0] != 3 || three.StepBytes != 12 {
		t.Fatalf("formats %+v, %+v, %+v; want float32[2] twice, shared, then float32[3]", *one.Format, *two.Format, *three.Format)
	}
	if err := s.Release(3); err != nil {
		t.Fatal(err)
	}
	again := s.Put(&Chunk{Key: 4, Format: mine, Length: 1})
	if again.Shape[0] != 3 || len(s.formats) != 2 || len(s.owners) != 2 || s.owners[again.Format] == nil {
		t.Fatalf("a format put again after its last chunk went: %+v, %d formats, %d owners", *again.Format, len(s.formats), len(s.owners))
	}
	if err := s.Release(1, 2, 4); err != nil {
		t.Fatal(err)
	}
	if len(s.formats)+len(s.owners) != 0 || s.last != nil {
		t.Fatalf("an empty store holds %d formats, %d owners, last %v", len(s.formats), len(s.owners), s.last)
	}
}

func TestChunkStoreEpochWraps(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 4, 8)
	putChunk(s, 2, 4, 8)
	// Chunk 1 is marked in epoch 1, chunk 2 never: after the wrap neither
	// mark may read as the current epoch's.
	if _, _, err := s.acquire([]Column{col("a", 1)}, nil); err != nil {
		t.Fatal(err)
	}
	s.epoch = math.MaxUint32
	for range 3 {
		got, _, err := s.acquire([]Column{col("a", 1, 1), col("b", 2, 1)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Key != 1 || got[1].Key != 2 {
			t.Fatalf("acquire at epoch %d returned %v, want chunks 1, 2", s.epoch, got)
		}
	}
	if s.epoch != 3 || refs(s, 1) != 5 || refs(s, 2) != 4 {
		t.Fatalf("after three acquires across the wrap: epoch %d, refs %d and %d; want 3, 5 and 4", s.epoch, refs(s, 1), refs(s, 2))
	}
}

func TestChunkStoreBoundsReferences(t *testing.T) {
	s := NewChunkStore()
	putChunk(s, 1, 1, 8)
	putChunk(s, 2, 1, 8)
	sc, _ := s.lookupLocked(1)
	sc.refs = maxRefs - 1
	if _, _, err := s.acquire([]Column{col("a", 1)}, nil); err != nil {
		t.Fatalf("the last reference a chunk can take: %v", err)
	}
	_, _, err := s.acquire([]Column{col("a", 2), col("b", 1)}, nil)
	wantErr(t, err, []error{ErrInvalidItem}, "chunk 1", "references")
	err = s.Retain(2, 1)
	wantErr(t, err, []error{ErrInvalidArgument}, "chunk 1", "references")
	if refs(s, 1) != maxRefs || refs(s, 2) != 1 {
		t.Fatalf("refused calls took references: %d, %d", refs(s, 1), refs(s, 2))
	}
}

// The bookkeeping a chunk and an item cost is what the memory targets are
// made of: these sizes are size classes of Go's allocator, or fill slabs.
func TestHeaderSizes(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes are for 64-bit platforms")
	}
	if n := unsafe.Sizeof(storedChunk{}); n != 64 {
		t.Errorf("storedChunk is %d bytes, want 64", n)
	}
	if n := unsafe.Sizeof(entry{}); n != 96 {
		t.Errorf("entry is %d bytes, want 96", n)
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
