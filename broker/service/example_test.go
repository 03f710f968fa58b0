package service_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// A table service on an in-process NATS server: one uniform table of up to
// a million items, sampled once it holds 1,000. Run serves until its
// context ends, then writes a final checkpoint and returns.
// (Info asked before the service serves fails at once, as NATS has no
// responder yet: a learner retries, as this one does.)
func ExampleNew() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "reprise-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := embeddednats.Start(ctx, embeddednats.WithStoreDir(dir), embeddednats.WithoutListener())
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	nc, err := srv.Connect()
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	replay := tables.Config{
		Name:    "replay",
		Sampler: selectors.Options{Kind: selectors.KindUniform},
		Remover: selectors.Options{Kind: selectors.KindFifo},
		MaxSize: 1_000_000,
		Limiter: limiter.MinSize(1000),
	}
	svc, err := service.New(nc, []tables.Config{replay}, service.WithPrefix("example"))
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()

	// A learner's client sees the table once the service serves it.
	c, err := broker.NewClient(nc, broker.WithPrefix("example"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	info, err := c.Info(ctx, "replay")
	for ; err != nil; info, err = c.Info(ctx, "replay") {
		time.Sleep(50 * time.Millisecond) // not serving yet: NATS has no responder
	}
	fmt.Println("serving", info.Tables[0].Name, "sampled by", info.Tables[0].Sampler)
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output: serving replay sampled by uniform
}
