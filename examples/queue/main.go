// Queue shows an on-policy FIFO queue. An actor sends numbered items
// through a queue table (fifo sampler and remover, max times sampled 1,
// the Queue rate limiter) and a learner takes them: each item exactly
// once, in the order sent, while the actor waits whenever the queue is
// full.
//
//	go run ./cmd/reprised --config examples/reprise.yaml   # in one terminal
//	go run ./examples/queue                                # in another
//	go run ./examples/queue --embedded                     # or alone
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/examples/internal/deploy"
	"github.com/reprise-rl/reprise/tables"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "queue:", err)
		os.Exit(1)
	}
}

// The table as examples/reprise.yaml defines it: at most 16 unread items.
var queue = tables.QueueConfig("queue", 16)

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("queue", flag.ContinueOnError)
	var where deploy.Flags
	where.Register(fs)
	items := fs.Int("items", 200, "how many items the actor sends")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	d, err := deploy.Start(ctx, where, []tables.Config{queue})
	if err != nil {
		return err
	}
	defer d.Close()
	fmt.Fprintf(stdout, "queue: an actor sends %d items through table %q (a queue of %d, via %s), a learner takes them\n", *items, queue.Name, queue.MaxSize, d.Where)

	// The actor runs beside the learner, as it would in its own process.
	var (
		wg       sync.WaitGroup
		actorErr error
	)
	wg.Go(func() {
		if actorErr = act(ctx, d, *items); actorErr != nil {
			cancel() // stop the learner too
		}
	})
	received, err := learn(ctx, d, *items)
	if err != nil {
		cancel() // stop the actor too
	}
	wg.Wait()
	if err := errors.Join(err, actorErr); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "learner received %d items: each exactly once, in order: ok\n", received)
	return nil
}

// learn takes whatever the queue holds, up to 8 at a time, with one request
// in flight (a prefetching Sampler would lose what it holds at Close), and
// checks that the items come in order.
func learn(ctx context.Context, d *deploy.Deployment, n int) (int64, error) {
	nc, err := d.Connect()
	if err != nil {
		return 0, err
	}
	learner, err := broker.NewClient(nc, broker.WithPrefix(d.Prefix))
	if err != nil {
		return 0, err
	}
	defer learner.Close()
	var next int64
	for next < int64(n) {
		batch, err := learner.Sample(ctx, queue.Name, 8, broker.Flexible())
		if err != nil {
			return next, fmt.Errorf("learner: %w", err)
		}
		for _, s := range batch {
			col, _ := s.Column("id")
			id, err := col.Int64s()
			if err != nil {
				return next, err
			}
			if id[0] != next {
				return next, fmt.Errorf("learner got item %d where item %d was due", id[0], next)
			}
			next++
		}
	}
	return next, nil
}

func act(ctx context.Context, d *deploy.Deployment, n int) (err error) {
	nc, err := d.Connect()
	if err != nil {
		return err
	}
	p, err := broker.NewProducer(ctx, nc, broker.WithPrefix(d.Prefix))
	if err != nil {
		return err
	}
	defer func() {
		// Close sends what is left and waits until JetStream has it.
		if cerr := p.Close(ctx); err == nil && cerr != nil {
			err = fmt.Errorf("actor: %w", cerr)
		}
	}()
	for i := range n {
		step := broker.Step{
			"id":          broker.Int64s(nil, []int64{int64(i)}),
			"observation": broker.Float32s([]int64{4}, []float32{float32(i), 0, 1, 0}),
		}
		if err := p.Append(ctx, step); err != nil {
			return fmt.Errorf("actor: %w", err)
		}
		if err := p.CreateItem(ctx, queue.Name, 1, broker.LastStep("id", "observation")); err != nil {
			return fmt.Errorf("actor: %w", err)
		}
	}
	return nil
}
