package service

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
)

// The active role among a prefix's table services is a lease: one key in a
// JetStream KV bucket whose entries expire after the bucket's TTL (the
// server removes them; no clock of Reprise's decides). A service takes it
// with Create, which succeeds only while the key is absent, and keeps it
// with Update conditioned on the revision of its own last write; so at most
// one service holds it, and a service that stops renewing loses it one TTL
// after its last write at most.
//
// A holder counts its lease from the moment it sent its last successful
// write, on its own monotonic clock, minus a margin: the server stored that
// write later and expires it one TTL after storing it, so the holder stops
// believing it holds the lease before any other service can take it. A
// paused process resumes with its clock advanced, sees the lease lapsed and
// does nothing the active role does.

// DefaultLeaseTTL is the lease's default time to live: a standby takes over
// within about this long (plus half a renewal period) after the active
// service stops renewing.
const DefaultLeaseTTL = 3 * time.Second

const leaseKey = "active"

// errLeaseLost: another service holds the lease, or it lapsed.
var errLeaseLost = errors.New("broker: lease lost")

// lease is one service's side of the active role's lease.
type lease struct {
	kv     jetstream.KeyValue
	id     string // this service's value in the key
	ttl    time.Duration
	margin time.Duration
	base   time.Time    // origin of until, on the monotonic clock
	until  atomic.Int64 // time after base up to which the lease is held; 0: not held
	epoch  atomic.Uint64
	// writes orders the lease's writes: the goroutine that holds the
	// lease renews it while the final checkpoint's renewals start.
	writes sync.Mutex
	rev    uint64 // revision of the last write
	// checkpoint is the newest checkpoint this service wrote, which the
	// lease's value names after the service's id (leaseValue), so that a
	// standby can tell whether it reads the same checkpoints.
	checkpoint atomic.Pointer[string]
}

// value is what the lease's key holds while this service holds it.
func (l *lease) value() []byte {
	v := l.id
	if c := l.checkpoint.Load(); c != nil {
		v += "\n" + *c
	}
	return []byte(v)
}

func leaseHolderOf(e jetstream.KeyValueEntry) string {
	holder, _ := leaseValue(e.Value())
	return holder
}

// leaseValue reads a lease key's value: the holder's id, then the newest
// checkpoint it wrote, if any (a release that wrote the id alone names
// none).
func leaseValue(b []byte) (holder, checkpoint string) {
	holder, checkpoint, _ = strings.Cut(string(b), "\n")
	return holder, checkpoint
}

// serviceID names this process in the lease and in its replies: host,
// process id, and a random part so that a restarted process differs.
func serviceID() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), rand.Text()[:8])
}

// openLease opens the lease bucket, creating it with ttl if it does not
// exist. An existing bucket's TTL wins over ttl, since every service of the
// prefix must count with the TTL the server applies.
func openLease(ctx context.Context, js jetstream.JetStream, bucket string, replicas int, ttl time.Duration, id string, log *slog.Logger) (*lease, error) {
	cfg := jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "Reprise: which table service is active",
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}
	var (
		kv     jetstream.KeyValue
		status jetstream.KeyValueStatus
	)
	err := retryJS(ctx, log, "the lease bucket "+bucket, func(ctx context.Context) error {
		var err error
		kv, err = js.KeyValue(ctx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			kv, err = js.CreateKeyValue(ctx, cfg)
		}
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, bucket) // another service created it meanwhile
		}
		if err == nil {
			status, err = kv.Status(ctx)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("broker: lease bucket %s: %w", bucket, err)
	}
	if status.TTL() <= 0 {
		return nil, fmt.Errorf("%w: the lease bucket %s has no TTL: delete it, and reprised recreates it", protocol.ErrInvalidOption, bucket)
	}
	if status.TTL() != ttl {
		log.Warn("reprise service: the lease bucket's TTL differs from the configured one; using the bucket's", "bucket", bucket, "bucket_ttl", status.TTL(), "configured", ttl)
	}
	return &lease{kv: kv, id: id, ttl: status.TTL(), margin: status.TTL() / 6, base: time.Now()}, nil
}

// renewEvery is how often the holder renews: three chances per TTL.
func (l *lease) renewEvery() time.Duration { return l.ttl / 3 }

// pollEvery is how often a standby tries to take the lease.
func (l *lease) pollEvery() time.Duration { return l.ttl / 6 }

// held says whether the lease is this service's now, by its own clock.
func (l *lease) held() bool {
	u := l.until.Load()
	return u > 0 && time.Since(l.base) < time.Duration(u)
}

// wrote records a successful write sent at sent (after base).
func (l *lease) wrote(sent time.Duration, rev uint64) {
	l.rev = rev
	l.until.Store(int64(sent + l.ttl - l.margin))
}

// acquire takes the lease if it is free.
func (l *lease) acquire(ctx context.Context) (bool, error) {
	l.writes.Lock()
	defer l.writes.Unlock()
	ctx, cancel := context.WithTimeout(ctx, l.renewEvery())
	defer cancel()
	sent := time.Since(l.base)
	rev, err := l.kv.Create(ctx, leaseKey, l.value())
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	l.wrote(sent, rev)
	l.epoch.Store(rev)
	return true, nil
}

// renew extends the lease; errLeaseLost if another service has it or it
// lapsed, another error if the server could not be asked (the lease may
// still be held).
func (l *lease) renew(ctx context.Context) error {
	l.writes.Lock()
	defer l.writes.Unlock()
	ctx, cancel := context.WithTimeout(ctx, l.renewEvery())
	defer cancel()
	for retried := false; ; retried = true {
		sent := time.Since(l.base)
		rev, err := l.kv.Update(ctx, leaseKey, l.value(), l.rev)
		if err == nil {
			l.wrote(sent, rev)
			return nil
		}
		if !wrongRevision(err) {
			return err
		}
		// A renewal whose answer was lost moved the revision on: the key
		// still names this service, at a revision it did not see.
		e, gerr := l.kv.Get(ctx, leaseKey)
		if retried || gerr != nil || leaseHolderOf(e) != l.id {
			l.drop()
			return errLeaseLost
		}
		l.rev = e.Revision()
	}
}

func wrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// drop stops counting the lease as held.
func (l *lease) drop() { l.until.Store(0) }

// release gives the lease up at once, so that a standby need not wait for
// it to lapse. It deletes the key even where the lease lapsed by this
// service's own clock, which counts it lapsed a margin before the server
// does: renewals that fell behind (a loaded machine) left the key naming
// this service for up to a TTL after it stopped. The delete is of a
// revision that names this service, so never of another service's lease.
func (l *lease) release(ctx context.Context) error {
	l.writes.Lock()
	defer l.writes.Unlock()
	l.drop()
	if l.rev == 0 {
		return nil // never written: a delete without a revision is anyone's
	}
	err := l.kv.Delete(ctx, leaseKey, jetstream.LastRevision(l.rev))
	if wrongRevision(err) {
		// A write whose answer was lost (a renewal cut short as the
		// service stopped) moved the revision on: the key may still name
		// this service, at a revision it did not see.
		e, gerr := l.kv.Get(ctx, leaseKey)
		switch {
		case errors.Is(gerr, jetstream.ErrKeyNotFound):
			err = nil // lapsed
		case gerr != nil:
			err = gerr
		case leaseHolderOf(e) != l.id:
			err = nil // another service's now
		default:
			err = l.kv.Delete(ctx, leaseKey, jetstream.LastRevision(e.Revision()))
		}
	}
	if err == nil {
		l.rev = 0
	}
	return err
}
