"""Chunk encoding: the Python twin of broker/wire/codec.go and delta.go.

A chunk holds ``length`` consecutive steps of one column batched along a new
leading axis, as raw little-endian bytes in C order, optionally delta-encoded
along the step axis (integer dtypes only, wrapping arithmetic) and then
compressed with zstd (or stored as is). Every size is checked before anything
is allocated, as the Go decoder does.
"""

from __future__ import annotations

import math
import threading
from typing import Final

import ml_dtypes
import numpy as np
import zstandard

from . import errors
from ._proto import reprise_pb2 as pb

#: Largest decompressed chunk, in bytes (wire.MaxChunkRawSize).
MAX_CHUNK_RAW_SIZE: Final = 256 << 20
#: The most a sample reply's items may decode to (Go's wire.MaxReplyBytes,
#: the service's default limits.max_reply_bytes): a larger reply is refused
#: before it is decoded.
MAX_REPLY_BYTES: Final = 2 << 30

#: The largest output of one zstd block (RFC 8878); every block costs at
#: least 3 bytes, which bounds what n bytes of zstd data can decode to.
_ZSTD_MAX_BLOCK: Final = 128 << 10

#: zstd level matching the Go side's zstd.SpeedDefault.
ZSTD_LEVEL: Final = 3

#: The dtypes the wire carries, by their numpy names, as little-endian numpy
#: dtypes. bfloat16 comes from ml_dtypes (numpy has none of its own).
DTYPES: Final[dict[str, np.dtype]] = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype("<i1"),
    "int16": np.dtype("<i2"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "uint8": np.dtype("<u1"),
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
    "uint64": np.dtype("<u8"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "complex64": np.dtype("<c8"),
    "complex128": np.dtype("<c16"),
}

_INTEGER: Final = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
_UNSIGNED_OF_WIDTH: Final[dict[int, np.dtype]] = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_NAME_OF: Final[dict[np.dtype, str]] = {}
for _name, _dt in DTYPES.items():
    _NAME_OF[_dt] = _name
    _NAME_OF[_dt.newbyteorder("=")] = _name


def dtype_name(dtype: np.dtype) -> str:
    """The wire name of a numpy dtype, or InvalidArgumentError if the wire has
    no such dtype (strings, objects, structured dtypes...)."""
    dt = np.dtype(dtype)
    name = _NAME_OF.get(dt)
    if name is None and dt.byteorder == ">":
        name = _NAME_OF.get(dt.newbyteorder("<"))
    if name is None:
        raise errors.InvalidArgumentError(
            f"dtype {dt} is not carried by the wire (supported: {', '.join(DTYPES)})"
        )
    return name


def wire_dtype(name: str) -> np.dtype:
    """The numpy dtype of a wire dtype name."""
    try:
        return DTYPES[name]
    except KeyError:
        raise errors.InvalidArgumentError(f"unknown dtype {name!r}") from None


def is_integer(name: str) -> bool:
    """Whether delta encoding applies to the dtype."""
    return name in _INTEGER


class _Local(threading.local):
    def __init__(self) -> None:
        self.compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        self.decompressor = zstandard.ZstdDecompressor()


_local = _Local()


def delta_encode(steps: np.ndarray) -> np.ndarray:
    """Every step but the first becomes its wrapping difference from the
    previous one. ``steps`` has shape [L, ...] and an integer dtype; the
    result is a new array of the same dtype."""
    u = steps.view(_UNSIGNED_OF_WIDTH[steps.dtype.itemsize])
    out = u.copy()
    if len(u) > 1:
        np.subtract(u[1:], u[:-1], out=out[1:])
    return out.view(steps.dtype)


def delta_decode(steps: np.ndarray) -> np.ndarray:
    """Undoes delta_encode with a running (wrapping) sum along axis 0, in
    place when the array is writable."""
    u = steps.view(_UNSIGNED_OF_WIDTH[steps.dtype.itemsize])
    if len(u) > 1:
        np.cumsum(u, axis=0, dtype=u.dtype, out=u)
    return steps


def encode_chunk(
    key: int,
    steps: np.ndarray,
    *,
    compression: str = "zstd",
    delta: bool = True,
    episode_id: int = 0,
    episode_step: int = 0,
) -> pb.Chunk:
    """Encodes ``steps`` (shape [length, *step_shape], a wire dtype) as a
    chunk, as wire.EncodeChunk does: delta-encoded if asked and the dtype is
    an integer, then compressed with zstd unless that would not save at
    least an eighth of its bytes (then stored uncompressed) or
    ``compression`` is "none"."""
    if compression not in ("zstd", "none"):
        raise errors.InvalidArgumentError(
            f"compression {compression!r}: the Python writer writes 'zstd' or 'none' (s2 has no Python codec here)"
        )
    name = dtype_name(steps.dtype)
    if steps.ndim < 1 or steps.shape[0] < 1:
        raise errors.InvalidArgumentError(f"chunk {key} has no steps")
    arr = np.ascontiguousarray(steps, dtype=DTYPES[name])
    raw_size = arr.nbytes
    if raw_size > MAX_CHUNK_RAW_SIZE:
        raise errors.InvalidArgumentError(
            f"chunk {key}: {arr.shape[0]} steps of {raw_size // arr.shape[0]} bytes exceed the chunk limit of {MAX_CHUNK_RAW_SIZE} bytes"
        )
    use_delta = delta and name in _INTEGER
    if use_delta:
        arr = delta_encode(arr)
    raw = arr.tobytes()
    comp = pb.COMPRESSION_NONE
    data = raw
    if compression == "zstd" and raw_size > 0:
        z = _local.compressor.compress(raw)
        if len(z) <= raw_size - raw_size // 8:
            comp, data = pb.COMPRESSION_ZSTD, z
    return pb.Chunk(
        key=key,
        dtype=name,
        step_shape=arr.shape[1:],
        length=arr.shape[0],
        compression=comp,
        delta_encoded=use_delta,
        raw_size=raw_size,
        data=data,
        episode_id=episode_id,
        episode_step=episode_step,
    )


def _num_elements(shape: tuple[int, ...] | list[int], limit: int) -> int:
    for i, d in enumerate(shape):
        if d < 0:
            raise ValueError(f"dimension {i} is {d}")
    if any(d == 0 for d in shape):
        return 0
    n = 1
    for d in shape:
        if n > limit // d:
            raise ValueError(f"more than {limit} elements")
        n *= d
    return n


def decode_chunk(c: pb.Chunk, *, writable: bool = True) -> np.ndarray:
    """Decodes a chunk into an array of shape [length, *step_shape]. Checks
    every field before allocating and never allocates more than the chunk's
    declared raw size (at most MAX_CHUNK_RAW_SIZE). With ``writable`` the
    result owns a writable copy; without, it may be a read-only view of the
    chunk's bytes (the sample path copies when it gathers anyway)."""
    return decode_chunk_fields(
        c.key, c.dtype, tuple(c.step_shape), c.length, c.compression, c.delta_encoded, c.raw_size, c.data, writable
    )


def decode_chunk_fields(
    key: int,
    dtype: str,
    step_shape: tuple[int, ...],
    length: int,
    compression: int,
    delta_encoded: bool,
    raw_size: int,
    data: bytes | memoryview,
    writable: bool = True,
) -> np.ndarray:
    """decode_chunk on a chunk's fields; ``data`` may be a view into a
    larger buffer (a packed sample reply's data), which a read-only result
    of an uncompressed chunk then shares."""
    dt = DTYPES.get(dtype)
    if dt is None:
        raise errors.ProtocolError(f"chunk {key}: unknown dtype {dtype!r}")
    if length < 1:
        raise errors.ProtocolError(f"chunk {key}: length {length} is not positive")
    try:
        step_elems = _num_elements(step_shape, MAX_CHUNK_RAW_SIZE // dt.itemsize)
    except ValueError as e:
        raise errors.ProtocolError(f"chunk {key}: step_shape {list(step_shape)}: {e}") from None
    step_bytes = step_elems * dt.itemsize
    if step_bytes > 0 and length > MAX_CHUNK_RAW_SIZE // step_bytes:
        raise errors.ProtocolError(f"chunk {key}: {length} steps of shape {list(step_shape)} exceed the chunk limit")
    want = step_bytes * length
    if raw_size != want:
        raise errors.ProtocolError(
            f"chunk {key}: raw_size is {raw_size}, {length} steps of shape {list(step_shape)} of {dtype} need {want}"
        )
    if delta_encoded and dtype not in _INTEGER:
        raise errors.ProtocolError(f"chunk {key}: delta_encoded is set on non-integer dtype {dtype}")
    shape = (length, *step_shape)
    if want == 0:
        if data:
            raise errors.ProtocolError(f"chunk {key}: raw_size is 0 but data has {len(data)} bytes")
        return np.empty(shape, dtype=dt)
    if compression == pb.COMPRESSION_NONE:
        if len(data) != want:
            raise errors.ProtocolError(f"chunk {key}: uncompressed data has {len(data)} bytes, raw_size is {want}")
        buf: bytes | bytearray | memoryview = bytearray(data) if writable or delta_encoded else data
        out = np.frombuffer(buf, dtype=dt).reshape(shape)
    elif compression == pb.COMPRESSION_ZSTD:
        if want > (len(data) // 3) * _ZSTD_MAX_BLOCK:
            raise errors.ProtocolError(f"chunk {key}: {len(data)} bytes of zstd data cannot hold raw_size {want}")
        try:
            # The decompressor allocates what a frame declares, whatever
            # max_output_size says: a declared size is checked first.
            declared = zstandard.frame_content_size(data)
            if declared not in (-1, want):
                raise errors.ProtocolError(f"chunk {key}: the zstd frame declares {declared} bytes, raw_size is {want}")
            raw = _local.decompressor.decompress(data, max_output_size=want)
        except zstandard.ZstdError as e:
            raise errors.ProtocolError(f"chunk {key}: zstd data: {e}") from None
        if len(raw) != want:
            raise errors.ProtocolError(f"chunk {key}: zstd data decodes to {len(raw)} bytes, raw_size is {want}")
        buf = bytearray(raw) if writable or delta_encoded else raw
        out = np.frombuffer(buf, dtype=dt).reshape(shape)
    elif compression == pb.COMPRESSION_S2:
        raise errors.UnsupportedCodecError(
            f"chunk {key} is compressed with s2, which the Python client cannot decode: "
            "have the Go producer write zstd or uncompressed chunks "
            "(broker.WithCompression(wire.Zstd) or broker.WithCompression(wire.Uncompressed))"
        )
    else:
        raise errors.ProtocolError(f"chunk {key}: unknown compression {compression}")
    if delta_encoded:
        delta_decode(out)
    return out


def check_finite_priority(p: float, what: str) -> float:
    """Returns p as a float, or raises InvalidArgumentError unless it is
    finite and >= 0."""
    try:
        f = float(p)
    except (TypeError, ValueError):
        raise errors.InvalidArgumentError(f"{what}: priority {p!r} is not a number") from None
    if math.isnan(f) or math.isinf(f) or f < 0:
        raise errors.InvalidArgumentError(f"{what}: priority {f} (must be finite and >= 0)")
    return f
