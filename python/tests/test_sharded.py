"""Sharded tables: ShardedClient over two reprised on one NATS server (shard
0 embeds it, shard 1 connects to it), each with its own prefix.

Statistical checks use Hoeffding's bound: n independent draws of a shard
with probability p give a share within t of p but with probability at most
2 exp(-2 n t^2); t is computed for a false failure below 1e-6.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import random
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import reprise
import reprise.aio
from conftest import Reprised, aclose_while_waiting, close_while_waiting, wait_for
from reprise import _info, _sharded
from reprise._proto import reprise_pb2 as pb
from reprise._writer import _Producer

PREFIXES = ["s0", "s1"]

TABLES = """
tables:
  - name: replay
    max_size: 100000
  - name: uniform
    max_size: 100000
    signature:
      - {name: x, dtype: int64, shape: []}
  - name: prio
    max_size: 100000
    sampler: {kind: prioritized, exponent: 0.7}
  - name: mut
    max_size: 100000
    sampler: {kind: prioritized, exponent: 1.0}
  - name: limited
    max_size: 1000
    rate_limiter: {preset: min_size, min_size: 5}
  - name: held
    max_size: 2
    rate_limiter: {preset: queue}
"""

#: The false-failure probability each statistical check allows.
FAIL_P = 1e-6


def hoeffding(n: int) -> float:
    """The deviation t of a share of n draws from its probability that
    Hoeffding's bound allows with probability FAIL_P."""
    return math.sqrt(math.log(2 / FAIL_P) / (2 * n))


def start_shards(make: Any) -> list[Reprised]:
    s0 = make(TABLES, ["--shard", "0/2"], prefix="s0")
    return [s0, make(TABLES, ["--shard", "1/2"], prefix="s1", nats=s0.url)]


@pytest.fixture(scope="module")
def shards(binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Reprised]]:
    made: list[Reprised] = []

    def make(tables: str, extra: list[str], **kwargs: Any) -> Reprised:
        r = Reprised(binaries["reprised"], tmp_path_factory.mktemp("shard"), tables, extra, **kwargs)
        made.append(r)
        r.start()
        return r

    try:
        yield start_shards(make)
    finally:
        for r in reversed(made):
            r.kill9()


@pytest.fixture
def sc(shards: list[Reprised]) -> Iterator[reprise.ShardedClient]:
    with reprise.ShardedClient(shards[0].url, PREFIXES) as c:
        yield c


def fill(c: reprise.Client, table: str, xs: Sequence[int], priorities: Sequence[float] | None = None,
         versions: Sequence[int] | None = None) -> None:
    """One single-step item per x on the shard of c, column x."""
    with c.trajectory_writer(1) as w:
        for j, x in enumerate(xs):
            if versions is not None:
                w.set_policy_version(versions[j])
            w.append({"x": np.int64(x)})
            w.create_item(table, 1.0 if priorities is None else priorities[j], {"x": w.history["x"][-1]})
        w.flush(timeout=30)


def all_keys(c: reprise.Client, table: str, n: int) -> dict[int, int]:
    """Column x to key of every item of a shard holding n, sampled until
    each was seen."""
    seen: dict[int, int] = {}

    def every() -> bool:
        b = c.sample_batch(table, 64, timeout=5)
        seen.update(zip(b.data["x"].tolist(), b.info.key.tolist()))
        return len(seen) == n

    wait_for(f"all {n} items of {table!r} on {c.prefix} sampled", every, timeout=30, interval=0)
    return seen


# -- without a service -------------------------------------------------------


def test_weights_add_exactly() -> None:
    rng = random.Random(5)
    for _ in range(200):
        pairs = [(rng.uniform(0.5, 1.0), rng.randint(-1500, 1500)) for _ in range(rng.randint(1, 5))]
        pairs += [(0.0, 0)]
        exact = sum(Fraction(f) * Fraction(2) ** e for f, e in pairs)
        frac, exp = _info.add_weights(pairs)
        assert 0.5 <= frac < 1
        # Correctly rounded: the nearest double times 2**exp.
        want = Fraction(exact) / Fraction(2) ** exp
        assert frac == float(want)
    assert _info.add_weights([(0.75, 1 << 40), (0.5, (1 << 40) - 2)]) == (0.875, 1 << 40)
    assert _info.add_weights([]) == (0.0, 0)
    assert _info.weight_float(0.75, 1 << 40) == math.inf
    assert _info.weight_float(0.75, 2) == 3.0
    assert _info.weight_float(0.75, -(1 << 40)) == 0.0


def test_shard_ratios() -> None:
    f = np.array([0.75, 0.5, 0.0])
    r = _sharded.shard_ratios(np.array([3, 1, 0]), f, np.array([1 << 40, (1 << 40) - 1, 0]))
    assert r is not None and r.tolist() == [0.75, 0.25, 0.0]
    # Priorities all 0: the sizes, as one table samples uniformly then.
    r = _sharded.shard_ratios(np.array([3, 1, 0]), np.zeros(3), np.zeros(3, np.int64))
    assert r is not None and r.tolist() == [3.0, 1.0, 0.0]
    assert _sharded.shard_ratios(np.zeros(3, np.int64), np.zeros(3), np.zeros(3, np.int64)) is None


class _Draws(random.Random):
    """A Random whose getrandbits returns given values."""

    def __init__(self, values: list[int]) -> None:
        super().__init__()
        self.values = values

    def getrandbits(self, k: int) -> int:
        return self.values.pop(0)


def test_shard_keys() -> None:
    p = _Producer(reprise.WriterOptions(key_shard=(1, 3)), 1 << 20, lambda r: None)

    def key() -> int:
        # The varint as protobuf reads it: one packed release key.
        v = p._item_key_locked()
        return pb.InsertBatch.FromString(b"\x2a" + bytes([len(v)]) + v).release_chunk_keys[0]

    keys = [key() for _ in range(2000)]
    assert all(k % 3 == 1 and 0 <= k < 1 << 64 for k in keys)
    assert len(set(keys)) == 2000
    # 2**64 = 1 (mod 3): the top run [2**64-1] is short and drawn again, so
    # every key of the class has exactly 3 draws that give it.
    p._rng = _Draws([(1 << 64) - 1, 7])
    assert key() == 7
    p._rng = _Draws([(1 << 64) - 2])
    assert key() == (1 << 64) - 3
    for bad in [(2, 2), (0, 0), (-1, 2), (0, (1 << 16) + 1), (0.0, 2)]:
        with pytest.raises(reprise.InvalidArgumentError, match="key_shard"):
            reprise.WriterOptions(key_shard=bad)  # type: ignore[arg-type]


def test_prefixes_checked() -> None:
    with pytest.raises(reprise.InvalidArgumentError, match="prefixes"):
        reprise.ShardedClient("nats://127.0.0.1:1", PREFIXES, prefix="s0")
    with pytest.raises(reprise.InvalidArgumentError, match="twice"):
        reprise.ShardedClient("nats://127.0.0.1:1", ["s0", "s0"])
    with pytest.raises(reprise.InvalidArgumentError, match="list of prefixes"):
        reprise.ShardedClient("nats://127.0.0.1:1", "s0")
    with pytest.raises(reprise.InvalidArgumentError, match="share a stream"):
        reprise.ShardedClient("nats://127.0.0.1:1", ["s.0", "s-0"])


def test_hostile_weights_count_as_none() -> None:
    """What a hostile or broken shard could report (NaN, infinite or
    out-of-range fractions, extreme exponents, negative sizes) counts as no
    weight: shares stay finite, and sums ignore it."""
    for fraction, exponent, size in [
        (math.nan, 1, 10), (math.inf, 1, 10), (-0.75, 1, 10), (2.0, 1, 10),
        (0.5, 2**63 - 1, 10), (0.5, -(2**63), 10), (0.0, 0, -5),
    ]:
        st = _sharded._TableState("t", ("s0", "s1"))
        st.learn(0, 0, 10, 0.5, 4)
        st.learn(1, 0, size, fraction, exponent)
        ratios = _sharded.shard_ratios(st.size, st.fraction, st.exponent)
        assert ratios is not None and ratios[0] > 0 and ratios[1] == 0, (fraction, exponent, size)
    assert _info.add_weights([(0.5, 4), (math.inf, 1), (math.nan, 2), (1e308, 3)]) == (0.5, 4)


# -- with two shards ------------------------------------------------------------


def test_misordered_prefixes(shards: list[Reprised]) -> None:
    with reprise.ShardedClient(shards[0].url, ["s1", "s0"]) as c:
        want = (r"prefix 's1' is shard 1/2 \(reprised --shard\), expected shard 0/2: "
                r"give every shard's prefix, in shard order")
        with pytest.raises(reprise.InvalidArgumentError, match=want):
            c.sample_batch("replay", 1, timeout=5)
        with pytest.raises(reprise.InvalidArgumentError, match=want):
            c.server_info()
    with reprise.ShardedClient(shards[0].url, ["s0"]) as c:
        with pytest.raises(reprise.InvalidArgumentError, match=r"prefix 's0' is shard 0/2 .*expected shard 0/1"):
            c.update_priorities("replay", [2], [1.0])
    with reprise.ShardedClient(shards[0].url, ["s0", "reprise"]) as c:
        with pytest.raises(reprise.UnavailableError, match="shard 1 \\(prefix 'reprise'\\)"):
            c.reset("replay", timeout=5)


def test_shards_with_different_tables(shards: list[Reprised], reprised_factory: Any) -> None:
    other = TABLES.replace("  - name: replay\n    max_size: 100000\n",
                           "  - name: replay\n    max_size: 100000\n    sampler: {kind: prioritized, exponent: 1.0}\n")
    reprised_factory(TABLES, ["--shard", "0/2"], prefix="t0", nats=shards[0].url)
    reprised_factory(other.replace("  - name: limited\n", "  - name: limited2\n"), ["--shard", "1/2"], prefix="t1",
                     nats=shards[0].url)
    with reprise.ShardedClient(shards[0].url, ["t0", "t1"]) as c:
        with pytest.raises(reprise.InvalidArgumentError,
                           match=r"table 'replay': shard 0 \(prefix 't0'\) has sampler uniform, shard 1 \(prefix 't1'\) "
                                 r"has prioritized\(1\): a table's shards need the same sampler"):
            c.sample_batch("replay", 1, timeout=5)
        with pytest.raises(reprise.NotFoundError, match=r"shard 1 \(prefix 't1'\): unknown table \"limited\""):
            c.sample_batch("limited", 1, timeout=5)
        with pytest.raises(reprise.InvalidArgumentError, match=r"table 'limited' is not served by shard 1 \(prefix 't1'\)"):
            c.server_info()
        info = c.shard_info()
        assert "limited" in info[0] and "limited2" in info[1]


def test_writer_writes_each_episode_to_one_shard(sc: reprise.ShardedClient) -> None:
    sc.reset("replay")
    with sc.trajectory_writer(3) as w:
        first = w.shard
        shard_of_episode = []
        for ep in range(12):
            shard_of_episode.append(w.shard)
            for t in range(5):
                w.append({"ep": np.int64(ep), "t": np.int64(t)})
                if w.episode_steps >= 3:
                    w.create_item("replay", 1.0, {"ep": w.history["ep"][-3:], "t": w.history["t"][-3:]})
            w.end_episode(timeout=30)
    # Closed without a rejection: every item was on the shard its key names.
    assert shard_of_episode == [(first + e) % 2 for e in range(12)]
    assert [t["replay"].current_size for t in sc.shard_info()] == [18, 18]
    assert sc.server_info()["replay"].current_size == 36
    for i in (0, 1):
        b = sc.shard(i).sample_batch("replay", 200, timeout=5)
        assert (b.info.key % 2 == i).all()
        eps, steps = b.data["ep"], b.data["t"]
        assert ((eps[:, 0] + first) % 2 == i).all()  # the shard's episodes, whole
        assert (eps == eps[:, :1]).all() and (steps == steps[:, :1] + np.arange(3)).all()


def test_writer_moves_on_when_an_episode_ends_and_its_wait_fails(sc: reprise.ShardedClient, shards: list[Reprised]) -> None:
    """An episode whose items are published has ended even when waiting
    for them times out, so the next episode goes to the next shard, in the
    sync and the async writer alike. Its error is no EpisodeNotEndedError,
    and end_episode called again (as after any error) finds an episode of
    no steps on the next shard and stays there: it ended that empty
    episode and moved on again, and the next episode skipped a shard."""
    sc.reset("held")
    with sc.trajectory_writer(1, linger=0.0) as w:
        first = w.shard
        for i in range(3):
            w.append({"x": np.int64(i)})
            w.create_item("held", 1.0, {"x": w.history["x"][-1]})
        with pytest.raises(reprise.DeadlineExceededError) as e:
            w.end_episode(timeout=0.3)  # the shard's table holds the third item
        assert not isinstance(e.value, reprise.EpisodeNotEndedError)
        assert w.shard == (first + 1) % 2
        w.end_episode(timeout=30)
        assert w.shard == (first + 1) % 2

    async def main() -> None:
        async with reprise.aio.ShardedClient(shards[0].url, PREFIXES) as c:
            await c.reset("held")
            async with await c.trajectory_writer(1, linger=0.0) as aw:
                first = aw.shard
                for i in range(3):
                    await aw.append({"x": np.int64(i)})
                    await aw.create_item("held", 1.0, {"x": aw.history["x"][-1]})
                with pytest.raises(reprise.DeadlineExceededError) as e:
                    await aw.end_episode(timeout=0.3)
                assert not isinstance(e.value, reprise.EpisodeNotEndedError)
                assert aw.shard == (first + 1) % 2
                await aw.end_episode(timeout=30)
                assert aw.shard == (first + 1) % 2

    asyncio.run(main())
    sc.reset("held")


def test_a_closed_writer_says_so_before_asking_the_shards(sc: reprise.ShardedClient, shards: list[Reprised]) -> None:
    """create_item of a closed sharded writer raises ClosedError, as the Go
    ShardedProducer's CreateItem returns ErrClosed, before it asks the
    shards about a table it has not written to: it raised what the shards
    said of the table (NotFoundError for an unknown one), sync and async
    writers alike."""
    w = sc.trajectory_writer(1)
    w.append({"x": np.int64(0)})
    ref = w.history["x"][-1]
    w.close()
    with pytest.raises(reprise.ClosedError):
        w.create_item("nosuch", 1.0, {"x": ref})

    async def main() -> None:
        async with reprise.aio.ShardedClient(shards[0].url, PREFIXES) as c:
            aw = await c.trajectory_writer(1)
            await aw.append({"x": np.int64(0)})
            ref = aw.history["x"][-1]
            await aw.close()
            with pytest.raises(reprise.ClosedError):
                await aw.create_item("nosuch", 1.0, {"x": ref})

    asyncio.run(main())


def test_a_shard_whose_close_waits_leaves_the_others_their_time(sc: reprise.ShardedClient) -> None:
    """A sharded writer's close closes the shards' writers at once, each
    within the timeout, as the Go ShardedProducer's Close does (and the
    async writer's): the sync writer closed them one after the other, and
    a shard whose close waited out the timeout (its table holding its
    items) left the next shard no time, whose close gave up on its closing
    message and raised a loss for a shard that lost nothing."""
    sc.reset("held")
    w = sc.trajectory_writer(1, linger=0.0, max_unapplied=1)
    w._shard = 0
    for i in range(4):  # the queue takes two, holds the third: the fourth waits for room
        w.append({"x": np.int64(i)})
        w.create_item("held", 1.0, {"x": w.history["x"][-1]})
    with pytest.raises(reprise.RepriseError) as e:
        w.close(timeout=1)
    assert "shard 0 (prefix 's0')" in e.value.message, e.value.message
    assert "shard 1" not in e.value.message, e.value.message
    sc.reset("held")


def give_up_on_shards(writers: Sequence[Any]) -> None:
    """Records on the writer of shard 0 a message given up on that may be
    stored, and on that of shard 1 one not stored, as their transports do
    (messages of no items: the counts stay as they are)."""
    from reprise._writer import not_stored_error, outcome_unknown_error

    for w, err in zip(writers, (outcome_unknown_error(reprise.DeadlineExceededError("no ack"), 1, 0),
                                not_stored_error(reprise.UnavailableError("no stream answered"), 1, 0))):
        with w._p.mu:
            w._p.errors.append(err)


def check_both_shards_lost(e: reprise.RepriseError) -> None:
    assert isinstance(e, reprise.OutcomeUnknownError) and isinstance(e, reprise.NotStoredError), repr(e)
    assert "shard 0 (prefix 's0'): message 1 (0 items) may be stored" in e.message, e.message
    assert "shard 1 (prefix 's1'): message 1 (0 items) not stored" in e.message, e.message


def test_writer_raises_every_shards_loss(sc: reprise.ShardedClient, shards: list[Reprised]) -> None:
    """A flush over the shards raises the errors of every shard's writer,
    each naming its shard, as one of every kind of loss among them, as the
    Go ShardedProducer's joined error is. It raised the first shard's
    alone, though each writer's flush had taken its errors: a message of
    unknown outcome on shard 0 hid for ever that shard 1 lost one, and
    ``except NotStoredError`` missed it; sync and async writers alike."""
    with sc.trajectory_writer(1, linger=0.0) as w:
        give_up_on_shards(w.writers)
        with pytest.raises(reprise.RepriseError) as e:
            w.flush(timeout=30)
        check_both_shards_lost(e.value)
        w.flush(timeout=30)  # each loss reported once

    async def main() -> None:
        async with reprise.aio.ShardedClient(shards[0].url, PREFIXES) as c:
            async with await c.trajectory_writer(1, linger=0.0) as aw:
                give_up_on_shards(aw.writers)
                with pytest.raises(reprise.RepriseError) as e:
                    await aw.flush(timeout=30)
                check_both_shards_lost(e.value)
                await aw.flush(timeout=30)

    asyncio.run(main())


def test_an_interrupted_flush_leaves_at_once_and_loses_no_shards_error(sc: reprise.ShardedClient, shards: list[Reprised]) -> None:
    """A KeyboardInterrupt in the thread that calls a sync sharded writer's
    flush (which runs shard 0's) leaves the call at once, and the errors
    that the other shards' calls, running on, took from their writers are
    raised by the next call. The call waited for every other shard's wait
    to end (with no timeout, for ever) before it raised the interrupt,
    then dropped their errors: shard 1's loss was never raised. So do
    exceptions that are no RepriseError leave the shards' errors to the
    next call, in the async writer too, which dropped them as well."""
    w = sc.trajectory_writer(1, linger=0.0)
    give_up_on_shards(w.writers)
    first, second = w.writers
    release, done = threading.Event(), threading.Event()
    flush = second.flush

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    def slow(*args: Any, **kwargs: Any) -> None:
        try:
            release.wait(10)
            flush(*args, **kwargs)
        finally:
            done.set()

    first.flush, second.flush = interrupted, slow  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        w.flush(timeout=30)
    assert not done.is_set(), "the interrupted flush waited for shard 1's"
    release.set()
    wait_for("shard 1's flush to end", done.is_set)
    del first.flush, second.flush
    with pytest.raises(reprise.RepriseError) as e:
        w.flush(timeout=30)
    check_both_shards_lost(e.value)

    give_up_on_shards(w.writers)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    first.flush = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        w.flush(timeout=30)
    del first.flush
    with pytest.raises(reprise.RepriseError) as e:
        w.flush(timeout=30)
    check_both_shards_lost(e.value)
    w.flush(timeout=30)  # each loss reported once
    w.close()

    async def main() -> None:
        async with reprise.aio.ShardedClient(shards[0].url, PREFIXES) as c:
            aw = await c.trajectory_writer(1, linger=0.0)
            give_up_on_shards(aw.writers)

            async def abroken(*args: Any, **kwargs: Any) -> None:
                raise RuntimeError("a bug")

            aw.writers[0].flush = abroken  # type: ignore[method-assign]
            with pytest.raises(RuntimeError):
                await aw.flush(timeout=30)
            del aw.writers[0].flush
            with pytest.raises(reprise.RepriseError) as e:
                await aw.flush(timeout=30)
            check_both_shards_lost(e.value)
            await aw.flush(timeout=30)
            await aw.close()

    asyncio.run(main())


def test_insert_goes_to_one_random_shard(sc: reprise.ShardedClient) -> None:
    sc.reset("replay")
    for x in range(24):
        sc.insert({"x": np.int64(x)}, {"replay": 1.0})
    sizes = [t["replay"].current_size for t in sc.shard_info()]
    # Both shards get some: all 24 on one has probability 2**-23.
    assert sum(sizes) == 24 and min(sizes) > 0


def test_plain_writer_to_a_shard_gets_foreign_keys_rejected(shards: list[Reprised]) -> None:
    with reprise.Client(shards[1].url, prefix="s1") as c:
        w = c.trajectory_writer(1)
        # 40 random keys are all odd (shard 1's) with probability 2**-40.
        with pytest.raises(reprise.RejectedError, match="belongs to shard 0 of 2, and this service is shard 1/2") as e:
            for x in range(40):
                w.append({"x": np.int64(x)})
                w.create_item("replay", 1.0, {"x": w.history["x"][-1]})
            w.flush(timeout=30)
        assert e.value.rejections and all(r.item_key % 2 == 0 for r in e.value.rejections)
        assert isinstance(e.value, reprise.InvalidArgumentError)
        with contextlib.suppress(reprise.RejectedError):
            w.close()


def test_uniform_shares_follow_sizes(sc: reprise.ShardedClient, shards: list[Reprised]) -> None:
    sc.reset("uniform")
    fill(sc.shard(0), "uniform", range(30))
    fill(sc.shard(1), "uniform", range(100, 190))
    # A new client: its first draw asks both shards.
    with reprise.ShardedClient(shards[0].url, PREFIXES) as c:
        n, from0 = 0, 0
        for _ in range(20):
            b = c.sample_batch("uniform", 500, timeout=10)
            assert len(b) == 500
            on0 = b.info.key % 2 == 0
            # Items and their data placed together: shard 0 holds x < 100.
            assert ((b.data["x"] < 100) == on0).all()
            np.testing.assert_allclose(b.info.probability, 1 / 120, rtol=1e-12)
            assert (b.info.table_size == 120).all()
            # Drawn order, not grouped by shard (a random order of ~125 and
            # ~375 is sorted with probability below 1e-100).
            assert (np.diff(on0.astype(int)) != 0).sum() > 1
            from0 += int(on0.sum())
            n += len(b)
        assert abs(from0 / n - 0.25) <= hoeffding(n)
        samples = list(c.sample("uniform", 50, timeout=10))
        assert len(samples) == 50
        for s in samples:
            assert s.info.probability == pytest.approx(1 / 120, rel=1e-12)
            assert s.info.table_size == 120
            assert (int(s.data["x"]) < 100) == (s.info.key % 2 == 0)
        got = 0
        with c.sampler("uniform", 100, prefetch=3, timeout=10) as it:
            for b in it:
                assert len(b) == 100
                np.testing.assert_allclose(b.info.probability, 1 / 120, rtol=1e-12)
                got += 1
                if got == 5:
                    break


@pytest.mark.parametrize("prefetch", [1, 3])
def test_sharded_samplers_keep_prefetch_calls_in_flight(
    sc: reprise.ShardedClient, shards: list[Reprised], prefetch: int
) -> None:
    """Both sharded samplers send the call that replaces a batch before
    they hand it out, so prefetch calls are in flight while the caller
    trains on it, as with the unsharded samplers."""
    sc.reset("uniform")
    fill(sc.shard(0), "uniform", range(10))
    fill(sc.shard(1), "uniform", range(100, 110))
    with sc.sampler("uniform", 8, prefetch=prefetch, timeout=10) as it:
        for k in range(5):
            assert len(next(it)) == 8
            assert len(it._futs) == prefetch, f"after batch {k}"

    async def main() -> None:
        async with reprise.aio.ShardedClient(shards[0].url, PREFIXES) as c:
            async with c.sampler("uniform", 8, prefetch=prefetch, timeout=10) as ait:
                for k in range(5):
                    assert len(await ait.__anext__()) == 8
                    assert len(ait._tasks) == prefetch, f"after batch {k}"

    asyncio.run(main())


def test_prioritized_probabilities(sc: reprise.ShardedClient) -> None:
    sc.reset("prio")
    p0 = [0.5, 1.0, 2.0, 3.0, 4.0]
    p1 = [0.25, 6.0, 7.5, 10.0, 0.0]
    fill(sc.shard(0), "prio", range(5), p0)
    fill(sc.shard(1), "prio", range(5, 10), p1)
    prio = dict(enumerate(p0 + p1))
    w = {x: p**0.7 for x, p in prio.items()}
    total = sum(w.values())
    info = sc.server_info()["prio"]
    assert info.weight == pytest.approx(total, rel=1e-12)
    assert info.current_size == 10
    n, from0 = 0, 0
    for _ in range(4):
        b = sc.sample_batch("prio", 500, timeout=10)
        xs = b.data["x"].tolist()
        np.testing.assert_allclose(b.info.priority, [prio[x] for x in xs], rtol=0)
        np.testing.assert_allclose(b.info.probability, [w[x] / total for x in xs], rtol=1e-9)
        assert 9 not in xs  # priority 0
        from0 += int((b.info.key % 2 == 0).sum())
        n += len(b)
    assert abs(from0 / n - sum(w[x] for x in range(5)) / total) <= hoeffding(n)


def test_mutations_reach_the_shard_of_each_key(sc: reprise.ShardedClient) -> None:
    sc.reset("mut")
    fill(sc.shard(0), "mut", range(10))
    fill(sc.shard(1), "mut", range(10, 20))
    key = {**all_keys(sc.shard(0), "mut", 10), **all_keys(sc.shard(1), "mut", 10)}
    assert all(key[x] % 2 == (x >= 10) for x in key)
    xs = list(range(20))
    random.Random(3).shuffle(xs)  # the shards' keys mixed
    sc.update_priorities("mut", [key[x] for x in xs], [x + 1.0 for x in xs])
    per = sc.shard_info()
    assert per[0]["mut"].weight == sum(range(1, 11))
    assert per[1]["mut"].weight == sum(range(11, 21))
    b = sc.sample_batch("mut", 200, timeout=10)
    np.testing.assert_array_equal(b.info.priority, b.data["x"] + 1.0)
    np.testing.assert_allclose(b.info.probability, (b.data["x"] + 1.0) / 210, rtol=1e-12)

    gone = [0, 1, 2, 10, 11]
    sc.mutate_priorities("mut", updates={key[5]: 0.5, key[15]: 2.0}, deletes=[key[x] for x in gone])
    per = sc.shard_info()
    assert [t["mut"].current_size for t in per] == [7, 8]
    assert [t["mut"].num_deletes for t in per] == [3, 2]
    left = {x: x + 1.0 for x in range(20) if x not in gone} | {5: 0.5, 15: 2.0}
    total = sum(left.values())
    # Right after the mutation: the shards' sizes and weights are asked
    # again, not taken from the last sample.
    b = sc.sample_batch("mut", 200, timeout=10)
    assert not set(b.data["x"].tolist()) & set(gone)
    assert (b.info.table_size == 15).all()
    np.testing.assert_allclose(b.info.probability, [left[x] / total for x in b.data["x"].tolist()], rtol=1e-12)


def test_sharded_mutations_refuse_keys_out_of_range(sc: reprise.ShardedClient) -> None:
    """A key a uint64 cannot hold is refused, as by Client: cast as it
    was, an int64 -1 became 2**64-1 and deleted or updated that key on
    its shard, and a list's -1 raised a bare OverflowError."""
    for call in (
        lambda: sc.mutate_priorities("mut", deletes=np.array([-1], np.int64)),
        lambda: sc.mutate_priorities("mut", deletes=[-1]),
        lambda: sc.mutate_priorities("mut", updates={np.int64(-1): 1.0}),
        lambda: sc.mutate_priorities("mut", deletes=[1 << 64]),
    ):
        with pytest.raises(reprise.InvalidArgumentError, match="2\\*\\*64-1"):
            call()


def test_server_info_sums_the_shards(sc: reprise.ShardedClient) -> None:
    sc.reset("replay")
    fill(sc.shard(0), "replay", range(3), versions=[1, 2, 3])
    fill(sc.shard(1), "replay", range(4), versions=[2, 3, 4, 5])
    sc.set_policy_version("replay", 4)
    sc.sample_batch("replay", 50, timeout=10)
    per = [t["replay"] for t in sc.shard_info()]
    agg = sc.server_info()["replay"]
    assert agg.current_size == 7 and agg.max_size == 200000
    assert agg.policy_version == 4 and [t.policy_version for t in per] == [4, 4]
    assert (agg.min_item_version, agg.max_item_version) == (1, 5)
    assert agg.rate_limiter_info.samples == 50  # since the reset
    for f in ("current_size", "bytes_held", "num_inserts", "num_samples", "num_deletes", "num_evictions",
              "insert_waits", "sample_waits", "num_stale_evictions", "num_episodes", "num_deleted_episodes",
              "num_unique_samples"):
        assert getattr(agg, f) == sum(getattr(t, f) for t in per), f
    for f in ("inserts", "samples", "deletes"):
        assert getattr(agg.rate_limiter_info, f) == sum(getattr(t.rate_limiter_info, f) for t in per), f
    assert agg.weight == 7.0 and [t.weight for t in per] == [3.0, 4.0]
    assert (agg.sampler, agg.remover, agg.signature) == (per[0].sampler, per[0].remover, per[0].signature)
    cps = sc.checkpoint()
    assert len(cps) == 2 and all(cp.name for cp in cps)


def test_empty_table_waits_for_items(sc: reprise.ShardedClient) -> None:
    sc.reset("uniform")
    with pytest.raises(reprise.RateLimitedError, match="no shard of the table holds items"):
        sc.sample_batch("uniform", 4, timeout=0.3)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(sc.sample_batch("uniform", 4, timeout=30)))
    t.start()
    fill(sc.shard(1), "uniform", [7])
    t.join(60)
    assert len(got) == 1 and got[0].data["x"].tolist() == [7] * 4


def test_sharded_sampler_refuses_a_timeout_without_time(sc: reprise.ShardedClient, shards: list[Reprised]) -> None:
    """As a Client's sampler: a timeout of 0 or less is refused."""
    with pytest.raises(reprise.InvalidArgumentError, match="timeout must be > 0"):
        sc.sampler("limited", 2, timeout=0)

    async def main() -> None:
        async with reprise.aio.ShardedClient(shards[0].url, PREFIXES) as c:
            with pytest.raises(reprise.InvalidArgumentError, match="timeout must be > 0"):
                c.sampler("limited", 2, timeout=0.0)

    asyncio.run(main())


def test_rate_limited_shard_leaves_its_positions_out(sc: reprise.ShardedClient) -> None:
    sc.reset("limited")
    fill(sc.shard(0), "limited", range(10))
    fill(sc.shard(1), "limited", [10])  # below the shard's min_size of 5
    # Shard 1 is drawn for some of 200 positions but with probability
    # (10/11)**200 < 1e-8, shard 0 for none with (1/11)**200.
    with pytest.raises(reprise.RateLimitedError, match="shard 1 \\(prefix 's1'\\)") as e:
        sc.sample_batch("limited", 200, timeout=0.5)
    part = e.value.partial
    assert 0 < len(part) < 200
    assert (part.info.key % 2 == 0).all() and (part.data["x"] < 10).all()
    np.testing.assert_allclose(part.info.probability, 1 / 11, rtol=1e-12)
    assert (part.info.table_size == 11).all()
    b = sc.sample_batch("limited", 200, timeout=0.5, flexible=True)
    assert 0 < len(b) < 200 and (b.info.key % 2 == 0).all()


def test_dead_shard_weighs_nothing_until_it_answers(reprised_factory: Any) -> None:
    s0, s1 = start_shards(reprised_factory)
    with reprise.ShardedClient(s0.url, PREFIXES) as c:
        fill(c.shard(0), "replay", range(10))
        fill(c.shard(1), "replay", range(10, 20))
        assert len(c.sample_batch("replay", 10, timeout=10)) == 10
        s1.kill9()
        # Drawn for shard 1 (all but with probability 2**-200 when its state
        # is still the last reply's), the call gets its error and shard 0's
        # items; or shard 1 is known down already and weighs 0.
        try:
            b = c.sample_batch("replay", 200, timeout=5)
            assert len(b) == 200 and (b.info.key % 2 == 0).all()
        except (reprise.UnavailableError, reprise.DeadlineExceededError) as e:
            assert "shard 1 (prefix 's1')" in e.message
            assert 0 < len(e.partial) < 200 and (e.partial.info.key % 2 == 0).all()

        def from_shard0_alone() -> reprise.SampleBatch:
            return c.sample_batch("replay", 200, timeout=2)

        b = wait_for("samples from shard 0 alone", from_shard0_alone)
        assert len(b) == 200 and (b.info.key % 2 == 0).all() and (b.data["x"] < 10).all()
        np.testing.assert_allclose(b.info.probability, 1 / 10, rtol=1e-12)
        assert (b.info.table_size == 10).all()
        with c.sampler("replay", 200, timeout=5) as it:
            for _ in range(3):
                b = next(it)
                assert len(b) == 200 and (b.info.key % 2 == 0).all()
        with pytest.raises(reprise.UnavailableError, match="shard 1 \\(prefix 's1'\\)"):
            c.server_info(timeout=5)

        s1.start()  # the same prefix and stream: its items come back

        def both() -> reprise.SampleBatch | None:
            # Shard 1 answers while it replays its stream: until then it
            # holds fewer items, and the probabilities say so.
            b = c.sample_batch("replay", 200, timeout=5)
            return b if np.allclose(b.info.probability, 1 / 20, rtol=1e-12, atol=0) else None

        b = wait_for("samples from both shards again", both)
        assert len(b) == 200 and (b.info.table_size == 20).all()
        # Shard 1 is drawn for none of 200 positions with probability 2**-200.
        assert (b.info.key % 2 == 1).any() and ((b.data["x"] >= 10) == (b.info.key % 2 == 1)).all()


@pytest.fixture
def hung_shard(reprised_factory: Any) -> Iterator[tuple[Reprised, Reprised]]:
    """Two shards holding 10 items of "replay" each (x 0-9 on shard 0, 10-19
    on shard 1), for a test to hang shard 1 with hang(); it goes on at the
    end."""
    s0, s1 = start_shards(reprised_factory)
    with reprise.ShardedClient(s0.url, PREFIXES) as c:
        fill(c.shard(0), "replay", range(10))
        fill(c.shard(1), "replay", range(10, 20))
    try:
        yield s0, s1
    finally:
        assert s1.proc is not None
        s1.proc.send_signal(signal.SIGCONT)


def hang(r: Reprised) -> None:
    """Stops r's process (SIGSTOP), as a stuck or paused one: NATS still
    takes its requests, and nobody answers them."""
    assert r.proc is not None
    r.proc.send_signal(signal.SIGSTOP)


def test_short_timeouts_sample_while_a_shard_hangs(
    hung_shard: tuple[Reprised, Reprised], caplog: pytest.LogCaptureFixture
) -> None:
    """With shard 1 hung, calls whose timeout is under the info requests' 2 s
    get shard 0's items, and shard 0 is never said not to answer. Each call
    used to spend its whole timeout on shard 1's info request, then send
    shard 0's sample with no time left: DeadlineExceededError blaming shard
    0, which was marked down. No call succeeded, and a sampler with that
    timeout ended at once."""
    s0, s1 = hung_shard
    hang(s1)
    with caplog.at_level(logging.WARNING, logger="reprise"), reprise.ShardedClient(s0.url, PREFIXES) as c:
        for _ in range(3):
            b = c.sample_batch("replay", 4, timeout=1.5)
            assert len(b) == 4 and (b.info.key % 2 == 0).all()
        with c.sampler("replay", 4, prefetch=1, timeout=1.5) as it:
            for _ in range(5):
                b = next(it)
                assert len(b) == 4 and (b.info.key % 2 == 0).all()
    assert not [r.getMessage() for r in caplog.records if "shard 0" in r.getMessage()]


def test_sampler_goes_on_while_a_shard_hangs(hung_shard: tuple[Reprised, Reprised]) -> None:
    """A sampler without a timeout (ReplayDataset's default) goes on handing
    out batches of shard 0's items once shard 1 hangs mid-use. A draw that
    included shard 1 used to wait for its reply for about 70 s (the probe
    of a waiting sample only told a shard nobody listens for), and once it
    was down every draw waited for its info again, 2 s. Go's sampler
    waited the same (TestShardedSamplerGoesOnWhileAShardHangs)."""
    s0, s1 = hung_shard
    full = [0]  # batches of 8 of shard 0's items
    with reprise.ShardedClient(s0.url, PREFIXES) as c:
        assert len(c.sample_batch("replay", 8, timeout=10)) == 8
        hang(s1)
        it = c.sampler("replay", 8, prefetch=2)

        def learn() -> None:
            for b in it:
                if len(b) == 8 and (b.info.key % 2 == 0).all():
                    full[0] += 1

        t = threading.Thread(target=learn, daemon=True)
        t.start()
        try:
            # Far below the 70 s that one draw used to wait.
            wait_for("30 batches of shard 0's items while shard 1 hangs", lambda: full[0] >= 30, timeout=40)
        finally:
            it.close()
            t.join(30)
        assert not t.is_alive()
        assert c._aclient._states["replay"].down[1] is not None


@contextlib.contextmanager
def own_reprised(binaries: dict[str, Path], tmp_path: Path) -> Iterator[Callable[..., Reprised]]:
    """make(tables, extra, **kwargs) starts a reprised of a test's own, each
    in a folder of tmp_path; every one is killed at the end."""
    made: list[Reprised] = []

    def make(tables: str, extra: list[str], **kwargs: Any) -> Reprised:
        d = tmp_path / f"r{len(made)}"
        d.mkdir()
        r = Reprised(binaries["reprised"], d, tables, extra, **kwargs)
        made.append(r)
        r.start()
        return r

    try:
        yield make
    finally:
        for r in reversed(made):
            r.kill9()


def test_no_probe_fails_unretrieved_after_close(reprised_factory: Any) -> None:
    """A draw that waits for items while a shard is down probes that shard
    in the background; once the client closed, a probe it started then
    failed with ClosedError that nobody retrieved ("Task exception was
    never retrieved"). None starts after close."""
    shards = start_shards(reprised_factory)
    shards[1].kill9()  # down (no responders); shard 0 answers, empty
    contexts: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: contexts.append(ctx))
        c = reprise.aio.ShardedClient(shards[0].url, PREFIXES)
        await c.connect()
        await c.shard(0).reset("uniform")
        draw = asyncio.ensure_future(c.sample_batch("uniform", 4, timeout=30))
        while ("uniform", 1) not in c._probes:  # waits for items, probing shard 1
            await asyncio.sleep(0.01)
        await c.close()
        with pytest.raises(reprise.RepriseError):
            await draw
        assert all(t.done() for t in c._probes.values())
        del c, draw
        gc.collect()
        await asyncio.sleep(0)  # the loop's handler runs for what gc found
        lost = [f"{x.get('message')}: {x.get('exception')!r}" for x in contexts if "never retrieved" in str(x.get("message"))]
        assert not lost, lost

    asyncio.run(main())


def test_a_refresh_given_up_leaves_no_failure_unseen() -> None:
    """A draw whose caller gives up (asyncio.wait_for, a sampler's aclose)
    while it waits for the shards' info stops waiting, not the requests: one
    that fails afterwards was left failing unseen ("exception was never
    retrieved")."""
    contexts: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: contexts.append(ctx))
        c = reprise.aio.ShardedClient("nats://127.0.0.1:1", PREFIXES)  # never connected: _info is replaced
        started, fail = asyncio.Semaphore(0), asyncio.Event()

        async def failing_info(timeout: float | None, table: str = "") -> Any:
            started.release()
            await fail.wait()
            raise reprise.InvalidArgumentError("a failure that is not the shard being down")

        for sh in c._shards:
            sh._info = failing_info  # type: ignore[method-assign]
        draw = asyncio.ensure_future(c._refresh("t", _sharded._TableState("t", tuple(c.prefixes)), [0, 1], 30.0))
        for _ in c._shards:
            await started.acquire()
        draw.cancel()
        with pytest.raises(asyncio.CancelledError):
            await draw
        fail.set()
        while c._refreshing:
            await asyncio.sleep(0.01)
        del draw
        gc.collect()
        await asyncio.sleep(0)
        lost = [f"{x.get('message')}: {x.get('exception')!r}" for x in contexts if "never retrieved" in str(x.get("message"))]
        assert not lost, lost

    asyncio.run(main())


def test_every_shard_down_is_unavailable(binaries: dict[str, Path], tmp_path: Path) -> None:
    """With no shard answering there is no item to wait for: a sample fails
    with UnavailableError naming the shards, as a Client's does when its
    service is gone, rather than wait out its timeout and blame the rate
    limiter. The shards serve on a third reprised's NATS server, which
    stays up."""
    with own_reprised(binaries, tmp_path) as make:
        host = make(TABLES, [], prefix="host")
        s0 = make(TABLES, ["--shard", "0/2"], prefix="s0", nats=host.url)
        s1 = make(TABLES, ["--shard", "1/2"], prefix="s1", nats=host.url)
        with reprise.ShardedClient(host.url, PREFIXES) as c:
            fill(c.shard(0), "replay", range(5))
            assert len(c.sample_batch("replay", 4, timeout=10)) == 4
            s0.kill9()
            s1.kill9()
            with pytest.raises(reprise.UnavailableError):
                c.sample_batch("replay", 4, timeout=30)  # may name the shard it drew
            for _ in range(2):
                with pytest.raises(reprise.UnavailableError, match="no shard of the table answers.*shard 1 \\(prefix 's1'\\)"):
                    c.sample_batch("replay", 4, timeout=30)


def test_client_started_while_a_shard_is_down(binaries: dict[str, Path], tmp_path: Path) -> None:
    """A learner started while a shard is down samples the others, and the
    shard once it is back, checked then: one that comes back as another
    shard's place is refused. Every call of such a client used to fail
    until the shard came back."""
    with own_reprised(binaries, tmp_path) as make:
        host = make(TABLES, [], prefix="host")
        make(TABLES, ["--shard", "0/2"], prefix="s0", nats=host.url)
        s1 = make(TABLES, ["--shard", "1/2"], prefix="s1", nats=host.url)
        with reprise.ShardedClient(host.url, PREFIXES) as c:
            c.reset("uniform")
            fill(c.shard(0), "uniform", range(10))
            fill(c.shard(1), "uniform", range(100, 130))
        s1.kill9()
        with reprise.ShardedClient(host.url, PREFIXES) as c:
            b = c.sample_batch("uniform", 50, timeout=10)
            assert set((b.info.key % 2).tolist()) == {0}
            np.testing.assert_allclose(b.info.probability, 1 / 10)
            back = make(TABLES, ["--shard", "1/2"], prefix="s1", nats=host.url)
            wait_for("samples from shard 1 once it is back",
                     lambda: 1 in (c.sample_batch("uniform", 50, timeout=10).info.key % 2).tolist())
            back.kill9()
        with reprise.ShardedClient(host.url, PREFIXES) as c:
            c.sample_batch("uniform", 1, timeout=10)
            make(TABLES, ["--shard", "0/2"], prefix="s1", nats=host.url)  # the wrong place

            def refused() -> bool:
                try:
                    c.sample_batch("uniform", 1, timeout=10)
                except reprise.InvalidArgumentError as e:
                    return "expected shard 1/2" in str(e)
                return False

            wait_for("the misplaced shard is refused", refused)


def test_async_sharded_client(shards: list[Reprised]) -> None:
    async def main() -> None:
        async with reprise.aio.ShardedClient(shards[0].url, PREFIXES) as c:
            await c.reset("mut")
            async with await c.trajectory_writer(2) as w:
                first = w.shard
                for ep in range(4):
                    for t in range(3):
                        await w.append({"x": np.int64(10 * ep + t)})
                        await w.create_item("mut", 1.0, {"x": w.history["x"][-1]})
                    await w.end_episode(timeout=30)
                await w.wait_applied(timeout=30)
            per = await c.shard_info()
            assert [t["mut"].current_size for t in per] == [6, 6]
            b = await c.sample_batch("mut", 100, timeout=10)
            # Episode e went to shard (first + e) % 2.
            np.testing.assert_array_equal(b.info.key % 2, (b.data["x"] // 10 + first) % 2)
            np.testing.assert_allclose(b.info.probability, 1 / 12, rtol=1e-12)
            await c.update_priorities("mut", b.info.key, b.data["x"] + 1.0)
            samples = await c.sample("mut", 20, timeout=10)
            assert len(samples) == 20
            n = 0
            async with c.sampler("mut", 16, prefetch=2, timeout=10) as it:
                async for batch in it:
                    assert len(batch) == 16
                    n += 1
                    if n == 3:
                        break
            assert (await c.server_info())["mut"].current_size == 12
            assert len(await c.checkpoint()) == 2

    asyncio.run(main())


def test_torch_dataset_over_shards(sc: reprise.ShardedClient, shards: list[Reprised]) -> None:
    """The PyTorch dataset reads a sharded table through prefixes: batches
    hold both shards' items with the whole table's probabilities."""
    torch = pytest.importorskip("torch")
    import reprise.torch as rt

    sc.reset("uniform")
    fill(sc.shard(0), "uniform", range(10))
    fill(sc.shard(1), "uniform", range(100, 130))
    ds = rt.ReplayDataset(shards[0].url, "uniform", batch_size=64, prefixes=PREFIXES)
    try:
        seen = set()
        for i, b in enumerate(ds):
            assert b.data["x"].shape == (64,) and b.data["x"].dtype == torch.int64
            torch.testing.assert_close(b.info["probability"], torch.full((64,), 1 / 40, dtype=torch.float64))
            seen.update((b.info_numpy.key % 2).tolist())
            ds.update_priorities(b.info["key"], torch.ones(64))
            if i == 4:
                break
        # 320 draws miss a shard holding a quarter of the table with
        # probability 0.75^320 < 1e-39.
        assert seen == {0, 1}
    finally:
        ds.close()


@pytest.mark.parametrize("table", ["replay", "limited"])
def test_sharded_sampler_close_from_another_thread(sc: reprise.ShardedClient, table: str) -> None:
    """close() ends a next() that waits on an empty table: the call it
    waits on is cancelled too. It waited out the sample wait."""
    sc.reset(table)
    s = sc.sampler(table, 4)
    assert close_while_waiting(s, s.close) == ["stop"]


def test_sharded_client_close_while_iterating(shards: list[Reprised]) -> None:
    """A sharded client closed while a sampler waits on an empty table ends
    the sampler's iteration. Its draw was left pending in the closed event
    loop, and the iterating thread waited for good."""
    c = reprise.ShardedClient(shards[0].url, PREFIXES)
    c.reset("replay")
    assert close_while_waiting(c.sampler("replay", 4), c.close) == ["stop"]


def test_async_sharded_sampler_aclose_from_another_task(shards: list[Reprised]) -> None:
    """aclose() from another task ends the waiting __anext__ with
    StopAsyncIteration."""

    async def main() -> Any:
        async with reprise.aio.ShardedClient(shards[0].url, PREFIXES) as c:
            await c.reset("replay")
            return await aclose_while_waiting(c.sampler("replay", 4))

    assert asyncio.run(main()) == "stop"
