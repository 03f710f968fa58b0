package service

import (
	"sync"

	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/wire"
)

// sampleWaits holds the sample requests being served by their reply
// subjects, so that a withdrawal (SampleRequest.withdraw) finds the one
// it names. NATS request-reply has no cancellation: a learner that stopped
// waiting (a closed sampler, a cancelled call) left its request waiting
// for the rate limiter, which then took the next items for nobody, and a
// queue table lost them.
//
// A request is added in the sample subscription's callback, before its
// handler is spawned, and NATS delivers one client's messages on one
// subject in order: a withdrawal, which the client publishes on the same
// subject after its request, finds the request or comes after it ended.
// An entry lives exactly as long as its request's handler, so the map
// holds at most the requests in flight (requestSlots bounds them).
type sampleWaits struct {
	mu      sync.Mutex
	byReply map[string]*lazyDeadline
}

func newSampleWaits() *sampleWaits {
	return &sampleWaits{byReply: make(map[string]*lazyDeadline)}
}

// add registers l as the wait of the request answered on reply. Requests
// that share a reply subject (only a client of its own making sends them)
// are chained: a withdrawal names the subject, and ends them all.
func (w *sampleWaits) add(reply string, l *lazyDeadline) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l.next = w.byReply[reply]
	w.byReply[reply] = l
}

// remove forgets l, the wait of the request on reply, once it ended.
func (w *sampleWaits) remove(reply string, l *lazyDeadline) {
	w.mu.Lock()
	defer w.mu.Unlock()
	first := w.byReply[reply]
	switch {
	case first == l && l.next == nil:
		delete(w.byReply, reply)
	case first == l:
		w.byReply[reply] = l.next
	default:
		for p := first; p != nil; p = p.next {
			if p.next == l {
				p.next = l.next
				break
			}
		}
	}
	l.next = nil
}

// withdraw ends the waits of the requests on reply; a subject no request
// waits on (answered already, or never sent) changes nothing.
func (w *sampleWaits) withdraw(reply string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for l := w.byReply[reply]; l != nil; l = l.next {
		l.withdraw()
	}
}

// len is how many requests are registered.
func (w *sampleWaits) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, l := range w.byReply {
		for ; l != nil; l = l.next {
			n++
		}
	}
	return n
}

// handleUnanswerable takes a message on the sample subject that came
// without a reply subject: a withdrawal, or a request nobody would read
// the answer of, which is not served (its items would count as sampled,
// and leave a queue, for nobody). It runs in the subscription's callback,
// whatever the lease says: a withdrawal only ever takes less.
func (s *Service) handleUnanswerable(r micro.Request) {
	var req wire.SampleRequest
	if proto.Unmarshal(r.Data(), &req) == nil && req.Withdraw != "" {
		s.waits.withdraw(req.Withdraw)
		return
	}
	if s.rejectLog.allow() {
		s.log.Warn("reprise service: ignoring a sample request without a reply subject")
	}
}
