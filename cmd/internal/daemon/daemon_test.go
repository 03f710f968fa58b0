package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/cmd/internal/cli"
	"github.com/reprise-rl/reprise/cmd/internal/config"
	"github.com/reprise-rl/reprise/internal/natstest"
	"github.com/reprise-rl/reprise/internal/syncbuf"
	"github.com/reprise-rl/reprise/internal/testutil"
)

// running is reprised started in process by start.
type running struct {
	url, prefix, metrics string
	stdout, stderr       *syncbuf.Buffer
	stop                 func() error
}

var (
	urlLine     = regexp.MustCompile(`NATS URL:\s+(\S+)`)
	prefixLine  = regexp.MustCompile(`prefix:\s+(\S+)`)
	metricsLine = regexp.MustCompile(`metrics:\s+(\S+)`)
)

// start runs reprised with args until stop (or the end of the test) and
// waits until it says it is ready.
func start(t *testing.T, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, args, r.stdout, r.stderr) }()
	var once sync.Once
	var stopErr error
	r.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(30 * time.Second):
				stopErr = errors.New("reprised did not stop within 30s of its context ending")
			}
		})
		return stopErr
	}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("reprised: %v\nstderr:\n%s", err, r.stderr.String())
		}
	})
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(r.stdout.String(), "Stop it with Ctrl-C.") {
		select {
		case err := <-done:
			done <- err // for stop
			t.Fatalf("reprised exited before it was ready: %v\nstderr:\n%s", err, r.stderr.String())
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			t.Fatalf("reprised not ready within a minute\nstdout:\n%s\nstderr:\n%s", r.stdout.String(), r.stderr.String())
		}
	}
	out := r.stdout.String()
	r.url = urlLine.FindStringSubmatch(out)[1]
	r.prefix = prefixLine.FindStringSubmatch(out)[1]
	if m := metricsLine.FindStringSubmatch(out); m != nil {
		r.metrics = m[1]
	}
	return r
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// insert puts n items into table through a producer and waits until the
// service has applied them.
func insert(t *testing.T, url, prefix, table string, n int) {
	t.Helper()
	ctx := testCtx(t)
	p, err := broker.NewProducer(ctx, connect(t, url), broker.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := p.Append(ctx, broker.Step{"x": broker.Float32s([]int64{2}, []float32{float32(i), 1})}); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, table, 1, broker.LastStep("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func tableSize(t *testing.T, url, prefix, table string) int64 {
	t.Helper()
	c, err := broker.NewClient(connect(t, url), broker.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.Info(testCtx(t), table)
	if err != nil {
		t.Fatal(err)
	}
	return info.Tables[0].Size
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

func TestEmbeddedStartStopRestart(t *testing.T) {
	store := filepath.Join(t.TempDir(), "data")
	args := []string{"--listen", "127.0.0.1:-1", "--store", store, "--metrics", "127.0.0.1:0", "--prefix", "test.daemon"}
	r := start(t, args...)
	out := r.stdout.String()
	for _, want := range []string{"embedded server, data in " + store, "tables:    replay", "Try: go run ./cmd/reprisectl info --nats " + r.url + " --prefix test.daemon"} {
		if !strings.Contains(out, want) {
			t.Errorf("ready message lacks %q:\n%s", want, out)
		}
	}
	if r.prefix != "test.daemon" {
		t.Errorf("prefix %q, want test.daemon", r.prefix)
	}
	insert(t, r.url, r.prefix, "replay", 5)
	if got := tableSize(t, r.url, r.prefix, "replay"); got != 5 {
		t.Errorf("replay holds %d items, want 5", got)
	}
	metrics := scrape(t, r.metrics)
	for _, want := range []string{`reprise_table_size{table="replay"} 5`, `reprise_table_max_size{table="replay"} 1e+06`, `reprise_insert_latency_seconds_count{table="replay"} 5`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	if err := r.stop(); err != nil {
		t.Fatalf("stopping: %v", err)
	}
	if !strings.Contains(r.stderr.String(), "reprised stopped") {
		t.Errorf("no shutdown log line:\n%s", r.stderr.String())
	}
	if _, err := http.Get(r.metrics); err == nil {
		t.Error("the metrics server still answers after shutdown")
	}

	// The stream is the write-ahead log: a new reprised on the same store
	// rebuilds the table.
	r2 := start(t, args...)
	if got := tableSize(t, r2.url, r2.prefix, "replay"); got != 5 {
		t.Errorf("after a restart replay holds %d items, want 5", got)
	}
}

func TestConfigFileAndOverrides(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "reprise.yaml")
	yaml := `
server:
  listen: 127.0.0.1:-1
  store: ` + filepath.Join(dir, "data") + `
  prefix: from.file
log:
  format: text
tables:
  - name: q
    max_size: 10
    rate_limiter: {preset: queue}
  - name: u
    max_size: 100
`
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	r := start(t, "--config", file, "--prefix", "from.flag", "--log-format", "json")
	if r.prefix != "from.flag" {
		t.Errorf("prefix %q: the flag should override the file", r.prefix)
	}
	if !strings.Contains(r.stdout.String(), "tables:    q, u") {
		t.Errorf("tables from the file not served:\n%s", r.stdout.String())
	}
	c, err := broker.NewClient(connect(t, r.url), broker.WithPrefix("from.flag"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.Info(testCtx(t), "q")
	if err != nil {
		t.Fatal(err)
	}
	if q := info.Tables[0]; q.Sampler != "fifo" || q.MaxTimesSampled != 1 || q.MaxSize != 10 {
		t.Errorf("table q = %v, want a queue of 10", q)
	}
	// JSON logs: every stderr line is a JSON object.
	for _, line := range strings.Split(strings.TrimSpace(r.stderr.String()), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Errorf("log line %q is not JSON: %v", line, err)
		}
	}
}

func TestExternalServer(t *testing.T) {
	srv := natstest.Start(t)
	r := start(t, "--nats", srv.URL(), "--prefix", "ext")
	if r.url != srv.URL() {
		t.Errorf("URL %q, want the external server's %q", r.url, srv.URL())
	}
	if !strings.Contains(r.stdout.String(), "(external server)") {
		t.Errorf("ready message does not say the server is external:\n%s", r.stdout.String())
	}
	insert(t, r.url, "ext", "replay", 3)
	if got := tableSize(t, r.url, "ext", "replay"); got != 3 {
		t.Errorf("replay holds %d items, want 3", got)
	}
}

func TestExternalServerUnreachable(t *testing.T) {
	var stderr bytes.Buffer
	// Port 1 on loopback: nothing listens there.
	code := Main(testCtx(t), []string{"--nats", "nats://127.0.0.1:1", "--nats-wait", "300ms"}, io.Discard, &stderr)
	if code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	msg := stderr.String()
	if !strings.Contains(msg, "waiting for the NATS server at nats://127.0.0.1:1") {
		t.Errorf("log %q does not say what reprised waits for", msg)
	}
	if !strings.Contains(msg, "connecting to NATS at nats://127.0.0.1:1") || !strings.Contains(msg, "--nats-wait") {
		t.Errorf("error %q does not say which server it could not reach, and how to wait longer", msg)
	}
}

// TestExternalServerStartsLater: reprised started before its NATS server
// (as compose or Kubernetes start them) waits for it, saying so, and serves
// once it is up.
func TestExternalServerStartsLater(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)

	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &syncbuf.Buffer{}, &syncbuf.Buffer{}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, []string{"--nats", url, "--prefix", "late"}, stdout, stderr) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reprised: %v", err)
		}
	}()
	waitOutput(t, stderr, "waiting for the NATS server at "+url, done)
	natstest.Start(t, natstest.WithPort(port))
	waitOutput(t, stdout, "Stop it with Ctrl-C.", done)
	insert(t, url, "late", "replay", 3)
	if got := tableSize(t, url, "late", "replay"); got != 3 {
		t.Errorf("replay holds %d items, want 3", got)
	}
}

// waitOutput waits until out holds want, failing if reprised exits first.
func waitOutput(t *testing.T, out *syncbuf.Buffer, want string, done chan error) {
	t.Helper()
	testutil.WaitUntil(t, fmt.Sprintf("reprised writes %q", want), func() bool {
		select {
		case err := <-done:
			done <- err // for the deferred stop
			t.Fatalf("reprised exited: %v\n%s", err, out.String())
		default:
		}
		return strings.Contains(out.String(), want)
	})
}

func TestPortInUse(t *testing.T) {
	r := start(t, "--listen", "127.0.0.1:-1", "--store", t.TempDir())
	hostport := strings.TrimPrefix(r.url, "nats://")
	var stderr bytes.Buffer
	code := Main(testCtx(t), []string{"--listen", hostport, "--store", t.TempDir()}, io.Discard, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "pick another with --listen") {
		t.Errorf("exit status %d, stderr %q: want 1 and a hint about --listen", code, stderr.String())
	}
	// A store that is a file is not the port's fault.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	code = Main(testCtx(t), []string{"--listen", "127.0.0.1:-1", "--store", file}, io.Discard, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "not a directory") || strings.Contains(stderr.String(), "--listen)") {
		t.Errorf("store a file: exit status %d, stderr %q: want 1 and the store's reason alone", code, stderr.String())
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"serve"}, `unexpected argument "serve"`},
		{[]string{"--listen", "4222"}, "not HOST:PORT"},
		{[]string{"--prefix", "a b"}, "not a subject prefix"},
		{[]string{"--metrics", "nope"}, "not HOST:PORT"},
		{[]string{"--max-payload", "lots"}, "not a number of bytes"},
		{[]string{"--max-payload", "100"}, "out of range"},
		{[]string{"--log-level", "loud"}, `unknown log level "loud"`},
		{[]string{"--log-format", "xml"}, `unknown log format "xml"`},
		{[]string{"--nats", "nats://x:4222", "--listen", "127.0.0.1:5000"}, "--listen configures the embedded server"},
		{[]string{"--nats", "nats://x:4222", "--store", "d"}, "--store configures the embedded server"},
		{[]string{"--creds", "a.creds"}, "--creds is for connecting to an external server: add --nats URL"},
		{[]string{"--nats", "nats://x:4222", "--tls-cert", "c.pem"}, "--tls-cert and --tls-key go together"},
		{[]string{"--store", ""}, "--store is empty"},
		{[]string{"--user", "service", "--password", "pw"}, "--user is for connecting to an external server: add --nats URL"},
		{[]string{"--nkey", "s.nk"}, "--nkey is for connecting to an external server"},
		{[]string{"--nats", "nats://x:4222", "--password", "pw"}, "--password needs --user"},
		{[]string{"--nats", "nats://x:4222", "--user", "a", "--password", "p", "--creds", "c"}, "--user and --creds are different ways to authenticate"},
		{[]string{"--nats", "nats://x:4222", "--embedded-user", "actor:a:p"}, "--embedded-user configures the embedded server"},
		{[]string{"--embedded-user", "actr:a:p"}, `unknown role "actr"`},
		{[]string{"--embedded-user", "actor:alice"}, `user "alice" has no password`},
		{[]string{"--embedded-user", "actor:a.b:p"}, "without dots"},
		{[]string{"--embedded-user", "actor:a:p", "--embedded-user", "admin:a:q"}, "user a given twice"},
		{[]string{"--embedded-nkey", "learner:SUAB"}, "this is an nkey seed"},
		{[]string{"--embedded-nkey", "learner:UXYZ"}, `"UXYZ" is not the public key of a user nkey`},
		{[]string{"--nats-wait", "5s"}, "server.nats_wait or --nats-wait is 5s, which waits for an external server"},
		{[]string{"--nats", "nats://x:4222", "--user", "a", "--password", "p", "--nkey", "a.nk", "--creds", "c"}, "--nkey and --creds are different ways to authenticate"},
		{[]string{"--listen-tls-cert", "c.pem"}, "--listen-tls-cert and --listen-tls-key go together"},
		{[]string{"--listen-tls-cert", "c.pem", "--listen-tls-key", "k.pem", "--listen-tls-ca", "ca.pem"}, "add --listen-tls-verify"},
		{[]string{"--listen-tls-verify"}, "--listen-tls-verify needs TLS"},
	}
	for _, tt := range tests {
		var stderr bytes.Buffer
		err := Run(testCtx(t), tt.args, io.Discard, &stderr)
		if !errors.Is(err, cli.ErrUsage) {
			t.Errorf("Run(%q) = %v, want a usage error", tt.args, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Run(%q) = %q, want it to contain %q", tt.args, err, tt.want)
		}
		if code := Main(testCtx(t), tt.args, io.Discard, &stderr); code != 2 {
			t.Errorf("Main(%q) exit status %d, want 2", tt.args, code)
		}
	}
}

// TestSecretsNotPrinted: a password or an nkey seed given on the command
// line, in a config file or in the --nats URL never reaches reprised's
// output, whether it is refused or used. The flag package printed refused
// --embedded-user values whole, a seed given for a public key was quoted,
// and the URL's password was in the log and the ready banner.
func TestSecretsNotPrinted(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	const secret = "S3cretPW"
	cfg := filepath.Join(t.TempDir(), "r.yaml")
	if err := os.WriteFile(cfg, []byte("server:\n  users:\n    - {nkey: "+string(seed)+", role: learner}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Users written as htpasswd lines, which the config quoted back.
	scalarUser := filepath.Join(t.TempDir(), "scalar-user.yaml")
	if err := os.WriteFile(scalarUser, []byte("server:\n  users:\n    - alice:"+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	scalarUsers := filepath.Join(t.TempDir(), "scalar-users.yaml")
	if err := os.WriteFile(scalarUsers, []byte("server:\n  users: alice:"+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--config", scalarUser},
		{"--config", scalarUsers},
		{"--embedded-user", "actr:alice:" + secret},
		{"--embedded-user", "actor:bad name:" + secret},
		{"--embedded-user", "actor:alice:x1", "--embedded-user", "actor:alice:" + secret},
		{"--embedded-nkey", "learner:" + string(seed)},
		{"--config", cfg},
		{"--nats", "nats://svc:" + secret + "@127.0.0.1:1", "--nats-wait", "300ms"},
		{"--nats", "nats://" + secret + "@127.0.0.1:1", "--nats-wait", "300ms"},
	} {
		var stderr bytes.Buffer
		if code := Main(testCtx(t), args, io.Discard, &stderr); code == 0 {
			t.Errorf("%q: exit status 0", args)
		}
		if out := stderr.String(); strings.Contains(out, secret) || strings.Contains(out, string(seed)) {
			t.Errorf("%q: the secret is in its output:\n%s", args, out)
		}
	}
	srv := natstest.Start(t, natstest.WithConfig(`authorization { users = [ {user: svc, password: `+secret+`} ] }`, nats.UserInfo("svc", secret)))
	r := start(t, "--nats", strings.Replace(srv.URL(), "nats://", "nats://svc:"+secret+"@", 1))
	r.stop()
	if out := r.stdout.String() + r.stderr.String(); strings.Contains(out, secret) || !strings.Contains(out, "nats://svc:xxxxx@") {
		t.Errorf("serving: the password is in the output, or the server is not named:\n%s", out)
	}
}

// TestConnectionSettingsOfFile: the file's connection settings are checked
// where they are, by key and line, and a way to authenticate given by flag
// replaces the file's. They were reported as flags nobody gave, and a flag
// added a second way.
func TestConnectionSettingsOfFile(t *testing.T) {
	dir := t.TempDir()
	for key, text := range map[string]string{
		"server.password":     "server:\n  nats: nats://127.0.0.1:1\n  password: pw\n",
		"server.inbox_prefix": "server:\n  nats: nats://127.0.0.1:1\n  inbox_prefix: \"a.*\"\n",
		"server.nkey":         "server:\n  nats: nats://127.0.0.1:1\n  user: svc\n  password: pw\n  nkey: s.nk\n",
	} {
		cfg := filepath.Join(dir, strings.ReplaceAll(key, ".", "-")+".yaml")
		if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		if code := Main(testCtx(t), []string{"--config", cfg}, io.Discard, &stderr); code != 1 || !strings.Contains(stderr.String(), cfg+":") || !strings.Contains(stderr.String(), key+":") {
			t.Errorf("%s: exit status %d, %q: want the file, line and key", key, code, stderr.String())
		}
	}
	// The file's way to authenticate gives way to --creds: what is left to
	// fail is reading the credentials, not two ways at once.
	cfg := filepath.Join(dir, "user.yaml")
	if err := os.WriteFile(cfg, []byte("server:\n  nats: nats://127.0.0.1:1\n  user: svc\n  password: pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Run(testCtx(t), []string{"--config", cfg, "--creds", filepath.Join(dir, "missing.creds"), "--nats-wait", "200ms"}, io.Discard, io.Discard)
	if err == nil || strings.Contains(err.Error(), "different ways to authenticate") {
		t.Errorf("--creds over a file's user: %v", err)
	}
	// A file's replicas and nats_wait need an external server, which --nats
	// may give (examples/deploy) or take away.
	cluster := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(cluster, []byte("server:\n  nats_wait: 5m\nstream:\n  replicas: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := parseArgs([]string{"--config", cluster, "--nats", "nats://127.0.0.1:1"}, io.Discard); err != nil {
		t.Errorf("replicas 3 and nats_wait with --nats: %v", err)
	}
	for _, args := range [][]string{{"--config", cluster}, {"--config", cluster, "--nats", ""}} {
		if _, err := parseArgs(args, io.Discard); !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), "stream.replicas is 3") {
			t.Errorf("%q: %v, want a usage error naming stream.replicas", args, err)
		}
	}
	wait := filepath.Join(dir, "wait.yaml")
	if err := os.WriteFile(wait, []byte("server:\n  nats_wait: 5m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := parseArgs([]string{"--config", wait}, io.Discard); !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), "server.nats_wait or --nats-wait is 5m0s") {
		t.Errorf("nats_wait with the embedded server: %v, want a usage error naming it", err)
	}
	// --nats "" turns a file's server off, and its nats_wait with it.
	ext := filepath.Join(dir, "ext.yaml")
	if err := os.WriteFile(ext, []byte("server:\n  nats: nats://10.0.0.1:4222\n  nats_wait: 1m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, err := parseArgs([]string{"--config", ext, "--nats", ""}, io.Discard); err != nil || cfg.Server.NATSWait != 0 {
		t.Errorf("a file's server and nats_wait turned off by --nats \"\": %v, nats_wait %v", err, cfg.Server.NATSWait)
	}
}

// TestBadSeedFileDoesNotWait: a --nkey file that holds no seed ends the
// start at once, with the reason; reprised used to wait on it as if for
// the server, until stopped, and then exit 0.
func TestBadSeedFileDoesNotWait(t *testing.T) {
	srv := natstest.Start(t)
	bad := filepath.Join(t.TempDir(), "bad.nk")
	if err := os.WriteFile(bad, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	if code := Main(testCtx(t), []string{"--nats", srv.URL(), "--nkey", bad}, io.Discard, &stderr); code != 1 || !strings.Contains(stderr.String(), "holds no user nkey seed") {
		t.Errorf("exit status %d, %q: want 1 and the reason", code, stderr.String())
	}
}

func TestConfigFileErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("tables:\n  - name: t\n    max_size: 10\n    sampler: unifrom\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	if code := Main(testCtx(t), []string{"--config", bad}, io.Discard, &stderr); code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	if want := bad + `:4: tables[0].sampler: unknown selector kind "unifrom": did you mean "uniform"?`; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr %q lacks %q", stderr.String(), want)
	}
	err := Run(testCtx(t), []string{"--config", filepath.Join(dir, "missing.yaml")}, io.Discard, io.Discard)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing config file: %v, want a not-exist error", err)
	}
	// A config file that sets the external server and a flag that sets an
	// embedded-only setting contradict each other.
	ext := filepath.Join(dir, "ext.yaml")
	if err := os.WriteFile(ext, []byte("server:\n  nats: nats://10.0.0.1:4222\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = Run(testCtx(t), []string{"--config", ext, "--listen", "127.0.0.1:4222"}, io.Discard, io.Discard)
	if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), "NATS is external (nats://10.0.0.1:4222)") {
		t.Errorf("got %v, want a usage error naming the external server", err)
	}
}

// TestListenBeyondLoopback: an embedded server reachable from other
// machines with no way to authenticate clients needs the explicit flag,
// and then reprised warns.
func TestListenBeyondLoopback(t *testing.T) {
	var stderr bytes.Buffer
	code := Main(testCtx(t), []string{"--listen", "0.0.0.0:-1", "--store", t.TempDir()}, io.Discard, &stderr)
	for _, want := range []string{"--listen 0.0.0.0:-1 reaches beyond this machine", "--embedded-user", "--allow-unauthenticated"} {
		if code != 2 || !strings.Contains(stderr.String(), want) {
			t.Errorf("exit status %d, stderr %q: want 2 and %q", code, stderr.String(), want)
		}
	}
	r := start(t, "--listen", "0.0.0.0:-1", "--store", t.TempDir(), "--allow-unauthenticated")
	if !strings.Contains(r.stderr.String(), "without authentication") {
		t.Errorf("no warning about listening without authentication:\n%s", r.stderr.String())
	}
	start(t, "--listen", "0.0.0.0:-1", "--store", t.TempDir(), "--embedded-user", "admin:ops:pw")
}

func TestHelp(t *testing.T) {
	var stderr bytes.Buffer
	err := Run(testCtx(t), []string{"--help"}, io.Discard, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Run(--help) = %v, want flag.ErrHelp", err)
	}
	if code := Main(testCtx(t), []string{"-h"}, io.Discard, io.Discard); code != 0 {
		t.Errorf("exit status %d for -h, want 0", code)
	}
	help := stderr.String()
	for _, f := range []string{"config", "nats", "creds", "user", "password", "nkey", "inbox-prefix", "tls-ca", "tls-cert", "tls-key", "listen", "listen-tls-cert", "listen-tls-key", "listen-tls-ca", "listen-tls-verify", "allow-unauthenticated", "embedded-user", "embedded-nkey", "store", "max-payload", "prefix", "metrics", "log-format", "log-level"} {
		if !strings.Contains(help, "--"+f+" ") && !strings.Contains(help, "--"+f+"\n") {
			t.Errorf("help does not explain --%s:\n%s", f, help)
		}
	}
	if !strings.Contains(help, "reprise.example.yaml") {
		t.Error("help does not point to the example configuration")
	}
}

func TestStopBeforeReady(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Run(ctx, []string{"--listen", "127.0.0.1:-1", "--store", t.TempDir()}, io.Discard, io.Discard); err != nil {
		t.Errorf("Run with a context already done = %v, want nil (a shutdown)", err)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := parseArgs(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	def := config.Default()
	if cfg.Server.Listen != "127.0.0.1:4222" || cfg.Server.Store != "./reprise-data" || cfg.Server.Prefix != "reprise" || !cfg.Server.Embedded() {
		t.Errorf("defaults %+v, want the embedded server on 127.0.0.1:4222 with ./reprise-data", cfg.Server)
	}
	if len(cfg.Tables) != 1 || cfg.Tables[0].Name != "replay" || cfg.Tables[0].MaxSize != def.Tables[0].MaxSize {
		t.Errorf("default tables %+v", cfg.Tables)
	}
}

func TestExternalServerWithoutJetStream(t *testing.T) {
	// A free port: listen, note it, close.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	cmd := exec.Command(natstest.Binary(t), "-a", "127.0.0.1", "-p", port)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	url := "nats://127.0.0.1:" + port
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		nc, err := nats.Connect(url)
		if err == nil {
			nc.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server without JetStream did not come up: %v", err)
		}
		<-tick.C
	}
	var stderr bytes.Buffer
	code := Main(testCtx(t), []string{"--nats", url}, io.Discard, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "has no JetStream") || !strings.Contains(stderr.String(), "-js") {
		t.Errorf("exit status %d, stderr %q: want 1 and a hint to enable JetStream", code, stderr.String())
	}
}

// TestFinalCheckpointFailureIsReported: a final checkpoint that cannot be
// written makes the shutdown fail. Reported as a clean stop, the items
// acknowledged since the last checkpoint went unnoticed until the stream's
// limits dropped them.
func TestFinalCheckpointFailureIsReported(t *testing.T) {
	dir := t.TempDir()
	checkpoints := filepath.Join(dir, "checkpoints")
	r := start(t, "--listen", "127.0.0.1:-1", "--store", filepath.Join(dir, "data"), "--checkpoint-dir", checkpoints, "--checkpoint-every", "0s")
	insert(t, r.url, r.prefix, "replay", 3)
	// A file where the directory was: no checkpoint can go in, whoever
	// runs the test (root ignores permissions).
	if err := os.RemoveAll(checkpoints); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(checkpoints, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := r.stop()
	if err == nil || !errors.Is(err, errStopping) || !strings.Contains(err.Error(), "final checkpoint") {
		t.Fatalf("stopping with no place for the final checkpoint = %v, want an error about it", err)
	}
	r.stop = func() error { return nil } // the failure was the point
}

// reprised opens service.reply_conns connections for sample replies, the
// request connection among them, or one per two cores for 0.
func TestReplyConnections(t *testing.T) {
	url := testutil.StartEmbedded(t, 0)
	for _, tc := range []struct{ configured, want int }{{1, 1}, {3, 3}, {0, service.DefaultReplyConns(runtime.GOMAXPROCS(0))}} {
		d := &daemon{cfg: config.Default()}
		d.cfg.Service.ReplyConns = tc.configured
		var names []string
		err := d.dialReplies(func(name string) (*nats.Conn, error) {
			names = append(names, name)
			return nats.Connect(url, nats.Name(name))
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, nc := range d.replies {
			nc.Close()
		}
		if len(names) != tc.want-1 || len(d.replies) != tc.want-1 || (len(names) > 0 && names[len(names)-1] != fmt.Sprintf("reprised replies %d", tc.want-1)) {
			t.Errorf("reply_conns %d: dialled %q, want %d connections beside the request connection", tc.configured, names, tc.want-1)
		}
	}
	if got := service.DefaultReplyConns(2); got != 2 {
		t.Errorf("2 cores: %d reply connections, want 2", got)
	}
	if got := service.DefaultReplyConns(16); got != 8 {
		t.Errorf("16 cores: %d reply connections, want 8", got)
	}
}

// TestCheckpointDirOfAnotherPrefix: checkpoint files do not say whose they
// are, so a reprised given another prefix's --checkpoint-dir (shards
// started by one script) recovered that prefix's tables as its own, and
// the two deleted each other's checkpoints when keeping the newest. It
// must refuse the directory, naming the prefix that owns it.
func TestCheckpointDirOfAnotherPrefix(t *testing.T) {
	dir := t.TempDir()
	checkpoints := filepath.Join(dir, "checkpoints")
	r := start(t, "--listen", "127.0.0.1:-1", "--store", filepath.Join(dir, "data"), "--prefix", "p0", "--checkpoint-dir", checkpoints, "--checkpoint-every", "0s")
	insert(t, r.url, r.prefix, "replay", 3)
	c, err := broker.NewClient(connect(t, r.url), broker.WithPrefix("p0"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Checkpoint(testCtx(t)); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	err = Run(ctx, []string{"--nats", r.url, "--prefix", "p1", "--checkpoint-dir", checkpoints}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), checkpoints) || !strings.Contains(err.Error(), `"p0"`) {
		t.Fatalf("reprised of prefix p1 on p0's checkpoint dir: Run = %v, want an error naming the dir and p0\nstderr:\n%s", err, stderr.String())
	}
	start(t, "--nats", r.url, "--prefix", "p1", "--checkpoint-dir", filepath.Join(dir, "p1-checkpoints"))
}

// TestSecondServiceOfAPrefix: two reprised of one prefix without
// --standby both applied the stream and both answered (a queue's items
// were sampled once by each, info came from either, each checkpointed and
// trimmed). The second must refuse to start, saying what to do.
func TestSecondServiceOfAPrefix(t *testing.T) {
	r := start(t, "--listen", "127.0.0.1:-1", "--store", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	err := Run(ctx, []string{"--nats", r.url, "--checkpoint-dir", t.TempDir()}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "--standby") {
		t.Fatalf("a second reprised of prefix %s: Run = %v, want an error pointing to --standby\nstdout:\n%s", r.prefix, err, stdout.String())
	}
	// A standby beside it found the lease free, took it and served too.
	var stdout2 syncbuf.Buffer
	err = Run(ctx, []string{"--nats", r.url, "--standby"}, &stdout2, &stderr)
	if err == nil || !strings.Contains(err.Error(), "--standby") {
		t.Fatalf("a reprised with --standby beside one without: Run = %v, want an error pointing to --standby\nstdout:\n%s", err, stdout2.String())
	}
}

// TestLargestMaxPayloadCarriesItsMessages: JetStream's file store refuses a
// message over 32 MiB whatever max_payload says, and the producer, told
// 503, retried it until it gave up: an item of a size reprised's largest
// max_payload let through never got in. Every max_payload reprised accepts
// must carry an item nearly that large.
func TestLargestMaxPayloadCarriesItsMessages(t *testing.T) {
	r := start(t, "--listen", "127.0.0.1:-1", "--store", t.TempDir(), "--max-payload", strconv.Itoa(config.MaxMaxPayload))
	ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Second)
	defer cancel()
	p, err := broker.NewProducer(ctx, connect(t, r.url), broker.WithCompression(wire.Uncompressed))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	obs := make([]byte, config.MaxMaxPayload-1<<20)
	if err := p.Append(ctx, broker.Step{"obs": broker.Uint8s([]int64{int64(len(obs))}, obs)}); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateItem(ctx, "replay", 1, broker.LastStep("obs")); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("an item of %d bytes with max_payload %d: %v", len(obs), config.MaxMaxPayload, err)
	}
}

// TestPrefixThatNamesNoStream: a prefix is also the name of the stream and
// of the checkpoint and lease buckets, which JetStream takes of fewer
// characters than subjects: "a/b" names no stream, "équipe" no bucket.
// Such a prefix is refused before the service starts, naming what it
// cannot name and the way out; the JetStream calls of the running service
// named only the stream or bucket.
func TestPrefixThatNamesNoStream(t *testing.T) {
	store := t.TempDir()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--prefix", "a/b"}, `prefix "a/b" names the stream REPRISE_A/B`},
		{[]string{"--prefix", "équipe"}, "REPRISE_ÉQUIPE_CHECKPOINTS"},
		{[]string{"--prefix", "équipe", "--checkpoint-dir", t.TempDir(), "--standby"}, "REPRISE_ÉQUIPE_LEASE"},
	}
	for _, tt := range tests {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := Run(ctx, append([]string{"--listen", "127.0.0.1:-1", "--store", store}, tt.args...), io.Discard, io.Discard)
		cancel()
		if !errors.Is(err, broker.ErrInvalidPrefix) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Run(%q) = %v, want ErrInvalidPrefix containing %q", tt.args, err, tt.want)
		}
	}
}
