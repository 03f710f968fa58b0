"""reprise.aio: the same API as coroutines."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import reprise
import reprise.aio
from conftest import Reprised, in_thread


def test_async_writer_sampler_and_calls(server: Reprised) -> None:
    async def main() -> None:
        async with reprise.aio.Client(server.url) as c:
            await c.reset("dtypes")
            async with await c.trajectory_writer(3, chunk_length=2) as w:
                for t in range(6):
                    await w.append({"obs": np.full(4, t, np.float32)}, partial_step=True)
                    await w.append({"t": np.int64(t)})
                    if w.episode_steps >= 3:
                        await w.create_item("dtypes", 1.0, {"obs": w.history["obs"][-3:], "t": w.history["t"][-1]})
                await w.wait_applied(timeout=30)
            info = await c.server_info()
            assert info["dtypes"].current_size == 4
            b = await c.sample_batch("dtypes", 8, timeout=5)
            t = b.data["t"]
            np.testing.assert_array_equal(b.data["obs"][:, :, 0], np.stack([t - 2, t - 1, t], axis=1).astype(np.float32))
            samples = await c.sample("dtypes", 2)
            assert samples[0].data["obs"].shape == (3, 4)
            n = 0
            async with c.sampler("dtypes", 4, prefetch=3) as s:
                async for batch in s:
                    assert len(batch) == 4
                    n += 1
                    if n == 5:
                        break
            await c.update_priorities("dtypes", b.info.key, np.ones(8) * 2)
            await c.insert({"obs": np.zeros(4, np.float32), "t": np.int64(99)}, {"dtypes": 1.0})
            with pytest.raises(reprise.NotFoundError):
                await c.sample_batch("nope", 1, timeout=2)
            with pytest.raises(reprise.RateLimitedError):
                await c.reset("limited")
                await c.sample_batch("limited", 1, timeout=0.3)
            assert (await c.checkpoint()).name

    asyncio.run(main())


def test_a_tables_first_item_reads_its_picks_once(server: Reprised) -> None:
    """As the sync writer: a one-shot iterable of picks, read once though
    the first item for a table is checked before and after the client asks
    for its signature."""

    async def main() -> None:
        async with reprise.aio.Client(server.url) as c:
            before = (await c.server_info())["sig"].num_inserts
        async with reprise.aio.Client(server.url) as c:
            async with await c.trajectory_writer(3) as w:
                await w.append({"obs": np.zeros(4, np.float32), "action": np.int64(1)})
                await w.create_item("sig", 1.0, (w.history[n][-1:] for n in ("obs", "action")))
                await w.wait_applied(timeout=30)
            assert (await c.server_info())["sig"].num_inserts == before + 1

    asyncio.run(main())


def test_connect_failure_is_unavailable() -> None:
    async def main() -> None:
        with pytest.raises(reprise.UnavailableError, match="cannot connect"):
            await reprise.aio.connect("nats://127.0.0.1:1", connect_timeout=0.5)

    asyncio.run(main())
    with pytest.raises(reprise.UnavailableError):
        reprise.Client("nats://127.0.0.1:1", connect_timeout=0.5)


def test_wrong_prefix_is_a_clear_error(server: Reprised) -> None:
    with reprise.Client(server.url, prefix="elsewhere") as c:
        with pytest.raises(reprise.UnavailableError, match="no table service.*elsewhere"):
            c.server_info(timeout=5)


async def until(cond: Any) -> None:
    """Returns once cond() holds (bound it with asyncio.wait_for)."""
    while not cond():
        await asyncio.sleep(0.01)


def test_sample_fails_when_the_service_dies(server: Reprised) -> None:
    """A sample whose service takes the request and dies, never answering,
    raises UnavailableError soon after instead of waiting without end. A
    subscriber that swallows sample requests stands in for the dead
    service; nothing listens for info."""
    import nats

    from reprise._proto import reprise_pb2 as pb

    async def main() -> None:
        nc = await nats.connect(server.url)
        swallowed: list[Any] = []

        async def swallow(m: Any) -> None:
            swallowed.append(m)

        await nc.subscribe("gone.api.sample", cb=swallow)
        await nc.flush()
        c = await reprise.aio.connect(server.url, prefix="gone")
        try:
            with pytest.raises(reprise.UnavailableError, match="stopped while the sample waited"):
                await c.sample("t", 1)  # no timeout
        finally:
            await c.close()
        # One request, which the call withdrew as it gave up on it.
        try:
            await asyncio.wait_for(until(lambda: len(swallowed) >= 2), 10)
        finally:
            await nc.close()
        assert len(swallowed) == 2
        request, withdrawal = swallowed
        assert request.reply and not withdrawal.reply
        assert pb.SampleRequest.FromString(withdrawal.data).withdraw == request.reply

    asyncio.run(main())


def test_requests_watch_and_expire_without_tasks_of_their_own(server: Reprised) -> None:
    """A request's deadline and watch are the loop's timers: a request
    answered in time leaves no task behind, its watch cancelled if it had
    started; one not answered raises DeadlineExceededError; what a watch
    raises fails its request."""
    import nats

    async def main() -> None:
        nc = await nats.connect(server.url)

        async def echo(m: Any) -> None:
            await m.respond(m.data)

        async def mute(m: Any) -> None:
            pass

        await nc.subscribe("echo", cb=echo)
        await nc.subscribe("mute", cb=mute)
        await nc.flush()
        c = await reprise.aio.connect(server.url)
        req = c._requester()
        watched: list[str] = []

        async def watch() -> None:
            watched.append("started")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                watched.append("cancelled")
                raise

        async def gone() -> None:
            raise reprise.UnavailableError("the responder is gone")

        try:
            tasks = asyncio.all_tasks()
            for i in range(50):
                assert await req.request("echo", b"%d" % i, 10, watch=watch, watch_after=60) == b"%d" % i
            assert watched == [] and asyncio.all_tasks() == tasks
            with pytest.raises(reprise.DeadlineExceededError, match="no reply .* on mute within 0.2s"):
                await req.request("mute", b"", 0.2, watch=watch, watch_after=0)
            assert watched[-2:] == ["started", "cancelled"] and asyncio.all_tasks() == tasks
            with pytest.raises(reprise.UnavailableError, match="responder is gone"):
                await req.request("mute", b"", None, watch=gone, watch_after=0)
            assert asyncio.all_tasks() == tasks
        finally:
            await c.close()
            await nc.close()

    asyncio.run(main())


def test_a_sampler_closed_while_it_waits_sends_nothing_more(server: Reprised) -> None:
    """An AsyncSampler closed during a retry's backoff, or after it gave up
    on requests that got no reply, stops: it sends no request after that
    and leaves none in flight. No service listens on the prefix, so every
    request fails at once as unavailable and the sampler backs off and
    retries; a subscriber that swallows sample requests makes the others
    time out, which the sampler waits out as it does a service that is
    gone (its timeout ends the iteration only through the rate limiter)."""
    import nats

    async def main() -> None:
        c = await reprise.aio.connect(server.url, prefix="nobody")
        sent: list[str] = []
        sample_raw = c.sample_raw

        def counted(*args: Any) -> Any:
            sent.append(args[0])
            return sample_raw(*args)

        c.sample_raw = counted  # type: ignore[method-assign]
        try:
            s = c.sampler("t", 4, prefetch=2, retry_unavailable_for=60)
            waiting = asyncio.ensure_future(s.next_raw())
            while len(sent) < 4:  # two rounds of requests: it is retrying
                await asyncio.sleep(0.005)
            await s.aclose()
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(waiting, 10)
            assert not s._tasks
            n = len(sent)
            with pytest.raises(StopAsyncIteration):
                await s.next_raw()
            assert len(sent) == n
        finally:
            await c.close()

        async def mute(m: Any) -> None:
            pass

        nc = await nats.connect(server.url)
        await nc.subscribe("mute.api.sample", cb=mute)
        await nc.flush()
        c = await reprise.aio.connect(server.url, prefix="mute")
        try:
            s = c.sampler("t", 4, prefetch=3, timeout=0.2, retry_unavailable_for=0.5)
            with pytest.raises(reprise.DeadlineExceededError):
                await asyncio.wait_for(s.next_raw(), 10)
            await s.aclose()
            assert s._closed and not s._tasks
        finally:
            await c.close()
            await nc.close()

    asyncio.run(main())


@contextlib.contextmanager
def unacknowledged_writer(server: Reprised) -> Iterator[reprise.TrajectoryWriter]:
    """A writer on prefix "mute" with one item created, whose messages
    JetStream never acknowledges: a subscriber that swallows the inserts
    stands in for it."""
    import nats

    async def swallow(m: Any) -> None:
        pass

    async def subscribed() -> Any:
        nc = await nats.connect(server.url)
        await nc.subscribe("mute.data.insert", cb=swallow)
        await nc.flush()
        return nc

    loop = asyncio.new_event_loop()
    nc = loop.run_until_complete(subscribed())
    try:
        with reprise.Client(server.url, prefix="mute") as c:
            w = c.trajectory_writer(1, validate_signatures=False, ack_timeout=60, return_on_store=True)
            w.append({"x": np.int64(1)})
            w.create_item("t", 1.0, {"x": w.history["x"][-1]})
            yield w
    finally:
        loop.run_until_complete(nc.close())
        loop.close()


def test_a_writer_closed_before_its_acks_gives_up_at_its_timeout(server: Reprised) -> None:
    """close(timeout) fails the acks it still waits for once its timeout
    passes, as messages given up on that may be stored (sent, never
    answered), instead of letting each run out the writer's
    ack_timeout."""
    import time

    with unacknowledged_writer(server) as w:
        start = time.monotonic()
        with pytest.raises(reprise.OutcomeUnknownError) as e:
            w.close(timeout=0.5)
        assert time.monotonic() - start < 30, "close waited out the ack timeout"
        assert isinstance(e.value, reprise.ClosedError) and not isinstance(e.value, reprise.NotStoredError)
        assert "message 1 (1 items) may be stored" in e.value.message
        assert "not acknowledged by JetStream before the writer closed" in e.value.message


def test_a_flush_waiting_when_close_gives_up_raises(server: Reprised) -> None:
    """A flush waiting for acks on one thread while close gives the
    messages up on another raises OutcomeUnknownError (sent, never
    answered, they may be stored). close took the messages' errors, and
    the flush, finding every message settled and no error left, returned
    as if its items were stored (the Go producer did so when its
    connection closed, and a cluster soak lost acknowledged inserts)."""
    import time

    with unacknowledged_writer(server) as w:
        t, flushed = in_thread(lambda: w.flush(timeout=30))
        deadline = time.monotonic() + 30
        while not w._p.unsettled:
            assert time.monotonic() < deadline, "the flush did not publish"
            time.sleep(0.005)
        with pytest.raises(reprise.OutcomeUnknownError):
            w.close(timeout=0.2)
        t.join(30)
        assert flushed and isinstance(flushed[0], reprise.OutcomeUnknownError), flushed


def test_stale_refusals_do_not_fail_later_mutations() -> None:
    """A service that replays the stream (a restart from an older
    checkpoint, a standby that takes over) sends again the refusals of
    mutations whose callers took theirs long ago. They were kept, never to
    be taken, and past the bound counted as lost: a mutation in flight then
    raised RejectedError though the service applied it (as in Go's
    TestStaleRefusalsDoNotFailLaterMutations)."""
    from types import SimpleNamespace

    from reprise._proto import reprise_pb2 as pb

    async def main() -> None:
        w = reprise.aio._AppliedWatch()
        n = reprise.aio._MAX_KEPT_REFUSALS + 100
        await w.on_progress(SimpleNamespace(data=pb.Progress(applied_sequence=n).SerializeToString()))
        lost = w.lost
        for seq in range(1, n + 1):
            r = pb.Rejection(sequence=seq, table="gone", code=pb.CODE_NOT_FOUND, message="replayed")
            await w.on_rejection(SimpleNamespace(data=r.SerializeToString()))
        await w.on_progress(SimpleNamespace(data=pb.Progress(applied_sequence=n + 1).SerializeToString()))
        assert w.refusal("t", [n + 1], 1, 1, lost) is None
        assert not w._refused

    asyncio.run(main())


def test_abandoned_refusals_do_not_fail_later_mutations() -> None:
    """Refusals whose callers gave up before the service applied their
    mutations are never taken; past the bound on those kept, each pushed
    out counted as lost, and a mutation in flight then raised RejectedError
    though the service applied it (as Go's
    TestAbandonedRefusalsDoNotFailLaterMutations)."""
    from types import SimpleNamespace

    from reprise._proto import reprise_pb2 as pb

    def msg(m: Any) -> Any:
        return SimpleNamespace(data=m.SerializeToString())

    async def main() -> None:
        w = reprise.aio._AppliedWatch()
        n = reprise.aio._MAX_KEPT_REFUSALS - 24
        for seq in range(1, n + 1):
            await w.on_rejection(msg(pb.Rejection(sequence=seq, table="t", code=pb.CODE_NOT_FOUND, message="refused")))
        await w.on_progress(msg(pb.Progress(applied_sequence=n)))
        await w.on_progress(msg(pb.Progress(applied_sequence=n + 1)))
        lost = w.lost
        for seq in range(1_000_000, 1_000_100):
            await w.on_rejection(msg(pb.Rejection(sequence=seq, table="t", code=pb.CODE_NOT_FOUND, message="refused")))
        await w.on_progress(msg(pb.Progress(applied_sequence=n + 2)))
        assert w.refusal("t", [n + 2], 1, 1, lost) is None

    asyncio.run(main())


def test_a_passed_refusal_pushed_out_before_taken_is_lost() -> None:
    """A caller takes its refusal only after progress passed its mutation:
    pushed out before its caller took it, the refusal counts as lost, or
    the caller would see its refused mutation as applied (as Go's
    TestPassedRefusalPushedOutBeforeTakenIsLost)."""
    from types import SimpleNamespace

    from reprise._proto import reprise_pb2 as pb

    def msg(m: Any) -> Any:
        return SimpleNamespace(data=m.SerializeToString())

    async def main() -> None:
        w = reprise.aio._AppliedWatch()
        lost = w.lost
        await w.on_rejection(msg(pb.Rejection(sequence=1, table="t", code=pb.CODE_NOT_FOUND, message="refused")))
        await w.on_progress(msg(pb.Progress(applied_sequence=1)))  # its wait ends; not yet taken
        for seq in range(1000, 1000 + reprise.aio._MAX_KEPT_REFUSALS):
            await w.on_rejection(msg(pb.Rejection(sequence=seq, table="t", code=pb.CODE_NOT_FOUND, message="refused")))
        await w.on_progress(msg(pb.Progress(applied_sequence=2)))
        assert isinstance(w.refusal("t", [1], 1, 1, lost), reprise.RejectedError)

    asyncio.run(main())


def test_refusals_dropped_by_the_connection_are_counted() -> None:
    """A refusal nats-py dropped as a slow consumer makes a mutation
    waiting meanwhile raise that it may have been refused, as Go counts its
    notice subscription's drops; before, it returned None."""
    from types import SimpleNamespace

    from nats.errors import SlowConsumerError

    from reprise._proto import reprise_pb2 as pb

    async def main() -> None:
        c = reprise.aio.Client()
        c._notice = "_INBOX.notices"
        c._denials.watch_drops(c._notice, c._applied.note_dropped)  # as connect does
        lost = c._applied.lost
        await c._on_error(SlowConsumerError(subject="_INBOX.other", reply="", sid=1, sub=None))  # type: ignore[arg-type]
        assert c._applied.lost == lost, "another subscription's drop"
        await c._on_error(SlowConsumerError(subject=c._notice, reply="", sid=2, sub=None))  # type: ignore[arg-type]
        await c._applied.on_progress(SimpleNamespace(data=pb.Progress(applied_sequence=5).SerializeToString()))
        assert isinstance(c._applied.refusal("t", [5], 1, 1, lost), reprise.RejectedError)

    asyncio.run(main())


def test_refusals_dropped_on_a_writers_inbox_fail_its_next_wait(server: Reprised) -> None:
    """A rejection nats-py dropped as a slow consumer on a writer's notice
    inbox (the client's connection, whose error handler sees it) fails the
    writer's next wait, as the Go producer's dropped rejections do
    (checkDroppedRejections); it was ignored, and the writer took items
    that may have been refused as applied."""
    from nats.errors import SlowConsumerError

    async def main() -> None:
        async with reprise.aio.Client(server.url) as c:
            async with await c.trajectory_writer(1) as w:
                await w.append({"t": np.int64(1)})
                await w.create_item("replay", 1.0, {"t": w.history["t"][-1:]})
                await w.wait_applied(timeout=30)
                notice = w._t._notice
                await c._on_error(SlowConsumerError(subject=notice, reply="", sid=1, sub=None))  # type: ignore[arg-type]
                with pytest.raises(reprise.RejectedError):  # the writer's next calls
                    await w.append({"t": np.int64(2)})
                    await w.create_item("replay", 1.0, {"t": w.history["t"][-1:]})
                    await w.wait_applied(timeout=30)

    asyncio.run(main())


def test_an_append_that_raises_kept_nothing_of_its_step(reprised_factory: Any) -> None:
    """An append that raises (here, cancelled while it waits for room in
    the window) kept nothing of its step, so an actor may append it again.
    It kept the step, then waited to publish the item the step completed:
    an actor that appended the step again had it twice in its episode (as
    the Go producer's Append did)."""
    r = reprised_factory("""
tables:
  - name: queue
    max_size: 1
    rate_limiter: {preset: queue}
  - name: replay
    max_size: 100
  - name: last4
    max_size: 100
""")

    async def main() -> None:
        async with reprise.aio.Client(r.url) as c:
            w = await c.trajectory_writer(16, chunk_length=2, max_unapplied=1, linger=0.0)
            # The queue holds its second item: the window (one item) is full.
            for i in range(4):
                await w.append({"id": np.int64(i)})
                if i % 2:
                    await w.create_item("queue", 1.0, {"id": w.history["id"][-1]})
                if i == 1:
                    await w.wait_applied(timeout=30)
            with pytest.raises(reprise.DeadlineExceededError):
                await w.wait_applied(timeout=0.3)
            await w.append({"id": np.int64(4)})
            await w.create_item("replay", 1.0, {"id": w.history["id"][-1]})  # its chunk is open
            failed = 0
            for i in range(5, 8):
                while True:
                    try:
                        await asyncio.wait_for(w.append({"id": np.int64(i)}), 0.3)
                        break
                    except asyncio.TimeoutError:
                        assert w.episode_steps == i, f"append of step {i} was cancelled with the step kept"
                        failed += 1
                        # The learner makes room; the actor appends the step again.
                        await c.sample_batch("queue", 1, timeout=10)
            assert failed, "no append waited for the window: the test no longer tests"
            await w.create_item("last4", 1.0, {"id": w.history["id"][-4:]})
            for _ in range((await c.server_info())["queue"].current_size):
                await c.sample_batch("queue", 1, timeout=10)
            await w.flush(timeout=30)
            got = (await c.sample_batch("last4", 1, timeout=10)).data["id"]
            assert got.tolist() == [[4, 5, 6, 7]], "the episode's last four steps"
            await w.close()


    asyncio.run(main())


def test_a_create_item_that_raises_created_nothing(reprised_factory: Any) -> None:
    """A create_item that raises (here, cancelled while it waits for room
    in the window) created nothing, so an actor may create the item again.
    It queued the item, then waited to publish it: an actor that created
    the item again had it twice in its table (as the Go producer's
    CreateItem did)."""
    r = reprised_factory("""
tables:
  - name: queue
    max_size: 1
    rate_limiter: {preset: queue}
  - name: replay
    max_size: 100
""")

    async def main() -> None:
        async with reprise.aio.Client(r.url) as c:
            w = await c.trajectory_writer(16, max_unapplied=1, linger=0.0)
            p = w._p
            assert p is not None
            # The queue holds its second item: the window (one item) is full.
            for i in range(2):
                await w.append({"id": np.int64(i)})
                await w.create_item("queue", 1.0, {"id": w.history["id"][-1]})
                if i == 0:
                    await w.wait_applied(timeout=30)
            with pytest.raises(reprise.DeadlineExceededError):
                await w.wait_applied(timeout=0.3)
            await w.append({"id": np.int64(2)})
            created = failed = 0
            while created < 2:
                before = len(p.pending) + len(p.batch_items)
                try:
                    await asyncio.wait_for(w.create_item("replay", 1.0, {"id": w.history["id"][-1]}), 0.3)
                    created += 1
                    continue
                except asyncio.TimeoutError:
                    pass
                after = len(p.pending) + len(p.batch_items)
                assert after == before, f"create_item was cancelled with {after} items kept, {before} before it"
                failed += 1
                # The learner makes room; the actor creates the item again.
                await c.sample_batch("queue", 1, timeout=10)
            assert failed, "no create_item waited for the window: the test no longer tests"
            for _ in range((await c.server_info())["queue"].current_size):
                await c.sample_batch("queue", 1, timeout=10)
            await w.flush(timeout=30)
            assert (await c.server_info())["replay"].current_size == created
            await w.close()

    asyncio.run(main())
