// Package ctl is reprisectl, the operator's tool for a Reprise deployment:
// it shows the tables (info), empties them (reset), checkpoints them
// (checkpoint), loads them with a benchmark (bench) and prints the users
// of an external NATS server with their roles' permissions (permissions).
// cmd/reprisectl is a thin main around Main.
package ctl

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/cmd/internal/cli"
	"github.com/reprise-rl/reprise/cmd/internal/config"
	"github.com/reprise-rl/reprise/internal/natsconn"
)

const usageText = `reprisectl talks to a running Reprise deployment (see reprised).

Usage:
  reprisectl <command> [flags] [arguments]

Commands:
  info          show every table: size, selectors, rate limiter, counters
  reset TABLE   empty a table and zero its rate limiter (--all: every table)
  checkpoint    write a checkpoint of every table now
  bench         load the deployment with inserts, samples or both, and
                report items/s, bytes/s and latency percentiles
  permissions   print nats-server users with the permissions of each role
                (actor, learner, admin, service), for an external server

Every command but permissions takes --nats URL (default ` + natsconn.DefaultURL + `,
where reprised listens by default), --prefix (default ` + broker.DefaultPrefix + `) and
how to authenticate: --user (and --password or $` + natsconn.PasswordEnv + `), --nkey
SEED_FILE or --creds FILE, and TLS files (--tls-ca, --tls-cert, --tls-key).
Run "reprisectl <command> --help" for a command's flags.
`

// Main runs reprisectl and returns its exit status: 0 on success and for
// --help, 2 for a bad command line, 1 for other errors.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := Run(ctx, args, stdout, stderr)
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, cli.ErrUsage):
		fmt.Fprintf(stderr, "reprisectl: %v\n", strings.TrimPrefix(err.Error(), cli.ErrUsage.Error()+": "))
		return 2
	default:
		fmt.Fprintf(stderr, "reprisectl: %v\n", err)
		return 1
	}
}

// Run is Main returning an error. Results go to stdout; progress and
// help to stderr.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return cli.Usagef("no command: want info, reset, checkpoint, bench or permissions")
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "info":
		return runInfo(ctx, args, stdout, stderr)
	case "reset":
		return runReset(ctx, args, stdout, stderr)
	case "checkpoint":
		return runCheckpoint(ctx, args, stdout, stderr)
	case "bench":
		return runBench(ctx, args, stdout, stderr)
	case "permissions":
		return runPermissions(ctx, args, stdout, stderr)
	case "help", "-h", "-help", "--help":
		if len(args) > 0 {
			return Run(ctx, []string{args[0], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stderr, usageText)
		return flag.ErrHelp
	}
	return cli.Usagef("unknown command %q: want info, reset, checkpoint, bench or permissions (see reprisectl --help)", cmd)
}

// target is where a command sends its requests: the flags every command
// shares.
type target struct {
	conn   natsconn.Config
	prefix string
	// timeout is --timeout; set before registering the flags, the
	// command's default.
	timeout time.Duration
	// shards are the prefixes of a sharded table in shard order, for a
	// command that takes --prefix once per shard (bench, info); prefix is the
	// first.
	shards []string
}

func (t *target) register(fs *flag.FlagSet) {
	t.prefix = broker.DefaultPrefix
	fs.StringVar(&t.prefix, "prefix", t.prefix, "subject `prefix` of the deployment, as given to reprised")
	t.registerConn(fs)
}

// registerShards registers --prefix, once per shard of a sharded
// deployment (in shard order) or once, into t.shards; finishShards then
// sets the defaults.
func (t *target) registerShards(fs *flag.FlagSet) {
	fs.Func("prefix", "subject `prefix` of the deployment, as given to reprised; for a sharded table, once per shard in shard order (default "+broker.DefaultPrefix+")", func(v string) error {
		if err := config.CheckPrefix(v); err != nil {
			return err
		}
		t.shards = append(t.shards, v)
		return nil
	})
	t.registerConn(fs)
}

// finishShards gives t.shards its default and t.prefix the first shard's.
func (t *target) finishShards() {
	if len(t.shards) == 0 {
		t.shards = []string{broker.DefaultPrefix}
	}
	t.prefix = t.shards[0]
}

// registerConn registers the flags of register but --prefix: where to
// connect, as whom, and how long to wait.
func (t *target) registerConn(fs *flag.FlagSet) {
	t.conn.URL = natsconn.DefaultURL
	fs.StringVar(&t.conn.URL, "nats", t.conn.URL, "`URL` of the NATS server reprised uses (comma-separated for a cluster)")
	fs.DurationVar(&t.timeout, "timeout", cmp.Or(t.timeout, 10*time.Second), "how long to wait for the table service to answer")
	t.conn.RegisterAuth(fs)
}

func (t *target) check() error {
	if err := config.CheckPrefix(t.prefix); err != nil {
		return cli.Usagef("--prefix: %v", err)
	}
	if t.timeout <= 0 {
		return cli.Usagef("--timeout must be > 0, got %v", t.timeout)
	}
	return cli.CheckConn(t.conn)
}

func (t *target) connect(opts ...nats.Option) (*nats.Conn, error) {
	return t.conn.Connect("reprisectl", opts...)
}

func (t *target) client(nc *nats.Conn) (*broker.Client, error) {
	return broker.NewClient(nc, broker.WithPrefix(t.prefix))
}

// dial connects and makes a client, and a context for its requests that
// ends after --timeout, or as soon as the server refuses this connection a
// publish or a subscription: a request the user's role does not allow gets
// no answer, and would wait out the timeout. hangUp closes all three.
func (t *target) dial(ctx context.Context) (c *broker.Client, rctx context.Context, hangUp func(), err error) {
	nc, rctx, hangUpConn, err := t.dialConn(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	if c, err = t.client(nc); err != nil {
		hangUpConn()
		return nil, nil, nil, err
	}
	return c, rctx, func() { c.Close(); hangUpConn() }, nil
}

// dialConn is dial's connection and context, for a command that makes
// clients of its own on it.
func (t *target) dialConn(ctx context.Context) (nc *nats.Conn, rctx context.Context, hangUp func(), err error) {
	rctx, refuse := context.WithCancelCause(ctx)
	rctx, cancel := context.WithTimeout(rctx, t.timeout)
	nc, err = t.connect(nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			refuse(err)
		}
	}))
	if err != nil {
		cancel()
		refuse(nil)
		return nil, nil, nil, err
	}
	return nc, rctx, func() { nc.Close(); cancel(); refuse(nil) }, nil
}

// explain adds what to do to an error from the table service; ctx is the
// context of the request that failed.
func (t *target) explain(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, nats.ErrPermissionViolation) {
		return fmt.Errorf("the NATS server refused this user: %w (its role does not allow it; reprisectl permissions shows what each role may do)", cause)
	}
	// A service that answered with a failure is there: the advice to
	// start one below would send the operator after the wrong cause. A
	// shard that did not answer still gets it, whatever the others said.
	var answered *broker.StatusError
	switch {
	case errors.Is(err, broker.ErrUnknownTable):
		return fmt.Errorf("%w (reprisectl info lists the tables)", err)
	case errors.Is(err, context.DeadlineExceeded) && len(t.shards) > 1:
		return t.noShard(err)
	case errors.As(err, &answered):
		return fmt.Errorf("the table service on prefix %q answered: %w", t.prefix, err)
	case errors.Is(err, broker.ErrServer) && len(t.shards) > 1:
		return t.noShard(err)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, broker.ErrServer):
		return fmt.Errorf("no table service answered on prefix %q at %s: %w\nStart one with: go run ./cmd/reprised (or check --nats and --prefix)", t.prefix, natsconn.Redact(t.conn.URL), err)
	}
	return err
}

// noShard says that a shard's table service did not answer, and how to
// start one.
func (t *target) noShard(err error) error {
	return fmt.Errorf("a shard's table service did not answer (prefixes %q at %s): %w\nStart one per shard with: go run ./cmd/reprised --nats URL --prefix PREFIX --shard INDEX/COUNT (or check --nats and --prefix)", t.shards, natsconn.Redact(t.conn.URL), err)
}

// newFlagSet makes a command's flag set with help that starts with what
// the command does.
func newFlagSet(name, synopsis, about string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("reprisectl "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage:\n  reprisectl %s\n\n%s\nFlags:\n", synopsis, about)
		cli.PrintDefaults(fs.Output(), fs)
	}
	return fs
}

// parseInterleaved parses flags that may come before or after positional
// arguments (reprisectl reset replay --nats URL), which the flag package
// alone stops at.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := cli.Parse(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}
