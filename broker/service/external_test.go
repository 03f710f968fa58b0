package service

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/internal/testutil"

	"github.com/reprise-rl/reprise/broker"

	"github.com/reprise-rl/reprise/internal/natstest"
	"github.com/reprise-rl/reprise/tables"
)

// TestExternalServer runs the data path against a separate nats-server
// process built from the module proxy, and kills that process with SIGKILL
// in the middle of the run: producers reconnect and resend what was not
// acknowledged, the dedupe ids keep resends from inserting twice, and a
// learner draining a Queue table sees every item exactly once, in order.
// The service keeps running across the restart.
func TestExternalServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a nats-server process")
	}
	srv := natstest.Start(t)
	d := deploy(t, []tables.Config{tables.QueueConfig("queue", 1000), testutil.UniformTable("uniform", 1000)}, deployOptions{url: srv.URL()})
	ctx := testutil.Context(t)
	p := d.producer(broker.WithRetryFor(time.Minute))
	c := d.client() // before the kill: connecting during it would fail
	const total = 400
	killed := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range int64(total) {
			if i == total/2 {
				srv.Kill()
				srv.Restart(t)
				close(killed)
			}
			actx, cancel := context.WithTimeout(ctx, time.Minute)
			err := p.Append(actx, broker.Step{"id": broker.Int64s(nil, []int64{i})})
			if err == nil {
				err = p.CreateItem(actx, "queue", 1, broker.LastStep("id"))
			}
			if err == nil && i%50 == 0 {
				err = p.CreateItem(actx, "uniform", 1, broker.LastStep("id"))
			}
			cancel()
			if err != nil {
				t.Errorf("step %d: %v", i, err)
				return
			}
		}
		if err := p.Flush(ctx); err != nil {
			t.Errorf("flush: %v", err)
		}
	}()
	// A sample whose reply is cut off by the kill would lose its items (as
	// in Reverb), so the learner drains once the server is back.
	<-killed
	next := int64(0)
	for next < total {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		samples, err := c.Sample(sctx, "queue", 10, broker.Flexible())
		cancel()
		if err != nil {
			t.Logf("sample after %d items: %v", next, err)
			continue
		}
		for _, s := range samples {
			id := ids(t, s)[0]
			if id != next {
				t.Fatalf("queue delivered item %d, want %d: an item was lost or duplicated across the server restart", id, next)
			}
			next++
		}
	}
	wg.Wait()
	info, err := c.Info(ctx, "uniform")
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Tables[0].Size; got != total/50 {
		t.Fatalf("uniform table holds %d items, want %d", got, total/50)
	}
}
