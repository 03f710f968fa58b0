package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
)

// Standby services. With WithStandby, every service of a prefix applies the
// stream to its own tables, and the one holding the lease (lease.go) is
// active: it alone answers requests, publishes progress and rejections,
// writes checkpoints and trims the stream. Each of those checks the lease
// just before it acts (mayAct), so a service that lost the lease while
// paused does none of them when it resumes. A service that loses the lease
// stops its endpoints and goes back to following the stream, and takes the
// lease again when it is free.

// HeaderService names, in every reply of a service run with WithStandby,
// the service that answered (its lease value).
const HeaderService = "Reprise-Service"

// A service that took the lease asks the cluster some questions before it
// acts (the checkpoints' epochs, the stream's trim), and renews the lease
// while it waits, for up to takeoverCheckTimeout in all. A question the
// cluster dropped while it elected a leader would go unanswered until its
// deadline, so it is asked again, each try allowed twice as long as the
// one before, from takeoverFirstAttempt: a dropped call costs a couple of
// seconds, and a slow cluster still gets tries long enough to answer. A
// service that gets no answer in time gives the lease up and asks again
// at its next turn.
const (
	takeoverFirstAttempt = 2 * time.Second
	takeoverCheckTimeout = 10 * time.Second
)

// askBeforeActing calls f until it succeeds, fails for good, or ctx ends.
func (s *Service) askBeforeActing(ctx context.Context, what string, f func(context.Context) error) error {
	attempt := takeoverFirstAttempt
	return retryJS(ctx, s.log, what, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, attempt)
		defer cancel()
		attempt *= 2
		return f(actx)
	})
}

// mayAct says whether the service may act for the prefix now: always
// without standby, while it holds the lease with it.
func (s *Service) mayAct() bool { return s.lease == nil || s.lease.held() }

// activate starts the active role's work: the request endpoints, progress
// and periodic checkpoints. stop ends it and waits for the requests in
// progress (their waits end with it).
func (s *Service) activate(parent context.Context) (stop func() error, err error) {
	ctx, cancel := context.WithCancel(parent)
	workers := newRequestWorkers()
	s.closingMu.Lock()
	s.workers = workers
	s.closingMu.Unlock()
	svc, err := s.startMicro(ctx)
	if err != nil {
		cancel()
		workers.stop()
		return nil, err
	}
	var bg sync.WaitGroup
	bg.Go(func() { s.publishProgress(ctx) })
	if s.o.checkpoints != nil && s.o.checkpointEvery > 0 {
		bg.Go(func() { s.checkpointPeriodically(ctx) })
	}
	return func() error {
		cancel()
		stopErr := svc.Stop()
		// The endpoints drain asynchronously: a request may still reach
		// spawn, which refuses it once closing is set.
		s.closingMu.Lock()
		s.closing = true
		s.closingMu.Unlock()
		s.handlers.Wait()
		workers.stop()
		s.closingMu.Lock()
		s.closing = false
		s.closingMu.Unlock()
		bg.Wait()
		return stopErr
	}, nil
}

// lead takes the lease whenever it is free and acts while it holds it,
// until ctx ends. It leaves a lease it acted under held at the end, so
// that the final checkpoint can be written under it; Run releases it.
func (s *Service) lead(ctx context.Context, lose context.CancelCauseFunc) {
	poll := time.NewTicker(s.lease.pollEvery())
	defer poll.Stop()
	var lastErr string
	for {
		ok, err := s.lease.acquire(ctx)
		switch {
		case ctx.Err() != nil:
			if ok {
				// Taken as the service stops: its tables went unchecked.
				s.releaseLease(ctx)
			}
			return
		case err != nil:
			// Logged once per kind of error: a standby asks twice a TTL.
			if err.Error() != lastErr {
				s.log.Warn("reprise service: asking for the lease", "error", err)
				lastErr = err.Error()
			}
		case ok:
			lastErr = ""
			s.holdLease(ctx, lose)
			if ctx.Err() != nil {
				return
			}
		}
		select {
		case <-poll.C:
		case <-ctx.Done():
			return
		}
	}
}

// holdLease acts while the lease is held: it renews the lease, and stops
// the active role's work as soon as the lease is lost.
func (s *Service) holdLease(ctx context.Context, lose context.CancelCauseFunc) {
	took := time.Now()
	// Taking the active role asks the cluster what may take longer than a
	// renewal period, a slow or electing one above all: the lease is
	// renewed meanwhile.
	stopRenewing := s.keepLease(ctx)
	checks, endChecks := context.WithTimeout(ctx, takeoverCheckTimeout)
	epoch, listErr := s.takeEpoch(checks)
	var trimErr error
	if listErr == nil {
		s.log.Info("reprise service: holding the lease; catching up with the stream", "id", s.lease.id, "epoch", epoch, "applied", s.progress.get())
		s.catchUp(checks)
		trimErr = s.checkNotBehindTrim(checks)
	}
	endChecks()
	stopRenewing()
	switch {
	case ctx.Err() != nil:
		// Unchecked, its tables may lack what the trim took: no final
		// checkpoint of them under the lease.
		s.releaseLease(ctx)
		return
	case listErr != nil:
		s.log.Error("reprise service: listing checkpoints before taking the active role; giving the lease up", "error", listErr)
		s.releaseLease(ctx)
		return
	case errors.Is(trimErr, protocol.ErrStreamLost):
		// Serving, it would lack what the checkpoint holds, and its own
		// checkpoints would trim that one away: restarted, it recovers
		// from it.
		s.missedTrim.Store(true)
		s.log.Error("reprise service: giving the lease up and stopping", "error", trimErr)
		s.releaseLease(ctx)
		lose(trimErr)
		return
	case trimErr != nil:
		// Unchecked, it might serve behind the trim; it tries again at
		// its next turn.
		s.log.Warn("reprise service: giving the lease up: cannot tell whether the stream was trimmed past this service", "error", trimErr)
		s.releaseLease(ctx)
		return
	}
	// Stopping the renewals may have cut one short, and the loop's first
	// is a period away.
	if s.lease.held() {
		if err := s.lease.renew(ctx); err != nil && !errors.Is(err, errLeaseLost) {
			s.log.Warn("reprise service: renewing the lease", "error", err)
		}
	}
	if !s.lease.held() {
		s.log.Warn("reprise service: lost the lease while taking the active role; standing by", "id", s.lease.id, "epoch", epoch)
		return
	}
	renew := time.NewTicker(s.lease.renewEvery())
	defer renew.Stop()
	stop, err := s.activate(ctx)
	if err != nil {
		s.log.Error("reprise service: starting the active role; giving the lease up", "error", err)
		s.releaseLease(ctx)
		return
	}
	s.log.Info("reprise service: active", "id", s.lease.id, "epoch", epoch, "applied", s.progress.get(), "catch_up", time.Since(took).Round(time.Millisecond))
	for {
		select {
		case <-renew.C:
		case <-ctx.Done():
			if err := stop(); err != nil {
				s.log.Warn("reprise service: stopping the endpoints", "error", err)
			}
			return
		}
		// After a pause (SIGSTOP, a long GC, a frozen VM) the lease may
		// have lapsed before it could be renewed: anything else the active
		// role does checks the same, first.
		err := errLeaseLost
		if s.lease.held() {
			err = s.lease.renew(ctx)
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, errLeaseLost) && s.lease.held() {
			s.log.Warn("reprise service: renewing the lease", "error", err)
			continue
		}
		s.lease.drop()
		s.log.Warn("reprise service: lost the lease; standing by", "id", s.lease.id, "epoch", epoch, "error", err)
		if err := stop(); err != nil {
			s.log.Warn("reprise service: stopping the endpoints", "error", err)
		}
		return
	}
}

// keepLease renews a held lease, at once and then every renewal period,
// until stop is called: while a service that took the lease asks the
// cluster what it must know before it acts, and from the end of the run's
// apply loop until its final checkpoint is written, since stopping the
// active role's work (a periodic checkpoint in progress, say) and writing
// that of large tables take longer than what is left of the lease. Lease
// writes are ordered, so it may renew beside holdLease.
func (s *Service) keepLease(ctx context.Context) (stop func()) {
	if s.lease == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		renew := time.NewTicker(s.lease.renewEvery())
		defer renew.Stop()
		for s.lease.held() {
			if err := s.lease.renew(ctx); errors.Is(err, errLeaseLost) {
				return // renew dropped it
			}
			select {
			case <-renew.C:
			case <-ctx.Done():
				return
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

// A stopping active service with a standby beside it hands over without
// its final checkpoint: writing one holds the lease, and so every
// producer's applied progress, for as long as copying the tables takes
// (21.7 s for 310 MB in a cluster soak), while the standby already holds
// the tables. Nothing is lost by it: the stream keeps every message since
// the last periodic checkpoint, as after a kill. Without periodic
// checkpoints the final ones are the only ones, and are always written.
// The stopping service waits until the standby serves; where none does
// (the standby was stopped too, or cannot take over), it takes the lease
// back and writes the final checkpoint after all, so that stopping every
// service at once leaves the newest state in a checkpoint, not only in
// the stream, whose limits may drop it.
//
// standbyCallTimeout bounds the question: a standby answers in
// milliseconds, and with none the server says at once that no one
// listens.
const standbyCallTimeout = time.Second

// standbyReply is a standby's answer on protocol.Subjects.Standby.
type standbyReply struct {
	Service         string `json:"service"`
	AppliedSequence uint64 `json:"applied_sequence"`
}

// standbyToTakeOver says which standby service, if any, answers that it
// will take the lease once this active one releases it.
func (s *Service) standbyToTakeOver(ctx context.Context) (standbyReply, bool) {
	if s.lease == nil || s.o.checkpointEvery <= 0 {
		return standbyReply{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, standbyCallTimeout)
	defer cancel()
	m, err := s.nc.RequestWithContext(ctx, s.subj.Standby(), nil)
	if err != nil {
		if !errors.Is(err, nats.ErrNoResponders) {
			s.log.Warn("reprise service: asking for a standby to take over", "error", err)
		}
		return standbyReply{}, false
	}
	var r standbyReply
	if json.Unmarshal(m.Data, &r) != nil || r.Service == "" || r.Service == s.id {
		return standbyReply{}, false
	}
	return r, true
}

// tryHandOver hands over to a standby that answers, if one does. It takes
// the lease's renewals, stopRenewing, and returns the function that stops
// those it runs from then on: none once the lease is released, new ones
// once it is taken back. handedOver false with no error: write the final
// checkpoint, under the lease held.
func (s *Service) tryHandOver(ctx context.Context, stopRenewing func()) (handedOver bool, renewing func(), err error) {
	answer, ok := s.standbyToTakeOver(ctx)
	if !ok {
		return false, stopRenewing, nil
	}
	standby := answer.Service
	s.log.Info("reprise service: handing over to a standby", "standby", standby, "standby_applied_sequence", answer.AppliedSequence, "applied_sequence", s.progress.get())
	stopRenewing()
	holds, err := s.handOver(ctx, standby)
	if err != nil || !holds {
		return err == nil, func() {}, err
	}
	renewing = s.keepLease(ctx)
	handedOver, err = s.tookBack(ctx, standby)
	return handedOver, renewing, err
}

// handOverTimeout is the longest a stopping service waits for a standby
// to serve: the standby takes the lease within a TTL of its release, asks
// its take-over questions, and waits up to TTL/3 to catch up.
func (s *Service) handOverTimeout() time.Duration { return 2*s.lease.ttl + takeoverCheckTimeout }

// handOver releases the lease and waits until another service serves the
// prefix: answers an info request, which a standby does only once it took
// the lease and asked its take-over questions. It takes the lease back
// (holds) if the lease stays free for a TTL, or nobody serves within
// handOverTimeout and the lease is free then; it fails when it can do
// neither: nobody serves, and nobody wrote a final checkpoint.
func (s *Service) handOver(ctx context.Context, standby string) (holds bool, err error) {
	s.releaseLease(ctx)
	wait, cancel := context.WithTimeout(ctx, s.handOverTimeout())
	defer cancel()
	// The standby tries to take the lease every pollEvery: look a few
	// times as often, so that stopping takes little longer than the
	// take-over.
	poll := time.NewTicker(s.lease.pollEvery() / 4)
	defer poll.Stop()
	freeSince := time.Now()
	for {
		if s.servedByAnother(wait, standby) {
			return false, nil
		}
		holder, err := s.leaseHolder(wait)
		switch {
		case err != nil: // cannot tell
		case holder != "":
			freeSince = time.Now()
		case time.Since(freeSince) >= s.lease.ttl:
			if ok, err := s.lease.acquire(ctx); err == nil && ok {
				return true, nil
			}
			freeSince = time.Now()
		}
		select {
		case <-poll.C:
		case <-wait.Done():
			// A last, longer look: the standby may be serving, its
			// answers slow.
			if s.servedByAnother(ctx, standby) {
				return false, nil
			}
			if ok, err := s.lease.acquire(ctx); err == nil && ok {
				return true, nil
			}
			return false, fmt.Errorf("broker: no final checkpoint: the standby %s answered that it would take over, but no service served within %v, and the lease could not be taken back", standby, s.handOverTimeout())
		}
	}
}

// servedByAnother says whether another service serves the prefix now, and
// logs the hand-over if so.
func (s *Service) servedByAnother(ctx context.Context, standby string) bool {
	ctx, cancel := context.WithTimeout(ctx, s.lease.renewEvery())
	defer cancel()
	m, err := s.nc.RequestWithContext(ctx, s.subj.Info(), nil)
	if err != nil || m.Header.Get(micro.ErrorCodeHeader) != "" {
		return false
	}
	by := m.Header.Get(HeaderService)
	if by == "" || by == s.id {
		return false
	}
	s.log.Info("reprise service: a standby took over; no final checkpoint", "standby", by, "answered", standby, "applied_sequence", s.progress.get())
	return true
}

// tookBack decides, once a stopping service has taken the lease back
// after a hand-over that did not happen, whether to skip its final
// checkpoint all the same: where another service was active meanwhile and
// wrote a checkpoint of a newer epoch, which recovery ranks above one of
// this service's epoch, and whose needs this service's trim would not
// see.
func (s *Service) tookBack(ctx context.Context, standby string) (handedOver bool, err error) {
	newest, err := s.newestCheckpointEpoch(ctx)
	if err != nil {
		return false, fmt.Errorf("broker: no final checkpoint: listing the checkpoints after taking the lease back: %w", err)
	}
	if newest > s.epoch.Load() {
		s.log.Info("reprise service: another service was active since the lease was released; no final checkpoint", "answered", standby, "its_epoch", newest)
		return true, nil
	}
	s.log.Warn("reprise service: the standby that answered did not take over; writing the final checkpoint", "answered", standby)
	return false, nil
}

// leaseHolder is the service that holds the lease by the bucket ("" if
// none).
func (s *Service) leaseHolder(ctx context.Context) (string, error) {
	holder, _, err := s.leaseEntry(ctx)
	return holder, err
}

// leaseEntry reads the lease's key: its holder and the newest checkpoint
// the holder wrote ("" and "" if none holds it).
func (s *Service) leaseEntry(ctx context.Context) (holder, checkpoint string, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.lease.renewEvery())
	defer cancel()
	e, err := s.lease.kv.Get(ctx, leaseKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	holder, checkpoint = leaseValue(e.Value())
	return holder, checkpoint, nil
}

// answerStandbyCall tells a stopping active service that this standby
// follows the stream and will take the lease.
func (s *Service) answerStandbyCall(m *nats.Msg) {
	if s.mayAct() {
		return // the active service, or one taking over
	}
	// Only services may ask, but shards may share a service user, whose
	// rights reach every shard's lease bucket: see answerSubjectError.
	if m.Reply == "" || s.replySubjectError(m.Reply) != "" {
		return
	}
	data, err := json.Marshal(standbyReply{Service: s.id, AppliedSequence: s.progress.get()})
	if err != nil {
		return
	}
	_ = m.Respond(data)
}

func (s *Service) releaseLease(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.lease.renewEvery())
	defer cancel()
	if err := s.lease.release(ctx); err != nil {
		s.log.Warn("reprise service: releasing the lease", "error", err)
	}
}

// catchUp waits, for at most a renewal period, until the tables hold what
// the stream held when the lease was taken: what the previous active
// service acknowledged is then sampleable before the first request is
// answered. A table whose rate limiter holds inserts in a full queue may
// keep it from catching up; it serves anyway after the wait.
func (s *Service) catchUp(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.lease.renewEvery())
	defer cancel()
	info, err := s.stream.Info(ctx)
	if err != nil {
		s.log.Warn("reprise service: reading the stream's last sequence before serving", "error", err)
		return
	}
	if err := s.progress.waitFor(ctx, info.State.LastSeq); err != nil {
		s.log.Warn("reprise service: serving before the tables caught up with the stream", "applied", s.progress.get(), "stream_last", info.State.LastSeq)
	}
}

// checkNotBehindTrim reports a service about to take the active role whose
// tables lack stream messages that the stream no longer has and a
// checkpoint holds (ErrStreamLost): a standby whose reader fell behind the
// former active service's trim (a rate limiter held its inserts, say) and
// has not reached the gap yet. It returns another error when it cannot
// tell: the stream's state or the checkpoints could not be read in time.
func (s *Service) checkNotBehindTrim(ctx context.Context) error {
	var info *jetstream.StreamInfo
	err := s.askBeforeActing(ctx, "the stream's state", func(ctx context.Context) (err error) {
		info, err = s.stream.Info(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("reading the stream's state: %w", err)
	}
	next := s.progress.get() + 1
	if info.State.FirstSeq <= next {
		return nil
	}
	var name string
	err = s.askBeforeActing(ctx, "the checkpoints", func(ctx context.Context) (err error) {
		name, err = s.checkpointHolding(ctx, next)
		return err
	})
	if err != nil {
		return err
	}
	if name != "" {
		return fmt.Errorf("%w: the stream holds messages from sequence %d on, this service applied them up to %d, and checkpoint %s holds the rest; restart it to recover from that checkpoint", protocol.ErrStreamLost, info.State.FirstSeq, next-1, name)
	}
	return nil
}

// takeEpoch sets the epoch of the checkpoints this service writes while it
// holds the lease: above every epoch already in the checkpoint store, so
// that recovery prefers them over any a former active service writes late.
func (s *Service) takeEpoch(ctx context.Context) (uint64, error) {
	epoch := s.lease.epoch.Load()
	if s.o.checkpoints != nil {
		newest, err := s.newestCheckpointEpoch(ctx)
		if err != nil {
			return 0, err
		}
		epoch = max(epoch, newest+1)
	}
	s.epoch.Store(epoch)
	return epoch, nil
}

// newestCheckpointEpoch is the highest epoch among the stored checkpoints
// (0 if none).
func (s *Service) newestCheckpointEpoch(ctx context.Context) (uint64, error) {
	var names []string
	err := s.askBeforeActing(ctx, "the checkpoints", func(ctx context.Context) (err error) {
		names, err = s.o.checkpoints.List(ctx)
		return err
	})
	if err != nil {
		return 0, err
	}
	var newest uint64
	for _, name := range names {
		if e, _, ok := parseCheckpointName(name); ok {
			newest = max(newest, e)
		}
	}
	return newest, nil
}

// holdsOrSucceeds says whether a store listing names (sorted) holds newest,
// one written after it, or another of its epoch: only the service of that
// epoch writes those, so the store is the one it writes to (newest itself
// may have been deleted as damaged since, by another service).
func holdsOrSucceeds(names []string, newest string) bool {
	if len(names) > 0 && names[len(names)-1] >= newest {
		return true
	}
	epoch, _, ok := parseCheckpointName(newest)
	if !ok || epoch == 0 {
		return false
	}
	return slices.ContainsFunc(names, func(n string) bool {
		e, _, ok := parseCheckpointName(n)
		return ok && e == epoch
	})
}

// sharedCheckpointWait bounds how long a standby waits for the newest
// checkpoint the active service wrote to show in its own checkpoint store
// (a shared file system may show a new file late).
const sharedCheckpointWait = 10 * time.Second

// checkSharedCheckpoints makes sure this standby reads the checkpoints the
// active service writes: that one trims the stream below them, and a
// standby that cannot read them (each machine keeping its own directory)
// takes the trimmed messages for ones the stream's limits dropped, and
// takes over without them. The lease names the newest checkpoint its
// holder wrote; the standby's store must hold it, or a newer one.
func (s *Service) checkSharedCheckpoints(ctx context.Context) error {
	if s.lease == nil || s.o.checkpoints == nil {
		return nil
	}
	deadline := time.Now().Add(sharedCheckpointWait)
	for {
		holder, newest, err := s.leaseEntry(ctx)
		if err != nil {
			return nil // the lease's bucket cannot say now; the next check may
		}
		if holder == s.id || newest == "" || s.damaged[newest] {
			return nil // a damaged one this service deleted was in its store
		}
		names, err := s.o.checkpoints.List(ctx)
		if err != nil || holdsOrSucceeds(names, newest) {
			return nil // a store that cannot list says nothing of this
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: the active service %s wrote checkpoint %s, which this standby's checkpoint store does not hold: every service of a prefix must read the same checkpoints (the default object store, or one directory that all of them mount), since the active one trims the stream below its own", protocol.ErrInvalidOption, holder, newest)
		}
		if !pause(ctx, s.lease.renewEvery()) {
			return ctx.Err()
		}
	}
}
