"""The actor side: the Python twin of broker/producer.go, flow.go and
trajectory.go.

``_Producer`` holds the writer's state under one lock and never blocks while
holding it: a call that needs room in the window gets ``_Blocked`` back and
waits (a thread on a condition variable, a coroutine on a future) for the
window to change, then tries again. Publishing and acks run on the client's
event loop (``_Transport``); finished messages are handed to it without
waiting for it.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import hashlib
import json
import logging
import math
import random
import secrets
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

import nats
import numpy as np
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from . import _codec, errors
from ._conn import Denials, Subjects
from ._proto import reprise_pb2 as pb

log = logging.getLogger("reprise")

_E = TypeVar("_E", bound=errors.RepriseError)

#: Header JetStream deduplicates on.
MSG_ID_HEADER = "Nats-Msg-Id"

#: The most shards a table may be spread over (the service's MaxShards).
MAX_SHARDS = 1 << 16

_KEY_MAX = (1 << 64) - 1


def new_producer_id() -> str:
    """128 bits from a CSPRNG as 32 lowercase hex digits: secret, since with
    the sequence it forms the dedupe id."""
    return secrets.token_hex(16)


def notice_token(producer_id: str) -> str:
    """The producer's public name: the last token of its rejection subject."""
    return hashlib.sha256(b"reprise-notice:" + producer_id.encode()).hexdigest()[:32]


def msg_id(producer_id: str, sequence: int) -> str:
    """The JetStream dedupe id of a producer's message, as the Go producer
    sets it."""
    return f"{producer_id}-{sequence}"


def decode_progress(data: bytes) -> tuple[int, dict[str, int], int]:
    """The service's progress message (``<prefix>.applied``): the stream
    sequence applied, the tables applied only up to an earlier sequence,
    and the bound on unapplied items while the service paces inserts (0:
    none)."""
    prog = pb.Progress.FromString(data)
    return prog.applied_sequence, {h.table: h.applied_sequence for h in prog.held}, prog.max_unapplied


@dataclasses.dataclass(frozen=True)
class WriterOptions:
    """A writer's settings; the defaults are the Go producer's."""

    #: Steps of a column per chunk (broker.WithChunkLength). Longer chunks
    #: compress better; a learner receives whole chunks.
    chunk_length: int = 1
    #: "zstd" or "none" (broker.WithCompression; s2 has no Python encoder).
    #: A chunk zstd would not shrink by an eighth is stored uncompressed,
    #: and a column whose chunks keep not shrinking is spared zstd for up to
    #: MAX_COMPRESSION_BACKOFF chunks at a time, as the Go producer does.
    compression: str = "zstd"
    #: Delta-encode integer columns along the step axis (broker.WithDelta).
    delta: bool = True
    #: How many recent steps items may reference (broker.WithHistory;
    #: Reverb's num_keep_alive_refs).
    num_keep_alive_refs: int = 128
    #: Messages published and not yet settled (broker.WithMaxInFlight); also
    #: the window every message declares.
    max_in_flight: int = 256
    #: Items published and not yet applied by the service
    #: (broker.WithMaxUnapplied): the writer blocks beyond it. While the
    #: service paces inserts so that learners keep their pace, it may set
    #: a smaller bound.
    max_unapplied: int = 4096
    #: A message is published once it holds this many items or bytes.
    batch_items: int = 64
    batch_bytes: int = 256 << 10
    #: How long a partly filled batch waits for more items, seconds.
    linger: float = 0.001
    #: How long a failed publish is retried, seconds (below the stream's
    #: 2-minute dedupe window).
    retry_for: float = 60.0
    #: How long to wait for JetStream's ack before resending, seconds.
    ack_timeout: float = 5.0
    #: Check items against their table's signature before sending.
    validate_signatures: bool = True
    #: ``flush`` returns once JetStream stored the items (durable), a round
    #: trip sooner, instead of once the service applied them (visible to a
    #: sample), which is what Reverb's flush does (broker.WithReturnOnStore).
    return_on_store: bool = False
    #: ``(index, count)``: every item key is ``index`` modulo ``count``, as
    #: shard ``index`` of a table spread over ``count`` reprised
    #: (``reprised --shard``) requires; None: any key. The writers of a
    #: :class:`ShardedClient` and of its ``shard(i)`` clients set it.
    key_shard: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        for name in ("chunk_length", "num_keep_alive_refs", "max_in_flight", "max_unapplied", "batch_items", "batch_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise errors.InvalidArgumentError(f"{name} must be an int >= 1, got {v!r}")
        if self.compression not in ("zstd", "none"):
            raise errors.InvalidArgumentError(
                f"compression {self.compression!r}: the Python writer writes 'zstd' or 'none'"
            )
        if self.linger < 0 or self.retry_for <= 0 or self.ack_timeout <= 0:
            raise errors.InvalidArgumentError("linger must be >= 0, retry_for and ack_timeout > 0")
        if self.key_shard is not None:
            ks = self.key_shard
            if (
                not isinstance(ks, tuple)
                or len(ks) != 2
                or not all(isinstance(v, int) for v in ks)
                or not 1 <= ks[1] <= MAX_SHARDS
                or not 0 <= ks[0] < ks[1]
            ):
                raise errors.InvalidArgumentError(
                    f"key_shard must be (index, count) with 1 <= count <= {MAX_SHARDS} and 0 <= index < count, got {ks!r}"
                )


# ---------------------------------------------------------------- protobuf bits


def _varint(v: int) -> bytes:
    """The protobuf varint of 0 <= v < 2**64."""
    if 0 <= v < 0x4000:
        return _VARINT14[v]
    if v < 0:
        raise ValueError(f"varint of {v}: negative (callers encode int64 as its two's complement)")
    # 14 bits a step through a table: item and chunk keys are random 64-bit
    # numbers, whose 10 bytes one at a time cost a writer more than
    # anything else it does per item. Nearly every key has its top byte
    # set, and one join of its five groups costs two thirds of the loop.
    if v >> 56:
        if v >> 64:
            raise ValueError(f"varint of {v}: over 64 bits")
        return b"".join((_CONT14[v & 0x3FFF], _CONT14[v >> 14 & 0x3FFF], _CONT14[v >> 28 & 0x3FFF],
                         _CONT14[v >> 42 & 0x3FFF], _VARINT14[v >> 56]))
    parts = []
    while v >= 0x4000:
        parts.append(_CONT14[v & 0x3FFF])
        v >>= 14
    parts.append(_VARINT14[v])
    return b"".join(parts)


_uvarint = _varint


#: Keys a writer draws at a time: numpy draws and encodes a pool of them for
#: less than encoding one key in Python costs.
_KEY_POOL = 1024
_GROUP_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)


def random_key_varints(rng: random.Random, n: int) -> list[bytes]:
    """The varints of n keys drawn uniformly from the 64-bit numbers but 0
    (0 is no key on the wire), from rng's bytes."""
    keys = np.frombuffer(rng.randbytes(8 * n), dtype="<u8").copy()
    keys[keys == 0] = 1
    groups = keys[:, None] >> _GROUP_SHIFTS
    lengths = np.count_nonzero(groups, axis=1)  # a key's groups above its top bit are 0
    more = np.arange(10) < (lengths - 1)[:, None]
    flat = ((groups & 0x7F).astype(np.uint8) | (more.view(np.uint8) << 7)).tobytes()
    return [flat[10 * i : 10 * i + ln] for i, ln in enumerate(lengths.tolist())]


def _field_bytes(num: int, b: bytes) -> bytes:
    return _varint(num << 3 | 2) + _uvarint(len(b)) + b


# The varints of 0 to 2**14-1, and the two continued bytes of each 14-bit
# group of a larger number (low group first, as varints go).
_VARINT14 = [bytes([i]) for i in range(0x80)] + [bytes(((i & 0x7F) | 0x80, i >> 7)) for i in range(0x80, 0x4000)]
_CONT14 = [bytes(((i & 0x7F) | 0x80, (i >> 7) | 0x80)) for i in range(0x4000)]


_DOUBLE = struct.Struct("<d")


def encode_chunk_fast(
    header: bytes,
    key_varint: bytes,
    length: int,
    arr: np.ndarray,
    compression: str,
    delta: bool,
    episode_field: bytes,
    episode_step: int,
) -> tuple[bytes, bool]:
    """An encoded Chunk, as _codec.encode_chunk makes it, written directly,
    and whether it is compressed: ``header`` holds the fields that are the
    same for every chunk of a column (dtype and step shape); ``arr`` holds
    the ``length`` steps (one step may come without the step axis)."""
    if delta and length > 1:
        arr = _codec.delta_encode(arr)
    raw = arr.tobytes()
    raw_size = len(raw)
    comp = 0
    data = raw
    if compression == "zstd" and raw_size > 0:
        z = _codec._local.compressor.compress(raw)
        if len(z) <= raw_size - raw_size // 8:
            comp, data = 1, z
    parts = [b"\x08", key_varint, header, b"\x20", _uvarint(length)]
    if comp:
        parts.append(b"\x28\x01")
    if delta:
        parts.append(b"\x30\x01")
    if raw_size:
        parts += [b"\x38", _uvarint(raw_size)]
    if data:
        parts += [b"\x42", _uvarint(len(data)), data]
    parts.append(episode_field)
    if episode_step:
        parts += [b"\x50", _varint(episode_step)]
    return b"".join(parts), comp == 1


def chunk_header(dtype: str, step_shape: tuple[int, ...]) -> bytes:
    """Fields 2 (dtype) and 3 (step_shape, packed) of a Chunk."""
    out = _field_bytes(2, dtype.encode())
    if step_shape:
        out += _field_bytes(3, b"".join(_varint(d) for d in step_shape))
    return out


def encode_item(key: bytes, table: bytes, priority: float, columns: list[bytes], policy_version: int = 0) -> bytes:
    """An encoded Item; ``key`` is the key's varint, ``table`` the field
    already encoded, ``columns`` the encoded TrajectoryColumn fields."""
    parts = [b"\x08", key, table]
    # proto3 leaves out a priority of +0.0 (but not -0.0).
    if priority != 0.0 or str(priority)[0] == "-":
        parts += [b"\x19", _DOUBLE.pack(priority)]
    parts += columns
    if policy_version:
        # int64 on the wire: a negative value is its two's complement.
        parts += [b"\x28", _varint(policy_version & 0xFFFFFFFFFFFFFFFF)]
    return b"".join(parts)


def _slice_field(key: bytes, off: int, ln: int) -> bytes:
    """An encoded ChunkSlice field (tag 2 of TrajectoryColumn) from its
    chunk's key varint."""
    # Here and in the writer's other per-item encodings, lengths under
    # 2**14 are read from the table without the call to _varint: a call
    # costs more than the lookup.
    v = _VARINT14[ln] if ln < 0x4000 else _varint(ln)
    if off:
        sl = b"".join((b"\x08", key, b"\x10", _uvarint(off), b"\x18", v))
    else:
        sl = b"".join((b"\x08", key, b"\x18", v))
    return b"\x12" + _VARINT14[len(sl)] + sl  # under 40 bytes


def encode_column(name: bytes, slice_fields: list[bytes], squeeze: bool) -> bytes:
    """An encoded TrajectoryColumn field (tag 4 of Item) from the encoded
    name field and ChunkSlice fields."""
    body = b"".join((name, *slice_fields, b"\x18\x01")) if squeeze else b"".join((name, *slice_fields))
    n = len(body)
    return b"".join((b"\x22", _VARINT14[n] if n < 0x4000 else _varint(n), body))


def encode_insert_batch(
    producer_id: str,
    sequence: int,
    chunks: Sequence[bytes],
    items: Sequence[bytes],
    release: Sequence[int],
    end: bool,
    window_start: int,
    window: int,
    notice: str = "",
) -> bytes:
    """An encoded InsertBatch from already encoded chunks and items, fields
    in number order as protobuf writes them."""
    return encode_insert_batch_fields(
        producer_id, sequence, [b"\x1a" + _uvarint(len(c)) + c for c in chunks],
        [b"\x22" + _uvarint(len(it)) + it for it in items], [_varint(k) for k in release], end, window_start,
        window, notice,
    )


def encode_insert_batch_fields(
    producer_id: str,
    sequence: int,
    chunk_fields: Sequence[bytes],
    item_fields: Sequence[bytes],
    release: Sequence[bytes],
    end: bool,
    window_start: int,
    window: int,
    notice: str = "",
) -> bytes:
    """encode_insert_batch from chunk and item fields already prefixed with
    their tags and lengths, and the varints of the keys to release."""
    parts = [_field_bytes(1, producer_id.encode())]
    if sequence:
        parts.append(b"\x10" + _varint(sequence))
    parts += chunk_fields
    parts += item_fields
    if release:
        parts.append(_field_bytes(5, b"".join(release)))
    if end:
        parts.append(b"\x30\x01")
    if window_start:
        parts.append(b"\x38" + _varint(window_start))
    if window:
        parts.append(b"\x40" + _varint(window))
    if notice:
        parts.append(_field_bytes(9, notice.encode()))
    return b"".join(parts)


# ---------------------------------------------------------------- history


@dataclasses.dataclass(frozen=True)
class TrajectoryColumn:
    """Steps ``[start, stop)`` of one column of the current episode, as
    picked from :attr:`TrajectoryWriter.history`. ``squeeze`` (a single step
    picked with an integer index) drops the step axis."""

    column: str
    start: int
    stop: int
    squeeze: bool
    episode: int

    def __len__(self) -> int:
        return self.stop - self.start


_new_object = object.__new__


class ColumnHistory:
    """The steps of one column a writer can still reference: index it like a
    list of the episode's steps. ``h[-1]`` is the newest step (squeezed),
    ``h[-3:]`` the last three, ``h[i]`` step i of the episode."""

    def __init__(self, producer: _Producer, column: str) -> None:
        self._p = producer
        self._column = column

    def __len__(self) -> int:
        return self._p.episode_steps

    def __getitem__(self, index: int | slice) -> TrajectoryColumn:
        p = self._p
        n, ep = p.episode_steps, p._episode
        if type(index) is int and -n <= index < n:
            # The common pick, h[-1]: a frozen dataclass's __init__ sets
            # each field through object.__setattr__, which costs more than
            # the rest of picking it.
            j = index + n if index < 0 else index
            tc = _new_object(TrajectoryColumn)
            tc.__dict__.update(column=self._column, start=j, stop=j + 1, squeeze=True, episode=ep)
            return tc
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                raise errors.InvalidArgumentError(f"column {self._column!r}: history slices need step 1, got {step}")
            if stop <= start:
                raise errors.InvalidArgumentError(
                    f"column {self._column!r}: history[{index.start}:{index.stop}] selects no step (the episode has {n})"
                )
            return TrajectoryColumn(self._column, start, stop, False, ep)
        i = int(index)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise errors.InvalidArgumentError(f"column {self._column!r}: step {i} out of range (the episode has {n})")
        return TrajectoryColumn(self._column, j, j + 1, True, ep)

    def __repr__(self) -> str:
        return f"ColumnHistory({self._column!r}, steps={len(self)})"


class History(Mapping[str, ColumnHistory]):
    """Column name to :class:`ColumnHistory`, for every column appended."""

    def __init__(self, producer: _Producer) -> None:
        self._p = producer
        # A writer's columns are never dropped: one view each, made once.
        self._views: dict[str, ColumnHistory] = {}

    def __getitem__(self, column: str) -> ColumnHistory:
        h = self._views.get(column)
        if h is None:
            if column not in self._p.columns:
                raise KeyError(column)
            h = self._views[column] = ColumnHistory(self._p, column)
        return h

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._p.columns))

    def __len__(self) -> int:
        return len(self._p.columns)


# ---------------------------------------------------------------- state


class _Sealed:
    __slots__ = ("key_varint", "start", "length", "encoded", "sent", "whole")

    def __init__(self, key_varint: bytes, start: int, length: int, encoded: bytes) -> None:
        self.key_varint = key_varint
        self.start = start
        self.length = length
        self.encoded: bytes | None = encoded  # None once sent
        self.sent = False
        # The slice field of an item column that takes every step of the
        # chunk, as most do (_slice_field's, written out: a writer seals a
        # chunk a step).
        v = _VARINT14[length] if length < 0x4000 else _varint(length)
        self.whole = b"".join((b"\x12", _VARINT14[2 + len(key_varint) + len(v)], b"\x08", key_varint, b"\x18", v))


#: The most chunks a column stores uncompressed before it tries zstd again
#: (the Go producer's maxCompressionBackoff).
MAX_COMPRESSION_BACKOFF = 64


class _Column:
    __slots__ = (
        "name",
        "dtype",
        "wire",
        "shape",
        "open",
        "open_start",
        "chunks",
        "header",
        "delta",
        "skip",
        "after",
        "single",
        "name_field",
    )

    def __init__(self, name: str, dtype: np.dtype, shape: tuple[int, ...], delta: bool) -> None:
        self.name = name
        self.dtype = _codec.DTYPES[_codec.dtype_name(dtype)]
        self.wire = _codec.dtype_name(dtype)
        self.shape = shape
        self.header = chunk_header(self.wire, shape)
        self.delta = delta and _codec.is_integer(self.wire)
        self.name_field = _name_field(name)
        # What follows the key in every uncompressed chunk of one step
        # (length, flags, sizes), up to its bytes: such chunks are encoded
        # from it without encode_chunk_fast's decisions.
        nbytes = self.dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        self.single = self.header + b"\x20\x01" + (b"\x30\x01" if self.delta else b"")
        if nbytes:
            self.single += b"\x38" + _uvarint(nbytes) + b"\x42" + _uvarint(nbytes)
        self.open: list[np.ndarray] = []
        self.open_start = 0
        self.chunks: collections.deque[_Sealed] = collections.deque()
        # Random floats and encoded images stay uncompressed, and zstd
        # costs more than storing them: after each try that leaves a chunk
        # uncompressed, the next ``skip`` chunks are stored without trying,
        # twice as many as after the previous one (``after``), up to
        # MAX_COMPRESSION_BACKOFF; a chunk stored compressed ends the
        # backoff.
        self.skip = 0
        self.after = 0

    def codec(self, compression: str) -> str:
        """The codec the column's next chunk is encoded with, given the
        writer's compression; counts a skipped chunk. Delta stays as asked,
        so that a column's chunks all say the same of it."""
        if compression == "none" or not self.skip:
            return compression
        self.skip -= 1
        return "none"

    def record(self, compressed: bool) -> None:
        """Notes what a try of zstd gave: whether the chunk is stored
        compressed."""
        if compressed:
            self.skip = self.after = 0
        else:
            self.after = min(max(1, 2 * self.after), MAX_COMPRESSION_BACKOFF)
            self.skip = self.after

    def covers(self, start: int, stop: int) -> int:
        """The first step in [start, stop) without a cell, or stop."""
        if self.chunks and not self.open:
            newest = self.chunks[-1]
            if newest.start <= start and stop <= newest.start + newest.length:
                return stop  # the common item: steps of the newest chunk
        # Chunks are sorted by start and items reference recent steps: walk
        # back from the newest to the first chunk that reaches start.
        spans = []
        for ch in reversed(self.chunks):
            if ch.start + ch.length <= start:
                break
            if ch.start < stop:
                spans.append((ch.start, ch.start + ch.length))
        if self.open:
            spans.append((self.open_start, self.open_start + len(self.open)))
        nxt = start
        for lo, hi in sorted(spans):
            if lo <= nxt < hi:
                nxt = hi
        return min(nxt, stop)


@functools.lru_cache(maxsize=4096)
def _name_field(name: str) -> bytes:
    return _field_bytes(1, name.encode())


@functools.lru_cache(maxsize=4096)
def _table_field(table: str) -> bytes:
    return _field_bytes(2, table.encode())


class _Ref:
    """A column of an item: steps [start, stop) of a writer's column."""

    __slots__ = ("name", "col", "start", "stop", "squeeze", "name_field")

    def __init__(self, name: str, col: _Column, start: int, stop: int, squeeze: bool) -> None:
        self.name = name
        self.col = col
        self.start = start
        self.stop = stop
        self.squeeze = squeeze
        self.name_field = col.name_field if name == col.name else _name_field(name)


class _Pending:
    """An item created and not yet in a batch."""

    __slots__ = ("table", "priority", "key", "refs", "policy_version", "table_field")

    def __init__(self, table: str, priority: float, key: bytes, refs: list[_Ref], policy_version: int = 0) -> None:
        self.table = table
        self.priority = priority
        self.key = key
        self.refs = refs
        self.policy_version = policy_version
        self.table_field = _table_field(table)


class _Record:
    """One published message, until it is settled."""

    __slots__ = (
        "seq", "data", "headers", "items", "tables", "fills", "first_sent", "attempts", "future", "sent_at", "settled",
        "unknown",
    )

    def __init__(
        self, seq: int, data: bytes, headers: dict[str, str], items: int, tables: frozenset[str] = frozenset(),
        fills: int = 0,
    ) -> None:
        self.seq = seq
        self.data = data
        self.headers = headers
        self.items = items
        # The tables its items are for; a gap fill's: those of the messages
        # it frees.
        self.tables = tables
        # Set on a gap fill (_Producer._fill_gap_locked): the message given
        # up on whose place it took, or took from a gap fill given up on
        # before it.
        self.fills = fills
        self.first_sent = 0.0
        self.sent_at = 0.0
        self.attempts = 0
        self.future: asyncio.Future[Msg] | None = None
        self.settled = False
        # Set once an attempt was sent and no answer came from the stream
        # (its ack timed out, the writer closed while it waited): JetStream
        # may have stored the message, and no later attempt's failure says
        # otherwise (as the Go producer's inFlight.unknown).
        self.unknown = False


class _Blocked(Exception):
    """Internal: the window is full; wait for it to change and try again."""


def rejection_error(r: Any, what: str = "") -> errors.RejectedError:
    """A Rejection message as an exception that is both a RejectedError and
    the class of its status code (so ``except SignatureMismatchError`` works
    for a rejected item too). ``what`` says what was refused, when not a
    writer's message or item."""
    base = type(errors.error_for_code(r.code, ""))
    cls = errors.compound_class("Rejected" + base.__name__, (errors.RejectedError, base))
    if not what:
        item = f"item {r.item_key} for table {r.table!r}" if r.item_key else "message"
        what = f"rejected by the table service: {item} of message {r.sequence}"
    code = errors.Code(r.code) if r.code in errors.Code._value2member_map_ else r.code
    name = code.name if isinstance(code, errors.Code) else str(code)
    return cls(
        f"{what}: {name}: {r.message}",
        code=r.code,
        sequence=r.sequence,
        item_key=r.item_key,
        table=r.table,
    )


def not_stored_error(err: errors.RepriseError, seq: int, items: int) -> errors.NotStoredError:
    """The error of a message given up on: both a NotStoredError and the
    class of its last failure (so ``except DeadlineExceededError`` still
    sees a message that got no ack in time)."""
    cls = _not_stored_class(type(err))
    return cls(f"message {seq} ({items} items) not stored: {err.message}", code=err.code, sequence=seq, items=items)


def denied_not_stored_error(err: errors.PermissionDeniedError, seq: int, items: int) -> errors.NotStoredError:
    """not_stored_error of a message whose publish the user's role refused:
    a PermissionDeniedError too, with its operation and subject."""
    return _loss_of(_not_stored_class(type(err)), err, f"message {seq} ({items} items) not stored: {err.message}", seq, items)


def _not_stored_class(base: type[errors.RepriseError]) -> type[errors.NotStoredError]:
    return errors.compound_class("NotStored" + base.__name__, (errors.NotStoredError, base))


def outcome_unknown_error(err: errors.RepriseError, seq: int, items: int) -> errors.OutcomeUnknownError:
    """The error of a message given up on that JetStream may have stored
    (an attempt went unanswered): both an OutcomeUnknownError and the class
    of its last failure, with that failure's fields (a
    PermissionDeniedError's operation and subject too)."""
    base = type(err)
    cls = errors.compound_class("OutcomeUnknown" + base.__name__, (errors.OutcomeUnknownError, base))
    message = (f"message {seq} ({items} items) may be stored, its items applied: an attempt went unanswered; "
               f"given up on: {err.message}")
    return _loss_of(cls, err, message, seq, items)


def episode_not_ended_error(err: errors.RepriseError) -> errors.EpisodeNotEndedError:
    """The error of an end_episode that failed with err before it ended the
    episode: both an EpisodeNotEndedError and err's class, with err's
    fields (as the Go producer's ErrEpisodeNotEnded wraps the failure)."""
    return _also(errors.EpisodeNotEndedError, err, f"episode not ended: {err.message}")


def closed_while_retrying(err: errors.RepriseError) -> errors.ClosedError:
    """err, the last failure of a message that the writer's close gave up
    on while it waited to be resent, as a ClosedError too, with err's
    fields: the Go producer's error then wraps both ErrClosed and err."""
    return _also(errors.ClosedError, err, f"the writer closed while retrying: {err.message}")


def _also(kind: type[_E], err: errors.RepriseError, message: str) -> _E:
    """A copy of err that says message, caused by err, with its fields, of
    a class that is both kind and err's class."""
    base = type(err)
    cls = errors.compound_class(kind.__name__.removesuffix("Error") + base.__name__, (kind, base))
    return cast(_E, with_message(err, message, cls))


def _loss_of(cls: type[_E], err: errors.RepriseError, message: str, seq: int, items: int) -> _E:
    """An error of cls (a subclass of err's class) with err's fields, which
    says message of message seq and its items, caused by err."""
    out = cast(_E, errors.bare(cls, message))
    out.__dict__.update(err.__dict__)
    out.message = message
    out.__dict__.update(sequence=seq, items=items)
    out.__cause__ = err
    return out


def with_message(e: _E, message: str, cls: type[errors.RepriseError] | None = None) -> _E:
    """A copy of e, of its class (or cls, a subclass of it) and with its
    fields, that says message and was caused by e. Made without calling
    the class's __init__, whose arguments differ from class to class
    (PermissionDeniedError's operation and subject, NotStoredError's
    sequence and items)."""
    out = cast(_E, errors.bare(cls or type(e), message))
    out.__dict__.update(e.__dict__)
    out.message = message
    out.__cause__ = e
    return out


#: How many of the errors a joined error names in its text.
_JOIN_SHOWN = 5


#: The kinds of loss a writer reports, which a joined error is of wherever
#: one of its errors is (as Go's errors.Is finds each in an errors.Join).
_LOSS_KINDS: tuple[type[errors.RepriseError], ...] = (
    errors.RejectedError, errors.NotStoredError, errors.OutcomeUnknownError)

#: What ended a call, which a joined error is of wherever one of its errors
#: is, beside the losses it reports: the writer's close, or the call's
#: timeout (as Go's errors.Is finds ErrClosed or the context's deadline).
_END_KINDS: tuple[type[errors.RepriseError], ...] = (errors.ClosedError, errors.DeadlineExceededError)

def _joined_class(base: type[errors.RepriseError], extra: tuple[type[errors.RepriseError], ...]) -> type[errors.RepriseError]:
    """base, also of the kinds of loss in extra."""
    return errors.compound_class(base.__name__, (base, *extra))


def _join(errs: list[errors.RepriseError]) -> errors.RepriseError:
    """Several errors of a writer as one, to raise. It takes the class and
    attributes of the first that lost items or may have (a rejection, a
    message not stored, one of unknown outcome), else of the first, and is
    also of each of those kinds that another of them is, with that one's
    attributes where the first has none: ``except (RejectedError,
    NotStoredError)`` never misses a certain loss behind a message that may
    be stored, nor ``except OutcomeUnknownError`` a message that may be
    stored behind a loss. So is it a ClosedError or a
    DeadlineExceededError wherever one of them is: ``except ClosedError``
    never misses a wait the close ended behind the losses it reports. Its
    text names them all (the first few), and a rejection's ``rejections``
    lists every refusal."""
    if len(errs) == 1:
        return errs[0]
    lost = [e for e in errs if isinstance(e, _LOSS_KINDS)]
    first = lost[0] if lost else errs[0]
    shown = "; ".join(e.message for e in errs[:_JOIN_SHOWN])
    more = f"; and {len(errs) - _JOIN_SHOWN} more" if len(errs) > _JOIN_SHOWN else ""
    extra = tuple(k for k in _LOSS_KINDS if not isinstance(first, k) and any(isinstance(e, k) for e in lost))
    extra += tuple(k for k in _END_KINDS if not isinstance(first, k) and any(isinstance(e, k) for e in errs))
    # Made of its class at once: a DeadlineExceededError is an OSError,
    # whose instances a class assignment could not make of it.
    out = with_message(first, f"{len(errs)} errors: {shown}{more}", _joined_class(type(first), extra) if extra else None)
    if extra:
        for e in lost:
            for k, v in e.__dict__.items():
                out.__dict__.setdefault(k, v)
    if isinstance(out, errors.RejectedError):
        out.rejections = [r for e in errs if isinstance(e, errors.RejectedError) for r in e.rejections]
    return out


#: Where a call that waits for a writer's messages starts counting its
#: failures (_Producer.failure_mark): items lost, rejections, items of
#: unknown outcome.
FailureMark = tuple[int, int, int]


class _Producer:
    """The writer's state. Thread-safe; never waits while holding its lock."""

    def __init__(self, opts: WriterOptions, max_payload: int, submit: Callable[[_Record], None]) -> None:
        self.o = opts
        self.id = new_producer_id()
        self.token = notice_token(self.id)
        # The inbox subject the service sends rejections to; set by the
        # transport before the first message.
        self.notice = ""
        # The version of the policy producing the steps: items created from
        # now on carry it.
        self.policy_version = 0
        self.max_payload = max_payload
        self._submit = submit
        self.mu = threading.Lock()
        self.cond = threading.Condition(self.mu)
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._rng = random.Random(secrets.randbits(64))
        self._keys: list[bytes] = []
        self._episode = 0
        self._episode_field = b""
        self.episode = self._rng.getrandbits(64)
        self.episode_steps = 0
        self.columns: dict[str, _Column] = {}
        self.pending: collections.deque[_Pending] = collections.deque()
        self.batch_chunks: list[bytes] = []
        self.batch_items: list[bytes] = []
        self.batch_tables: set[str] = set()
        self.batch_bytes = 0
        # The chunks to release, as the varints of their keys.
        self.release: list[bytes] = []
        self.seq = 0
        self.closing = False
        self.closed = False
        # The transport stopped: no ack or progress can come any more, so a
        # wait for one ends (stopped_error_locked).
        self.stopped = False
        # Flow: unsettled sequences in increasing order (settled in publish
        # order by the transport), items not yet acked, acked batches not
        # yet known to be applied.
        self.unsettled: collections.deque[int] = collections.deque()
        self.unacked_items = 0
        # (stream sequence, items, tables, gap fill) of messages JetStream
        # stored and the service has not applied yet.
        self.acked: list[tuple[int, int, frozenset[str], bool]] = []
        # Gap fills sent and not yet applied: the messages they free are in
        # their tables only once they are, though the service's progress
        # passed those messages earlier.
        self.gap_fills = 0
        # The latest message JetStream stored.
        self.stored = 0
        # The latest message sent that is not a gap fill.
        self.last_batch_seq = 0
        # (sequence, tables) of the messages with items from the lowest
        # unsettled one on, for a gap fill to wait for the tables of the
        # messages it frees.
        self.sent_tables: collections.deque[tuple[int, frozenset[str]]] = collections.deque()
        # Tables whose items the service applied only up to a sequence before
        # `applied`: their rate limiters hold items in their queues.
        self.held: dict[str, int] = {}
        self.acked_items = 0
        self.applied = 0
        # The service's bound on unapplied items while it paces inserts; 0:
        # none, only max_unapplied.
        self.paced = 0
        self.errors: list[errors.RepriseError] = []
        # Items of the messages that could not be published, ever, and of
        # those whose errors are still in errors: a call that waited for
        # them learns of their loss even where another call took their
        # errors. The service's rejections are counted the same way.
        self.failed_items = 0
        self.untaken_failed_items = 0
        # The items of messages given up on that JetStream may have stored
        # (OutcomeUnknownError), counted as failed_items are.
        self.unknown_items = 0
        self.untaken_unknown_items = 0
        self.rejections = 0
        self.untaken_rejections = 0
        # Table to (its signature as the client holds it, compiled).
        self._signatures: dict[str, tuple[Sequence[Any], list[_Spec]]] = {}
        # The linger timer is set; a batch whose linger time passed waits
        # for room in the window (lingered), published when the window
        # changes. Each batch waits out its linger time once, as in Go.
        self.linger_armed = False
        self.lingered = False
        self.linger_cb: Callable[[], None] | None = None  # set by the transport
        self.history = History(self)

    @property
    def episode(self) -> int:
        return self._episode

    @episode.setter
    def episode(self, v: int) -> None:
        self._episode = v
        self._episode_field = b"\x48" + _varint(v) if v else b""

    # -- notification ---------------------------------------------------

    def notify_locked(self) -> None:
        self.cond.notify_all()
        waiters, self._async_waiters = self._async_waiters, []
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_wake, fut)

    def changed_future_locked(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._async_waiters.append((loop, fut))
        return fut

    # -- append ---------------------------------------------------------

    def append_locked(self, step: Mapping[str, Any]) -> None:
        if self.closing:
            raise errors.ClosedError("writer closed")
        if not step:
            raise errors.InvalidArgumentError("empty step")
        cells: list[tuple[str, np.ndarray, _Column | None]] = []
        cols = self.columns
        for name, value in step.items():
            c = cols.get(name)
            if c is not None and type(value) is np.ndarray and value.dtype is c.dtype and value.shape == c.shape:
                cells.append((name, value, c))  # the common case, checked
                continue
            cells.append((name, self.cell_locked(name, value), c))
        step_no = self.episode_steps
        chunk_length = self.o.chunk_length
        if chunk_length == 1:
            # Every cell is a chunk, sealed (copied) now: no column has an
            # open chunk to seal.
            for name, a, col in cells:
                if col is None:
                    col = cols[name] = _Column(name, a.dtype, a.shape, self.o.delta)
                self._seal_locked(col, a, 1, step_no)
        else:
            for name, a, col in cells:
                if col is None:
                    col = cols[name] = _Column(name, a.dtype, a.shape, self.o.delta)
                if not col.open:
                    col.open_start = step_no
                col.open.append(a.copy())  # the caller may reuse its array
            for name, c in cols.items():
                if c.open and (len(c.open) >= chunk_length or name not in step):
                    self._seal_open_locked(c)
        self.episode_steps += 1
        if self.episode_steps > self.o.num_keep_alive_refs:
            self._trim_locked()

    def due_locked(self) -> bool:
        """Whether an append or create_item must first publish what earlier
        calls left (items pending, a batch due), waiting for room in the
        window: it waits only before it keeps its step or creates its item,
        so that one that raises kept or created nothing (as the Go
        producer's Append and CreateItem)."""
        return bool(self.pending) or (
            bool(self.batch_items)
            and (self.o.linger == 0 or len(self.batch_items) >= self.o.batch_items or self.batch_bytes >= self.o.batch_bytes)
        )

    def advance_kept_locked(self) -> None:
        """advance_locked(False) for an append whose step is kept or a
        create_item whose item is created, which neither waits nor raises:
        a batch that needs room waits for it as a lingered one does, the
        items behind it follow it once it is published
        (_publish_lingered_locked), and an item's error (over the max
        payload) is the next call's."""
        if not self.pending:
            return  # nothing waits for the chunks the step sealed
        try:
            self.advance_locked(False)
        except _Blocked:
            self.lingered = True
        except errors.RepriseError as e:
            self.errors.append(e)

    def cell_locked(self, name: Any, value: Any) -> np.ndarray:
        """value as the array a step of column name holds, little-endian,
        checked against the column's earlier steps."""
        if not isinstance(name, str) or not name:
            raise errors.InvalidArgumentError(f"column names are non-empty strings, got {name!r}")
        a = np.asarray(value)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        c = self.columns.get(name)
        if c is None:
            try:
                _codec.dtype_name(a.dtype)
            except errors.InvalidArgumentError as e:
                raise errors.InvalidArgumentError(f"column {name!r}: {e.message}") from None
            # What a full chunk would exceed is refused before any step of
            # the column is kept: its dtype and shape fix its steps' size.
            if a.nbytes and self.o.chunk_length > _codec.MAX_CHUNK_RAW_SIZE // a.nbytes:
                raise errors.InvalidArgumentError(
                    f"column {name!r}: a chunk of {self.o.chunk_length} steps of {a.nbytes} bytes exceeds the "
                    f"chunk limit of {_codec.MAX_CHUNK_RAW_SIZE} bytes: use shorter chunks"
                )
        elif a.dtype != c.dtype or a.shape != c.shape:
            have = _codec._NAME_OF.get(a.dtype, str(a.dtype))
            raise errors.SignatureMismatchError(
                f"column {name!r}: step {self.episode_steps} has {have}{list(a.shape)}, "
                f"earlier steps have {c.wire}{list(c.shape)}"
            )
        return a

    def partial_step_locked(self, partial: Mapping[str, np.ndarray], step: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The open step's columns, partial, with step's added: each cell
        checked now and copied, since the caller may reuse its arrays
        before the step is finished."""
        if self.closing:
            raise errors.ClosedError("writer closed")
        merged = dict(partial)
        for name, value in step.items():
            if name in merged:
                raise errors.InvalidArgumentError(f"column {name!r} was already given for this step")
            # Copied whatever value is: an object's __array__ may give an
            # array that it owns and the caller refills.
            merged[name] = np.array(self.cell_locked(name, value), copy=True)
        return merged

    def _seal_open_locked(self, c: _Column) -> None:
        steps, c.open = c.open, []
        self._seal_locked(c, np.stack(steps) if len(steps) > 1 else steps[0], len(steps), c.open_start)

    def _seal_locked(self, c: _Column, arr: np.ndarray, length: int, start: int) -> None:
        """Seals a chunk of length steps from start: arr holds them, one
        step without the step axis. append_locked checked every cell's
        dtype and shape against the column's, and its size against the
        chunk limit, and tobytes reads any layout in C order: one step's
        array already holds the chunk's bytes."""
        kv = self._key_locked()
        compression = self.o.compression
        if compression != "none":
            compression = c.codec(compression)
        if compression == "none" and length == 1:
            # A step of one uncompressed chunk, the most common chunk: a
            # delta of one step is the step itself.
            raw = arr.tobytes()
            at = (b"\x50" + (_VARINT14[start] if start < 0x4000 else _varint(start))) if start else b""
            size = 1 + len(kv) + len(c.single) + len(raw) + len(self._episode_field) + len(at)
            sv = _VARINT14[size] if size < 0x4000 else _varint(size)
            field = b"".join((b"\x1a", sv, b"\x08", kv, c.single, raw, self._episode_field, at))
        else:
            data, compressed = encode_chunk_fast(
                c.header, kv, length, arr, compression, c.delta, self._episode_field, start
            )
            if compression != "none":
                c.record(compressed)
            field = b"\x1a" + _uvarint(len(data)) + data
        c.chunks.append(_Sealed(kv, start, length, field))

    def _trim_locked(self) -> None:
        horizon = self.episode_steps - self.o.num_keep_alive_refs
        for it in self.pending:
            for r in it.refs:
                if r.start < horizon:
                    horizon = r.start
        for c in self.columns.values():
            chunks = c.chunks
            while chunks:
                ch = chunks[0]
                if ch.start + ch.length > horizon:
                    break
                chunks.popleft()
                if ch.sent:
                    self.release.append(ch.key_varint)

    # -- items ----------------------------------------------------------

    def resolve_locked(self, trajectory: Mapping[str, TrajectoryColumn] | Iterable[TrajectoryColumn]) -> list[_Ref]:
        # A dict's names are unique; any other's need checking. A dict is
        # told apart before the Mapping check, an ABC's, which costs more.
        names: set[str] | None = set()
        if isinstance(trajectory, dict):
            names = None
            pairs = list(trajectory.items())
        elif isinstance(trajectory, Mapping):
            pairs = list(trajectory.items())
        else:
            pairs = [(r.column, r) for r in trajectory]
        if not pairs:
            raise errors.InvalidArgumentError("an item needs at least one column")
        refs = []
        episode, horizon = self._episode, self.episode_steps - self.o.num_keep_alive_refs
        for name, r in pairs:
            if not isinstance(r, TrajectoryColumn):
                raise errors.InvalidArgumentError(
                    f"item column {name!r}: expected a reference from writer.history, got {type(r).__name__}"
                )
            if names is not None:
                if name in names:
                    raise errors.InvalidArgumentError(f"item column {name!r} appears twice")
                names.add(name)
            if r.episode != episode:
                raise errors.InvalidArgumentError(f"item column {name!r} references a step of an earlier episode")
            c = self.columns.get(r.column)
            if c is None:
                raise errors.InvalidArgumentError(f"column {r.column!r} was never appended")
            if r.start < horizon:
                raise errors.InvalidArgumentError(
                    f"column {r.column!r}: the item reaches {self.episode_steps - r.start} steps back, beyond the "
                    f"writer's num_keep_alive_refs of {self.o.num_keep_alive_refs}"
                )
            gap = c.covers(r.start, r.stop)
            if gap < r.stop:
                raise errors.InvalidArgumentError(
                    f"column {r.column!r} has no cell at step {gap} (the item wants steps {r.start}..{r.stop})"
                )
            refs.append(_Ref(name, c, r.start, r.stop, r.squeeze))
        return refs

    def create_item_locked(self, table: str, priority: float, refs: list[_Ref]) -> None:
        if self.closing:
            raise errors.ClosedError("writer closed")
        self.pending.append(_Pending(table, priority, self._item_key_locked(), refs, self.policy_version))

    def check_picks(
        self, trajectory: Mapping[str, TrajectoryColumn] | Iterable[TrajectoryColumn]
    ) -> Mapping[str, TrajectoryColumn] | list[TrajectoryColumn]:
        """The item's picks, read once, once they resolve: a client asks for
        a table's signature before its first item, and the item's own
        errors come before those of asking. add_item_locked reads them
        again."""
        if not isinstance(trajectory, Mapping):
            trajectory = list(trajectory)
        with self.mu:
            self.resolve_locked(trajectory)
        return trajectory

    def add_item_locked(
        self,
        table: str,
        priority: float,
        trajectory: Mapping[str, TrajectoryColumn] | Iterable[TrajectoryColumn],
        signature: Sequence[Any],
    ) -> None:
        """What a client's create_item checks and does under the lock,
        once check_item passed and what due_locked asked for is published:
        the item from its picks of history, checked against the table's
        signature (empty: any columns), queued to be sent. The errors of
        earlier messages are raised before the item is queued, so that a
        create_item that raises created nothing (as the Go producer's
        CreateItem); an error of the item's own leaves them for the next
        call."""
        refs = self.resolve_locked(trajectory)
        if signature:
            check_signature(table, refs, self._compiled_signature(table, signature))
        if self.closing:
            raise errors.ClosedError("writer closed")
        err = self.take_errors_locked()
        if err is not None:
            raise err
        self.create_item_locked(table, priority, refs)

    def _compiled_signature(self, table: str, signature: Sequence[Any]) -> list[_Spec]:
        """The table's signature as check_signature reads it, made once per
        signature the client holds for the table."""
        held = self._signatures.get(table)
        if held is None or held[0] is not signature:
            held = self._signatures[table] = (signature, [_Spec(s) for s in signature])
        return held[1]

    def _key_locked(self) -> bytes:
        """A fresh key's varint, for a chunk or an item: any 64 bits but 0."""
        if not self._keys:
            self._keys = random_key_varints(self._rng, _KEY_POOL)
        return self._keys.pop()

    def _item_key_locked(self) -> bytes:
        """An item key's varint: any 64 bits but 0, or with key_shard,
        uniform among those of the shard's residue class (a sharded service
        refuses the others)."""
        ks = self.o.key_shard
        if ks is None:
            return self._key_locked()
        index, count = ks
        while True:
            k = self._rng.getrandbits(64)
            # A draw in the top run of fewer than count values is drawn
            # again: every key of the class then has exactly count draws that
            # give it, and none overflows (as the Go producer does).
            base = k - k % count
            if base <= _KEY_MAX - (count - 1):
                return _varint(base + index)

    def _build_item(self, it: _Pending) -> tuple[bytes, list[_Sealed]]:
        cols = []
        fresh: list[_Sealed] = []
        for r in it.refs:
            chunks = r.col.chunks
            ch = chunks[-1] if chunks else None
            if ch is not None and ch.start == r.start and ch.start + ch.length == r.stop:
                # The common item: the steps of its column's newest chunk
                # (encode_column's field, written out).
                body = b"".join((r.name_field, ch.whole, b"\x18\x01")) if r.squeeze else r.name_field + ch.whole
                n = len(body)
                cols.append(b"".join((b"\x22", _VARINT14[n] if n < 0x4000 else _varint(n), body)))
                if not ch.sent and ch not in fresh:
                    fresh.append(ch)
                continue
            picked: list[_Sealed] = []
            for ch in reversed(chunks):  # newest first: refs are recent
                if ch.start + ch.length <= r.start:
                    break
                if ch.start < r.stop:
                    picked.append(ch)
            slices = []
            for ch in reversed(picked):
                lo, hi = max(ch.start, r.start), min(ch.start + ch.length, r.stop)
                whole = hi - lo == ch.length
                slices.append(ch.whole if whole else _slice_field(ch.key_varint, lo - ch.start, hi - lo))
                if not ch.sent and ch not in fresh:
                    fresh.append(ch)
            cols.append(encode_column(r.name_field, slices, r.squeeze))
        item = encode_item(it.key, it.table_field, it.priority, cols, it.policy_version)
        n = len(item)
        return b"".join((b"\x22", _VARINT14[n] if n < 0x4000 else _varint(n), item)), fresh

    def advance_locked(self, force: bool) -> None:
        """Moves ready items into the batch and publishes full batches (all
        of it with force). Raises _Blocked when the window has no room."""
        limit = self.max_payload - 1024 - 10 * len(self.release)
        while self.pending:
            it = self.pending[0]
            unsealed = False
            for r in it.refs:
                if r.col.open and r.stop > r.col.open_start:
                    unsealed = True  # a step it needs is still in an open chunk
                    break
            if unsealed:
                break
            item, fresh = self._build_item(it)
            size = len(item) + 16
            for ch in fresh:
                size += len(ch.encoded or b"")
            if size > limit:
                # Dropped, and the items behind it go on, as in Go: its
                # error is raised by the call that waits for it (flush) or
                # by the next call, never in place of theirs.
                self.pending.popleft()
                self.errors.append(errors.InvalidArgumentError(
                    f"item for table {it.table!r} needs {size} bytes, over the server's max payload of "
                    f"{self.max_payload}: use shorter chunks or raise max_payload"
                ))
                self.notify_locked()
                continue
            if self.batch_items and self.batch_bytes + size > limit:
                self._publish_locked(False)  # may raise _Blocked; the item stays pending
                continue
            for ch in fresh:
                assert ch.encoded is not None
                self.batch_chunks.append(ch.encoded)
                ch.encoded, ch.sent = None, True
            self.batch_items.append(item)
            self.batch_tables.add(it.table)
            self.batch_bytes += size
            self.pending.popleft()
        full = len(self.batch_items) >= self.o.batch_items or self.batch_bytes >= self.o.batch_bytes
        if force or full or self.o.linger == 0:
            if self.batch_items or (force and self.release):
                self._publish_locked(False)
        elif self.batch_items and not self.linger_armed and not self.lingered and self.linger_cb is not None:
            self.linger_armed = True
            self.linger_cb()

    def try_advance_locked(self) -> bool:
        """advance_locked(False); False if the window has no room, for the
        caller to wait outside the lock and advance again."""
        try:
            self.advance_locked(False)
        except _Blocked:
            return False
        return True

    def _room_locked(self, items: int) -> bool:
        nxt = self.seq + 1
        if self.unsettled and nxt >= self.unsettled[0] + self.o.max_in_flight:
            return False
        u = self.unacked_items + self.acked_items
        limit = self.o.max_unapplied
        if self.paced:
            limit = min(limit, self.paced)
        return u + items <= limit or u == 0

    def _publish_locked(self, end: bool) -> None:
        if self.closed:
            raise errors.ClosedError("writer closed")
        if not self._room_locked(len(self.batch_items)):
            raise _Blocked
        self.seq += 1
        seq = self.last_batch_seq = self.seq
        self.unsettled.append(seq)
        n = len(self.batch_items)
        # Releases that came while the batch waited for the window may not
        # all fit beside it: the rest go with the next message, since a
        # chunk is no less released later, while a message over the
        # server's max payload would lose its items.
        release, self.release = self.release, []
        room = max(0, (self.max_payload - 1024 - self.batch_bytes) // 10)
        if end:
            # The end mark releases every chunk the service holds for this
            # writer; naming them too could push the message over the max
            # payload after a long history (as the Go producer's).
            release = []
        elif len(release) > room:
            release, self.release = release[:room], release[room:]
        data = encode_insert_batch_fields(
            self.id, seq, self.batch_chunks, self.batch_items, release, end, self.unsettled[0], self.o.max_in_flight,
            self.notice,
        )
        tables = frozenset(self.batch_tables)
        self.batch_chunks, self.batch_items, self.batch_bytes = [], [], 0
        self.batch_tables = set()
        self.lingered = False
        self.unacked_items += n
        if tables:
            self.sent_tables.append((seq, tables))
        self._submit(_Record(seq, data, {MSG_ID_HEADER: msg_id(self.id, seq)}, n, tables))

    def _fill_gap_locked(self, failed: _Record) -> bool:
        """Sends a gap fill in the place of failed, a message given up on,
        when the service may hold later messages behind it: those sent
        before it failed state a window start at or below it, and the
        service applies them only once a message states a later one. The
        gap fill, a message of no items, states it at once rather than at
        the writer's next message, which may never come. It takes failed's
        place in the window in the same hold of the lock, so that the
        window never looks empty before it is sent. Whether it sent one."""
        # Needed while a message sent after failed may wait for it: one
        # stored after what failed stands in for (even with nothing sent
        # since), or one sent after failed that may yet be. For a gap fill,
        # only a message with items counts as sent after it: gap fills sent
        # after one another would keep each other going for as long as
        # JetStream takes nothing.
        fills = failed.fills or failed.seq
        later = self.last_batch_seq if failed.fills else self.seq
        if self.closed or (self.stored <= fills and later <= failed.seq):
            return False
        tables = set(failed.tables)
        for seq, t in self.sent_tables:
            if seq > failed.seq:
                tables |= t
        self.seq += 1
        seq = self.seq
        self.unsettled.append(seq)
        # The staged batch stays: its items hold no place in the window. So
        # do the releases, which its items may still need.
        data = encode_insert_batch_fields(
            self.id, seq, [], [], [], False, self.unsettled[0], self.o.max_in_flight, self.notice,
        )
        fill = _Record(seq, data, {MSG_ID_HEADER: msg_id(self.id, seq)}, 0, frozenset(tables), fills)
        if tables:
            self.sent_tables.append((seq, fill.tables))
        self._submit(fill)
        return True

    def on_linger(self) -> None:
        """The linger time passed (the timer, on the event loop)."""
        with self.mu:
            self.linger_armed = False
            self.lingered = True
            self._publish_lingered_locked()

    def _publish_lingered_locked(self) -> None:
        """Publishes the partly filled batch whose linger time passed, if
        the window has room; else it stays lingered until the window
        changes (an ack, the service's progress). Then the ready items that
        an append, which may not wait once it kept its step, left behind
        the batch follow it: the actor may never call again to publish
        them."""
        if self.closing or not self.batch_items:
            self.lingered = False
            return
        try:
            self._publish_locked(False)
        except _Blocked:
            return
        except errors.RepriseError as e:
            self.lingered = False
            self.errors.append(e)
            return
        self.advance_kept_locked()

    def flush_locked(self) -> None:
        # A flush, wait_applied or end_episode of a closed writer has
        # nothing of its own to wait for, and returning would tell the
        # caller its items went in: the Go producer's return ErrClosed too.
        if self.closed:
            raise errors.ClosedError("writer closed")
        for c in self.columns.values():
            if c.open:
                self._seal_open_locked(c)
        self.advance_locked(True)

    def not_ended_error_locked(self, err: errors.RepriseError) -> errors.RepriseError:
        """err, which publishing an end_episode's items raised: an
        EpisodeNotEndedError too while the episode has steps, for the
        actor to call end_episode again before the next episode's first."""
        return episode_not_ended_error(err) if self.episode_steps else err

    def end_episode_locked(self) -> None:
        """Ends the episode, unless it has no steps: it then has nothing to
        end (an end_episode called again after one that ended the episode
        and then failed its wait finds one), and a new episode would move
        a sharded writer on a shard more."""
        if not self.episode_steps:
            return
        for c in self.columns.values():
            for ch in c.chunks:
                if ch.sent:
                    self.release.append(ch.key_varint)
            c.chunks.clear()
        self.episode_steps = 0
        self.episode = self._rng.getrandbits(64)

    # -- flow (called on the event loop) ----------------------------------

    def on_settled(self, rec: _Record, stream_seq: int | None, err: errors.RepriseError | None) -> None:
        with self.mu:
            try:
                self.unsettled.remove(rec.seq)
            except ValueError:
                pass
            self.unacked_items -= rec.items
            if err is not None:
                # Nothing is stored once the writer or its connection closed.
                # A gap fill given up on is replaced only when it was
                # retried for retry_for: one refused at once (a stream that
                # takes nothing) would be refused again at once, for ever.
                # (first_sent is the event loop's time: time.monotonic.)
                refused = bool(rec.fills) and time.monotonic() - rec.first_sent < self.o.retry_for
                # A refused publish refuses its gap fill too.
                filled = (not refused and not isinstance(err, (errors.ClosedError, errors.PermissionDeniedError))
                          and self._fill_gap_locked(rec))
                if not rec.fills:
                    if filled:
                        self.gap_fills += 1
                    self.errors.append(err)
                    if isinstance(err, errors.OutcomeUnknownError):
                        self.unknown_items += rec.items
                        self.untaken_unknown_items += rec.items
                    else:
                        self.failed_items += rec.items
                        self.untaken_failed_items += rec.items
                elif not filled:
                    self.gap_fills -= 1  # it lost no items
            elif stream_seq is not None:
                self.stored = max(self.stored, rec.seq)
                if rec.fills and self._applied_locked(stream_seq, rec.tables):
                    self.gap_fills -= 1
                elif rec.fills or (rec.items > 0 and not self._applied_locked(stream_seq, rec.tables)):
                    self.acked.append((stream_seq, rec.items, rec.tables, bool(rec.fills)))
                    self.acked_items += rec.items
            lowest = self.unsettled[0] if self.unsettled else self.seq + 1
            while self.sent_tables and self.sent_tables[0][0] <= lowest:
                self.sent_tables.popleft()
            if self.lingered:
                self._publish_lingered_locked()
            self.notify_locked()

    def _applied_locked(self, seq: int, tables: frozenset[str]) -> bool:
        """Whether the service applied every item of the message stored at
        seq (for tables): it applied the stream up to seq, and none of the
        tables holds items from before it."""
        return seq <= self.applied and all(seq <= self.held.get(t, seq) for t in tables)

    def on_applied(self, applied: int, held: dict[str, int], paced: int = 0) -> None:
        """The service's progress (a Progress message): applied, but for the
        tables in held, applied only up to their sequence; and, while the
        service paces inserts so that learners keep their pace, the most
        items to keep unapplied (paced; 0: no such bound)."""
        with self.mu:
            if applied < self.applied:
                return  # published before what we have
            self.applied, self.held, self.paced = applied, held, paced
            kept = []
            for b in self.acked:
                s, n, tables, gap_fill = b
                if self._applied_locked(s, tables):
                    self.acked_items -= n
                    if gap_fill:
                        self.gap_fills -= 1
                else:
                    kept.append(b)
            self.acked = kept
            if self.lingered:
                self._publish_lingered_locked()
            self.notify_locked()

    def close_locked(self) -> None:
        """Nothing is published once closed: the items still staged are
        lost, and counted as a message given up is (NotStoredError), so
        that a caller counting its losses sees them (as in Go)."""
        self.closing = self.closed = True
        staged = len(self.batch_items) + len(self.pending)
        if staged:
            closed = _not_stored_class(errors.ClosedError)
            self.errors.append(closed(f"{staged} items never published: the writer closed first", items=staged))
            self.batch_chunks, self.batch_items, self.batch_bytes = [], [], 0
            self.pending.clear()
            self.failed_items += staged
            self.untaken_failed_items += staged
            self.notify_locked()

    def on_rejected(self, err: errors.RejectedError) -> None:
        """A rejection by the service."""
        with self.mu:
            self.errors.append(err)
            self.rejections += 1
            self.untaken_rejections += 1
            self.notify_locked()

    def on_error(self, err: errors.RepriseError) -> None:
        """An error for the writer's next call that is neither a loss nor a
        rejection (a refused permission)."""
        with self.mu:
            self.errors.append(err)
            self.notify_locked()

    def stop_locked(self) -> None:
        """The transport stopped (the writer's close): wakes the waits."""
        self.stopped = True
        self.notify_locked()

    def stopped_error_locked(self, what: str, mark: FailureMark) -> errors.RepriseError:
        """What a wait that the writer's close ended raises: ClosedError
        saying what was left, with the errors seen since mark (as the Go
        producer's waits end with ErrClosed)."""
        return self.ended_error_locked(
            errors.ClosedError(f"writer {what}: the writer closed first: {self.describe_wait_locked()}"), mark)

    def ended_error_locked(self, err: errors.RepriseError, mark: FailureMark) -> errors.RepriseError:
        """err, which ended a wait for the writer's messages (its timeout,
        the writer's close), with the errors seen since mark
        (waited_errors_locked), as the Go producer's waits return them
        beside why they ended, rather than leave them to a later call."""
        seen = self.waited_errors_locked(mark)
        return err if seen is None else _join([seen, err])

    def take_errors_locked(self) -> errors.RepriseError | None:
        if not self.errors:
            return None
        errs, self.errors = self.errors, []
        self.untaken_failed_items = self.untaken_unknown_items = self.untaken_rejections = 0
        return _join(errs)

    def failure_mark(self) -> FailureMark:
        """Where a call that waits for its messages starts counting the
        items lost, the rejections and the items of unknown outcome
        (waited_errors_locked)."""
        with self.mu:
            return self.failed_items, self.rejections, self.unknown_items

    def waited_errors_locked(self, mark: FailureMark) -> errors.RepriseError | None:
        """The errors of a call that waited for its messages since
        failure_mark gave mark, with a NotStoredError for the items lost,
        an OutcomeUnknownError for those given up on that may be stored
        and a RejectedError for the rejections meanwhile whose errors
        another call on the writer took (close, or a flush on another
        thread), unless its own errors report them: the call must not
        return as if items that may never have reached their tables did."""
        lost = self.failed_items - mark[0] - self.untaken_failed_items
        refused = self.rejections - mark[1] - self.untaken_rejections
        unknown = self.unknown_items - mark[2] - self.untaken_unknown_items
        errs, self.errors = self.errors, []
        self.untaken_failed_items = self.untaken_unknown_items = self.untaken_rejections = 0
        if lost > 0 and not any(isinstance(e, errors.NotStoredError) for e in errs):
            errs.append(errors.NotStoredError(
                f"{lost} of this writer's items were not stored while this call waited "
                "(another call on this writer reported why)"
            ))
        if unknown > 0 and not any(isinstance(e, errors.OutcomeUnknownError) for e in errs):
            errs.append(errors.OutcomeUnknownError(
                f"{unknown} of this writer's items were given up on while this call waited, and may be stored "
                "and applied (another call on this writer reported why)"
            ))
        if refused > 0 and not any(isinstance(e, errors.RejectedError) for e in errs):
            errs.append(errors.RejectedError(
                f"the service sent {refused} rejections while this call waited "
                "(another call on this writer reported them)"
            ))
        return _join(errs) if errs else None

    def flushed_locked(self, n: int) -> bool:
        """Whether at most n items are still to be done as flush counts
        them: not yet applied by the service (not yet stored by JetStream
        with return_on_store), staged items included; with n 0, no message
        awaiting JetStream either, nor (unless return_on_store) one held in
        the service behind one given up on."""
        left = self.in_flight_items_locked() + (0 if self.o.return_on_store else self.acked_items)
        return left <= n and (n > 0 or (not self.unsettled and (self.o.return_on_store or not self.gap_fills)))

    def all_applied_locked(self) -> bool:
        """Whether the service applied every item this writer published:
        none awaits its ack or application, and no message waits in the
        service behind one given up on (a gap fill not yet applied)."""
        return self.unacked_items + self.acked_items == 0 and not self.gap_fills

    def in_flight_items_locked(self) -> int:
        staged = len(self.batch_items) + len(self.pending)
        return self.unacked_items + staged

    def describe_wait_locked(self) -> str:
        held = ""
        if self.gap_fills:
            held = f"{self.gap_fills} messages given up on still holding later ones in the service, "
        return (
            f"{self.unacked_items + self.acked_items} items published but not applied, {held}"
            f"{len(self.unsettled)} messages awaiting JetStream (is the table service running? "
            "is a table's rate limiter holding inserts?)"
        )


def check_item(table: str, priority: Any) -> float:
    """An item's priority as a float, once its table name and priority are
    checked. Clients call it before taking the writer's lock: a tensor's
    __float__ may wait for its device."""
    if not table:
        raise errors.InvalidArgumentError("empty table name")
    # The check in full costs a formatted message per item.
    if type(priority) is float and 0.0 <= priority < math.inf:
        return priority
    return _codec.check_finite_priority(priority, f"item for table {table!r}")


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def check_policy_version(version: Any) -> int:
    """version as an int, once checked to be an int64, which a policy
    version is on the wire and in the Go producer and client: one out of
    range would go out wrapped, another version, and int() of a float or a
    string would make a version of what is none (2.7 went out as 2)."""
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
        raise errors.InvalidArgumentError(f"policy version {version!r} is not an integer")
    v = int(version)
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise errors.InvalidArgumentError(f"policy version {version!r} is out of int64's range")
    return v


class _Spec:
    """A column of a table's signature (a ColumnSpec), read once."""

    __slots__ = ("name", "dtype", "shape", "exact")

    def __init__(self, spec: Any) -> None:
        self.name: str = spec.name
        self.dtype: str = spec.dtype
        self.shape = tuple(spec.shape)
        self.exact = -1 not in self.shape  # no size that matches any


def check_signature(table: str, refs: list[_Ref], signature: Sequence[_Spec]) -> None:
    """Raises SignatureMismatchError unless the item's columns match the
    table's signature (empty means any columns): the same names in the
    same order, the dtypes, and shapes [T, *step_shape] ([*step_shape]
    when squeezed) where -1 matches any size."""
    if not signature:
        return
    if len(refs) != len(signature):
        raise errors.SignatureMismatchError(
            f"item for table {table!r} has {len(refs)} columns, the table's signature has {len(signature)}: "
            + ", ".join(f"{s.name} {s.dtype}{list(s.shape)}" for s in signature)
        )
    for r, spec in zip(refs, signature):
        if r.name != spec.name:
            raise errors.SignatureMismatchError(
                f"item for table {table!r}: column {r.name!r} is where the signature has {spec.name!r}"
            )
        if r.col.wire != spec.dtype:
            raise errors.SignatureMismatchError(
                f"item for table {table!r}: column {r.name!r} has dtype {r.col.wire}, the signature wants {spec.dtype}"
            )
        shape = r.col.shape if r.squeeze else (r.stop - r.start, *r.col.shape)
        if shape == spec.shape:
            continue
        want = spec.shape
        if spec.exact or len(shape) != len(want) or any(w != -1 and w != d for w, d in zip(want, shape)):
            raise errors.SignatureMismatchError(
                f"item for table {table!r}: column {r.name!r} has shape {list(shape)}, the signature wants {list(want)}"
            )


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


# ---------------------------------------------------------------- transport


class _Transport:
    """Publishes a producer's messages in order on the event loop, awaits
    JetStream's acks in publish order and resends failed ones with the same
    dedupe id until retry_for passes."""

    def __init__(
        self, nc: NATS, subjects: Subjects, loop: asyncio.AbstractEventLoop, opts: WriterOptions, denials: Denials
    ) -> None:
        self.nc = nc
        self._denials = denials
        self._denied: errors.PermissionDeniedError | None = None
        self.subj = subjects
        self.loop = loop
        self.o = opts
        self.p: _Producer | None = None
        self._queue: asyncio.Queue[_Record | None] = asyncio.Queue()
        self._order: asyncio.Queue[_Record | None] = asyncio.Queue()
        self._inbox = nc.new_inbox()
        # Rejections come to an inbox of the connection's, which only this
        # user may read (a role's permissions).
        self._notice = nc.new_inbox()
        self._subs: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._abort = asyncio.Event()
        self._acks: dict[str, _Record] = {}
        # A publish waited ack_timeout for nats-py's forced flush: the
        # server reads nothing (stopped, hung), and the connection's
        # buffer is full until it does.
        self._stalled = False

    async def start(self, p: _Producer) -> None:
        self.p = p
        p.linger_cb = self._arm_linger
        self._subs.append(await self.nc.subscribe(self._inbox + ".*", cb=self._on_ack))
        self._subs.append(await self.nc.subscribe(self.subj.applied, cb=self._on_applied))
        p.notice = self._notice
        self._denials.add(self._on_denied)
        self._denials.watch_drops(self._notice, self._on_rejection_dropped)
        self._subs.append(await self.nc.subscribe(self._notice, cb=self._on_rejected))
        self._tasks.append(self.loop.create_task(self._publisher()))
        self._tasks.append(self.loop.create_task(self._ack_loop()))

    def _on_denied(self, err: errors.PermissionDeniedError) -> None:
        """A refused insert publish, or a refused subscription to the acks,
        notices or progress, leaves the writer unable to work: every message
        fails at once (no resends) and the next call raises err."""
        mine = {self.subj.insert} if err.operation == "publish" else {
            self._inbox + ".*", self._notice, self.subj.applied}
        if err.subject not in mine or self._denied is not None:
            return
        self._denied = err
        for rec in list(self._acks.values()):
            if rec.future is not None and not rec.future.done():
                # A refused publish was not stored; a message sent before
                # its ack's subscription was refused may have been.
                rec.unknown = rec.unknown or err.operation != "publish"
                rec.future.set_exception(err)
        assert self.p is not None
        self.p.on_error(err)

    def submit(self, rec: _Record) -> None:
        """Thread-safe: queue a record for publishing, in order."""
        self.loop.call_soon_threadsafe(self._queue.put_nowait, rec)

    def _arm_linger(self) -> None:
        p = self.p
        assert p is not None
        self.loop.call_soon_threadsafe(self.loop.call_later, p.o.linger, p.on_linger)

    async def _on_applied(self, m: Msg) -> None:
        # nats-py wakes each subscription's task in the order the messages
        # came, but a task takes every message already queued in one run:
        # progress, a rejection, then more progress arriving together, the
        # second progress was taken first, and a flush waiting on another
        # thread returned before the rejection it covers was recorded. The
        # rejection's task is queued to run by now: it runs first.
        await asyncio.sleep(0)
        try:
            progress = decode_progress(m.data)
        except Exception:  # noqa: BLE001 - not ours to judge
            return
        assert self.p is not None
        self.p.on_applied(*progress)

    def _on_rejection_dropped(self) -> None:
        """nats-py dropped a message on the notice inbox (a slow consumer):
        which items a rejection there was for is unknown, so the next call
        fails (as the Go producer's checkDroppedRejections)."""
        assert self.p is not None
        self.p.on_rejected(
            errors.RejectedError(
                "a rejection of this writer's items was dropped unread by the connection (a slow consumer); "
                "which items it was for is unknown"
            )
        )

    async def _on_rejected(self, m: Msg) -> None:
        try:
            r = pb.Rejection.FromString(m.data)
        except Exception:  # noqa: BLE001 - garbage on our subject
            return
        assert self.p is not None
        self.p.on_rejected(rejection_error(r))

    async def _on_ack(self, m: Msg) -> None:
        token = m.subject[m.subject.rfind(".") + 1 :]
        rec = self._acks.get(token)
        if rec is None or rec.settled:
            return
        stream_seq, dup, err, _ = _parse_ack(m)
        if err is None:
            # Stored: settle at once (the ack loop skips it), so a writer
            # waiting for room wakes without more hops through the loop.
            self._settle_stored(rec, stream_seq, dup)
        if rec.future is not None and not rec.future.done():
            rec.future.set_result(m)

    def _settle_stored(self, rec: _Record, stream_seq: int | None, dup: bool) -> None:
        p = self.p
        assert p is not None
        rec.settled = True
        self._forget(rec)
        if dup and rec.attempts == 1:
            p.on_settled(rec, None, errors.DuplicateIdError(
                f"message {rec.seq} ({rec.items} items) was sent once and JetStream acknowledged it as a "
                "duplicate: another publisher used this writer's dedupe id; its items were not stored",
                sequence=rec.seq, items=rec.items,
            ))
        else:
            p.on_settled(rec, stream_seq, None)

    async def _send(self, rec: _Record) -> None:
        rec.attempts += 1
        rec.sent_at = self.loop.time()
        if rec.attempts == 1:
            rec.first_sent = rec.sent_at
        token = f"{rec.seq}x{rec.attempts}"
        rec.future = self.loop.create_future()
        if self._denied is not None:
            rec.future.set_exception(self._denied)
            return
        if self._abort.is_set():
            rec.future.set_exception(_closed_unacked())
            return
        nc = self.nc
        # nats-py's bound on its outbound buffer; over it, a publish waits
        # for its flusher, for as long as the server does not read.
        limit = getattr(nc, "_max_pending_size", 0)
        # A buffer that emptied is read again; a message larger than the
        # whole buffer goes once it is empty.
        if self._stalled and nc.is_connected and 0 < nc.pending_data_size and 0 < limit < nc.pending_data_size + len(rec.data):
            # Not published: resent, as a failed publish is, until retry_for.
            rec.future.set_exception(errors.UnavailableError(
                f"the NATS server reads nothing: {nc.pending_data_size} bytes wait in the connection's buffer"))
            return
        self._stalled = False
        self._acks[token] = rec
        try:
            # nats-py's forced flush has no timeout: a server that stops
            # reading would hold the publisher, and every message behind
            # it, past retry_for, until the connection is found stale
            # (minutes). The message is in the buffer before the flush
            # waits, and is awaited as one sent.
            pub = nc.publish(self.subj.insert, rec.data, reply=self._inbox + "." + token, headers=rec.headers)
            if limit <= 0 or nc.pending_data_size + len(rec.data) + 1024 < limit:
                await pub  # no forced flush (the 1024: the command's subject and headers)
            else:
                started = self.loop.time()
                try:
                    await asyncio.wait_for(pub, self.o.ack_timeout)
                except asyncio.TimeoutError:
                    self._stalled = True
                # (nats-py may swallow the cancellation and return.)
                if self.loop.time() - started >= self.o.ack_timeout:
                    self._stalled = True
        except (nats.errors.OutboundBufferLimitError, nats.errors.ConnectionReconnectingError) as e:
            if not rec.future.done():
                rec.future.set_exception(errors.UnavailableError(f"not connected: {e!r}"))
        except nats.errors.MaxPayloadError:
            if not rec.future.done():
                rec.future.set_exception(errors.ResourceExhaustedError("message over the server's max payload"))
        except nats.errors.ConnectionClosedError:
            if not rec.future.done():
                rec.future.set_exception(errors.ClosedError("connection closed"))

    async def _publisher(self) -> None:
        while True:
            rec = await self._queue.get()
            if rec is None:
                self._order.put_nowait(None)
                return
            await self._send(rec)
            self._order.put_nowait(rec)

    async def _ack_loop(self) -> None:
        while True:
            rec = await self._order.get()
            if rec is None:
                return
            await self._await(rec)

    async def _await(self, rec: _Record) -> None:
        p = self.p
        assert p is not None
        backoff = 0.05
        while True:
            if rec.settled:
                return
            assert rec.future is not None
            timeout = rec.sent_at + self.o.ack_timeout - self.loop.time()
            err: errors.RepriseError
            retryable = True
            try:
                if rec.future.done():
                    m = rec.future.result()
                else:
                    m = await asyncio.wait_for(asyncio.shield(rec.future), max(0.0, timeout))
                if rec.settled:
                    return
                stream_seq, dup, err_or_none, retryable = _parse_ack(m)
                if err_or_none is None:
                    self._settle_stored(rec, stream_seq, dup)
                    return
                err = err_or_none
            except asyncio.TimeoutError:
                # Sent, unanswered: JetStream may have stored it.
                rec.unknown = True
                err = errors.DeadlineExceededError(f"no ack from JetStream within {self.o.ack_timeout}s")
            except errors.RepriseError as e:
                err = e
                retryable = not isinstance(
                    e, (errors.ClosedError, errors.ResourceExhaustedError, errors.PermissionDeniedError)
                )
            expired = self.loop.time() - rec.first_sent > self.o.retry_for
            if not retryable or expired or self._abort.is_set():
                if rec.settled:
                    return  # its ack landed as the writer closed
                rec.settled = True
                self._forget(rec)
                if retryable and not expired:
                    # Given up on for the close alone, waiting to be resent.
                    err = closed_while_retrying(err)
                if rec.unknown:
                    log.warning("reprise writer: publish given up on, may be stored: producer %s message %d "
                                "(%d items): %s", p.token, rec.seq, rec.items, err.message)
                    p.on_settled(rec, None, outcome_unknown_error(err, rec.seq, rec.items))
                    return
                if isinstance(err, errors.PermissionDeniedError):
                    # A loss like any other: the denial alone, once taken,
                    # would leave a later wait for this message to return.
                    p.on_settled(rec, None, denied_not_stored_error(err, rec.seq, rec.items))
                    return
                log.warning("reprise writer: publish failed: producer %s message %d (%d items): %s",
                            p.token, rec.seq, rec.items, err.message)
                p.on_settled(rec, None, not_stored_error(err, rec.seq, rec.items))
                return
            try:
                await asyncio.wait_for(self._abort.wait(), backoff)
            except asyncio.TimeoutError:
                pass
            backoff = min(2 * backoff, 1.0)
            if not self._abort.is_set():
                await self._send(rec)
            # else the next pass gives up on it, with its last error

    def _forget(self, rec: _Record) -> None:
        for a in range(1, rec.attempts + 1):
            self._acks.pop(f"{rec.seq}x{a}", None)

    async def close(self, timeout: float | None) -> None:
        """Waits for every queued message to settle (resends stop when
        timeout passes), then unsubscribes."""
        # After what submit queued before, through the loop: an async
        # writer's close submits its end message from the loop itself, and
        # a stop put first would leave it unsent.
        self.loop.call_soon(self._queue.put_nowait, None)
        done = asyncio.gather(*self._tasks)
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout)
        except asyncio.TimeoutError:
            # The acks still awaited fail now, as the Go producer's do,
            # rather than each running out its ack_timeout.
            self._abort.set()
            for rec in list(self._acks.values()):
                if rec.future is not None and not rec.future.done():
                    rec.unknown = True  # sent, unanswered: it may be stored
                    rec.future.set_exception(_closed_unacked())
            await done
        self._denials.discard(self._on_denied)
        self._denials.unwatch_drops(self._notice)
        for s in self._subs:
            try:
                await s.unsubscribe()
            except Exception:  # noqa: BLE001 - the connection may be gone
                pass


def _closed_unacked() -> errors.ClosedError:
    return errors.ClosedError("not acknowledged by JetStream before the writer closed")


def _parse_ack(m: Msg) -> tuple[int | None, bool, errors.RepriseError | None, bool]:
    """(stream sequence, duplicate, error, retryable) from a PubAck reply."""
    hdr = m.headers
    if not m.data:
        status = hdr.get("Status") if hdr else None
        if status == "503":
            return None, False, errors.UnavailableError(
                "no JetStream stream answers on the insert subject (is reprised running with this prefix?)"
            ), True
        return None, False, errors.ProtocolError(f"empty ack (status {status})"), True
    try:
        d = json.loads(m.data)
    except ValueError:
        return None, False, errors.ProtocolError("malformed JetStream ack"), True
    e = d.get("error")
    if e:
        code = int(e.get("code", 0))
        desc = e.get("description", "")
        # 503: no stream leader yet; 429: the stream's ingest queue is full.
        if code in (503, 429):
            return None, False, errors.UnavailableError(f"JetStream {code}: {desc}"), True
        if code == 413 or "maximum" in desc:
            return None, False, errors.ResourceExhaustedError(f"JetStream {code}: {desc}"), False
        return None, False, errors.InvalidArgumentError(f"JetStream {code}: {desc}"), False
    return int(d.get("seq", 0)), bool(d.get("duplicate", False)), None, True


__all__ = [
    "ColumnHistory",
    "History",
    "TrajectoryColumn",
    "WriterOptions",
    "encode_insert_batch",
    "msg_id",
    "new_producer_id",
    "notice_token",
]
