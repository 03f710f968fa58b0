package embeddednats

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/reprise-rl/reprise/internal/syncbuf"
	"github.com/reprise-rl/reprise/internal/testcerts"
)

// onlyOwn lets a user publish and subscribe under its own name, and read
// its own inbox.
func onlyOwn(name string) Permissions {
	return Permissions{
		Publish:   SubjectPermissions{Allow: []string{name + ".>"}},
		Subscribe: SubjectPermissions{Allow: []string{name + ".>", "_INBOX." + name + ".>"}, Deny: []string{name + ".secret"}},
	}
}

// violations collects the permissions violations the server reports to a
// connection.
type violations struct{ errs chan error }

func (v violations) option() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			select {
			case v.errs <- err:
			default:
			}
		}
	})
}

// next waits for the next violation, which must name subject.
func (v violations) next(t *testing.T, subject string) {
	t.Helper()
	select {
	case err := <-v.errs:
		if !strings.Contains(err.Error(), `"`+subject+`"`) {
			t.Fatalf("violation %v, want one for %q", err, subject)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no permissions violation for %q", subject)
	}
}

func TestUsersAndNkeys(t *testing.T) {
	ctx := testContext(t)
	hash, err := bcrypt.GenerateFromPassword([]byte("bob's password"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	s := start(t, ctx, WithStoreDir(t.TempDir()), WithListen("127.0.0.1:-1"),
		WithUser("alice", "alice's password", onlyOwn("alice")),
		WithUser("bob", string(hash), onlyOwn("bob")),
		WithNkeyUser(pub, onlyOwn(pub)))
	url := s.ClientURL()

	if _, err := nats.Connect(url); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("connecting without credentials: %v, want an authorization error", err)
	}
	if _, err := nats.Connect(url, nats.UserInfo("alice", "wrong")); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("connecting with a wrong password: %v, want an authorization error", err)
	}
	if _, err := nats.Connect(url, nats.UserInfo("bob", string(hash))); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("connecting with bob's hash as the password: %v, want an authorization error", err)
	}
	if _, err := s.Connect(nats.Name("anonymous")); !errors.Is(err, ErrCredentialsRequired) {
		t.Errorf("connecting in process without credentials: %v, want ErrCredentialsRequired", err)
	}

	for _, tc := range []struct {
		name string
		opts []nats.Option
	}{
		{"alice", []nats.Option{nats.UserInfo("alice", "alice's password")}},
		{"bob", []nats.Option{nats.UserInfo("bob", "bob's password")}},
		{pub, []nats.Option{nats.Nkey(pub, kp.Sign)}},
	} {
		v := violations{make(chan error, 8)}
		opts := append(tc.opts, nats.CustomInboxPrefix("_INBOX."+tc.name), v.option())
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		defer nc.Close()
		sub, err := nc.SubscribeSync(tc.name + ".in")
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(tc.name+".in", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := sub.NextMsg(10 * time.Second); err != nil {
			t.Errorf("%s does not receive its own message: %v", tc.name, err)
		}
		nc.Publish("other.in", []byte("x"))
		v.next(t, "other.in")
		nc.SubscribeSync("other.>")
		v.next(t, "other.>")
		nc.SubscribeSync(tc.name + ".secret")
		v.next(t, tc.name+".secret")
		nc.SubscribeSync("_INBOX.>")
		v.next(t, "_INBOX.>")
		// Its own inbox is allowed. The server answers SUB before the
		// PING of Flush, so a violation would be recorded by then.
		inbox := nc.NewInbox()
		if !strings.HasPrefix(inbox, "_INBOX."+tc.name+".") {
			t.Fatalf("inbox %s", inbox)
		}
		if _, err := nc.SubscribeSync(inbox); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := nc.LastError(); err != nil && strings.Contains(err.Error(), inbox) {
			t.Errorf("%s may not read its own inbox: %v", tc.name, err)
		}
	}

	// In process, with credentials.
	nc, err := s.Connect(nats.UserInfo("alice", "alice's password"))
	if err != nil {
		t.Fatalf("connecting in process as alice: %v", err)
	}
	nc.Close()
}

func TestInvalidUsers(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	tests := []struct {
		name string
		opts []Option
		text string
	}{
		{"no password", []Option{WithUser("a", "", Permissions{})}, "needs a name and a password"},
		{"no name", []Option{WithUser("", "p", Permissions{})}, "needs a name and a password"},
		{"same name twice", []Option{WithUser("a", "p", Permissions{}), WithUser("a", "q", Permissions{})}, `user "a" given twice`},
		{"seed as nkey", []Option{WithNkeyUser(string(seed), Permissions{})}, "is not the public key of a user nkey"},
		{"nkey twice", []Option{WithNkeyUser(pub, Permissions{}), WithNkeyUser(pub, Permissions{})}, "given twice"},
		{"TLS without key", []Option{WithTLS(TLS{CertFile: "c.pem"})}, "certificate file and a key file"},
		{"CA without verification", []Option{WithTLS(TLS{CertFile: "c.pem", KeyFile: "k.pem", CAFile: "ca.pem"})}, "set VerifyClients"},
		{"missing certificate", []Option{WithTLS(TLS{CertFile: dir + "/none.pem", KeyFile: dir + "/none.pem"})}, "TLS:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Start(ctx, append([]Option{WithStoreDir(dir), WithoutListener()}, tt.opts...)...)
			if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), tt.text) {
				if s != nil {
					s.Shutdown(ctx)
				}
				t.Fatalf("Start = %v, want ErrInvalidOption containing %q", err, tt.text)
			}
		})
	}
}

func TestListenBeyondLoopback(t *testing.T) {
	ctx := testContext(t)
	for _, listen := range []string{"0.0.0.0:-1", ":-1", "[::]:-1", "example.com:-1"} {
		s, err := Start(ctx, WithStoreDir(t.TempDir()), WithListen(listen))
		if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "add users") {
			if s != nil {
				s.Shutdown(ctx)
			}
			t.Errorf("Start on %s without users = %v, want ErrUnauthenticated with a way out", listen, err)
		}
	}
	for host, want := range map[string]bool{"127.0.0.1": true, "127.0.0.2": true, "::1": true, "localhost": true, "": false, "0.0.0.0": false, "::": false, "10.0.0.1": false, "reprise.example.com": false} {
		if got := isLoopback(host); got != want {
			t.Errorf("isLoopback(%q) = %t, want %t", host, got, want)
		}
	}

	var logs syncbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s := start(t, ctx, WithStoreDir(t.TempDir()), WithListen("0.0.0.0:-1"), WithAllowUnauthenticated(), WithLogger(logger))
	if !strings.Contains(logs.String(), "without authentication") {
		t.Errorf("no warning about listening without authentication:\n%s", logs.String())
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()

	var logs2 syncbuf.Buffer
	logger2 := slog.New(slog.NewTextHandler(&logs2, &slog.HandlerOptions{Level: slog.LevelWarn}))
	start(t, ctx, WithStoreDir(t.TempDir()), WithListen("0.0.0.0:-1"), WithUser("a", "p", Permissions{}), WithLogger(logger2))
	if got := logs2.String(); strings.Contains(got, "without authentication") || !strings.Contains(got, "passwords cross the network in the clear") {
		t.Errorf("with a password user and no TLS, want only the clear-text warning, got:\n%s", got)
	}
}

func TestTLS(t *testing.T) {
	ctx := testContext(t)
	certs := testcerts.Write(t)
	s := start(t, ctx, WithStoreDir(t.TempDir()), WithListen("127.0.0.1:-1"),
		WithTLS(TLS{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, VerifyClients: true, CAFile: certs.CA}))
	url := s.ClientURL()
	if _, err := nats.Connect(url); err == nil {
		t.Error("connected without TLS")
	}
	if _, err := nats.Connect(url, nats.RootCAs(certs.CA)); err == nil {
		t.Error("connected over TLS without a client certificate")
	}
	nc, err := nats.Connect(url, nats.RootCAs(certs.CA), nats.ClientCert(certs.ClientCert, certs.ClientKey))
	if err != nil {
		t.Fatalf("connecting with a client certificate: %v", err)
	}
	if !nc.TLSRequired() {
		t.Error("the connection does not use TLS")
	}
	nc.Close()
	// In process, no certificate is needed.
	nc, err = s.Connect()
	if err != nil {
		t.Fatalf("connecting in process: %v", err)
	}
	nc.Close()

	// Client certificates verified are authentication: 0.0.0.0 is allowed.
	start(t, ctx, WithStoreDir(t.TempDir()), WithListen("0.0.0.0:-1"),
		WithTLS(TLS{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, VerifyClients: true, CAFile: certs.CA}))

	// Verified against the system's roots, a certificate any public CA
	// issued for client authentication would let its holder in, with
	// every permission: that is no authentication beyond loopback.
	if s, err := Start(ctx, WithStoreDir(t.TempDir()), WithListen("0.0.0.0:-1"),
		WithTLS(TLS{CertFile: certs.ServerCert, KeyFile: certs.ServerKey, VerifyClients: true})); !errors.Is(err, ErrUnauthenticated) {
		if s != nil {
			s.Shutdown(ctx)
		}
		t.Errorf("Start on 0.0.0.0 verifying client certificates against the system roots, without users = %v, want ErrUnauthenticated", err)
	}

	// Without verification, clients need only trust the server.
	s3 := start(t, ctx, WithStoreDir(t.TempDir()), WithListen("127.0.0.1:-1"), WithTLS(TLS{CertFile: certs.ServerCert, KeyFile: certs.ServerKey}))
	nc, err = nats.Connect(s3.ClientURL(), nats.RootCAs(certs.CA))
	if err != nil {
		t.Fatalf("connecting over TLS: %v", err)
	}
	nc.Close()
}
