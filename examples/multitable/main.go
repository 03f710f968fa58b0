// Multitable shows trajectories shared between tables. One producer writes
// overlapping trajectories into two tables at once, as in §4 of the Reverb
// paper: after every step, an item of the last 2 steps into one table and
// an item of the last 3 steps into the other. The items only reference
// chunks, so each step is sent and stored once however many items in
// however many tables use it.
//
//	go run ./cmd/reprised --config examples/reprise.yaml   # in one terminal
//	go run ./examples/multitable                           # in another
//	go run ./examples/multitable --embedded                # or alone
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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
		fmt.Fprintln(os.Stderr, "multitable:", err)
		os.Exit(1)
	}
}

// uniform is a table as examples/reprise.yaml defines both.
func uniform(name string) tables.Config {
	return tables.Config{
		Name:    name,
		Sampler: selectors.Options{Kind: selectors.KindUniform},
		Remover: selectors.Options{Kind: selectors.KindFifo},
		MaxSize: 1000,
		Limiter: limiter.MinSize(1),
	}
}

var (
	pairs   = uniform("multitable_2steps")
	triples = uniform("multitable_3steps")
	columns = []string{"observation", "action"}
)

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("multitable", flag.ContinueOnError)
	var where deploy.Flags
	where.Register(fs)
	episodesFlag := fs.Int("episodes", 3, "how many episodes to write")
	lengthFlag := fs.Int("steps", 10, "steps per episode (at least 3)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	episodes, length := *episodesFlag, *lengthFlag
	if length < 3 || episodes < 1 {
		return fmt.Errorf("need at least 1 episode of at least 3 steps, got %d of %d", episodes, length)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	d, err := deploy.Start(ctx, where, []tables.Config{pairs, triples})
	if err != nil {
		return err
	}
	defer d.Close()
	nc, err := d.Connect()
	if err != nil {
		return err
	}
	client, err := broker.NewClient(nc, broker.WithPrefix(d.Prefix))
	if err != nil {
		return err
	}
	defer client.Close()
	before, err := client.Info(ctx, "")
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "multitable: %d episodes of %d steps via %s; after each step, the last 2 steps go to %s and the last 3 to %s\n",
		episodes, length, d.Where, pairs.Name, triples.Name)

	if err := write(ctx, d, episodes, length); err != nil {
		return err
	}

	after, err := client.Info(ctx, "")
	if err != nil {
		return err
	}
	sizes := map[string]broker.TableInfo{}
	for _, t := range after.Tables {
		sizes[t.Name] = t
	}
	p, t := sizes[pairs.Name], sizes[triples.Name]
	fmt.Fprintf(stdout, "%s: %d items, %s: %d items; together they reference 2×%d + 3×%d = %d steps of each column\n",
		pairs.Name, p.Size, triples.Name, t.Size, p.Size, t.Size, 2*p.Size+3*t.Size)
	fmt.Fprintf(stdout, "the chunk store gained %d chunks, one per step and column (%d steps × %d columns), %d bytes;\n",
		after.Chunks-before.Chunks, episodes*length, len(columns), after.ChunkBytes-before.ChunkBytes)
	fmt.Fprintf(stdout, "%s references %d bytes of them and %s %d: each step is stored once and shared by both tables\n",
		pairs.Name, p.BytesHeld, triples.Name, t.BytesHeld)

	// A learner sees each item's columns with its own number of steps.
	for _, name := range []string{pairs.Name, triples.Name} {
		s, err := client.Sample(ctx, name, 1)
		if err != nil {
			return err
		}
		obs, _ := s[0].Column("observation")
		act, _ := s[0].Column("action")
		fmt.Fprintf(stdout, "a sample from %s: observation %v, action %v\n", name, obs.Shape, act.Shape)
	}
	return nil
}

// write plays the episodes and creates both tables' items after every
// step, then waits until the table service has applied them.
func write(ctx context.Context, d *deploy.Deployment, episodes, length int) (err error) {
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
	for e := range episodes {
		for t := range length {
			step := broker.Step{
				"observation": broker.Float32s([]int64{3}, []float32{float32(e), float32(t), 0.5}),
				"action":      broker.Int64s(nil, []int64{int64(t % 2)}),
			}
			if err := p.Append(ctx, step); err != nil {
				return err
			}
			// Both items cover the newest step: its chunks are shared.
			if t >= 1 {
				if err := p.CreateItem(ctx, pairs.Name, 1, broker.Last(2, columns...)); err != nil {
					return err
				}
			}
			if t >= 2 {
				if err := p.CreateItem(ctx, triples.Name, 1, broker.Last(3, columns...)); err != nil {
					return err
				}
			}
		}
		// The episode's chunks are now held by the items alone.
		if err := p.EndEpisode(ctx); err != nil {
			return err
		}
	}
	if err := p.Flush(ctx); err != nil {
		return err
	}
	return p.WaitApplied(ctx)
}
