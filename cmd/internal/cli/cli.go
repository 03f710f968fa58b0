// Package cli holds what reprised and reprisectl share: usage errors,
// loggers, and the rendering of flag help. The flags that say how to reach
// a NATS server are internal/natsconn's, shared with the examples.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/reprise-rl/reprise/internal/natsconn"
)

// ErrUsage marks errors in the command line, which exit with status 2.
var ErrUsage = errors.New("usage")

// Usagef returns an error matching ErrUsage.
func Usagef(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, args...))
}

// CheckConn checks connection settings, as a usage error.
func CheckConn(c natsconn.Config) error {
	if err := c.Check(); err != nil {
		return Usagef("%s", strings.TrimPrefix(err.Error(), natsconn.ErrInvalid.Error()+": "))
	}
	return nil
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
