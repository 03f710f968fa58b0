"""Chunk codec and writer state, without a server."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest

import reprise
from reprise import _codec, _sample
from reprise._proto import reprise_pb2 as pb
from reprise._writer import ColumnHistory, WriterOptions, _Blocked, _Producer, encode_insert_batch

import packed


@pytest.mark.parametrize("dt", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"])
def test_delta_roundtrip_wraps(dt: str) -> None:
    d = _codec.DTYPES[dt]
    info = np.iinfo(d)
    a = np.array([[info.max, info.min, 0], [info.min, info.max, 1], [0, 0, info.max]], dtype=d)
    c = _codec.encode_chunk(1, a, delta=True)
    assert c.delta_encoded
    out = _codec.decode_chunk(c)
    np.testing.assert_array_equal(out, a)


def test_delta_skips_floats_and_bools() -> None:
    for a in (np.ones((3, 2), np.float32), np.ones((3, 2), np.bool_)):
        assert not _codec.encode_chunk(1, a, delta=True).delta_encoded


def test_incompressible_data_is_stored_uncompressed() -> None:
    a = np.random.default_rng(0).standard_normal((1, 100)).astype(np.float32)
    assert _codec.encode_chunk(1, a).compression == pb.COMPRESSION_NONE
    z = _codec.encode_chunk(1, np.zeros((8, 100), np.float32))
    assert z.compression == pb.COMPRESSION_ZSTD and len(z.data) < 800


def test_big_endian_input_is_stored_little_endian() -> None:
    a = np.arange(6, dtype=">i4").reshape(2, 3)
    c = _codec.encode_chunk(1, a, delta=False, compression="none")
    assert c.dtype == "int32" and c.data == np.arange(6, dtype="<i4").tobytes()


def test_unsupported_dtype_is_a_clear_error() -> None:
    with pytest.raises(reprise.InvalidArgumentError, match="not carried"):
        _codec.encode_chunk(1, np.array([["a"]]))
    with pytest.raises(reprise.InvalidArgumentError, match="s2"):
        _codec.encode_chunk(1, np.zeros((1, 1)), compression="s2")


@pytest.mark.parametrize(
    "fields,match",
    [
        (dict(dtype="float32", step_shape=[4], length=1, raw_size=15, data=b"x" * 15), "raw_size"),
        (dict(dtype="nope", step_shape=[4], length=1, raw_size=16, data=b"x" * 16), "dtype"),
        (dict(dtype="float32", step_shape=[4], length=0, raw_size=0), "length"),
        (dict(dtype="float32", step_shape=[-4], length=1, raw_size=16), "dimension"),
        (dict(dtype="uint8", step_shape=[1 << 20, 1 << 20], length=1, raw_size=1 << 40), "limit|elements"),
        (dict(dtype="float32", step_shape=[4], length=1, raw_size=16, delta_encoded=True, data=b"x" * 16), "delta"),
        (dict(dtype="uint8", step_shape=[1 << 20], length=200, raw_size=200 << 20, compression=1, data=b"\x28\xb5\x2f\xfd" + b"\0" * 10), "cannot hold"),
        (dict(dtype="uint8", step_shape=[4], length=1, raw_size=4, compression=1, data=b"garbage!"), "zstd"),
        # A frame that declares 2**40 bytes: the decompressor would allocate them.
        (dict(dtype="uint8", step_shape=[4], length=1, raw_size=4, compression=1,
              data=b"\x28\xb5\x2f\xfd\xe0" + (1 << 40).to_bytes(8, "little") + bytes(8)), "declares"),
        (dict(dtype="uint8", step_shape=[4], length=1, raw_size=4, compression=9, data=b"abcd"), "compression"),
    ],
)
def test_hostile_chunks_are_refused_before_allocating(fields: dict, match: str) -> None:
    with pytest.raises(reprise.ProtocolError, match=match):
        _codec.decode_chunk(pb.Chunk(key=3, **fields))


def producer(**kw: object) -> tuple[_Producer, list]:
    """A producer whose messages go to the list; each item is sent at once
    unless kw sets a linger."""
    sent: list = []
    p = _Producer(WriterOptions(**{"linger": 0.0, **kw}), 1 << 20, sent.append)  # type: ignore[arg-type]
    return p, sent


def one_item(p: _Producer, i: int) -> None:
    """Appends step i of column x and makes it an item of table t."""
    with p.mu:
        p.append_locked({"x": np.int64(i)})
        p.create_item_locked("t", 1.0, p.resolve_locked({"x": ColumnHistory(p, "x")[-1]}))
        p.advance_locked(False)


def test_history_indexing() -> None:
    p, _ = producer()
    with p.mu:
        for t in range(5):
            p.append_locked({"x": np.int64(t)})
    h = ColumnHistory(p, "x")
    assert len(h) == 5
    r = h[-3:]
    assert (r.start, r.stop, r.squeeze) == (2, 5, False)
    r = h[-1]
    assert (r.start, r.stop, r.squeeze) == (4, 5, True)
    assert h[1].start == 1
    with pytest.raises(reprise.InvalidArgumentError):
        h[::2]
    with pytest.raises(reprise.InvalidArgumentError):
        h[7]


def test_items_beyond_keep_alive_or_missing_cells_are_refused() -> None:
    p, _ = producer(num_keep_alive_refs=2)
    with p.mu:
        for t in range(4):
            p.append_locked({"x": np.int64(t)} if t != 2 else {"y": np.int64(t)})
        with pytest.raises(reprise.InvalidArgumentError, match="num_keep_alive_refs"):
            p.resolve_locked({"x": ColumnHistory(p, "x")[-3:]})
        with pytest.raises(reprise.InvalidArgumentError, match="no cell at step 2"):
            p.resolve_locked({"x": ColumnHistory(p, "x")[-2:]})
        old = ColumnHistory(p, "x")[-1]
        p.end_episode_locked()
        p.append_locked({"x": np.int64(9)})
        with pytest.raises(reprise.InvalidArgumentError, match="earlier episode"):
            p.resolve_locked({"x": old})


def test_item_columns_are_named_once() -> None:
    """A sequence of picks, or a mapping that lists a name twice, may not
    give a column twice."""

    class Twice(Mapping[str, reprise.TrajectoryColumn]):
        def __init__(self, ref: reprise.TrajectoryColumn) -> None:
            self.ref = ref

        def __getitem__(self, name: str) -> reprise.TrajectoryColumn:
            return self.ref

        def __iter__(self) -> Iterator[str]:
            return iter(["x", "x"])

        def __len__(self) -> int:
            return 2

    p, _ = producer()
    with p.mu:
        p.append_locked({"x": np.int64(0)})
        ref = p.history["x"][-1]
        for picks in ([ref, ref], Twice(ref)):
            with pytest.raises(reprise.InvalidArgumentError, match="'x' appears twice"):
                p.resolve_locked(picks)
        assert len(p.resolve_locked({"x": ref, "y": ref})) == 2


def test_window_spans_sequences_not_counts() -> None:
    """A message may only be sent while its sequence lies within
    [lowest unsettled, lowest unsettled + window): a stuck message blocks
    the writer even if later ones were acked."""
    p, sent = producer(max_in_flight=3)

    one_item(p, 0)
    one_item(p, 1)
    one_item(p, 2)
    assert [r.seq for r in sent] == [1, 2, 3]
    # Window starts as declared: the lowest unsettled sequence.
    starts = [pb.InsertBatch.FromString(r.data).window_start for r in sent]
    assert starts == [1, 1, 1]
    p.on_settled(sent[1], 10, None)
    p.on_settled(sent[2], 11, None)
    with pytest.raises(_Blocked):
        one_item(p, 3)  # seq 4 is outside [1, 4)
    p.on_settled(sent[0], 9, None)
    with p.mu:
        p.advance_locked(False)
    b = pb.InsertBatch.FromString(sent[3].data)
    assert (b.sequence, b.window_start, b.window) == (4, 4, 3)
    assert sent[3].headers == {"Nats-Msg-Id": f"{p.id}-4"}


def test_unapplied_items_bound_the_writer() -> None:
    p, sent = producer(max_unapplied=2)
    for i in range(2):
        with p.mu:
            p.append_locked({"x": np.int64(i)})
            p.create_item_locked("t", 1.0, p.resolve_locked({"x": ColumnHistory(p, "x")[-1]}))
            p.advance_locked(False)
    for r in sent:
        p.on_settled(r, r.seq, None)  # acked, not applied
    with p.mu:
        p.append_locked({"x": np.int64(2)})
        p.create_item_locked("t", 1.0, p.resolve_locked({"x": ColumnHistory(p, "x")[-1]}))
        with pytest.raises(_Blocked):
            p.advance_locked(False)
    p.on_applied(2, {})
    with p.mu:
        p.advance_locked(False)
    assert len(sent) == 3


def test_the_services_pace_bounds_the_writer() -> None:
    """While the service paces inserts, its progress bounds the writer's
    unapplied items below max_unapplied; a message larger than the bound
    still goes out alone, and the bound ends with the next progress that
    carries none."""
    p, sent = producer(max_unapplied=100)

    def item(i: int) -> None:
        with p.mu:
            p.append_locked({"x": np.int64(i)})
            p.create_item_locked("t", 1.0, p.resolve_locked({"x": ColumnHistory(p, "x")[-1]}))
            p.advance_locked(False)

    p.on_applied(0, {}, 2)
    item(0)
    item(1)
    with pytest.raises(_Blocked):
        item(2)
    for r in sent:
        p.on_settled(r, r.seq, None)
    p.on_applied(2, {}, 2)  # both applied: room for two more
    with p.mu:
        p.advance_locked(False)
    item(3)
    assert len(sent) == 4
    with pytest.raises(_Blocked):
        item(4)
    p.on_applied(2, {}, 0)  # no longer paced: max_unapplied again
    with p.mu:
        p.advance_locked(False)
    assert len(sent) == 5


def test_a_held_table_holds_only_its_items() -> None:
    """The service's progress names the tables whose rate limiters hold
    items: the writer counts its items for them as not applied, and its
    items for other tables as applied."""
    p, sent = producer(max_unapplied=100)
    for i, table in enumerate(["a", "b", "b"]):
        with p.mu:
            p.append_locked({"x": np.int64(i)})
            p.create_item_locked(table, 1.0, p.resolve_locked({"x": ColumnHistory(p, "x")[-1]}))
            p.advance_locked(False)
    assert [r.tables for r in sent] == [frozenset({"a"}), frozenset({"b"}), frozenset({"b"})]
    for r in sent:
        p.on_settled(r, r.seq, None)
    p.on_applied(3, {"a": 0})
    assert p.acked_items == 1  # a's item waits in its table's queue
    p.on_applied(2, {})
    assert p.acked_items == 1  # published before: ignored
    p.on_applied(3, {})
    assert p.acked_items == 0


def test_column_dtype_and_shape_are_fixed() -> None:
    p, _ = producer()
    with p.mu:
        p.append_locked({"x": np.zeros(3, np.float32), "y": 1})
        with pytest.raises(reprise.SignatureMismatchError, match="'x'"):
            p.append_locked({"x": np.zeros(4, np.float32)})
        with pytest.raises(reprise.SignatureMismatchError, match="'y'"):
            p.append_locked({"y": 1.5})
        assert p.episode_steps == 1  # nothing of a refused step is kept


@pytest.mark.parametrize("chunk_length", [1, 3])
def test_chunks_hold_the_steps_whatever_their_layout(chunk_length: int) -> None:
    """Steps given as strided views, transposes and big-endian arrays are
    sealed in C order as the column's little-endian dtype."""
    p, sent = producer(chunk_length=chunk_length, compression="none")
    base = np.arange(96, dtype=np.int32).reshape(8, 12)
    steps = [
        {"x": base[::2, ::3].copy(), "y": np.float64(0.5)},  # contiguous, for reference
        {"x": base[1::2, ::3], "y": np.float64(1.5)},  # strided view
        {"x": np.asfortranarray(base[::2, 1::3]), "y": np.array(2.5, dtype=">f8")},  # Fortran order, big-endian
        {"x": base[::2, 2::3].T.copy().T, "y": np.float64(3.5)},  # a transposed view
    ]
    with p.mu:
        for step in steps:
            p.append_locked(step)
            refs = p.resolve_locked({"x": p.history["x"][-1], "y": p.history["y"][-1]})
            p.create_item_locked("t", 1.0, refs)
        p.flush_locked()
    chunks = [c for rec in sent for c in pb.InsertBatch.FromString(rec.data).chunks]
    got = {name: np.concatenate([_codec.decode_chunk(c) for c in chunks if c.step_shape == shape])
           for name, shape in (("x", [4, 4]), ("y", []))}
    np.testing.assert_array_equal(got["x"], np.stack([s["x"] for s in steps]))
    np.testing.assert_array_equal(got["y"], [0.5, 1.5, 2.5, 3.5])
    assert got["y"].dtype == np.dtype("<f8")


@pytest.mark.parametrize("first_step", [0, (1 << 14) - 20])
@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("chunk_length", [1, 2, 3])
def test_writer_messages_are_protobufs_own_encoding(chunk_length: int, compression: str, first_step: int) -> None:
    """The writer encodes chunks and items by hand, with short ways for
    the common ones (a step of an uncompressed chunk, an item column that
    takes a whole chunk). Whatever way each took, every message is byte for
    byte what protobuf makes of its own decoding, every item's slices cover
    the steps it picked, and every chunk holds its column's steps."""
    p, sent = producer(chunk_length=chunk_length, compression=compression, linger=0.001, batch_items=5,
                       max_in_flight=1 << 16, max_unapplied=1 << 20)
    p.episode_steps = first_step  # steps past 2**14 take varints of two bytes
    rng = np.random.default_rng(chunk_length)
    steps: list[dict[str, np.ndarray]] = []
    picked: list[tuple[str, float, int, list[tuple[str, str, int, int, bool]]]] = []
    h = p.history

    def item(table: str, prio: float, traj: dict[str, reprise.TrajectoryColumn] | list[reprise.TrajectoryColumn]) -> None:
        pairs = traj.items() if isinstance(traj, dict) else [(r.column, r) for r in traj]
        picked.append((table, prio, p.policy_version, [(n, r.column, r.start, r.stop, r.squeeze) for n, r in pairs]))
        with p.mu:
            p.add_item_locked(table, prio, traj, ())
            p.advance_locked(False)

    for t in range(40):
        step = {
            "obs": rng.standard_normal(3).astype(np.float32),
            "act": np.int64(t * 7 - 100),
            "none": np.zeros(0, np.float32),
            "flag": rng.integers(0, 2, 2).astype(bool),
        }
        if t % 7 == 3:
            del step["flag"]
        steps.append(step)
        with p.mu:
            p.append_locked(step)
        p.policy_version = t - 20
        if t >= 3:
            prio = [1.5, 0.0, -0.0, 2.0 ** 70][t % 4]
            item("a", prio, {"o": h["obs"][-1], "act": h["act"][-1]})
            if t % 2:
                item("b", 0.5, {"obs": h["obs"][-3:], "none": h["none"][-2:]})
            if t % 5 == 0 and "flag" in step:
                item("c", 1.0, [h["act"][-2:], h["flag"][-1]])
    with p.mu:
        p.flush_locked()

    chunks: dict[int, pb.Chunk] = {}
    items: list[pb.Item] = []
    for rec in sent:
        b = pb.InsertBatch.FromString(rec.data)
        assert b.SerializeToString() == rec.data, f"message {rec.seq}"
        chunks.update((c.key, c) for c in b.chunks)
        items += b.items
    assert len(items) == len(picked)
    for it, (table, prio, version, cols) in zip(items, picked):
        assert (it.table, it.priority, it.policy_version) == (table, prio, version)
        assert [c.name for c in it.columns] == [n for n, *_ in cols]
        for col, (_, column, start, stop, squeeze) in zip(it.columns, cols):
            assert col.squeeze == squeeze
            covered: list[int] = []
            for sl in col.slices:
                c = chunks[sl.chunk_key]
                covered += range(c.episode_step + sl.offset, c.episode_step + sl.offset + sl.length)
                want = np.stack([steps[s - first_step][column] for s in range(c.episode_step, c.episode_step + c.length)])
                np.testing.assert_array_equal(_codec.decode_chunk(c), want)
                assert c.delta_encoded == (column == "act"), "every chunk of an integer column says it is delta-encoded"
            assert covered == list(range(start, stop))


def test_items_are_checked_against_the_tables_signature() -> None:
    """Names in order, dtypes, and shapes [T, *step_shape] (the step shape
    when squeezed), where -1 in the signature matches any size; the
    signature is read once per signature the client holds."""
    p, _ = producer(chunk_length=2)
    with p.mu:
        for t in range(3):
            p.append_locked({"obs": np.zeros((2, 3), np.float32), "act": np.int64(t)})
    h = p.history
    exact = (pb.ColumnSpec(name="obs", dtype="float32", shape=[2, 2, 3]), pb.ColumnSpec(name="act", dtype="int64"))
    loose = (pb.ColumnSpec(name="obs", dtype="float32", shape=[-1, 2, -1]), pb.ColumnSpec(name="act", dtype="int64"))
    good = [({"obs": h["obs"][-2:], "act": h["act"][-1]}, exact), ({"obs": h["obs"][-3:], "act": h["act"][-1]}, loose)]
    bad = [
        ({"obs": h["obs"][-3:], "act": h["act"][-1]}, exact, r"shape \[3, 2, 3\], the signature wants \[2, 2, 3\]"),
        ({"obs": h["obs"][-1], "act": h["act"][-1]}, loose, r"shape \[2, 3\], the signature wants \[-1, 2, -1\]"),
        ({"obs": h["obs"][-2:], "act": h["act"][-2:]}, exact, r"'act' has shape \[2\], the signature wants \[\]"),
        ({"act": h["act"][-1], "obs": h["obs"][-2:]}, exact, "column 'act' is where the signature has 'obs'"),
        ({"obs": h["obs"][-2:]}, exact, "1 columns, the table's signature has 2"),
        ({"obs": h["act"][-2:], "act": h["act"][-1]}, exact, "dtype int64, the signature wants float32"),
    ]
    with p.mu:
        for traj, sig in good:
            p.add_item_locked("t", 1.0, traj, sig)
        for traj, sig, match in bad:
            with pytest.raises(reprise.SignatureMismatchError, match=match):
                p.add_item_locked("t", 1.0, traj, sig)
        assert len(p.pending) == len(good)
        compiled = p._compiled_signature("t", loose)
        assert p._compiled_signature("t", loose) is compiled
        assert p._compiled_signature("t", exact) is not compiled


def test_compression_backoff_schedule() -> None:
    """A column whose chunks never shrink tries zstd on chunks 0, 2, 5, 10,
    ... (after 1, 2, 4, ... skipped) up to stretches of 64, as the Go
    producer does; one that shrinks is tried on the very next chunk."""
    p, _ = producer()
    with p.mu:
        p.append_locked({"x": np.float32(0)})
    c = p.columns["x"]
    c.skip = c.after = 0
    tried = []
    for chunk in range(400):
        if c.codec("zstd") == "zstd":
            tried.append(chunk)
            c.record(False)
    assert tried == [0, 2, 5, 10, 19, 36, 69, 134, 199, 264, 329, 394]
    c.record(True)
    assert c.codec("zstd") == "zstd"


def test_incompressible_columns_back_off() -> None:
    """After a long stretch of random steps, a column's next chunks are
    stored uncompressed without trying, even zeros; within 64 chunks zstd
    is tried again and compresses from then on. Every step decodes intact."""
    noise, zeros = 200, 150
    p, sent = producer()
    rng = np.random.default_rng(7)
    steps = np.concatenate([rng.random((noise, 256), dtype=np.float32), np.zeros((zeros, 256), np.float32)])
    with p.mu:
        for step in steps:
            p.append_locked({"obs": step})
            p.create_item_locked("t", 1.0, p.resolve_locked({"obs": p.history["obs"][-1]}))
        p.flush_locked()
    chunks = sorted(
        (c for rec in sent for c in pb.InsertBatch.FromString(rec.data).chunks), key=lambda c: c.episode_step
    )
    assert [c.episode_step for c in chunks] == list(range(noise + zeros))
    np.testing.assert_array_equal(np.stack([_codec.decode_chunk(c)[0] for c in chunks]), steps)
    compressed = np.array([c.compression == pb.COMPRESSION_ZSTD for c in chunks])
    assert not compressed[: noise + 1].any(), "the first zero step, right after the random ones, was tried"
    first = noise + int(np.argmax(compressed[noise:]))
    assert compressed[first] and first <= noise + 64
    assert compressed[first:].all()


def test_varints_match_protobuf() -> None:
    from reprise._writer import _varint

    edges = [0, 1, 127, 128, (1 << 14) - 1, 1 << 14, (1 << 21) - 1, 1 << 21, 1 << 28, (1 << 56) - 1, 1 << 56,
             (1 << 63) + 5, (1 << 64) - 1]
    rng = np.random.default_rng(3)
    values = edges + [int(v) for v in rng.integers(0, 1 << 63, 2000, dtype=np.uint64) << np.uint64(1)]
    for v in values:
        # A packed repeated field of one value: its tag, its length, the varint.
        assert _varint(v) == pb.InsertBatch(release_chunk_keys=[v]).SerializeToString()[2:], v
    for bad in (-1, 1 << 64):
        with pytest.raises(ValueError):
            _varint(bad)


class _Bytes(random.Random):
    """A Random whose randbytes gives the given keys' little-endian bytes."""

    def __init__(self, keys: list[int]) -> None:
        super().__init__()
        self.keys = keys

    def randbytes(self, n: int) -> bytes:
        assert n == 8 * len(self.keys)
        return np.array(self.keys, dtype="<u8").tobytes()


def test_random_keys_are_the_varints_of_the_drawn_bytes() -> None:
    from reprise._writer import _varint, random_key_varints

    # Every varint length from 1 to 10 bytes, at both ends.
    edges = [0, 1, 127] + [v for b in range(7, 64, 7) for v in ((1 << b), (1 << min(b + 7, 64)) - 1)]
    # 0 is no key on the wire: it becomes 1, as the writer's draws did before.
    assert random_key_varints(_Bytes(edges), len(edges)) == [_varint(k or 1) for k in edges]
    drawn = random_key_varints(random.Random(5), 4096)
    want = np.frombuffer(random.Random(5).randbytes(8 * 4096), dtype="<u8").tolist()
    assert drawn == [_varint(k or 1) for k in want]


def test_insert_batch_encoding_matches_protobuf() -> None:
    c = pb.Chunk(key=5, dtype="uint8", step_shape=[2], length=1, raw_size=2, data=b"ab").SerializeToString()
    it = pb.Item(key=9, table="t", priority=0.5).SerializeToString()
    mine = encode_insert_batch("ab" * 16, 300, [c], [it], [1, 1 << 63], True, 290, 256, "_INBOX.u.n1")
    ref = pb.InsertBatch(
        producer_id="ab" * 16, sequence=300, chunks=[pb.Chunk.FromString(c)], items=[pb.Item.FromString(it)],
        release_chunk_keys=[1, 1 << 63], end_of_stream=True, window_start=290, window=256,
        notice_subject="_INBOX.u.n1",
    ).SerializeToString()
    assert mine == ref


def test_writer_options_are_checked() -> None:
    with pytest.raises(reprise.InvalidArgumentError):
        WriterOptions(chunk_length=0)
    with pytest.raises(reprise.InvalidArgumentError):
        WriterOptions(compression="s2")


def test_item_encoding_with_policy_version_matches_protobuf() -> None:
    from reprise._writer import encode_item

    for version in (0, 1, 300, -1, -(2**63), 2**63 - 1):
        mine = encode_item(b"\x07", b"\x12\x01t", 0.5, [], version)
        ref = pb.Item(key=7, table="t", priority=0.5, policy_version=version).SerializeToString()
        assert mine == ref, version


def _response(items: list[tuple[int, int, int]], chunk_steps: int, step: int) -> bytes:
    """A packed reply of float32 chunks of chunk_steps steps of step
    values; items are (chunk key, offset, length), one column each."""
    chunks = []
    for key in sorted({k for k, _, _ in items}):
        data = (np.arange(chunk_steps * step, dtype=np.float32) + 1000 * key).tobytes()
        chunks.append(pb.Chunk(key=key, dtype="float32", step_shape=[step], length=chunk_steps, raw_size=len(data), data=data))
    squeeze = chunk_steps == 1 and all(ln == 1 for _, _, ln in items)
    return packed.one_column(items, chunks, squeeze)


@pytest.mark.parametrize(
    "items,chunk_steps,step",
    [
        ([(1, 0, 1), (2, 0, 1), (3, 0, 1)], 1, 4),  # item i is chunk i
        ([(1, 0, 1), (2, 0, 1), (1, 0, 1)], 1, 4),  # an item sampled twice
        ([(1, 0, 2), (2, 0, 2)], 2, 8192),  # large chunks
        ([(1, 0, 2), (1, 1, 2), (2, 1, 2)], 3, 8192),  # overlapping items of large chunks
    ],
)
def test_sampled_batches_are_the_learners(items: list[tuple[int, int, int]], chunk_steps: int, step: int) -> None:
    """A learner may write into a sampled batch: its array is writable,
    shares no memory with the reply, and writing into it changes no later
    decode of the same reply; rows of an item sampled twice are separate."""
    raw = _response(items, chunk_steps, step)
    batch = _sample.decode_batch(_sample.parse_response(raw))
    x = batch.data["x"]
    assert x.flags.writeable
    assert not np.shares_memory(x, np.frombuffer(raw, np.uint8))
    want = _sample.decode_batch(_sample.parse_response(raw)).data["x"].copy()
    x += 1
    again = _sample.decode_batch(_sample.parse_response(raw)).data["x"]
    assert not np.shares_memory(x, again)
    np.testing.assert_array_equal(again, want)
    np.testing.assert_array_equal(x, want + 1)


@pytest.mark.parametrize("seed", range(40))
def test_batches_stack_the_items(seed: int) -> None:
    """decode_batch stacks what decode_samples returns item by item: random
    replies of one to three columns, chunks of one to four steps, items
    sharing chunks or sampled twice, and now and then an item whose column
    takes two slices (gathered step by step)."""
    rng = np.random.default_rng(seed)
    ncol = int(rng.integers(1, 4))
    steps = int(rng.integers(1, 3))
    two_slices = steps == 2 and rng.random() < 0.3
    chunks = []
    chunk_len = {}
    for key in range(1, 9):
        n = int(rng.integers(max(steps, 2 if two_slices else 1), 5))
        chunk_len[key] = n
        data = rng.standard_normal(n * 3).astype(np.float32).tobytes()
        chunks.append(pb.Chunk(key=key, dtype="float32", step_shape=[3], length=n, raw_size=len(data), data=data))
    items = []
    for i in range(int(rng.integers(1, 12))):
        cols = []
        for j in range(ncol):
            key = int(rng.integers(1, 9))
            if two_slices and i == 0 and j == ncol - 1:
                cols.append(packed.Column(f"c{j}", [(key, chunk_len[key] - 1, 1), (key % 8 + 1, 0, 1)]))
                continue
            off = int(rng.integers(0, chunk_len[key] - steps + 1))
            cols.append(packed.Column(f"c{j}", [(key, off, steps)], squeeze=steps == 1 and j == 0))
        items.append(
            packed.Item(
                cols,
                key=int(rng.integers(1, 2**63)),
                probability=float(rng.random()),
                table_size=int(rng.integers(0, 1000)),
                times_sampled=int(rng.integers(0, 9)),
                rate_limited=bool(rng.random() < 0.5),
            )
        )
    raw = packed.pack(items, chunks).SerializeToString()
    batch = _sample.decode_batch(_sample.parse_response(raw))
    samples = _sample.decode_samples(_sample.parse_response(raw))
    assert len(batch) == len(samples)
    assert batch.info.rate_limited.tolist() == [it.rate_limited for it in items]
    assert batch.info.key.tolist() == [it.key for it in items]
    for field in _sample.SampleInfo._fields:
        np.testing.assert_array_equal(getattr(batch.info, field), [getattr(s.info, field) for s in samples])
    for j in range(ncol):
        np.testing.assert_array_equal(batch.data[f"c{j}"], np.stack([s.data[f"c{j}"] for s in samples]))


def test_joined_errors_keep_every_loss_and_message() -> None:
    """Errors a writer raises together take the class and fields of the
    first that lost items, are of every kind of loss among them, name
    every error, and list every rejection; any class joins,
    PermissionDeniedError's keyword-only fields too."""
    from reprise._writer import _join, not_stored_error, outcome_unknown_error

    denied = reprise.PermissionDeniedError("publish denied", operation="publish", subject="r.data.insert")
    lost = not_stored_error(reprise.DeadlineExceededError("no ack from JetStream within 5.0s"), 3, 64)
    rej = [reprise.RejectedError(f"item {k} refused", code=reprise.Code.NOT_FOUND, sequence=4, item_key=k, table="t")
           for k in (7, 8)]
    e = _join([denied, lost, rej[0]])
    assert isinstance(e, reprise.NotStoredError) and isinstance(e, reprise.DeadlineExceededError)
    assert (e.sequence, e.items, e.__cause__) == (3, 64, lost)
    for part in ("3 errors", "publish denied", "message 3 (64 items) not stored: no ack", "item 7 refused"):
        assert part in e.message and part in str(e)
    e = _join([denied, rej[0], lost, rej[1]])
    assert isinstance(e, reprise.RejectedError) and e.rejections == rej and e.item_key == 7
    # Of every kind of loss it joins, as Go's errors.Is finds each.
    unknown = outcome_unknown_error(reprise.DeadlineExceededError("no ack from JetStream within 5.0s"), 2, 5)
    e = _join([denied, unknown, lost, rej[0]])
    assert isinstance(e, reprise.OutcomeUnknownError) and isinstance(e, reprise.DeadlineExceededError)
    assert isinstance(e, reprise.NotStoredError) and isinstance(e, reprise.RejectedError)
    assert (e.sequence, e.items, e.rejections, e.item_key) == (2, 5, [rej[0]], 7)
    e = _join([denied, denied])
    assert isinstance(e, reprise.PermissionDeniedError) and (e.operation, e.subject) == ("publish", "r.data.insert")
    e = _join([reprise.UnavailableError(f"down {i}") for i in range(8)])
    assert type(e) is reprise.UnavailableError and e.message.endswith("down 4; and 3 more")



def test_every_writer_error_pickles_and_copies() -> None:
    """Errors of several kinds (a loss of its last failure's class, a close
    that gave up on a resend, errors joined) and a PermissionDeniedError,
    whose __init__ takes required keyword-only fields, pickle and copy
    with their class and fields: they raised PicklingError or TypeError."""
    import copy
    import pickle

    from reprise._writer import _join, closed_while_retrying, episode_not_ended_error, not_stored_error

    denied = reprise.PermissionDeniedError("publish denied", operation="publish", subject="r.data.insert")
    lost = not_stored_error(reprise.DeadlineExceededError("no ack"), 3, 64)
    rej = reprise.RejectedError("item 7 refused", code=reprise.Code.NOT_FOUND, sequence=4, item_key=7, table="t")
    for e in (denied, lost, _join([denied, lost, rej]), _join([rej, reprise.ClosedError("closed")]),
              closed_while_retrying(reprise.UnavailableError("no stream")),
              episode_not_ended_error(reprise.DeadlineExceededError("no room"))):
        for again in (copy.copy(e), pickle.loads(pickle.dumps(e))):
            assert type(again) is type(e) and str(again) == str(e) and again.args == e.args
            assert {k: v for k, v in vars(again).items() if k != "rejections"} == \
                {k: v for k, v in vars(e).items() if k != "rejections"}


def test_a_waiting_call_reports_items_lost_to_another_calls_errors() -> None:
    """A call that waited for messages (flush, end_episode, close) reports
    the items lost meanwhile even where another call took their errors;
    not a lost message without items (a release of chunks), nor a loss
    whose error is still there for the next call, which reports it."""
    from reprise._writer import _Record, not_stored_error

    p, _ = producer()

    def fail(seq: int, items: int) -> None:
        p.unsettled.append(seq)
        p.unacked_items += items
        p.on_settled(_Record(seq, b"", {}, items), None, not_stored_error(reprise.ClosedError("closed"), seq, items))

    with p.mu:
        mark = (p.failed_items, p.rejections, p.unknown_items)
    fail(1, 0)  # a release: nothing lost
    with p.mu:
        assert p.take_errors_locked() is not None  # another call takes it
        assert p.waited_errors_locked(mark) is None
        mark = (p.failed_items, p.rejections, p.unknown_items)
    fail(2, 5)
    with p.mu:
        taken = p.take_errors_locked()  # another call takes it
        assert isinstance(taken, reprise.NotStoredError)
        e = p.waited_errors_locked(mark)
        assert isinstance(e, reprise.NotStoredError) and "5 of this writer's items" in e.message
        mark = (p.failed_items, p.rejections, p.unknown_items)
    fail(3, 2)
    with p.mu:
        # This call's own errors report the loss, and the next call does
        # not again.
        e = p.waited_errors_locked(mark)
        assert isinstance(e, reprise.NotStoredError) and "message 3 (2 items)" in e.message
        assert p.waited_errors_locked((p.failed_items, p.rejections, p.unknown_items)) is None


def test_a_waiting_call_reports_items_of_unknown_outcome_apart() -> None:
    """Items of a message given up on that JetStream may have stored are
    counted apart from those lost: a call that waited meanwhile reports
    them as OutcomeUnknownError, never NotStoredError, even where another
    call took their error (Go twin: flow.withLost)."""
    from reprise._writer import _Record, outcome_unknown_error

    p, _ = producer()
    mark = p.failure_mark()
    p.unsettled.append(1)
    p.unacked_items += 3
    err = outcome_unknown_error(reprise.DeadlineExceededError("no ack"), 1, 3)
    assert isinstance(err, reprise.DeadlineExceededError) and not isinstance(err, reprise.NotStoredError)
    p.on_settled(_Record(1, b"", {}, 3), None, err)
    assert (p.failed_items, p.unknown_items) == (0, 3)
    with p.mu:
        assert isinstance(p.take_errors_locked(), reprise.OutcomeUnknownError)  # another call takes it
        e = p.waited_errors_locked(mark)
        assert isinstance(e, reprise.OutcomeUnknownError) and not isinstance(e, reprise.NotStoredError)
        assert "3 of this writer's items" in e.message
        assert p.waited_errors_locked((p.failed_items, p.rejections, p.unknown_items)) is None


def test_a_waiting_call_reports_rejections_another_call_took() -> None:
    """A call that waited while the service rejected items raises a
    RejectedError even where another call took the rejections' errors; not
    for rejections from before it began, nor twice for those it raises
    itself, nor for an error that is no rejection."""
    from reprise._writer import rejection_error

    p, _ = producer()

    def reject(key: int) -> None:
        p.on_rejected(rejection_error(pb.Rejection(sequence=4, item_key=key, table="t", code=reprise.Code.NOT_FOUND, message="unknown table")))

    reject(1)  # before the call
    mark = p.failure_mark()
    reject(2)
    reject(3)
    with p.mu:
        assert isinstance(p.take_errors_locked(), reprise.RejectedError)  # another call takes them
        e = p.waited_errors_locked(mark)
        assert isinstance(e, reprise.RejectedError) and "2 rejections" in e.message
    mark = p.failure_mark()
    reject(4)
    with p.mu:
        e = p.waited_errors_locked(mark)  # its own, raised as it is and once
        assert isinstance(e, reprise.RejectedError) and e.item_key == 4 and len(e.rejections) == 1
    mark = p.failure_mark()
    p.on_error(reprise.PermissionDeniedError("denied", operation="subscribe", subject="x"))
    with p.mu:
        p.take_errors_locked()
        assert p.waited_errors_locked(mark) is None


def test_gap_fills_replace_a_given_up_message_while_one_sent_after_may_wait() -> None:
    """A message given up on is replaced by a gap fill while a message sent
    after it may be held behind it in the service; a gap fill given up on
    (after retry_for) is replaced while a message other than a gap fill
    was sent after it, or one stored may be held, and not for gap fills
    alone, which would keep each other going for as long as JetStream takes
    nothing (Go twin: TestAGapFillGivenUpIsReplacedForAMessageSentAfterIt)."""
    p, sent = producer(retry_for=0.3)

    def give_up(rec: Any) -> None:
        rec.first_sent = time.monotonic() - 1.0  # retried for retry_for
        p.on_settled(rec, None, reprise.DeadlineExceededError("no ack"))

    one_item(p, 0)
    one_item(p, 1)
    assert [r.seq for r in sent] == [1, 2]
    give_up(sent[0])  # message 2 may wait for it: gap fill 3
    give_up(sent[1])  # gap fill 3 may: gap fill 4
    assert [(r.seq, r.fills) for r in sent[2:]] == [(3, 1), (4, 2)]
    one_item(p, 2)  # message 5, sent while gap fill 3 is out
    give_up(sent[2])  # message 5 may wait for it: gap fill 6
    assert [(r.seq, r.fills) for r in sent[5:]] == [(6, 1)]
    give_up(sent[3])  # gap fill 4: message 5 was sent after it: gap fill 7
    give_up(sent[5])  # gap fill 6: only gap fill 7 after it, nothing stored: none
    assert [(r.seq, r.fills) for r in sent[6:]] == [(7, 2)]
    assert p.gap_fills == 1 and p.failed_items == 2
