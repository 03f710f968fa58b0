package load

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"
)

// BenchConfig describes an insert or sample run on a Reprise table, the
// same workloads as reprisectl bench, for profiling them in one process.
type BenchConfig struct {
	URL, Prefix, Table string
	Clients            int
	// Payload is the size of one item: random float32s.
	Payload int
	// Batch is the items per Flush (inserts) or per request (samples).
	Batch            int
	Warmup, Duration time.Duration
}

func (c BenchConfig) validate() error {
	err := errors.Join(check("Clients", c.Clients, 1), check("Payload", c.Payload, 4), check("Batch", c.Batch, 1))
	if c.Payload%4 != 0 {
		err = errors.Join(err, fmt.Errorf("%w: Payload must be a multiple of 4 (float32s), got %d", ErrConfig, c.Payload))
	}
	if c.Duration <= 0 {
		err = errors.Join(err, fmt.Errorf("%w: Duration must be > 0, got %v", ErrConfig, c.Duration))
	}
	return err
}

// Insert runs producers that each append a step of random floats and
// create an item from it, Batch at a time, then Flush.
func Insert(ctx context.Context, cfg BenchConfig) (Throughput, error) {
	if err := cfg.validate(); err != nil {
		return Throughput{}, err
	}
	log := slog.New(slog.DiscardHandler)
	return runClients(ctx, cfg.Clients, cfg.Warmup, cfg.Duration, func(ctx context.Context, i int, c *counter) (err error) {
		nc, err := connect(cfg.URL, fmt.Sprintf("inserter %d", i))
		if err != nil {
			return err
		}
		defer nc.Close()
		p, err := broker.NewProducer(ctx, nc, broker.WithPrefix(cfg.Prefix), broker.WithLogger(log),
			broker.WithCompression(wire.Uncompressed), broker.WithBatch(cfg.Batch, max(256<<10, cfg.Batch*(cfg.Payload+256))))
		if err != nil {
			return fmt.Errorf("load: inserter %d: %w", i, err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if cerr := p.Close(cctx); cerr != nil && err == nil {
				err = fmt.Errorf("load: inserter %d: closing: %w", i, cerr)
			}
		}()
		payloads := randomPayloads(uint64(i), 0x5eed, cfg.Payload)
		traj := broker.LastStep("payload")
		for step := 0; time.Now().Before(c.w.End); {
			t0 := time.Now()
			for range cfg.Batch {
				if err := p.Append(ctx, broker.Step{"payload": payloads[step%len(payloads)]}); err != nil {
					return fmt.Errorf("load: inserter %d: %w", i, err)
				}
				if err := p.CreateItem(ctx, cfg.Table, 1, traj); err != nil {
					return fmt.Errorf("load: inserter %d: %w", i, err)
				}
				step++
			}
			if err := p.Flush(ctx); err != nil {
				return fmt.Errorf("load: inserter %d: %w", i, err)
			}
			c.record(t0, time.Now(), int64(cfg.Batch), int64(cfg.Batch*cfg.Payload))
		}
		return nil
	})
}

// Sample runs learners that each ask for Batch items at a time.
func Sample(ctx context.Context, cfg BenchConfig) (Throughput, error) {
	if err := cfg.validate(); err != nil {
		return Throughput{}, err
	}
	log := slog.New(slog.DiscardHandler)
	return runClients(ctx, cfg.Clients, cfg.Warmup, cfg.Duration, func(ctx context.Context, i int, c *counter) error {
		cl, hangUp, err := dialClient(cfg.URL, fmt.Sprintf("learner %d", i), cfg.Prefix, log)
		if err != nil {
			return err
		}
		defer hangUp()
		for time.Now().Before(c.w.End) {
			t0 := time.Now()
			samples, err := cl.Sample(ctx, cfg.Table, cfg.Batch)
			if err != nil {
				return fmt.Errorf("load: learner %d: %w", i, err)
			}
			var bytes int64
			for _, s := range samples {
				for _, col := range s.Columns {
					bytes += int64(len(col.Tensor.Data))
				}
			}
			c.record(t0, time.Now(), int64(len(samples)), bytes)
		}
		return nil
	})
}

// randomPayloads makes 8 payloads of random float32s for one client to
// cycle through: random, so that compression cannot shrink them.
func randomPayloads(client, seed uint64, bytes int) []*wire.Tensor {
	rng := rand.New(rand.NewPCG(client, seed))
	payloads := make([]*wire.Tensor, 8)
	for k := range payloads {
		v := make([]float32, bytes/4)
		for j := range v {
			v[j] = rng.Float32()
		}
		payloads[k] = wire.Float32s([]int64{int64(len(v))}, v)
	}
	return payloads
}

// dialClient connects a learner; hangUp closes the client and connection.
func dialClient(url, name, prefix string, log *slog.Logger) (cl *broker.Client, hangUp func(), err error) {
	nc, err := connect(url, name)
	if err != nil {
		return nil, nil, err
	}
	if cl, err = broker.NewClient(nc, broker.WithPrefix(prefix), broker.WithLogger(log)); err != nil {
		nc.Close()
		return nil, nil, err
	}
	return cl, func() { cl.Close(); nc.Close() }, nil
}
