package service

import (
	"testing"

	"github.com/nats-io/nats.go"

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
