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
	leaseStream      = "KV_REPRISE_REPRISE_LEASE"        // the lease bucket's stream
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cr := startClusterRun(ctx, t, 1, 11, []string{streamName, checkpointStream})

	var killed string // the node the last round killed
	for _, k := range []nodeKill{
		{"the stream leader", streamName, func(ci *jetstream.ClusterInfo) string { return ci.Leader }},
		{"a stream follower", streamName, func(ci *jetstream.ClusterInfo) string {
			// Not the node killed before, so that each round kills another.
			if ci.Replicas[0].Name == killed {
				return ci.Replicas[1].Name
			}
			return ci.Replicas[0].Name
		}},
	} {
		killed = cr.killNode(ctx, t, k)
	}
	cr.finish(ctx, t)
}

// clusterRun is reprised on a three-node cluster under the load of
// startLoad.
type clusterRun struct {
	cluster *natstest.Cluster
	url     string
	rs      []*reprised
	js      jetstream.JetStream
	c       *broker.Client
	l       *ledger
	stop    func() // stops the load
}

// startClusterRun starts a three-node cluster and n reprised on it (with
// --standby when n > 1), with the stream and so the buckets at three
// replicas; it waits until each of streams exists with three replicas,
// starts the load and returns once 300 inserts are acknowledged.
func startClusterRun(ctx context.Context, t *testing.T, n int, seed uint64, streams []string) *clusterRun {
	t.Helper()
	cr := &clusterRun{cluster: natstest.StartCluster(t, 3)}
	cr.url = cr.cluster.URL()
	cfg := filepath.Join(t.TempDir(), "reprise.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("stream:\n  replicas: 3\ntables:\n  - name: %s\n    max_size: 10000000\n", table)), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", cfg, "--nats", cr.url, "--checkpoint-every", "500ms"}
	if n > 1 {
		args = append(args, "--standby")
	}
	for range n {
		cr.rs = append(cr.rs, startReprised(t, args...))
	}
	cr.c = readyClient(t, cr.url)
	var err error
	if cr.js, err = jetstream.New(connect(t, cr.url)); err != nil {
		t.Fatal(err)
	}
	for _, name := range streams {
		var replicas int
		waitFor(t, name+" exists", func() bool {
			info, err := streamInfo(ctx, cr.js, name)
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
	cr.l, cr.stop = startLoad(ctx, t, cr.url, cr.c, seed, time.Minute)
	waitFor(t, "inserts acknowledged before the first kill", func() bool { return cr.l.ackedCount() >= 300 })
	return cr
}

// nodeKill is a round of a cluster test: the node pick names among the
// replicas of stream is killed.
type nodeKill struct {
	what   string // the node's role, for the log
	stream string
	pick   func(*jetstream.ClusterInfo) string
}

// killNode plays round k once the stream and k's stream each have a
// leader and two current followers: it kills the node with SIGKILL, waits
// for 300 inserts acknowledged while it is down, restarts it, and waits
// until it caught up and 100 more are acknowledged. It logs the pause and
// returns the node's name.
func (cr *clusterRun) killNode(ctx context.Context, t *testing.T, k nodeKill) string {
	t.Helper()
	streams := []string{streamName}
	if k.stream != streamName {
		streams = append(streams, k.stream)
	}
	var cis []*jetstream.ClusterInfo
	current := func() bool { cis = currentClusters(ctx, cr.js, streams...); return cis != nil }
	waitFor(t, "the streams have a leader and two current followers", current)
	name := k.pick(cis[len(cis)-1])
	node := cr.cluster.Node(name)
	if node == nil {
		t.Fatalf("no node named %q", name)
	}
	before := cr.l.ackedCount()
	killedAt := time.Now()
	node.Kill()
	cr.waitAcked(ctx, t, "inserts acknowledged with "+name+" down", before+300)
	gap, resumed := cr.l.stall(killedAt)
	t.Logf("killed %s (%s): longest pause between acknowledged inserts %v, inserts flowing again %v after the kill",
		k.what, name, gap.Round(time.Millisecond), resumed.Round(time.Millisecond))
	node.Restart(t)
	waitFor(t, name+" caught up", current)
	before = cr.l.ackedCount()
	cr.waitAcked(ctx, t, "inserts acknowledged after "+name+" is back", before+100)
	return name
}

// finish stops the load and checks the table against what was
// acknowledged.
func (cr *clusterRun) finish(ctx context.Context, t *testing.T) {
	t.Helper()
	cr.stop()
	// Everything acknowledged is in the stream; wait until the service has
	// applied all of it.
	waitStreamApplied(ctx, t, cr.js, cr.c)
	verify(t, cr.l, cr.c)
	if _, err := cr.c.Sample(ctx, table, 4); err != nil {
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

// currentClusters returns the cluster of each named stream if each has a
// leader and two current followers, nil if one has not.
func currentClusters(ctx context.Context, js jetstream.JetStream, names ...string) []*jetstream.ClusterInfo {
	var cis []*jetstream.ClusterInfo
	for _, name := range names {
		info, err := streamInfo(ctx, js, name)
		if err != nil || !allCurrent(info.Cluster) {
			return nil
		}
		cis = append(cis, info.Cluster)
	}
	return cis
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
func (cr *clusterRun) waitAcked(ctx context.Context, t *testing.T, what string, n int) {
	t.Helper()
	l, c, js := cr.l, cr.c, cr.js
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
			// goroutine's stack into its output, which the test logs (one
			// killed and not restarted yet is skipped: Signal fails).
			for _, r := range cr.rs {
				r.stop(syscall.SIGQUIT, time.Minute)
			}
			t.Fatalf("timed out waiting for %s: %d of %d", what, l.ackedCount(), n)
		}
		<-tick.C
	}
}
