package service

import (
	"errors"
	"strings"
	"testing"

	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/tables"
)

// TestReplyBoundHeldForARequestThatWaited: a sample request is measured
// against limits.max_reply_bytes at the table's largest item when its
// samples are taken, not only when it arrives. A learner that asked an
// empty table for 11 items (any number fits a table of no items) was
// served 11 items of 10,000 bytes once they came, a reply over the bound
// of 10 such items, counted against the limiter.
func TestReplyBoundHeldForARequestThatWaited(t *testing.T) {
	limits := DefaultLimits()
	limits.MaxItemBytes, limits.MaxReplyBytes = 20_000, 110_000
	cfg := testutil.TableConfig("t", selectors.Options{Kind: selectors.KindUniform}, selectors.Options{Kind: selectors.KindFifo}, 100, limiter.MinSize(10))
	d := deploy(t, []tables.Config{cfg}, deployOptions{service: []Option{WithLimits(limits)}})
	ctx := testutil.Context(t)
	c := d.client()
	tb, _ := d.svc.Table("t")
	done := make(chan error, 1)
	go func() {
		_, err := c.Sample(ctx, "t", 11)
		done <- err
	}()
	testutil.WaitUntil(t, "the request waits for the table's limiter", func() bool { return tb.Counters().SampleWaits > 0 })
	insertSteps(t, d.producer(), 0, 10, 2498) // 10,000 bytes a step
	if err := <-done; !errors.Is(err, protocol.ErrResourceExhausted) || !strings.Contains(err.Error(), "ask for at most 10") {
		t.Fatalf("a sample of 11 that waited for items of 10,000 bytes: %v, want ErrResourceExhausted saying at most 10", err)
	}
	if n := tb.Counters().Samples; n != 0 {
		t.Fatalf("the table counted %d samples for a refused request, want 0", n)
	}
}

// TestSampleWaitingAtShutdownIsUnavailable: a sample waiting for a table's
// rate limiter when the service stops is told the service is shutting
// down (CodeUnavailable: a sharded learner then samples the other shards),
// not that the limiter allowed nothing within the request's whole wait.
func TestSampleWaitingAtShutdownIsUnavailable(t *testing.T) {
	cfg := testutil.TableConfig("t", selectors.Options{Kind: selectors.KindUniform}, selectors.Options{Kind: selectors.KindFifo}, 100, limiter.MinSize(10))
	d := deploy(t, []tables.Config{cfg}, deployOptions{})
	c := d.client()
	tb, _ := d.svc.Table("t")
	done := make(chan error, 1)
	go func() {
		_, err := c.Sample(testutil.Context(t), "t", 1)
		done <- err
	}()
	testutil.WaitUntil(t, "the request waits for the table's limiter", func() bool { return tb.Counters().SampleWaits > 0 })
	d.stop()
	err := <-done
	var se *protocol.StatusError
	if !errors.As(err, &se) || se.Code != protocol.CodeUnavailable || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("a sample waiting as the service stops: %v, want CodeUnavailable saying it is shutting down", err)
	}
}
