// Package tables is Reprise's replay engine: Tables of Items with a sampler,
// a remover, a size bound, a max-times-sampled bound and a rate limiter, over
// a reference-counted ChunkStore that all tables share.
//
// The package does no I/O. Chunk payloads are opaque bytes to it (the broker
// stores them encoded and compressed, exactly as they travel on the wire), so
// an item's data is stored once however many tables reference it and is sent
// to learners without being decoded.
package tables

import (
	"errors"
	"time"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

// Errors returned by tables. Match them with errors.Is.
var (
	ErrClosed          = errors.New("tables: table closed")
	ErrInvalidConfig   = errors.New("tables: invalid config")
	ErrInvalidItem     = errors.New("tables: invalid item")
	ErrChunkMissing    = errors.New("tables: chunk missing")
	ErrSignature       = errors.New("tables: signature mismatch")
	ErrInvalidArgument = errors.New("tables: invalid argument")
	ErrInvalidSnapshot = errors.New("tables: invalid snapshot")
	ErrInvalidPriority = selectors.ErrInvalidPriority
	// ErrTooLarge reports an item that decodes to more bytes than the
	// table's WithMaxItemBytes allows.
	ErrTooLarge = errors.New("tables: item too large")
	// ErrTooMany reports a sample request for more items than the bound
	// its caller gave AppendSamplesWithin allows at the table's largest
	// item.
	ErrTooMany = errors.New("tables: more samples than fit the caller's bound")
	// ErrBusy reports a Page or List that the table's removals made lose
	// its place too often: trying again may work.
	ErrBusy = errors.New("tables: table too busy to list")
)

// ChunkKey identifies a chunk in the ChunkStore.
type ChunkKey = uint64

// Format is what each step of a chunk holds: its element type and shape,
// and the bytes it decodes to. The store gives all the chunks of one format
// the same *Format (Put), so that a chunk's header costs one pointer for it
// however many chunks there are. Nobody may modify a Format a chunk points
// to.
type Format struct {
	// DType is the numpy name of the element type ("float32", "uint8", ...).
	DType string
	// Shape is the shape of one step (without the leading step axis).
	Shape []int64
	// StepBytes is the decoded size of one step: what a learner's copy of
	// each step an item selects costs. 0 when the caller does not know it.
	StepBytes int64
	// DataAt, when above 0, says that a chunk of this format holds its
	// steps as they are (not compressed) in Data, Length×StepBytes bytes
	// from DataAt on, delta-encoded if Delta is set: a reader takes them
	// without decoding the rest of Data. 0: read Data's header.
	DataAt int32
	Delta  bool
}

// Chunk is K consecutive steps of one column. The engine reads only the
// metadata; Data is stored and returned untouched.
type Chunk struct {
	Key ChunkKey
	// Format is shared among chunks (see Format); a nil Format is the zero
	// one.
	*Format
	// Length is the number of steps in the chunk.
	Length int32
	// slot is the store's number for the chunk while it holds it, set by
	// Put under the store's lock before any table can see the chunk.
	slot int32
	// Data is the encoded chunk as it travels on the wire.
	Data []byte
	// Episode is the id of the episode whose steps it holds (0: unknown).
	Episode uint64
}

// Slice selects Length consecutive steps of a chunk, starting at Offset.
type Slice struct {
	Chunk  ChunkKey `json:"chunk"`
	Offset int32    `json:"offset"`
	Length int32    `json:"length"`
}

// Column is one column of an item's trajectory: the steps it covers, in
// order, possibly spanning several chunks. Squeeze marks a single step whose
// leading axis the reader drops.
type Column struct {
	Name    string  `json:"name"`
	Slices  []Slice `json:"slices"`
	Squeeze bool    `json:"squeeze,omitempty"`
}

// Steps is the number of steps the column covers.
func (c Column) Steps() int64 {
	var n int64
	for _, s := range c.Slices {
		n += int64(s.Length)
	}
	return n
}

// Item is the metadata of one replay entry: a trajectory of chunk slices and
// the bookkeeping its table keeps. It holds no tensor data.
type Item struct {
	Key          uint64
	Priority     float64
	TimesSampled int32
	InsertedAt   time.Time
	Trajectory   []Column
	// PolicyVersion is the version of the policy that produced the item
	// (0 when nobody says): a table with MaxStaleness drops items too many
	// versions behind its current one (Table.SetPolicyVersion).
	PolicyVersion int64
}

// ItemView is an item as its table holds it: its trajectory is Layout
// over Chunks, as a Sample's is, where an Item's is built for it. Nobody
// may modify what it holds.
type ItemView struct {
	Key           uint64
	Priority      float64
	TimesSampled  int32
	InsertedAt    time.Time
	PolicyVersion int64
	Layout        Layout
	Chunks        []*Chunk
}

// Item is v with its trajectory built. It allocates: encoders read Layout
// and Chunks instead.
func (v *ItemView) Item() Item {
	return Item{Key: v.Key, Priority: v.Priority, TimesSampled: v.TimesSampled, InsertedAt: v.InsertedAt,
		Trajectory: v.Layout.Trajectory(v.Chunks), PolicyVersion: v.PolicyVersion}
}

// ColumnSpec is one column of a table signature. A shape entry of -1 matches
// any size on that axis.
type ColumnSpec struct {
	Name  string  `json:"name"`
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
}

// Signature, when set on a table, is the exact list of columns every item
// must have, in order.
type Signature []ColumnSpec

// Config describes a table. It is what Info reports and what a snapshot
// stores.
type Config struct {
	Name    string            `json:"name"`
	Sampler selectors.Options `json:"sampler"`
	Remover selectors.Options `json:"remover"`
	// MaxSize bounds the number of items; inserting beyond it evicts with
	// the remover.
	MaxSize int64 `json:"max_size"`
	// MaxTimesSampled removes an item on its last allowed sample; < 1 means
	// unlimited.
	MaxTimesSampled int32          `json:"max_times_sampled"`
	Limiter         limiter.Config `json:"rate_limiter"`
	Signature       Signature      `json:"signature,omitempty"`
	// MaxStaleness, when set, is how many policy versions an item may lag
	// the table's current version (SetPolicyVersion): an item whose
	// PolicyVersion is below current - MaxStaleness is stale. Stale items
	// are removed (counted in Counters.StaleEvictions, and as deletes by
	// the rate limiter) and stale inserts dropped. 0 keeps only items of
	// the current version (on-policy); nil bounds nothing.
	MaxStaleness *int64 `json:"max_staleness,omitempty"`
}

// SampleInfo describes one sampled item as it was at the moment of sampling.
type SampleInfo struct {
	Key          uint64
	Probability  float64
	TableSize    int64
	Priority     float64
	TimesSampled int32 // including this sample
	InsertedAt   time.Time
	RateLimited  bool // the sample had to wait for the rate limiter
}

// Sample is one sampled item with the chunks its trajectory references.
type Sample struct {
	Info SampleInfo
	// Layout is the item's trajectory with its chunks by their place in
	// Chunks; Trajectory gives it with their keys.
	Layout Layout
	Chunks []*Chunk
}

// Trajectory is the sampled item's trajectory, with chunk keys. It
// allocates: encoders read Layout and Chunks instead.
func (s *Sample) Trajectory() []Column { return s.Layout.Trajectory(s.Chunks) }

// Layout is an item's trajectory with each slice naming its chunk by its
// place in the item's list of distinct chunks rather than by key. This is
// how a table holds trajectories: the items of one shape (the same columns,
// offsets and lengths, whatever their chunks) share one Layout, so an item
// costs the table a pointer for it. Nobody may modify a Layout a table hands
// out.
type Layout []LayoutColumn

// LayoutColumn is one column of a Layout.
type LayoutColumn struct {
	Name    string
	Slices  []LayoutSlice
	Squeeze bool
}

// LayoutSlice is a Slice whose chunk is given by index.
type LayoutSlice struct {
	// Chunk is the index of the slice's chunk in the item's chunks.
	Chunk  int32
	Offset int32
	Length int32
}

// Trajectory is l with each slice's chunk given by its key in chunks,
// which must be the item's chunks l was made for.
func (l Layout) Trajectory(chunks []*Chunk) []Column {
	n := 0
	for i := range l {
		n += len(l[i].Slices)
	}
	out := make([]Column, len(l))
	all := make([]Slice, n)
	for i := range l {
		c := &l[i]
		sl := all[:len(c.Slices):len(c.Slices)]
		all = all[len(c.Slices):]
		for j, s := range c.Slices {
			sl[j] = Slice{Chunk: chunks[s.Chunk].Key, Offset: s.Offset, Length: s.Length}
		}
		out[i] = Column{Name: c.Name, Slices: sl, Squeeze: c.Squeeze}
	}
	return out
}

// PriorityUpdate sets the priority of one item.
type PriorityUpdate struct {
	Key      uint64
	Priority float64
}

// Mutation is one step of MutatePriorities: an update, or a delete when
// Delete is true.
type Mutation struct {
	Key      uint64
	Priority float64
	Delete   bool
}
