package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/reprise-rl/reprise/internal/natstest"
)

// modulePath is the module the suite builds reprised and reprisectl from.
const modulePath = "github.com/reprise-rl/reprise"

// moduleRoot finds the Reprise module that contains dir.
func moduleRoot(ctx context.Context, dir string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "env", "GOMOD")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("finding the Reprise module (go env GOMOD in %s): %w", dir, err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("%s is not inside the Reprise module: run the suite from the repository (or pass --repo)", dir)
	}
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	if !bytes.Contains(data, []byte("module "+modulePath+"\n")) {
		return "", fmt.Errorf("%s is not %s's go.mod: run the suite from the Reprise repository (or pass --repo)", gomod, modulePath)
	}
	return filepath.Dir(gomod), nil
}

type binaries struct {
	reprised, reprisectl string
	// natsServer is empty unless a section runs reprised on a NATS
	// server of its own.
	natsServer string
}

// natsServerModule is the NATS server the shards section runs, at the
// version go.mod requires, as internal/natstest builds it for tests.
const natsServerModule = "github.com/nats-io/nats-server/v2"

// build compiles reprised and reprisectl, and nats-server if withNATS, into
// dir: the suite measures the programs users run.
func build(ctx context.Context, repo, dir string, withNATS bool) (binaries, error) {
	pkgs := []string{"./cmd/reprised", "./cmd/reprisectl"}
	if withNATS {
		pkgs = append(pkgs, natsServerModule)
	}
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return binaries{}, fmt.Errorf("building %s (go build in %s): %w\n%s", strings.Join(pkgs, " "), repo, err, out)
	}
	b := binaries{reprised: filepath.Join(dir, "reprised"), reprisectl: filepath.Join(dir, "reprisectl")}
	if withNATS {
		b.natsServer = filepath.Join(dir, "nats-server")
	}
	return b, nil
}

// prebuilt finds reprised and reprisectl, and nats-server if withNATS, in
// dir, as --bin names them.
func prebuilt(dir string, withNATS bool) (binaries, error) {
	names := []string{"reprised", "reprisectl"}
	if withNATS {
		names = append(names, "nats-server")
	}
	paths := make([]string, len(names))
	for i, name := range names {
		paths[i] = filepath.Join(dir, name)
		info, err := os.Stat(paths[i])
		if err != nil {
			return binaries{}, fmt.Errorf("--bin %s: %w", dir, err)
		}
		if info.IsDir() || info.Mode().Perm()&0o111 == 0 {
			return binaries{}, fmt.Errorf("--bin %s: %s is not an executable file", dir, paths[i])
		}
	}
	b := binaries{reprised: paths[0], reprisectl: paths[1]}
	if withNATS {
		b.natsServer = paths[2]
	}
	return b, nil
}

// daemon is a server process the suite started: reprised or nats-server.
type daemon struct {
	name    string // which program, for messages
	cmd     *exec.Cmd
	url     string
	logPath string
	exited  chan struct{}
	waitErr error
}

// embeddedArgs are the arguments of a reprised with its embedded server
// on a free loopback port and its JetStream data under dir.
func embeddedArgs(config, dir, name string) []string {
	return []string{"--config", config, "--listen", "127.0.0.1:-1", "--store", filepath.Join(dir, name+"-store")}
}

// startDaemon starts reprised with args, its log in dir, and waits until
// it says it is ready.
func startDaemon(ctx context.Context, bin, dir, name string, args ...string) (*daemon, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	d := &daemon{name: "reprised", cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	urls := make(chan string, 1)
	var reading sync.WaitGroup
	reading.Go(func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			// "  NATS URL:  nats://127.0.0.1:PORT (embedded server, ...)"
			if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "NATS URL:"); ok {
				if f := strings.Fields(rest); len(f) > 0 {
					select {
					case urls <- f[0]:
					default:
					}
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	})
	go func() {
		reading.Wait()
		d.waitErr = cmd.Wait()
		logFile.Close()
		close(d.exited)
	}()
	timer := time.NewTimer(time.Minute)
	defer timer.Stop()
	select {
	case d.url = <-urls:
		return d, nil
	case <-d.exited:
		return nil, fmt.Errorf("reprised exited before it was ready (%v):\n%s", d.waitErr, tail(logPath))
	case <-timer.C:
		d.stop()
		return nil, fmt.Errorf("reprised was not ready within a minute:\n%s", tail(logPath))
	case <-ctx.Done():
		d.stop()
		return nil, ctx.Err()
	}
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// startNATS starts nats-server with JetStream on a free loopback port,
// its data and log in dir, and waits until JetStream answers.
func startNATS(ctx context.Context, bin, dir string) (*daemon, error) {
	portsDir := filepath.Join(dir, "nats-server-ports")
	if err := os.MkdirAll(portsDir, 0o755); err != nil {
		return nil, err
	}
	// Port -1 takes a free one, which the server writes into the ports
	// file once it listens.
	conf := fmt.Sprintf("host: \"127.0.0.1\"\nport: -1\nports_file_dir: %q\njetstream {\n  store_dir: %q\n}\n", portsDir, filepath.Join(dir, "nats-server-store"))
	confPath := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "nats-server.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-c", confPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	d := &daemon{name: "nats-server", cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		d.waitErr = cmd.Wait()
		logFile.Close()
		close(d.exited)
	}()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if url := natstest.ReadPortsFile(portsDir); url != "" && natstest.JetStreamAnswers(ctx, url) == nil {
			d.url = url
			return d, nil
		}
		select {
		case <-d.exited:
			return nil, fmt.Errorf("nats-server exited before it was ready (%v):\n%s", d.waitErr, tail(logPath))
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), d.stop())
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return nil, errors.Join(fmt.Errorf("nats-server's JetStream did not answer within a minute:\n%s", tail(logPath)), d.stop())
		}
	}
}

// stop interrupts the process, as Ctrl-C would, and waits for it to exit;
// after 30 seconds it kills it.
func (d *daemon) stop() error {
	_ = d.cmd.Process.Signal(os.Interrupt)
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case <-d.exited:
	case <-timer.C:
		_ = d.cmd.Process.Kill()
		<-d.exited
		return fmt.Errorf("%s did not stop within 30s of an interrupt: killed it:\n%s", d.name, tail(d.logPath))
	}
	if d.waitErr != nil {
		return fmt.Errorf("%s: %w:\n%s", d.name, d.waitErr, tail(d.logPath))
	}
	return nil
}

// alive reports an error if the process has exited.
func (d *daemon) alive() error {
	select {
	case <-d.exited:
		return fmt.Errorf("%s exited (%v):\n%s", d.name, d.waitErr, tail(d.logPath))
	default:
		return nil
	}
}

// tail returns the last lines of a log file, to explain a failure.
func tail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// ctlArgs is one reprisectl bench run.
type ctlArgs struct {
	mode, table             string
	clients, payload, batch int
	warmup, duration        time.Duration
	// prefixes are the shards' (the default prefix if none); sharded
	// loads through the sharded producer and client even with one.
	prefixes []string
	sharded  bool
	// episode is the items of an inserter's episode (0: reprisectl's
	// default).
	episode int
}

// ctlReport is the part of reprisectl bench --json the suite reads.
type ctlReport struct {
	ItemsPerSec float64    `json:"items_per_sec"`
	BytesPerSec float64    `json:"bytes_per_sec"`
	Latency     ctlLatency `json:"latency"`
	Insert      *ctlOp     `json:"insert"`
	Sample      *ctlOp     `json:"sample"`
}

type ctlOp struct {
	Items       int64      `json:"items"`
	ItemsPerSec float64    `json:"items_per_sec"`
	BytesPerSec float64    `json:"bytes_per_sec"`
	RateLimited int64      `json:"rate_limited_requests"`
	Latency     ctlLatency `json:"latency"`
}

type ctlLatency struct {
	Count int64   `json:"count"`
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
}

// ctlBench runs reprisectl bench against the daemon and decodes its
// report.
func ctlBench(ctx context.Context, bin, url string, a ctlArgs) (ctlReport, error) {
	args := []string{"bench", "--nats", url, "--json",
		"--mode", a.mode, "--table", a.table,
		"--clients", strconv.Itoa(a.clients), "--payload", strconv.Itoa(a.payload), "--batch", strconv.Itoa(a.batch),
		"--warmup", a.warmup.String(), "--duration", a.duration.String()}
	for _, p := range a.prefixes {
		args = append(args, "--prefix", p)
	}
	if a.sharded {
		args = append(args, "--sharded")
	}
	if a.episode > 0 {
		args = append(args, "--episode", strconv.Itoa(a.episode))
	}
	ctx, cancel := context.WithTimeout(ctx, a.warmup+a.duration+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return ctlReport{}, fmt.Errorf("reprisectl %s: %w\n%s", strings.Join(args, " "), err, lastLines(stderr.String(), 10))
	}
	var r ctlReport
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		return ctlReport{}, fmt.Errorf("reprisectl %s: reading its --json output: %w\n%s", strings.Join(args, " "), err, lastLines(stdout.String(), 10))
	}
	if r.Insert == nil && r.Sample == nil {
		return ctlReport{}, errors.New("reprisectl bench reported neither inserts nor samples")
	}
	return r, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
