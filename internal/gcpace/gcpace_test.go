package gcpace

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/internal/testutil"
)

func TestPercent(t *testing.T) {
	for _, tt := range []struct {
		live uint64
		want int
	}{
		{0, MaxPercent},
		{Headroom / 100, MaxPercent},
		{Headroom / 4, MaxPercent},
		{Headroom / 2, 200},
		{Headroom, 100},
		{3 * Headroom / 2, 66},
		{2 * Headroom, 50},
		{4 * Headroom, MinPercent},
		{100 * Headroom, MinPercent},
	} {
		if got := Percent(tt.live); got != tt.want {
			t.Errorf("Percent(%d) = %d, want %d", tt.live, got, tt.want)
		}
	}
}

// TestRunLowersGOGC: with a live heap past Headroom, Run sets the GOGC
// Percent gives, and puts the old one back when it returns.
func TestRunLowersGOGC(t *testing.T) {
	t.Setenv("GOGC", "")
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	keep := make([]byte, 3*Headroom/2)
	for i := 0; i < len(keep); i += 4096 {
		keep[i] = 1
	}
	runtime.GC() // so that the live heap counts it
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, 10*time.Millisecond, time.Hour)
	}()
	testutil.WaitUntil(t, "GOGC below 100", func() bool {
		g := gogc()
		return g < 100 && g >= MinPercent
	})
	cancel()
	<-done
	if got := gogc(); got != 100 {
		t.Fatalf("GOGC %d after Run returned, want the 100 it found", got)
	}
	runtime.KeepAlive(keep)
}

// TestRunRaisesGOGC: a small live heap gets MaxPercent, so that it is not
// marked again every few megabytes allocated.
func TestRunRaisesGOGC(t *testing.T) {
	t.Setenv("GOGC", "")
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	runtime.GC()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, 10*time.Millisecond, time.Hour)
	}()
	testutil.WaitUntil(t, "GOGC at MaxPercent", func() bool { return gogc() == MaxPercent })
	cancel()
	<-done
	if got := gogc(); got != 100 {
		t.Fatalf("GOGC %d after Run returned, want the 100 it found", got)
	}
}

func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// TestRestClock: memory goes back once per rest, only after restAfter of
// allocating below the resting rate, and a busy tick starts the rest over.
func TestRestClock(t *testing.T) {
	var r restClock
	t0 := time.Unix(1000, 0)
	const sec = time.Second
	steps := []struct {
		at        time.Duration // since t0, a tick of one second each
		allocated uint64
		want      bool
	}{
		{1 * sec, 0, false},
		{5 * sec, restingRate / 2, false},
		{11 * sec, 0, false},
		{12 * sec, 0, true}, // 12 s since the rest began at t0
		{13 * sec, 0, false},
		{20 * sec, 0, false},               // once per rest
		{21 * sec, 2 * restingRate, false}, // busy: a new rest starts after it
		{22 * sec, 0, false},
		{32 * sec, 0, false},
		{33 * sec, 0, true},
	}
	for _, s := range steps {
		if got := r.tick(t0.Add(s.at), s.allocated, sec, 12*sec); got != s.want {
			t.Errorf("tick at %v with %d bytes: %v, want %v", s.at, s.allocated, got, s.want)
		}
	}
}

// TestRunReturnsMemoryAtRest: garbage a burst left, which no collection
// has freed, goes back to the system once the process rests.
func TestRunReturnsMemoryAtRest(t *testing.T) {
	runtime.GC()
	before := released()
	burst := make([][]byte, 64)
	for i := range burst {
		burst[i] = make([]byte, 1<<20)
		for j := 0; j < len(burst[i]); j += 4096 {
			burst[i][j] = 1
		}
	}
	runtime.KeepAlive(burst)
	burst = nil
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, 10*time.Millisecond, 50*time.Millisecond)
	}()
	defer func() {
		cancel()
		<-done
	}()
	testutil.WaitUntil(t, "the burst's 64 MiB released", func() bool { return released() >= before+48<<20 })
}

func released() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
