// Package broker puts Reprise's engine on NATS JetStream. Actors publish
// trajectories through a Producer; a Service consumes the stream, applies it
// to the tables and answers learners; learners sample through a Client.
//
// Every subject lives under one prefix (DefaultPrefix unless set), so several
// deployments can share a NATS server:
//
//	<prefix>.data.insert    InsertBatch messages (JetStream, the write-ahead log)
//	<prefix>.data.mutate    Mutation messages (JetStream)
//	<prefix>.data.reset     table resets (JetStream, published by the service)
//	<prefix>.applied        the service's last applied stream sequence (core NATS)
//	<prefix>.api.sample     sample requests (request-reply, a NATS micro endpoint)
//	<prefix>.api.info       table info (request-reply)
//	<prefix>.api.items      list items by key or page (request-reply)
//	<prefix>.api.reset      reset a table (request-reply)
//	<prefix>.api.checkpoint write a checkpoint now (request-reply)
//
// What the service rejects from a producer goes to the notice subject the
// producer names in its messages, an inbox only its own user may read.
package broker

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// DefaultPrefix is the subject prefix used when none is configured.
const DefaultPrefix = "reprise"

// Errors shared by the producer, the service and the client. Match them
// with errors.Is.
var (
	ErrInvalidPrefix  = errors.New("broker: invalid subject prefix")
	ErrInvalidOption  = errors.New("broker: invalid option")
	ErrUnknownTable   = errors.New("broker: unknown table")
	ErrRateLimited    = errors.New("broker: rate limited")
	ErrRejected       = errors.New("broker: rejected by the table service")
	ErrClosed         = errors.New("broker: closed")
	ErrInvalidMessage = errors.New("broker: invalid message")
	ErrSignature      = errors.New("broker: signature mismatch")
	ErrHistory        = errors.New("broker: trajectory outside the producer's history")
	ErrNotApplied     = errors.New("broker: items not yet applied by the table service")
	ErrServer         = errors.New("broker: table service error")
	// ErrResourceExhausted reports a limit reached: a message, item or
	// reply over one of the service's Limits, too many producers, or no
	// free request slot.
	ErrResourceExhausted = errors.New("broker: resource exhausted")
	// ErrStreamLost ends a service whose stream was deleted or recreated
	// under it.
	ErrStreamLost = errors.New("broker: stream lost")
)

// subjects derives every subject and the stream name from a prefix.
type subjects struct {
	prefix string
}

func newSubjects(prefix string) (subjects, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	for _, tok := range strings.Split(prefix, ".") {
		if tok == "" || strings.ContainsAny(tok, " \t\r\n*>") {
			return subjects{}, fmt.Errorf("%w: %q (dot-separated tokens without spaces or wildcards)", ErrInvalidPrefix, prefix)
		}
	}
	return subjects{prefix: prefix}, nil
}

func (s subjects) insert() string  { return s.prefix + ".data.insert" }
func (s subjects) mutate() string  { return s.prefix + ".data.mutate" }
func (s subjects) reset() string   { return s.prefix + ".data.reset" }
func (s subjects) data() string    { return s.prefix + ".data.>" }
func (s subjects) applied() string { return s.prefix + ".applied" }
func (s subjects) apiGroup() string {
	return s.prefix + ".api"
}
func (s subjects) sample() string { return s.apiGroup() + ".sample" }
func (s subjects) info() string   { return s.apiGroup() + ".info" }
func (s subjects) resetAPI() string {
	return s.apiGroup() + ".reset"
}
func (s subjects) checkpoint() string { return s.apiGroup() + ".checkpoint" }
func (s subjects) items() string      { return s.apiGroup() + ".items" }

// owns reports whether subject lies under the prefix.
func (s subjects) owns(subject string) bool { return strings.HasPrefix(subject, s.prefix+".") }

// noticeToken names a producer in public (in logs and rejections) without
// giving away its secret id, which forms its messages' dedupe ids.
func noticeToken(producerID string) string {
	sum := sha256.Sum256([]byte("reprise-notice:" + producerID))
	return hex.EncodeToString(sum[:16])
}

// newProducerID returns 128 random bits as 32 hex digits: a dedupe id
// prefix nobody else can guess.
func newProducerID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// stream is the name of the JetStream stream that holds the data subjects:
// the prefix upper-cased with dots turned into underscores.
func (s subjects) stream() string {
	return "REPRISE_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(s.prefix))
}
