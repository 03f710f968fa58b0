package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// ClientOption configures a Client.
type ClientOption interface {
	configureClient(*clientOptions) error
}

type clientOptions struct {
	prefix        string
	logger        *slog.Logger
	returnOnStore bool // mutations return once stored, not once applied
}

// Client is a learner's connection to a deployment: it samples, updates
// priorities, deletes, and asks for info and resets. Safe for concurrent
// use.
type Client struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	subj  protocol.Subjects
	o     clientOptions
	inbox string
	sub   *nats.Subscription
	// The service's applied stream sequence, which mutations wait for, and
	// its refusals of this client's mutations, which arrive on notice.
	progressSub *nats.Subscription
	notice      string
	noticeSub   *nats.Subscription
	applied     appliedWatch
	// mutationOps is the service's limits.max_mutation_ops as its last info
	// reply gave it (0: not told), the most ops a mutation message carries.
	mutationOps atomic.Int64

	mu      sync.Mutex
	closed  bool
	pending map[string]*call
	nextID  atomic.Uint64
	// known holds the tables the service confirmed: a mutation goes through
	// the stream, where a table name nobody serves would only be a counted
	// rejection, so the client checks the name first, once.
	known sync.Map
}

// call collects the reply to one request, which may come in parts.
type call struct {
	subject string
	parts   [][]byte
	want    int
	done    chan struct{}
	err     error
	// withdraw: a sample request, which the service withdraws on a
	// SampleRequest.withdraw naming its reply subject.
	withdraw bool
	// sent: its request went out (set under Client.mu), so that Close
	// withdraws only requests its withdrawal follows on the connection.
	sent bool
}

// NewClient connects a client through nc.
func NewClient(nc *nats.Conn, opts ...ClientOption) (*Client, error) {
	o := clientOptions{prefix: DefaultPrefix, logger: slog.Default()}
	for _, opt := range opts {
		if err := opt.configureClient(&o); err != nil {
			return nil, err
		}
	}
	subj, err := protocol.NewSubjects(o.prefix)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("broker: jetstream: %w", err)
	}
	c := &Client{nc: nc, js: js, subj: subj, o: o, inbox: nc.NewInbox(), pending: make(map[string]*call)}
	// One subscription for every reply: a request's reply subject is the
	// inbox plus a token, so parts of large replies find their call.
	c.sub, err = nc.Subscribe(c.inbox+".*", c.onReply)
	if err != nil {
		return nil, fmt.Errorf("broker: subscribing to replies: %w", err)
	}
	// A reply larger than nats.go's 64 MiB of pending bytes arrives in
	// parts faster than a paused handler (a GC, a loaded learner) takes
	// them; a part dropped fails its call. Python's client allows 1 GiB.
	if err := c.sub.SetPendingLimits(-1, replyPendingBytes); err != nil {
		c.sub.Unsubscribe()
		return nil, fmt.Errorf("broker: subscribing to replies: %w", err)
	}
	// No reply comes once the connection is closed for good, nor any
	// progress: a call waiting for one waited out its deadline (a minute
	// and more), or for ever.
	c.sub.SetClosedHandler(func(string) {
		if nc.IsClosed() {
			err := fmt.Errorf("broker: %w", nats.ErrConnectionClosed)
			c.failPending(err)
			c.applied.close(err)
		}
	})
	// Synchronous, so that the connection queues a refusal in the order the
	// service sent it: before the progress that covers the mutation, whose
	// handler reads it (onProgress).
	c.notice = nc.NewInbox()
	c.noticeSub, err = nc.SubscribeSync(c.notice)
	if err != nil {
		c.sub.Unsubscribe()
		return nil, fmt.Errorf("broker: subscribing to the service's notices: %w", err)
	}
	c.applied.notices = c.noticeSub
	c.progressSub, err = nc.Subscribe(subj.Applied(), c.applied.onProgress)
	if err != nil {
		c.sub.Unsubscribe()
		c.noticeSub.Unsubscribe()
		return nil, fmt.Errorf("broker: subscribing to the service's progress: %w", err)
	}
	return c, nil
}

// replyPendingBytes bounds the reply bytes a client holds before its
// handler takes them.
const replyPendingBytes = 1 << 30

// Close stops the client. Calls in progress fail with ErrClosed. A second
// Close does nothing.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	// Ended here, and their withdrawals collected, at once: a call whose
	// ctx ends meanwhile finds itself ended, and withdraws nothing more.
	// A sample call that has not sent its request yet withdraws it itself
	// once it has (sent), so that the withdrawal follows the request.
	var withdraw []string
	for id, cl := range c.pending {
		if cl.withdraw && cl.sent {
			withdraw = append(withdraw, id)
		}
	}
	c.failPendingLocked(ErrClosed)
	c.mu.Unlock()
	err := errors.Join(c.sub.Unsubscribe(), c.progressSub.Unsubscribe(), c.noticeSub.Unsubscribe())
	c.applied.close(ErrClosed)
	// Published before Close returns, so that a connection closed next
	// still sends them.
	for _, id := range withdraw {
		c.withdraw(id)
	}
	return err
}

// failPending ends every call waiting for its reply with err.
func (c *Client) failPending(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failPendingLocked(err)
}

func (c *Client) failPendingLocked(err error) {
	for id, cl := range c.pending {
		cl.err = err
		close(cl.done)
		delete(c.pending, id)
	}
}

func (c *Client) onReply(m *nats.Msg) {
	id := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	c.mu.Lock()
	defer c.mu.Unlock()
	cl, ok := c.pending[id]
	if !ok {
		return // the caller gave up
	}
	finish := func(err error) {
		cl.err = err
		close(cl.done)
		delete(c.pending, id)
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		finish(fmt.Errorf("%w: %w on %s (is reprised running with prefix %q?)", ErrServer, errNoService, cl.subject, c.subj.Prefix))
		return
	}
	parts := m.Header.Get(protocol.HeaderParts)
	if parts == "" {
		cl.parts = [][]byte{m.Data}
		finish(nil)
		return
	}
	n, err1 := strconv.Atoi(parts)
	i, err2 := strconv.Atoi(m.Header.Get(protocol.HeaderPart))
	if err1 != nil || err2 != nil || n < 1 || i != len(cl.parts) || (cl.want != 0 && cl.want != n) {
		finish(fmt.Errorf("%w: reply part %q of %q out of order", ErrServer, m.Header.Get(protocol.HeaderPart), parts))
		return
	}
	cl.want = n
	cl.parts = append(cl.parts, m.Data)
	if len(cl.parts) == n {
		finish(nil)
	}
}

// request sends req to subject and returns the whole reply.
func (c *Client) request(ctx context.Context, subject string, req proto.Message) ([]byte, error) {
	return c.call(ctx, subject, req, false)
}

// call is request; with withdraw (a sample request), a call whose ctx ends
// before its reply, or that Close ends, withdraws the request, so that the
// service takes no items for it that nobody would read.
func (c *Client) call(ctx context.Context, subject string, req proto.Message, withdraw bool) ([]byte, error) {
	data, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("broker: encoding request: %w", err)
	}
	// The service acts on a request whatever becomes of its caller: a
	// sample takes its items, a reset empties the table. One whose caller
	// already gave up is not sent.
	if ctx.Err() != nil {
		return nil, fmt.Errorf("broker: not sending to %s: %w", subject, context.Cause(ctx))
	}
	// In hex, a call's token never spells "applied": the service answers
	// no reply subject shaped like one of a prefix's own.
	id := strconv.FormatUint(c.nextID.Add(1), 16)
	cl := &call{subject: subject, done: make(chan struct{}), withdraw: withdraw}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.pending[id] = cl
	c.mu.Unlock()
	if err := c.nc.PublishRequest(subject, c.inbox+"."+id, data); err != nil {
		c.forget(id)
		return nil, fmt.Errorf("broker: sending request to %s: %w", subject, err)
	}
	if withdraw && c.sent(cl) {
		c.withdraw(id)
	}
	select {
	case <-cl.done:
	case <-ctx.Done():
		if c.forget(id) && withdraw {
			c.withdraw(id)
		}
		return nil, fmt.Errorf("broker: waiting for %s: %w", subject, context.Cause(ctx))
	}
	if cl.err != nil {
		return nil, cl.err
	}
	if len(cl.parts) == 1 {
		return cl.parts[0], nil
	}
	var n int
	for _, p := range cl.parts {
		n += len(p)
	}
	whole := make([]byte, 0, n)
	for _, p := range cl.parts {
		whole = append(whole, p...)
	}
	return whole, nil
}

// sent records that cl's request went out, and says whether Close came
// first: it ended the call without withdrawing it, which is then the
// caller's to do.
func (c *Client) sent(cl *call) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl.sent = true
	return c.closed
}

// forget drops the call id, and says whether it was still waiting for its
// reply.
func (c *Client) forget(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.pending[id]
	delete(c.pending, id)
	return ok
}

// withdraw tells the service that nobody waits for the sample request id
// any more: one that still waits for the rate limiter ends without taking
// items. Best effort, and it never waits: a withdrawal that is lost leaves
// the request as it was. A service older than withdrawals ignores it, and
// logs that it did (at most about once a second).
func (c *Client) withdraw(id string) {
	if err := c.nc.Publish(c.subj.Sample(), withdrawal(c.inbox+"."+id)); err != nil {
		c.o.logger.Debug("reprise: withdrawing a sample request", "error", err)
	}
}

// statusError is the error a reply's status reports, or nil.
func statusError(st *wire.Status) error {
	return protocol.Status(protocol.Code(st.GetCode()), st.GetMessage())
}

// Sample is one sampled item: its sample info and its columns as tensors.
type Sample struct {
	Info    tables.SampleInfo
	Columns []NamedTensor
}

// NamedTensor is one column of a sampled item.
type NamedTensor struct {
	Name   string
	Tensor Tensor
}

// Column returns the named column, and whether the item has it.
func (s Sample) Column(name string) (Tensor, bool) {
	for _, c := range s.Columns {
		if c.Name == name {
			return c.Tensor, true
		}
	}
	return Tensor{}, false
}

// SampleOption configures one Sample call; given to NewSampler, it
// configures each of the Sampler's calls.
type SampleOption interface {
	configureSample(*sampleOptions) error
}

type sampleOptions struct {
	flexible bool
	// hungAfter, when set, is how long a service may leave unanswered an
	// info request that a waiting sample checks it with before it counts
	// as gone too: a sharded client samples the other shards meanwhile.
	hungAfter time.Duration
}

// Flexible returns as soon as at least one item is allowed, with up to the
// asked number: a batch may be smaller than asked when the rate limiter
// allows only some items.
func Flexible() interface {
	SampleOption
	SamplerOption
} {
	return flexibleOption{}
}

type flexibleOption struct{}

func (flexibleOption) configureSample(o *sampleOptions) error   { o.flexible = true; return nil }
func (flexibleOption) configureSampler(o *samplerOptions) error { o.sample.flexible = true; return nil }

// Sample takes n items from table. It waits for the table's rate limiter as
// long as ctx allows (the service caps the wait), or DefaultSampleWait
// without a deadline; when the limiter allows no sample in that time the
// error matches ErrRateLimited. When it allows only some, those are
// returned with an error matching ErrRateLimited: samples are never
// dropped. A reply that finds no room in the service's reply budget
// (limits.max_reply_bytes_in_flight) within the wait fails the same way;
// its samples were taken, and are lost, as a reply sent after the caller
// stopped waiting would be. A service that stops while the call waits
// fails it with ErrServer within about two seconds. A call whose ctx ends
// first (or that Close ends) withdraws its request: one still waiting for
// the rate limiter takes no items.
func (c *Client) Sample(ctx context.Context, table string, n int, opts ...SampleOption) ([]Sample, error) {
	o, err := sampleConfig(n, opts)
	if err != nil {
		return nil, err
	}
	return c.sample(ctx, table, n, o)
}

func sampleConfig(n int, opts []SampleOption) (sampleOptions, error) {
	if n < 1 || n > 1<<30 {
		return sampleOptions{}, fmt.Errorf("%w: sample size %d", ErrInvalidMessage, n)
	}
	var o sampleOptions
	for _, opt := range opts {
		if err := opt.configureSample(&o); err != nil {
			return sampleOptions{}, err
		}
	}
	return o, nil
}

func (c *Client) sample(ctx context.Context, table string, n int, o sampleOptions) ([]Sample, error) {
	out, _, err := c.sampleReply(ctx, table, n, o)
	return out, err
}

// sampleReply is sample that also returns the table's state after it, when
// the service sent samples.
func (c *Client) sampleReply(ctx context.Context, table string, n int, o sampleOptions) ([]Sample, wire.TableState, error) {
	data, err := c.sampleRequest(ctx, table, n, o)
	if err != nil {
		return nil, wire.TableState{}, err
	}
	reply, err := wire.DecodeSamples(data, newNamedTensor, newSample)
	if err != nil {
		return nil, wire.TableState{}, fmt.Errorf("%w: %w", ErrServer, err)
	}
	err = replyStatus(reply.Code, reply.Message)
	if err != nil && reply.Code != wire.Code_CODE_PARTIAL {
		return nil, wire.TableState{}, err
	}
	return reply.Samples, reply.After, err
}

// replyStatus is the error of a sample reply's status. A partial reply's
// matches ErrRateLimited and comes with the items the reply has; any
// other error comes alone.
func replyStatus(code wire.Code, msg string) error {
	if code == wire.Code_CODE_PARTIAL {
		return &StatusError{Code: CodeRateLimited, Message: msg}
	}
	return protocol.Status(protocol.Code(code), msg)
}

// sampleRequest asks the service for n items of table and returns its
// reply, undecoded.
func (c *Client) sampleRequest(ctx context.Context, table string, n int, o sampleOptions) ([]byte, error) {
	req := newSampleRequest(table, n, o)
	if dl, ok := ctx.Deadline(); ok {
		// Leave the reply time to travel, even on a loaded machine: a
		// sample the service takes after the client stopped listening is
		// lost.
		left := time.Until(dl)
		margin := min(left/2, max(left/10, 250*time.Millisecond))
		req.TimeoutMs = max(0, (left - margin).Milliseconds())
	} else {
		// The service answers by then, rate limited or not, unless it is
		// gone.
		req.TimeoutMs = DefaultSampleWait.Milliseconds()
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultSampleWait+sampleReplyMargin)
		defer cancel()
	}
	// A service that dies with the request never answers, and nothing else
	// would tell: a request that waits long checks that one still listens.
	ctx, cancel := context.WithCancelCause(ctx)
	probed := make(chan struct{})
	probe := time.AfterFunc(serviceProbeEvery, func() {
		defer close(probed)
		c.probeService(ctx, cancel, table, o.hungAfter)
	})
	defer func() {
		cancel(nil)
		if !probe.Stop() {
			<-probed // it started: it ends with ctx
		}
	}()
	return c.call(ctx, c.subj.Sample(), req, true)
}

// newSampleRequest is the request for n items of table, without its
// timeout (golden vectors hold its bytes, with Python's).
func newSampleRequest(table string, n int, o sampleOptions) *wire.SampleRequest {
	return &wire.SampleRequest{Table: table, NumSamples: int32(n), Flexible: o.flexible, Packed: true, Layout: wire.PackedLayout_PACKED_LAYOUT_UNIFORM}
}

// withdrawal is the message that withdraws the sample request sent with
// reply subject reply.
func withdrawal(reply string) []byte {
	data, _ := proto.Marshal(&wire.SampleRequest{Withdraw: reply})
	return data
}

// DefaultSampleWait is how long a sample waits for the rate limiter when
// its context has no deadline: the service's own default bound
// (service.max_sample_wait), after which it answers ErrRateLimited.
const DefaultSampleWait = time.Minute

// sampleReplyMargin is how long after the wait it asked for a client still
// waits for the reply, on a loaded machine.
const sampleReplyMargin = 10 * time.Second

// serviceProbeEvery is how often a sample that waits checks that a table
// service still listens.
const serviceProbeEvery = time.Second

// errNoService is NATS's answer to a request nobody listens for.
var errNoService = errors.New("no table service is listening")

// probeService asks for table's info every serviceProbeEvery and cancels
// ctx once no table service listens, or, with hungAfter, once one leaves a
// request unanswered that long (a service answers info at once, whatever
// its samples wait for: one that does not hangs, stopped or stuck).
func (c *Client) probeService(ctx context.Context, cancel context.CancelCauseFunc, table string, hungAfter time.Duration) {
	tick := time.NewTicker(serviceProbeEvery)
	defer tick.Stop()
	for {
		pctx, pcancel := context.WithTimeout(ctx, cmp.Or(hungAfter, serviceProbeEvery))
		_, err := c.Info(pctx, table)
		pcancel()
		switch {
		case errors.Is(err, errNoService):
			cancel(fmt.Errorf("%w: the table service stopped while the sample waited: %w", ErrServer, err))
			return
		case hungAfter > 0 && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			cancel(fmt.Errorf("%w: the table service left an info request unanswered for %v while the sample waited: it hangs", ErrServer, hungAfter))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// newNamedTensor and newSample give decoded items the public types,
// sharing their memory.
func newNamedTensor(c wire.SampledColumn) NamedTensor {
	return NamedTensor{Name: c.Name, Tensor: Tensor{DType: c.Dtype, Shape: c.Shape, Data: c.Data}}
}

func newSample(info tables.SampleInfo, cols []NamedTensor) Sample {
	return Sample{Info: info, Columns: cols}
}

// Mutate updates priorities and deletes items of table, in the order given.
// It goes through the stream like inserts, so it is durable and applied in
// order with the inserts around it; it returns once the service applied it
// (a sample or Get after it sees it), or with WithReturnOnStore once
// JetStream stored it. Keys that are not in the table are skipped. A
// mutation the service refused (a table it no longer serves, say) returns
// an error wrapping ErrRejected and the service's StatusError; one of
// more ops than the service takes at once goes in parts, and a refusal
// names the part. A connection closed for good while it waits ends the
// wait with ErrNotApplied and nats.ErrConnectionClosed: the mutation is
// stored, and the service applies it all the same.
func (c *Client) Mutate(ctx context.Context, table string, muts ...tables.Mutation) error {
	m := &wire.Mutation{Ops: make([]*wire.MutationOp, len(muts))}
	for i, mu := range muts {
		if !mu.Delete {
			if err := checkPriority(mu.Priority); err != nil {
				return fmt.Errorf("key %d: %w", mu.Key, err)
			}
		}
		m.Ops[i] = &wire.MutationOp{Key: mu.Key, Priority: mu.Priority, Delete: mu.Delete}
	}
	return c.mutate(ctx, table, m)
}

// mutate sends m, a Mutation of table, through the stream and waits until
// the service applied it (or JetStream stored it, with WithReturnOnStore).
func (c *Client) mutate(ctx context.Context, table string, m *wire.Mutation) error {
	if table == "" {
		return fmt.Errorf("%w: empty table name", ErrInvalidMessage)
	}
	// A mutation is durable once published: none goes out from a closed
	// client, nor for a caller that already gave up.
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if ctx.Err() != nil {
		return fmt.Errorf("broker: mutation for table %q not sent: %w", table, context.Cause(ctx))
	}
	m.Table = table
	if _, ok := c.known.Load(table); !ok {
		if _, err := c.Info(ctx, table); err != nil {
			return fmt.Errorf("broker: mutation for table %q: %w", table, err)
		}
		c.known.Store(table, struct{}{})
	}
	// Split as Python's client splits: the service refuses a mutation of
	// more ops than its limits.max_mutation_ops, and NATS one over its max
	// payload.
	limit := int(c.mutationOps.Load())
	if limit <= 0 {
		limit = defaultMutationOps
	}
	per := min(limit, max(1, (int(c.nc.MaxPayload())-1024-len(table))/mutationOpBytes))
	if !c.o.returnOnStore {
		m.NoticeSubject = c.notice
	}
	lost := c.applied.lostRefusals()
	ops := m.Ops
	var parts []uint64 // each part's stream sequence
	for start := 0; start == 0 || start < len(ops); start += per {
		m.Ops = ops[start:min(start+per, len(ops))]
		data, err := proto.Marshal(m)
		if err != nil {
			return fmt.Errorf("broker: encoding mutation: %w", err)
		}
		ack, err := c.js.Publish(ctx, c.subj.Mutate(), data)
		if err != nil {
			if start > 0 {
				return fmt.Errorf("broker: publishing mutation for table %q: its first %d of %d ops were stored, the rest not: %w", table, start, len(ops), err)
			}
			return fmt.Errorf("broker: publishing mutation for table %q: %w", table, err)
		}
		parts = append(parts, ack.Sequence)
	}
	if c.o.returnOnStore {
		return nil
	}
	last := parts[len(parts)-1]
	if err := c.applied.waitFor(ctx, last); err != nil {
		return fmt.Errorf("%w: mutation for table %q stored up to sequence %d: %w", ErrNotApplied, table, last, err)
	}
	err := c.applied.refusal(table, parts, per, len(ops), lost)
	if err != nil {
		// The service changed under the client (a new config, other
		// limits): the next call asks it again, and so fails before it
		// sends for a table it dropped, or sends parts it takes.
		c.known.Delete(table)
	}
	return err
}

// defaultMutationOps is the service's default limits.max_mutation_ops, the
// parts a mutation is sent in until an info reply tells the service's own.
// mutationOpBytes bounds one encoded op (key, priority, delete flag and
// framing).
const (
	defaultMutationOps = 65536
	mutationOpBytes    = 24
)

// appliedWatch follows the service's applied stream sequence, and its
// refusals of the client's mutations.
type appliedWatch struct {
	notices *nats.Subscription // read only in onProgress

	mu      sync.Mutex
	seq     uint64
	prevSeq uint64        // seq before its latest change
	changed chan struct{} // closed at the next change; made only when someone waits
	err     error         // why no progress comes any more
	// refused holds the refusals not yet taken, by the mutation's stream
	// sequence; lost counts those dropped unread, by the connection or
	// past maxKeptRefusals, for a waiter to know it may have missed its own.
	refused map[uint64]*wire.Rejection
	lost    uint64
	dropped int // the notice subscription's drops seen so far
}

// maxKeptRefusals bounds the refusals waiting to be taken: a mutation's
// caller takes its own once the service applied it, so only callers that
// gave up leave theirs behind.
const maxKeptRefusals = 1024

// close makes every wait, current and later, fail with err, or with the
// error of an earlier close.
func (w *appliedWatch) close(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
	if w.changed != nil {
		close(w.changed)
		w.changed = nil
	}
}

func (w *appliedWatch) onProgress(m *nats.Msg) {
	var prog wire.Progress
	if proto.Unmarshal(m.Data, &prog) != nil {
		return // not ours to judge: someone else published there
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// Every refusal the service sent before this progress is queued by now.
	w.takeNoticesLocked()
	if prog.AppliedSequence > w.seq {
		w.prevSeq, w.seq = w.seq, prog.AppliedSequence
		if w.changed != nil {
			close(w.changed)
			w.changed = nil
		}
	}
}

func (w *appliedWatch) takeNoticesLocked() {
	if w.notices == nil {
		return
	}
	if n, err := w.notices.Dropped(); err == nil && n > w.dropped {
		w.lost += uint64(n - w.dropped)
		w.dropped = n
	}
	n, _, err := w.notices.Pending()
	for ; err == nil && n > 0; n-- {
		m, err := w.notices.NextMsg(0)
		if err != nil {
			return
		}
		var r wire.Rejection
		if proto.Unmarshal(m.Data, &r) != nil || r.Sequence == 0 {
			continue // not the service's: anyone may publish to an inbox
		}
		if r.Sequence <= w.seq {
			// Progress passed it before it came, so its caller is gone:
			// a service that replays the stream (a restart, a takeover)
			// sends its refusals again. Kept, it would only push out one
			// a caller still waits for.
			continue
		}
		if w.refused == nil {
			w.refused = make(map[uint64]*wire.Rejection)
		}
		w.refused[r.Sequence] = &r
		if len(w.refused) > maxKeptRefusals {
			// A caller takes its refusal once progress passed its
			// mutation: one the latest progress passed may still be
			// waited for, one an earlier progress passed was left by a
			// caller that gave up.
			oldest := slices.Min(slices.Collect(maps.Keys(w.refused)))
			delete(w.refused, oldest)
			if oldest > w.prevSeq {
				w.lost++
			}
		}
	}
}

// lostRefusals is how many refusals went unread so far.
func (w *appliedWatch) lostRefusals() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lost
}

// refusal takes the refusals of a mutation of table sent in parts (their
// stream sequences, per ops each, total in all) once the service applied
// them, and says what was refused; lost is lostRefusals before the first
// part was sent.
func (w *appliedWatch) refusal(table string, parts []uint64, per, total int, lost uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var (
		first   *wire.Rejection
		firstAt uint64
		ranges  []string
	)
	for i, seq := range parts {
		r, ok := w.refused[seq]
		if !ok {
			continue
		}
		delete(w.refused, seq)
		if first == nil {
			first, firstAt = r, seq
		}
		ranges = append(ranges, fmt.Sprintf("%d to %d", i*per, min((i+1)*per, total)-1))
	}
	if first == nil {
		if w.lost != lost {
			return fmt.Errorf("%w: mutation for table %q: refusals of mutations were dropped unread (by the connection, or more than %d waiting), and this may have been one of them", ErrRejected, table, maxKeptRefusals)
		}
		return nil
	}
	what := ""
	if len(parts) > 1 {
		others := "the other parts were applied"
		if len(ranges) == len(parts) {
			others = "none was applied"
		}
		what = fmt.Sprintf(" (ops %s of %d, of %d parts sent apart; %s)", strings.Join(ranges, ", "), total, len(parts), others)
	}
	return fmt.Errorf("%w: mutation for table %q at stream sequence %d%s: %w", ErrRejected, table, firstAt, what, &StatusError{Code: Code(first.Code), Message: first.Message})
}

// waitFor waits until the service has applied the stream up to seq.
func (w *appliedWatch) waitFor(ctx context.Context, seq uint64) error {
	for {
		w.mu.Lock()
		if w.seq >= seq {
			w.mu.Unlock()
			return nil
		}
		if w.err != nil {
			err := w.err
			w.mu.Unlock()
			return err
		}
		if w.changed == nil {
			w.changed = make(chan struct{})
		}
		ch := w.changed
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// SetPolicyVersion raises table's current policy version to version (the
// highest set wins, whichever learner sets it): with a staleness bound
// (max_staleness), items that many versions behind are removed and no
// longer sampled. Like a mutation it goes through the stream, so it is
// durable and replayed, and it returns once applied (WithReturnOnStore:
// once stored).
func (c *Client) SetPolicyVersion(ctx context.Context, table string, version int64) error {
	return c.mutate(ctx, table, &wire.Mutation{PolicyVersion: version})
}

// SetMaxStaleness changes table's staleness bound while it runs: items
// more than maxStaleness policy versions behind are removed at once and
// from then on; a negative value removes the bound. It goes through the
// stream like a mutation; a restart applies the config file's bound again.
func (c *Client) SetMaxStaleness(ctx context.Context, table string, maxStaleness int64) error {
	return c.mutate(ctx, table, &wire.Mutation{MaxStaleness: &maxStaleness})
}

// UpdatePriorities sets the priorities of items in table.
func (c *Client) UpdatePriorities(ctx context.Context, table string, updates ...tables.PriorityUpdate) error {
	return c.Mutate(ctx, table, updateMutations(updates)...)
}

// Delete removes items from table.
func (c *Client) Delete(ctx context.Context, table string, keys ...uint64) error {
	return c.Mutate(ctx, table, deleteMutations(keys)...)
}

func updateMutations(updates []tables.PriorityUpdate) []tables.Mutation {
	muts := make([]tables.Mutation, len(updates))
	for i, u := range updates {
		muts[i] = tables.Mutation{Key: u.Key, Priority: u.Priority}
	}
	return muts
}

func deleteMutations(keys []uint64) []tables.Mutation {
	muts := make([]tables.Mutation, len(keys))
	for i, k := range keys {
		muts[i] = tables.Mutation{Key: k, Delete: true}
	}
	return muts
}

// How long a call waits for the service when its ctx has no deadline (the
// Python client's defaults): a service that never answers (stopped, hung)
// must not hold the caller for ever. Info and Items are answered at once;
// a reset waits for the stream to reach it, a checkpoint writes every
// table.
const (
	DefaultInfoWait       = 10 * time.Second
	DefaultResetWait      = 60 * time.Second
	DefaultCheckpointWait = 120 * time.Second
)

// withDefaultWait bounds ctx by d unless it has a deadline.
func withDefaultWait(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// Info describes every table, or only the named one. Without a deadline in
// ctx it waits at most DefaultInfoWait, as Items and Get do.
func (c *Client) Info(ctx context.Context, table string) (*Info, error) {
	ctx, cancel := withDefaultWait(ctx, DefaultInfoWait)
	defer cancel()
	data, err := c.request(ctx, c.subj.Info(), &wire.TableRequest{Table: table})
	if err != nil {
		return nil, err
	}
	var resp wire.InfoResponse
	if err := proto.Unmarshal(data, &resp); err != nil {
		return nil, fmt.Errorf("%w: malformed info response: %v", ErrServer, err)
	}
	if err := statusError(resp.Status); err != nil {
		return nil, err
	}
	if resp.MaxMutationOps > 0 {
		c.mutationOps.Store(int64(resp.MaxMutationOps))
	}
	return infoFromWire(&resp), nil
}

// Reset empties table (every table when table is empty) and zeroes its
// rate limiter. Like a mutation it goes through the stream. Without a
// deadline in ctx it waits at most DefaultResetWait.
func (c *Client) Reset(ctx context.Context, table string) error {
	ctx, cancel := withDefaultWait(ctx, DefaultResetWait)
	defer cancel()
	data, err := c.request(ctx, c.subj.ResetAPI(), &wire.TableRequest{Table: table})
	if err != nil {
		return err
	}
	var resp wire.ResetResponse
	if err := proto.Unmarshal(data, &resp); err != nil {
		return fmt.Errorf("%w: malformed reset response: %v", ErrServer, err)
	}
	return statusError(resp.Status)
}

func checkPriority(p float64) error {
	if math.IsNaN(p) || math.IsInf(p, 0) || p < 0 {
		return fmt.Errorf("%w: priority %v (must be finite and >= 0)", ErrInvalidMessage, p)
	}
	return nil
}

// Sampler keeps several sample requests in flight so a learner rarely waits
// for a round trip. Close withdraws the requests still waiting for the
// rate limiter, which then take nothing (a service that predates
// withdrawals serves them for nobody). Batches already sampled and nobody
// took are lost at Close: those that arrived, and replies on their way,
// up to twice WithInFlight batches when the table has items, since each
// request's batch waits for Next while the request after it is out. With
// a Queue table use one request in flight.
type Sampler struct{ p *prefetcher[[]Sample] }

// prefetcher keeps calls of a fetch function going and queues their
// results.
type prefetcher[T any] struct {
	results chan prefetched[T]
	cancel  context.CancelFunc
	closed  chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

type prefetched[T any] struct {
	v   T
	err error
}

// SamplerOption configures a Sampler. Flexible is one too.
type SamplerOption interface {
	configureSampler(*samplerOptions) error
}

type samplerOption func(*samplerOptions) error

func (f samplerOption) configureSampler(o *samplerOptions) error { return f(o) }

type samplerOptions struct {
	inFlight int
	timeout  time.Duration
	sample   sampleOptions
}

// WithInFlight sets how many requests are kept open (default 2, at least
// 1).
func WithInFlight(n int) SamplerOption {
	return samplerOption(func(o *samplerOptions) error {
		if n < 1 {
			return fmt.Errorf("%w: WithInFlight(%d): want at least 1", ErrInvalidOption, n)
		}
		o.inFlight = n
		return nil
	})
}

// WithRateLimitTimeout bounds how long one request may wait for the rate
// limiter (default: the service's maximum). Next then returns an error
// matching ErrRateLimited instead of hanging.
func WithRateLimitTimeout(d time.Duration) SamplerOption {
	return samplerOption(func(o *samplerOptions) error {
		// Python refuses the same: a port of Reverb's
		// rate_limiter_timeout_ms=0 meant "do not wait", and waited the
		// service's whole minute.
		if d <= 0 {
			return fmt.Errorf("%w: WithRateLimitTimeout(%v): want > 0 (leave it out to wait the service's maximum)", ErrInvalidOption, d)
		}
		o.timeout = d
		return nil
	})
}

// NewSampler starts prefetching batches of size items from table, until
// Close.
func (c *Client) NewSampler(table string, size int, opts ...SamplerOption) (*Sampler, error) {
	o, err := samplerConfig(size, opts)
	if err != nil {
		return nil, err
	}
	return &Sampler{startPrefetch(o, func(ctx context.Context) ([]Sample, error) { return c.sample(ctx, table, size, o.sample) })}, nil
}

func samplerConfig(size int, opts []SamplerOption) (samplerOptions, error) {
	if size < 1 || size > 1<<30 {
		return samplerOptions{}, fmt.Errorf("%w: sample size %d", ErrInvalidOption, size)
	}
	o := samplerOptions{inFlight: 2}
	for _, opt := range opts {
		if err := opt.configureSampler(&o); err != nil {
			return samplerOptions{}, err
		}
	}
	return o, nil
}

// startPrefetch keeps o.inFlight calls of fetch going until close.
func startPrefetch[T any](o samplerOptions, fetch func(context.Context) (T, error)) *prefetcher[T] {
	ctx, cancel := context.WithCancel(context.Background())
	s := &prefetcher[T]{results: make(chan prefetched[T], o.inFlight), cancel: cancel, closed: make(chan struct{})}
	for range o.inFlight {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			backoff := time.Duration(0)
			for ctx.Err() == nil {
				rctx, rcancel := ctx, context.CancelFunc(func() {})
				if o.timeout > 0 {
					rctx, rcancel = context.WithTimeout(ctx, o.timeout)
				}
				v, err := fetch(rctx)
				rcancel()
				if ctx.Err() != nil {
					return
				}
				if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, ErrClosed) {
					// No later request can succeed, and nobody may read
					// (a learner that dropped its sampler with its
					// connection): the sampler ends itself, Next hands
					// out what came, then ErrClosed.
					select {
					case s.results <- prefetched[T]{v, err}:
					default:
					}
					s.once.Do(func() { close(s.closed) })
					cancel()
					return
				}
				select {
				case s.results <- prefetched[T]{v, err}:
				case <-ctx.Done():
					return
				}
				// A service that answers at once with an error (unknown
				// table, shutting down) is not asked again in a tight loop.
				if err != nil && !errors.Is(err, ErrRateLimited) {
					backoff = min(max(2*backoff, 10*time.Millisecond), time.Second)
					select {
					case <-time.After(backoff):
					case <-ctx.Done():
						return
					}
				} else {
					backoff = 0
				}
			}
		}()
	}
	return s
}

// Next returns the next batch. A batch cut short by the rate limiter comes
// with an error matching ErrRateLimited, as from Client.Sample. Once the
// sampler is closed, Next hands out the batches that had arrived, then
// returns ErrClosed, also to a Next already waiting.
func (s *Sampler) Next(ctx context.Context) ([]Sample, error) { return s.p.next(ctx) }

// Close stops the sampler's requests, withdrawing those that wait, and
// waits for them to end.
func (s *Sampler) Close() { s.p.close() }

func (p *prefetcher[T]) next(ctx context.Context) (T, error) {
	// A batch that came before Close is still handed out: the service
	// drew its items.
	select {
	case r := <-p.results:
		return r.v, r.err
	default:
	}
	var zero T
	select {
	case r := <-p.results:
		return r.v, r.err
	case <-p.closed:
		return zero, ErrClosed
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

func (p *prefetcher[T]) close() {
	p.once.Do(func() { close(p.closed) })
	p.cancel()
	p.wg.Wait()
}

// Checkpoint asks the service to write a checkpoint now. Without a
// deadline in ctx it waits at most DefaultCheckpointWait, which a table of
// more than about 300 MiB may take to write: give such a call a deadline
// of its own (the service allows 30 s and 1 s a 4 MiB).
func (c *Client) Checkpoint(ctx context.Context) (*CheckpointInfo, error) {
	ctx, cancel := withDefaultWait(ctx, DefaultCheckpointWait)
	defer cancel()
	data, err := c.request(ctx, c.subj.Checkpoint(), &wire.CheckpointRequest{})
	if err != nil {
		return nil, err
	}
	var resp wire.CheckpointResponse
	if err := proto.Unmarshal(data, &resp); err != nil {
		return nil, fmt.Errorf("%w: malformed checkpoint response: %v", ErrServer, err)
	}
	if err := statusError(resp.Status); err != nil {
		return nil, err
	}
	return &CheckpointInfo{
		Name: resp.Name, AppliedSequence: resp.AppliedSequence, Items: resp.Items, Bytes: resp.Bytes,
		Pause: time.Duration(resp.PauseNs), Write: time.Duration(resp.WriteNs),
	}, nil
}

// Items returns the metadata of up to limit items of table, in insertion
// order, after the first offset. A page whose reply would take more than
// the service's limits.max_reply_bytes, or 64 MiB, fails with
// ErrResourceExhausted: ask for fewer. The service walks to offset a few
// thousand items at a time, letting the table insert and sample between:
// a table that changes meanwhile changes the page as it would between two
// calls, but no key is in it twice. One whose items are removed from
// under the walk again and again fails with ErrServer, code
// CodeUnavailable: try again.
func (c *Client) Items(ctx context.Context, table string, offset int64, limit int32) (*ItemList, error) {
	return c.items(ctx, &wire.ItemsRequest{Table: table, Offset: offset, Limit: limit})
}

// Get returns the metadata of the items of table with the given keys, in
// the order asked, skipping keys the table does not hold. Its reply is
// bounded as Items'.
func (c *Client) Get(ctx context.Context, table string, keys ...uint64) (*ItemList, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: Get needs at least one key", ErrInvalidMessage)
	}
	return c.items(ctx, &wire.ItemsRequest{Table: table, Keys: keys})
}

func (c *Client) items(ctx context.Context, req *wire.ItemsRequest) (*ItemList, error) {
	ctx, cancel := withDefaultWait(ctx, DefaultInfoWait)
	defer cancel()
	data, err := c.request(ctx, c.subj.Items(), req)
	if err != nil {
		return nil, err
	}
	var resp wire.ItemsResponse
	if err := proto.Unmarshal(data, &resp); err != nil {
		return nil, fmt.Errorf("%w: malformed items response: %v", ErrServer, err)
	}
	if err := statusError(resp.Status); err != nil {
		return nil, err
	}
	out := &ItemList{Items: make([]ItemInfo, len(resp.Items)), TableSize: resp.TableSize}
	for i, it := range resp.Items {
		out.Items[i] = ItemInfo{
			Key: it.Key, Priority: it.Priority, TimesSampled: it.TimesSampled,
			InsertedAt: time.Unix(0, it.InsertedAtUnixNano), Trajectory: wire.ToTableColumns(it.Columns), PolicyVersion: it.PolicyVersion,
		}
	}
	return out, nil
}
