// Learner is the other half of examples/actor: a separate process that
// samples batches of 3-step trajectories from a running reprised, checks
// that each is three consecutive steps of one episode, and stops after a
// given number of items.
//
//	go run ./cmd/reprised           # terminal 1
//	go run ./examples/learner       # terminal 2
//	go run ./examples/actor         # terminal 3
//
// Against a reprised whose server has users, pass the credentials of a
// user with the learner role: --user NAME (with --password or $NATS_PASSWORD),
// or --nkey SEED_FILE; and --tls-ca FILE when the server uses TLS.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/internal/natsconn"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "learner:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("learner", flag.ContinueOnError)
	var conn natsconn.Config
	fs.StringVar(&conn.URL, "nats", natsconn.DefaultURL, "`URL` of the NATS server of a running reprised")
	conn.RegisterAuth(fs)
	prefix := fs.String("prefix", broker.DefaultPrefix, "subject `prefix` of that reprised")
	table := fs.String("table", "replay", "`table` to sample")
	want := fs.Int("items", 1000, "stop after sampling this many items")
	batch := fs.Int("batch", 32, "items per sample request")
	wait := fs.Duration("wait", 2*time.Minute, "give up if the items do not arrive within this `time`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	if err := conn.Check(); err != nil {
		return err
	}
	nc, err := conn.Connect("reprise-learner")
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := broker.NewClient(nc, broker.WithPrefix(*prefix))
	if err != nil {
		return err
	}
	defer c.Close()
	// Two requests in flight: the next batch is on its way while this one
	// is checked.
	s, err := c.NewSampler(*table, *batch, broker.WithInFlight(2))
	if err != nil {
		return err
	}
	defer s.Close()
	sampled := 0
	episodes := map[float32]bool{}
	for sampled < *want {
		items, err := s.Next(ctx)
		if err != nil {
			return fmt.Errorf("after %d items: %w", sampled, err)
		}
		for _, it := range items {
			obsColumn, _ := it.Column("obs")
			actionColumn, _ := it.Column("action")
			obs, err := obsColumn.Float32s()
			if err != nil {
				return err
			}
			actions, err := actionColumn.Int64s()
			if err != nil {
				return err
			}
			if !slices.Equal(obsColumn.Shape, []int64{3, 4}) || len(actions) != 3 {
				return fmt.Errorf("item %d: obs shape %v, %d actions; want [3 4] and 3", it.Info.Key, obsColumn.Shape, len(actions))
			}
			for k := range 3 {
				ep, t := obs[4*k], obs[4*k+1]
				if ep != obs[0] || t != obs[1]+float32(k) || actions[k] != int64(t)%4 {
					return fmt.Errorf("item %d: step %d is (episode %v, t %v, action %d), not the next step of episode %v", it.Info.Key, k, ep, t, actions[k], obs[0])
				}
			}
			episodes[obs[0]] = true
		}
		sampled += len(items)
	}
	fmt.Fprintf(stdout, "learner: sampled %d items from %d episodes of table %q; each is 3 consecutive steps of one episode: ok\n", sampled, len(episodes), *table)
	return nil
}
