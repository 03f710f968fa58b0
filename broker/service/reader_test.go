package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/reprise-rl/reprise/internal/testutil"
)

// readerStream is a stream of n messages on a real embedded server.
func readerStream(t *testing.T, n int) (jetstream.Stream, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(testutil.StartEmbedded(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx := testutil.Context(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R", Subjects: []string{"r.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := js.Publish(ctx, "r.x", fmt.Appendf(nil, "%d", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	return st, js
}

func readSeqs(t *testing.T, r *streamReader, n int) []uint64 {
	t.Helper()
	var seqs []uint64
	for range n {
		ctx, cancel := context.WithTimeout(testutil.Context(t), 30*time.Second)
		_, meta, err := r.Next(ctx)
		cancel()
		if err != nil {
			t.Fatalf("after %v: %v", seqs, err)
		}
		seqs = append(seqs, meta.Sequence.Stream)
	}
	return seqs
}

// A consumer deleted under the reader is replaced, and reading goes on
// from the next message, none skipped or repeated.
func TestReaderReplacesALostConsumer(t *testing.T) {
	st, js := readerStream(t, 10)
	r := newStreamReader(st, "r.>", 1, 1<<20, testutil.QuietLogger(), nil)
	defer r.close()
	got := readSeqs(t, r, 3)
	// Drop what the pull already buffered, so that the next messages must
	// come from a new consumer.
	name := r.cons.CachedInfo().Name
	r.drop()
	if err := st.DeleteConsumer(testutil.Context(t), name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatal(err)
	}
	got = append(got, readSeqs(t, r, 7)...)
	for i, seq := range got {
		if seq != uint64(i+1) {
			t.Fatalf("read %v, want 1 to 10 in order", got)
		}
	}
	// And one deleted while the reader waits on it.
	readAfterDeletion(t, st, js, r)
}

// Messages purged before the reader got to them are reported as a gap.
func TestReaderReportsPurgedMessages(t *testing.T) {
	st, _ := readerStream(t, 10)
	var gaps [][2]uint64
	r := newStreamReader(st, "r.>", 1, 1<<20, testutil.QuietLogger(), func(_ context.Context, from, to uint64) error {
		gaps = append(gaps, [2]uint64{from, to})
		return nil
	})
	defer r.close()
	readSeqs(t, r, 3)
	r.drop()
	if err := st.Purge(testutil.Context(t), jetstream.WithPurgeSequence(8)); err != nil {
		t.Fatal(err)
	}
	if got := readSeqs(t, r, 3); got[0] != 8 || got[2] != 10 {
		t.Fatalf("read %v after the purge, want 8 to 10", got)
	}
	if len(gaps) != 1 || gaps[0] != [2]uint64{4, 7} {
		t.Fatalf("gaps %v, want [4 7]", gaps)
	}
	// So are messages purged before a reader's first one: the purge may
	// come after whoever set where it starts looked at the stream.
	gaps = nil
	first := newStreamReader(st, "r.>", 2, 1<<20, testutil.QuietLogger(), r.gap)
	defer first.close()
	if got := readSeqs(t, first, 1); got[0] != 8 || len(gaps) != 1 || gaps[0] != [2]uint64{2, 7} {
		t.Fatalf("a reader from 2 read %v first and reported gaps %v; want 8, after [2 7]", got, gaps)
	}
}

// unansweredGets is a stream whose GetMsg is never answered, as while it
// has no leader (an election); it notes its GetMsg and CreateConsumer
// calls in order.
type unansweredGets struct {
	jetstream.Stream
	calls []string
}

func (s *unansweredGets) GetMsg(ctx context.Context, _ uint64, _ ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	s.calls = append(s.calls, "GetMsg")
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *unansweredGets) CreateConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	s.calls = append(s.calls, "CreateConsumer")
	return s.Stream.CreateConsumer(ctx, cfg)
}

// A lost consumer that was delivering is replaced without first asking the
// stream for the next message's size: while the stream cannot answer,
// each replacement waited out that ask before it tried to create the
// next consumer.
func TestReaderReplacesALostConsumerWithoutAskingTheNextMessage(t *testing.T) {
	st, js := readerStream(t, 10)
	s := &unansweredGets{Stream: st}
	r := newStreamReader(s, "r.>", 1, 1<<20, testutil.QuietLogger(), nil)
	defer r.close()
	readSeqs(t, r, 10)
	readAfterDeletion(t, st, js, r)
	// Up to the replacement's creation; the quiet time may ask later.
	calls := s.calls
	if i := slices.Index(calls[1:], "CreateConsumer"); i >= 0 {
		calls = calls[:i+2]
	}
	if slices.Contains(calls, "GetMsg") {
		t.Fatalf("calls to the stream up to the replacement %v, want no GetMsg", calls)
	}
}

// readAfterDeletion deletes r's consumer while r waits on it, publishes
// message 11, and checks that r reads it from a consumer of its own.
func readAfterDeletion(t *testing.T, st jetstream.Stream, js jetstream.JetStream, r *streamReader) {
	t.Helper()
	if err := st.DeleteConsumer(testutil.Context(t), r.cons.CachedInfo().Name); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(testutil.Context(t), "r.x", []byte("11")); err != nil {
		t.Fatal(err)
	}
	if got := readSeqs(t, r, 1); got[0] != 11 {
		t.Fatalf("read %v after the consumer's deletion, want 11", got)
	}
}
