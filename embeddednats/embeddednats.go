// Package embeddednats runs a NATS server with JetStream inside the current
// process, so Reprise works out of the box without a separate server.
//
// A Server is ready when Start returns: clients can connect and JetStream
// answers API calls. Clients in the same process connect through
// (*Server).Connect without a network hop; others use ClientURL.
//
// By default the server listens on the loopback interface and lets any
// client in. WithUser and WithNkeyUser require clients to authenticate
// (with a password, or by signing with an nkey) and give each user its
// subject permissions; WithTLS encrypts connections and can require client
// certificates. A server that listens beyond the loopback interface with
// none of these refuses to start unless WithAllowUnauthenticated says so.
package embeddednats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// ErrInvalidOption reports an option Start cannot use; the error names it.
var ErrInvalidOption = errors.New("embeddednats: invalid option")

// ErrUnauthenticated reports a server that would listen beyond the
// loopback interface with no way to authenticate clients.
var ErrUnauthenticated = errors.New("embeddednats: listening beyond loopback without authentication")

// ErrCredentialsRequired is Connect's answer, without contacting the
// server, when clients must authenticate and opts carry no credentials.
var ErrCredentialsRequired = errors.New("embeddednats: the server requires credentials: connect with nats.UserInfo or nats.Nkey")

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

	users       []*server.User
	nkeys       []*server.NkeyUser
	tls         *TLS
	allowNoAuth bool
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

// Permissions are the subjects a user may publish and subscribe to. As in
// nats-server, a nil Allow allows every subject and an empty, non-nil one
// none; Deny wins over Allow.
type Permissions struct {
	Publish   SubjectPermissions
	Subscribe SubjectPermissions
}

// SubjectPermissions lists subject patterns (with * and >) allowed and
// denied.
type SubjectPermissions struct {
	Allow []string
	Deny  []string
}

func (p Permissions) server() *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.Publish.Allow, Deny: p.Publish.Deny},
		Subscribe: &server.SubjectPermission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
	}
}

// WithUser lets a client connect as name with password, and gives it
// perms. password may be the bcrypt hash of the password (starting "$2a$",
// "$2b$" or "$2y$", as "nats server passwd" prints it), which nats-server
// compares against what the client sends; keep the plain password out of
// files. Once a user or nkey user exists, every client must authenticate,
// including those that connect in process.
func WithUser(name, password string, perms Permissions) Option {
	return func(c *config) {
		c.users = append(c.users, &server.User{Username: name, Password: password, Permissions: perms.server()})
	}
}

// WithNkeyUser lets a client connect with the user nkey whose public key
// (starting with U) is given: the client proves it holds the seed by
// signing a nonce, so no secret crosses the network. perms are as for
// WithUser.
func WithNkeyUser(publicKey string, perms Permissions) Option {
	return func(c *config) {
		c.nkeys = append(c.nkeys, &server.NkeyUser{Nkey: publicKey, Permissions: perms.server()})
	}
}

// TLS configures the listener's TLS.
type TLS struct {
	// CertFile and KeyFile are the server's certificate (PEM, with its
	// chain) and private key. Required.
	CertFile string
	KeyFile  string
	// VerifyClients requires every client connecting over the network to
	// present a certificate, checked against CAFile (or the system's
	// roots when CAFile is empty, which authenticates no one: a server
	// beyond loopback then still needs users). Clients in the process are
	// trusted.
	VerifyClients bool
	CAFile        string
}

// WithTLS makes clients connect over TLS (clients in the process connect
// without it).
func WithTLS(t TLS) Option {
	return func(c *config) { c.tls = &t }
}

// WithAllowUnauthenticated lets the server listen beyond the loopback
// interface although clients need no password, nkey or certificate:
// anyone who reaches the port may read, change and delete everything.
// Start logs a warning. Without it such a server refuses to start.
func WithAllowUnauthenticated() Option {
	return func(c *config) { c.allowNoAuth = true }
}

// Server is a running embedded NATS server.
type Server struct {
	ns *server.Server
	// probe is set when clients must authenticate.
	probe     *probe
	listening bool
	// lock keeps other servers off the store until shutdown is done.
	lock     *os.File
	stopOnce sync.Once
	stopped  chan struct{}
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
	probe, err := addProbe(sopts)
	if err != nil {
		return nil, err
	}
	lock, err := lockStore(cfg.storeDir)
	if err != nil {
		return nil, err
	}
	ns, err := server.NewServer(sopts)
	if err != nil {
		unlock(lock)
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

	if cfg.insecure(sopts) {
		logger.Warn("the NATS server listens beyond the loopback interface without authentication: anyone who reaches it may read, change and delete everything", "listen", cfg.listen)
	}
	if cfg.cleartextPasswords(sopts) {
		logger.Warn("the NATS server listens beyond the loopback interface without TLS: passwords cross the network in the clear (use TLS, or nkeys)", "listen", cfg.listen)
	}

	s := &Server{ns: ns, listening: !cfg.noListener, stopped: make(chan struct{}), probe: probe, lock: lock}
	ns.Start()
	if err := s.waitReady(ctx, log); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		unlock(lock)
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
	if err := c.authOptions(o); err != nil {
		return nil, err
	}
	return o, nil
}

// authOptions sets users, nkeys and TLS, and refuses a listener beyond
// loopback that lets anyone in.
func (c *config) authOptions(o *server.Options) error {
	names := make(map[string]bool)
	for _, u := range c.users {
		if u.Username == "" || u.Password == "" {
			return fmt.Errorf("%w: user %q: a user needs a name and a password", ErrInvalidOption, u.Username)
		}
		if names[u.Username] {
			return fmt.Errorf("%w: user %q given twice", ErrInvalidOption, u.Username)
		}
		names[u.Username] = true
	}
	for _, u := range c.nkeys {
		if !nkeys.IsValidPublicUserKey(u.Nkey) {
			return fmt.Errorf("%w: %q is not the public key of a user nkey (it starts with U; the seed, starting with SU, stays with the client)", ErrInvalidOption, u.Nkey)
		}
		if names[u.Nkey] {
			return fmt.Errorf("%w: nkey %s given twice", ErrInvalidOption, u.Nkey)
		}
		names[u.Nkey] = true
	}
	o.Users, o.Nkeys = c.users, c.nkeys
	if t := c.tls; t != nil {
		if t.CertFile == "" || t.KeyFile == "" {
			return fmt.Errorf("%w: TLS needs a certificate file and a key file", ErrInvalidOption)
		}
		if t.CAFile != "" && !t.VerifyClients {
			return fmt.Errorf("%w: TLS CA file %s verifies client certificates: set VerifyClients, or drop the CA file", ErrInvalidOption, t.CAFile)
		}
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: t.CertFile, KeyFile: t.KeyFile, CaFile: t.CAFile, Verify: t.VerifyClients})
		if err != nil {
			return fmt.Errorf("%w: TLS: %v", ErrInvalidOption, err)
		}
		o.TLSConfig = tc
	}
	if c.insecure(o) && !c.allowNoAuth {
		return fmt.Errorf("%w: %s: anyone who reaches it could read, change and delete everything; add users or nkey users, or TLS with client certificates signed by a CA file of your own, or listen on 127.0.0.1 (WithAllowUnauthenticated overrides this)", ErrUnauthenticated, c.listen)
	}
	return nil
}

// authenticates reports whether clients must prove who they are. A
// certificate checked against the system's roots proves nothing: any
// public CA issues them.
func (c *config) authenticates() bool {
	return len(c.users) > 0 || len(c.nkeys) > 0 || (c.tls != nil && c.tls.VerifyClients && c.tls.CAFile != "")
}

// insecure reports a listener beyond loopback that lets anyone in.
func (c *config) insecure(o *server.Options) bool {
	return !c.noListener && !isLoopback(o.Host) && !c.authenticates()
}

// cleartextPasswords reports passwords sent over the network unencrypted.
func (c *config) cleartextPasswords(o *server.Options) bool {
	return !c.noListener && !isLoopback(o.Host) && len(c.users) > 0 && c.tls == nil
}

// isLoopback reports whether host names only the loopback interface. An
// empty host, like 0.0.0.0 or ::, is every interface; any other name may
// resolve to anything.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// probe is the user Start checks readiness with when clients must
// authenticate: an nkey made for this server, whose seed never leaves the
// process, allowed only to ask JetStream for the account's info.
type probe struct {
	key   nkeys.KeyPair
	pub   string
	inbox string
}

func addProbe(o *server.Options) (*probe, error) {
	if len(o.Users) == 0 && len(o.Nkeys) == 0 {
		return nil, nil
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("%w: creating the readiness probe's nkey: %v", ErrStartFailed, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrStartFailed, err)
	}
	p := &probe{key: kp, pub: pub, inbox: "_INBOX." + pub}
	perms := Permissions{
		Publish:   SubjectPermissions{Allow: []string{jetstreamAccountInfo}},
		Subscribe: SubjectPermissions{Allow: []string{p.inbox + ".>"}},
	}
	o.Nkeys = append(o.Nkeys, &server.NkeyUser{Nkey: pub, Permissions: perms.server()})
	return p, nil
}

// jetstreamAccountInfo is the JetStream request the readiness probe makes.
const jetstreamAccountInfo = "$JS.API.INFO"

func (p *probe) options() []nats.Option {
	if p == nil {
		return nil
	}
	return []nats.Option{nats.Nkey(p.pub, p.key.Sign), nats.CustomInboxPrefix(p.inbox)}
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
	nc, err := s.Connect(s.probe.options()...)
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
// applied before the in-process dialer, which they cannot replace. When
// clients must authenticate, opts carry the credentials (nats.UserInfo,
// nats.Nkey); TLS is not used in process.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	if s.probe != nil && !hasCredentials(opts) {
		// The server would refuse the connection, but over the in-process
		// pipe its refusal and the client's next write block each other
		// until the server's write deadline (10s) ends the connection.
		return nil, ErrCredentialsRequired
	}
	return nats.Connect("", slices.Concat(opts, []nats.Option{nats.InProcessServer(s.ns)})...)
}

func hasCredentials(opts []nats.Option) bool {
	o := nats.GetDefaultOptions()
	for _, opt := range opts {
		if opt(&o) != nil {
			return true // let nats.Connect report it
		}
	}
	return o.User != "" || o.Nkey != "" || o.UserJWT != nil || o.UserInfo != nil || o.Token != "" || o.TokenHandler != nil
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
			unlock(s.lock)
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

func unlock(f *os.File) {
	if f != nil {
		f.Close()
	}
}
