"""A packed sample reply encoder for tests: what the Go service writes
(AppendPackedSampleResponse, PackedSamples in broker/wire/reprise.proto),
built from plain descriptions of items and pb.Chunk messages."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable, Sequence

from reprise._proto import reprise_pb2 as pb

INFO = struct.Struct("<QdqdqiIB7x")
COLUMN = struct.Struct("<III")
SLICE = struct.Struct("<III")
CHUNK = struct.Struct("<QQQQIIBB6x")


@dataclasses.dataclass
class Column:
    name: str
    #: (chunk key, offset, length) of each slice, in order.
    slices: list[tuple[int, int, int]]
    squeeze: bool = False


@dataclasses.dataclass
class Item:
    columns: list[Column]
    key: int = 0
    probability: float = 0.0
    table_size: int = 0
    priority: float = 0.0
    times_sampled: int = 0
    inserted_at_unix_nano: int = 0
    rate_limited: bool = False


def pack(
    items: Sequence[Item],
    chunks: Iterable[pb.Chunk],
    *,
    code: int = pb.CODE_OK,
    message: str = "",
    table_size: int = 0,
) -> pb.SampleResponse:
    """A SampleResponse with items packed: chunks in the order the items
    first use them, names and formats each once, each chunk's bytes at a
    multiple of 8 in data."""
    by_key = {c.key: c for c in chunks}
    order: dict[int, int] = {}  # chunk key -> record index
    names: dict[str, int] = {}
    formats: dict[tuple[str, tuple[int, ...]], int] = {}
    infos, columns, slices = bytearray(), bytearray(), bytearray()
    for it in items:
        infos += INFO.pack(
            it.key, it.probability, it.table_size, it.priority, it.inserted_at_unix_nano, it.times_sampled,
            len(it.columns), int(it.rate_limited),
        )  # fmt: skip
        for col in it.columns:
            columns += COLUMN.pack(names.setdefault(col.name, len(names)), len(col.slices), int(col.squeeze))
            for key, off, ln in col.slices:
                slices += SLICE.pack(order.setdefault(key, len(order)), off, ln)
    records, data = bytearray(), bytearray()
    for key in order:
        c = by_key[key]
        fmt = formats.setdefault((c.dtype, tuple(c.step_shape)), len(formats))
        records += CHUNK.pack(c.key, len(data), len(c.data), c.raw_size, c.length, fmt, c.compression, int(c.delta_encoded))
        data += c.data
        data += bytes(-len(data) % 8)
    packed = pb.PackedSamples(
        infos=bytes(infos),
        columns=bytes(columns),
        names=list(names),
        slices=bytes(slices),
        chunks=bytes(records),
        formats=[pb.StepFormat(dtype=d, step_shape=s) for d, s in formats],
        data=bytes(data),
    )
    resp = pb.SampleResponse(status=pb.Status(code=code, message=message), table_size=table_size)
    if items:
        resp.packed.CopyFrom(packed)
    return resp


def one_column(items: Sequence[tuple[int, int, int]], chunks: Iterable[pb.Chunk], squeeze: bool = False) -> bytes:
    """A reply of items of one column "x", each one slice (chunk key,
    offset, length), item i's key i."""
    return pack(
        [Item([Column("x", [s], squeeze)], key=i) for i, s in enumerate(items)], chunks
    ).SerializeToString()


#: Where each field of a record lies: (offset, struct format).
FIELDS = {
    "infos": {"columns": (44, "<I"), "rate_limited": (48, "B")},
    "columns": {"name": (0, "<I"), "slices": (4, "<I"), "squeeze": (8, "<I")},
    "slices": {"chunk": (0, "<I"), "offset": (4, "<I"), "length": (8, "<I")},
    "chunks": {
        "at": (8, "<Q"),
        "size": (16, "<Q"),
        "raw_size": (24, "<Q"),
        "steps": (32, "<I"),
        "format": (36, "<I"),
        "compression": (40, "B"),
        "delta": (41, "B"),
    },
}
SIZES = {"infos": INFO.size, "columns": COLUMN.size, "slices": SLICE.size, "chunks": CHUNK.size}


def patch(resp: pb.SampleResponse, records: str, i: int, field: str, value: int) -> pb.SampleResponse:
    """A copy of resp with one field of record i of packed.<records> set."""
    out = pb.SampleResponse()
    out.CopyFrom(resp)
    buf = bytearray(getattr(out.packed, records))
    at, fmt = FIELDS[records][field]
    struct.pack_into(fmt, buf, i * SIZES[records] + at, value)
    setattr(out.packed, records, bytes(buf))
    return out
