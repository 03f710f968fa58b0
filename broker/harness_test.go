package broker

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/selectors"
	"github.com/reprise-rl/reprise/tables"
)

// quietLogger keeps expected warnings (rejections in the garbage tests) out
// of test output unless -v is set.
func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.DiscardHandler)
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// deployment is a NATS server, a running table service and a way to make
// clients for it.
type deployment struct {
	t       testing.TB
	url     string
	prefix  string
	svc     *Service
	stop    func() // stops svc
	connect func() *nats.Conn
}

type deployOptions struct {
	maxPayload int32
	service    []ServiceOption
	url        string // use this server instead of starting an embedded one
}

func startEmbedded(t testing.TB, maxPayload int32) string {
	t.Helper()
	opts := []embeddednats.Option{embeddednats.WithStoreDir(t.TempDir()), embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithLogger(quietLogger())}
	if maxPayload > 0 {
		opts = append(opts, embeddednats.WithMaxPayload(maxPayload))
	}
	srv, err := embeddednats.Start(testContext(t), opts...)
	if err != nil {
		t.Fatalf("starting embedded NATS: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutting down NATS: %v", err)
		}
	})
	return srv.ClientURL()
}

func deploy(t testing.TB, cfgs []tables.Config, o deployOptions) *deployment {
	t.Helper()
	url := o.url
	if url == "" {
		url = startEmbedded(t, o.maxPayload)
	}
	d := &deployment{t: t, url: url, prefix: "test"}
	d.connect = func() *nats.Conn {
		nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatalf("connecting to %s: %v", url, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	d.svc, d.stop = d.startService(cfgs, o.service...)
	return d
}

// startService runs a table service on the deployment's server until the
// returned stop is called (or the test ends), and waits until it answers.
func (d *deployment) startService(cfgs []tables.Config, extra ...ServiceOption) (*Service, func()) {
	t := d.t
	t.Helper()
	opts := append([]ServiceOption{WithPrefix(d.prefix), WithLogger(quietLogger())}, extra...)
	svc, err := NewService(d.connect(), cfgs, opts...)
	if err != nil {
		t.Fatalf("NewService: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("service Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("service did not stop within 30s of its context ending")
			}
		})
	}
	t.Cleanup(stop)
	c := d.client()
	waitUntil(t, "service answers info", func() bool {
		select {
		case err := <-done:
			t.Fatalf("service Run returned early: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Info(ctx, "")
		return err == nil
	})
	return svc, stop
}

func (d *deployment) client() *Client {
	c, err := NewClient(d.connect(), WithPrefix(d.prefix))
	if err != nil {
		d.t.Fatalf("NewClient: %v", err)
	}
	d.t.Cleanup(func() { c.Close() })
	return c
}

func (d *deployment) producer(opts ...ProducerOption) *Producer {
	opts = append([]ProducerOption{WithPrefix(d.prefix), WithLogger(quietLogger())}, opts...)
	p, err := NewProducer(testContext(d.t), d.connect(), opts...)
	if err != nil {
		d.t.Fatalf("NewProducer: %v", err)
	}
	d.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil && !errors.Is(err, ErrClosed) {
			d.t.Logf("closing producer: %v", err)
		}
	})
	return p
}

// waitUntil polls cond until it holds or a generous deadline passes.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-tick.C
	}
}

func tableConfig(name string, sampler, remover selectors.Options, maxSize int64, lim limiter.Config) tables.Config {
	return tables.Config{Name: name, Sampler: sampler, Remover: remover, MaxSize: maxSize, Limiter: lim}
}

func uniformTable(name string, maxSize int64) tables.Config {
	return tableConfig(name, selectors.Options{Kind: selectors.KindUniform}, selectors.Options{Kind: selectors.KindFifo}, maxSize, limiter.MinSize(1))
}

// step builds a step whose "obs" is a float32 vector derived from i, and
// whose "id" is i itself, so a sampled item tells which step it came from.
func step(i int64, obsLen int) Step {
	obs := make([]float32, obsLen)
	for j := range obs {
		obs[j] = float32(i) + float32(j)/1000
	}
	return Step{
		"obs": wire.Float32s([]int64{int64(obsLen)}, obs),
		"id":  wire.Int64s(nil, []int64{i}),
	}
}

func ids(t testing.TB, s Sample) []int64 {
	t.Helper()
	tn := s.Column("id")
	if tn == nil {
		t.Fatalf("sample %d has no id column (columns %v)", s.Info.Key, s.Columns)
	}
	v, err := tn.AsInt64s()
	if err != nil {
		t.Fatalf("id column: %v", err)
	}
	return v
}

func checkObs(t testing.TB, s Sample, obsLen int) {
	t.Helper()
	idv := ids(t, s)
	obs, err := s.Column("obs").AsFloat32s()
	if err != nil {
		t.Fatalf("obs column: %v", err)
	}
	if len(obs) != len(idv)*obsLen {
		t.Fatalf("obs has %d values for %d steps of %d", len(obs), len(idv), obsLen)
	}
	for k, id := range idv {
		for j := range obsLen {
			want := float32(id) + float32(j)/1000
			if got := obs[k*obsLen+j]; math.Abs(float64(got-want)) > 0 {
				t.Fatalf("step %d obs[%d] = %v, want %v", id, j, got, want)
			}
		}
	}
}
