package crashtest

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/natstest"
)

const (
	infoSubject      = "reprise.api.info"
	appliedSubject   = "reprise.applied"
	checkpointBucket = "REPRISE_REPRISE_CHECKPOINTS"
)

// standbyPair starts two reprised with --standby on one nats-server and
// returns them with the server's URL.
func standbyPair(t *testing.T) (string, []*reprised) {
	t.Helper()
	srv := natstest.Start(t)
	cfg := writeConfig(t)
	var rs []*reprised
	for range 2 {
		rs = append(rs, startReprised(t, "--config", cfg, "--nats", srv.URL(), "--checkpoint-every", "300ms", "--standby"))
	}
	return srv.URL(), rs
}

// answeringPID is the process id of the reprised that answers an info
// request now, from the service's name in the reply; 0 if none answered,
// and the negated id of one that refused it (a service without the lease).
func answeringPID(nc *nats.Conn) int {
	msg, err := nc.Request(infoSubject, nil, 500*time.Millisecond)
	if err != nil {
		return 0
	}
	if refused(msg) {
		return -pidOf(msg)
	}
	return pidOf(msg)
}

// refused says whether a reply is the refusal of a service that lost its
// lease (CodeUnavailable, no data) rather than an answer.
func refused(msg *nats.Msg) bool {
	var resp wire.SampleResponse
	return msg.Header.Get(micro.ErrorCodeHeader) != "" && proto.Unmarshal(msg.Data, &resp) == nil &&
		resp.GetStatus().GetCode() == wire.Code_CODE_UNAVAILABLE && strings.Contains(resp.GetStatus().GetMessage(), "lost its lease")
}

// pidOf reads the process id in a reply's service name (0 if none).
func pidOf(msg *nats.Msg) int {
	id := strings.Split(msg.Header.Get(service.HeaderService), "-")
	if len(id) < 3 {
		return 0
	}
	pid, _ := strconv.Atoi(id[len(id)-2])
	return pid
}

// activeAndStandby says which of rs answers requests.
func activeAndStandby(t *testing.T, nc *nats.Conn, rs []*reprised) (active, standby *reprised) {
	t.Helper()
	var pid int
	waitFor(t, "one reprised answers", func() bool { pid = answeringPID(nc); return pid > 0 })
	for i, r := range rs {
		if r.pid() == pid {
			return r, rs[1-i]
		}
	}
	t.Fatalf("answered by pid %d, not one of the two reprised", pid)
	return nil, nil
}

// killActive kills the active one of rs with SIGKILL and waits until the
// standby answers. It returns them, when the kill was, and how long after
// it the standby answered.
func killActive(t *testing.T, nc *nats.Conn, rs []*reprised) (active, standby *reprised, killed time.Time, answered time.Duration) {
	t.Helper()
	active, standby = activeAndStandby(t, nc, rs)
	killed = time.Now()
	active.kill()
	waitFor(t, "the standby answers", func() bool { return answeringPID(nc) == standby.pid() })
	return active, standby, killed, time.Since(killed)
}

// TestStandbyTakesOverFromKilledActive: two reprised for one prefix, two
// producers inserting and a learner sampling, updating and deleting; the
// active one is killed with SIGKILL. The standby serves, with every
// acknowledged insert exactly once and every acknowledged mutation. How
// long it took is logged (README.md, "Standby services"), not asserted.
func TestStandbyTakesOverFromKilledActive(t *testing.T) {
	if testing.Short() {
		t.Skip("builds reprised and nats-server, runs two reprised and kills one")
	}
	url, rs := standbyPair(t)
	nc := connect(t, url)
	run(t, url, func() {
		_, _, killed, answered := killActive(t, nc, rs)
		c, err := broker.NewClient(nc)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		waitFor(t, "the standby serves samples", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := c.Sample(ctx, table, 1)
			return err == nil
		})
		t.Logf("active reprised killed: the standby answered info %v and samples %v after the kill",
			answered.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	})
}

// TestStandbyTakesOverFromStoppedActive: as above, with the active one
// stopped gracefully (SIGTERM) instead: it exits 0, hands over without a
// final checkpoint (a standby answered it), and the standby serves with
// every acknowledged insert exactly once and every acknowledged mutation.
func TestStandbyTakesOverFromStoppedActive(t *testing.T) {
	if testing.Short() {
		t.Skip("builds reprised and nats-server, runs two reprised and stops one")
	}
	url, rs := standbyPair(t)
	nc := connect(t, url)
	run(t, url, func() {
		active, standby := activeAndStandby(t, nc, rs)
		stopped := time.Now()
		stopCleanly(t, active)
		waitFor(t, "the standby answers", func() bool { return answeringPID(nc) == standby.pid() })
		t.Logf("active reprised stopped: the standby answered %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
		if out := active.out.String(); !strings.Contains(out, "a standby took over; no final checkpoint") {
			t.Fatalf("the stopped reprised did not hand over to the standby:\n%s", out)
		}
	})
}

// TestStandbyPausedActiveStaysFenced: the active reprised is stopped with
// SIGSTOP until the standby has taken over, then continued with SIGCONT.
// From then on it must not act for the prefix beside the new active one:
// no answer to requests, no progress published, no checkpoint written.
func TestStandbyPausedActiveStaysFenced(t *testing.T) {
	if testing.Short() {
		t.Skip("builds reprised and nats-server, runs two reprised and pauses one")
	}
	url, rs := standbyPair(t)
	nc := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := readyClient(t, url)
	l, stop := startLoad(ctx, t, url, c, 5, 5*time.Second)
	waitFor(t, "inserts acknowledged before the pause", func() bool { return l.ackedCount() >= 300 })

	paused, standby := activeAndStandby(t, nc, rs)
	pausedAt := time.Now()
	if err := paused.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The paused one is continued however the test ends, so that it can be
	// killed and reaped.
	defer paused.signal(syscall.SIGCONT)
	waitFor(t, "the standby answers", func() bool { return answeringPID(nc) == standby.pid() })
	t.Logf("active reprised paused: the standby answered %v after SIGSTOP", time.Since(pausedAt).Round(time.Millisecond))
	before := l.ackedCount()
	waitFor(t, "inserts acknowledged by the new active one", func() bool { return l.ackedCount() >= before+200 })

	// What the paused one might do once continued: publish progress below
	// what the new active one has applied, or write a checkpoint of the
	// epoch it held.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.ObjectStore(ctx, checkpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := obs.Watch(ctx, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	// Until the server drops the paused one's connection, it routes some
	// requests to its endpoints, where they wait unanswered: each try is
	// short.
	var floor uint64
	waitFor(t, "the new active one's applied sequence", func() bool {
		ictx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		info, err := c.Info(ictx, table)
		if err == nil {
			floor = info.AppliedSequence
		}
		return err == nil
	})
	var progressMu sync.Mutex
	var stale []uint64
	sub, err := nc.Subscribe(appliedSubject, func(m *nats.Msg) {
		var p wire.Progress
		if proto.Unmarshal(m.Data, &p) == nil && p.AppliedSequence < floor {
			progressMu.Lock()
			stale = append(stale, p.AppliedSequence)
			progressMu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	newEpoch := activeEpoch(t, standby)

	// Requests sent while it is paused: those the server routed to it wait
	// in its connection, and must be refused when it wakes, not answered.
	late := nats.NewInbox()
	repliedBy := map[int]int{}
	var repliedMu sync.Mutex
	lateSub, err := nc.Subscribe(late, func(m *nats.Msg) {
		pid := pidOf(m)
		if refused(m) {
			pid = -pid
		}
		repliedMu.Lock()
		repliedBy[pid]++
		repliedMu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer lateSub.Unsubscribe()
	for range 50 {
		if err := nc.PublishRequest(infoSubject, late, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	if err := paused.signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	continued := time.Now()
	answers := map[int]int{}
	// Requests while it wakes and after: the new active one answers them
	// all (the continued one may only refuse those it gets).
	for time.Since(continued) < 3*time.Second || !strings.Contains(paused.out.String(), "lost the lease") {
		if time.Since(continued) > time.Minute {
			t.Fatal("the continued reprised did not log that it lost the lease")
		}
		answers[answeringPID(nc)]++
	}
	if n := answers[paused.pid()]; n > 0 {
		t.Errorf("the paused reprised answered %d info requests after SIGCONT (answers by pid: %v)", n, answers)
	}
	repliedMu.Lock()
	if n := repliedBy[paused.pid()]; n > 0 {
		t.Errorf("the paused reprised answered %d of the requests sent while it was paused (answers by pid: %v)", n, repliedBy)
	}
	t.Logf("after SIGCONT: info answers by pid %v, to requests sent during the pause %v (negative: refusals; new active %d, paused %d)",
		answers, repliedBy, standby.pid(), paused.pid())
	repliedMu.Unlock()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	progressMu.Lock()
	if len(stale) > 0 {
		t.Errorf("progress published below the new active one's %d after SIGCONT: %v", floor, stale)
	}
	progressMu.Unlock()
	for done := false; !done; {
		select {
		case oi := <-watch.Updates():
			if oi == nil || oi.Deleted {
				continue
			}
			if epoch := nameEpoch(oi.Name); epoch < newEpoch {
				t.Errorf("checkpoint %s of epoch %d written after SIGCONT (the new active one's epoch is %d)", oi.Name, epoch, newEpoch)
			}
		default:
			done = true
		}
	}

	stop()
	waitStreamApplied(ctx, t, js, c)
	verify(t, l, c)
}

// nameEpoch reads the epoch in a checkpoint's name (0 for none).
func nameEpoch(name string) uint64 {
	var epoch, applied uint64
	if _, err := fmt.Sscanf(name, "checkpoint-e%020d-%020d", &epoch, &applied); err != nil {
		return 0
	}
	return epoch
}

// activeEpoch waits until r logs that it is active and returns the epoch
// it took.
func activeEpoch(t *testing.T, r *reprised) uint64 {
	t.Helper()
	re := regexp.MustCompile(`msg="reprise service: active".* epoch=(\d+)`)
	var epoch uint64
	waitFor(t, "the new active reprised logs its epoch", func() bool {
		m := re.FindStringSubmatch(r.out.String())
		if m == nil {
			return false
		}
		epoch, _ = strconv.ParseUint(m[1], 10, 64)
		return true
	})
	return epoch
}
