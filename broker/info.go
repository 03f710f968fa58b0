package broker

import (
	"time"

	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// Info is what the table service reports of itself and its tables.
type Info struct {
	Tables []TableInfo
	// AppliedSequence is the last stream sequence applied to the tables.
	AppliedSequence uint64
	// Chunks and ChunkBytes are the chunks the service holds, shared by the
	// items of every table.
	Chunks     int64
	ChunkBytes int64
	// RejectedMessages counts the messages and items the service refused.
	RejectedMessages int64
	// ShardIndex and ShardCount place the service in a sharded table
	// (reprised --shard); ShardCount is 0 when it is not sharded.
	ShardIndex, ShardCount int
	// MaxMutationOps is the most ops the service takes in one mutation
	// message (limits.max_mutation_ops); Mutate sends more in parts. 0 from
	// a service that does not say.
	MaxMutationOps int
}

// TableInfo describes one table: its configuration and its counters since
// it was created or reset.
type TableInfo struct {
	Name            string
	Sampler         string
	Remover         string
	MaxSize         int64
	MaxTimesSampled int32
	Limiter         LimiterInfo
	// Signature is the columns every item must have; empty means any.
	Signature []tables.ColumnSpec
	Size      int64
	BytesHeld int64
	Inserts   int64
	Samples   int64
	Deletes   int64
	Evictions int64
	// InsertWaits and SampleWaits count the calls the rate limiter held.
	InsertWaits int64
	SampleWaits int64
	// PolicyVersion is the table's current policy version; MaxStaleness its
	// staleness bound (nil: none); MinItemVersion and MaxItemVersion the
	// versions of its items (0 when empty); StaleEvictions the items
	// removed or dropped as stale.
	PolicyVersion  int64
	MaxStaleness   *int64
	MinItemVersion int64
	MaxItemVersion int64
	StaleEvictions int64
	// Episodes is the number of episodes the items hold steps of;
	// DeletedEpisodes counts the episodes whose last item left, and
	// UniqueSamples the items sampled at least once (Reverb's num_episodes,
	// num_deleted_episodes and num_unique_samples).
	Episodes        int64
	DeletedEpisodes int64
	UniqueSamples   int64
	// Weight is the total weight the sampler draws by: the sum of
	// priority^exponent for a prioritized sampler, the item count for every
	// other (Weight.Float64 gives it as a number where it fits).
	Weight tables.Weight
}

// LimiterInfo is a table's rate limiter: its configuration and the
// counters it decides by.
type LimiterInfo struct {
	SamplesPerInsert float64
	MinSize          int64
	MinDiff          float64
	MaxDiff          float64
	Inserts          int64
	Samples          int64
	Deletes          int64
}

// ItemInfo is an item's metadata: its priority, how often it was sampled,
// when it was inserted, and the chunk slices its columns cover.
type ItemInfo struct {
	Key          uint64
	Priority     float64
	TimesSampled int32
	InsertedAt   time.Time
	Trajectory   []tables.Column
	// PolicyVersion is the version of the policy that produced the item.
	PolicyVersion int64
}

// ItemList is a page of a table's items, or the items asked for by key.
type ItemList struct {
	Items []ItemInfo
	// TableSize is the table's size when listed.
	TableSize int64
}

// CheckpointInfo describes a checkpoint the service wrote.
type CheckpointInfo struct {
	Name string
	// AppliedSequence is the stream sequence the checkpoint covers up to.
	AppliedSequence uint64
	Items           int64
	Bytes           int64
	// Pause is how long inserts and samples stopped while the state was
	// copied; Write how long encoding and storing it took.
	Pause time.Duration
	Write time.Duration
}

func infoFromWire(r *wire.InfoResponse) *Info {
	out := &Info{
		Tables:          make([]TableInfo, len(r.Tables)),
		AppliedSequence: r.AppliedSequence, Chunks: r.Chunks, ChunkBytes: r.ChunkBytes, RejectedMessages: r.RejectedMessages,
		ShardIndex: int(r.ShardIndex), ShardCount: int(r.ShardCount), MaxMutationOps: int(r.MaxMutationOps),
	}
	for i, t := range r.Tables {
		l := t.GetLimiter()
		ti := TableInfo{
			Name: t.Name, Sampler: t.Sampler, Remover: t.Remover, MaxSize: t.MaxSize, MaxTimesSampled: t.MaxTimesSampled,
			Limiter: LimiterInfo{
				SamplesPerInsert: l.GetSamplesPerInsert(), MinSize: l.GetMinSize(), MinDiff: l.GetMinDiff(), MaxDiff: l.GetMaxDiff(),
				Inserts: l.GetInserts(), Samples: l.GetSamples(), Deletes: l.GetDeletes(),
			},
			Size: t.Size, BytesHeld: t.BytesHeld, Inserts: t.Inserts, Samples: t.Samples, Deletes: t.Deletes,
			Evictions: t.Evictions, InsertWaits: t.InsertWaits, SampleWaits: t.SampleWaits,

			PolicyVersion: t.PolicyVersion, MaxStaleness: t.MaxStaleness,
			MinItemVersion: t.MinItemVersion, MaxItemVersion: t.MaxItemVersion, StaleEvictions: t.StaleEvictions,
			Episodes: t.NumEpisodes, DeletedEpisodes: t.NumDeletedEpisodes, UniqueSamples: t.NumUniqueSamples,
			Weight: tables.Weight{Fraction: t.WeightFraction, Exponent: t.WeightExponent},
		}
		for _, c := range t.Signature {
			ti.Signature = append(ti.Signature, tables.ColumnSpec{Name: c.Name, DType: c.Dtype, Shape: c.Shape})
		}
		out.Tables[i] = ti
	}
	return out
}
