package broker

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestFlowKeepsThePacedWindow: while the service paces inserts, its bound
// on unapplied items holds below the producer's own; a message larger than
// it still goes out alone, and the producer's own window is back once the
// service stops pacing.
func TestFlowKeepsThePacedWindow(t *testing.T) {
	f := newFlow(256, 4096)
	acquire := func(n int) bool {
		ok, _ := f.tryAcquire(n)
		return ok
	}
	f.setApplied(0, nil, 100)
	if !acquire(64) {
		t.Fatal("first message of 64 refused under a window of 100")
	}
	if acquire(64) {
		t.Fatal("128 items let out under a paced window of 100")
	}
	f.ack(1, 64, []string{"t"})
	f.setApplied(1, nil, 100)
	if !acquire(500) {
		t.Fatal("a message larger than the paced window refused with nothing unapplied")
	}
	if acquire(1) {
		t.Fatal("a message let out beside one over the paced window")
	}
	f.ack(2, 500, []string{"t"})
	f.setApplied(1, nil, 0) // not paced any more; message 2 not applied yet
	if !acquire(3000) {
		t.Fatal("3500 items refused under the producer's own window of 4096 once unpaced")
	}
	if acquire(1000) {
		t.Fatal("the producer's own window of 4096 not kept")
	}
}

// TestWaitReportsItemsOfUnknownOutcomeApart: items of a message given up
// on that JetStream may have stored are counted apart from those lost: a
// call that waited meanwhile reports them as ErrOutcomeUnknown, never
// ErrNotStored, even where another call took their error (Python twin:
// test_a_waiting_call_reports_items_of_unknown_outcome_apart).
func TestWaitReportsItemsOfUnknownOutcomeApart(t *testing.T) {
	f := newFlow(256, 4096)
	mark := f.failureMark()
	if ok, _ := f.tryAcquire(3); !ok {
		t.Fatal("no room in an empty window")
	}
	f.fail(3, fmt.Errorf("%w: message 1 (3 items): no ack", ErrOutcomeUnknown))
	if m := f.failureMark(); m.failedItems != 0 || m.unknownItems != 3 {
		t.Fatalf("after a message of 3 items given up on unanswered: %+v, want 0 lost and 3 unknown", m)
	}
	if err := f.takeErrors(); !errors.Is(err, ErrOutcomeUnknown) { // another call takes it
		t.Fatalf("the error taken: %v, want ErrOutcomeUnknown", err)
	}
	err := f.withLost(nil, mark)
	if !errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrNotStored) || !strings.Contains(err.Error(), "3 of this producer's items") {
		t.Fatalf("a wait during which 3 items were given up on unanswered: %v, want ErrOutcomeUnknown for 3 items and not ErrNotStored", err)
	}
	if err := f.withLost(nil, f.failureMark()); err != nil {
		t.Fatalf("a wait after the loss: %v, want nil", err)
	}
}
