// Package natstest runs a real nats-server process for integration tests.
// Unlike an embedded server, a separate process can be killed with SIGKILL
// and restarted on the same port and store, which is how tests check that
// acknowledged data survives a crash.
//
// The server is built from the nats-server module this repository
// requires, with the local Go toolchain, once per machine and version.
package natstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/reprise-rl/reprise/internal/syncbuf"
)

const serverModule = "github.com/nats-io/nats-server/v2"

// readyTimeout bounds how long Start and Restart wait for the server, and
// Stop for it to exit, on a loaded CI machine.
const readyTimeout = 30 * time.Second

var built struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of a nats-server executable built from the
// module version in go.mod. The first call on a machine builds it (this
// takes a while) into a directory under os.TempDir() named after that
// version; later calls, from this or other test binaries, reuse it.
func Binary(t testing.TB) string {
	t.Helper()
	built.once.Do(func() { built.path, built.err = build() })
	if built.err != nil {
		t.Fatalf("natstest: %v", built.err)
	}
	return built.path
}

func build() (string, error) {
	version, err := moduleVersion()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(os.TempDir(), "reprise-natstest", "nats-server@"+version)
	path := filepath.Join(dir, "nats-server")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Build in a private directory and rename into place, so test binaries
	// building at the same time never see a half-written executable.
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "nats-server")
	cmd := exec.Command("go", "build", "-o", out, serverModule)
	if output, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s@%s: %v\n%s", serverModule, version, err, output)
	}
	if err := os.Rename(out, path); err != nil {
		return "", err
	}
	return path, nil
}

// moduleVersion asks the go command which nats-server version the current
// module requires.
func moduleVersion() (string, error) {
	output, err := exec.Command("go", "list", "-m", "-json", serverModule).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("%v: %s", err, exit.Stderr)
		}
		return "", fmt.Errorf("go list -m %s: %v", serverModule, err)
	}
	var m struct {
		Version string
		Replace *struct{ Path string }
	}
	if err := json.Unmarshal(output, &m); err != nil {
		return "", fmt.Errorf("go list -m %s: %v", serverModule, err)
	}
	if m.Replace != nil {
		return "", fmt.Errorf("%s is replaced by %s; binaries are cached by version, so natstest cannot build it", serverModule, m.Replace.Path)
	}
	return m.Version, nil
}

// Option configures Start.
type Option func(*config)

type config struct {
	storeDir   string
	maxPayload int32
	port       int
	extra      string
	probe      []nats.Option
	// name and cluster are set by StartCluster: the server name and the
	// cluster block of the configuration file.
	name    string
	cluster string
}

// WithPort listens on port instead of a free one: for a client started
// before the server.
func WithPort(port int) Option {
	return func(c *config) { c.port = port }
}

// WithStoreDir keeps JetStream data in dir instead of a fresh t.TempDir(),
// so a later Process can find it.
func WithStoreDir(dir string) Option {
	return func(c *config) { c.storeDir = dir }
}

// WithMaxPayload sets the server's max_payload, in bytes.
func WithMaxPayload(bytes int32) Option {
	return func(c *config) { c.maxPayload = bytes }
}

// WithConfig appends text to the server's configuration file, e.g. an
// authorization block. probe are the connection options Start checks
// readiness with: the credentials of a user the block lets ask JetStream
// for its account info ($JS.API.INFO) and read its inbox.
func WithConfig(text string, probe ...nats.Option) Option {
	return func(c *config) { c.extra, c.probe = text, probe }
}

// Process is a nats-server process with JetStream, listening on a loopback
// port that stays the same across restarts.
type Process struct {
	bin    string
	cfg    config
	output syncbuf.Buffer

	mu     sync.Mutex
	url    string
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start starts a nats-server on a free loopback port and returns once
// JetStream answers. The process is killed when the test ends; its output
// is logged if the test failed.
func Start(t testing.TB, opts ...Option) *Process {
	t.Helper()
	p := &Process{bin: Binary(t)}
	for _, opt := range opts {
		opt(&p.cfg)
	}
	if p.cfg.storeDir == "" {
		p.cfg.storeDir = t.TempDir()
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("nats-server output:\n%s", p.output.String())
		}
	})
	port := -1
	if p.cfg.port > 0 {
		port = p.cfg.port
	}
	p.launch(t, port)
	return p
}

// URL returns the client URL, the same after a restart.
func (p *Process) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.url
}

// Kill sends SIGKILL and waits for the process to exit: nothing is
// flushed or closed cleanly. It does nothing if the process has exited.
func (p *Process) Kill() {
	p.signalAndWait(syscall.SIGKILL)
}

// Stop sends SIGTERM, which makes the server shut down cleanly, and waits
// for the process to exit (killing it if it takes too long). It does
// nothing if the process has exited.
func (p *Process) Stop() {
	p.signalAndWait(syscall.SIGTERM)
}

// Restart starts the server again on the same port and store dir, stopping
// it first if it is still running, and returns once JetStream answers.
func (p *Process) Restart(t testing.TB) {
	t.Helper()
	p.Stop()
	p.mu.Lock()
	port := p.port
	p.mu.Unlock()
	p.launch(t, port)
}

func (p *Process) signalAndWait(sig syscall.Signal) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	// An error means the process is already gone, which is what we want.
	_ = cmd.Process.Signal(sig)
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case <-exited:
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-exited
	}
}

// launch starts the process on port (-1 for any) and waits until it
// serves JetStream.
func (p *Process) launch(t testing.TB, port int) {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	p.spawn(t, port, deadline)
	p.awaitJetStream(t, deadline)
}

// spawn starts the process on port (-1 for any) and returns once it
// listens for clients. A cluster node cannot serve JetStream alone, so
// StartCluster spawns every node before it waits for JetStream on any.
func (p *Process) spawn(t testing.TB, port int, deadline time.Time) {
	t.Helper()
	dir := t.TempDir()
	conf := fmt.Sprintf("host: \"127.0.0.1\"\nport: %d\nports_file_dir: %q\njetstream {\n  store_dir: %q\n}\n", port, dir, p.cfg.storeDir)
	if p.cfg.maxPayload > 0 {
		conf += fmt.Sprintf("max_payload: %d\n", p.cfg.maxPayload)
	}
	if p.cfg.name != "" {
		conf += fmt.Sprintf("server_name: %q\n", p.cfg.name)
	}
	conf += p.cfg.cluster
	conf += p.cfg.extra
	confPath := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	cmd := exec.Command(p.bin, "-c", confPath)
	cmd.Stdout = &p.output
	cmd.Stderr = &p.output
	if err := cmd.Start(); err != nil {
		t.Fatalf("natstest: starting nats-server: %v", err)
	}
	exited := make(chan struct{})
	// Owned by the Process: it ends when the server exits, which Kill,
	// Stop and the test cleanup ensure.
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()

	var clientURL string
	for clientURL == "" {
		clientURL = ReadPortsFile(dir)
		if clientURL == "" {
			p.await(t, "ports file", deadline)
		}
	}
	u, err := url.Parse(clientURL)
	if err != nil {
		t.Fatalf("natstest: client URL %q: %v", clientURL, err)
	}
	bound, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("natstest: client URL %q: %v", clientURL, err)
	}
	p.mu.Lock()
	p.url, p.port = clientURL, bound
	p.mu.Unlock()
}

// awaitJetStream returns once the server answers a JetStream request; in a
// cluster that needs a meta leader.
func (p *Process) awaitJetStream(t testing.TB, deadline time.Time) {
	t.Helper()
	url := p.URL()
	for err := JetStreamAnswers(context.Background(), url, p.cfg.probe...); err != nil; err = JetStreamAnswers(context.Background(), url, p.cfg.probe...) {
		p.await(t, fmt.Sprintf("JetStream (last error: %v)", err), deadline)
	}
}

// await pauses before the next readiness check, failing the test if the
// process exited or the deadline passed.
func (p *Process) await(t testing.TB, what string, deadline time.Time) {
	t.Helper()
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	timer := time.NewTimer(20 * time.Millisecond)
	defer timer.Stop()
	select {
	case <-exited:
		t.Fatalf("natstest: nats-server %s exited while waiting for %s:\n%s", p.cfg.name, what, p.output.String())
	case <-timer.C:
	}
	if time.Now().After(deadline) {
		t.Fatalf("natstest: nats-server %s: no %s after %v:\n%s", p.cfg.name, what, readyTimeout, p.output.String())
	}
}

// ReadPortsFile returns the client URL from the ports file a nats-server
// configured with ports_file_dir: dir writes once it listens, or "" while
// there is none. The benchmark suite, which starts servers outside tests,
// uses it too.
func ReadPortsFile(dir string) string {
	matches, _ := filepath.Glob(filepath.Join(dir, "*.ports"))
	for _, m := range matches {
		data, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		var ports struct {
			Nats []string `json:"nats"`
		}
		// A file still being written does not parse; the caller retries.
		if json.Unmarshal(data, &ports) == nil && len(ports.Nats) > 0 {
			return ports.Nats[0]
		}
	}
	return ""
}

// JetStreamAnswers asks the server at clientURL, connecting with probe's
// options, for its JetStream account, waiting a second at most: nil once
// JetStream serves. The benchmark suite uses it too.
func JetStreamAnswers(ctx context.Context, clientURL string, probe ...nats.Option) error {
	nc, err := nats.Connect(clientURL, append([]nats.Option{nats.Timeout(time.Second), nats.NoReconnect()}, probe...)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}
