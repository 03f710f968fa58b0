package service

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
	"github.com/reprise-rl/reprise/broker/wire"
	"github.com/reprise-rl/reprise/limiter"
	"github.com/reprise-rl/reprise/tables"
)

// errNotActive: the service does not hold the lease (WithStandby).
var errNotActive = fmt.Errorf("%w: not the active service of the prefix (standby)", protocol.ErrServer)

// ErrCorruptCheckpoint is returned for a checkpoint that does not decode or
// whose checksum does not match.
var ErrCorruptCheckpoint = errors.New("broker: corrupt checkpoint")

const checkpointVersion = 1

// CheckpointResult describes a written checkpoint.
type CheckpointResult struct {
	Name string
	// Applied is the last stream sequence the checkpoint covers.
	Applied uint64
	Items   int64
	Bytes   int64
	// Pause is how long the apply loop stopped (and each table's lock was
	// held, table by table) to copy the state; Write is how long encoding
	// and storing took, while everything else went on.
	Pause time.Duration
	Write time.Duration
}

// RecoveryResult describes what the service loaded at start.
type RecoveryResult struct {
	// Checkpoint is the name of the checkpoint loaded; empty when none was.
	Checkpoint string
	Applied    uint64
	Items      int64
	Chunks     int
	// Skipped lists checkpoints that could not be used, with the reason.
	Skipped  []string
	Duration time.Duration
	// kept are the skipped checkpoints not found damaged: a cause outside
	// them (the store, the tables' config) may have failed them, and the
	// stream may no longer hold what they cover.
	kept []keptCheckpoint
	// streamCreated is when the stream the loaded checkpoint numbers was
	// created; zero when unknown.
	streamCreated time.Time
}

// keptCheckpoint is a checkpoint recovery skipped but did not delete.
type keptCheckpoint struct {
	applied uint64 // the last stream sequence it holds
	why     string // its name and the error that skipped it
}

// checkpointLoadPatience is how long recovery waits for one checkpoint
// that the store does not give in time before it skips it: a bucket
// elects its leader in seconds, and an object whose parts are gone times
// out whenever it is read. A variable, so that tests wait less.
var checkpointLoadPatience = 2 * time.Minute

// captured is the state copied on the apply goroutine. It is immutable, so
// encoding and writing it can happen anywhere.
type captured struct {
	applied   uint64
	created   time.Time
	stream    time.Time // when the stream applied numbers was created
	lastSweep time.Time
	tables    []tables.TableSnapshot
	chunks    []*tables.Chunk
	producers []*wire.ProducerCheckpoint
	pending   []*wire.PendingItem
	pause     time.Duration
}

// interrupter lets other goroutines ask the apply loop for a capture: the
// loop serves requests between messages, and a request cancels whatever
// the loop is waiting on (the next message, or an insert the rate limiter
// holds) so that it is served promptly.
type interrupter struct {
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
	reqs   []chan *captured
}

// context returns the context for the apply loop's waits: parent, cancelled
// by the next capture request. It is made anew only after a request
// cancelled the previous one, so waits that are not interrupted cost no
// allocation.
func (in *interrupter) context(parent context.Context) context.Context {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.ctx == nil || in.ctx.Err() != nil {
		in.ctx, in.cancel = context.WithCancel(parent)
		if len(in.reqs) > 0 {
			in.cancel()
		}
	}
	return in.ctx
}

// interrupted reports whether a wait on ictx ended for a capture request
// rather than for the end of parent.
func interrupted(parent, ictx context.Context) bool {
	return ictx.Err() != nil && parent.Err() == nil
}

func (in *interrupter) request() <-chan *captured {
	ch := make(chan *captured, 1)
	in.mu.Lock()
	in.reqs = append(in.reqs, ch)
	if in.cancel != nil {
		in.cancel()
	}
	in.mu.Unlock()
	return ch
}

func (in *interrupter) take() []chan *captured {
	in.mu.Lock()
	defer in.mu.Unlock()
	reqs := in.reqs
	in.reqs = nil
	return reqs
}

// serveCaptures answers pending capture requests; apply goroutine only.
func (s *Service) serveCaptures() {
	reqs := s.intr.take()
	if len(reqs) == 0 {
		return
	}
	c := s.capture()
	for _, ch := range reqs {
		ch <- c
	}
}

// capture copies the service's state; apply goroutine only (or after the
// apply loop stopped). Every message up to the applied sequence is in it,
// and so is every message not fully applied yet (the one whose insert a rate
// limiter holds, with how many of its items are in, and those held back by
// a gap in their producer's sequence): recovery applies their rest, and
// skips their stream copies as duplicates.
func (s *Service) capture() *captured {
	start := time.Now()
	c := &captured{applied: s.progress.get(), created: start, stream: s.streamCreated, lastSweep: s.lastSweep}
	seen := make(map[uint64]struct{})
	for _, name := range s.names {
		snap := s.tables[name].Snapshot()
		c.tables = append(c.tables, snap)
		for _, ch := range snap.Chunks {
			if _, dup := seen[ch.Key]; !dup {
				seen[ch.Key] = struct{}{}
				c.chunks = append(c.chunks, ch)
			}
		}
	}
	for id, ps := range s.producers {
		pc := &wire.ProducerCheckpoint{Id: id, LastSequence: ps.lastSeq, LastSeenUnixNano: ps.lastSeen.UnixNano(), End: ps.end, NoticeSubject: ps.notice}
		keys := make([]uint64, 0, len(ps.chunks))
		for key := range ps.chunks {
			keys = append(keys, key)
			if _, dup := seen[key]; dup {
				continue
			}
			if ch, ok := s.store.Get(key); ok {
				seen[key] = struct{}{}
				c.chunks = append(c.chunks, ch)
			}
		}
		slices.Sort(keys)
		pc.ChunkKeys = keys
		pc.ChunkOrders = make([]uint64, len(keys))
		for i, k := range keys {
			pc.ChunkOrders[i] = ps.chunks[k].order
		}
		held := make([]*insertBatch, 0, len(ps.waiting))
		for _, b := range ps.waiting {
			held = append(held, b)
		}
		slices.SortFunc(held, func(a, b *insertBatch) int { return cmp.Compare(a.sequence, b.sequence) })
		for _, b := range held {
			pc.Held = append(pc.Held, &wire.HeldMessage{Data: b.raw, StoredAtUnixNano: b.storedAt.UnixNano(), ItemsApplied: int32(b.done)})
		}
		c.producers = append(c.producers, pc)
	}
	slices.SortFunc(c.producers, func(a, b *wire.ProducerCheckpoint) int { return cmp.Compare(a.Id, b.Id) })
	for _, name := range s.names {
		q := s.pending[name]
		for _, p := range q.items[q.head:] {
			if p.dropped {
				continue
			}
			c.pending = append(c.pending, &wire.PendingItem{
				Item:           &wire.Item{Key: p.item.Key, Table: name, Priority: p.item.Priority, Columns: wire.FromTableColumns(p.item.Trajectory), PolicyVersion: p.item.PolicyVersion},
				StreamSequence: p.streamSeq, StoredAtUnixNano: p.storedAt.UnixNano(),
				ProducerId: p.to.producer, Sequence: p.sequence, NoticeSubject: p.to.subject,
			})
			for _, key := range p.chunks {
				if _, dup := seen[key]; dup {
					continue
				}
				if ch, ok := s.store.Get(key); ok {
					seen[key] = struct{}{}
					c.chunks = append(c.chunks, ch)
				}
			}
		}
	}
	c.pause = time.Since(start)
	return c
}

func (c *captured) items() int64 {
	var n int64
	for _, t := range c.tables {
		n += int64(len(t.Items))
	}
	return n
}

// encode lays out the checkpoint file: a CheckpointFile whose field 1 is
// the encoded Checkpoint and field 2 its SHA-256. The Checkpoint is made of
// pieces the reader hands out in turn, the chunks as they are stored: a
// checkpoint is mostly the tables' chunks, and encoding it into one message,
// then into the file's, made two copies of all of them, which a large table
// may not have the memory for. The pieces' order is not the generated
// code's, which decoding does not care about.
func (c *captured) encode() (*checkpointReader, error) {
	head := &wire.Checkpoint{
		Version:         checkpointVersion,
		AppliedSequence: c.applied,
		CreatedUnixNano: c.created.UnixNano(),
		Producers:       c.producers,
		Pending:         c.pending,
	}
	if !c.lastSweep.IsZero() {
		head.LastSweepUnixNano = c.lastSweep.UnixNano()
	}
	if !c.stream.IsZero() {
		head.StreamCreatedUnixNano = c.stream.UnixNano()
	}
	r := &checkpointReader{chunks: c.chunks, hash: sha256.New()}
	var err error
	if r.head, err = proto.Marshal(head); err != nil {
		return nil, fmt.Errorf("broker: encoding checkpoint: %w", err)
	}
	for _, t := range c.tables {
		tc := &wire.TableCheckpoint{Items: make([]*wire.ItemCheckpoint, len(t.Items)), PolicyVersion: t.PolicyVersion}
		if tc.ConfigJson, err = json.Marshal(t.Config); err != nil {
			return nil, fmt.Errorf("broker: encoding table %q config: %w", t.Config.Name, err)
		}
		if tc.LimiterJson, err = json.Marshal(t.Limiter); err != nil {
			return nil, fmt.Errorf("broker: encoding table %q limiter: %w", t.Config.Name, err)
		}
		if tc.CountersJson, err = json.Marshal(t.Counters); err != nil {
			return nil, fmt.Errorf("broker: encoding table %q counters: %w", t.Config.Name, err)
		}
		for i, it := range t.Items {
			tc.Items[i] = &wire.ItemCheckpoint{
				Key: it.Key, Priority: it.Priority, TimesSampled: it.TimesSampled,
				InsertedAtUnixNano: it.InsertedAt.UnixNano(), Seq: it.Seq, Columns: wire.FromTableColumns(it.Trajectory),
				PolicyVersion: it.PolicyVersion,
			}
		}
		// The field's length prefix needs the table's size first; the
		// marshal then reuses the sizes that computed, rather than walk
		// every item again.
		b := protowire.AppendTag(nil, fieldCheckpointTables, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(proto.Size(tc)))
		if b, err = (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(b, tc); err != nil {
			return nil, fmt.Errorf("broker: encoding table %q: %w", t.Config.Name, err)
		}
		r.tables = append(r.tables, b)
	}
	inner := len(r.head)
	for _, b := range r.tables {
		inner += len(b)
	}
	for _, ch := range c.chunks {
		inner += 1 + protowire.SizeBytes(len(ch.Data))
	}
	r.fileHead = protowire.AppendVarint(protowire.AppendTag(nil, fieldFileCheckpoint, protowire.BytesType), uint64(inner))
	r.size = int64(len(r.fileHead)+inner) + 1 + int64(protowire.SizeBytes(sha256.Size))
	return r, nil
}

// The fields encode writes by hand (reprise.proto: Checkpoint.tables,
// Checkpoint.chunks, CheckpointFile.checkpoint and .sha256).
const (
	fieldCheckpointTables = 4
	fieldCheckpointChunks = 5
	fieldFileCheckpoint   = 1
	fieldFileSHA256       = 2
)

// checkpointReader reads out a checkpoint file that encode laid out: the
// file's field 1 header, the Checkpoint's pieces (hashed as they go), then
// field 2, the hash.
type checkpointReader struct {
	size     int64
	fileHead []byte
	head     []byte
	tables   [][]byte
	chunks   []*tables.Chunk
	hash     hash.Hash

	stage   int
	cur     []byte // what is left of the current piece
	hashed  bool   // whether cur is part of the Checkpoint
	next    int    // the next chunk or table
	inData  bool   // cur is a chunk's data, after its header
	chunkAt [binary.MaxVarintLen64 + 1]byte
}

// Size is the file's length in bytes.
func (r *checkpointReader) Size() int64 { return r.size }

// Read fills p as far as the checkpoint goes. nats.go's object store keeps
// each Read as one message of the object: reading a piece at a time (a
// chunk's header, then its data) stored two messages a chunk, 130 times as
// many as its chunk size asks, and the server's buffers for them swung the
// embedded server's memory by hundreds of MB.
func (r *checkpointReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(r.cur) == 0 {
			if !r.advance() {
				break
			}
			continue
		}
		m := copy(p[n:], r.cur)
		if r.hashed {
			r.hash.Write(r.cur[:m])
		}
		r.cur = r.cur[m:]
		n += m
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

// advance moves to the next piece; false at the end.
func (r *checkpointReader) advance() bool {
	const (
		fileHead = iota
		head
		chunks
		tableFields
		sum
		end
	)
	r.hashed = true
	switch r.stage {
	case fileHead:
		r.cur, r.hashed, r.stage = r.fileHead, false, head
	case head:
		r.cur, r.stage = r.head, chunks
	case chunks:
		if r.next == len(r.chunks) {
			r.next, r.stage = 0, tableFields
			return r.advance()
		}
		data := r.chunks[r.next].Data
		if r.inData {
			r.cur, r.inData = data, false
			r.next++
			return true
		}
		b := protowire.AppendTag(r.chunkAt[:0], fieldCheckpointChunks, protowire.BytesType)
		r.cur, r.inData = protowire.AppendVarint(b, uint64(len(data))), true
	case tableFields:
		if r.next == len(r.tables) {
			r.stage = sum
			return r.advance()
		}
		r.cur = r.tables[r.next]
		r.next++
	case sum:
		b := protowire.AppendTag(nil, fieldFileSHA256, protowire.BytesType)
		r.cur, r.hashed, r.stage = protowire.AppendBytes(b, r.hash.Sum(nil)), false, end
	default:
		return false
	}
	return true
}

// Checkpoint writes a checkpoint now and trims the stream below the oldest
// checkpoint still kept. Inserts and samples go on while it is encoded and
// written; they stop only while the state is copied (Pause).
func (s *Service) Checkpoint(ctx context.Context) (CheckpointResult, error) {
	if s.o.checkpoints == nil {
		return CheckpointResult{}, fmt.Errorf("%w: no checkpoint store configured", protocol.ErrServer)
	}
	var c *captured
	select {
	case c = <-s.intr.request():
	case <-s.applyDone:
		return CheckpointResult{}, fmt.Errorf("%w: service stopped", protocol.ErrClosed)
	case <-ctx.Done():
		return CheckpointResult{}, fmt.Errorf("broker: waiting for the apply loop to copy the state: %w", ctx.Err())
	}
	return s.write(ctx, c)
}

// write encodes and stores a capture, then drops old checkpoints and trims
// the stream. Writes happen one at a time, in capture order.
func (s *Service) write(ctx context.Context, c *captured) (CheckpointResult, error) {
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	start := time.Now()
	res := CheckpointResult{Name: checkpointName(s.epoch.Load(), c.applied), Applied: c.applied, Items: c.items(), Pause: c.pause}
	if res.Name < s.lastName {
		return res, fmt.Errorf("%w: a newer checkpoint (%s) is already written", protocol.ErrServer, s.lastName)
	}
	if s.missedTrim.Load() {
		// Its tables lack what a checkpoint holds: written, this one would
		// be the newest, and recovery would load it instead.
		return res, fmt.Errorf("%w: the tables lack stream messages that were trimmed below a checkpoint; the service is stopping to recover from it", protocol.ErrServer)
	}
	file, err := c.encode()
	if err != nil {
		return res, err
	}
	res.Bytes = file.Size()
	if err := s.save(ctx, res.Name, c, file); err != nil {
		return res, err
	}
	s.lastCheckpoint, s.lastName = c.applied, res.Name
	if s.lease != nil {
		s.lease.checkpoint.Store(&res.Name) // named by the lease's next renewal
	}
	res.Write = time.Since(start)
	s.log.Info("reprise service: checkpoint written", "name", res.Name, "applied", res.Applied, "items", res.Items,
		"bytes", res.Bytes, "pause", res.Pause, "write", res.Write)
	if err := s.trim(ctx); err != nil {
		s.log.Warn("reprise service: trimming after checkpoint", "error", err)
	}
	return res, nil
}

// checkpointStalls bounds how many times a checkpoint is written again
// after the store gave up on a server that acknowledged too slowly.
const checkpointStalls = 8

// save stores what encode made of c. nats.go's object store gives up a
// write once the server has left 4000 of its messages unacknowledged for
// 200 ms, which a starved machine does: the checkpoint written at shutdown
// failed so, and reprised exited 1. The capture is still whole, so it is
// encoded and written again after a growing pause (the store purged the
// failed write's part).
func (s *Service) save(ctx context.Context, name string, c *captured, file *checkpointReader) error {
	wait := 100 * time.Millisecond
	for stalls := 0; ; stalls++ {
		// Checked as late as possible; a write that a pause delays past the
		// lease's end carries the former epoch, which recovery ranks lower.
		if !s.mayAct() {
			return errNotActive
		}
		err := s.o.checkpoints.Save(ctx, name, file)
		if err == nil || !errors.Is(err, jetstream.ErrTooManyStalledMsgs) || stalls == checkpointStalls {
			return err
		}
		s.log.Warn("reprise service: the checkpoint's write stalled; writing it again", "name", name, "stalls", stalls+1, "error", err)
		if !pause(ctx, wait) {
			return err
		}
		wait = min(2*wait, time.Second)
		// The failed write's reader holds every table's encoded items:
		// let it go before the next one is encoded.
		file = nil
		if file, err = c.encode(); err != nil {
			return err
		}
	}
}

// trim keeps the newest checkpointKeep checkpoints and purges the stream
// below what the oldest of them needs: if the newest turns out unreadable,
// recovery falls back to an older one and still finds the stream it needs.
func (s *Service) trim(ctx context.Context) error {
	all, err := s.o.checkpoints.List(ctx)
	if err != nil {
		return err
	}
	// Only checkpoints this service wrote or could load count: anything
	// newer was skipped as unusable.
	var names []string
	for _, name := range all {
		if name <= s.lastName {
			names = append(names, name)
		}
	}
	if len(names) == 0 || !s.mayAct() {
		return nil
	}
	if len(names) > s.o.checkpointKeep {
		for _, name := range names[:len(names)-s.o.checkpointKeep] {
			if err := s.o.checkpoints.Delete(ctx, name); err != nil {
				return err
			}
		}
		names = names[len(names)-s.o.checkpointKeep:]
	}
	// A newer epoch's checkpoint may cover less of the stream than an
	// older one's: what every kept one needs stays.
	oldest := uint64(math.MaxUint64)
	for _, name := range names {
		_, applied, ok := parseCheckpointName(name)
		if !ok {
			return fmt.Errorf("checkpoint name %q: not one reprise writes", name)
		}
		oldest = min(oldest, applied)
	}
	if s.stream == nil || oldest == 0 || !s.mayAct() {
		return nil
	}
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSequence(oldest+1)); err != nil {
		return fmt.Errorf("purging stream below %d: %w", oldest+1, err)
	}
	return nil
}

// recover loads the newest usable checkpoint, skipping damaged ones with a
// log line each. With no usable checkpoint the service starts empty and
// replays the whole stream.
func (s *Service) recover(ctx context.Context) (RecoveryResult, error) {
	start := time.Now()
	var res RecoveryResult
	names, err := s.listForRecovery(ctx)
	if err != nil {
		return res, err
	}
	for i := len(names) - 1; i >= 0; i-- {
		name := names[i]
		// A store that cannot answer in time (a bucket electing its leader)
		// is waited for: the checkpoint is fine, and the stream may hold
		// nothing older.
		var cp *wire.Checkpoint
		began := time.Now()
		err := retryJS(ctx, s.log, "checkpoint "+name, func(ctx context.Context) error {
			var err error
			if cp, err = s.loadCheckpoint(ctx, name); err != nil && time.Since(began) >= checkpointLoadPatience {
				// Not wrapped, so that retryJS takes it as final.
				return fmt.Errorf("no answer in %v: %v", checkpointLoadPatience, err)
			}
			return err
		})
		if err == nil {
			err = s.restore(cp)
		}
		if err != nil {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			s.log.Error("reprise service: skipping unusable checkpoint, trying the previous one", "name", name, "error", err)
			res.Skipped = append(res.Skipped, fmt.Sprintf("%s: %v", name, err))
			// A damaged one would be tried first at every start, and would
			// count among the kept ones when trimming.
			if errors.Is(err, ErrCorruptCheckpoint) {
				s.damaged[name] = true
				if err := s.o.checkpoints.Delete(ctx, name); err != nil {
					s.log.Warn("reprise service: deleting damaged checkpoint", "name", name, "error", err)
				}
			} else if _, applied, ok := parseCheckpointName(name); ok {
				res.kept = append(res.kept, keptCheckpoint{applied: applied, why: res.Skipped[len(res.Skipped)-1]})
			}
			continue
		}
		res.Checkpoint, res.Applied, res.Chunks = name, cp.AppliedSequence, s.store.Len()
		if cp.StreamCreatedUnixNano != 0 {
			res.streamCreated = time.Unix(0, cp.StreamCreatedUnixNano)
		}
		for _, t := range cp.Tables {
			res.Items += int64(len(t.Items))
		}
		s.lastCheckpoint, s.lastName = cp.AppliedSequence, name
		break
	}
	// Without standby, checkpoints go on in the newest epoch, so that they
	// sort after those of a former standby deployment.
	for _, name := range names {
		if e, _, ok := parseCheckpointName(name); ok && e > s.epoch.Load() {
			s.epoch.Store(e)
		}
	}
	res.Duration = time.Since(start)
	return res, nil
}

func (s *Service) loadCheckpoint(ctx context.Context, name string) (*wire.Checkpoint, error) {
	r, err := s.o.checkpoints.Load(ctx, name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cp, err := readCheckpoint(r)
	if err != nil && !errors.Is(err, ErrCorruptCheckpoint) {
		return nil, fmt.Errorf("broker: loading checkpoint %s: %w", name, err)
	}
	return cp, err
}

// listForRecovery lists the checkpoints, trying again while the store
// cannot answer in time (a cluster electing the bucket's leader): at
// start, and when a gap in the stream asks whether one holds what is gone.
func (s *Service) listForRecovery(ctx context.Context) ([]string, error) {
	var names []string
	err := retryJS(ctx, s.log, "the checkpoint store's list", func(ctx context.Context) error {
		var err error
		names, err = s.o.checkpoints.List(ctx)
		return err
	})
	return names, err
}

// restore replaces the service's state with a checkpoint's. On error the
// state is unchanged.
func (s *Service) restore(cp *wire.Checkpoint) error {
	store := tables.NewChunkStore()
	keys := make([]uint64, 0, len(cp.Chunks))
	var chunks chunkParser
	for i, raw := range cp.Chunks {
		c, _, err := chunks.parse(raw)
		if err != nil {
			return fmt.Errorf("chunk %d: %w", i, err)
		}
		store.Put(&c)
		keys = append(keys, c.Key)
	}
	// The references Put took are only needed while the tables and
	// producers take theirs.
	defer store.Release(keys...)

	restored := make(map[string]*tables.Table, len(s.configs))
	fail := func(err error) error {
		for _, t := range restored {
			t.Close()
			t.Reset()
		}
		return err
	}
	for _, tc := range cp.Tables {
		var snap tables.TableSnapshot
		if err := json.Unmarshal(tc.ConfigJson, &snap.Config); err != nil {
			return fail(fmt.Errorf("table config: %w", err))
		}
		name := snap.Config.Name
		if err := json.Unmarshal(tc.LimiterJson, &snap.Limiter); err != nil {
			return fail(fmt.Errorf("table %q limiter: %w", name, err))
		}
		if err := json.Unmarshal(tc.CountersJson, &snap.Counters); err != nil {
			return fail(fmt.Errorf("table %q counters: %w", name, err))
		}
		want, ok := s.configs[name]
		if !ok {
			s.log.Warn("reprise service: the checkpoint has a table the config no longer defines; its items are not restored (add the table back to the config to keep them)",
				"table", name, "items", len(tc.Items))
			continue
		}
		if err := snap.Config.Limiter.Validate(); err != nil {
			// A checkpoint of an earlier release may hold a rate limiter
			// this one refuses (one that can stall its table for good):
			// the config file's, which wins on restore anyway, takes its
			// place rather than the table being lost.
			s.log.Warn("reprise service: the checkpoint's rate limiter is refused; the config file's takes its place", "table", name, "error", err)
			// Its counters were counted under the refused one: read under
			// the config's ratio as they are, a long history would hold
			// one side off until the other made up for all of it.
			snap.Limiter.Config = snap.Config.Limiter
			snap.Limiter = snap.Limiter.Rebased(want.Limiter)
			snap.Config.Limiter = want.Limiter
		}
		snap.Items = make([]tables.ItemSnapshot, len(tc.Items))
		for i, it := range tc.Items {
			snap.Items[i] = tables.ItemSnapshot{
				Key: it.Key, Priority: it.Priority, TimesSampled: it.TimesSampled,
				InsertedAt: time.Unix(0, it.InsertedAtUnixNano), Seq: it.Seq, Trajectory: wire.ToTableColumns(it.Columns),
				PolicyVersion: it.PolicyVersion,
			}
		}
		snap.PolicyVersion = tc.PolicyVersion
		t, err := tables.NewFromSnapshot(snap, store, s.o.tableOptions...)
		if err != nil {
			return fail(fmt.Errorf("table %q: %w", name, err))
		}
		restored[name] = t
		s.reconcile(t, snap.Config, want)
	}
	for name, cfg := range s.configs {
		if _, ok := restored[name]; ok {
			continue
		}
		t, err := tables.New(cfg, store, s.o.tableOptions...)
		if err != nil {
			return fail(err)
		}
		restored[name] = t
		s.log.Info("reprise service: table not in the checkpoint starts empty", "table", name)
	}
	producers := make(map[string]*producerState, len(cp.Producers))
	stalled := make(map[string]*producerState)
	var (
		holds          []holdEntry
		heldChunkBytes int64
		heldBytes      int64
	)
	for _, pc := range cp.Producers {
		ps := &producerState{lastSeq: pc.LastSequence, lastSeen: time.Unix(0, pc.LastSeenUnixNano), end: pc.End, notice: pc.NoticeSubject, chunks: make(map[uint64]chunkHold, len(pc.ChunkKeys))}
		if len(pc.ChunkOrders) != len(pc.ChunkKeys) {
			return fail(fmt.Errorf("producer %s: %d chunk orders for %d chunks", protocol.NoticeToken(pc.Id), len(pc.ChunkOrders), len(pc.ChunkKeys)))
		}
		if err := store.Retain(pc.ChunkKeys...); err != nil {
			return fail(fmt.Errorf("producer %s: %w", protocol.NoticeToken(pc.Id), err))
		}
		for i, k := range pc.ChunkKeys {
			ch, _ := store.Get(k)
			h := chunkHold{order: pc.ChunkOrders[i], bytes: int64(len(ch.Data))}
			ps.chunks[k] = h
			holds = append(holds, holdEntry{producer: pc.Id, key: k, order: h.order})
			heldChunkBytes += h.bytes
		}
		for _, h := range pc.Held {
			b, err := parseInsertBatch(h.Data, &s.o.limits)
			if err != nil {
				// Accepted when it arrived: the limits have changed since.
				s.log.Error("reprise service: a message held in the checkpoint is now refused; it is dropped", "producer", protocol.NoticeToken(pc.Id), "error", err)
				continue
			}
			b.raw, b.storedAt = h.Data, time.Unix(0, h.StoredAtUnixNano)
			if h.ItemsApplied < 0 || int(h.ItemsApplied) > len(b.items) {
				return fail(fmt.Errorf("producer %s message %d: %d items applied of %d", pc.Id, b.sequence, h.ItemsApplied, len(b.items)))
			}
			b.done = int(h.ItemsApplied)
			if ps.waiting == nil {
				ps.waiting = make(map[uint64]*insertBatch)
			}
			ps.waiting[b.sequence] = b
			heldBytes += int64(len(b.raw))
		}
		producers[pc.Id] = ps
		if len(ps.waiting) > 0 {
			stalled[pc.Id] = ps
		}
	}
	pending := make(map[string]*pendingQueue, len(restored))
	for name := range restored {
		pending[name] = newPendingQueue()
	}
	var unconfigured []*wire.PendingItem
	for _, pi := range cp.Pending {
		q, ok := pending[pi.GetItem().GetTable()]
		if !ok {
			unconfigured = append(unconfigured, pi)
			continue
		}
		p := &pendingItem{
			item: tables.Item{Key: pi.Item.Key, Priority: pi.Item.Priority, Trajectory: wire.ToTableColumns(pi.Item.Columns), PolicyVersion: pi.Item.PolicyVersion},
			arrival: arrival{
				streamSeq: pi.StreamSequence, storedAt: time.Unix(0, pi.StoredAtUnixNano),
				to: noticeTo{producer: pi.ProducerId, subject: pi.NoticeSubject}, sequence: pi.Sequence,
			},
			// When it joined is not kept: by the checkpoint at the latest.
			queuedAt: cp.AppliedSequence,
		}
		var err error
		if p.chunks, p.bytes, err = store.RetainItem(p.item.Trajectory); err != nil {
			return fail(fmt.Errorf("waiting item %d of table %q: %w", p.item.Key, pi.Item.Table, err))
		}
		q.push(p)
	}
	for _, t := range s.tables {
		t.Close()
	}
	s.store, s.tables, s.producers, s.stalled, s.pending = store, restored, producers, stalled, pending
	// Their producers count them applied once progress passes their
	// messages, which no table holds back any more: they are told.
	for _, pi := range unconfigured {
		table := pi.GetItem().GetTable()
		// Keyed by the table: a service that still has it (an active one,
		// while this is a standby) publishes progress past the checkpoint
		// holding the table below the item, without telling anyone.
		s.rejectAt(noticeAt{seq: cp.AppliedSequence, table: table}, noticeTo{producer: pi.ProducerId, subject: pi.NoticeSubject}, pi.Sequence, pi.GetItem().GetKey(), table, protocol.CodeNotFound,
			fmt.Sprintf("item waiting at the checkpoint of stream sequence %d for table %q, which the config no longer defines: dropped (add the table back to the config to keep such items)", cp.AppliedSequence, table))
	}
	// Holds are released oldest first: the same order as before the crash.
	slices.SortFunc(holds, func(a, b holdEntry) int { return cmp.Compare(a.order, b.order) })
	s.holds = holdQueue{entries: holds, live: len(holds), bytes: heldChunkBytes}
	s.heldBytes = heldBytes
	if cp.LastSweepUnixNano != 0 {
		s.lastSweep = time.Unix(0, cp.LastSweepUnixNano)
	}
	s.progress.set(cp.AppliedSequence)
	for name, q := range pending {
		s.noteHeld(name, q)
	}
	return nil
}

// reconcile applies the config file's rate limiter and max times sampled
// to a restored table (the file wins, and the log says so); other
// differences keep the checkpoint's value, since the items were built for
// it, and are reported.
func (s *Service) reconcile(t *tables.Table, got, want tables.Config) {
	if got.Limiter != want.Limiter || got.MaxTimesSampled != want.MaxTimesSampled {
		if err := t.Reconfigure(want.Limiter, want.MaxTimesSampled); err != nil {
			s.log.Error("reprise service: keeping the checkpoint's rate limiter: the config's does not fit the restored table", "table", got.Name, "error", err)
		} else {
			s.log.Info("reprise service: config file overrides the checkpoint", "table", got.Name,
				"rate_limiter", limiterString(want.Limiter), "was", limiterString(got.Limiter),
				"max_times_sampled", want.MaxTimesSampled, "was_max_times_sampled", got.MaxTimesSampled)
		}
	}
	if !equalStaleness(got.MaxStaleness, want.MaxStaleness) {
		if err := t.ReconfigureStaleness(want.MaxStaleness); err != nil {
			s.log.Error("reprise service: keeping the checkpoint's max_staleness", "table", got.Name, "error", err)
		} else {
			s.log.Info("reprise service: config file overrides the checkpoint's max_staleness", "table", got.Name)
		}
	}
	if got.Sampler != want.Sampler || got.Remover != want.Remover || got.MaxSize != want.MaxSize || !slices.EqualFunc(got.Signature, want.Signature, columnSpecEqual) {
		s.log.Warn("reprise service: the config changes a restored table's sampler, remover, max size or signature; the checkpoint's are kept, and a reset keeps them too: only a service started without the checkpoint builds the table from the config",
			"table", got.Name, "sampler", got.Sampler.String(), "remover", got.Remover.String(), "max_size", got.MaxSize)
	}
}

func equalStaleness(a, b *int64) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

func columnSpecEqual(a, b tables.ColumnSpec) bool {
	return a.Name == b.Name && a.DType == b.DType && slices.Equal(a.Shape, b.Shape)
}

func limiterString(c limiter.Config) string {
	return fmt.Sprintf("spi=%g min_size=%d min_diff=%g max_diff=%g", c.SamplesPerInsert, c.MinSize, c.MinDiff, c.MaxDiff)
}
