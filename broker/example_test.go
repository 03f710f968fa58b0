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
	svcConn := connect()
	svc, err := service.New(svcConn, []tables.Config{replay}, service.WithoutFinalCheckpoint())
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	nc := connect()
	return nc, func() {
		nc.Close()
		stop()
		<-done
		svcConn.Close()
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
