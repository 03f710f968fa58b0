package service

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
)

// retryJS calls f until it succeeds, fails for good, or ctx ends. A
// cluster answers JetStream API calls only once it has a meta leader, and a
// call it takes while electing one (a stream's or bucket's leader, say)
// may go unanswered until its deadline: both are worth trying again. Two
// services creating the same replicated stream at once meet that too. It
// says what it waits for, once and then every few seconds.
func retryJS(ctx context.Context, log *slog.Logger, what string, f func(context.Context) error) error {
	const (
		first   = 100 * time.Millisecond
		longest = time.Second
		every   = 5 * time.Second
	)
	wait, logged := first, time.Time{}
	for attempt := 1; ; attempt++ {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || !(protocol.RetryableJSError(err) || errors.Is(err, context.DeadlineExceeded)) {
			return err
		}
		if time.Since(logged) >= every {
			log.Warn("reprise service: waiting for JetStream", "for", what, "attempt", attempt, "error", err)
			logged = time.Now()
		}
		if !pause(ctx, wait) {
			return err
		}
		wait = min(2*wait, longest)
	}
}

// pause waits d, or until ctx ends, and says whether it waited d whole.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
