package service

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/reprise-rl/reprise/internal/testutil"
)

// TestRequestWorkersReuseGoroutines: requests one after another run on a
// few goroutines, not one each; requests at once each get one; stop waits
// for the jobs in progress and then refuses more.
func TestRequestWorkersReuseGoroutines(t *testing.T) {
	w := newRequestWorkers()
	stacks := map[uintptr]bool{}
	for range 200 {
		done := make(chan uintptr)
		if !w.run(func() {
			var here byte
			done <- uintptr(unsafe.Pointer(&here))
		}) {
			t.Fatal("run refused before stop")
		}
		stacks[<-done] = true
	}
	// Each job leaves its worker idle by the time the next but one comes:
	// at most a few workers, where a goroutine each would make 200.
	if len(stacks) > 20 {
		t.Fatalf("200 jobs one after another ran on %d stacks", len(stacks))
	}

	const parallel = 16
	var running atomic.Int32
	var release sync.WaitGroup
	release.Add(1)
	finished := make(chan struct{}, parallel)
	for range parallel {
		w.run(func() {
			running.Add(1)
			release.Wait()
			finished <- struct{}{}
		})
	}
	// None ends before all have started: they cannot share workers.
	testutil.WaitUntil(t, "16 jobs running at once", func() bool { return running.Load() == parallel })
	stopped := make(chan struct{})
	go func() { w.stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while jobs ran")
	default:
	}
	release.Done()
	<-stopped
	if len(finished) != parallel {
		t.Fatalf("%d of %d jobs finished when stop returned", len(finished), parallel)
	}
	if w.run(func() { t.Error("a job ran after stop") }) {
		t.Fatal("run took a job after stop")
	}
}

// TestLazyDeadline: the deadline a sample waits under, made when first
// asked for, ends the wait at its time or with its parent, and carries the
// parent's values.
func TestLazyDeadline(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	at := time.Now().Add(20 * time.Millisecond)
	l := &lazyDeadline{parent: parent, at: at}
	if d, ok := l.Deadline(); !ok || !d.Equal(at) {
		t.Fatalf("deadline %v, %v; want %v", d, ok, at)
	}
	if l.Value(key{}) != "v" {
		t.Fatal("the parent's value is lost")
	}
	select {
	case <-l.Done():
	case <-time.After(time.Minute):
		t.Fatal("no end by the deadline")
	}
	if !errors.Is(l.Err(), context.DeadlineExceeded) {
		t.Fatalf("err %v, want DeadlineExceeded", l.Err())
	}
	l.stop()

	l = &lazyDeadline{parent: parent, at: time.Now().Add(time.Hour)}
	done := l.Done()
	cancel()
	<-done
	if !errors.Is(l.Err(), context.Canceled) {
		t.Fatalf("err %v, want Canceled with the parent", l.Err())
	}
	l.stop()
	unused := &lazyDeadline{parent: context.Background(), at: time.Now()}
	unused.stop()
	if unused.Err() != nil {
		t.Fatal("a deadline stopped before it was made ended")
	}
}
