package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
)

// ProducerOption configures a Producer.
type ProducerOption interface {
	configureProducer(*producerOptions) error
}

type producerOption func(*producerOptions) error

func (f producerOption) configureProducer(o *producerOptions) error { return f(o) }

type producerOptions struct {
	prefix        string
	chunkLength   int
	compression   wire.Codec
	delta         bool
	history       int
	maxInFlight   int
	maxUnapplied  int
	batchItems    int
	batchBytes    int
	linger        time.Duration
	retryFor      time.Duration
	ackTimeout    time.Duration
	logger        *slog.Logger
	returnOnStore bool // Flush returns once stored, not once applied
	// shard, when shard.count > 0, makes every item key name the shard the
	// producer writes to (see newKey).
	shard keyShard
}

// keyShard is a shard's place among count: its keys are index modulo count.
type keyShard struct{ index, count uint64 }

func defaultProducerOptions() producerOptions {
	return producerOptions{
		prefix:       DefaultPrefix,
		chunkLength:  1,
		compression:  wire.Zstd,
		delta:        true,
		history:      128,
		maxInFlight:  256,
		maxUnapplied: 4096,
		batchItems:   64,
		batchBytes:   256 << 10,
		linger:       time.Millisecond,
		retryFor:     time.Minute,
		ackTimeout:   5 * time.Second,
		logger:       slog.Default(),
	}
}

func positive(name string, v int) error {
	if v < 1 {
		return fmt.Errorf("%w: %s must be >= 1, got %d", ErrInvalidOption, name, v)
	}
	return nil
}

// WithChunkLength sets how many steps of a column go into one chunk
// (default 1). Longer chunks compress better and cost fewer messages; a
// learner receives whole chunks, so they also cost bytes per sample, and an
// item is sent only once the chunks it needs are complete (or flushed).
func WithChunkLength(steps int) ProducerOption {
	return producerOption(func(o *producerOptions) error { o.chunkLength = steps; return positive("chunk length", steps) })
}

// WithCompression chooses the chunk compression (default zstd). A chunk
// it would not shrink by an eighth is stored uncompressed, and a column
// whose chunks keep not shrinking (random floats, encoded images) is
// spared the codec for up to 64 chunks at a time, trying it again after
// each such stretch.
func WithCompression(c wire.Codec) ProducerOption {
	return producerOption(func(o *producerOptions) error {
		switch c {
		case wire.Zstd, wire.S2, wire.Uncompressed:
			o.compression = c
			return nil
		}
		return fmt.Errorf("%w: unknown compression %v", ErrInvalidOption, c)
	})
}

// WithDelta turns delta encoding of integer columns on or off (default on):
// consecutive frames that differ little compress far better as differences.
func WithDelta(on bool) ProducerOption {
	return producerOption(func(o *producerOptions) error { o.delta = on; return nil })
}

// WithHistory sets how many recent steps items may reference (default 128).
// The service holds the chunks of that many steps per producer so that
// later items can share them.
func WithHistory(steps int) ProducerOption {
	return producerOption(func(o *producerOptions) error { o.history = steps; return positive("history", steps) })
}

// WithMaxInFlight bounds the messages published and not yet acknowledged by
// JetStream (default 256). Every message states this window, and the table
// service refuses one above its limits.max_producer_window (default 1024).
func WithMaxInFlight(messages int) ProducerOption {
	return producerOption(func(o *producerOptions) error {
		if messages > MaxProducerWindow {
			return fmt.Errorf("%w: max in flight %d exceeds %d", ErrInvalidOption, messages, MaxProducerWindow)
		}
		o.maxInFlight = messages
		return positive("max in flight", messages)
	})
}

// WithMaxUnapplied bounds the items published but not yet applied by the
// table service (default 4096). When a table's rate limiter holds inserts,
// the producer blocks here. While the service paces inserts so that
// learners keep their pace (service.WithSamplePriority), it may set a
// smaller bound.
func WithMaxUnapplied(items int) ProducerOption {
	return producerOption(func(o *producerOptions) error { o.maxUnapplied = items; return positive("max unapplied", items) })
}

// WithBatch sets when a message is published: once it holds this many items
// or bytes (defaults 64 and 256 KiB), or when the linger time has passed.
func WithBatch(items, bytes int) ProducerOption {
	return producerOption(func(o *producerOptions) error {
		o.batchItems, o.batchBytes = items, bytes
		return errors.Join(positive("batch items", items), positive("batch bytes", bytes))
	})
}

// WithLinger sets how long a partly filled batch waits for more items
// (default 1ms); 0 publishes every item at once.
func WithLinger(d time.Duration) ProducerOption {
	return producerOption(func(o *producerOptions) error {
		if d < 0 {
			return fmt.Errorf("%w: linger must be >= 0, got %v", ErrInvalidOption, d)
		}
		o.linger = d
		return nil
	})
}

// WithRetryFor sets how long a message whose publish failed (no responders,
// lost connection, missing ack) is retried before its error is reported
// (default 1 minute; keep it below the stream's dedupe window).
func WithRetryFor(d time.Duration) ProducerOption {
	return producerOption(func(o *producerOptions) error {
		if d <= 0 {
			return fmt.Errorf("%w: retry time must be > 0, got %v", ErrInvalidOption, d)
		}
		o.retryFor = d
		return nil
	})
}

// Producer is an actor's writer: it appends steps, cuts them into chunks per
// column, and publishes items with the chunks they need to JetStream. A
// chunk is sent once however many items (in however many tables) reference
// it. Publishing is asynchronous within a bounded window; errors that
// surface later (a failed publish, a rejection by the table service) are
// returned by the next call. Safe for concurrent use, though an actor
// normally owns one producer.
type Producer struct {
	nc         *nats.Conn
	js         jetstream.JetStream
	subj       protocol.Subjects
	id         string
	notice     string // an inbox of the connection's: rejections arrive there
	o          producerOptions
	maxPayload int
	flow       *flow
	subs       []*nats.Subscription
	// Progress and rejections arrive on channels of their own, which the
	// connection fills in the order the service published: a rejection is
	// in rejections before the progress that covers it is in progress.
	progress   chan *nats.Msg
	rejections chan *nats.Msg
	rejectSub  *nats.Subscription
	// droppedRejections is how many rejections the connection dropped,
	// as far as readNotes reported them.
	droppedRejections int
	notesDone         chan struct{}
	connClosed        chan nats.Status // the connection's close, for readNotes
	// connLost is closed by readNotes once the connection is closed for
	// good: no room in the window and no ack can come any more, so a
	// Close under way stops waiting for them.
	connLost chan struct{}
	// selfClosed is closed once the producer closed itself, its
	// connection being closed (readNotes), and selfCloseErr is what that
	// Close returned: what it lost, for the user's Close to report.
	selfClosed   chan struct{}
	selfCloseErr error

	mu      sync.Mutex
	closing bool // Close has started: no new steps or items
	closed  bool // Close has sent everything
	episode uint64
	step    int64 // steps appended in this episode
	version int64 // policy version of the items created from now on
	cols    map[string]*column
	// colList holds cols in the order they came, which a loop over every
	// column takes: starting a loop over a map cost more than the loop.
	colList []*column
	// stepCols are the columns of the step Append is adding.
	stepCols []stepColumn
	pending  []*pendingItem // created, waiting for their chunks, in creation order
	// spareItem is the last item added to a batch, which nothing reads
	// any more, for CreateItem's next: one allocation fewer an item.
	spareItem *pendingItem
	batch     batch
	// lastMessage is the size of the last message sent: the next one's
	// buffer starts that large.
	lastMessage int
	// builder writes every batch in turn (nil before the first), and the
	// buffers of acknowledged messages come back through spare for it to
	// fill again: a producer in steady state allocates no message buffers.
	builder *wire.BatchBuilder
	spare   chan []byte
	scratch itemScratch // the wire item that build fills, reused
	// chunkData holds the data buffers of chunks copied into a batch, for
	// the next chunks sealed: at most spareChunks.
	chunkData [][]byte
	release   []uint64 // sent chunks that no item will reference again
	seq       uint64
	lastBatch uint64 // the latest message sent that is not a gap fill
	// settled is the last sequence whose message, and every one before it,
	// JetStream acknowledged or the producer gave up on. The ack loop
	// settles messages in order.
	settled atomic.Uint64
	linger  *time.Timer
	// lingering: a batch's linger time passed and onLinger waits for room
	// in the window; it publishes what is staged then, so no new timer
	// starts meanwhile.
	lingering bool
	// added is closed when a call finishes adding an item to the batch;
	// made only when someone waits (EndEpisode, for an item another call
	// adds).
	added chan struct{}

	acks     chan *inFlight // the ack loop takes them in publish order; room for every place in the window
	abort    chan struct{}  // closed when Close gives up on retries
	ackDone  chan struct{}
	lifetime context.Context // cancelled by Close; bounds linger publishes
	cancel   context.CancelFunc
}

// column is one column's chunker and its recent chunks.
type column struct {
	name  string
	dtype string
	shape []int64
	open  []*wire.Tensor // steps not yet in a chunk
	// spare are Tensors of sealed steps, for the next: EncodeChunk copies
	// a chunk's steps, so theirs are free once it returns, and a new one
	// for every step was a producer's most frequent allocation.
	spare     []*wire.Tensor
	openStart int64
	chunks    []*sealedChunk // ascending by start, within the history window
	backoff   compressionBackoff
	// appended is one past the step this column last got. It is read only
	// while the column has open steps, which are of this episode.
	appended int64
}

// stepColumn is a column of a step being appended: nil for a new one.
type stepColumn struct {
	name   string
	tensor Tensor
	col    *column
}

// maxCompressionBackoff is the most chunks a column stores uncompressed
// before it tries its codec again: one zstd try in that many costs an
// incompressible column little, and a column whose data turn compressible
// is compressed again within that many chunks.
const maxCompressionBackoff = 64

// compressionBackoff spares a column the codec while its chunks stay
// uncompressed (see wire.ChunkOptions). Random floats and already-encoded
// images always do, and zstd costs a 400-byte chunk more than twice what
// storing it costs (a 400 kB one three times), only to keep the raw bytes.
// After each try that leaves a chunk uncompressed, the column skips twice
// as many chunks as after the previous one, up to maxCompressionBackoff; a
// chunk stored compressed ends the backoff.
type compressionBackoff struct {
	skip  int // chunks left to store without trying
	after int // chunks skipped after the latest try that left one uncompressed
}

// skipping reports whether the column's next chunk is stored without
// trying the codec, and counts it.
func (b *compressionBackoff) skipping() bool {
	if b.skip == 0 {
		return false
	}
	b.skip--
	return true
}

// record notes what a try of the codec gave: whether the chunk is stored
// compressed.
func (b *compressionBackoff) record(compressed bool) {
	if compressed {
		b.after, b.skip = 0, 0
		return
	}
	b.after = min(max(1, 2*b.after), maxCompressionBackoff)
	b.skip = b.after
}

type sealedChunk struct {
	chunk  *wire.Chunk // nil once sent
	key    uint64
	start  int64
	length int64
	sent   bool
}

type pendingItem struct {
	// adding is set while the item is being added to the batch, which may
	// wait for room without the lock: other callers stop at it.
	adding   bool
	table    string
	priority float64
	version  int64
	key      uint64
	refs     []resolvedRef
	// inline holds the refs of items of few columns, the usual kind,
	// saving an allocation per item.
	inline [2]resolvedRef
}

// itemScratch is the wire item build fills and the batch copies at once,
// with the columns and slices it points to.
type itemScratch struct {
	item    wire.Item
	columns []*wire.TrajectoryColumn
	column  []wire.TrajectoryColumn
	slices  []wire.ColumnSlice
	fresh   []*sealedChunk
}

// spareMessages bounds the acknowledged message buffers a producer keeps
// for its next batches: a few cover the steady state, in which one message
// is filled while others await their acks. spareChunks bounds the data
// buffers of sent chunks it keeps for the next chunks sealed: as many as
// one item of a few columns sends; buffers over maxSpareChunk are left to
// the garbage collector, so that a few huge chunks do not stay pinned.
const (
	spareMessages = 4
	spareChunks   = 8
	maxSpareChunk = 4 << 20
)

type resolvedRef struct {
	name     string
	col      *column
	from, to int64 // steps [from, to) of the episode
	squeeze  bool
}

type batch struct {
	msg    *wire.BatchBuilder // nil until an item is added
	tables []string           // of its items
}

func (b *batch) items() int {
	if b.msg == nil {
		return 0
	}
	return b.msg.Items()
}

func (b *batch) bytes() int {
	if b.msg == nil {
		return 0
	}
	return b.msg.Size()
}

type inFlight struct {
	msg *nats.Msg
	fut jetstream.PubAckFuture
	err error // why the first attempt failed at once, when it did
	// connErr is the connection's last error before the latest attempt:
	// only a permissions violation after it concerns that attempt.
	connErr   error
	items     int
	tables    []string  // the tables its items are for
	seq       uint64    // producer sequence
	published time.Time // first attempt; retries stop retryFor after it
	// fills is set on a gap fill (fillGap): the message given up on whose
	// place it took, or took from a gap fill given up on before it.
	fills uint64
	// unknown is set once an attempt was sent and no answer came from the
	// stream (outcomeUnknown): JetStream may have stored the message, and
	// no later attempt's failure says otherwise.
	unknown bool
}

// NewProducer connects a producer to a deployment through nc. If the table
// service has not created the stream yet, it waits for it until ctx ends: a
// producer only asks whether the stream exists, so an actor needs no right
// to create or change it.
func NewProducer(ctx context.Context, nc *nats.Conn, opts ...ProducerOption) (*Producer, error) {
	o := defaultProducerOptions()
	for _, opt := range opts {
		if err := opt.configureProducer(&o); err != nil {
			return nil, err
		}
	}
	subj, err := protocol.NewSubjects(o.prefix)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(o.maxInFlight*2),
		jetstream.WithPublishAsyncTimeout(o.ackTimeout))
	if err != nil {
		return nil, fmt.Errorf("broker: jetstream: %w", err)
	}
	if err := waitStream(ctx, nc, js, subj, o.logger); err != nil {
		return nil, err
	}
	p := &Producer{
		nc:         nc,
		js:         js,
		subj:       subj,
		id:         newProducerID(),
		o:          o,
		maxPayload: int(nc.MaxPayload()),
		flow:       newFlow(o.maxInFlight, o.maxUnapplied),
		episode:    rand.Uint64(),
		cols:       make(map[string]*column),
		acks:       make(chan *inFlight, o.maxInFlight+1),
		spare:      make(chan []byte, spareMessages),
		abort:      make(chan struct{}),
		ackDone:    make(chan struct{}),
		connLost:   make(chan struct{}),
	}
	p.lifetime, p.cancel = context.WithCancel(context.Background())
	started := false
	defer func() {
		if !started {
			p.cancel()
		}
	}()
	// A progress message only says how far the service got, and a later
	// one says it again: the connection may drop some when readNotes lags.
	// A rejection must not be dropped: the service sends one for each item,
	// chunk or message it refuses, so the channel is sized by the window
	// (items, a chunk beside each, and messages), and a drop is reported
	// (checkDroppedRejections).
	p.progress = make(chan *nats.Msg, 256)
	p.rejections = make(chan *nats.Msg, min(maxRejectionNotes, 2*o.maxUnapplied+o.maxInFlight))
	p.notice = nc.NewInbox()
	// Before the subscriptions, so that a close after them is seen.
	p.connClosed = nc.StatusChanged(nats.CLOSED)
	for _, sc := range []struct {
		subject string
		ch      chan *nats.Msg
	}{{subj.Applied(), p.progress}, {p.notice, p.rejections}} {
		sub, err := nc.ChanSubscribe(sc.subject, sc.ch)
		if err != nil {
			for _, s := range p.subs {
				s.Unsubscribe()
			}
			nc.RemoveStatusListener(p.connClosed)
			return nil, fmt.Errorf("broker: subscribe %s: %w", sc.subject, err)
		}
		p.subs = append(p.subs, sub)
	}
	p.rejectSub = p.subs[1]
	p.notesDone = make(chan struct{})
	go p.readNotes()
	started = true
	go p.ackLoop()
	return p, nil
}

// ID is the producer's unique id. It is secret: with it, a client allowed to
// publish inserts could make JetStream drop this producer's messages as
// duplicates. Logs name a producer by its notice token (NoticeToken).
func (p *Producer) ID() string { return p.id }

// NoticeToken is the producer's public name: how the service's logs and
// rejections name it.
func (p *Producer) NoticeToken() string { return protocol.NoticeToken(p.id) }

// readNotes handles the service's progress and rejection messages until
// Close unsubscribes and stops it, or the connection is closed for good:
// then nothing can be published or acknowledged any more, and it closes
// the producer, whose goroutines would otherwise wait for acks and notices
// that cannot come (an actor that closes its connection without closing
// its producer, or loses it).
func (p *Producer) readNotes() {
	defer close(p.notesDone)
	closed := p.connClosed
	// Every rejection the connection received before a progress message
	// is in p.rejections by the time that message is read.
	takeRejections := func() {
		for {
			select {
			case m := <-p.rejections:
				p.onRejected(m)
			default:
				p.checkDroppedRejections()
				return
			}
		}
	}
	for {
		select {
		case m := <-p.rejections:
			p.onRejected(m)
		case m := <-p.progress:
			takeRejections()
			p.onApplied(m)
		case <-closed:
			if !p.nc.IsClosed() {
				closed = nil // Close removed the listener: the lifetime ends next
				continue
			}
			// What arrived before the close counts: no later progress
			// will say it again.
			for drained := false; !drained; {
				select {
				case m := <-p.progress:
					takeRejections()
					p.onApplied(m)
				default:
					takeRejections()
					drained = true
				}
			}
			close(p.connLost)
			p.mu.Lock()
			if p.closing {
				// The user's Close is under way: connLost ends its
				// waits, and it reports what was lost.
				p.mu.Unlock()
				return
			}
			mark := p.flow.failureMark()
			p.closing = true
			selfClosed := make(chan struct{})
			p.selfClosed = selfClosed
			p.mu.Unlock()
			// close waits for this goroutine to end, so it runs on its
			// own; connLost ends its other waits.
			go func() {
				defer close(selfClosed)
				p.selfCloseErr = p.close(context.Background(), mark)
			}()
			return
		case <-p.lifetime.Done():
			return
		}
	}
}

// maxRejectionNotes bounds the channel of a producer's rejections (8 bytes
// each) whatever its window; a window beyond it can lose rejections only
// when every item in it is rejected at once, and then says so.
var maxRejectionNotes = 1 << 16

// checkDroppedRejections reports rejections the connection dropped: which
// items they were for is unknown, so every later wait fails with them.
func (p *Producer) checkDroppedRejections() {
	n, err := p.rejectSub.Dropped()
	if err != nil || n <= p.droppedRejections {
		return
	}
	lost := n - p.droppedRejections
	p.droppedRejections = n
	p.flow.reject(fmt.Errorf("%w: %d of the service's rejections of this producer's items were dropped unread (its window holds more than %d); which items they were for is unknown", ErrRejected, lost, cap(p.rejections)))
}

func (p *Producer) onApplied(m *nats.Msg) {
	var prog wire.Progress
	if err := proto.Unmarshal(m.Data, &prog); err != nil {
		return // not ours to judge: someone else published there
	}
	var held map[string]uint64
	if len(prog.Held) > 0 {
		held = make(map[string]uint64, len(prog.Held))
		for _, h := range prog.Held {
			held[h.Table] = h.AppliedSequence
		}
	}
	p.flow.setApplied(prog.AppliedSequence, held, int(prog.MaxUnapplied))
}

func (p *Producer) onRejected(m *nats.Msg) {
	var r wire.Rejection
	if err := proto.Unmarshal(m.Data, &r); err != nil {
		return
	}
	what := "message"
	if r.ItemKey != 0 {
		what = fmt.Sprintf("item %d for table %q", r.ItemKey, r.Table)
	}
	p.flow.reject(fmt.Errorf("%w: %s of message %d: %w", ErrRejected, what, r.Sequence, &StatusError{Code: Code(r.Code), Message: r.Message}))
}

// Append adds one step to the current episode. Every column keeps the dtype
// and shape it first had; a mismatch is an error naming the column. Append
// copies the tensors' data and keeps neither them nor step: a caller may
// reuse both for its next step.
//
// An error means that nothing of the step is kept, so a caller may append
// it again. Append waits for room in the window (until ctx ends) only
// before it keeps the step, to publish items that earlier steps completed;
// the items this step completes are published as far as the window has
// room, the rest once the window moves (with no further call), and their
// errors (an item over the max payload) are returned by a later call.
func (p *Producer) Append(ctx context.Context, step Step) error {
	if len(step) == 0 {
		return fmt.Errorf("%w: empty step", ErrInvalidMessage)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return ErrClosed
	}
	// The step is checked after the wait, which may release the lock.
	if err := p.publishDueLocked(ctx); err != nil {
		return err
	}
	cols := p.stepCols[:0]
	defer func() { clear(cols); p.stepCols = cols[:0] }()
	for name, t := range step {
		if name == "" {
			return fmt.Errorf("%w: step has a column with an empty name", ErrInvalidMessage)
		}
		if err := t.Validate(); err != nil {
			return fmt.Errorf("column %q: %w", name, err)
		}
		c := p.cols[name]
		if c != nil && (c.dtype != t.DType || !slices.Equal(c.shape, t.Shape)) {
			return fmt.Errorf("%w: column %q: step %d has %s%v, earlier steps have %s%v",
				ErrSignature, name, p.step, t.DType, t.Shape, c.dtype, c.shape)
		}
		// What EncodeChunk would refuse once the chunk is full is refused
		// before any step of the column is kept: the column's dtype and
		// shape fix its steps' size.
		if n := len(t.Data); c == nil && n > 0 && p.o.chunkLength > wire.MaxChunkRawSize/n {
			return fmt.Errorf("%w: column %q: a chunk of %d steps of %d bytes exceeds the chunk limit of %d bytes: use shorter chunks",
				ErrInvalidMessage, name, p.o.chunkLength, n, wire.MaxChunkRawSize)
		}
		cols = append(cols, stepColumn{name, t, c})
	}
	for _, sc := range cols {
		c, t := sc.col, sc.tensor
		if c == nil {
			c = &column{name: sc.name, dtype: t.DType, shape: slices.Clone(t.Shape)}
			p.cols[sc.name] = c
			p.colList = append(p.colList, c)
		}
		c.appended = p.step + 1
		if len(c.open) == 0 {
			c.openStart = p.step
		}
		data := t.Data
		if len(c.open)+1 < p.o.chunkLength {
			// Kept past this call: the caller may reuse its buffer. A step
			// that completes its chunk is encoded (copied or compressed)
			// below, before Append returns.
			data = slices.Clone(data)
		}
		var st *wire.Tensor
		if n := len(c.spare); n > 0 {
			st, c.spare = c.spare[n-1], c.spare[:n-1]
		} else {
			st = new(wire.Tensor)
		}
		st.Dtype, st.Shape, st.Data = t.DType, c.shape, data
		c.open = append(c.open, st)
	}
	// The step is kept: what fails from here on is another call's to
	// report. Errors are joined as they come: a slice of them, passed on
	// to errors.Join, cost an allocation every step.
	var err error
	for _, c := range p.colList {
		// A chunk holds consecutive steps: a column missing from this step
		// ends its open chunk.
		if len(c.open) > 0 && (len(c.open) >= p.o.chunkLength || c.appended != p.step+1) {
			err = joinErr(err, p.sealLocked(c))
		}
	}
	p.step++
	p.trimLocked()
	if err = joinErr(err, p.advanceLocked(ctx, false, false)); err != nil {
		p.flow.report(err)
	}
	return nil
}

// joinErr is errors.Join(err, more) without allocating when more is nil.
func joinErr(err, more error) error {
	if more == nil {
		return err
	}
	return errors.Join(err, more)
}

// sealLocked turns a column's open steps into a chunk.
func (p *Producer) sealLocked(c *column) error {
	steps := c.open
	defer func() {
		for _, st := range steps {
			st.Data = nil // the caller's buffer, not to be kept alive
		}
		c.spare = append(c.spare, steps...)
		clear(steps)
		c.open = steps[:0]
	}()
	opts := wire.ChunkOptions{Codec: p.o.compression, Delta: p.o.delta, EpisodeID: p.episode, EpisodeStep: c.openStart, Buffer: p.takeChunkData(steps)}
	trying := opts.Codec != wire.Uncompressed
	if trying && c.backoff.skipping() {
		// Delta stays as asked, so that a column's chunks all say the same
		// of it and a reply of its items can describe them once (the
		// uniform layout of PackedSamples).
		opts.Codec, trying = wire.Uncompressed, false
	}
	ch, err := wire.EncodeChunk(rand.Uint64(), steps, opts)
	if err != nil {
		return fmt.Errorf("broker: column %q: sealing steps %d..%d: %w", c.name, c.openStart, c.openStart+int64(len(steps)), err)
	}
	if trying {
		c.backoff.record(ch.Compression != wire.Compression_COMPRESSION_NONE)
	}
	c.chunks = append(c.chunks, &sealedChunk{chunk: ch, key: ch.Key, start: c.openStart, length: int64(len(steps))})
	return nil
}

// takeChunkData takes the smallest spare buffer with room for the steps'
// bytes, if one is kept: columns differ in size (a frame and a reward), and
// a reward's chunk should not take the frame's buffer.
func (p *Producer) takeChunkData(steps []*wire.Tensor) []byte {
	n := 0
	for _, s := range steps {
		n += len(s.Data)
	}
	best := -1
	for i, buf := range p.chunkData {
		if cap(buf) >= n && (best < 0 || cap(buf) < cap(p.chunkData[best])) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	buf := p.chunkData[best]
	p.chunkData = slices.Delete(p.chunkData, best, best+1)
	return buf
}

// trimLocked forgets chunks that fell out of the history window, except
// those a pending item still needs.
func (p *Producer) trimLocked() {
	horizon := p.step - int64(p.o.history)
	for _, it := range p.pending {
		for _, r := range it.refs {
			horizon = min(horizon, r.from)
		}
	}
	for _, c := range p.colList {
		n := 0
		for n < len(c.chunks) && c.chunks[n].start+c.chunks[n].length <= horizon {
			if c.chunks[n].sent {
				p.release = append(p.release, c.chunks[n].key)
			}
			n++
		}
		c.chunks = c.chunks[n:]
	}
}

// CreateItem adds an item for table from the episode's recent steps. The
// item is published once the chunks it needs are complete: at once with
// chunk length 1, otherwise when they fill up or at Flush or EndEpisode.
//
// An error means that the item was not created, so a caller may create it
// again. CreateItem waits for room in the window (until ctx ends) only
// before it creates the item, to publish what earlier calls left. Before
// it creates the item it also returns the errors that earlier messages met
// since the producer's last call that reported them (ErrRejected,
// ErrNotStored, ErrOutcomeUnknown, an earlier item over the max payload):
// then it created nothing either. The item goes out as far as the window
// has room, the rest by the next call or once the window moves, and its
// own errors (an item over the max payload, a loss, a rejection) are
// returned by a later call.
func (p *Producer) CreateItem(ctx context.Context, table string, priority float64, traj Trajectory) error {
	if table == "" {
		return fmt.Errorf("%w: empty table name", ErrInvalidMessage)
	}
	if err := checkPriority(priority); err != nil {
		return fmt.Errorf("item for table %q: %w", table, err)
	}
	if len(traj) == 0 {
		return fmt.Errorf("%w: item for table %q has no columns", ErrInvalidMessage, table)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return ErrClosed
	}
	// The item is resolved after the wait, which may release the lock.
	if err := p.publishDueLocked(ctx); err != nil {
		return err
	}
	it := p.spareItem
	if it != nil {
		p.spareItem = nil
	} else {
		it = new(pendingItem)
	}
	*it = pendingItem{table: table, priority: priority, version: p.version, key: p.o.shard.newKey()}
	if len(traj) <= len(it.inline) {
		it.refs = it.inline[:len(traj)]
	} else {
		it.refs = make([]resolvedRef, len(traj))
	}
	for i, r := range traj {
		if err := r.validate(); err != nil {
			return err
		}
		c, ok := p.cols[r.Column]
		if !ok {
			return fmt.Errorf("%w: column %q was never appended", ErrHistory, r.Column)
		}
		to := p.step - int64(r.Skip)
		from := to - int64(r.Length)
		switch {
		case from < 0:
			return fmt.Errorf("%w: column %q: item wants steps %d..%d, the episode has %d steps", ErrHistory, r.Column, from, to, p.step)
		case from < p.step-int64(p.o.history):
			return fmt.Errorf("%w: column %q: item reaches %d steps back, beyond the producer's history of %d (WithHistory)", ErrHistory, r.Column, p.step-from, p.o.history)
		}
		if err := c.covers(from, to); err != nil {
			return err
		}
		it.refs[i] = resolvedRef{name: r.name(), col: c, from: from, to: to, squeeze: r.Squeeze}
	}
	if err := p.flow.takeErrors(); err != nil {
		return err
	}
	// The item is created: what fails from here on is another call's to
	// report.
	p.pending = append(p.pending, it)
	if err := p.advanceLocked(ctx, false, false); err != nil {
		p.flow.report(err)
	}
	return nil
}

// newKey draws an item key: any 64 bits, or for a shard's producer, any
// whose residue modulo the shard count is the shard's index, uniformly
// among them (a sharded service refuses the others).
func (s keyShard) newKey() uint64 {
	if s.count < 2 {
		return rand.Uint64()
	}
	for {
		k := rand.Uint64()
		// A draw in the top run of fewer than count values is drawn again:
		// every key of the class then has exactly count draws that give it,
		// and none overflows.
		if base := k - k%s.count; base <= math.MaxUint64-(s.count-1) {
			return base + s.index
		}
	}
}

// overlapping returns the sealed chunks that hold any of steps [from, to).
// Chunks are disjoint and ascending, so a binary search finds the first: an
// item reads a few chunks out of a history of hundreds.
func (c *column) overlapping(from, to int64) []*sealedChunk {
	lo, _ := slices.BinarySearchFunc(c.chunks, from, func(ch *sealedChunk, step int64) int {
		if ch.start+ch.length <= step {
			return -1
		}
		return 1
	})
	hi := lo
	for hi < len(c.chunks) && c.chunks[hi].start < to {
		hi++
	}
	return c.chunks[lo:hi]
}

// covers checks that every step in [from, to) has a cell in this column.
func (c *column) covers(from, to int64) error {
	next := from
	for _, ch := range c.overlapping(from, to) {
		if ch.start <= next && next < ch.start+ch.length {
			next = ch.start + ch.length
		}
	}
	if len(c.open) > 0 && c.openStart <= next && next < c.openStart+int64(len(c.open)) {
		next = c.openStart + int64(len(c.open))
	}
	if next < to {
		return fmt.Errorf("%w: column %q has no cell at step %d (wanted steps %d..%d)", ErrHistory, c.name, next, from, to)
	}
	return nil
}

// sealed reports whether steps [from, to) are all in sealed chunks.
func (c *column) sealed(to int64) bool {
	return len(c.open) == 0 || to <= c.openStart
}

// advanceLocked moves ready items (in creation order) into the batch and
// publishes when the batch is full, or everything when force is set. An item
// that cannot be sent for lack of room in the window stays queued. With wait
// it may release p.mu while it waits for room (see publishLocked); without,
// it never releases p.mu, and what needs room waits for it in onLinger
// (the staged batch, then the items behind it).
func (p *Producer) advanceLocked(ctx context.Context, force, wait bool) error {
	front := p.pending[:0]
	defer func() {
		// pending is taken from its front; once empty it starts again
		// where it started when this call began (the front of its array
		// when an earlier call emptied it), so that CreateItem's appends
		// reuse the array: left to creep along it, they allocated for
		// nearly every item. Another caller's appends, while
		// addToBatchLocked waited, may have moved pending to a new array;
		// front's is then no one's.
		if len(p.pending) == 0 {
			p.pending = front
		}
	}()
	var errs []error
	for len(p.pending) > 0 {
		it := p.pending[0]
		if it.adding || !it.ready() {
			break
		}
		it.adding = true
		err := p.addToBatchLocked(ctx, it, wait)
		it.adding = false
		if p.added != nil {
			close(p.added)
			p.added = nil
		}
		if err == errNoRoom {
			p.publishWhenRoomLocked()
			return errors.Join(errs...)
		}
		if endsWait(err) {
			return errors.Join(append(errs, err)...)
		}
		// Other callers stopped at it, so it is still first, and no one
		// else holds it.
		p.pending[0] = nil
		p.pending = p.pending[1:]
		p.spareItem = it
		if err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case force || p.batchFull() || p.o.linger == 0:
		switch {
		case p.batch.items() == 0 && !(force && len(p.release) > 0):
		case wait:
			errs = append(errs, p.publishLocked(ctx, false))
		case !p.sendIfRoomLocked():
			p.publishWhenRoomLocked()
		}
	case p.batch.items() > 0 && p.linger == nil && !p.lingering:
		p.linger = time.AfterFunc(p.o.linger, p.onLinger)
	}
	return errors.Join(errs...)
}

// publishDueLocked publishes what earlier calls left pending, or a staged
// batch that is due, waiting for room in the window: Append and CreateItem
// call it before they keep what they were given, so that one that fails
// kept nothing. The wait may release p.mu, and another call may append,
// end the episode or close meanwhile.
func (p *Producer) publishDueLocked(ctx context.Context) error {
	if len(p.pending) == 0 && (p.batch.items() == 0 || (p.o.linger > 0 && !p.batchFull())) {
		return nil
	}
	if err := p.advanceLocked(ctx, false, true); err != nil {
		return err
	}
	if p.closing {
		return ErrClosed
	}
	return nil
}

// batchFull reports whether the staged batch is due to be published.
func (p *Producer) batchFull() bool {
	return p.batch.items() >= p.o.batchItems || p.batch.bytes() >= p.o.batchBytes
}

// errNoRoom ends an advance that may not wait where the window has no room:
// the item stays pending.
var errNoRoom = errors.New("broker: no room in the window")

// sendIfRoomLocked sends the staged batch if the window has room now, and
// reports whether it did.
func (p *Producer) sendIfRoomLocked() bool {
	if ok, _ := p.flow.tryAcquire(p.batch.items()); !ok {
		return false
	}
	p.sendBatchLocked(false)
	return true
}

// publishWhenRoomLocked has onLinger publish the staged batch once the
// window has room, unless it will already: a call that may not wait left it.
// A linger timer armed for the batch's first item is put forward: the batch
// is due now, and would otherwise wait out its linger time after the window
// moved.
func (p *Producer) publishWhenRoomLocked() {
	if p.batch.items() == 0 || p.lingering {
		return
	}
	if p.linger != nil && !p.linger.Stop() {
		return // fired: onLinger is on its way
	}
	p.linger = time.AfterFunc(0, p.onLinger)
}

// ready reports whether every step the item needs is in a sealed chunk.
func (it *pendingItem) ready() bool {
	for _, r := range it.refs {
		if !r.col.sealed(r.to) {
			return false
		}
	}
	return true
}

// onLinger publishes a batch that waited long enough, then the ready items
// that a call which may not wait left pending behind it. It waits for room
// in the window without holding the producer's lock, so callers that
// honour their own contexts are never stuck behind it.
func (p *Producer) onLinger() {
	p.mu.Lock()
	p.linger = nil
	p.lingering = true
	defer func() {
		p.lingering = false
		p.mu.Unlock()
	}()
	for !p.closing {
		if p.batch.items() == 0 {
			// Items that an Append, which may not wait once it kept its
			// step, left behind the batch just sent: the actor may never
			// call again to publish them.
			if len(p.pending) == 0 || p.pending[0].adding || !p.pending[0].ready() {
				return
			}
			if err := p.advanceLocked(p.lifetime, false, false); err != nil {
				p.flow.report(err)
			}
			continue
		}
		ok, changed := p.flow.tryAcquire(p.batch.items())
		if ok {
			p.sendBatchLocked(false)
			continue
		}
		p.mu.Unlock()
		select {
		case <-changed:
		case <-p.lifetime.Done():
			p.mu.Lock()
			return
		}
		p.mu.Lock()
	}
}

// addToBatchLocked adds an item and the chunks it needs that were not sent
// yet. A message never exceeds the server's max payload: a batch that would
// is published first.
func (p *Producer) addToBatchLocked(ctx context.Context, it *pendingItem, wait bool) error {
	for {
		item, fresh := it.build(&p.scratch)
		if p.batch.msg == nil {
			p.batch.msg = p.nextBuilder()
		}
		before := p.batch.msg.Mark()
		size := p.batch.msg.Size()
		for _, ch := range fresh {
			p.batch.msg.AddChunk(ch.chunk)
		}
		p.batch.msg.AddItem(item)
		size = p.batch.msg.Size() - size
		// Leave room for the message's own fields and its release list.
		limit := p.maxPayload - 1024 - 10*len(p.release)
		if size > limit || p.batch.msg.Size() > limit {
			p.batch.msg.Undo(before)
			if size > limit {
				return fmt.Errorf("%w: item for table %q needs %d bytes, over the server's max payload of %d: use shorter chunks or raise max_payload",
					ErrInvalidMessage, it.table, size, p.maxPayload)
			}
			if !wait {
				if !p.sendIfRoomLocked() {
					return errNoRoom
				}
				continue
			}
			// Publishing may release the lock; build the item again after.
			if err := p.publishLocked(ctx, false); err != nil {
				return err
			}
			continue
		}
		for _, ch := range fresh {
			// The batch copied the chunk's bytes, so its buffer can take
			// the next chunk's.
			if len(p.chunkData) < spareChunks && 0 < cap(ch.chunk.Data) && cap(ch.chunk.Data) <= maxSpareChunk {
				p.chunkData = append(p.chunkData, ch.chunk.Data[:0])
			}
			ch.sent, ch.chunk = true, nil
		}
		if !slices.Contains(p.batch.tables, it.table) {
			p.batch.tables = append(p.batch.tables, it.table)
		}
		return nil
	}
}

// nextBuilder is the builder for a new batch, in a spare buffer if an
// acknowledged message left one.
func (p *Producer) nextBuilder() *wire.BatchBuilder {
	hint := p.lastMessage + p.lastMessage/8
	if p.builder == nil {
		p.builder = wire.NewBatchBuilder(p.id, hint)
		return p.builder
	}
	var buf []byte
	select {
	case buf = <-p.spare:
	default:
	}
	p.builder.Reset(buf, hint)
	return p.builder
}

// recycle keeps the buffer of a message that JetStream acknowledged, which
// neither this producer nor the connection reads again (the connection
// copied it when published), for a later batch.
func (p *Producer) recycle(rec *inFlight) {
	select {
	case p.spare <- rec.msg.Data[:0]:
	default:
	}
	rec.msg.Data = nil
}

// build fills s with the wire item, and lists the chunks it needs that were
// not sent yet. Both are valid until the next build.
func (it *pendingItem) build(s *itemScratch) (*wire.Item, []*sealedChunk) {
	s.fresh, s.columns, s.column, s.slices = s.fresh[:0], s.columns[:0], slices.Grow(s.column[:0], len(it.refs)), s.slices[:0]
	for _, r := range it.refs {
		s.column = s.column[:len(s.column)+1]
		tc := &s.column[len(s.column)-1]
		tc.Name, tc.Squeeze = r.name, r.squeeze
		first := len(s.slices)
		for _, ch := range r.col.overlapping(r.from, r.to) {
			lo, hi := max(ch.start, r.from), min(ch.start+ch.length, r.to)
			s.slices = append(s.slices, wire.ColumnSlice{ChunkKey: ch.key, Offset: int32(lo - ch.start), Length: int32(hi - lo)})
			if !ch.sent && !slices.Contains(s.fresh, ch) {
				s.fresh = append(s.fresh, ch)
			}
		}
		tc.Slices = tc.Slices[:0]
		for i := first; i < len(s.slices); i++ {
			tc.Slices = append(tc.Slices, &s.slices[i])
		}
		s.columns = append(s.columns, tc)
	}
	s.item.Key, s.item.Table, s.item.Priority, s.item.PolicyVersion, s.item.Columns = it.key, it.table, it.priority, it.version, s.columns
	return &s.item, s.fresh
}

// publishLocked waits for room in the window, then sends the batch and the
// release list as one message. It waits without holding p.mu, so that other
// callers, and Close, are not stuck behind a caller whose context allows a
// long wait; it sends the batch as it is once there is room (another caller
// may have sent it meanwhile). If the wait fails the batch stays.
func (p *Producer) publishLocked(ctx context.Context, end bool) error {
	for {
		if p.closed {
			return ErrClosed
		}
		if !end && p.batch.items() == 0 && len(p.release) == 0 {
			return nil
		}
		ok, changed := p.flow.tryAcquire(p.batch.items())
		if ok {
			p.sendBatchLocked(end)
			return nil
		}
		p.mu.Unlock()
		select {
		case <-changed:
			p.mu.Lock()
		case <-ctx.Done():
			p.mu.Lock()
			return p.flow.notApplied(ctx.Err())
		case <-p.connLost:
			p.mu.Lock()
			return p.flow.notApplied(fmt.Errorf("%w: its connection was closed: %w", ErrClosed, nats.ErrConnectionClosed))
		}
	}
}

// sendBatchLocked sends the batch; the caller holds a place in the window.
func (p *Producer) sendBatchLocked(end bool) {
	if p.linger != nil {
		p.linger.Stop()
		p.linger = nil
	}
	p.seq++
	p.lastBatch = p.seq
	b := p.batch
	if b.msg == nil {
		b.msg = p.nextBuilder()
	}
	n := b.msg.Items()
	// Releases that came while the batch waited for the window may not
	// all fit beside it: the rest go with the next message, since a chunk
	// is no less released later, while a message over the server's max
	// payload would lose its items.
	release := p.release
	switch room := max(0, (p.maxPayload-1024-b.msg.Size())/10); {
	case end:
		// The end mark releases every chunk the service holds for this
		// producer; naming them too could push the message over the max
		// payload after a long history.
		release, p.release = nil, nil
	case len(release) > room:
		release, p.release = release[:room], release[room:]
	default:
		p.release = nil
	}
	data := b.msg.Finish(p.seq, release, end, p.settled.Load()+1, uint32(p.o.maxInFlight), p.notice)
	p.lastMessage = len(data)
	p.batch = batch{}
	p.sendLocked(&inFlight{items: n, tables: b.tables}, data)
}

// sendLocked publishes data as message p.seq, which rec is the record of,
// and hands rec to the ack loop.
func (p *Producer) sendLocked(rec *inFlight, data []byte) {
	m := nats.NewMsg(p.subj.Insert())
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, p.id+"-"+strconv.FormatUint(p.seq, 10))
	rec.msg, rec.seq, rec.published = m, p.seq, time.Now()
	// A failed first attempt is left to the ack loop, which retries in
	// publish order.
	rec.connErr = p.nc.LastError()
	rec.fut, rec.err = p.js.PublishMsgAsync(m)
	p.acks <- rec
}

// fillGap sends a gap fill in the place of failed, a message given up on,
// when the service may hold later messages behind it: those sent before it
// failed state a window start at or below it, and the service applies them
// only once a message states a later one. The gap fill, a message of no
// items, states it at once rather than at the producer's next message,
// which may never come. It takes failed's place in the window, so that the
// window never looks empty before it is sent, and in p.acks, which has
// room for every place. stored is the latest message JetStream stored. It
// returns the gap fill, or nil when none is needed or none can be sent.
func (p *Producer) fillGap(failed *inFlight, stored uint64) *inFlight {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Needed while a message sent after failed may wait for it: one stored
	// after what failed stands in for (even with nothing sent since), or
	// one sent after failed that may yet be. For a gap fill, only a message
	// that is not one counts as sent after it: gap fills sent after one
	// another would keep each other going for as long as JetStream takes
	// nothing.
	from, later := failed.seq, p.seq
	if failed.fills != 0 {
		from, later = failed.fills, p.lastBatch
	}
	// Close closes p.acks once closed is set; nothing is stored once the
	// connection is closed for good.
	if p.closed || p.nc.IsClosed() || (stored <= from && later <= failed.seq) {
		return nil
	}
	p.seq++
	rec := &inFlight{fills: failed.seq}
	if failed.fills != 0 {
		rec.fills, rec.tables = failed.fills, failed.tables
	}
	// The staged batch stays: its items hold no place in the window. So do
	// the releases, which its items may still need.
	data := wire.NewBatchBuilder(p.id, 0).Finish(p.seq, nil, false, p.settled.Load()+1, uint32(p.o.maxInFlight), p.notice)
	p.sendLocked(rec, data)
	return rec
}

// ackLoop awaits JetStream's acks in publish order and retries failed
// publishes with the same dedupe id, so a retry after a reconnect or a lost
// ack never inserts twice.
func (p *Producer) ackLoop() {
	defer close(p.ackDone)
	var (
		stored uint64      // the latest message JetStream stored
		fills  []*inFlight // gap fills sent and not yet settled, in order
	)
	for rec := range p.acks {
		streamSeq, err := p.await(rec)
		// Settled before the window has room for the next message, which
		// states the window it was sent in.
		p.settled.Store(rec.seq)
		if rec.fills != 0 {
			fills = fills[1:]
		}
		if err == nil {
			stored = rec.seq
			// The service may hold rec until the gap fills after it apply:
			// a wait for them waits for rec's tables too.
			for _, f := range fills {
				if f.fills < rec.seq {
					for _, t := range rec.tables {
						if !slices.Contains(f.tables, t) {
							f.tables = append(f.tables, t)
						}
					}
				}
			}
			p.recycle(rec)
			if rec.fills != 0 {
				p.flow.ackGapFill(streamSeq, rec.tables)
			} else {
				p.flow.ack(streamSeq, rec.items, rec.tables)
			}
			continue
		}
		// A gap fill given up on is replaced only when it was retried for
		// retryFor: one refused at once would be refused again at once.
		var fill *inFlight
		if rec.fills == 0 || time.Since(rec.published) >= p.o.retryFor {
			fill = p.fillGap(rec, stored)
		}
		switch {
		case fill != nil:
			fills = append(fills, fill)
			if rec.fills == 0 {
				p.flow.replace(rec.items, err)
			}
		case rec.fills != 0:
			p.flow.dropGapFill()
		default:
			p.flow.fail(rec.items, err)
		}
	}
}

// await returns the stream sequence JetStream stored rec at, or why it was
// not stored.
func (p *Producer) await(rec *inFlight) (uint64, error) {
	deadline := rec.published.Add(p.o.retryFor)
	backoff := 50 * time.Millisecond
	lastErr := rec.err
	retried := false
	for {
		if rec.fut != nil {
			var ack *jetstream.PubAck
			// An answer in hand outranks the producer's closing: select
			// picks among ready cases at random, and gave up on messages
			// JetStream had acknowledged.
			select {
			case ack = <-rec.fut.Ok():
			case lastErr = <-rec.fut.Err():
			default:
				select {
				case ack = <-rec.fut.Ok():
				case lastErr = <-rec.fut.Err():
				case <-p.abort:
					return 0, fmt.Errorf("%w: message %d (%d items) not acknowledged before the producer closed: it may be stored and its items applied (%w)", ErrOutcomeUnknown, rec.seq, rec.items, ErrClosed)
				}
			}
			if ack != nil {
				if ack.Duplicate && !retried {
					// JetStream already held a message with this dedupe id,
					// and this producer never sent it: someone else did,
					// and this message was dropped in its place.
					p.o.logger.Error("reprise producer: JetStream took a message this producer never sent for its own; its dedupe id was forged or reused",
						"producer", protocol.NoticeToken(p.id), "sequence", rec.seq)
					return 0, fmt.Errorf("%w: %w: message %d (%d items): JetStream reports a duplicate of a message this producer never sent (a forged or reused dedupe id)", ErrRejected, ErrNotStored, rec.seq, rec.items)
				}
				return ack.Sequence, nil
			}
		}
		// The server answers a publish the user may not make with an error
		// on the connection, not on the ack, which then times out: so
		// would every resend, for the whole retry time. The connection
		// keeps its last error until the next: one from before this
		// attempt (permissions since widened) is not this attempt's.
		if err := p.nc.LastError(); err != rec.connErr && errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), "Publish to "+strconv.Quote(rec.msg.Subject)) {
			lastErr = err
		}
		if outcomeUnknown(lastErr) {
			rec.unknown = true
		}
		if !retryablePublishError(lastErr) || time.Now().After(deadline) {
			p.o.logger.Warn("reprise producer: publish failed", "producer", protocol.NoticeToken(p.id), "sequence", rec.seq, "items", rec.items, "error", lastErr)
			return 0, fmt.Errorf("%w: message %d (%d items)%s: %w", rec.givenUp(), rec.seq, rec.items, rec.mayBeStored(), lastErr)
		}
		select {
		case <-time.After(backoff):
		case <-p.abort:
			return 0, fmt.Errorf("%w: message %d (%d items)%s: the producer closed while retrying (%w): %w", rec.givenUp(), rec.seq, rec.items, rec.mayBeStored(), ErrClosed, lastErr)
		}
		backoff = min(2*backoff, time.Second)
		retried = true
		var err error
		rec.connErr = p.nc.LastError()
		if rec.fut, err = p.js.PublishMsgAsync(rec.msg); err != nil {
			lastErr = err
		}
	}
}

// outcomeUnknown reports whether an attempt that failed with err was sent
// and left no answer from the stream, which may have stored it: its ack
// timed out, or the connection was lost with the ack pending (nats.go
// fails every pending ack at a reconnect). Every other failure is an
// answer, or an attempt never sent: no stream responded, JetStream refused
// it (an API error), PublishMsgAsync failed at once, or the server refused
// the user the publish.
func outcomeUnknown(err error) bool {
	return errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, nats.ErrDisconnected)
}

// givenUp is the error of a message given up on: ErrOutcomeUnknown once
// an attempt went unanswered, else ErrNotStored.
func (rec *inFlight) givenUp() error {
	if rec.unknown {
		return ErrOutcomeUnknown
	}
	return ErrNotStored
}

// mayBeStored says what ErrOutcomeUnknown means, in its message.
func (rec *inFlight) mayBeStored() string {
	if rec.unknown {
		return ": an attempt went unanswered, so it may be stored and its items applied"
	}
	return ""
}

// retryablePublishError tells transient failures (a reconnect, a lost ack,
// a stream leader election) from permanent ones (a message over the
// server's limits). A nil error is the first attempt failing to start.
func retryablePublishError(err error) bool {
	if err == nil {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// 503: no stream leader yet; 429: the stream's ingest queue is
		// full for now.
		return apiErr.Code == 503 || apiErr.Code == 429
	}
	return !errors.Is(err, nats.ErrMaxPayload) && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubject) && !errors.Is(err, nats.ErrPermissionViolation)
}

// Flush completes every open chunk, publishes every item created so far and
// waits until the table service has applied them: on return they are in
// their tables (or were rejected, which it reports), so a sample or info
// sees them, as after Reverb's flush. Under a rate limiter that holds the
// items it waits until the limiter lets them in or ctx ends. With
// WithReturnOnStore it returns once JetStream has stored them, which makes
// them durable. It returns the errors seen since the last call, once what
// was not lost is applied.
func (p *Producer) Flush(ctx context.Context) error {
	return p.flush(ctx, p.flow.failureMark())
}

// flush is Flush, reporting the items lost and the rejections since mark.
func (p *Producer) flush(ctx context.Context, mark failureMark) error {
	var err error
	if p.o.returnOnStore {
		err = p.flushStored(ctx)
	} else {
		err = p.waitApplied(ctx)
	}
	return p.flow.withLost(err, mark)
}

// flushStored publishes everything and waits until JetStream stored it.
func (p *Producer) flushStored(ctx context.Context) error {
	err := p.publishAcked(ctx)
	return errors.Join(p.flow.takeErrors(), err)
}

// publishAcked publishes everything and waits for JetStream's acks, leaving
// the losses and rejections seen for the caller to take.
func (p *Producer) publishAcked(ctx context.Context) error {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return ErrClosed
	}
	err := p.sealOpenLocked()
	for {
		more := p.advanceLocked(ctx, true, true)
		err = joinErr(err, more)
		if endsWait(more) || len(p.pending) == 0 {
			break
		}
		// advanceLocked stopped at an item another call was adding, which
		// that call may give up on (its context ending while it waits for
		// room in the window) after this call went past it: the item
		// would then wait, unpublished, for a later call.
		if it := p.pending[0]; it.adding {
			if more = p.waitAddedLocked(ctx); more != nil {
				err = joinErr(err, more)
				break
			}
		} else if !it.ready() {
			break // created after this call sealed every chunk
		}
	}
	p.mu.Unlock()
	if endsWait(err) {
		return err
	}
	if err != nil {
		p.flow.report(err)
	}
	return p.flow.waitAcked(ctx)
}

// endsWait reports whether err, from publishing what is staged, ends the
// call: the wait for room in the window ended (ErrNotApplied) or the
// producer closed. Any other error is an item's own (one over the max
// payload), dropped while the rest went on: a call that waits reports it
// once the rest is waited for (flow.report), as Python's does, and an
// EndEpisode ends the episode past it.
func endsWait(err error) bool {
	return errors.Is(err, ErrNotApplied) || errors.Is(err, ErrClosed)
}

func (p *Producer) flushLocked(ctx context.Context) error {
	return errors.Join(p.sealOpenLocked(), p.advanceLocked(ctx, true, true))
}

// sealOpenLocked completes every open chunk.
func (p *Producer) sealOpenLocked() error {
	var errs []error
	for _, c := range p.colList {
		if len(c.open) > 0 {
			errs = append(errs, p.sealLocked(c))
		}
	}
	return errors.Join(errs...)
}

// WaitApplied waits until the table service has processed everything this
// producer published and JetStream stored: after it returns, the items are
// in their tables, or were rejected (which the call reports), or wait in the
// service behind an earlier message of this producer that the stream
// stored late (a resend after a reconnect). Under a rate limiter that holds
// the items it waits until the limiter lets them in or ctx ends. It is what
// Flush does unless WithReturnOnStore.
func (p *Producer) WaitApplied(ctx context.Context) error {
	mark := p.flow.failureMark()
	return p.flow.withLost(p.waitApplied(ctx), mark)
}

func (p *Producer) waitApplied(ctx context.Context) error {
	// Losses and rejections are reported once the rest is applied: on
	// return, whatever was not lost is in its tables (as in Python), or
	// the wait ended, and then they are reported with why.
	err := p.publishAcked(ctx)
	if err == nil {
		err = p.flow.waitApplied(ctx)
	}
	return errors.Join(p.flow.takeErrors(), err)
}

// SetPolicyVersion sets the version of the policy that produces the steps
// from now on: items created after it carry it, and a table with a
// staleness bound drops them once they are too many versions behind the
// table's current one (Client.SetPolicyVersion).
func (p *Producer) SetPolicyVersion(version int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.version = version
}

// EndEpisode publishes the episode's remaining items, waits for them as
// Flush does, and starts a new episode: later items can no longer
// reference its steps, and the service drops its hold on its chunks. An
// error that is ErrEpisodeNotEnded says the episode did not end
// (publishing its items failed: ctx ended while it waited for room in the
// window, or the producer closed): the actor must call EndEpisode again,
// with a context that allows the wait, before it appends the next
// episode's first step, which would otherwise continue this episode; that
// call reports the item over the max payload this one went past, if any. Any
// other error came after the episode ended, from the wait for its items,
// as Flush's would: an item over the max payload is dropped, as Flush
// drops it, and reported with them. Calling EndEpisode again after any
// error is safe: an episode with no steps has nothing to end, so the call
// publishes what is left and waits, and starts no episode (nor, on a
// ShardedProducer, moves to the next shard).
func (p *Producer) EndEpisode(ctx context.Context) error {
	_, err := p.endEpisode(ctx)
	return err
}

// endEpisode is EndEpisode, which also says whether it ended an episode:
// it does unless the episode has no steps or publishing its items failed,
// even when waiting for them fails.
func (p *Producer) endEpisode(ctx context.Context) (ended bool, err error) {
	mark := p.flow.failureMark()
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return false, ErrClosed
	}
	err = joinErr(p.sealOpenLocked(), p.advanceLocked(ctx, false, true))
	if !endsWait(err) {
		if err != nil {
			p.flow.report(err)
		}
		ended, err = p.publishEndLocked(ctx)
	}
	open := !ended && p.step > 0
	p.mu.Unlock()
	if open {
		// What this call went past (an item over the max payload) is left
		// for the call made again, as Python's end_episode leaves it.
		return false, fmt.Errorf("%w: %w", ErrEpisodeNotEnded, err)
	}
	if err != nil {
		// The episode ended (or had no steps) and its last message found
		// no room: the call ends as a Flush whose wait ended, with what it
		// went past and what it saw lost, not leaving them to the next
		// call.
		return ended, p.flow.withLost(errors.Join(p.flow.takeErrors(), err), mark)
	}
	// Everything is published: this only waits.
	return ended, p.flush(ctx, mark)
}

// publishEndLocked ends the episode, if it has steps, and publishes its
// last items with the release of its chunks, in one message where they
// fit: the service applies a message's items before its releases, and a
// message of its own for the releases would cost a stream write per
// episode.
func (p *Producer) publishEndLocked(ctx context.Context) (ended bool, err error) {
	// Items another call is still adding: publish them first. One that the
	// other call is adding, waiting for room in the window, builds its
	// columns from the episode's chunks when it gets the room, so the
	// episode must not end before.
	for {
		if len(p.pending) > 0 && !p.pending[0].adding {
			if err := p.advanceLocked(ctx, true, true); endsWait(err) {
				return false, err
			} else if err != nil {
				p.flow.report(err)
			}
		}
		if len(p.pending) == 0 || !p.pending[0].adding {
			break
		}
		if err := p.waitAddedLocked(ctx); err != nil {
			return false, err
		}
	}
	// An EndEpisode called again after one that ended the episode and
	// then failed its wait finds an episode of no steps: ending it would
	// move a ShardedProducer on a shard more.
	ended = p.step > 0
	if ended {
		p.endEpisodeLocked()
	}
	if p.batch.msg != nil && p.batch.msg.Size()+10*len(p.release)+1024 > p.maxPayload {
		release := p.release
		p.release = nil
		err := p.publishLocked(ctx, false)
		p.release = append(release, p.release...)
		if err != nil {
			return ended, err
		}
	}
	return ended, p.publishLocked(ctx, false)
}

// waitAddedLocked waits, without holding p.mu, until the call adding the
// first pending item is done with it: added it, or gave up (its context
// ended while it waited for room in the window), leaving it pending.
func (p *Producer) waitAddedLocked(ctx context.Context) error {
	if p.added == nil {
		p.added = make(chan struct{})
	}
	added := p.added
	p.mu.Unlock()
	select {
	case <-added:
		p.mu.Lock()
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		return p.flow.notApplied(ctx.Err())
	}
}

func (p *Producer) endEpisodeLocked() {
	for _, c := range p.colList {
		for _, ch := range c.chunks {
			if ch.sent {
				p.release = append(p.release, ch.key)
			}
		}
		c.chunks = nil
	}
	p.step = 0
	p.episode = rand.Uint64()
}

// Close publishes what is left, tells the service it may drop every chunk
// it holds for this producer, waits for the acks and stops. When ctx ends
// first, the messages still awaiting JetStream are given up on (reported
// with ErrOutcomeUnknown where an attempt went unanswered, else
// ErrNotStored), and items it could not publish for lack of room in the
// window are reported lost (ErrNotStored); so are they when the
// connection is closed for good while Close waits, which then returns
// ErrClosed.
func (p *Producer) Close(ctx context.Context) error {
	mark := p.flow.failureMark()
	p.mu.Lock()
	if p.closing {
		selfClosed := p.selfClosed
		p.mu.Unlock()
		if selfClosed == nil {
			return ErrClosed
		}
		// It closed itself with its connection: what it lost is reported
		// to the first Close of the user's.
		select {
		case <-selfClosed:
		case <-ctx.Done():
			return fmt.Errorf("broker: closing producer: %w", ctx.Err())
		}
		p.mu.Lock()
		err := p.selfCloseErr
		p.selfCloseErr = nil
		p.mu.Unlock()
		return errors.Join(fmt.Errorf("%w: its connection was closed", ErrClosed), err)
	}
	p.closing = true
	p.mu.Unlock()
	return p.close(ctx, mark)
}

// close is Close for whoever set closing: the user's Close, or readNotes
// when the connection closed first. It reports the items lost since mark.
func (p *Producer) close(ctx context.Context, mark failureMark) error {
	p.mu.Lock()
	var errs []error
	errs = append(errs, p.flushLocked(ctx))
	if len(p.pending) == 0 && p.batch.items() == 0 {
		p.endEpisodeLocked()
		errs = append(errs, p.publishLocked(ctx, true))
	}
	// Nothing is published once closed is set: the items still staged
	// are lost, and a caller that counts its losses by ErrNotStored (as
	// for a message given up) must see them.
	if lost := len(p.pending) + p.batch.items(); lost > 0 {
		p.flow.lose(lost, fmt.Errorf("%w: %d items never published: the producer closed first (%w)", ErrNotStored, lost, ErrClosed))
	}
	p.closed = true
	// Callers waiting for room in the window see closed and give up.
	p.flow.wake()
	if p.linger != nil {
		p.linger.Stop()
		p.linger = nil
	}
	close(p.acks)
	p.mu.Unlock()

	select {
	case <-p.ackDone:
	case <-p.connLost:
		close(p.abort)
		<-p.ackDone
	case <-ctx.Done():
		close(p.abort)
		<-p.ackDone
		errs = append(errs, fmt.Errorf("broker: closing producer: %w", ctx.Err()))
	}
	for _, s := range p.subs {
		errs = append(errs, s.Unsubscribe())
	}
	// The JetStream context's ack subscription and its connection
	// listener are this producer's: the connection outlives it.
	p.js.CleanupPublisher()
	p.nc.RemoveStatusListener(p.connClosed)
	p.cancel()
	<-p.notesDone
	p.flow.stop()
	errs = append(errs, p.flow.takeErrors())
	return p.flow.withLost(errors.Join(errs...), mark)
}
