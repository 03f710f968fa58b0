"""Sample requests a learner stopped waiting for are withdrawn: on a queue
table they take nothing, and every item inserted afterwards reaches the
next reader. NATS request-reply has no cancellation: the service kept such
a request waiting for the rate limiter, and it took the next item for
nobody."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
import pytest

import reprise
from reprise import aio as raio
from reprise._proto import reprise_pb2 as pb

from conftest import wait_for

QUEUE = """
tables:
  - {name: q, max_size: 100, rate_limiter: {preset: queue}}
"""

N = 8


def barrier(c: reprise.Client) -> None:
    """Returns once the service took every message c sent on the sample
    subject before: a request of the empty queue that cannot wait is
    answered only after the withdrawals before it were taken."""
    with pytest.raises(reprise.RateLimitedError):
        c.sample_batch("q", 1, timeout=1.0)


def sample_messages(c: reprise.Client) -> int:
    """How many messages the service's sample endpoint has handled
    (requests and withdrawals), as its NATS micro stats count them."""
    m = c._call(c._aclient.nats.request("$SRV.STATS.reprise", b"", timeout=5))
    return sum(e["num_requests"] for e in json.loads(m.data)["endpoints"] if e["name"] == "sample")


def insert_and_read(url: str, c: reprise.Client, sampled_before: int = 0) -> None:
    """Inserts N items into the empty queue and reads them with a fresh
    client: every one arrives, once, and the table counts N samples more
    than the sampled_before it counted."""
    for i in range(N):
        c.insert({"x": np.float32(i)}, {"q": 1.0})
    got: list[int] = []
    with reprise.Client(url) as reader:
        while len(got) < N:
            try:
                b = reader.sample_batch("q", 1, timeout=5)
            except reprise.RateLimitedError:
                pytest.fail(f"only {sorted(got)} of {N} items reached the reader: an abandoned request took the others")
            assert b.info.times_sampled.tolist() == [1]
            got.append(int(b.data["x"][0]))
        info = reader.server_info()["q"]
    assert sorted(got) == list(range(N))
    # The withdrawn requests counted no sample, with the table or its limiter.
    n = sampled_before + N
    assert (info.num_samples, info.rate_limiter_info.samples, info.current_size) == (n, n, 0)


@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_a_sampler_ended_by_its_timeout_leaves_nothing_waiting(reprised_factory: Any, prefetch: int) -> None:
    """A sampler whose timeout ends it withdraws the requests it had in
    flight, and sends none after the reply that ends it."""
    r = reprised_factory(QUEUE)
    with reprise.Client(r.url) as c:
        with c.sampler("q", 1, prefetch=prefetch, timeout=1) as s:
            assert sum(1 for _ in s) == 0
        barrier(c)
        insert_and_read(r.url, c)


def test_a_closed_sampler_withdraws_its_requests(reprised_factory: Any) -> None:
    r = reprised_factory(QUEUE)
    with reprise.Client(r.url) as c:
        s = c.sampler("q", 1, prefetch=4)
        next_ready = s._next_ready()  # sends the requests, takes none
        assert next_ready is None
        wait_for("4 requests wait", lambda: c.server_info()["q"].sample_waits == 4)
        s.close()
        barrier(c)
        insert_and_read(r.url, c)


def test_closing_the_client_withdraws(reprised_factory: Any) -> None:
    """Requests in flight when their client closes are withdrawn."""
    r = reprised_factory(QUEUE)
    with reprise.Client(r.url) as watch:
        with reprise.Client(r.url) as c:
            s = c.sampler("q", 1, prefetch=4)
            assert s._next_ready() is None
            wait_for("4 requests wait", lambda: watch.server_info()["q"].sample_waits == 4)
        # The withdrawals went out before the connection drained, on
        # another connection than watch's: wait until the service took
        # them (the endpoint counts each message it handled).
        wait_for("the service takes the withdrawals", lambda: sample_messages(watch) >= 8)
        insert_and_read(r.url, watch)


def test_async_withdrawals(reprised_factory: Any) -> None:
    """An AsyncSampler's aclose, its end by its timeout, and a cancelled
    sample_batch withdraw their requests."""
    r = reprised_factory(QUEUE)

    async def main() -> None:
        async with raio.Client(r.url) as c:
            s = c.sampler("q", 1, prefetch=4)
            first = asyncio.ensure_future(s.__anext__())
            while (await c.server_info())["q"].sample_waits < 4:
                await asyncio.sleep(0.01)
            await s.aclose()
            with pytest.raises(StopAsyncIteration):
                await first
            async with c.sampler("q", 1, prefetch=2, timeout=1) as s2:
                assert [b async for b in s2] == []
            before = (await c.server_info())["q"].sample_waits
            task = asyncio.ensure_future(c.sample_batch("q", 1))
            while (await c.server_info())["q"].sample_waits == before:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(reprise.RateLimitedError):
                await c.sample_batch("q", 1, timeout=1.0)  # the barrier

    asyncio.run(main())
    with reprise.Client(r.url) as c:
        insert_and_read(r.url, c)


def test_a_request_the_lost_connection_failed_is_withdrawn(reprised_factory: Any) -> None:
    """A sample call that a lost connection fails (UnavailableError) is
    withdrawn once the client reconnects: the service, on a connection of
    its own, still held the request, which took the next item for
    nobody."""
    r = reprised_factory(QUEUE)

    async def main() -> None:
        async with raio.Client(r.url) as c:
            task = asyncio.ensure_future(c.sample_batch("q", 1))
            while (await c.server_info())["q"].sample_waits < 1:
                await asyncio.sleep(0.01)
            await c.nats.force_reconnect()
            with pytest.raises(reprise.UnavailableError):
                await task
            deadline = asyncio.get_running_loop().time() + 30
            while not c.nats.is_connected:
                assert asyncio.get_running_loop().time() < deadline, "the client did not reconnect"
                await asyncio.sleep(0.01)
            with pytest.raises(reprise.RateLimitedError):
                await c.sample_batch("q", 1, timeout=1.0)  # the barrier

    asyncio.run(main())
    with reprise.Client(r.url) as c:
        insert_and_read(r.url, c)


def test_an_async_sampler_closed_with_its_client_withdraws(reprised_factory: Any) -> None:
    """A sampler's ``async with`` inside its client's: aclose cancels the
    requests, and the client's close follows before the cancelled calls
    ran. The close withdraws them too: it skipped them (cancelled, their
    futures were done) and then dropped them, and the four requests took
    the next four items for nobody."""
    r = reprised_factory(QUEUE)

    async def main() -> None:
        async with raio.Client(r.url) as c:
            async with c.sampler("q", 1, prefetch=4) as s:
                first = asyncio.ensure_future(s.__anext__())
                while (await c.server_info())["q"].sample_waits < 4:
                    await asyncio.sleep(0.01)
        with pytest.raises(StopAsyncIteration):
            await first

    asyncio.run(main())
    with reprise.Client(r.url) as watch:
        wait_for("the service takes the withdrawals", lambda: sample_messages(watch) >= 8)
        insert_and_read(r.url, watch)


def test_withdrawal_bytes() -> None:
    """The withdrawal is a SampleRequest with withdraw set and nothing
    else (golden vectors check its bytes against Go's)."""
    m = pb.SampleRequest.FromString(raio.sample_withdrawal("_INBOX.abc.1f"))
    assert m == pb.SampleRequest(withdraw="_INBOX.abc.1f")


def test_a_closed_sharded_sampler_withdraws_its_requests(reprised_factory: Any) -> None:
    """The shards' requests a ShardedSampler leaves waiting at close are
    withdrawn: a min_size limiter that lets samples through later counts
    only the reader's."""
    r = reprised_factory(extra=["--shard", "0/1"])
    with reprise.Client(r.url) as c:
        c.insert({"x": np.float32(0)}, {"limited": 1.0})  # below min_size 5: samples wait
        with reprise.ShardedClient(r.url, ["reprise"]) as sc:
            s = sc.sampler("limited", 1, prefetch=2)
            assert s._next_ready() is None
            wait_for("2 requests wait", lambda: c.server_info()["limited"].sample_waits == 2)
            s.close()
            # On the connection the shard's requests went out on.
            with pytest.raises(reprise.RateLimitedError):
                sc.shard(0).sample_batch("limited", 1, timeout=1.0)
            for i in range(1, 5):
                c.insert({"x": np.float32(i)}, {"limited": 1.0})
            c.sample_batch("limited", 1, timeout=5)
            info = c.server_info()["limited"]
    assert (info.num_samples, info.rate_limiter_info.samples) == (1, 1)


@contextlib.contextmanager
def ctrl_c_when(cond: Callable[[], bool]) -> Iterator[None]:
    """Expects the block to raise KeyboardInterrupt: sends SIGINT to the
    main thread (a Ctrl-C) once cond holds, from a thread of its own. The
    default handler is installed meanwhile, whatever the process inherited
    (SIGINT ignored, say). The signal goes out only once the block's call
    waits and while the block runs: one that landed before it would be
    raised in here, and one after it pytest would take for the user's and
    stop the session. What kept it from going out fails the test."""
    main = threading.main_thread().ident
    assert main is not None and threading.current_thread() is threading.main_thread()
    failed: list[BaseException] = []
    lock = threading.Lock()
    running = True

    def blocked() -> bool:
        """Whether the main thread waits in threading's wait: in the
        block's call (a signal sent sooner, as cond already holds, would
        land before the block)."""
        f = sys._current_frames().get(main)
        while f is not None:
            if f.f_code.co_name == "wait" and f.f_code.co_filename == threading.__file__:
                return True
            f = f.f_back
        return False

    def run() -> None:
        try:
            wait_for("the request waits, and the block's call for it", lambda: cond() and blocked())
        except BaseException as e:  # noqa: BLE001 - raised in the test's thread
            failed.append(e)  # and the signal ends the block's wait
        with lock:
            if running:
                signal.pthread_kill(main, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    th = threading.Thread(target=run, daemon=True)
    try:
        with pytest.raises(KeyboardInterrupt):
            try:
                th.start()
                yield
            finally:
                # A signal sent as this waits for the lock interrupts the
                # wait, here, inside the block.
                with lock:
                    running = False
    finally:
        th.join()
        signal.signal(signal.SIGINT, previous)
        if failed:
            raise failed[0]


def test_a_sample_interrupted_by_ctrl_c_is_withdrawn(reprised_factory: Any) -> None:
    """A KeyboardInterrupt while a sync sample_batch waits withdraws its
    request. The call on the client's loop ran on: the request waited for
    the rate limiter and took the next item for nobody."""
    r = reprised_factory(QUEUE)
    with reprise.Client(r.url) as c, reprise.Client(r.url) as watch:
        with ctrl_c_when(lambda: watch.server_info()["q"].sample_waits >= 1):
            c.sample_batch("q", 1)
        barrier(c)
        insert_and_read(r.url, c)


def test_a_sampler_interrupted_by_ctrl_c_keeps_its_request(reprised_factory: Any) -> None:
    """A KeyboardInterrupt while a sync Sampler's next waits leaves the
    request it waited on the sampler's: the next call takes its reply, and
    close withdraws it. The sampler dropped it: the next call sent another,
    and close left the dropped one waiting, to take an item for nobody."""
    r = reprised_factory(QUEUE)
    with reprise.Client(r.url) as c, reprise.Client(r.url) as watch:
        with c.sampler("q", 1, prefetch=1, timeout=10) as s:
            with ctrl_c_when(lambda: watch.server_info()["q"].sample_waits >= 1):
                next(s)
            c.insert({"x": np.float32(-1)}, {"q": 1.0})
            assert next(s).data["x"].tolist() == [-1]
            with ctrl_c_when(lambda: watch.server_info()["q"].sample_waits >= 2):
                next(s)
        barrier(c)
        insert_and_read(r.url, c, sampled_before=1)


def test_sharded_samples_interrupted_by_ctrl_c_are_withdrawn(reprised_factory: Any) -> None:
    """A KeyboardInterrupt while a sync ShardedClient's sample_batch, or a
    ShardedSampler's next, waits leaves no request waiting once the
    sampler closes: a min_size limiter that then lets samples through
    counts only the reader's."""
    r = reprised_factory(extra=["--shard", "0/1"])
    with reprise.Client(r.url) as c:
        c.insert({"x": np.float32(0)}, {"limited": 1.0})  # below min_size 5: samples wait
        with reprise.ShardedClient(r.url, ["reprise"]) as sc:
            with ctrl_c_when(lambda: c.server_info()["limited"].sample_waits >= 1):
                sc.sample_batch("limited", 1)
            with sc.sampler("limited", 1, prefetch=1) as s:
                with ctrl_c_when(lambda: c.server_info()["limited"].sample_waits >= 2):
                    next(s)
            # On the connection the shard's requests went out on.
            with pytest.raises(reprise.RateLimitedError):
                sc.shard(0).sample_batch("limited", 1, timeout=1.0)
            for i in range(1, 5):
                c.insert({"x": np.float32(i)}, {"limited": 1.0})
            c.sample_batch("limited", 1, timeout=5)
            info = c.server_info()["limited"]
    assert (info.num_samples, info.rate_limiter_info.samples) == (1, 1)
