package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// A sharded table is one table spread over several table services, its
// shards: shard i of n is a reprised with its own prefix and stream, started
// with --shard i/n. A ShardedProducer writes each episode to one shard, so an
// item lives with the chunks it references, and makes every item key name
// its shard (key modulo n), which the shard checks. A ShardedClient samples
// across the shards in proportion to the weight each one's sampler draws by
// (its item count, or its total priority^exponent), so a sample's reported
// probability is its probability in the whole table, and sends a key's
// priority update or delete to the shard that holds it.
//
// Each shard keeps its own max_size, max_times_sampled and rate limiter, and
// an ordered selector (Fifo, Lifo, heaps) orders the items of its shard. The
// shard count is fixed for a table's life: the keys encode it.

// checkShardPrefixes checks the prefixes of a sharded table, and that opts
// do not name a prefix of their own.
func checkShardPrefixes[O any](prefixes []string, opts []O) error {
	if len(prefixes) < 1 || len(prefixes) > protocol.MaxShards {
		return fmt.Errorf("%w: %d shard prefixes: want 1 to %d", ErrInvalidOption, len(prefixes), protocol.MaxShards)
	}
	streams := make([]string, len(prefixes))
	for i, p := range prefixes {
		subj, err := protocol.NewSubjects(p)
		if err != nil {
			return fmt.Errorf("shard %d: %w", i, err)
		}
		// Prefixes that differ only in case or in '.' against '-' name
		// one stream.
		streams[i] = subj.Stream()
		if j := slices.Index(streams, streams[i]); j != i {
			return fmt.Errorf("%w: prefixes %q (shard %d) and %q (shard %d) share the stream %s: each shard needs its own", ErrInvalidOption, prefixes[j], j, p, i, streams[i])
		}
	}
	for _, o := range opts {
		if _, ok := any(o).(prefixOption); ok {
			return fmt.Errorf("%w: WithPrefix does not apply to a sharded table: the prefixes argument names each shard's", ErrInvalidOption)
		}
	}
	return nil
}

// checkShardPlace checks that the service at place i of n prefixes is
// shard i of n, as its info says.
func checkShardPlace(index, count, i, n int) error {
	switch {
	case count == 0:
		return fmt.Errorf("%w: its service is not a shard: start it with --shard %d/%d", ErrInvalidOption, i, n)
	case count != n || index != i:
		return fmt.Errorf("%w: its service is shard %d/%d (reprised --shard), and this place is %d/%d: give the prefixes in shard order",
			ErrInvalidOption, index, count, i, n)
	}
	return nil
}

// eachShard calls f for each of the shards concurrently and joins their
// errors, each naming its shard.
func eachShard(shards []int, prefixes []string, f func(i int) error) error {
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	for j, i := range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(i); err != nil {
				errs[j] = fmt.Errorf("shard %d (prefix %q): %w", i, prefixes[i], err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// allShards is the indices 0 to n-1.
func allShards(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// Writer is what an actor writes through, sharded table or not: a
// *Producer or a *ShardedProducer.
type Writer interface {
	Append(ctx context.Context, step Step) error
	CreateItem(ctx context.Context, table string, priority float64, traj Trajectory) error
	Flush(ctx context.Context) error
	EndEpisode(ctx context.Context) error
	Close(ctx context.Context) error
}

var (
	_ Writer = (*Producer)(nil)
	_ Writer = (*ShardedProducer)(nil)
)

// ShardedProducer is an actor's producer for a sharded table. It has the
// Producer's calls (both are Writers); an episode's steps and items go to one shard, and the
// next episode to the next shard, starting from a random one, which spreads
// many actors' episodes evenly. Safe for concurrent use, though an
// episode's calls belong in one goroutine, as with Producer.
type ShardedProducer struct {
	prefixes []string
	shards   []*Producer

	mu      sync.Mutex // held by an episode's calls, so an end waits for them
	current int
}

// NewShardedProducer connects a producer to each shard through nc; prefixes
// names the shards' prefixes in shard order, which it checks with each
// shard's service (waiting for those not up yet, as long as ctx allows).
// opts apply to every shard's producer (WithPrefix does not apply).
func NewShardedProducer(ctx context.Context, nc *nats.Conn, prefixes []string, opts ...ProducerOption) (*ShardedProducer, error) {
	if err := checkShardPrefixes(prefixes, opts); err != nil {
		return nil, err
	}
	// Out of order, every item would be refused by its shard, which a
	// producer that returns once items are stored would not see.
	if err := eachShard(allShards(len(prefixes)), prefixes, func(i int) error { return askShardPlace(ctx, nc, prefixes, i) }); err != nil {
		return nil, err
	}
	sp := &ShardedProducer{prefixes: slices.Clone(prefixes), current: rand.IntN(len(prefixes))}
	for i, prefix := range prefixes {
		shard := keyShard{index: uint64(i), count: uint64(len(prefixes))}
		p, err := NewProducer(ctx, nc, append(slices.Clip(opts), WithPrefix(prefix),
			producerOption(func(o *producerOptions) error { o.shard = shard; return nil }))...)
		if err != nil {
			sp.closeShards(ctx)
			return nil, fmt.Errorf("shard %d (prefix %q): %w", i, prefix, err)
		}
		sp.shards = append(sp.shards, p)
	}
	return sp, nil
}

// askShardPlace asks the service of prefixes[i] which shard it is, waiting
// while none answers yet (a producer may start before its services), and
// checks it is shard i.
func askShardPlace(ctx context.Context, nc *nats.Conn, prefixes []string, i int) error {
	subj, err := protocol.NewSubjects(prefixes[i])
	if err != nil {
		return err
	}
	req, err := proto.Marshal(&wire.TableRequest{})
	if err != nil {
		return err
	}
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		m, err := nc.RequestWithContext(ctx, subj.Info(), req)
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			select {
			case <-ctx.Done():
				return fmt.Errorf("broker: waiting for the table service on %s: %w", subj.Info(), ctx.Err())
			case <-time.After(pause):
			}
			continue
		case err != nil:
			return fmt.Errorf("broker: asking %s: %w", subj.Info(), err)
		}
		var info wire.InfoResponse
		if err := proto.Unmarshal(m.Data, &info); err != nil {
			return fmt.Errorf("%w: malformed info response: %v", ErrServer, err)
		}
		if err := statusError(info.Status); err != nil {
			return err
		}
		return checkShardPlace(int(info.ShardIndex), int(info.ShardCount), i, len(prefixes))
	}
}

// Append adds a step to the episode, on its shard (see Producer.Append).
func (sp *ShardedProducer) Append(ctx context.Context, step Step) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.shards[sp.current].Append(ctx, step)
}

// CreateItem creates an item of the episode's steps, on its shard (see
// Producer.CreateItem).
func (sp *ShardedProducer) CreateItem(ctx context.Context, table string, priority float64, traj Trajectory) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.shards[sp.current].CreateItem(ctx, table, priority, traj)
}

// EndEpisode ends the episode as Producer.EndEpisode does; once it ended
// (the error, if any, is not ErrEpisodeNotEnded), the next one goes to the
// next shard. Called again after an error, it moves no further: the
// episode it finds has no steps.
func (sp *ShardedProducer) EndEpisode(ctx context.Context) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	ended, err := sp.shards[sp.current].endEpisode(ctx)
	if ended {
		sp.current = (sp.current + 1) % len(sp.shards)
	}
	return err
}

// Flush flushes every shard's producer (see Producer.Flush).
func (sp *ShardedProducer) Flush(ctx context.Context) error {
	return eachShard(allShards(len(sp.shards)), sp.prefixes, func(i int) error { return sp.shards[i].Flush(ctx) })
}

// WaitApplied waits for every shard as Producer.WaitApplied does.
func (sp *ShardedProducer) WaitApplied(ctx context.Context) error {
	return eachShard(allShards(len(sp.shards)), sp.prefixes, func(i int) error { return sp.shards[i].WaitApplied(ctx) })
}

// SetPolicyVersion sets the policy version of the items created from now
// on (see Producer.SetPolicyVersion).
func (sp *ShardedProducer) SetPolicyVersion(version int64) {
	for _, p := range sp.shards {
		p.SetPolicyVersion(version)
	}
}

// Close closes every shard's producer (see Producer.Close).
func (sp *ShardedProducer) Close(ctx context.Context) error {
	return sp.closeShards(ctx)
}

func (sp *ShardedProducer) closeShards(ctx context.Context) error {
	return eachShard(allShards(len(sp.shards)), sp.prefixes, func(i int) error { return sp.shards[i].Close(ctx) })
}

// shardStateMaxAge is how old a shard's size and weight may be when a
// sample is drawn by them; older ones are asked for first. A shard's sample
// reply renews its own, so only the shards a client has not drawn from
// lately cost a request.
const shardStateMaxAge = 100 * time.Millisecond

// ShardedClient is a learner's client of a sharded table: it has the
// Client's calls, over every shard. Safe for concurrent use.
type ShardedClient struct {
	prefixes []string
	shards   []*Client

	mu     sync.Mutex
	tables map[string][]shardState // per table, per shard; made once the shards agree
	// like is, per table, how the first shard to answer configures it:
	// a shard that was down when the table was first used is checked
	// against it when it answers.
	like map[string]*TableInfo
	// probing is the down shards being asked again in the background (see
	// probeDown), and probeErr what such a probe found wrong other than
	// the shard's being down, for the next sample to return.
	probing  map[tableShard]bool
	probeErr map[tableShard]error
	bg       context.Context // the probes', ended by Close
	stopBg   context.CancelFunc
	probes   sync.WaitGroup
}

type tableShard struct {
	table string
	shard int
}

// shardState is what a client knows of a table on one shard.
type shardState struct {
	size   int64
	weight tables.Weight
	at     time.Time // when it was learned; zero once a mutation changed it
	// down is why the shard's service did not answer; it weighs 0 until
	// it answers again.
	down error
	// unchecked is a shard that has not answered since the table was
	// first used: its place and its table are checked when it does.
	unchecked bool
}

// maxWeightExponent bounds a weight's exponent as a client takes it: far
// above any a selector reports (2^60), and far enough from int64's ends
// that differences of two cannot overflow.
const maxWeightExponent = 1 << 61

// reported is a shard's state as its service reported it, made safe to
// draw by: a reply the client cannot trust (a negative size, a fraction
// outside [0.5, 1), NaN) counts as no weight rather than skewing or
// breaking the draw.
func reported(size int64, w tables.Weight, at time.Time) shardState {
	return shardState{size: max(size, 0), weight: trusted(w), at: at}
}

// trusted is w, or no weight when a reply could not have made it.
func trusted(w tables.Weight) tables.Weight {
	if w.Fraction < 0.5 || w.Fraction >= 1 || w.Exponent > maxWeightExponent || w.Exponent < -maxWeightExponent {
		return tables.Weight{}
	}
	return w
}

// shardDown reports whether err says that a shard's service is not there
// (no responder, shutting down, failing), rather than that the call was
// wrong.
func shardDown(err error) bool { return errors.Is(err, ErrServer) }

// NewShardedClient connects a client to each shard through nc; prefixes
// names the shards' prefixes in shard order. opts apply to every shard's
// client (WithPrefix does not apply). Before it first uses a table it checks
// that each shard is the one its place says (reprised --shard) and that they
// all configure the table alike.
func NewShardedClient(nc *nats.Conn, prefixes []string, opts ...ClientOption) (*ShardedClient, error) {
	if err := checkShardPrefixes(prefixes, opts); err != nil {
		return nil, err
	}
	c := &ShardedClient{prefixes: slices.Clone(prefixes), tables: make(map[string][]shardState), like: make(map[string]*TableInfo),
		probing: make(map[tableShard]bool), probeErr: make(map[tableShard]error)}
	c.bg, c.stopBg = context.WithCancel(context.Background())
	for i, prefix := range prefixes {
		cl, err := NewClient(nc, append(slices.Clip(opts), WithPrefix(prefix))...)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("shard %d (prefix %q): %w", i, prefix, err)
		}
		c.shards = append(c.shards, cl)
	}
	return c, nil
}

// Shard is the client of shard i alone, for the calls a sharded table has
// no whole-table form of, such as Items.
func (c *ShardedClient) Shard(i int) *Client { return c.shards[i] }

// NumShards is the number of shards.
func (c *ShardedClient) NumShards() int { return len(c.shards) }

// Close closes every shard's client.
func (c *ShardedClient) Close() error {
	c.mu.Lock()
	c.stopBg()
	c.mu.Unlock()
	c.probes.Wait()
	var errs []error
	for _, cl := range c.shards {
		errs = append(errs, cl.Close())
	}
	return errors.Join(errs...)
}

func (c *ShardedClient) all() []int { return allShards(len(c.shards)) }

// Sample takes n items from table across its shards (see Client.Sample).
// Each item's shard is drawn in proportion to the shards' weights, then each
// shard is asked for its items at once. The probability reported is the
// item's in the whole table: the shard's share of the weight times the
// item's probability within its shard. TableSize is the whole table's.
//
// A call waits for every shard it draws from, each under its own rate
// limiter. Items a shard could not give (its limiter, an error) leave their
// places empty: the call returns the others, in order, with the error.
//
// A shard whose service does not answer weighs 0 until it answers again:
// meanwhile samples come from the other shards, with probabilities in the
// table they hold. Not answering is having no service listening (killed,
// restarting), failing, or leaving an info request unanswered for 2 s, or
// half of what is left of ctx (a service answers info at once: one that
// does not hangs, stopped or stuck). A sample that waits on a shard asks
// it for info every second and gives up on it the same way. The client asks
// a down shard again in the background, without a sample waiting on it:
// 100 ms after its last answer, or after its last request ended for one
// that hangs.
func (c *ShardedClient) Sample(ctx context.Context, table string, n int, opts ...SampleOption) ([]Sample, error) {
	o, err := sampleConfig(n, opts)
	if err != nil {
		return nil, err
	}
	return c.sample(ctx, table, n, o)
}

// NewSampler starts prefetching batches of size items from table, as
// Client.NewSampler does.
func (c *ShardedClient) NewSampler(table string, size int, opts ...SamplerOption) (*Sampler, error) {
	o, err := samplerConfig(size, opts)
	if err != nil {
		return nil, err
	}
	return &Sampler{startPrefetch(o, func(ctx context.Context) ([]Sample, error) { return c.sample(ctx, table, size, o.sample) })}, nil
}

// shardReply is one shard's part of a sample.
type shardReply struct {
	samples []Sample
	after   wire.TableState
	err     error
}

func (c *ShardedClient) sample(ctx context.Context, table string, n int, o sampleOptions) ([]Sample, error) {
	d, err := c.draw(ctx, table, n)
	if err != nil {
		return nil, err
	}
	o.hungAfter = shardInfoTimeout
	if ctx.Err() != nil {
		// No shard is asked, so none is to blame.
		return nil, fmt.Errorf("broker: sampling table %q: no time left to ask the shards drawn: %w", table, context.Cause(ctx))
	}
	replies := make([]shardReply, len(c.shards))
	eachShard(d.drawn, c.prefixes, func(i int) error {
		r := &replies[i]
		r.samples, r.after, r.err = c.shards[i].sampleReply(ctx, table, d.counts[i], o)
		return nil
	})
	c.settle(table, d, func(i int) (int, wire.TableState, error) {
		return len(replies[i].samples), replies[i].after, replies[i].err
	})
	out := make([]Sample, 0, n)
	next := make([]int, len(c.shards))
	for _, i := range d.picks {
		r := &replies[i]
		if next[i] == len(r.samples) {
			continue
		}
		s := r.samples[next[i]]
		next[i]++
		s.Info.Probability, s.Info.TableSize = d.inWhole(int(i), s.Info.Probability, s.Info.TableSize)
		out = append(out, s)
	}
	return out, c.outcome(d, func(i int) error { return replies[i].err }, len(out), n, o.flexible)
}

// shardDraw is the shards a sample's places are drawn from.
type shardDraw struct {
	states []shardState
	share  []float64 // each shard's, unnormalised
	total  float64
	picks  []int32 // the shard of each place
	counts []int   // the places of each shard
	drawn  []int   // the shards with places
	// sizeAll is the whole table's size, as the shards last reported it.
	sizeAll int64
}

// draw draws the shard of each of n places in proportion to the shards'
// shares, waiting while no shard holds an item.
func (c *ShardedClient) draw(ctx context.Context, table string, n int) (*shardDraw, error) {
	states, err := c.freshStates(ctx, table)
	if err != nil {
		return nil, err
	}
	share, ok := shardShares(states)
	for !ok {
		if states, err = c.awaitItems(ctx, table); err != nil {
			return nil, err
		}
		share, ok = shardShares(states)
	}
	d := &shardDraw{states: states, share: share, picks: make([]int32, n), counts: make([]int, len(c.shards))}
	for _, s := range states {
		d.sizeAll += s.size
	}
	// The shard of each place, drawn by cumulative share.
	cum := make([]float64, len(share))
	for i, s := range share {
		d.total += s
		cum[i] = d.total
	}
	for j := range d.picks {
		u := rand.Float64() * d.total
		i := min(sort.Search(len(cum), func(i int) bool { return cum[i] > u }), len(cum)-1)
		d.picks[j] = int32(i)
		d.counts[i]++
	}
	for i, k := range d.counts {
		if k > 0 {
			d.drawn = append(d.drawn, i)
		}
	}
	return d, nil
}

// inWhole is the probability and table size of an item of shard i, given
// in its shard, in the whole table: the shard's share of the weight times
// the probability within it, and every shard's size.
func (d *shardDraw) inWhole(i int, prob float64, size int64) (float64, int64) {
	return prob * d.share[i] / d.total, size + d.sizeAll - d.states[i].size
}

// settle learns what the drawn shards' replies (items, the table's state
// after them, error) tell of the shards.
func (c *ShardedClient) settle(table string, d *shardDraw, reply func(i int) (int, wire.TableState, error)) {
	now := time.Now()
	for _, i := range d.drawn {
		switch items, after, err := reply(i); {
		case items > 0:
			// A reply carries the table's state only with samples.
			c.learn(table, i, reported(after.Size, after.Weight, now))
		case shardDown(err):
			c.learn(table, i, shardState{at: now, down: err})
		}
	}
}

// outcome is the error of a sample whose drawn shards failed with
// errOf(i), got items of the n asked for. Errors are kept per shard, not
// joined as they come: a rate-limited shard still gave what it had.
func (c *ShardedClient) outcome(d *shardDraw, errOf func(i int) error, got, n int, flexible bool) error {
	var errs []error
	var limited *StatusError
	for _, i := range d.drawn {
		switch err := errOf(i); {
		case err == nil:
		case errors.Is(err, ErrRateLimited) && limited == nil:
			limited = &StatusError{Code: CodeRateLimited, Message: fmt.Sprintf("shard %d (prefix %q): %v", i, c.prefixes[i], err)}
		case !errors.Is(err, ErrRateLimited):
			errs = append(errs, fmt.Errorf("shard %d (prefix %q): %w", i, c.prefixes[i], err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if limited != nil && (got == 0 || !flexible) {
		if got > 0 {
			limited.Message = fmt.Sprintf("%d of %d samples; %s", got, n, limited.Message)
		}
		return limited
	}
	return nil
}

// shardShares is each shard's share of a draw, unnormalised: its weight,
// or, when no shard has weight (a prioritized table whose priorities are
// all 0 samples uniformly), its size. ok is false when no shard holds an
// item.
func shardShares(states []shardState) (share []float64, ok bool) {
	top := int64(math.MinInt64)
	for _, s := range states {
		if s.weight.Fraction > 0 {
			top = max(top, s.weight.Exponent)
		}
	}
	share = make([]float64, len(states))
	total := 0.0
	for i, s := range states {
		// In the frame of the largest weight; a weight 2^-1100 times
		// smaller is 0 beside it, as the shard's own sampler would make it.
		if d := s.weight.Exponent - top; s.weight.Fraction > 0 && d > -1100 {
			share[i] = math.Ldexp(s.weight.Fraction, int(d))
			total += share[i]
		}
	}
	if total > 0 {
		return share, true
	}
	for i, s := range states {
		share[i] = float64(s.size)
		total += share[i]
	}
	return share, total > 0
}

// learn records a shard's state of table, and logs when the shard goes
// down or comes back.
func (c *ShardedClient) learn(table string, i int, st shardState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	known := c.tables[table]
	if st.down != nil {
		st.unchecked = known[i].unchecked // until it answers
	}
	switch was := known[i].down; {
	case was == nil && st.down != nil:
		c.shards[i].o.logger.Warn("reprise: a shard does not answer; sampling the others until it does", "table", table, "shard", i, "prefix", c.prefixes[i], "error", st.down)
	case was != nil && st.down == nil:
		c.shards[i].o.logger.Info("reprise: a shard answers again", "table", table, "shard", i, "prefix", c.prefixes[i])
	}
	known[i] = st
}

// freshStates returns what the client knows of table on each shard, having
// checked the shards on first use and asked again those whose state is
// old.
func (c *ShardedClient) freshStates(ctx context.Context, table string) ([]shardState, error) {
	c.mu.Lock()
	_, ok := c.tables[table]
	c.mu.Unlock()
	if !ok {
		return c.checkShards(ctx, table)
	}
	stale, err := c.shardsToAsk(table, false)
	if err != nil {
		return nil, err
	}
	if len(stale) > 0 {
		return c.refresh(ctx, table, stale)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.tables[table]), nil
}

// shardsToAsk is the shards of table whose state a sample asks for and
// waits on: the answering ones whose state is old (every one with all),
// and every one when none answers, as nothing else is left to wait on.
// Otherwise a down shard whose state is old is asked again in the
// background (see probeDown).
func (c *ShardedClient) shardsToAsk(table string, all bool) ([]int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	known := c.tables[table]
	answering := slices.ContainsFunc(known, func(s shardState) bool { return s.down == nil })
	var ask []int
	for i, s := range known {
		old := time.Since(s.at) > shardStateMaxAge
		switch {
		case s.down != nil && answering:
			if !old {
				continue
			}
			if err := c.probeDown(table, i); err != nil {
				return nil, err
			}
		case all || old:
			ask = append(ask, i)
		}
	}
	return ask, nil
}

// probeDown asks down shard i for table's state again in the background,
// one request at a time, so that no sample waits on a shard that does not
// answer (one that hangs is so asked once per shardInfoTimeout). It returns,
// once, what the last probe found wrong other than the shard's being down
// (a shard back in another's place). c.mu is held.
func (c *ShardedClient) probeDown(table string, i int) error {
	k := tableShard{table, i}
	if err := c.probeErr[k]; err != nil {
		delete(c.probeErr, k)
		return err
	}
	if c.probing[k] || c.bg.Err() != nil {
		return nil
	}
	c.probing[k] = true
	c.probes.Add(1)
	go func() {
		defer c.probes.Done()
		_, err := c.refresh(c.bg, table, []int{i})
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.probing, k)
		if err != nil && c.bg.Err() == nil {
			c.probeErr[k] = err
		}
	}()
	return nil
}

// checked makes sure the shards were checked for table (see checkShards),
// as a key routed by a wrong order would reach a shard that skips it.
func (c *ShardedClient) checked(ctx context.Context, table string) error {
	c.mu.Lock()
	_, ok := c.tables[table]
	c.mu.Unlock()
	if ok {
		return nil
	}
	_, err := c.checkShards(ctx, table)
	return err
}

// checkShards asks every shard for table and checks that each is the shard
// its place says and configures the table as the others do. A shard whose
// service does not answer is marked down, and checked once it answers, so
// that a learner started while a shard is down samples the others, as one
// started before does; with no shard answering it fails.
func (c *ShardedClient) checkShards(ctx context.Context, table string) ([]shardState, error) {
	if table == "" {
		return nil, fmt.Errorf("%w: empty table name", ErrInvalidMessage)
	}
	wait, err := infoWait(ctx, table)
	if err != nil {
		return nil, err
	}
	infos := make([]*TableInfo, len(c.shards))
	states := make([]shardState, len(c.shards))
	err = eachShard(c.all(), c.prefixes, func(i int) error {
		info, ti, down, err := c.askShard(ctx, wait, i, table)
		if down != nil {
			states[i] = shardState{at: time.Now(), down: down, unchecked: true}
			return nil
		}
		if err != nil {
			return err
		}
		if err := checkShardPlace(info.ShardIndex, info.ShardCount, i, len(c.shards)); err != nil {
			return err
		}
		infos[i] = ti
		states[i] = reported(ti.Size, ti.Weight, time.Now())
		return nil
	})
	if err != nil {
		return nil, err
	}
	var like *TableInfo
	var down []error
	for i, ti := range infos {
		switch {
		case ti == nil:
			down = append(down, fmt.Errorf("shard %d (prefix %q): %w", i, c.prefixes[i], states[i].down))
		case like == nil:
			like = ti
		default:
			if err := c.sameTable(table, like, ti, i); err != nil {
				return nil, err
			}
		}
	}
	if like == nil {
		return nil, errors.Join(down...)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tables[table], c.like[table] = states, like
	return slices.Clone(states), nil
}

// sameTable checks that shard i configures table as like says the others
// do.
func (c *ShardedClient) sameTable(table string, like, ti *TableInfo, i int) error {
	if ti.Sampler != like.Sampler || ti.Remover != like.Remover || !slices.EqualFunc(ti.Signature, like.Signature, sameColumnSpec) {
		return fmt.Errorf("%w: table %q differs between shards: sampler %s, remover %s, signature %v on the others; %s, %s, %v on shard %d (prefix %q)",
			ErrInvalidOption, table, like.Sampler, like.Remover, like.Signature, ti.Sampler, ti.Remover, ti.Signature, i, c.prefixes[i])
	}
	return nil
}

func sameColumnSpec(a, b tables.ColumnSpec) bool {
	return a.Name == b.Name && a.DType == b.DType && slices.Equal(a.Shape, b.Shape)
}

// refresh asks the given shards for table's size and weight. A shard whose
// service does not answer is marked down; any other error is returned.
func (c *ShardedClient) refresh(ctx context.Context, table string, shards []int) ([]shardState, error) {
	wait, err := infoWait(ctx, table)
	if err != nil {
		return nil, err
	}
	fresh := make([]shardState, len(c.shards))
	err = eachShard(shards, c.prefixes, func(i int) error {
		info, ti, down, err := c.askShard(ctx, wait, i, table)
		switch {
		case down != nil:
			fresh[i] = shardState{at: time.Now(), down: down}
		case err != nil:
			return err
		default:
			if err := c.checkLate(table, i, info, ti); err != nil {
				return err
			}
			fresh[i] = reported(ti.Size, ti.Weight, time.Now())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, i := range shards {
		c.learn(table, i, fresh[i])
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.tables[table]), nil
}

// infoWait is how long an info request on the way to a sample may take:
// shardInfoTimeout, and at most half of what ctx has left, the other half
// being the sample's, so that a shard that does not answer cannot take the
// time of the shards drawn after it. With no time left, no shard is asked
// (and none can be found down): the error says so.
func infoWait(ctx context.Context, table string) (time.Duration, error) {
	wait := shardInfoTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)/2)
	}
	if wait <= 0 || ctx.Err() != nil {
		return 0, fmt.Errorf("broker: no time left to ask the shards of table %q for its state: %w", table, cmp.Or(context.Cause(ctx), context.DeadlineExceeded))
	}
	return wait, nil
}

// askShard asks shard i for table's info. down is why its service did not
// answer within wait (a shard that hangs, paused or stuck, is down too, for
// a while); err is any other failure.
func (c *ShardedClient) askShard(ctx context.Context, wait time.Duration, i int, table string) (info *Info, ti *TableInfo, down, err error) {
	ictx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	info, ti, err = c.tableInfo(ictx, i, table)
	if ctx.Err() == nil && (shardDown(err) || errors.Is(err, context.DeadlineExceeded)) {
		return nil, nil, err, nil
	}
	return info, ti, nil, err
}

// checkLate checks a shard that answers for the first time since the
// table was first used, as checkShards checked the others.
func (c *ShardedClient) checkLate(table string, i int, info *Info, ti *TableInfo) error {
	c.mu.Lock()
	unchecked, like := c.tables[table][i].unchecked, c.like[table]
	c.mu.Unlock()
	if !unchecked {
		return nil
	}
	if err := checkShardPlace(info.ShardIndex, info.ShardCount, i, len(c.shards)); err != nil {
		return err
	}
	return c.sameTable(table, like, ti, i)
}

// shardInfoTimeout bounds a shard's answer to the info a client refreshes
// its state with; a shard slower than that (or than infoWait) counts as
// down until it answers: a service answers info at once, whatever its
// samples wait for, so one that does not hangs (stopped, stuck). A sample
// waiting on a shard checks it with info requests bounded the same way
// (sampleOptions.hungAfter), and probeDown asks a down one with it.
const shardInfoTimeout = 2 * time.Second

// tableInfo asks shard i for table's info, which must describe that table
// alone: a reply that does not is the service's error, not a reason to
// fail otherwise.
func (c *ShardedClient) tableInfo(ctx context.Context, i int, table string) (*Info, *TableInfo, error) {
	info, err := c.shards[i].Info(ctx, table)
	if err != nil {
		return nil, nil, err
	}
	if len(info.Tables) != 1 || info.Tables[0].Name != table {
		return nil, nil, fmt.Errorf("%w: malformed info response: %d tables for table %q", ErrServer, len(info.Tables), table)
	}
	return info, &info.Tables[0], nil
}

// maxEmptyWait bounds how long a sample waits for a sharded table to hold
// an item when ctx does not, as the service bounds a request's wait by
// default.
const maxEmptyWait = time.Minute

// awaitItems waits until a shard of table holds an item, asking every shard
// with a growing pause, and returns the states then.
func (c *ShardedClient) awaitItems(ctx context.Context, table string) ([]shardState, error) {
	ctx, cancel := context.WithTimeout(ctx, maxEmptyWait)
	defer cancel()
	pause := 5 * time.Millisecond
	var states []shardState
	down := func() string {
		var msg string
		for i, s := range states {
			if s.down != nil {
				msg += fmt.Sprintf("; shard %d (prefix %q) does not answer: %v", i, c.prefixes[i], s.down)
			}
		}
		return msg
	}
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil, fmt.Errorf("broker: waiting for an item of table %q: %w", table, context.Cause(ctx))
			}
			return nil, &StatusError{Code: CodeRateLimited, Message: fmt.Sprintf("no shard of table %q held an item: %v%s", table, ctx.Err(), down())}
		case <-time.After(pause):
		}
		ask, err := c.shardsToAsk(table, true)
		if err != nil {
			return nil, err
		}
		if states, err = c.refresh(ctx, table, ask); err != nil {
			if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
				continue // reported above, with the shards' state
			}
			return nil, err
		}
		if _, ok := shardShares(states); ok {
			return states, nil
		}
		// With no shard answering, there is nothing to wait for: fail as
		// a Client does when its service is gone.
		if !slices.ContainsFunc(states, func(s shardState) bool { return s.down == nil }) {
			return nil, fmt.Errorf("%w: no shard of table %q answers%s", ErrServer, table, down())
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// markStale makes the next sample ask the shards for table's state again.
func (c *ShardedClient) markStale(table string, shards []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if known, ok := c.tables[table]; ok {
		for _, i := range shards {
			known[i].at = time.Time{}
		}
	}
}

// byShard splits keys by the shard their residue names, keeping their order.
func (c *ShardedClient) byShard(n int, key func(j int) uint64) (groups [][]int, shards []int) {
	groups = make([][]int, len(c.shards))
	for j := range n {
		i := key(j) % uint64(len(c.shards))
		groups[i] = append(groups[i], j)
	}
	for i, g := range groups {
		if len(g) > 0 {
			shards = append(shards, i)
		}
	}
	return groups, shards
}

// Mutate updates priorities and deletes items of table, each on the shard
// its key names, in the order given within a shard (see Client.Mutate).
func (c *ShardedClient) Mutate(ctx context.Context, table string, muts ...tables.Mutation) error {
	if err := c.checked(ctx, table); err != nil {
		return err
	}
	groups, shards := c.byShard(len(muts), func(j int) uint64 { return muts[j].Key })
	defer c.markStale(table, shards)
	return eachShard(shards, c.prefixes, func(i int) error {
		mine := make([]tables.Mutation, len(groups[i]))
		for k, j := range groups[i] {
			mine[k] = muts[j]
		}
		return c.shards[i].Mutate(ctx, table, mine...)
	})
}

// UpdatePriorities sets the priorities of items in table.
func (c *ShardedClient) UpdatePriorities(ctx context.Context, table string, updates ...tables.PriorityUpdate) error {
	return c.Mutate(ctx, table, updateMutations(updates)...)
}

// Delete removes items from table.
func (c *ShardedClient) Delete(ctx context.Context, table string, keys ...uint64) error {
	return c.Mutate(ctx, table, deleteMutations(keys)...)
}

// SetPolicyVersion raises table's policy version on every shard (see
// Client.SetPolicyVersion).
func (c *ShardedClient) SetPolicyVersion(ctx context.Context, table string, version int64) error {
	defer c.markStale(table, c.all())
	return eachShard(c.all(), c.prefixes, func(i int) error { return c.shards[i].SetPolicyVersion(ctx, table, version) })
}

// SetMaxStaleness changes table's staleness bound on every shard (see
// Client.SetMaxStaleness).
func (c *ShardedClient) SetMaxStaleness(ctx context.Context, table string, maxStaleness int64) error {
	defer c.markStale(table, c.all())
	return eachShard(c.all(), c.prefixes, func(i int) error { return c.shards[i].SetMaxStaleness(ctx, table, maxStaleness) })
}

// Reset empties table (every table when table is empty) on every shard.
func (c *ShardedClient) Reset(ctx context.Context, table string) error {
	defer func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for name, known := range c.tables {
			if table == "" || name == table {
				for i := range known {
					known[i].at = time.Time{}
				}
			}
		}
	}()
	return eachShard(c.all(), c.prefixes, func(i int) error { return c.shards[i].Reset(ctx, table) })
}

// Checkpoint asks every shard to write a checkpoint now; the result is in
// shard order.
func (c *ShardedClient) Checkpoint(ctx context.Context) ([]*CheckpointInfo, error) {
	out := make([]*CheckpointInfo, len(c.shards))
	err := eachShard(c.all(), c.prefixes, func(i int) (err error) {
		out[i], err = c.shards[i].Checkpoint(ctx)
		return err
	})
	return out, err
}

// Get returns the metadata of the items of table with the given keys, each
// from the shard its key names, in the order asked, skipping keys the table
// does not hold. TableSize is the whole table's.
func (c *ShardedClient) Get(ctx context.Context, table string, keys ...uint64) (*ItemList, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: Get needs at least one key", ErrInvalidMessage)
	}
	if err := c.checked(ctx, table); err != nil {
		return nil, err
	}
	groups, shards := c.byShard(len(keys), func(j int) uint64 { return keys[j] })
	lists := make([]*ItemList, len(c.shards))
	err := eachShard(c.all(), c.prefixes, func(i int) (err error) {
		if len(groups[i]) == 0 {
			// Asked only for its size.
			_, ti, err := c.tableInfo(ctx, i, table)
			if err == nil {
				lists[i] = &ItemList{TableSize: ti.Size}
			}
			return err
		}
		mine := make([]uint64, len(groups[i]))
		for k, j := range groups[i] {
			mine[k] = keys[j]
		}
		lists[i], err = c.shards[i].Get(ctx, table, mine...)
		return err
	})
	if err != nil {
		return nil, err
	}
	found := make(map[uint64]ItemInfo)
	out := &ItemList{}
	for _, i := range shards {
		for _, it := range lists[i].Items {
			found[it.Key] = it
		}
	}
	for _, l := range lists {
		out.TableSize += l.TableSize
	}
	for _, k := range keys {
		if it, ok := found[k]; ok {
			out.Items = append(out.Items, it)
		}
	}
	return out, nil
}

// ShardedInfo is what the shards of a sharded table report: Info adds them
// up, and Shards has each one's own.
//
// In Info, every count and size is the sum over the shards (MaxSize too:
// each shard bounds its own), the weight is the sum of the shards', the
// policy versions are the highest (MinItemVersion the lowest of the shards
// that hold items), and the configuration is shard 0's. AppliedSequence is
// 0, as each shard has a stream of its own.
type ShardedInfo struct {
	Info
	Shards []*Info
}

// Info describes every table, or only the named one, over all shards.
func (c *ShardedClient) Info(ctx context.Context, table string) (*ShardedInfo, error) {
	out := &ShardedInfo{Shards: make([]*Info, len(c.shards))}
	err := eachShard(c.all(), c.prefixes, func(i int) (err error) {
		out.Shards[i], err = c.shards[i].Info(ctx, table)
		return err
	})
	if err != nil {
		return nil, err
	}
	out.ShardCount = len(c.shards)
	byName := make(map[string]int)
	for _, s := range out.Shards {
		out.Chunks += s.Chunks
		out.ChunkBytes += s.ChunkBytes
		out.RejectedMessages += s.RejectedMessages
		for _, t := range s.Tables {
			j, ok := byName[t.Name]
			if !ok {
				byName[t.Name] = len(out.Tables)
				t.Weight = trusted(t.Weight)
				out.Tables = append(out.Tables, t)
				continue
			}
			addTableInfo(&out.Tables[j], &t)
		}
	}
	return out, nil
}

// addTableInfo adds shard b's view of a table to the sum a.
func addTableInfo(a, b *TableInfo) {
	if b.Size > 0 {
		if a.Size == 0 {
			a.MinItemVersion = b.MinItemVersion
		} else {
			a.MinItemVersion = min(a.MinItemVersion, b.MinItemVersion)
		}
		a.MaxItemVersion = max(a.MaxItemVersion, b.MaxItemVersion)
	}
	a.MaxSize += b.MaxSize
	a.Limiter.Inserts += b.Limiter.Inserts
	a.Limiter.Samples += b.Limiter.Samples
	a.Limiter.Deletes += b.Limiter.Deletes
	a.Size += b.Size
	a.BytesHeld += b.BytesHeld
	a.Inserts += b.Inserts
	a.Samples += b.Samples
	a.Deletes += b.Deletes
	a.Evictions += b.Evictions
	a.InsertWaits += b.InsertWaits
	a.SampleWaits += b.SampleWaits
	a.PolicyVersion = max(a.PolicyVersion, b.PolicyVersion)
	a.StaleEvictions += b.StaleEvictions
	a.Episodes += b.Episodes
	a.DeletedEpisodes += b.DeletedEpisodes
	a.UniqueSamples += b.UniqueSamples
	a.Weight = addWeights(a.Weight, trusted(b.Weight)) // a's was trusted as it was added
}

// addWeights adds two weights in the frame of the larger, where a weight
// 2^-1100 times smaller is 0.
func addWeights(a, b tables.Weight) tables.Weight {
	if b.Fraction == 0 {
		return a
	}
	if a.Fraction == 0 {
		return b
	}
	if a.Exponent < b.Exponent {
		a, b = b, a
	}
	sum := a.Fraction
	// d <= 0 unless the subtraction overflowed, which only a hostile reply
	// makes: its weight is left out then.
	if d := b.Exponent - a.Exponent; d > -1100 && d <= 0 {
		sum += math.Ldexp(b.Fraction, int(d))
	}
	frac, exp := math.Frexp(sum)
	return tables.Weight{Fraction: frac, Exponent: min(a.Exponent+int64(exp), maxWeightExponent)}
}
