package selectors

// queue serves Fifo and Lifo: a doubly linked list in insertion order whose
// nodes live in one slice, so that inserting does not allocate once the slice
// has grown to the working size. Freed nodes are chained through next and
// reused before the slice grows.
type queue struct {
	lifo  bool
	nodes []queueNode
	index map[Key]int // key -> position in nodes
	head  int         // oldest node, or none
	tail  int         // newest node, or none
	free  int         // first reusable node, or none
}

type queueNode struct {
	key        Key
	prev, next int
}

// none marks the end of a chain of node or slot indices.
const none = -1

// NewFifo returns a selector that always picks the least recently inserted
// key. Priorities are validated but otherwise ignored; updating a key does not
// move it.
func NewFifo() Selector { return newQueue(false) }

// NewLifo returns a selector that always picks the most recently inserted key.
// Priorities are validated but otherwise ignored; updating a key does not move
// it.
func NewLifo() Selector { return newQueue(true) }

func newQueue(lifo bool) *queue {
	return &queue{lifo: lifo, index: make(map[Key]int), head: none, tail: none, free: none}
}

func (q *queue) Insert(key Key, priority float64) error {
	if err := CheckPriority(priority); err != nil {
		return err
	}
	if _, ok := q.index[key]; ok {
		return errKeyExists(key)
	}
	n := queueNode{key: key, prev: q.tail, next: none}
	i := q.free
	if i == none {
		i = len(q.nodes)
		q.nodes = append(q.nodes, n)
	} else {
		q.free = q.nodes[i].next
		q.nodes[i] = n
	}
	if q.tail == none {
		q.head = i
	} else {
		q.nodes[q.tail].next = i
	}
	q.tail = i
	q.index[key] = i
	return nil
}

func (q *queue) Update(key Key, priority float64) error {
	if err := CheckPriority(priority); err != nil {
		return err
	}
	if _, ok := q.index[key]; !ok {
		return errKeyNotFound(key)
	}
	return nil
}

func (q *queue) Delete(key Key) error {
	i, ok := q.index[key]
	if !ok {
		return errKeyNotFound(key)
	}
	delete(q.index, key)
	n := q.nodes[i]
	if n.prev == none {
		q.head = n.next
	} else {
		q.nodes[n.prev].next = n.next
	}
	if n.next == none {
		q.tail = n.prev
	} else {
		q.nodes[n.next].prev = n.prev
	}
	q.nodes[i] = queueNode{next: q.free}
	q.free = i
	return nil
}

func (q *queue) Sample() (Key, float64, error) {
	if q.head == none {
		return 0, 0, ErrEmpty
	}
	if q.lifo {
		return q.nodes[q.tail].key, 1, nil
	}
	return q.nodes[q.head].key, 1, nil
}

// Clear keeps the node slice and the map's storage: a cleared table usually
// refills to the same size.
func (q *queue) Clear() {
	q.nodes = q.nodes[:0]
	clear(q.index)
	q.head, q.tail, q.free = none, none, none
}

func (q *queue) Len() int { return len(q.index) }

func (q *queue) Options() Options {
	if q.lifo {
		return Options{Kind: KindLifo}
	}
	return Options{Kind: KindFifo}
}

func (q *queue) Weight() (float64, int64) { return countWeight(len(q.index)) }
