package load

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/wire"
)

// LatencyConfig describes the insert-to-sampleable run.
type LatencyConfig struct {
	URL, Prefix string
	// Table must be a queue: a learner's request waits until an item
	// arrives and takes each item once.
	Table   string
	Payload int
	// Inserts is how many items go through, one at a time.
	Inserts int
}

// InsertLatency is what the insert-to-sampleable run measured.
type InsertLatency struct {
	// ToSampled runs from the actor's Append to the learner holding the
	// decoded item: publish, storage in JetStream, delivery to the table
	// service, insert, and the answer to a sample request already waiting.
	ToSampled LatencyReport `json:"to_sampled"`
	// ToDurable runs from Append until Flush returns: JetStream stored it.
	ToDurable LatencyReport `json:"to_durable"`
}

type received struct {
	at  time.Time
	id  float32
	err error
}

// InsertToSampleable inserts items one at a time into a queue table while
// a learner waits on it, and times each from Append to the learner.
func InsertToSampleable(ctx context.Context, cfg LatencyConfig) (InsertLatency, error) {
	if err := errors.Join(check("Payload", cfg.Payload, 4), check("Inserts", cfg.Inserts, 1)); err != nil {
		return InsertLatency{}, err
	}
	log := slog.New(slog.DiscardHandler)
	anc, err := connect(cfg.URL, "latency actor")
	if err != nil {
		return InsertLatency{}, err
	}
	defer anc.Close()
	lnc, err := connect(cfg.URL, "latency learner")
	if err != nil {
		return InsertLatency{}, err
	}
	defer lnc.Close()
	// Flush returns once stored: ToDurable measures durability, and
	// ToSampled the service's part.
	p, err := broker.NewProducer(ctx, anc, broker.WithPrefix(cfg.Prefix), broker.WithLogger(log),
		broker.WithLinger(0), broker.WithCompression(wire.Uncompressed), broker.WithReturnOnStore())
	if err != nil {
		return InsertLatency{}, fmt.Errorf("load: latency actor: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Close(cctx)
	}()
	cl, err := broker.NewClient(lnc, broker.WithPrefix(cfg.Prefix), broker.WithLogger(log))
	if err != nil {
		return InsertLatency{}, err
	}
	defer cl.Close()

	lctx, stop := context.WithCancel(ctx)
	got := make(chan received, 1)
	learnerDone := make(chan struct{})
	go func() {
		defer close(learnerDone)
		for lctx.Err() == nil {
			rctx, cancel := context.WithTimeout(lctx, 5*time.Second)
			s, err := cl.Sample(rctx, cfg.Table, 1)
			cancel()
			r := received{at: time.Now()}
			switch {
			case lctx.Err() != nil:
				return
			case errors.Is(err, broker.ErrRateLimited):
				continue // nothing inserted yet: ask again
			case err != nil:
				r.err = err
			default:
				col, _ := s[0].Column("payload")
				v, verr := col.Float32s()
				r.id, r.err = v[0], verr
			}
			select {
			case got <- r:
			case <-lctx.Done():
				return
			}
		}
	}()
	defer func() {
		stop()
		<-learnerDone
	}()

	rng := rand.New(rand.NewPCG(3, 0x5eed))
	v := make([]float32, cfg.Payload/4)
	for i := range v {
		v[i] = rng.Float32()
	}
	traj := broker.LastStep("payload")
	sampled, durable := newHistogram(), newHistogram()
	for i := range cfg.Inserts {
		v[0] = float32(i)
		t0 := time.Now()
		if err := p.Append(ctx, broker.Step{"payload": broker.Float32s([]int64{int64(len(v))}, v)}); err != nil {
			return InsertLatency{}, fmt.Errorf("load: latency actor: %w", err)
		}
		if err := p.CreateItem(ctx, cfg.Table, 1, traj); err != nil {
			return InsertLatency{}, fmt.Errorf("load: latency actor: %w", err)
		}
		if err := p.Flush(ctx); err != nil {
			return InsertLatency{}, fmt.Errorf("load: latency actor: %w", err)
		}
		durable.record(time.Since(t0))
		select {
		case r := <-got:
			if r.err != nil {
				return InsertLatency{}, fmt.Errorf("load: latency learner: %w", r.err)
			}
			if r.id != float32(i) {
				return InsertLatency{}, fmt.Errorf("load: latency learner got item %v, want %d: is table %q a queue nobody else uses?", r.id, i, cfg.Table)
			}
			sampled.record(r.at.Sub(t0))
		case <-time.After(10 * time.Second):
			return InsertLatency{}, fmt.Errorf("load: latency: item %d was not sampled within 10s of its insert", i)
		case <-ctx.Done():
			return InsertLatency{}, ctx.Err()
		}
	}
	return InsertLatency{ToSampled: sampled.report(), ToDurable: durable.report()}, nil
}

// FillConfig describes a fill: Items items of Payload random bytes
// inserted by Clients producers.
type FillConfig struct {
	URL, Prefix, Table      string
	Items, Payload, Clients int
}

// Fill inserts exactly cfg.Items items and returns once the table service
// has applied them all.
func Fill(ctx context.Context, cfg FillConfig) error {
	if err := errors.Join(check("Items", cfg.Items, 0), check("Payload", cfg.Payload, 4), check("Clients", cfg.Clients, 1)); err != nil {
		return err
	}
	if cfg.Payload%4 != 0 {
		return fmt.Errorf("%w: Payload must be a multiple of 4 (float32s), got %d", ErrConfig, cfg.Payload)
	}
	log := slog.New(slog.DiscardHandler)
	_, err := runClients(ctx, cfg.Clients, 0, time.Hour, func(ctx context.Context, i int, _ *counter) (err error) {
		n := cfg.Items / cfg.Clients
		if i < cfg.Items%cfg.Clients {
			n++
		}
		nc, err := connect(cfg.URL, fmt.Sprintf("filler %d", i))
		if err != nil {
			return err
		}
		defer nc.Close()
		p, err := broker.NewProducer(ctx, nc, broker.WithPrefix(cfg.Prefix), broker.WithLogger(log), broker.WithCompression(wire.Uncompressed), broker.WithReturnOnStore())
		if err != nil {
			return fmt.Errorf("load: filler %d: %w", i, err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if cerr := p.Close(cctx); cerr != nil && err == nil {
				err = fmt.Errorf("load: filler %d: closing: %w", i, cerr)
			}
		}()
		payloads := randomPayloads(uint64(i), 0xf111, cfg.Payload)
		traj := broker.LastStep("payload")
		for k := range n {
			if err := p.Append(ctx, broker.Step{"payload": payloads[k%len(payloads)]}); err != nil {
				return fmt.Errorf("load: filler %d: %w", i, err)
			}
			if err := p.CreateItem(ctx, cfg.Table, 1, traj); err != nil {
				return fmt.Errorf("load: filler %d: %w", i, err)
			}
		}
		if err := p.Flush(ctx); err != nil {
			return fmt.Errorf("load: filler %d: %w", i, err)
		}
		if err := p.WaitApplied(ctx); err != nil {
			return fmt.Errorf("load: filler %d: %w", i, err)
		}
		return nil
	})
	return err
}

// Drain samples table until ctx ends, discarding what it gets. Run after
// a mixed run's learners have stopped, it lets actors that are closing get
// their last items past a rate limiter that holds inserts until they are
// sampled.
func Drain(ctx context.Context, url, prefix, table string) error {
	nc, err := connect(url, "drain")
	if err != nil {
		return err
	}
	defer nc.Close()
	cl, err := broker.NewClient(nc, broker.WithPrefix(prefix), broker.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return err
	}
	defer cl.Close()
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := cl.Sample(rctx, table, 64, broker.Flexible())
		cancel()
		if err != nil && ctx.Err() == nil && !errors.Is(err, broker.ErrRateLimited) && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("load: drain: %w", err)
		}
	}
	return nil
}

// CaughtUp waits until the table service has applied everything its
// stream holds, polling its info every 20ms.
func CaughtUp(ctx context.Context, url, prefix string) error {
	nc, err := connect(url, "catch-up")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	name, err := js.StreamNameBySubject(ctx, prefix+".data.insert")
	if err != nil {
		return fmt.Errorf("load: finding the stream of %s: %w", prefix, err)
	}
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("load: stream %s: %w", name, err)
	}
	cl, err := broker.NewClient(nc, broker.WithPrefix(prefix), broker.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return err
	}
	defer cl.Close()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		si, err := stream.Info(ctx)
		if err != nil {
			return fmt.Errorf("load: stream %s: %w", name, err)
		}
		info, err := cl.Info(ctx, "")
		if err != nil {
			return fmt.Errorf("load: service info: %w", err)
		}
		if info.AppliedSequence >= si.State.LastSeq {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("load: the table service applied up to %d of %d stream messages: %w", info.AppliedSequence, si.State.LastSeq, ctx.Err())
		}
	}
}
