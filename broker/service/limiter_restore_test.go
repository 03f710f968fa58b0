package service

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/tables"
)

// TestRestoreReplacingARefusedLimiterKeepsTheDifference: a checkpoint's
// rate limiter this release refuses is replaced by the config file's, which
// is a change of samples_per_insert like any other: the new ratio must
// weigh the inserts to come, as Reconfigure makes it, not the checkpoint's
// whole history. The counters were read with the new ratio: after 1e6
// inserts at 1 sample each, a config of 2 held inserts off for ~1e6 samples.
func TestRestoreReplacingARefusedLimiterKeepsTheDifference(t *testing.T) {
	cfg := testutil.UniformTable("t", 10)
	var err error
	if cfg.Limiter, err = limiter.SampleToInsertRatio(2, 1, 20); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(testutil.StartEmbedded(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	svc, err := New(nc, []tables.Config{cfg}, WithLogger(testutil.QuietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	old := cfg
	old.Limiter = limiter.Config{SamplesPerInsert: 1, MinSize: 1, MinDiff: 0, MaxDiff: 0}
	if old.Limiter.Validate() == nil {
		t.Fatal("the old limiter is accepted: the test shows nothing")
	}
	cfgJSON, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	const history = 1_000_000
	saved := limiter.State{Config: old.Limiter, Inserts: history, Samples: history, Deletes: history}
	limJSON, err := json.Marshal(saved)
	if err != nil {
		t.Fatal(err)
	}
	cp := &wire.Checkpoint{Version: checkpointVersion, Tables: []*wire.TableCheckpoint{{
		ConfigJson: cfgJSON, LimiterJson: limJSON, CountersJson: []byte(`{}`),
	}}}
	if err := svc.restore(cp); err != nil {
		t.Fatalf("restore: %v", err)
	}
	tb, ok := svc.Table("t")
	if !ok {
		t.Fatal("table t not restored")
	}
	st := tb.Info().Limiter
	diff := func(s limiter.State) float64 {
		return float64(s.Inserts)*s.Config.SamplesPerInsert - float64(s.Samples) + s.Offset
	}
	if st.Config != cfg.Limiter || st.Inserts != history || math.Abs(diff(st)-diff(saved)) > 0.5 {
		t.Fatalf("restored limiter %+v: inserts*samples_per_insert - samples + offset = %v, want the config's limiter going on from the checkpoint's %v",
			st, diff(st), diff(saved))
	}
}
