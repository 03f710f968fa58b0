package load

import (
	"bytes"
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/broker/wire"
)

func TestFramesAreSimilarInTimeAndCompress(t *testing.T) {
	f := NewFrames(1)
	prev := f.Next()
	steps := []*wire.Tensor{wire.Uint8s([]int64{FrameSide, FrameSide}, prev)}
	for range 15 {
		cur := f.Next()
		if len(cur) != FrameSide*FrameSide {
			t.Fatalf("frame of %d bytes, want %d", len(cur), FrameSide*FrameSide)
		}
		changed := 0
		for i := range cur {
			if cur[i] != prev[i] {
				changed++
			}
		}
		// Six sprites of at most 7x10 pixels that move, and a score box.
		if changed == 0 || changed > 2*6*7*10+8*24 {
			t.Errorf("%d pixels changed between frames, want some and few", changed)
		}
		steps = append(steps, wire.Uint8s([]int64{FrameSide, FrameSide}, cur))
		prev = cur
	}
	c, err := wire.EncodeChunk(1, steps, wire.ChunkOptions{Codec: wire.Zstd, Delta: true})
	if err != nil {
		t.Fatal(err)
	}
	if raw := 16 * FrameSide * FrameSide; len(c.Data)*10 > raw {
		t.Errorf("16 frames compressed to %d of %d bytes, want over 10x", len(c.Data), raw)
	}
	if !bytes.Equal(NewFrames(1).Next(), NewFrames(1).Next()) || bytes.Equal(NewFrames(1).Next(), NewFrames(2).Next()) {
		t.Error("frames depend on something besides their seed")
	}
}

func TestLatencyReport(t *testing.T) {
	h := newHistogram()
	if r := h.report(); r != (LatencyReport{}) {
		t.Errorf("empty report %+v, want zeros", r)
	}
	for i := 100; i >= 1; i-- {
		h.record(time.Duration(i) * time.Millisecond)
	}
	r := h.report()
	near := func(got, want float64) bool { return math.Abs(got-want) <= 0.01*want }
	if r.Count != 100 || !near(r.P50Ms, 50) || !near(r.P90Ms, 90) || !near(r.P99Ms, 99) || r.MaxMs != 100 || r.MeanMs != 50.5 {
		t.Errorf("report %+v, want count 100, p50 50ms, p90 90ms, p99 99ms (within 1%%), max 100ms, mean 50.5ms", r)
	}
}

func TestWindowCountsOnlyInside(t *testing.T) {
	m := newMeter(NewWindow(time.Hour, time.Hour))
	c := m.counter()
	now := time.Now()
	c.record(now, now, 5, 50) // during the warmup
	in := c.w.Start.Add(time.Minute)
	c.record(in, in, 3, 30)
	after := c.w.End.Add(time.Second)
	c.record(after, after, 7, 70)
	c.done()
	if r := m.result(3600); r.Items != 3 || r.Bytes != 30 || r.Latency.Count != 1 {
		t.Errorf("result %+v, want only the operation inside the window", r)
	}
}

func TestConfigErrors(t *testing.T) {
	ctx := t.Context()
	if _, err := RawPublish(ctx, RawConfig{URL: "nats://127.0.0.1:1", Clients: 0, Payload: 400, Duration: time.Second}); !errors.Is(err, ErrConfig) {
		t.Errorf("0 clients: %v, want ErrConfig", err)
	}
	if _, err := RawPublishConsumed(ctx, RawConfig{URL: "nats://127.0.0.1:1", Clients: 1, Payload: 400, Batch: 1}); !errors.Is(err, ErrConfig) {
		t.Errorf("no duration: %v, want ErrConfig", err)
	}
	if _, err := RawRequest(ctx, RawConfig{URL: "nats://127.0.0.1:1", Clients: 1, Payload: 400, Batch: 0, Duration: time.Second}); !errors.Is(err, ErrConfig) {
		t.Errorf("batch 0: %v, want ErrConfig", err)
	}
	if _, err := Atari(ctx, AtariConfig{Actors: 1, Learners: 1, ChunkLength: 16, SequenceLength: 16, Period: 8, EpisodeLength: 8, SampleBatch: 1, Duration: time.Second}); !errors.Is(err, ErrConfig) {
		t.Errorf("episodes shorter than sequences: %v, want ErrConfig", err)
	}
	if err := Fill(ctx, FillConfig{Items: 1, Payload: 6, Clients: 1}); !errors.Is(err, ErrConfig) {
		t.Errorf("payload of 6 bytes: %v, want ErrConfig", err)
	}
	if _, err := Bench(ctx, BenchConfig{Payload: 400, Batch: 1, Duration: time.Second}); !errors.Is(err, ErrConfig) {
		t.Errorf("neither inserters nor samplers: %v, want ErrConfig", err)
	}
	if _, err := Bench(ctx, BenchConfig{Inserters: 1, Payload: 400, Batch: 1, Warmup: -time.Second, Duration: time.Second}); !errors.Is(err, ErrConfig) {
		t.Errorf("negative warmup: %v, want ErrConfig", err)
	}
	if _, err := Bench(ctx, BenchConfig{Inserters: 1, Payload: 400, Batch: 8, Episode: 12, Duration: time.Second}); !errors.Is(err, ErrConfig) {
		t.Errorf("episodes of 12 items in batches of 8: %v, want ErrConfig", err)
	}
}

func TestSeqWatch(t *testing.T) {
	w := newSeqWatch()
	stopped := make(chan struct{})
	wait := func(ctx context.Context, seq uint64) <-chan error {
		ch := make(chan error, 1)
		go func() { ch <- w.wait(ctx, stopped, seq) }()
		return ch
	}
	result := func(ch <-chan error) error {
		t.Helper()
		select {
		case err := <-ch:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("wait did not return")
			return nil
		}
	}
	near, far := wait(t.Context(), 5), wait(t.Context(), 9)
	w.set(4)
	w.set(5)
	if err := result(near); err != nil {
		t.Errorf("wait for 5 after 5 arrived: %v", err)
	}
	select {
	case err := <-far:
		t.Fatalf("wait for 9 returned at 5: %v", err)
	default:
	}
	w.set(12) // a consumer may pass a sequence without stopping at it
	if err := result(far); err != nil {
		t.Errorf("wait for 9 after 12 arrived: %v", err)
	}
	if err := result(wait(t.Context(), 3)); err != nil {
		t.Errorf("wait for a sequence already reached: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	gone := wait(ctx, 50)
	cancel()
	if err := result(gone); !errors.Is(err, context.Canceled) {
		t.Errorf("wait whose context ended: %v, want context.Canceled", err)
	}
	orphan := wait(t.Context(), 50)
	close(stopped)
	if err := result(orphan); !errors.Is(err, errConsumerStopped) {
		t.Errorf("wait on a stopped consumer: %v, want errConsumerStopped", err)
	}
}
