// Package natsconn says how to reach and authenticate to a NATS server: the
// connection flags that reprised, reprisectl and the examples share (user
// and password, an nkey seed file, a credentials file, TLS files), and the
// nats.go options they turn into.
//
// A user's replies arrive under its own inbox (broker.InboxPrefix), the
// only one the roles let it read, so a connection that authenticates as a
// user or nkey uses that inbox unless told otherwise.
package natsconn

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/reprise-rl/reprise/broker"
)

// DefaultURL is where reprised's embedded server listens by default.
const DefaultURL = "nats://127.0.0.1:4222"

// handshakeTimeout bounds a connection's set-up: reaching the server and
// reading its greeting. nats.go's 2 s was too short for a server busy
// storing 400 kB messages from 32 clients: a benchmark's next reprisectl
// timed out reading the greeting of a server that was up.
const handshakeTimeout = 10 * time.Second

// PasswordEnv is the environment variable a password is read from when
// --user is given without --password, so it stays out of the process list.
const PasswordEnv = "NATS_PASSWORD"

// ErrInvalid marks a connection setting that cannot work.
var ErrInvalid = errors.New("natsconn: invalid connection settings")

// Config says how to connect to a NATS server. At most one way to
// authenticate may be given: User and Password, NkeyFile, or Creds.
type Config struct {
	URL string
	// User and Password authenticate with a password.
	User     string
	Password string
	// NkeyFile holds a user nkey seed (SU…): the client signs the
	// server's nonce with it, and no secret crosses the network.
	NkeyFile string
	// Creds is a credentials file (a user JWT and its nkey seed), for
	// servers in operator mode.
	Creds string
	// TLSCA is a CA certificate to verify the server with; TLSCert and
	// TLSKey a client certificate and its key.
	TLSCA   string
	TLSCert string
	TLSKey  string
	// InboxPrefix overrides where replies arrive; by default it is the
	// user's inbox (broker.InboxPrefix) with User or NkeyFile, and NATS's
	// _INBOX otherwise.
	InboxPrefix string
}

// RegisterAuth adds --user, --password, --nkey, --creds, --tls-ca,
// --tls-cert, --tls-key and --inbox-prefix to fs.
func (c *Config) RegisterAuth(fs *flag.FlagSet) {
	fs.StringVar(&c.User, "user", c.User, "NATS user `name` (with a password: --password or $"+PasswordEnv+")")
	fs.StringVar(&c.Password, "password", c.Password, "NATS `password` of --user (default $"+PasswordEnv+")")
	fs.StringVar(&c.NkeyFile, "nkey", c.NkeyFile, "`file` with the user nkey seed (SU...) to authenticate with")
	fs.StringVar(&c.Creds, "creds", c.Creds, "NATS credentials `file` (user JWT and nkey seed)")
	fs.StringVar(&c.TLSCA, "tls-ca", c.TLSCA, "CA certificate `file` to verify the NATS server with")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "client certificate `file` for NATS (with --tls-key)")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "client private key `file` for NATS (with --tls-cert)")
	fs.StringVar(&c.InboxPrefix, "inbox-prefix", c.InboxPrefix, "subject `prefix` replies arrive under (default _INBOX.<user> with --user or --nkey, else _INBOX)")
}

// password is the password given, or $NATS_PASSWORD for a user given
// without one.
func (c Config) password() string {
	if c.User != "" && c.Password == "" {
		return os.Getenv(PasswordEnv)
	}
	return c.Password
}

// Check reports settings that cannot work together. Its errors match
// ErrInvalid and name the flags to fix.
func (c Config) Check() error {
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return fmt.Errorf("%w: --tls-cert and --tls-key go together: give both or neither", ErrInvalid)
	}
	if c.Password != "" && c.User == "" {
		return fmt.Errorf("%w: --password needs --user", ErrInvalid)
	}
	if c.User != "" && c.password() == "" {
		return fmt.Errorf("%w: --user %s needs a password: --password or $%s", ErrInvalid, c.User, PasswordEnv)
	}
	var ways []string
	for _, w := range []struct{ flag, value string }{{"--user", c.User}, {"--nkey", c.NkeyFile}, {"--creds", c.Creds}} {
		if w.value != "" {
			ways = append(ways, w.flag)
		}
	}
	if len(ways) > 1 {
		return fmt.Errorf("%w: %s are different ways to authenticate: give one", ErrInvalid, strings.Join(ways, " and "))
	}
	if c.InboxPrefix != "" {
		if strings.ContainsAny(c.InboxPrefix, "*> \t") || strings.HasSuffix(c.InboxPrefix, ".") || strings.HasPrefix(c.InboxPrefix, ".") {
			return fmt.Errorf("%w: --inbox-prefix %q: want a subject without wildcards or spaces, not ending in a dot", ErrInvalid, c.InboxPrefix)
		}
	} else if c.User != "" {
		if err := broker.CheckUser(c.User); err != nil {
			return fmt.Errorf("%w: --user: %v (or give --inbox-prefix)", ErrInvalid, err)
		}
	}
	return nil
}

// Options are the nats.go options for these settings and a client name.
// Reading the nkey seed file can fail.
func (c Config) Options(name string) ([]nats.Option, error) {
	opts := []nats.Option{nats.Name(name), nats.Timeout(handshakeTimeout)}
	inbox := c.InboxPrefix
	switch {
	case c.User != "":
		opts = append(opts, nats.UserInfo(c.User, c.password()))
		if inbox == "" {
			inbox = broker.InboxPrefix(c.User)
		}
	case c.NkeyFile != "":
		kp, pub, err := readSeed(c.NkeyFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Nkey(pub, kp.Sign))
		if inbox == "" {
			inbox = broker.InboxPrefix(pub)
		}
	case c.Creds != "":
		opts = append(opts, nats.UserCredentials(c.Creds))
	}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	return opts, nil
}

// readSeed reads a user nkey seed from a file, alone or decorated as in a
// credentials file.
func readSeed(path string) (nkeys.KeyPair, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("reading the nkey seed: %w", err)
	}
	kp, err := nkeys.ParseDecoratedUserNKey(data)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %s holds no user nkey seed (SU...): %v", ErrInvalid, path, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, "", fmt.Errorf("%w: %s: %v", ErrInvalid, path, err)
	}
	return kp, pub, nil
}

// Redact returns urls, a comma-separated list of NATS server URLs, fit to
// print: a password in one, or a token (a user name alone), is replaced by
// "xxxxx". A URL that does not parse is replaced whole, since nothing says
// where its secret would be.
func Redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, part := range parts {
		u, err := url.Parse(strings.TrimSpace(part))
		switch {
		case err != nil && strings.Contains(part, "@"):
			parts[i] = "(a URL that does not parse)"
		case err != nil || u.User == nil:
		case hasPassword(u.User):
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			parts[i] = u.String()
		default:
			u.User = url.User("xxxxx")
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}

func hasPassword(u *url.Userinfo) bool {
	_, ok := u.Password()
	return ok
}

// Connect connects to c.URL, with an error that says what to check.
func (c Config) Connect(name string, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := c.Options(name)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(c.URL, append(opts, extra...)...)
	if err != nil {
		hint := "is the server running and reachable?"
		switch {
		case errors.Is(err, nats.ErrAuthorization) && c.User == "" && c.NkeyFile == "" && c.Creds == "":
			hint = "the server requires authentication: give --user and --password, --nkey or --creds"
		case errors.Is(err, nats.ErrAuthorization):
			hint = "the server refused these credentials: check --user and --password, --nkey or --creds"
		case errors.Is(err, nats.ErrNoServers) && c.URL == DefaultURL:
			hint = "start one with: go run ./cmd/reprised"
		}
		return nil, fmt.Errorf("connecting to NATS at %s: %w (%s)", Redact(c.URL), err, hint)
	}
	return nc, nil
}
