package tables

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
)

// ChunkStore holds the chunks of one deployment, shared by all its tables.
// A chunk lives while anything holds a reference to it (the caller that Put
// it, a producer's keep-alive set, every item whose trajectory names it) and
// is dropped when the last reference is released. Beside its Data, a chunk
// costs the store 64 bytes, a pointer and 11 to 22 bytes of index: the
// chunks of one dtype and shape share one Format. It is safe for concurrent
// use.
type ChunkStore struct {
	mu     sync.Mutex
	chunks keyIndex[slotKeys] // by slot
	bytes  int64
	// epoch and scratch serve acquire, under mu: a chunk is distinct within
	// one item when its mark is not yet the current epoch, which dedupes
	// without allocating a set per item.
	epoch   uint32
	scratch []*storedChunk
	// slots numbers the stored chunks densely (Chunk.slot), so that a table
	// counts its references to each in a slice rather than a map; free
	// lists the numbers of dropped chunks, for reuse.
	slots []*storedChunk
	free  []int32
	// formats holds one Format per distinct format of the stored chunks,
	// by formatKey, with the number of chunks that have it; owners finds
	// it from the store's Format, so that dropping a chunk builds no key;
	// formatKey is the scratch buffer keys are built in.
	formats   map[string]*storedFormat
	owners    map[*Format]*storedFormat
	formatKey []byte
	// last is the Format interned last: a message's chunks share a few
	// formats, so most find theirs by comparing with it, without a key.
	last *storedFormat
}

// storedChunk is 64 bytes, the size class it is allocated in: with refs
// and mark of 64 bits it took 80.
type storedChunk struct {
	chunk Chunk // the store's copy: its slot and Format are this store's
	// refs counts the chunk's references. acquire (an item's) and Retain
	// refuse to take it past maxRefs; Put cannot refuse, but each of its
	// references is a caller's or a producer's hold, which cost far more
	// memory apiece than 2^31 of them would leave.
	refs int32
	mark uint32
}

type storedFormat struct {
	format Format
	key    string
	chunks int64
}

// maxRefs is the most references a chunk takes: acquire and Retain refuse
// more, which only an item count no memory holds could reach.
const maxRefs = math.MaxInt32

// NewChunkStore returns an empty store.
func NewChunkStore() *ChunkStore {
	s := &ChunkStore{formats: make(map[string]*storedFormat), owners: make(map[*Format]*storedFormat)}
	s.chunks = newKeyIndex(slotKeys{s})
	return s
}

// slotKeys reads the keys of a store's chunks by slot, for its index.
type slotKeys struct{ s *ChunkStore }

func (k slotKeys) keyOf(slot uint32) uint64 { return k.s.slots[slot].chunk.Key }

// lookupLocked finds the chunk with key.
func (s *ChunkStore) lookupLocked(key ChunkKey) (*storedChunk, bool) {
	slot, ok := s.chunks.find(key)
	if !ok {
		return nil, false
	}
	return s.slots[slot], true
}

// Put adds c and takes one reference to it for the caller. When a chunk with
// c's key is already present, Put takes a reference to that one and returns
// it instead: keys are unique per deployment, so the two are the same chunk
// (a producer may send it again after a reconnect). The store keeps a
// shallow copy of c, the chunk Put returns, sharing c's Data;
// nobody may modify a chunk once it is Put. The copy's Format is the
// store's own for c's (equal in every field, shared with the other chunks
// of that format). Put(nil) does nothing and returns nil.
func (s *ChunkStore) Put(c *Chunk) *Chunk {
	if c == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.putLocked(c)
}

// PutAll is Put of each of cs in turn, under one hold of the store's lock:
// a producer's message brings dozens of chunks.
func (s *ChunkStore) PutAll(cs []*Chunk) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		if c != nil {
			s.putLocked(c)
		}
	}
}

func (s *ChunkStore) putLocked(c *Chunk) *Chunk {
	if sc, ok := s.lookupLocked(c.Key); ok {
		sc.refs++
		return &sc.chunk
	}
	sc := &storedChunk{chunk: *c, refs: 1}
	sc.chunk.Format = s.internLocked(c.Format)
	if n := len(s.free); n > 0 {
		sc.chunk.slot, s.free = s.free[n-1], s.free[:n-1]
		s.slots[sc.chunk.slot] = sc
	} else {
		sc.chunk.slot = int32(len(s.slots))
		s.slots = append(s.slots, sc)
	}
	s.chunks.insert(uint32(sc.chunk.slot))
	s.bytes += int64(len(c.Data))
	return &sc.chunk
}

// Prefetch brings into the CPU's cache what Put and the lookups of chunks
// with these keys read first, and changes nothing: a caller about to put a
// message's chunks calls it once for all of them, so that their cache
// misses overlap rather than come one per chunk.
func (s *ChunkStore) Prefetch(keys []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.chunks.prefetch(keys)
}

// prefetchRelease reads what releasing cs reads first, and changes
// nothing: each chunk's place in slots and the index slot of its key.
func (s *ChunkStore) prefetchRelease(cs []*Chunk) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum uint64
	for _, c := range cs {
		if s.slots[c.slot] != nil {
			sum++
		}
		sum += s.chunks.touch(c.Key)
	}
	s.chunks.prefetched = sum
}

// Retain takes one more reference to each key (a key listed twice is
// retained twice). If any key is missing it takes none and returns an error
// wrapping ErrChunkMissing that names the first missing key.
func (s *ChunkStore) Retain(keys ...ChunkKey) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		sc, ok := s.lookupLocked(k)
		if !ok {
			return fmt.Errorf("%w: chunk %d", ErrChunkMissing, k)
		}
		// As if every key were this one: a bound that needs no counting.
		if int64(sc.refs)+int64(len(keys)) > maxRefs {
			return fmt.Errorf("%w: chunk %d already has %d references, the most it can take", ErrInvalidArgument, k, sc.refs)
		}
	}
	for _, k := range keys {
		sc, _ := s.lookupLocked(k)
		sc.refs++
	}
	return nil
}

// RetainItem takes one reference to each distinct chunk an item's
// trajectory names, for an item that waits before its table takes it, and
// returns their keys in order of first use and their total size. If a chunk
// is missing it takes none and returns an error wrapping ErrChunkMissing
// that names the first missing chunk's column and slice. Unlike Retain of
// the item's keys, it dedupes them in one pass (by the chunks' marks), and
// stops at the first missing chunk: an item of many slices costs the
// caller no more than its table's own check would.
func (s *ChunkStore) RetainItem(traj []Column) (keys []ChunkKey, bytes int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextEpochLocked()
	distinct := s.scratch[:0]
	defer func() {
		clear(distinct)
		s.scratch = distinct[:0]
	}()
	for ci := range traj {
		col := &traj[ci]
		for si, sl := range col.Slices {
			sc, ok := s.lookupLocked(sl.Chunk)
			if !ok {
				return nil, 0, fmt.Errorf("%w: chunk %d (column %q, slice %d)", ErrChunkMissing, sl.Chunk, col.Name, si)
			}
			if sc.mark == s.epoch {
				continue
			}
			sc.mark = s.epoch
			if sc.refs >= maxRefs {
				return nil, 0, fmt.Errorf("%w: chunk %d already has %d references, the most it can take", ErrInvalidArgument, sc.chunk.Key, sc.refs)
			}
			distinct = append(distinct, sc)
		}
	}
	keys = make([]ChunkKey, len(distinct))
	for i, sc := range distinct {
		sc.refs++
		keys[i] = sc.chunk.Key
		bytes += int64(len(sc.chunk.Data))
	}
	return keys, bytes, nil
}

// Release gives back one reference to each key (a key listed twice is
// released twice) and drops the chunks whose last reference goes. Keys the
// store does not hold are skipped and reported in an error wrapping
// ErrChunkMissing: releasing more than was taken is a bug of the caller's.
func (s *ChunkStore) Release(keys ...ChunkKey) error {
	var missing []ChunkKey
	s.mu.Lock()
	for _, k := range keys {
		sc, ok := s.lookupLocked(k)
		if !ok {
			missing = append(missing, k)
			continue
		}
		s.releaseLocked(sc, 1)
	}
	s.mu.Unlock()
	if missing != nil {
		return fmt.Errorf("%w: cannot release chunks %v: not held", ErrChunkMissing, missing)
	}
	return nil
}

// Get returns the chunk with the given key, if present. The chunk stays
// valid after it leaves the store (chunks are immutable), but only a
// reference keeps it in the store.
func (s *ChunkStore) Get(key ChunkKey) (*Chunk, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sc, ok := s.lookupLocked(key); ok {
		return &sc.chunk, true
	}
	return nil, false
}

// Len is the number of chunks held.
func (s *ChunkStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.chunks.len()
}

// Bytes is the total size of the chunks held (the sum of len(Data)).
func (s *ChunkStore) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

func (s *ChunkStore) releaseLocked(sc *storedChunk, n int32) {
	sc.refs -= n
	if sc.refs <= 0 {
		s.chunks.remove(sc.chunk.Key)
		s.bytes -= int64(len(sc.chunk.Data))
		s.slots[sc.chunk.slot] = nil
		s.free = append(s.free, sc.chunk.slot)
		s.dropFormatLocked(sc.chunk.Format)
	}
}

// internLocked returns the store's Format equal to f (the zero one for a
// nil f), making it from a copy of f if the store has none, and counts one
// more chunk of it.
func (s *ChunkStore) internLocked(f *Format) *Format {
	if f == nil {
		f = &Format{}
	}
	if sf := s.last; sf != nil && sf.format.equal(f) {
		sf.chunks++
		return &sf.format
	}
	s.formatKey = appendFormatKey(s.formatKey[:0], f)
	sf, ok := s.formats[string(s.formatKey)]
	if ok {
		sf.chunks++
	} else {
		sf = &storedFormat{format: Format{DType: f.DType, Shape: slices.Clone(f.Shape), StepBytes: f.StepBytes, DataAt: f.DataAt, Delta: f.Delta}, key: string(s.formatKey), chunks: 1}
		s.formats[sf.key] = sf
		s.owners[&sf.format] = sf
	}
	s.last = sf
	return &sf.format
}

// dropFormatLocked counts one chunk of the store's Format f fewer, and
// forgets f with its last chunk.
func (s *ChunkStore) dropFormatLocked(f *Format) {
	sf := s.owners[f]
	if sf.chunks--; sf.chunks > 0 {
		return
	}
	delete(s.formats, sf.key)
	delete(s.owners, f)
	if sf == s.last {
		s.last = nil
	}
}

// equal says whether f and g have the same fields, as their keys would.
func (f *Format) equal(g *Format) bool {
	return f.DType == g.DType && f.StepBytes == g.StepBytes && f.DataAt == g.DataAt && f.Delta == g.Delta && slices.Equal(f.Shape, g.Shape)
}

// appendFormatKey appends f's fields in a form that tells every two
// Formats apart: the dtype's length before it, then fixed-width numbers.
func appendFormatKey(b []byte, f *Format) []byte {
	b = binary.AppendUvarint(b, uint64(len(f.DType)))
	b = append(b, f.DType...)
	b = binary.LittleEndian.AppendUint64(b, uint64(f.StepBytes))
	b = binary.LittleEndian.AppendUint32(b, uint32(f.DataAt))
	if f.Delta {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	for _, d := range f.Shape {
		b = binary.LittleEndian.AppendUint64(b, uint64(d))
	}
	return b
}

// acquire checks an item's trajectory against the chunks it names and
// against sig (when not nil), then takes one reference to each distinct
// chunk and returns them in order of first use. On error it takes nothing.
// Checking under the store's lock means the chunks cannot go between the
// check and the reference.
func (s *ChunkStore) acquire(traj []Column, sig Signature) ([]*Chunk, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	distinct, decoded, err := s.collectLocked(traj, sig)
	var out []*Chunk
	for _, sc := range distinct {
		if err == nil && sc.refs >= maxRefs {
			err = fmt.Errorf("%w: chunk %d already has %d references, the most it can take", ErrInvalidItem, sc.chunk.Key, sc.refs)
		}
	}
	if err == nil {
		out = make([]*Chunk, len(distinct))
		for i, sc := range distinct {
			sc.refs++
			out[i] = &sc.chunk
		}
	}
	clear(distinct)
	s.scratch = distinct[:0]
	return out, decoded, err
}

// nextEpochLocked starts a new epoch of marks, in which no chunk is marked
// yet.
func (s *ChunkStore) nextEpochLocked() {
	if s.epoch++; s.epoch == 0 {
		// Marks of the epoch before the wrap would read as current.
		for _, sc := range s.slots {
			if sc != nil {
				sc.mark = 0
			}
		}
		s.epoch = 1
	}
}

// collectLocked does acquire's checks and gathers the distinct chunks and the
// bytes the item's steps decode to.
func (s *ChunkStore) collectLocked(traj []Column, sig Signature) (distinct []*storedChunk, decoded int64, err error) {
	s.nextEpochLocked()
	distinct = s.scratch[:0]
	for ci := range traj {
		col := &traj[ci]
		var first *Chunk
		var steps int64
		for si, sl := range col.Slices {
			sc, ok := s.lookupLocked(sl.Chunk)
			if !ok {
				return distinct, 0, fmt.Errorf("%w: chunk %d (column %q, slice %d)", ErrChunkMissing, sl.Chunk, col.Name, si)
			}
			c := &sc.chunk
			if sl.Offset < 0 || sl.Length < 1 || int64(sl.Offset)+int64(sl.Length) > int64(c.Length) {
				return distinct, 0, fmt.Errorf("%w: column %q slice %d: steps [%d, %d) are outside chunk %d of %d steps",
					ErrInvalidItem, col.Name, si, sl.Offset, int64(sl.Offset)+int64(sl.Length), c.Key, c.Length)
			}
			if first == nil {
				first = c
			} else if c.Format != first.Format && (c.DType != first.DType || !slices.Equal(c.Shape, first.Shape)) {
				return distinct, 0, fmt.Errorf("%w: column %q mixes chunks of %s%v (chunk %d) and %s%v (chunk %d)",
					ErrInvalidItem, col.Name, first.DType, first.Shape, first.Key, c.DType, c.Shape, c.Key)
			}
			steps += int64(sl.Length)
			// Slices are at most MaxInt32 steps of chunks whose step size the
			// broker bounds, and items have a bounded number of slices, so
			// this cannot overflow.
			decoded += int64(sl.Length) * c.StepBytes
			if sc.mark != s.epoch {
				sc.mark = s.epoch
				distinct = append(distinct, sc)
			}
		}
		if col.Squeeze && steps != 1 {
			return distinct, 0, fmt.Errorf("%w: column %q is squeezed but covers %d steps (want 1)", ErrInvalidItem, col.Name, steps)
		}
		if sig != nil {
			if err := sig[ci].match(col.Name, first, steps, col.Squeeze); err != nil {
				return distinct, 0, err
			}
		}
	}
	return distinct, decoded, nil
}

// releaseChunks gives back one reference to each chunk; the chunks are
// distinct and were acquired together.
// Each is in the store, since the caller holds a reference: its slot finds
// it without a lookup.
func (s *ChunkStore) releaseChunks(cs []*Chunk) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		s.releaseLocked(s.slots[c.slot], 1)
	}
}

// releaseHeld gives back a table's references to every chunk at once (a
// table that drops all its items): held[slot] references to the chunk in
// that slot.
func (s *ChunkStore) releaseHeld(held []int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for slot, n := range held {
		if n > 0 {
			s.releaseLocked(s.slots[slot], n)
		}
	}
}

// heldChunks lists the chunks a table references, by held as above.
func (s *ChunkStore) heldChunks(held []int32, out []*Chunk) []*Chunk {
	s.mu.Lock()
	defer s.mu.Unlock()
	for slot, n := range held {
		if n > 0 {
			out = append(out, &s.slots[slot].chunk)
		}
	}
	return out
}
