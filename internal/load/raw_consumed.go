package load

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// rawUnapplied is how far, in items, a raw publisher may run ahead of the
// consumer: a Reprise producer's default window of unapplied items.
const rawUnapplied = 4096

// RawPublishConsumed is RawPublish with what Reprise adds on the server's
// side and nothing of its own: one pull consumer, on a connection of its
// own like the table service's, receives every message the publishers
// store (no acks, a memory-held consumer, the service's 16 MiB pull
// window) and throws it away. Each publisher waits, as a producer's window
// makes it, while the consumer is more than its share of rawUnapplied
// items behind. Reprise's inserts cannot outrun this on a machine whose
// cores the server, the consumer and the publishers share.
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
	ahead := uint64(max(1, rawUnapplied/cfg.Batch) * cfg.Clients)
	return runClients(ctx, cfg.Clients, cfg.Warmup, cfg.Duration, func(ctx context.Context, i int, c *counter) error {
		nc, err := connect(cfg.URL, fmt.Sprintf("raw publisher %d", i))
		if err != nil {
			return err
		}
		defer nc.Close()
		if len(data) > int(nc.MaxPayload()) {
			return fmt.Errorf("%w: a batch of %d items of %d bytes exceeds the server's max payload (%d bytes)", ErrConfig, cfg.Batch, cfg.Payload, nc.MaxPayload())
		}
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
		if err != nil {
			return err
		}
		for time.Now().Before(c.w.End) {
			t0 := time.Now()
			f, err := js.PublishAsync(rawInsertSubject, data)
			if err != nil {
				return fmt.Errorf("load: raw publish: %w", err)
			}
			select {
			case ack := <-f.Ok():
				c.record(t0, time.Now(), int64(cfg.Batch), int64(len(data)))
				if ack.Sequence > ahead {
					if err := seen.wait(ctx, done, ack.Sequence-ahead); err != nil {
						if errors.Is(err, errConsumerStopped) {
							return fmt.Errorf("load: raw consumer: %w", consumeErr)
						}
						return err
					}
				}
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
// wait for it to reach a value.
type seqWatch struct {
	mu      sync.Mutex
	seq     uint64
	changed chan struct{}
}

func newSeqWatch() *seqWatch { return &seqWatch{changed: make(chan struct{})} }

func (w *seqWatch) set(seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if seq > w.seq {
		w.seq = seq
		close(w.changed)
		w.changed = make(chan struct{})
	}
}

var errConsumerStopped = errors.New("load: the consumer stopped")

// wait waits until the consumer reached seq, or stopped (closing stopped).
func (w *seqWatch) wait(ctx context.Context, stopped <-chan struct{}, seq uint64) error {
	for {
		w.mu.Lock()
		cur, ch := w.seq, w.changed
		w.mu.Unlock()
		if cur >= seq {
			return nil
		}
		select {
		case <-ch:
		case <-stopped:
			return errConsumerStopped
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
