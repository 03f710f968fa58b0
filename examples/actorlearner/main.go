// Actorlearner shows an actor-learner setup: several actors play a small
// environment and insert 3-step transitions; a learner samples them under a
// SampleToInsertRatio rate limiter, which keeps it at 2 samples per
// inserted item: it waits when it runs ahead of the actors, and they wait
// when it falls behind.
//
//	go run ./cmd/reprised --config examples/reprise.yaml   # in one terminal
//	go run ./examples/actorlearner                         # in another
//	go run ./examples/actorlearner --embedded              # or alone
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
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
		fmt.Fprintln(os.Stderr, "actorlearner:", err)
		os.Exit(1)
	}
}

const (
	samplesPerInsert = 2
	minSize          = 100
	errorBuffer      = 200
	steps            = 3 // per item
	batchSize        = 32
)

// table is the table as examples/reprise.yaml defines it.
func table() (tables.Config, error) {
	lim, err := limiter.SampleToInsertRatio(samplesPerInsert, minSize, errorBuffer)
	return tables.Config{
		Name:    "actorlearner",
		Sampler: selectors.Options{Kind: selectors.KindUniform},
		Remover: selectors.Options{Kind: selectors.KindFifo},
		MaxSize: 1000,
		Limiter: lim,
	}, err
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("actorlearner", flag.ContinueOnError)
	var where deploy.Flags
	where.Register(fs)
	actors := fs.Int("actors", 4, "how many actors")
	items := fs.Int("items", 2000, "how many items the actors insert in all")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cfg, err := table()
	if err != nil {
		return err
	}
	d, err := deploy.Start(ctx, where, []tables.Config{cfg})
	if err != nil {
		return err
	}
	defer d.Close()
	fmt.Fprintf(stdout, "actorlearner: %d actors and a learner on table %q via %s (%d samples per insert, min size %d, error buffer %d)\n",
		*actors, cfg.Name, d.Where, samplesPerInsert, minSize, errorBuffer)

	var (
		wg        sync.WaitGroup
		actorErrs = make([]error, *actors)
		episodes  atomic.Int64
		actorsRun = make(chan struct{}) // closed when every item is in the table
	)
	for i := range *actors {
		share := *items / *actors
		if i < *items%*actors {
			share++
		}
		wg.Go(func() {
			n, err := act(ctx, d, i, share)
			episodes.Add(n)
			if actorErrs[i] = err; err != nil {
				cancel()
			}
		})
	}
	go func() {
		wg.Wait()
		close(actorsRun)
	}()

	sampled, batches, err := learn(ctx, d, actorsRun)
	if err != nil {
		cancel()
	}
	<-actorsRun
	if err := errors.Join(append(actorErrs, err)...); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "actors inserted %d items of %d steps from %d episodes; the learner sampled %d items in %d batches\n",
		*items, steps, episodes.Load(), sampled, batches)
	fmt.Fprintf(stdout, "achieved samples per insert: %.3f (target %d)\n", float64(sampled)/float64(*items), samplesPerInsert)
	return nil
}

// chain is a tiny environment: walk left or right along a line of cells;
// reaching the right end pays 1 and ends the episode, as does running out
// of time.
type chain struct {
	pos, t int
}

const (
	chainLength = 8
	chainSteps  = 30
)

func (c *chain) observation() []float32 {
	return []float32{float32(c.pos) / chainLength, float32(c.t) / chainSteps}
}

func (c *chain) step(right bool) (reward float32, done bool) {
	if right {
		c.pos++
	} else if c.pos > 0 {
		c.pos--
	}
	c.t++
	if c.pos == chainLength {
		return 1, true
	}
	return 0, c.t == chainSteps
}

// act plays episodes with a random policy leaning right and inserts the
// last 3 steps of every step from the third on, until it has inserted n
// items and the table service has applied them. It returns the number of
// episodes played.
func act(ctx context.Context, d *deploy.Deployment, id, n int) (episodes int64, err error) {
	nc, err := d.Connect()
	if err != nil {
		return 0, err
	}
	p, err := broker.NewProducer(ctx, nc, broker.WithPrefix(d.Prefix))
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := p.Close(ctx); err == nil && cerr != nil {
			err = fmt.Errorf("actor %d: %w", id, cerr)
		}
	}()
	rng := rand.New(rand.NewPCG(uint64(id), 1))
	for inserted := 0; inserted < n; episodes++ {
		env := chain{}
		for t, done := 0, false; !done && inserted < n; t++ {
			obs := env.observation()
			action := int32(0)
			if rng.Float64() < 0.6 {
				action = 1 // right
			}
			reward, end := env.step(action == 1)
			done = end
			step := broker.Step{
				"observation": broker.Float32s([]int64{2}, obs),
				"action":      broker.Int32s(nil, []int32{action}),
				"reward":      broker.Float32s(nil, []float32{reward}),
			}
			if err := p.Append(ctx, step); err != nil {
				return episodes, fmt.Errorf("actor %d: %w", id, err)
			}
			if t+1 >= steps {
				if err := p.CreateItem(ctx, "actorlearner", 1, broker.Last(steps, "observation", "action", "reward")); err != nil {
					return episodes, fmt.Errorf("actor %d: %w", id, err)
				}
				inserted++
			}
		}
		if err := p.EndEpisode(ctx); err != nil {
			return episodes, fmt.Errorf("actor %d: %w", id, err)
		}
	}
	// Wait until the service has the items, not only JetStream: the
	// learner counts on them to finish.
	if err := p.WaitApplied(ctx); err != nil {
		return episodes, fmt.Errorf("actor %d: %w", id, err)
	}
	return episodes, nil
}

// learn samples batches until the actors are done and the rate limiter
// allows no more: then it has taken exactly samplesPerInsert per item.
func learn(ctx context.Context, d *deploy.Deployment, actorsRun <-chan struct{}) (sampled, batches int64, err error) {
	nc, err := d.Connect()
	if err != nil {
		return 0, 0, err
	}
	learner, err := broker.NewClient(nc, broker.WithPrefix(d.Prefix))
	if err != nil {
		return 0, 0, err
	}
	defer learner.Close()
	for {
		// Flexible: take what the limiter allows, up to a batch, so that
		// the last few samples are taken too.
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		batch, err := learner.Sample(rctx, "actorlearner", batchSize, broker.Flexible())
		cancel()
		switch {
		case err == nil:
			sampled += int64(len(batch))
			batches++
			// A learning step would train on batch here.
		case errors.Is(err, broker.ErrRateLimited):
			select {
			case <-actorsRun:
				return sampled, batches, nil
			default: // the actors are still at it
			}
		default:
			return sampled, batches, fmt.Errorf("learner: %w", err)
		}
	}
}
