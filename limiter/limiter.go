package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
)

// ErrRateLimited is wrapped, together with the context's error, by a wait
// that its context ended before the limiter allowed it.
var ErrRateLimited = errors.New("limiter: rate limited")

// ErrInvalidCount is returned for a negative count, a count that would
// overflow a counter, and counters that no limiter could have reached.
var ErrInvalidCount = errors.New("limiter: invalid count")

// State is everything a limiter holds; it is what a table snapshot stores and
// what Restore takes back.
type State struct {
	Config  Config `json:"config"`
	Inserts int64  `json:"inserts"`
	Samples int64  `json:"samples"`
	Deletes int64  `json:"deletes"`
	// Offset is added to inserts*SamplesPerInsert - samples wherever the
	// inequality reads it: Reconfigure sets it so that a new
	// samples_per_insert weighs the inserts to come, not those already
	// made. Without it, changing the ratio after a long run moves the
	// difference by (new - old)*inserts, and one side waits until the
	// other has made up for the whole history. It is a whole number, so
	// the differences the limiter can reach are those Validate reasons
	// about (see stall); 0 until a Reconfigure changes the ratio.
	Offset float64 `json:"offset,omitempty"`
}

// canInsert is the insert half of the inequality. The size test is written
// as n <= MinSize - size so that no sum of counts can overflow.
func (s *State) canInsert(n int64) bool {
	if !fits(s.Inserts, n) {
		return false
	}
	if n <= s.Config.MinSize-(s.Inserts-s.Deletes) {
		return true
	}
	return s.diff(s.Inserts+n) <= s.Config.MaxDiff
}

// canSample is the sample half of the inequality.
func (s *State) canSample(n int64) bool {
	return fits(s.Samples, n) &&
		s.Inserts-s.Deletes >= s.Config.MinSize &&
		s.diff(s.Inserts)-float64(n) >= s.Config.MinDiff
}

// diff is inserts*SamplesPerInsert - samples (plus Offset) for a count of
// inserts.
func (s *State) diff(inserts int64) float64 {
	return float64(inserts)*s.Config.SamplesPerInsert - float64(s.Samples) + s.Offset
}

// fits reports whether n is a count that may be added to counter: no limiter
// state ever allows a negative count or one that would wrap the counter.
func fits(counter, n int64) bool {
	return n >= 0 && n <= math.MaxInt64-counter
}

func (s State) validate() error {
	if err := s.Config.Validate(); err != nil {
		return err
	}
	switch {
	case s.Inserts < 0 || s.Samples < 0 || s.Deletes < 0:
		return fmt.Errorf("%w: counters must be >= 0, got inserts=%d samples=%d deletes=%d",
			ErrInvalidCount, s.Inserts, s.Samples, s.Deletes)
	case s.Deletes > s.Inserts:
		return fmt.Errorf("%w: deletes (%d) > inserts (%d): more items removed than inserted",
			ErrInvalidCount, s.Deletes, s.Inserts)
	case math.IsInf(s.Offset, 0) || math.Trunc(s.Offset) != s.Offset:
		return fmt.Errorf("%w: offset must be a finite whole number, got %v", ErrInvalidCount, s.Offset)
	}
	return nil
}

// Limiter decides whether a table may insert or sample now, and records the
// inserts, samples and deletes it lets through. It is safe for concurrent use.
//
// A table calls TryInsert and TrySample while holding its own lock (the
// limiter's lock nests inside it, and the limiter never calls out while
// holding it), drops its lock and waits on the returned channel when refused.
// Callers without a lock of their own use WaitInsert and WaitSample.
//
// Create Limiters with New: the zero Limiter has an invalid Config.
type Limiter struct {
	mu sync.Mutex
	st State
	// changed is closed and cleared at the next change of st. It exists only
	// while somebody was refused, so that admitted operations never allocate.
	changed chan struct{}
}

// New returns a limiter with cfg and zero counters.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Limiter{st: State{Config: cfg}}, nil
}

// CanInsert reports whether n inserts would be allowed now. A negative n is
// never allowed.
func (l *Limiter) CanInsert(n int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st.canInsert(int64(n))
}

// CanSample reports whether n samples would be allowed now. A negative n is
// never allowed.
func (l *Limiter) CanSample(n int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st.canSample(int64(n))
}

// TryInsert records n inserts and returns (true, nil) if they are allowed.
// Otherwise it records nothing and returns false and a channel that is closed
// at the next change of the limiter's state (a counter, Reconfigure, Reset or
// Restore); the refusal and the channel come from one critical section, so a
// change between them cannot be missed. The channel is nil when n can never
// be allowed (n < 0, or the insert counter would overflow).
func (l *Limiter) TryInsert(n int) (ok bool, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.st.canInsert(int64(n)) {
		return false, l.refuse(l.st.Inserts, n)
	}
	if n > 0 {
		l.st.Inserts += int64(n)
		l.notify()
	}
	return true, nil
}

// TrySample is TryInsert for samples.
func (l *Limiter) TrySample(n int) (ok bool, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.st.canSample(int64(n)) {
		return false, l.refuse(l.st.Samples, n)
	}
	if n > 0 {
		l.st.Samples += int64(n)
		l.notify()
	}
	return true, nil
}

// TrySampleUpTo records as many samples as are allowed now, up to n, one
// at a time as n calls of TrySample(1) would, under one lock: a table
// drawing a batch asks once, not once an item. When it records fewer than
// n it also returns the channel TrySample(1) would for the next.
func (l *Limiter) TrySampleUpTo(n int) (got int, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for got < n && l.st.canSample(1) {
		l.st.Samples++
		got++
	}
	if got > 0 {
		l.notify()
	}
	if got < n {
		changed = l.refuse(l.st.Samples, 1)
	}
	return got, changed
}

// WaitInsert blocks until n inserts are allowed and records them, or until
// ctx ends. If they are allowed at once they are recorded even when ctx is
// already done, so an expired context means "try once".
func (l *Limiter) WaitInsert(ctx context.Context, n int) error {
	return l.wait(ctx, l.TryInsert, "insert", n)
}

// WaitSample is WaitInsert for samples.
func (l *Limiter) WaitSample(ctx context.Context, n int) error {
	return l.wait(ctx, l.TrySample, "sample", n)
}

func (l *Limiter) wait(ctx context.Context, try func(int) (bool, <-chan struct{}), op string, n int) error {
	for {
		ok, changed := try(n)
		if ok {
			return nil
		}
		if changed == nil {
			return fmt.Errorf("%w: %s %d can never be allowed (counts must be >= 0 and fit the counters)", ErrInvalidCount, op, n)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			s := l.State()
			return fmt.Errorf("%w: %s %d not allowed (inserts=%d samples=%d deletes=%d): %w",
				ErrRateLimited, op, n, s.Inserts, s.Samples, s.Deletes, ctx.Err())
		}
	}
}

// Delete records n removals of items: evictions, items that reached their
// max times sampled, explicit deletes. It may let inserts through. A
// non-positive n is ignored, and deletes never exceed inserts: the limiter
// cannot have lost more items than it admitted.
func (l *Limiter) Delete(n int) {
	if n <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	d := min(int64(n), l.st.Inserts-l.st.Deletes)
	if d == 0 {
		return
	}
	l.st.Deletes += d
	l.notify()
}

// Reconfigure replaces the config and keeps the counters. A new
// samples_per_insert applies to the inserts to come: the difference
// inserts*samples_per_insert - samples goes on from its current value
// (rounded to a whole number), so min_diff and max_diff bound the traffic
// from now on instead of asking one side to make up the whole history
// first. Waiters re-check at once.
func (l *Limiter) Reconfigure(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.st = l.st.Rebased(cfg)
	l.notify()
	return nil
}

// Rebased is s under cfg as Reconfigure puts it: a new samples_per_insert
// weighs the inserts to come, the difference going on from its value under
// s's config. For a state restored under another config than the one it
// was counted under (a checkpoint's refused limiter, replaced).
func (s State) Rebased(cfg Config) State {
	if spi := s.Config.SamplesPerInsert; cfg.SamplesPerInsert != spi {
		inserts := float64(s.Inserts)
		offset := math.Round(s.Offset + inserts*spi - inserts*cfg.SamplesPerInsert)
		if math.IsInf(offset, 0) || math.IsNaN(offset) {
			// inserts*ratio overflowed: there is no current difference to
			// go on from, so the counters are read as they are.
			offset = 0
		}
		s.Offset = offset
	}
	s.Config = cfg
	return s
}

// Reset sets the counters to zero, as for an emptied table. Waiters re-check
// at once.
func (l *Limiter) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.st = State{Config: l.st.Config}
	l.notify()
}

// State returns a consistent snapshot of the config and counters.
func (l *Limiter) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st
}

// Restore replaces config and counters with s, typically from a snapshot.
// Waiters re-check at once.
func (l *Limiter) Restore(s State) error {
	if err := s.validate(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.st = s
	l.notify()
	return nil
}

// refuse returns the channel a refused caller waits on, creating it on first
// need. Must hold l.mu.
func (l *Limiter) refuse(counter int64, n int) <-chan struct{} {
	if !fits(counter, int64(n)) {
		return nil
	}
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return l.changed
}

// notify wakes everyone waiting for a change. Must hold l.mu.
func (l *Limiter) notify() {
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}
