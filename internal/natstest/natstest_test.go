package natstest

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func connect(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func TestAckedMessageSurvivesKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := Start(t)
	url := p.URL()
	js := connect(t, url)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOG", Subjects: []string{"log"}}); err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, "log", []byte("durable"))
	if err != nil {
		t.Fatal(err)
	}

	p.Kill()
	if err := JetStreamAnswers(context.Background(), url); err == nil {
		t.Fatal("server still answers after Kill")
	}
	p.Restart(t)
	if p.URL() != url {
		t.Fatalf("URL after restart = %s, want %s", p.URL(), url)
	}

	js = connect(t, p.URL())
	stream, err := js.Stream(ctx, "LOG")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetMsg(ctx, ack.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != "durable" {
		t.Fatalf("after kill -9 and restart got %q, want \"durable\"", msg.Data)
	}
}

func TestRestartStopsARunningServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := Start(t, WithStoreDir(t.TempDir()), WithMaxPayload(2048))
	p.Restart(t)
	js := connect(t, p.URL())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s", make([]byte, 2000)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s", make([]byte, 2049)); !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("publishing over max payload: err = %v, want ErrMaxPayload", err)
	}
	p.Stop()
	if err := JetStreamAnswers(context.Background(), p.URL()); err == nil {
		t.Fatal("server still answers after Stop")
	}
}

func TestBinaryIsBuiltOnce(t *testing.T) {
	path := Binary(t)
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	again, err := build()
	if err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(again)
	if err != nil {
		t.Fatal(err)
	}
	if again != path || !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("second build gave %s (%v), first %s (%v): want the cached file", again, after.ModTime(), path, before.ModTime())
	}
}

// TestClusterSurvivesLeaderKill: an R3 stream on a three-node cluster keeps
// every acknowledged message when its leader is killed with SIGKILL,
// accepts new ones from the two nodes left, and the restarted node catches
// up.
func TestClusterSurvivesLeaderKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := StartCluster(t, 3)
	if len(c.URLs()) != 3 {
		t.Fatalf("URLs() = %v", c.URLs())
	}
	nc, err := nats.Connect(c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOG", Subjects: []string{"log"}, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	// publish retries until the cluster acknowledges: while a leader is
	// elected publishes time out or find no responders.
	publish := func(i int) {
		t.Helper()
		for {
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			_, err := js.Publish(pctx, "log", []byte{byte(i)}, jetstream.WithMsgID(strconv.Itoa(i)))
			pcancel()
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("publishing %d: %v", i, err)
			}
		}
	}
	for i := range 10 {
		publish(i)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := c.Node(info.Cluster.Leader)
	if leader == nil {
		t.Fatalf("stream leader %q is none of the nodes", info.Cluster.Leader)
	}
	leader.Kill()
	for i := 10; i < 20; i++ {
		publish(i)
	}
	leader.Restart(t)

	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err = stream.Info(ctx)
		if err == nil && info.State.Msgs == 20 && len(info.Cluster.Replicas) == 2 && info.Cluster.Replicas[0].Current && info.Cluster.Replicas[1].Current {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream after restart: info %+v, err %v; want 20 messages and two current replicas", info, err)
		}
		<-tick.C
	}
	if info.Cluster.Leader == "" {
		t.Fatal("no stream leader after restart")
	}
}
