package broker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/internal/testutil"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/reprise-rl/reprise/internal/syncbuf"
	"github.com/reprise-rl/reprise/tables"
)

// TestProducerWaitsForTheStream: a producer started before the table
// service does not create the stream (an actor may not); it says what it
// waits for, and goes on once the service has created it.
func TestProducerWaitsForTheStream(t *testing.T) {
	url := testutil.StartEmbedded(t, 0)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var logs syncbuf.Buffer
	type result struct {
		p   *Producer
		err error
	}
	made := make(chan result, 1)
	go func() {
		p, err := NewProducer(testutil.Context(t), nc, WithPrefix("test"), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		made <- result{p, err}
	}()
	testutil.WaitUntil(t, "the producer says it waits for the stream", func() bool {
		return strings.Contains(logs.String(), "waiting for the table service to create the stream") &&
			strings.Contains(logs.String(), "stream=REPRISE_TEST")
	})
	select {
	case r := <-made:
		t.Fatalf("NewProducer returned before the stream existed: %v", r.err)
	default:
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(testutil.Context(t), "REPRISE_TEST"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("the waiting producer created the stream (or the look-up failed): %v", err)
	}

	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, url)
	r := <-made
	if r.err != nil {
		t.Fatalf("NewProducer: %v", r.err)
	}
	p := r.p
	ctx := testutil.Context(t)
	if err := p.Append(ctx, step(1, 2)); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "t", 1, LastStep("obs", "id")); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if tbl, _ := d.svc.Table("t"); tbl.Size() != 1 {
		t.Errorf("table holds %d items, want 1", tbl.Size())
	}
}

func TestProducerGivesUpWaitingForTheStream(t *testing.T) {
	nc, err := nats.Connect(testutil.StartEmbedded(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = NewProducer(ctx, nc, WithPrefix("nobody.here"), WithLogger(testutil.QuietLogger()))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "REPRISE_NOBODY_HERE") || !strings.Contains(err.Error(), `prefix "nobody.here"`) {
		t.Fatalf("NewProducer without a service = %v, want a deadline error naming the stream and the prefix", err)
	}
}
