package tables

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
)

// Table is one replay table: items chosen by a sampler, evicted by a remover
// beyond MaxSize, removed after MaxTimesSampled samples, and admitted by a
// rate limiter. It is safe for concurrent use. Calls that wait for the
// limiter (Insert, Sample, SampleFlexible) hold no lock while they wait.
//
// An item costs the table 96 bytes of bookkeeping, 11 to 22 bytes of index
// by key, a slice of its distinct chunk pointers and its place in the two
// selectors: about 135 bytes in all for a two-chunk item with Uniform and
// Fifo selectors (a Prioritized or heap selector keeps an index of its
// own). Its trajectory costs nothing more: the table keeps one Layout per
// shape of item, shared.
type Table struct {
	store *ChunkStore
	now   func() time.Time
	name  string
	sig   Signature
	done  chan struct{} // closed by Close

	mu      sync.Mutex
	cfg     Config
	lim     *limiter.Limiter
	sampler order
	remover order
	items   keyIndex[entryKeys]
	head    *entry // oldest item; items are linked in insertion order
	tail    *entry
	spare   *entry // removed entries for reuse, chained through next
	// slabs hold the entries, slabEntries apart in number (entry.ref);
	// fresh counts the entries of the last slab handed out.
	slabs [][]entry
	fresh int
	seq   uint64 // stamps inserts and priority updates (heap tie order)
	// held counts, by the store's chunk slot, the table's items that
	// reference each chunk; heldChunks and heldSize are the chunks with a
	// count and their bytes.
	held       []int32
	heldChunks int
	heldSize   int64
	// largestItem is the most bytes an item inserted since the last Reset
	// decodes to: a bound on what a sample of n items expands to.
	// It is written under mu and read without it: a service checks it before
	// every sample request, and taking the lock for it cost learners a wait
	// behind every insert in the lock's queue.
	largestItem atomic.Int64
	// largestParts is the most parts an item inserted since the last Reset
	// has (itemParts), read like largestItem: a reply spends a bounded number
	// of bytes on each part of each item it carries, beside the bytes its
	// steps decode to.
	largestParts atomic.Int64
	maxItemBytes int64
	counters     Counters
	closed       bool
	// version is the current policy version (SetPolicyVersion); versions
	// indexes the items' versions.
	version  int64
	versions versionIndex
	// episodes counts, per episode, the chunks of the table's items that
	// hold its steps (a chunk once per item referencing it).
	episodes map[uint64]int64
	layouts  layouts
	// picks is sampleManyLocked's scratch, and prefetched where it leaves
	// the reads that bring entries into cache (the compiler would drop
	// them otherwise).
	picks      []pick
	prefetched int64
	// victimChunks is prefetchVictims' scratch.
	victimChunks []*Chunk
}

// entry is one item's bookkeeping: 96 bytes, its fields ordered so that
// no padding comes between them.
type entry struct {
	key        uint64
	priority   float64
	insertedAt int64  // unix nanoseconds
	seq        uint64 // of its insert or latest priority update
	version    int64  // of the policy that produced it
	// layout and chunks are shared read-only with every Sample and Item
	// handed out, so they are replaced, never modified.
	layout *layout
	chunks []*Chunk // distinct, in order of first use
	// prev and next link the entries in insertion order, by link.
	prev, next uint32
	// pos is the entry's place in a uniform sampler's (0) and remover's (1)
	// array.
	pos          [2]int32
	timesSampled int32
	ref          uint32 // the entry's number in the table's slabs, for life
}

// link is how entries refer to e: its ref + 1, and 0 for no entry.
func link(e *entry) uint32 {
	if e == nil {
		return 0
	}
	return e.ref + 1
}

// linked is the entry a link refers to.
func (t *Table) linked(l uint32) *entry {
	if l == 0 {
		return nil
	}
	return t.entryAt(l - 1)
}

// entryKeys reads the keys of a table's entries by number, for its index.
type entryKeys struct{ t *Table }

func (k entryKeys) keyOf(ref uint32) uint64 { return k.t.entryAt(ref).key }

func (t *Table) entryAt(ref uint32) *entry {
	return &t.slabs[ref/uint32(slabEntries)][ref%uint32(slabEntries)]
}

// lookup finds the item with key.
func (t *Table) lookup(key uint64) (*entry, bool) {
	ref, ok := t.items.find(key)
	if !ok {
		return nil, false
	}
	return t.entryAt(ref), true
}

// Counters are a table's lifetime event counts. Reset does not clear them:
// metrics export them as counters, which only grow. The counts since the
// last Reset, which Reverb's info reports as its completed inserts and
// samples, are the limiter's, in Info.Limiter.
type Counters struct {
	// Inserts counts new items. Inserting a key already present updates
	// its priority and is not counted here.
	Inserts int64 `json:"inserts"`
	// Samples counts sampled items (a Sample of n counts n).
	Samples int64 `json:"samples"`
	// Deletes counts every removal: explicit deletes, evictions and items
	// that reached max_times_sampled.
	Deletes int64 `json:"deletes"`
	// Evictions counts items removed by the remover to respect max_size.
	Evictions int64 `json:"evictions"`
	// InsertWaits counts inserts the rate limiter held at least once
	// (whether they then got in or their context ended).
	InsertWaits int64 `json:"insert_waits"`
	// SampleWaits counts Sample and SampleFlexible calls the rate limiter
	// held at least once.
	SampleWaits int64 `json:"sample_waits"`
	// StaleEvictions counts items removed, or inserts dropped, because
	// their policy version fell below the table's staleness bound (also
	// counted in Deletes when the item was in the table).
	StaleEvictions int64 `json:"stale_evictions"`
	// UniqueSamples counts items sampled for the first time, and
	// DeletedEpisodes the episodes whose last item left the table (Reverb's
	// num_unique_samples and num_deleted_episodes).
	UniqueSamples   int64 `json:"unique_samples"`
	DeletedEpisodes int64 `json:"deleted_episodes"`
}

// Info describes a table at one moment.
type Info struct {
	// Config is the current config, including a limiter or
	// max_times_sampled changed by Reconfigure.
	Config   Config        `json:"config"`
	Size     int64         `json:"size"`
	Limiter  limiter.State `json:"limiter"`
	Counters Counters      `json:"counters"`
	// Chunks is the number of distinct chunks the items reference, and
	// BytesHeld their total size: a chunk shared by several items of this
	// table counts once (and once more in every other table using it).
	Chunks    int   `json:"chunks"`
	BytesHeld int64 `json:"bytes_held"`
	// LargestItemBytes is the most bytes an item inserted since the last
	// Reset decodes to (from its chunks' StepBytes).
	LargestItemBytes int64 `json:"largest_item_bytes"`
	// PolicyVersion is the table's current policy version, and
	// ItemVersions the lowest and highest of its items' (nil when empty).
	PolicyVersion int64     `json:"policy_version"`
	ItemVersions  *[2]int64 `json:"item_versions,omitempty"`
	// Episodes is the number of episodes the items hold steps of.
	Episodes int64 `json:"episodes"`
	// Weight is the total weight the sampler draws by (see Table.Weight).
	Weight Weight `json:"weight"`
}

// Weight is a sampler's total weight, Fraction × 2^Exponent with Fraction in
// [0.5, 1), or zero: a prioritized sampler's total can lie beyond float64's
// range (see selectors.Selector.Weight).
type Weight struct {
	Fraction float64 `json:"fraction"`
	Exponent int64   `json:"exponent"`
}

// Float64 is the weight as a float64: +Inf beyond its range, 0 below it.
func (w Weight) Float64() float64 {
	if w.Exponent > math.MaxInt32 {
		return math.Inf(1)
	}
	if w.Exponent < math.MinInt32 {
		return 0
	}
	return math.Ldexp(w.Fraction, int(w.Exponent))
}

// Option configures New and NewFromSnapshot.
type Option func(*options)

type options struct {
	rng          *rand.Rand
	now          func() time.Time
	maxItemBytes int64
}

// WithMaxItemBytes refuses items whose steps decode to more than n bytes
// (ErrTooLarge), as counted from their chunks' StepBytes; n < 1 means no
// limit.
func WithMaxItemBytes(n int64) Option { return func(o *options) { o.maxItemBytes = n } }

// WithRand drives the random selectors (Uniform, Prioritized) with rng
// instead of a randomly seeded source, so that tests can replay draws. The
// table uses rng only under its lock; nothing else may use it.
func WithRand(rng *rand.Rand) Option { return func(o *options) { o.rng = rng } }

// WithClock replaces time.Now as the source of insertion times.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// New returns an empty table described by cfg. Its items reference chunks of
// store, which must be the store the caller puts their chunks in.
func New(cfg Config, store *ChunkStore, opts ...Option) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, fmt.Errorf("%w: table %q: chunk store is nil", ErrInvalidConfig, cfg.Name)
	}
	o := options{now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if o.now == nil {
		o.now = time.Now
	}
	lim, err := limiter.New(cfg.Limiter)
	if err != nil {
		return nil, fmt.Errorf("%w: table %q: rate_limiter: %w", ErrInvalidConfig, cfg.Name, err)
	}
	cfg.Signature = cloneSignature(cfg.Signature)
	if cfg.MaxStaleness != nil {
		k := *cfg.MaxStaleness
		cfg.MaxStaleness = &k
	}
	t := &Table{
		store: store,
		now:   o.now,
		name:  cfg.Name,
		sig:   cfg.Signature,
		done:  make(chan struct{}),
		cfg:   cfg,
		lim:   lim,

		maxItemBytes: o.maxItemBytes,
		versions:     newVersionIndex(cfg.MaxStaleness != nil),
		episodes:     make(map[uint64]int64),
		layouts:      newLayouts(),
	}
	t.items = newKeyIndex(entryKeys{t})
	if t.sampler, err = t.orderFor(cfg.Sampler, 0, o.rng); err != nil {
		return nil, fmt.Errorf("%w: table %q: sampler: %w", ErrInvalidConfig, cfg.Name, err)
	}
	if t.remover, err = t.orderFor(cfg.Remover, 1, o.rng); err != nil {
		return nil, fmt.Errorf("%w: table %q: remover: %w", ErrInvalidConfig, cfg.Name, err)
	}
	return t, nil
}

// Name is the table's name.
func (t *Table) Name() string { return t.name }

// Weight is what the sampler draws by: the total weight of the items (the
// sum of priority^α for a prioritized sampler, the item count for every
// other) and their number. A client of a table spread over shards picks a
// shard in proportion to it.
func (t *Table) Weight() (Weight, int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.weightLocked(), int64(t.items.len())
}

func (t *Table) weightLocked() Weight {
	frac, exp := t.sampler.weight()
	return Weight{Fraction: frac, Exponent: exp}
}

// Size is the number of items.
func (t *Table) Size() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int64(t.items.len())
}

// Insert adds item once the rate limiter allows it, waiting (without holding
// the table) until then, until ctx ends (an error wrapping both
// limiter.ErrRateLimited and ctx.Err()) or until the table is closed
// (ErrClosed).
//
// The item is checked before any wait: its priority (ErrInvalidPriority if
// NaN, infinite or negative; any other is valid, however large), its
// trajectory (ErrInvalidItem), its chunks, which must be in the store
// (ErrChunkMissing), and the table's signature (ErrSignature). Insert then
// takes a reference to each chunk, so a waiting item's chunks stay put,
// and keeps it for as long as the table holds the item. The table
// keeps none of item.Trajectory, whose layout it shares with its items of
// the same shape.
// A zero InsertedAt is set to the table's clock; TimesSampled is ignored.
//
// As in Reverb, inserting a key the table already holds only sets that
// item's priority; the new trajectory is dropped, and the limiter neither
// counts nor holds it. Also as in Reverb, eviction follows the insert: the
// remover of a full table chooses among all items, the new one included, so
// a new item can be its own victim (a MinHeap remover picks it when its
// priority is the lowest). Insert then succeeds and the item is gone at once.
func (t *Table) Insert(ctx context.Context, item Item) error {
	waited := false
	for {
		ok, changed, err := t.TryInsert(item, waited)
		if ok || err != nil {
			return err
		}
		waited = true
		if err := t.wait(ctx, changed, "insert"); err != nil {
			return err
		}
	}
}

// CountHeldInsert counts an insert the rate limiter holds that the caller
// queued without trying it (behind others it holds), as TryInsert counts
// the ones it refuses.
func (t *Table) CountHeldInsert() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.counters.InsertWaits++
}

// Prefetch brings into the CPU's cache what inserting items with these
// keys reads first, and changes nothing: a caller about to insert a
// message's items calls it once for all of them, so that their cache
// misses overlap rather than come one per item.
func (t *Table) Prefetch(keys []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.items.prefetch(keys)
	t.prefetchVictims(len(keys))
}

// prefetchVictims reads, all at once, what evicting the items that n
// inserts will evict reads first, when the remover makes them known: a
// Fifo remover takes the oldest. Evicting them one by one missed the cache
// on each one's index slot, its chunks and the store's records of them, in
// turn: a third of the apply loop's time in bench/profile's 400 B inserts.
func (t *Table) prefetchVictims(n int) {
	evicted := int64(t.items.len()) + int64(n) - t.cfg.MaxSize
	if evicted <= 0 || t.remover.kind() != selectors.KindFifo {
		return
	}
	var sum uint64
	chunks := t.victimChunks[:0]
	for e := t.head; e != nil && evicted > 0; e, evicted = t.linked(e.next), evicted-1 {
		sum += t.items.touch(e.key)
		for _, c := range e.chunks {
			sum += uint64(t.held[c.slot])
			chunks = append(chunks, c)
		}
	}
	t.prefetched = int64(sum)
	t.store.prefetchRelease(chunks)
	clear(chunks)
	t.victimChunks = chunks[:0]
}

// TryInsert is Insert without the wait: when the rate limiter does not
// allow the insert now, it returns false and a channel closed at the
// limiter's next change, when trying again may succeed. Checks and
// eviction are as in Insert. retry says the caller was refused this item
// before, so that the table counts each held insert once (InsertWaits).
func (t *Table) TryInsert(item Item, retry bool) (inserted bool, changed <-chan struct{}, err error) {
	if err := selectors.CheckPriority(item.Priority); err != nil {
		return false, nil, fmt.Errorf("table %q: item %d: %w", t.name, item.Key, err)
	}
	if err := checkTrajectory(item.Trajectory, t.sig); err != nil {
		return false, nil, fmt.Errorf("table %q: item %d: %w", t.name, item.Key, err)
	}
	if !item.InsertedAt.IsZero() && !inRange(item.InsertedAt) {
		return false, nil, fmt.Errorf("%w: table %q: item %d: inserted_at %v is outside the years 1678-2262", ErrInvalidItem, t.name, item.Key, item.InsertedAt)
	}
	chunks, decoded, err := t.store.acquire(item.Trajectory, t.sig)
	if err != nil {
		return false, nil, fmt.Errorf("table %q: item %d: %w", t.name, item.Key, err)
	}
	if t.maxItemBytes > 0 && decoded > t.maxItemBytes {
		t.store.releaseChunks(chunks)
		return false, nil, fmt.Errorf("%w: table %q: item %d decodes to %d bytes, over the limit of %d", ErrTooLarge, t.name, item.Key, decoded, t.maxItemBytes)
	}
	at := item.InsertedAt
	if at.IsZero() {
		at = t.now()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		t.store.releaseChunks(chunks)
		return false, nil, fmt.Errorf("%w: table %q", ErrClosed, t.name)
	}
	if floor, ok := t.staleBefore(); ok && item.PolicyVersion < floor {
		// Stale on arrival: dropped as if evicted at once.
		t.counters.StaleEvictions++
		t.store.releaseChunks(chunks)
		return true, nil, nil
	}
	if e, ok := t.lookup(item.Key); ok {
		t.updateLocked(e, item.Priority)
		t.store.releaseChunks(chunks)
		return true, nil, nil
	}
	ok, changed := t.lim.TryInsert(1)
	if !ok {
		if !retry {
			t.counters.InsertWaits++
		}
		t.store.releaseChunks(chunks)
		if changed == nil {
			// The limiter refuses for good only when a counter would overflow.
			return false, nil, fmt.Errorf("%w: table %q: insert can never be allowed: limiter counters exhausted", limiter.ErrInvalidCount, t.name)
		}
		return false, changed, nil
	}
	t.raiseLargest(decoded, itemParts(item.Trajectory, chunks))
	t.insertLocked(item.Key, item.Priority, item.PolicyVersion, at.UnixNano(), t.layouts.intern(item.Trajectory, chunks), chunks)
	return true, nil, nil
}

// wait blocks until the limiter's state changes, ctx ends or the table is
// closed.
func (t *Table) wait(ctx context.Context, changed <-chan struct{}, op string) error {
	if changed == nil {
		// The limiter refuses for good only when a counter would overflow.
		return fmt.Errorf("%w: table %q: %s can never be allowed: limiter counters exhausted", limiter.ErrInvalidCount, t.name, op)
	}
	select {
	case <-changed:
		return nil
	case <-t.done:
		return fmt.Errorf("%w: table %q", ErrClosed, t.name)
	case <-ctx.Done():
		return fmt.Errorf("%w: table %q: %s: %w", limiter.ErrRateLimited, t.name, op, ctx.Err())
	}
}

func (t *Table) insertLocked(key uint64, priority float64, version, at int64, l *layout, chunks []*Chunk) {
	e := t.newEntry()
	t.seq++
	*e = entry{key: key, priority: priority, version: version, insertedAt: at, seq: t.seq, layout: l, chunks: chunks, prev: link(t.tail), ref: e.ref}
	t.versions.add(key, version)
	if t.versions.keys != nil {
		t.versions.compact(version, func(k uint64, v int64) bool {
			e, ok := t.lookup(k)
			return ok && e.version == v
		})
	}
	if t.tail == nil {
		t.head = e
	} else {
		t.tail.next = link(e)
	}
	t.tail = e
	t.items.insert(e.ref)
	t.sampler.insert(e)
	t.remover.insert(e)
	t.holdLocked(chunks)
	t.counters.Inserts++
	for int64(t.items.len()) > t.cfg.MaxSize {
		victim, _ := t.remover.pick()
		t.removeLocked(victim)
		t.counters.Evictions++
	}
}

func (t *Table) holdLocked(chunks []*Chunk) {
	for _, c := range chunks {
		t.episodes[c.Episode]++
		if n := int(c.slot) + 1; n > len(t.held) {
			t.held = slices.Grow(t.held, n-len(t.held))[:n]
		}
		if t.held[c.slot]++; t.held[c.slot] == 1 {
			t.heldChunks++
			t.heldSize += int64(len(c.Data))
		}
	}
}

// slabEntries is how many entries a slab holds: as many as fill 32 KiB, the
// largest size class, which a slab of more bytes than that would be rounded
// up from (256 entries of 120 bytes took 128 bytes an entry).
const slabEntries = 32 << 10 / int64(unsafe.Sizeof(entry{}))

// newEntry hands out entries from a slab, reusing removed ones first, so
// that inserting does not allocate per item. The entry's ref is set; the
// caller keeps it when filling in the rest.
func (t *Table) newEntry() *entry {
	if e := t.spare; e != nil {
		t.spare = t.linked(e.next)
		return e
	}
	if len(t.slabs) == 0 || t.fresh == len(t.slabs[len(t.slabs)-1]) {
		// A small table's slab holds max_size entries: a second, for the
		// one an insert holds beyond it before evicting, is rarely needed.
		t.slabs = append(t.slabs, make([]entry, min(slabEntries, t.cfg.MaxSize)))
		t.fresh = 0
	}
	e := &t.slabs[len(t.slabs)-1][t.fresh]
	e.ref = uint32(len(t.slabs)-1)*uint32(slabEntries) + uint32(t.fresh)
	t.fresh++
	return e
}

func (t *Table) updateLocked(e *entry, priority float64) {
	t.sampler.update(e, priority)
	t.remover.update(e, priority)
	e.priority = priority
	t.seq++
	e.seq = t.seq
}

// removeLocked drops e from the table, counts the removal in the limiter
// (which may let inserts through) and gives back its chunk references.
func (t *Table) removeLocked(e *entry) {
	t.sampler.delete(e)
	t.remover.delete(e)
	t.items.remove(e.key)
	if prev := t.linked(e.prev); prev == nil {
		t.head = t.linked(e.next)
	} else {
		prev.next = e.next
	}
	if next := t.linked(e.next); next == nil {
		t.tail = t.linked(e.prev)
	} else {
		next.prev = e.prev
	}
	t.lim.Delete(1)
	t.counters.Deletes++
	t.versions.remove(e.version)
	for _, c := range e.chunks {
		if t.episodes[c.Episode]--; t.episodes[c.Episode] <= 0 {
			delete(t.episodes, c.Episode)
			t.counters.DeletedEpisodes++
		}
		if t.held[c.slot]--; t.held[c.slot] == 0 {
			t.heldChunks--
			t.heldSize -= int64(len(c.Data))
		}
	}
	t.store.releaseChunks(e.chunks)
	t.layouts.drop(e.layout)
	*e = entry{next: link(t.spare), ref: e.ref}
	t.spare = e
}

// must stops on a selector of the selectors package (an order's keyed)
// refusing what the table's own bookkeeping makes valid, which no caller's
// input can cause. Every call passes a key that t.items says the selectors
// hold (Update, Delete) or do not (Insert), and a priority that
// selectors.CheckPriority accepted before anything changed: that check is
// the selectors' whole rule, so every selector accepts it, at any
// magnitude. An order picks only when it is not empty (every order, the
// table's own too): eviction runs while the table holds more than max_size
// >= 1 items, and the limiter allows a sample only while inserts - deletes,
// which is the table's size, is at least min_size >= 1. An error here means
// the selectors and the table are out of step, and carrying on would
// corrupt the table.
func must(err error) {
	if err != nil {
		panic(fmt.Sprintf("tables: selector out of step with its table: %v", err))
	}
}

// Sample returns n samples, each one allowed by the rate limiter, waiting
// (without holding the table) for those not yet allowed. An item may be
// returned more than once. An item that reaches max_times_sampled is returned
// and removed in the same step. If ctx ends or the table closes first, Sample
// returns the samples it took with an error (wrapping both
// limiter.ErrRateLimited and ctx.Err(), or ErrClosed): those items have been
// counted as sampled, and may have been removed, so the caller must use them.
//
// The returned layouts and chunk slices are shared with the table and
// other samples: read them, never modify them.
func (t *Table) Sample(ctx context.Context, n int) ([]Sample, error) {
	out, _, err := t.AppendSamples(ctx, nil, n, n)
	return out, err
}

// SampleFlexible waits until at least one sample is allowed, then returns as
// many as the rate limiter allows at that moment, up to n. It fails as
// Sample does, with no samples.
func (t *Table) SampleFlexible(ctx context.Context, n int) ([]Sample, error) {
	out, _, err := t.AppendSamples(ctx, nil, 1, n)
	return out, err
}

// State is a table's size and sampling weight at one moment.
type State struct {
	Size   int64
	Weight Weight
}

// AppendSamples takes as many samples as the rate limiter allows, up to
// most, and appends them to dst; while it has fewer than least, it waits
// and takes more (the samples taken stay taken, counted and, at
// max_times_sampled, removed). Sample is (nil, n, n) and SampleFlexible
// (nil, 1, n). A caller that
// samples again and again passes the slice it used last time, cleared, so
// that a batch of samples allocates nothing. It also returns the table's
// state once the last samples were taken, read under the same lock, so that
// a caller replying with both takes the table's lock once: under load every
// acquisition may wait behind the queue of inserts. It fails as Sample
// does, with the samples it appended.
func (t *Table) AppendSamples(ctx context.Context, dst []Sample, least, most int) ([]Sample, State, error) {
	return t.AppendSamplesWithin(ctx, dst, least, most, nil)
}

// AppendSamplesWithin is AppendSamples for a caller that can take at most
// so many items of the table's largest: before it takes samples, each time,
// it asks fits (when not nil) whether most items of the largest item's
// bytes and parts (LargestItemBytes, LargestItemParts) fit, and fails with
// ErrTooMany when they do not. It asks under the lock that inserts raise
// them under: a request that waited for the rate limiter is held to the
// items that came meanwhile, which may be larger than any it was measured
// against when it arrived. Samples taken before such a failure stay taken
// and are returned with it. A wait that ends as ctx is cancelled takes
// nothing more, even when an insert woke it at the same time; one woken
// as its deadline passed takes what the insert allows.
func (t *Table) AppendSamplesWithin(ctx context.Context, dst []Sample, least, most int, fits func(largestBytes, largestParts int64) bool) ([]Sample, State, error) {
	if least < 1 || most < least {
		return dst, State{}, fmt.Errorf("%w: table %q: sample counts must be 1 <= least <= most, got %d and %d", ErrInvalidArgument, t.name, least, most)
	}
	var state State
	out, base := dst, len(dst)
	sized, waited := false, false
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return out, state, fmt.Errorf("%w: table %q", ErrClosed, t.name)
		}
		if fits != nil && !fits(t.largestItem.Load(), t.largestParts.Load()) {
			t.mu.Unlock()
			return out, state, fmt.Errorf("%w: table %q: %d items", ErrTooMany, t.name, most)
		}
		if waited && errors.Is(ctx.Err(), context.Canceled) {
			// Woken by a change as ctx was cancelled (select picks
			// either): the caller stopped waiting, and a request withdrawn
			// by its learner must take nothing more (a queue would lose
			// it). A deadline that passed meanwhile is no such end: the
			// caller still listens, and Reverb samples on a signalled wait.
			// Asked only after a wait: the service's ctx makes its timer
			// when first asked, which a request let through at once
			// never is.
			t.mu.Unlock()
			return out, state, fmt.Errorf("%w: table %q: sample: %w", limiter.ErrRateLimited, t.name, ctx.Err())
		}
		if !sized {
			// Sized for the usual case (no more than the table holds) and
			// never by the request alone, which may be absurd.
			out = slices.Grow(out, min(most, max(1, t.items.len())))
			sized = true
		}
		var changed <-chan struct{}
		if t.cfg.MaxTimesSampled > 0 {
			for len(out)-base < most {
				var ok bool
				if ok, changed = t.lim.TrySample(1); !ok {
					break
				}
				out = append(out, t.sampleLocked(waited))
			}
		} else {
			out, changed = t.sampleManyLocked(out, base+most, waited)
		}
		state = State{Size: int64(t.items.len()), Weight: t.weightLocked()}
		if len(out)-base >= least {
			t.mu.Unlock()
			return out, state, nil
		}
		if !waited {
			waited = true
			t.counters.SampleWaits++
		}
		t.mu.Unlock()
		if err := t.wait(ctx, changed, "sample"); err != nil {
			return out, state, err
		}
	}
}

// sampleLocked takes one sample the limiter has allowed (and counted). The
// limiter's size bound keeps the table non-empty whenever it allows one.
func (t *Table) sampleLocked(waited bool) Sample {
	e, prob := t.sampler.pick()
	var s Sample
	t.takeLocked(&s, e, prob, int64(t.items.len()), waited)
	if m := t.cfg.MaxTimesSampled; m > 0 && e.timesSampled >= m {
		t.removeLocked(e)
	}
	return s
}

// sampleManyLocked appends samples to out, up to most in all, as far as
// the limiter allows, for a table whose samples remove nothing: then a
// sample changes nothing the next draw depends on, so every entry can be
// drawn before any is read. Drawing only finds an entry's address; reading
// them all at once lets the CPU overlap their cache misses, where
// sampleLocked takes them one after the other. Their chunks are left to the
// reply, which reads them after the lock: with many learners on one table
// the lock is what they wait on, and the chunks' misses were a quarter of
// the time it was held (BenchmarkSampleLocked).
// The draws, and what each sample says, are those of sampleLocked.
func (t *Table) sampleManyLocked(out []Sample, most int, waited bool) ([]Sample, <-chan struct{}) {
	allowed, changed := t.lim.TrySampleUpTo(most - len(out))
	picks := t.picks[:0]
	for range allowed {
		e, prob := t.sampler.pick()
		picks = append(picks, pick{e, prob})
	}
	var sum int64
	for _, p := range picks {
		sum += int64(p.e.timesSampled) + int64(len(p.e.chunks))
	}
	t.prefetched = sum
	size := int64(t.items.len())
	for _, p := range picks {
		// Written in place: a Sample is 120 bytes, and each copy of it
		// would be made under the lock.
		out = append(out, Sample{})
		t.takeLocked(&out[len(out)-1], p.e, p.prob, size, waited)
	}
	clear(picks)
	t.picks = picks[:0]
	return out, changed
}

// pick is an entry a sampler drew, and the probability it was drawn with.
type pick struct {
	e    *entry
	prob float64
}

// takeLocked counts a sample of e, from a table of size items, and
// describes it in s.
func (t *Table) takeLocked(s *Sample, e *entry, prob float64, size int64, waited bool) {
	if e.timesSampled == 0 {
		t.counters.UniqueSamples++
	}
	// Saturates rather than wraps: 2^31 samples of one item (hours of a
	// heap sampler that returns the same item) made it negative, and a
	// snapshot with a negative count does not restore.
	if e.timesSampled < math.MaxInt32 {
		e.timesSampled++
	}
	t.counters.Samples++
	*s = Sample{
		Info: SampleInfo{
			Key:          e.key,
			Probability:  prob,
			TableSize:    size,
			Priority:     e.priority,
			TimesSampled: e.timesSampled,
			InsertedAt:   time.Unix(0, e.insertedAt).UTC(),
			RateLimited:  waited,
		},
		Layout: e.layout.Layout,
		Chunks: e.chunks,
	}
}

// Mutate applies priority updates and deletes in the order given, so an
// update after a delete of the same key finds it missing. Keys the table
// does not hold are skipped and returned in missing (they were usually
// removed by the table in the meantime). All priorities are checked first:
// if one is invalid Mutate applies nothing and returns an error wrapping
// ErrInvalidPriority that names its key.
func (t *Table) Mutate(muts []Mutation) (missing []uint64, err error) {
	for i, m := range muts {
		if m.Delete {
			continue
		}
		if err := selectors.CheckPriority(m.Priority); err != nil {
			return nil, fmt.Errorf("table %q: mutation %d (key %d): %w", t.name, i, m.Key, err)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range muts {
		e, ok := t.lookup(m.Key)
		switch {
		case !ok:
			missing = append(missing, m.Key)
		case m.Delete:
			t.removeLocked(e)
		default:
			t.updateLocked(e, m.Priority)
		}
	}
	return missing, nil
}

// Delete removes the items with the given keys and returns the keys it did
// not find.
func (t *Table) Delete(keys ...uint64) (missing []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		if e, ok := t.lookup(k); ok {
			t.removeLocked(e)
		} else {
			missing = append(missing, k)
		}
	}
	return missing
}

// Reset removes every item, giving back their chunk references, and zeroes
// the limiter's counters and the policy version: a new run's actors start
// from version 0 again, and with a staleness bound they would otherwise
// have every insert dropped as stale. The table's Counters keep counting.
func (t *Table) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.store.releaseHeld(t.held)
	clear(t.held)
	t.heldChunks, t.heldSize = 0, 0
	t.items.clear()
	t.head, t.tail, t.spare, t.slabs, t.fresh = nil, nil, nil, nil, 0
	t.sampler.clear()
	t.remover.clear()
	t.lim.Reset()
	t.largestItem.Store(0)
	t.largestParts.Store(0)
	t.version = 0
	t.versions = newVersionIndex(t.cfg.MaxStaleness != nil)
	clear(t.episodes)
	t.layouts.clear()
}

// Reconfigure replaces the rate limiter's config and max_times_sampled while
// the table runs; the limiter keeps its counters, a new samples_per_insert
// weighs only the inserts to come (see limiter.Limiter.Reconfigure), and
// waiting inserts and samples re-check at once. An
// item already sampled as often as a lowered max_times_sampled allows stays
// until its next sample, which returns it and removes it.
func (t *Table) Reconfigure(lim limiter.Config, maxTimesSampled int32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := checkLimiter(lim, t.cfg.MaxSize); err != nil {
		return fmt.Errorf("%w: table %q: %w", ErrInvalidConfig, t.name, err)
	}
	if err := t.lim.Reconfigure(lim); err != nil {
		return fmt.Errorf("%w: table %q: rate_limiter: %w", ErrInvalidConfig, t.name, err)
	}
	t.cfg.Limiter = lim
	t.cfg.MaxTimesSampled = maxTimesSampled
	return nil
}

// Close makes waiting and later Insert, Sample and SampleFlexible calls
// return ErrClosed. The items stay, so that a final Snapshot sees them; Reset
// gives back their chunks. Close is idempotent.
func (t *Table) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.closed = true
		close(t.done)
	}
}

// Counters are the table's lifetime counts now: Info's, without the rest.
func (t *Table) Counters() Counters {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.counters
}

// Info describes the table now.
func (t *Table) Info() Info {
	t.mu.Lock()
	defer t.mu.Unlock()
	cfg := t.cfg
	cfg.Signature = cloneSignature(cfg.Signature)
	return Info{
		Config:    cfg,
		Size:      int64(t.items.len()),
		Limiter:   t.lim.State(),
		Counters:  t.counters,
		Chunks:    t.heldChunks,
		BytesHeld: t.heldSize,

		LargestItemBytes: t.largestItem.Load(),
		PolicyVersion:    t.version,
		ItemVersions:     versionSpan(t.versions.span()),
		Episodes:         int64(len(t.episodes)),
		Weight:           t.weightLocked(),
	}
}

// versionSpan is the versions of the items, or nil for an empty table.
func versionSpan(lo, hi int64, ok bool) *[2]int64 {
	if !ok {
		return nil
	}
	return &[2]int64{lo, hi}
}

// LargestItemBytes is the most bytes an item inserted since the last Reset
// decodes to: n samples decode to at most n times as much.
func (t *Table) LargestItemBytes() int64 {
	return t.largestItem.Load()
}

// LargestItemParts is the most parts an item inserted since the last
// Reset has: its columns, its slices, its distinct chunks and the bytes of
// its column names. A reply describes each item by these, at a bounded cost
// apiece, however few bytes its steps decode to.
func (t *Table) LargestItemParts() int64 {
	return t.largestParts.Load()
}

// raiseLargest records an item of n bytes and parts parts; called under
// mu, the only writer.
func (t *Table) raiseLargest(n, parts int64) {
	if n > t.largestItem.Load() {
		t.largestItem.Store(n)
	}
	if parts > t.largestParts.Load() {
		t.largestParts.Store(parts)
	}
}

// itemParts counts the parts of an item of traj over chunks, its distinct
// chunks (see LargestItemParts).
func itemParts(traj []Column, chunks []*Chunk) int64 {
	n := int64(len(traj) + len(chunks))
	for i := range traj {
		n += int64(len(traj[i].Slices) + len(traj[i].Name))
	}
	return n
}

// Get returns the items with the given keys, in the order asked, skipping
// keys the table does not hold.
func (t *Table) Get(keys ...uint64) []Item {
	var out []Item
	for _, v := range t.View(keys...) {
		out = append(out, v.Item())
	}
	return out
}

// View is Get with the items as the table holds them, which costs nothing
// per slice: an encoder of a reply of items of many slices reads these.
func (t *Table) View(keys ...uint64) []ItemView {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []ItemView
	for _, k := range keys {
		if e, ok := t.lookup(k); ok {
			out = append(out, e.view())
		}
	}
	return out
}

// List is Page with the items copied out.
func (t *Table) List(offset, limit int) ([]Item, error) {
	views, err := t.Page(offset, limit)
	if err != nil {
		return nil, err
	}
	var out []Item
	for _, v := range views {
		out = append(out, v.Item())
	}
	return out, nil
}

// pageStep is how many entries Page visits under one hold of the table's
// lock: some tens of microseconds. Walked in one hold, an offset of
// 900,000 of 1,000,000 items kept the table locked for about 9 ms, its
// inserts and samples waiting (BenchmarkPageFar).
const pageStep = 4096

// pageTries is how many walks Page starts before it gives up with ErrBusy,
// each after the last lost its place: the item it stood on removed while
// it let go of the lock.
const pageTries = 8

// pageYield runs between Page's steps, holding no lock. sync.Mutex lets
// the goroutine that unlocks take the lock straight back; yielding lets
// the inserts and samples it held back run first. Tests replace it to act
// at those moments.
var pageYield = runtime.Gosched

// Page returns up to limit items in insertion order, skipping the first
// offset. A negative offset counts as 0; a limit below 1 lists nothing.
//
// Page walks to offset from the end of the table nearer to it, and lets
// go of the table's lock every pageStep items, so that the table's inserts
// and samples do not wait for the whole walk. A table that changes
// meanwhile changes the page as it would between two calls: an item
// inserted or removed during the walk may or may not be in it, and its
// first item may be as many places from offset as items were removed.
// Still, no key is in it twice, and the items the table held all the
// while are in it in order, none left out between the first and the last
// of them. When the item Page stands on is removed while it let go, Page
// walks again; after pageTries walks it gives up with an error wrapping
// ErrBusy.
func (t *Table) Page(offset, limit int) ([]ItemView, error) {
	if limit < 1 {
		return nil, nil
	}
	offset = max(offset, 0)
	for range pageTries {
		if page, ok := t.page(offset, limit); ok {
			return page, nil
		}
	}
	return nil, fmt.Errorf("%w: table %q: items at offset %d were removed under the listing %d times: try again", ErrBusy, t.name, offset, pageTries)
}

// page is one walk of Page, false if it lost its place.
func (t *Table) page(offset, limit int) (page []ItemView, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.items.len()
	if offset >= n {
		return nil, true
	}
	// skip counts the entries to pass before the page's first, from the
	// head, or from the tail when back.
	e, skip, back := t.head, offset, false
	if n-1-offset < offset {
		e, skip, back = t.tail, n-1-offset, true
	}
	// seen holds the keys of the page taken in earlier steps: a key
	// removed and inserted again while the lock was let go is at the tail
	// again, and the page holds it already.
	var seen map[uint64]struct{}
	for step := 0; e != nil && len(page) < limit; step++ {
		if step == pageStep {
			at := placeOf(e)
			t.mu.Unlock()
			if len(page) > 0 {
				if seen == nil {
					seen = make(map[uint64]struct{}, len(page))
				}
				for _, v := range page[len(seen):] {
					seen[v.Key] = struct{}{}
				}
			}
			pageYield()
			t.mu.Lock()
			if e, ok = t.find(at); !ok {
				return nil, false
			}
			step = 0
		}
		switch {
		case skip > 0 && back:
			// The head before the count is done: items before e went
			// while the lock was let go, and where offset falls now is
			// not known.
			if e = t.linked(e.prev); e == nil {
				return nil, false
			}
			skip--
		case skip > 0:
			e = t.linked(e.next)
			skip--
		default:
			if _, dup := seen[e.key]; !dup {
				page = append(page, e.view())
			}
			e = t.linked(e.next)
		}
	}
	return page, true
}

// place is the entry a paused walk stands on, told from a later item in
// its slot by key and insert time (an item inserted again with its key
// and inserted_at into the slot it left is taken for it, and the walk
// goes on from where that one is).
type place struct {
	ref uint32
	key uint64
	at  int64
}

func placeOf(e *entry) place { return place{ref: e.ref, key: e.key, at: e.insertedAt} }

// find is the entry at p, if the table still holds it.
func (t *Table) find(p place) (*entry, bool) {
	ref, ok := t.items.find(p.key)
	if !ok || ref != p.ref {
		return nil, false
	}
	e := t.entryAt(ref)
	return e, e.insertedAt == p.at
}

func (e *entry) view() ItemView {
	return ItemView{
		Key:           e.key,
		Priority:      e.priority,
		TimesSampled:  e.timesSampled,
		InsertedAt:    time.Unix(0, e.insertedAt).UTC(),
		PolicyVersion: e.version,
		Layout:        e.layout.Layout,
		Chunks:        e.chunks,
	}
}

// inRange reports whether at survives the table's storage as unix
// nanoseconds.
func inRange(at time.Time) bool { return time.Unix(0, at.UnixNano()).Equal(at) }

func cloneSignature(s Signature) Signature {
	if s == nil {
		return nil
	}
	out := make(Signature, len(s))
	for i, c := range s {
		c.Shape = append([]int64(nil), c.Shape...)
		out[i] = c
	}
	return out
}
