package load

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/reprise-rl/reprise/broker/service"
)

// The raw baseline's stream and subjects; they share the server with a
// Reprise deployment without touching it.
const (
	RawStream        = "REPRISE_BENCH_RAW"
	rawInsertSubject = "reprise_bench_raw.insert"
	rawSampleSubject = "reprise_bench_raw.sample"
	// rawStreamBytes caps the raw stream like the suite caps Reprise's, so
	// both pay for discarding old messages once full.
	rawStreamBytes = 1 << 30
)

// RawConfig describes one raw JetStream baseline run.
type RawConfig struct {
	URL     string
	Clients int
	// Payload is the size of one item in bytes.
	Payload int
	// Batch is the number of items in one message: one published batch,
	// or one reply of a request.
	Batch            int
	Warmup, Duration time.Duration
}

func (c RawConfig) validate(withBatch bool) error {
	err := errors.Join(check("Clients", c.Clients, 1), check("Payload", c.Payload, 1))
	if withBatch {
		err = errors.Join(err, check("Batch", c.Batch, 1))
	}
	if c.Duration <= 0 {
		err = errors.Join(err, fmt.Errorf("%w: Duration must be > 0, got %v", ErrConfig, c.Duration))
	}
	return err
}

// RawPublish measures what Reprise's inserts are bounded by: every client,
// on its own connection, publishes the bytes a producer sends for a batch,
// cfg.Batch items of cfg.Payload random bytes in one message, async to a
// plain file-backed stream, and waits for its ack before the next, as a
// producer's Flush waits for JetStream to store its batch. The batch's
// items count once JetStream acknowledged it.
func RawPublish(ctx context.Context, cfg RawConfig) (Throughput, error) {
	if err := cfg.validate(true); err != nil {
		return Throughput{}, err
	}
	if err := ensureRawStream(ctx, cfg.URL); err != nil {
		return Throughput{}, err
	}
	data := randomBytes(cfg.Batch*cfg.Payload, 1)
	return runClients(ctx, cfg.Clients, cfg.Warmup, cfg.Duration, func(ctx context.Context, i int, c *counter) error {
		nc, js, err := rawPublisher(cfg, i, len(data))
		if err != nil {
			return err
		}
		defer nc.Close()
		for time.Now().Before(c.w.End) {
			t0 := time.Now()
			f, err := js.PublishAsync(rawInsertSubject, data)
			if err != nil {
				return fmt.Errorf("load: raw publish: %w", err)
			}
			select {
			case <-f.Ok():
				c.record(t0, time.Now(), int64(cfg.Batch), int64(len(data)))
			case err := <-f.Err():
				return fmt.Errorf("load: raw publish: %w", err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
}

// rawPublisher connects raw publisher i, whose messages of size bytes
// must fit the server's max payload, and opens JetStream on it.
func rawPublisher(cfg RawConfig, i, size int) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := connect(cfg.URL, fmt.Sprintf("raw publisher %d", i))
	if err != nil {
		return nil, nil, err
	}
	if size > int(nc.MaxPayload()) {
		nc.Close()
		return nil, nil, fmt.Errorf("%w: a batch of %d items of %d bytes exceeds the server's max payload (%d bytes)", ErrConfig, cfg.Batch, cfg.Payload, nc.MaxPayload())
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// RawPublishSync publishes one item at a time and waits for each ack: the
// floor under an insert's time to durable.
func RawPublishSync(ctx context.Context, cfg RawConfig) (Throughput, error) {
	if err := cfg.validate(false); err != nil {
		return Throughput{}, err
	}
	if err := ensureRawStream(ctx, cfg.URL); err != nil {
		return Throughput{}, err
	}
	data := randomBytes(cfg.Payload, 3)
	return runClients(ctx, cfg.Clients, cfg.Warmup, cfg.Duration, func(ctx context.Context, i int, c *counter) error {
		nc, err := connect(cfg.URL, fmt.Sprintf("raw sync publisher %d", i))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		for time.Now().Before(c.w.End) {
			t0 := time.Now()
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := js.Publish(pctx, rawInsertSubject, data)
			cancel()
			if err != nil {
				return fmt.Errorf("load: raw sync publish: %w", err)
			}
			c.record(t0, time.Now(), 1, int64(cfg.Payload))
		}
		return nil
	})
}

// RawRequest measures what Reprise's samples are bounded by: responders
// answer every request at once with a prepared reply of cfg.Batch items of
// cfg.Payload bytes, and every client, on its own connection, sends one
// request after another over core NATS.
func RawRequest(ctx context.Context, cfg RawConfig) (Throughput, error) {
	if err := cfg.validate(true); err != nil {
		return Throughput{}, err
	}
	reply := randomBytes(cfg.Batch*cfg.Payload, 2)
	// As many responders as reprised has reply connections on this
	// machine: the server reads each connection in one goroutine.
	var responders []*nats.Conn
	defer func() {
		for _, nc := range responders {
			nc.Close()
		}
	}()
	for i := range service.DefaultReplyConns(runtime.GOMAXPROCS(0)) {
		nc, err := connect(cfg.URL, fmt.Sprintf("raw responder %d", i))
		if err != nil {
			return Throughput{}, err
		}
		responders = append(responders, nc)
		if len(reply) > int(nc.MaxPayload())-1024 {
			return Throughput{}, fmt.Errorf("%w: a reply of %d items of %d bytes exceeds the server's max payload (%d bytes)", ErrConfig, cfg.Batch, cfg.Payload, nc.MaxPayload())
		}
		if _, err := nc.QueueSubscribe(rawSampleSubject, "responders", func(m *nats.Msg) { _ = m.Respond(reply) }); err != nil {
			return Throughput{}, fmt.Errorf("load: raw responder: %w", err)
		}
		if err := nc.Flush(); err != nil {
			return Throughput{}, fmt.Errorf("load: raw responder: %w", err)
		}
	}
	req := []byte("sample")
	return runClients(ctx, cfg.Clients, cfg.Warmup, cfg.Duration, func(ctx context.Context, i int, c *counter) error {
		nc, err := connect(cfg.URL, fmt.Sprintf("raw requester %d", i))
		if err != nil {
			return err
		}
		defer nc.Close()
		for time.Now().Before(c.w.End) {
			t0 := time.Now()
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			m, err := nc.RequestWithContext(rctx, rawSampleSubject, req)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("load: raw request: %w", err)
			}
			if len(m.Data) != len(reply) {
				return fmt.Errorf("load: raw request: reply of %d bytes, want %d", len(m.Data), len(reply))
			}
			c.record(t0, time.Now(), int64(cfg.Batch), int64(len(reply)))
		}
		return nil
	})
}

func ensureRawStream(ctx context.Context, url string) error {
	nc, err := connect(url, "raw stream setup")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     RawStream,
		Subjects: []string{rawInsertSubject},
		Storage:  jetstream.FileStorage,
		MaxBytes: rawStreamBytes,
		Discard:  jetstream.DiscardOld,
	})
	if err != nil {
		return fmt.Errorf("load: creating stream %s: %w", RawStream, err)
	}
	return nil
}

// DeleteRawStream removes the raw baseline's stream, if there is one.
func DeleteRawStream(ctx context.Context, url string) error {
	nc, err := connect(url, "raw stream cleanup")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := js.DeleteStream(ctx, RawStream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("load: deleting stream %s: %w", RawStream, err)
	}
	return nil
}

// randomBytes returns n bytes that do not compress, like the float32
// payloads of Reprise's runs.
func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}
