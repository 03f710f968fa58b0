package broker_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// startReprise runs what `go run ./cmd/reprised` runs, in this process: an
// embedded NATS server and a table service with one uniform table,
// "replay", sampled from its first item. It returns a connection to the
// server and a function that stops both.
func startReprise() (*nats.Conn, func()) {
	return startServices(nil)
}

// startServices runs an embedded NATS server and a table service as
// startReprise does for each of the option lists given.
func startServices(services ...[]service.Option) (*nats.Conn, func()) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "reprise-example")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := embeddednats.Start(ctx, embeddednats.WithStoreDir(dir), embeddednats.WithoutListener())
	if err != nil {
		log.Fatal(err)
	}
	connect := func() *nats.Conn {
		nc, err := srv.Connect()
		if err != nil {
			log.Fatal(err)
		}
		return nc
	}
	replay := tables.Config{
		Name: "replay", MaxSize: 1000, Limiter: limiter.MinSize(1),
		Sampler: selectors.Options{Kind: selectors.KindUniform}, Remover: selectors.Options{Kind: selectors.KindFifo},
	}
	runCtx, stop := context.WithCancel(ctx)
	var stops []func()
	for _, opts := range services {
		svcConn := connect()
		svc, err := service.New(svcConn, []tables.Config{replay}, append(opts, service.WithoutFinalCheckpoint())...)
		if err != nil {
			log.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- svc.Run(runCtx) }()
		stops = append(stops, func() { <-done; svcConn.Close() })
	}
	nc := connect()
	return nc, func() {
		nc.Close()
		stop()
		for _, f := range stops {
			f()
		}
		srv.Shutdown(ctx)
		os.RemoveAll(dir)
	}
}

// An actor writes an episode of 10 steps and makes an item of each window
// of 3 consecutive steps; the items share the steps' chunks.
func ExampleProducer() {
	nc, stop := startReprise()
	defer stop()
	ctx := context.Background()

	p, err := broker.NewProducer(ctx, nc, broker.WithChunkLength(4))
	if err != nil {
		log.Fatal(err)
	}
	for t := range int64(10) {
		obs := broker.Float32s([]int64{2}, []float32{float32(t), -float32(t)})
		if err := p.Append(ctx, broker.Step{"obs": obs, "action": broker.Int64s(nil, []int64{t % 3})}); err != nil {
			log.Fatal(err)
		}
		if t >= 2 {
			if err := p.CreateItem(ctx, "replay", 1.0, broker.Last(3, "obs", "action")); err != nil {
				log.Fatal(err)
			}
		}
	}
	if err := p.EndEpisode(ctx); err != nil {
		log.Fatal(err)
	}
	// WaitApplied returns once the service holds every item (Flush once
	// JetStream stored them, which makes them durable).
	if err := p.WaitApplied(ctx); err != nil {
		log.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		log.Fatal(err)
	}

	c, err := broker.NewClient(nc)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	info, err := c.Info(ctx, "replay")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("items in replay:", info.Tables[0].Size)
	// Output: items in replay: 8
}

// A learner samples a batch, reads a column of each item, and lowers the
// priority of what it sampled.
func ExampleClient_Sample() {
	nc, stop := startReprise()
	defer stop()
	ctx := context.Background()
	insertSteps(ctx, nc, 5)

	c, err := broker.NewClient(nc)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// Sample waits for the table's rate limiter as long as ctx allows.
	batch, err := c.Sample(ctx, "replay", 4)
	if err != nil {
		log.Fatal(err)
	}
	var updates []tables.PriorityUpdate
	var shape []int64
	for _, s := range batch {
		obs, _ := s.Column("obs")
		shape = obs.Shape
		values, err := obs.Float32s()
		if err != nil {
			log.Fatal(err)
		}
		if values[0] < 0 || values[0] > 4 {
			log.Fatalf("obs %v is not one of the inserted steps", values)
		}
		updates = append(updates, tables.PriorityUpdate{Key: s.Info.Key, Priority: 0.5})
	}
	if err := c.UpdatePriorities(ctx, "replay", updates...); err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(batch), "items, obs of shape", shape)
	// Output: 4 items, obs of shape [2]
}

// A Sampler keeps requests in flight so that the next batch is on its way
// while the learner trains on this one.
func ExampleClient_NewSampler() {
	nc, stop := startReprise()
	defer stop()
	ctx := context.Background()
	insertSteps(ctx, nc, 5)

	c, err := broker.NewClient(nc)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSampler("replay", 8, broker.WithInFlight(2))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	for range 3 {
		batch, err := s.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("a batch of", len(batch))
	}
	// Output:
	// a batch of 8
	// a batch of 8
	// a batch of 8
}

// SampleBatch stacks the items, one tensor a column, as a learner trains
// on them: the obs of 8 one-step items make one tensor of shape [8, 2].
func ExampleClient_SampleBatch() {
	nc, stop := startReprise()
	defer stop()
	ctx := context.Background()
	insertSteps(ctx, nc, 5)

	c, err := broker.NewClient(nc)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	batch, err := c.SampleBatch(ctx, "replay", 8)
	if err != nil {
		log.Fatal(err)
	}
	obs, _ := batch.Column("obs")
	values, err := obs.Float32s()
	if err != nil {
		log.Fatal(err)
	}
	// Row i is item i's obs, [t, -t].
	rowsAgree := true
	for i := range batch.Len() {
		rowsAgree = rowsAgree && values[2*i] == -values[2*i+1]
	}
	fmt.Println(batch.Len(), "items, obs of shape", obs.Shape, "rows agree:", rowsAgree)
	// Output: 8 items, obs of shape [8 2] rows agree: true
}

// insertSteps writes n one-step items whose obs is [t, -t].
func insertSteps(ctx context.Context, nc *nats.Conn, n int64) {
	p, err := broker.NewProducer(ctx, nc)
	if err != nil {
		log.Fatal(err)
	}
	for t := range n {
		if err := p.Append(ctx, broker.Step{"obs": broker.Float32s([]int64{2}, []float32{float32(t), -float32(t)})}); err != nil {
			log.Fatal(err)
		}
		if err := p.CreateItem(ctx, "replay", 1, broker.LastStep("obs")); err != nil {
			log.Fatal(err)
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		log.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		log.Fatal(err)
	}
}

// A table spread over two shards: two table services with their own
// prefixes (reprised --prefix shard0 --shard 0/2, and shard1 1/2). The
// actor's episodes go to the shards in turn; the learner samples the whole
// table, each item with its probability in the whole table.
func ExampleShardedClient() {
	prefixes := []string{"shard0", "shard1"}
	nc, stop := startServices(
		[]service.Option{service.WithPrefix(prefixes[0]), service.WithShard(service.Shard{Index: 0, Count: 2})},
		[]service.Option{service.WithPrefix(prefixes[1]), service.WithShard(service.Shard{Index: 1, Count: 2})},
	)
	defer stop()
	ctx := context.Background()

	p, err := broker.NewShardedProducer(ctx, nc, prefixes)
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close(ctx)
	for episode := range int64(4) {
		for t := range int64(5) {
			if err := p.Append(ctx, broker.Step{"t": broker.Int64s(nil, []int64{episode*10 + t})}); err != nil {
				log.Fatal(err)
			}
			if err := p.CreateItem(ctx, "replay", 1.0, broker.LastStep("t")); err != nil {
				log.Fatal(err)
			}
		}
		if err := p.EndEpisode(ctx); err != nil {
			log.Fatal(err)
		}
	}

	c, err := broker.NewShardedClient(nc, prefixes)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	info, err := c.Info(ctx, "replay")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d items: %d on shard 0, %d on shard 1\n", info.Tables[0].Size, info.Shards[0].Tables[0].Size, info.Shards[1].Tables[0].Size)
	samples, err := c.Sample(ctx, "replay", 8)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("each sampled with probability 1/%.0f in a table of %d\n", 1/samples[0].Info.Probability, samples[0].Info.TableSize)
	// Output:
	// 20 items: 10 on shard 0, 10 on shard 1
	// each sampled with probability 1/20 in a table of 20
}
