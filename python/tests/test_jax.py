"""reprise.jax: ReplayIterator and conversion to JAX arrays."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import numpy as np
import pytest

if os.environ.get("REPRISE_REQUIRE_JAX") == "1":
    import jax
else:
    jax = pytest.importorskip("jax")
import jax.numpy as jnp

import reprise
import reprise.jax as rj
from reprise import _codec
from conftest import REPO, Reprised, free_port, wait_for

BF16 = _codec.DTYPES["bfloat16"]


def run_python(code: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Runs code in a fresh interpreter (JAX's x64 flag and device count
    are fixed once jax is imported) with this process's reprise; fails the
    test with its output if it fails."""
    path = os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")])
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_to_jax_keeps_bfloat16_and_takes_either_byte_order() -> None:
    bf = np.array([1.5, -2.0], BF16)
    x = rj.to_jax(bf)
    assert x.dtype == jnp.bfloat16 and x.tolist() == [1.5, -2.0]
    for dt in (">f4", "<f4", ">i4", ">u2", ">f8"):
        assert rj.to_jax(np.array([1, 2, 3], dt)).tolist() == [1, 2, 3], dt
    dev = jax.devices()[0]
    assert rj.to_jax(np.arange(3, dtype=np.float32), dev).devices() == {dev}


def test_64_bit_columns_without_x64() -> None:
    """Without jax_enable_x64 JAX makes 64-bit arrays 32-bit: values that
    fit come through, floats lose precision, and integers that would wrap
    are refused (JAX itself turned 2**40 into 0)."""
    assert not jax.config.jax_enable_x64
    x = rj.to_jax(np.array([-(2**31), 2**31 - 1], np.int64))
    assert x.dtype == jnp.int32 and x.tolist() == [-(2**31), 2**31 - 1]
    u = rj.to_jax(np.array([2**32 - 1], np.uint64))
    assert u.dtype == jnp.uint32 and u.tolist() == [2**32 - 1]
    f = rj.to_jax(np.array([0.1, 2.5], np.float64))
    assert f.dtype == jnp.float32 and f.tolist() == [np.float32(0.1), 2.5]
    with pytest.raises(ValueError, match="jax_enable_x64"):
        rj.to_jax(np.array([0, 2**40], np.int64))
    with pytest.raises(ValueError, match="jax_enable_x64"):
        rj.to_jax(np.array([2**63 + 7], np.uint64))
    with pytest.raises(ValueError, match="jax_enable_x64"):
        rj.to_jax(np.array([2**31], ">i8"))


def test_64_bit_columns_with_x64() -> None:
    """With jax_enable_x64 64-bit arrays keep their dtype and values; keys
    stay numpy uint64 either way."""
    out = run_python(
        """
        import jax, numpy as np
        import reprise.jax as rj
        from reprise._sample import empty_batch
        assert jax.config.jax_enable_x64
        for a in (np.array([2**40, -3], np.int64), np.array([2**63 + 7], np.uint64), np.array([0.1], np.float64)):
            x = rj.to_jax(a)
            assert x.dtype == a.dtype and np.array_equal(np.asarray(x), a), (x, a)
        b = rj.batch_to_jax(empty_batch())
        assert b.info["probability"].dtype == np.float64 and b.info["table_size"].dtype == np.int64
        assert b.info_numpy.key.dtype == np.uint64 and "key" not in b.info
        print("ok")
        """,
        env={"JAX_ENABLE_X64": "1"},
    )
    assert out.strip() == "ok"


def fill(url: str, n: int, table: str = "dtypes") -> dict[int, int]:
    """n items of one step each: obs (3x5 float32) and half (4 bfloat16)
    are filled with the item's step t, a (int32) is t. Returns each item's t by key, read back from a sample of the whole
    table."""
    with reprise.Client(url) as c:
        c.reset(table)
        with c.trajectory_writer(1) as w:
            for t in range(n):
                w.append({"obs": np.full((3, 5), t, np.float32), "half": np.full(4, t, BF16), "a": np.int32(t)})
                w.create_item(table, 1.0, {k: w.history[k][-1] for k in ("obs", "half", "a")})
            w.wait_applied(timeout=30)
        seen: dict[int, int] = {}
        while len(seen) < n:
            b = c.sample_batch(table, 4 * n, timeout=10)
            seen.update(zip(b.info.key.tolist(), b.data["a"].tolist()))
        return seen


def check_batch(b: rj.JaxBatch, t_of: dict[int, int], size: int) -> None:
    """b holds the items its keys name, each column filled with its t."""
    assert len(b) == size and b.info_numpy.key.dtype == np.uint64
    t = np.array([t_of[k] for k in b.info_numpy.key.tolist()], np.int32)
    obs, half, a = b.data["obs"], b.data["half"], b.data["a"]
    assert isinstance(obs, jax.Array) and obs.shape == (size, 3, 5) and obs.dtype == jnp.float32
    assert half.dtype == jnp.bfloat16 and half.shape == (size, 4)
    assert a.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(a), t)
    np.testing.assert_array_equal(np.asarray(obs), np.broadcast_to(t[:, None, None], (size, 3, 5)).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(half, np.float32), np.broadcast_to(t[:, None], (size, 4)))
    assert set(b.info) == {"probability", "priority", "table_size", "times_sampled"}
    assert b.info["probability"].dtype == jnp.float32 and b.info["table_size"].dtype == jnp.int32
    np.testing.assert_allclose(np.asarray(b.info["probability"]), b.info_numpy.probability, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(b.info["table_size"]), b.info_numpy.table_size)


def test_iterator_yields_the_items_inserted(server: Reprised) -> None:
    t_of = fill(server.url, 20)
    with rj.ReplayIterator(server.url, "dtypes", 8, prefetch=3, device_prefetch=2) as it:
        for i, b in enumerate(it):
            check_batch(b, t_of, 8)
            if i == 5:
                break
    assert next(it, None) is None  # closed


def test_batches_keep_their_values(server: Reprised) -> None:
    """A batch's arrays do not change as later batches come: jax.device_put
    on CPU may share a numpy array's memory (64-byte aligned ones), so a
    decoder that reused its buffers would rewrite batches handed out. The
    numpy arrays they may share are read-only."""
    t_of = fill(server.url, 64)
    with reprise.Client(server.url) as c:
        with rj.ReplayIterator(c, "dtypes", 32, device_prefetch=3) as it:
            first = [next(it) for _ in range(4)]
            kept = [{k: np.array(v) for k, v in b.data.items()} for b in first]
            later = [next(it) for _ in range(8)]
            for b, k in zip(first, kept):
                check_batch(b, t_of, 32)
                for name, v in k.items():
                    np.testing.assert_array_equal(np.asarray(b.data[name]), v, err_msg=name)
            check_batch(later[-1], t_of, 32)
            assert not first[0].info_numpy.key.flags.writeable
            assert not any(v.flags.writeable for v in (first[0].info_numpy.priority, first[0].info_numpy.table_size))
        assert not c._closed  # the caller's client stays the caller's
        c.server_info()


def test_device_prefetch_places_that_many_ahead(server: Reprised, monkeypatch: pytest.MonkeyPatch) -> None:
    """After each batch handed out, device_prefetch more are placed (0:
    none), no more: exactly that many from the second batch on, once the
    replies are in (device_prefetch + 1 requests in flight, answered
    before each batch is taken); the first call sends its requests, and
    places ahead only those already answered."""
    fill(server.url, 16)
    placed = []
    real = rj.batch_to_jax

    def counting(*args: object, **kwargs: object) -> rj.JaxBatch:
        b = real(*args, **kwargs)  # type: ignore[arg-type]
        placed.append(b)
        return b

    monkeypatch.setattr(rj, "batch_to_jax", counting)
    for ahead in (0, 1, 3):
        placed.clear()
        with rj.ReplayIterator(server.url, "dtypes", 4, prefetch=ahead + 1, device_prefetch=ahead) as it:
            b = next(it)
            assert b is placed[0] and len(placed) <= 1 + ahead
            futs: Any = it._sampler._futs
            for k in range(2, 7):
                wait_for("the replies in flight", lambda: len(futs) == ahead + 1 and all(f.done() for f in list(futs)))
                b = next(it)
                assert b is placed[k - 1]  # in order
                assert len(placed) == k + ahead, (ahead, k)


def test_timeout_ends_the_iteration(server: Reprised) -> None:
    """An empty table behind a min_size limiter allows nothing: the
    iteration ends after the timeout instead of waiting."""
    with reprise.Client(server.url) as c:
        c.reset("limited")
    with rj.ReplayIterator(server.url, "limited", 4, timeout=0.5) as it:
        assert list(it) == []


def test_update_priorities_with_jax_arrays(server: Reprised) -> None:
    t_of = fill(server.url, 32)
    with reprise.Client(server.url) as c, rj.ReplayIterator(c, "dtypes", 8) as it:
        b = next(it)
        new = b.data["a"].astype(jnp.float32) + 0.5  # a JAX array, as a step computes
        it.update_priorities(b.info_numpy.key, new)
        with pytest.raises(reprise.InvalidArgumentError, match="info_numpy.key"):
            it.update_priorities(jnp.asarray(b.info_numpy.key.astype(np.uint32)), new)
        updated = set(b.info_numpy.key.tolist())
        after = c.sample_batch("dtypes", 512, timeout=10)
        for k, p in zip(after.info.key.tolist(), after.info.priority.tolist()):
            assert p == (t_of[k] + 0.5 if k in updated else 1.0), (k, p)


def test_sharded_over_four_devices(server: Reprised) -> None:
    """With XLA's four host devices and a NamedSharding of the batch axis,
    device d holds rows 4d..4d+3 of each column and of the info, and
    priorities computed on the sharded batch go back to the right keys. A
    batch_size the four cannot split is refused."""
    t_of = fill(server.url, 40)
    out = run_python(
        """
        import sys, jax, numpy as np, jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import reprise, reprise.jax as rj
        url, t_of = sys.argv[1], dict(eval(sys.argv[2]))
        assert jax.device_count() == 4
        mesh = Mesh(np.array(jax.devices()), ("batch",))
        sh = NamedSharding(mesh, P("batch"))
        try:
            rj.ReplayIterator(url, "dtypes", 6, sharding=sh)
            raise AssertionError("batch_size 6 accepted")
        except ValueError as e:
            assert "batch_size 6" in str(e) and "4 devices" in str(e), e
        with rj.ReplayIterator(url, "dtypes", 16, sharding=sh) as it:
            for _ in range(3):
                b = next(it)
                t = np.array([t_of[k] for k in b.info_numpy.key.tolist()])
                for col in (b.data["a"], b.data["obs"], b.info["probability"]):
                    assert col.sharding == sh and len(col.addressable_shards) == 4
                    for s in col.addressable_shards:
                        d = s.device.id
                        assert s.index[0] == slice(4 * d, 4 * d + 4), s.index
                        assert s.data.shape[0] == 4
                for s in b.data["a"].addressable_shards:
                    assert np.array_equal(np.asarray(s.data), t[s.index[0]]), (s.device, s.data, t)
                for s in b.data["obs"].addressable_shards:
                    assert (np.asarray(s.data) == t[s.index[0], None, None]).all()
                for s in b.info["probability"].addressable_shards:
                    assert np.allclose(np.asarray(s.data), b.info_numpy.probability[s.index[0]])
            step = jax.jit(lambda a: a.astype(jnp.float32) * 2 + 1)
            pr = step(b.data["a"])
            assert pr.sharding.is_equivalent_to(sh, 1)
            it.update_priorities(b.info_numpy.key, pr)
            with reprise.Client(url) as c:
                after = c.sample_batch("dtypes", 1024, timeout=10)
            keys = set(b.info_numpy.key.tolist())
            for k, p in zip(after.info.key.tolist(), after.info.priority.tolist()):
                assert p == (2 * t_of[k] + 1 if k in keys else 1.0), (k, p)
        print("ok")
        """,
        server.url,
        repr(sorted(t_of.items())),
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"},
    )
    assert out.strip() == "ok"


def test_jitted_sgd_learns_from_the_table(server: Reprised) -> None:
    """A jitted SGD step (plain jax.grad) fits the linear map that the
    inserted items hold, x -> x @ w + c: its loss falls a thousandfold
    within 300 steps."""
    rng = np.random.default_rng(7)
    w, c0 = rng.normal(size=4).astype(np.float32), np.float32(0.5)
    with reprise.Client(server.url) as c:
        c.reset("dtypes")
        with c.trajectory_writer(1) as wr:
            for _ in range(256):
                x = rng.normal(size=4).astype(np.float32)
                wr.append({"x": x, "y": np.float32(x @ w + c0)})
                wr.create_item("dtypes", 1.0, {"x": wr.history["x"][-1], "y": wr.history["y"][-1]})
            wr.wait_applied(timeout=30)

    def loss(params: tuple[jax.Array, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        wh, ch = params
        return jnp.mean((x @ wh + ch - y) ** 2)

    @jax.jit
    def step(params: tuple[jax.Array, jax.Array], x: jax.Array, y: jax.Array) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        value, g = jax.value_and_grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g), value

    params = (jnp.zeros(4), jnp.zeros(()))
    losses = []
    with rj.ReplayIterator(server.url, "dtypes", 32, prefetch=4) as it:
        for i, b in enumerate(it):
            params, value = step(params, b.data["x"], b.data["y"])
            losses.append(float(value))
            if i == 299:
                break
    assert losses[0] > 1000 * np.mean(losses[-10:]), (losses[0], losses[-10:])
    np.testing.assert_allclose(np.asarray(params[0]), w, atol=1e-2)


def test_a_short_batch_is_handed_out_unless_sharded(reprised_factory: Any) -> None:
    """A queue of 10 items gives batches of 4, 4 and the 2 left (the rate
    limiter cuts the last short), then ends on the timeout. With a
    sharding the 2 are dropped: every process must give a global batch the
    same share, and a short one may not split over the devices."""
    # Two queues: the request in flight at the end of one iteration takes
    # what its queue gets next.
    r = reprised_factory(
        "tables:\n"
        "  - {name: q, max_size: 100, rate_limiter: {preset: queue}}\n"
        "  - {name: q2, max_size: 100, rate_limiter: {preset: queue}}\n"
    )
    with reprise.Client(r.url) as c, c.trajectory_writer(1) as w:
        for t in range(10):
            w.append({"x": np.int32(t)})
            for q in ("q", "q2"):
                w.create_item(q, 1.0, {"x": w.history["x"][-1]})
        w.wait_applied(timeout=30)

    with rj.ReplayIterator(r.url, "q", 4, timeout=1.0, prefetch=1) as it:
        assert [np.asarray(b.data["x"]).tolist() for b in it] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    sh = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with rj.ReplayIterator(r.url, "q2", 4, timeout=1.0, prefetch=1, sharding=sh) as it:
        assert [np.asarray(b.data["x"]).tolist() for b in it] == [[0, 1, 2, 3], [4, 5, 6, 7]]


QUEUE = "tables:\n  - {name: q, max_size: 100, rate_limiter: {preset: queue}}\n"


@pytest.mark.parametrize("sharded", [False, True])
def test_a_batch_come_is_handed_out_without_waiting_for_those_ahead(reprised_factory: Any, sharded: bool) -> None:
    """An actor and a learner in one thread: each step inserts a batch's
    items into a queue, then takes a batch. The iterator hands out the
    batch that came at once, and places ahead only batches already come:
    the queue holds the next ones only once later steps insert them. It
    waited for device_prefetch more, till the timeout ended the iteration
    (or, without one, for good)."""
    size = 1 if sharded else 4  # a ShardedClient draws a batch's items from the shards by their sizes
    if sharded:
        s0 = reprised_factory(QUEUE, ["--shard", "0/2"], prefix="s0")
        reprised_factory(QUEUE, ["--shard", "1/2"], prefix="s1", nats=s0.url)
        c: reprise.Client | reprise.ShardedClient = reprise.ShardedClient(s0.url, ["s0", "s1"])
    else:
        c = reprise.Client(reprised_factory(QUEUE).url)
    with c, c.trajectory_writer(1) as w, rj.ReplayIterator(c, "q", size, prefetch=1, device_prefetch=2, timeout=5.0) as it:
        for step in range(4):
            xs = list(range(size * step, size * (step + 1)))
            for x in xs:
                w.append({"x": np.int32(x)})
                w.create_item("q", 1.0, {"x": w.history["x"][-1]})
            w.wait_applied(timeout=30)
            b = next(it)
            assert sorted(np.asarray(b.data["x"]).tolist()) == xs, step


def test_sharded_over_a_data_and_model_mesh(server: Reprised) -> None:
    """On a 4x2 mesh of XLA's eight host devices, P("data") splits each
    batch over the data axis and replicates it over the model axis: the
    two devices of a data row hold the same rows, and priorities computed
    on the batch go back to the right keys once. A PartitionSpec that
    splits any other axis is refused with a ValueError that says so; it
    raised JAX's IndexError."""
    t_of = fill(server.url, 40)
    out = run_python(
        """
        import sys, jax, numpy as np, jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import reprise, reprise.jax as rj
        url, t_of = sys.argv[1], dict(eval(sys.argv[2]))
        mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
        for spec in (P("data", "model"), P(None, "model"), P("data", None)):
            try:
                rj.ReplayIterator(url, "dtypes", 8, sharding=NamedSharding(mesh, spec))
                raise AssertionError(f"{spec} accepted")
            except ValueError as e:
                assert "leading axis" in str(e), e
        try:
            rj.ReplayIterator(url, "dtypes", 6, sharding=NamedSharding(mesh, P("data")))
            raise AssertionError("batch_size 6 accepted")
        except ValueError as e:
            assert "4 devices" in str(e), e
        sh = NamedSharding(mesh, P("data"))
        with rj.ReplayIterator(url, "dtypes", 8, sharding=sh) as it:
            b = next(it)
            t = np.array([t_of[k] for k in b.info_numpy.key.tolist()])
            for col in (b.data["a"], b.data["obs"], b.info["times_sampled"]):
                assert col.sharding == sh and len(col.addressable_shards) == 8
            for s in b.data["a"].addressable_shards:
                row = mesh.device_ids.tolist().index([d for d in mesh.device_ids.tolist() if s.device.id in d][0])
                assert s.index[0] == slice(2 * row, 2 * row + 2), (s.device, s.index)
                assert np.array_equal(np.asarray(s.data), t[2 * row : 2 * row + 2])
            pr = jax.jit(lambda a: a.astype(jnp.float32) * 2 + 1)(b.data["a"])
            it.update_priorities(b.info_numpy.key, pr)
            with reprise.Client(url) as c:
                after = c.sample_batch("dtypes", 1024, timeout=10)
            keys = set(b.info_numpy.key.tolist())
            for k, p in zip(after.info.key.tolist(), after.info.priority.tolist()):
                assert p == (2 * t_of[k] + 1 if k in keys else 1.0), (k, p)
        print("ok")
        """,
        server.url,
        repr(sorted(t_of.items())),
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"},
    )
    assert out.strip() == "ok"


def test_an_error_placing_ahead_comes_after_the_batch_in_hand(reprised_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second batch of a queue holds an int64 JAX without x64 would
    wrap: next() hands out the first, placing the second ahead once its
    reply is in, and raises the second's ValueError on the call after, as
    the batches came. It raised the error with the first batch in hand."""
    c = reprise.Client(reprised_factory(QUEUE).url)
    with c, c.trajectory_writer(1) as w:
        for x in (0, 1, 2, 3, 2**40, 5, 6, 7):
            w.append({"x": np.int64(x)})
            w.create_item("q", 1.0, {"x": w.history["x"][-1]})
        w.wait_applied(timeout=30)
        with rj.ReplayIterator(c, "q", 4, prefetch=1, device_prefetch=1) as it:
            s: Any = it._sampler
            ready = s._next_ready

            def once_in() -> Any:
                wait_for("the second reply", lambda: s._futs and s._futs[0].done())
                return ready()

            monkeypatch.setattr(s, "_next_ready", once_in)
            b = next(it)
            assert np.asarray(b.data["x"]).tolist() == [0, 1, 2, 3]
            with pytest.raises(ValueError, match="jax_enable_x64"):
                next(it)


#: Run first in each process of run_processes: an uncaught error ends the
#: process at once, not in atexit's jax.distributed.shutdown, a barrier
#: the other processes may never reach; then the process joins the others.
_PROCESS_PREAMBLE = """
import os, sys, traceback
def _exit_now(*exc):
    traceback.print_exception(*exc)
    sys.stderr.flush()
    os._exit(1)
sys.excepthook = _exit_now
import jax
jax.distributed.initialize(
    f"127.0.0.1:{sys.argv[2]}", num_processes=int(sys.argv[3]), process_id=int(sys.argv[1]), initialization_timeout=60
)
"""


#: What gRPC logs in process 0 when the coordinator's port was taken.
_PORT_TAKEN = "Failed to add port to server"


def run_processes(code: str, *args: str, n: int = 2, timeout: float = 120.0) -> list[str]:
    """Runs code as the n processes of one multi-process JAX on CPU, two
    devices each, with this process's reprise: sys.argv is the process id,
    the coordinator's port, n, then args. Returns each one's stdout and
    stderr. Fails the test with their output if one fails (the others,
    which may wait for it in a collective, are killed) or if they are not
    all done within timeout. A coordinator's port taken between its choice
    and JAX's bind is chosen again, twice at most."""
    path = os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")])
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }
    program = _PROCESS_PREAMBLE + textwrap.dedent(code) + "\njax.distributed.shutdown()\n"
    for _ in range(3):
        codes, killed, outs = _run_once(program, [str(free_port()), str(n), *args], n, env, timeout)
        failed = any(c for i, c in enumerate(codes) if i not in killed)
        if not (failed and 0 not in killed and codes[0] and _PORT_TAKEN in outs[0]):
            break
    report = "\n".join(f"--- process {i} (exit {c}):\n{out}" for i, (c, out) in enumerate(zip(codes, outs)))
    why = "a process failed" if failed else f"processes {killed} were not done within {timeout}s"
    assert not killed and not failed, f"{why}\n{report}"
    return outs


def _run_once(
    program: str, args: list[str], n: int, env: dict[str, str], timeout: float
) -> tuple[list[int], list[int], list[str]]:
    """One try of run_processes: each process's exit code, those killed
    (still running when one failed or the timeout passed), and each one's
    output."""
    logs = [tempfile.TemporaryFile("w+") for _ in range(n)]  # a pipe left unread could fill and stop a process
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", program, str(i), *args],
            stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
        )
        for i, log in enumerate(logs)
    ]  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            running = [p for p in procs if p.poll() is None]
            if not running or any(p.returncode for p in procs):
                break
            try:
                running[0].wait(0.1)
            except subprocess.TimeoutExpired:
                pass
    finally:
        killed = [i for i, p in enumerate(procs) if p.poll() is None]
        for i in killed:
            procs[i].kill()
            procs[i].wait()
    outs = []
    for log in logs:
        log.seek(0)
        outs.append(log.read())
        log.close()
    return [p.returncode for p in procs], killed, outs


def test_run_processes_moves_off_a_coordinator_port_taken_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator's port is free when run_processes picks it, but
    another program (a test's server beside it) may take it in the seconds
    before JAX's coordinator binds it, after JAX's import: process 0 then
    dies (a segfault in JAX 0.10) and the test failed. run_processes tries
    again on another port."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        ports, fresh = iter([int(taken.getsockname()[1])]), free_port
        monkeypatch.setattr(sys.modules[__name__], "free_port", lambda: next(ports, None) or fresh())
        outs = run_processes('print("RESULT " + str(jax.process_index()), flush=True)')
    assert [result(out) for out in outs] == [0, 1]


def result(out: str) -> Any:
    """What a process of run_processes printed after "RESULT ", as JSON."""
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT ") :])


def test_two_processes_make_one_global_batch(server: Reprised) -> None:
    """Two JAX processes of two CPU devices each sample one table through
    ReplayIterator with a NamedSharding of a global mesh's batch axis: each
    process's devices hold exactly the rows it sampled, of every column
    and of the info; a jitted mean over the global batch (a collective)
    sees both processes' rows; and priorities computed on the global batch
    reach each key either process sampled, each process sending its own
    rows."""
    t_of = fill(server.url, 40)
    code = """
    import json
    import jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import reprise.jax as rj
    pid, url, t_of = int(sys.argv[1]), sys.argv[4], dict(eval(sys.argv[5]))
    assert (jax.process_count(), jax.device_count(), jax.local_device_count()) == (2, 4, 2)
    mesh = Mesh(np.array(jax.devices()), ("batch",))
    sh = NamedSharding(mesh, P("batch"))
    position = list(mesh.devices.flat).index
    assert sorted(position(d) for d in jax.local_devices()) == [2 * pid, 2 * pid + 1]
    means = jax.jit(lambda a, obs: (jnp.mean(a.astype(jnp.float32)), jnp.mean(obs, axis=0)))
    step = jax.jit(lambda a: a.astype(jnp.float32) * 2 + 1)
    batches = []
    with rj.ReplayIterator(url, "dtypes", 4, sharding=sh, timeout=30) as it:
        for _ in range(3):
            b = next(it)
            t = np.array([t_of[k] for k in b.info_numpy.key.tolist()])
            i = b.info_numpy
            for name, col, local in (
                ("a", b.data["a"], t),
                ("obs", b.data["obs"], t[:, None, None]),
                ("half", b.data["half"], t[:, None]),
                ("probability", b.info["probability"], i.probability.astype(np.float32)),
                ("table_size", b.info["table_size"], i.table_size),
                ("times_sampled", b.info["times_sampled"], i.times_sampled),
            ):
                assert col.shape[0] == 8 and col.sharding == sh and not col.is_fully_addressable, name
                assert len(col.addressable_shards) == 2, name
                for s in col.addressable_shards:
                    d = position(s.device)  # rows 2d, 2d+1 of the global batch; of this process's, from 4 * pid
                    assert s.index[0] == slice(2 * d, 2 * d + 2), (name, s.device, s.index)
                    got = np.asarray(s.data, np.float32 if name == "half" else None)
                    assert (got == local[2 * d - 4 * pid : 2 * d + 2 - 4 * pid]).all(), (name, s.device, got, local)
            mean, obs_mean = means(b.data["a"], b.data["obs"])
            pr = step(b.data["a"])
            assert pr.sharding.is_equivalent_to(sh, 1)
            it.update_priorities(b.info_numpy.key, pr)
            batches.append({
                "keys": b.info_numpy.key.tolist(),
                "mean": float(mean.addressable_data(0)),
                "obs_mean": np.asarray(obs_mean.addressable_data(0)).tolist(),
            })
    print("RESULT " + json.dumps(batches), flush=True)
    """
    outs = run_processes(code, server.url, repr(sorted(t_of.items())))
    results = [result(out) for out in outs]
    for j in range(3):
        ts = [t_of[k] for r in results for k in r[j]["keys"]]
        assert len(ts) == 8
        for r in results:
            assert r[j]["mean"] == pytest.approx(np.mean(ts)), (j, r[j], ts)
            np.testing.assert_allclose(r[j]["obs_mean"], np.full((3, 5), np.mean(ts)), rtol=1e-6)
    check_priorities(server.url, t_of, {k for r in results for b in r for k in b["keys"]})


def check_priorities(url: str, t_of: dict[int, int], sampled: set[int]) -> None:
    """Each item of table dtypes has priority 2t + 1 if its key is in
    sampled, 1 otherwise: read from samples till every item came."""
    seen: dict[int, float] = {}
    with reprise.Client(url) as c:

        def all_seen() -> bool:
            b = c.sample_batch("dtypes", 256, timeout=10)
            seen.update(zip(b.info.key.tolist(), b.info.priority.tolist()))
            return len(seen) == len(t_of)

        wait_for("every item sampled", all_seen)
    for k, p in seen.items():
        assert p == (2 * t_of[k] + 1 if k in sampled else 1.0), (k, p)


def test_a_sharding_that_gives_processes_the_same_rows_is_refused(server: Reprised) -> None:
    """With two JAX processes, a sharding that puts rows of a batch on
    devices of both (one replicating the leading axis, P(), or splitting
    it over a mesh axis within each process) is refused with a
    ValueError: each process samples its own batch, and JAX takes the
    rows both hold as the same in each, so process 0 computed on its
    batch and process 1 on its own, silently, each believing it the
    global one. A sharding over the processes that replicates within
    each, and a mesh of this process's devices alone, are taken."""
    t_of = fill(server.url, 40)
    code = """
    import json
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import reprise.jax as rj
    pid, url, t_of = int(sys.argv[1]), sys.argv[4], dict(eval(sys.argv[5]))
    devices = np.array(jax.devices())
    flat, grid = Mesh(devices, ("batch",)), Mesh(devices.reshape(2, 2), ("proc", "batch"))
    local = Mesh(np.array(jax.local_devices()), ("batch",))
    assert {d.process_index for d in grid.devices[pid]} == {pid}
    for spec, mesh in ((P(), flat), (P("batch"), grid), (P(), grid)):
        try:
            rj.ReplayIterator(url, "dtypes", 4, sharding=NamedSharding(mesh, spec))
            raise AssertionError(f"{spec} over {dict(mesh.shape)} accepted")
        except ValueError as e:
            assert "several JAX processes ([0, 1])" in str(e), e
    for spec, mesh, first in ((P("proc"), grid, 4 * pid), (P("batch"), local, 0)):
        with rj.ReplayIterator(url, "dtypes", 4, sharding=NamedSharding(mesh, spec), timeout=30) as it:
            b = next(it)
            t = np.array([t_of[k] for k in b.info_numpy.key.tolist()])
            a = b.data["a"]
            assert a.is_fully_addressable == (mesh is local) and a.shape == (8 if mesh is grid else 4,)
            for s in a.addressable_shards:
                start = (s.index[0].start or 0) - first
                assert (np.asarray(s.data) == t[start : start + s.data.shape[0]]).all(), (spec, s.device, s.data, t)
    print("RESULT " + json.dumps("ok"), flush=True)
    """
    assert [result(out) for out in run_processes(code, server.url, repr(sorted(t_of.items())))] == ["ok", "ok"]


def test_a_sharding_that_gives_processes_unequal_shares_is_refused(server: Reprised) -> None:
    """With two JAX processes, a sharding whose global array spans both
    but gives them unequal shares of the batch (a mesh of three of the
    four devices), or gives this process none (a mesh of process 0's
    devices, or process 0's first device, as process 1 sees them), is
    refused at construction with a ValueError: each process samples
    batch_size items for its own devices. Process 1 raised
    ZeroDivisionError where it had no device, and the three devices were
    taken, to fail in JAX's make_array_from_process_local_data at next()
    with the first batch already sampled. Process 0 takes a mesh of its
    own devices, its arrays its own."""
    code = """
    import json
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding, PartitionSpec as P
    import reprise.jax as rj
    pid, url = int(sys.argv[1]), sys.argv[4]
    devices = np.array(jax.devices())
    assert [d.process_index for d in devices] == [0, 0, 1, 1]
    for name, sh, here in (
        ("three devices", NamedSharding(Mesh(devices[:3], ("batch",)), P("batch")), False),
        ("process 0's devices", NamedSharding(Mesh(devices[:2], ("batch",)), P("batch")), pid == 1),
        ("process 0's first device", SingleDeviceSharding(devices[0]), pid == 1),
    ):
        try:
            rj.ReplayIterator(url, "dtypes", 4, sharding=sh).close()
            assert pid == 0 and name != "three devices", f"{name} accepted"
        except ValueError as e:
            assert "unequal shares" in str(e) and (f"process {pid} none" in str(e)) == here, (name, e)
            assert name != "three devices" or "process 0 2/3, process 1 1/3" in str(e), e
    print("RESULT " + json.dumps("ok"), flush=True)
    """
    assert [result(out) for out in run_processes(code, server.url)] == ["ok", "ok"]


def test_a_device_of_another_process_is_refused(server: Reprised) -> None:
    """With two JAX processes, device=jax.devices()[0] in each (as code
    written for one process has it) is refused in process 1 with a
    ValueError: the device is process 0's. JAX placed process 1's batches
    there without a word, arrays it could not read, each batch sampled for
    nobody. Process 0 takes it, its batches on the device."""
    t_of = fill(server.url, 40)
    code = """
    import json
    import numpy as np
    import reprise.jax as rj
    pid, url, t_of = int(sys.argv[1]), sys.argv[4], dict(eval(sys.argv[5]))
    device = jax.devices()[0]
    try:
        with rj.ReplayIterator(url, "dtypes", 4, device=device, timeout=30) as it:
            assert pid == 0, "process 0's device accepted in process 1"
            b = next(it)
            assert b.data["a"].devices() == {device} and b.data["a"].is_fully_addressable
            assert np.asarray(b.data["a"]).tolist() == [t_of[k] for k in b.info_numpy.key.tolist()]
    except ValueError as e:
        assert pid == 1 and "process 0's" in str(e), e
    print("RESULT " + json.dumps("ok"), flush=True)
    """
    assert [result(out) for out in run_processes(code, server.url, repr(sorted(t_of.items())))] == ["ok", "ok"]


@pytest.mark.parametrize("layout", ["replicated", "interleaved", "finer"])
def test_priorities_laid_out_otherwise_than_the_batch(server: Reprised, layout: str) -> None:
    """Two JAX processes; a step's priorities for a batch come out laid
    out otherwise than the batch. update_priorities sends each process's
    own rows, those its keys name, wherever they are on its devices:
    replicated, or split finer (the batch split over the processes alone,
    P("x") of a 2x2 mesh, the priorities over all four devices). Split in
    another order (P(("y", "x")) puts rows 2:4, process 0's, on process 1's
    first device), they are refused (InvalidArgumentError) and nothing
    changes. It took the priorities' own shards here: replicated, all 8
    rows for 4 keys (InvalidArgumentError: 4 keys and 8 priorities);
    interleaved, process 0 sent rows 0:2 and 4:6, the second half
    process 1's, as its own keys' priorities."""
    t_of = fill(server.url, 40)
    code = """
    import json
    import jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import reprise, reprise.jax as rj
    url, layout = sys.argv[4], sys.argv[5]
    devices = np.array(jax.devices())
    flat, grid = Mesh(devices, ("batch",)), Mesh(devices.reshape(2, 2), ("x", "y"))
    sh, out = {
        "replicated": (NamedSharding(flat, P("batch")), NamedSharding(flat, P())),
        "interleaved": (NamedSharding(flat, P("batch")), NamedSharding(grid, P(("y", "x")))),
        "finer": (NamedSharding(grid, P("x")), NamedSharding(flat, P("batch"))),
    }[layout]
    step = jax.jit(lambda a: a.astype(jnp.float32) * 2 + 1, out_shardings=out)
    keys = []
    with rj.ReplayIterator(url, "dtypes", 4, sharding=sh, timeout=30) as it:
        for _ in range(2):
            b = next(it)
            pr = step(b.data["a"])
            assert pr.sharding == out
            if layout == "interleaved":
                try:
                    it.update_priorities(b.info_numpy.key, pr)
                    raise AssertionError("priorities interleaved over the processes taken")
                except reprise.InvalidArgumentError as e:
                    assert "is on none of its devices" in str(e), e
            else:
                it.update_priorities(b.info_numpy.key, pr)
                keys += b.info_numpy.key.tolist()
    print("RESULT " + json.dumps(keys), flush=True)
    """
    outs = run_processes(code, server.url, layout)
    check_priorities(server.url, t_of, {k for out in outs for k in result(out)})
