// Package cli holds what reprised and reprisectl share: the flags that say
// how to reach a NATS server, loggers, and the rendering of flag help.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go"
)

// DefaultURL is where reprised's embedded server listens by default.
const DefaultURL = "nats://127.0.0.1:4222"

// ErrUsage marks errors in the command line, which exit with status 2.
var ErrUsage = errors.New("usage")

// Usagef returns an error matching ErrUsage.
func Usagef(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, args...))
}

// Conn says how to connect to a NATS server.
type Conn struct {
	URL     string
	Creds   string
	TLSCA   string
	TLSCert string
	TLSKey  string
}

// RegisterAuth adds --creds, --tls-ca, --tls-cert and --tls-key to fs.
func (c *Conn) RegisterAuth(fs *flag.FlagSet) {
	fs.StringVar(&c.Creds, "creds", c.Creds, "NATS credentials `file` (user JWT and nkey seed)")
	fs.StringVar(&c.TLSCA, "tls-ca", c.TLSCA, "CA certificate `file` to verify the NATS server with")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "client certificate `file` for NATS (with --tls-key)")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "client private key `file` for NATS (with --tls-cert)")
}

// Check reports a certificate without its key and the reverse.
func (c Conn) Check() error {
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return Usagef("--tls-cert and --tls-key go together: give both or neither")
	}
	return nil
}

// Options are the nats.go options for the credentials and TLS files, and a
// client name.
func (c Conn) Options(name string) []nats.Option {
	opts := []nats.Option{nats.Name(name)}
	if c.Creds != "" {
		opts = append(opts, nats.UserCredentials(c.Creds))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	return opts
}

// Connect connects to c.URL, with an error that says what to check.
func (c Conn) Connect(name string, extra ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(c.URL, append(c.Options(name), extra...)...)
	if err != nil {
		hint := "is the server running and reachable?"
		if errors.Is(err, nats.ErrNoServers) && c.URL == DefaultURL {
			hint = "start one with: go run ./cmd/reprised"
		}
		return nil, fmt.Errorf("connecting to NATS at %s: %w (%s)", c.URL, err, hint)
	}
	return nc, nil
}

// NewLogger returns a logger writing to w in format "text" or "json" at
// level and above.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, Usagef("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, Usagef("log format %q: want text or json", format)
}

// PrintDefaults writes fs's flags in the --name form (the flag package
// accepts both, and Go tools document the double dash less often than
// users type it).
func PrintDefaults(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// Parse parses args with fs, writing help to w when asked (and returning
// flag.ErrHelp) and turning other flag errors into ErrUsage. Flag errors are
// not printed by fs: the caller prints the returned error once.
func Parse(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	case err != nil:
		return Usagef("%v (see --help)", err)
	}
	return nil
}
