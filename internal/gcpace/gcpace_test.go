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
		{0, 100},
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
		Run(ctx, 10*time.Millisecond)
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

func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}
