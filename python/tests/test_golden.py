"""Golden vectors shared with the Go side (broker/golden_test.go).

The Go test writes encoded chunks, an insert batch and sample responses with
what they decode to (golden/go_*.json); these tests decode them. The Python
writer's messages are written to golden/python_insert_batches.json (with
REPRISE_UPDATE_GOLDEN=1, as ``scripts/test.sh --update-golden`` does) and
decoded by the Go test TestGoldenPythonVectors.
"""

from __future__ import annotations

import base64
import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import reprise
from reprise import _codec, _sample
from reprise import aio as raio
from reprise._proto import reprise_pb2 as pb
from reprise._writer import ColumnHistory as H
from reprise._writer import WriterOptions, _Producer, decode_progress, msg_id, notice_token

GOLDEN = Path(__file__).parent / "golden"


def load(name: str) -> Any:
    return json.loads((GOLDEN / name).read_text())


def b64(s: str | None) -> bytes:
    return base64.b64decode(s or "")


def expected(t: dict[str, Any]) -> np.ndarray:
    dt = _codec.DTYPES[t["dtype"]]
    return np.frombuffer(b64(t["raw"]), dtype=dt).reshape(t["shape"] or ())


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    # Bit for bit: NaNs and -0 included.
    assert got.tobytes() == want.tobytes()


GO_CHUNKS = load("go_chunks.json")


@pytest.mark.parametrize("case", GO_CHUNKS, ids=[c["name"] for c in GO_CHUNKS])
def test_go_chunks_decode(case: dict[str, Any]) -> None:
    chunk = pb.Chunk.FromString(b64(case["chunk"]))
    if case.get("error"):
        with pytest.raises(reprise.UnsupportedCodecError) as e:
            _codec.decode_chunk(chunk)
        assert "s2" in str(e.value) and "WithCompression" in str(e.value)
        return
    got = _codec.decode_chunk(chunk)
    assert_same(got, expected(case["want"]))
    assert got.flags.writeable


def test_every_wire_dtype_is_covered() -> None:
    seen = {c["want"]["dtype"] for c in GO_CHUNKS}
    assert seen == set(_codec.DTYPES)
    combos = {(c["want"]["dtype"], c["compression"], c["delta"]) for c in GO_CHUNKS}
    # Delta really was applied to integer chunks, and both codecs appear.
    assert ("int16", "COMPRESSION_ZSTD", True) in combos
    assert ("uint64", "COMPRESSION_NONE", True) in combos
    assert ("float32", "COMPRESSION_NONE", False) in combos


@pytest.mark.parametrize("case", GO_CHUNKS[:-1], ids=[c["name"] for c in GO_CHUNKS[:-1]])
def test_python_reencodes_go_chunks(case: dict[str, Any]) -> None:
    """The Python encoder makes chunks that decode to the same steps, with
    the same delta and compression decisions as Go's."""
    want = expected(case["want"])
    comp = "none" if "/none/" in case["name"] else "zstd"
    c = _codec.encode_chunk(5, want, compression=comp, delta="delta=false" not in case["name"])
    assert c.delta_encoded == case["delta"]
    assert pb.Compression.Name(c.compression) == case["compression"]
    assert_same(_codec.decode_chunk(c), want)


RESPONSES = load("go_sample_responses.json")


@pytest.mark.parametrize("case", RESPONSES, ids=[c["name"] for c in RESPONSES])
def test_go_sample_responses_decode(case: dict[str, Any]) -> None:
    data = b64(case["response"])
    code = case["code"]
    resp = _sample.parse_response(data)
    table = case["table"]
    assert (resp.table_size, resp.weight_fraction, resp.weight_exponent) == (
        table["size"],
        table["weight_fraction"],
        table["weight_exponent"],
    )
    if code not in (pb.CODE_OK, pb.CODE_PARTIAL):
        cls = type(reprise.errors.error_for_code(code, ""))
        with pytest.raises(cls) as e:
            raio.decode_batch(data)
        assert e.value.message == case["message"]
        assert e.value.code == code
        return
    if code == pb.CODE_PARTIAL:
        with pytest.raises(reprise.RateLimitedError) as e:
            raio.decode_samples(data)
        samples = e.value.partial
        assert e.value.message == case["message"]
    else:
        samples = raio.decode_samples(data)
    assert len(samples) == len(case["items"])
    for s, want in zip(samples, case["items"]):
        assert s.info._asdict() == want["info"]
        assert list(s.data) == [c["name"] for c in want["columns"]]
        for c in want["columns"]:
            assert_same(s.data[c["name"]], expected(c["want"]))
    if not case["batchable"]:
        with pytest.raises(reprise.InvalidArgumentError, match="sample()"):
            raio.decode_batch(data)
        return
    if code == pb.CODE_PARTIAL:
        with pytest.raises(reprise.RateLimitedError) as e:
            raio.decode_batch(data)
        batch = e.value.partial
    else:
        batch = raio.decode_batch(data)
    assert len(batch) == len(case["items"])
    for field in ("key", "probability", "table_size", "priority", "times_sampled", "rate_limited"):
        assert getattr(batch.info, field).tolist() == [it["info"][field] for it in case["items"]]
    assert batch.info.key.dtype == np.uint64
    for j, c in enumerate(case["items"][0]["columns"]):
        want = np.stack([expected(it["columns"][j]["want"]) for it in case["items"]])
        assert_same(batch.data[c["name"]], want)


def test_go_insert_batch_decodes() -> None:
    g = load("go_insert_batch.json")
    b = pb.InsertBatch.FromString(b64(g["batch"]))
    assert b.producer_id == "0123456789abcdef0123456789abcdef"
    assert (b.sequence, b.window_start, b.window, list(b.release_chunk_keys)) == (7, 5, 256, [3, 4])
    chunks = {c.key: _codec.decode_chunk(c) for c in b.chunks}
    for it, want in zip(b.items, g["items"]):
        assert (it.key, it.table, it.priority) == (want["key"], want["table"], want["priority"])
        for c, wc in zip(it.columns, want["columns"]):
            got = np.concatenate([chunks[s.chunk_key][s.offset : s.offset + s.length] for s in c.slices])
            if c.squeeze:
                got = got[0]
            assert (c.name, c.squeeze) == (wc["name"], wc["squeeze"])
            assert_same(got, expected(wc["want"]))


@pytest.mark.parametrize("case", load("go_progress.json"), ids=lambda c: c["name"])
def test_go_progress_decodes(case: dict[str, Any]) -> None:
    """The service's progress, paced or not, reads as the Go producer reads
    it: applied, the held tables, and the paced bound on unapplied items."""
    applied, held, paced = decode_progress(b64(case["data"]))
    assert (applied, held, paced) == (case["applied"], case["held"] or {}, case["max_unapplied"])


GO_SAMPLE_REQUESTS = load("go_sample_requests.json")


def _sample_request_bytes(case: dict[str, Any]) -> bytes:
    if case["withdraw"]:
        return raio.sample_withdrawal(case["withdraw"])
    return raio.sample_request(case["table"], case["num_samples"], case["timeout_ms"], case["flexible"])


@pytest.mark.parametrize("case", GO_SAMPLE_REQUESTS, ids=[c["name"] for c in GO_SAMPLE_REQUESTS])
def test_sample_requests_are_go_s(case: dict[str, Any]) -> None:
    """Python sends a sample request, and its withdrawal, in the bytes Go
    sends them in."""
    assert _sample_request_bytes(case) == b64(case["data"])


# --------------------------------------------------------------- Python -> Go


def test_python_sample_requests() -> None:
    """Python's sample requests and withdrawal, which the Go test
    TestGoldenPythonSampleRequests decodes."""
    cases = [
        {"name": "request", "table": "replay", "num_samples": 32, "timeout_ms": 4500, "flexible": False, "withdraw": ""},
        {"name": "flexible request", "table": "q", "num_samples": 1, "timeout_ms": 0, "flexible": True, "withdraw": ""},
        {"name": "withdrawal", "table": "", "num_samples": 0, "timeout_ms": 0, "flexible": False,
         "withdraw": "_INBOX.learner.Xq2Zt0PQmUc1Vf8gLw3bsa.2a"},
    ]
    msgs = []
    for c in cases:
        data = _sample_request_bytes(c)
        m = pb.SampleRequest.FromString(data)
        msgs.append({**c, "data": base64.b64encode(data).decode(), "packed": m.packed, "layout": int(m.layout)})
    path = GOLDEN / "python_sample_requests.json"
    if os.environ.get("REPRISE_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(msgs, indent=1) + "\n")
    assert json.loads(path.read_text()) == msgs, "regenerate with scripts/test.sh --update-golden"



def tensor_json(a: np.ndarray) -> dict[str, Any]:
    return {
        "dtype": _codec.dtype_name(a.dtype),
        "shape": list(a.shape),
        "raw": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode(),
    }


def python_vectors() -> list[dict[str, Any]]:
    """Messages of a deterministic writer (fixed id, seeded keys) and what
    each item must decode to."""
    records: list[Any] = []
    out: list[dict[str, Any]] = []
    expect: list[dict[str, Any]] = []

    def writer(name: str, compression: str, chunk_length: int, seed: int) -> _Producer:
        p = _Producer(
            WriterOptions(chunk_length=chunk_length, compression=compression, linger=0.0, max_in_flight=4),
            1 << 20,
            records.append,
        )
        p.id = format(seed * 0x1F2E3D4C5B6A7988 % (1 << 128), "032x")
        p.token = notice_token(p.id)
        p.notice = f"_INBOX.golden.notice{seed}"
        p._rng = random.Random(seed)
        p.episode = 42
        return p

    def item(p: _Producer, table: str, prio: float, traj: dict[str, Any], steps: list[dict[str, np.ndarray]]) -> None:
        with p.mu:
            refs = p.resolve_locked(traj)
            p.create_item_locked(table, prio, refs)
        cols = []
        for name, r in traj.items():
            a = np.stack([steps[i][r.column] for i in range(r.start, r.stop)])
            cols.append({"name": name, "squeeze": r.squeeze, "want": tensor_json(a[0] if r.squeeze else a)})
        expect.append({"table": table, "priority": prio, "policy_version": p.policy_version, "columns": cols})

    def drain(p: _Producer, name: str, force: bool = False) -> None:
        with p.mu:
            if force:
                p.flush_locked()
            else:
                p.advance_locked(False)
        while records:
            rec = records.pop(0)
            out.append({"name": f"{name} #{rec.seq}", "rec": rec, "producer": p})
            p.on_settled(rec, rec.seq, None)  # acked at once: the window moves

    rng = np.random.default_rng(7)
    # 1: a trajectory writer with chunks of 2 steps, zstd, delta.
    p = writer("traj", "zstd", 2, 1)
    steps: list[dict[str, np.ndarray]] = []
    for t in range(5):
        s = {
            "obs": rng.integers(0, 255, size=(6, 6), dtype=np.uint8),
            "action": np.int64(t * 1000 - 2),
            "reward": np.float32(t) / 3,
        }
        steps.append(s)
        with p.mu:
            p.append_locked(s)
        if t >= 2:
            p.policy_version = t - 3  # -1, 0 and 1: a negative int64 on the wire too
            item(p, "replay", float(t), {"obs": H(p, "obs")[-3:], "action": H(p, "action")[-3:], "reward": H(p, "reward")[-1]}, steps)
        drain(p, "trajectories")
    drain(p, "trajectories flush", force=True)
    with p.mu:
        p.end_episode_locked()
    # 2: every dtype in one step, uncompressed, one item per table.
    p2 = writer("dtypes", "none", 1, 2)
    s2: dict[str, np.ndarray] = {}
    for name, dt in _codec.DTYPES.items():
        if name == "bool":
            a = rng.integers(0, 2, size=(2, 3)).astype(dt)
        elif np.issubdtype(dt, np.integer):
            info = np.iinfo(dt)
            a = rng.integers(info.min, info.max, size=(2, 3), dtype=dt, endpoint=True)
        elif np.issubdtype(dt, np.complexfloating):
            a = (rng.standard_normal((2, 3)) + 1j * rng.standard_normal((2, 3))).astype(dt)
        else:
            a = rng.standard_normal((2, 3)).astype(dt)
        s2[name] = a
    with p2.mu:
        p2.append_locked(s2)
        p2.append_locked(s2)
    item(p2, "dtypes", 0.25, {n: H(p2, n)[-2:] for n in s2}, [s2, s2])
    item(p2, "other", 2.0, {"scalar_view": H(p2, "int64")[-1]}, [s2, s2])
    drain(p2, "every dtype", force=True)
    # 3: the chunks the ended episode let go of, released in a message of
    # their own; then the end of stream, which releases every chunk left
    # and so names none.
    with p.mu:
        p._publish_locked(False)
    drain(p, "releases")
    with p.mu:
        p._publish_locked(True)
    drain(p, "end of stream")

    msgs = []
    items_seen = 0
    for o in out:
        rec, prod = o["rec"], o["producer"]
        b = pb.InsertBatch.FromString(rec.data)
        n = len(b.items)
        exp = expect[items_seen : items_seen + n]
        items_seen += n
        for e, it in zip(exp, b.items):
            e["key"] = it.key
        msgs.append(
            {
                "name": o["name"],
                "data": base64.b64encode(rec.data).decode(),
                "msg_id": rec.headers["Nats-Msg-Id"],
                "notice_token": prod.token,
                "notice_subject": b.notice_subject,
                "producer_id": prod.id,
                "sequence": rec.seq,
                "window_start": b.window_start,
                "window": b.window,
                "release": list(b.release_chunk_keys) or None,
                "end": b.end_of_stream,
                "chunks": [c.key for c in b.chunks] or None,
                "items": [
                    {"key": e["key"], "table": e["table"], "priority": e["priority"],
                     "policy_version": e["policy_version"], "columns": e["columns"]}
                    for e in exp
                ]
                or None,
            }
        )
    assert items_seen == len(expect)
    return msgs


def _semantic(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A message without its bytes (which depend on the zstd library's
    version)."""
    return [{k: v for k, v in m.items() if k != "data"} for m in msgs]


def test_python_vectors() -> None:
    msgs = python_vectors()
    path = GOLDEN / "python_insert_batches.json"
    if os.environ.get("REPRISE_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(msgs, indent=1) + "\n")
    stored = json.loads(path.read_text())
    assert _semantic(stored) == _semantic(msgs), "regenerate with scripts/test.sh --update-golden"
    # The stored bytes decode to what they claim.
    for m in stored:
        b = pb.InsertBatch.FromString(b64(m["data"]))
        assert m["msg_id"] == msg_id(b.producer_id, b.sequence)
        assert m["window_start"] <= b.sequence < m["window_start"] + m["window"]
    assert any(m["end"] for m in stored) and any(m["release"] for m in stored)
    assert {m["items"][0]["table"] for m in stored if m["items"]} >= {"replay", "dtypes"}


def test_notice_token_and_ids() -> None:
    pid = reprise._writer.new_producer_id()
    assert len(pid) == 32 and int(pid, 16) >= 0 and pid == pid.lower()
    # A fixed vector: sha256("reprise-notice:" + id)[:32].
    assert notice_token("0" * 32) == __import__("hashlib").sha256(b"reprise-notice:" + b"0" * 32).hexdigest()[:32]
    assert msg_id(pid, 3) == pid + "-3"


def test_sample_response_parts_are_joined_before_decoding() -> None:
    # parse_response takes whole replies; a truncated one is a clear error.
    data = b64(RESPONSES[0]["response"])
    with pytest.raises(reprise.ProtocolError):
        _sample.parse_response(data[: len(data) // 2])
