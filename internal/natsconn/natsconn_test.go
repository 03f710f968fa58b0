package natsconn

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/reprise-rl/reprise/embeddednats"
)

func TestCheck(t *testing.T) {
	t.Setenv(PasswordEnv, "")
	tests := []struct {
		c    Config
		want string // "" for no error
	}{
		{Config{}, ""},
		{Config{TLSCert: "c.pem"}, "--tls-cert and --tls-key go together"},
		{Config{TLSKey: "k.pem"}, "--tls-cert and --tls-key go together"},
		{Config{TLSCert: "c.pem", TLSKey: "k.pem", TLSCA: "ca.pem"}, ""},
		{Config{User: "alice", Password: "pw"}, ""},
		{Config{Password: "pw"}, "--password needs --user"},
		{Config{User: "alice"}, "--user alice needs a password"},
		{Config{User: "alice", Password: "pw", NkeyFile: "a.nk"}, "--user and --nkey are different ways to authenticate"},
		{Config{NkeyFile: "a.nk", Creds: "a.creds"}, "--nkey and --creds"},
		{Config{User: "a.b", Password: "pw"}, "--user: "},
		{Config{User: "a.b", Password: "pw", InboxPrefix: "_INBOX.ab"}, ""},
		{Config{InboxPrefix: "_INBOX.>"}, "--inbox-prefix"},
		{Config{InboxPrefix: "_INBOX."}, "--inbox-prefix"},
	}
	for _, tt := range tests {
		err := tt.c.Check()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v: %v", tt.c, err)
		case tt.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%+v: %v, want ErrInvalid containing %q", tt.c, err, tt.want)
		}
	}
	t.Setenv(PasswordEnv, "from the environment")
	if err := (Config{User: "alice"}).Check(); err != nil {
		t.Errorf("a user with $%s set: %v", PasswordEnv, err)
	}
}

func writeSeed(t *testing.T) (path, pub string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ = kp.PublicKey()
	path = filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(path, append(seed, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, pub
}

func TestConnect(t *testing.T) {
	t.Setenv(PasswordEnv, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seedFile, pub := writeSeed(t)
	all := embeddednats.Permissions{}
	srv, err := embeddednats.Start(ctx, embeddednats.WithStoreDir(t.TempDir()), embeddednats.WithListen("127.0.0.1:-1"),
		embeddednats.WithUser("alice", "pw", all), embeddednats.WithNkeyUser(pub, all))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	url := srv.ClientURL()

	nc, err := Config{URL: url, User: "alice", Password: "pw"}.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	if inbox := nc.NewInbox(); !strings.HasPrefix(inbox, "_INBOX.alice.") {
		t.Errorf("alice's inbox %s, want it under _INBOX.alice", inbox)
	}
	nc.Close()

	t.Setenv(PasswordEnv, "pw")
	nc, err = Config{URL: url, User: "alice"}.Connect("test")
	if err != nil {
		t.Fatalf("password from $%s: %v", PasswordEnv, err)
	}
	nc.Close()

	nc, err = Config{URL: url, NkeyFile: seedFile}.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	if inbox := nc.NewInbox(); !strings.HasPrefix(inbox, "_INBOX."+pub+".") {
		t.Errorf("nkey user's inbox %s, want it under _INBOX.%s", inbox, pub)
	}
	nc.Close()

	nc, err = Config{URL: url, User: "alice", Password: "pw", InboxPrefix: "_R.alice"}.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	if inbox := nc.NewInbox(); !strings.HasPrefix(inbox, "_R.alice.") {
		t.Errorf("inbox %s, want it under --inbox-prefix", inbox)
	}
	nc.Close()

	if _, err := (Config{URL: url}).Connect("test"); err == nil || !strings.Contains(err.Error(), "requires authentication: give --user and --password, --nkey or --creds") {
		t.Errorf("without credentials: %v", err)
	}
	if _, err := (Config{URL: url, User: "alice", Password: "wrong"}).Connect("test"); err == nil || !strings.Contains(err.Error(), "refused these credentials") || !strings.Contains(err.Error(), url) {
		t.Errorf("with a wrong password: %v", err)
	}
	if _, err := (Config{URL: url, NkeyFile: filepath.Join(t.TempDir(), "none")}).Connect("test"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("with a missing seed file: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.nk")
	os.WriteFile(bad, []byte(pub), 0o600)
	if _, err := (Config{URL: url, NkeyFile: bad}).Connect("test"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "no user nkey seed") {
		t.Errorf("with a public key as the seed: %v", err)
	}
}

func TestConnectDefaultURL(t *testing.T) {
	nc, err := Config{URL: DefaultURL}.Connect("test")
	if err == nil {
		nc.Close()
	}
	// Nothing listens on 4222 in tests, or something does: either way a
	// failure names the URL and says what to do.
	if err != nil && (!strings.Contains(err.Error(), DefaultURL) || !strings.Contains(err.Error(), "go run ./cmd/reprised")) {
		t.Errorf("connecting to the default URL: %v", err)
	}
}

func TestOptions(t *testing.T) {
	// The name and the handshake timeout, then one option per setting given.
	opts, err := Config{Creds: "u.creds", TLSCA: "ca.pem", TLSCert: "c.pem", TLSKey: "k.pem"}.Options("x")
	if err != nil || len(opts) != 5 {
		t.Errorf("%d options (%v), want 5", len(opts), err)
	}
	opts, err = Config{User: "u", Password: "p"}.Options("x")
	if err != nil || len(opts) != 4 {
		t.Fatalf("user: %d options (%v), want name, timeout, user and inbox", len(opts), err)
	}
	o := nats.GetDefaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			t.Fatal(err)
		}
	}
	if o.Name != "x" || o.Timeout != handshakeTimeout || o.User != "u" || o.Password != "p" || o.InboxPrefix == "" {
		t.Errorf("options set name %q, timeout %v, user %q, password %q, inbox prefix %q", o.Name, o.Timeout, o.User, o.Password, o.InboxPrefix)
	}
}

func TestRegisterAuth(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.RegisterAuth(fs)
	args := []string{"--user", "u", "--password", "p", "--nkey", "n", "--creds", "c", "--tls-ca", "ca", "--tls-cert", "cc", "--tls-key", "ck", "--inbox-prefix", "i"}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	want := Config{User: "u", Password: "p", NkeyFile: "n", Creds: "c", TLSCA: "ca", TLSCert: "cc", TLSKey: "ck", InboxPrefix: "i"}
	if c != want {
		t.Errorf("parsed %+v, want %+v", c, want)
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                        "nats://127.0.0.1:4222",
		"nats://svc:S3cret@10.0.0.1:4222":              "nats://svc:xxxxx@10.0.0.1:4222",
		"nats://T0ken@10.0.0.1:4222":                   "nats://xxxxx@10.0.0.1:4222",
		"nats://a:1@h1:4222,nats://h2:4222,tls://k@h3": "nats://a:xxxxx@h1:4222,nats://h2:4222,tls://xxxxx@h3",
		"127.0.0.1:4222":                               "127.0.0.1:4222",
		"nats://a:b c@h%zz":                            "(a URL that does not parse)",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
