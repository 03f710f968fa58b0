// Staleness shows an asynchronous actor-learner loop held to a staleness
// bound. Actors act with whatever policy version they last saw, which lags
// the learner's; they tag each item with it. The learner trains on batches,
// publishes each new version, and tells the table: with max_staleness K,
// items more than K versions behind are removed and never sampled, so
// every batch is at most K versions off-policy, however far actors lag.
//
//	go run ./cmd/reprised --config examples/reprise.yaml   # in one terminal
//	go run ./examples/staleness                            # in another
//	go run ./examples/staleness --embedded                 # or alone
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/examples/internal/deploy"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "staleness:", err)
		os.Exit(1)
	}
}

// maxStaleness is the table's bound: as examples/reprise.yaml defines it.
const maxStaleness = 2

var async = func() tables.Config {
	k := int64(maxStaleness)
	return tables.Config{
		Name: "async", MaxSize: 10_000, MaxStaleness: &k, Limiter: limiter.MinSize(8),
		Sampler: selectors.Options{Kind: selectors.KindUniform}, Remover: selectors.Options{Kind: selectors.KindFifo},
	}
}()

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("staleness", flag.ContinueOnError)
	var where deploy.Flags
	where.Register(fs)
	updates := fs.Int("updates", 30, "learner updates (policy versions) to run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	d, err := deploy.Start(ctx, where, []tables.Config{async})
	if err != nil {
		return err
	}
	defer d.Close()
	fmt.Fprintf(stdout, "staleness: 2 actors feed table %q (max_staleness %d, via %s); a learner runs %d updates\n", async.Name, maxStaleness, d.Where, *updates)

	c, err := client(d)
	if err != nil {
		return err
	}
	defer c.Close()
	// A table keeps its version across runs (a reset empties it, the
	// learner's version goes on): start from it.
	info, err := c.Info(ctx, async.Name)
	if err != nil {
		return err
	}
	// published is the learner's latest version; each actor picks it up
	// only every few steps, so actors lag the learner.
	var published atomic.Int64
	published.Store(info.Tables[0].PolicyVersion)
	actCtx, stopActors := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() { errs[i] = act(actCtx, d, &published, 5+3*i) })
	}
	worst, err := learn(ctx, c, &published, *updates)
	stopActors()
	wg.Wait()
	if err := errors.Join(append(errs, err)...); err != nil {
		return err
	}
	info, err = c.Info(ctx, async.Name)
	if err != nil {
		return err
	}
	ti := info.Tables[0]
	fmt.Fprintf(stdout, "the table is at version %d and holds items of versions %d..%d; %d items went stale\n",
		ti.PolicyVersion, ti.MinItemVersion, ti.MaxItemVersion, ti.StaleEvictions)
	fmt.Fprintf(stdout, "every sampled item was at most %d versions behind (worst: %d): ok\n", maxStaleness, worst)
	return nil
}

func client(d *deploy.Deployment) (*broker.Client, error) {
	nc, err := d.Connect()
	if err != nil {
		return nil, err
	}
	return broker.NewClient(nc, broker.WithPrefix(d.Prefix))
}

// learn samples, checks how far behind each item's version is, and moves
// the policy on. It returns the worst lag it saw.
func learn(ctx context.Context, c *broker.Client, published *atomic.Int64, updates int) (int64, error) {
	var worst int64
	start := published.Load()
	for version := start + 1; version <= start+int64(updates); version++ {
		batch, err := c.Sample(ctx, async.Name, 16)
		if err != nil {
			return worst, fmt.Errorf("learner: %w", err)
		}
		for _, s := range batch {
			col, _ := s.Column("version")
			v, err := col.Int64s()
			if err != nil {
				return worst, err
			}
			lag := version - 1 - v[0]
			if lag > maxStaleness {
				return worst, fmt.Errorf("learner at version %d sampled an item of version %d: %d behind, over max_staleness %d", version-1, v[0], lag, maxStaleness)
			}
			worst = max(worst, lag)
		}
		// Training on the batch would happen here; then the new version.
		if err := c.SetPolicyVersion(ctx, async.Name, version); err != nil {
			return worst, fmt.Errorf("learner: %w", err)
		}
		published.Store(version)
	}
	return worst, nil
}

// act writes one-step items until ctx ends, refreshing its policy version
// from the learner every refresh steps.
func act(ctx context.Context, d *deploy.Deployment, published *atomic.Int64, refresh int) (err error) {
	nc, err := d.Connect()
	if err != nil {
		return err
	}
	p, err := broker.NewProducer(ctx, nc, broker.WithPrefix(d.Prefix), broker.WithLinger(time.Millisecond))
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if cerr := p.Close(cctx); err == nil && cerr != nil && ctx.Err() == nil {
			err = fmt.Errorf("actor: %w", cerr)
		}
	}()
	var version int64
	for step := 0; ctx.Err() == nil; step++ {
		if step%refresh == 0 {
			version = published.Load()
			p.SetPolicyVersion(version)
		}
		if err := p.Append(ctx, broker.Step{"version": broker.Int64s(nil, []int64{version})}); err != nil {
			return ignoreEnd(ctx, err)
		}
		if err := p.CreateItem(ctx, async.Name, 1, broker.LastStep("version")); err != nil {
			return ignoreEnd(ctx, err)
		}
	}
	return nil
}

// ignoreEnd drops the error of a call that the end of the run interrupted.
func ignoreEnd(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("actor: %w", err)
}
