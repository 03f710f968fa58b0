package crashtest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/internal/natstest"
)

// TestShardKill: a table spread over two reprised on one nats-server, under
// two sharded actors and a sharded learner. kill -9 of one shard's reprised:
// samples go on from the other shard meanwhile; after its restart every
// acknowledged insert and mutation is there, each on the shard its key
// names, exactly once.
func TestShardKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds reprised and nats-server and kills a shard")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv := natstest.Start(t)
	url := srv.URL()
	prefixes := []string{"shard0", "shard1"}
	cfg := writeConfig(t)
	var rs []*reprised
	var clients []*broker.Client
	for i, prefix := range prefixes {
		rs = append(rs, startReprised(t, "--config", cfg, "--nats", url, "--prefix", prefix, "--shard", fmt.Sprintf("%d/2", i), "--checkpoint-every", "300ms"))
		c, err := broker.NewClient(connect(t, url), broker.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		waitReady(t, c)
		clients = append(clients, c)
	}
	quiet := broker.WithLogger(slog.New(slog.DiscardHandler))
	sc, err := broker.NewShardedClient(connect(t, url), prefixes, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })

	l := newLedger()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for a := range int64(2) {
		p, err := broker.NewShardedProducer(ctx, connect(t, url), prefixes, broker.WithRetryFor(2*time.Minute), quiet)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { actor(ctx, p, l, done, a*1_000_000_000, 5*time.Second, 10) })
	}
	wg.Go(func() { learner(ctx, sc, l, done, 13) })
	stop := sync.OnceFunc(func() { close(done); wg.Wait() })
	t.Cleanup(stop)

	waitFor(t, "inserts acknowledged before the kill", func() bool { return l.ackedCount() >= 500 })
	rs[1].kill()
	waitFor(t, "a batch from shard 0 alone while shard 1 is down", func() bool {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		samples, err := sc.Sample(sctx, table, 16)
		if err != nil {
			return false
		}
		for _, s := range samples {
			if s.Info.Key%2 != 0 {
				return false
			}
		}
		return len(samples) == 16
	})
	rs[1].start()
	waitReady(t, clients[1])
	before := l.ackedCount()
	waitFor(t, "inserts acknowledged after the restart", func() bool { return l.ackedCount() >= before+300 })
	stop()

	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range clients {
		waitStreamNameApplied(ctx, t, js, c, "REPRISE_"+strings.ToUpper(prefixes[i]))
	}
	verify(t, l, clients...)
	info, err := sc.Info(ctx, table)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range info.Shards {
		if s.Tables[0].Size == 0 {
			t.Errorf("shard %d holds no items: episodes should alternate", i)
		}
	}
	if _, err := sc.Sample(ctx, table, 4); err != nil {
		t.Fatalf("sampling after the restart: %v", err)
	}
}
