package limiter

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// refCanInsert and refCanSample are REFERENCE.md's inequality written out
// as plainly as possible, for counts small enough not to overflow.
func refCanInsert(s State, n int64) bool {
	if n < 0 {
		return false
	}
	if s.Inserts+n-s.Deletes <= s.Config.MinSize {
		return true
	}
	return float64(s.Inserts+n)*s.Config.SamplesPerInsert-float64(s.Samples) <= s.Config.MaxDiff
}

func refCanSample(s State, n int64) bool {
	if n < 0 {
		return false
	}
	return s.Inserts-s.Deletes >= s.Config.MinSize &&
		float64(s.Inserts)*s.Config.SamplesPerInsert-float64(s.Samples)-float64(n) >= s.Config.MinDiff
}

func newLimiter(t testing.TB, cfg Config) *Limiter {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return l
}

func TestInequality(t *testing.T) {
	ratio2 := mustRatio(t, 2, 10, 4)     // min_diff 16, max_diff 24
	ratioHalf := mustRatio(t, 0.5, 4, 2) // min_diff 0, max_diff 4
	type counts struct{ inserts, samples, deletes int64 }
	tests := []struct {
		name      string
		cfg       Config
		at        counts
		n         int
		canInsert bool
		canSample bool
	}{
		{"MinSize empty: inserts up to min_size are free", MinSize(3), counts{0, 0, 0}, 3, true, false},
		{"MinSize below min_size", MinSize(3), counts{2, 0, 0}, 1, true, false},
		{"MinSize at min_size", MinSize(3), counts{3, 0, 0}, 1, true, true},
		{"MinSize never limits samples", MinSize(3), counts{3, 1e6, 0}, 100, true, true},
		{"MinSize deletes drop below min_size", MinSize(3), counts{3, 5, 1}, 1, true, false},
		{"MinSize n=0", MinSize(3), counts{0, 0, 0}, 0, true, false},
		{"MinSize n<0", MinSize(3), counts{5, 0, 0}, -1, false, false},

		{"spi 2: below min_size", ratio2, counts{9, 0, 0}, 1, true, false},
		{"spi 2: free insert stops at min_size", ratio2, counts{9, 0, 0}, 3, true, false},
		{"spi 2: past max_diff", ratio2, counts{9, 0, 0}, 4, false, false},
		{"spi 2: at min_size, sample to min_diff", ratio2, counts{10, 0, 0}, 2, true, true},
		{"spi 2: sample to exactly min_diff", ratio2, counts{10, 0, 0}, 4, false, true},
		{"spi 2: sample past min_diff", ratio2, counts{10, 0, 0}, 5, false, false},
		{"spi 2: insert to max_diff exactly", ratio2, counts{12, 4, 0}, 2, true, true},
		{"spi 2: full", ratio2, counts{12, 0, 0}, 1, false, true},
		{"spi 2: samples make room", ratio2, counts{12, 2, 0}, 1, true, true},
		{"spi 2: deletes make room below min_size", ratio2, counts{12, 0, 3}, 1, true, false},
		{"spi 2: deletes free only up to min_size", ratio2, counts{12, 0, 3}, 2, false, false},

		{"spi 0.5: at min_size", ratioHalf, counts{4, 0, 0}, 2, true, true},
		{"spi 0.5: one sample too many", ratioHalf, counts{4, 0, 0}, 3, true, false},
		{"spi 0.5: insert to max_diff", ratioHalf, counts{8, 2, 0}, 4, true, false},
		{"spi 0.5: insert past max_diff", ratioHalf, counts{8, 2, 0}, 5, false, false},
		{"spi 0.5: below min_size", ratioHalf, counts{3, 0, 0}, 1, true, false},

		{"Queue empty", Queue(3), counts{0, 0, 0}, 1, true, false},
		{"Queue fill at once", Queue(3), counts{0, 0, 0}, 3, true, false},
		{"Queue overfill", Queue(3), counts{0, 0, 0}, 4, false, false},
		{"Queue full", Queue(3), counts{3, 0, 0}, 1, false, true},
		{"Queue drain all", Queue(3), counts{3, 0, 0}, 3, false, true},
		{"Queue never more samples than inserts", Queue(3), counts{3, 0, 0}, 4, false, false},
		{"Queue sampled and deleted", Queue(3), counts{3, 1, 1}, 1, true, true},
		{"Queue sampled and deleted, 2", Queue(3), counts{3, 1, 1}, 2, false, true},
		{"Queue empty again", Queue(3), counts{3, 3, 3}, 3, true, false},
		{"Queue(1) full", Queue(1), counts{1, 0, 0}, 1, false, true},
		{"Queue(1) sampled, not yet deleted", Queue(1), counts{1, 1, 0}, 1, true, false},
		{"Queue(1) deleted", Queue(1), counts{1, 1, 1}, 1, true, false},
		{"Stack full", Stack(2), counts{2, 0, 0}, 1, false, true},
		{"Stack room", Stack(2), counts{2, 1, 1}, 1, true, true},
	}
	for _, tt := range tests {
		s := State{Config: tt.cfg, Inserts: tt.at.inserts, Samples: tt.at.samples, Deletes: tt.at.deletes}
		if got := refCanInsert(s, int64(tt.n)); got != tt.canInsert {
			t.Fatalf("%s: the test's reference says CanInsert=%v, the row says %v", tt.name, got, tt.canInsert)
		}
		if got := refCanSample(s, int64(tt.n)); got != tt.canSample {
			t.Fatalf("%s: the test's reference says CanSample=%v, the row says %v", tt.name, got, tt.canSample)
		}
		l := newLimiter(t, tt.cfg)
		if err := l.Restore(s); err != nil {
			t.Fatalf("%s: Restore: %v", tt.name, err)
		}
		if got := l.CanInsert(tt.n); got != tt.canInsert {
			t.Errorf("%s: CanInsert(%d) = %v, want %v", tt.name, tt.n, got, tt.canInsert)
		}
		if got := l.CanSample(tt.n); got != tt.canSample {
			t.Errorf("%s: CanSample(%d) = %v, want %v", tt.name, tt.n, got, tt.canSample)
		}

		ok, _ := l.TryInsert(tt.n)
		want := s
		if ok {
			want.Inserts += int64(tt.n)
		}
		if ok != tt.canInsert || l.State() != want {
			t.Errorf("%s: TryInsert(%d) = %v, state %+v; want %v, state %+v", tt.name, tt.n, ok, l.State(), tt.canInsert, want)
		}
		if err := l.Restore(s); err != nil {
			t.Fatal(err)
		}
		ok, _ = l.TrySample(tt.n)
		want = s
		if ok {
			want.Samples += int64(tt.n)
		}
		if ok != tt.canSample || l.State() != want {
			t.Errorf("%s: TrySample(%d) = %v, state %+v; want %v, state %+v", tt.name, tt.n, ok, l.State(), tt.canSample, want)
		}
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	l, err := New(Config{SamplesPerInsert: 1})
	if l != nil || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New(min_size 0) = %v, %v; want nil, ErrInvalidConfig", l, err)
	}
}

func TestCountsOutOfRange(t *testing.T) {
	l := newLimiter(t, MinSize(1))
	for _, try := range []func(int) (bool, <-chan struct{}){l.TryInsert, l.TrySample} {
		if ok, ch := try(-1); ok || ch != nil {
			t.Errorf("Try(-1) = %v, %v; want false, nil", ok, ch)
		}
	}
	if err := l.Restore(State{Config: MinSize(1), Inserts: math.MaxInt64 - 1, Samples: math.MaxInt64 - 1}); err != nil {
		t.Fatal(err)
	}
	if l.CanInsert(2) || l.CanSample(2) {
		t.Error("a count that overflows a counter is allowed")
	}
	if ok, ch := l.TryInsert(2); ok || ch != nil {
		t.Errorf("TryInsert(overflow) = %v, %v; want false, nil", ok, ch)
	}
	ctx := t.Context()
	for name, err := range map[string]error{
		"WaitInsert(-1)":       l.WaitInsert(ctx, -1),
		"WaitSample(-3)":       l.WaitSample(ctx, -3),
		"WaitSample(overflow)": l.WaitSample(ctx, 2),
	} {
		if !errors.Is(err, ErrInvalidCount) || errors.Is(err, ErrRateLimited) {
			t.Errorf("%s = %v, want ErrInvalidCount", name, err)
		}
	}
	if ok, _ := l.TryInsert(1); !ok {
		t.Error("TryInsert(1) refused just below the counter's limit")
	}
}

func TestDelete(t *testing.T) {
	l := newLimiter(t, Queue(2))
	l.Delete(1) // nothing inserted: nothing to delete
	l.Delete(-4)
	if ok, _ := l.TryInsert(2); !ok {
		t.Fatal("TryInsert(2) on an empty Queue(2) refused")
	}
	l.Delete(5)
	if got := l.State(); got.Deletes != 2 {
		t.Errorf("after Delete(5) of 2 items: deletes = %d, want 2", got.Deletes)
	}
	// Deleting every item frees the min_size zone again, however far the
	// counters have run.
	if ok, _ := l.TryInsert(1); !ok {
		t.Error("TryInsert(1) refused after every item was deleted")
	}
}

func TestReconfigureKeepsCounters(t *testing.T) {
	l := newLimiter(t, Queue(2))
	if ok, _ := l.TryInsert(2); !ok {
		t.Fatal("TryInsert(2) refused")
	}
	if err := l.Reconfigure(Config{SamplesPerInsert: 0}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Reconfigure(invalid) = %v, want ErrInvalidConfig", err)
	}
	if got := l.State(); got.Config != Queue(2) {
		t.Fatalf("a rejected Reconfigure changed the config to %+v", got.Config)
	}
	if err := l.Reconfigure(Queue(5)); err != nil {
		t.Fatal(err)
	}
	if want := (State{Config: Queue(5), Inserts: 2}); l.State() != want {
		t.Errorf("State = %+v, want %+v", l.State(), want)
	}
	if !l.CanInsert(3) || l.CanInsert(4) {
		t.Error("Queue(5) holding 2 items should allow exactly 3 more inserts")
	}
}

func TestRestoreValidates(t *testing.T) {
	l := newLimiter(t, MinSize(1))
	tests := []struct {
		s    State
		is   error
		want string
	}{
		{State{Config: Config{}}, ErrInvalidConfig, "samples_per_insert"},
		{State{Config: MinSize(1), Inserts: -1}, ErrInvalidCount, "counters must be >= 0, got inserts=-1 samples=0 deletes=0"},
		{State{Config: MinSize(1), Samples: -1}, ErrInvalidCount, "counters must be >= 0"},
		{State{Config: MinSize(1), Inserts: 2, Deletes: 3}, ErrInvalidCount, "deletes (3) > inserts (2)"},
	}
	for _, tt := range tests {
		err := l.Restore(tt.s)
		if !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Restore(%+v) = %v, want %v containing %q", tt.s, err, tt.is, tt.want)
		}
	}
	if want := (State{Config: MinSize(1)}); l.State() != want {
		t.Errorf("rejected Restores changed the state to %+v", l.State())
	}
	good := State{Config: Queue(9), Inserts: 7, Samples: 3, Deletes: 2}
	if err := l.Restore(good); err != nil || l.State() != good {
		t.Errorf("Restore(%+v) = %v, state %+v", good, err, l.State())
	}
	l.Reset()
	if want := (State{Config: Queue(9)}); l.State() != want {
		t.Errorf("after Reset: %+v, want %+v", l.State(), want)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestChangedChannel(t *testing.T) {
	l := newLimiter(t, Queue(1))
	if ok, ch := l.TryInsert(1); !ok || ch != nil {
		t.Fatalf("TryInsert(1) = %v, %v; want true, nil", ok, ch)
	}
	ok, ch := l.TryInsert(1)
	if ok || ch == nil {
		t.Fatalf("TryInsert(1) on a full queue = %v, %v; want false and a channel", ok, ch)
	}
	if _, ch2 := l.TryInsert(1); ch2 != ch {
		t.Error("a second refusal before any change returned a different channel")
	}
	// Reading and non-changes do not close it.
	l.CanInsert(1)
	l.CanSample(1)
	l.State()
	l.Delete(0)
	if ok, _ := l.TryInsert(0); !ok {
		t.Error("TryInsert(0) refused")
	}
	if isClosed(ch) {
		t.Fatal("channel closed without a change of state")
	}
	changes := []struct {
		name   string
		change func()
	}{
		{"TrySample", func() { l.TrySample(1) }},
		{"Delete", func() { l.Delete(1) }},
		{"TryInsert", func() { l.TryInsert(1) }},
		{"Reconfigure", func() { l.Reconfigure(Queue(1)) }},
		{"Restore", func() { l.Restore(State{Config: Queue(1), Inserts: 1}) }},
		{"Reset", func() { l.Reset() }},
	}
	for _, c := range changes {
		// Make sure somebody is waiting: a refusal of an impossible sample
		// size hands out the current channel.
		_, ch := l.TrySample(1 << 20)
		c.change()
		if !isClosed(ch) {
			t.Errorf("%s did not close the changed channel", c.name)
		}
	}
}

func TestFastPathDoesNotAllocate(t *testing.T) {
	l := newLimiter(t, MinSize(1))
	allocs := testing.AllocsPerRun(1000, func() {
		l.TryInsert(1)
		l.TrySample(1)
		l.Delete(1)
	})
	if allocs != 0 {
		t.Errorf("TryInsert+TrySample+Delete allocate %v times per run, want 0", allocs)
	}
}

// waiting reports whether somebody was refused since the last change: a
// waiter is then parked on (or about to select on) l.changed.
func waiting(l *Limiter) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed != nil
}

// waitUntil waits for cond with a generous deadline, yielding the processor
// in between.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		runtime.Gosched()
	}
}

// startWait runs wait in a goroutine owned by the test and returns its result
// channel; the test waits for the result before it ends.
func startWait(t *testing.T, wait func() error) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() { done <- wait() })
	t.Cleanup(wg.Wait)
	return done
}

func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("waiter did not return")
		return nil
	}
}

func assertBlocked(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("waiter returned %v while the limiter forbids it", err)
	default:
	}
}

func TestWaitWakesOnChange(t *testing.T) {
	ctx := t.Context()
	tests := []struct {
		name    string
		cfg     Config
		setup   State // counters before the wait
		wait    func(*Limiter) error
		nudge   func(*Limiter) // a change that does not allow the wait yet
		release func(*Limiter) // the change that allows it
		want    State          // counters after the wait
	}{
		{
			name:    "WaitSample wakes on inserts",
			cfg:     MinSize(2),
			wait:    func(l *Limiter) error { return l.WaitSample(ctx, 1) },
			nudge:   func(l *Limiter) { l.TryInsert(1) },
			release: func(l *Limiter) { l.TryInsert(1) },
			want:    State{Config: MinSize(2), Inserts: 2, Samples: 1},
		},
		{
			name:    "WaitInsert wakes on samples",
			cfg:     Queue(2),
			setup:   State{Config: Queue(2), Inserts: 2},
			wait:    func(l *Limiter) error { return l.WaitInsert(ctx, 2) },
			nudge:   func(l *Limiter) { l.TrySample(1) },
			release: func(l *Limiter) { l.TrySample(1) },
			want:    State{Config: Queue(2), Inserts: 4, Samples: 2},
		},
		{
			name:    "WaitInsert wakes on deletes",
			cfg:     MinSize(2).withMaxDiff(2),
			setup:   State{Config: MinSize(2).withMaxDiff(2), Inserts: 2},
			wait:    func(l *Limiter) error { return l.WaitInsert(ctx, 1) },
			nudge:   func(l *Limiter) { l.Reconfigure(MinSize(2).withMaxDiff(2)) },
			release: func(l *Limiter) { l.Delete(1) },
			want:    State{Config: MinSize(2).withMaxDiff(2), Inserts: 3, Deletes: 1},
		},
		{
			name:    "Reconfigure unblocks and keeps counters",
			cfg:     Queue(1),
			setup:   State{Config: Queue(1), Inserts: 1},
			wait:    func(l *Limiter) error { return l.WaitInsert(ctx, 2) },
			nudge:   func(l *Limiter) { l.Reconfigure(Queue(2)) },
			release: func(l *Limiter) { l.Reconfigure(Queue(3)) },
			want:    State{Config: Queue(3), Inserts: 3},
		},
		{
			name:    "Reset unblocks",
			cfg:     Queue(1),
			setup:   State{Config: Queue(1), Inserts: 1},
			wait:    func(l *Limiter) error { return l.WaitInsert(ctx, 1) },
			nudge:   func(l *Limiter) { l.Reconfigure(Queue(1)) },
			release: func(l *Limiter) { l.Reset() },
			want:    State{Config: Queue(1), Inserts: 1},
		},
		{
			name:    "Restore unblocks",
			cfg:     MinSize(3),
			wait:    func(l *Limiter) error { return l.WaitSample(ctx, 2) },
			nudge:   func(l *Limiter) { l.Restore(State{Config: MinSize(3), Inserts: 2}) },
			release: func(l *Limiter) { l.Restore(State{Config: MinSize(3), Inserts: 7, Samples: 1, Deletes: 4}) },
			want:    State{Config: MinSize(3), Inserts: 7, Samples: 3, Deletes: 4},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLimiter(t, tt.cfg)
			if tt.setup.Config != (Config{}) {
				if err := l.Restore(tt.setup); err != nil {
					t.Fatal(err)
				}
			}
			done := startWait(t, func() error { return tt.wait(l) })
			waitUntil(t, "the waiter is refused", func() bool { return waiting(l) })
			tt.nudge(l)
			// The nudge changed the state; the waiter must re-check, be
			// refused again and go back to waiting.
			waitUntil(t, "the waiter is refused again", func() bool { return waiting(l) })
			assertBlocked(t, done)
			tt.release(l)
			if err := result(t, done); err != nil {
				t.Fatalf("wait: %v", err)
			}
			if got := l.State(); got != tt.want {
				t.Errorf("state = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func (c Config) withMaxDiff(d float64) Config {
	c.MaxDiff = d
	return c
}

func TestWaitContextEnds(t *testing.T) {
	t.Run("deadline", func(t *testing.T) {
		l := newLimiter(t, Queue(1))
		l.TryInsert(1)
		ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
		defer cancel()
		err := l.WaitInsert(ctx, 1)
		if !errors.Is(err, ErrRateLimited) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrRateLimited and DeadlineExceeded", err)
		}
		const want = "limiter: rate limited: insert 1 not allowed (inserts=1 samples=0 deletes=0): context deadline exceeded"
		if err.Error() != want {
			t.Errorf("err = %q, want %q", err, want)
		}
		if got := l.State(); got.Inserts != 1 {
			t.Errorf("a timed-out wait recorded inserts: %+v", got)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		l := newLimiter(t, MinSize(5))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := startWait(t, func() error { return l.WaitSample(ctx, 3) })
		waitUntil(t, "the waiter is refused", func() bool { return waiting(l) })
		cancel()
		err := result(t, done)
		if !errors.Is(err, ErrRateLimited) || !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want ErrRateLimited and Canceled", err)
		}
		if want := "sample 3 not allowed (inserts=0 samples=0 deletes=0)"; !strings.Contains(err.Error(), want) {
			t.Errorf("err = %q, want it to contain %q", err, want)
		}
	})
	t.Run("done context tries once", func(t *testing.T) {
		l := newLimiter(t, Queue(1))
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := l.WaitInsert(ctx, 1); err != nil {
			t.Errorf("allowed WaitInsert with a done context = %v, want nil", err)
		}
		if err := l.WaitInsert(ctx, 1); !errors.Is(err, ErrRateLimited) || !errors.Is(err, context.Canceled) {
			t.Errorf("refused WaitInsert with a done context = %v, want ErrRateLimited and Canceled", err)
		}
		if got := l.State(); got.Inserts != 1 {
			t.Errorf("inserts = %d, want 1", got.Inserts)
		}
	})
}

// TestConcurrentSampleToInsertRatio runs producers and consumers against one
// limiter and checks every state they observe. Once min_size items are in,
// an insert is only admitted if it leaves inserts*spi - samples <= max_diff
// and a sample only if it leaves it >= min_diff, and nothing else moves it
// (no deletes here), so every snapshot must lie in [min_diff, max_diff]: the
// achieved samples stay within error_buffer of (inserts - min_size)*spi.
func TestConcurrentSampleToInsertRatio(t *testing.T) {
	tests := []struct {
		spi                  float64
		minSize              int64
		errorBuffer          float64
		maxInsert, maxSample int // batch sizes drawn uniformly from [1, max]
		producers, consumers int
		inserts              int64
	}{
		// The window 2*error_buffer is at least maxInsert*spi + maxSample,
		// so a refused producer and a refused consumer cannot coexist.
		{spi: 1, minSize: 10, errorBuffer: 1, maxInsert: 1, maxSample: 1, producers: 4, consumers: 4, inserts: 2000},
		{spi: 0.25, minSize: 5, errorBuffer: 1, maxInsert: 2, maxSample: 1, producers: 3, consumers: 5, inserts: 4000},
		{spi: 4, minSize: 3, errorBuffer: 6, maxInsert: 2, maxSample: 3, producers: 5, consumers: 3, inserts: 1000},
	}
	if testing.Short() {
		for i := range tests {
			tests[i].inserts /= 4
		}
	}
	for i, tt := range tests {
		cfg := mustRatio(t, tt.spi, tt.minSize, tt.errorBuffer)
		l := newLimiter(t, cfg)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		// Samples stop where the last insert leaves them: as many as keep
		// inserts*spi - samples >= min_diff.
		sampleBudget := int64(math.Floor(float64(tt.inserts)*tt.spi - cfg.MinDiff))
		var insertsLeft, samplesLeft atomic.Int64
		insertsLeft.Store(tt.inserts)
		samplesLeft.Store(sampleBudget)
		var violations atomic.Int64
		check := func(s State) {
			d := float64(s.Inserts)*s.Config.SamplesPerInsert - float64(s.Samples)
			bad := s.Inserts < s.Config.MinSize && s.Samples != 0 ||
				s.Inserts >= s.Config.MinSize && (d < s.Config.MinDiff || d > s.Config.MaxDiff)
			if bad && violations.Add(1) == 1 {
				t.Errorf("case %d: observed %+v: inserts*spi - samples = %v outside [%v, %v]",
					i, s, d, s.Config.MinDiff, s.Config.MaxDiff)
			}
		}
		// claim takes up to most from left, or returns 0 when nothing is left.
		claim := func(left *atomic.Int64, most int64) int64 {
			for {
				have := left.Load()
				n := min(have, most)
				if n == 0 || left.CompareAndSwap(have, have-n) {
					return n
				}
			}
		}
		var wg sync.WaitGroup
		run := func(id int, most int, wait func(context.Context, int) error, left *atomic.Int64) {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(id)))
			wg.Go(func() {
				for {
					n := claim(left, int64(1+rng.IntN(most)))
					if n == 0 {
						return
					}
					if err := wait(ctx, int(n)); err != nil {
						t.Errorf("case %d: %v", i, err)
						return
					}
					check(l.State())
				}
			})
		}
		for p := range tt.producers {
			run(p, tt.maxInsert, l.WaitInsert, &insertsLeft)
		}
		for c := range tt.consumers {
			run(tt.producers+c, tt.maxSample, l.WaitSample, &samplesLeft)
		}
		wg.Wait()
		cancel()

		final := l.State()
		if final.Inserts != tt.inserts || final.Samples != sampleBudget {
			t.Errorf("case %d: final %+v, want inserts=%d samples=%d", i, final, tt.inserts, sampleBudget)
		}
		// The achieved ratio samples/(inserts - min_size) is within
		// error_buffer/(inserts - min_size) of spi; compared before dividing
		// so that rounding cannot push an edge case out.
		span := float64(final.Inserts - tt.minSize)
		if off := float64(final.Samples) - span*tt.spi; math.Abs(off) > tt.errorBuffer {
			t.Errorf("case %d: samples per insert past min_size = %v, want %v ± %v",
				i, float64(final.Samples)/span, tt.spi, tt.errorBuffer/span)
		}
	}
}

// TestConcurrentQueue drives Queue(size) the way a table with max times
// sampled 1 does: every sample is followed by the delete of the sampled item,
// and waits go through the changed channel. Every item must be sampled
// exactly once and the queue never holds more than size unsampled items.
func TestConcurrentQueue(t *testing.T) {
	const size, items, producers, consumers = 5, 3000, 3, 3
	l := newLimiter(t, Queue(size))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var insertsLeft, samplesLeft atomic.Int64
	insertsLeft.Store(items)
	samplesLeft.Store(items)
	var refusals, violations atomic.Int64
	var wg sync.WaitGroup
	run := func(left *atomic.Int64, try func(int) (bool, <-chan struct{}), after func()) {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				for {
					ok, changed := try(1)
					if ok {
						break
					}
					refusals.Add(1)
					select {
					case <-changed:
					case <-ctx.Done():
						t.Errorf("queue stalled: %+v", l.State())
						return
					}
				}
				after()
				s := l.State()
				if (s.Samples > s.Inserts || s.Inserts-s.Samples > size || s.Deletes > s.Samples) && violations.Add(1) == 1 {
					t.Errorf("observed %+v: want deletes <= samples <= inserts <= samples+%d", s, size)
				}
			}
		})
	}
	for range producers {
		run(&insertsLeft, l.TryInsert, func() {})
	}
	for range consumers {
		run(&samplesLeft, l.TrySample, func() { l.Delete(1) })
	}
	wg.Wait()
	if want := (State{Config: Queue(size), Inserts: items, Samples: items, Deletes: items}); l.State() != want {
		t.Errorf("final %+v, want %+v", l.State(), want)
	}
	t.Logf("%d refusals", refusals.Load())
}
