// Package deploy gives the examples a Reprise deployment to talk to: a
// running reprised (by default), or with --embedded a NATS server and a
// table service inside the example, in a temporary directory, so that the
// example also runs alone. Either way the example finds the tables it needs,
// empty.
package deploy

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/internal/natsconn"
	"github.com/reprise-rl/reprise/tables"
)

// Flags are the command-line flags every example takes.
type Flags struct {
	// Conn is where reprised's NATS server is and how to authenticate.
	Conn     natsconn.Config
	Prefix   string
	Embedded bool
}

// Register adds --nats, the authentication flags (--user, --password,
// --nkey, --creds, TLS), --prefix and --embedded to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Conn.URL, "nats", natsconn.DefaultURL, "`URL` of the NATS server of a running reprised")
	f.Conn.RegisterAuth(fs)
	fs.StringVar(&f.Prefix, "prefix", broker.DefaultPrefix, "subject `prefix` of that reprised")
	fs.BoolVar(&f.Embedded, "embedded", false, "run alone: start a NATS server and a table service inside this program")
}

// Deployment is where an example's actors and learners connect.
type Deployment struct {
	Prefix string
	// Where is a description for output: the URL, or "an embedded NATS
	// server".
	Where string

	connect func() (*nats.Conn, error)
	stop    func() error

	mu    sync.Mutex
	conns []*nats.Conn
}

// Start reaches the deployment f names and checks that it serves every
// table in want as configured there, then resets them so the example
// starts from empty tables (and a rerun behaves like the first run).
func Start(ctx context.Context, f Flags, want []tables.Config) (*Deployment, error) {
	d := &Deployment{Prefix: f.Prefix}
	d.stop = func() error {
		d.closeConns()
		return nil
	}
	if f.Embedded {
		if err := d.startEmbedded(ctx, want); err != nil {
			return nil, errors.Join(err, d.Close())
		}
	} else {
		if err := f.Conn.Check(); err != nil {
			return nil, err
		}
		d.Where = f.Conn.URL
		d.connect = func() (*nats.Conn, error) {
			nc, err := f.Conn.Connect("reprise-example")
			if err != nil {
				return nil, fmt.Errorf("%w\nStart reprised with the examples' tables: go run ./cmd/reprised --config examples/reprise.yaml\nor run this example alone with --embedded", err)
			}
			return nc, nil
		}
	}
	if err := d.prepare(ctx, want); err != nil {
		return nil, errors.Join(err, d.Close())
	}
	return d, nil
}

// Connect opens a connection to the deployment; Close closes it. Each
// actor and learner of an example has its own, as separate processes
// would. It is safe for concurrent use.
func (d *Deployment) Connect() (*nats.Conn, error) {
	nc, err := d.connect()
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.conns = append(d.conns, nc)
	return nc, nil
}

// Close closes the connections and stops what Start started.
func (d *Deployment) Close() error { return d.stop() }

func (d *Deployment) closeConns() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, nc := range d.conns {
		nc.Close()
	}
}

func (d *Deployment) startEmbedded(ctx context.Context, want []tables.Config) error {
	dir, err := os.MkdirTemp("", "reprise-example-")
	if err != nil {
		return err
	}
	srv, err := embeddednats.Start(ctx, embeddednats.WithStoreDir(dir), embeddednats.WithoutListener())
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	d.Where = "an embedded NATS server"
	d.connect = func() (*nats.Conn, error) { return srv.Connect(nats.Name("reprise-example")) }
	d.stop = func() error {
		d.closeConns()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return errors.Join(srv.Shutdown(ctx), os.RemoveAll(dir))
	}
	nc, err := d.Connect()
	if err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	svc, err := service.New(nc, want, service.WithPrefix(d.Prefix), service.WithLogger(quiet))
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	stopServer := d.stop
	d.stop = func() error {
		// The service goes first, while its connection is open.
		cancel()
		err := <-done
		return errors.Join(err, stopServer())
	}
	return nil
}

// prepare waits for the table service, checks its tables and resets them.
func (d *Deployment) prepare(ctx context.Context, want []tables.Config) error {
	nc, err := d.Connect()
	if err != nil {
		return err
	}
	c, err := broker.NewClient(nc, broker.WithPrefix(d.Prefix))
	if err != nil {
		return err
	}
	defer c.Close()
	info, err := waitInfo(ctx, c)
	if err != nil {
		return fmt.Errorf("no table service on prefix %q at %s: %w\nStart one with the examples' tables: go run ./cmd/reprised --config examples/reprise.yaml\nor run this example alone with --embedded", d.Prefix, d.Where, err)
	}
	for _, cfg := range want {
		i := slices.IndexFunc(info.Tables, func(t broker.TableInfo) bool { return t.Name == cfg.Name })
		if i < 0 {
			return fmt.Errorf("reprised at %s does not serve table %q: start it with the examples' tables: go run ./cmd/reprised --config examples/reprise.yaml (or run this example with --embedded)", d.Where, cfg.Name)
		}
		if diff := differences(info.Tables[i], cfg); diff != "" {
			return fmt.Errorf("table %q at %s is not the one this example expects (%s): start reprised with --config examples/reprise.yaml (or run this example with --embedded)", cfg.Name, d.Where, diff)
		}
		if err := c.Reset(ctx, cfg.Name); err != nil {
			return fmt.Errorf("resetting table %q: %w", cfg.Name, err)
		}
	}
	return nil
}

// waitInfo asks for the tables until the service answers: an embedded one
// may still be starting.
func waitInfo(ctx context.Context, c *broker.Client) (*broker.Info, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := c.Info(rctx, "")
		cancel()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return info, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// differences describes how a served table differs from cfg.
func differences(t broker.TableInfo, cfg tables.Config) string {
	var d []string
	check := func(what string, got, want any) {
		if got != want {
			d = append(d, fmt.Sprintf("%s %v, want %v", what, got, want))
		}
	}
	check("sampler", t.Sampler, cfg.Sampler.String())
	check("remover", t.Remover, cfg.Remover.String())
	check("max_size", t.MaxSize, cfg.MaxSize)
	check("max_times_sampled", t.MaxTimesSampled, cfg.MaxTimesSampled)
	l := t.Limiter
	check("samples_per_insert", l.SamplesPerInsert, cfg.Limiter.SamplesPerInsert)
	check("min_size", l.MinSize, cfg.Limiter.MinSize)
	check("min_diff", l.MinDiff, cfg.Limiter.MinDiff)
	check("max_diff", l.MaxDiff, cfg.Limiter.MaxDiff)
	return strings.Join(d, ", ")
}
