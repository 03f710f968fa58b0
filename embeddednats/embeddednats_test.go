package embeddednats

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func start(t *testing.T, ctx context.Context, opts ...Option) *Server {
	t.Helper()
	s, err := Start(ctx, opts...)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return s
}

func TestPersistsAcrossRestart(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	s := start(t, ctx, WithStoreDir(dir), WithListen("127.0.0.1:0"))

	url := s.ClientURL()
	if !strings.HasPrefix(url, "nats://127.0.0.1:") || strings.HasSuffix(url, ":0") || strings.HasSuffix(url, ":-1") {
		t.Fatalf("ClientURL = %q, want a bound loopback port", url)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, "events.a", []byte("kept"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	s2 := start(t, ctx, WithStoreDir(dir), WithoutListener())
	nc2, err := s2.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	js2, err := jetstream.New(nc2)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js2.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != "kept" || msg.Subject != "events.a" {
		t.Fatalf("after restart got %q on %q, want \"kept\" on events.a", msg.Data, msg.Subject)
	}
}

func TestWithoutListener(t *testing.T) {
	ctx := testContext(t)
	s := start(t, ctx, WithStoreDir(t.TempDir()), WithoutListener())
	if url := s.ClientURL(); url != "" {
		t.Fatalf("ClientURL = %q, want empty", url)
	}
	if addr := s.NATSServer().Addr(); addr != nil {
		t.Fatalf("server listens on %v", addr)
	}
	nc, err := s.Connect(nats.Name("in-process"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s", []byte("x")); err != nil {
		t.Fatal(err)
	}
}

func TestConnectInProcessWithListener(t *testing.T) {
	ctx := testContext(t)
	s := start(t, ctx, WithStoreDir(t.TempDir()), WithListen("127.0.0.1:-1"))
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// In-process connections run over a net.Pipe.
	if addr := nc.ConnectedAddr(); addr != "pipe" {
		t.Fatalf("Connect went through the network to %s", addr)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestInvalidOptions(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	tests := []struct {
		name string
		opts []Option
		text string
	}{
		{"no store dir", nil, "WithStoreDir is required"},
		{"empty store dir", []Option{WithStoreDir("")}, "WithStoreDir is required"},
		{"listen without port", []Option{WithStoreDir(dir), WithListen("127.0.0.1")}, `listen address "127.0.0.1"`},
		{"listen bad port", []Option{WithStoreDir(dir), WithListen("127.0.0.1:http")}, "bad port"},
		{"listen port out of range", []Option{WithStoreDir(dir), WithListen("127.0.0.1:70000")}, "bad port"},
		{"zero max payload", []Option{WithStoreDir(dir), WithMaxPayload(0)}, "max payload 0"},
		{"negative max store", []Option{WithStoreDir(dir), WithJetStreamMaxStore(-1)}, "must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Start(ctx, tt.opts...)
			if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), tt.text) {
				if s != nil {
					s.Shutdown(ctx)
				}
				t.Fatalf("Start = %v, want ErrInvalidOption containing %q", err, tt.text)
			}
		})
	}
}

func TestMaxPayload(t *testing.T) {
	ctx := testContext(t)
	s := start(t, ctx, WithStoreDir(t.TempDir()), WithoutListener(), WithMaxPayload(4096))
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.MaxPayload(); got != 4096 {
		t.Fatalf("MaxPayload = %d, want 4096", got)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s", make([]byte, 4000)); err != nil {
		t.Fatalf("publishing 4000 bytes: %v", err)
	}
	if _, err := js.Publish(ctx, "s", make([]byte, 4097)); !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("publishing 4097 bytes: err = %v, want ErrMaxPayload", err)
	}
}

func TestPortInUse(t *testing.T) {
	ctx := testContext(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s, err := Start(ctx, WithStoreDir(t.TempDir()), WithListen(l.Addr().String()))
	if !errors.Is(err, ErrStartFailed) || !strings.Contains(err.Error(), "listen") {
		if s != nil {
			s.Shutdown(ctx)
		}
		t.Fatalf("Start on a taken port = %v, want ErrStartFailed naming the listener", err)
	}
}

func TestUnusableStoreDir(t *testing.T) {
	ctx := testContext(t)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Start(ctx, WithStoreDir(file), WithoutListener())
	if !errors.Is(err, ErrStartFailed) || !strings.Contains(err.Error(), "JetStream") {
		if s != nil {
			s.Shutdown(ctx)
		}
		t.Fatalf("Start with a file as store dir = %v, want ErrStartFailed naming JetStream", err)
	}
}

// TestStoreDirInUse: two servers writing one JetStream store corrupt each
// other's streams, so a second on a store in use must not start.
func TestStoreDirInUse(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	first := start(t, ctx, WithStoreDir(dir), WithoutListener())
	s, err := Start(ctx, WithStoreDir(dir), WithoutListener())
	if !errors.Is(err, ErrStartFailed) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "in use") {
		if s != nil {
			s.Shutdown(ctx)
		}
		t.Fatalf("Start on a store dir in use = %v, want ErrStartFailed naming the dir in use", err)
	}
	if err := first.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	start(t, ctx, WithStoreDir(dir), WithoutListener())
}

func TestStartHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s, err := Start(ctx, WithStoreDir(t.TempDir()), WithoutListener())
	if !errors.Is(err, context.Canceled) {
		if s != nil {
			s.Shutdown(context.Background())
		}
		t.Fatalf("Start with a cancelled context = %v, want context.Canceled", err)
	}
}

// recordHandler keeps the messages of the records it handles.
type recordHandler struct {
	mu     sync.Mutex
	levels map[string]slog.Level
	level  slog.Level
}

func (h *recordHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *recordHandler) WithGroup(string) slog.Handler                { return h }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.levels[r.Message] = r.Level
	return nil
}

func (h *recordHandler) find(prefix string) (slog.Level, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for msg, l := range h.levels {
		if strings.HasPrefix(msg, prefix) {
			return l, true
		}
	}
	return 0, false
}

func TestLogger(t *testing.T) {
	ctx := testContext(t)
	h := &recordHandler{levels: map[string]slog.Level{}, level: slog.LevelInfo}
	start(t, ctx, WithStoreDir(t.TempDir()), WithoutListener(), WithServerName("reprise-test"), WithLogger(slog.New(h)))
	if l, ok := h.find("Server is ready"); !ok || l != slog.LevelInfo {
		t.Errorf("notice \"Server is ready\" logged = %t at %v, want Info", ok, l)
	}
	if _, ok := h.find("  Name:     reprise-test"); !ok {
		t.Error("server name not in the log")
	}
	if _, ok := h.find("  Go build:"); ok {
		t.Error("a debug message was logged with the handler at Info")
	}
}

func TestFatalIsLoggedAtError(t *testing.T) {
	var buf bytes.Buffer
	l := &logAdapter{logger: slog.New(slog.NewTextHandler(&buf, nil))}
	l.Fatalf("cannot %s", "start")
	l.Fatalf("second")
	if got := *l.fatal.Load(); got != "cannot start" {
		t.Errorf("fatal message = %q, want the first one", got)
	}
	if !strings.Contains(buf.String(), `level=ERROR msg="cannot start" fatal=true`) {
		t.Errorf("log = %q", buf.String())
	}
}

func TestShutdownTwice(t *testing.T) {
	ctx := testContext(t)
	s, err := Start(ctx, WithStoreDir(t.TempDir()), WithoutListener())
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if s.NATSServer().Running() {
		t.Fatal("server still running after Shutdown")
	}
	if _, err := s.Connect(); err == nil {
		t.Fatal("Connect succeeded after Shutdown")
	}
}

func TestSyncAlways(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := Start(ctx, WithStoreDir(t.TempDir()), WithoutListener(), WithSyncAlways())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	if !srv.NATSServer().JetStreamConfig().SyncAlways {
		t.Fatal("JetStream does not sync every write")
	}
}
