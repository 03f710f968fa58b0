"""Decoding sample replies into numpy arrays.

A SampleResponse carries every item's sample info and column slices, and
once each the chunks the items reference, still compressed as stored. The
batch path decodes each chunk once, concatenates the chunks of a column into
one array and gathers every item's steps with one numpy fancy-index per
column: no array is built per item.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

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


@dataclasses.dataclass
class _Response:
    code: int
    message: str
    items: Sequence[Any]  # pb.SampledItem
    chunks: Sequence[bytes]
    # The table after the sample: its size and the total weight its sampler
    # draws by, weight_fraction * 2**weight_exponent (see TableInfo).
    table_size: int = 0
    weight_fraction: float = 0.0
    weight_exponent: int = 0


def parse_response(data: bytes) -> _Response:
    """Parses a SampleResponse."""
    try:
        resp = pb.SampleResponse.FromString(data)
    except Exception as e:  # the protobuf runtime's DecodeError
        raise errors.ProtocolError(f"malformed sample response: {e}") from None
    return _Response(
        resp.status.code,
        resp.status.message,
        resp.items,
        resp.chunks,
        resp.table_size,
        resp.weight_fraction,
        resp.weight_exponent,
    )


def raise_for_status(code: int, message: str, partial: Any = None) -> None:
    """Raises the error a reply status stands for (OK and PARTIAL are not
    errors by themselves)."""
    if code in (pb.CODE_OK, pb.CODE_PARTIAL):
        return
    err = errors.error_for_code(code, message)
    if isinstance(err, errors.RateLimitedError):
        err.partial = partial
    raise err


class _Chunks:
    """The chunks of one response, decoded lazily and once each."""

    def __init__(self, raw: Sequence[bytes]) -> None:
        self._raw: dict[int, pb.Chunk] = {}
        for i, b in enumerate(raw):
            try:
                c = pb.Chunk.FromString(b)
            except Exception as e:
                raise errors.ProtocolError(f"chunk {i} of the response: {e}") from None
            self._raw[c.key] = c
        self._decoded: dict[int, np.ndarray] = {}

    def raws(self, keys: Sequence[int]) -> list[Any]:
        """The undecoded chunks of keys."""
        try:
            return [self._raw[k] for k in keys]
        except KeyError as e:
            raise errors.ProtocolError(f"the response references chunk {e.args[0]}, which it does not carry") from None

    def get(self, key: int) -> np.ndarray:
        a = self._decoded.get(key)
        if a is None:
            c = self._raw.get(key)
            if c is None:
                raise errors.ProtocolError(f"the response references chunk {key}, which it does not carry")
            a = _codec.decode_chunk(c, writable=False)
            self._decoded[key] = a
        return a


def _gather_column(name: str, squeeze: bool, slices: Sequence[Any], chunks: _Chunks) -> np.ndarray:
    """One column of one item (the per-item path)."""
    if not slices:
        raise errors.ProtocolError(f"column {name!r} has no slices")
    parts = []
    first: np.ndarray | None = None
    for s in slices:
        a = chunks.get(s.chunk_key)
        if first is None:
            first = a
        elif a.dtype != first.dtype or a.shape[1:] != first.shape[1:]:
            raise errors.ProtocolError(f"column {name!r}: its chunks disagree on dtype or step shape")
        if s.offset < 0 or s.length < 1 or s.offset + s.length > a.shape[0]:
            raise errors.ProtocolError(
                f"column {name!r}: slice wants steps [{s.offset}, {s.offset}+{s.length}) of chunk {s.chunk_key}, which has {a.shape[0]}"
            )
        parts.append(a[s.offset : s.offset + s.length])
    out = parts[0].copy() if len(parts) == 1 else np.concatenate(parts)
    if squeeze:
        if out.shape[0] != 1:
            raise errors.ProtocolError(f"column {name!r} is squeezed but selects {out.shape[0]} steps")
        out = out[0]
    return out


def decode_samples(resp: _Response) -> list[ReplaySample]:
    """Every item of a response as a ReplaySample."""
    chunks = _Chunks(resp.chunks)
    out = []
    for it in resp.items:
        i = it.info
        info = SampleInfo(
            i.key, i.probability, i.table_size, i.priority, i.times_sampled, i.inserted_at_unix_nano, i.rate_limited
        )
        data = {c.name: _gather_column(c.name, c.squeeze, c.slices, chunks) for c in it.columns}
        out.append(ReplaySample(info, data))
    return out


_INFO_DTYPE = np.dtype(
    [
        ("key", np.uint64),
        ("probability", np.float64),
        ("table_size", np.int64),
        ("priority", np.float64),
        ("times_sampled", np.int32),
        ("inserted_at_unix_nano", np.int64),
        ("rate_limited", np.bool_),
    ]
)


def _info_arrays(items: Sequence[Any]) -> BatchInfo:
    rec = np.array(
        [
            (i.key, i.probability, i.table_size, i.priority, i.times_sampled, i.inserted_at_unix_nano, i.rate_limited)
            for i in (it.info for it in items)
        ],
        dtype=_INFO_DTYPE,
    )
    return BatchInfo(**{name: np.ascontiguousarray(rec[name]) for name in _INFO_DTYPE.names or ()})


def decode_batch(resp: _Response) -> SampleBatch:
    """Every item of a response stacked into one batch. Items must agree on
    their column names, order, squeeze flags, step counts, dtypes and step
    shapes (a table with a signature guarantees it); otherwise use
    ``sample``, which returns items one by one."""
    items = resp.items
    info = _info_arrays(items)
    if not items:
        return SampleBatch(info, {})
    chunks = _Chunks(resp.chunks)
    layout = [(c.name, c.squeeze) for c in items[0].columns]
    data: dict[str, np.ndarray] = {}
    for j, (name, squeeze) in enumerate(layout):
        cols = []
        for it in items:
            cs = it.columns
            if len(cs) != len(layout) or cs[j].name != name:
                raise errors.InvalidArgumentError(
                    "the sampled items have different columns; use sample() for tables without a signature"
                )
            cols.append(cs[j])
        data[name] = _gather_batch_column(name, squeeze, cols, chunks)
    return SampleBatch(info, data)


def _gather_single_slices(name: str, squeeze: bool, cols: Sequence[Any], chunks: _Chunks) -> np.ndarray | None:
    """The fast path of _gather_batch_column: every item's column is one
    slice, and no chunk needs delta decoding across steps. The chunks' bytes
    (decompressed where needed) are stacked into one array once (_stack),
    which is the batch itself when item i is chunk i; None when the path
    does not apply."""
    keys: list[int] = []
    offsets: list[int] = []
    lengths: list[int] = []
    for c in cols:
        sl = c.slices
        if len(sl) != 1 or c.squeeze != squeeze:
            return None
        s = sl[0]
        keys.append(s.chunk_key)
        offsets.append(s.offset)
        lengths.append(s.length)
    offs = np.array(offsets, dtype=np.int64)
    lens = np.array(lengths, dtype=np.int64)
    steps = int(lens[0])
    if steps < 1 or not (lens == steps).all():
        return None
    order = list(dict.fromkeys(keys))
    raws = chunks.raws(order)
    c0 = raws[0]
    dtype, step_shape = c0.dtype, tuple(c0.step_shape)
    dt = _codec.DTYPES.get(dtype)
    if dt is None or c0.compression not in (pb.COMPRESSION_NONE, pb.COMPRESSION_ZSTD):
        return None  # the slow path raises the right error
    try:
        step_elems = _codec._num_elements(step_shape, _codec.MAX_CHUNK_RAW_SIZE)
    except ValueError as e:
        raise errors.ProtocolError(f"chunk {c0.key}: step_shape {list(step_shape)}: {e}") from None
    step_bytes = step_elems * dt.itemsize
    rows = [c.length for c in raws]
    total = sum(rows)
    parts: list[Any] = []
    shape0 = list(step_shape)  # compared with a list: a third cheaper than with another chunk's
    none = pb.COMPRESSION_NONE
    for c, length in zip(raws, rows):
        if c.delta_encoded and length > 1:
            return None
        if c.dtype != dtype or c.step_shape != shape0:
            raise errors.InvalidArgumentError(
                f"column {name!r}: items hold steps of different dtypes or shapes; use sample()"
            )
        data = c.data
        n = length * step_bytes
        if c.compression == none and length >= 1 and len(data) == n == c.raw_size:
            parts.append(data)
        else:
            a = chunks.get(c.key)  # checked decoding
            if a.nbytes != n:
                return None  # a size mismatch: the slow path names the chunk
            parts.append(a)
    whole, fresh = _stack(parts, total, step_shape, dt)
    size = np.asarray(rows, dtype=np.int64)
    starts = np.cumsum(size) - size
    if len(order) != len(keys):
        # An item sampled twice, or two items of one chunk: order is not
        # keys, so each item's chunk is looked up.
        at = {k: i for i, k in enumerate(order)}
        idx = np.fromiter((at[k] for k in keys), dtype=np.int64, count=len(keys))
        starts, size = starts[idx], size[idx]
    if (offs < 0).any() or (offs + steps > size).any():
        bad = int(np.flatnonzero((offs < 0) | (offs + steps > size))[0])
        raise errors.ProtocolError(
            f"column {name!r}: slice wants steps [{offs[bad]}, {offs[bad]}+{steps}) of chunk {keys[bad]}, which has {size[bad]}"
        )
    if squeeze and steps != 1:
        raise errors.ProtocolError(f"column {name!r} is squeezed but selects {steps} steps")
    if fresh and len(order) == len(keys) and (offs == 0).all() and (size == steps).all():
        # Item i is chunk i, whole: the array is the batch.
        return whole if squeeze else whole.reshape((len(keys), steps, *step_shape))
    starts += offs
    if squeeze:
        return whole[starts]
    return whole[starts[:, None] + np.arange(steps, dtype=np.int64)[None, :]]


# Chunks at least this large are copied one by one into the batch's array;
# smaller ones are joined first, which costs less per chunk.
_PLACE_BYTES = 16 << 10


def _stack(parts: Sequence[Any], rows: int, step_shape: tuple[int, ...], dt: np.dtype) -> tuple[np.ndarray, bool]:
    """The chunks' steps, in order, as one array of shape [rows,
    *step_shape]: fresh and writable (True), or a read-only view of joined
    bytes (False) that the caller must index into a copy."""
    total = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
    if parts and total >= _PLACE_BYTES * len(parts):
        whole = np.empty((rows, *step_shape), dtype=dt)
        flat = whole.reshape(-1).view(np.uint8)
        at = 0
        for p in parts:
            src = np.frombuffer(p, dtype=np.uint8) if isinstance(p, bytes) else p.reshape(-1).view(np.uint8)
            flat[at : at + src.size] = src
            at += src.size
        return whole, True
    buf = b"".join(p if isinstance(p, bytes) else p.tobytes() for p in parts)
    return np.frombuffer(buf, dtype=dt).reshape((rows, *step_shape)), False


def _gather_batch_column(name: str, squeeze: bool, cols: Sequence[Any], chunks: _Chunks) -> np.ndarray:
    """One column of every item, stacked, gathered with one fancy index."""
    out = _gather_single_slices(name, squeeze, cols, chunks)
    if out is not None:
        return out
    # The column's chunks are concatenated once; placed[key] is where a
    # chunk's first step lands and how many steps it has.
    placed: dict[int, tuple[int, int]] = {}
    arrays: list[np.ndarray] = []
    rows = 0
    starts: list[int] = []
    lengths: list[int] = []
    per_item: list[int] = []
    for c in cols:
        if squeeze != c.squeeze:
            raise errors.InvalidArgumentError(f"column {name!r} is squeezed in some items only; use sample()")
        n = 0
        for s in c.slices:
            p = placed.get(s.chunk_key)
            if p is None:
                a = chunks.get(s.chunk_key)
                p = placed[s.chunk_key] = (rows, a.shape[0])
                rows += a.shape[0]
                arrays.append(a)
            off, ln = s.offset, s.length
            if off < 0 or ln < 1 or off + ln > p[1]:
                raise errors.ProtocolError(
                    f"column {name!r}: slice wants steps [{off}, {off}+{ln}) of chunk {s.chunk_key}, which has {p[1]}"
                )
            starts.append(p[0] + off)
            lengths.append(ln)
            n += ln
        per_item.append(n)
    if not arrays:
        raise errors.ProtocolError(f"column {name!r} has no slices")
    first = arrays[0]
    for a in arrays[1:]:
        if a.dtype != first.dtype or a.shape[1:] != first.shape[1:]:
            raise errors.InvalidArgumentError(
                f"column {name!r}: items hold steps of different dtypes or shapes; use sample()"
            )
    steps = per_item[0]
    if per_item.count(steps) != len(per_item):
        raise errors.InvalidArgumentError(f"column {name!r}: items have different step counts; use sample()")
    if squeeze and steps != 1:
        raise errors.ProtocolError(f"column {name!r} is squeezed but selects {steps} steps")
    whole = first if len(arrays) == 1 else np.concatenate(arrays)
    st = np.asarray(starts, dtype=np.int64)
    if len(st) == len(cols) and squeeze:
        return whole[st]  # [B, *step_shape]
    if len(st) == len(cols):
        # One slice per item (the common case): rows start .. start+T.
        idx = st[:, None] + np.arange(steps, dtype=np.int64)[None, :]
    else:
        # Several slices per item: expand every slice into its rows.
        ln = np.asarray(lengths, dtype=np.int64)
        ends = np.cumsum(ln)
        flat = np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(ends - ln, ln) + np.repeat(st, ln)
        idx = flat.reshape(len(cols), steps)
    out = whole[idx]  # [B, T, *step_shape], a fresh array
    if squeeze:
        out = out[:, 0]
    return out
