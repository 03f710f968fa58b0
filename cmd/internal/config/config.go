// Package config reads reprised's YAML configuration: the tables to serve and
// the server, log, stream and service settings around them. Reading is
// strict: an unknown key, a value of the wrong type or a value no table
// could use is an error that names its file, line and key, and says what to
// write instead. Everything not set takes the default Default documents.
package config

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// ErrInvalid is matched (errors.Is) by every error about the contents of a
// configuration.
var ErrInvalid = errors.New("config: invalid")

// ErrCheckpointDirBusy is matched (errors.Is) by the error of a claim of a
// checkpoint dir that another process kept locked until the claim gave up.
var ErrCheckpointDirBusy = errors.New("config: checkpoint dir busy")

// Config is everything reprised needs to run.
type Config struct {
	Server Server
	// Users may connect to the embedded server (server.users); with none,
	// it lets any client in, and so listens on loopback only unless
	// Server.AllowUnauthenticated.
	Users      []User
	Log        Log
	Stream     service.StreamOptions
	Service    Service
	Checkpoint Checkpoint
	// Limits bound what one client can make the service spend.
	Limits service.Limits
	Tables []tables.Config
}

// Checkpoint says when and where the service writes checkpoints of its
// tables. Recovery loads the newest and replays the stream after it; the
// stream is trimmed below what the oldest kept checkpoint needs.
type Checkpoint struct {
	// Every is the interval between checkpoints; 0 writes them only on
	// request (reprisectl checkpoint) and at shutdown.
	Every time.Duration
	// Dir keeps checkpoints as files in a directory; empty keeps them in
	// the JetStream object store bucket REPRISE_<PREFIX>_CHECKPOINTS.
	Dir string
	// Keep is how many checkpoints are kept.
	Keep int
}

// Options turns the settings into the table service's options for the
// deployment with the given prefix. A checkpoint dir is claimed for the
// prefix, waiting for another process's claim until ctx ends.
func (c Checkpoint) Options(ctx context.Context, prefix string) ([]service.Option, error) {
	opts := []service.Option{service.WithCheckpointEvery(c.Every), service.WithCheckpointKeep(c.Keep)}
	if c.Dir == "" {
		return append(opts, service.WithObjectStoreCheckpoints()), nil
	}
	if err := claimCheckpointDir(ctx, c.Dir, prefix); err != nil {
		return nil, err
	}
	fc, err := service.NewFileCheckpoints(c.Dir)
	if err != nil {
		return nil, err
	}
	return append(opts, service.WithCheckpoints(fc)), nil
}

// checkpointOwner names, in a checkpoint directory, the prefix whose
// checkpoints it holds. Checkpoint files do not say: another prefix's
// service would recover them as its own, and delete them when keeping
// its newest.
const checkpointOwner = "prefix"

// claimCheckpointDir makes dir the checkpoint directory of prefix, or
// refuses it if it is another prefix's. The services of one prefix
// (standbys) share it.
func claimCheckpointDir(ctx context.Context, dir, prefix string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("checkpoint dir: %w", err)
	}
	owner := filepath.Join(dir, checkpointOwner)
	unlock, err := lockDir(ctx, dir)
	if err != nil {
		return err
	}
	defer unlock()
	for {
		got, err := os.ReadFile(owner)
		if err == nil && len(got) > 0 {
			if string(got) != prefix {
				return fmt.Errorf("%w: checkpoint dir %s holds the checkpoints of prefix %q (its file %s says so), not of %q: give each prefix a directory of its own", ErrInvalid, dir, got, checkpointOwner, prefix)
			}
			return nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("checkpoint dir: %w", err)
		}
		// An empty file names no one: a crash left it so, between its
		// creation and its data reaching the disk. It is replaced whole.
		stale := err == nil
		// Written aside, synced and linked into place, so that a service
		// starting beside this one, or after a crash, reads the whole
		// name or none.
		tmp, err := os.CreateTemp(dir, ".tmp-prefix-*")
		if err != nil {
			return fmt.Errorf("checkpoint dir: %w", err)
		}
		_, err = tmp.WriteString(prefix)
		if err == nil {
			err = tmp.Sync()
		}
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil && stale {
			err = os.Rename(tmp.Name(), owner)
		} else if err == nil {
			err = os.Link(tmp.Name(), owner)
		}
		os.Remove(tmp.Name())
		if err != nil && !stale && !errors.Is(err, fs.ErrExist) {
			// A file system without hard links (some network and FUSE
			// ones): created in place instead, where a service starting
			// at the same instant may read it half written.
			err = writeNew(owner, prefix)
		}
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("checkpoint dir: %w", err)
		}
		syncDir(dir)
	}
}

// syncDir makes the entries of dir durable, where the system can.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// writeNew writes data to a file at path that must not exist yet.
func writeNew(path, data string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(data)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// Server says where NATS is and where the table service listens.
type Server struct {
	// NATS is the URL (or comma-separated URLs) of an external NATS server;
	// empty starts an embedded one.
	NATS string
	// NATSWait bounds how long reprised waits at startup for an external
	// NATS server to accept it and for JetStream to answer (a cluster
	// started at the same moment elects its leader first); 0 waits until
	// reprised is stopped.
	NATSWait time.Duration
	// Creds, TLSCA, TLSCert and TLSKey are files for connecting to an
	// external server: a credentials file, a CA to trust, and a client
	// certificate and its key.
	Creds   string
	TLSCA   string
	TLSCert string
	TLSKey  string
	// User and Password, or Nkey (a seed file), authenticate reprised to
	// an external server.
	User     string
	Password string
	Nkey     string
	// InboxPrefix overrides where replies to reprised arrive on an
	// external server (default: the user's inbox, broker.InboxPrefix).
	InboxPrefix string
	// Listen is the embedded server's client address (HOST:PORT; port -1
	// picks a free one).
	Listen string
	// ListenTLSCert and ListenTLSKey make the embedded server's clients
	// connect over TLS; with ListenTLSVerify they must present a
	// certificate, signed by ListenTLSCA (or a system root).
	ListenTLSCert   string
	ListenTLSKey    string
	ListenTLSCA     string
	ListenTLSVerify bool
	// AllowUnauthenticated lets the embedded server listen beyond the
	// loopback interface without users or verified client certificates.
	AllowUnauthenticated bool
	// Store is the embedded server's JetStream directory.
	Store string
	// MaxPayload is the embedded server's largest message, in bytes.
	MaxPayload int32
	// SyncAlways makes the embedded server fsync every write before
	// acknowledging it (survives power loss; slower).
	SyncAlways bool
	// Prefix is the subject prefix of the deployment.
	Prefix string
	// Metrics is the HOST:PORT that serves /metrics; empty serves none.
	Metrics string
}

// Embedded reports whether reprised runs its own NATS server.
func (s Server) Embedded() bool { return s.NATS == "" }

// User may connect to the embedded server in a role: with a name and a
// password, or with an nkey.
type User struct {
	Role broker.Role
	// Name and Password (plain, or a bcrypt hash as "nats server passwd"
	// prints it) authenticate a password user.
	Name     string
	Password string
	// Nkey is the public key (U…) of an nkey user.
	Nkey string
}

// ID names the user in its permissions and its reply inbox: its name, or
// its public key.
func (u User) ID() string {
	if u.Nkey != "" {
		return u.Nkey
	}
	return u.Name
}

// Check reports a user that cannot connect: an unknown role, a name that
// cannot name an inbox, a missing password, or a malformed nkey.
func (u User) Check() error {
	if _, err := broker.ParseRole(string(u.Role)); err != nil {
		return err
	}
	switch {
	case u.Nkey != "" && (u.Name != "" || u.Password != ""):
		return errors.New("give an nkey, or a name and a password, not both")
	case u.Nkey != "":
		switch {
		case nkeys.IsValidPublicUserKey(u.Nkey):
		case strings.HasPrefix(u.Nkey, "S"):
			// Not printed: it is a seed, or looks like one, and a seed is
			// the secret.
			return errors.New("this is an nkey seed, the secret that stays with the client: give its public key (it starts with U; nk -inkey SEEDFILE -pubout prints it)")
		case strings.HasPrefix(u.Nkey, "U"):
			return fmt.Errorf("%q is not the public key of a user nkey (it starts with U; the seed, SU..., stays with the client)", u.Nkey)
		default:
			return errors.New("not the public key of a user nkey (it starts with U; the seed, SU..., stays with the client)")
		}
	case u.Name == "":
		return errors.New("give a name and a password, or an nkey")
	case u.Password == "":
		return fmt.Errorf("user %q has no password", u.Name)
	default:
		return broker.CheckUser(u.Name)
	}
	return nil
}

// Log chooses the log format ("text" or "json") and the lowest level logged
// ("debug", "info", "warn" or "error").
type Log struct {
	Format string
	Level  string
}

// Service holds the table service's limits.
type Service struct {
	MaxSampleWait        time.Duration
	MaxConcurrentSamples int
	PullBytes            int
	// ProducerIdle is how long a silent producer's chunks are held; 0
	// holds them until the producer closes.
	ProducerIdle time.Duration
	// Standby lets several reprised serve the prefix, one active at a
	// time, chosen by a lease with LeaseTTL (0: the default).
	Standby  bool
	LeaseTTL time.Duration
	// Shard is "INDEX/COUNT" for one shard of a sharded table, or empty.
	Shard string
	// SamplePriority is the delay to run above which the service paces
	// inserts while learners sample; 0 never paces them.
	SamplePriority time.Duration
	// ReplyConns is how many connections carry the replies with items
	// (service.WithReplyConns); 0 lets reprised choose by the cores it
	// has.
	ReplyConns int
}

// CheckShard accepts "INDEX/COUNT", such as "0/4", or nothing.
func CheckShard(s string) error {
	if s == "" {
		return nil
	}
	_, err := service.ParseShard(s)
	return err
}

// Options turns the settings into the table service's options.
func (s Service) Options() []service.Option {
	opts := []service.Option{
		service.WithMaxSampleWait(s.MaxSampleWait),
		service.WithMaxConcurrentSamples(s.MaxConcurrentSamples),
		service.WithPullBytes(s.PullBytes),
		service.WithProducerIdle(s.ProducerIdle),
		service.WithSamplePriority(s.SamplePriority),
	}
	if s.Standby {
		opts = append(opts, service.WithStandby(s.LeaseTTL))
	}
	if s.Shard != "" {
		// Load and the flags checked it.
		sh, _ := service.ParseShard(s.Shard)
		opts = append(opts, service.WithShard(sh))
	}
	return opts
}

// Defaults. The service's repeat the broker's own, so that the example
// configuration can state them.
const (
	DefaultListen     = "127.0.0.1:4222"
	DefaultStore      = "./reprise-data"
	DefaultMaxPayload = 1 << 20
	DefaultTableName  = "replay"
	DefaultTableSize  = 1_000_000
	// DefaultCheckpointEvery bounds both the stream a recovery replays and
	// the disk the stream uses under steady load.
	DefaultCheckpointEvery = time.Minute
)

// DefaultTable is the table reprised serves when the configuration defines
// none: uniform sampling, oldest items evicted beyond a million, sampling
// allowed as soon as one item is in.
func DefaultTable() tables.Config {
	return tables.Config{
		Name:    DefaultTableName,
		Sampler: selectors.Options{Kind: selectors.KindUniform},
		Remover: selectors.Options{Kind: selectors.KindFifo},
		MaxSize: DefaultTableSize,
		Limiter: limiter.MinSize(1),
	}
}

// Default is the configuration of reprised run without one: an embedded
// server on the loopback interface storing in ./reprise-data, text logs at
// level info, and DefaultTable.
func Default() Config {
	return Config{
		Server: Server{
			Listen:     DefaultListen,
			Store:      DefaultStore,
			MaxPayload: DefaultMaxPayload,
			Prefix:     broker.DefaultPrefix,
		},
		Log:    Log{Format: "text", Level: "info"},
		Stream: service.StreamOptions{Replicas: 1},
		Service: Service{
			MaxSampleWait:        time.Minute,
			MaxConcurrentSamples: 1024,
			PullBytes:            16 << 20,
			ProducerIdle:         30 * time.Minute,
			LeaseTTL:             service.DefaultLeaseTTL,
			SamplePriority:       service.DefaultSamplePriority,
		},
		Checkpoint: Checkpoint{Every: DefaultCheckpointEvery, Keep: 2},
		Limits:     service.DefaultLimits(),
		Tables:     []tables.Config{DefaultTable()},
	}
}

// Load reads the configuration file at path.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading the configuration: %w", err)
	}
	return Parse(path, data)
}
