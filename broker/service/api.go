package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// A sample response larger than the connection's max payload travels in
// parts (headers protocol.HeaderPart and HeaderParts). Parts arrive in order
// on the reply subject; the client joins them and decodes the whole.
const payloadHeadroom = 1024 // room left in every message for headers and protocol overhead

func (s *Service) startMicro(ctx context.Context) (micro.Service, error) {
	svc, err := micro.AddService(s.rc, micro.Config{
		Name:        "reprise",
		Version:     Version,
		Description: "Reprise experience replay table service",
		Metadata:    map[string]string{"prefix": s.subj.Prefix, "tables": strings.Join(s.names, ",")},
		ErrorHandler: func(_ micro.Service, err *micro.NATSError) {
			s.log.Warn("reprise service: request subscription", "subject", err.Subject, "error", err.Description)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("broker: starting micro service: %w", err)
	}
	g := svc.AddGroup(s.subj.APIGroup())
	endpoints := []struct {
		name    string
		handler micro.HandlerFunc
	}{
		{"sample", func(r micro.Request) { s.spawnSample(ctx, r) }},
		{"info", func(r micro.Request) { s.handleInfo(r) }},
		{"items", func(r micro.Request) { s.handleItems(r) }},
		{"reset", func(r micro.Request) { s.spawn(ctx, r, s.handleReset) }},
		{"checkpoint", func(r micro.Request) { s.spawn(ctx, r, s.handleCheckpoint) }},
	}
	for _, e := range endpoints {
		h := func(r micro.Request) {
			// Refused before the request is acted on: a sample would take
			// its items for a caller that gets no answer.
			if why := s.replySubjectError(r.Reply()); why != "" {
				if s.rejectLog.allow() {
					s.log.Warn("reprise service: ignoring a request whose reply subject the service must not publish on", "endpoint", e.name, "reply", fmt.Sprintf("%.128q", r.Reply()), "reason", why)
				}
				return
			}
			if r.Reply() == "" && e.name == "sample" {
				s.handleUnanswerable(r)
				return
			}
			if !s.mayAct() {
				s.refuseInactive(s.rc, r, "; try again: the active one answers")
				return
			}
			e.handler(r)
		}
		if err := g.AddEndpoint(e.name, micro.HandlerFunc(h)); err != nil {
			return nil, errors.Join(fmt.Errorf("broker: adding endpoint %s: %w", e.name, err), svc.Stop())
		}
	}
	return svc, nil
}

// replySubjectError says why the service must not answer a request on
// reply, the subject it named, or returns "" (also for no subject).
func (s *Service) replySubjectError(reply string) string {
	switch {
	case reply == "":
		return ""
	case s.subj.Owns(reply):
		return "under the prefix"
	}
	return cmp.Or(answerSubjectError(reply), literalSubjectError(reply))
}

// spawnSample serves a sample request in a slot of its table's (see
// requestSlots), registered in s.waits until it ends so that a withdrawal
// that follows it finds it.
func (s *Service) spawnSample(ctx context.Context, r micro.Request) {
	start := time.Now()
	var req wire.SampleRequest
	if err := proto.Unmarshal(r.Data(), &req); err != nil {
		s.respondStatus(r, protocol.CodeInvalidArgument, fmt.Sprintf("malformed sample request: %v", err))
		return
	}
	if req.Withdraw != "" {
		s.respondStatus(r, protocol.CodeInvalidArgument, "a withdrawal of a sample request is published without a reply subject")
		return
	}
	t, ok := s.tables[req.Table]
	if !ok {
		s.respondStatus(r, protocol.CodeNotFound, fmt.Sprintf("unknown table %q (tables: %s)", req.Table, strings.Join(s.names, ", ")))
		return
	}
	wait := s.o.maxSampleWait
	if req.TimeoutMs >= 0 && req.TimeoutMs < wait.Milliseconds() {
		wait = time.Duration(req.TimeoutMs) * time.Millisecond
	}
	wctx := &lazyDeadline{parent: ctx, at: start.Add(wait)}
	reply := r.Reply()
	s.waits.add(reply, wctx)
	served := s.spawnIn(ctx, r, req.Table, func(ctx context.Context, r micro.Request) {
		defer s.waits.remove(reply, wctx)
		s.handleSample(ctx, r, &req, t, start, wait, wctx)
	})
	if !served {
		s.waits.remove(reply, wctx)
	}
}

// spawn serves a request that may wait (for the stream, for a checkpoint)
// on its own goroutine, so the endpoint's subscription keeps dispatching.
func (s *Service) spawn(ctx context.Context, r micro.Request, h func(context.Context, micro.Request)) {
	s.spawnIn(ctx, r, "", h)
}

// spawnIn is spawn in a slot of table's, and says whether h runs.
func (s *Service) spawnIn(ctx context.Context, r micro.Request, table string, h func(context.Context, micro.Request)) bool {
	s.closingMu.Lock()
	defer s.closingMu.Unlock()
	if s.closing || ctx.Err() != nil {
		s.respondStatus(r, protocol.CodeUnavailable, "service shutting down")
		return false
	}
	if err := s.slots.take(table); err != nil {
		s.respondStatus(r, protocol.CodeResourceExhausted, err.Error())
		return false
	}
	s.handlers.Add(1)
	job := func() {
		defer func() {
			s.slots.give(table)
			s.handlers.Done()
		}()
		h(ctx, r)
	}
	if s.workers == nil || !s.workers.run(job) {
		go job()
	}
	return true
}

// requestSlots bounds the requests served at once, and shares them so that
// requests waiting on one table (for its rate limiter, say) cannot take
// every slot from the others: a table may hold more than its fair share
// (an equal split between the tables, and admin requests as one more) only
// while at least half the slots are free.
type requestSlots struct {
	mu      sync.Mutex
	limit   int
	fair    int
	inUse   int
	byTable map[string]int
}

func newRequestSlots(limit, tables int) *requestSlots {
	return &requestSlots{limit: limit, fair: max(1, limit/(tables+1)), byTable: make(map[string]int)}
}

func (rs *requestSlots) take(table string) error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	mine := rs.byTable[table]
	switch {
	case rs.inUse >= rs.limit:
		return fmt.Errorf("service busy: %d requests in progress, the limit", rs.inUse)
	case mine >= rs.fair && rs.inUse >= rs.limit/2:
		return fmt.Errorf("service busy: %d requests in progress, %d of them for table %q, over its share of %d while others wait", rs.inUse, mine, table, rs.fair)
	}
	rs.inUse++
	rs.byTable[table] = mine + 1
	return nil
}

func (rs *requestSlots) give(table string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.inUse--
	if rs.byTable[table]--; rs.byTable[table] == 0 {
		delete(rs.byTable, table)
	}
}

// microCode maps a status to the code NATS micro stats show.
func microCode(c protocol.Code) string {
	switch c {
	case protocol.CodeInvalidArgument:
		return "400"
	case protocol.CodeNotFound:
		return "404"
	case protocol.CodeRateLimited:
		return "429"
	case protocol.CodeUnavailable, protocol.CodeResourceExhausted:
		return "503"
	default:
		return "500"
	}
}

// respondStatus answers with an error status only; the body is the
// endpoint's response message with just its status set, so clients decode
// every answer the same way.
func (s *Service) respondStatus(r micro.Request, code protocol.Code, msg string) {
	data, _ := proto.Marshal(&wire.SampleResponse{Status: &wire.Status{Code: wire.Code(code), Message: msg}})
	s.reply(r, data, nats.Header{micro.ErrorHeader: []string{msg}, micro.ErrorCodeHeader: []string{microCode(code)}})
}

// reply publishes data on r's reply subject. Handlers that wait answer from
// their own goroutine after micro's handler has returned, and micro's own
// Respond records its outcome in the request, which micro reads then: a
// data race. So every answer goes out here instead (micro's stats still
// count requests and processing time, not errors).
func (s *Service) reply(r micro.Request, data []byte, h nats.Header) {
	s.replyOn(s.rc, r, data, h)
}

// replyConn is the connection for the next reply that carries items.
func (s *Service) replyConn() *nats.Conn {
	conns := s.o.replyConns
	if len(conns) == 0 {
		return s.rc
	}
	return conns[(s.replies.Add(1)-1)%uint64(len(conns))]
}

// replyOn is reply over nc, and says whether data went out. A service
// whose lease lapsed while it served the request sends a refusal instead
// (refuseInactive): its tables are no longer the ones clients use.
func (s *Service) replyOn(nc *nats.Conn, r micro.Request, data []byte, h nats.Header) bool {
	if r.Reply() == "" {
		return false
	}
	if !s.mayAct() {
		// What the request changed through the stream (a reset it
		// published) still takes effect under the active service: a
		// caller that tried again blindly would change it twice.
		s.refuseInactive(nc, r, " while it served this request, and withheld its answer; what the request stored in the stream (a reset) still takes effect")
		return false
	}
	if s.lease != nil {
		if h == nil {
			h = nats.Header{}
		}
		h.Set(HeaderService, s.id)
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: r.Reply(), Data: data, Header: h}); err != nil {
		s.log.Debug("reprise service: replying", "error", err)
	}
	return true
}

// refuseInactive answers a request that reached a service without the
// lease (one paused past its lease, say, before it stops its endpoints)
// with CodeUnavailable and no data, the reason ending with more. Left
// unanswered, the caller would wait out its whole timeout (a reprisectl
// checkpoint waited ten minutes); the refusal tells it at once.
func (s *Service) refuseInactive(nc *nats.Conn, r micro.Request, more string) {
	if r.Reply() == "" {
		return
	}
	msg := fmt.Sprintf("service %s is not the active one of prefix %q: it lost its lease%s", s.id, s.subj.Prefix, more)
	data, _ := proto.Marshal(&wire.SampleResponse{Status: &wire.Status{Code: wire.Code(protocol.CodeUnavailable), Message: msg}})
	h := nats.Header{micro.ErrorHeader: []string{msg}, micro.ErrorCodeHeader: []string{microCode(protocol.CodeUnavailable)}, HeaderService: []string{s.id}}
	if err := nc.PublishMsg(&nats.Msg{Subject: r.Reply(), Data: data, Header: h}); err != nil {
		s.log.Debug("reprise service: refusing a request", "error", err)
	}
}

// handleSample serves req, waiting for the limiter until wctx ends: at
// start plus wait, or when the request is withdrawn, and then it ends
// unanswered unless it sampled.
func (s *Service) handleSample(ctx context.Context, r micro.Request, req *wire.SampleRequest, t *tables.Table, start time.Time, wait time.Duration, wctx *lazyDeadline) {
	defer wctx.stop()
	if wctx.isWithdrawn() {
		return
	}
	if req.NumSamples < 1 || int(req.NumSamples) > s.o.maxBatch {
		s.respondStatus(r, protocol.CodeInvalidArgument, fmt.Sprintf("num_samples %d out of range [1, %d]", req.NumSamples, s.o.maxBatch))
		return
	}
	// Refused before anything is sampled: a sample counts against the
	// limiter and max_times_sampled whether or not it reaches the learner.
	// An item takes the bytes it decodes to and the records that describe
	// it, which an item of many slices of empty steps is all made of. One
	// item is always served: any item may be sampled. The table asks
	// whenever it takes samples, since larger items may come while the
	// request waits for its limiter.
	var per, fit int64
	counted := false
	fits := func(largestBytes, largestParts int64) bool {
		per = largestBytes + wire.SampleItemBytes + wire.SamplePartBytes*largestParts
		fit = max(1, s.o.limits.MaxReplyBytes/per)
		ok := int64(req.NumSamples) <= fit
		if ok && !counted {
			// A learner for pacing inserts, counted as it comes (the
			// table asks at once), as the period whose delays it suffers
			// sees it: counted once served, learners starved of the CPU
			// in a period went unseen just when pacing was for them.
			// Requests refused at once (malformed, of no table, out of
			// range, over max_reply_bytes) are not counted: any client
			// sending them held the actors at the paced minimum.
			s.pace.samples.Add(1)
			counted = true
		}
		return ok
	}
	code := protocol.CodeInternal
	items := 0
	observe := s.o.observer != nil
	if observe {
		defer func() {
			if observe {
				s.o.observer.SampleServed(req.Table, items, time.Since(start), code)
			}
		}()
	}
	least := int(req.NumSamples)
	if req.Flexible {
		least = 1
	}
	pooled := sampleSlices.Get().(*[]tables.Sample)
	defer func() {
		// Cleared, so that the pool keeps no chunk alive.
		clear(*pooled)
		*pooled = (*pooled)[:0]
		sampleSlices.Put(pooled)
	}()
	samples, after, err := t.AppendSamplesWithin(wctx, *pooled, least, int(req.NumSamples), fits)
	*pooled = samples
	status, msg := protocol.CodeOK, ""
	tooMany := func() string {
		return fmt.Sprintf("table %q: %d items of up to %d bytes, with the records that describe them, may take more than %d bytes (limits.max_reply_bytes): ask for at most %d",
			req.Table, req.NumSamples, per, s.o.limits.MaxReplyBytes, fit)
	}
	switch {
	case err == nil:
	case errors.Is(err, tables.ErrTooMany) && len(samples) == 0:
		code = protocol.CodeResourceExhausted
		s.respondStatus(r, code, tooMany())
		return
	case errors.Is(err, tables.ErrTooMany):
		status, msg = protocol.CodePartial, fmt.Sprintf("%d of %d samples before larger items came: %s", len(samples), req.NumSamples, tooMany())
	case len(samples) > 0:
		status, msg = protocol.CodePartial, fmt.Sprintf("%d of %d samples before the timeout: %v", len(samples), req.NumSamples, err)
	case errors.Is(err, tables.ErrClosed) || ctx.Err() != nil:
		// The wait ended with the service's run, not the request's: a
		// sharded learner samples the other shards from one unavailable.
		code = protocol.CodeUnavailable
		s.respondStatus(r, code, "service shutting down")
		return
	case wctx.isWithdrawn():
		// Nobody listens, and nothing was taken: no answer, nothing
		// observed (the observer counts requests answered).
		observe = false
		return
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		code = protocol.CodeRateLimited
		s.respondStatus(r, protocol.CodeRateLimited, fmt.Sprintf("table %q: rate limiter allowed no sample within %v: %v", req.Table, wait, err))
		return
	default:
		s.respondStatus(r, protocol.CodeInternal, err.Error())
		return
	}
	code, items = status, len(samples)
	// The reply's bytes are taken from the service's budget before it is
	// built, and given back once the connection copied them. The wait for
	// them ends soon after the request's (replyRoomGrace), while the
	// learner still listens: a wait past that held the request's slot, and
	// then bytes other learners waited for, for a reply nobody read. The
	// budget cannot be taken before the samples are: their bytes are known
	// only once they are drawn, and a bound taken beforehand (the table's
	// largest item times the count) would hold far more than the replies
	// take, and hold it while requests wait for their limiter.
	roomWait := wait + replyRoomGrace(wait)
	var taken, asked int64
	var roomErr error
	defer func() { s.replyBudget.give(taken) }()
	reserve := func(n int64) error {
		asked = n
		var ok bool
		if taken, ok = s.replyBudget.tryTake(n); ok {
			// The usual reply: no deadline made for it (see lazyDeadline).
			return nil
		}
		rctx, cancel := context.WithDeadline(ctx, start.Add(roomWait))
		defer cancel()
		rctx, unbind := wctx.whileListened(rctx)
		defer unbind()
		taken, roomErr = s.replyBudget.take(rctx, n)
		return roomErr
	}
	buf := responseBuffers.Get().(*[]byte)
	// A reply that found no room before the service stopped, its wait
	// for room ended or its learner withdrew it. Its samples stay taken,
	// as those of any reply the learner stopped waiting for.
	noRoom := func() {
		s.putResponseBuffer(buf)
		items = 0
		if ctx.Err() != nil {
			code = protocol.CodeUnavailable
			s.respondStatus(r, code, "service shutting down")
			return
		}
		if wctx.isWithdrawn() {
			// Nobody listens: no answer, nothing observed.
			observe = false
			return
		}
		code = protocol.CodeRateLimited
		s.respondStatus(r, code, fmt.Sprintf("table %q: the reply of %d samples (%d bytes) found no room within limits.max_reply_bytes_in_flight in %v (the request's %v and a part of the margin its client listens past it); the samples were taken", req.Table, len(samples), asked, roomWait, wait))
	}
	if req.Packed {
		// A layout newer than this service gets the newest it knows; the
		// client tells which by the fields it finds.
		*buf, err = wire.AppendPackedSampleResponseWithin((*buf)[:0], req.Layout, wire.Code(status), msg, samples, after,
			func(n int) error { return reserve(int64(n)) })
		if roomErr != nil {
			noRoom()
			return
		}
		if err != nil {
			// The store holds only chunks that decoded when they came in.
			s.putResponseBuffer(buf)
			code, items = protocol.CodeInternal, 0
			s.log.Error("reprise service: packing a sample", "table", req.Table, "error", err)
			s.respondStatus(r, protocol.CodeInternal, fmt.Sprintf("table %q: %v", req.Table, err))
			return
		}
	} else {
		// Clients older than packed replies read items one by one: no
		// item of such a reply takes more than the largest the table holds.
		if reserve(int64(len(samples))*per) != nil {
			noRoom()
			return
		}
		*buf = wire.AppendSampleResponse((*buf)[:0], wire.Code(status), msg, samples, after)
	}
	s.respondParts(r, *buf)
	// Respond copied the bytes into the connection's buffer.
	s.putResponseBuffer(buf)
}

// replyRoomGrace is how long past its request's wait a reply whose samples
// were taken may still wait for room in the reply budget: half the margin
// both clients listen past the timeout_ms they send, for the reply to
// travel (broker.Client.Sample, the Python client's sample_timeouts). For
// a timeout_ms of T that margin is T up to 250 ms, 250 ms up to 2.25 s,
// and T/9 past it. Without it, samples taken at the deadline (those of a
// partial reply, or the ones the limiter let through last) found no room
// at once whenever another reply was ahead of them, and were lost while
// the learner still listened.
func replyRoomGrace(wait time.Duration) time.Duration {
	return min(wait, max(250*time.Millisecond, wait/9)) / 2
}

// putResponseBuffer keeps buf for a later reply unless it outgrew
// limits.max_reply_bytes: a reply larger than that is an outlier, whose
// buffer would hold its memory while the pool keeps it.
func (s *Service) putResponseBuffer(buf *[]byte) {
	if int64(cap(*buf)) <= s.o.limits.MaxReplyBytes {
		responseBuffers.Put(buf)
	}
}

// responseBuffers keeps sample response buffers between requests: a batch
// of large items makes megabytes each time.
var responseBuffers = sync.Pool{New: func() any { return new([]byte) }}

// sampleSlices keeps the slices samples are taken into between requests:
// fresh, they were 15% of what reprised allocated while serving batches of
// 256 items of 400 B (the NATS server's copies of the replies most of the
// rest), and each collection marks every table.
var sampleSlices = sync.Pool{New: func() any { return new([]tables.Sample) }}

// respondParts sends data in one message, or in parts when it exceeds the
// connection's max payload.
func (s *Service) respondParts(r micro.Request, data []byte) {
	nc := s.replyConn()
	// Of a max payload as small as 1 KiB (reprised takes that), half is
	// left to the headers: the headroom would leave the data nothing.
	payload := int(nc.MaxPayload())
	limit := payload - min(payloadHeadroom, payload/2)
	if len(data) <= limit || limit < 1 {
		s.replyOn(nc, r, data, nil)
		return
	}
	parts := (len(data) + limit - 1) / limit
	total := strconv.Itoa(parts)
	for i := range parts {
		part := data[i*limit : min(len(data), (i+1)*limit)]
		if !s.replyOn(nc, r, part, nats.Header{protocol.HeaderPart: []string{strconv.Itoa(i)}, protocol.HeaderParts: []string{total}}) {
			return
		}
	}
}

func (s *Service) handleInfo(r micro.Request) {
	var req wire.TableRequest
	if err := proto.Unmarshal(r.Data(), &req); err != nil {
		s.respondStatus(r, protocol.CodeInvalidArgument, fmt.Sprintf("malformed info request: %v", err))
		return
	}
	resp := &wire.InfoResponse{
		Status:           &wire.Status{},
		AppliedSequence:  s.progress.get(),
		Chunks:           int64(s.store.Len()),
		ChunkBytes:       s.store.Bytes(),
		RejectedMessages: s.stats.rejected.Load(),
		ShardIndex:       uint32(s.o.shard.Index),
		ShardCount:       uint32(s.o.shard.Count),
		MaxMutationOps:   uint32(min(s.o.limits.MaxMutationOps, math.MaxUint32)),
	}
	names := s.names
	if req.Table != "" {
		if _, ok := s.tables[req.Table]; !ok {
			s.respondStatus(r, protocol.CodeNotFound, fmt.Sprintf("unknown table %q (tables: %s)", req.Table, strings.Join(s.names, ", ")))
			return
		}
		names = []string{req.Table}
	}
	for _, name := range names {
		resp.Tables = append(resp.Tables, tableInfo(s.tables[name].Info()))
	}
	data, _ := proto.Marshal(resp)
	s.respondParts(r, data)
}

func tableInfo(in tables.Info) *wire.TableInfo {
	c := in.Config
	ti := &wire.TableInfo{
		Name:            c.Name,
		Sampler:         c.Sampler.String(),
		Remover:         c.Remover.String(),
		MaxSize:         c.MaxSize,
		MaxTimesSampled: c.MaxTimesSampled,
		Limiter: &wire.LimiterInfo{
			SamplesPerInsert: in.Limiter.Config.SamplesPerInsert,
			MinSize:          in.Limiter.Config.MinSize,
			MinDiff:          in.Limiter.Config.MinDiff,
			MaxDiff:          in.Limiter.Config.MaxDiff,
			Inserts:          in.Limiter.Inserts,
			Samples:          in.Limiter.Samples,
			Deletes:          in.Limiter.Deletes,
		},
		Size:        in.Size,
		BytesHeld:   in.BytesHeld,
		Inserts:     in.Counters.Inserts,
		Samples:     in.Counters.Samples,
		Deletes:     in.Counters.Deletes,
		Evictions:   in.Counters.Evictions,
		InsertWaits: in.Counters.InsertWaits,
		SampleWaits: in.Counters.SampleWaits,

		PolicyVersion:  in.PolicyVersion,
		MaxStaleness:   c.MaxStaleness,
		StaleEvictions: in.Counters.StaleEvictions,

		NumEpisodes:        in.Episodes,
		NumDeletedEpisodes: in.Counters.DeletedEpisodes,
		NumUniqueSamples:   in.Counters.UniqueSamples,

		WeightFraction: in.Weight.Fraction,
		WeightExponent: in.Weight.Exponent,
	}
	if v := in.ItemVersions; v != nil {
		ti.MinItemVersion, ti.MaxItemVersion = v[0], v[1]
	}
	for _, cs := range c.Signature {
		ti.Signature = append(ti.Signature, &wire.ColumnSpec{Name: cs.Name, Dtype: cs.DType, Shape: cs.Shape})
	}
	return ti
}

// handleReset publishes the reset to the stream, so that it is replayed in
// order with the inserts around it after a crash, and answers once the
// apply loop has applied it.
func (s *Service) handleReset(ctx context.Context, r micro.Request) {
	var req wire.TableRequest
	if err := proto.Unmarshal(r.Data(), &req); err != nil {
		s.respondStatus(r, protocol.CodeInvalidArgument, fmt.Sprintf("malformed reset request: %v", err))
		return
	}
	if _, ok := s.tables[req.Table]; req.Table != "" && !ok {
		s.respondStatus(r, protocol.CodeNotFound, fmt.Sprintf("unknown table %q (tables: %s)", req.Table, strings.Join(s.names, ", ")))
		return
	}
	data, _ := proto.Marshal(&wire.ResetRequest{Table: req.Table})
	wctx, cancel := context.WithTimeout(ctx, s.o.maxSampleWait)
	defer cancel()
	ack, err := s.js.Publish(wctx, s.subj.Reset(), data)
	if err != nil {
		s.respondStatus(r, protocol.CodeUnavailable, fmt.Sprintf("publishing reset: %v", err))
		return
	}
	select {
	case s.resetStored <- struct{}{}:
	default: // the apply loop has a wake-up to take already
	}
	if err := s.progress.waitFor(wctx, ack.Sequence); err != nil {
		s.respondStatus(r, protocol.CodeUnavailable, fmt.Sprintf("reset stored at sequence %d but not applied yet (a rate limiter may be holding an insert before it): %v", ack.Sequence, err))
		return
	}
	out, _ := proto.Marshal(&wire.ResetResponse{Status: &wire.Status{}})
	s.reply(r, out, nil)
}

// handleCheckpoint writes a checkpoint and answers with what it wrote.
func (s *Service) handleCheckpoint(ctx context.Context, r micro.Request) {
	var req wire.CheckpointRequest
	if err := proto.Unmarshal(r.Data(), &req); err != nil {
		s.respondStatus(r, protocol.CodeInvalidArgument, fmt.Sprintf("malformed checkpoint request: %v", err))
		return
	}
	res, err := s.Checkpoint(ctx)
	if err != nil {
		s.respondStatus(r, protocol.CodeUnavailable, err.Error())
		return
	}
	out, _ := proto.Marshal(&wire.CheckpointResponse{
		Status: &wire.Status{}, Name: res.Name, AppliedSequence: res.Applied, Items: res.Items, Bytes: res.Bytes,
		PauseNs: res.Pause.Nanoseconds(), WriteNs: res.Write.Nanoseconds(),
	})
	s.reply(r, out, nil)
}

// maxListItems bounds one page of ItemsRequest.
const maxListItems = 10_000

// maxItemsReplyBytes bounds an items reply, below limits.max_reply_bytes.
// Its items' slices are bounded only by limits.max_slices_per_item each,
// and keys may repeat: without it, one request of 10,000 keys could make
// the service build gigabytes.
const maxItemsReplyBytes = 64 << 20

// itemsGroup is how many keys an items request looks up at a time, so
// that it stops at maxItemsReplyBytes having built little more.
const itemsGroup = 64

// handleItems lists item metadata: the keys asked for, or a page.
func (s *Service) handleItems(r micro.Request) {
	var req wire.ItemsRequest
	if err := proto.Unmarshal(r.Data(), &req); err != nil {
		s.respondStatus(r, protocol.CodeInvalidArgument, fmt.Sprintf("malformed items request: %v", err))
		return
	}
	t, ok := s.tables[req.Table]
	if !ok {
		s.respondStatus(r, protocol.CodeNotFound, fmt.Sprintf("unknown table %q (tables: %s)", req.Table, strings.Join(s.names, ", ")))
		return
	}
	if len(req.Keys) > maxListItems || req.Limit < 0 || req.Limit > maxListItems || req.Offset < 0 {
		s.respondStatus(r, protocol.CodeInvalidArgument, fmt.Sprintf("items request: at most %d keys, limit in [0, %d], offset >= 0", maxListItems, maxListItems))
		return
	}
	// Sized from the items as the table holds them, and encoded from there
	// too: as generated messages, a slice took ten times the bytes it
	// takes in the reply.
	var items []tables.ItemView
	size, most := 0, min(maxItemsReplyBytes, int(s.o.limits.MaxReplyBytes))
	add := func(it tables.ItemView) bool {
		if size += wire.SizeItemInfo(&it); size > most {
			return false
		}
		items = append(items, it)
		return true
	}
	fits := true
	if len(req.Keys) > 0 {
		for keys := req.Keys; len(keys) > 0 && fits; keys = keys[min(len(keys), itemsGroup):] {
			for _, it := range t.View(keys[:min(len(keys), itemsGroup)]...) {
				if fits = add(it); !fits {
					break
				}
			}
		}
	} else if req.Limit > 0 {
		// Taken whole, then sized: its views cost about 100 bytes each,
		// and sizing them holds back nothing of the table's. A walk the
		// table's removals keep losing is refused as unavailable: asking
		// again may work.
		page, err := t.Page(int(min(req.Offset, math.MaxInt32)), int(req.Limit))
		if err != nil {
			s.respondStatus(r, protocol.CodeUnavailable, err.Error())
			return
		}
		for _, it := range page {
			if fits = add(it); !fits {
				break
			}
		}
	}
	if !fits {
		s.respondStatus(r, protocol.CodeResourceExhausted, fmt.Sprintf("table %q: the items asked for take more than %d bytes to describe, past the first %d of them: ask for fewer", req.Table, most, len(items)))
		return
	}
	s.respondParts(r, wire.AppendItemsResponse(nil, t.Size(), items))
}
