package tables

import (
	"encoding/binary"
	"fmt"
)

// layouts interns a table's item layouts: one per distinct shape, counted
// by the items that have it. A layout whose last item goes stays for the
// next item of its shape (a queue's items come and go one at a time), until
// the idle ones outnumber the others by idleLayouts; then they all go. So a
// client sending items of ever new shapes grows the set by no more than
// twice the items the table holds. It is used under the table's lock.
type layouts struct {
	byKey map[string]*layout
	idle  int // layouts of no item
	// key and chunkAt are scratch: the key being looked up, and the chunk
	// indices by key of an item with too many chunks to search.
	key     []byte
	chunkAt map[ChunkKey]int32
}

type layout struct {
	Layout
	key   string
	items int64
}

// searchedChunks is the most distinct chunks an item's slices are matched
// to by searching: past it, a map matches them, so that an item of
// thousands of slices over thousands of chunks costs linear time.
const searchedChunks = 32

// idleLayouts is how many more idle layouts than layouts in use a table
// keeps.
const idleLayouts = 16

func newLayouts() layouts { return layouts{byKey: make(map[string]*layout)} }

// intern returns the layout of traj, whose distinct chunks in order of
// first use are chunks (as acquire returns them), counting one more item of
// it.
func (ls *layouts) intern(traj []Column, chunks []*Chunk) *layout {
	if len(chunks) > searchedChunks {
		if ls.chunkAt == nil {
			ls.chunkAt = make(map[ChunkKey]int32, len(chunks))
		}
		for i, c := range chunks {
			ls.chunkAt[c.Key] = int32(i)
		}
		defer clear(ls.chunkAt)
	}
	ls.key = ls.appendKey(ls.key[:0], traj, chunks)
	if l, ok := ls.byKey[string(ls.key)]; ok {
		if l.items == 0 {
			ls.idle--
		}
		l.items++
		return l
	}
	built, err := NewLayout(traj, chunks)
	if err != nil {
		// acquire listed every chunk the slices name.
		panic(err)
	}
	l := &layout{Layout: built, key: string(ls.key), items: 1}
	ls.byKey[l.key] = l
	return l
}

// drop counts one item of l fewer. Sweeping the idle layouts when they are
// over half of all costs each drop a constant on average.
func (ls *layouts) drop(l *layout) {
	if l.items--; l.items > 0 {
		return
	}
	if ls.idle++; ls.idle <= len(ls.byKey)-ls.idle+idleLayouts {
		return
	}
	for k, l := range ls.byKey {
		if l.items == 0 {
			delete(ls.byKey, k)
		}
	}
	ls.idle = 0
}

func (ls *layouts) clear() {
	clear(ls.byKey)
	ls.idle = 0
}

// chunkIndex is the place of key in chunks; next is the number of chunks
// the item's slices used so far, so that a chunk used for the first time
// is found without a search.
func (ls *layouts) chunkIndex(chunks []*Chunk, key ChunkKey, next int32) int32 {
	if int(next) < len(chunks) && chunks[next].Key == key {
		return next
	}
	if ls.chunkAt != nil && len(chunks) > searchedChunks {
		return ls.chunkAt[key]
	}
	for i := range next {
		if chunks[i].Key == key {
			return i
		}
	}
	// acquire listed every chunk the slices name.
	panic("tables: a slice's chunk is not among the item's chunks")
}

// appendKey appends traj's layout in a form that tells every two layouts
// apart: lengths before names and lists, fixed-width numbers.
func (ls *layouts) appendKey(b []byte, traj []Column, chunks []*Chunk) []byte {
	next := int32(0)
	for i := range traj {
		c := &traj[i]
		b = binary.AppendUvarint(b, uint64(len(c.Name)))
		b = append(b, c.Name...)
		squeeze := byte(0)
		if c.Squeeze {
			squeeze = 1
		}
		b = append(b, squeeze)
		b = binary.AppendUvarint(b, uint64(len(c.Slices)))
		for _, s := range c.Slices {
			at := ls.chunkIndex(chunks, s.Chunk, next)
			if at == next {
				next++
			}
			b = binary.LittleEndian.AppendUint32(b, uint32(at))
			b = binary.LittleEndian.AppendUint32(b, uint32(s.Offset))
			b = binary.LittleEndian.AppendUint32(b, uint32(s.Length))
		}
	}
	return b
}

// NewLayout is traj's layout for an item whose distinct chunks are chunks,
// for those who build Samples themselves. Every slice's chunk must be among
// chunks, which may list others too.
func NewLayout(traj []Column, chunks []*Chunk) (Layout, error) {
	at := make(map[ChunkKey]int32, len(chunks))
	for i, c := range chunks {
		at[c.Key] = int32(i)
	}
	out := make(Layout, len(traj))
	for i, c := range traj {
		lc := LayoutColumn{Name: c.Name, Squeeze: c.Squeeze, Slices: make([]LayoutSlice, len(c.Slices))}
		for j, s := range c.Slices {
			k, ok := at[s.Chunk]
			if !ok {
				return nil, fmt.Errorf("%w: column %q slice %d: chunk %d is not among the item's chunks", ErrChunkMissing, c.Name, j, s.Chunk)
			}
			lc.Slices[j] = LayoutSlice{Chunk: k, Offset: s.Offset, Length: s.Length}
		}
		out[i] = lc
	}
	return out, nil
}
