// Package embeddednats runs a NATS server with JetStream inside the current
// process, so Reprise works out of the box without a separate server.
//
// A Server is ready when Start returns: clients can connect and JetStream
// answers API calls. Clients in the same process connect through
// (*Server).Connect without a network hop; others use ClientURL.
package embeddednats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrInvalidOption reports an option Start cannot use; the error names it.
var ErrInvalidOption = errors.New("embeddednats: invalid option")

// ErrStartFailed reports that the server could not start (for example its
// port is taken or its store dir is unusable); the error carries the
// server's own message.
var ErrStartFailed = errors.New("embeddednats: server failed to start")

// DefaultListen is where the server accepts clients unless WithListen or
// WithoutListener says otherwise: loopback only, the standard NATS port.
const DefaultListen = "127.0.0.1:4222"

// LevelTrace is the slog level of the server's protocol traces. They are
// only produced when the logger given to WithLogger enables this level.
const LevelTrace = slog.LevelDebug - 4

// Option configures Start.
type Option func(*config)

type config struct {
	storeDir      string
	listen        string
	noListener    bool
	maxPayload    int32
	logger        *slog.Logger
	serverName    string
	maxStore      int64
	maxMemory     int64
	maxPayloadSet bool
	syncAlways    bool
}

// WithStoreDir sets the directory where JetStream keeps its data. It is
// required: the server's default would share one directory under the
// system temp dir with every other server on the machine.
func WithStoreDir(dir string) Option {
	return func(c *config) { c.storeDir = dir }
}

// WithListen sets the host:port where the server accepts clients. Port 0
// or -1 picks a free port; ClientURL reports it.
func WithListen(hostport string) Option {
	return func(c *config) { c.listen = hostport; c.noListener = false }
}

// WithoutListener runs the server without any network listener: only
// clients in this process can connect, through Connect.
func WithoutListener() Option {
	return func(c *config) { c.noListener = true }
}

// WithMaxPayload sets the largest message the server accepts, in bytes
// (the server's default is 1 MiB).
func WithMaxPayload(bytes int32) Option {
	return func(c *config) { c.maxPayload = bytes; c.maxPayloadSet = true }
}

// WithLogger sends the server's log to logger: notices at Info, warnings at
// Warn, errors and fatal errors at Error, debug messages at Debug and
// protocol traces at LevelTrace, each only if the logger enables its level.
// Without it the server logs nothing.
func WithLogger(logger *slog.Logger) Option {
	return func(c *config) { c.logger = logger }
}

// WithServerName sets the server's name, which shows in its logs and
// monitoring; by default the server uses its generated ID.
func WithServerName(name string) Option {
	return func(c *config) { c.serverName = name }
}

// WithJetStreamMaxStore caps JetStream file storage, in bytes. By default
// the server takes up to 1 TB or what the disk has free.
func WithJetStreamMaxStore(bytes int64) Option {
	return func(c *config) { c.maxStore = bytes }
}

// WithJetStreamMaxMemory caps JetStream memory storage, in bytes. By
// default the server takes up to 75% of system memory.
func WithJetStreamMaxMemory(bytes int64) Option {
	return func(c *config) { c.maxMemory = bytes }
}

// WithSyncAlways makes JetStream fsync every write before acknowledging
// it, so that acknowledged data survives power loss and OS crashes, not only
// a crash of the process. Without it the server fsyncs every 2 minutes.
// Slower.
func WithSyncAlways() Option {
	return func(c *config) { c.syncAlways = true }
}

// Server is a running embedded NATS server.
type Server struct {
	ns        *server.Server
	listening bool
	stopOnce  sync.Once
	stopped   chan struct{}
}

// Start starts a server and waits until it is ready: accepting connections
// and answering JetStream API calls. It keeps waiting until ctx ends, then
// shuts the server down and returns ctx's error.
func Start(ctx context.Context, opts ...Option) (*Server, error) {
	cfg := config{listen: DefaultListen}
	for _, opt := range opts {
		opt(&cfg)
	}
	sopts, err := cfg.serverOptions()
	if err != nil {
		return nil, err
	}
	ns, err := server.NewServer(sopts)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidOption, err)
	}
	logger := cfg.logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	log := &logAdapter{logger: logger}
	ns.SetLoggerV2(log,
		logger.Enabled(ctx, slog.LevelDebug),
		logger.Enabled(ctx, LevelTrace), false)

	s := &Server{ns: ns, listening: !cfg.noListener, stopped: make(chan struct{})}
	ns.Start()
	if err := s.waitReady(ctx, log); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, err
	}
	return s, nil
}

func (c *config) serverOptions() (*server.Options, error) {
	if c.storeDir == "" {
		return nil, fmt.Errorf("%w: WithStoreDir is required (the server's default store dir is shared machine-wide)", ErrInvalidOption)
	}
	if c.maxPayloadSet && c.maxPayload <= 0 {
		return nil, fmt.Errorf("%w: max payload %d is not positive", ErrInvalidOption, c.maxPayload)
	}
	if c.maxStore < 0 || c.maxMemory < 0 {
		return nil, fmt.Errorf("%w: JetStream limits must not be negative (store %d, memory %d)", ErrInvalidOption, c.maxStore, c.maxMemory)
	}
	o := &server.Options{
		ServerName:         c.serverName,
		JetStream:          true,
		StoreDir:           c.storeDir,
		JetStreamMaxStore:  c.maxStore,
		JetStreamMaxMemory: c.maxMemory,
		MaxPayload:         c.maxPayload,
		DontListen:         c.noListener,
		SyncAlways:         c.syncAlways,
		// The embedding program owns the process's signals.
		NoSigs: true,
	}
	if !c.noListener {
		host, portText, err := net.SplitHostPort(c.listen)
		if err != nil {
			return nil, fmt.Errorf("%w: listen address %q: %v", ErrInvalidOption, c.listen, err)
		}
		port, err := strconv.Atoi(portText)
		if err != nil || port < -1 || port > 65535 {
			return nil, fmt.Errorf("%w: listen address %q: bad port", ErrInvalidOption, c.listen)
		}
		if port == 0 {
			// The server reads 0 as "the default port", not "any port".
			port = server.RANDOM_PORT
		}
		o.Host, o.Port = host, port
	}
	return o, nil
}

// waitReady waits until clients can connect and JetStream answers.
func (s *Server) waitReady(ctx context.Context, log *logAdapter) error {
	const poll = 50 * time.Millisecond
	for !s.ns.ReadyForConnections(poll) {
		if msg := log.fatal.Load(); msg != nil {
			return fmt.Errorf("%w: %s", ErrStartFailed, *msg)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("embeddednats: server not accepting connections: %w", ctx.Err())
		}
	}
	nc, err := s.Connect()
	if err != nil {
		return fmt.Errorf("%w: in-process connection: %v", ErrStartFailed, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrStartFailed, err)
	}
	ticker := time.NewTicker(poll)
	defer ticker.Stop()
	for {
		if msg := log.fatal.Load(); msg != nil {
			return fmt.Errorf("%w: %s", ErrStartFailed, *msg)
		}
		callCtx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := js.AccountInfo(callCtx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("embeddednats: JetStream not answering (last error: %v): %w", err, ctx.Err())
		case <-ticker.C:
		}
	}
}

// ClientURL returns the URL clients outside the process connect to, with
// the port actually bound, or "" if the server has no listener.
func (s *Server) ClientURL() string {
	if !s.listening {
		return ""
	}
	return s.ns.ClientURL()
}

// Connect returns a client connection to the server that does not go
// through the network. It works with or without a listener. opts are
// applied before the in-process dialer, which they cannot replace.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect("", slices.Concat(opts, []nats.Option{nats.InProcessServer(s.ns)})...)
}

// NATSServer returns the underlying server, for monitoring and the rare
// setting this package does not expose.
func (s *Server) NATSServer() *server.Server {
	return s.ns
}

// Shutdown stops the server, closing client connections and flushing
// JetStream, and waits until it is done or ctx ends. If ctx ends first the
// shutdown still completes in the background; calling Shutdown again waits
// for it.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(func() {
		go func() {
			s.ns.Shutdown()
			s.ns.WaitForShutdown()
			close(s.stopped)
		}()
	})
	select {
	case <-s.stopped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("embeddednats: shutdown not finished: %w", ctx.Err())
	}
}

// logAdapter implements the server's Logger on top of slog. It also keeps
// the first fatal message: an embedded server must not exit the process,
// so Start reports it instead.
type logAdapter struct {
	logger *slog.Logger
	fatal  atomic.Pointer[string]
}

func (l *logAdapter) logf(level slog.Level, format string, v []any) {
	ctx := context.Background()
	if l.logger.Enabled(ctx, level) {
		l.logger.Log(ctx, level, fmt.Sprintf(format, v...))
	}
}

func (l *logAdapter) Noticef(format string, v ...any) { l.logf(slog.LevelInfo, format, v) }
func (l *logAdapter) Warnf(format string, v ...any)   { l.logf(slog.LevelWarn, format, v) }
func (l *logAdapter) Errorf(format string, v ...any)  { l.logf(slog.LevelError, format, v) }
func (l *logAdapter) Debugf(format string, v ...any)  { l.logf(slog.LevelDebug, format, v) }
func (l *logAdapter) Tracef(format string, v ...any)  { l.logf(LevelTrace, format, v) }

func (l *logAdapter) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.fatal.CompareAndSwap(nil, &msg)
	l.logger.Error(msg, "fatal", true)
}
