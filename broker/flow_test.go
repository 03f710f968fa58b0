package broker

import "testing"

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
