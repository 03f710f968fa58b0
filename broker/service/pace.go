package service

import (
	"context"
	"math"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// Learners first. A learner's sample is a handful of goroutine hops through
// the NATS server and the service, each of which waits its turn to run.
// Unthrottled actors can keep every core busy, and then every hop waits in
// a long run queue: on two cores, 16 learners beside 200 producers got a
// seventh of what they got beside 16. The training run waits on the
// learner, not on the actors, so while learners sample and the service's
// goroutines wait too long to run, the service paces the inserts it
// applies, and tells producers, in its progress, to keep fewer items
// unapplied. Their windows fill, they publish less, and the machine's CPU
// goes back to sampling.

const (
	// pacePeriod is how often the pace is revised.
	pacePeriod = 100 * time.Millisecond
	// paceMinWaits is the least number of goroutine wake-ups in a period
	// whose delay says anything; fewer is an idle process.
	paceMinWaits = 50
	// paceDecrease and paceIncrease move the pace per period: down fast
	// when learners wait, back up slowly.
	paceDecrease = 0.7
	paceIncrease = 1.1
	// paceMinShare is the least share of their unpaced rate that actors
	// keep however long learners crowd the machine; paceMinRate is the
	// least pace, in items a second.
	paceMinShare = 0.1
	paceMinRate  = 1000
	// paceLag is how much of the pace, in time, the producers' windows
	// hold together while paced: what learners may lag behind actors.
	paceLag = 100 * time.Millisecond
)

// paceObservation is one period as the pace controller sees it.
type paceObservation struct {
	// learners: sample requests were served in the period.
	learners bool
	// limited: some insert or sample waited for its table's rate limiter
	// in the period. The limiter, not the CPU, then sets the balance of
	// actors and learners: learners held by it wait on inserts, which
	// pacing would slow more, and inserts held by it already wait on the
	// learners.
	limited bool
	// delay is the 90th percentile of how long goroutines waited to run;
	// 0 when too few woke to tell.
	delay time.Duration
	// applied is the items applied, per second.
	applied float64
}

// paceController decides the pace of inserts from period to period.
type paceController struct {
	target time.Duration
	// rate is the items per second the apply loop may apply; 0: unpaced.
	rate float64
	// floor is the least rate of this paced spell.
	floor float64
}

// step revises the pace after a period and returns it.
func (c *paceController) step(o paceObservation) float64 {
	switch {
	case !o.learners || o.limited:
		c.rate = 0
	case o.delay > c.target:
		if c.rate == 0 {
			if o.applied < paceMinRate {
				return 0 // inserts are not what crowds the machine
			}
			c.rate, c.floor = o.applied, max(paceMinRate, paceMinShare*o.applied)
		}
		c.rate = max(c.floor, paceDecrease*min(c.rate, o.applied))
	case c.rate > 0:
		c.rate *= paceIncrease
		if c.rate > 2*max(o.applied, c.floor) {
			c.rate = 0 // the actors no longer reach the pace
		}
	}
	return c.rate
}

// pacer paces the apply loop: the controller's goroutine sets the rate, the
// apply loop waits for its turn.
type pacer struct {
	rate    atomic.Uint64 // math.Float64bits of items per second; 0: unpaced
	samples atomic.Int64  // sample requests served
	applied atomic.Int64  // items applied
	next    time.Time     // owned by the apply loop: when it may go on
}

// paceBurst is how far behind its pace the apply loop may fall and still
// catch up at full speed.
const paceBurst = 10 * time.Millisecond

// applyRate is the current pace, 0 when unpaced.
func (p *pacer) applyRate() float64 { return math.Float64frombits(p.rate.Load()) }

// wait is how long the apply loop should wait before applying more.
func (p *pacer) wait(now time.Time) time.Duration {
	if p.applyRate() == 0 || !p.next.After(now) {
		return 0
	}
	return p.next.Sub(now)
}

// took records n items applied at now.
func (p *pacer) took(now time.Time, n int) {
	p.applied.Add(int64(n))
	r := p.applyRate()
	if r == 0 {
		p.next = time.Time{}
		return
	}
	if p.next.Before(now.Add(-paceBurst)) {
		p.next = now.Add(-paceBurst)
	}
	p.next = p.next.Add(time.Duration(float64(n) / r * float64(time.Second)))
}

// schedDelay reads the runtime's cumulative histogram of how long
// goroutines waited to run.
type schedDelay struct {
	sample [1]metrics.Sample
	last   []uint64
}

func newSchedDelay() *schedDelay {
	d := &schedDelay{}
	d.sample[0].Name = "/sched/latencies:seconds"
	d.read()
	return d
}

// read returns the 90th percentile of the waits since the last read, or 0
// when there were too few.
func (d *schedDelay) read() time.Duration {
	metrics.Read(d.sample[:])
	if d.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0
	}
	h := d.sample[0].Value.Float64Histogram()
	delta := make([]uint64, len(h.Counts))
	for i, c := range h.Counts {
		delta[i] = c
		if i < len(d.last) {
			delta[i] -= d.last[i]
		}
	}
	d.last = append(d.last[:0], h.Counts...)
	return p90(h.Buckets, delta)
}

// p90 is the lower bound of the bucket that holds the 90th percentile of
// counts (counts[i] between buckets[i] and buckets[i+1] seconds), or 0 for
// fewer than paceMinWaits.
func p90(buckets []float64, counts []uint64) time.Duration {
	var n uint64
	for _, c := range counts {
		n += c
	}
	if n < paceMinWaits {
		return 0
	}
	var seen uint64
	for i, c := range counts {
		if seen += c; seen*10 >= n*9 {
			return time.Duration(max(0, buckets[i]) * float64(time.Second))
		}
	}
	return 0
}

// paceLoop revises the pace every pacePeriod until ctx ends, then leaves
// the apply loop unpaced. probe reads the goroutines' delay to run since
// its last call.
func (s *Service) paceLoop(ctx context.Context, probe func() time.Duration) {
	defer s.setPace(0)
	c := paceController{target: s.o.samplePriority}
	t := time.NewTicker(pacePeriod)
	defer t.Stop()
	last := time.Now()
	lastSamples, lastApplied, lastWaits := s.pace.samples.Load(), s.pace.applied.Load(), s.limiterWaits()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		now := time.Now()
		samples, applied, waits := s.pace.samples.Load(), s.pace.applied.Load(), s.limiterWaits()
		was := c.rate
		rate := c.step(paceObservation{
			learners: samples > lastSamples,
			limited:  waits > lastWaits,
			delay:    probe(),
			applied:  float64(applied-lastApplied) / now.Sub(last).Seconds(),
		})
		last, lastSamples, lastApplied, lastWaits = now, samples, applied, waits
		switch {
		case was == 0 && rate > 0:
			s.log.Info("reprise service: pacing inserts so that learners keep their pace", "items_per_second", int64(rate), "sample_priority", s.o.samplePriority)
		case was > 0 && rate == 0:
			s.log.Info("reprise service: inserts no longer paced")
		}
		s.setPace(rate)
	}
}

// limiterWaits is how many inserts and samples have waited for their
// table's rate limiter, over all tables.
func (s *Service) limiterWaits() int64 {
	var n int64
	for _, t := range s.tables {
		c := t.Counters()
		n += c.InsertWaits + c.SampleWaits
	}
	return n
}

// setPace sets the apply loop's pace and the window producers are told to
// keep while paced.
func (s *Service) setPace(rate float64) {
	s.pace.rate.Store(math.Float64bits(rate))
	var window uint32
	if rate > 0 {
		producers := float64(max(1, s.stats.producers.Load()))
		window = uint32(min(math.MaxUint32, max(1, math.Ceil(rate*paceLag.Seconds()/producers))))
	}
	s.progress.setWindow(window)
}

// InsertPace is how many items a second the service currently lets in so
// that learners keep their pace; 0 when it does not pace inserts.
func (s *Service) InsertPace() float64 { return s.pace.applyRate() }
