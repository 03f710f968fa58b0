package config

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestCheckpointDirOwnerLeftEmpty: the owner file is written without a
// sync, and where the file system has no hard links it is created before
// it is written. A crash or power cut then leaves it empty, and every
// start after refused the directory as another prefix's (prefix ""),
// until an operator deleted the file by hand. An empty owner file names
// no prefix: the directory is claimed as if it had none.
func TestCheckpointDirOwnerLeftEmpty(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, checkpointOwner), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := claimCheckpointDir(context.Background(), dir, "p0"); err != nil {
		t.Fatalf("claiming a checkpoint dir whose owner file a crash left empty: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(dir, checkpointOwner))
	if err != nil || string(got) != "p0" {
		t.Fatalf("owner file after the claim: %q, %v; want \"p0\"", got, err)
	}
	if err := claimCheckpointDir(context.Background(), dir, "p1"); err == nil {
		t.Fatal("another prefix claimed the dir once p0 owned it")
	}
}

// TestCheckpointDirOwnerLeftEmptyClaimedOnce: two services of different
// prefixes started together on a dir whose owner file a crash left empty
// must not both claim it; one of them is refused.
func TestCheckpointDirOwnerLeftEmptyClaimedOnce(t *testing.T) {
	for trial := range 100 {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, checkpointOwner), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		const n = 4
		start := make(chan struct{})
		errs := make(chan error, n)
		for i := range n {
			go func() {
				<-start
				errs <- claimCheckpointDir(context.Background(), dir, fmt.Sprintf("p%d", i))
			}()
		}
		close(start)
		claimed := 0
		for range n {
			if <-errs == nil {
				claimed++
			}
		}
		if claimed != 1 {
			got, _ := os.ReadFile(filepath.Join(dir, checkpointOwner))
			t.Fatalf("trial %d: %d of %d prefixes claimed the dir (owner file now %q); want 1", trial, claimed, n, got)
		}
	}
}
