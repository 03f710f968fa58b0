// Package testutil holds the helpers the broker's and the table service's
// tests share: a quiet logger, bounded contexts, waiting on conditions, an
// embedded NATS server per test, and table configs.
package testutil

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// QuietLogger keeps expected warnings (rejections in the garbage tests) out
// of test output unless -v is set.
func QuietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.DiscardHandler)
}

// Context ends two minutes from now or with the test.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// WaitUntil polls cond until it holds, failing the test after a generous
// deadline.
func WaitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-tick.C
	}
}

// StartEmbedded runs an embedded NATS server on a free loopback port for the
// test and returns its client URL. maxPayload 0 keeps the default; extra
// options (users, say) are added.
func StartEmbedded(t testing.TB, maxPayload int32, extra ...embeddednats.Option) string {
	t.Helper()
	opts := []embeddednats.Option{embeddednats.WithStoreDir(t.TempDir()), embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithLogger(QuietLogger())}
	if maxPayload > 0 {
		opts = append(opts, embeddednats.WithMaxPayload(maxPayload))
	}
	srv, err := embeddednats.Start(Context(t), append(opts, extra...)...)
	if err != nil {
		t.Fatalf("starting embedded NATS: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutting down NATS: %v", err)
		}
	})
	return srv.ClientURL()
}

// TableConfig is a table with the given selectors, size and limiter.
func TableConfig(name string, sampler, remover selectors.Options, maxSize int64, lim limiter.Config) tables.Config {
	return tables.Config{Name: name, Sampler: sampler, Remover: remover, MaxSize: maxSize, Limiter: lim}
}

// UniformTable samples uniformly, removes the oldest first and samples from
// its first item on.
func UniformTable(name string, maxSize int64) tables.Config {
	return TableConfig(name, selectors.Options{Kind: selectors.KindUniform}, selectors.Options{Kind: selectors.KindFifo}, maxSize, limiter.MinSize(1))
}

// Obs is the "obs" vector of step i in the tests' episodes, whose "id" is
// i itself: a sampled item's ids tell which steps it came from, and
// CheckObs checks its obs against them.
func Obs(i int64, obsLen int) []float32 {
	obs := make([]float32, obsLen)
	for j := range obs {
		obs[j] = float32(i) + float32(j)/1000
	}
	return obs
}

// CheckObs checks that a sampled item's obs values are what Obs gives for
// each of its ids.
func CheckObs(t testing.TB, ids []int64, obs []float32, obsLen int) {
	t.Helper()
	if len(obs) != len(ids)*obsLen {
		t.Fatalf("obs has %d values for %d steps of %d", len(obs), len(ids), obsLen)
	}
	for k, i := range ids {
		for j, want := range Obs(i, obsLen) {
			if got := obs[k*obsLen+j]; got != want {
				t.Fatalf("step %d obs[%d] = %v, want %v", i, j, got, want)
			}
		}
	}
}
