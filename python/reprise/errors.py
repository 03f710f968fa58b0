"""Exceptions raised by the Reprise client.

Every exception derives from :class:`RepriseError`. Errors the table service
reports carry its status code (:class:`Code`) and its message; they map to
one class per code, so ``except reprise.RateLimitedError`` works whether the
rate limiter held a sample request or a writer's flush waited too long.
Several classes also derive from the matching builtin (``TimeoutError``,
``ValueError``, ``ConnectionError``) so generic handlers keep working.
"""

from __future__ import annotations

import enum
from typing import Any, cast


class Code(enum.IntEnum):
    """Status codes of the wire (``reprise.v1.Code``); stable."""

    OK = 0
    INVALID_ARGUMENT = 1
    NOT_FOUND = 2
    RATE_LIMITED = 3
    UNAVAILABLE = 4
    INTERNAL = 5
    PARTIAL = 6
    RESOURCE_EXHAUSTED = 7
    SIGNATURE_MISMATCH = 8


class RepriseError(Exception):
    """Base class of every Reprise error. ``code`` is the service's status
    code when the service reported the error, else None."""

    code: Code | None = None
    #: For a sample of a sharded table (:class:`reprise.ShardedClient`) that
    #: failed on some shards: the items the other shards returned (sampled
    #: items are never dropped); None otherwise. :class:`RateLimitedError`
    #: sets it for a sample cut short by a rate limiter.
    partial: Any = None

    def __init__(self, message: str, *, code: Code | int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            try:
                self.code = Code(code)
            except ValueError:
                self.code = None

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (multiprocessing sends what a worker raised so) and
        # copied without the class's __init__, whose arguments differ from
        # class to class (PermissionDeniedError's are keyword-only and
        # required), and a class of several kinds (compound_class) by its
        # name and bases: pickle finds no such class by its name, and
        # another process has not made it yet.
        return _restore, (_spec(type(self)), self.args), self.__dict__


class InvalidArgumentError(RepriseError, ValueError):
    """A request or an item the service (or the client, before sending) finds
    malformed: a bad priority, an empty table name, a step of the wrong
    dtype..."""

    code = Code.INVALID_ARGUMENT


class SignatureMismatchError(InvalidArgumentError):
    """An item's columns do not match its table's signature, or a step's
    column changed dtype or shape. Raised before anything is sent when the
    client can tell."""

    code = Code.SIGNATURE_MISMATCH


class NotFoundError(RepriseError, LookupError):
    """Something named does not exist; the service uses it for unknown
    tables."""

    code = Code.NOT_FOUND


#: The service reports an unknown table as NOT_FOUND.
UnknownTableError = NotFoundError


class RateLimitedError(RepriseError, TimeoutError):
    """The table's rate limiter did not allow the request before its timeout,
    or a sample's reply found no room in the service's reply budget
    (``limits.max_reply_bytes_in_flight``) by then: its items were taken,
    and are lost, as a reply sent after the caller stopped waiting would
    be. For a sample cut short, ``partial`` holds the items that did arrive
    (samples are never dropped)."""

    code = Code.RATE_LIMITED

    def __init__(self, message: str, *, code: Code | int | None = None, partial: Any = None) -> None:
        super().__init__(message, code=code)
        self.partial = partial


class DeadlineExceededError(RepriseError, TimeoutError):
    """The caller's own timeout passed: no reply in time, or a writer's
    flush or wait for the service's progress did not finish (the items may
    still be stored later: a writer keeps retrying them, and says so with
    a :class:`NotStoredError` or :class:`OutcomeUnknownError` when it
    gives up)."""


class _NotSentError(DeadlineExceededError):
    """The caller's timeout passed before a request could be sent: nothing
    was asked, so nothing is known of the service. A sampler with a
    timeout ends on it, as on the rate limiter's timeout."""


class UnavailableError(RepriseError, ConnectionError):
    """No table service answered (it is not running, is shutting down or is
    busy), or the connection was lost while waiting for a reply: the request
    may or may not have been served."""

    code = Code.UNAVAILABLE


class InternalError(RepriseError):
    """The service failed on its side."""

    code = Code.INTERNAL


class ResourceExhaustedError(RepriseError):
    """A limit was reached: a message, item or reply too large, too many
    producers or held messages, no free request slot."""

    code = Code.RESOURCE_EXHAUSTED


class ProtocolError(RepriseError):
    """A reply or chunk that does not decode: a bug or a hostile peer."""


class UnsupportedCodecError(RepriseError):
    """A chunk is compressed with a codec the Python client cannot decode
    (s2). The message names the Go producer option that changes it."""


class ClosedError(RepriseError):
    """The client or writer was closed."""


class PermissionDeniedError(RepriseError, PermissionError):
    """The NATS server refused this connection's user a publish or a
    subscription: its role does not allow the call (``reprisectl
    permissions`` prints what each role may do). Raised at once instead of
    waiting out a timeout for an answer that cannot come. ``operation`` is
    ``"publish"`` or ``"subscribe"`` and ``subject`` the refused subject."""

    def __init__(self, message: str, *, operation: str, subject: str) -> None:
        super().__init__(message)
        self.operation = operation
        self.subject = subject


class EpisodeNotEndedError(RepriseError):
    """A writer's ``end_episode`` raised before it ended the episode:
    publishing its items failed (no room in the window before the
    timeout, say). The episode is still open, and steps appended next
    would continue it: the next episode's items could reference its
    steps, and the service would keep holding its chunks. Call
    ``end_episode`` again before the next episode's first step, unless it
    is a :class:`ClosedError` too (the writer's close gave up while it
    waited for room): no call ends it then. The call made again raises
    the errors this one left (losses, rejections). It is
    also of the class of the failure (``DeadlineExceededError``...), as
    the Go producer's ``ErrEpisodeNotEnded`` wraps it. Any other error of
    ``end_episode`` came once the episode had ended, from the wait for its
    items."""


class NotStoredError(RepriseError):
    """A writer gave up on a message: JetStream did not store it, and its
    items are lost (raised by the writer's next call). It is also of the
    class of the last failure: ``UnavailableError`` when no stream
    answered within the writer's ``retry_for``, ``ResourceExhaustedError``
    for a message JetStream refused as too large..., and a
    :class:`ClosedError` too where the writer's close gave it up while it
    waited to be resent (as the Go producer's error wraps ``ErrClosed``
    beside its last failure). ``sequence`` is the
    writer's message and ``items`` the number of items it held. ``except
    (RejectedError, NotStoredError)`` catches every loss a writer
    reports; a message that may have been stored raises
    :class:`OutcomeUnknownError` instead."""

    def __init__(self, message: str, *, code: Code | int | None = None, sequence: int = 0, items: int = 0) -> None:
        super().__init__(message, code=code)
        self.sequence = sequence
        self.items = items


class OutcomeUnknownError(RepriseError):
    """A writer gave up on a message that JetStream may have stored, its
    items applied: an attempt to publish it went unanswered (no ack within
    the writer's ``ack_timeout``, the writer closed while it waited for
    one) and none said it was not stored (raised by the writer's next
    call). Items sent again may be inserted twice; items counted lost may
    be in their tables. It is also of the class of the last failure
    (``DeadlineExceededError``, ``ClosedError``...), and a
    :class:`ClosedError` too where the writer's close gave it up while it
    waited to be resent, never a
    :class:`NotStoredError`, unless it joins the errors of several
    messages, one of them not stored: it is then of every kind of loss
    among them, as Go's ``errors.Is`` finds each in a joined error.
    ``sequence`` is the writer's message and ``items`` the number of items
    it held."""

    def __init__(self, message: str, *, code: Code | int | None = None, sequence: int = 0, items: int = 0) -> None:
        super().__init__(message, code=code)
        self.sequence = sequence
        self.items = items


class RejectedError(RepriseError):
    """The table service refused part of what a writer sent (reported
    asynchronously, raised by the writer's next call). ``sequence`` is the
    writer's message, ``item_key`` the item (0 for the whole message) and
    ``table`` its table. Use :func:`error_for_code` semantics: ``code``
    tells why, and ``rejections`` lists every refusal when several
    arrived."""

    def __init__(
        self,
        message: str,
        *,
        code: Code | int | None = None,
        sequence: int = 0,
        item_key: int = 0,
        table: str = "",
        rejections: list[RejectedError] | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.sequence = sequence
        self.item_key = item_key
        self.table = table
        self.rejections = rejections or [self]


class DuplicateIdError(NotStoredError, RejectedError):
    """JetStream acknowledged a message that was sent only once as a
    duplicate: another publisher used this writer's dedupe id, and the
    message's items were not stored. A rejection of the whole message, as
    the Go producer reports it (``ErrRejected``)."""

    def __init__(self, message: str, *, sequence: int = 0, items: int = 0) -> None:
        RejectedError.__init__(self, message, sequence=sequence)
        self.items = items


#: A class of several kinds: its name and bases, as compound_class made it.
_Spec = tuple[str, tuple[Any, ...]]

_COMPOUND: dict[tuple[str, tuple[type[RepriseError], ...]], type[RepriseError]] = {}
_COMPOUND_SPEC: dict[type[RepriseError], _Spec] = {}


def compound_class(name: str, bases: tuple[type[RepriseError], ...]) -> type[Any]:
    """The class name of bases, an error of several kinds (a rejection of
    its code's class, a loss of its last failure's...), made once per
    process: one class for each, so that ``type(a) is type(b)`` for errors
    of the same kinds, and pickled by its name and bases (see
    RepriseError.__reduce__)."""
    key = (name, bases)
    cls = _COMPOUND.get(key)
    if cls is None:
        # setdefault keeps one class where two threads make it at once.
        cls = _COMPOUND.setdefault(key, type(name, bases, {}))
        _COMPOUND_SPEC[cls] = (name, tuple(_spec(b) for b in bases))
    return cls


def _spec(cls: type[RepriseError]) -> type[RepriseError] | _Spec:
    """cls as pickled: itself, which pickle finds by its name, or a class
    of several kinds by its name and bases."""
    return _COMPOUND_SPEC.get(cls, cls)


def _class(spec: type[RepriseError] | _Spec) -> type[RepriseError]:
    if isinstance(spec, type):
        return spec
    name, bases = spec
    return compound_class(name, tuple(_class(b) for b in bases))


def bare(cls: type[RepriseError], message: str) -> Any:
    """An instance of cls that says message, made without cls's __init__:
    the caller sets its fields."""
    # The __new__ of the builtin base that lays instances out: that of a
    # class of LookupError and TimeoutError (a rejection joined with a
    # timeout) is OSError's, and its MRO finds LookupError's first, which
    # refuses to make one.
    new = OSError.__new__ if issubclass(cls, OSError) else cls.__new__
    out = new(cls, message)
    out.args = (message,)  # OSError's subclasses leave args to __init__
    return out


def _restore(spec: type[RepriseError] | _Spec, args: tuple[Any, ...]) -> RepriseError:
    """An error unpickled: of the class spec names, with args; pickle then
    sets its fields."""
    out = bare(_class(spec), args[0] if args else "")
    out.args = args
    return cast(RepriseError, out)


_BY_CODE: dict[Code, type[RepriseError]] = {
    Code.INVALID_ARGUMENT: InvalidArgumentError,
    Code.NOT_FOUND: NotFoundError,
    Code.RATE_LIMITED: RateLimitedError,
    Code.UNAVAILABLE: UnavailableError,
    Code.INTERNAL: InternalError,
    Code.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    Code.SIGNATURE_MISMATCH: SignatureMismatchError,
}


def error_for_code(code: int, message: str) -> RepriseError:
    """The exception for a service status code (an unknown code maps to
    RepriseError)."""
    try:
        c = Code(code)
    except ValueError:
        return RepriseError(f"status {code}: {message}")
    cls = _BY_CODE.get(c, RepriseError)
    return cls(message, code=c)


__all__ = [
    "ClosedError",
    "Code",
    "DeadlineExceededError",
    "DuplicateIdError",
    "EpisodeNotEndedError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "NotStoredError",
    "OutcomeUnknownError",
    "PermissionDeniedError",
    "ProtocolError",
    "RateLimitedError",
    "RejectedError",
    "RepriseError",
    "ResourceExhaustedError",
    "SignatureMismatchError",
    "UnavailableError",
    "UnknownTableError",
    "UnsupportedCodecError",
    "error_for_code",
]
