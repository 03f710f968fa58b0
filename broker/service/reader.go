package service

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The stream reader replaces nats.go's ordered consumer. That one retries
// the recreation of a lost consumer under the same consumer name forever:
// on a cluster, a create request that timed out while a node died can leave
// an assignment of that name placed on the dead node, every retry then
// updates that assignment instead of placing a new one, and the reader
// never returns (the stall README.md's "Running at scale" tells of). The
// reader below names every attempt afresh, bounds each one, and resumes
// from the next sequence it has not handed out.
const (
	// readerAttemptTimeout bounds one consumer creation. It is answered by
	// the node the consumer is placed on, in milliseconds, or never if the
	// cluster placed it on a node that just died and is not yet known to be
	// down; then a new attempt places a new consumer.
	readerAttemptTimeout = 2 * time.Second
	// readerHeartbeat is the server's idle heartbeat on a waiting pull; two
	// missed mean the consumer (or its node) is gone.
	readerHeartbeat = time.Second
	// readerInactive lets the server delete a consumer the service
	// abandoned and could not delete (its node was down).
	readerInactive = 2 * time.Minute
	// readerDeleteTimeout bounds the deletion of an abandoned consumer.
	readerDeleteTimeout = 5 * time.Second
	readerBackoffMin    = 100 * time.Millisecond
	readerBackoffMax    = 2 * time.Second
	// readerQuiet is how long the reader waits for a message before it
	// asks whether the next one is larger than its pulls (see fitNext).
	readerQuiet = 5 * time.Second
)

// streamReader reads a stream's messages in order, each once, from a
// sequence on, through a one-replica ephemeral consumer that it replaces
// when it fails. It is used by one goroutine at a time.
type streamReader struct {
	stream    jetstream.Stream
	filter    string
	pullBytes int
	log       *slog.Logger

	next uint64 // stream sequence of the next message to hand out
	// gap is told of messages the stream no longer held when they were to
	// be read (purged, or dropped by its limits); an error from it ends
	// the reading.
	gap       func(ctx context.Context, from, to uint64) error
	cons      jetstream.Consumer
	msgs      jetstream.MessagesContext
	delivered uint64 // consumer sequence of the last message read from cons

	// Deletions of abandoned consumers: they run beside the reader, which
	// waits for them in close.
	deletes sync.WaitGroup
}

func newStreamReader(stream jetstream.Stream, filter string, from uint64, pullBytes int, log *slog.Logger, gap func(ctx context.Context, from, to uint64) error) *streamReader {
	return &streamReader{stream: stream, filter: filter, next: max(from, 1), pullBytes: pullBytes, log: log, gap: gap}
}

// open creates a consumer from r.next, trying until one is created or ctx
// ends. Every attempt has a fresh name, so the cluster places each anew.
func (r *streamReader) open(ctx context.Context) error {
	backoff := readerBackoffMin
	for attempt := 1; ; attempt++ {
		start := time.Now()
		err := r.create(ctx)
		if err == nil {
			if attempt > 1 {
				r.log.Info("reprise service: reading the stream again", "from_sequence", r.next, "consumer", r.cons.CachedInfo().Name, "attempts", attempt)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if closed(err) {
			return err
		}
		r.log.Warn("reprise service: creating the stream's consumer", "attempt", attempt, "from_sequence", r.next, "took", time.Since(start).Round(time.Millisecond), "error", err)
		if !pause(ctx, backoff) {
			return ctx.Err()
		}
		backoff = min(2*backoff, readerBackoffMax)
	}
}

func (r *streamReader) create(ctx context.Context) error {
	name := "reprise_" + rand.Text()
	actx, cancel := context.WithTimeout(ctx, readerAttemptTimeout)
	defer cancel()
	cons, err := r.stream.CreateConsumer(actx, jetstream.ConsumerConfig{
		Name:              name,
		FilterSubject:     r.filter,
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       r.next,
		AckPolicy:         jetstream.AckNonePolicy,
		Replicas:          1,
		MemoryStorage:     true,
		InactiveThreshold: readerInactive,
	})
	if err != nil {
		// The request may have reached the cluster and left a consumer
		// behind.
		r.retire(name)
		return err
	}
	msgs, err := cons.Messages(jetstream.PullMaxBytes(r.pullBytes), jetstream.PullHeartbeat(readerHeartbeat))
	if err != nil {
		r.retire(name)
		return err
	}
	r.cons, r.msgs, r.delivered = cons, msgs, 0
	return nil
}

// retire deletes an abandoned consumer in the background; if its node is
// down the server deletes it once inactive.
func (r *streamReader) retire(name string) {
	r.deletes.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), readerDeleteTimeout)
		defer cancel()
		if err := r.stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			r.log.Debug("reprise service: deleting an abandoned consumer", "consumer", name, "error", err)
		}
	})
}

// drop abandons the current consumer.
func (r *streamReader) drop() {
	if r.msgs == nil {
		return
	}
	r.msgs.Stop()
	r.retire(r.cons.CachedInfo().Name)
	r.cons, r.msgs = nil, nil
}

// Next returns the next message, with its stream sequence and time. It
// returns only when ctx ends or the connection is closed; every other
// failure replaces the consumer.
func (r *streamReader) Next(ctx context.Context) (jetstream.Msg, *jetstream.MsgMetadata, error) {
	for {
		if r.msgs == nil {
			if err := r.open(ctx); err != nil {
				return nil, nil, err
			}
		}
		qctx, cancel := context.WithTimeout(ctx, readerQuiet)
		m, err := r.msgs.Next(jetstream.NextContext(qctx))
		quiet := qctx.Err() != nil
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			if quiet && errors.Is(err, context.DeadlineExceeded) {
				if r.fitNext(ctx) {
					r.drop()
				}
				continue
			}
			if closed(err) {
				return nil, nil, err
			}
			// A message larger than the pulls shows as missed heartbeats
			// too, on a loaded machine before the quiet time passes: the
			// replaced consumer would pull too little again. Yet the ask
			// waits up to readerAttemptTimeout on a stream that cannot
			// answer (no leader, in an election), which is when consumers
			// are lost, and each replacement waited it out before it
			// tried to create the next. So only a consumer that delivered
			// none of what it had at its creation asks: one stopped by a
			// large message after others, or published after it was
			// created, is replaced by one that has it first, which asks.
			if r.starved() {
				r.fitNext(ctx)
			}
			r.log.Warn("reprise service: reading the stream; replacing its consumer", "from_sequence", r.next, "error", err)
			r.drop()
			continue
		}
		meta, err := m.Metadata()
		if err != nil {
			r.log.Error("reprise service: a stream message without metadata; replacing the consumer", "subject", m.Subject(), "error", err)
			r.drop()
			continue
		}
		if meta.Sequence.Consumer != r.delivered+1 {
			// A message the consumer sent was lost: read again from the
			// first one not handed out.
			r.log.Warn("reprise service: a gap in the stream's delivery; replacing its consumer", "from_sequence", r.next, "expected", r.delivered+1, "got", meta.Sequence.Consumer)
			r.drop()
			continue
		}
		r.delivered = meta.Sequence.Consumer
		if meta.Sequence.Stream < r.next {
			continue // handed out already
		}
		if meta.Sequence.Stream > r.next && r.gap != nil {
			if err := r.gap(ctx, r.next, meta.Sequence.Stream-1); err != nil {
				return nil, nil, err
			}
		}
		r.next = meta.Sequence.Stream + 1
		return m, meta, nil
	}
}

// starved says whether the current consumer delivered none of the
// messages the stream held for it when it was created.
func (r *streamReader) starved() bool {
	return r.delivered == 0 && r.cons.CachedInfo().NumPending > 0
}

// fitNext raises the pull bytes to what the next message to read takes,
// where that is more, and says whether it did. The service raises them to
// its connection's max payload at start, but the stream keeps what a
// server of a larger one took (max_payload lowered across a restart,
// another node of a cluster): JetStream answers a pull of fewer bytes
// than its next message "Message Size Exceeds MaxBytes", which nats.go
// takes in silence and pulls again, and the reader waited for ever.
func (r *streamReader) fitNext(ctx context.Context) bool {
	gctx, cancel := context.WithTimeout(ctx, readerAttemptTimeout)
	defer cancel()
	m, err := r.stream.GetMsg(gctx, r.next, jetstream.WithGetMsgSubject(r.filter))
	if err != nil {
		return false // none yet, or the stream cannot say now
	}
	// As the server counts it: subject, reply subject, headers and data.
	size := len(m.Subject) + len(m.Data) + pullOverhead + 2*len(r.stream.CachedInfo().Config.Name) + len("NATS/1.0\r\n\r\n")
	for k, vs := range m.Header {
		for _, v := range vs {
			size += len(k) + len(v) + len(": \r\n")
		}
	}
	if size <= r.pullBytes {
		return false
	}
	r.log.Warn("reprise service: the next stream message is larger than a pull takes (stored under a larger max_payload?): raising pull bytes", "sequence", m.Sequence, "bytes", size, "pull_bytes", r.pullBytes)
	r.pullBytes = size
	return true
}

// closed says whether err comes from the service's connection being
// closed, which no new consumer cures.
func closed(err error) bool {
	return errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, jetstream.ErrConnectionClosed)
}

// close abandons the consumer and waits for the deletions under way.
func (r *streamReader) close() {
	r.drop()
	r.deletes.Wait()
}
