package protocol

import (
	"errors"
	"fmt"
	"strings"
)

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
	// ErrNotStored reports a producer's message that JetStream did not
	// store: its items are lost.
	ErrNotStored = errors.New("broker: message not stored")
	// ErrOutcomeUnknown reports a producer's message given up on that
	// JetStream may have stored: every answer to it was lost.
	ErrOutcomeUnknown = errors.New("broker: message may be stored")
	// ErrResourceExhausted reports a limit reached: a message, item or
	// reply over one of the service's Limits, too many producers, or no
	// free request slot.
	ErrResourceExhausted = errors.New("broker: resource exhausted")
	// ErrStreamLost ends a service whose stream was deleted or recreated
	// under it.
	ErrStreamLost = errors.New("broker: stream lost")
)

// Code is a status code that replies and rejections carry: stable, the same
// numbers as the wire's reprise.v1.Code, so clients in any language switch
// on them.
type Code int32

// The codes.
const (
	CodeOK Code = iota
	// CodeInvalidArgument: the request or message is malformed or breaks a
	// rule (a bad priority, a missing chunk, a window it is outside of).
	CodeInvalidArgument
	// CodeNotFound: the table does not exist.
	CodeNotFound
	// CodeRateLimited: the table's rate limiter allowed nothing before the
	// request's timeout, or a sample's reply found no room in the service's
	// reply budget (Limits.MaxReplyBytesInFlight) by then.
	CodeRateLimited
	// CodeUnavailable: the service is shutting down or cannot reach
	// JetStream; trying again later may work.
	CodeUnavailable
	// CodeInternal: the service failed.
	CodeInternal
	// CodePartial: fewer items than asked for before the timeout (a reply
	// that still carries items; not an error).
	CodePartial
	// CodeResourceExhausted: a limit was reached (see the service's
	// Limits), or no request slot was free.
	CodeResourceExhausted
	// CodeSignatureMismatch: an item's columns do not match its table's
	// signature.
	CodeSignatureMismatch
)

var codeNames = [...]string{"ok", "invalid_argument", "not_found", "rate_limited", "unavailable", "internal", "partial", "resource_exhausted", "signature_mismatch"}

// String is the code's name in lower case, as metrics label it:
// "rate_limited".
func (c Code) String() string {
	if c >= 0 && int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("code_%d", int32(c))
}

// codeErrors pairs each error code with the error value errors.Is matches
// it with. It is the catalogue: CodeOf and StatusError.Is read it both ways.
var codeErrors = []struct {
	code Code
	err  error
}{
	{CodeInvalidArgument, ErrInvalidMessage},
	{CodeNotFound, ErrUnknownTable},
	{CodeRateLimited, ErrRateLimited},
	{CodeUnavailable, ErrServer},
	{CodeInternal, ErrServer},
	{CodeResourceExhausted, ErrResourceExhausted},
	{CodeSignatureMismatch, ErrSignature},
}

// Sentinel is the error value errors.Is matches a code with.
func (c Code) Sentinel() error {
	for _, ce := range codeErrors {
		if ce.code == c {
			return ce.err
		}
	}
	return ErrServer
}

// CodeOf is the code that reports err across the wire: the code of the
// first catalogued error err wraps, CodeInvalidArgument for any other.
func CodeOf(err error) Code {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code
	}
	for _, ce := range codeErrors {
		if errors.Is(err, ce.err) {
			return ce.code
		}
	}
	return CodeInvalidArgument
}

// StatusError is an error the table service reported: its code and its
// message, as they crossed the wire. Match the kind with errors.Is against
// the catalogue's values (ErrRateLimited, ErrUnknownTable...), or take the
// code with errors.As.
type StatusError struct {
	Code    Code
	Message string
}

// Status turns a reply's code and message into an error: nil for OK and
// Partial.
func Status(code Code, message string) error {
	if code == CodeOK || code == CodePartial {
		return nil
	}
	return &StatusError{Code: code, Message: message}
}

func (e *StatusError) Error() string {
	return "reprise: " + e.Code.String() + ": " + strings.TrimSpace(e.Message)
}

// Is matches the catalogue's error value for the code.
func (e *StatusError) Is(target error) bool { return target == e.Code.Sentinel() }
