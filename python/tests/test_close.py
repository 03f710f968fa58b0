"""Closing a sampler, a client or a dataset while another thread or task
waits on it: the wait ends, as the end of the iteration, and nothing is
left running."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import reprise
import reprise.aio
from conftest import Reprised, aclose_while_waiting, close_while_waiting, in_thread, next_in_thread, wait_for


def frame_of(thread: threading.Thread, function: str) -> Any:
    """The frame of a call of function on thread's stack now, or None."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None and frame.f_code.co_name != function:
        frame = frame.f_back
    return frame


def waiting_in(thread: threading.Thread, function: str) -> bool:
    """Whether thread's stack holds a call of function now."""
    return frame_of(thread, function) is not None


def test_sampler_close_from_another_thread(server: Reprised) -> None:
    """close() cancels the request next() waits on: next() stops at once.
    It used to wait out the service's sample wait (a minute)."""
    with reprise.Client(server.url) as c:
        c.reset("limited")
        s = c.sampler("limited", 4)
        assert close_while_waiting(s, s.close) == ["stop"]


def test_client_close_while_sampler_retries(server: Reprised) -> None:
    """A sampler waiting out an absent service stops when its client
    closes. It raised RuntimeError('Event loop is closed')."""
    c = reprise.Client(server.url, prefix="nosuch")
    s = c.sampler("dtypes", 4)
    t, out = next_in_thread(s)
    # next_raw's since is set once a request found no service.
    wait_for("the sampler retries", lambda: (f := frame_of(t, "next_raw")) is not None and f.f_locals.get("since") is not None)
    c.close()
    t.join(20)
    assert out == ["stop"]


def test_async_sampler_aclose_from_another_task(server: Reprised) -> None:
    """aclose() from another task ends the waiting __anext__ with
    StopAsyncIteration, not CancelledError, and not after a minute."""

    async def main() -> Any:
        async with reprise.aio.Client(server.url) as c:
            await c.reset("limited")
            return await aclose_while_waiting(c.sampler("limited", 4))

    assert asyncio.run(main()) == "stop"


def test_a_closed_writer_says_so(server: Reprised) -> None:
    """flush, wait_applied and end_episode of a closed writer raise
    ClosedError, as every call of a closed Go producer returns ErrClosed:
    they returned, as if the caller's items had gone in, and an async
    writer's create_item complained of its trajectory instead."""
    c = reprise.Client(server.url)
    try:
        w = c.trajectory_writer(1)
        w.append({"x": np.int64(1)})
        ref = w.history["x"][-1:]
        w.close()
        calls: list[Callable[[], object]] = [
            lambda: w.flush(timeout=5), lambda: w.wait_applied(timeout=5), lambda: w.end_episode(timeout=5),
            lambda: w.append({"x": np.int64(2)}), lambda: w.create_item("replay", 1.0, {"x": ref}),
        ]  # fmt: skip
        for call in calls:
            with pytest.raises(reprise.ClosedError):
                call()
    finally:
        c.close()

    async def main() -> list[str]:
        ac = await reprise.aio.connect(server.url)
        try:
            w = await ac.trajectory_writer(1)
            await w.append({"x": np.int64(1)})
            ref = w.history["x"][-1:]
            await w.close()
            names = []
            for name, call in [
                ("flush", lambda: w.flush(timeout=5)),
                ("wait_applied", lambda: w.wait_applied(timeout=5)),
                ("end_episode", lambda: w.end_episode(timeout=5)),
                ("append", lambda: w.append({"x": np.int64(2)})),
                ("create_item", lambda: w.create_item("replay", 1.0, {"x": ref})),
            ]:
                try:
                    await call()
                except reprise.ClosedError:
                    continue
                except Exception as e:  # noqa: BLE001 - reported with the call's name
                    names.append(f"{name}: {e!r}")
                    continue
                names.append(f"{name}: returned")
            return names
        finally:
            await ac.close()

    assert asyncio.run(main()) == []


def _not_closed(name: str, e: BaseException | None) -> list[str]:
    """What is wrong with how a call of a closing or closed writer ended
    (e: what it raised, None: it returned): nothing for a ClosedError
    that says nothing of the episode."""
    if isinstance(e, reprise.ClosedError) and not isinstance(e, reprise.EpisodeNotEndedError):
        return []
    return [f"{name}: {'returned' if e is None else repr(e)}"]


_HELD = "tables:\n  - {name: held, max_size: 1, rate_limiter: {preset: queue}}\n  - {name: t, max_size: 10}\n"
_HELD_OPTIONS: dict[str, Any] = {"linger": 0.0, "max_unapplied": 1, "validate_signatures": False}


def test_a_closing_writer_says_so(reprised_factory: Callable[..., Reprised]) -> None:
    """Once a writer's close has begun, flush, wait_applied and end_episode
    raise ClosedError at once, and so does an async append, as every call
    of a Go producer whose Close has begun returns ErrClosed; end_episode
    raises no EpisodeNotEndedError, which would have the actor call it
    again, also after a close that gave up. A flush on another thread
    waited for the window beside the close and raised its own timeout's
    DeadlineExceededError, an async append(partial_step=True) kept its
    cells, and end_episode raised EpisodeNotEndedError."""
    r = reprised_factory(_HELD)
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(3, **_HELD_OPTIONS)
        p = w._p
        w.append({"id": np.int64(0)})
        w.create_item("held", 1.0, {"id": w.history["id"][-1]})
        w.flush(timeout=30)  # the queue is full
        w.append({"id": np.int64(1)})
        w.create_item("held", 1.0, {"id": w.history["id"][-1]})  # held: the window stays full
        w.append({"id": np.int64(2)})
        w.create_item("t", 1.0, {"id": w.history["id"][-3:]})  # waits for room
        th, closed = in_thread(lambda: w.close(timeout=3))
        wait_for("close waits for room", lambda: len(p.cond._waiters) > 0)  # type: ignore[attr-defined]
        wrong: list[str] = []
        for name, call in [
            ("flush", lambda: w.flush(timeout=0.5)),
            ("wait_applied", lambda: w.wait_applied(timeout=0.5)),
            ("end_episode", lambda: w.end_episode(timeout=0.5)),
        ]:
            _, out = in_thread(call)
            wait_for(f"{name} to end", lambda: out)  # noqa: B023 - called at once
            wrong += _not_closed(name + " while closing", out[0])
        th.join(30)
        # The item for t never got room.
        assert len(closed) == 1 and isinstance(closed[0], reprise.NotStoredError), closed
        try:
            w.end_episode(timeout=0.5)
            wrong.append("end_episode after a close that gave up: returned")
        except reprise.RepriseError as e:
            wrong += _not_closed("end_episode after a close that gave up", e)
        assert not wrong, "\n".join(wrong)

    async def main() -> list[str]:
        async with await reprise.aio.connect(r.url) as c:
            await c.reset("held")
            w = await c.trajectory_writer(3, **_HELD_OPTIONS)
            p = w._p
            assert p is not None
            await w.append({"id": np.int64(0)})
            await w.create_item("held", 1.0, {"id": w.history["id"][-1]})
            await w.flush(timeout=30)
            await w.append({"id": np.int64(1)})
            await w.create_item("held", 1.0, {"id": w.history["id"][-1]})
            await w.append({"id": np.int64(2)})
            await w.create_item("t", 1.0, {"id": w.history["id"][-3:]})
            closing = asyncio.ensure_future(w.close(timeout=3))
            while not p._async_waiters:
                await asyncio.sleep(0.01)
            wrong: list[str] = []
            for name, call in [
                ("flush", lambda: w.flush(timeout=0.5)),
                ("wait_applied", lambda: w.wait_applied(timeout=0.5)),
                ("end_episode", lambda: w.end_episode(timeout=0.5)),
                ("append", lambda: w.append({"y": np.int64(0)}, partial_step=True)),
            ]:
                try:
                    await call()
                    wrong += _not_closed(name + " while closing", None)
                except reprise.RepriseError as e:
                    wrong += _not_closed(name + " while closing", e)
            with pytest.raises(reprise.NotStoredError):
                await closing
            try:
                await w.end_episode(timeout=0.5)
                wrong.append("end_episode after a close that gave up: returned")
            except reprise.RepriseError as e:
                wrong += _not_closed("end_episode after a close that gave up", e)
            return wrong

    wrong = asyncio.run(main())
    assert not wrong, "\n".join(wrong)


def test_what_ended_a_call_is_in_its_error_beside_the_losses(reprised_factory: Callable[..., Reprised]) -> None:
    """A flush that the writer's close ended raises a ClosedError, and a
    close that ran out of time a DeadlineExceededError, whatever
    rejections or losses their errors join, as Go's errors.Is finds
    ErrClosed and the context's deadline in its joined errors: they took
    the class of the first rejection or loss alone, and ``except
    ClosedError`` or ``except DeadlineExceededError`` missed them."""
    r = reprised_factory(_HELD)
    with reprise.Client(r.url) as c:
        w = c.trajectory_writer(1, **{**_HELD_OPTIONS, "max_unapplied": 2})
        p = w._p
        w.append({"id": np.int64(0)})
        w.create_item("held", 1.0, {"id": w.history["id"][-1]})
        w.flush(timeout=30)  # the queue is full
        w.append({"id": np.int64(1)})
        w.create_item("held", 1.0, {"id": w.history["id"][-1]})  # held
        th, flushed = in_thread(lambda: w.flush(timeout=30))
        wait_for("the flush waits for the held item", lambda: len(p.cond._waiters) > 0)  # type: ignore[attr-defined]
        w.append({"id": np.int64(2)})
        w.create_item("nosuch", 1.0, {"id": w.history["id"][-1]})
        wait_for("the rejection", lambda: p.rejections == 1)
        with pytest.raises(reprise.RejectedError):
            w.close(timeout=30)  # the close or the flush takes the rejection: both raise it
        th.join(30)
        assert len(flushed) == 1, flushed
        e = flushed[0]
        assert isinstance(e, reprise.ClosedError) and isinstance(e, reprise.RejectedError), repr(e)

        w = c.trajectory_writer(1, **_HELD_OPTIONS)
        for i in (3, 4):  # held behind the queue's item; the second waits for room
            w.append({"id": np.int64(i)})
            w.create_item("held", 1.0, {"id": w.history["id"][-1]})
        with pytest.raises(reprise.RepriseError) as closed:
            w.close(timeout=0.5)
        e = closed.value
        assert isinstance(e, reprise.DeadlineExceededError) and isinstance(e, reprise.NotStoredError), repr(e)


torch = pytest.importorskip("torch")
import reprise.torch as rt  # noqa: E402


def loop_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("reprise-")}


def test_dataset_close_while_iterating(server: Reprised) -> None:
    """ds.close() from another thread ends a for loop over the dataset
    that waits for a batch. It raised ClosedError, or not, by timing."""
    with reprise.Client(server.url) as c:
        c.reset("limited")
    ds = rt.ReplayDataset(server.url, "limited", batch_size=4)
    it = iter(ds)
    t, out = next_in_thread(it)
    wait_for("the loop waits for a batch", lambda: waiting_in(t, "next_raw") and waiting_in(t, "result"))
    ds.close()
    t.join(20)
    assert out == ["stop"]


def test_dataset_makes_one_client(server: Reprised) -> None:
    """Two threads starting on one dataset at once share one client, which
    close() closes: no event-loop thread is left behind."""
    with reprise.Client(server.url) as c:
        c.reset("dtypes")
        with c.trajectory_writer(1) as w:
            for i in range(8):
                w.append({"obs": np.full((2,), i, np.float32)})
                w.create_item("dtypes", 1.0, {"obs": w.history["obs"][-1]})
            w.wait_applied(timeout=30)
    before = loop_threads()
    ds = rt.ReplayDataset(server.url, "dtypes", batch_size=4, timeout=10)
    start = threading.Barrier(2)
    clients: list[Any] = []

    def one() -> None:
        start.wait()
        clients.append(ds.client())

    threads = [threading.Thread(target=one) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert len(clients) == 2 and clients[0] is clients[1]
    ds.close()
    wait_for("the client's threads end", lambda: not {t for t in loop_threads() - before if t.is_alive()})


def test_async_sampler_of_unconnected_client_raises() -> None:
    """A client never connected is not a closed one: its sampler raises
    ClosedError saying so, rather than end as if the table ran dry."""

    async def main() -> list[Any]:
        c = reprise.aio.Client("nats://127.0.0.1:1")
        return [b async for b in c.sampler("t", 4)]

    with pytest.raises(reprise.ClosedError, match="not connected"):
        asyncio.run(main())


def test_async_client_close_ends_sampler(server: Reprised) -> None:
    """An async client closed while its sampler waits ends the iteration."""

    async def main() -> str:
        c = await reprise.aio.Client(server.url).connect()
        await c.reset("limited")
        return await aclose_while_waiting(c.sampler("limited", 4), c.close)

    assert asyncio.run(main()) == "stop"


def test_a_cancelled_writer_close_is_finished_by_the_next(server: Reprised) -> None:
    """A writer's close cancelled while it waits for JetStream (here, by
    wait_for's timeout) leaves its transport to the next close of the
    writer, which reports what was lost, or of its client: nothing of it
    runs after them."""
    import nats

    async def swallow(m: Any) -> None:
        pass

    async def transport_tasks() -> list[str]:
        me = asyncio.current_task()
        return [repr(t.get_coro()) for t in asyncio.all_tasks() if t is not me and "_Transport" in repr(t.get_coro())]

    async def main(close_writer_again: bool) -> list[str]:
        mute = await nats.connect(server.url)
        await mute.subscribe("mute.data.insert", cb=swallow)  # nothing is acked
        await mute.flush()
        c = await reprise.aio.connect(server.url, prefix="mute")
        w = await c.trajectory_writer(1, validate_signatures=False, max_in_flight=1, linger=30.0, retry_for=2.0)
        await w.append({"x": np.int64(1)})
        await w.create_item("t", 1.0, {"x": w.history["x"][-1]})
        with pytest.raises(reprise.DeadlineExceededError):
            await w.flush(timeout=0.3)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(w.close(timeout=30), 0.3)
        assert await transport_tasks(), "the cancelled close stopped the transport itself"
        if close_writer_again:
            with pytest.raises(reprise.OutcomeUnknownError):
                await w.close(timeout=0.5)  # the message never acked is given up on, and said so
            left = await transport_tasks()
        await c.close()
        if not close_writer_again:
            left = await transport_tasks()
        await mute.close()
        return left

    for again in (True, False):
        assert asyncio.run(main(again)) == [], f"tasks still running after close (writer closed again: {again})"


def test_an_async_writer_close_sends_its_end_message(server: Reprised) -> None:
    """An async writer's close sends the message that tells the service it
    may drop the writer's chunks, and waits for its ack: submitted from the
    loop, it used to queue behind the transport's stop and never leave."""

    async def main() -> tuple[int, list[int]]:
        c = await reprise.aio.connect(server.url)
        w = await c.trajectory_writer(1)
        await w.append({"x": np.int64(1)})
        await w.create_item("replay", 1.0, {"x": w.history["x"][-1]})
        await w.flush()
        p = w._p
        assert p is not None
        await w.close()
        await c.close()
        return p.seq, list(p.unsettled)

    sent, unsettled = asyncio.run(main())
    assert (sent, unsettled) == (2, []), f"{sent} messages sent, {unsettled} never acknowledged: want the item's and the end's, both settled"
