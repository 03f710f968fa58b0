// Package service is Reprise's table service, the only writer of table
// state. It consumes a deployment's JetStream stream in order and applies
// it to the tables: a reader pulls messages, prepare workers parse and
// validate inserts off the apply loop (parse.go), and the apply loop
// (apply.go) inserts items, keeps each producer's window and reorder buffer,
// and rejects what it cannot apply. It answers sample, info, items, reset
// and checkpoint requests as NATS micro endpoints (api.go), writes
// checkpoints and recovers from the newest one plus the stream's tail
// (checkpoint.go, checkpoint_store.go). Producers and clients are in package
// broker; the byte layouts in package broker/wire.
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// Code is the status code of a reply or a rejection (the same type as
// broker.Code).
type Code = protocol.Code

// Version is the version the service reports to NATS micro discovery.
const Version = "0.1.0"

// Option configures a Service.
type Option interface {
	configureService(*serviceOptions) error
}

// WithPrefix sets the subject prefix of the deployment (default
// "reprise"). Deployments with different prefixes share a NATS server
// without seeing each other; producers and clients must use the same one.
func WithPrefix(prefix string) Option {
	return serviceOption(func(o *serviceOptions) error { o.prefix = prefix; return nil })
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return serviceOption(func(o *serviceOptions) error { o.logger = l; return nil })
}

type serviceOption func(*serviceOptions) error

func (f serviceOption) configureService(o *serviceOptions) error { return f(o) }

type serviceOptions struct {
	prefix         string
	logger         *slog.Logger
	stream         StreamOptions
	maxSampleWait  time.Duration
	maxConcurrent  int
	maxBatch       int
	pullBytes      int
	producerIdle   time.Duration
	gapTimeout     time.Duration
	startSequence  uint64
	tableOptions   []tables.Option
	progressPeriod time.Duration
	observer       Observer
	samplePriority time.Duration
	schedProbe     func() time.Duration // tests stand in for the runtime's scheduler delay
	limits         Limits
	requestConn    *nats.Conn
	replyConns     []*nats.Conn

	checkpoints     CheckpointStore
	objectStore     bool
	checkpointEvery time.Duration
	checkpointKeep  int
	finalCheckpoint bool
	recovered       func(RecoveryResult)

	standby  bool
	leaseTTL time.Duration
	// shard is this service's place in a sharded table; count 0 when the
	// tables are not sharded.
	shard Shard
}

// Observer receives the service's measurements as they happen, e.g. to
// export them as metrics. Calls come from the service's goroutines and
// must not block.
type Observer interface {
	// SampleServed is called once per sample request answered (not for
	// one its client withdrew while it waited, for the rate limiter with
	// nothing sampled or for room for its reply, which is not answered).
	SampleServed(table string, items int, latency time.Duration, code Code)
	// ItemInserted is called per item applied to a table; age is the time
	// from the stream storing the message to the item being sampleable.
	ItemInserted(table string, age time.Duration)
	// Rejected is called per message or item refused.
	Rejected(table string, code Code)
}

// WithObserver sets an Observer for the service's measurements.
func WithObserver(obs Observer) Option {
	return serviceOption(func(o *serviceOptions) error { o.observer = obs; return nil })
}

func defaultServiceOptions() serviceOptions {
	return serviceOptions{
		prefix:          protocol.DefaultPrefix,
		logger:          slog.Default(),
		maxSampleWait:   time.Minute,
		maxConcurrent:   1024,
		maxBatch:        1 << 16,
		pullBytes:       16 << 20,
		producerIdle:    30 * time.Minute,
		gapTimeout:      2 * time.Minute,
		checkpointKeep:  2,
		finalCheckpoint: true,
		progressPeriod:  time.Second,
		samplePriority:  DefaultSamplePriority,
		limits:          DefaultLimits(),
	}
}

// WithStream sets the stream's limits; the service applies them to an
// existing stream too.
func WithStream(s StreamOptions) Option {
	return serviceOption(func(o *serviceOptions) error { o.stream = s; return nil })
}

// WithMaxSampleWait caps how long a sample request may wait for a table's
// rate limiter, whatever timeout it asks for (default 1 minute).
func WithMaxSampleWait(d time.Duration) Option {
	return serviceOption(func(o *serviceOptions) error {
		if d <= 0 {
			return fmt.Errorf("%w: max sample wait must be > 0, got %v", protocol.ErrInvalidOption, d)
		}
		o.maxSampleWait = d
		return nil
	})
}

// WithMaxConcurrentSamples bounds the sample requests served at once
// (default 1024); requests beyond it are answered "unavailable" at once.
func WithMaxConcurrentSamples(n int) Option {
	return serviceOption(func(o *serviceOptions) error { o.maxConcurrent = n; return positive("max concurrent samples", n) })
}

// DefaultSamplePriority is the service's sample priority unless
// WithSamplePriority sets another. Beside 16 producers and 16 learners the
// 2-core VMs measured show a p90 wait of about 0.5 ms, where nothing needs
// pacing; beside 200 producers, 4 ms let pacing start too late for the
// learners to keep half their pace (bench/README.md, "twenty-second
// round").
const DefaultSamplePriority = 2 * time.Millisecond

// WithSamplePriority puts learners before actors when they compete for the
// machine's CPU. While learners sample and the service's goroutines wait
// longer than d to run (the 90th percentile over 100 ms), the service paces
// the inserts it applies, down to a tenth of what actors managed unpaced,
// and tells producers to keep at most 100 ms of that pace unapplied between
// them; their windows fill and they publish less. The pace rises again as
// the delay falls, and ends when learners stop or actors no longer reach it.
// Where a table's rate limiter holds inserts or samples, it sets the balance
// of actors and learners: no period in which one waited for it is paced.
// On a machine with cores to spare the delay stays far below d and inserts
// are never paced. 0 turns pacing off: actors then take what the scheduler
// gives them, and learners wait behind them.
func WithSamplePriority(d time.Duration) Option {
	return serviceOption(func(o *serviceOptions) error {
		if d < 0 {
			return fmt.Errorf("%w: sample priority must be >= 0 (0: off), got %v", protocol.ErrInvalidOption, d)
		}
		o.samplePriority = d
		return nil
	})
}

// WithRequestConn serves sample, info, items, reset and checkpoint
// requests, and sends their replies, on nc instead of the connection given
// to New, which then carries only the stream's deliveries and the
// service's own publications. On one shared connection a request waits
// behind every stream message the server has already written to it (up to
// the pull window, 16 MiB by default), and its reply behind the consumer's
// traffic in the same write buffer: under many producers, learners wait
// tens of milliseconds more per request.
func WithRequestConn(nc *nats.Conn) Option {
	return serviceOption(func(o *serviceOptions) error {
		if nc == nil {
			return fmt.Errorf("%w: request connection is nil", protocol.ErrInvalidOption)
		}
		o.requestConn = nc
		return nil
	})
}

// WithReplyConns sends the replies that carry items (samples, item and
// table listings) over ncs, one connection per reply in turn, all parts of
// a reply on the same one so that they arrive in order. The NATS server
// reads each connection in one goroutine, and copies what it reads to the
// learners' connections there: on one connection, replies top out near
// 1.5 GB/s however many cores the machine has. Status-only replies, and
// every reply without this option, go out on the request connection.
func WithReplyConns(ncs ...*nats.Conn) Option {
	return serviceOption(func(o *serviceOptions) error {
		if slices.Contains(ncs, nil) {
			return fmt.Errorf("%w: a reply connection is nil", protocol.ErrInvalidOption)
		}
		o.replyConns = slices.Clone(ncs)
		return nil
	})
}

// DefaultReplyConns is how many connections reprised sends the replies
// with items over on a machine of cores: one per two cores, from 2 to 8.
// Measured on 16 cores (bench/README.md), 4 kB to 400 kB samples went from
// 1.6-1.9 GB/s on one connection to 3.1-3.4 on two, 4.4-5.5 on four and
// 4.9-5.6 on eight; on 2 cores two gave 8-20% more than one.
func DefaultReplyConns(cores int) int {
	return min(8, max(2, cores/2))
}

// WithPullBytes bounds the bytes of stream messages buffered ahead of the
// apply loop (default 16 MiB). It should stay well below the server's
// per-client output buffer (max_pending, 64 MiB by default), or the server
// drops the service as a slow consumer. Below the largest message the
// server accepts (its max_payload, with the message's subjects), the
// service raises it to that.
func WithPullBytes(n int) Option {
	return serviceOption(func(o *serviceOptions) error { o.pullBytes = n; return positive("pull bytes", n) })
}

// WithProducerIdle sets after how long without a message (in stream time) a
// producer's held chunks are dropped (default 30 minutes): a producer that
// died without closing must not pin memory forever. 0 never drops them.
func WithProducerIdle(d time.Duration) Option {
	return serviceOption(func(o *serviceOptions) error {
		if d < 0 {
			return fmt.Errorf("%w: producer idle time must be >= 0 (0: never drop), got %v", protocol.ErrInvalidOption, d)
		}
		o.producerIdle = d
		return nil
	})
}

// WithGapTimeout sets how long (in stream time) the service holds a
// producer's messages that arrived ahead of a missing one before it gives up
// on the missing one (default 2 minutes; keep it above the producers'
// WithRetryFor).
func WithGapTimeout(d time.Duration) Option {
	return serviceOption(func(o *serviceOptions) error {
		if d <= 0 {
			return fmt.Errorf("%w: gap timeout must be > 0, got %v", protocol.ErrInvalidOption, d)
		}
		o.gapTimeout = d
		return nil
	})
}

// WithStartSequence makes the service consume the stream from seq on (for
// recovery from a checkpoint taken at seq-1); default: from the beginning.
func WithStartSequence(seq uint64) Option {
	return serviceOption(func(o *serviceOptions) error { o.startSequence = seq; return nil })
}

// WithCheckpoints keeps checkpoints in cs: the service recovers from the
// newest usable one at start, writes one on request, periodically (see
// WithCheckpointEvery) and at shutdown, and trims the stream below what the
// kept checkpoints need.
func WithCheckpoints(cs CheckpointStore) Option {
	return serviceOption(func(o *serviceOptions) error { o.checkpoints = cs; return nil })
}

// WithObjectStoreCheckpoints keeps checkpoints in the JetStream object
// store bucket REPRISE_<PREFIX>_CHECKPOINTS on the service's own server,
// replicated like the stream.
func WithObjectStoreCheckpoints() Option {
	return serviceOption(func(o *serviceOptions) error { o.objectStore = true; return nil })
}

// WithCheckpointEvery writes a checkpoint at this interval (default never;
// a checkpoint is still written on request and at shutdown).
func WithCheckpointEvery(d time.Duration) Option {
	return serviceOption(func(o *serviceOptions) error {
		if d < 0 {
			return fmt.Errorf("%w: checkpoint interval must be >= 0, got %v", protocol.ErrInvalidOption, d)
		}
		o.checkpointEvery = d
		return nil
	})
}

// WithCheckpointKeep sets how many checkpoints are kept (default 2, at
// least 1). The stream is trimmed below what the oldest kept one needs, so
// with 2 an unreadable newest checkpoint still leaves a way back.
func WithCheckpointKeep(n int) Option {
	return serviceOption(func(o *serviceOptions) error { o.checkpointKeep = n; return positive("checkpoints kept", n) })
}

// WithoutFinalCheckpoint skips the checkpoint a graceful shutdown writes
// (for tests of crash recovery).
func WithoutFinalCheckpoint() Option {
	return serviceOption(func(o *serviceOptions) error { o.finalCheckpoint = false; return nil })
}

// WithRecoveryReport calls f with what recovery loaded, before the service
// starts consuming.
func WithRecoveryReport(f func(RecoveryResult)) Option {
	return serviceOption(func(o *serviceOptions) error { o.recovered = f; return nil })
}

// WithStandby lets several services serve one prefix, one at a time: each
// applies the stream to its own tables, and only the one holding the
// prefix's lease (a key in the JetStream KV bucket REPRISE_<PREFIX>_LEASE,
// replicated like the stream, whose entries expire after ttl) answers
// requests, publishes progress, writes checkpoints and trims the stream.
// When it stops renewing the lease (killed, paused, cut off), another takes
// over within about ttl plus ttl/6. One stopped gracefully hands over to
// a standby that answers it without writing its final checkpoint, when
// periodic checkpoints are on, and writes it after all where no standby
// serves. A ttl of 0 means DefaultLeaseTTL; an existing bucket's TTL
// wins. Every service of the prefix must use it.
func WithStandby(ttl time.Duration) Option {
	return serviceOption(func(o *serviceOptions) error {
		if ttl < 0 {
			return fmt.Errorf("%w: lease TTL must be >= 0 (0: the default %v), got %v", protocol.ErrInvalidOption, DefaultLeaseTTL, ttl)
		}
		if ttl == 0 {
			ttl = DefaultLeaseTTL
		}
		o.standby, o.leaseTTL = true, ttl
		return nil
	})
}

// Shard places a service in a table spread over Count services, each with
// its own prefix and stream: this one is number Index, from 0.
type Shard struct {
	Index, Count int
}

// MaxShards bounds a shard count.
const MaxShards = protocol.MaxShards

// ParseShard reads a shard as "INDEX/COUNT", such as "0/4".
func ParseShard(s string) (Shard, error) {
	i, n, ok := strings.Cut(s, "/")
	index, err1 := strconv.Atoi(i)
	count, err2 := strconv.Atoi(n)
	if !ok || err1 != nil || err2 != nil {
		return Shard{}, fmt.Errorf("%w: shard %q: want INDEX/COUNT, such as 0/4", protocol.ErrInvalidOption, s)
	}
	sh := Shard{Index: index, Count: count}
	return sh, sh.check()
}

func (sh Shard) check() error {
	if sh.Count < 1 || sh.Count > MaxShards || sh.Index < 0 || sh.Index >= sh.Count {
		return fmt.Errorf("%w: shard %d/%d: want a count from 1 to %d and an index from 0 to count-1", protocol.ErrInvalidOption, sh.Index, sh.Count, MaxShards)
	}
	return nil
}

// String gives the form ParseShard reads.
func (sh Shard) String() string { return fmt.Sprintf("%d/%d", sh.Index, sh.Count) }

// WithShard makes the service shard sh of a sharded table. A key names its
// shard: the service refuses items whose key modulo sh.Count is not
// sh.Index (a sharded producer makes its keys so), which lets a sharded
// client send a key's priority update or delete to the one shard that
// holds it. Info reports the shard, so a client given the shards' prefixes
// in the wrong order finds out.
func WithShard(sh Shard) Option {
	return serviceOption(func(o *serviceOptions) error {
		if err := sh.check(); err != nil {
			return err
		}
		o.shard = sh
		return nil
	})
}

// WithTableOptions passes options to every table the service creates.
func WithTableOptions(opts ...tables.Option) Option {
	return serviceOption(func(o *serviceOptions) error { o.tableOptions = opts; return nil })
}

// Service is the table service: the only writer of table state. It applies
// the stream in order to its tables and answers learners' requests. One
// service serves one prefix.
type Service struct {
	nc *nats.Conn
	// rc serves the requests (api.go): nc unless WithRequestConn.
	rc *nats.Conn
	// replies counts the replies sent over WithReplyConns's connections,
	// to take them in turn.
	replies atomic.Uint64
	// missedTrim is set once the stream lacked messages a checkpoint
	// holds (streamGap): the tables lack them too, and a checkpoint of
	// them, the newest, would be recovered from instead of that one.
	missedTrim atomic.Bool
	js         jetstream.JetStream
	subj       protocol.Subjects
	o          serviceOptions
	log        *slog.Logger
	store      *tables.ChunkStore
	// Fixed once Run has recovered: read without a lock afterwards.
	tables  map[string]*tables.Table
	names   []string
	configs map[string]tables.Config
	stream  jetstream.Stream
	// streamCreated tells the stream read from one of the same name
	// created again (whose sequences start over) in checkpoints.
	streamCreated time.Time
	// damaged names the checkpoints recovery found damaged and deleted;
	// written before the stream is read, read-only afterwards.
	damaged map[string]bool

	progress progress
	stats    serviceStats
	pace     pacer

	// Owned by the apply loop.
	producers map[string]*producerState
	stalled   map[string]*producerState // producers with waiting messages
	lastSweep time.Time
	holds     holdQueue
	heldBytes int64                    // of the messages in producers' waiting sets
	pending   map[string]*pendingQueue // per table: items its rate limiter holds
	// resetAhead maps a table whose full queue held up the stream to the
	// stream sequence of a reset of it that is stored but not applied yet:
	// its items from before that reset are dropped as it would drop them.
	resetAhead map[string]uint64
	resetScans map[string]*resetScan // where findResetAhead goes on from
	applying   uint64                // the stream sequence of the message being applied
	watcher    *watcher              // set by the apply loop
	dupWindow  time.Duration         // the stream's, read at start
	keys       []uint64              // prefetch's and release's scratch
	puts       []*tables.Chunk       // applyBatch's scratch: a message's chunks to store

	// resetStored wakes an apply loop that a full queue holds up to look
	// for a reset of its table in the stream (handleReset stored one).
	resetStored chan struct{}

	slots     *requestSlots
	waits     *sampleWaits
	handlers  sync.WaitGroup
	workers   *requestWorkers // while active; under closingMu
	rejectLog rateLimitedLog
	// withheld holds the notices of messages applied while the service
	// could not act (see reject), to send before its next progress, unless
	// progress a service of the prefix published (which sent the notices
	// of the messages it covers) passed them: up to covered, and for each
	// table of the config up to coveredTables (below covered while the
	// table holds items back). A table the config does not define is
	// covered as far as the latest progress, coveredLast, says: its names
	// come from producers, and following each would cost memory and every
	// progress message heard a look.
	withheld      withheldNotices
	coveredMu     sync.Mutex
	covered       uint64
	coveredTables map[string]uint64
	coveredLast   *wire.Progress
	// replies bounds the bytes of the sample replies built at once.
	replyBudget *replyBudget

	intr           interrupter
	running        atomic.Bool
	applyDone      chan struct{} // closed when the apply loop has stopped
	stopApply      func()        // closes applyDone, once
	closingMu      sync.Mutex    // with closing, keeps spawn from starting handlers once Run waits for them
	closing        bool
	cpMu           sync.Mutex // one checkpoint write at a time
	lastCheckpoint uint64
	lastName       string // of the newest checkpoint written or recovered

	lease *lease        // with WithStandby, once Run has opened it
	id    string        // names this service in the lease and its replies
	epoch atomic.Uint64 // of the checkpoints it writes
}

type serviceStats struct {
	rejected   atomic.Int64
	duplicates atomic.Int64
	missing    atomic.Int64 // mutations naming absent keys
	messages   atomic.Int64
	producers  atomic.Int64 // tracked by the apply loop: who reads progress
}

// New builds the tables from their configs. Run starts serving.
func New(nc *nats.Conn, configs []tables.Config, opts ...Option) (*Service, error) {
	o := defaultServiceOptions()
	for _, opt := range opts {
		if err := opt.configureService(&o); err != nil {
			return nil, err
		}
	}
	subj, err := protocol.NewSubjects(o.prefix)
	if err != nil {
		return nil, err
	}
	if err := checkNames(subj, o); err != nil {
		return nil, err
	}
	o.tableOptions = append(slices.Clip(o.tableOptions), tables.WithMaxItemBytes(o.limits.MaxItemBytes))
	if len(configs) == 0 {
		return nil, fmt.Errorf("%w: no tables configured", tables.ErrInvalidConfig)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("broker: jetstream: %w", err)
	}
	s := &Service{
		nc:          nc,
		rc:          cmp.Or(o.requestConn, nc),
		js:          js,
		subj:        subj,
		o:           o,
		log:         o.logger.With("prefix", subj.Prefix),
		store:       tables.NewChunkStore(),
		tables:      make(map[string]*tables.Table, len(configs)),
		producers:   make(map[string]*producerState),
		stalled:     make(map[string]*producerState),
		pending:     make(map[string]*pendingQueue, len(configs)),
		resetAhead:  make(map[string]uint64),
		resetScans:  make(map[string]*resetScan),
		damaged:     make(map[string]bool),
		resetStored: make(chan struct{}, 1),
		slots:       newRequestSlots(o.maxConcurrent, len(configs)),
		waits:       newSampleWaits(),
		replyBudget: newReplyBudget(max(o.limits.MaxReplyBytesInFlight, o.limits.MaxReplyBytes)),
		configs:     make(map[string]tables.Config, len(configs)),
		applyDone:   make(chan struct{}),
		id:          serviceID(),
	}
	s.stopApply = sync.OnceFunc(func() { close(s.applyDone) })
	s.progress.seq = o.startSequence - min(o.startSequence, 1)
	for _, cfg := range configs {
		if _, dup := s.tables[cfg.Name]; dup {
			return nil, fmt.Errorf("%w: table %q defined twice", tables.ErrInvalidConfig, cfg.Name)
		}
		t, err := tables.New(cfg, s.store, o.tableOptions...)
		if err != nil {
			return nil, err
		}
		s.tables[cfg.Name] = t
		s.pending[cfg.Name] = newPendingQueue()
		s.configs[cfg.Name] = cfg
		s.names = append(s.names, cfg.Name)
	}
	slices.Sort(s.names)
	return s, nil
}

// checkNames refuses a prefix whose stream, or whose buckets where o uses
// them, JetStream would refuse to create: their names take fewer
// characters than subjects do, and a running service that cannot create
// them names only the bucket in its error.
func checkNames(subj protocol.Subjects, o serviceOptions) error {
	if name := subj.Stream(); strings.ContainsAny(name, "/\\\f") {
		return fmt.Errorf("%w: prefix %q names the stream %s, which JetStream refuses (no / or \\): choose another prefix", protocol.ErrInvalidPrefix, subj.Prefix, name)
	}
	var buckets []string
	if o.objectStore {
		buckets = append(buckets, subj.CheckpointBucket())
	}
	if o.standby {
		buckets = append(buckets, subj.LeaseBucket())
	}
	for _, b := range buckets {
		if strings.IndexFunc(b, func(r rune) bool {
			return !(r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z')
		}) >= 0 {
			return fmt.Errorf("%w: prefix %q names the bucket %s, which JetStream takes only of letters A-Z, digits, '_' and '-': choose a prefix of those and '.', or keep checkpoints in files (reprised --checkpoint-dir) and run without standby", protocol.ErrInvalidPrefix, subj.Prefix, b)
		}
	}
	return nil
}

// TableNames lists the service's tables, sorted.
func (s *Service) TableNames() []string { return slices.Clone(s.names) }

// Table returns the named table, for in-process inspection once Run has
// recovered. Changes made to it directly bypass the stream: they are not
// durable and not replayed after a crash.
func (s *Service) Table(name string) (*tables.Table, bool) {
	t, ok := s.tables[name]
	return t, ok
}

// Applied is the last stream sequence applied to the tables.
func (s *Service) Applied() uint64 { return s.progress.get() }

// Rejected counts the messages and items the service refused.
func (s *Service) Rejected() int64 { return s.stats.rejected.Load() }

// pullOverhead is what a delivered message adds to its payload in a pull's
// byte count: its subject and its reply subject ($JS.ACK.<domain>.<account
// hash>.<stream>.<consumer>.<five numbers>.<token>).
const pullOverhead = 1 << 10

// pullBytes is the configured pull bytes, or the largest message the
// server accepts when that is more: JetStream never delivers a message
// larger than a pull asks for, and the reader would ask again for the same
// one without end.
func (s *Service) pullBytes() int {
	largest := int(s.nc.MaxPayload()) + pullOverhead + 2*len(s.subj.Stream()) + len(s.subj.Data())
	if s.o.pullBytes >= largest {
		return s.o.pullBytes
	}
	s.log.Info("reprise service: pull bytes raised to hold the largest message the server accepts", "prefix", s.subj.Prefix, "configured", s.o.pullBytes, "pull_bytes", largest)
	return largest
}

// Run serves until ctx ends, then stops taking requests, lets the requests
// in progress finish (their waits end with ctx), and returns. It returns
// nil after a shutdown through ctx.
func (s *Service) Run(parent context.Context) error {
	if s.running.Swap(true) {
		return fmt.Errorf("%w: Run called twice", protocol.ErrInvalidOption)
	}
	defer s.stopApply()
	// Waits on the tables end with the run, however it ends; the items
	// stay for a final look.
	defer func() {
		for _, t := range s.tables {
			t.Close()
		}
	}()
	// The stream's disappearance ends the run as the parent's end would,
	// with protocol.ErrStreamLost as the cause.
	ctx, lose := context.WithCancelCause(parent)
	defer lose(nil)
	stream, err := ensureStream(ctx, s.js, s.subj, s.o.stream, s.log)
	if err != nil {
		return stoppedOr(parent, err)
	}
	s.stream = stream
	s.streamCreated = stream.CachedInfo().Created
	s.dupWindow = stream.CachedInfo().Config.Duplicates
	// Before recovery: while a standby waits for the lease bucket (a
	// cluster electing its leader), the active service goes on trimming
	// the stream, and the checkpoint to recover from is the newest after
	// the wait.
	if s.o.standby {
		s.lease, err = openLease(ctx, s.js, s.subj.LeaseBucket(), s.o.stream.Replicas, s.o.leaseTTL, s.id, s.log)
		if err != nil {
			return stoppedOr(parent, err)
		}
	}
	recovered, err := s.recoverAtStart(ctx)
	if err != nil {
		return stoppedOr(parent, err)
	}
	if err := s.checkSharedCheckpoints(ctx); err != nil {
		return stoppedOr(parent, err)
	}
	start, err := s.checkStreamCovers(ctx, s.progress.get()+1, recovered)
	if err != nil {
		return stoppedOr(parent, err)
	}
	// A gap that stops the service ends the run at once: the apply loop
	// may be waiting on a rate limiter, far behind the reader.
	reader := newStreamReader(stream, s.subj.Data(), start, s.pullBytes(), s.log, func(ctx context.Context, from, to uint64) error {
		err := s.streamGap(ctx, from, to)
		if errors.Is(err, protocol.ErrStreamLost) {
			lose(err)
		}
		return err
	})
	defer reader.close()
	if err := reader.open(ctx); err != nil {
		return stoppedOr(parent, fmt.Errorf("broker: consumer on %s: %w", s.subj.Stream(), err))
	}

	stopAnswering := func() {}
	if s.lease != nil {
		calls, err := s.nc.Subscribe(s.subj.Standby(), s.answerStandbyCall)
		if err != nil {
			return fmt.Errorf("broker: subscribing to %s: %w", s.subj.Standby(), err)
		}
		stopAnswering = sync.OnceFunc(func() { _ = calls.Unsubscribe() })
		defer stopAnswering()
		progress, err := s.nc.Subscribe(s.subj.Applied(), s.noteCovered)
		if err != nil {
			return fmt.Errorf("broker: subscribing to %s: %w", s.subj.Applied(), err)
		}
		defer progress.Unsubscribe()
	}

	// The active role: for the whole run without standby, while the lease
	// is held with it.
	actx, stopActing := context.WithCancel(ctx)
	defer stopActing()
	var bg sync.WaitGroup
	var stopErr error
	if s.lease == nil {
		stop, err := s.activate(actx)
		if err != nil {
			return err
		}
		bg.Go(func() {
			<-actx.Done()
			stopErr = stop()
		})
	} else {
		bg.Go(func() { s.lead(actx, lose) })
	}
	// On actx, not ctx: the apply loop can end on its own (the connection
	// closed for good), and Run must then return.
	bg.Go(func() { s.watchStream(actx, lose) })
	if s.o.samplePriority > 0 {
		probe := s.o.schedProbe
		if probe == nil {
			probe = newSchedDelay().read
		}
		bg.Go(func() { s.paceLoop(actx, probe) })
	}
	s.log.Info("reprise service running", "tables", s.names, "stream", s.subj.Stream(), "start_sequence", start, "standby", s.lease != nil)

	err = s.applyLoop(ctx, reader)
	// A stopping service is no one to hand over to.
	stopAnswering()
	// A hand-over leaves the newest state to the stream and the standby:
	// only for a shutdown, never where the stream is lost or the run
	// failed, when the final checkpoint is all that holds it.
	mayHandOver := parent.Err() != nil && !errors.Is(context.Cause(ctx), protocol.ErrStreamLost) && (err == nil || errors.Is(err, ctx.Err()))
	// The lease is renewed from here until the final checkpoint is
	// written: stopping the active role's work can take longer than what
	// is left of it. Writing the checkpoint takes as long as its tables'
	// bytes take to move, waited for at the slowest rate a store's
	// transfer is (a slow disk, a loaded cluster), so that a large state
	// is written rather than given up on at a fixed bound.
	budget := time.Minute + time.Duration(s.store.Bytes()/objectMinRate)*time.Second
	if s.lease != nil {
		budget += standbyCallTimeout + s.handOverTimeout()
	}
	wctx, endWrite := context.WithTimeout(context.WithoutCancel(ctx), budget)
	defer endWrite()
	stopRenewing := s.keepLease(wctx)
	s.stopApply()
	stopActing()
	bg.Wait()
	var cpErr error
	if s.o.checkpoints != nil && s.o.finalCheckpoint && s.mayAct() && !s.missedTrim.Load() {
		handedOver := false
		if mayHandOver {
			handedOver, stopRenewing, cpErr = s.tryHandOver(wctx, stopRenewing)
		}
		if !handedOver && cpErr == nil {
			_, cpErr = s.write(wctx, s.capture())
			if cpErr != nil {
				cpErr = fmt.Errorf("broker: final checkpoint: %w", cpErr)
			}
		}
	}
	stopRenewing()
	if s.lease != nil {
		s.releaseLease(ctx)
	}
	if cause := context.Cause(ctx); errors.Is(cause, protocol.ErrStreamLost) {
		err = cause
	} else if ctx.Err() != nil && (err == nil || errors.Is(err, ctx.Err())) {
		err = nil
	}
	return errors.Join(err, stopErr, cpErr)
}

// stoppedOr is err, or nil where it came of a shutdown through ctx: a
// service stopped while it waits for JetStream at start has nothing to
// report.
func stoppedOr(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil
	}
	return err
}

// recoverAtStart loads the newest usable checkpoint and applies the
// messages it had held back, then reports what it did. It returns the
// checkpoints it skipped without finding them damaged (RecoveryResult.kept).
func (s *Service) recoverAtStart(ctx context.Context) (RecoveryResult, error) {
	if s.o.objectStore && s.o.checkpoints == nil {
		var cs *ObjectStoreCheckpoints
		err := retryJS(ctx, s.log, "the checkpoint bucket", func(ctx context.Context) error {
			var err error
			cs, err = NewObjectStoreCheckpoints(ctx, s.js, checkpointBucket(s.subj), s.o.stream.Replicas)
			return err
		})
		if err != nil {
			return RecoveryResult{}, err
		}
		s.o.checkpoints = cs
	}
	if s.o.checkpoints == nil {
		return RecoveryResult{}, nil
	}
	res, err := s.recover(ctx)
	if err != nil {
		return RecoveryResult{}, fmt.Errorf("broker: recovery: %w", err)
	}
	if res.Checkpoint == "" && len(res.Skipped) > 0 {
		s.log.Error("reprise service: no usable checkpoint; replaying the stream from its start (anything trimmed from it is lost)", "skipped", len(res.Skipped))
	}
	s.log.Info("reprise service: recovered", "checkpoint", res.Checkpoint, "applied", res.Applied, "items", res.Items, "chunks", res.Chunks, "took", res.Duration)
	if s.o.recovered != nil {
		s.o.recovered(res)
	}
	return res, nil
}

// checkStreamCovers reports, loudly, messages recovery needs that the
// stream no longer has: discarded by its limits, purged, or lost with a
// stream that was recreated. Where a checkpoint that recovery skipped, but
// kept, holds some of them, it refuses to start: serving would lose them,
// and the checkpoints written next would trim the one that holds them.
// Other missing messages are a gap in the stream (streamGap), reported
// here rather than by the reader. It returns the sequence to read the
// stream from: start, or the first one the stream holds past such a gap.
func (s *Service) checkStreamCovers(ctx context.Context, start uint64, recovered RecoveryResult) (uint64, error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		s.log.Warn("reprise service: reading the stream's state", "error", err)
		return start, nil // the reader reports a gap at its first message
	}
	st := info.State
	var holding []string // kept checkpoints with messages from start on
	for _, k := range recovered.kept {
		if k.applied >= start {
			holding = append(holding, k.why)
		}
	}
	// A stream created again numbers its messages from 1: those it holds
	// below the checkpoint's sequence are not the checkpoint's, and
	// reading it from the checkpoint on would skip them. Only a checkpoint
	// that says which stream it numbers tells when the new one has grown
	// past it.
	recreated := !recovered.streamCreated.IsZero() && !recovered.streamCreated.Equal(info.Created)
	switch {
	case st.LastSeq+1 < start || recreated && st.Msgs > 0 && st.FirstSeq < start:
		s.log.Error("reprise service: the stream was deleted and created again since the checkpoint: its sequence numbers start over below the checkpoint's, and reading it from there would skip what it holds. To serve the checkpoints' tables and drop the new stream's messages, purge it below the sequence after the checkpoint's; to start over from the new stream, move the checkpoints away",
			"stream_first", st.FirstSeq, "stream_last", st.LastSeq, "stream_created", info.Created, "checkpoint_applied", start-1, "checkpoint_stream_created", recovered.streamCreated)
		return 0, fmt.Errorf("%w: %s was created again since the checkpoint (its first sequence %d, its last %d; the checkpoint holds the former stream's up to %d)", protocol.ErrStreamLost, s.subj.Stream(), st.FirstSeq, st.LastSeq, start-1)
	case recreated:
		s.log.Warn("reprise service: the stream was created again since the checkpoint, and purged below the sequence after it: reading it from there", "stream_first", st.FirstSeq, "checkpoint_applied", start-1)
	case st.FirstSeq > start && len(holding) > 0:
		return 0, fmt.Errorf("%w: the stream holds messages from sequence %d on, and recovery needs them from %d: they are in a checkpoint it could not load (%s); remove its cause and start again, or move that checkpoint away to start without what only it holds",
			protocol.ErrStreamLost, st.FirstSeq, start, strings.Join(holding, "; "))
	case st.FirstSeq > start:
		if err := s.streamGap(ctx, start, st.FirstSeq-1); err != nil {
			return 0, err
		}
		return st.FirstSeq, nil
	}
	return start, nil
}

// gapListingTimeout bounds the checkpoint listing that decides what a gap
// in the stream means: a store that cannot answer by then cannot say.
const gapListingTimeout = 30 * time.Second

// streamGap is told of stream messages gone before the service read them.
// Where the checkpoint a restart would recover from holds them (the stream
// was trimmed below it), the service stops, with an error, so that its
// supervisor restarts it and recovery covers what it missed. That is a
// standby that fell behind the active one's trim, before it took over or
// after, or while it started: going on, it would serve without them, and
// its own checkpoints would trim away the one that holds them. A standby
// stops too when the checkpoint store cannot say. Messages that only the
// stream's limits (or a purge) dropped are lost to recovery too: the
// service goes on without them, since a restart would meet the same gap.
// It returns ctx's error if ctx ends first: the service is stopping, reads
// no further, and writes no final checkpoint unless the store said that
// none holds the missing messages.
func (s *Service) streamGap(ctx context.Context, from, to uint64) error {
	s.log.Error("reprise service: stream messages were gone before this service read them (purged, or dropped by the stream's limits)", "from", from, "to", to)
	// Before the listing, which may take long enough for the lease to be
	// taken meanwhile.
	standby := s.lease != nil && !s.mayAct()
	lctx, cancel := context.WithTimeout(ctx, gapListingTimeout)
	defer cancel()
	if standby {
		if err := s.checkSharedCheckpoints(lctx); err != nil && ctx.Err() == nil {
			s.missedTrim.Store(true)
			return fmt.Errorf("%w: messages %d to %d are gone: %w", protocol.ErrStreamLost, from, to, err)
		}
	}
	name, err := s.checkpointHolding(lctx, from)
	if ctx.Err() != nil {
		if name != "" || err != nil {
			// Stopping, with tables that lack what a checkpoint holds, or
			// may: no final checkpoint of them.
			s.missedTrim.Store(true)
		}
		return ctx.Err()
	}
	switch {
	case name != "" && standby:
		err = fmt.Errorf("%w: this standby fell behind the stream's trim (messages %d to %d are gone, and checkpoint %s holds them); restart it to recover from that checkpoint", protocol.ErrStreamLost, from, to, name)
	case name != "":
		err = fmt.Errorf("%w: stream messages %d to %d were trimmed below checkpoint %s, which holds them and which this service did not load (it fell behind the trim before it took over); restart it to recover from that checkpoint", protocol.ErrStreamLost, from, to, name)
	case err != nil && standby:
		err = fmt.Errorf("%w: this standby may have fallen behind the stream's trim (messages %d to %d are gone) and the checkpoint store cannot say (%v); restart it to recover from the newest checkpoint", protocol.ErrStreamLost, from, to, err)
	default:
		return nil
	}
	// Its tables lack what it stops for: no checkpoint of them, should it
	// even take the lease before it stops.
	s.missedTrim.Store(true)
	return err
}

// checkpointHolding names the checkpoint a restart would recover from, the
// newest, if it holds stream message seq; it is "" when that one does not
// (an older one with more messages would not be loaded), or when there is
// no checkpoint, and err when the store cannot say.
func (s *Service) checkpointHolding(ctx context.Context, seq uint64) (string, error) {
	if s.o.checkpoints == nil {
		return "", nil // without checkpoints nothing trims the stream
	}
	names, err := s.listForRecovery(ctx)
	if err != nil {
		s.log.Error("reprise service: listing checkpoints after a gap in the stream", "error", err)
		return "", err
	}
	for i := len(names) - 1; i >= 0; i-- {
		if _, applied, ok := parseCheckpointName(names[i]); ok {
			if applied >= seq {
				return names[i], nil
			}
			return "", nil
		}
	}
	return "", nil
}

// checkCheckpointStore recreates a deleted checkpoint bucket or directory,
// loudly, and writes a checkpoint at once: the stream may be trimmed below
// what the lost checkpoints covered, so until then a crash would lose data.
func (s *Service) checkCheckpointStore(ctx context.Context) {
	rc, ok := s.o.checkpoints.(recreatable)
	if !ok || !s.mayAct() {
		return
	}
	recreated, err := rc.ensure(ctx)
	if err != nil {
		s.log.Error("reprise service: the checkpoint store is gone and cannot be recreated", "error", err)
		return
	}
	if !recreated {
		return
	}
	s.log.Error("reprise service: the checkpoint store was deleted; recreated it, writing a checkpoint now")
	if _, err := s.Checkpoint(ctx); err != nil && ctx.Err() == nil {
		s.log.Error("reprise service: checkpoint after recreating the store", "error", err)
	}
}

// watchStream ends the run, through lose, when the stream is deleted or
// replaced under the service: the tables would go on answering from a log
// that no longer exists, and producers' acks would come from a stream
// nobody applies. It also looks after the checkpoint store.
func (s *Service) watchStream(ctx context.Context, lose context.CancelCauseFunc) {
	t := time.NewTicker(s.o.progressPeriod)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		s.checkCheckpointStore(ctx)
		info, err := s.stream.Info(ctx)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			s.log.Error("reprise service: the stream was deleted; stopping (the final checkpoint keeps what was applied)", "stream", s.subj.Stream())
			lose(fmt.Errorf("%w: %s was deleted", protocol.ErrStreamLost, s.subj.Stream()))
			return
		case err != nil:
			continue // the server may be electing a leader or restarting
		case !info.Created.Equal(s.streamCreated):
			s.log.Error("reprise service: the stream was deleted and recreated; stopping (the final checkpoint keeps what was applied)", "stream", s.subj.Stream())
			lose(fmt.Errorf("%w: %s was recreated", protocol.ErrStreamLost, s.subj.Stream()))
			return
		}
	}
}

func (s *Service) checkpointPeriodically(ctx context.Context) {
	t := time.NewTicker(s.o.checkpointEvery)
	defer t.Stop()
	var last stateMark
	for {
		select {
		case <-t.C:
			last, _ = s.periodicCheckpoint(ctx, last)
		case <-ctx.Done():
			return
		}
	}
}

// periodicCheckpoint writes a checkpoint unless nothing changed since the
// one it wrote last (at last): an idle service stored the same tables
// again at every period, each copy replicated, its old one deleted. It
// returns the mark of what it wrote, read before the state is copied, so
// that a change meanwhile makes the next one write again, and whether it
// wrote.
func (s *Service) periodicCheckpoint(ctx context.Context, last stateMark) (stateMark, bool) {
	now := s.stateMark()
	if now.same(last) {
		return last, false
	}
	if _, err := s.Checkpoint(ctx); err != nil {
		if ctx.Err() == nil {
			s.log.Error("reprise service: periodic checkpoint", "error", err)
		}
		return last, false
	}
	return now, true
}

// stateMark changes whenever the tables may have: with every stream
// message applied, and with every sample, which changes times sampled and
// the rate limiters outside the stream (the tables' counts say so).
type stateMark struct {
	applied uint64
	counts  []tables.Counters // by s.names; nil: no mark
}

func (s *Service) stateMark() stateMark {
	m := stateMark{applied: s.progress.get(), counts: make([]tables.Counters, len(s.names))}
	for i, name := range s.names {
		c := s.tables[name].Counters()
		// A learner waiting on a rate limiter that no actor feeds counts
		// its waits, and changes nothing.
		c.SampleWaits, c.InsertWaits = 0, 0
		m.counts[i] = c
	}
	return m
}

func (m stateMark) same(o stateMark) bool {
	return m.counts != nil && o.counts != nil && m.applied == o.applied && slices.Equal(m.counts, o.counts)
}

// rateLimitedLog lets through a burst of log lines, then one a second, so a
// flood of garbage cannot flood the logs too.
type rateLimitedLog struct {
	mu     sync.Mutex
	tokens float64
	last   time.Time
}

func (r *rateLimitedLog) allow() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.last.IsZero() {
		r.tokens = 20
	} else {
		r.tokens = min(20, r.tokens+now.Sub(r.last).Seconds())
	}
	r.last = now
	if r.tokens < 1 {
		return false
	}
	r.tokens--
	return true
}

// progress is how far the apply loop got: the last stream sequence it
// applied, and for each table whose rate limiter holds items in its queue,
// the sequence before its oldest waiting item. It has a way to wait for a
// change.
type progress struct {
	mu      sync.Mutex
	seq     uint64
	held    map[string]uint64
	window  uint32 // the producers' paced window; 0: none
	version uint64
	changed chan struct{} // closed at the next change; made only when someone waits
}

func (p *progress) get() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

func (p *progress) changedLocked() {
	p.version++
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

func (p *progress) set(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq = seq
	p.changedLocked()
}

// setWindow sets the window producers are told to keep while inserts are
// paced.
func (p *progress) setWindow(items uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.window == items {
		return
	}
	p.window = items
	p.changedLocked()
}

// hold records that table's items are applied only up to seq.
func (p *progress) hold(table string, seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(map[string]uint64)
	}
	if cur, ok := p.held[table]; ok && cur == seq {
		return
	}
	p.held[table] = seq
	p.changedLocked()
}

// release records that table has no waiting items.
func (p *progress) release(table string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.held[table]; !ok {
		return
	}
	delete(p.held, table)
	p.changedLocked()
}

// next returns the sequence, the version of the whole progress, and a
// channel closed when either changes.
func (p *progress) next() (seq, version uint64, changed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.changed == nil {
		p.changed = make(chan struct{})
	}
	return p.seq, p.version, p.changed
}

// message is the progress as producers read it.
func (p *progress) message() *wire.Progress {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := &wire.Progress{AppliedSequence: p.seq, MaxUnapplied: p.window}
	for table, seq := range p.held {
		m.Held = append(m.Held, &wire.TableProgress{Table: table, AppliedSequence: seq})
	}
	slices.SortFunc(m.Held, func(a, b *wire.TableProgress) int { return strings.Compare(a.Table, b.Table) })
	return m
}

// waitFor waits until seq is applied.
func (p *progress) waitFor(ctx context.Context, seq uint64) error {
	for {
		cur, _, ch := p.next()
		if cur >= seq {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// progressGap is the least time between two progress updates while the
// applied sequence moves. Every producer (and client) receives every
// update, so the gap grows with the producers: the server fans out about
// 50,000 deliveries a second at most (up to 500 producers; beyond, one
// update every 10 ms), and a lone producer waiting in Flush hears at once
// that its message was applied.
func progressGap(producers int64) time.Duration {
	return min(10*time.Millisecond, time.Duration(max(producers, 1))*20*time.Microsecond)
}

// publishProgress tells producers how far the service has applied: right
// away, then at most once every progressGap while it moves, and once a
// period while it does not (for producers that start late or missed a
// message).
func (s *Service) publishProgress(ctx context.Context) {
	heartbeat := time.NewTicker(s.o.progressPeriod)
	defer heartbeat.Stop()
	sent := uint64(math.MaxUint64)
	for {
		_, version, changed := s.progress.next()
		if version != sent {
			data, _ := proto.Marshal(s.progress.message())
			// After the progress is read: a notice withheld before the
			// sequence it covers was applied is sent ahead of it. Not once
			// the lease lapsed (the lease loop stops this soon), which is
			// asked last, right before publishing: a service stopped (a
			// pause, SIGSTOP) between the two publishes stale progress
			// when it goes on.
			if s.mayAct() {
				s.withheld.send(s.nc, s.coversNotice)
				if s.mayAct() {
					if err := s.nc.Publish(s.subj.Applied(), data); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
						s.log.Warn("reprise service: publishing progress", "error", err)
					}
				}
			}
			sent = version
			// Batch bursts of applied messages into one update.
			select {
			case <-time.After(progressGap(s.stats.producers.Load())):
			case <-ctx.Done():
				return
			}
			continue
		}
		select {
		case <-changed:
		case <-heartbeat.C:
			sent = math.MaxUint64 // resend the same value
		case <-ctx.Done():
			return
		}
	}
}

// noteCovered follows the progress that services of the prefix publish.
func (s *Service) noteCovered(m *nats.Msg) {
	var p wire.Progress
	if proto.Unmarshal(m.Data, &p) != nil {
		return
	}
	s.coveredMu.Lock()
	defer s.coveredMu.Unlock()
	if p.AppliedSequence >= s.covered {
		s.covered, s.coveredLast = p.AppliedSequence, &p
	}
	if s.coveredTables == nil {
		s.coveredTables = make(map[string]uint64, len(s.names))
	}
	for _, name := range s.names {
		s.coveredTables[name] = max(s.coveredTables[name], tableCovered(&p, name))
	}
}

// tableCovered is how far p says table is applied.
func tableCovered(p *wire.Progress, table string) uint64 {
	for _, h := range p.Held {
		if h.Table == table {
			return h.AppliedSequence
		}
	}
	return p.AppliedSequence
}

// coversNotice says whether a service's progress covered a withheld
// notice, which that service then sent.
func (s *Service) coversNotice(at noticeAt) bool {
	s.coveredMu.Lock()
	defer s.coveredMu.Unlock()
	if at.table == "" {
		return at.seq <= s.covered
	}
	if seq, ok := s.coveredTables[at.table]; ok {
		return at.seq <= seq
	}
	// A table the config does not define, which another service may have
	// and hold below the notice. A standby that lags hears the active
	// service's progress past a message before it applies it: progress
	// that covered the notice (the active service refused the item too, or
	// took it in) may not come again before a takeover.
	return s.coveredLast != nil && at.seq <= tableCovered(s.coveredLast, at.table)
}

// coveredUpTo is the highest stream sequence a service of the prefix
// published progress for.
func (s *Service) coveredUpTo() uint64 {
	s.coveredMu.Lock()
	defer s.coveredMu.Unlock()
	return s.covered
}

func positive(name string, v int) error {
	if v < 1 {
		return fmt.Errorf("%w: %s must be >= 1, got %d", protocol.ErrInvalidOption, name, v)
	}
	return nil
}
