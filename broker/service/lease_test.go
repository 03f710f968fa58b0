package service

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/reprise-rl/reprise/internal/testutil"
)

// leases opens n leases on one bucket of a real embedded server, each as
// its own service on its own connection.
func leases(t *testing.T, n int, ttl time.Duration) []*lease {
	t.Helper()
	url := testutil.StartEmbedded(t, 0)
	var out []*lease
	for i := range n {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		l, err := openLease(testutil.Context(t), js, "TEST_LEASE", 1, ttl, string(rune('a'+i)), testutil.QuietLogger())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

func mustAcquire(t *testing.T, l *lease, want bool) {
	t.Helper()
	ok, err := l.acquire(testutil.Context(t))
	if err != nil || ok != want {
		t.Fatalf("%s acquire = %t, %v; want %t", l.id, ok, err, want)
	}
}

func TestLeaseOneHolderAtATime(t *testing.T) {
	ls := leases(t, 2, time.Second)
	a, b := ls[0], ls[1]
	mustAcquire(t, a, true)
	mustAcquire(t, b, false)
	for range 3 {
		if err := a.renew(testutil.Context(t)); err != nil {
			t.Fatalf("renew: %v", err)
		}
		mustAcquire(t, b, false)
	}
	if !a.held() || b.held() {
		t.Fatalf("held: a %t, b %t; want a only", a.held(), b.held())
	}
	if a.epoch.Load() == 0 {
		t.Fatal("no epoch after acquiring")
	}
}

// The holder stops counting the lease as held before the server lets
// anyone else take it, and cannot renew it afterwards.
func TestLeaseLapses(t *testing.T) {
	ls := leases(t, 2, time.Second)
	a, b := ls[0], ls[1]
	mustAcquire(t, a, true)
	start := time.Now()
	var aHeldAtTakeOver bool
	testutil.WaitUntil(t, "b takes the lapsed lease", func() bool {
		held := a.held()
		ok, err := b.acquire(testutil.Context(t))
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		aHeldAtTakeOver = held
		return ok
	})
	t.Logf("lease taken over %v after the last write (TTL 1s)", time.Since(start).Round(time.Millisecond))
	if aHeldAtTakeOver || a.held() {
		t.Fatal("a still counted the lease as held when b took it")
	}
	if err := a.renew(testutil.Context(t)); !errors.Is(err, errLeaseLost) {
		t.Fatalf("renewing a lapsed lease: %v, want errLeaseLost", err)
	}
	if b.epoch.Load() <= a.epoch.Load() {
		t.Fatalf("epochs: a %d, b %d; want b's above", a.epoch.Load(), b.epoch.Load())
	}
}

func TestLeaseRelease(t *testing.T) {
	ls := leases(t, 2, time.Minute)
	a, b := ls[0], ls[1]
	mustAcquire(t, a, true)
	if err := a.release(testutil.Context(t)); err != nil {
		t.Fatal(err)
	}
	if a.held() {
		t.Fatal("a holds the lease it released")
	}
	mustAcquire(t, b, true)
}

// TestLeaseReleaseLapsedByItsClock: a holder whose renewals fell behind
// counts the lease lapsed a margin before the server does, and one whose
// renewal was cut short as it stopped does not know the key's revision.
// Either release left the key naming it, and standbys waited out the rest
// of the TTL to take over. Releasing deletes the key where it names the
// holder, and only there.
func TestLeaseReleaseLapsedByItsClock(t *testing.T) {
	ls := leases(t, 2, time.Minute)
	a, b := ls[0], ls[1]
	mustAcquire(t, a, true)
	a.drop() // its clock ran out; the server's has most of a minute left
	// And a renewal cut short as it stopped moved the revision on, its
	// answer lost.
	if _, err := a.kv.Update(testutil.Context(t), leaseKey, a.value(), a.rev); err != nil {
		t.Fatal(err)
	}
	if err := a.release(testutil.Context(t)); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, b, true)
	// b's lease now: a's release of its old revision must not touch it.
	a.rev = b.rev - 1
	if err := a.release(testutil.Context(t)); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, a, false)
}

// A renewal stored by the server whose answer was lost leaves the holder
// a revision behind: the next renewal finds its own value and goes on.
func TestLeaseRenewAfterLostAnswer(t *testing.T) {
	ls := leases(t, 1, time.Minute)
	a := ls[0]
	mustAcquire(t, a, true)
	if _, err := a.kv.Update(testutil.Context(t), leaseKey, []byte(a.id), a.rev); err != nil {
		t.Fatal(err)
	}
	if err := a.renew(testutil.Context(t)); err != nil {
		t.Fatalf("renew after a lost answer: %v", err)
	}
	if !a.held() {
		t.Fatal("lease not held after renewing")
	}
}

// Every service counts with the TTL the server applies.
func TestLeaseBucketTTLWins(t *testing.T) {
	url := testutil.StartEmbedded(t, 0)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := openLease(testutil.Context(t), js, "TEST_LEASE", 1, 2*time.Second, "a", testutil.QuietLogger()); err != nil {
		t.Fatal(err)
	}
	l, err := openLease(testutil.Context(t), js, "TEST_LEASE", 1, 10*time.Second, "b", testutil.QuietLogger())
	if err != nil {
		t.Fatal(err)
	}
	if l.ttl != 2*time.Second {
		t.Fatalf("ttl %v, want the bucket's 2s", l.ttl)
	}
}

func TestCheckpointNames(t *testing.T) {
	names := []string{checkpointName(0, 99999), checkpointName(2, 5), checkpointName(2, 40), checkpointName(10, 1)}
	for i := 1; i < len(names); i++ {
		if names[i-1] >= names[i] {
			t.Errorf("%q sorts after %q", names[i-1], names[i])
		}
	}
	for _, want := range [][2]uint64{{0, 99999}, {2, 5}, {10, 1}} {
		e, a, ok := parseCheckpointName(checkpointName(want[0], want[1]))
		if !ok || e != want[0] || a != want[1] {
			t.Errorf("parse(name(%d, %d)) = %d, %d, %t", want[0], want[1], e, a, ok)
		}
	}
	if _, _, ok := parseCheckpointName("checkpoint-x"); ok {
		t.Error("parsed a name reprise does not write")
	}
}
