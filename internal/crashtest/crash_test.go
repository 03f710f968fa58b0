// Package crashtest runs Reprise as separate processes: reprised, an actor
// and a learner that share nothing but NATS; and it kills reprised and
// nats-server processes with SIGKILL in the middle of concurrent inserts,
// priority updates, deletes and samples, restarts them, and checks that
// everything acknowledged is there.
package crashtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/internal/natstest"
	"github.com/reprise-rl/reprise/internal/syncbuf"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
)

const table = "crash"

// programs are the commands the tests run, built once per test binary.
var programs = testutil.NewPrograms("reprise-crashtest-", "cmd/reprised", "examples/actor", "examples/learner")

func TestMain(m *testing.M) {
	code := m.Run()
	programs.Remove()
	os.Exit(code)
}

func binary(t *testing.T, name string) string {
	t.Helper()
	return programs.Path(t, name)
}

// reprised is a running reprised process. A goroutine of its own reaps
// it, so that a test can wait for it with a deadline; a supervised one is
// started again whenever it exits without the test stopping it, as
// systemd's Restart=always would.
type reprised struct {
	t    *testing.T
	bin  string
	args []string
	out  *syncbuf.Buffer

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{} // closed once cmd has exited and been reaped
	err      error         // cmd's exit, once exited
	restart  bool          // supervised
	stopping bool          // the test stops it: no restart
	restarts int
}

func startReprised(t *testing.T, args ...string) *reprised {
	t.Helper()
	r := &reprised{t: t, bin: binary(t, "reprised"), args: args, out: &syncbuf.Buffer{}}
	r.start()
	t.Cleanup(func() {
		r.stop(syscall.SIGKILL, time.Minute)
		if t.Failed() {
			t.Logf("reprised output:\n%s", r.out.String())
		}
	})
	return r
}

// supervise has r started again whenever it exits on its own.
func (r *reprised) supervise() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restart = true
}

// start starts the process again with the same arguments (so on the same
// store and port).
func (r *reprised) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopping = false
	if err := r.launchLocked(); err != nil {
		r.t.Fatalf("starting reprised: %v", err)
	}
}

func (r *reprised) launchLocked() error {
	cmd := exec.Command(r.bin, r.args...)
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	r.cmd, r.exited = cmd, exited
	go func() {
		err := cmd.Wait()
		r.mu.Lock()
		defer r.mu.Unlock()
		close(exited)
		if r.cmd != cmd {
			return // one the test gave up waiting for: another runs
		}
		r.err = err
		if !r.restart || r.stopping {
			return
		}
		// Said in its output, which the test shows when it fails; the test
		// may have ended, so not through t.
		fmt.Fprintf(r.out, "--- crashtest: reprised (pid %d) exited (%v); starting it again\n", cmd.Process.Pid, err)
		r.restarts++
		time.AfterFunc(restartDelay, func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.stopping || r.cmd != cmd {
				return
			}
			if err := r.launchLocked(); err != nil {
				fmt.Fprintf(r.out, "--- crashtest: starting reprised again: %v\n", err)
			}
		})
	}()
	return nil
}

// restartDelay is how long supervision waits before it starts an exited
// reprised again, as systemd's RestartSec does: one that exits at once
// does not take the machine's cores.
const restartDelay = 200 * time.Millisecond

// kill sends SIGKILL and reaps the process.
func (r *reprised) kill() {
	r.stop(syscall.SIGKILL, time.Minute)
	if ended, _ := r.ended(); !ended {
		r.t.Fatalf("reprised (pid %d) still running a minute after SIGKILL", r.pid())
	}
}

// stop sends sig and waits, at most within, for the process to exit,
// without a restart. It returns how the process exited, which is nil for
// exit status 0.
func (r *reprised) stop(sig syscall.Signal, within time.Duration) error {
	r.mu.Lock()
	r.stopping = true
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(within):
		return fmt.Errorf("reprised (pid %d) still running %v after %v", cmd.Process.Pid, within, sig)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// pid is the process id of the current process.
func (r *reprised) pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd.Process.Pid
}

// signal sends sig to the current process.
func (r *reprised) signal(sig syscall.Signal) error {
	r.mu.Lock()
	cmd := r.cmd
	r.mu.Unlock()
	return cmd.Process.Signal(sig)
}

// ended says whether the current process exited, and how.
func (r *reprised) ended() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.exited:
		return true, r.err
	default:
		return false, nil
	}
}

// restarted is how often supervision started the process again.
func (r *reprised) restarted() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.restarts
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func writeConfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "reprise.yaml")
	cfg := fmt.Sprintf("tables:\n  - name: %s\n    max_size: 10000000\n", table)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func waitReady(t *testing.T, c *broker.Client) {
	t.Helper()
	waitFor(t, "reprised answers", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Info(ctx, "")
		return err == nil
	})
}

// ledger records what the service acknowledged.
type ledger struct {
	mu      sync.Mutex
	acked   map[int64]bool   // item ids whose insert was acknowledged
	updated map[uint64]int64 // keys whose priority update (to id+0.5) was acknowledged
	deleted map[uint64]int64 // keys whose delete was acknowledged
	// keys a delete was sent for: one whose acknowledgment timed out may
	// still have been applied, and then its item is legitimately gone
	deleteSent map[uint64]int64
	touched    map[uint64]bool  // keys a mutation was sent for, acknowledged or not
	keyID      map[uint64]int64 // keys seen in samples
	ackedAt    []time.Time      // when each acknowledgment of inserts returned, in order
}

func newLedger() *ledger {
	return &ledger{acked: map[int64]bool{}, updated: map[uint64]int64{}, deleted: map[uint64]int64{}, deleteSent: map[uint64]int64{}, touched: map[uint64]bool{}, keyID: map[uint64]int64{}}
}

// actor inserts items with priority = id (ids from first on) until stop, flushing every 25
// items: a Flush that returns nil acknowledges everything created before it.
// With episode > 0 it ends an episode every episode items, which
// acknowledges them too.
// Each call gets callTimeout; what a call that timed out held is not
// counted as acknowledged.
func actor(ctx context.Context, p broker.Writer, l *ledger, stop <-chan struct{}, first int64, callTimeout time.Duration, episode int) {
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		p.Close(cctx)
	}()
	var pending []int64
	for id := first; ; id++ {
		select {
		case <-stop:
			fctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := p.Flush(fctx)
			cancel()
			if err == nil {
				l.ack(pending)
			}
			return
		default:
		}
		actx, cancel := context.WithTimeout(ctx, callTimeout)
		err := p.Append(actx, broker.Step{"id": broker.Int64s(nil, []int64{id})})
		if err == nil {
			err = p.CreateItem(actx, table, float64(id), broker.LastStep("id"))
		}
		if err == nil {
			pending = append(pending, id)
		}
		switch {
		case err == nil && episode > 0 && (id-first+1)%int64(episode) == 0:
			if err = p.EndEpisode(actx); err == nil {
				l.ack(pending)
				pending = nil
			}
		case err == nil && len(pending) >= 25:
			if err = p.Flush(actx); err == nil {
				l.ack(pending)
				pending = nil
			}
		}
		cancel()
		if err != nil {
			// During a crash calls time out; what they held is retried.
			pending = pending[:0:0]
		}
	}
}

func (l *ledger) ack(ids []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		l.acked[id] = true
	}
	l.ackedAt = append(l.ackedAt, time.Now())
}

// ackedCount is the number of acknowledged inserts.
func (l *ledger) ackedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// learnerClient is what a learner samples and mutates through: a Client,
// or a ShardedClient.
type learnerClient interface {
	Sample(ctx context.Context, table string, n int, opts ...broker.SampleOption) ([]broker.Sample, error)
	UpdatePriorities(ctx context.Context, table string, updates ...tables.PriorityUpdate) error
	Delete(ctx context.Context, table string, keys ...uint64) error
}

// learner samples, and for some sampled items updates the priority to
// id+0.5 or deletes them, each key at most once.
func learner(ctx context.Context, c learnerClient, l *ledger, stop <-chan struct{}, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	for {
		select {
		case <-stop:
			return
		default:
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		samples, err := c.Sample(sctx, table, 8)
		cancel()
		if err != nil {
			continue
		}
		for _, s := range samples {
			col, _ := s.Column("id")
			v, err := col.Int64s()
			if err != nil || len(v) != 1 {
				continue
			}
			id, key := v[0], s.Info.Key
			l.mu.Lock()
			l.keyID[key] = id
			skip := l.touched[key]
			if !skip {
				l.touched[key] = true
			}
			l.mu.Unlock()
			if skip {
				continue
			}
			mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			switch r := rng.Float64(); {
			case r < 0.3:
				if c.UpdatePriorities(mctx, table, tables.PriorityUpdate{Key: key, Priority: float64(id) + 0.5}) == nil {
					l.mu.Lock()
					l.updated[key] = id
					l.mu.Unlock()
				}
			case r < 0.45:
				l.mu.Lock()
				l.deleteSent[key] = id
				l.mu.Unlock()
				if c.Delete(mctx, table, key) == nil {
					l.mu.Lock()
					l.deleted[key] = id
					l.mu.Unlock()
				}
			}
			cancel()
		}
	}
}

// verify lists the whole table and checks it against the ledger. With
// several clients, client i is shard i of a sharded table, and holds only
// the keys that name it.
func verify(t *testing.T, l *ledger, clients ...*broker.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	byID := map[int64][]broker.ItemInfo{}
	var total int64
	for shard, c := range clients {
		var size int64
		for offset := int64(0); ; {
			page, err := c.Items(ctx, table, offset, 5000)
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range page.Items {
				id := int64(it.Priority) // priority is id or id+0.5
				byID[id] = append(byID[id], it)
				if n := uint64(len(clients)); n > 1 && it.Key%n != uint64(shard) {
					t.Errorf("shard %d holds key %d of shard %d", shard, it.Key, it.Key%n)
				}
			}
			offset += int64(len(page.Items))
			size = page.TableSize
			if len(page.Items) == 0 {
				break
			}
		}
		info, err := c.Info(ctx, table)
		if err != nil {
			t.Fatal(err)
		}
		lim := info.Tables[0].Limiter
		if lim.Inserts-lim.Deletes != info.Tables[0].Size || info.Tables[0].Size != size {
			t.Errorf("shard %d: limiter inserts %d - deletes %d != size %d (listed %d)", shard, lim.Inserts, lim.Deletes, info.Tables[0].Size, size)
		}
		total += size
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	deletedIDs := map[int64]uint64{}
	for key, id := range l.deleted {
		deletedIDs[id] = key
	}
	maybeDeleted := map[int64]bool{}
	for key, id := range l.deleteSent {
		if _, acked := l.deleted[key]; !acked {
			maybeDeleted[id] = true
		}
	}
	missing, dups, unackedDeletes := 0, 0, 0
	for id, items := range byID {
		if len(items) > 1 {
			dups++
			t.Errorf("item id %d stored %d times", id, len(items))
		}
	}
	for id := range l.acked {
		items := byID[id]
		if _, gone := deletedIDs[id]; gone {
			if len(items) != 0 {
				t.Errorf("item id %d was deleted (acknowledged) but is back", id)
			}
			continue
		}
		if len(items) == 0 && maybeDeleted[id] {
			unackedDeletes++ // its delete timed out but was applied
			continue
		}
		if len(items) == 0 {
			missing++
			if missing < 10 {
				t.Errorf("acknowledged item id %d is missing", id)
			}
			continue
		}
	}
	for key, id := range l.updated {
		for _, it := range byID[id] {
			if it.Key == key && it.Priority != float64(id)+0.5 {
				t.Errorf("item id %d: acknowledged priority update to %v lost (priority %v)", id, float64(id)+0.5, it.Priority)
			}
		}
	}
	t.Logf("verified: %d items stored, %d acknowledged inserts, %d acknowledged updates, %d acknowledged deletes (and %d applied whose acknowledgment timed out); %d missing, %d duplicated",
		total, len(l.acked), len(l.updated), len(l.deleted), unackedDeletes, missing, dups)
	if missing > 0 {
		t.Fatalf("%d acknowledged items missing", missing)
	}
}

// run drives actors and a learner, calls crash in the middle, and verifies
// once the service answers again.
func run(t *testing.T, url string, crash func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := readyClient(t, url)
	l, stop := startLoad(ctx, t, url, c, 7, 5*time.Second)
	waitFor(t, "inserts acknowledged before the crash", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return len(l.acked) >= 500 })
	crash()
	waitReady(t, c)
	before := func() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.acked) }()
	waitFor(t, "inserts acknowledged after the crash", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return len(l.acked) >= before+300 })
	stop()
	// Everything the actors flushed is in the stream; wait until the
	// service has applied all of it.
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	waitStreamApplied(ctx, t, js, c)
	verify(t, l, c)
	// Sampling resumes.
	if _, err := c.Sample(ctx, table, 4); err != nil {
		t.Fatalf("sampling after recovery: %v", err)
	}
}

// readyClient is a client of the service at url, once the service answers;
// the test closes it at its end.
func readyClient(t *testing.T, url string) *broker.Client {
	t.Helper()
	c, err := broker.NewClient(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	waitReady(t, c)
	return c
}

// startLoad runs two actors (on connections of their own to url) and a
// learner (on c) until the returned stop is called, which waits for them
// and may be called again; the test calls it at its end in any case.
// callTimeout bounds each of the actors' calls.
func startLoad(ctx context.Context, t *testing.T, url string, c *broker.Client, seed uint64, callTimeout time.Duration) (*ledger, func()) {
	l := newLedger()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for a := range int64(2) {
		p, err := broker.NewProducer(ctx, connect(t, url), broker.WithRetryFor(2*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { actor(ctx, p, l, done, a*1_000_000_000, callTimeout, 0) })
	}
	wg.Go(func() { learner(ctx, c, l, done, seed) })
	stop := sync.OnceFunc(func() {
		close(done)
		wg.Wait()
	})
	t.Cleanup(stop)
	return l, stop
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func TestKillReprisedWithEmbeddedServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds reprised and kills it")
	}
	addr := freePort(t)
	r := startReprised(t, "--config", writeConfig(t), "--store", t.TempDir(), "--listen", addr, "--checkpoint-every", "300ms")
	run(t, "nats://"+addr, func() {
		r.kill()
		r.start()
	})
}

func TestKillNATSServerWhileServiceRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds reprised and nats-server and kills nats-server")
	}
	srv := natstest.Start(t)
	startReprised(t, "--config", writeConfig(t), "--nats", srv.URL(), "--checkpoint-every", "300ms")
	run(t, srv.URL(), func() {
		srv.Kill()
		srv.Restart(t)
	})
}

func TestKillReprisedWhileServerRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds reprised and nats-server and kills reprised")
	}
	srv := natstest.Start(t)
	r := startReprised(t, "--config", writeConfig(t), "--nats", srv.URL(), "--checkpoint-every", "300ms")
	run(t, srv.URL(), func() {
		r.kill()
		r.start()
	})
}

// TestActorAndLearnerProcesses: an actor process and a learner process,
// started separately, exchange trajectories through reprised with nothing
// else between them.
func TestActorAndLearnerProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three processes")
	}
	addr := freePort(t)
	startReprised(t, "--store", t.TempDir(), "--listen", addr)
	url := "nats://" + addr
	readyClient(t, url)

	start := func(name string, args ...string) (*exec.Cmd, *syncbuf.Buffer) {
		out := &syncbuf.Buffer{}
		cmd := exec.Command(binary(t, name), append([]string{"--nats", url}, args...)...)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
		})
		return cmd, out
	}
	// The learner first: it waits for items to sample.
	learner, learnerOut := start("learner", "--items", "400")
	actor, actorOut := start("actor", "--episodes", "10", "--steps", "50")
	if err := actor.Wait(); err != nil {
		t.Fatalf("actor: %v\n%s", err, actorOut.String())
	}
	if err := learner.Wait(); err != nil {
		t.Fatalf("learner: %v\n%s", err, learnerOut.String())
	}
	if got := actorOut.String(); !strings.Contains(got, "published 480 items") || !strings.Contains(got, "all acknowledged") {
		t.Fatalf("actor printed %q", got)
	}
	if got := learnerOut.String(); !strings.Contains(got, "each is 3 consecutive steps of one episode: ok") {
		t.Fatalf("learner printed %q", got)
	}
	t.Logf("%s%s", actorOut.String(), learnerOut.String())
}
