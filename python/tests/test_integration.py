"""Against a real reprised process: Go producer -> Python sampler, Python
writer -> Go client, Python -> Python, rate limiting, flow control,
reconnects, dedupe and kill -9."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from typing import Any

import numpy as np
import pytest

import reprise
from reprise import _codec, aio

from conftest import Reprised, gohelper, in_thread, wait_for


def write_xs(c: reprise.Client, table: str, n: int) -> None:
    """n one-step items of column x (0 to n-1), applied."""
    with c.trajectory_writer(1) as w:
        for i in range(n):
            w.append({"x": np.int64(i)})
            w.create_item(table, 1.0, {"x": w.history["x"][-1]})
        w.wait_applied(timeout=30)


def table_size(c: reprise.Client, table: str) -> int:
    return c.server_info(timeout=5)[table].current_size


def check_go_items(batch: reprise.SampleBatch, length: int) -> None:
    """Items of the Go producer: `length` consecutive steps of one episode
    with obs = [e, t, e*1000+t, -t], action = e*1000+t, frame = (e+t)%256."""
    obs, action, frame = batch.data["obs"], batch.data["action"], batch.data["frame"]
    b = len(batch)
    assert obs.shape == (b, length, 4) and obs.dtype == np.float32
    assert action.shape == (b, length) and action.dtype == np.int64
    assert frame.shape == (b, length, 4, 4) and frame.dtype == np.uint8
    e, t = obs[:, :, 0].astype(np.int64), obs[:, :, 1].astype(np.int64)
    assert (e == e[:, :1]).all(), "an item spans episodes"
    assert (np.diff(t, axis=1) == 1).all(), "steps are not consecutive"
    np.testing.assert_array_equal(obs[:, :, 2], e * 1000 + t)
    np.testing.assert_array_equal(obs[:, :, 3], -t)
    np.testing.assert_array_equal(action, e * 1000 + t)
    np.testing.assert_array_equal(frame, np.broadcast_to(((e + t) % 256).astype(np.uint8)[:, :, None, None], frame.shape))


@pytest.mark.parametrize("compression,delta", [("zstd", True), ("none", False), ("zstd", False)])
def test_go_producer_to_python_sampler(
    reprised_factory: Any, binaries: Any, compression: str, delta: bool
) -> None:
    r = reprised_factory()
    out = gohelper(binaries, "produce", "--nats", r.url, "--table", "replay", "--episodes", "4", "--steps", "20",
                   "--length", "3", "--chunk-length", "4", "--compression", compression, f"--delta={str(delta).lower()}")
    assert json.loads(out) == {"items": 4 * 18}
    with reprise.Client(r.url) as c:
        assert table_size(c, "replay") == 72
        check_go_items(c.sample_batch("replay", 64, timeout=5), 3)
        with c.sampler("replay", 32, prefetch=3) as s:
            for _, batch in zip(range(5), s):
                check_go_items(batch, 3)
        for smp in c.sample("replay", 5):
            assert smp.data["obs"].shape == (3, 4)
            assert smp.info.table_size == 72 and smp.info.probability == pytest.approx(1 / 72)


def test_go_s2_chunks_name_the_option(reprised_factory: Any, binaries: Any) -> None:
    r = reprised_factory()
    gohelper(binaries, "produce", "--nats", r.url, "--episodes", "1", "--steps", "5", "--compression", "s2")
    with reprise.Client(r.url) as c:
        with pytest.raises(reprise.UnsupportedCodecError, match="WithCompression"):
            c.sample_batch("replay", 4, timeout=5)


def steps_for(marker: int, n: int) -> list[dict[str, Any]]:
    return [
        {
            "obs": np.array([marker, t, marker * 0.5, -t], dtype=np.float32),
            "action": np.int64(marker * 100 + t),
            "img": np.full((3, 2), (marker + t) % 256, dtype=np.uint8),
            "id": np.int32(marker),
        }
        for t in range(n)
    ]


def test_python_writer_to_go_client(client: reprise.Client, server: Reprised, binaries: Any) -> None:
    client.reset("dtypes")
    written: dict[int, dict[str, np.ndarray]] = {}
    with client.trajectory_writer(num_keep_alive_refs=4, chunk_length=3) as w:
        for ep in range(5):
            steps = steps_for(ep, 6)
            for t, s in enumerate(steps):
                w.append(s)
                if t >= 1:
                    w.create_item("dtypes", 0.5 + t, {
                        "obs": w.history["obs"][-2:],
                        "action": w.history["action"][-2:],
                        "img": w.history["img"][-1],
                        "id": w.history["id"][-1],
                    })
                    written[ep * 100 + t] = {
                        "obs": np.stack([steps[t - 1]["obs"], s["obs"]]),
                        "action": np.array([steps[t - 1]["action"], s["action"]]),
                        "img": s["img"],
                        "id": np.array(ep, np.int32),
                    }
            w.end_episode()
        w.wait_applied(timeout=30)
    assert table_size(client, "dtypes") == len(written) == 25
    out = json.loads(gohelper(binaries, "consume", "--nats", server.url, "--table", "dtypes", "--distinct", "25"))
    assert len(out) == 25
    for it in out:
        cols = {
            name: np.frombuffer(base64.b64decode(t["raw"] or ""), _codec.DTYPES[t["dtype"]]).reshape(t["shape"] or ())
            for name, t in it["columns"].items()
        }
        assert it["order"] == ["obs", "action", "img", "id"]
        ep, t = int(cols["id"]), int(cols["action"][-1]) % 100
        want = written[ep * 100 + t]
        assert it["priority"] == 0.5 + t
        for name, a in want.items():
            assert cols[name].dtype == a.dtype and cols[name].shape == a.shape, name
            np.testing.assert_array_equal(cols[name], a)


def test_python_to_python_every_dtype(client: reprise.Client) -> None:
    client.reset("dtypes")
    rng = np.random.default_rng(1)
    step: dict[str, np.ndarray] = {}
    for name, dt in _codec.DTYPES.items():
        if name == "bool":
            step[name] = rng.integers(0, 2, (2, 3)).astype(dt)
        elif np.issubdtype(dt, np.integer):
            info = np.iinfo(dt)
            step[name] = rng.integers(info.min, info.max, (2, 3), dtype=dt, endpoint=True)
        else:
            step[name] = rng.standard_normal((2, 3)).astype(dt)
    step["float32"][0, 0] = np.nan
    step["scalar"] = np.float64(3.25)
    steps = []
    with client.trajectory_writer(2, chunk_length=2) as w:
        for k in range(4):
            st = {n: (a if n == "bool" else (a + k).astype(np.asarray(a).dtype)) for n, a in step.items()}
            st["k"] = np.int64(k)
            steps.append(st)
            w.append(st)
            if k >= 1:
                w.create_item("dtypes", 1.0, {n: w.history[n][-2:] for n in st})
        w.wait_applied(timeout=30)
    batch = client.sample_batch("dtypes", 16, timeout=5)
    ks = batch.data["k"][:, 1]
    for n in steps[0]:
        got = batch.data[n]
        assert got.dtype == np.asarray(steps[0][n]).dtype and got.shape == (16, 2, *np.shape(steps[0][n])), n
        want = np.stack([np.stack([steps[k - 1][n], steps[k][n]]) for k in ks])
        assert got.tobytes() == want.tobytes(), n  # bit for bit, NaN included
    for s in client.sample("dtypes", 3):
        k = int(s.data["k"][1])
        for n in steps[0]:
            assert s.data[n].tobytes() == np.stack([steps[k - 1][n], steps[k][n]]).tobytes()


def test_a_partial_step_is_checked_and_copied_when_given(client: reprise.Client) -> None:
    """An env may refill its observation buffer before it finishes the
    step, and a bad cell is reported where it was given; a finishing
    append that fails keeps the step's earlier columns for the retry."""
    client.reset("dtypes")
    obs = np.zeros(3, dtype=np.float32)
    with client.trajectory_writer(2) as w:
        w.append({"obs": obs}, partial_step=True)
        obs[:] = 7.0
        with pytest.raises(reprise.InvalidArgumentError, match="'note'"):
            w.append({"note": "left"}, partial_step=True)
        with pytest.raises(reprise.InvalidArgumentError, match="'obs' was already given"):
            w.append({"obs": obs}, partial_step=True)
        with pytest.raises(reprise.InvalidArgumentError, match="'act'"):
            w.append({"act": "left"})
        w.append({"act": np.int64(1)})
        w.append({"obs": obs, "act": np.int64(2)})
        w.create_item("dtypes", 1.0, {"obs": w.history["obs"][-2:], "act": w.history["act"][-2:]})
        w.wait_applied(timeout=30)
    b = client.sample_batch("dtypes", 1, timeout=5)
    np.testing.assert_array_equal(b.data["obs"][0], [[0, 0, 0], [7, 7, 7]])
    np.testing.assert_array_equal(b.data["act"][0], [1, 2])


def test_a_squeezed_scalar_column_is_a_0d_array(client: reprise.Client) -> None:
    """sample() maps columns to arrays, a squeezed column of scalar steps
    included, whether the reply's items stack into a batch or not."""
    client.reset("dtypes")
    with client.trajectory_writer(2) as w:
        for k in range(2):
            w.append({"k": np.int64(k)})
        w.create_item("dtypes", 1.0, {"k": w.history["k"][-1]})
        w.wait_applied(timeout=30)
        for s in client.sample("dtypes", 4, timeout=5):
            assert isinstance(s.data["k"], np.ndarray) and s.data["k"].shape == () and int(s.data["k"]) == 1
        w.create_item("dtypes", 1.0, {"k": w.history["k"][-2:]})  # items of two layouts: decoded one by one
        w.wait_applied(timeout=30)
    squeezed = [s.data["k"] for s in client.sample("dtypes", 32, timeout=5) if s.data["k"].shape == ()]
    assert squeezed, "no squeezed item among 32 samples of 2"
    assert all(isinstance(k, np.ndarray) and int(k) == 1 for k in squeezed)


def test_signature_mismatch_before_sending(client: reprise.Client) -> None:
    before = client.server_info()["sig"].num_inserts
    with client.trajectory_writer(3) as w:
        w.append({"obs": np.zeros(4, np.float32), "action": np.int64(1)})
        w.create_item("sig", 1.0, {"obs": w.history["obs"][-1:], "action": w.history["action"][-1:]})
    # The call above matched; now a real mismatch.
    with client.trajectory_writer(3) as w:
        w.append({"obs": np.zeros(4, np.float32), "action": np.int32(1)})
        with pytest.raises(reprise.SignatureMismatchError, match="dtype int32"):
            w.create_item("sig", 1.0, {"obs": w.history["obs"][-1:], "action": w.history["action"][-1:]})
        with pytest.raises(reprise.SignatureMismatchError, match="shape"):
            w.create_item("sig", 1.0, {"obs": w.history["obs"][-1], "action": w.history["action"][-1:]})
        with pytest.raises(reprise.SignatureMismatchError, match="columns"):
            w.create_item("sig", 1.0, {"obs": w.history["obs"][-1:]})
        with pytest.raises(reprise.NotFoundError, match="unknown table"):
            w.create_item("no-such-table", 1.0, {"obs": w.history["obs"][-1:]})
        with pytest.raises(reprise.SignatureMismatchError, match="'obs'"):
            w.append({"obs": np.zeros(5, np.float32), "action": np.int32(1)})
    wait_for("the matching item", lambda: client.server_info()["sig"].num_inserts == before + 1)


def test_a_tables_first_item_reads_its_picks_once(server: Reprised) -> None:
    """The first item for a table waits for the client to learn the table's
    signature and checks its picks both before and after: picks given as a
    one-shot iterable are read once all the same. A priority is read
    outside the writer's lock."""
    with reprise.Client(server.url) as other:
        before = other.server_info()["sig"].num_inserts
    with reprise.Client(server.url) as c, c.trajectory_writer(3) as w:
        w.append({"obs": np.zeros(4, np.float32), "action": np.int64(1)})
        w.create_item("sig", 1.0, (w.history[n][-1:] for n in ("obs", "action")))

        class Priority:
            """A priority whose float may take long (a tensor's waits for
            its device): it is read before the writer's lock is taken."""

            locked: list[bool] = []

            def __float__(self) -> float:
                self.locked.append(w._p.mu.locked())
                return 2.0

        w.create_item("sig", Priority(), [w.history[n][-1:] for n in ("obs", "action")])  # type: ignore[arg-type]
        assert Priority.locked == [False]
        w.wait_applied(timeout=30)
        assert c.server_info()["sig"].num_inserts == before + 2


def test_rejection_reaches_the_writer(client: reprise.Client) -> None:
    with client.trajectory_writer(3, validate_signatures=False) as w:
        w.append({"obs": np.zeros(3, np.float32)})
        w.create_item("sig", 1.0, {"obs": w.history["obs"][-1:]})
        with pytest.raises(reprise.RejectedError) as e:
            w.wait_applied(timeout=30)
        assert isinstance(e.value, reprise.InvalidArgumentError)  # the code's class too
        assert e.value.table == "sig" and e.value.item_key != 0
        with pytest.raises(reprise.RejectedError, match="unknown table"):
            w.create_item("no-such-table", 1.0, {"obs": w.history["obs"][-1:]})
            w.wait_applied(timeout=30)


@pytest.mark.parametrize("use_async", [False, True])
def test_sampler_with_a_timeout_does_not_end_when_the_service_dies(reprised_factory: Any, use_async: bool) -> None:
    """A sampler with a timeout (Reverb's rate_limiter_timeout_ms) ends
    only when the rate limiter allows nothing in time. Once the service
    (reprised with its NATS) was killed, the client's own deadline passed
    too, and its iteration ended as if the table were exhausted: a
    training loop stopped as if done. It raises once it gave up waiting."""
    r = reprised_factory()
    with reprise.Client(r.url) as c:
        write_xs(c, "replay", 8)

    async def drain_async() -> None:
        async with aio.Client(r.url) as ac:
            it = ac.sampler("replay", 2, timeout=1.0, retry_unavailable_for=2.0)
            try:
                await it.__anext__()
                r.kill9()
                with pytest.raises(reprise.RepriseError):
                    for _ in range(1000):
                        await it.__anext__()
            finally:
                await it.aclose()

    if use_async:
        asyncio.run(drain_async())
        return
    with reprise.Client(r.url) as c:
        it = c.sampler("replay", 2, timeout=1.0, retry_unavailable_for=2.0)
        next(it)
        r.kill9()
        with pytest.raises(reprise.RepriseError):
            for _ in range(1000):
                next(it)


def test_sampler_refuses_a_timeout_without_time(client: reprise.Client, server: Reprised) -> None:
    """A sampler's timeout of 0 or less is refused, naming it: no request is
    sent without time for its reply, and such a sampler's iteration ended
    before any request, however many items the table held; since the
    samplers retried what was not sent, it raised after
    retry_unavailable_for instead."""
    with pytest.raises(reprise.InvalidArgumentError, match="timeout must be > 0"):
        client.sampler("replay", 2, timeout=0)

    async def main() -> None:
        async with aio.Client(server.url) as c:
            with pytest.raises(reprise.InvalidArgumentError, match="timeout must be > 0"):
                c.sampler("replay", 2, timeout=-1.0)

    asyncio.run(main())


def test_a_delete_of_more_keys_than_the_service_takes_at_once(client: reprise.Client) -> None:
    """A mutation of more ops than the service's limits.max_mutation_ops
    (65,536) is sent in parts: at 8 MiB of max payload it went as one
    message, which the service refused whole, and the call returned as if
    applied."""
    client.reset("replay")
    write_xs(client, "replay", 3)
    held = np.unique(client.sample_batch("replay", 64, timeout=10).info.key)
    assert len(held) == 3
    per = aio._ops_per_message("replay", 8 << 20, aio.MAX_MUTATION_OPS)
    assert len(aio.mutation_messages("replay", aio.mutation_ops(None, range(70_000)), per)) == 2, (
        "split at the service's limit, not only at the max payload"
    )
    keys = np.concatenate([np.arange(1 << 40, (1 << 40) + 70_000 - 3, dtype=np.uint64), held])
    client.mutate_priorities("replay", deletes=keys, timeout=30)
    assert table_size(client, "replay") == 0


def test_rate_limited_sample_raises(client: reprise.Client) -> None:
    client.reset("limited")
    t0 = time.monotonic()
    with pytest.raises(reprise.RateLimitedError, match="rate limiter"):
        client.sample_batch("limited", 1, timeout=0.5)
    assert time.monotonic() - t0 < 5
    assert isinstance(reprise.RateLimitedError("x"), TimeoutError)
    # A sampler with a timeout ends instead of hanging, as Reverb's does.
    assert list(client.sampler("limited", 2, timeout=0.3)) == []
    # A blocked request is served once inserts arrive.
    result: dict[str, Any] = {}

    def sample() -> None:
        try:
            result["batch"] = client.sample_batch("limited", 2, timeout=30)
        except Exception as e:  # noqa: BLE001
            result["error"] = e

    th = threading.Thread(target=sample)
    th.start()
    for i in range(5):
        client.insert({"x": np.int64(i)}, {"limited": 1.0})
    th.join(30)
    assert "batch" in result, result
    assert result["batch"].data["x"].shape == (2,)


def test_unknown_table_and_bad_arguments(client: reprise.Client) -> None:
    with pytest.raises(reprise.NotFoundError, match="nope"):
        client.sample_batch("nope", 1, timeout=2)
    with pytest.raises(reprise.NotFoundError):
        client.reset("nope")
    with pytest.raises(reprise.InvalidArgumentError):
        client.mutate_priorities("replay", {1: float("nan")})
    with pytest.raises(reprise.InvalidArgumentError):
        client.update_priorities("replay", [1, 2], [0.5])
    # Keys are uint64 on the wire: one outside is named, not a numpy or
    # protobuf error.
    for call in (
        lambda: client.mutate_priorities("replay", {-1: 1.0}),
        lambda: client.mutate_priorities("replay", {1 << 64: 1.0}),
        lambda: client.mutate_priorities("replay", deletes=[-1]),
        lambda: client.update_priorities("replay", [-1], [1.0]),
        lambda: client.update_priorities("replay", np.array([3, -2]), [1.0, 1.0]),
        lambda: client.update_priorities("replay", [1 << 64], [1.0]),
        lambda: client.update_priorities("replay", np.array([1.5]), [1.0]),
        lambda: client.update_priorities("replay", np.array([1e30]), [1.0]),
    ):
        with pytest.raises(reprise.InvalidArgumentError, match="2\\*\\*64-1"):
            call()


def test_priorities_deletes_reset_info_checkpoint(client: reprise.Client) -> None:
    client.reset("replay")
    write_xs(client, "replay", 10)
    batch = client.sample_batch("replay", 10, timeout=5)
    keys = np.unique(batch.info.key)
    client.update_priorities("replay", keys, np.full(len(keys), 7.5))
    wait_for("priorities", lambda: all(s.info.priority == 7.5 for s in client.sample("replay", 10) if s.info.key in set(keys.tolist())))
    client.mutate_priorities("replay", deletes=keys[:2].tolist())
    wait_for("deletes", lambda: table_size(client, "replay") == 8)
    info = client.server_info()
    t = info["replay"]
    assert (t.sampler, t.remover, t.max_size) == ("uniform", "fifo", 1000000)
    assert t.rate_limiter_info.min_size_to_sample == 1 and t.limiter.inserts == 10
    assert info["sig"].signature[0] == reprise.ColumnSpec("obs", "float32", (-1, 4))
    cp = client.checkpoint()
    assert cp.name and cp.applied_sequence > 0
    client.reset("replay")
    assert table_size(client, "replay") == 0


def test_sample_reply_in_parts(reprised_factory: Any) -> None:
    r = reprised_factory(extra=["--max-payload", "65536"])
    with reprise.Client(r.url) as c:
        with c.trajectory_writer(1, compression="none") as w:
            for i in range(40):
                w.append({"x": np.full(2000, i, np.float32)})  # 8 kB each
                w.create_item("replay", 1.0, {"x": w.history["x"][-1]})
            w.wait_applied(timeout=30)
        batch = c.sample_batch("replay", 40, timeout=5)  # ~320 kB: 5+ parts
        assert batch.data["x"].shape == (40, 2000)
        assert (batch.data["x"] == batch.data["x"][:, :1]).all()


def test_writer_blocks_while_inserts_are_held_then_resumes(reprised_factory: Any) -> None:
    tables = """
tables:
  - name: queue
    max_size: 4
    rate_limiter: {preset: queue}
"""
    r = reprised_factory(tables)
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(1, max_unapplied=2, linger=0.0)
        for i in range(8):
            if i == 6:
                break
            w.append({"x": np.int64(i)})
            w.create_item("queue", 1.0, {"x": w.history["x"][-1]})
        # The queue holds 4; the 5th waits in the service; the window of 2
        # unapplied items is full: the writer cannot finish.
        with pytest.raises(reprise.DeadlineExceededError, match="not applied|awaiting|published"):
            w.wait_applied(timeout=1.0)
        got = [int(x) for _ in range(6) for x in c.sample_batch("queue", 1, timeout=10).data["x"]]
        assert got == list(range(6)), "a queue returns every item once, in order"
        w.wait_applied(timeout=10)
        w.close()


def test_close_reports_the_staged_items_it_gives_up_on(reprised_factory: Any) -> None:
    """A close that runs out of time while the window is full (an item held
    by a full queue) drops the items still staged, and says so with a
    NotStoredError, as for a message given up: except (RejectedError,
    NotStoredError) catches every loss."""
    tables = """
tables:
  - name: queue
    max_size: 1
    rate_limiter: {preset: queue}
"""
    r = reprised_factory(tables)
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(1, max_unapplied=1, batch_items=10, linger=30.0)
        for i in range(2):
            w.append({"x": np.int64(i)})
            w.create_item("queue", 1.0, {"x": w.history["x"][-1]})
            if i == 0:
                w.wait_applied(timeout=30)
        with pytest.raises(reprise.DeadlineExceededError):
            w.wait_applied(timeout=0.5)  # item 1 is held: the window is full
        w.append({"x": np.int64(2)})
        w.create_item("queue", 1.0, {"x": w.history["x"][-1]})  # staged
        with pytest.raises(reprise.NotStoredError, match="1 items never published") as e:
            w.close(timeout=0.5)
        assert isinstance(e.value, reprise.ClosedError)


def test_a_call_with_no_time_left_sends_nothing(reprised_factory: Any) -> None:
    """The service acts on a request whatever becomes of its caller: a
    sample with timeout 0 that was sent would take a queue's items, and the
    call could not wait for them. As in Go, it is not sent."""
    tables = """
tables:
  - {name: q, max_size: 100, sampler: fifo, remover: fifo, max_times_sampled: 1}
"""
    r = reprised_factory(tables)
    with reprise.Client(r.url) as c:
        write_xs(c, "q", 4)
        for call in (lambda: c.sample_batch("q", 2, timeout=0), lambda: list(c.sample("q", 2, timeout=0)),
                     lambda: c.reset("q", timeout=0), lambda: c.reset("q", timeout=-1)):
            with pytest.raises(reprise.DeadlineExceededError, match="not sending"):
                call()
        assert table_size(c, "q") == 4
        got = c.sample_batch("q", 4, timeout=10).data["x"].tolist()
        assert got == [0, 1, 2, 3]


def test_retries_never_insert_twice(reprised_factory: Any) -> None:
    """An ack timeout far below the round trip makes every message be sent
    several times: JetStream drops the copies (same dedupe id)."""
    r = reprised_factory()
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(1, ack_timeout=0.0005, batch_items=5)
        for i in range(50):
            w.append({"x": np.int64(i)})
            w.create_item("replay", 1.0, {"x": w.history["x"][-1]})
        w.wait_applied(timeout=60)
        w.close()
        info = c.server_info()["replay"]
        assert info.current_size == 50 and info.num_inserts == 50


def test_duplicate_ack_for_a_message_sent_once_is_an_error(reprised_factory: Any) -> None:
    r = reprised_factory()
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(1)
        # Someone else publishes with the writer's next dedupe id first.
        c._lt.call(c._aclient.nats.request(
            "reprise.data.insert", b"", headers={"Nats-Msg-Id": f"{w.producer_id}-1"}, timeout=5))
        w.append({"x": np.int64(1)})
        w.create_item("replay", 1.0, {"x": w.history["x"][-1]})
        with pytest.raises(reprise.DuplicateIdError, match="sent once") as e:
            w.flush(timeout=10)
        # Lost, as the Go producer says: a rejection of the whole message.
        assert isinstance(e.value, reprise.RejectedError) and isinstance(e.value, reprise.NotStoredError)
        assert (e.value.sequence, e.value.items, e.value.item_key, e.value.rejections) == (1, 1, 0, [e.value])
        w.close()


def test_a_message_given_up_is_not_stored(server: Any) -> None:
    """A message JetStream does not store within the writer's retry_for
    (no stream answers on the prefix) is reported as lost: a
    NotStoredError that is also the class of its last failure."""
    with reprise.Client(server.url, prefix="nobody") as c:
        w = c.trajectory_writer(1, validate_signatures=False, retry_for=0.3, return_on_store=True)
        w.append({"x": np.int64(1)})
        w.create_item("t", 1.0, {"x": w.history["x"][-1]})
        with pytest.raises(reprise.NotStoredError, match="message 1 \\(1 items\\) not stored: no JetStream stream") as e:
            w.flush(timeout=30)
        assert isinstance(e.value, reprise.UnavailableError)
        assert (e.value.sequence, e.value.items) == (1, 1)
        with pytest.raises(reprise.NotStoredError, match="message 2 \\(0 items\\)"):
            w.close()  # the release of its chunks


def test_messages_given_up_in_an_outage_end_the_flush(server: Any) -> None:
    """When no stream takes anything for longer than retry_for, every
    message in flight is given up on; none was stored, so none waits in
    the service behind them, and the gap fills sent meanwhile are not
    replaced once they fail too: flush reports the loss rather than wait
    out its timeout."""
    with reprise.Client(server.url, prefix="nobody") as c:
        w = c.trajectory_writer(1, validate_signatures=False, retry_for=0.3, batch_items=1, linger=30.0)
        for i in range(2):
            w.append({"x": np.int64(i)})
            w.create_item("t", 1.0, {"x": w.history["x"][-1]})
        with pytest.raises(reprise.NotStoredError, match="message 2 \\(1 items\\)"):
            w.flush(timeout=30)
        with pytest.raises(reprise.NotStoredError):
            w.close(timeout=5)


def test_client_reconnects_after_reprised_restarts(reprised_factory: Any) -> None:
    r = reprised_factory()
    with reprise.Client(r.url) as c:
        c.insert({"x": np.int64(1)}, {"replay": 1.0})
        assert len(c.sample_batch("replay", 1, timeout=5)) == 1
        r.stop()
        with pytest.raises((reprise.UnavailableError, reprise.DeadlineExceededError)):
            c.sample_batch("replay", 1, timeout=1)
        r.start(wait=False)
        # The same client, without reconnecting by hand.
        batch = wait_for("a sample after the restart", lambda: c.sample_batch("replay", 1, timeout=2), 60)
        assert int(batch.data["x"][0]) == 1
        c.insert({"x": np.int64(2)}, {"replay": 1.0})
        wait_for("the new insert", lambda: table_size(c, "replay") == 2)
        # A sampler rides out a restart too.
        with c.sampler("replay", 2, prefetch=2) as s:
            next(s)
            r.stop()
            r.start(wait=False)
            for _ in range(3):
                assert len(next(s)) == 2


@pytest.mark.parametrize("prefetch", [1, 3])
def test_a_sampler_keeps_prefetch_requests_ahead_of_the_caller(reprised_factory: Any, prefetch: int) -> None:
    """A queue's sampler hands out its items, none twice, while it keeps
    exactly prefetch requests not yet taken, in order with one in flight.
    With prefetch 1 the event loop's thread sends the replacement as the
    reply lands, and the caller must not send another."""
    r = reprised_factory(
        "tables:\n  - {name: q, max_size: 1000, sampler: fifo, remover: fifo, max_times_sampled: 1}\n"
    )
    with reprise.Client(r.url) as c:
        with c.trajectory_writer(1) as w:
            for i in range(200):
                w.append({"x": np.int64(i)})
                w.create_item("q", 1.0, {"x": w.history["x"][-1]})
            w.flush(timeout=30)
        firsts = []
        with c.sampler("q", 4, prefetch=prefetch, timeout=10) as s:
            senders: list[str] = []
            submit = c._lt.submit

            def counted(coro: Any) -> Any:
                senders.append(threading.current_thread().name)
                return submit(coro)

            c._lt.submit = counted  # type: ignore[method-assign]
            for k in range(20):
                x = next(s).data["x"].tolist()
                # A request takes the queue's next 4 items at once; requests
                # in flight together are served in any order.
                assert x[0] % 4 == 0 and x == list(range(x[0], x[0] + 4)), f"batch {k}: {x}"
                firsts.append(x[0])
                with s._lock:
                    assert len(s._futs) == prefetch, f"after batch {k}"
            wait_for("the requests in flight to be served", lambda: table_size(c, "q") == 200 - 4 * (20 + prefetch))
        assert len(set(firsts)) == 20 and max(firsts) < 4 * (20 + prefetch)
        from_loop = sum(name == "reprise-client" for name in senders)
        if prefetch == 1:
            assert firsts == list(range(0, 80, 4))
            # A reply can land before the caller waits for it; most do not.
            assert from_loop >= 10, senders
        else:
            assert from_loop == 0, senders


def test_kill9_during_writes_loses_no_flushed_item(reprised_factory: Any) -> None:
    r = reprised_factory()
    total = 1500
    flushed = 0
    killed_at: list[int] = []
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(1, batch_items=16)

        def killer() -> None:
            wait_for("some flushed items", lambda: flushed >= 300, 60)
            r.kill9()
            killed_at.append(flushed)
            time.sleep(0.3)
            r.start(wait=False)

        th = threading.Thread(target=killer)
        th.start()
        for i in range(total):
            w.append({"x": np.int64(i), "payload": np.full(64, i, np.float32)})
            w.create_item("replay", 1.0, {"x": w.history["x"][-1], "payload": w.history["payload"][-1]})
            if i % 25 == 24:
                w.flush(timeout=120)
                flushed = i + 1
        w.flush(timeout=120)
        th.join(60)
        assert killed_at and killed_at[0] < total, "reprised was not killed during the writes"
        r.wait_ready()
        w.wait_applied(timeout=120)
        w.close()
        # Every item whose flush returned survived, and the writer's resends
        # after the restart added each missing one exactly once.
        wait_for("every item applied", lambda: table_size(c, "replay") == total, 60)
        info = c.server_info()["replay"]
        assert info.current_size == total
        seen = set()
        for _ in range(40):
            b = c.sample_batch("replay", 256, timeout=10)
            np.testing.assert_array_equal(b.data["payload"][:, 0], b.data["x"].astype(np.float32))
            seen.update(b.data["x"].tolist())
        assert seen <= set(range(total)) and len(seen) > total * 0.9


def test_user_and_password(binaries: Any, tmp_path: Any) -> None:
    """The connection options reach a NATS server that demands a user:
    reprised and the Python client both log in with user and password."""
    import subprocess

    from conftest import DEFAULT_TABLES, free_port

    port = free_port()
    srv = subprocess.Popen(
        [str(binaries["gohelper"]), "auth-server", "--listen", f"127.0.0.1:{port}", "--store", str(tmp_path / "js"),
         "--user", "actor", "--password", "s3cret"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    procs = [srv]
    try:
        assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
        cfg = tmp_path / "reprise.yaml"
        cfg.write_text(DEFAULT_TABLES)
        rp = subprocess.Popen(
            [str(binaries["reprised"]), "--config", str(cfg), "--nats", f"nats://actor:s3cret@127.0.0.1:{port}",
             "--checkpoint-every", "0s", "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        procs.append(rp)
        url = f"nats://127.0.0.1:{port}"
        with pytest.raises(reprise.UnavailableError):
            reprise.Client(url, user="actor", password="wrong", connect_timeout=1)

        def ready() -> bool:
            with reprise.Client(url, user="actor", password="s3cret", connect_timeout=2) as c:
                c.server_info(timeout=2)
            return True

        wait_for("reprised behind a password", ready, 60)
        with reprise.Client(url, user="actor", password="s3cret") as c:
            c.insert({"x": np.int64(5)}, {"replay": 1.0})
            assert int(c.sample_batch("replay", 1, timeout=5).data["x"][0]) == 5
    finally:
        for p in reversed(procs):
            p.kill()
            p.wait()


def test_permission_violations_parsed() -> None:
    """Both spellings servers use, for publish and subscribe; other errors
    are not permission denials."""
    from reprise._conn import permission_denied

    e = permission_denied(Exception('nats: permissions violation for publish to "rl.api.sample"'), "bob")
    assert e is not None and (e.operation, e.subject) == ("publish", "rl.api.sample") and "'bob'" in e.message
    e = permission_denied(Exception("nats: 'Permissions Violation for Subscription to \"_INBOX.x.*\"'"), None)
    assert e is not None and (e.operation, e.subject) == ("subscribe", "_INBOX.x.*")
    assert permission_denied(Exception("nats: stale connection"), "bob") is None


def test_roles_on_embedded_server(binaries: Any, tmp_path: Any) -> None:
    """With users on reprised's embedded server, a Python actor and a Python
    learner each work within their role: their replies reach them in their
    own ``_INBOX.<user>``, the only inbox a role may read. (The Go tests
    check what each role is refused.)"""
    from conftest import DEFAULT_TABLES, Reprised

    # Items over 64 bytes give the actor a rejection only the service sends.
    r = Reprised(binaries["reprised"], tmp_path, DEFAULT_TABLES + "limits:\n  max_item_bytes: 64\n",
                 ["--embedded-user", "actor:bob:s3cret", "--embedded-user", "learner:alice:s3cret"])
    r.start(wait=False)
    try:
        r.wait_ready(user="alice", password="s3cret")
        with reprise.Client(r.url, user="bob", password="s3cret") as actor:
            for x in range(5):
                actor.insert({"x": np.int64(x)}, {"replay": 1.0})
            # Rejections reach the actor in its own inbox.
            with actor.trajectory_writer() as w:
                w.append({"x": np.zeros(100, np.uint8)})
                w.create_item("replay", 1.0, {"x": w.history["x"][-1:]})
                with pytest.raises(reprise.RejectedError, match="max_item_bytes"):
                    w.wait_applied(timeout=30)
            # What the role does not allow fails at once, naming the subject,
            # instead of waiting out the timeout.
            with pytest.raises(reprise.PermissionDeniedError) as e:
                actor.sample_batch("replay", 4, timeout=60)
            assert e.value.operation == "publish" and e.value.subject.endswith(".api.sample")
            assert "'bob'" in str(e.value)
        with reprise.Client(r.url, user="alice", password="s3cret") as learner:
            wait_for("the actor's items", lambda: learner.server_info(timeout=2)["replay"].current_size == 5, 30)
            got = set(learner.sample_batch("replay", 64, timeout=5).data["x"].tolist())
            assert got <= set(range(5)) and got
            with pytest.raises(reprise.PermissionDeniedError) as e:
                learner.insert({"x": np.int64(1)}, {"replay": 1.0}, timeout=60)
            assert e.value.subject.endswith(".data.insert")
            assert learner.sample_batch("replay", 4, timeout=5).data["x"].shape == (4,)
    finally:
        r.kill9()


def test_held_table_holds_only_its_writers(binaries: Any, tmp_path: Any) -> None:
    """A table whose rate limiter holds items does not hold up another
    table: a writer to the free table gets its items applied while the held
    one is full; the held table's writer waits, and its items land in order
    as a learner makes room."""
    from conftest import Reprised

    cfg = """
tables:
  - {name: held, max_size: 2, rate_limiter: {preset: queue}}
  - {name: free, max_size: 1000}
"""
    r = Reprised(binaries["reprised"], tmp_path, cfg)
    r.start()
    try:
        with reprise.Client(r.url) as c:
            blocked = c.trajectory_writer(1, linger=0.0, return_on_store=True)
            for i in range(6):
                blocked.append({"id": np.int64(i)})
                blocked.create_item("held", 1.0, {"id": blocked.history["id"][-1:]})
            blocked.flush(timeout=30)
            with c.trajectory_writer(1, linger=0.0) as free:
                for i in range(10):
                    free.append({"id": np.int64(100 + i)})
                    free.create_item("free", 1.0, {"id": free.history["id"][-1:]})
                free.wait_applied(timeout=30)
            assert c.server_info(timeout=5)["free"].current_size == 10
            with pytest.raises(reprise.DeadlineExceededError):
                blocked.wait_applied(timeout=0.2)  # 4 items wait for the held table
            got = [int(s.data["id"][0]) for _ in range(6) for s in c.sample("held", 1, timeout=30)]
            assert got == list(range(6))
            blocked.wait_applied(timeout=30)
            blocked.close()
    finally:
        r.kill9()


def test_a_wait_raises_rejections_another_call_took(reprised_factory: Any) -> None:
    """wait_applied on one thread raises the rejection of an item that the
    service refused while it waited, even where a call on another thread
    (create_item) raised that rejection first; it returned as if the item
    were in its table."""
    r = reprised_factory(
        "tables:\n  - {name: held, max_size: 1, rate_limiter: {preset: queue}}\n  - {name: t, max_size: 10}\n"
    )
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(1, linger=0.0, batch_items=1, validate_signatures=False)
        p = w._p

        def add(i: int, table: str) -> None:
            w.append({"x": np.int64(i)})
            w.create_item(table, 1.0, {"x": w.history["x"][-1]})

        add(0, "held")
        wait_for("the queue is full", lambda: c.server_info(timeout=5)["held"].current_size == 1)
        add(1, "held")  # held by the queue
        th, waited = in_thread(lambda: w.wait_applied(timeout=30))
        wait_for("wait_applied waits", lambda: len(p.cond._waiters) > 0)  # type: ignore[attr-defined]
        add(2, "nosuch")
        wait_for("the rejection", lambda: p.rejections == 1)
        with pytest.raises(reprise.RejectedError, match="nosuch"):
            add(3, "t")  # raises the earlier message's rejection
        assert [int(s.data["x"]) for s in c.sample("held", 1, timeout=30)] == [0]  # makes room
        th.join(30)
        assert len(waited) == 1 and isinstance(waited[0], reprise.RejectedError), waited
        w.close()


def test_a_wait_that_times_out_raises_what_it_saw(reprised_factory: Any) -> None:
    """A flush or wait_applied that times out raises the rejections seen
    meanwhile beside its DeadlineExceededError, once, as the Go producer's
    Flush returns them beside ErrNotApplied: they were left for a later
    call, and an actor that took the timeout for a slow service and
    carried on learned of them only then; sync and async alike."""
    r = reprised_factory(
        "tables:\n  - {name: held, max_size: 1, rate_limiter: {preset: queue}}\n  - {name: t, max_size: 10}\n"
    )
    options = {"linger": 0.0, "validate_signatures": False}

    def check(e: BaseException, rejected: bool) -> None:
        assert isinstance(e, reprise.DeadlineExceededError), repr(e)
        assert isinstance(e, reprise.RejectedError) == rejected, repr(e)

    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(1, **options)
        p = w._p
        for i, table in enumerate(("held", "held")):  # the queue holds the second
            w.append({"x": np.int64(i)})
            w.create_item(table, 1.0, {"x": w.history["x"][-1]})
        for n, call, rejected in ((1, lambda: w.flush(timeout=0.3), True),
                                  (2, lambda: w.wait_applied(timeout=0.3), True),
                                  (2, lambda: w.flush(timeout=0.3), False)):  # reported once
            if rejected:
                w.append({"x": np.int64(10 + n)})
                w.create_item("nosuch", 1.0, {"x": w.history["x"][-1]})
                wait_for("the rejection", lambda: p.rejections == n)  # noqa: B023 - called at once
            with pytest.raises(reprise.RepriseError) as e:
                call()
            check(e.value, rejected)
        assert [int(s.data["x"]) for s in c.sample("held", 1, timeout=30)] == [0]  # makes room
        w.flush(timeout=30)
        w.close()

    async def main() -> None:
        async with await aio.connect(r.url) as c:
            await c.reset("held")
            w = await c.trajectory_writer(1, **options)
            p = w._p
            assert p is not None
            for i in range(2):
                await w.append({"x": np.int64(i)})
                await w.create_item("held", 1.0, {"x": w.history["x"][-1]})
            for n, call, rejected in ((1, lambda: w.flush(timeout=0.3), True),
                                      (2, lambda: w.wait_applied(timeout=0.3), True),
                                      (2, lambda: w.flush(timeout=0.3), False)):
                if rejected:
                    await w.append({"x": np.int64(10 + n)})
                    await w.create_item("nosuch", 1.0, {"x": w.history["x"][-1]})
                    while p.rejections < n:
                        await asyncio.sleep(0.01)
                with pytest.raises(reprise.RepriseError) as e:
                    await call()
                check(e.value, rejected)
            assert [int(s.data["x"]) for s in await c.sample("held", 1, timeout=30)] == [0]
            await w.flush(timeout=30)
            await w.close()

    asyncio.run(main())


def test_end_episode_ends_it_even_when_the_wait_fails(reprised_factory: Any) -> None:
    """end_episode publishes the items and starts a new episode before it
    waits, as the Go producer does: a wait that times out (a rate limiter
    holding the items) leaves the writer in the new episode, whose steps
    count from 0 and whose items cannot reach back into the old one."""
    r = reprised_factory("tables:\n  - {name: held, max_size: 2, rate_limiter: {preset: queue}}\n")
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(2, linger=0.0)
        for i in range(3):
            w.append({"id": np.int64(i)})
            w.create_item("held", 1.0, {"id": w.history["id"][-1:]})
        with pytest.raises(reprise.DeadlineExceededError):
            w.end_episode(timeout=0.3)  # the third item waits for room
        assert w.episode_steps == 0
        w.append({"id": np.int64(10)})
        assert w.episode_steps == 1 and len(w.history["id"]) == 1
        assert [int(s.data["id"][0]) for s in c.sample("held", 3, timeout=30)] == [0, 1, 2]
        w.close()


def test_a_writers_errors_pickle_and_copy(reprised_factory: Any) -> None:
    """The errors a writer raises pickle, as multiprocessing sends what a
    worker raised, into a process that never made their classes, and
    copy, keeping their kinds and fields: an EpisodeNotEndedError that is
    a DeadlineExceededError too, a rejection of its code's class. Their
    classes, made with type() when first raised, were found by no name:
    pickle raised PicklingError, and a pool's worker reported that in
    place of the error."""
    import copy
    import os
    import pickle
    import subprocess
    import sys

    r = reprised_factory("tables:\n  - {name: held, max_size: 1, rate_limiter: {preset: queue}}\n  - {name: t, max_size: 10}\n")
    raised: list[reprise.RepriseError] = []
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(3, linger=0.0, max_unapplied=1, validate_signatures=False)
        w.append({"id": np.int64(0)})
        w.create_item("held", 1.0, {"id": w.history["id"][-1]})
        w.flush(timeout=30)  # the queue is full
        w.append({"id": np.int64(1)})
        w.create_item("held", 1.0, {"id": w.history["id"][-1]})  # held: the window stays full
        w.create_item("t", 1.0, {"id": w.history["id"][-1]})
        with pytest.raises(reprise.EpisodeNotEndedError) as e:
            w.end_episode(timeout=0.3)
        raised.append(e.value)
        assert [int(s.data["id"]) for s in c.sample("held", 1, timeout=30)] == [0]  # makes room
        w.end_episode(timeout=30)
        w.append({"id": np.int64(2)})
        w.create_item("nosuch", 1.0, {"id": w.history["id"][-1]})
        with pytest.raises(reprise.RejectedError) as e:
            w.flush(timeout=30)
        raised.append(e.value)
        w.close()

    kinds = [k for k in vars(reprise).values() if isinstance(k, type) and issubclass(k, BaseException)]

    def described(errs: list[Any]) -> list[Any]:
        return [(type(e).__name__, sorted(k.__name__ for k in kinds if isinstance(e, k)), e.message,
                 {k: v for k, v in vars(e).items() if k != "rejections"}) for e in errs]

    want = described(raised)
    assert "EpisodeNotEndedError" in want[0][1] and "DeadlineExceededError" in want[0][1], want[0]
    assert "RejectedError" in want[1][1] and "NotFoundError" in want[1][1], want[1]
    assert described([copy.copy(e) for e in raised]) == want
    again = pickle.loads(pickle.dumps(raised))
    assert described(again) == want and [type(e) for e in again] == [type(e) for e in raised]
    # Another process, as multiprocessing's parent, makes the classes anew.
    script = ("import pickle, sys, reprise\n"
              "errs = pickle.loads(sys.stdin.buffer.read())\n"
              "kinds = [k for k in vars(reprise).values() if isinstance(k, type) and issubclass(k, BaseException)]\n"
              "print(repr([(type(e).__name__, sorted(k.__name__ for k in kinds if isinstance(e, k)), e.message,"
              " {k: v for k, v in vars(e).items() if k != 'rejections'}) for e in errs]))\n")
    out = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(raised), capture_output=True, check=True,
                         env={**os.environ, "PYTHONPATH": ":".join(sys.path)})
    assert out.stdout.decode().strip() == repr(want)


def test_an_end_episode_error_says_whether_the_episode_ended(reprised_factory: Any) -> None:
    """An end_episode that times out waiting for room in the window, before
    it published the episode's items, has not ended the episode and raises
    EpisodeNotEndedError (a DeadlineExceededError too); called again once
    the window has room, it ends it. One that ended the episode and then
    timed out waiting for its items raises no EpisodeNotEndedError, and
    called again ends no empty episode. Both raised the same
    DeadlineExceededError, and an actor that took the first for the second
    appended its next episode to the old one. In the sync and the async
    writer alike, as Go's ErrEpisodeNotEnded."""
    r = reprised_factory("tables:\n  - {name: held, max_size: 1, rate_limiter: {preset: queue}}\n  - {name: t, max_size: 10}\n")
    options = {"linger": 0.0, "max_unapplied": 1, "validate_signatures": False}

    def check_not_ended(e: BaseException, w: Any) -> None:
        assert isinstance(e, reprise.EpisodeNotEndedError) and isinstance(e, reprise.DeadlineExceededError), repr(e)
        assert w.episode_steps == 3

    def check_ended(e: BaseException, w: Any) -> int:
        assert isinstance(e, reprise.DeadlineExceededError) and not isinstance(e, reprise.EpisodeNotEndedError), repr(e)
        assert w.episode_steps == 0
        return int(w._p.episode)

    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(3, **options)
        w.append({"id": np.int64(0)})
        w.create_item("held", 1.0, {"id": w.history["id"][-1]})
        w.flush(timeout=30)  # the queue is full
        w.append({"id": np.int64(1)})
        w.create_item("held", 1.0, {"id": w.history["id"][-1]})  # held: the window stays full
        w.append({"id": np.int64(2)})
        w.create_item("t", 1.0, {"id": w.history["id"][-3:]})
        with pytest.raises(reprise.RepriseError) as e:
            w.end_episode(timeout=0.3)
        check_not_ended(e.value, w)
        assert [int(s.data["id"]) for s in c.sample("held", 1, timeout=30)] == [0]  # makes room
        w.end_episode(timeout=30)
        assert w.episode_steps == 0
        assert [s.data["id"].tolist() for s in c.sample("t", 1, timeout=30)] == [[0, 1, 2]]

        w.append({"id": np.int64(3)})
        w.create_item("held", 1.0, {"id": w.history["id"][-1]})  # held
        with pytest.raises(reprise.RepriseError) as e:
            w.end_episode(timeout=0.3)
        episode = check_ended(e.value, w)
        with pytest.raises(reprise.RepriseError) as e:
            w.end_episode(timeout=0.3)
        assert check_ended(e.value, w) == episode, "end_episode called again ended the empty episode"
        assert [int(s.data["id"]) for _ in range(2) for s in c.sample("held", 1, timeout=30)] == [1, 3]
        w.close()

    async def main() -> None:
        async with await aio.connect(r.url) as c:
            w = await c.trajectory_writer(3, **options)
            await w.append({"id": np.int64(0)})
            await w.create_item("held", 1.0, {"id": w.history["id"][-1]})
            await w.flush(timeout=30)
            await w.append({"id": np.int64(1)})
            await w.create_item("held", 1.0, {"id": w.history["id"][-1]})
            await w.append({"id": np.int64(2)})
            await w.create_item("t", 1.0, {"id": w.history["id"][-3:]})
            with pytest.raises(reprise.RepriseError) as e:
                await w.end_episode(timeout=0.3)
            check_not_ended(e.value, w)
            assert [int(s.data["id"]) for s in await c.sample("held", 1, timeout=30)] == [0]
            await w.end_episode(timeout=30)
            assert w.episode_steps == 0
            assert [s.data["id"].tolist() for s in await c.sample("t", 1, timeout=30)] == [[0, 1, 2]]

            await w.append({"id": np.int64(3)})
            await w.create_item("held", 1.0, {"id": w.history["id"][-1]})
            with pytest.raises(reprise.RepriseError) as e:
                await w.end_episode(timeout=0.3)
            episode = check_ended(e.value, w)
            with pytest.raises(reprise.RepriseError) as e:
                await w.end_episode(timeout=0.3)
            assert check_ended(e.value, w) == episode, "end_episode called again ended the empty episode"
            assert [int(s.data["id"]) for _ in range(2) for s in await c.sample("held", 1, timeout=30)] == [1, 3]
            await w.close()

    asyncio.run(main())


def test_an_item_refused_at_once_keeps_earlier_rejections(reprised_factory: Any) -> None:
    """create_item raises the errors of earlier messages before it creates
    its item, and then created nothing; an item it creates and then
    refuses itself (too large for a message) is raised by the next call.
    Neither drops the other."""
    r = reprised_factory("tables:\n  - {name: t, max_size: 10}\n")
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(1, linger=0.0, validate_signatures=False)
        w.append({"x": np.int64(1)})
        w.create_item("nosuch", 1.0, {"x": w.history["x"][-1]})
        wait_for("the rejection of the item for an unknown table", lambda: bool(w._p.errors))
        # Random floats, so that compression does not shrink the step.
        w.append({"big": np.random.default_rng(0).standard_normal(c._aclient._nc.max_payload // 4 + 1).astype(np.float32)})
        with pytest.raises(reprise.RejectedError, match="nosuch"):
            w.create_item("t", 1.0, {"big": w.history["big"][-1]})
        assert not w._p.pending and not w._p.batch_items, "the create_item that raised created its item"
        w.create_item("t", 1.0, {"big": w.history["big"][-1]})
        with pytest.raises(reprise.InvalidArgumentError, match="over the server's max payload"):
            w.flush(timeout=30)
        w.close()


def test_read_your_writes(reprised_factory: Any) -> None:
    """Once flush or a mutation returns, the service has applied it: info
    shows the item, and a max-heap table samples the item just raised to the
    top priority, with that priority, round after round."""
    r = reprised_factory("tables:\n  - {name: heap, max_size: 1000, sampler: max_heap}\n")
    with reprise.Client(r.url) as c, c.trajectory_writer(1, linger=3600.0) as w:
        for i in range(30):
            w.append({"x": np.int64(i)})
            w.create_item("heap", 1.0, {"x": w.history["x"][-1:]})
            w.flush(timeout=30)
            assert c.server_info(timeout=5)["heap"].current_size == i + 1, f"round {i}: flush returned before applied"
            item = next(c.sample("heap", 1, timeout=5))
            c.mutate_priorities("heap", {item.info.key: float(1000 + i)}, timeout=30)
            top = next(c.sample("heap", 1, timeout=5))
            assert (top.info.key, top.info.priority) == (item.info.key, float(1000 + i)), f"round {i}: update not visible"


def test_linger_publishes_without_flush(reprised_factory: Any) -> None:
    """Items in a partly filled batch reach their table once the linger
    time passes, with no flush: the first batch, and again after the
    writer sat idle long enough for its timer to stop."""
    r = reprised_factory("tables:\n  - {name: t, max_size: 100}\n")
    with reprise.Client(r.url) as c, c.trajectory_writer(1, linger=0.02) as w:
        for want in (3, 5):
            while w.episode_steps < want:
                w.append({"x": np.int64(w.episode_steps)})
                w.create_item("t", 1.0, {"x": w.history["x"][-1]})
            wait_for(f"{want} items applied without a flush", lambda: c.server_info(timeout=5)["t"].current_size == want)
            wait_for("the idle writer's linger timer to stop", lambda: not w._p.linger_armed)


def test_linger_waits_its_time_and_for_room(reprised_factory: Any) -> None:
    """A partly filled batch goes out when its linger time passes, not
    sooner (an earlier message's ack does not publish it), and not later
    than the window allows: one that found the window full goes out as
    soon as the service's progress makes room."""
    r = reprised_factory(
        "tables:\n  - {name: t, max_size: 100}\n  - {name: held, max_size: 2, rate_limiter: {preset: queue}}\n"
    )
    with reprise.Client(r.url) as c:
        with c.trajectory_writer(1, linger=3600.0, batch_items=4) as w:
            for i in range(5):
                w.append({"x": np.int64(i)})
                w.create_item("t", 1.0, {"x": w.history["x"][-1]})
            wait_for("the full batch's ack", lambda: not w._p.unsettled)
            assert len(w._p.batch_items) == 1, "the ack published the batch still lingering"
            w.flush(timeout=30)
            assert c.server_info(timeout=5)["t"].current_size == 5
        with c.trajectory_writer(1, linger=0.05, batch_items=4, max_unapplied=2) as w:
            for i in range(5):
                w.append({"x": np.int64(i)})
                w.create_item("held", 1.0, {"x": w.history["x"][-1]})
            # The table holds two of the first message's items, so the
            # fifth item's batch finds no room when its linger time passes.
            wait_for("the fifth item's linger time", lambda: w._p.lingered)
            assert len(w._p.batch_items) == 1
            got = [int(s.data["x"]) for _ in range(4) for s in c.sample("held", 1, timeout=30)]
            assert got == [0, 1, 2, 3]
            wait_for("the fifth item in its table", lambda: c.server_info(timeout=5)["held"].num_inserts == 5)


def test_releases_beside_a_waiting_batch_never_overflow_it(reprised_factory: Any) -> None:
    """Chunks released while a batch near the server's max payload waits
    for the window go with a later message when they do not fit beside
    it, rather than push the message over the max payload, which would
    lose its items."""
    r = reprised_factory(
        "tables:\n  - {name: t, max_size: 1000}\n  - {name: q, max_size: 1, rate_limiter: {preset: queue}}\n",
        ["--max-payload", "16384"],
    )
    steps = 150
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(steps, linger=3600.0, batch_items=2, max_unapplied=1, compression="none")
        # Items on every step: their chunks are sent, so leaving the
        # history releases them.
        for i in range(steps):
            w.append({"a": np.int64(i), "b": np.int64(i)})
            w.create_item("t", 1.0, {"a": w.history["a"][-1], "b": w.history["b"][-1]})
        # The queue holds the second item of this message, so the window
        # (one unapplied item) stays full.
        for i in range(2):
            w.append({"a": np.int64(i)})
            w.create_item("q", 1.0, {"a": w.history["a"][-1]})
        w.append({"big": np.zeros(14000, np.uint8)})
        w.create_item("t", 1.0, {"big": w.history["big"][-1]})  # staged: one of two
        # Steps without items push the sent chunks out of the history.
        for i in range(steps):
            w.append({"a": np.int64(i), "b": np.int64(i)})
        p = w._p
        assert p.batch_bytes + 10 * len(p.release) > 16384, "the releases fit beside the batch: the test shows nothing"
        got = [int(s.data["a"]) for _ in range(2) for s in c.sample("q", 1, timeout=30)]
        assert got == [0, 1]
        w.flush(timeout=30)
        assert c.server_info(timeout=5)["t"].current_size == steps + 1
        w.close()


def test_a_given_up_message_holds_no_later_one_back(reprised_factory: Any) -> None:
    """Message N is refused by JetStream for good (over the stream's max
    message size) after message N+1, stored, went out stating a window that
    includes N. The service holds N+1 until a message states a later window
    start, and its progress passes N+1 meanwhile; once the writer reports
    N lost, its waits still return only when N+1's item is in its table,
    though the writer sends nothing more."""
    r = reprised_factory("tables:\n  - {name: t, max_size: 100}\n", ["--max-payload", "16384"])
    with reprise.Client(r.url) as c:

        async def lower_max_msg_size() -> None:
            js = c._aclient.nats.jetstream()
            cfg = (await js.stream_info("REPRISE_" + r.prefix.upper())).config
            cfg.max_msg_size = 9000
            await js.update_stream(cfg)

        c._lt.call(lower_max_msg_size())
        w = c.trajectory_writer(2, chunk_length=2, linger=3600.0, compression="none", delta=False)
        # Item N takes column a (10 kB, over the stream's max message size),
        # item N+1 column b (7 kB). Both wait for their 2-step chunks until
        # flush, which sends them as two messages back to back: together
        # they exceed the server's max payload.
        w.append({"a": np.zeros(10000, np.uint8), "b": np.zeros(7000, np.uint8)})
        w.create_item("t", 1.0, {"a": w.history["a"][-1]})
        w.create_item("t", 1.0, {"b": w.history["b"][-1]})
        with pytest.raises(reprise.NotStoredError, match="message 1 \\(1 items\\)"):
            w.flush(timeout=30)
        assert table_size(c, "t") == 1, "flush returned before message 2's item was in its table"
        w.wait_applied(timeout=30)
        assert table_size(c, "t") == 1
        w.close()


def test_a_policy_version_out_of_int64_is_refused(server: Reprised) -> None:
    """A policy version is an int64 on the wire, as in the Go producer and
    client: one out of its range raises InvalidArgumentError, and the
    writer keeps the version it had. The writer wrapped it (2**63 went out
    as -2**63, which a staleness bound finds the stalest of all), and the
    client's set_policy_version raised protobuf's bare ValueError. Nor is
    what is no integer taken (2.7 went out as 2, "5" as 5)."""
    versions = [1 << 63, -(1 << 63) - 1, 1 << 64, float("inf"), "v", 2.7, "5", True]
    with reprise.Client(server.url) as c:
        w = c.trajectory_writer(1)
        w.set_policy_version(7)
        for v in versions:
            with pytest.raises(reprise.InvalidArgumentError, match="policy version"):
                w.set_policy_version(v)  # type: ignore[arg-type]
            with pytest.raises(reprise.InvalidArgumentError, match="policy version"):
                c.set_policy_version("replay", v, timeout=5)  # type: ignore[arg-type]
        assert w._p.policy_version == 7
        w.set_policy_version(np.int64(8))
        assert w._p.policy_version == 8 and type(w._p.policy_version) is int
        w.set_policy_version(-(1 << 63))
        w.close()

    async def main() -> None:
        async with await aio.connect(server.url) as c:
            w = await c.trajectory_writer(1)
            for v in versions:
                with pytest.raises(reprise.InvalidArgumentError, match="policy version"):
                    w.set_policy_version(v)  # type: ignore[arg-type]
            await w.close()

    asyncio.run(main())


def test_staleness_bound(reprised_factory: Any) -> None:
    """Items carry their writer's policy version; a learner raises the
    table's version; with max_staleness 1 the items two versions behind are
    removed and stale inserts dropped, and server_info says so."""
    r = reprised_factory("tables:\n  - {name: t, max_size: 100, max_staleness: 1}\n")
    with reprise.Client(r.url) as c, c.trajectory_writer(1, linger=0.0) as w:
        for version, xs in ((0, (0, 1)), (1, (10, 11)), (2, (20,))):
            w.set_policy_version(version)
            for x in xs:
                w.append({"x": np.int64(x)})
                w.create_item("t", 1.0, {"x": w.history["x"][-1:]})
            w.flush(timeout=30)
        c.set_policy_version("t", 2, timeout=30)
        w.set_policy_version(0)
        w.append({"x": np.int64(2)})
        w.create_item("t", 1.0, {"x": w.history["x"][-1:]})
        w.flush(timeout=30)  # stale on arrival: dropped
        info = c.server_info(timeout=5)["t"]
        assert (info.current_size, info.policy_version, info.max_staleness) == (3, 2, 1)
        assert (info.min_item_version, info.max_item_version, info.num_stale_evictions) == (1, 2, 3)
        got = {int(s.data["x"][0]) for _ in range(20) for s in c.sample("t", 1, timeout=5)}
        assert got <= {10, 11, 20}, got
        # Reverb's counts: one writer episode, the items sampled at least once.
        info = c.server_info(timeout=5)["t"]
        assert info.num_episodes == 1 and info.num_unique_samples == len(got), info
        # At runtime: 0 keeps only version 2's item; None lifts the bound.
        c.set_max_staleness("t", 0, timeout=30)
        info = c.server_info(timeout=5)["t"]
        assert (info.current_size, info.max_staleness) == (1, 0)
        c.set_max_staleness("t", None, timeout=30)
        assert c.server_info(timeout=5)["t"].max_staleness is None


def _mutation_tables(names: str, max_ops: int) -> str:
    return "tables:\n" + "".join(f"  - {{name: {n}, max_size: 1000}}\n" for n in names) + f"limits: {{max_mutation_ops: {max_ops}}}\n"


def test_refused_mutations_are_reported(reprised_factory: Any) -> None:
    """A mutation the service refuses raises, with the service's code,
    rather than returning: here the service restarted without the client's
    table, and then with a lower limits.max_mutation_ops than the client
    learned. Before, both returned None with nothing applied."""
    server = reprised_factory(_mutation_tables("tu", 10))
    with reprise.Client(server.url) as c:
        c.mutate_priorities("t", deletes=[1])
        c.mutate_priorities("u", deletes=[1])
        server.stop()
        server.config.write_text(_mutation_tables("u", 5))
        server.start()
        with pytest.raises(reprise.NotFoundError, match="mutation for table 't' at stream sequence") as e:
            c.mutate_priorities("t", deletes=[1])
        assert isinstance(e.value, reprise.RejectedError) and e.value.code == reprise.Code.NOT_FOUND
        with pytest.raises(reprise.NotFoundError) as e:
            c.mutate_priorities("t", deletes=[1])
        assert not isinstance(e.value, reprise.RejectedError), "asked again, and refused before sending"
        write_xs(c, "u", 2)
        keys = np.unique(c.sample_batch("u", 64, timeout=10).info.key)
        assert len(keys) == 2
        update = {int(keys[0]): 3.0, **{(1 << 40) + i: 1.0 for i in range(10)}, int(keys[1]): 7.0}
        with pytest.raises(reprise.ResourceExhaustedError, match="ops 0 to 9 of 12, of 2 parts sent apart; the other parts"):
            c.mutate_priorities("u", update)

        def priorities() -> dict[int, float]:
            b = c.sample_batch("u", 64, timeout=10)
            return dict(zip(b.info.key.tolist(), b.info.priority.tolist()))

        assert priorities() == {int(keys[0]): 1.0, int(keys[1]): 7.0}, "the second part alone was applied"
        c.mutate_priorities("u", update)  # after a refusal the client asks again, and learns the new limit
        assert priorities() == {int(keys[0]): 3.0, int(keys[1]): 7.0}


def test_mutations_follow_the_services_limit(reprised_factory: Any) -> None:
    """A mutation of more ops than the service's limits.max_mutation_ops goes
    in parts it takes; before, a delete of 25 keys from a service taking 10
    ops returned None and deleted nothing."""
    server = reprised_factory(_mutation_tables("t", 10))
    with reprise.Client(server.url) as c:
        write_xs(c, "t", 3)
        keys = np.unique(c.sample_batch("t", 64, timeout=10).info.key)
        c.mutate_priorities("t", deletes=[*range(1 << 40, (1 << 40) + 22), *keys.tolist()])
        assert table_size(c, "t") == 0


def test_an_append_refuses_a_column_its_chunks_cannot_hold(client: reprise.Client) -> None:
    """A column whose full chunk would exceed the chunk limit is refused by
    the append of its first step, which keeps nothing of the step: a
    step of two columns, one sealed and one refused, kept half a step."""
    from reprise import _codec

    with client.trajectory_writer(1, chunk_length=1) as w:
        with pytest.raises(reprise.InvalidArgumentError, match="column 'x'"):
            w.append({"id": np.int64(0), "x": np.zeros(_codec.MAX_CHUNK_RAW_SIZE + 1, np.uint8)})
        assert w.episode_steps == 0 and not w._p.columns, "the refused step was kept"
        w.append({"id": np.int64(0)})
        assert w.history["id"][-1].start == 0, "the next step is step 0"


def test_an_item_an_append_left_pending_goes_out_with_no_later_call(reprised_factory: Any) -> None:
    """The append that completes item X, which does not fit beside the
    staged batch W while the window is full, returns at once with X
    pending; once the window moves, W and then X are published with no
    other call of the actor's. X waited for the actor's next call, which
    may never come (the episode's last step, say). Before appends stopped
    waiting after they keep their step, that append waited for room and
    published both (as the Go producer's Append)."""
    r = reprised_factory("""
tables:
  - name: queue
    max_size: 1
    rate_limiter: {preset: queue}
  - name: replay
    max_size: 100
""")
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(4, chunk_length=2, max_unapplied=1, compression="none", batch_bytes=8 << 20)
        # The queue holds its second item: the window (one item) is full.
        for i in range(4):
            w.append({"id": np.int64(i)})
            if i % 2:
                w.create_item("queue", 1.0, {"id": w.history["id"][-1]})
            if i == 1:
                w.wait_applied(timeout=30)
        with pytest.raises(reprise.DeadlineExceededError):
            w.wait_applied(timeout=0.3)
        # W and X take 600 kB each: they do not fit in one message, and
        # neither fills a batch.
        big = np.zeros(300_000, np.uint8)
        w.append({"x": big})
        w.append({"x": big})
        w.create_item("replay", 1.0, {"x": w.history["x"][-1]})  # W, staged
        w.append({"x": big})
        w.create_item("replay", 1.0, {"x": w.history["x"][-1]})  # X, its chunk open
        # The actor's last call: it seals X's chunk.
        th, outcome = in_thread(lambda: w.append({"x": big}))
        wait_for("X's chunk sealed", lambda: not w._p.columns["x"].open)
        c.sample_batch("queue", 1, timeout=10)  # room
        th.join(30)
        assert outcome == [None]
        deadline = time.monotonic() + 10
        while table_size(c, "replay") < 2:
            assert time.monotonic() < deadline, (
                f"{table_size(c, 'replay')} items in replay after 10 s, want 2 "
                f"({len(w._p.pending)} pending): an item waited for a call that never came"
            )
            time.sleep(0.02)
        w.close()


def test_an_item_over_the_max_payload_leaves_none_behind_it_pending(reprised_factory: Any) -> None:
    """The append that completes items A, B and C, B over the server's max
    payload, keeps its step, leaves B's error to a later call, and A and C
    are published with no other call of the actor's (as the Go producer's
    Append does). The append stopped at B: C stayed pending, and A staged
    with no linger timer armed, both until the actor's next call, which
    may never come."""
    r = reprised_factory()
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(2, chunk_length=2, compression="none", batch_bytes=8 << 20)
        big = np.zeros(600_000, np.uint8)  # B's chunk of two steps: 1.2 MB
        w.append({"id": np.int64(0), "x": big})
        w.create_item("replay", 1.0, {"id": w.history["id"][-1]})  # A
        w.create_item("replay", 1.0, {"x": w.history["x"][-1]})  # B
        w.create_item("replay", 1.0, {"id": w.history["id"][-1]})  # C
        w.append({"id": np.int64(1), "x": big})  # seals their chunks
        assert w.episode_steps == 2
        deadline = time.monotonic() + 10
        while table_size(c, "replay") < 2:
            assert time.monotonic() < deadline, (
                f"{table_size(c, 'replay')} items in replay after 10 s, want 2 ({len(w._p.pending)} pending, "
                f"{len(w._p.batch_items)} staged): items behind one over the max payload waited for a call"
            )
            time.sleep(0.02)
        with pytest.raises(reprise.InvalidArgumentError, match="max payload"):
            w.flush(timeout=30)  # B's error
        w.close()


def test_a_flush_publishes_the_items_behind_one_over_the_max_payload(reprised_factory: Any) -> None:
    """Items A, B and C wait for the flush to seal their chunks, B over the
    server's max payload: the flush publishes A and C and raises B's error
    (as the Go producer's Flush). It raised at B with C left pending, for
    the actor's next call to publish."""
    r = reprised_factory()
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(2, chunk_length=4, compression="none", batch_bytes=8 << 20)
        w.append({"id": np.int64(0), "x": np.zeros(1_200_000, np.uint8)})
        w.create_item("replay", 1.0, {"id": w.history["id"][-1]})  # A
        w.create_item("replay", 1.0, {"x": w.history["x"][-1]})  # B
        w.create_item("replay", 1.0, {"id": w.history["id"][-1]})  # C
        assert len(w._p.pending) == 3, "the items wait for their open chunks"
        with pytest.raises(reprise.InvalidArgumentError, match="max payload"):
            w.flush(timeout=30)
        assert not w._p.pending, "C left pending behind B"
        assert table_size(c, "replay") == 2
        w.close()


def test_a_create_item_raising_earlier_errors_created_nothing(client: reprise.Client) -> None:
    """The errors of earlier messages (here a rejection) are raised by the
    next create_item before it creates its item, so that one that raises
    created nothing. It raised them after it queued its item, which was
    then published: an actor that created the item again had it twice."""
    before = client.server_info()["replay"].num_inserts
    with client.trajectory_writer(1, validate_signatures=False, linger=0.0) as w:
        w.append({"obs": np.zeros(3, np.float32)})
        w.create_item("no-such-table", 1.0, {"obs": w.history["obs"][-1]})
        wait_for("the service's rejection", lambda: w._p.rejections == 1)
        created = 0
        for _ in range(2):
            try:
                w.create_item("replay", 1.0, {"obs": w.history["obs"][-1]})
                created += 1
            except reprise.RejectedError:
                pass
        assert created == 1, "the first create_item after the rejection raises it"
        w.flush(timeout=30)
    assert client.server_info()["replay"].num_inserts == before + created


def test_a_message_stored_without_an_ack_is_not_reported_not_stored(reprised_factory: Any) -> None:
    """A message whose every attempt went unanswered (a stream that stores
    without acking, no_ack) may have been stored: the writer gives up on it
    with OutcomeUnknownError, never NotStoredError, which said its items
    were lost while the service applied them (an actor that resent them on
    NotStoredError inserted them twice). As the Go producer's
    TestAMessageStoredWithoutAnAckIsNotReportedNotStored."""
    r = reprised_factory("tables:\n  - {name: t, max_size: 10}\n")
    with reprise.Client(r.url) as c:

        async def no_ack(on: bool) -> None:
            js = c._aclient.nats.jetstream()
            cfg = (await js.stream_info("REPRISE_" + r.prefix.upper())).config
            cfg.no_ack = on
            await js.update_stream(cfg)

        c._lt.call(no_ack(True))
        w = c.trajectory_writer(1, linger=0.0, ack_timeout=0.2, retry_for=0.5)
        w.append({"x": np.int64(1)})
        w.create_item("t", 1.0, {"x": w.history["x"][-1]})
        with pytest.raises(reprise.OutcomeUnknownError, match=r"message 1 \(1 items\) may be stored") as e:
            w.flush(timeout=30)
        assert not isinstance(e.value, reprise.NotStoredError)
        assert isinstance(e.value, reprise.DeadlineExceededError)  # the class of its last failure too
        wait_for("the service to apply the stored item", lambda: table_size(c, "t") == 1)
        assert (w._p.failed_items, w._p.unknown_items) == (0, 1)
        c._lt.call(no_ack(False))
        w.close(timeout=30)


def test_a_loss_behind_a_message_of_unknown_outcome_is_still_a_not_stored_error(reprised_factory: Any) -> None:
    """A writer that gave up on a message that may be stored (its first
    attempt unanswered, on a no_ack stream) and on one JetStream refused
    (over the stream's max_msg_size) raises one error for both that is an
    OutcomeUnknownError and a NotStoredError, as the Go producer's joined
    error is both ErrOutcomeUnknown and ErrNotStored: it took the class of
    the first alone, and ``except (RejectedError, NotStoredError)``, which
    catches every certain loss, missed the refused message's."""
    r = reprised_factory("tables:\n  - {name: t, max_size: 10}\n")
    with reprise.Client(r.url) as c:

        async def stream(no_ack: bool, max_msg_size: int) -> None:
            js = c._aclient.nats.jetstream()
            cfg = (await js.stream_info("REPRISE_" + r.prefix.upper())).config
            cfg.no_ack, cfg.max_msg_size = no_ack, max_msg_size
            await js.update_stream(cfg)

        c._lt.call(stream(True, -1))
        w = c.trajectory_writer(1, linger=0.0, ack_timeout=2.0, retry_for=2.5)
        w.append({"x": np.int64(1)})
        w.create_item("t", 1.0, {"x": w.history["x"][-1]})
        # Stored, unanswered: its ack times out only after the next message
        # was refused, so that no call takes one error before the other.
        wait_for("the service to apply the unanswered message", lambda: table_size(c, "t") == 1)
        c._lt.call(stream(False, 64))
        w.append({"x": np.int64(2)})
        w.create_item("t", 1.0, {"x": w.history["x"][-1]})
        wait_for("both messages to be given up on", lambda: (w._p.unknown_items, w._p.failed_items) == (1, 1), timeout=30)
        c._lt.call(stream(False, -1))
        with pytest.raises(reprise.NotStoredError) as e:
            w.flush(timeout=30)
        assert isinstance(e.value, reprise.OutcomeUnknownError), e.value
        assert "message 1 (1 items) may be stored" in e.value.message and "(1 items) not stored" in e.value.message
        w.close(timeout=30)
