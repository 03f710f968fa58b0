package crashtest

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestClusterStandbyNodeKill: two reprised with --standby on a three-node
// NATS cluster, with the stream and the checkpoint and lease buckets at
// three replicas, under the load of TestClusterNodeKill. Three rounds kill
// with SIGKILL, one after the other: the node leading the lease bucket's
// stream, the node leading the data stream, and the active reprised
// (restarted as a standby). These are what a standby deployment on a
// cluster meets that one service on one server does not: a lease whose
// renewals stop while its bucket elects a leader (README.md, "Standby
// services": the active service may lose it, and whichever service takes
// it next must catch up with the stream before it serves), a stream that
// changes leader under the active service and the standby's reader at
// once, and a failover whose lease and checkpoints are replicated. In the
// end every acknowledged insert is in the table exactly once, every
// acknowledged mutation holds, sampling works, and both reprised stop
// cleanly. A reprised that exits on its own (a standby behind the trim)
// is started again, as a supervisor would, and counted in the log.
//
// The pause in acknowledged inserts of each round, and how often a node
// kill cost the active service its lease, are logged: measurements
// (README.md, "Standby services"), not assertions, since machines differ.
//
// It takes 30 to 45 s of three nats-server processes and two reprised, so
// -short skips it.
func TestClusterStandbyNodeKill(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: three nats-server processes and two reprised killed and restarted, 30 to 45 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cr := startClusterRun(ctx, t, 2, 17, []string{streamName, checkpointStream, leaseStream})
	// A standby that falls behind the active one's trim exits, to be
	// restarted from the newest checkpoint (README.md, "Standby services"):
	// here as under systemd or Kubernetes.
	for _, r := range cr.rs {
		r.supervise()
	}
	leader := func(ci *jetstream.ClusterInfo) string { return ci.Leader }
	lost := 0
	for _, k := range []nodeKill{
		{"the lease bucket's leader", leaseStream, leader},
		{"the stream leader", streamName, leader},
	} {
		cr.killNode(ctx, t, k)
		n := lostLeases(cr.rs)
		t.Logf("killed %s: leases the active reprised lost: %d", k.what, n-lost)
		lost = n
	}

	waitFor(t, "the stream has a leader and two current followers", func() bool { return currentClusters(ctx, cr.js, streamName) != nil })
	nc := connect(t, cr.url)
	before := cr.l.ackedCount()
	active, _, killedAt, answered := killActive(t, nc, cr.rs)
	cr.waitAcked(ctx, t, "inserts acknowledged by the former standby", before+300)
	gap, resumed := cr.l.stall(killedAt)
	t.Logf("killed the active reprised: the standby answered %v after the kill; longest pause between acknowledged inserts %v, inserts flowing again %v after the kill",
		answered.Round(time.Millisecond), gap.Round(time.Millisecond), resumed.Round(time.Millisecond))
	// The output so far holds the killed process's own start.
	restartedAt := len(active.out.String())
	active.start()
	waitFor(t, "the restarted reprised runs as a standby", func() bool {
		out := active.out.String()[restartedAt:]
		return strings.Contains(out, `msg="reprise service running"`) && strings.Contains(out, "standby=true")
	})
	before = cr.l.ackedCount()
	cr.waitAcked(ctx, t, "inserts acknowledged after the restart", before+100)

	cr.finish(ctx, t)
	for i, r := range cr.rs {
		// A standby behind the trim exits once and comes back from the
		// newest checkpoint; one that keeps exiting is a crash loop.
		n := r.restarted()
		t.Logf("reprised %d: started again %d times after exiting on its own", i, n)
		if n > 3 {
			t.Errorf("reprised %d exited on its own %d times", i, n)
		}
		for _, line := range strings.Split(r.out.String(), "\n") {
			if strings.Contains(line, "level=ERROR") || strings.HasPrefix(line, "--- crashtest:") {
				t.Logf("reprised %d: %s", i, line)
			}
		}
		stopCleanly(t, r)
	}
}

// stopCleanly stops r with SIGTERM and fails the test unless it exits 0.
func stopCleanly(t *testing.T, r *reprised) {
	t.Helper()
	pid := r.pid()
	err := r.stop(syscall.SIGTERM, time.Minute)
	if ended, _ := r.ended(); !ended {
		r.stop(syscall.SIGQUIT, time.Minute) // its goroutines' stacks, into its output
	}
	if err != nil {
		t.Errorf("reprised (pid %d): %v", pid, err)
	}
}

// lostLeases counts the times an active reprised of rs logged that it lost
// the lease.
func lostLeases(rs []*reprised) int {
	n := 0
	for _, r := range rs {
		n += strings.Count(r.out.String(), "lost the lease; standing by")
	}
	return n
}
