package service

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/internal/testutil"
	"github.com/reprise-rl/reprise/tables"
)

// BenchmarkApplyInsert measures the apply loop's cost per item: applying a
// prepared (parsed and checked) insert message of 64 one-step items of 400
// bytes, each with its own chunk, to a full uniform table, so every insert
// also evicts. Parsing is left out: the prepare workers do it off the loop.
// A table of 10,000 items mostly fits in the CPU's caches; one of 100,000
// (the suite's for 400-byte items) does not.
//
//	go test -run - -bench ApplyInsert -benchmem ./broker/service
func BenchmarkApplyInsert(b *testing.B) {
	for _, size := range []int64{10_000, 100_000} {
		b.Run(fmt.Sprintf("table=%d", size), func(b *testing.B) { benchmarkApplyInsert(b, size) })
	}
}

func benchmarkApplyInsert(b *testing.B, size int64) {
	const items = 64
	s, err := New(fuzzConn(b), []tables.Config{testutil.UniformTable("t", size)}, WithPrefix("bench"), WithLogger(testutil.QuietLogger()))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	message := func(seq uint64) *insertBatch { return preparedMessage(b, s, seq, items, 100) }
	// Fill the table first, so that the measured inserts evict.
	seq := uint64(0)
	for s.tables["t"].Size() < size {
		seq++
		if err := s.applyInsert(ctx, message(seq), seq); err != nil {
			b.Fatal(err)
		}
	}
	// Messages are prepared a round at a time: stopping the timer around
	// each one would stop the world to read memory statistics twice per 64
	// items.
	const round = 256
	prepared := make([]*insertBatch, 0, round)
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		b.StopTimer()
		prepared = prepared[:0]
		for range min(round, b.N-done) {
			seq++
			prepared = append(prepared, message(seq))
		}
		b.StartTimer()
		for _, m := range prepared {
			if err := s.applyInsert(ctx, m, m.sequence); err != nil {
				b.Fatal(err)
			}
		}
		done += len(prepared)
	}
	b.StopTimer()
	perItem := b.Elapsed() / time.Duration(b.N*items)
	b.ReportMetric(float64(perItem.Nanoseconds()), "ns/item")
	b.ReportMetric(float64(time.Second)/float64(perItem), "items/s")
}

// BenchmarkHeldBytes measures what a table holds per item beyond its payload:
// the live heap after parsing and applying insert messages of 64 one-step
// items of 16 bytes (four float32s), each with its own chunk, as an actor's
// producer sends them, into a table large enough to keep them all. It is
// the heap's share of the memory section's figure per 16-byte item, which
// reads the whole process's resident memory.
//
//	go test -run - -bench HeldBytes -benchtime 4000x ./broker/service
func BenchmarkHeldBytes(b *testing.B) {
	const items, payloadBytes = 64, 16
	s, err := New(fuzzConn(b), []tables.Config{testutil.UniformTable("t", 100_000_000)}, WithPrefix("bench"), WithLogger(testutil.QuietLogger()))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for seq := uint64(1); seq <= uint64(b.N); seq++ {
		batch := preparedMessage(b, s, seq, items, payloadBytes/4)
		if err := s.applyInsert(ctx, batch, seq); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(b.N) * items
	if size := s.tables["t"].Size(); size != held {
		b.Fatalf("table holds %d items, want %d", size, held)
	}
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(held)-payloadBytes, "B/item-beyond-payload")
}

// BenchmarkParseInsert measures what the prepare workers do per message
// before the apply loop sees it: reading and checking an insert message of
// 64 one-step items of 400 bytes, each with its own chunk.
//
//	go test -run - -bench ParseInsert -benchmem ./broker/service
func BenchmarkParseInsert(b *testing.B) {
	const items = 64
	limits := DefaultLimits()
	data := benchMessage(b, 1, items, 100)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseInsertBatch(data, &limits); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*items), "ns/item")
}

// benchMessage is an encoded insert message of n one-step items of floats
// float32s for table "t", each with its own chunk, keyed from seq, as an
// actor's producer sends them.
func benchMessage(b *testing.B, seq uint64, n, floats int) []byte {
	payload := make([]float32, floats)
	m := &wire.InsertBatch{ProducerId: "0123456789abcdef0123456789abcdef", Sequence: seq, WindowStart: seq, Window: 1}
	for i := range uint64(n) {
		key := seq<<8 | i + 1
		ch, err := wire.EncodeChunk(key, []*wire.Tensor{wire.Float32s([]int64{int64(floats)}, payload)}, wire.ChunkOptions{Codec: wire.Uncompressed})
		if err != nil {
			b.Fatal(err)
		}
		m.Chunks = append(m.Chunks, ch)
		m.Items = append(m.Items, &wire.Item{Key: key, Table: "t", Priority: 1,
			Columns: []*wire.TrajectoryColumn{{Name: "payload", Squeeze: true, Slices: []*wire.ColumnSlice{{ChunkKey: key, Length: 1}}}}})
		m.ReleaseChunkKeys = append(m.ReleaseChunkKeys, key)
	}
	data, err := proto.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// preparedMessage is benchMessage parsed as s's prepare workers parse it,
// stored at a fixed time.
func preparedMessage(b *testing.B, s *Service, seq uint64, n, floats int) *insertBatch {
	data := benchMessage(b, seq, n, floats)
	batch, err := parseInsertBatch(data, &s.o.limits)
	if err != nil {
		b.Fatal(err)
	}
	batch.storedAt, batch.raw = time.Unix(1_700_000_000, 0), data
	return batch
}
