package crashtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/internal/natstest"
)

const (
	streamName       = "REPRISE_REPRISE"
	checkpointStream = "OBJ_REPRISE_REPRISE_CHECKPOINTS" // the object store bucket's stream
)

// TestClusterNodeKill: reprised against a three-node NATS cluster, with
// the stream and the checkpoint bucket at three replicas, while two
// producers insert and a learner samples, updates priorities and deletes.
// The node leading the stream is killed with SIGKILL, and once it is back a
// node that follows the stream is: the producers, the learner and reprised
// carry on through both with nothing but their connection's URL list, and
// in the end every acknowledged insert is in the table exactly once, every
// acknowledged mutation holds, and sampling works.
//
// The longest pause between acknowledged inserts around each kill is
// logged: a measurement (README.md, "Running at scale"), not an assertion,
// since CI machines differ.
//
// It takes 15 to 30 s of three nats-server processes and reprised, so
// -short skips it.
func TestClusterNodeKill(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: three nats-server processes killed and restarted, 15 to 30 s")
	}
	cluster := natstest.StartCluster(t, 3)
	url := cluster.URL()
	cfg := filepath.Join(t.TempDir(), "reprise.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("stream:\n  replicas: 3\ntables:\n  - name: %s\n    max_size: 10000000\n", table)), 0o644); err != nil {
		t.Fatal(err)
	}
	r := startReprised(t, "--config", cfg, "--nats", url, "--checkpoint-every", "500ms")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := readyClient(t, url)
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{streamName, checkpointStream} {
		var replicas int
		waitFor(t, name+" exists", func() bool {
			info, err := streamInfo(ctx, js, name)
			if err == nil {
				replicas = info.Config.Replicas
			}
			return err == nil
		})
		if replicas != 3 {
			t.Fatalf("stream %s has %d replicas, want 3", name, replicas)
		}
	}

	// Calls wait as long as a user's would, so that the pauses measured
	// are the cluster's and the client's, not the test's.
	l, stop := startLoad(ctx, t, url, c, 11, time.Minute)
	waitFor(t, "inserts acknowledged before the first kill", func() bool { return l.ackedCount() >= 300 })

	var killed string // the node the last round killed
	for _, victim := range []struct {
		what string
		pick func(*jetstream.ClusterInfo) string
	}{
		{"the stream leader", func(ci *jetstream.ClusterInfo) string { return ci.Leader }},
		{"a stream follower", func(ci *jetstream.ClusterInfo) string {
			// Not the node killed before, so that each round kills another.
			if ci.Replicas[0].Name == killed {
				return ci.Replicas[1].Name
			}
			return ci.Replicas[0].Name
		}},
	} {
		var name string
		waitFor(t, "the stream has a leader and two current followers", func() bool {
			info, err := streamInfo(ctx, js, streamName)
			if err != nil || !allCurrent(info.Cluster) {
				return false
			}
			name = victim.pick(info.Cluster)
			return true
		})
		node := cluster.Node(name)
		if node == nil {
			t.Fatalf("no node named %q", name)
		}
		before := l.ackedCount()
		killed = name
		killedAt := time.Now()
		node.Kill()
		waitAcked(ctx, t, r, l, c, js, "inserts acknowledged with "+name+" down", before+300)
		gap, resumed := l.stall(killedAt)
		t.Logf("killed %s (%s): longest pause between acknowledged inserts %v, inserts flowing again %v after the kill",
			victim.what, name, gap.Round(time.Millisecond), resumed.Round(time.Millisecond))
		node.Restart(t)
		waitFor(t, name+" caught up", func() bool {
			info, err := streamInfo(ctx, js, streamName)
			return err == nil && allCurrent(info.Cluster)
		})
		before = l.ackedCount()
		waitAcked(ctx, t, r, l, c, js, "inserts acknowledged after "+name+" is back", before+100)
	}
	stop()

	// Everything acknowledged is in the stream; wait until the service has
	// applied all of it.
	waitStreamApplied(ctx, t, js, c)
	verify(t, l, c)
	if _, err := c.Sample(ctx, table, 4); err != nil {
		t.Fatalf("sampling after the kills: %v", err)
	}
}

// waitStreamApplied waits until the service has applied everything the
// stream holds.
func waitStreamApplied(ctx context.Context, t *testing.T, js jetstream.JetStream, c *broker.Client) {
	t.Helper()
	waitStreamNameApplied(ctx, t, js, c, streamName)
}

// waitStreamNameApplied waits until the service has applied everything its
// stream, the named one, holds.
func waitStreamNameApplied(ctx context.Context, t *testing.T, js jetstream.JetStream, c *broker.Client, stream string) {
	t.Helper()
	waitFor(t, "the service applied stream "+stream, func() bool {
		si, err := streamInfo(ctx, js, stream)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx, table)
		return err == nil && info.AppliedSequence >= si.State.LastSeq
	})
}

func streamInfo(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.Info(ctx)
}

// allCurrent says whether a three-replica stream has a leader and two
// followers that are online and caught up.
func allCurrent(ci *jetstream.ClusterInfo) bool {
	if ci == nil || ci.Leader == "" || len(ci.Replicas) != 2 {
		return false
	}
	for _, r := range ci.Replicas {
		if !r.Current || r.Offline {
			return false
		}
	}
	return true
}

// stall measures the pause in acknowledged inserts a kill at killed
// caused: the longest gap between successive acknowledgments from the last
// one before the kill on, and when the acknowledgment that ended it came,
// counted from the kill.
func (l *ledger) stall(killed time.Time) (gap, resumed time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	prev := killed
	for _, at := range l.ackedAt {
		if at.Before(killed) {
			prev = at
			continue
		}
		if d := at.Sub(prev); d > gap {
			gap, resumed = d, at.Sub(killed)
		}
		prev = at
	}
	return gap, resumed
}

// waitAcked waits until n inserts are acknowledged; if they are not in
// time it says where they stopped: in the stream, or before the service
// applied them.
func waitAcked(ctx context.Context, t *testing.T, r *reprised, l *ledger, c *broker.Client, js jetstream.JetStream, what string, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for l.ackedCount() < n {
		if time.Now().After(deadline) {
			var last uint64
			if si, err := streamInfo(ctx, js, streamName); err == nil {
				last = si.State.LastSeq
				t.Logf("stream: %+v; cluster: leader %s, replicas %+v", si.State, si.Cluster.Leader, si.Cluster.Replicas)
			} else {
				t.Logf("stream info: %v", err)
			}
			if st, err := js.Stream(ctx, streamName); err == nil {
				for ci := range st.ListConsumers(ctx).Info() {
					t.Logf("consumer %s on %s: delivered stream sequence %d, %d pending, %d waiting pulls",
						ci.Name, ci.Cluster.Leader, ci.Delivered.Stream, ci.NumPending, ci.NumWaiting)
				}
			}
			if info, err := c.Info(ctx, table); err == nil {
				t.Logf("service applied up to %d of %d", info.AppliedSequence, last)
			} else {
				t.Logf("service info: %v", err)
			}
			// Where reprised waits: SIGQUIT makes the Go runtime write every
			// goroutine's stack into its output, which the test logs.
			r.cmd.Process.Signal(syscall.SIGQUIT)
			r.cmd.Wait()
			t.Fatalf("timed out waiting for %s: %d of %d", what, l.ackedCount(), n)
		}
		<-tick.C
	}
}
