//go:build unix

package config

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// claimWait bounds how long a claim of a checkpoint dir waits for another
// one. A claim holds the lock for a read and a write of a small file; one
// held longer belongs to a process stopped while it claimed (SIGSTOP, a
// hung disk), and waiting for it without end held back every start on the
// directory.
const claimWait = 30 * time.Second

// lockDir holds an exclusive lock on dir until the returned func is
// called, so that services starting together claim it one after another:
// replacing an empty owner file, or creating one in place, is otherwise
// seen half done by the other. Where the file system keeps no locks, it
// goes unlocked, as before. It waits for another holder until ctx ends or
// for claimWait, then fails with ErrCheckpointDirBusy.
func lockDir(ctx context.Context, dir string) (func(), error) {
	d, err := os.Open(dir)
	if err != nil {
		return func() {}, nil
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, claimWait)
	defer cancel()
	// flock has no deadline of its own: the lock is tried, not waited on.
	retry := time.Millisecond
	for {
		err = syscall.Flock(int(d.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return func() { d.Close() }, nil
		case errors.Is(err, syscall.EINTR):
			continue
		case !errors.Is(err, syscall.EWOULDBLOCK):
			d.Close()
			return func() {}, nil
		}
		t := time.NewTimer(retry)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			d.Close()
			return nil, fmt.Errorf("%w: checkpoint dir %s: another process holds its lock (a reprised claiming it, or one stopped while it did); gave up after %v: %w",
				ErrCheckpointDirBusy, dir, time.Since(start).Round(time.Millisecond), ctx.Err())
		}
		retry = min(2*retry, 100*time.Millisecond)
	}
}
