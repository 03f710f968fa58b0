package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker/service"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
)

// deployment is a NATS server with a running table service, for the tests
// of producers and clients (the service's own tests have a fuller one).
type deployment struct {
	t           testing.TB
	url         string
	prefix      string
	svc         *service.Service
	stopService func() // stops svc, once
}

// deploy runs a table service with cfgs on the server at url, or on an
// embedded server when url is empty, until the test ends.
func deploy(t testing.TB, cfgs []tables.Config, url string) *deployment {
	t.Helper()
	if url == "" {
		url = testutil.StartEmbedded(t, 0)
	}
	return deployPrefix(t, cfgs, url, "test")
}

// deployShards runs n table services on one embedded server, shard i with
// prefix "shard<i>", each with cfgs.
func deployShards(t testing.TB, cfgs []tables.Config, n int) []*deployment {
	t.Helper()
	url := testutil.StartEmbedded(t, 0)
	out := make([]*deployment, n)
	for i := range out {
		out[i] = deployPrefix(t, cfgs, url, fmt.Sprintf("shard%d", i), service.WithShard(service.Shard{Index: i, Count: n}))
	}
	return out
}

func deployPrefix(t testing.TB, cfgs []tables.Config, url, prefix string, opts ...service.Option) *deployment {
	t.Helper()
	d := &deployment{t: t, url: url, prefix: prefix}
	opts = append([]service.Option{service.WithPrefix(d.prefix), service.WithLogger(testutil.QuietLogger())}, opts...)
	svc, err := service.New(d.connect(), cfgs, opts...)
	if err != nil {
		t.Fatalf("service.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	d.stopService = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("service Run: %v", err)
		}
	})
	t.Cleanup(d.stopService)
	d.svc = svc
	c := d.client()
	testutil.WaitUntil(t, "the service answers info", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Info(ctx, "")
		return err == nil
	})
	return d
}

func (d *deployment) connect() *nats.Conn {
	nc, err := nats.Connect(d.url, nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		d.t.Fatalf("connecting to %s: %v", d.url, err)
	}
	d.t.Cleanup(nc.Close)
	return nc
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
	opts = append([]ProducerOption{WithPrefix(d.prefix), WithLogger(testutil.QuietLogger())}, opts...)
	p, err := NewProducer(testutil.Context(d.t), d.connect(), opts...)
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

// step is step i of the tests' episodes: "obs" from testutil.Obs and "id"
// i itself.
func step(i int64, obsLen int) Step {
	return Step{"obs": Float32s([]int64{int64(obsLen)}, testutil.Obs(i, obsLen)), "id": Int64s(nil, []int64{i})}
}

// ids are the step ids of a sampled item.
func ids(t testing.TB, s Sample) []int64 {
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

func checkObs(t testing.TB, s Sample, obsLen int) {
	t.Helper()
	col, _ := s.Column("obs")
	obs, err := col.Float32s()
	if err != nil {
		t.Fatalf("obs column: %v", err)
	}
	testutil.CheckObs(t, ids(t, s), obs, obsLen)
}
