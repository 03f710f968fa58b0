// Prioritized shows prioritized experience replay. A learner samples from a
// table with a prioritized sampler, computes a "TD error" for each item
// and sets the item's priority to it. A few items are hard (large errors),
// the rest easy; once the priorities are updated the learner sees the hard
// items far more often.
//
//	go run ./cmd/reprised --config examples/reprise.yaml   # in one terminal
//	go run ./examples/prioritized                          # in another
//	go run ./examples/prioritized --embedded               # or alone
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/examples/internal/deploy"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "prioritized:", err)
		os.Exit(1)
	}
}

const exponent = 0.6

// table is the table as examples/reprise.yaml defines it.
var table = tables.Config{
	Name:    "prioritized",
	Sampler: selectors.Options{Kind: selectors.KindPrioritized, Exponent: exponent},
	Remover: selectors.Options{Kind: selectors.KindFifo},
	MaxSize: 1000,
	Limiter: limiter.MinSize(1),
}

const batchSize = 50

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("prioritized", flag.ContinueOnError)
	var where deploy.Flags
	where.Register(fs)
	items := fs.Int("items", 100, "how many items to insert; every 10th is hard")
	samples := fs.Int("samples", 2000, "how many items to sample before and after the updates")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *items < 10 || *samples < batchSize {
		return fmt.Errorf("need at least 10 items and %d samples", batchSize)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	d, err := deploy.Start(ctx, where, []tables.Config{table})
	if err != nil {
		return err
	}
	defer d.Close()
	if err := insert(ctx, d, *items); err != nil {
		return err
	}
	nc, err := d.Connect()
	if err != nil {
		return err
	}
	learner, err := broker.NewClient(nc, broker.WithPrefix(d.Prefix))
	if err != nil {
		return err
	}
	defer learner.Close()
	fmt.Fprintf(stdout, "prioritized: %d items in table %q via %s, sampled with probability ∝ priority^%g; every 10th item is hard\n",
		*items, table.Name, d.Where, exponent)

	// Before: every item has priority 1, so sampling is uniform.
	hard, mean, err := measure(ctx, learner, *samples)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "before the updates: hard items are %.1f%% of %d sampled (expected %.1f%%), mean priority %.3f\n",
		100*hard, *samples, 100*float64((*items+9)/10)/float64(*items), mean)

	// Learn: sample, compute TD errors, make them the new priorities,
	// until every item has had its update.
	rng := rand.New(rand.NewPCG(1, 2))
	priority := make(map[uint64]float64) // by item key
	hardKeys := make(map[uint64]bool)
	for rounds := 0; len(priority) < *items; rounds++ {
		if rounds == 1000 {
			return fmt.Errorf("after 1000 rounds only %d of %d items were sampled", len(priority), *items)
		}
		batch, err := learner.Sample(ctx, table.Name, batchSize)
		if err != nil {
			return err
		}
		var updates []tables.PriorityUpdate
		for _, s := range batch {
			p := tdError(rng, isHard(s))
			priority[s.Info.Key] = p
			hardKeys[s.Info.Key] = isHard(s)
			updates = append(updates, tables.PriorityUpdate{Key: s.Info.Key, Priority: p})
		}
		if err := learner.UpdatePriorities(ctx, table.Name, updates...); err != nil {
			return err
		}
	}
	if err := waitForPriorities(ctx, learner, priority); err != nil {
		return err
	}

	hard, mean, err = measure(ctx, learner, *samples)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "after the updates:  hard items are %.1f%% of %d sampled (expected %.1f%%), mean priority %.3f\n",
		100*hard, *samples, 100*hardShare(priority, hardKeys), mean)
	return nil
}

func insert(ctx context.Context, d *deploy.Deployment, n int) (err error) {
	nc, err := d.Connect()
	if err != nil {
		return err
	}
	p, err := broker.NewProducer(ctx, nc, broker.WithPrefix(d.Prefix))
	if err != nil {
		return err
	}
	defer func() {
		if cerr := p.Close(ctx); err == nil && cerr != nil {
			err = cerr
		}
	}()
	for i := range n {
		if err := p.Append(ctx, broker.Step{"id": broker.Int64s(nil, []int64{int64(i)})}); err != nil {
			return err
		}
		// New items get the largest priority, so each is sampled soon.
		if err := p.CreateItem(ctx, table.Name, 1, broker.LastStep("id")); err != nil {
			return err
		}
	}
	if err := p.Flush(ctx); err != nil {
		return err
	}
	return p.WaitApplied(ctx)
}

func isHard(s broker.Sample) bool {
	col, _ := s.Column("id")
	id, _ := col.Int64s()
	return len(id) == 1 && id[0]%10 == 0
}

// tdError fakes a learner's temporal-difference error: about 1 for hard
// items, about 0.05 for easy ones.
func tdError(rng *rand.Rand, hard bool) float64 {
	if hard {
		return 0.9 + 0.2*rng.Float64()
	}
	return 0.04 + 0.02*rng.Float64()
}

// measure samples n items and returns the share of hard ones and their
// mean priority as the table reported it.
func measure(ctx context.Context, c *broker.Client, n int) (hard, mean float64, err error) {
	var hardCount, total int
	var sum float64
	for total < n {
		batch, err := c.Sample(ctx, table.Name, min(batchSize, n-total))
		if err != nil {
			return 0, 0, err
		}
		for _, s := range batch {
			if isHard(s) {
				hardCount++
			}
			sum += s.Info.Priority
			total++
		}
	}
	return float64(hardCount) / float64(total), sum / float64(total), nil
}

// hardShare is the probability that a sample is hard: the hard items'
// share of priority^exponent.
func hardShare(priority map[uint64]float64, hardKeys map[uint64]bool) float64 {
	var hard, all float64
	for key, p := range priority {
		w := math.Pow(p, exponent)
		all += w
		if hardKeys[key] {
			hard += w
		}
	}
	return hard / all
}

// waitForPriorities waits until a batch shows the priorities the learner
// set: updates travel through the stream, like inserts, and the table
// service applies them a moment after UpdatePriorities returns.
func waitForPriorities(ctx context.Context, c *broker.Client, priority map[uint64]float64) error {
	for {
		batch, err := c.Sample(ctx, table.Name, batchSize)
		if err != nil {
			return err
		}
		current := true
		for _, s := range batch {
			current = current && s.Info.Priority == priority[s.Info.Key]
		}
		if current {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the table does not show the new priorities: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
