"""Packed sample replies (PackedSamples, compact layout), without a server:
parse_response against the protobuf runtime, decode_samples and
decode_batch against what the items hold, replies of older services, and
replies that are damaged or hostile."""

from __future__ import annotations

import asyncio
import struct
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import reprise
from reprise import _codec, _sample
from reprise._proto import reprise_pb2 as pb

import packed
from packed import Column, Item, pack, patch


def parse(raw: bytes) -> _sample._Response:
    return _sample.parse_response(raw)


def batch(raw: bytes) -> _sample.SampleBatch:
    return _sample.decode_batch(parse(raw))


def samples(raw: bytes) -> list[_sample.ReplaySample]:
    return _sample.decode_samples(parse(raw))


# ----------------------------------------------------------------- parsing


def _random_response(rng: np.random.Generator) -> pb.SampleResponse:
    def text() -> str:
        return "".join(rng.choice(list("ab_ä€😀")) for _ in range(int(rng.integers(0, 6))))

    def blob() -> bytes:
        return rng.bytes(int(rng.integers(0, 40)))

    r = pb.SampleResponse()
    if rng.random() < 0.9:
        r.status.code = int(rng.integers(-(2**31), 2**31)) if rng.random() < 0.2 else int(rng.integers(0, 9))
        r.status.message = text()
    r.table_size = int(rng.integers(-(2**63), 2**63))
    r.weight_fraction = float(rng.standard_normal())
    r.weight_exponent = int(rng.integers(-(2**63), 2**63))
    if rng.random() < 0.8:
        p = r.packed
        p.compact_infos, p.compact_columns, p.slices, p.compact_chunks, p.data = blob(), blob(), blob(), blob(), blob()
        if rng.random() < 0.1:  # a field of the wide layout: an older service
            setattr(p, str(rng.choice(["infos", "columns", "chunks"])), blob() or b"w")
        p.names.extend(text() for _ in range(int(rng.integers(0, 3))))
        for _ in range(int(rng.integers(0, 3))):
            p.formats.add(dtype=text(), step_shape=[int(d) for d in rng.integers(-(2**63), 2**63, size=int(rng.integers(0, 4)))])
    return r


def _unknown_fields(rng: np.random.Generator) -> bytes:
    """Fields no message here has, of every wire type but groups."""
    out = b""
    for _ in range(int(rng.integers(0, 3))):
        kind = int(rng.integers(0, 4))
        num = int(rng.integers(20, 2**29))
        if kind == 0:
            out += _varint(num << 3) + _varint(int(rng.integers(0, 2**63)))
        elif kind == 1:
            out += _varint(num << 3 | 1) + rng.bytes(8)
        elif kind == 2:
            b = rng.bytes(int(rng.integers(0, 9)))
            out += _varint(num << 3 | 2) + _varint(len(b)) + b
        else:
            out += _varint(num << 3 | 5) + rng.bytes(4)
    return out


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _encode(rng: np.random.Generator) -> bytes:
    """A random SampleResponse with unknown fields, at the top and in
    packed, and now and then two of them joined (which protobuf merges)."""
    r = _random_response(rng)
    raw = _unknown_fields(rng)
    if r.HasField("packed"):
        p = r.packed.SerializeToString() + _unknown_fields(rng)
        r.ClearField("packed")
        raw += _varint(7 << 3 | 2) + _varint(len(p)) + p
    raw = r.SerializeToString() + raw
    if rng.random() < 0.2:
        raw += _random_response(rng).SerializeToString()
    return raw


def _assert_same(mine: _sample._Response, ref: pb.SampleResponse) -> None:
    assert (mine.code, mine.message) == (ref.status.code, ref.status.message)
    assert (mine.table_size, mine.weight_exponent) == (ref.table_size, ref.weight_exponent)
    assert struct.pack("<d", mine.weight_fraction) == struct.pack("<d", ref.weight_fraction)
    p, q = mine.packed, ref.packed
    for field in ("compact_infos", "compact_columns", "slices", "compact_chunks", "data"):
        assert bytes(getattr(p, field)) == getattr(q, field), field
    assert p.names == list(q.names)
    assert p.formats == [(f.dtype, tuple(f.step_shape)) for f in q.formats]


@pytest.mark.parametrize("seed", range(200))
def test_parse_response_reads_what_protobuf_reads(seed: int) -> None:
    """What the runtime reads, or (a field of the wide layout present) a
    refusal naming the older service."""
    rng = np.random.default_rng(seed)
    raw = _encode(rng)
    ref = pb.SampleResponse.FromString(raw)
    if ref.packed.infos or ref.packed.columns or ref.packed.chunks:
        with pytest.raises(reprise.ProtocolError, match="wide packed layout"):
            parse(raw)
        return
    _assert_same(parse(raw), ref)


@pytest.mark.parametrize("seed", range(100))
def test_damaged_replies_parse_as_protobuf_or_not_at_all(seed: int) -> None:
    """A damaged reply (truncated, bytes flipped, inserted or dropped) that
    parse_response accepts reads as the protobuf runtime reads it; one the
    runtime refuses is a ProtocolError. (parse_response refuses some that
    the runtime accepts: groups, and the fields of unpacked replies and of
    the wide layout.)"""
    rng = np.random.default_rng(seed)
    raw = bytearray(_encode(rng))
    for _ in range(20):
        b = bytearray(raw)
        if not b:
            break
        kind = int(rng.integers(0, 4))
        at = int(rng.integers(0, len(b)))
        if kind == 0:
            del b[at:]
        elif kind == 1:
            b[at] ^= 1 << int(rng.integers(0, 8))
        elif kind == 2:
            b[at:at] = rng.bytes(int(rng.integers(1, 4)))
        else:
            del b[at : at + int(rng.integers(1, 4))]
        data = bytes(b)
        try:
            ref = pb.SampleResponse.FromString(data)
        except Exception:
            ref = None
        try:
            mine = parse(data)
        except reprise.ProtocolError:
            continue
        assert ref is not None, data
        _assert_same(mine, ref)


def test_unpacked_replies_are_refused() -> None:
    """A service that predates the packed layout answers item by item,
    which this client no longer reads: it says so."""
    old = pb.SampleResponse(status=pb.Status(code=pb.CODE_OK), items=[pb.SampledItem()], chunks=[b"x"])
    with pytest.raises(reprise.ProtocolError, match="unpacked.*upgrade reprised"):
        parse(old.SerializeToString())


@pytest.mark.parametrize("fields", [("infos", "columns", "chunks"), ("infos",), ("columns",), ("chunks",)])
def test_wide_replies_are_refused(fields: tuple[str, ...]) -> None:
    """A service that predates SampleRequest.layout answers in the wide
    layout, which this client no longer reads: it says so, whichever wide
    field it finds, and whatever compact fields come with it."""
    resp, _ = rich(1)
    old = pack(
        [Item([Column("x", [(1, 0, 1)])], rate_limited=True)], [_codec.encode_chunk(1, np.ones((1, 2)))], wide=True
    )
    assert old.packed.infos and old.packed.columns and old.packed.chunks and not old.packed.compact_infos
    for f in ("infos", "columns", "chunks"):
        if f not in fields:
            old.packed.ClearField(f)  # type: ignore[arg-type]
    mixed = pb.SampleResponse()
    mixed.CopyFrom(resp)
    for f in fields:
        setattr(mixed.packed, f, getattr(old.packed, f))
    for reply in (old, mixed):
        with pytest.raises(
            reprise.ProtocolError,
            match=r"wide packed layout: the table service predates SampleRequest\.layout, .*upgrade reprised",
        ):
            parse(reply.SerializeToString())


def test_requests_ask_for_the_uniform_layout() -> None:
    """The request the client sends is packed in the uniform layout, and
    the compact reply it gets back decodes."""
    from reprise import aio

    sent: list[pb.SampleRequest] = []
    reply = pack([Item([Column("x", [(1, 0, 1)])], key=3)], [_codec.encode_chunk(1, np.ones((1, 2)))])

    class Requester:
        async def request(self, subject: str, data: bytes, wait: float, **watch: Any) -> bytes:
            sent.append(pb.SampleRequest.FromString(data))
            return reply.SerializeToString()

    async def main() -> bytes:
        c = aio.Client()
        c._req = Requester()  # type: ignore[assignment]
        return await c.sample_raw("t", 4, timeout=None)

    raw = asyncio.run(main())
    [req] = sent
    assert (req.table, req.num_samples, req.packed, req.layout) == ("t", 4, True, pb.PACKED_LAYOUT_UNIFORM)
    assert batch(raw).info.key.tolist() == [3]


def test_status_only_replies_have_no_items() -> None:
    raw = pb.SampleResponse(status=pb.Status(code=pb.CODE_NOT_FOUND, message="no table"), table_size=-3).SerializeToString()
    r = parse(raw)
    assert (r.code, r.message, r.table_size) == (pb.CODE_NOT_FOUND, "no table", -3)
    assert _sample.decode_samples(r) == []
    b = _sample.decode_batch(r)
    assert len(b) == 0 and b.data == {}
    for name, dt in _sample._INFO_FIELDS:
        assert getattr(b.info, name).dtype == dt
    assert len(_sample.empty_batch()) == 0


# ---------------------------------------------------------------- decoding

#: The columns of the rich reply, in order.
COLUMNS = ["obs", "act", "rew", "z", "flag", "empty"]


def rich(seed: int, n: int = 5) -> tuple[pb.SampleResponse, list[dict[str, np.ndarray]]]:
    """A reply of n items of six columns that takes every path of the
    decoders, and what each item's columns hold:

    obs    float32 [2, 3], 2 of the 3 steps of uncompressed chunks
    act    int64 [8], 2 steps of chunks of 4 (zstd or not, delta or not),
           across two chunks in item 1 (two slices)
    rew    float64 scalar, squeezed, chunks of one step
    z      complex128 [2], one step
    flag   bool [3], one step of chunks of 2, not squeezed
    empty  float32 [0], one step

    Items 0 and n-1 are the same item (sampled twice); items 2 and 3 take
    steps of the same obs and act chunks."""
    rng = np.random.default_rng(seed)
    chunks: list[pb.Chunk] = []
    key = iter(range(1000 * seed + 1, 1000 * seed + 1000))

    def chunk(a: np.ndarray, compression: str = "none", delta: bool = False) -> int:
        k = next(key)
        chunks.append(_codec.encode_chunk(k, a, compression=compression, delta=delta))
        return k

    def encoding() -> dict[str, Any]:
        return {"compression": str(rng.choice(["none", "zstd"])), "delta": bool(rng.random() < 0.5)}

    items: list[Item] = []
    want: list[dict[str, np.ndarray]] = []
    shared: tuple[int, np.ndarray, int, np.ndarray] | None = None
    for i in range(n - 1):
        if shared is not None and i == 3:
            ko, obs, ka, act = shared
        else:
            obs = rng.standard_normal((3, 2, 3)).astype(np.float32)
            act = np.cumsum(rng.integers(-5, 5, size=(4, 8)), axis=0).astype(np.int64)
            ko, ka = chunk(obs), chunk(act, **encoding())
            shared = (ko, obs, ka, act)
        oo = int(rng.integers(0, 2))
        if i == 1:
            act2 = np.cumsum(rng.integers(-5, 5, size=(4, 8)), axis=0).astype(np.int64)
            ka2 = chunk(act2, **encoding())
            act_slices = [(ka, 3, 1), (ka2, 0, 1)]
            act_want = np.concatenate([act[3:], act2[:1]])
        else:
            ao = int(rng.integers(0, 3))
            act_slices = [(ka, ao, 2)]
            act_want = act[ao : ao + 2]
        rew = rng.standard_normal((1,))
        z = (rng.standard_normal((1, 2)) + 1j * rng.standard_normal((1, 2))).astype(np.complex128)
        flag = rng.random((2, 3)) < 0.5
        fo = int(rng.integers(0, 2))
        cols = [
            Column("obs", [(ko, oo, 2)]),
            Column("act", act_slices),
            Column("rew", [(chunk(rew), 0, 1)], squeeze=True),
            Column("z", [(chunk(z), 0, 1)]),
            Column("flag", [(chunk(flag), fo, 1)]),
            Column("empty", [(chunk(np.zeros((1, 0), np.float32)), 0, 1)]),
        ]
        items.append(
            Item(
                cols,
                key=int(rng.integers(0, 2**64, dtype=np.uint64)),
                probability=float(rng.random()),
                table_size=int(rng.integers(0, 2**40)),
                priority=float(rng.random()),
                times_sampled=int(rng.integers(0, 2**31)),
                inserted_at_unix_nano=int(rng.integers(0, 2**62)),
                rate_limited=bool(rng.random() < 0.5),
            )
        )
        want.append(
            {
                "obs": obs[oo : oo + 2],
                "act": act_want,
                "rew": rew[0],
                "z": z,
                "flag": flag[fo : fo + 1],
                "empty": np.zeros((1, 0), np.float32),
            }
        )
    items.append(items[0])
    want.append(want[0])
    return pack(items, chunks), want


def _assert_identical(got: Any, want: np.ndarray) -> None:
    got = np.asarray(got)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("seed", range(20))
def test_items_decode_to_what_they_hold(seed: int) -> None:
    resp, want = rich(seed)
    raw = resp.SerializeToString()
    items = samples(raw)
    b = batch(raw)
    assert [s.info.key for s in items] == b.info.key.tolist()
    assert len(items) == len(b) == len(want)
    for s, w in zip(items, want):
        assert list(s.data) == COLUMNS
        for name in COLUMNS:
            _assert_identical(s.data[name], w[name])
    for name in COLUMNS:
        _assert_identical(b.data[name], np.stack([w[name] for w in want]))
    for name, dt in _sample._INFO_FIELDS:
        got = getattr(b.info, name)
        assert got.dtype == dt
        assert got.tolist() == [getattr(s.info, name) for s in items]


def transitions(seed: int, columns: int = 3, plain: bool = False) -> tuple[list[Item], list[pb.Chunk]]:
    """1 to 10 items whose columns are each a whole chunk of its own, alike
    for every item: an obs of one step, an act of two (delta-encoded unless
    ``plain``), a squeezed reward (the first ``columns`` of them); random
    infos."""
    rng = np.random.default_rng(seed)
    chunks: list[pb.Chunk] = []
    items: list[Item] = []
    for i in range(int(rng.integers(1, 11))):
        base = 100 * i + 1
        chunks += [
            _codec.encode_chunk(base, rng.standard_normal((1, 3)).astype(np.float32), compression="none"),
            _codec.encode_chunk(base + 1, rng.integers(-9, 9, (2, 4)), compression="none", delta=not plain),
            _codec.encode_chunk(base + 2, rng.standard_normal((1,)), compression="none"),
        ]
        cols = [Column("obs", [(base, 0, 1)]), Column("act", [(base + 1, 0, 2)]), Column("rew", [(base + 2, 0, 1)], squeeze=True)]
        cols = cols[:columns]
        items.append(Item(cols, key=int(rng.integers(0, 2**63)), priority=float(rng.random()), rate_limited=bool(rng.random() < 0.5)))
    return items, chunks


@pytest.mark.parametrize("columns", [1, 3])
@pytest.mark.parametrize("seed", range(10))
def test_uniform_replies_decode_as_compact_ones(seed: int, columns: int) -> None:
    """A reply in the uniform form is 44 bytes smaller for each column of
    each item and decodes to what the compact reply of the same items does."""
    items, chunks = transitions(seed, columns)
    compact = pack(items, chunks).SerializeToString()
    uniform = pack(items, chunks, uniform=True).SerializeToString()
    assert len(compact) - len(uniform) >= 44 * columns * len(items) - 32 * columns
    got, want = samples(uniform), samples(compact)
    assert [s.info for s in got] == [s.info for s in want]
    names = ["obs", "act", "rew"][:columns]
    for g, w in zip(got, want):
        assert list(g.data) == names
        for name in g.data:
            _assert_identical(g.data[name], np.asarray(w.data[name]))
    gb, wb = batch(uniform), batch(compact)
    for name in names:
        _assert_identical(gb.data[name], wb.data[name])
    # One parsed reply decodes both ways, in either order.
    r = parse(uniform)
    _assert_identical(_sample.decode_batch(r).data["obs"], wb.data["obs"])
    assert [s.info for s in _sample.decode_samples(r)] == [s.info for s in want]
    assert gb.info.rate_limited.tolist() == [it.rate_limited for it in items]


def test_uniform_replies_repeat_the_chunks_of_items_sampled_twice() -> None:
    """An item sampled twice has its chunks in a uniform reply's data twice;
    each copy decodes to its own arrays."""
    items, chunks = transitions(5)
    items = items[:3] + [items[0]]
    got = samples(pack(items, chunks, uniform=True).SerializeToString())
    want = samples(pack(items, chunks).SerializeToString())
    for g, w in zip(got, want):
        for name in g.data:
            _assert_identical(g.data[name], np.asarray(w.data[name]))
    got[0].data["obs"][...] = 0
    assert not np.array_equal(got[3].data["obs"], got[0].data["obs"])


def _the_long_way(p: _sample._Packed) -> None:
    return None


@pytest.mark.parametrize("seed", range(10))
def test_plain_uniform_batches_skip_the_record_arrays(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """decode_batch and decode_samples read a uniform reply of plain columns
    without _layout, to what _layout's way gives; a column stored compressed
    or delta-encoded sends it _layout's way."""
    items, chunks = transitions(seed, plain=True)
    uniform = pack(items, chunks, uniform=True).SerializeToString()
    compact = pack(items, chunks).SerializeToString()
    want, want_items = batch(compact), samples(compact)
    with monkeypatch.context() as m:
        m.setattr(_sample, "_layout", None)  # the short way calls nothing of it
        got, got_items = batch(uniform), samples(uniform)
    _assert_same_batch(got, want)
    _assert_same_samples(got_items, want_items)
    _assert_items_own_their_arrays(got_items)
    delta = pack(*transitions(seed), uniform=True)
    assert _sample._uniform_batch(parse(delta.SerializeToString()).packed) is None
    chunks = [_codec.encode_chunk(k, np.zeros((1, 256), np.float32), compression="zstd") for k in (1, 2)]
    assert all(c.compression == pb.COMPRESSION_ZSTD for c in chunks)
    items = [Item([Column("x", [(k, 0, 1)])], key=k) for k in (1, 2)]
    assert _sample._uniform_batch(parse(pack(items, chunks, uniform=True).SerializeToString()).packed) is None


def _assert_same_batch(got: _sample.SampleBatch, want: _sample.SampleBatch) -> None:
    assert list(got.data) == list(want.data)
    for name in want.data:
        _assert_identical(got.data[name], want.data[name])
    for name, _ in _sample._INFO_FIELDS:
        _assert_identical(getattr(got.info, name), getattr(want.info, name))


def _assert_same_samples(got: list[_sample.ReplaySample], want: list[_sample.ReplaySample]) -> None:
    assert [s.info for s in got] == [s.info for s in want]
    for g, w in zip(got, want):
        assert list(g.data) == list(w.data)
        for name in w.data:
            _assert_identical(g.data[name], w.data[name])


def _assert_items_own_their_arrays(items: list[_sample.ReplaySample]) -> None:
    """Writing the first item's arrays changes no other item's. (A squeezed
    scalar column is a numpy scalar, which nobody writes.)"""
    for name in (n for n, a in items[0].data.items() if isinstance(a, np.ndarray)):
        before = [s.data[name].copy() for s in items]
        items[0].data[name][...] = 7
        for s, b in zip(items[1:], before[1:]):
            _assert_identical(s.data[name], b)


def _both_ways(raw: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """decode_batch and decode_samples give raw's items, or refuse them, as
    _layout's way does."""
    for decode, same in ((batch, _assert_same_batch), (samples, _assert_same_samples)):
        outcomes: list[Any] = []
        for short in (True, False):
            with monkeypatch.context() as m:
                if not short:
                    m.setattr(_sample, "_uniform_batch", _the_long_way)
                try:
                    outcomes.append(decode(raw))
                except _ALLOWED + (reprise.InvalidArgumentError,) as e:
                    outcomes.append(type(e))
        got, want = outcomes
        if isinstance(want, type):
            assert got is want
        else:
            assert not isinstance(got, type)
            same(got, want)


def _set_uniform(j: int, offset: int, fmt: str, value: int) -> Callable[[pb.PackedSamples], None]:
    """A change that sets a field of uniform record j."""

    def change(p: pb.PackedSamples) -> None:
        u = bytearray(p.uniform_columns)
        struct.pack_into(fmt, u, 32 * j + offset, value)
        p.uniform_columns = bytes(u)

    return change


def _set_item_columns(i: int, count: int) -> Callable[[pb.PackedSamples], None]:
    def change(p: pb.PackedSamples) -> None:
        infos = bytearray(p.compact_infos)
        struct.pack_into("<I", infos, 48 * i + 44, count)
        p.compact_infos = bytes(infos)

    return change


@pytest.mark.parametrize(
    "change",
    [
        _set_uniform(1, 4, "<I", 1 | packed.FLAG),  # act squeezed, of 2 steps
        _set_uniform(0, 0, "<I", 7),  # a name beyond the names
        _set_uniform(2, 0, "<I", 0),  # rew named obs too
        _set_uniform(0, 20, "<I", 9),  # a format beyond the formats
        _set_uniform(0, 28, "<B", 9),  # an unknown compression
        _set_uniform(0, 29, "<B", 2),  # delta neither 0 nor 1
        _set_uniform(0, 29, "<B", 1),  # delta on a float32 step
        _set_uniform(1, 29, "<B", 1),  # delta on act: not plain
        _set_uniform(0, 16, "<I", 2),  # a size its steps do not make
        _set_uniform(0, 16, "<I", 24),  # and steps to fit it
        _set_uniform(0, 8, "<Q", 12345),  # a key, which the service leaves 0 and no reader needs
        _set_item_columns(0, 4),  # items of 4 and 2 columns: the same records split otherwise
        _set_item_columns(0, 2),
        lambda p: p.formats.add(dtype="float33"),  # an unused format that is wrong
        lambda p: setattr(p, "data", p.data[:-1]),
        lambda p: setattr(p, "data", p.data[: len(p.data) - 8]),
        lambda p: setattr(p, "compact_infos", p.compact_infos[:-1]),
    ],
)
def test_odd_plain_uniform_replies_decode_either_way_alike(
    change: Callable[[pb.PackedSamples], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uniform replies changed where the short way of decode_batch checks
    them: each decodes to what _layout's way gives, or is refused as it is."""
    for seed in range(3):
        resp = pack(*transitions(seed, plain=True), uniform=True)
        change(resp.packed)
        _both_ways(resp.SerializeToString(), monkeypatch)


@pytest.mark.parametrize("records", ["compact_infos", "uniform_columns", "data", None])
@pytest.mark.parametrize("seed", range(4))
def test_damaged_plain_uniform_replies_decode_either_way_alike(
    records: str | None, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Damaged uniform replies of plain columns (cut short, bits flipped in
    their records or anywhere): the short way of decode_batch accepts what
    _layout's way accepts, to the same batch, and nothing else."""
    for raw in _damaged(pack(*transitions(seed, plain=True), uniform=True), records, np.random.default_rng(seed)):
        _both_ways(raw, monkeypatch)


def _uniform_damage(change: Callable[[pb.PackedSamples], None]) -> bytes:
    items, chunks = transitions(3)
    resp = pack(items[:2], chunks, uniform=True)
    change(resp.packed)
    return resp.SerializeToString()


def _set_uniform_slices(p: pb.PackedSamples) -> None:
    u = bytearray(p.uniform_columns)
    struct.pack_into("<I", u, 4, 2)
    p.uniform_columns = bytes(u)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda p: setattr(p, "compact_columns", packed.COLUMN.pack(0, 1)), "uniform_columns beside"),
        (lambda p: setattr(p, "slices", packed.SLICE.pack(0, 0, 1)), "uniform_columns beside"),
        (lambda p: setattr(p, "uniform_columns", p.uniform_columns[:31]), "uniform_columns has 31 bytes"),
        (_set_uniform_slices, "uniform column 0 has 2 slices, not 1"),
        (lambda p: setattr(p, "compact_infos", p.compact_infos * 20), "40 items of 3 uniform columns"),
        (lambda p: setattr(p, "data", p.data[:40]), r"chunk 1 \(key 0\): bytes \[16, 16\+64\) lie beyond the 40 bytes"),
        (
            lambda p: setattr(p, "compact_infos", p.compact_infos[:44] + struct.pack("<I", 4) + p.compact_infos[48:]),
            "the items have 7 columns, the reply 6 column records",
        ),
    ],
)
def test_uniform_replies_are_checked(change: Callable[[pb.PackedSamples], None], match: str) -> None:
    with pytest.raises(reprise.ProtocolError, match=match):
        samples(_uniform_damage(change))


@pytest.mark.parametrize("dtype", list(_codec.DTYPES))
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_every_dtype_gathers(dtype: str, compression: str) -> None:
    """Each dtype, each step one slice of its own chunk, after a 1-byte
    chunk so that no chunk starts at a multiple of 16; items of two steps
    and (with one step) squeezed."""
    dt = _codec.DTYPES[dtype]
    rng = np.random.default_rng(1)
    for steps in (1, 2):
        chunks = [_codec.encode_chunk(1, np.zeros((1,), np.uint8), compression="none")]
        arrays = []
        items = [Item([Column("pad", [(1, 0, 1)], squeeze=True)])]
        for k in range(2, 8):
            a = rng.integers(0, 256, size=(steps + 1) * 5 * dt.itemsize, dtype=np.uint8).view(dt).reshape(steps + 1, 5)
            chunks.append(_codec.encode_chunk(k, np.zeros_like(a) if compression == "zstd" else a, compression=compression))
            arrays.append(np.zeros_like(a) if compression == "zstd" else a)
            items.append(Item([Column("pad", [(1, 0, 1)], squeeze=True), Column("x", [(k, 1, steps)], squeeze=steps == 1)]))
        resp = pack(items[1:], chunks)
        if compression == "none" and dt.itemsize == 16:
            at = _sample._layout(parse(resp.SerializeToString()).packed).ch_at[1:]
            assert (at % 16 == 8).all()
        raw = resp.SerializeToString()
        b = batch(raw)
        want = np.stack([a[1] if steps == 1 else a[1 : 1 + steps] for a in arrays])
        _assert_identical(b.data["x"], want)
        for s, w in zip(samples(raw), want):
            _assert_identical(s.data["x"], w)


def test_flags_ride_in_bit_31() -> None:
    """rate_limited and squeeze are bit 31 of the item's column count and
    of the column's slice count: they decode to bools, and the counts to the
    other 31 bits."""
    c = _codec.encode_chunk(1, np.arange(6, dtype=np.float32).reshape(3, 2), compression="none")
    limited = [True, False, True]
    items = [
        Item([Column("a", [(1, i, 1)], squeeze=True), Column("b", [(1, 0, 1), (1, 1, 1)])], key=i, rate_limited=lim)
        for i, lim in enumerate(limited)
    ]
    resp = pack(items, [c])
    f = packed.FLAG
    assert [packed.get(resp, "compact_infos", i, "columns") for i in range(3)] == [2 | f, 2, 2 | f]
    assert [packed.get(resp, "compact_columns", k, "slices") for k in range(6)] == [1 | f, 2] * 3
    raw = resp.SerializeToString()
    b = batch(raw)
    assert b.info.rate_limited.dtype == np.bool_ and b.info.rate_limited.tolist() == limited
    assert b.info.key.tolist() == [0, 1, 2]
    steps = np.arange(6, dtype=np.float32).reshape(3, 2)
    _assert_identical(b.data["a"], steps)
    _assert_identical(b.data["b"], np.stack([steps[:2]] * 3))
    got = samples(raw)
    assert [s.info.rate_limited for s in got] == limited
    assert all(type(s.info.rate_limited) is bool for s in got)
    for s, want in zip(got, steps):
        _assert_identical(s.data["a"], want)
        _assert_identical(s.data["b"], steps[:2])
    # Squeezed in one item only: each item decodes with its own flag.
    raw = pack([Item([Column("a", [(1, 0, 1)], squeeze=sq)], rate_limited=not sq) for sq in (False, True)], [c])
    got = samples(raw.SerializeToString())
    assert [s.data["a"].shape for s in got] == [(1, 2), (2,)]
    assert [s.info.rate_limited for s in got] == [True, False]


def test_chunks_start_where_the_one_before_ends_rounded_up_to_8() -> None:
    """The compact chunk records say no chunk's place in data: chunk i
    starts where chunk i-1 ends, rounded up to a multiple of 8. Chunks of
    odd sizes, uncompressed (n steps of one byte) and zstd, each lie where
    the encoder put them and decode to their steps."""
    rng = np.random.default_rng(5)
    chunks: list[pb.Chunk] = []
    items: list[Item] = []
    want: list[dict[str, np.ndarray]] = []
    for i, n in enumerate([1, 3, 8, 9, 17, 5, 16, 7, 2]):
        bytes_ = rng.integers(0, 256, size=(n, 1), dtype=np.uint8)
        ints = np.repeat(rng.integers(0, 9, size=(1, 64)), n + 1, axis=0)  # repeated: zstd shrinks it
        chunks.append(_codec.encode_chunk(2 * i + 1, bytes_, compression="none"))
        chunks.append(_codec.encode_chunk(2 * i + 2, ints, compression="zstd", delta=False))
        cols = [
            Column("first", [(2 * i + 1, 0, 1)]),
            Column("last", [(2 * i + 1, n - 1, 1)], squeeze=True),
            Column("z", [(2 * i + 2, n, 1)]),
        ]
        items.append(Item(cols, key=i))
        want.append({"first": bytes_[:1], "last": bytes_[n - 1], "z": ints[n : n + 1]})
    zstd = [len(c.data) for c in chunks if c.compression == pb.COMPRESSION_ZSTD]
    assert len(zstd) == 9 and any(size % 8 for size in zstd)
    at, end = [], 0
    for c in chunks:  # the order of first use
        at.append(end)
        end = (end + len(c.data) + 7) // 8 * 8
    resp = pack(items, chunks)
    raw = resp.SerializeToString()
    lay = _sample._layout(parse(raw).packed)
    assert lay.ch_at.tolist() == at
    assert lay.ch_raw.tolist() == [c.raw_size for c in chunks]
    for a, c in zip(at, chunks):
        assert resp.packed.data[a : a + len(c.data)] == c.data
    got = samples(raw)
    b = batch(raw)
    for name in ("first", "last", "z"):
        for s, w in zip(got, want):
            _assert_identical(s.data[name], w[name])
        _assert_identical(b.data[name], np.stack([w[name] for w in want]))


def test_returned_arrays_are_the_callers() -> None:
    """Every array decode_samples and decode_batch return is writable and
    shares no memory with the reply or with another array; writing into
    one changes no other and no later decode (a batch of one item too,
    whose info fields numpy would call contiguous views)."""
    for n in (5, 2):
        resp, _ = rich(3, n)
        raw = resp.SerializeToString()
        reply = np.frombuffer(raw, np.uint8)
        b = batch(raw)
        items = samples(raw)
        arrays = list(b.data.values()) + [getattr(b.info, f) for f, _ in _sample._INFO_FIELDS]
        arrays += [np.asarray(a) for s in items for a in s.data.values() if isinstance(a, np.ndarray)]
        for i, a in enumerate(arrays):
            assert a.flags.writeable
            assert not np.shares_memory(a, reply)
            for other in arrays[i + 1 :]:
                assert not np.shares_memory(a, other)
        before = batch(raw)
        for a in arrays:
            if a.size:
                a.reshape(-1).view(np.uint8)[:] ^= 0xFF
        again = batch(raw)
        for name in COLUMNS:
            _assert_identical(again.data[name], before.data[name])
    one, _ = rich(4, 2)
    raw = pack([Item([Column("x", [(1, 0, 1)])], key=7)], [_codec.encode_chunk(1, np.ones((1, 2)))]).SerializeToString()
    info = batch(raw).info
    for f, _ in _sample._INFO_FIELDS:
        a = getattr(info, f)
        assert a.flags.writeable and not np.shares_memory(a, np.frombuffer(raw, np.uint8))
    info.key[0] = 9
    assert batch(raw).info.key.tolist() == [7]


def _two_items(second: Column) -> bytes:
    chunks = [
        _codec.encode_chunk(1, np.arange(6, dtype=np.float32).reshape(3, 2), compression="none"),
        _codec.encode_chunk(2, np.arange(6, dtype=np.float64).reshape(3, 2), compression="none"),
        _codec.encode_chunk(3, np.arange(6, dtype=np.float32).reshape(2, 3), compression="none"),
    ]
    return pack([Item([Column("x", [(1, 0, 2)])]), Item([second])], chunks).SerializeToString()


def _unstackable(lay: _sample._Layout) -> _sample.SampleBatch:
    raise reprise.InvalidArgumentError("taken for items that do not stack")


@pytest.mark.parametrize("seed", range(20))
def test_items_that_stack_are_samples_of_a_batch(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """decode_samples decodes items that stack as a batch, to the samples
    it decodes one by one, and each item's arrays are its own."""
    raw = rich(seed)[0].SerializeToString()
    got = samples(raw)
    with monkeypatch.context() as m:
        m.setattr(_sample, "_batch", _unstackable)
        want = samples(raw)
    _assert_same_samples(got, want)
    _assert_items_own_their_arrays(got)


@pytest.mark.parametrize(
    "second,match",
    [
        (Column("y", [(1, 0, 2)]), "different columns"),
        (Column("x", [(1, 0, 1)]), "different step counts"),
        (Column("x", [(2, 0, 2)]), "different dtypes or shapes"),
        (Column("x", [(3, 0, 2)]), "different dtypes or shapes"),
        (Column("x", [(1, 0, 1), (1, 2, 1)]), None),  # two slices of the same steps: batchable
    ],
)
def test_items_that_do_not_stack_are_samples(second: Column, match: str | None) -> None:
    raw = _two_items(second)
    assert len(samples(raw)) == 2
    if match is None:
        assert batch(raw).data["x"].shape == (2, 2, 2)
        return
    with pytest.raises(reprise.InvalidArgumentError, match=f"{match}.*sample\\(\\)"):
        batch(raw)


def test_items_squeezed_differently_do_not_stack() -> None:
    c = _codec.encode_chunk(1, np.ones((1, 2), np.float32))
    raw = pack([Item([Column("x", [(1, 0, 1)], squeeze=s)]) for s in (True, False)], [c]).SerializeToString()
    assert [s.data["x"].shape for s in samples(raw)] == [(2,), (1, 2)]
    with pytest.raises(reprise.InvalidArgumentError, match="squeezed in some items only; use sample()"):
        batch(raw)
    raw = pack([Item([Column("x", [(1, 0, 1)])]), Item([])], [c]).SerializeToString()
    with pytest.raises(reprise.InvalidArgumentError, match="different columns; use sample()"):
        batch(raw)


# ----------------------------------------------------------- hostile replies


def _decoders() -> list[Callable[[bytes], Any]]:
    return [samples, batch]


RICH, _ = rich(0)


def _both_refuse(resp: pb.SampleResponse, match: str, kind: type[Exception] = reprise.ProtocolError) -> None:
    raw = resp.SerializeToString()
    for decode in _decoders():
        with pytest.raises(kind, match=match):
            decode(raw)


#: The flag bit of a count (rate_limited, squeeze).
F = packed.FLAG


@pytest.mark.parametrize(
    "records,i,field,value,match",
    [
        ("compact_infos", 1, "columns", 99, r"the items have \d+ columns, the reply 30 column records"),
        # The rate_limited bit is no part of the count.
        ("compact_infos", 1, "columns", 99 | F, r"the items have \d+ columns, the reply 30 column records"),
        ("compact_infos", 1, "columns", F, r"the items have 24 columns, the reply 30 column records"),
        ("compact_columns", 7, "name", 99, r"item 1 column 1: name 99 of 6"),
        ("compact_columns", 0, "slices", 0, r"item 0 column 0 'obs' has no slices"),
        ("compact_columns", 0, "slices", F, r"item 0 column 0 'obs' has no slices"),
        ("compact_columns", 6, "slices", 2, r"the columns have 32 slices, the reply 31 slice records"),
        ("compact_columns", 6, "slices", 1 | F, r"item 1 column 0 'obs' is squeezed but selects 2 steps"),
        ("compact_columns", 2, "slices", 2 | F, r"the columns have 32 slices, the reply 31 slice records"),
        ("slices", 0, "chunk", 999, r"slice 0 \(item 0 column 0 'obs'\): chunk 999 of \d+"),
        ("slices", 1, "length", 0, r"slice 1 \(item 0 column 1 'act'\): length 0 is not positive"),
        ("slices", 0, "offset", 2, r"slice 0 .*: wants steps \[2, 2\+2\) of chunk 0 \(key 1\), which has 3"),
        ("slices", 0, "offset", 2**32 - 1, r"wants steps \[4294967295, 4294967295\+2\)"),
        ("compact_chunks", 0, "format", 99, r"chunk 0 \(key 1\): format 99 of \d+"),
        ("compact_chunks", 0, "compression", 7, r"chunk 0 \(key 1\): unknown compression 7"),
        ("compact_chunks", 0, "delta", 2, r"chunk 0 \(key 1\): delta is 2"),
        ("compact_chunks", 0, "steps", 0, r"chunk 0 \(key 1\): length 0 is not positive"),
        # Chunk 1 (zstd, 103 bytes) starts after chunk 0's 72.
        ("compact_chunks", 1, "size", 2**32 - 1, r"chunk 1 \(key 2\): bytes \[72, 72\+4294967295\) lie beyond the 1280 bytes"),
        ("compact_chunks", 0, "size", 2**32 - 1, r"chunk 0 \(key 1\): bytes \[0, 0\+4294967295\) lie beyond"),
        # A chunk 8 bytes longer moves every later one: the last of any
        # bytes (6, at 1272) then ends past the data.
        ("compact_chunks", 0, "size", 80, r"chunk 21 \(key 22\): bytes \[1280, 1280\+6\) lie beyond the 1280 bytes"),
        # Rounded up to 8 as 103 is: no chunk moves, but the zstd frame of
        # chunk 1 (key 2, as _codec names it) is cut short.
        ("compact_chunks", 1, "size", 100, r"chunk 2: zstd"),
        ("compact_chunks", 0, "steps", 2**32 - 1, r"chunk 0 .*: 4294967295 steps of float32\[2, 3\] make \d+ bytes, beyond"),
        ("compact_chunks", 0, "steps", 4, r"chunk 0 .*: uncompressed data has 72 bytes, 4 steps of float32\[2, 3\] need 96"),
        ("compact_chunks", 0, "size", 64, r"chunk 0 .*: uncompressed data has 64 bytes, 3 steps of float32\[2, 3\] need 72"),
        ("compact_chunks", 0, "delta", 1, r"chunk 0 \(key 1\): delta_encoded is set on non-integer dtype float32"),
    ],
)
def test_out_of_range_fields_are_named(records: str, i: int, field: str, value: int, match: str) -> None:
    _both_refuse(patch(RICH, records, i, field, value), match)


@pytest.mark.parametrize(
    "records,fewer",
    [
        ("compact_infos", r"the items have 24 columns, the reply 30 column records"),
        ("compact_columns", r"the items have 30 columns, the reply 29 column records"),
        ("slices", r"the columns have 31 slices, the reply 30 slice records"),
        ("compact_chunks", r"slice 24 \(item 3 column 5 'empty'\): chunk 22 of 22"),
    ],
)
def test_records_are_whole_and_counted(records: str, fewer: str) -> None:
    resp = pb.SampleResponse()
    resp.CopyFrom(RICH)
    setattr(resp.packed, records, getattr(RICH.packed, records)[:-1])
    _both_refuse(resp, rf"packed {records} has \d+ bytes, not a whole number of {packed.SIZES[records]}-byte records")
    setattr(resp.packed, records, getattr(RICH.packed, records)[: -packed.SIZES[records]])
    _both_refuse(resp, fewer)


@pytest.mark.parametrize(
    "dtype,shape,match",
    [
        ("float33", [2, 3], r"format 0: unknown dtype 'float33'"),
        ("float32", [2, -3], r"format 0: step_shape \[2, -3\]: dimension 1 is -3"),
        ("uint8", [1 << 40, 1 << 40], r"format 0: step_shape .*elements"),
        ("float64", [2, 3], r"chunk 0 .*: uncompressed data has 72 bytes, 3 steps of float64\[2, 3\] need 144"),
    ],
)
def test_bad_formats_are_named(dtype: str, shape: list[int], match: str) -> None:
    resp = pb.SampleResponse()
    resp.CopyFrom(RICH)
    resp.packed.formats[0].dtype = dtype
    resp.packed.formats[0].step_shape[:] = shape
    _both_refuse(resp, match)


def test_names_are_indexed_in_range() -> None:
    resp = pb.SampleResponse()
    resp.CopyFrom(RICH)
    del resp.packed.names[3:]
    _both_refuse(resp, r"item 0 column 3: name 3 of 3")


def test_a_columns_chunks_share_a_format() -> None:
    chunks = [
        _codec.encode_chunk(1, np.ones((2, 2), np.float32), compression="none"),
        _codec.encode_chunk(2, np.ones((2, 2), np.float64), compression="none"),
    ]
    raw = pack([Item([Column("x", [(1, 0, 1), (2, 0, 1)])])], chunks)
    _both_refuse(raw, r"slice 1 \(item 0 column 0 'x'\): the column's chunks disagree on dtype or step shape")


def test_a_column_is_named_once_an_item() -> None:
    c = _codec.encode_chunk(1, np.ones((1, 2), np.float32))
    _both_refuse(pack([Item([Column("x", [(1, 0, 1)]), Column("x", [(1, 0, 1)])])], [c]), "item 0 has column 'x' twice")


def test_compressed_chunks_are_checked() -> None:
    c = _codec.encode_chunk(1, np.zeros((4, 64), np.int64))
    assert c.compression == pb.COMPRESSION_ZSTD and c.delta_encoded
    resp = pack([Item([Column("x", [(1, 0, 4)])])], [c])
    assert batch(resp.SerializeToString()).data["x"].shape == (1, 4, 64)
    garbled = pb.SampleResponse()
    garbled.CopyFrom(resp)
    garbled.packed.data = b"\xff" * 8 + resp.packed.data[8:]
    _both_refuse(garbled, r"chunk 1: zstd data")
    # A frame that declares more than the raw size (steps times step bytes)
    # is refused before allocating.
    frame = b"\x28\xb5\x2f\xfd\xe0" + struct.pack("<Q", 1 << 40) + bytes(8)
    huge = pb.SampleResponse()
    huge.CopyFrom(resp)
    huge.packed.data = frame + bytes(-len(frame) % 8)
    huge = patch(huge, "compact_chunks", 0, "size", len(frame))
    _both_refuse(huge, r"chunk 1: the zstd frame declares 1099511627776 bytes, raw_size is 2048")
    _both_refuse(patch(resp, "compact_chunks", 0, "compression", pb.COMPRESSION_S2), "s2.*WithCompression", reprise.UnsupportedCodecError)


#: What a decoder may raise for a damaged reply: a ProtocolError, an
#: UnsupportedCodecError where a chunk's compression became s2, and (a
#: batch only) InvalidArgumentError where its items no longer stack.
_ALLOWED = (reprise.ProtocolError, reprise.UnsupportedCodecError)


def _decodes_or_refuses(raw: bytes) -> None:
    """Each decoder decodes raw or raises one of _ALLOWED."""
    for decode in _decoders():
        try:
            decode(raw)
        except _ALLOWED:
            pass
        except reprise.InvalidArgumentError:
            assert decode is batch


@pytest.mark.parametrize("records", ["compact_infos", "compact_columns", "slices", "compact_chunks", "data"])
@pytest.mark.parametrize("seed", range(4))
def test_damaged_records_are_protocol_errors(records: str, seed: int) -> None:
    """Records cut short or with bits flipped, in a reply over every path
    (rich): each decoder decodes the reply or raises one of _ALLOWED."""
    rng = np.random.default_rng(seed)
    resp, _ = rich(seed)
    for _ in range(150):
        buf = bytearray(getattr(resp.packed, records))
        if rng.random() < 0.2:
            del buf[int(rng.integers(0, len(buf) + 1)) :]
        else:
            for _ in range(int(rng.integers(1, 4))):
                at = int(rng.integers(0, len(buf)))
                buf[at] ^= 1 << int(rng.integers(0, 8))
        bad = pb.SampleResponse()
        bad.CopyFrom(resp)
        setattr(bad.packed, records, bytes(buf))
        raw = bad.SerializeToString()
        _decodes_or_refuses(raw)


@pytest.mark.parametrize("records", ["compact_infos", "uniform_columns", "data", None])
@pytest.mark.parametrize("seed", range(4))
def test_damaged_uniform_replies_are_protocol_errors(records: str | None, seed: int) -> None:
    """The same for a reply in the uniform form: its records cut short or
    with bits flipped, or (None) bits flipped anywhere in the reply."""
    for raw in _damaged(pack(*transitions(seed), uniform=True), records, np.random.default_rng(seed)):
        _decodes_or_refuses(raw)


def _damaged(resp: pb.SampleResponse, records: str | None, rng: np.random.Generator) -> Iterator[bytes]:
    """150 damaged copies of resp: the PackedSamples field records cut
    short or with bits flipped, or (None) bits flipped anywhere in the
    encoded reply."""
    for _ in range(150):
        buf = bytearray(resp.SerializeToString() if records is None else getattr(resp.packed, records))
        if records is not None and rng.random() < 0.2:
            del buf[int(rng.integers(0, len(buf) + 1)) :]
        else:
            for _ in range(int(rng.integers(1, 4))):
                buf[int(rng.integers(0, len(buf)))] ^= 1 << int(rng.integers(0, 8))
        if records is None:
            yield bytes(buf)
            continue
        bad = pb.SampleResponse()
        bad.CopyFrom(resp)
        setattr(bad.packed, records, bytes(buf))
        yield bad.SerializeToString()


@pytest.mark.parametrize("seed", range(4))
def test_damaged_replies_are_protocol_errors(seed: int) -> None:
    """The same for damage anywhere in the encoded reply, names and
    formats included."""
    rng = np.random.default_rng(seed)
    resp, _ = rich(seed)
    good = resp.SerializeToString()
    for _ in range(300):
        b = bytearray(good)
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(0, len(b)))
            b[at] ^= 1 << int(rng.integers(0, 8))
        _decodes_or_refuses(bytes(b))


def test_a_reply_that_decodes_to_too_much_is_refused_unread() -> None:
    """A reply of one chunk sliced 400,000 times (a few megabytes) decodes to
    more than any reply may: it is refused before anything is allocated for
    its items, as by Go's client; it asked numpy for terabytes."""
    chunk = pb.Chunk(key=1, dtype="uint8", step_shape=[], length=1 << 20, raw_size=1 << 20, data=bytes(1 << 20))
    bomb = pack([Item([Column("x", [(1, 0, 1 << 20)] * 400_000)])], [chunk]).SerializeToString()
    for decode in (_sample.decode_batch, _sample.decode_samples):
        with pytest.raises(reprise.ProtocolError, match="decode to"):
            decode(_sample.parse_response(bomb))


def test_a_batch_holds_one_decoded_chunk_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Items of a few steps out of long compressed chunks: decoding the
    batch never keeps a decoded chunk past copying it into its column, so
    a learner's memory holds the batch, one column's chunks as they are
    joined and one decoded chunk, not every chunk of the reply decoded."""
    steps, names = 50, ("obs", "action")
    chunks: list[pb.Chunk] = []
    want: dict[str, list[np.ndarray]] = {name: [] for name in names}
    items = []
    for i in range(6):
        cols = []
        for j, name in enumerate(names):
            key = 100 * j + i + 1
            a = np.arange(steps * 4, dtype=np.float32).reshape(steps, 4) + 1000 * key
            c = _codec.encode_chunk(key, a, compression="zstd")
            assert c.compression == pb.COMPRESSION_ZSTD
            chunks.append(c)
            off = (7 * i) % (steps - 2)
            cols.append(Column(name, [(key, off, 2)]))
            want[name].append(a[off : off + 2])
        items.append(Item(cols, key=i + 1))
    decoded, held = _watch_decodes(monkeypatch)
    got = batch(pack(items, chunks).SerializeToString())
    assert len(decoded) == len(chunks)
    assert max(held) == 0
    for name in names:
        np.testing.assert_array_equal(got.data[name], np.stack(want[name]))


def test_a_chunk_two_columns_share_is_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """obs and next_obs out of one compressed trajectory column: each chunk
    is decoded once for the batch, and none is left held once it is
    built."""
    steps = 50
    chunks: list[pb.Chunk] = []
    obs, nxt, items = [], [], []
    for i in range(6):
        a = np.arange(steps * 4, dtype=np.float32).reshape(steps, 4) + 1000 * i
        c = _codec.encode_chunk(i + 1, a, compression="zstd")
        assert c.compression == pb.COMPRESSION_ZSTD
        chunks.append(c)
        off = (7 * i) % (steps - 3)
        items.append(Item([Column("obs", [(i + 1, off, 2)]), Column("next_obs", [(i + 1, off + 1, 2)])], key=i + 1))
        obs.append(a[off : off + 2])
        nxt.append(a[off + 1 : off + 3])
    decoded, _ = _watch_decodes(monkeypatch)
    got = batch(pack(items, chunks).SerializeToString())
    assert len(decoded) == len(chunks)
    assert not any(r() is not None for r in decoded)
    np.testing.assert_array_equal(got.data["obs"], np.stack(obs))
    np.testing.assert_array_equal(got.data["next_obs"], np.stack(nxt))


def _watch_decodes(monkeypatch: pytest.MonkeyPatch) -> tuple[list[weakref.ref[np.ndarray]], list[int]]:
    """Weak references to every chunk the decoder decodes from now on, and
    how many of those decoded before were still held at each decode."""
    decode = _codec.decode_chunk_fields
    decoded: list[weakref.ref[np.ndarray]] = []
    held: list[int] = []

    def watching(*args: Any, **kwargs: Any) -> np.ndarray:
        held.append(sum(r() is not None for r in decoded))
        a = decode(*args, **kwargs)
        decoded.append(weakref.ref(a))
        return a

    monkeypatch.setattr(_codec, "decode_chunk_fields", watching)
    return decoded, held
