"""A packed sample reply encoder for tests: what the Go service writes
(AppendPackedSampleResponse, PackedSamples in broker/wire/reprise.proto),
built from plain descriptions of items and pb.Chunk messages. Replies are
in the compact layout; ``uniform=True`` writes the uniform form of items
that all have the same columns, each a whole chunk of its own; ``wide=True``
writes the wide layout of a service that predates SampleRequest.layout."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable, Sequence

from reprise._proto import reprise_pb2 as pb

#: The compact records. The last uint32 of INFO and of COLUMN is a count
#: with a flag in bit 31 (rate_limited, squeeze).
INFO = struct.Struct("<QdqdqiI")
COLUMN = struct.Struct("<II")
SLICE = struct.Struct("<III")
CHUNK = struct.Struct("<QIIIBB2x")
FLAG = 1 << 31

#: The wide records (infos, columns, chunks).
WIDE_INFO = struct.Struct("<QdqdqiIB7x")
WIDE_COLUMN = struct.Struct("<III")
WIDE_CHUNK = struct.Struct("<QQQQIIBB6x")


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
    wide: bool = False,
    uniform: bool = False,
) -> pb.SampleResponse:
    """A SampleResponse with items packed: chunks in the order the items
    first use them, names and formats each once, each chunk's bytes at a
    multiple of 8 in data, right after the one before (rounded up)."""
    by_key = {c.key: c for c in chunks}
    order: dict[int, int] = {}  # chunk key -> record index
    names: dict[str, int] = {}
    formats: dict[tuple[str, tuple[int, ...]], int] = {}
    infos, columns, slices = bytearray(), bytearray(), bytearray()
    for it in items:
        head = (it.key, it.probability, it.table_size, it.priority, it.inserted_at_unix_nano, it.times_sampled)
        if wide:
            infos += WIDE_INFO.pack(*head, len(it.columns), int(it.rate_limited))
        else:
            infos += INFO.pack(*head, len(it.columns) | (FLAG if it.rate_limited else 0))
        for col in it.columns:
            name = names.setdefault(col.name, len(names))
            if wide:
                columns += WIDE_COLUMN.pack(name, len(col.slices), int(col.squeeze))
            else:
                columns += COLUMN.pack(name, len(col.slices) | (FLAG if col.squeeze else 0))
            for key, off, ln in col.slices:
                slices += SLICE.pack(order.setdefault(key, len(order)), off, ln)
    records, data = bytearray(), bytearray()
    for key in order:
        c = by_key[key]
        fmt = formats.setdefault((c.dtype, tuple(c.step_shape)), len(formats))
        if wide:
            records += WIDE_CHUNK.pack(
                c.key, len(data), len(c.data), c.raw_size, c.length, fmt, c.compression, int(c.delta_encoded)
            )
        else:
            records += CHUNK.pack(c.key, len(c.data), c.length, fmt, c.compression, int(c.delta_encoded))
        data += c.data
        data += bytes(-len(data) % 8)
    packed = pb.PackedSamples(
        names=list(names),
        slices=bytes(slices),
        formats=[pb.StepFormat(dtype=d, step_shape=s) for d, s in formats],
        data=bytes(data),
    )
    if wide:
        packed.infos, packed.columns, packed.chunks = bytes(infos), bytes(columns), bytes(records)
    elif uniform:
        # The first item's column and chunk records, without the key, stand
        # for every item's: the caller's items must fit them. Each column's
        # chunk is in data once for each time it is taken.
        n = len(items[0].columns)
        assert all(len(it.columns) == n and all(len(c.slices) == 1 for c in it.columns) for it in items)
        data = bytearray()
        for it in items:
            for col in it.columns:
                data += by_key[col.slices[0][0]].data
                data += bytes(-len(data) % 8)
        packed.data = bytes(data)
        packed.compact_infos, packed.slices = bytes(infos), b""
        packed.uniform_columns = b"".join(
            columns[j * COLUMN.size : (j + 1) * COLUMN.size] + bytes(8) + records[j * CHUNK.size + 8 : (j + 1) * CHUNK.size]
            for j in range(n)
        )
    else:
        packed.compact_infos, packed.compact_columns = bytes(infos), bytes(columns)
        packed.compact_chunks = bytes(records)
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


#: Where each field of a compact record lies: (offset, struct format),
#: by the PackedSamples field that holds the records. A count with a flag
#: in bit 31 is patched whole: columns and slices take count | FLAG.
FIELDS = {
    "compact_infos": {"columns": (44, "<I")},
    "compact_columns": {"name": (0, "<I"), "slices": (4, "<I")},
    "slices": {"chunk": (0, "<I"), "offset": (4, "<I"), "length": (8, "<I")},
    "compact_chunks": {
        "size": (8, "<I"),
        "steps": (12, "<I"),
        "format": (16, "<I"),
        "compression": (20, "B"),
        "delta": (21, "B"),
    },
}
SIZES = {"compact_infos": INFO.size, "compact_columns": COLUMN.size, "slices": SLICE.size, "compact_chunks": CHUNK.size}


def get(resp: pb.SampleResponse, records: str, i: int, field: str) -> int:
    """One field of record i of packed.<records>."""
    at, fmt = FIELDS[records][field]
    return int(struct.unpack_from(fmt, getattr(resp.packed, records), i * SIZES[records] + at)[0])


def patch(resp: pb.SampleResponse, records: str, i: int, field: str, value: int) -> pb.SampleResponse:
    """A copy of resp with one field of record i of packed.<records> set."""
    out = pb.SampleResponse()
    out.CopyFrom(resp)
    buf = bytearray(getattr(out.packed, records))
    at, fmt = FIELDS[records][field]
    struct.pack_into(fmt, buf, i * SIZES[records] + at, value)
    setattr(out.packed, records, bytes(buf))
    return out
