package load

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// rawUnapplied is a Reprise producer's default window of unapplied items:
// how far each raw publisher may run ahead of the consumer.
const rawUnapplied = 4096

// RawPublishConsumed is RawPublish with what Reprise adds on the server's
// side and nothing of its own: one pull consumer, on a connection of its
// own like the table service's, receives every message the publishers
// store (no acks, a memory-held consumer, the service's 16 MiB pull
// window) and throws it away. Before each publish a publisher waits, as a
// producer's window makes it, while the consumer is more messages behind
// than the publishers' windows of rawUnapplied items hold together, or
// than a quarter of the stream's bytes (so that the stream never discards
// a message the consumer has yet to read). Reprise's inserts cannot outrun
// this on a machine whose cores the server, the consumer and the
// publishers share.
func RawPublishConsumed(ctx context.Context, cfg RawConfig) (Throughput, error) {
	if err := cfg.validate(true); err != nil {
		return Throughput{}, err
	}
	if err := ensureRawStream(ctx, cfg.URL); err != nil {
		return Throughput{}, err
	}
	nc, err := connect(cfg.URL, "raw consumer")
	if err != nil {
		return Throughput{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return Throughput{}, err
	}
	stream, err := js.Stream(ctx, RawStream)
	if err != nil {
		return Throughput{}, fmt.Errorf("load: raw consumer: %w", err)
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverNewPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		MemoryStorage:     true,
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return Throughput{}, fmt.Errorf("load: raw consumer: %w", err)
	}
	msgs, err := cons.Messages(jetstream.PullMaxBytes(16 << 20))
	if err != nil {
		return Throughput{}, fmt.Errorf("load: raw consumer: %w", err)
	}
	seen := newSeqWatch()
	done := make(chan struct{})
	var consumeErr error // set before done closes
	go func() {
		defer close(done)
		for {
			m, err := msgs.Next()
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				continue // the iterator goes on, as the service's reader does
			}
			if err != nil {
				consumeErr = err // jetstream.ErrMsgIteratorClosed once stopped below
				return
			}
			if meta, err := m.Metadata(); err == nil {
				seen.set(meta.Sequence.Stream)
			}
		}
	}()
	defer func() {
		msgs.Stop()
		<-done
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
	}()
	data := randomBytes(cfg.Batch*cfg.Payload, 1)
	ahead := uint64(min(max(1, rawUnapplied/cfg.Batch)*cfg.Clients, max(1, rawStreamBytes/4/len(data))))
	return runClients(ctx, cfg.Clients, cfg.Warmup, cfg.Duration, func(ctx context.Context, i int, c *counter) error {
		nc, js, err := rawPublisher(cfg, i, len(data))
		if err != nil {
			return err
		}
		defer nc.Close()
		// A wait for the consumer past the window would count nothing.
		wctx, cancel := context.WithDeadline(ctx, c.w.End)
		defer cancel()
		var last uint64 // the stream sequence of this publisher's last message
		for time.Now().Before(c.w.End) {
			t0 := time.Now()
			if last > ahead {
				if err := seen.wait(wctx, done, last-ahead); err != nil {
					switch {
					case errors.Is(err, errConsumerStopped):
						return fmt.Errorf("load: raw consumer: %w", consumeErr)
					case ctx.Err() == nil:
						return nil // the window ended
					}
					return err
				}
			}
			f, err := js.PublishAsync(rawInsertSubject, data)
			if err != nil {
				return fmt.Errorf("load: raw publish: %w", err)
			}
			select {
			case ack := <-f.Ok():
				c.record(t0, time.Now(), int64(cfg.Batch), int64(len(data)))
				last = ack.Sequence
			case err := <-f.Err():
				return fmt.Errorf("load: raw publish: %w", err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
}

// seqWatch is the last stream sequence a consumer received, with a way to
// wait for it to reach a value. It wakes its waiters only once the least
// sequence one of them waits for is reached: waking all of them at every
// message took CPU from the run it measures.
type seqWatch struct {
	mu      sync.Mutex
	seq     uint64
	want    uint64 // the least sequence waited for; 0: none
	reached chan struct{}
}

func newSeqWatch() *seqWatch { return &seqWatch{reached: make(chan struct{})} }

func (w *seqWatch) set(seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq = max(w.seq, seq)
	if w.want != 0 && w.seq >= w.want {
		close(w.reached)
		w.reached, w.want = make(chan struct{}), 0
	}
}

var errConsumerStopped = errors.New("load: the consumer stopped")

// wait waits until the consumer reached seq, or stopped (closing stopped).
func (w *seqWatch) wait(ctx context.Context, stopped <-chan struct{}, seq uint64) error {
	for {
		w.mu.Lock()
		if w.seq >= seq {
			w.mu.Unlock()
			return nil
		}
		if w.want == 0 || seq < w.want {
			w.want = seq
		}
		ch := w.reached
		w.mu.Unlock()
		select {
		case <-ch:
		case <-stopped:
			return errConsumerStopped
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
