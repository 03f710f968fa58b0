package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/tables"
)

// The apply path. A reader pulls the stream in order; prepare workers parse
// each insert and decode its chunks once (the costly, stateless part) in
// parallel; the apply loop takes the prepared messages in stream order and
// is the only writer of table and producer state.

// streamMsg is one stream message on its way to the apply loop. ready is
// closed once a worker has prepared it.
type streamMsg struct {
	subject string
	data    []byte
	seq     uint64
	at      time.Time
	insert  *insertBatch
	err     error // the insert could not be parsed: reject it whole
	ready   chan struct{}
}

// prefetchMessages bounds the messages read ahead of the apply loop (the
// pull's byte bound applies too).
const prefetchMessages = 256

// producerState is what the service keeps per producer: the chunks it
// sent that later items may reference, and where it is in its sequence.
type producerState struct {
	lastSeq  uint64 // every message up to here is applied (or given up)
	lastSeen time.Time
	chunks   map[uint64]chunkHold
	// Messages not yet fully applied: the one being applied, and those
	// that arrived ahead of a gap.
	waiting map[uint64]*insertBatch
	end     bool   // the producer closed, or its chunks were dropped
	notice  string // the notice subject of its latest message
}

// noticeTo is whom a rejection concerns and where it is sent.
type noticeTo struct {
	producer string // the producer's id; empty when not known
	subject  string // its notice subject; empty for none
}

// chunkHold is a producer's hold on a chunk: its size, and its place in
// the order in which holds are released when they exceed their bound.
type chunkHold struct {
	order uint64 // stream sequence << 16 | index in its message
	bytes int64
}

// holdQueue orders every producer's chunk holds by arrival, so that the
// oldest go first when they exceed Limits.MaxHeldChunkBytes. A released
// hold leaves its entry behind; entries are checked against the producer's
// record when they reach the front, and the queue is compacted once stale
// entries outnumber live ones, so its upkeep is O(1) amortised per hold.
type holdQueue struct {
	entries []holdEntry // entries[head:] are the queue
	head    int
	live    int
	bytes   int64
}

type holdEntry struct {
	producer string
	key      uint64
	order    uint64
}

// applyLoop applies the stream until ctx ends or the stream can no longer
// be read. It owns the reader and the prepare workers, and stops them
// before it returns.
func (s *Service) applyLoop(ctx context.Context, reader *streamReader) error {
	rctx, stop := context.WithCancel(ctx)
	s.watcher = &watcher{ctx: rctx, wake: make(chan string, len(s.names))}
	defer func() {
		stop()
		s.watcher.wg.Wait()
	}()
	s.applying = s.progress.get()
	// Items waiting at the checkpoint go in as their limiters allow, and a
	// message a full queue was holding up goes on from where it stopped.
	for _, name := range s.names {
		if s.pending[name].len() > 0 {
			s.drainPending(name)
		}
	}
	for id, ps := range s.stalled {
		if err := s.drain(ctx, id, ps, 0); err != nil {
			return err
		}
	}
	ordered := make(chan *streamMsg, prefetchMessages)
	jobs := make(chan *streamMsg)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	var readErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(ordered)
		defer close(jobs)
		readErr = s.readStream(rctx, reader, ordered, jobs)
	}()
	for range max(1, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range jobs {
				m.insert, m.err = parseInsertBatch(m.data, &s.o.limits)
				close(m.ready)
			}
		}()
	}
	for {
		s.serveCaptures()
		ictx := s.intr.context(ctx)
		if d := s.pace.wait(time.Now()); d > 0 {
			// Paced so that learners keep their pace; captures, the
			// limiters' wake-ups and the end are still served at once.
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case table := <-s.watcher.wake:
				t.Stop()
				s.drainPending(table)
				continue
			case <-ictx.Done():
				t.Stop()
				if ctx.Err() != nil {
					return ctx.Err()
				}
				continue
			}
		}
		var m *streamMsg
		select {
		case m = <-ordered:
		case table := <-s.watcher.wake:
			s.drainPending(table)
			continue
		case <-ictx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue // a capture request: served at the top
		}
		if m == nil {
			return readErr
		}
		select {
		case <-m.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
		s.applying = m.seq
		if err := s.apply(ctx, m); err != nil {
			return err // only ctx ends an apply early
		}
		if m.insert != nil {
			s.pace.took(time.Now(), len(m.insert.items))
		}
		s.progress.set(m.seq)
		s.stats.producers.Store(int64(len(s.producers)))
	}
}

// readStream hands the stream's messages, in order, to the apply loop and
// the inserts among them to the prepare workers. It returns nil when ctx
// ends, or the error that stopped the reader (the connection's close).
func (s *Service) readStream(ctx context.Context, reader *streamReader, ordered, jobs chan<- *streamMsg) error {
	for {
		m, meta, err := reader.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		sm := &streamMsg{subject: m.Subject(), data: m.Data(), seq: meta.Sequence.Stream, at: meta.Timestamp, ready: make(chan struct{})}
		if sm.subject == s.subj.Insert() {
			select {
			case jobs <- sm:
			case <-ctx.Done():
				return nil
			}
		} else {
			close(sm.ready)
		}
		select {
		case ordered <- sm:
		case <-ctx.Done():
			return nil
		}
	}
}

// apply applies one stream message. Bad input is rejected and counted;
// only the end of ctx (while a rate limiter holds an insert) stops it, and
// then the message was not fully applied.
func (s *Service) apply(ctx context.Context, m *streamMsg) error {
	s.stats.messages.Add(1)
	switch m.subject {
	case s.subj.Insert():
		if m.err != nil {
			to, sequence, tomb := refusedBatch(m.data, &s.o.limits)
			s.reject(to, sequence, 0, "", codeOf(m.err), fmt.Sprintf("stream message %d: %v", m.seq, m.err))
			if tomb == nil {
				return nil
			}
			tomb.storedAt = m.at
			return s.applyInsert(ctx, tomb, m.seq)
		}
		m.insert.storedAt, m.insert.raw = m.at, m.data
		return s.applyInsert(ctx, m.insert, m.seq)
	case s.subj.Mutate():
		s.applyMutation(m.data, m.seq)
	case s.subj.Reset():
		s.applyReset(m.data, m.seq)
	default:
		s.reject(noticeTo{}, m.seq, 0, "", protocol.CodeInvalidArgument, fmt.Sprintf("unexpected subject %q", m.subject))
	}
	return nil
}

// codeOf is the status code a rejection for err carries: the engine's
// errors are over a limit or against a signature, or else invalid.
func codeOf(err error) protocol.Code {
	switch {
	case errors.Is(err, tables.ErrTooLarge):
		return protocol.CodeResourceExhausted
	case errors.Is(err, tables.ErrSignature):
		return protocol.CodeSignatureMismatch
	}
	return protocol.CodeOf(err)
}

func (s *Service) applyInsert(ctx context.Context, b *insertBatch, seq uint64) error {
	b.streamSeq = seq
	if err := s.sweep(ctx, b.storedAt); err != nil {
		return err
	}
	ps := s.producers[b.producerID]
	if ps == nil {
		if len(s.producers) >= s.o.limits.MaxProducers {
			s.reject(noticeTo{b.producerID, b.notice}, b.sequence, 0, "", protocol.CodeResourceExhausted,
				fmt.Sprintf("the service tracks %d producers, its limit (limits.max_producers): a new producer is refused until idle ones expire", len(s.producers)))
			return nil
		}
		ps = &producerState{chunks: make(map[uint64]chunkHold)}
		s.producers[b.producerID] = ps
	}
	ps.lastSeen = b.storedAt
	if b.notice != "" {
		ps.notice = b.notice
	}
	if _, waiting := ps.waiting[b.sequence]; waiting || b.sequence <= ps.lastSeq {
		// A resend the stream's dedupe window did not catch.
		s.stats.duplicates.Add(1)
		return nil
	}
	if ps.waiting == nil {
		ps.waiting = make(map[uint64]*insertBatch)
	}
	// Every message goes through the reorder buffer and leaves it only once
	// all its items are applied, so a checkpoint taken while one of them
	// waits for a rate limiter holds the message and how far it got.
	ps.waiting[b.sequence] = b
	s.heldBytes += int64(len(b.raw))
	s.stalled[b.producerID] = ps
	// Every sequence below the message's window start was settled before it
	// was sent: what of them the stream holds has been delivered already.
	if err := s.drain(ctx, b.producerID, ps, b.windowStart-1); err != nil {
		return err
	}
	s.shedHeldMessages()
	return nil
}

// drain applies a producer's held messages in sequence order. It passes a
// gap only below settled: every sequence up to it that will ever arrive has.
func (s *Service) drain(ctx context.Context, id string, ps *producerState, settled uint64) error {
	for len(ps.waiting) > 0 {
		next, ok := ps.waiting[ps.lastSeq+1]
		if !ok {
			lowest := uint64(math.MaxUint64)
			for q := range ps.waiting {
				lowest = min(lowest, q)
			}
			if lowest-1 > settled {
				break
			}
			s.log.Info("reprise service: a producer gave up on messages; going on without them",
				"producer", protocol.NoticeToken(id), "missing_from", ps.lastSeq+1, "missing_to", lowest-1)
			next = ps.waiting[lowest]
			ps.lastSeq = lowest - 1
		}
		if err := s.applyBatch(ctx, id, ps, next); err != nil {
			return err
		}
		delete(ps.waiting, next.sequence)
		s.heldBytes -= int64(len(next.raw))
		ps.lastSeq = next.sequence
	}
	if settled != math.MaxUint64 {
		ps.lastSeq = max(ps.lastSeq, settled)
	}
	if len(ps.waiting) > 0 {
		return nil
	}
	delete(s.stalled, id)
	if ps.end {
		s.dropProducer(id, ps)
	}
	return nil
}

// shedHeldMessages rejects the oldest messages held behind a gap while they
// exceed their bound. A rejected message leaves a tombstone with its chunk
// releases, so its producer's later messages still apply in order.
func (s *Service) shedHeldMessages() {
	for s.heldBytes > s.o.limits.MaxHeldMessageBytes {
		var (
			oldest   *insertBatch
			oldestID string
		)
		for id, ps := range s.stalled {
			for q, b := range ps.waiting {
				if q == ps.lastSeq+1 || len(b.chunks)+len(b.items) == 0 {
					continue // being applied, or nothing to shed
				}
				if oldest == nil || b.streamSeq < oldest.streamSeq {
					oldest, oldestID = b, id
				}
			}
		}
		if oldest == nil {
			return
		}
		s.reject(noticeTo{oldestID, oldest.notice}, oldest.sequence, 0, "", protocol.CodeResourceExhausted,
			fmt.Sprintf("message held behind missing message %d dropped: held messages exceed %d bytes (limits.max_held_message_bytes)",
				s.producers[oldestID].lastSeq+1, s.o.limits.MaxHeldMessageBytes))
		s.heldBytes -= int64(len(oldest.raw))
		oldest.toTombstone()
		s.heldBytes += int64(len(oldest.raw))
	}
}

// sweep runs the service's housekeeping at fixed steps of stream time: it
// gives up on gaps held open longer than gapTimeout, drops the chunks of
// idle producers and forgets expired ones. The step is in checkpoints, so a
// replay after a crash makes the same decisions at the same messages.
func (s *Service) sweep(ctx context.Context, now time.Time) error {
	step := now.Truncate(s.o.gapTimeout / 4)
	if !step.After(s.lastSweep) {
		return nil
	}
	s.lastSweep = step
	for id, ps := range s.stalled {
		for _, b := range ps.waiting {
			if now.Sub(b.storedAt) > s.o.gapTimeout {
				if err := s.drain(ctx, id, ps, math.MaxUint64); err != nil {
					return err
				}
				break
			}
		}
	}
	if s.o.producerIdle <= 0 {
		return nil
	}
	// A record must outlive the stream's dedupe window: a resend arriving
	// after it is recognised only by the record.
	forget := s.o.producerIdle + s.dupWindow
	for id, ps := range s.producers {
		idle := now.Sub(ps.lastSeen)
		switch {
		case len(ps.waiting) > 0:
		case idle > forget && len(ps.chunks) == 0:
			delete(s.producers, id)
		case idle > s.o.producerIdle && len(ps.chunks) > 0:
			s.log.Info("reprise service: dropping the chunks of an idle producer", "producer", protocol.NoticeToken(id), "idle", idle, "held_chunks", len(ps.chunks))
			s.dropProducer(id, ps)
		}
	}
	return nil
}

// applyBatch applies one message of a producer from where it stopped: its
// chunks, its items from b.done on, then its releases. It returns early only
// when ctx ends while a rate limiter holds an item.
func (s *Service) applyBatch(ctx context.Context, id string, ps *producerState, b *insertBatch) error {
	b.appliedAt = time.Now()
	if b.done == 0 {
		s.prefetch(b)
		for i, rc := range b.chunks {
			if rc.err != nil {
				s.reject(noticeTo{id, b.notice}, b.sequence, 0, "", codeOf(rc.err), rc.err.Error())
				continue
			}
			if _, dup := ps.chunks[rc.key]; dup {
				continue
			}
			// The reference the store takes is the producer's hold.
			s.hold(id, ps, rc.key, chunkHold{order: b.streamSeq<<16 | uint64(i), bytes: int64(len(rc.chunk.Data))})
			s.puts = append(s.puts, &b.chunks[i].chunk)
		}
		s.store.PutAll(s.puts)
		clear(s.puts)
		s.puts = s.puts[:0]
		s.shedHeldChunks()
	}
	for ; b.done < len(b.items); b.done++ {
		if err := s.insertItem(ctx, id, b, &b.items[b.done]); err != nil {
			return err
		}
	}
	s.release(ps, b.release)
	ps.end = ps.end || b.end
	return nil
}

// prefetch has the store and the tables read the index slots of a
// message's chunks and items all at once, before applying them one by one:
// in a table of 100,000 items, misses on those slots, one per chunk and
// item in turn, were half the apply loop's time.
func (s *Service) prefetch(b *insertBatch) {
	s.keys = s.keys[:0]
	for i := range b.chunks {
		s.keys = append(s.keys, b.chunks[i].key)
	}
	// The chunks it releases too: as many as it brings, in steady state.
	// Only so many: nothing else bounds a message's release list.
	s.keys = append(s.keys, b.release[:min(len(b.release), s.o.limits.MaxChunksPerMessage)]...)
	if len(s.keys) > 0 {
		s.store.Prefetch(s.keys)
	}
	// By table, in runs: a producer's message usually serves one.
	for i := 0; i < len(b.items); {
		name := b.items[i].table
		s.keys = s.keys[:0]
		for ; i < len(b.items) && b.items[i].table == name; i++ {
			s.keys = append(s.keys, b.items[i].item.Key)
		}
		if t, ok := s.tables[name]; ok {
			t.Prefetch(s.keys)
		}
	}
}

// insertItem inserts an item, or queues it while its table's rate limiter
// holds it. It returns an error only when ctx ended while the table's full
// queue held up the stream.
func (s *Service) insertItem(ctx context.Context, producer string, b *insertBatch, it *preparedItem) error {
	if it.err != nil {
		s.reject(noticeTo{producer, b.notice}, b.sequence, it.item.Key, it.table, codeOf(it.err), it.err.Error())
		return nil
	}
	t, ok := s.tables[it.table]
	if !ok {
		at := noticeAt{seq: s.applying}
		if !s.mayAct() {
			// Withheld, and keyed by the table: an active service whose
			// config has it may queue the item, and publish progress past
			// this message that holds the table below it. That progress
			// does not tell the producer of a refusal that this service
			// must send if it takes over.
			at.table = it.table
		}
		s.rejectAt(at, noticeTo{producer, b.notice}, b.sequence, it.item.Key, it.table, protocol.CodeNotFound, fmt.Sprintf("unknown table %q (tables: %s)", it.table, strings.Join(s.names, ", ")))
		return nil
	}
	if sh := s.o.shard; sh.Count > 0 && it.item.Key%uint64(sh.Count) != uint64(sh.Index) {
		s.reject(noticeTo{producer, b.notice}, b.sequence, it.item.Key, it.table, protocol.CodeInvalidArgument,
			fmt.Sprintf("item key %d belongs to shard %d of %d, and this service is shard %s: write to a sharded table through a sharded producer", it.item.Key, it.item.Key%uint64(sh.Count), sh.Count, sh))
		return nil
	}
	return s.insertNow(ctx, t, it.item, arrival{streamSeq: b.streamSeq, storedAt: b.storedAt, to: noticeTo{producer, b.notice}, sequence: b.sequence, appliedAt: b.appliedAt})
}

// tooLarge names the limit an oversized item is over.
func tooLarge(err error) string {
	if errors.Is(err, tables.ErrTooLarge) {
		return err.Error() + " (limits.max_item_bytes)"
	}
	return err.Error()
}

// hold records a producer's hold on a chunk it sent.
func (s *Service) hold(id string, ps *producerState, key uint64, h chunkHold) {
	ps.chunks[key] = h
	s.holds.entries = append(s.holds.entries, holdEntry{producer: id, key: key, order: h.order})
	s.holds.live++
	s.holds.bytes += h.bytes
}

// release gives back the producer's holds on those of keys it holds, in
// one call to the store: a message releases as many chunks as it brings,
// and taking the store's lock for each was a fifth of applying it.
func (s *Service) release(ps *producerState, keys []uint64) {
	held := s.keys[:0]
	for _, key := range keys {
		if s.forgetHold(ps, key) {
			held = append(held, key)
		}
	}
	if len(held) > 0 {
		s.store.Release(held...)
	}
	s.keys = held[:0]
	if cap(held) > s.o.limits.MaxChunksPerMessage {
		s.keys = nil // a producer's whole history, not a message's worth
	}
	s.maybeCompactHolds()
}

// maybeCompactHolds drops stale entries once they outnumber live ones.
func (s *Service) maybeCompactHolds() {
	if stale := len(s.holds.entries) - s.holds.head - s.holds.live; stale > s.holds.live && stale > 1024 {
		s.compactHolds()
	}
}

// liveHold reports whether e is still its producer's hold.
func (s *Service) liveHold(e holdEntry) bool {
	ps := s.producers[e.producer]
	if ps == nil {
		return false
	}
	h, ok := ps.chunks[e.key]
	return ok && h.order == e.order
}

func (s *Service) compactHolds() {
	kept := s.holds.entries[:0]
	for _, e := range s.holds.entries[s.holds.head:] {
		if s.liveHold(e) {
			kept = append(kept, e)
		}
	}
	clear(s.holds.entries[len(kept):])
	s.holds.entries, s.holds.head = kept, 0
}

// shedHeldChunks releases the oldest chunk holds while they exceed their
// bound, telling each producer which of its chunks it lost.
func (s *Service) shedHeldChunks() {
	q := &s.holds
	for ; q.head < len(q.entries) && q.bytes > s.o.limits.MaxHeldChunkBytes; q.head++ {
		e := q.entries[q.head]
		q.entries[q.head] = holdEntry{}
		if !s.liveHold(e) {
			continue
		}
		ps := s.producers[e.producer]
		s.unholdQuiet(ps, e.key)
		s.reject(noticeTo{e.producer, ps.notice}, 0, 0, "", protocol.CodeResourceExhausted,
			fmt.Sprintf("chunk %d released: producers hold more than %d bytes of chunks (limits.max_held_chunk_bytes); later items that reference it are rejected", e.key, s.o.limits.MaxHeldChunkBytes))
	}
	s.maybeCompactHolds()
}

// unholdQuiet gives back one hold without compaction, for callers walking
// the queue.
func (s *Service) unholdQuiet(ps *producerState, key uint64) {
	if s.forgetHold(ps, key) {
		s.store.Release(key)
	}
}

// forgetHold drops the producer's hold on key from the books, reporting
// whether it had one; the caller releases the chunk in the store.
func (s *Service) forgetHold(ps *producerState, key uint64) bool {
	h, ok := ps.chunks[key]
	if !ok {
		return false
	}
	delete(ps.chunks, key)
	s.holds.live--
	s.holds.bytes -= h.bytes
	return true
}

// dropProducer releases the chunks a producer holds. Its sequence is kept
// (until sweep forgets it), so a late copy of one of its messages is still
// recognised.
func (s *Service) dropProducer(id string, ps *producerState) {
	for key := range ps.chunks {
		s.unholdQuiet(ps, key)
	}
	ps.end = true
	s.maybeCompactHolds()
}

func (s *Service) applyMutation(data []byte, seq uint64) {
	var m wire.Mutation
	if err := proto.Unmarshal(data, &m); err != nil {
		s.reject(noticeTo{}, seq, 0, "", protocol.CodeInvalidArgument, fmt.Sprintf("malformed mutation: %v", err))
		return
	}
	// Refused whole, as an insert batch with such a subject is: nobody
	// could be told what became of it.
	if err := checkNoticeSubject("mutation", m.NoticeSubject); err != nil {
		s.reject(noticeTo{}, seq, 0, m.Table, protocol.CodeInvalidArgument, err.Error())
		return
	}
	to := noticeTo{subject: m.NoticeSubject}
	t, ok := s.tables[m.Table]
	if !ok {
		s.reject(to, seq, 0, m.Table, protocol.CodeNotFound, fmt.Sprintf("mutation for unknown table %q (tables: %s)", m.Table, strings.Join(s.names, ", ")))
		return
	}
	if len(m.Ops) > s.o.limits.MaxMutationOps {
		s.reject(to, seq, 0, m.Table, protocol.CodeResourceExhausted, fmt.Sprintf("mutation of %d ops, over the limit of %d (limits.max_mutation_ops)", len(m.Ops), s.o.limits.MaxMutationOps))
		return
	}
	muts := make([]tables.Mutation, len(m.Ops))
	for i, op := range m.Ops {
		muts[i] = tables.Mutation{Key: op.Key, Priority: op.Priority, Delete: op.Delete}
	}
	missing, err := t.Mutate(muts)
	if err != nil {
		s.reject(to, seq, 0, m.Table, protocol.CodeInvalidArgument, err.Error())
		return
	}
	// Items still waiting for the table's limiter were inserted before the
	// mutation: it applies to them too.
	queued := s.mutatePending(m.Table, muts)
	for _, key := range missing {
		if !queued[key] {
			s.stats.missing.Add(1)
		}
	}
	if m.PolicyVersion != 0 && t.SetPolicyVersion(m.PolicyVersion) {
		s.dropStalePending(m.Table, t)
	}
	if m.MaxStaleness != nil {
		var bound *int64
		if k := m.GetMaxStaleness(); k >= 0 {
			bound = &k
		}
		if err := t.ReconfigureStaleness(bound); err != nil {
			s.reject(to, seq, 0, m.Table, protocol.CodeInvalidArgument, err.Error())
			return
		}
		s.dropStalePending(m.Table, t)
	}
}

func (s *Service) applyReset(data []byte, seq uint64) {
	var r wire.ResetRequest
	if err := proto.Unmarshal(data, &r); err != nil {
		s.reject(noticeTo{}, seq, 0, "", protocol.CodeInvalidArgument, fmt.Sprintf("malformed reset: %v", err))
		return
	}
	if r.Table == "" {
		for name, t := range s.tables {
			s.resetTable(name, t)
		}
		return
	}
	t, ok := s.tables[r.Table]
	if !ok {
		s.reject(noticeTo{}, seq, 0, r.Table, protocol.CodeNotFound, fmt.Sprintf("reset of unknown table %q", r.Table))
		return
	}
	s.resetTable(r.Table, t)
}

func (s *Service) resetTable(name string, t *tables.Table) {
	t.Reset()
	s.resetPending(name)
	// Resets apply in order: a reset found ahead is this one or a later one.
	delete(s.resetAhead, name)
}

// reject counts, logs (rate-limited) and, when the producer gave a notice
// subject, tells it what was refused.
func (s *Service) reject(to noticeTo, seq, itemKey uint64, table string, code protocol.Code, msg string) {
	s.rejectAt(noticeAt{seq: s.applying}, to, seq, itemKey, table, code, msg)
}

// rejectAt is reject for a notice that progress covers as at says.
func (s *Service) rejectAt(at noticeAt, to noticeTo, seq, itemKey uint64, table string, code protocol.Code, msg string) {
	s.stats.rejected.Add(1)
	if s.o.observer != nil {
		s.o.observer.Rejected(table, code)
	}
	token := ""
	if to.producer != "" {
		token = protocol.NoticeToken(to.producer)
	}
	if s.rejectLog.allow() {
		s.log.Warn("reprise service: rejected", "producer", token, "sequence", seq, "item", itemKey, "table", table, "code", code.String(), "reason", msg)
	}
	// A notice subject under the prefix would put the notice on the
	// service's own subjects: only a hostile producer names one.
	if to.subject == "" || s.subj.Owns(to.subject) {
		return
	}
	data, _ := proto.Marshal(&wire.Rejection{Producer: token, Sequence: seq, ItemKey: itemKey, Table: table, Code: wire.Code(code), Message: msg})
	if !s.mayAct() {
		// A standby tells no one while the active service sends the same
		// notice. But producers and clients take progress past their
		// message with no notice before it as applied in full, and the
		// active service may never apply it (it died first, or this one
		// only paused): the notice goes out before this service's next
		// progress, if it acts again, unless another service's progress
		// covered the message by then (it sent the notice).
		s.withheld.add(at, to.subject, data)
		return
	}
	// Best effort: the count and the log line are the record.
	_ = s.nc.Publish(to.subject, data)
}

// maxWithheldNotices bounds the notices a service that may not act keeps
// to send once it may: a standby applies the stream for as long as it
// waits, and only the last few can concern a message still waited for.
const maxWithheldNotices = 1024

// noticeAt is what progress must cover for a notice to have been sent by
// the service that published it: the stream sequence seq, or, for an item
// refused as it left its table's queue (long after its message was
// applied, and after progress that held the table below it), seq in
// table's progress, seq being the message applied when it joined the
// queue.
type noticeAt struct {
	seq   uint64
	table string
}

// withheldNotices are the notices made while the service could not act, in
// the order made, each with what progress covers it (at).
type withheldNotices struct {
	mu   sync.Mutex
	at   []noticeAt
	msgs []*nats.Msg
}

func (w *withheldNotices) add(at noticeAt, subject string, data []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.msgs) >= maxWithheldNotices {
		w.msgs[0] = nil
		w.at, w.msgs = w.at[1:], w.msgs[1:]
	}
	w.at = append(w.at, at)
	w.msgs = append(w.msgs, &nats.Msg{Subject: subject, Data: data})
}

// send publishes on nc the withheld notices that progress has not covered
// (the service that published it sent the others), and forgets them all.
func (w *withheldNotices) send(nc *nats.Conn, covered func(noticeAt) bool) {
	w.mu.Lock()
	at, msgs := w.at, w.msgs
	w.at, w.msgs = nil, nil
	w.mu.Unlock()
	for i, m := range msgs {
		if !covered(at[i]) {
			_ = nc.PublishMsg(m) // best effort, as every notice
		}
	}
}
