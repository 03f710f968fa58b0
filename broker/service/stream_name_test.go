package service

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
)

// TestPrefixSharingAStreamName: prefixes that differ only in case, '.',
// '-' or '_' name the same stream (REPRISE_TEST for "test" and "TEST").
// A service of the second must refuse the stream, not take it over by
// rewriting its subjects, which left the first deployment's producers
// with no stream to publish to, and would have served the second from the
// first's checkpoints.
func TestPrefixSharingAStreamName(t *testing.T) {
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 1000)}, deployOptions{})
	p := d.producer()
	insertSteps(t, p, 0, 5, 4)

	other, err := New(d.connect(), []tables.Config{testutil.UniformTable("t", 1000)}, WithPrefix("TEST"), WithLogger(testutil.QuietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = other.Run(ctx)
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "test.data.>") {
		t.Fatalf("a service of prefix TEST on the stream of prefix test: Run returned %v, want an error naming the stream's subjects", err)
	}
	insertSteps(t, p, 5, 10, 4)
}
