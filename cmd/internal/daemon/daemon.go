// Package daemon is reprised: the table service of a Reprise deployment, on
// an embedded NATS server or an external one, configured by flags and a
// YAML file, with Prometheus metrics. cmd/reprised is a thin main around
// Main.
package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/cmd/internal/cli"
	"github.com/reprise-rl/reprise/cmd/internal/config"
	"github.com/reprise-rl/reprise/cmd/internal/metrics"
	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/internal/natsconn"
)

// Main runs reprised until ctx ends and returns its exit status: 0 after a
// clean shutdown or --help, 2 for a bad command line, 1 for other errors.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := Run(ctx, args, stdout, stderr)
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, cli.ErrUsage):
		fmt.Fprintf(stderr, "reprised: %v\n", strings.TrimPrefix(err.Error(), cli.ErrUsage.Error()+": "))
		return 2
	default:
		fmt.Fprintf(stderr, "reprised: %v\n", err)
		return 1
	}
}

const usageText = `reprised runs a Reprise table service: experience replay tables served
over NATS JetStream. Without flags it starts an embedded NATS server on
127.0.0.1:4222 that keeps its data in ./reprise-data, and serves one table,
"replay" (uniform sampling, fifo eviction beyond 1000000 items, sampling
allowed from the first item).

Usage:
  reprised [flags]

Flags override the server and log settings of the --config file; see
reprise.example.yaml for every setting, table option and default.

Without users the embedded server lets in any client that reaches it, so it
listens beyond loopback only with users (--embedded-user, --embedded-nkey),
client certificates signed by your own CA (--listen-tls-verify with
--listen-tls-ca) or --allow-unauthenticated.
"reprisectl permissions" prints the users of an external server.

Flags:
`

// Run is Main returning an error: it parses args, starts NATS (unless
// --nats names a server) and the table service, prints where clients
// connect to stdout, logs to stderr, and when ctx ends stops the service,
// then the server.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseArgs(args, stderr)
	if err != nil {
		return err
	}
	log, err := cli.NewLogger(stderr, cfg.Log.Format, cfg.Log.Level)
	if err != nil {
		return err
	}
	d := &daemon{cfg: cfg, log: log, stdout: stdout}
	defer d.shutdown()
	if err := d.run(ctx); err != nil && (ctx.Err() == nil || errors.Is(err, errStopping)) {
		return err
	}
	// Any other error after ctx ended (a start-up cut short) is the
	// shutdown that was asked for.
	return nil
}

// errStopping marks an error of a shutdown that was asked for, such as a
// final checkpoint that could not be written: it must reach the exit
// status, since items acknowledged since the last checkpoint may be lost
// with it once the stream's limits drop them.
var errStopping = errors.New("stopping")

// parseArgs builds the configuration: defaults, then the --config file,
// then the flags that were given.
func parseArgs(args []string, stderr io.Writer) (config.Config, error) {
	fs := flag.NewFlagSet("reprised", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		cli.PrintDefaults(fs.Output(), fs)
	}
	def := config.Default()
	var (
		file string
		conn natsconn.Config
		s    = def.Server
		lg   = def.Log
	)
	fs.StringVar(&file, "config", "", "YAML configuration `file` with the tables and settings (see reprise.example.yaml)")
	fs.StringVar(&conn.URL, "nats", "", "`URL` of an external NATS server with JetStream (comma-separated for a cluster); without it reprised starts an embedded server")
	natsWait := fs.Duration("nats-wait", 0, "how long to wait at startup for the external NATS server and its JetStream (`duration`; 0 waits until stopped)")
	conn.RegisterAuth(fs)
	fs.Func("listen", "`HOST:PORT` where the embedded server accepts clients (port -1: any free port; beyond loopback it needs users, --listen-tls-verify with --listen-tls-ca, or --allow-unauthenticated) (default "+config.DefaultListen+")", checked(&s.Listen, config.CheckListen))
	// Checked once parsed, not by the flag package, which would print the
	// value, password and all, with its error.
	var userArgs []userArg
	fs.Func("embedded-user", "let `ROLE:NAME:PASSWORD` connect to the embedded server (role actor, learner, admin or service; the password plain or bcrypt-hashed); repeat for more users; replaces the config file's users", func(v string) error {
		userArgs = append(userArgs, userArg{v, false})
		return nil
	})
	fs.Func("embedded-nkey", "let the nkey `ROLE:PUBLIC_KEY` connect to the embedded server; repeatable, with --embedded-user too", func(v string) error {
		userArgs = append(userArgs, userArg{v, true})
		return nil
	})
	fs.StringVar(&s.ListenTLSCert, "listen-tls-cert", "", "certificate `file` of the embedded server: clients connect over TLS (with --listen-tls-key)")
	fs.StringVar(&s.ListenTLSKey, "listen-tls-key", "", "private key `file` of --listen-tls-cert")
	fs.StringVar(&s.ListenTLSCA, "listen-tls-ca", "", "CA certificate `file` that clients' certificates must be signed by (with --listen-tls-verify)")
	fs.BoolVar(&s.ListenTLSVerify, "listen-tls-verify", false, "require clients of the embedded server to present a TLS certificate")
	fs.BoolVar(&s.AllowUnauthenticated, "allow-unauthenticated", false, "let the embedded server listen beyond loopback with no users and no client certificates: anyone who reaches it may read, change and delete everything")
	fs.StringVar(&s.Store, "store", s.Store, "`directory` where the embedded server keeps its JetStream data")
	fs.Func("max-payload", "largest NATS message of the embedded server, in `bytes` (default 1048576)", func(v string) error {
		n, err := parseSize(v)
		if err != nil {
			return err
		}
		s.MaxPayload = int32(n)
		return nil
	})
	fs.Func("prefix", "subject `prefix` of the deployment; clients must use the same (default "+broker.DefaultPrefix+")", checked(&s.Prefix, config.CheckPrefix))
	fs.Func("metrics", "`HOST:PORT` to serve Prometheus metrics on, at /metrics (default: no metrics)", checked(&s.Metrics, config.CheckMetrics))
	fs.BoolVar(&s.SyncAlways, "sync-always", false, "make the embedded server fsync every write before acknowledging it (survives power loss; slower)")
	standby := fs.Bool("standby", false, "run as one of several reprised for the prefix: the one holding the lease (KV bucket REPRISE_<PREFIX>_LEASE) serves, the others follow the stream and take over when it stops (service.standby)")
	var shard string
	fs.Func("shard", "`INDEX/COUNT`: serve shard INDEX (from 0) of tables spread over COUNT reprised, each with its own --prefix; items whose key is not this shard's are refused (service.shard)", checked(&shard, config.CheckShard))
	var cp config.Checkpoint
	fs.DurationVar(&cp.Every, "checkpoint-every", def.Checkpoint.Every, "`interval` between checkpoints of the tables; 0 writes them only on request and at shutdown")
	fs.StringVar(&cp.Dir, "checkpoint-dir", "", "`directory` for checkpoint files (default: the JetStream object store bucket REPRISE_<PREFIX>_CHECKPOINTS)")
	fs.Func("log-format", "log `format`: text or json (default text)", checked(&lg.Format, config.CheckLogFormat))
	fs.Func("log-level", "lowest `level` logged: debug, info, warn or error (default info)", checked(&lg.Level, config.CheckLogLevel))
	if err := cli.Parse(fs, args); err != nil {
		return config.Config{}, err
	}
	if fs.NArg() > 0 {
		return config.Config{}, cli.Usagef("unexpected argument %q: reprised takes only flags (see --help)", fs.Arg(0))
	}
	users, err := embeddedUsers(userArgs)
	if err != nil {
		return config.Config{}, err
	}
	set := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	cfg := def
	if file != "" {
		var err error
		if cfg, err = config.Load(file); err != nil {
			return config.Config{}, err
		}
	}
	override := func(flagName string, dst *string, v string) {
		if set[flagName] {
			*dst = v
		}
	}
	override("nats", &cfg.Server.NATS, conn.URL)
	if set["nats-wait"] {
		if *natsWait < 0 {
			return config.Config{}, cli.Usagef("--nats-wait %v is negative: give a duration such as 1m, or 0 to wait until stopped", *natsWait)
		}
		cfg.Server.NATSWait = *natsWait
	}
	if set["user"] || set["nkey"] || set["creds"] {
		// A way to authenticate given by flag replaces the file's, which
		// would otherwise be a second one.
		cfg.Server.User, cfg.Server.Password, cfg.Server.Nkey, cfg.Server.Creds = "", "", "", ""
	}
	override("creds", &cfg.Server.Creds, conn.Creds)
	override("tls-ca", &cfg.Server.TLSCA, conn.TLSCA)
	override("tls-cert", &cfg.Server.TLSCert, conn.TLSCert)
	override("tls-key", &cfg.Server.TLSKey, conn.TLSKey)
	override("user", &cfg.Server.User, conn.User)
	override("password", &cfg.Server.Password, conn.Password)
	override("nkey", &cfg.Server.Nkey, conn.NkeyFile)
	override("inbox-prefix", &cfg.Server.InboxPrefix, conn.InboxPrefix)
	override("listen-tls-cert", &cfg.Server.ListenTLSCert, s.ListenTLSCert)
	override("listen-tls-key", &cfg.Server.ListenTLSKey, s.ListenTLSKey)
	override("listen-tls-ca", &cfg.Server.ListenTLSCA, s.ListenTLSCA)
	if set["listen-tls-verify"] {
		cfg.Server.ListenTLSVerify = s.ListenTLSVerify
	}
	if set["allow-unauthenticated"] {
		cfg.Server.AllowUnauthenticated = s.AllowUnauthenticated
	}
	if set["embedded-user"] || set["embedded-nkey"] {
		cfg.Users = users
	}
	override("listen", &cfg.Server.Listen, s.Listen)
	override("store", &cfg.Server.Store, s.Store)
	override("prefix", &cfg.Server.Prefix, s.Prefix)
	override("metrics", &cfg.Server.Metrics, s.Metrics)
	override("log-format", &cfg.Log.Format, lg.Format)
	override("log-level", &cfg.Log.Level, lg.Level)
	if set["max-payload"] {
		cfg.Server.MaxPayload = s.MaxPayload
	}
	if set["sync-always"] {
		cfg.Server.SyncAlways = s.SyncAlways
	}
	if set["standby"] {
		cfg.Service.Standby = *standby
	}
	override("shard", &cfg.Service.Shard, shard)
	override("checkpoint-dir", &cfg.Checkpoint.Dir, cp.Dir)
	if set["checkpoint-every"] {
		if cp.Every < 0 {
			return config.Config{}, cli.Usagef("--checkpoint-every %v is negative: give an interval such as 1m, or 0 for none", cp.Every)
		}
		cfg.Checkpoint.Every = cp.Every
	}

	for _, name := range []string{"listen", "store", "max-payload", "sync-always", "embedded-user", "embedded-nkey", "listen-tls-cert", "listen-tls-key", "listen-tls-ca", "listen-tls-verify", "allow-unauthenticated"} {
		if set[name] && !cfg.Server.Embedded() {
			return config.Config{}, cli.Usagef("--%s configures the embedded server, but NATS is external (%s): drop --%s", name, natsconn.Redact(cfg.Server.NATS), name)
		}
	}
	for _, name := range []string{"creds", "tls-ca", "tls-cert", "tls-key", "user", "password", "nkey", "inbox-prefix"} {
		if set[name] && cfg.Server.Embedded() {
			return config.Config{}, cli.Usagef("--%s is for connecting to an external server: add --nats URL", name)
		}
	}
	if cfg.Server.Store == "" {
		return config.Config{}, cli.Usagef("--store is empty: give a directory such as ./reprise-data")
	}
	// Checked here, not in the file: --nats may name the server the file
	// leaves out (examples/deploy), or turn it off.
	if cfg.Server.Embedded() && cfg.Stream.Replicas > 1 {
		return config.Config{}, cli.Usagef("stream.replicas is %d, but the embedded server is one node, which keeps one copy: set 1, or --nats URL of a cluster", cfg.Stream.Replicas)
	}
	// A file's nats_wait goes with its server, which --nats "" turns off.
	if cfg.Server.Embedded() && cfg.Server.NATSWait != 0 && (set["nats-wait"] || !set["nats"]) {
		return config.Config{}, cli.Usagef("server.nats_wait or --nats-wait is %v, which waits for an external server: add --nats URL, or drop it", cfg.Server.NATSWait)
	}
	if cfg.Server.Embedded() {
		// Settings for an external server that a file set and --nats ""
		// turned off.
		cfg.Server.Creds, cfg.Server.TLSCA, cfg.Server.TLSCert, cfg.Server.TLSKey = "", "", "", ""
		cfg.Server.User, cfg.Server.Password, cfg.Server.Nkey, cfg.Server.InboxPrefix = "", "", "", ""
		cfg.Server.NATSWait = 0
		if err := checkListenTLS(cfg.Server); err != nil {
			return config.Config{}, err
		}
	} else {
		// The reverse: settings of the embedded server.
		cfg.Users = nil
		cfg.Server.ListenTLSCert, cfg.Server.ListenTLSKey, cfg.Server.ListenTLSCA = "", "", ""
		cfg.Server.ListenTLSVerify, cfg.Server.AllowUnauthenticated = false, false
	}
	if err := cli.CheckConn(serverConn(cfg.Server)); err != nil {
		return config.Config{}, err
	}
	return cfg, nil
}

// userArg is one --embedded-user or --embedded-nkey value.
type userArg struct {
	value string
	nkey  bool
}

// embeddedUsers parses --embedded-user ROLE:NAME:PASSWORD and
// --embedded-nkey ROLE:PUBLIC_KEY values, in order. Its errors show a user
// by role and name, never by password or key.
func embeddedUsers(args []userArg) ([]config.User, error) {
	var users []config.User
	for _, a := range args {
		var u config.User
		flagName, shown := "--embedded-user", ""
		if a.nkey {
			role, key, _ := strings.Cut(a.value, ":")
			u = config.User{Role: broker.Role(role), Nkey: key}
			flagName, shown = "--embedded-nkey", role+":..."
		} else {
			parts := strings.SplitN(a.value, ":", 3)
			for len(parts) < 3 {
				parts = append(parts, "")
			}
			u = config.User{Role: broker.Role(parts[0]), Name: parts[1], Password: parts[2]}
			shown = parts[0] + ":" + parts[1] + ":..."
		}
		if err := u.Check(); err != nil {
			return nil, cli.Usagef("%s %s: %v", flagName, shown, err)
		}
		for _, other := range users {
			if other.ID() == u.ID() {
				return nil, cli.Usagef("%s %s: user %s given twice", flagName, shown, u.ID())
			}
		}
		users = append(users, u)
	}
	return users, nil
}

// checkListenTLS checks the embedded server's TLS settings, which flags
// and the file may have given in part.
func checkListenTLS(s config.Server) error {
	switch {
	case (s.ListenTLSCert == "") != (s.ListenTLSKey == ""):
		return cli.Usagef("--listen-tls-cert and --listen-tls-key go together: give both or neither")
	case s.ListenTLSCA != "" && !s.ListenTLSVerify:
		return cli.Usagef("--listen-tls-ca verifies client certificates: add --listen-tls-verify")
	case s.ListenTLSVerify && s.ListenTLSCert == "":
		return cli.Usagef("--listen-tls-verify needs TLS: add --listen-tls-cert and --listen-tls-key")
	}
	return nil
}

func checked(dst *string, check func(string) error) func(string) error {
	return func(v string) error {
		if err := check(v); err != nil {
			return err
		}
		*dst = v
		return nil
	}
}

func parseSize(v string) (int64, error) {
	var n int64
	if _, err := fmt.Sscan(v, &n); err != nil || fmt.Sprint(n) != v {
		return 0, fmt.Errorf("%q is not a number of bytes", v)
	}
	if n < config.MinMaxPayload || n > config.MaxMaxPayload {
		return 0, fmt.Errorf("%d is out of range [%d, %d]", n, config.MinMaxPayload, config.MaxMaxPayload)
	}
	return n, nil
}

func serverConn(s config.Server) natsconn.Config {
	return natsconn.Config{
		URL: s.NATS, Creds: s.Creds, TLSCA: s.TLSCA, TLSCert: s.TLSCert, TLSKey: s.TLSKey,
		User: s.User, Password: s.Password, NkeyFile: s.Nkey, InboxPrefix: s.InboxPrefix,
	}
}

// daemon is one run of reprised. shutdown undoes what run started, in
// reverse order.
type daemon struct {
	cfg    config.Config
	log    *slog.Logger
	stdout io.Writer

	srv *embeddednats.Server
	nc  *nats.Conn
	// rc carries the service's requests and replies, apart from the
	// stream's deliveries on nc (see service.WithRequestConn).
	rc *nats.Conn
	// replies are the connections beside rc that carry sample replies
	// (see service.WithReplyConns).
	replies     []*nats.Conn
	metrics     *http.Server
	metricsDone chan struct{}
	url         string // NATS's, with any password or token redacted
}

func (d *daemon) run(ctx context.Context) error {
	if err := d.connect(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for NATS: nothing had started
		}
		return err
	}
	if err := d.checkAlone(ctx); err != nil {
		return err
	}
	cpOpts, err := d.cfg.Checkpoint.Options(ctx, d.cfg.Server.Prefix)
	if err != nil {
		return err
	}
	opts := append([]service.Option{
		service.WithPrefix(d.cfg.Server.Prefix),
		service.WithLogger(d.log),
		service.WithStream(d.cfg.Stream),
		service.WithRequestConn(d.rc),
		service.WithReplyConns(append([]*nats.Conn{d.rc}, d.replies...)...),
	}, append(append(d.cfg.Service.Options(), service.WithLimits(d.cfg.Limits)), cpOpts...)...)
	var m *metrics.Metrics
	if d.cfg.Server.Metrics != "" {
		m = metrics.New()
		opts = append(opts, service.WithObserver(m))
	}
	svc, err := service.New(d.nc, d.cfg.Tables, opts...)
	if err != nil {
		return fmt.Errorf("table service: %w", err)
	}
	metricsURL := ""
	if m != nil {
		if err := m.Watch(svc); err != nil {
			return err
		}
		if metricsURL, err = d.serveMetrics(m); err != nil {
			return err
		}
	}

	probe, err := broker.NewClient(d.nc, broker.WithPrefix(d.cfg.Server.Prefix), broker.WithLogger(d.log))
	if err != nil {
		return err
	}
	defer probe.Close()

	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()

	if err := waitReady(ctx, probe, done); err != nil {
		return err
	}
	if ctx.Err() == nil {
		d.printReady(metricsURL)
		d.log.Info("reprised ready", "nats", d.url, "prefix", d.cfg.Server.Prefix, "tables", svc.TableNames())
	}
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("table service stopped: %w", err)
		}
		return nil
	case <-ctx.Done():
	}
	d.log.Info("reprised stopping: waiting for requests in progress")
	if err := <-done; err != nil {
		return fmt.Errorf("%w: table service: %w", errStopping, err)
	}
	return nil
}

// aloneTimeout bounds checkAlone's question. With no one subscribed the
// server answers no-responders at once; a service that answers at all
// answers well within it.
const aloneTimeout = 2 * time.Second

// checkAlone refuses to serve a prefix that a service without standby
// serves, and to serve one without standby beside any other: two such
// would both apply the stream and both answer, each sampling,
// checkpointing and trimming as if alone (a standby finds the lease free,
// since only standby services take it). Only standby services name
// themselves in their replies (service.HeaderService). The info request
// is asked raw, on its documented subject, for that header.
func (d *daemon) checkAlone(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, aloneTimeout)
	defer cancel()
	reply, err := d.nc.RequestMsgWithContext(rctx, &nats.Msg{Subject: d.cfg.Server.Prefix + ".api.info"})
	if err != nil {
		return nil
	}
	if d.cfg.Service.Standby && reply.Header.Get(service.HeaderService) != "" {
		return nil
	}
	return fmt.Errorf("a table service already serves prefix %q at %s: run every reprised of a prefix with --standby (service.standby), or give this one a --prefix of its own", d.cfg.Server.Prefix, d.url)
}

// connect starts the embedded server or connects to the external one, and
// checks that JetStream answers.
func (d *daemon) connect(ctx context.Context) error {
	s := d.cfg.Server
	if s.Embedded() {
		srvLog := d.log.With("component", "nats")
		if !d.log.Enabled(ctx, slog.LevelDebug) {
			// The server's notices (ports, limits, JetStream setup) are
			// noise at info level; its warnings are not.
			srvLog = slog.New(levelFloor{srvLog.Handler(), slog.LevelWarn})
		}
		opts := []embeddednats.Option{
			embeddednats.WithStoreDir(s.Store),
			embeddednats.WithListen(s.Listen),
			embeddednats.WithMaxPayload(s.MaxPayload),
			embeddednats.WithServerName("reprised"),
			embeddednats.WithLogger(srvLog),
		}
		if s.SyncAlways {
			opts = append(opts, embeddednats.WithSyncAlways())
		}
		auth, connOpts, err := d.embeddedAuth()
		if err != nil {
			return err
		}
		srv, err := embeddednats.Start(ctx, append(opts, auth...)...)
		if errors.Is(err, embeddednats.ErrUnauthenticated) {
			return cli.Usagef("--listen %s reaches beyond this machine, and no client would need to authenticate: anyone who reaches the port could read, change and delete everything. Add users (--embedded-user, --embedded-nkey, or server.users in the config), or client certificates signed by your own CA (--listen-tls-verify with --listen-tls-ca), or listen on 127.0.0.1; --allow-unauthenticated accepts the risk", s.Listen)
		}
		if err != nil {
			hint := ""
			if strings.Contains(err.Error(), "address already in use") {
				hint = " (another reprised or NATS server uses the port: pick another with --listen)"
			}
			return fmt.Errorf("starting the embedded NATS server on %s (store %s): %w%s", s.Listen, s.Store, err, hint)
		}
		d.srv = srv
		d.url = srv.ClientURL()
		d.nc, err = srv.Connect(append(connOpts, nats.Name("reprised"))...)
		if err != nil {
			return fmt.Errorf("connecting to the embedded NATS server: %w", err)
		}
		dial := func(name string) (*nats.Conn, error) { return srv.Connect(append(connOpts, nats.Name(name))...) }
		if d.rc, err = dial("reprised requests"); err != nil {
			return fmt.Errorf("connecting to the embedded NATS server: %w", err)
		}
		if err := d.dialReplies(dial); err != nil {
			return fmt.Errorf("connecting to the embedded NATS server: %w", err)
		}
		return nil
	}
	// A server or cluster started together with reprised (compose,
	// Kubernetes) may accept connections, and elect the leader JetStream
	// needs, only later: wait for both, saying what for. Once connected,
	// the connection reconnects by itself for as long as reprised runs.
	if s.NATSWait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.NATSWait)
		defer cancel()
	}
	conn := serverConn(s)
	dial := func(name string) (*nats.Conn, error) {
		return conn.Connect(name,
			nats.MaxReconnects(-1),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				d.log.Warn("disconnected from NATS", "connection", name, "error", err)
			}),
			nats.ReconnectHandler(func(nc *nats.Conn) {
				d.log.Info("reconnected to NATS", "connection", name, "url", nc.ConnectedUrl())
			}),
		)
	}
	// The URL as printed: it may hold a password or a token.
	shown := natsconn.Redact(s.NATS)
	err := d.waitFor(ctx, "the NATS server at "+shown, func() (bool, error) {
		nc, err := dial("reprised")
		d.nc = nc
		// Refused credentials will not change by waiting, nor will a seed
		// file that holds no seed. One that is missing may be mounted late.
		return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, natsconn.ErrInvalid), err
	})
	if err != nil {
		return err
	}
	d.url = shown
	if d.rc, err = dial("reprised requests"); err != nil {
		return fmt.Errorf("connecting to the NATS server at %s: %w", shown, err)
	}
	if err := d.dialReplies(dial); err != nil {
		return fmt.Errorf("connecting to the NATS server at %s: %w", shown, err)
	}
	return d.waitFor(ctx, "JetStream at "+shown, func() (bool, error) { return checkJetStream(ctx, d.nc, shown) })
}

// dialReplies opens the connections that carry sample replies beside the
// request connection: service.reply_conns of them in all, or by the cores.
func (d *daemon) dialReplies(dial func(name string) (*nats.Conn, error)) error {
	for i := 1; i < replyConnCount(d.cfg.Service.ReplyConns, runtime.GOMAXPROCS(0)); i++ {
		nc, err := dial(fmt.Sprintf("reprised replies %d", i))
		if err != nil {
			return err
		}
		d.replies = append(d.replies, nc)
	}
	return nil
}

// replyConnCount is configured, or service.DefaultReplyConns for the
// cores when it is 0.
func replyConnCount(configured, cores int) int {
	if configured > 0 {
		return configured
	}
	return service.DefaultReplyConns(cores)
}

// waitFor tries until try succeeds, fails for good, or ctx ends (then it
// returns try's last error), logging what it waits for at once and every
// 10 seconds after.
func (d *daemon) waitFor(ctx context.Context, what string, try func() (permanent bool, err error)) error {
	backoff := 50 * time.Millisecond
	var logged time.Time
	for {
		permanent, err := try()
		if err == nil || permanent {
			return err
		}
		if time.Since(logged) >= 10*time.Second {
			d.log.Warn("reprised: waiting for "+what, "error", err)
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up waiting: server.nats_wait or --nats-wait)", err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// embeddedAuth turns the users and TLS settings into the embedded server's
// options. With users, reprised connects as the service role with an nkey
// made for this run, whose seed never leaves the process; connOpts say so.
func (d *daemon) embeddedAuth() (opts []embeddednats.Option, connOpts []nats.Option, err error) {
	s := d.cfg.Server
	if s.ListenTLSCert != "" {
		opts = append(opts, embeddednats.WithTLS(embeddednats.TLS{
			CertFile: s.ListenTLSCert, KeyFile: s.ListenTLSKey, CAFile: s.ListenTLSCA, VerifyClients: s.ListenTLSVerify,
		}))
	}
	if s.AllowUnauthenticated {
		opts = append(opts, embeddednats.WithAllowUnauthenticated())
	}
	if len(d.cfg.Users) == 0 {
		return opts, nil, nil
	}
	for _, u := range d.cfg.Users {
		perms, err := rolePermissions(u.Role, s.Prefix, u.ID())
		if err != nil {
			return nil, nil, err
		}
		if u.Nkey != "" {
			opts = append(opts, embeddednats.WithNkeyUser(u.Nkey, perms))
		} else {
			opts = append(opts, embeddednats.WithUser(u.Name, u.Password, perms))
		}
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, nil, fmt.Errorf("creating reprised's own nkey: %w", err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, nil, fmt.Errorf("creating reprised's own nkey: %w", err)
	}
	perms, err := rolePermissions(broker.RoleService, s.Prefix, pub)
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, embeddednats.WithNkeyUser(pub, perms))
	connOpts = []nats.Option{nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(broker.InboxPrefix(pub))}
	return opts, connOpts, nil
}

func rolePermissions(role broker.Role, prefix, user string) (embeddednats.Permissions, error) {
	p, err := broker.RolePermissions(role, prefix, user)
	if err != nil {
		return embeddednats.Permissions{}, err
	}
	return embeddednats.Permissions{
		Publish:   embeddednats.SubjectPermissions{Allow: p.Publish.Allow, Deny: p.Publish.Deny},
		Subscribe: embeddednats.SubjectPermissions{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
	}, nil
}

// checkJetStream asks whether JetStream answers. A server without
// JetStream fails for good (permanent), where the service would otherwise
// wait for a stream it can never create.
func checkJetStream(ctx context.Context, nc *nats.Conn, url string) (permanent bool, err error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return true, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return true, fmt.Errorf("NATS at %s has no JetStream: %w (start nats-server with -js, or enable JetStream for this account)", url, err)
		}
		return false, fmt.Errorf("NATS at %s: JetStream does not answer: %w", url, err)
	}
	return false, nil
}

// serveMetrics listens before returning, so that a busy port is an error
// at startup, and serves /metrics until shutdown.
func (d *daemon) serveMetrics(m *metrics.Metrics) (string, error) {
	l, err := net.Listen("tcp", d.cfg.Server.Metrics)
	if err != nil {
		return "", fmt.Errorf("metrics: listening on %s: %w (pick another address with --metrics)", d.cfg.Server.Metrics, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	d.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	d.metricsDone = make(chan struct{})
	go func() {
		defer close(d.metricsDone)
		if err := d.metrics.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("metrics server stopped", "error", err)
		}
	}()
	return "http://" + l.Addr().String() + "/metrics", nil
}

// waitReady waits until the service answers an info request, so that what
// printReady announces works, or until ctx ends. If Run fails first it
// returns Run's error, and Run is over.
func waitReady(ctx context.Context, c *broker.Client, done <-chan error) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Info(rctx, "")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case err := <-done:
			if err == nil {
				err = ctx.Err()
			}
			return fmt.Errorf("table service: %w", err)
		case <-ctx.Done():
			return nil // a shutdown before the service was up is no error
		case <-tick.C:
		}
	}
}

func (d *daemon) printReady(metricsURL string) {
	s := d.cfg.Server
	where := "external server"
	if s.Embedded() {
		where = "embedded server, data in " + s.Store
	}
	names := make([]string, len(d.cfg.Tables))
	for i, t := range d.cfg.Tables {
		names[i] = t.Name
	}
	w := d.stdout
	fmt.Fprintln(w, "reprised is ready.")
	fmt.Fprintf(w, "  NATS URL:  %s (%s)\n", d.url, where)
	fmt.Fprintf(w, "  prefix:    %s\n", s.Prefix)
	fmt.Fprintf(w, "  tables:    %s\n", strings.Join(names, ", "))
	if metricsURL != "" {
		fmt.Fprintf(w, "  metrics:   %s\n", metricsURL)
	}
	check := "reprisectl info"
	if d.url != natsconn.DefaultURL {
		check += " --nats " + d.url
	}
	if s.Prefix != broker.DefaultPrefix {
		check += " --prefix " + s.Prefix
	}
	check += d.tryCredentials()
	fmt.Fprintf(w, "Try: go run ./cmd/%s\n", check)
	fmt.Fprintln(w, "Stop it with Ctrl-C.")
}

// tryCredentials are the flags reprisectl info needs to pass the embedded
// server's authentication: a user that may read info, and TLS files.
func (d *daemon) tryCredentials() string {
	var flags string
	if users := d.cfg.Users; len(users) > 0 {
		flags = " --nkey SEED_FILE"
		for _, u := range users {
			if u.Name != "" && (u.Role == broker.RoleAdmin || u.Role == broker.RoleLearner) {
				flags = " --user " + u.Name + " (password: --password or $" + natsconn.PasswordEnv + ")"
				break
			}
		}
	}
	if s := d.cfg.Server; s.Embedded() && s.ListenTLSCert != "" {
		tls := " --tls-ca CA_FILE"
		if s.ListenTLSVerify {
			tls += " --tls-cert CERT_FILE --tls-key KEY_FILE"
		}
		flags = tls + flags
	}
	return flags
}

// shutdown stops the metrics server, the connection and the embedded
// server, whichever were started.
func (d *daemon) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if d.metrics != nil {
		if err := d.metrics.Shutdown(ctx); err != nil {
			d.log.Warn("stopping the metrics server", "error", err)
		}
		<-d.metricsDone
	}
	for _, nc := range append([]*nats.Conn{d.rc, d.nc}, d.replies...) {
		if nc != nil {
			// Closing is no disconnection to report, and the report would
			// come after Run returned.
			nc.SetDisconnectErrHandler(nil)
			nc.SetReconnectHandler(nil)
			nc.Close()
		}
	}
	if d.srv != nil {
		if err := d.srv.Shutdown(ctx); err != nil {
			d.log.Warn("stopping the embedded NATS server", "error", err)
		}
	}
	d.log.Info("reprised stopped")
}

// levelFloor raises a handler's minimum level.
type levelFloor struct {
	slog.Handler
	floor slog.Level
}

func (h levelFloor) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.floor && h.Handler.Enabled(ctx, l)
}

func (h levelFloor) WithAttrs(attrs []slog.Attr) slog.Handler {
	return levelFloor{h.Handler.WithAttrs(attrs), h.floor}
}

func (h levelFloor) WithGroup(name string) slog.Handler {
	return levelFloor{h.Handler.WithGroup(name), h.floor}
}
