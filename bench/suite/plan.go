package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/reprise-rl/reprise/internal/gcpace"
)

// plan is what one run of the suite measures, and for how long.
type plan struct {
	payloads []int
	clients  []int
	warmup   time.Duration
	duration time.Duration
	// mixedBatch is the batch of both kinds of client in the mixed run.
	mixedBatch int

	mixedPayload int
	mixedClients []int

	// actorProducers are the producer counts of the actor-load run, few
	// then many, beside actorLearners learners; its warmup leaves time
	// for many producers to connect.
	actorProducers []int
	actorLearners  int
	actorWarmup    time.Duration

	atariActors, atariLearners int
	// atariBatch is the learners' batch: small in the quick plan, whose
	// learners decode under the race detector on a loaded CI machine.
	atariBatch int

	// latencyPoint times single-item samples; latencyInserts items go
	// through the insert-to-sampleable run.
	latencyPoint   time.Duration
	latencyInserts int

	memory []memorySeries

	// shardCounts are the shard counts of the shards section, each on a
	// fresh nats-server; shardPayloads and shardClients are its points.
	shardCounts   []int
	shardPayloads []int
	shardClients  []int

	// settle bounds the wait for a process's resident memory to settle.
	settle time.Duration
	// reverbQuiet is how long the Reverb driver may print nothing.
	reverbQuiet time.Duration
	// rest is how long the memory section lets reprised rest after each
	// fill before it reads its resident memory at rest: past the NATS
	// server's 10-second block cache and gcpace.RestAfter.
	rest time.Duration
}

// memorySeries fills one fresh reprised with items of one size and
// measures its resident memory at each cumulative count.
type memorySeries struct {
	Name    string `json:"name"`
	Payload int    `json:"payload_bytes"`
	Items   []int  `json:"items"`
}

// The Reverb paper's payloads: random float32s of 400 B to 400 kB.
var paperPayloads = []int{400, 4000, 40000, 400000}

func fullPlan() plan {
	return plan{
		payloads:       paperPayloads,
		clients:        []int{1, 2, 4, 8, 16, 32, 64},
		warmup:         500 * time.Millisecond,
		duration:       2 * time.Second,
		mixedBatch:     64,
		mixedPayload:   4000,
		mixedClients:   []int{1, 4, 16},
		actorProducers: []int{16, 200},
		actorLearners:  16,
		actorWarmup:    time.Second,
		atariActors:    4,
		atariLearners:  4,
		atariBatch:     32,
		latencyPoint:   3 * time.Second,
		latencyInserts: 1000,
		memory: []memorySeries{
			{Name: "payload", Payload: 4000, Items: []int{25000, 50000, 100000}},
			{Name: "per-item", Payload: 16, Items: []int{250000, 500000}},
		},
		shardCounts:   []int{1, 2, 4},
		shardPayloads: []int{400, 4000},
		shardClients:  []int{4, 16, 64},
		settle:        10 * time.Second,
		rest:          gcpace.RestAfter + 3*time.Second,
		reverbQuiet:   reverbQuiet,
	}
}

// quickPlan is the smoke version CI runs: every section, one payload, two
// client counts, under a second per point (the memory section rests 15 s
// before each reading at rest: each series' base and each point).
func quickPlan() plan {
	return plan{
		payloads:       []int{400},
		clients:        []int{1, 4},
		warmup:         250 * time.Millisecond,
		duration:       750 * time.Millisecond,
		mixedBatch:     64,
		mixedPayload:   400,
		mixedClients:   []int{2},
		actorProducers: []int{2, 8},
		actorLearners:  2,
		actorWarmup:    250 * time.Millisecond,
		atariActors:    2,
		atariLearners:  2,
		atariBatch:     4,
		latencyPoint:   750 * time.Millisecond,
		latencyInserts: 100,
		memory: []memorySeries{
			{Name: "payload", Payload: 4000, Items: []int{5000}},
			{Name: "per-item", Payload: 16, Items: []int{20000}},
		},
		shardCounts:   []int{1, 2},
		shardPayloads: []int{400},
		shardClients:  []int{4},
		settle:        3 * time.Second,
		rest:          gcpace.RestAfter + 3*time.Second,
		reverbQuiet:   reverbQuiet,
	}
}

// sampleBatch is the batch of a sample request for items of payload
// bytes: 256 as in the target, fewer for large items so that a
// reply stays under NATS's default max payload (1 MiB).
func sampleBatch(payload int) int {
	return min(256, max(1, (900<<10)/payload))
}

// insertBatch is the number of items an insert client creates between
// flushes: 64, halved for large items until 64 clients have at most 64 MiB
// waiting to be stored. JetStream refuses messages ("429 too many
// requests") once a stream's ingest queue holds 128 MiB.
func insertBatch(payload int) int {
	b := 64
	for b > 1 && 64*b*payload > 64<<20 {
		b /= 2
	}
	return b
}

// tableSize bounds a benchmark table to about 200 MB of payload (and
// 100000 items), so that the suite's memory stays modest.
func tableSize(payload int) int {
	return min(100000, max(100, (200<<20)/payload))
}

func benchTable(payload int) string { return fmt.Sprintf("bench_%d", payload) }

// The mixed run's rate limiter: 4 samples per insert, once 1000 items are
// in, give or take 4096 samples. The buffer is wide enough for several
// batches either way, so actors and learners rarely wait on each other's
// single request.
const (
	mixedTable            = "mixed"
	mixedSamplesPerInsert = 4
	mixedMinSize          = 1000
	mixedErrorBuffer      = 4096
	mixedMaxSize          = 100000
	// The actor-load run: small items, each producer flushing 64 at a
	// time, learners asking for 32; the table holds about a second of
	// inserts, and lets every sample through once it holds one item.
	actorsTable      = "actors"
	actorPayload     = 100
	actorInsertBatch = 64
	actorSampleBatch = 32
	actorsMaxSize    = 200000
	atariTable       = "atari"
	atariMaxSize     = 100000
	latencyTable     = "latency"
	memoryTable      = "mem"
	// streamBytes caps the stream so that a full suite does not fill the
	// disk: the oldest messages go first, as in a deployment sized for
	// its checkpoint interval.
	streamBytes = 2 << 30
)

// writeConfig writes the reprised configuration for the suite's tables.
func writeConfig(path string, memory bool) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by bench/suite.\nlog:\n  level: warn\nstream:\n  max_bytes: %d\n", streamBytes)
	if memory {
		// No periodic checkpoint: one copies the whole table into memory
		// while it is written, which a reading at rest would catch or miss
		// by chance (README's Memory section gives its cost).
		fmt.Fprintf(&b, "checkpoint:\n  every: 0s\ntables:\n")
		fmt.Fprintf(&b, "  - {name: %s, sampler: uniform, remover: fifo, max_size: 10000000}\n", memoryTable)
		return os.WriteFile(path, []byte(b.String()), 0o644)
	}
	b.WriteString("tables:\n")
	for _, p := range paperPayloads {
		fmt.Fprintf(&b, "  - {name: %s, sampler: uniform, remover: fifo, max_size: %d}\n", benchTable(p), tableSize(p))
	}
	fmt.Fprintf(&b, "  - name: %s\n    sampler: uniform\n    remover: fifo\n    max_size: %d\n", mixedTable, mixedMaxSize)
	fmt.Fprintf(&b, "    rate_limiter: {preset: sample_to_insert_ratio, samples_per_insert: %d, min_size: %d, error_buffer: %d}\n",
		mixedSamplesPerInsert, mixedMinSize, mixedErrorBuffer)
	fmt.Fprintf(&b, "  - {name: %s, sampler: uniform, remover: fifo, max_size: %d, rate_limiter: {preset: min_size, min_size: 1}}\n", actorsTable, actorsMaxSize)
	fmt.Fprintf(&b, "  - {name: %s, sampler: uniform, remover: fifo, max_size: %d}\n", atariTable, atariMaxSize)
	fmt.Fprintf(&b, "  - {name: %s, max_size: 1000, rate_limiter: {preset: queue}}\n", latencyTable)
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
