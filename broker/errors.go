package broker

import (
	"crypto/rand"
	"encoding/hex"
	"errors"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
)

// DefaultPrefix is the subject prefix used when none is configured.
const DefaultPrefix = protocol.DefaultPrefix

// MaxProducerWindow is the largest window a producer may ask for
// (WithMaxInFlight).
const MaxProducerWindow = protocol.MaxProducerWindow

// Errors shared by the producer, the client and the table service (package
// broker/service returns the same values). Match them with errors.Is.
var (
	ErrInvalidPrefix  = protocol.ErrInvalidPrefix
	ErrInvalidOption  = protocol.ErrInvalidOption
	ErrUnknownTable   = protocol.ErrUnknownTable
	ErrRateLimited    = protocol.ErrRateLimited
	ErrRejected       = protocol.ErrRejected
	ErrClosed         = protocol.ErrClosed
	ErrInvalidMessage = protocol.ErrInvalidMessage
	ErrSignature      = protocol.ErrSignature
	ErrHistory        = protocol.ErrHistory
	ErrNotApplied     = protocol.ErrNotApplied
	ErrServer         = protocol.ErrServer
	// ErrNotStored reports a producer's message that JetStream did not
	// store (no stream answered, JetStream refused it, a message too
	// large, a forged dedupe id, the producer closed before sending it):
	// its items are lost. ErrRejected and ErrNotStored together cover
	// every certain loss a producer reports, ErrOutcomeUnknown every
	// possible one.
	ErrNotStored = protocol.ErrNotStored
	// ErrOutcomeUnknown reports a producer's message given up on that
	// JetStream may have stored, its items applied: an attempt to publish
	// it went unanswered (no ack within its timeout, the connection lost
	// with the ack pending, the producer closed while waiting for it) and
	// none said it was not stored. A caller that resends its items may
	// insert them twice; one that counts them lost may count items that
	// are in their tables.
	ErrOutcomeUnknown = protocol.ErrOutcomeUnknown
	// ErrResourceExhausted reports a limit reached: a message, item or
	// reply over one of the service's limits, too many producers, or no
	// free request slot.
	ErrResourceExhausted = protocol.ErrResourceExhausted
	// ErrStreamLost ends a service whose stream was deleted or recreated
	// under it.
	ErrStreamLost = protocol.ErrStreamLost
)

// ErrEpisodeNotEnded reports an EndEpisode that failed before it ended the
// episode: publishing its items failed (the context ended while it waited
// for room in the window, say). The episode is still open, and steps
// appended next would continue it: the next episode's items could
// reference its steps, and the service would keep holding its chunks.
// EndEpisode's other errors came once the episode had ended, from the wait
// for its items.
var ErrEpisodeNotEnded = errors.New("broker: episode not ended")

// Code is the status code of a reply from the table service or of a
// rejection: stable, and the same numbers in every client.
type Code = protocol.Code

// The codes.
const (
	CodeOK                = protocol.CodeOK
	CodeInvalidArgument   = protocol.CodeInvalidArgument
	CodeNotFound          = protocol.CodeNotFound
	CodeRateLimited       = protocol.CodeRateLimited
	CodeUnavailable       = protocol.CodeUnavailable
	CodeInternal          = protocol.CodeInternal
	CodePartial           = protocol.CodePartial
	CodeResourceExhausted = protocol.CodeResourceExhausted
	CodeSignatureMismatch = protocol.CodeSignatureMismatch
)

// StatusError is an error the table service reported, with its code and
// message as they crossed the wire. errors.As gives the code; errors.Is
// matches the error values above by code (CodeRateLimited is
// ErrRateLimited, CodeNotFound ErrUnknownTable, CodeInvalidArgument
// ErrInvalidMessage, CodeResourceExhausted ErrResourceExhausted,
// CodeSignatureMismatch ErrSignature, CodeUnavailable and CodeInternal
// ErrServer). A rejection of what a producer sent wraps both ErrRejected and
// a StatusError.
type StatusError = protocol.StatusError

// newProducerID returns 128 random bits as 32 hex digits: a dedupe id
// prefix nobody else can guess.
func newProducerID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
