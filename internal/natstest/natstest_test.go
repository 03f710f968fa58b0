package natstest

import (
	"context"
	"errors"
	"os"
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
	if err := jetStreamAnswers(url, nil); err == nil {
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
	if err := jetStreamAnswers(p.URL(), nil); err == nil {
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
