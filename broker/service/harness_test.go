package service

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/internal/testutil"

	"github.com/reprise-rl/reprise/broker"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/tables"
)

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
	service    []Option
	url        string // use this server instead of starting an embedded one
}

func deploy(t testing.TB, cfgs []tables.Config, o deployOptions) *deployment {
	t.Helper()
	url := o.url
	if url == "" {
		url = testutil.StartEmbedded(t, o.maxPayload)
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
func (d *deployment) startService(cfgs []tables.Config, extra ...Option) (*Service, func()) {
	t := d.t
	t.Helper()
	opts := append([]Option{WithPrefix(d.prefix), WithLogger(testutil.QuietLogger())}, extra...)
	svc, err := New(d.connect(), cfgs, opts...)
	if err != nil {
		t.Fatalf("service.New: %v", err)
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
	testutil.WaitUntil(t, "service answers info", func() bool {
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

func (d *deployment) client() *broker.Client {
	c, err := broker.NewClient(d.connect(), broker.WithPrefix(d.prefix))
	if err != nil {
		d.t.Fatalf("NewClient: %v", err)
	}
	d.t.Cleanup(func() { c.Close() })
	return c
}

func (d *deployment) producer(opts ...broker.ProducerOption) *broker.Producer {
	opts = append([]broker.ProducerOption{broker.WithPrefix(d.prefix), broker.WithLogger(testutil.QuietLogger())}, opts...)
	p, err := broker.NewProducer(testutil.Context(d.t), d.connect(), opts...)
	if err != nil {
		d.t.Fatalf("NewProducer: %v", err)
	}
	d.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil && !errors.Is(err, protocol.ErrClosed) {
			d.t.Logf("closing producer: %v", err)
		}
	})
	return p
}

// step is step i of the tests' episodes: "obs" from testutil.Obs and "id"
// i itself.
func step(i int64, obsLen int) broker.Step {
	return broker.Step{"obs": broker.Float32s([]int64{int64(obsLen)}, testutil.Obs(i, obsLen)), "id": broker.Int64s(nil, []int64{i})}
}

// insertSteps appends steps from to to-1 (see step) with a one-step item
// of each in table t, and waits until the service applied them.
func insertSteps(t testing.TB, p *broker.Producer, from, to int64, obsLen int) {
	t.Helper()
	insertStepsInto(t, p, "t", from, to, obsLen)
}

// insertStepsInto is insertSteps into table.
func insertStepsInto(t testing.TB, p *broker.Producer, table string, from, to int64, obsLen int) {
	t.Helper()
	ctx := testutil.Context(t)
	for i := from; i < to; i++ {
		if err := p.Append(ctx, step(i, obsLen)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, table, 1, broker.LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
}

// ids are the step ids of a sampled item.
func ids(t testing.TB, s broker.Sample) []int64 {
	t.Helper()
	id, ok := s.Column("id")
	if !ok {
		t.Fatalf("sample %d has no id column (columns %v)", s.Info.Key, s.Columns)
	}
	v, err := id.Int64s()
	if err != nil {
		t.Fatalf("id column: %v", err)
	}
	return v
}

func checkObs(t testing.TB, s broker.Sample, obsLen int) {
	t.Helper()
	col, _ := s.Column("obs")
	obs, err := col.Float32s()
	if err != nil {
		t.Fatalf("obs column: %v", err)
	}
	testutil.CheckObs(t, ids(t, s), obs, obsLen)
}

// column is a sampled item's column, which it must have.
func column(t testing.TB, s broker.Sample, name string) broker.Tensor {
	t.Helper()
	c, ok := s.Column(name)
	if !ok {
		t.Fatalf("sample %d has no column %q", s.Info.Key, name)
	}
	return c
}

// pendingLen is how many items wait in table's queue, read on the apply
// loop through a capture.
func (s *Service) pendingLen(table string) int {
	var c *captured
	select {
	case c = <-s.intr.request():
	case <-s.applyDone:
		return -1
	}
	n := 0
	for _, p := range c.pending {
		if p.Item.Table == table {
			n++
		}
	}
	return n
}
