//go:build unix

package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCheckpointDirClaimWhileLocked: a claim waited on the dir's lock
// without end, so a process stopped (SIGSTOP) while it claimed the dir held
// back every start on it for ever. The claim now gives up when its context
// ends, with an error naming the dir and that another process holds it.
func TestCheckpointDirClaimWhileLocked(t *testing.T) {
	dir := t.TempDir()
	held, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := syscall.Flock(int(held.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Skipf("the file system keeps no locks: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = claimCheckpointDir(ctx, dir, "p0")
	if !errors.Is(err, ErrCheckpointDirBusy) || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "another process holds its lock") {
		t.Fatalf("claim of a dir another process holds locked: %v; want ErrCheckpointDirBusy naming %s and its holder", err, dir)
	}
	if _, err := os.Stat(filepath.Join(dir, checkpointOwner)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("owner file after the refused claim: %v; want none", err)
	}
	// Once the holder lets go, the dir is claimed.
	held.Close()
	if err := claimCheckpointDir(context.Background(), dir, "p0"); err != nil {
		t.Fatalf("claim once the lock was let go: %v", err)
	}
}
