package service

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
)

// With WithRequestConn the service answers requests on that connection,
// while the items still arrive through the stream on the other.
func TestRequestConnServesRequests(t *testing.T) {
	url := testutil.StartEmbedded(t, 0)
	rc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	d := deploy(t, []tables.Config{testutil.UniformTable("t", 100)}, deployOptions{url: url, service: []Option{WithRequestConn(rc)}})
	ctx := testutil.Context(t)
	p := d.producer()
	insertSteps(t, p, 0, 3, 2)
	before := rc.Stats()
	samples, err := d.client().Sample(ctx, "t", 2)
	if err != nil || len(samples) != 2 {
		t.Fatalf("Sample: %d samples, %v; want 2", len(samples), err)
	}
	after := rc.Stats()
	if after.InMsgs <= before.InMsgs || after.OutMsgs <= before.OutMsgs {
		t.Errorf("request connection: %d messages in and %d out before the sample, %d and %d after; want the request in and the reply out on it",
			before.InMsgs, before.OutMsgs, after.InMsgs, after.OutMsgs)
	}
}

func TestRequestConnNil(t *testing.T) {
	nc, err := nats.Connect(testutil.StartEmbedded(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := New(nc, []tables.Config{testutil.UniformTable("t", 10)}, WithRequestConn(nil)); err == nil {
		t.Error("WithRequestConn(nil): no error")
	}
}

// With WithReplyConns, replies with items go out over those connections in
// turn, and the parts of one reply larger than the max payload all go out
// over one, so that they arrive whole and in order.
func TestReplyConnsTakeTurns(t *testing.T) {
	url := testutil.StartEmbedded(t, 64<<10)
	var conns []*nats.Conn
	for range 3 {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		conns = append(conns, nc)
	}
	d := deploy(t, []tables.Config{testutil.UniformTable("big", 100)}, deployOptions{url: url, service: []Option{WithReplyConns(conns...)}})
	ctx := testutil.Context(t)
	p := d.producer(broker.WithCompression(wire.Uncompressed))
	const obsLen = 4000 // 16 kB per item
	insertStepsInto(t, p, "big", 0, 40, obsLen)
	out := func() []uint64 {
		n := make([]uint64, len(conns))
		for i, nc := range conns {
			n[i] = nc.Stats().OutMsgs
		}
		return n
	}
	c := d.client()
	next := -1 // the turn is unknown until the first reply: info requests take turns too
	for round := range 2 * len(conns) {
		before := out()
		samples, err := c.Sample(ctx, "big", 64) // 40 distinct chunks of 16 kB: several parts
		if err != nil || len(samples) != 64 {
			t.Fatalf("sample %d: %d samples, %v; want 64", round, len(samples), err)
		}
		for _, s := range samples {
			checkObs(t, s, obsLen)
		}
		after := out()
		var carried []int
		for i := range conns {
			if after[i] != before[i] {
				carried = append(carried, i)
			}
		}
		if next < 0 && len(carried) == 1 {
			next = carried[0]
		}
		if len(carried) != 1 || carried[0] != next || after[next]-before[next] < 2 {
			t.Fatalf("sample %d: messages out per reply connection %v before, %v after; want the reply's parts all on connection %d", round, before, after, next)
		}
		next = (next + 1) % len(conns)
	}
}

func TestReplyConnsNil(t *testing.T) {
	nc, err := nats.Connect(testutil.StartEmbedded(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := New(nc, []tables.Config{testutil.UniformTable("t", 10)}, WithReplyConns(nc, nil)); !errors.Is(err, protocol.ErrInvalidOption) {
		t.Errorf("WithReplyConns(nc, nil): %v, want ErrInvalidOption", err)
	}
}
