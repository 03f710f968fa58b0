package main

// These tests run reprised, reprisectl and the example actor and learner as
// separate processes, built with go build, against NATS servers with
// users: what each role may do works, and what it may not is refused by
// the server.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/internal/natstest"
	"github.com/reprise-rl/reprise/internal/syncbuf"
	"github.com/reprise-rl/reprise/internal/testcerts"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
)

// programs are the commands the tests run, built once per test binary.
var programs = testutil.NewPrograms("reprise-authtest-", "cmd/reprised", "cmd/reprisectl", "examples/actor", "examples/learner")

func TestMain(m *testing.M) {
	code := m.Run()
	programs.Remove()
	os.Exit(code)
}

func binary(t *testing.T, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs reprised, reprisectl and the examples")
	}
	return programs.Path(t, name)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func freeAddr(t *testing.T, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitFor polls cond until it holds, or fails the test after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// process is a running reprised.
type process struct {
	cmd    *exec.Cmd
	out    *syncbuf.Buffer
	exited chan struct{}
}

// startReprised runs reprised with args and waits until it says it is
// ready. SIGTERM stops it when the test ends.
func startReprised(t *testing.T, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(binary(t, "reprised"), args...), out: &syncbuf.Buffer{}, exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("reprised output:\n%s", p.out.String())
		}
	})
	waitFor(t, "reprised to be ready", func() bool {
		select {
		case <-p.exited:
			t.Fatalf("reprised exited before it was ready:\n%s", p.out.String())
		default:
		}
		return strings.Contains(p.out.String(), "Stop it with Ctrl-C.")
	})
	return p
}

func (p *process) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// run runs a built program to its end and returns its output and error.
func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(testCtx(t), binary(t, name), args...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// violations records the permissions violations the server reports to one
// connection.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrPermissionViolation) {
		v.mu.Lock()
		v.errs = append(v.errs, err.Error())
		v.mu.Unlock()
	}
}

func (v *violations) list() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.errs)
}

// refused waits until the server has reported a violation naming subject.
func (v *violations) refused(t *testing.T, subject string) {
	t.Helper()
	waitFor(t, "the server to refuse "+subject, func() bool {
		return slices.ContainsFunc(v.list(), func(e string) bool { return strings.Contains(e, `"`+subject+`"`) })
	})
}

// conn is a client connection as one user.
type conn struct {
	nc *nats.Conn
	v  *violations
}

// connect connects as user with password, reading replies in the user's
// inbox as the roles require.
func connect(t *testing.T, url, user, password string, extra ...nats.Option) conn {
	t.Helper()
	v := &violations{}
	opts := append([]nats.Option{nats.UserInfo(user, password), nats.CustomInboxPrefix(broker.InboxPrefix(user)), nats.ErrorHandler(v.handler)}, extra...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connecting as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return conn{nc, v}
}

func insert(t *testing.T, c conn, prefix string, n int) {
	t.Helper()
	ctx := testCtx(t)
	p, err := broker.NewProducer(ctx, c.nc, broker.WithPrefix(prefix))
	if err != nil {
		t.Fatalf("actor's producer: %v", err)
	}
	for i := range n {
		if err := p.Append(ctx, broker.Step{"x": broker.Float32s([]int64{2}, []float32{float32(i), 1})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "replay", 1, broker.LastStep("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatalf("actor's items not applied: %v", err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// insertRejected: an item for an unknown table comes back to the actor's
// producer as a rejection, through its own inbox.
func insertRejected(t *testing.T, c conn, prefix string) {
	t.Helper()
	ctx := testCtx(t)
	p, err := broker.NewProducer(ctx, c.nc, broker.WithPrefix(prefix))
	if err != nil {
		t.Fatalf("actor's producer: %v", err)
	}
	defer p.Close(ctx)
	if err := p.Append(ctx, broker.Step{"x": broker.Float32s([]int64{2}, []float32{0, 1})}); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "no-such-table", 1, broker.LastStep("x")); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitApplied(ctx); !errors.Is(err, broker.ErrRejected) || !strings.Contains(err.Error(), "unknown table") {
		t.Fatalf("an item for an unknown table: %v, want its rejection", err)
	}
}

func short(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

// checkActorLimits: an actor may not read data, mutate, reset, serve
// requests, or delete the stream or the checkpoint bucket.
func checkActorLimits(t *testing.T, actor conn, prefix string) {
	t.Helper()
	stream := "REPRISE_" + strings.ToUpper(strings.ReplaceAll(prefix, ".", "_"))
	// Nor read another user's inbox, where its rejections and replies go.
	for _, subject := range []string{prefix + ".data.>", prefix + ".api.sample", "_INBOX.learner1.>"} {
		actor.nc.SubscribeSync(subject)
		actor.v.refused(t, subject)
	}
	for _, subject := range []string{prefix + ".data.reset", prefix + ".data.mutate"} {
		actor.nc.Publish(subject, nil)
		actor.v.refused(t, subject)
	}
	js, err := jetstream.New(actor.nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(short(t), stream); err == nil {
		t.Error("the actor deleted the stream")
	}
	actor.v.refused(t, "$JS.API.STREAM.DELETE."+stream)
	if err := js.DeleteObjectStore(short(t), stream+"_CHECKPOINTS"); err == nil {
		t.Error("the actor deleted the checkpoint bucket")
	}
	actor.v.refused(t, "$JS.API.STREAM.DELETE.OBJ_"+stream+"_CHECKPOINTS")
	if _, err := js.OrderedConsumer(short(t), stream, jetstream.OrderedConsumerConfig{}); err == nil {
		t.Error("the actor read the stream through a consumer")
	}
}

// checkLearnerLimits: a learner may not insert, reset or checkpoint.
func checkLearnerLimits(t *testing.T, learner conn, prefix string) {
	t.Helper()
	c, err := broker.NewClient(learner.nc, broker.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Reset(short(t), "replay"); err == nil {
		t.Error("the learner reset a table")
	}
	learner.v.refused(t, prefix+".api.reset")
	if _, err := c.Checkpoint(short(t)); err == nil {
		t.Error("the learner wrote a checkpoint")
	}
	learner.v.refused(t, prefix+".api.checkpoint")
	learner.nc.Publish(prefix+".data.insert", []byte("x"))
	learner.v.refused(t, prefix+".data.insert")
	learner.nc.Publish(prefix+".data.reset", nil)
	learner.v.refused(t, prefix+".data.reset")
}

func sampleAndUpdate(t *testing.T, learner conn, prefix string, wantSize int64) {
	t.Helper()
	ctx := testCtx(t)
	c, err := broker.NewClient(learner.nc, broker.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.Info(ctx, "replay")
	if err != nil || info.Tables[0].Size != wantSize {
		t.Fatalf("learner's info = %v, %v; want %d items", info, err, wantSize)
	}
	batch, err := c.Sample(ctx, "replay", 4)
	if err != nil {
		t.Fatalf("learner sampling: %v", err)
	}
	key := batch[0].Info.Key
	if err := c.UpdatePriorities(ctx, "replay", tables.PriorityUpdate{Key: key, Priority: 5}); err != nil {
		t.Fatalf("learner updating a priority: %v", err)
	}
	got, err := c.Get(ctx, "replay", key)
	if err != nil || len(got.Items) != 1 || got.Items[0].Priority != 5 {
		t.Errorf("after the update, item %d = %v, %v; want priority 5", key, got, err)
	}
}

func noViolations(t *testing.T, who string, c conn) {
	t.Helper()
	if errs := c.v.list(); len(errs) > 0 {
		t.Errorf("%s was refused part of its job: %v", who, errs)
	}
}

// TestRolesOnTheEmbeddedServer: reprised with users of every role on its
// embedded server; each role does its job, through the broker, reprisectl
// and the examples, and is refused what it may not do.
func TestRolesOnTheEmbeddedServer(t *testing.T) {
	const prefix = "auth.embedded"
	hash, err := bcrypt.GenerateFromPassword([]byte("learner-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	dir := t.TempDir()
	seedFile := filepath.Join(dir, "learner2.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	configFile := filepath.Join(dir, "reprise.yaml")
	yaml := fmt.Sprintf(`server:
  users:
    - {name: actor1, role: actor, password: actor-pw}
    - {name: learner1, role: learner, password: %q}
    - {name: admin1, role: admin, password: admin-pw}
    - {nkey: %s, role: learner}
tables:
  - {name: replay, max_size: 1000}
  - {name: episodes, max_size: 1000}
`, hash, pub)
	if err := os.WriteFile(configFile, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t, "127.0.0.1")
	url := "nats://" + addr
	args := []string{"--config", configFile, "--listen", addr, "--store", filepath.Join(dir, "data"), "--prefix", prefix, "--checkpoint-every", "0"}
	r := startReprised(t, args...)
	if out := r.out.String(); !strings.Contains(out, "--user learner1") {
		t.Errorf("the ready message does not say how to authenticate:\n%s", out)
	}

	// Nobody gets in without a user, nor with a wrong password.
	if _, err := nats.Connect(url); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("connecting without credentials: %v, want an authorization error", err)
	}
	if _, err := nats.Connect(url, nats.UserInfo("admin1", "wrong")); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("connecting with a wrong password: %v, want an authorization error", err)
	}
	out, err := run(t, "reprisectl", "info", "--nats", url, "--prefix", prefix)
	if err == nil || !strings.Contains(out, "requires authentication: give --user and --password, --nkey or --creds") {
		t.Errorf("reprisectl info without credentials: %v\n%s", err, out)
	}
	out, err = run(t, "reprisectl", "info", "--nats", url, "--prefix", prefix, "--user", "admin1", "--password", "wrong")
	if err == nil || !strings.Contains(out, "Authorization Violation") || !strings.Contains(out, "refused these credentials") {
		t.Errorf("reprisectl info with a wrong password: %v\n%s", err, out)
	}

	// The actor inserts; its items land.
	actor := connect(t, url, "actor1", "actor-pw")
	insert(t, actor, prefix, 20)
	insertRejected(t, actor, prefix)
	noViolations(t, "the actor", actor)
	checkActorLimits(t, actor, prefix)

	// The learner (password checked against a bcrypt hash) samples and
	// updates priorities.
	learner := connect(t, url, "learner1", "learner-pw")
	sampleAndUpdate(t, learner, prefix, 20)
	noViolations(t, "the learner", learner)
	checkLearnerLimits(t, learner, prefix)
	if out, err := run(t, "reprisectl", "info", "--nats", url, "--prefix", prefix, "--nkey", seedFile); err != nil || !strings.Contains(out, "replay") {
		t.Errorf("reprisectl info as the nkey learner: %v\n%s", err, out)
	}
	out, err = run(t, "reprisectl", "reset", "replay", "--nats", url, "--prefix", prefix, "--user", "learner1", "--password", "learner-pw")
	if err == nil || !strings.Contains(out, "the NATS server refused this user") {
		t.Errorf("reprisectl reset as a learner: %v\n%s", err, out)
	}

	// The examples, with the roles' credentials.
	out, err = run(t, "actor", "--nats", url, "--prefix", prefix, "--table", "episodes", "--user", "actor1", "--password", "actor-pw", "--episodes", "2", "--steps", "10")
	if err != nil || !strings.Contains(out, "published 16 items") {
		t.Errorf("examples/actor as actor1: %v\n%s", err, out)
	}
	out, err = run(t, "learner", "--nats", url, "--prefix", prefix, "--table", "episodes", "--nkey", seedFile, "--items", "8", "--batch", "4")
	if err != nil || !strings.Contains(out, "each is 3 consecutive steps of one episode: ok") {
		t.Errorf("examples/learner as the nkey learner: %v\n%s", err, out)
	}

	// The admin checkpoints and resets, with reprisectl; it may not serve
	// requests.
	admin := []string{"--nats", url, "--prefix", prefix, "--user", "admin1", "--password", "admin-pw"}
	if out, err := run(t, "reprisectl", append([]string{"checkpoint"}, admin...)...); err != nil || !strings.Contains(out, "checkpoint checkpoint-") {
		t.Fatalf("reprisectl checkpoint as the admin: %v\n%s", err, out)
	}
	adminConn := connect(t, url, "admin1", "admin-pw")
	adminConn.nc.SubscribeSync(prefix + ".api.sample")
	adminConn.v.refused(t, prefix+".api.sample")

	// reprised restarts from the checkpoint in the object store, as the
	// service role.
	r.stop()
	startReprised(t, args...)
	waitFor(t, "the restarted reprised to serve the items", func() bool {
		out, err := run(t, "reprisectl", append([]string{"info", "--json", "replay"}, admin...)...)
		return err == nil && strings.Contains(out, `"size": 20`)
	})
	if out, err := run(t, "reprisectl", append([]string{"reset", "replay"}, admin...)...); err != nil || out != "reset table replay\n" {
		t.Errorf("reprisectl reset as the admin: %v\n%s", err, out)
	}
}

// TestPermissionsOnAnExternalServer: the block reprisectl permissions
// prints, loaded into a separate nats-server, lets reprised run as the
// service user and enforces the roles.
func TestPermissionsOnAnExternalServer(t *testing.T) {
	const prefix = "auth.external"
	block, err := run(t, "reprisectl", "permissions", "--prefix", prefix)
	if err != nil {
		t.Fatalf("reprisectl permissions: %v\n%s", err, block)
	}
	for _, role := range broker.Roles() {
		placeholder := strings.ToUpper(string(role)) + "_PASSWORD"
		if !strings.Contains(block, placeholder) {
			t.Fatalf("no placeholder %s in:\n%s", placeholder, block)
		}
		block = strings.ReplaceAll(block, placeholder, string(role)+"-pw")
	}
	srv := natstest.Start(t, natstest.WithConfig(block, nats.UserInfo("admin", "admin-pw"), nats.CustomInboxPrefix(broker.InboxPrefix("admin"))))
	url := srv.URL()
	// With --standby, the service role's permissions must cover the lease
	// bucket too (a denied request would leave reprised waiting for it).
	startReprised(t, "--nats", url, "--user", "service", "--password", "service-pw", "--prefix", prefix, "--checkpoint-every", "0", "--standby")

	if _, err := nats.Connect(url); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("connecting without credentials: %v, want an authorization error", err)
	}
	actor := connect(t, url, "actor", "actor-pw")
	insert(t, actor, prefix, 10)
	noViolations(t, "the actor", actor)
	checkActorLimits(t, actor, prefix)

	learner := connect(t, url, "learner", "learner-pw")
	sampleAndUpdate(t, learner, prefix, 10)
	noViolations(t, "the learner", learner)
	checkLearnerLimits(t, learner, prefix)

	admin := []string{"--nats", url, "--prefix", prefix, "--user", "admin", "--password", "admin-pw"}
	for _, cmd := range [][]string{{"checkpoint"}, {"reset", "replay"}} {
		if out, err := run(t, "reprisectl", append(cmd, admin...)...); err != nil {
			t.Errorf("reprisectl %s as the admin: %v\n%s", cmd[0], err, out)
		}
	}
}

// TestTLSAndClientCertificates: reprised's embedded server over TLS,
// requiring client certificates, listening on every interface.
func TestTLSAndClientCertificates(t *testing.T) {
	certs := testcerts.Write(t)
	addr := freeAddr(t, "0.0.0.0")
	_, port, _ := net.SplitHostPort(addr)
	url := "nats://127.0.0.1:" + port
	startReprised(t, "--listen", addr, "--store", t.TempDir(), "--prefix", "auth.tls",
		"--listen-tls-cert", certs.ServerCert, "--listen-tls-key", certs.ServerKey,
		"--listen-tls-verify", "--listen-tls-ca", certs.CA, "--embedded-user", "admin:ops:ops-pw")
	common := []string{"info", "--nats", url, "--prefix", "auth.tls", "--user", "ops", "--password", "ops-pw", "--tls-ca", certs.CA}
	if out, err := run(t, "reprisectl", append(common, "--tls-cert", certs.ClientCert, "--tls-key", certs.ClientKey)...); err != nil || !strings.Contains(out, "replay") {
		t.Errorf("reprisectl info over TLS with a client certificate: %v\n%s", err, out)
	}
	if out, err := run(t, "reprisectl", common...); err == nil {
		t.Errorf("reprisectl info without a client certificate succeeded:\n%s", out)
	}
}

// TestListenBeyondLoopback: reprised refuses to serve every interface
// without users unless told to, and then warns.
func TestListenBeyondLoopback(t *testing.T) {
	addr := freeAddr(t, "0.0.0.0")
	out, err := run(t, "reprised", "--listen", addr, "--store", t.TempDir())
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(out, "reaches beyond this machine") || !strings.Contains(out, "--allow-unauthenticated") {
		t.Errorf("reprised --listen %s without users: %v\n%s", addr, err, out)
	}
	r := startReprised(t, "--listen", addr, "--store", t.TempDir(), "--allow-unauthenticated")
	if !strings.Contains(r.out.String(), "without authentication") {
		t.Errorf("no warning:\n%s", r.out.String())
	}
}
