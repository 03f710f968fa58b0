"""Decoding sample replies into numpy arrays.

The client asks for replies packed in the compact layout
(``SampleRequest.packed`` and ``layout``; ``PackedSamples`` in
broker/wire/reprise.proto): the items' sample info, their columns, the
columns' slices and the chunks' headers come as arrays of fixed-size
little-endian records, and the chunks' bytes, as stored, in one buffer. The
compact records leave out what a reader can derive: where each chunk starts
in the buffer (the sizes before it, each rounded up to 8) and its raw size
(its steps times its format's bytes a step); the rate_limited and squeeze
flags ride in bit 31 of the item's column count and of the column's slice
count. A service that predates the compact layout answers in the wide one,
which this client refuses rather than reads (see _parse_response).

The client asks for the uniform layout, which is the compact one except
where every item of a reply has the same columns, each a whole chunk of its
own (one-step transitions of chunk length 1, say): such a reply sends the
column and chunk records of one item, ``uniform_columns``, for all of them,
and no slice records. Such a reply whose columns are stored plain is read
by _uniform_batch from its n records; otherwise _expand_uniform writes the
records out again, with numpy, before _layout reads them.

parse_response reads the protobuf framing itself and keeps views into the
reply, so that the bytes of a large reply are not copied before they are
gathered; _layout views the records as numpy arrays, derives what the
records leave out and checks every index and size with vector operations;
decode_batch then gathers each column of every item with one numpy fancy
index (a strided copy, in _uniform_batch), straight from the reply's bytes
when the column's chunks are stored uncompressed. No Python code runs per
item in decode_batch. decode_samples decodes the items of a reply as
decode_batch does where they stack, and item by item where they do not.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, NoReturn

import numpy as np

from . import _codec, errors
from ._proto import reprise_pb2 as pb


class SampleInfo(NamedTuple):
    """Sample info of one item, as in Reverb's ``reverb.SampleInfo``.

    ``probability`` is the probability the item had of being selected,
    ``table_size`` the table's size when sampled, ``times_sampled`` how often
    it has been sampled, this time included. Reprise adds
    ``inserted_at_unix_nano`` and ``rate_limited`` (the request waited for
    the rate limiter)."""

    key: int
    probability: float
    table_size: int
    priority: float
    times_sampled: int
    inserted_at_unix_nano: int = 0
    rate_limited: bool = False


class ReplaySample(NamedTuple):
    """One sampled item, as Reverb's ``reverb.ReplaySample``: ``info`` and
    ``data``. Unlike Reverb, ``data`` is a dict of column name to numpy array
    (Reverb returns the nest the writer was given): shape [T, *step_shape]
    for a column of T steps, step_shape for a squeezed single step."""

    info: SampleInfo
    data: dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class BatchInfo:
    """Sample info of a batch, one array entry per item."""

    key: np.ndarray  #: uint64
    probability: np.ndarray  #: float64
    table_size: np.ndarray  #: int64
    priority: np.ndarray  #: float64
    times_sampled: np.ndarray  #: int32
    inserted_at_unix_nano: np.ndarray  #: int64
    rate_limited: np.ndarray  #: bool


@dataclasses.dataclass(frozen=True)
class SampleBatch:
    """A batch of sampled items, stacked.

    ``data`` maps each column to an array of shape [B, T, *step_shape], or
    [B, *step_shape] for squeezed single-step columns; ``info`` holds the
    sample info as arrays of length B."""

    info: BatchInfo
    data: dict[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.info.key.shape[0])


# ---------------------------------------------------------------- the reply

#: Bytes of a reply: views into it keep the reply without copying it.
_Bytes = bytes | memoryview


@dataclasses.dataclass
class _Packed:
    """A reply's PackedSamples, its record arrays as views into the reply."""

    compact_infos: _Bytes = b""
    compact_columns: _Bytes = b""
    names: list[str] = dataclasses.field(default_factory=list)
    slices: _Bytes = b""
    compact_chunks: _Bytes = b""
    #: Each StepFormat as (dtype, step_shape).
    formats: list[tuple[str, tuple[int, ...]]] = dataclasses.field(default_factory=list)
    data: _Bytes = b""
    #: One item's column and chunk records, which every item's columns
    #: follow (the uniform layout), or empty.
    uniform_columns: _Bytes = b""
    #: The reply holds records of the wide layout (infos, columns, chunks),
    #: which only a service that predates SampleRequest.layout sends.
    wide: bool = False


@dataclasses.dataclass
class _Response:
    code: int = 0
    message: str = ""
    # The table after the sample: its size and the total weight its sampler
    # draws by, weight_fraction * 2**weight_exponent (see TableInfo).
    table_size: int = 0
    weight_fraction: float = 0.0
    weight_exponent: int = 0
    packed: _Packed = dataclasses.field(default_factory=_Packed)


class _Malformed(Exception):
    """The protobuf encoding of a reply does not parse."""


_U64 = (1 << 64) - 1
_I64_MIN = 1 << 63
_MAX_FIELD = (1 << 29) - 1
_double = struct.Struct("<d")


def _uvarint(b: _Bytes, i: int, end: int) -> tuple[int, int]:
    """The varint at b[i:end], truncated to 64 bits as protobuf reads it,
    and where it ends."""
    v = 0
    shift = 0
    while i < end:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        if c < 0x80:
            return v & _U64, i
        shift += 7
        if shift == 70:
            raise _Malformed("a varint is longer than 10 bytes")
    raise _Malformed("a varint is cut off")


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= _I64_MIN else v


def _fields(b: _Bytes, i: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """The fields of the message encoded in b[i:end]: (number, wire type,
    a, z), where a is the value of a varint and b[a:z] the value's bytes
    otherwise. Groups (no part of proto3, and no field of these messages)
    are refused rather than skipped."""
    while i < end:
        key, i = _uvarint(b, i, end)
        num, wt = key >> 3, key & 7
        if num == 0 or num > _MAX_FIELD:
            raise _Malformed(f"field number {num}")
        if wt == 0:
            v, i = _uvarint(b, i, end)
            yield num, 0, v, i
            continue
        if wt == 2:
            n, i = _uvarint(b, i, end)
        elif wt == 1:
            n = 8
        elif wt == 5:
            n = 4
        else:
            raise _Malformed(f"field {num} has wire type {wt}")
        if n > end - i:
            raise _Malformed(f"field {num} has {n} bytes, {end - i} are left")
        yield num, wt, i, i + n
        i += n


def _string(b: _Bytes, a: int, z: int) -> str:
    try:
        return bytes(b[a:z]).decode()
    except UnicodeDecodeError as e:
        raise _Malformed(f"a string is not UTF-8: {e}") from None


def parse_response(data: bytes) -> _Response:
    """Parses a SampleResponse. The packed arrays of the result are views
    into ``data``, which the caller must not change."""
    try:
        return _parse_response(data)
    except _Malformed as e:
        raise errors.ProtocolError(f"malformed sample response: {e}") from None


def reply_code(data: bytes) -> int:
    """The status code of a SampleResponse, read without parsing its items
    (CODE_OK for one too malformed to tell: parse_response says why)."""
    code = 0
    try:
        for num, wt, a, z in _fields(data, 0, len(data)):
            if num == 1 and wt == 2:
                for n, w, sa, _ in _fields(data, a, z):
                    if n == 1 and w == 0:
                        c = sa & 0xFFFFFFFF
                        code = c - (1 << 32) if c >> 31 else c
    except _Malformed:
        return 0
    return code


def _parse_response(data: bytes) -> _Response:
    # Fields met twice follow protobuf: a scalar's last value wins, a
    # message's occurrences merge. A field of the wrong wire type is an
    # unknown field, as protobuf has it.
    r = _Response()
    view = memoryview(data)
    unpacked = False
    for num, wt, a, z in _fields(data, 0, len(data)):
        if wt == 2:
            if num == 7:
                _parse_packed(data, view, a, z, r.packed)
            elif num == 1:
                for n, w, sa, sz in _fields(data, a, z):
                    if n == 1 and w == 0:
                        code = sa & 0xFFFFFFFF  # an enum is an int32
                        r.code = code - (1 << 32) if code >> 31 else code
                    elif n == 2 and w == 2:
                        r.message = _string(data, sa, sz)
            elif num in (2, 3):
                unpacked = True
        elif wt == 0:
            if num == 4:
                r.table_size = _int64(a)
            elif num == 6:
                r.weight_exponent = (a >> 1) ^ -(a & 1)
        elif wt == 1 and num == 5:
            r.weight_fraction = _double.unpack_from(data, a)[0]
    if unpacked:
        # A service that predates the packed layout ignores the request's
        # field and answers item by item.
        raise errors.ProtocolError(
            "the sample reply carries its items unpacked: the table service predates "
            "SampleRequest.packed, which this client needs; upgrade reprised"
        )
    if r.packed.wide:
        # A service that predates the compact layout ignores the request's
        # layout and answers in the wide one.
        raise errors.ProtocolError(
            "the sample reply carries its items in the wide packed layout: the table service predates "
            "SampleRequest.layout, which this client needs; upgrade reprised"
        )
    return r


def _parse_packed(b: bytes, view: memoryview, i: int, end: int, p: _Packed) -> None:
    for num, wt, a, z in _fields(b, i, end):
        if wt != 2:
            continue
        if num == 7:
            p.data = view[a:z]
        elif num == 8:
            p.compact_infos = view[a:z]
        elif num == 9:
            p.compact_columns = view[a:z]
        elif num == 4:
            p.slices = view[a:z]
        elif num == 10:
            p.compact_chunks = view[a:z]
        elif num == 11:
            p.uniform_columns = view[a:z]
        elif num in (1, 2, 5):  # infos, columns, chunks
            p.wide = True
        elif num == 3:
            p.names.append(_string(b, a, z))
        elif num == 6:
            dtype = ""
            shape: list[int] = []
            for n, w, fa, fz in _fields(b, a, z):
                if n == 1 and w == 2:
                    dtype = _string(b, fa, fz)
                elif n == 2 and w == 0:
                    shape.append(_int64(fa))
                elif n == 2 and w == 2:  # packed, as proto3 writes repeated scalars
                    while fa < fz:
                        d, fa = _uvarint(b, fa, fz)
                        shape.append(_int64(d))
            p.formats.append((dtype, tuple(shape)))


def raise_for_status(code: int, message: str, partial: Any = None) -> None:
    """Raises the error a reply status stands for (OK and PARTIAL are not
    errors by themselves)."""
    if code in (pb.CODE_OK, pb.CODE_PARTIAL):
        return
    err = errors.error_for_code(code, message)
    if isinstance(err, errors.RateLimitedError):
        err.partial = partial
    raise err


# ------------------------------------------------------------------ records

#: An item's record, whose fields become BatchInfo's arrays: "columns"
#: holds the item's column count in bits 0-30 and rate_limited in bit 31.
#: The other records are read as 2-D arrays of unsigned integers, a record
#: a row.
_INFO_REC = np.dtype(
    {
        "names": ["key", "probability", "table_size", "priority", "inserted_at_unix_nano", "times_sampled", "columns"],
        "formats": ["<u8", "<f8", "<i8", "<f8", "<i8", "<i4", "<u4"],
        "offsets": [0, 8, 16, 24, 32, 40, 44],
        "itemsize": 48,
    }
)
#: A column's record: name, slices (uint32 each; bit 31 of slices is the
#: squeeze flag, the other bits the count).
_COLUMN_SIZE = 8
#: A slice's record: chunk, offset, length (uint32 each).
_SLICE_SIZE = 12
#: A chunk's record: key (uint64), size, steps, format (uint32 each),
#: compression, delta (uint8 each), 2 zero bytes.
_CHUNK_SIZE = 24
#: A uniform column's record: its column record (slices 1), then its
#: chunks' record (key 0).
_UNIFORM_SIZE = _COLUMN_SIZE + _CHUNK_SIZE
#: The flag bit of a compact info's column count and a compact column's
#: slice count, and the mask of the count below it.
_FLAG = 31
_COUNT = (1 << _FLAG) - 1
#: Where the chunks' bytes start in data: the first at 0, each next one at
#: a multiple of this past the end of the one before.
_ALIGN = 8

#: BatchInfo's fields and their dtypes, in SampleInfo's order: all but
#: rate_limited, the last, are fields of _INFO_REC.
_INFO_FIELDS: tuple[tuple[str, np.dtype], ...] = (
    ("key", np.dtype(np.uint64)),
    ("probability", np.dtype(np.float64)),
    ("table_size", np.dtype(np.int64)),
    ("priority", np.dtype(np.float64)),
    ("times_sampled", np.dtype(np.int32)),
    ("inserted_at_unix_nano", np.dtype(np.int64)),
    ("rate_limited", np.dtype(np.bool_)),
)

#: The unsigned integers a column's bytes are gathered as, by size: a chunk
#: starts at a multiple of 8 in the reply's data, so steps of a dtype of at
#: most 8 bytes start at a multiple of its size, and those of complex128 at
#: a multiple of 8.
_UNITS: dict[int, np.dtype] = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}


class _Format(NamedTuple):
    """A StepFormat, checked."""

    dtype: str
    dt: np.dtype
    shape: tuple[int, ...]
    step_elems: int
    step_bytes: int


@dataclasses.dataclass
class _Layout:
    """A reply's records as numpy arrays, every index and size checked.
    Indices and counts are int64."""

    n: int
    info: np.ndarray  # _INFO_REC
    limited: np.ndarray  # bool: each item's rate_limited
    ncols: np.ndarray  # each item's columns
    names: list[str]
    formats: list[_Format]
    # Per column record:
    col_name: np.ndarray
    col_squeeze: np.ndarray  # bool
    col_nslices: np.ndarray
    col_first: np.ndarray  # its first slice record
    col_steps: np.ndarray  # the steps its slices select
    col_format: np.ndarray  # its chunks' format (the first index of equal formats)
    single: bool  # every column is one slice (slice k is column k)
    # Per slice record:
    sl_chunk: np.ndarray
    sl_offset: np.ndarray
    sl_length: np.ndarray
    # Per chunk record:
    ch_key: np.ndarray  # uint64
    ch_at: np.ndarray  # derived from the sizes before it
    ch_size: np.ndarray
    ch_raw: np.ndarray  # derived: steps times the format's bytes a step
    ch_steps: np.ndarray
    ch_format: np.ndarray  # the first index of equal formats
    ch_compression: np.ndarray  # uint8
    ch_delta: np.ndarray  # uint8
    ch_plain: np.ndarray  # bool: its data are its steps (uncompressed, no delta to undo)
    data: _Bytes


_max = np.maximum.reduce
_min = np.minimum.reduce


def _fail(mask: np.ndarray, say: Callable[[int], str]) -> NoReturn:
    """Raises ProtocolError naming the problem of the first record that
    ``mask`` flags. Checks call it once a reduction found a bad record, so
    that the masks are built on the error path only."""
    raise errors.ProtocolError(say(int(mask.argmax())))


@functools.lru_cache(maxsize=256)
def _format(dtype: str, shape: tuple[int, ...]) -> _Format | str:
    """A step format, checked, or what is wrong with it. Replies of a table
    carry the same few formats: each is checked once."""
    dt = _codec.DTYPES.get(dtype)
    if dt is None:
        return f"unknown dtype {dtype!r}"
    try:
        elems = _codec._num_elements(shape, _codec.MAX_CHUNK_RAW_SIZE // dt.itemsize)
    except ValueError as e:
        return f"step_shape {list(shape)}: {e}"
    return _Format(dtype, dt, shape, elems, elems * dt.itemsize)


def _formats(formats: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[list[_Format], np.ndarray]:
    """The formats, checked, and for each the index of the first format
    equal to it (a column's chunks agree when these agree)."""
    out: list[_Format] = []
    first: dict[_Format, int] = {}
    for i, fs in enumerate(formats):
        f = _format(*fs)
        if isinstance(f, str):
            raise errors.ProtocolError(f"format {i}: {f}")
        out.append(f)
        first.setdefault(f, i)
    return out, np.array([first[f] for f in out], dtype=np.int64)


def _expand_uniform(p: _Packed) -> None:
    """Writes out the column, slice and chunk records that a reply's
    uniform columns stand for: item i's column j is uniform record j, its
    one slice all the steps of chunk i*n+j, which is as record j says. The
    reply then holds those records instead, so that it decodes again."""
    u = p.uniform_columns
    if len(u) % _UNIFORM_SIZE:
        raise errors.ProtocolError(
            f"packed uniform_columns has {len(u)} bytes, not a whole number of {_UNIFORM_SIZE}-byte records"
        )
    if len(p.compact_columns) or len(p.slices) or len(p.compact_chunks):
        raise errors.ProtocolError("packed uniform_columns beside column, slice or chunk records")
    n, items = len(u) // _UNIFORM_SIZE, len(p.compact_infos) // _INFO_REC.itemsize
    # Each chunk holds a byte or more, so each but the last takes 8 bytes of
    # data or more: what is written here is bounded by the reply's size.
    if items * n > len(p.data) // _ALIGN + 1:
        raise errors.ProtocolError(
            f"packed samples: {items} items of {n} uniform columns, each a chunk of its own, in {len(p.data)} bytes of data"
        )
    # A record is 8 uint32: the column's 2, then the chunk's 6 (its key is
    # the first two).
    rec = np.frombuffer(u, "<u4").reshape(n, _UNIFORM_SIZE // 4)
    nsl = rec[:, 1] & _COUNT
    if (nsl != 1).any():
        _fail(nsl != 1, lambda j: f"packed uniform column {j} has {nsl[j]} slices, not 1")
    total = items * n
    p.uniform_columns = b""
    if total == 0:
        # No items: no records (a cast of an empty view would fail).
        return
    sls = np.zeros((items, n, 3), "<u4")
    sls[:, :, 0] = np.arange(total, dtype="<u4").reshape(items, n)
    sls[:, :, 2] = rec[:, 5]
    # Bytes of new contiguous arrays, which _layout views as it views the
    # reply's.
    pattern = rec[None]
    p.compact_columns = np.repeat(pattern[:, :, :2], items, axis=0).data.cast("B")
    p.slices = sls.data.cast("B")
    p.compact_chunks = np.repeat(pattern[:, :, 2:], items, axis=0).data.cast("B")


def _layout(p: _Packed) -> _Layout:
    """The reply's records, checked, with what the compact layout leaves
    out derived: record sizes, counts, every index in range, every chunk
    within the data and, uncompressed, of the size its format and steps
    give, every slice within its chunk, every column's chunks of one
    format."""
    if len(p.uniform_columns):
        _expand_uniform(p)
    for what, buf, rec in (
        ("compact_infos", p.compact_infos, _INFO_REC.itemsize),
        ("compact_columns", p.compact_columns, _COLUMN_SIZE),
        ("slices", p.slices, _SLICE_SIZE),
        ("compact_chunks", p.compact_chunks, _CHUNK_SIZE),
    ):
        if len(buf) % rec:
            raise errors.ProtocolError(f"packed {what} has {len(buf)} bytes, not a whole number of {rec}-byte records")
    info = np.frombuffer(p.compact_infos, _INFO_REC)
    cols = np.frombuffer(p.compact_columns, "<u4").reshape(-1, 2)
    sls = np.frombuffer(p.slices, "<u4").reshape(-1, 3)
    c8 = np.frombuffer(p.compact_chunks, "<u8").reshape(-1, 3)
    c4, c1 = c8.view("<u4"), c8.view("u1")
    names = p.names
    formats, canon = _formats(p.formats)
    nf, ndata = len(formats), len(p.data)
    n, ncol, nsl, nch = len(info), len(cols), len(sls), len(c8)
    flagged = info["columns"]
    ncols = (flagged & _COUNT).astype(np.int64)
    limited = (flagged >> _FLAG).astype(bool)
    item_end = np.add.accumulate(ncols)
    key, size, steps, fmt = c8[:, 0], c4[:, 2], c4[:, 3], c4[:, 4]
    comp, delta = c1[:, 20], c1[:, 21]
    col_name = cols[:, 0].astype(np.int64)
    col_nslices = (cols[:, 1] & _COUNT).astype(np.int64)
    col_squeeze = (cols[:, 1] >> _FLAG).astype(bool)
    col_end = np.add.accumulate(col_nslices)
    s64 = sls.astype(np.int64)
    sl_chunk, sl_offset, sl_length = s64[:, 0], s64[:, 1], s64[:, 2]

    # What errors say of a record (found on the error path only).
    def chunk(c: int) -> str:
        return f"chunk {c} (key {key[c]})"

    def column(k: int) -> str:
        i = int(np.searchsorted(item_end, k, side="right"))
        j = k - int(item_end[i] - ncols[i])
        name = f" {names[col_name[k]]!r}" if col_name[k] < len(names) else ""
        return f"item {i} column {j}{name}"

    def slice_(s: int) -> str:
        return f"slice {s} ({column(int(np.searchsorted(col_end, s, side='right')))})"

    if int(item_end[-1] if n else 0) != ncol:
        raise errors.ProtocolError(f"the items have {int(ncols.sum())} columns, the reply {ncol} column records")

    # Chunks: where each starts, then each field alone, then sizes by
    # format. A chunk starts where the one before ends, rounded up to a
    # multiple of 8 (the records do not say): sizes are uint32 and a reply
    # holds far fewer than 2**31 chunk records, so int64 sums them without
    # wrapping. at never decreases and at + size is at most the next
    # chunk's at, so the last chunk ends furthest: one comparison checks
    # that every chunk lies within data.
    ch_size = size.astype(np.int64)
    padded = (ch_size + (_ALIGN - 1)) & -_ALIGN
    ch_at = np.add.accumulate(padded) - padded
    ch_steps = steps.astype(np.int64)
    if nch:
        if _min(steps) == 0:
            _fail(steps == 0, lambda c: f"{chunk(c)}: length 0 is not positive")
        if _max(fmt) >= nf:
            _fail(fmt >= nf, lambda c: f"{chunk(c)}: format {fmt[c]} of {nf}")
        if _max(comp) > pb.COMPRESSION_S2:
            _fail(comp > pb.COMPRESSION_S2, lambda c: f"{chunk(c)}: unknown compression {comp[c]}")
        if _max(delta) > 1:
            _fail(delta > 1, lambda c: f"{chunk(c)}: delta is {delta[c]}, not 0 or 1")
        if int(ch_at[-1] + ch_size[-1]) > ndata:
            _fail(
                ch_at + ch_size > ndata,
                lambda c: f"{chunk(c)}: bytes [{ch_at[c]}, {ch_at[c]}+{size[c]}) lie beyond the {ndata} bytes of data",
            )
    # The raw size: steps < 2**32 and a step's bytes <= MAX_CHUNK_RAW_SIZE,
    # so int64 holds their product.
    ch_format = canon[fmt]
    ch_raw = ch_steps * np.array([f.step_bytes for f in formats], dtype=np.int64)[ch_format]
    uncompressed = comp == pb.COMPRESSION_NONE
    if nch:

        def steps_of(c: int) -> str:
            f = formats[ch_format[c]]
            return f"{steps[c]} steps of {f.dtype}{list(f.shape)}"

        if _max(ch_raw) > _codec.MAX_CHUNK_RAW_SIZE:
            _fail(
                ch_raw > _codec.MAX_CHUNK_RAW_SIZE,
                lambda c: f"{chunk(c)}: {steps_of(c)} make {ch_raw[c]} bytes, "
                f"beyond the chunk limit of {_codec.MAX_CHUNK_RAW_SIZE}",
            )
        if (uncompressed & (ch_size != ch_raw)).any():
            _fail(
                uncompressed & (ch_size != ch_raw),
                lambda c: f"{chunk(c)}: uncompressed data has {size[c]} bytes, {steps_of(c)} need {ch_raw[c]}",
            )
        not_integer = np.array([not _codec.is_integer(f.dtype) for f in formats], dtype=np.uint8)[ch_format]
        if _max(delta & not_integer):
            _fail(
                delta & not_integer,
                lambda c: f"{chunk(c)}: delta_encoded is set on non-integer dtype {formats[ch_format[c]].dtype}",
            )
    # Delta encoding leaves a chunk of one step as it is.
    ch_plain = uncompressed & ((delta == 0) | (steps == 1))

    if ncol:
        if _max(col_name) >= len(names):
            _fail(col_name >= len(names), lambda k: f"{column(k)}: name {col_name[k]} of {len(names)}")
        if _min(col_nslices) == 0:
            _fail(col_nslices == 0, lambda k: f"{column(k)} has no slices")
    if int(col_end[-1] if ncol else 0) != nsl:
        raise errors.ProtocolError(f"the columns have {int(col_nslices.sum())} slices, the reply {nsl} slice records")

    if nsl:
        if _max(sl_chunk) >= nch:
            _fail(sl_chunk >= nch, lambda s: f"{slice_(s)}: chunk {sl_chunk[s]} of {nch}")
        if _min(sl_length) == 0:
            _fail(sl_length == 0, lambda s: f"{slice_(s)}: length 0 is not positive")
        beyond = sl_offset + sl_length > ch_steps[sl_chunk]
        if beyond.any():
            _fail(
                beyond,
                lambda s: f"{slice_(s)}: wants steps [{sl_offset[s]}, {sl_offset[s]}+{sl_length[s]}) "
                f"of {chunk(sl_chunk[s])}, which has {steps[sl_chunk[s]]}",
            )
    col_first = col_end - col_nslices
    sl_format = ch_format[sl_chunk]
    single = nsl == ncol
    if single:
        col_steps, col_format = sl_length, sl_format
    else:
        col_steps = np.add.reduceat(sl_length, col_first)
        col_format = sl_format[col_first]
        mixed = sl_format != np.repeat(col_format, col_nslices)
        if mixed.any():
            _fail(mixed, lambda s: f"{slice_(s)}: the column's chunks disagree on dtype or step shape")
    if ncol and (col_squeeze & (col_steps != 1)).any():
        _fail(col_squeeze & (col_steps != 1), lambda k: f"{column(k)} is squeezed but selects {col_steps[k]} steps")
    # What the items decode to is bounded before anything is allocated for
    # them, as in Go: a reply of a few megabytes (a chunk sliced a million
    # times) asked for terabytes. In float64: the sum may pass int64.
    if ncol:
        step_bytes = np.array([f.step_bytes for f in formats], dtype=np.float64)
        total = float(np.dot(col_steps.astype(np.float64), step_bytes[col_format]))
        if total > _codec.MAX_REPLY_BYTES:
            raise errors.ProtocolError(
                f"the items decode to {total:.0f} bytes, over the {_codec.MAX_REPLY_BYTES} a reply may "
                "(the service's default limits.max_reply_bytes)"
            )
    return _Layout(
        n, info, limited, ncols, names, formats,
        col_name, col_squeeze, col_nslices, col_first, col_steps, col_format, single,
        sl_chunk, sl_offset, sl_length,
        key, ch_at, ch_size, ch_raw, ch_steps, ch_format, comp, delta, ch_plain,
        p.data,
    )  # fmt: skip


def _decode_chunk(lay: _Layout, c: int) -> np.ndarray:
    """Chunk c as an array of shape [steps, *step_shape], read-only."""
    f = lay.formats[lay.ch_format[c]]
    at = int(lay.ch_at[c])
    return _codec.decode_chunk_fields(
        int(lay.ch_key[c]), f.dtype, f.shape, int(lay.ch_steps[c]), int(lay.ch_compression[c]),
        bool(lay.ch_delta[c]), int(lay.ch_raw[c]), lay.data[at : at + int(lay.ch_size[c])], writable=False,
    )  # fmt: skip


class _Decoded:
    """The chunks of a reply that are compressed or delta-encoded, decoded
    once each: items read one by one may share them."""

    def __init__(self, layout: _Layout) -> None:
        self._layout = layout
        self._done: dict[int, np.ndarray] = {}

    def get(self, c: int) -> np.ndarray:
        """Chunk c as an array of shape [steps, *step_shape], read-only."""
        a = self._done.get(c)
        if a is None:
            a = self._done[c] = _decode_chunk(self._layout, c)
        return a


# ---------------------------------------------------------------- decoding


def decode_samples(resp: _Response) -> list[ReplaySample]:
    """Every item of a response as a ReplaySample. Items that decode_batch
    stacks (those of a table with a signature) are decoded as a batch, each
    item its rows of the batch's arrays: no two items share memory, and a
    reply of many small items is not read item by item. Items that do not
    stack are."""
    p = resp.packed
    batch = _uniform_batch(p)
    if batch is None:
        lay = _layout(p)
        try:
            batch = _batch(lay)
        except errors.InvalidArgumentError:
            return _items(lay)
    fields = [getattr(batch.info, name).tolist() for name, _ in _INFO_FIELDS]
    names = list(batch.data)
    if not names:
        return [ReplaySample(SampleInfo._make(f), {}) for f in zip(*fields)]
    return [
        ReplaySample(SampleInfo._make(f), dict(zip(names, row)))
        for f, row in zip(zip(*fields), zip(*map(_rows, batch.data.values())))
    ]


def _rows(a: np.ndarray) -> Iterable[np.ndarray]:
    """The rows of a batch's column as arrays: iterating a column of scalar
    steps would give numpy scalars, which are not arrays."""
    return a if a.ndim > 1 else [a[i, ...] for i in range(len(a))]


def _items(lay: _Layout) -> list[ReplaySample]:
    """The items of a reply one by one, each column copied alone."""
    info = lay.info
    fields = [info[name].tolist() for name, _ in _INFO_FIELDS[:-1]]  # in SampleInfo's order
    infos = list(map(SampleInfo._make, zip(*fields, lay.limited.tolist())))
    decoded = _Decoded(lay)
    names = [lay.names[k] for k in lay.col_name.tolist()]
    squeeze = lay.col_squeeze.tolist()
    fmt = lay.col_format.tolist()
    steps = lay.col_steps.tolist()
    first = lay.col_first.tolist()
    nslices = lay.col_nslices.tolist()
    sl_chunk, sl_offset, sl_length = lay.sl_chunk.tolist(), lay.sl_offset.tolist(), lay.sl_length.tolist()
    plain, at = lay.ch_plain.tolist(), lay.ch_at.tolist()
    out = []
    k0 = 0  # the item's first column record
    for i, ncols in enumerate(lay.ncols.tolist()):
        data: dict[str, np.ndarray] = {}
        for k in range(k0, k0 + ncols):
            f = lay.formats[fmt[k]]
            elems = f.step_elems
            shape = (steps[k], *f.shape)
            if elems == 0:
                a = np.empty(shape, dtype=f.dt)
            else:
                parts = []
                for s in range(first[k], first[k] + nslices[k]):
                    c, off, ln = sl_chunk[s], sl_offset[s], sl_length[s]
                    if plain[c]:
                        parts.append(np.frombuffer(lay.data, f.dt, count=ln * elems, offset=at[c] + off * f.step_bytes))
                    else:
                        parts.append(decoded.get(c).reshape(-1)[off * elems : (off + ln) * elems])
                a = (parts[0].copy() if len(parts) == 1 else np.concatenate(parts)).reshape(shape)
            name = names[k]
            if name in data:
                raise errors.ProtocolError(f"item {i} has column {name!r} twice")
            data[name] = a[0, ...] if squeeze[k] else a
        k0 += ncols
        out.append(ReplaySample(infos[i], data))
    return out


def _batch_info(info: np.ndarray, limited: np.ndarray) -> BatchInfo:
    """BatchInfo of the items' records and rate_limited flags (which the
    records hold in a bit of their column counts)."""
    # astype copies: the arrays own their memory, apart from the reply's.
    fields = {name: info[name].astype(dt) for name, dt in _INFO_FIELDS[:-1]}
    return BatchInfo(**fields, rate_limited=limited.astype(np.bool_))


def empty_batch() -> SampleBatch:
    """A batch of no items."""
    return SampleBatch(_batch_info(np.empty(0, _INFO_REC), np.empty(0, np.bool_)), {})


def decode_batch(resp: _Response) -> SampleBatch:
    """Every item of a response stacked into one batch. Items must agree on
    their column names, order, squeeze flags, step counts, dtypes and step
    shapes (a table with a signature guarantees it); otherwise use
    ``sample``, which returns items one by one."""
    batch = _uniform_batch(resp.packed)
    return batch if batch is not None else _batch(_layout(resp.packed))


def _batch(lay: _Layout) -> SampleBatch:
    """The items of a reply stacked, or InvalidArgumentError where they do
    not stack."""
    info = _batch_info(lay.info, lay.limited)
    n = lay.n
    if n == 0:
        return SampleBatch(info, {})
    width = int(lay.ncols[0])
    if (lay.ncols != width).any():
        raise errors.InvalidArgumentError(
            "the sampled items have different columns; use sample() for tables without a signature"
        )
    if width == 0:
        return SampleBatch(info, {})
    # Row i of each grid is item i's columns.
    name = lay.col_name.reshape(n, width)
    squeeze = lay.col_squeeze.reshape(n, width)
    fmt = lay.col_format.reshape(n, width)
    steps = lay.col_steps.reshape(n, width)
    odd = (name != name[0]) | (squeeze != squeeze[0]) | (fmt != fmt[0]) | (steps != steps[0])
    if odd.any():
        if (name != name[0]).any():
            raise errors.InvalidArgumentError(
                "the sampled items have different columns; use sample() for tables without a signature"
            )
        j = int(odd.any(axis=0).argmax())
        col = lay.names[name[0, j]]
        if (squeeze[:, j] != squeeze[0, j]).any():
            raise errors.InvalidArgumentError(f"column {col!r} is squeezed in some items only; use sample()")
        if (fmt[:, j] != fmt[0, j]).any():
            raise errors.InvalidArgumentError(
                f"column {col!r}: items hold steps of different dtypes or shapes; use sample()"
            )
        raise errors.InvalidArgumentError(f"column {col!r}: items have different step counts; use sample()")
    layout = [lay.names[k] for k in name[0].tolist()]
    if len(set(layout)) != width:
        dup = next(c for c in layout if layout.count(c) > 1)
        raise errors.ProtocolError(f"item 0 has column {dup!r} twice")
    shared = _Shared(lay, width)
    data = {}
    for j, col in enumerate(layout):
        f = lay.formats[fmt[0, j]]
        data[col] = _gather(lay, j, width, f, int(steps[0, j]), bool(squeeze[0, j]), shared)
    return SampleBatch(info, data)


class _Shared:
    """The compressed or delta-encoded chunks of a batch that more than one
    column takes slices of (an item's obs and next_obs out of one
    trajectory column, say): each is decoded once, and kept only until the
    last of those columns is gathered."""

    def __init__(self, lay: _Layout, width: int) -> None:
        self._layout = lay
        self._uses: dict[int, int] = {}
        self._kept: dict[int, np.ndarray] = {}
        chunk = lay.sl_chunk
        coded = ~lay.ch_plain[chunk]
        if not coded.any():
            return
        column = np.repeat(np.arange(len(lay.col_nslices)) % width, lay.col_nslices)
        pairs = np.unique(np.stack([chunk[coded].astype(np.int64), column[coded]]), axis=1)
        chunks, uses = np.unique(pairs[0], return_counts=True)
        many = uses > 1
        self._uses = dict(zip(chunks[many].tolist(), uses[many].tolist()))

    def take(self, c: int) -> np.ndarray:
        """Chunk c decoded, for one column that uses it."""
        uses = self._uses.get(c)
        if uses is None:
            return _decode_chunk(self._layout, c)
        a = self._kept.pop(c, None)
        if a is None:
            a = _decode_chunk(self._layout, c)
        if uses > 1:
            self._kept[c] = a
            self._uses[c] = uses - 1
        else:
            del self._uses[c]
        return a


#: A uniform record whole: the column's name and slices, then its chunks'
#: key, size, steps, format, compression and delta.
_UNIFORM_REC = struct.Struct("<IIQIIIBB2x")


def _uniform_batch(p: _Packed) -> SampleBatch | None:
    """The batch of a sound reply in the uniform form (uniform columns, no
    other column records) whose items each have the n uniform columns and
    whose columns are stored plain (uncompressed, no delta to undo); None
    for any other reply, which _layout then reads and checks, so that
    errors and odd replies take one way. Such a reply
    is the usual one of a table of one-step items. Its checks are those of
    one item's records, and run in Python over a few records they cost a
    fraction of _layout's vector operations, each of which costs more to
    start than to run on a reply's records. Item i's column j lies i times
    the bytes of an item's chunks past item 0's, so that one strided copy
    gathers each column."""
    u, infos = p.uniform_columns, p.compact_infos
    n, rest = divmod(len(u), _UNIFORM_SIZE)
    items, odd = divmod(len(infos), _INFO_REC.itemsize)
    nf, names, ndata = len(p.formats), p.names, len(p.data)
    if not n or rest or odd or not items or len(p.compact_columns) or len(p.slices) or len(p.compact_chunks):
        return None
    if items * n > ndata // _ALIGN + 1 or any(isinstance(_format(*fs), str) for fs in p.formats):
        return None
    cols: list[tuple[str, _Format, int, bool]] = []  # name, format, steps, squeeze
    at = 0  # where the column's chunk starts, past the item's first
    starts = []
    for j in range(n):
        name, nsl, _, size, steps, fmt, comp, delta = _UNIFORM_REC.unpack_from(u, j * _UNIFORM_SIZE)
        if name >= len(names) or nsl & _COUNT != 1 or not steps or fmt >= nf:
            return None
        f = _format(*p.formats[fmt])
        if isinstance(f, str) or comp != pb.COMPRESSION_NONE or delta > 1 or (delta and steps != 1):
            return None
        squeeze = bool(nsl >> _FLAG)
        if size != steps * f.step_bytes or size > _codec.MAX_CHUNK_RAW_SIZE or (squeeze and steps != 1):
            return None
        if delta and not _codec.is_integer(f.dtype):
            return None
        cols.append((names[name], f, steps, squeeze))
        starts.append(at)
        at += (size + _ALIGN - 1) & -_ALIGN
    stride = at
    # Where the last item's last chunk ends, before its padding.
    last = (items - 1) * stride + starts[-1] + cols[-1][1].step_bytes * cols[-1][2]
    if last > ndata or len({c[0] for c in cols}) != n:
        return None
    info = np.frombuffer(infos, _INFO_REC)
    flagged = info["columns"]
    if n != int(_max(flagged & _COUNT)) or n != int(_min(flagged & _COUNT)):
        return None
    data = {}
    for (name, f, steps, squeeze), start in zip(cols, starts):
        shape = (items, *f.shape) if squeeze else (items, steps, *f.shape)
        if not f.step_bytes:
            data[name] = np.empty(shape, dtype=f.dt)
            continue
        unit = min(f.dt.itemsize, 8)
        row = steps * f.step_bytes
        view = np.ndarray((items, row // unit), _UNITS[unit], p.data, start, (stride, unit))
        data[name] = view.copy().view(f.dt).reshape(shape)
    return SampleBatch(_batch_info(info, (flagged >> _FLAG).astype(bool)), data)


def _gather(lay: _Layout, j: int, width: int, f: _Format, steps: int, squeeze: bool, shared: _Shared) -> np.ndarray:
    """Column j of every item, stacked: a fresh array."""
    n = lay.n
    shape = (n, *f.shape) if squeeze else (n, steps, *f.shape)
    if f.step_bytes == 0:
        return np.empty(shape, dtype=f.dt)
    # The column's slice records, item by item.
    if lay.single:
        s: np.ndarray | slice = slice(j, None, width)
        count = None
    else:
        first = lay.col_first[j::width]
        count = lay.col_nslices[j::width]
        if (count == 1).all():
            s, count = first, None
        else:
            total = int(count.sum())
            s = np.arange(total) + np.repeat(first - (np.cumsum(count) - count), count)
    chunk, offset = lay.sl_chunk[s], lay.sl_offset[s]
    if lay.ch_plain[chunk].all():
        buf, base = lay.data, lay.ch_at
    else:
        buf, base = _decode_column(lay, chunk, shared)
    start = base[chunk] + offset * f.step_bytes  # in bytes
    if count is None:
        row = steps * f.step_bytes  # one row an item
    else:
        # Each slice's steps become rows of their own.
        length = lay.sl_length[s]
        ends = np.cumsum(length)
        start = np.repeat(start, length) + (np.arange(int(ends[-1])) - np.repeat(ends - length, length)) * f.step_bytes
        row = f.step_bytes
    unit = min(f.dt.itemsize, 8)
    # Every window of row bytes that starts at a multiple of unit: the rows
    # overlap, and a fancy index copies the ones wanted.
    rows = np.ndarray(((len(buf) - row) // unit + 1, row // unit), dtype=_UNITS[unit], buffer=buf, strides=(unit, unit))
    return rows[start // unit].view(f.dt).reshape(shape)


def _decode_column(lay: _Layout, chunk: np.ndarray, shared: _Shared) -> tuple[Any, np.ndarray]:
    """The distinct chunks among chunk, decoded and joined, and where each
    starts in the joined bytes (by chunk index). Each chunk is decoded
    straight into its place and dropped, unless a later column takes
    slices of it too: a column's chunks decoded whole can be many times the
    rows its items take, so holding them all, or those of earlier columns,
    beside the joined bytes would multiply what a reply costs the
    learner's memory."""
    distinct = np.unique(chunk)
    sizes = lay.ch_raw[distinct]
    base = np.zeros(len(lay.ch_key), dtype=np.int64)
    base[distinct] = np.cumsum(sizes) - sizes
    joined = np.empty(int(sizes.sum()), dtype=np.uint8)
    for c, at, size in zip(distinct.tolist(), base[distinct].tolist(), sizes.tolist()):
        joined[at : at + size] = shared.take(c).reshape(-1).view(np.uint8)
    return joined, base
