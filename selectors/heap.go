package selectors

// priorityHeap serves MaxHeap and MinHeap: an indexed binary heap ordered by
// priority, then by sequence number, which Insert and Update take from a
// counter so that among equal priorities the least recently inserted or
// updated key is on top.
//
// The map gives each key a slot that stays put while its entry moves through
// the heap; sifting rewrites slot positions in a slice instead of the map.
type priorityHeap struct {
	max   bool
	heap  []heapEntry
	slots []heapSlot
	free  int         // first reusable slot, chained through pos, or none
	index map[Key]int // key -> slot
	seq   uint64
}

type heapEntry struct {
	priority float64
	seq      uint64
	slot     int
}

type heapSlot struct {
	key Key
	pos int // position in heap; for a free slot, the next free slot
}

// NewMaxHeap returns a selector that always picks the key of highest
// priority; among equals, the least recently inserted or updated.
func NewMaxHeap() Selector { return &priorityHeap{max: true, free: none, index: make(map[Key]int)} }

// NewMinHeap returns a selector that always picks the key of lowest priority;
// among equals, the least recently inserted or updated.
func NewMinHeap() Selector { return &priorityHeap{free: none, index: make(map[Key]int)} }

// above reports whether a belongs above b.
func (h *priorityHeap) above(a, b *heapEntry) bool {
	if a.priority != b.priority {
		return (a.priority > b.priority) == h.max
	}
	return a.seq < b.seq
}

// place puts e at position i and records where its slot now is.
func (h *priorityHeap) place(i int, e heapEntry) {
	h.heap[i] = e
	h.slots[e.slot].pos = i
}

// fix restores the heap order around position i, whose entry has changed.
func (h *priorityHeap) fix(i int) {
	e := h.heap[i]
	start := i
	for i > 0 {
		parent := (i - 1) / 2
		if !h.above(&e, &h.heap[parent]) {
			break
		}
		h.place(i, h.heap[parent])
		i = parent
	}
	if i == start {
		n := len(h.heap)
		for {
			child := 2*i + 1
			if child >= n {
				break
			}
			if right := child + 1; right < n && h.above(&h.heap[right], &h.heap[child]) {
				child = right
			}
			if !h.above(&h.heap[child], &e) {
				break
			}
			h.place(i, h.heap[child])
			i = child
		}
	}
	h.place(i, e)
}

func (h *priorityHeap) Insert(key Key, priority float64) error {
	if err := CheckPriority(priority); err != nil {
		return err
	}
	if _, ok := h.index[key]; ok {
		return errKeyExists(key)
	}
	s := h.free
	if s == none {
		s = len(h.slots)
		h.slots = append(h.slots, heapSlot{})
	} else {
		h.free = h.slots[s].pos
	}
	h.slots[s].key = key
	h.index[key] = s
	h.seq++
	h.heap = append(h.heap, heapEntry{priority: priority, seq: h.seq, slot: s})
	h.fix(len(h.heap) - 1)
	return nil
}

func (h *priorityHeap) Update(key Key, priority float64) error {
	if err := CheckPriority(priority); err != nil {
		return err
	}
	s, ok := h.index[key]
	if !ok {
		return errKeyNotFound(key)
	}
	i := h.slots[s].pos
	h.seq++
	h.heap[i].priority = priority
	h.heap[i].seq = h.seq
	h.fix(i)
	return nil
}

func (h *priorityHeap) Delete(key Key) error {
	s, ok := h.index[key]
	if !ok {
		return errKeyNotFound(key)
	}
	delete(h.index, key)
	i := h.slots[s].pos
	h.slots[s] = heapSlot{pos: h.free}
	h.free = s
	last := len(h.heap) - 1
	if i != last {
		h.heap[i] = h.heap[last]
	}
	h.heap = h.heap[:last]
	if i != last {
		h.fix(i)
	}
	return nil
}

func (h *priorityHeap) Sample() (Key, float64, error) {
	if len(h.heap) == 0 {
		return 0, 0, ErrEmpty
	}
	return h.slots[h.heap[0].slot].key, 1, nil
}

// Clear keeps the slices and the map's storage: a cleared table usually
// refills to the same size.
func (h *priorityHeap) Clear() {
	h.heap = h.heap[:0]
	h.slots = h.slots[:0]
	h.free = none
	clear(h.index)
}

func (h *priorityHeap) Len() int { return len(h.heap) }

func (h *priorityHeap) Options() Options {
	if h.max {
		return Options{Kind: KindMaxHeap}
	}
	return Options{Kind: KindMinHeap}
}

func (h *priorityHeap) Weight() (float64, int64) { return countWeight(len(h.heap)) }
