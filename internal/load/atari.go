package load

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/reprise-rl/reprise/broker"
)

// FrameSide is the side of an Atari observation after the usual
// preprocessing (greyscale, resized to 84x84).
const FrameSide = 84

// Frames makes synthetic Atari-like observations: a static background of
// flat bands, a few sprites that move a pixel or two per step and bounce
// off the edges, and a score box that changes now and then. As in real
// games, consecutive frames differ in few pixels, which is what delta
// encoding and compression exploit.
type Frames struct {
	rng     *rand.Rand
	bg      []byte
	sprites []sprite
	score   int
	step    int
}

type sprite struct {
	x, y, dx, dy, w, h int
	shade              byte
}

// NewFrames returns a frame source; the same seed gives the same frames.
func NewFrames(seed uint64) *Frames {
	rng := rand.New(rand.NewPCG(seed, 0xa7a21))
	f := &Frames{rng: rng, bg: make([]byte, FrameSide*FrameSide)}
	shade := byte(rng.IntN(64))
	for y := range FrameSide {
		if y%12 == 0 {
			shade = byte(rng.IntN(96))
		}
		for x := range FrameSide {
			f.bg[y*FrameSide+x] = shade
		}
	}
	for range 6 {
		f.sprites = append(f.sprites, sprite{
			x: rng.IntN(FrameSide - 8), y: rng.IntN(FrameSide - 16),
			dx: 1 + rng.IntN(2), dy: rng.IntN(3) - 1,
			w: 3 + rng.IntN(5), h: 3 + rng.IntN(8),
			shade: byte(128 + rng.IntN(128)),
		})
	}
	return f
}

// Next returns the next frame, FrameSide*FrameSide bytes in row order.
func (f *Frames) Next() []byte {
	frame := slices.Clone(f.bg)
	for i := range f.sprites {
		s := &f.sprites[i]
		s.x, s.dx = bounce(s.x, s.dx, FrameSide-s.w)
		s.y, s.dy = bounce(s.y, s.dy, FrameSide-s.h)
		for y := s.y; y < s.y+s.h; y++ {
			for x := s.x; x < s.x+s.w; x++ {
				frame[y*FrameSide+x] = s.shade
			}
		}
	}
	f.step++
	if f.rng.IntN(30) == 0 {
		f.score++
	}
	// The score: an 8x24 box whose pattern follows the score's bits.
	for y := 2; y < 10; y++ {
		for x := 30; x < 54; x++ {
			if (f.score>>((x-30)/3))&1 == 1 {
				frame[y*FrameSide+x] = 255
			}
		}
	}
	return frame
}

func bounce(p, d, limit int) (int, int) {
	p += d
	if p < 0 || p > limit {
		d = -d
		p = min(max(p, 0), limit)
	}
	return p, d
}

// AtariConfig describes the Atari-like run: actors append steps of an
// observation (uint8 84x84), an action (int32) and a reward (float32),
// chunked and delta-encoded, and create overlapping sequence items as
// R2D2-style agents do; then learners sample them.
type AtariConfig struct {
	URL, Prefix, Table string
	Actors, Learners   int
	// ChunkLength steps go into one chunk of each column.
	ChunkLength int
	// SequenceLength steps make one item, one every Period steps.
	SequenceLength, Period int
	// EpisodeLength steps make one episode.
	EpisodeLength int
	SampleBatch   int
	// Warmup and Duration apply to the insert phase and to the sample
	// phase in turn.
	Warmup, Duration time.Duration
}

func (c AtariConfig) validate() error {
	err := errors.Join(
		check("Actors", c.Actors, 1), check("Learners", c.Learners, 1),
		check("ChunkLength", c.ChunkLength, 1), check("SequenceLength", c.SequenceLength, 1),
		check("Period", c.Period, 1), check("EpisodeLength", c.EpisodeLength, c.SequenceLength),
		check("SampleBatch", c.SampleBatch, 1),
	)
	if c.Duration <= 0 {
		err = errors.Join(err, fmt.Errorf("%w: Duration must be > 0, got %v", ErrConfig, c.Duration))
	}
	return err
}

// AtariResult is what the Atari-like run measured.
type AtariResult struct {
	Actors         int     `json:"actors"`
	Learners       int     `json:"learners"`
	ChunkLength    int     `json:"chunk_length"`
	SequenceLength int     `json:"sequence_length"`
	Period         int     `json:"period"`
	StepBytes      int     `json:"step_bytes"`
	StepsPerSec    float64 `json:"steps_per_sec"`
	ItemsPerSec    float64 `json:"items_per_sec"`
	// RawBytesPerSec is the rate of step bytes appended, before encoding.
	RawBytesPerSec float64 `json:"raw_bytes_per_sec"`
	// RawBytes of every step appended and WireBytes of every insert
	// message published for them, chunks and item metadata included.
	RawBytes         int64   `json:"raw_bytes"`
	WireBytes        int64   `json:"wire_bytes"`
	CompressionRatio float64 `json:"compression_ratio"`
	// Sample counts sampled items and the bytes of their decoded columns.
	Sample Throughput `json:"sample"`
}

// Atari runs the Atari-like workload. The compression ratio is measured on
// the wire: a subscriber counts the bytes of the insert messages the
// actors publish.
func Atari(ctx context.Context, cfg AtariConfig) (AtariResult, error) {
	if err := cfg.validate(); err != nil {
		return AtariResult{}, err
	}
	log := slog.New(slog.DiscardHandler)
	res := AtariResult{
		Actors: cfg.Actors, Learners: cfg.Learners, ChunkLength: cfg.ChunkLength,
		SequenceLength: cfg.SequenceLength, Period: cfg.Period, StepBytes: FrameSide*FrameSide + 4 + 4,
	}

	tap, err := connect(cfg.URL, "atari wire tap")
	if err != nil {
		return res, err
	}
	defer tap.Close()
	msgs := make(chan *nats.Msg, 1<<16)
	sub, err := tap.ChanSubscribe(cfg.Prefix+".data.insert", msgs)
	if err != nil {
		return res, fmt.Errorf("load: atari: subscribing to inserts: %w", err)
	}
	// Counted on this goroutine's behalf until the actors are done, then
	// drained below.
	var wireBytes atomic.Int64
	tapCtx, stopTap := context.WithCancel(ctx)
	tapDone := make(chan struct{})
	go func() {
		defer close(tapDone)
		for {
			select {
			case m := <-msgs:
				wireBytes.Add(int64(len(m.Data)))
			case <-tapCtx.Done():
				return
			}
		}
	}()

	var steps, items, rawAll atomic.Int64
	ins, err := runClients(ctx, cfg.Actors, cfg.Warmup, cfg.Duration, func(ctx context.Context, i int, c *counter) (err error) {
		nc, err := connect(cfg.URL, fmt.Sprintf("atari actor %d", i))
		if err != nil {
			return err
		}
		defer nc.Close()
		p, err := broker.NewProducer(ctx, nc, broker.WithPrefix(cfg.Prefix), broker.WithLogger(log),
			broker.WithChunkLength(cfg.ChunkLength), broker.WithHistory(max(128, cfg.SequenceLength)))
		if err != nil {
			return fmt.Errorf("load: atari actor %d: %w", i, err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if cerr := p.Close(cctx); cerr != nil && err == nil {
				err = fmt.Errorf("load: atari actor %d: closing: %w", i, cerr)
			}
		}()
		frames := NewFrames(uint64(i))
		traj := broker.Last(cfg.SequenceLength, "observation", "action", "reward")
		shape := []int64{FrameSide, FrameSide}
		for t := 1; time.Now().Before(c.w.End); t++ {
			t0 := time.Now()
			step := broker.Step{
				"observation": broker.Uint8s(shape, frames.Next()),
				"action":      broker.Int32s(nil, []int32{int32(t % 18)}),
				"reward":      broker.Float32s(nil, []float32{float32(t%7) * 0.5}),
			}
			if err := p.Append(ctx, step); err != nil {
				return fmt.Errorf("load: atari actor %d: %w", i, err)
			}
			rawAll.Add(int64(res.StepBytes))
			made := int64(0)
			inEpisode := (t-1)%cfg.EpisodeLength + 1
			if inEpisode >= cfg.SequenceLength && (inEpisode-cfg.SequenceLength)%cfg.Period == 0 {
				if err := p.CreateItem(ctx, cfg.Table, 1, traj); err != nil {
					return fmt.Errorf("load: atari actor %d: %w", i, err)
				}
				made = 1
			}
			if inEpisode == cfg.EpisodeLength {
				if err := p.EndEpisode(ctx); err != nil {
					return fmt.Errorf("load: atari actor %d: %w", i, err)
				}
			}
			t1 := time.Now()
			if c.w.Contains(t1) {
				steps.Add(1)
				items.Add(made)
			}
			c.record(t0, t1, made, int64(res.StepBytes))
		}
		return nil
	})
	if err != nil {
		stopTap()
		<-tapDone
		return res, err
	}
	// The actors closed their producers: every insert message is stored,
	// so it was routed to the tap before the server answers this flush.
	if err := tap.Flush(); err != nil {
		stopTap()
		<-tapDone
		return res, fmt.Errorf("load: atari: flushing the wire tap: %w", err)
	}
	stopTap()
	<-tapDone
	for drained := false; !drained; {
		select {
		case m := <-msgs:
			wireBytes.Add(int64(len(m.Data)))
		default:
			drained = true
		}
	}
	if dropped, _ := sub.Dropped(); dropped > 0 {
		return res, fmt.Errorf("load: atari: the wire tap dropped %d messages: the compression ratio would be wrong", dropped)
	}
	_ = sub.Unsubscribe()

	res.StepsPerSec = float64(steps.Load()) / ins.Seconds
	res.ItemsPerSec = float64(items.Load()) / ins.Seconds
	res.RawBytesPerSec = ins.BytesPerSec
	res.RawBytes, res.WireBytes = rawAll.Load(), wireBytes.Load()
	if res.WireBytes == 0 {
		return res, fmt.Errorf("load: atari: no insert message seen on %s.data.insert: is the prefix right?", cfg.Prefix)
	}
	res.CompressionRatio = float64(res.RawBytes) / float64(res.WireBytes)

	res.Sample, err = runClients(ctx, cfg.Learners, cfg.Warmup, cfg.Duration, func(ctx context.Context, i int, c *counter) error {
		cl, hangUp, err := dialClient(dialURL(cfg.URL), fmt.Sprintf("atari learner %d", i), cfg.Prefix, log)
		if err != nil {
			return err
		}
		defer hangUp()
		for time.Now().Before(c.w.End) {
			t0 := time.Now()
			samples, err := cl.Sample(ctx, cfg.Table, cfg.SampleBatch)
			if err != nil {
				return fmt.Errorf("load: atari learner %d: %w", i, err)
			}
			for _, s := range samples {
				obs, ok := s.Column("observation")
				if !ok || !slices.Equal(obs.Shape, []int64{int64(cfg.SequenceLength), FrameSide, FrameSide}) {
					return fmt.Errorf("load: atari learner %d: sampled observation %v, want shape [%d %d %d]", i, obs.Shape, cfg.SequenceLength, FrameSide, FrameSide)
				}
			}
			c.record(t0, time.Now(), int64(len(samples)), sampledBytes(samples))
		}
		return nil
	})
	return res, err
}
