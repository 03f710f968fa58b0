package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/reprise-rl/reprise/broker/wire"
)

// Batch is sampled items stacked, as a learner trains on them: each column
// is one tensor holding every item's steps of it, item i's in row i, of
// shape [B, T, step shape...], or [B, step shape...] for a squeezed
// column, where B is Len and T the column's steps. Info holds the items'
// sample info the same way.
type Batch struct {
	Info    BatchInfo
	Columns []NamedTensor
}

// BatchInfo is the sample info of a batch's items, entry i item i's; the
// fields mean what tables.SampleInfo's do.
type BatchInfo = wire.BatchInfo

// Len is the number of items.
func (b *Batch) Len() int { return b.Info.Len() }

// Column returns the named column, and whether the batch has it.
func (b *Batch) Column(name string) (Tensor, bool) {
	for _, c := range b.Columns {
		if c.Name == name {
			return c.Tensor, true
		}
	}
	return Tensor{}, false
}

// SampleBatch takes n items from table as Sample does, stacked into one
// Batch. The items must share their layout: the same columns in the same
// order, each with the same steps, dtype and step shape, as a table with a
// signature guarantees. Items that do not stack fail the call with an
// error matching ErrInvalidMessage (they were sampled, and count against
// the rate limiter); Sample returns such items one by one.
//
// A batch cut short by the rate limiter comes with an error matching
// ErrRateLimited, as from Sample. Decoding costs a few allocations a
// batch, not an item's: a column of a table of one-step items is the
// reply's bytes, without a copy.
func (c *Client) SampleBatch(ctx context.Context, table string, n int, opts ...SampleOption) (*Batch, error) {
	o, err := sampleConfig(n, opts)
	if err != nil {
		return nil, err
	}
	b, _, err := c.sampleBatch(ctx, table, n, o)
	return b, err
}

// sampleBatch is SampleBatch that also returns the table's state after
// it, when the service sent samples.
func (c *Client) sampleBatch(ctx context.Context, table string, n int, o sampleOptions) (*Batch, wire.TableState, error) {
	data, err := c.sampleRequest(ctx, table, n, o)
	if err != nil {
		return nil, wire.TableState{}, err
	}
	reply, err := wire.DecodeBatchResponse(data)
	switch {
	case errors.Is(err, wire.ErrUnstackable):
		return nil, wire.TableState{}, fmt.Errorf("%w: table %q: %w; Sample returns such items one by one", ErrInvalidMessage, table, err)
	case err != nil:
		return nil, wire.TableState{}, fmt.Errorf("%w: %w", ErrServer, err)
	}
	err = replyStatus(reply.Code, reply.Message)
	if err != nil && reply.Code != wire.Code_CODE_PARTIAL {
		return nil, wire.TableState{}, err
	}
	return newBatch(reply.Batch), reply.After, err
}

func newBatch(sb wire.SampledBatch) *Batch {
	b := &Batch{Info: sb.Info, Columns: make([]NamedTensor, len(sb.Columns))}
	for i, c := range sb.Columns {
		b.Columns[i] = newNamedTensor(c)
	}
	return b
}

// BatchSampler is a Sampler whose batches come stacked, as from
// Client.SampleBatch.
type BatchSampler struct{ p *prefetcher[*Batch] }

// NewBatchSampler starts prefetching batches of size items from table, as
// NewSampler does, each one stacked.
func (c *Client) NewBatchSampler(table string, size int, opts ...SamplerOption) (*BatchSampler, error) {
	o, err := samplerConfig(size, opts)
	if err != nil {
		return nil, err
	}
	return &BatchSampler{startPrefetch(o, func(ctx context.Context) (*Batch, error) {
		b, _, err := c.sampleBatch(ctx, table, size, o.sample)
		return b, err
	})}, nil
}

// Next returns the next batch. A batch cut short by the rate limiter comes
// with an error matching ErrRateLimited, as from Client.SampleBatch. Once the
// sampler is closed, Next hands out the batches that had arrived, then
// returns ErrClosed, also to a Next already waiting.
func (s *BatchSampler) Next(ctx context.Context) (*Batch, error) { return s.p.next(ctx) }

// Close stops the sampler's requests, withdrawing those that wait, and
// waits for them to end.
func (s *BatchSampler) Close() { s.p.close() }

// SampleBatch takes n items from table across its shards, as Sample does,
// stacked into one Batch as Client.SampleBatch stacks them. The shards'
// items must share their layout too.
func (c *ShardedClient) SampleBatch(ctx context.Context, table string, n int, opts ...SampleOption) (*Batch, error) {
	o, err := sampleConfig(n, opts)
	if err != nil {
		return nil, err
	}
	return c.sampleBatch(ctx, table, n, o)
}

// NewBatchSampler starts prefetching batches of size items from table, as
// Client.NewBatchSampler does.
func (c *ShardedClient) NewBatchSampler(table string, size int, opts ...SamplerOption) (*BatchSampler, error) {
	o, err := samplerConfig(size, opts)
	if err != nil {
		return nil, err
	}
	return &BatchSampler{startPrefetch(o, func(ctx context.Context) (*Batch, error) { return c.sampleBatch(ctx, table, size, o.sample) })}, nil
}

// shardBatch is one shard's part of a batch.
type shardBatch struct {
	batch *Batch
	after wire.TableState
	err   error
}

func (c *ShardedClient) sampleBatch(ctx context.Context, table string, n int, o sampleOptions) (*Batch, error) {
	d, err := c.draw(ctx, table, n)
	if err != nil {
		return nil, err
	}
	parts := make([]shardBatch, len(c.shards))
	eachShard(d.drawn, c.prefixes, func(i int) error {
		p := &parts[i]
		p.batch, p.after, p.err = c.shards[i].sampleBatch(ctx, table, d.counts[i], o)
		return nil
	})
	c.settle(table, d, func(i int) (int, wire.TableState, error) {
		items := 0
		if parts[i].batch != nil {
			items = parts[i].batch.Len()
		}
		return items, parts[i].after, parts[i].err
	})
	out, err := c.mergeBatches(d, parts)
	if err != nil {
		return nil, fmt.Errorf("%w: table %q: %w", ErrInvalidMessage, table, err)
	}
	return out, c.outcome(d, func(i int) error { return parts[i].err }, out.Len(), n, o.flexible)
}

// mergeBatches lays the shards' batches out as one, each place's item from
// the shard drawn for it in order, with its probability and table size in
// the whole table.
func (c *ShardedClient) mergeBatches(d *shardDraw, parts []shardBatch) (*Batch, error) {
	type row struct{ shard, at int }
	rows := make([]row, 0, len(d.picks))
	next := make([]int, len(parts))
	var like *Batch // a shard's batch with items, whose columns the others must match
	for _, i := range d.picks {
		b := parts[i].batch
		if b == nil || next[i] == b.Len() {
			continue
		}
		rows = append(rows, row{int(i), next[i]})
		next[i]++
		if like == nil {
			like = b
		}
	}
	if like == nil {
		return &Batch{Info: wire.MakeBatchInfo(0)}, nil
	}
	if len(d.drawn) == 1 && like.Len() == len(rows) {
		// Every place's item came from one shard, in its batch's order.
		in := &like.Info
		for k := range in.Keys {
			in.Probabilities[k], in.TableSizes[k] = d.inWhole(d.drawn[0], in.Probabilities[k], in.TableSizes[k])
		}
		return like, nil
	}
	out := &Batch{Info: wire.MakeBatchInfo(len(rows))}
	for _, i := range d.drawn {
		b := parts[i].batch
		if b == nil || b.Len() == 0 || b == like {
			continue
		}
		same := len(b.Columns) == len(like.Columns)
		for j := 0; same && j < len(b.Columns); j++ {
			x, y := &b.Columns[j], &like.Columns[j]
			same = x.Name == y.Name && x.Tensor.DType == y.Tensor.DType && slices.Equal(x.Tensor.Shape[1:], y.Tensor.Shape[1:])
		}
		if !same {
			return nil, fmt.Errorf("%w: shard %d (prefix %q) gave items of another layout than another shard's", wire.ErrUnstackable, i, c.prefixes[i])
		}
	}
	for k, r := range rows {
		in := &parts[r.shard].batch.Info
		out.Info.Keys[k], out.Info.Priorities[k], out.Info.TimesSampled[k] = in.Keys[r.at], in.Priorities[r.at], in.TimesSampled[r.at]
		out.Info.InsertedAt[k], out.Info.RateLimited[k] = in.InsertedAt[r.at], in.RateLimited[r.at]
		out.Info.Probabilities[k], out.Info.TableSizes[k] = d.inWhole(r.shard, in.Probabilities[r.at], in.TableSizes[r.at])
	}
	out.Columns = make([]NamedTensor, len(like.Columns))
	for j, col := range like.Columns {
		rowBytes := len(col.Tensor.Data) / like.Len()
		data := make([]byte, len(rows)*rowBytes)
		for k, r := range rows {
			copy(data[k*rowBytes:], parts[r.shard].batch.Columns[j].Tensor.Data[r.at*rowBytes:(r.at+1)*rowBytes])
		}
		shape := append([]int64{int64(len(rows))}, col.Tensor.Shape[1:]...)
		out.Columns[j] = NamedTensor{Name: col.Name, Tensor: Tensor{DType: col.Tensor.DType, Shape: shape, Data: data}}
	}
	return out, nil
}
