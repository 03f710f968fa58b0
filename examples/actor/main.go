// Actor is one half of a two-process setup: it plays episodes of a toy
// environment and publishes 3-step trajectories to a running reprised;
// examples/learner, started separately, samples them. The two processes
// share nothing but the NATS server.
//
//	go run ./cmd/reprised           # terminal 1
//	go run ./examples/learner       # terminal 2
//	go run ./examples/actor         # terminal 3
//
// Against a reprised whose server has users, pass the credentials of a
// user with the actor role: --user NAME (with --password or $NATS_PASSWORD),
// or --nkey SEED_FILE; and --tls-ca FILE when the server uses TLS.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/internal/natsconn"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "actor:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("actor", flag.ContinueOnError)
	var conn natsconn.Config
	fs.StringVar(&conn.URL, "nats", natsconn.DefaultURL, "`URL` of the NATS server of a running reprised")
	conn.RegisterAuth(fs)
	prefix := fs.String("prefix", broker.DefaultPrefix, "subject `prefix` of that reprised")
	table := fs.String("table", "replay", "`table` to write to")
	episodes := fs.Int("episodes", 20, "episodes to play")
	steps := fs.Int("steps", 50, "steps per episode")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := conn.Check(); err != nil {
		return err
	}
	nc, err := conn.Connect("reprise-actor")
	if err != nil {
		return err
	}
	defer nc.Close()
	p, err := broker.NewProducer(ctx, nc, broker.WithPrefix(*prefix))
	if err != nil {
		return err
	}
	items := 0
	for ep := range *episodes {
		for t := range *steps {
			// A toy environment: the observation says where the step is,
			// so the learner can check what it receives.
			obs := []float32{float32(ep), float32(t), float32(math.Sin(float64(t))), float32(math.Cos(float64(t)))}
			action := int64(t % 4)
			reward := float32(0)
			if action == 0 {
				reward = 1
			}
			step := broker.Step{
				"obs":    broker.Float32s([]int64{4}, obs),
				"action": broker.Int64s(nil, []int64{action}),
				"reward": broker.Float32s(nil, []float32{reward}),
			}
			if err := p.Append(ctx, step); err != nil {
				return err
			}
			if t >= 2 {
				if err := p.CreateItem(ctx, *table, 1, broker.Last(3, "obs", "action", "reward")); err != nil {
					return err
				}
				items++
			}
		}
		if err := p.EndEpisode(ctx); err != nil {
			return err
		}
	}
	// Flush returns once JetStream has stored every item: they are durable.
	if err := p.Flush(ctx); err != nil {
		return err
	}
	if err := p.Close(ctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "actor: published %d items (3 steps each) from %d episodes to table %q; all acknowledged\n", items, *episodes, *table)
	return nil
}
