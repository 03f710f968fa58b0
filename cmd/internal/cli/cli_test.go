package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/reprise-rl/reprise/internal/natsconn"
)

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	log, err := NewLogger(&buf, "json", "warn")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "k", 1)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil || rec["msg"] != "shown" || rec["k"] != 1.0 {
		t.Errorf("json log = %q (%v), want only the warning", buf.String(), err)
	}
	buf.Reset()
	log, err = NewLogger(&buf, "text", "debug")
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("d")
	if !strings.Contains(buf.String(), "level=DEBUG msg=d") {
		t.Errorf("text log = %q", buf.String())
	}
	for _, bad := range [][2]string{{"xml", "info"}, {"text", "loud"}} {
		if _, err := NewLogger(io.Discard, bad[0], bad[1]); !errors.Is(err, ErrUsage) {
			t.Errorf("NewLogger(%q, %q) = %v, want a usage error", bad[0], bad[1], err)
		}
	}
}

func TestCheckConn(t *testing.T) {
	if err := CheckConn(natsconn.Config{TLSCert: "c.pem"}); !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "--tls-cert and --tls-key go together") {
		t.Errorf("a certificate without a key: %v, want a usage error naming the flags", err)
	}
	if err := CheckConn(natsconn.Config{TLSCert: "c.pem", TLSKey: "k.pem"}); err != nil {
		t.Errorf("a certificate with its key: %v", err)
	}
}

func TestParseAndHelp(t *testing.T) {
	var out bytes.Buffer
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(&out)
	fs.Usage = func() { PrintDefaults(fs.Output(), fs) }
	name := fs.String("name", "dflt", "the `thing` to use")
	fs.Bool("quiet", false, "say less")
	var c natsconn.Config
	c.RegisterAuth(fs)

	if err := Parse(fs, []string{"--name", "v"}); err != nil || *name != "v" {
		t.Fatalf("Parse = %v, name %q", err, *name)
	}
	if out.Len() != 0 {
		t.Errorf("Parse wrote %q", out.String())
	}
	if err := Parse(fs, []string{"--nope"}); !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "see --help") || out.Len() != 0 {
		t.Errorf("bad flag: %v, output %q: want a usage error and nothing printed", err, out.String())
	}
	if err := Parse(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
	help := out.String()
	for _, want := range []string{"  --name thing\n    \tthe thing to use (default dflt)\n", "  --quiet\n    \tsay less\n", "  --creds file\n", "  --tls-ca file\n", "  --tls-cert file\n", "  --tls-key file\n", "  --user name\n", "  --nkey file\n"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q:\n%s", want, help)
		}
	}
}
