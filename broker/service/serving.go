package service

import (
	"context"
	"sync"
	"time"
)

// requestWorkers run request handlers on goroutines that outlive one
// request. A handler's stack grows past a new goroutine's to pack and send
// a reply; on a fresh goroutine for each request it grew, copied, each
// time (6% of serving a batch of small items). A worker keeps its stack
// while it takes request after request, and ends once idle for
// workerIdle, or when the workers stop.
type requestWorkers struct {
	jobs    chan func()
	quit    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex // orders run's start of a worker before stop's wait
	stopped bool
}

// workerIdle is how long a worker waits for its next request before it
// ends: long enough to outlast the gaps of a learner's steady requests.
const workerIdle = 5 * time.Second

func newRequestWorkers() *requestWorkers {
	return &requestWorkers{jobs: make(chan func()), quit: make(chan struct{})}
}

// run hands job to an idle worker, or to a new one. Once the workers have
// stopped it reports false and runs nothing.
func (w *requestWorkers) run(job func()) bool {
	select {
	case w.jobs <- job:
		return true
	default:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	w.wg.Add(1)
	go w.work(job)
	return true
}

func (w *requestWorkers) work(job func()) {
	defer w.wg.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		job()
		idle.Reset(workerIdle)
		select {
		case job = <-w.jobs:
		case <-idle.C:
			return
		case <-w.quit:
			return
		}
	}
}

// stop ends the workers once their jobs are done, and waits for them.
func (w *requestWorkers) stop() {
	w.mu.Lock()
	if !w.stopped {
		w.stopped = true
		close(w.quit)
	}
	w.mu.Unlock()
	w.wg.Wait()
}

// lazyDeadline is parent with a deadline at at, made when first asked for.
// A sample that the rate limiter lets through at once, the usual one,
// never asks: a deadline made for each (a timer, and a child registered
// with the service's context under its lock) was 2.4% of serving batches
// of small items. It also ends, as canceled, when its request is withdrawn
// (sampleWaits): a withdrawal of a request that never waited costs no
// context either.
type lazyDeadline struct {
	parent context.Context
	at     time.Time
	// next is the following request with the same reply subject, in
	// sampleWaits (under its lock).
	next *lazyDeadline

	mu        sync.Mutex
	ctx       context.Context
	cancel    context.CancelFunc
	withdrawn bool
	// onWithdraw ends a wait past the deadline (whileListened).
	onWithdraw context.CancelFunc
}

func (l *lazyDeadline) made() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil {
		l.ctx, l.cancel = context.WithDeadline(l.parent, l.at)
		if l.withdrawn {
			l.cancel()
		}
	}
	return l.ctx
}

func (l *lazyDeadline) Deadline() (time.Time, bool) { return l.made().Deadline() }
func (l *lazyDeadline) Done() <-chan struct{}       { return l.made().Done() }
func (l *lazyDeadline) Err() error                  { return l.made().Err() }
func (l *lazyDeadline) Value(key any) any           { return l.parent.Value(key) }

// withdraw ends l as canceled, unless stop came first.
func (l *lazyDeadline) withdraw() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.withdrawn = true
	if l.cancel != nil {
		l.cancel()
	}
	if l.onWithdraw != nil {
		l.onWithdraw()
	}
}

// whileListened is ctx, ended too when l is withdrawn (at once if it
// was): a reply whose samples were taken waits for room in the reply
// budget past l's deadline, while its learner may still listen, but not
// once it withdrew.
func (l *lazyDeadline) whileListened(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.withdrawn {
		cancel()
	} else {
		l.onWithdraw = cancel
	}
	return ctx, func() {
		l.mu.Lock()
		l.onWithdraw = nil
		l.mu.Unlock()
		cancel()
	}
}

func (l *lazyDeadline) isWithdrawn() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.withdrawn
}

// stop releases the deadline's timer, if it was made; from then on l is
// its parent.
func (l *lazyDeadline) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil {
		l.ctx, l.cancel = l.parent, func() {}
	}
	l.cancel()
	l.cancel = func() {}
}
