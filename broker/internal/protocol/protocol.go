// Package protocol holds what the producer, the client and the table
// service must agree on and users never name: the subjects and stream of a
// prefix, the reply headers, the notice token, and the errors both sides
// return (package broker re-exports them).
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
package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultPrefix is the subject prefix used when none is configured.
const DefaultPrefix = "reprise"

// MaxShards bounds the shards of a sharded table: far beyond what one
// deployment runs, and small enough for the wire's uint32.
const MaxShards = 1 << 16

// MaxProducerWindow bounds the messages a producer may have unsettled (its
// WithMaxInFlight) and so the window a message may state.
const MaxProducerWindow = 1 << 16

// Reply headers of a response sent in parts (larger than the server's max
// payload): the part's index and the number of parts.
const (
	HeaderPart  = "Reprise-Part"
	HeaderParts = "Reprise-Parts"
)

// Subjects derives every subject and the stream name from a prefix.
type Subjects struct {
	Prefix string
}

// NewSubjects checks prefix ("" means DefaultPrefix) and returns its
// subjects.
func NewSubjects(prefix string) (Subjects, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	for _, tok := range strings.Split(prefix, ".") {
		if tok == "" || strings.ContainsAny(tok, " \t\r\n*>") {
			return Subjects{}, fmt.Errorf("%w: %q (dot-separated tokens without spaces or wildcards)", ErrInvalidPrefix, prefix)
		}
	}
	return Subjects{Prefix: prefix}, nil
}

func (s Subjects) Insert() string     { return s.Prefix + ".data.insert" }
func (s Subjects) Mutate() string     { return s.Prefix + ".data.mutate" }
func (s Subjects) Reset() string      { return s.Prefix + ".data.reset" }
func (s Subjects) Data() string       { return s.Prefix + ".data.>" }
func (s Subjects) Applied() string    { return s.Prefix + ".applied" }
func (s Subjects) APIGroup() string   { return s.Prefix + ".api" }
func (s Subjects) Sample() string     { return s.APIGroup() + ".sample" }
func (s Subjects) Info() string       { return s.APIGroup() + ".info" }
func (s Subjects) ResetAPI() string   { return s.APIGroup() + ".reset" }
func (s Subjects) Checkpoint() string { return s.APIGroup() + ".checkpoint" }
func (s Subjects) Items() string      { return s.APIGroup() + ".items" }

// Standby is where an active service that stops asks whether a standby
// service of the prefix is there to take over (only services may publish
// or subscribe to it).
func (s Subjects) Standby() string { return s.APIGroup() + ".standby" }

// Owns reports whether subject lies under the prefix.
func (s Subjects) Owns(subject string) bool { return strings.HasPrefix(subject, s.Prefix+".") }

// Stream is the name of the JetStream stream that holds the data subjects:
// the prefix upper-cased with dots turned into underscores.
func (s Subjects) Stream() string {
	return "REPRISE_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(s.Prefix))
}

// CheckpointBucket is the object store bucket of the prefix's checkpoints.
func (s Subjects) CheckpointBucket() string { return s.Stream() + "_CHECKPOINTS" }

// LeaseBucket is the KV bucket of the prefix's lease: which of its table
// services is active.
func (s Subjects) LeaseBucket() string { return s.Stream() + "_LEASE" }

// NoticeToken names a producer in public (in logs and rejections) without
// giving away its secret id, which forms its messages' dedupe ids.
func NoticeToken(producerID string) string {
	sum := sha256.Sum256([]byte("reprise-notice:" + producerID))
	return hex.EncodeToString(sum[:16])
}

// RetryableJSError reports whether a JetStream API call may succeed if
// tried again: the cluster has no meta leader yet, or the server is busy.
func RetryableJSError(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// 10008: JetStream temporarily unavailable (no meta leader yet).
		return apiErr.ErrorCode == 10008 || apiErr.Code == 503
	}
	// Someone else created the stream between the service's look-up and
	// its create: the next attempt finds it and updates it.
	return errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) ||
		errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}
