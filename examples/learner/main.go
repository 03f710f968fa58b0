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
	// is checked. Each comes stacked, one tensor a column, as a training
	// step takes it.
	s, err := c.NewBatchSampler(*table, *batch, broker.WithInFlight(2))
	if err != nil {
		return err
	}
	defer s.Close()
	sampled := 0
	episodes := map[float32]bool{}
	for sampled < *want {
		b, err := s.Next(ctx)
		if err != nil {
			return fmt.Errorf("after %d items: %w", sampled, err)
		}
		obsColumn, _ := b.Column("obs")
		actionColumn, _ := b.Column("action")
		obs, err := obsColumn.Float32s()
		if err != nil {
			return err
		}
		actions, err := actionColumn.Int64s()
		if err != nil {
			return err
		}
		n := int64(b.Len())
		if !slices.Equal(obsColumn.Shape, []int64{n, 3, 4}) || !slices.Equal(actionColumn.Shape, []int64{n, 3}) {
			return fmt.Errorf("a batch of %d: obs of shape %v, actions of shape %v; want [%d 3 4] and [%d 3]", n, obsColumn.Shape, actionColumn.Shape, n, n)
		}
		// Row i of each column is item i's three steps.
		for i, key := range b.Info.Keys {
			row, acts := obs[12*i:12*(i+1)], actions[3*i:3*(i+1)]
			for k := range 3 {
				ep, t := row[4*k], row[4*k+1]
				if ep != row[0] || t != row[1]+float32(k) || acts[k] != int64(t)%4 {
					return fmt.Errorf("item %d: step %d is (episode %v, t %v, action %d), not the next step of episode %v", key, k, ep, t, acts[k], row[0])
				}
			}
			episodes[row[0]] = true
		}
		sampled += b.Len()
	}
	fmt.Fprintf(stdout, "learner: sampled %d items from %d episodes of table %q; each is 3 consecutive steps of one episode: ok\n", sampled, len(episodes), *table)
	return nil
}
