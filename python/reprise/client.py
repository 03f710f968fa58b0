"""The synchronous clients: :class:`Client`, :class:`TrajectoryWriter` and
:class:`Sampler`; :class:`ShardedClient`, :class:`ShardedTrajectoryWriter`
and :class:`ShardedSampler` for tables spread over several reprised.

The client runs the asyncio client of :mod:`reprise.aio` on one background
event-loop thread. Calls block the calling thread only; replies are decoded
in the calling thread (numpy and zstd release the GIL), and a writer encodes
its chunks and messages in the calling thread and hands finished messages to
the loop without waiting for it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import random
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from . import _conn, errors
from . import aio as _aio
from . import _sharded  # after aio, which imports it last
from ._info import CheckpointInfo, TableInfo
from ._sample import ReplaySample, SampleBatch
from ._writer import (
    FailureMark,
    History,
    TrajectoryColumn,
    WriterOptions,
    _Blocked,
    _join,
    _Producer,
    _Transport,
    check_item,
    check_policy_version,
)

log = logging.getLogger("reprise")
T = TypeVar("T")


class _LoopThread:
    """One event loop on a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        # A task left pending would leave whoever waits on its future
        # (a sampler's thread) waiting for good: cancelled, it tells them.
        tasks = asyncio.all_tasks(self.loop)
        for t in tasks:
            t.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *, interruptible: bool = False) -> T:
        """Runs coro on the loop and returns its result. With
        ``interruptible`` (a sample), a KeyboardInterrupt or SystemExit
        that leaves the call cancels coro too: a sample's request is then
        withdrawn, where it would wait on for the rate limiter and take
        items for nobody. Other calls run on to their end (a writer's
        close still flushes what it holds)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("reprise: a blocking call from the client's own event loop thread would deadlock")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except (TimeoutError, concurrent.futures.TimeoutError):  # distinct classes before 3.11
            if fut.done():
                raise  # the coroutine's own error (DeadlineExceededError is a TimeoutError)
            fut.cancel()
            raise errors.DeadlineExceededError(f"no result within {timeout}s") from None
        except (KeyboardInterrupt, SystemExit):
            if interruptible:
                fut.cancel()
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


class Client:
    """A client of a Reprise deployment, for learners and actors.

    ``Client("nats://127.0.0.1:4222")`` connects at once (waiting up to
    ``connect_timeout`` seconds for the server) and reconnects by itself
    after the server restarts. The connection options are the Go side's:

    Args:
      server_address: NATS URL, several comma-separated or as a list.
      prefix: the deployment's subject prefix (reprised ``--prefix``).
      user, password: NATS user and password.
      token: a NATS token.
      nkeys_seed: path of an nkey seed file (needs ``nats-py[nkeys]``).
      credentials: path of a NATS credentials (.creds) file (``--creds``).
      tls: an ``ssl.SSLContext``; or ``tls_ca`` (a CA file to trust),
        ``tls_cert`` and ``tls_key`` (a client certificate) to build one.
      inbox_prefix: where replies arrive (``--inbox-prefix``); by default
        ``_INBOX.<user>`` when ``user`` is given, the only inbox a Reprise
        role may read. An nkey user's inbox is ``_INBOX.<public key>``:
        pass it here.
      name: the connection's name as NATS monitoring shows it.
      return_on_store: mutations return once JetStream stored them
        (durable) rather than once the service applied them (visible), a
        round trip sooner, and without raising for a mutation the service
        refuses (Go: broker.WithReturnOnStore).

    Reverb users: ``reverb.Client(address)`` becomes
    ``reprise.Client("nats://host:4222")``; ``sample``, ``insert``,
    ``trajectory_writer``, ``mutate_priorities``, ``reset``,
    ``server_info`` and ``checkpoint`` keep their names. ``sample_batch``
    and ``sampler`` return stacked numpy batches (Reverb's datasets are
    TensorFlow's). Timeouts are in seconds; Reverb's ``*_ms`` names are
    accepted where Reverb has them.
    """

    def __init__(self, server_address: str | Sequence[str] = _conn.DEFAULT_URL, **options: Any) -> None:
        self._aclient = _aio.Client(server_address, **options)
        self._lt = _LoopThread("reprise-client")
        self._closed = False
        self._writers: set[TrajectoryWriter] = set()
        self._insert_writer: TrajectoryWriter | None = None
        self._insert_lock = threading.Lock()
        self._owns_loop = True
        try:
            self._lt.call(self._aclient.connect())
        except BaseException:
            self._lt.stop()
            raise

    @classmethod
    def _on_loop(cls, aclient: _aio.Client, lt: _LoopThread) -> Client:
        """A Client of an async client already connected on lt, a loop it
        shares with others (a ShardedClient's shards): closing it leaves the
        loop running."""
        c = cls.__new__(cls)
        c._aclient = aclient
        c._lt = lt
        c._closed = False
        c._writers = set()
        c._insert_writer = None
        c._insert_lock = threading.Lock()
        c._owns_loop = False
        return c

    @property
    def options(self) -> _conn.ConnectOptions:
        return self._aclient.options

    @property
    def prefix(self) -> str:
        return self._aclient.options.prefix

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *, interruptible: bool = False) -> T:
        if self._closed:
            coro.close()
            raise errors.ClosedError("client closed")
        return self._lt.call(coro, timeout, interruptible=interruptible)

    def close(self) -> None:
        """Flushes and closes the writers this client made, then the
        connection."""
        if self._closed:
            return
        for w in list(self._writers):
            try:
                w.close()
            except errors.RepriseError as e:
                log.warning("reprise: closing a writer: %s", e)
        self._closed = True
        try:
            self._lt.call(self._aclient.close(), 30)
        finally:
            if self._owns_loop:
                self._lt.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- learner side -----------------------------------------------------

    def sample(
        self,
        table: str,
        num_samples: int = 1,
        *,
        timeout: float | None = None,
        flexible: bool = False,
    ) -> Iterator[ReplaySample]:
        """Samples ``num_samples`` items of ``table`` in one request and
        yields them one by one as ``ReplaySample(info, data)``, as Reverb's
        ``Client.sample``; ``data`` is a dict of column name to numpy array.
        Items that stack are decoded as a batch: each item's arrays are its
        rows of the batch's, so no two items share memory, and an item kept
        keeps the batch's arrays.

        Waits for the table's rate limiter up to ``timeout`` seconds (None:
        as long as the service allows, one minute by default) and then
        raises RateLimitedError; when the limiter allowed only some items,
        the error's ``partial`` holds them. With ``flexible`` the reply may
        hold fewer items, as soon as at least one is allowed."""
        data = self._call(self._aclient.sample_raw(table, num_samples, timeout, flexible), interruptible=True)
        return iter(_aio.decode_samples(data))

    def sample_batch(
        self, table: str, batch_size: int, *, timeout: float | None = None, flexible: bool = False
    ) -> SampleBatch:
        """One batch of ``batch_size`` items, stacked: ``batch.data[col]``
        has shape [B, T, *step_shape] ([B, *step_shape] for single-step
        squeezed columns) and ``batch.info`` holds arrays ``key``,
        ``probability``, ``priority``, ``table_size``, ``times_sampled``.
        The items must share their layout (a table with a signature
        guarantees it). Errors as in :meth:`sample`."""
        return _aio.decode_batch(self._call(self._aclient.sample_raw(table, batch_size, timeout, flexible), interruptible=True))

    def sampler(
        self,
        table: str,
        batch_size: int,
        *,
        prefetch: int = 2,
        timeout: float | None = None,
        flexible: bool = False,
        retry_unavailable_for: float = 60.0,
    ) -> Sampler:
        """An iterator of batches (as :meth:`sample_batch`) that keeps
        ``prefetch`` requests in flight, like Reverb's
        ``max_in_flight_samples_per_worker``. With a ``timeout`` (seconds,
        > 0), a request the rate limiter does not allow in time ends the
        iteration (as Reverb's ``rate_limiter_timeout_ms`` ends a dataset);
        without, it waits. A lost service (a restart), or one that leaves requests
        unanswered, is waited for up to ``retry_unavailable_for`` seconds,
        then the error is raised. Close it (or use ``with``) to
        stop its requests: those still waiting for the rate limiter are
        withdrawn and take nothing, but the items of batches already
        sampled (replies that came and were not taken, or on their way)
        are lost at close: with a queue table use ``prefetch=1``, which
        loses at most one batch."""
        return Sampler(self, table, batch_size, prefetch, timeout, flexible, retry_unavailable_for)

    def mutate_priorities(
        self,
        table: str,
        updates: Mapping[int, float] | None = None,
        deletes: Iterable[int] | None = None,
        *,
        timeout: float | None = 10.0,
    ) -> None:
        """Sets the priorities of items (``updates``: key to priority) and
        deletes items (``deletes``: keys) of ``table``. Like Reverb, deletes
        apply first; keys not in the table are skipped. The change goes
        through the stream, durable and applied in order with the inserts
        around it, and this returns once the service applied it: a sample
        sent after sees it. With ``Client(..., return_on_store=True)`` it
        returns once the change is stored (durable), a round trip sooner."""
        self._call(self._aclient.mutate_priorities(table, updates, deletes, timeout=timeout))

    def set_policy_version(self, table: str, version: int, *, timeout: float | None = 10.0) -> None:
        """Raises ``table``'s current policy version to ``version`` (the
        highest set wins, whichever learner sets it). With the table's
        ``max_staleness: K``, items more than K versions behind are removed
        and never sampled again. Like a mutation it goes through the stream
        (durable, replayed after a crash) and returns once applied. Writers
        tag their items with :meth:`TrajectoryWriter.set_policy_version`."""
        self._call(self._aclient.set_policy_version(table, version, timeout=timeout))

    def set_max_staleness(self, table: str, max_staleness: int | None, *, timeout: float | None = 10.0) -> None:
        """Changes ``table``'s staleness bound while it runs: items more than
        ``max_staleness`` policy versions behind are removed at once and from
        then on; None removes the bound. Through the stream, like a
        mutation; a restart applies the config file's bound again."""
        self._call(self._aclient.set_max_staleness(table, max_staleness, timeout=timeout))

    def update_priorities(self, table: str, keys: Any, priorities: Any, *, timeout: float | None = 10.0) -> None:
        """``mutate_priorities`` from two arrays, e.g. ``batch.info.key`` and
        new priorities from TD errors."""
        self._call(self._aclient.update_priorities(table, keys, priorities, timeout=timeout))

    def reset(self, table: str, *, timeout: float | None = 60.0) -> None:
        """Empties ``table`` and zeroes its rate limiter's counters."""
        self._call(self._aclient.reset(table, timeout=timeout))

    def server_info(self, timeout: float | None = 10.0) -> dict[str, TableInfo]:
        """Table name to :class:`TableInfo`: size, max size, selectors, rate
        limiter parameters and counters, signature. ``timeout`` in seconds
        (Reverb's is too)."""
        return self._call(self._aclient.server_info(timeout))

    def checkpoint(self, *, timeout: float | None = 120.0) -> CheckpointInfo:
        """Writes a checkpoint now; returns what it wrote (``str()`` of it is
        its name)."""
        return self._call(self._aclient.checkpoint(timeout=timeout))

    # -- actor side ---------------------------------------------------------

    def trajectory_writer(self, num_keep_alive_refs: int = 128, **options: Any) -> TrajectoryWriter:
        """A :class:`TrajectoryWriter`, as Reverb's. ``num_keep_alive_refs``
        is how many recent steps its items may reference. Other options
        (see :class:`WriterOptions`): ``chunk_length`` (steps per chunk,
        default 1), ``compression`` ("zstd" or "none"), ``delta``,
        ``max_in_flight``, ``max_unapplied``, ``batch_items``,
        ``batch_bytes``, ``linger``, ``retry_for``, ``ack_timeout``,
        ``validate_signatures``."""
        return TrajectoryWriter(self, self._aclient.writer_options(num_keep_alive_refs, options))

    def insert(self, data: Mapping[str, Any], priorities: Mapping[str, float], *, timeout: float | None = 60.0) -> None:
        """Inserts ``data`` (column name to array or scalar) as one
        single-step item into each table of ``priorities`` (table to
        priority), as Reverb's ``Client.insert``. Returns once the service
        applied it (``Client(return_on_store=True)``: once stored, durable).
        For many items a :meth:`trajectory_writer` is much faster."""
        if not priorities:
            raise errors.InvalidArgumentError("insert needs priorities={table: priority}")
        with self._insert_lock:
            if self._insert_writer is None:
                self._insert_writer = self.trajectory_writer(1, linger=0.0, return_on_store=self._aclient._return_on_store)
            w = self._insert_writer
            old: TrajectoryWriter | None = None
            try:
                w.append(data)
            except errors.SignatureMismatchError:
                # A writer's column keeps its first dtype and shape, but
                # each insert is an episode of its own, free to differ
                # from the last (as Reverb's): a writer for the new ones.
                old = w
                w = self._insert_writer = self.trajectory_writer(
                    1, linger=0.0, return_on_store=self._aclient._return_on_store)
            try:
                if old is not None:
                    w.append(data)
                traj = {c: w.history[c][-1] for c in data}
                for table, p in priorities.items():
                    w.create_item(table, p, traj)
                w.end_episode(timeout=timeout)
            finally:
                if old is not None:
                    # Every insert it carried waited until applied, and
                    # raised what it lost: what closing it can still fail
                    # is its own end, which no caller should take for this
                    # insert's failure (and insert again).
                    try:
                        old.close(timeout)
                    except errors.RepriseError as e:
                        log.warning("reprise: closing the writer of earlier inserts: %s", e)


class _InFlight:
    """The line of calls in flight that Sampler and ShardedSampler keep:
    what both do with it, apart from sending and decoding."""

    _c: Any  # the Client or ShardedClient
    _lock: threading.Lock
    _closed: bool
    _futs: collections.deque[concurrent.futures.Future[Any]]

    def _fill(self) -> None:
        raise NotImplementedError

    def _pop_ready(self, replace: Callable[[concurrent.futures.Future[Any]], bool]) -> concurrent.futures.Future[Any] | None:
        """The first call if it is done, taken from the line (and another
        sent in its place where ``replace`` says), or None while it is not
        done; StopIteration once the sampler or its client is closed."""
        with self._lock:
            if self._closed or self._c._closed:
                raise StopIteration
            self._fill()
            if not self._futs or not self._futs[0].done():
                return None
            fut = self._futs.popleft()
            if replace(fut):
                self._fill()
        return fut

    def _keep(self, fut: concurrent.futures.Future[Any]) -> None:
        """Puts back fut, whose reply a KeyboardInterrupt (or SystemExit)
        kept the caller from, first in line: the next call takes it, and
        close withdraws it. Dropped, its request waited on for nobody, and
        the next call sent another."""
        with self._lock:
            if self._closed:
                fut.cancel()
            else:
                self._futs.appendleft(fut)


class Sampler(_InFlight):
    """Iterator of :class:`SampleBatch` with requests kept in flight; made
    by :meth:`Client.sampler`. Replies are decoded in the iterating
    thread."""

    def __init__(
        self,
        client: Client,
        table: str,
        batch_size: int,
        prefetch: int,
        timeout: float | None,
        flexible: bool,
        retry_unavailable_for: float,
    ) -> None:
        _aio.check_sampler(prefetch, timeout)
        self._c = client
        self._args = (table, batch_size, timeout, flexible)
        self._prefetch = prefetch
        self._retry_for = retry_unavailable_for
        self._futs: collections.deque[concurrent.futures.Future[bytes]] = collections.deque()
        self._closed = False
        # With prefetch 1: the iterating thread waits for the one request in
        # flight. Its reply is taken the moment it lands, so the loop sends
        # the request that replaces it there and then: handed over from
        # this thread once it woke, the request would leave the service
        # idle for two thread switches a reply. With more requests in
        # flight the service has work meanwhile, and the loop's thread,
        # busy reading their replies, is better left to it.
        self._waiting = False
        # The request next_raw waits on, which close cancels too.
        self._current: concurrent.futures.Future[bytes] | None = None
        # _futs, _closed, _waiting and _current are shared with the loop
        # thread, and with a thread that closes.
        self._lock = threading.Lock()

    def _fill(self) -> None:
        """Sends requests until prefetch are not yet taken, unless closed
        (the caller holds _lock)."""
        while not self._closed and not self._c._closed and len(self._futs) < self._prefetch:
            self._futs.append(self._c._lt.submit(self._request()))

    async def _request(self) -> bytes:
        t, n, timeout, flexible = self._args
        data = await self._c._aclient.sample_raw(t, n, timeout, flexible)
        with self._lock:
            # A failed request is not replaced here: next_raw decides
            # whether and when to ask again; nor is the reply that ends the
            # iteration.
            if self._waiting:
                self._waiting = False
                if not _aio.ends_sampler(data, timeout):
                    self._fill()
        return data

    def next_raw(self) -> bytes:
        """The next reply's bytes, undecoded."""
        if self._closed or self._c._closed:
            raise StopIteration
        since: float | None = None
        backoff = 0.01
        while True:
            with self._lock:
                self._fill()
                if not self._futs:
                    raise StopIteration  # closed by another thread
                fut = self._current = self._futs.popleft()
                self._waiting = self._prefetch == 1
            try:
                data = fut.result()
            except (concurrent.futures.CancelledError, errors.ClosedError):
                if self._closed or self._c._closed:
                    raise StopIteration from None  # closed by another thread
                raise
            except errors._NotSentError:
                # The timeout passed before a request could go: an end, as
                # the limiter's timeout is.
                self.close()
                raise StopIteration from None
            except (errors.UnavailableError, errors.DeadlineExceededError):
                # No reply is a service gone or swamped, not a rate limiter
                # that allowed nothing in time (RateLimitedError): waited
                # out as such, never the end of the iteration.
                now = time.monotonic()
                since = since or now
                if now - since > self._retry_for:
                    raise
                time.sleep(backoff)
                backoff = min(2 * backoff, 1.0)
                continue
            except (KeyboardInterrupt, SystemExit):
                self._keep(fut)
                raise
            finally:
                with self._lock:
                    self._waiting = False
                    self._current = None
            if not _aio.ends_sampler(data, self._args[2]):
                with self._lock:
                    self._fill()  # unless the loop replaced the reply already
            return data

    def __iter__(self) -> Sampler:
        return self

    def __next__(self) -> SampleBatch:
        since = time.monotonic()
        while True:
            data = self.next_raw()
            try:
                return _aio.decode_batch(data)
            except errors.RateLimitedError as e:
                if e.partial is not None and len(e.partial):
                    return e.partial  # a short batch: samples are never dropped
                if self._args[2] is None:
                    continue  # no timeout: wait on, as Reverb's sampler does
                self.close()
                raise StopIteration from None
            except errors.UnavailableError:
                # The service is shutting down or busy: wait it out.
                if time.monotonic() - since > self._retry_for:
                    raise
                time.sleep(0.05)

    def _next_ready(self) -> SampleBatch | None:
        """The next batch if its reply is in, else None: unlike next(), it
        never waits on the service, for a caller with a batch in hand to go
        on with (reprise.jax places batches ahead only as they come). A
        reply next() waits past (the limiter allowed nothing, without a
        timeout; the service unavailable) is dropped as next() drops it,
        and the end raises StopIteration as next() does."""
        timeout = self._args[2]
        while True:
            fut = self._pop_ready(
                lambda f: f.cancelled() or f.exception() is not None or not _aio.ends_sampler(f.result(), timeout)
            )
            if fut is None:
                return None
            try:
                return _aio.decode_batch(fut.result())
            except (concurrent.futures.CancelledError, errors.ClosedError):
                if self._closed or self._c._closed:
                    raise StopIteration from None
                raise
            except errors._NotSentError:
                self.close()
                raise StopIteration from None
            except errors.RateLimitedError as e:
                if e.partial is not None and len(e.partial):
                    return e.partial
                if self._args[2] is not None:
                    self.close()
                    raise StopIteration from None
            except (errors.UnavailableError, errors.DeadlineExceededError):
                pass  # the next reply may be in

    def close(self) -> None:
        """Cancels the requests in flight, the one an iterating thread waits
        on too: its iteration ends. Those still waiting for the rate limiter
        are withdrawn, and take nothing; replies already sampled and on
        their way are lost."""
        with self._lock:
            self._closed = True
            futs, self._futs = self._futs, collections.deque()
            if self._current is not None:
                futs.append(self._current)
        for f in futs:
            f.cancel()

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TrajectoryWriter:
    """Writes trajectories, as Reverb's ``TrajectoryWriter``; made by
    :meth:`Client.trajectory_writer`.

    ``append(step)`` adds a step (column name to array or scalar);
    ``history[column][-3:]`` references recent steps;
    ``create_item(table, priority, {"obs": history["obs"][-3:], ...})``
    makes an item of them; ``end_episode()``; ``flush()``; ``close()`` (or
    ``with``). Each column is cut into chunks of ``chunk_length`` steps,
    integer columns are delta-encoded, chunks are zstd-compressed and sent
    once however many items use them, exactly as the Go producer does.

    Items are published asynchronously within a bounded window: when the
    service does not apply them (a table's rate limiter holds inserts), the
    window fills and ``append``/``create_item`` block until it moves (with
    a log line after 10 s). Every message carries a dedupe id, so a resend
    after a reconnect never inserts twice. Errors that arrive later (a
    failed publish, a rejection by the service) are raised by the next
    ``create_item``, ``flush``, ``end_episode`` or ``close``.

    Differences from Reverb: a column's dtype and shape are fixed by its
    first step (a mismatch raises SignatureMismatchError naming the column);
    ``history`` references finished steps (the steps of a ``partial_step``
    become visible when the step is finished). ``flush`` returns, as
    Reverb's does, once the service applied the items (with
    ``return_on_store=True`` once JetStream stored them, durable; then
    :meth:`wait_applied` waits for the service).
    """

    def __init__(self, client: Client, opts: WriterOptions) -> None:
        self._c = client
        self.options = opts
        self._partial: dict[str, Any] = {}
        self._closed = False
        self._closing = False  # a close is under way, not interrupted
        self._close_mark: FailureMark = (0, 0, 0)  # the writer's failure_mark as its close began
        lt = client._lt

        async def start() -> tuple[_Producer, _Transport]:
            nc = client._aclient.nats
            t = _Transport(nc, client._aclient.subjects, lt.loop, opts, client._aclient._denials)
            p = _Producer(opts, client._aclient.max_payload, t.submit)
            await t.start(p)
            return p, t

        self._p, self._t = client._call(start())
        client._writers.add(self)

    @property
    def producer_id(self) -> str:
        """The writer's secret id, part of its dedupe ids: never log it."""
        return self._p.id

    @property
    def notice_token(self) -> str:
        """The writer's public name (its rejection subject's last token);
        the service's logs name it by this."""
        return self._p.token

    @property
    def history(self) -> History:
        """Column name to the column's recent steps, to pick items from."""
        return self._p.history

    @property
    def episode_steps(self) -> int:
        """Steps appended in the current episode."""
        return self._p.episode_steps

    def _advance(self, force: bool, deadline: float | None = None) -> None:
        p = self._p
        started = 0.0
        warned = False
        with p.mu:
            while True:
                try:
                    if force:
                        p.flush_locked()
                    else:
                        p.advance_locked(False)
                    return
                except _Blocked:
                    pass
                now = time.monotonic()
                started = started or now
                if deadline is not None and now >= deadline:
                    raise errors.DeadlineExceededError(
                        f"writer: no room in the window before the timeout: {p.describe_wait_locked()}"
                    )
                if not warned and now - started > _aio._WAIT_WARN_AFTER:
                    log.warning("reprise writer %s: waiting for room in the window: %s", p.token, p.describe_wait_locked())
                    warned = True
                p.cond.wait(1.0 if deadline is None else min(1.0, deadline - now))

    def append(self, step: Mapping[str, Any], partial_step: bool = False) -> None:
        """Appends one step: column name to array, numpy scalar or Python
        scalar (Python floats become float64, ints int64). With
        ``partial_step`` the step stays open for more columns until an
        append without it; its columns are checked and copied at the call.
        A column missing from a step has no cell there. Blocks while the
        window is full, and only before it keeps the step: an append that
        raises kept nothing of it, so the step may be appended again. The
        items the step completes are published as far as the window has
        room, the rest once it moves (with no further call); their errors (an
        item over the max payload) are raised by a later call."""
        self._check_open()
        p = self._p
        if partial_step:
            with p.mu:
                self._partial = p.partial_step_locked(self._partial, step)
            return
        if self._partial:
            for k in step:
                if k in self._partial:
                    raise errors.InvalidArgumentError(f"column {k!r} was already given for this step")
            step = {**self._partial, **step}
        # What earlier calls left is published first, waiting for room in
        # the window: an append that raises kept nothing of its step.
        with p.mu:
            if not p.due_locked() or p.try_advance_locked():
                p.append_locked(step)
                self._partial = {}
                p.advance_kept_locked()
                return
        self._advance(False)
        with p.mu:
            p.append_locked(step)
            self._partial = {}
            p.advance_kept_locked()

    def create_item(
        self,
        table: str,
        priority: float,
        trajectory: Mapping[str, TrajectoryColumn] | Iterable[TrajectoryColumn],
    ) -> None:
        """Creates an item for ``table`` from steps picked from
        :attr:`history`: ``trajectory`` maps the item's column names to
        references (``history["obs"][-3:]``; an integer index squeezes the
        single step), or lists references, each column named as the one it
        picks from. The item's columns are checked against the table's
        signature before anything is sent. It is published once the chunks
        it needs are complete (at once with chunk_length 1). Blocks while
        the window is full, and only before it creates the item: a
        create_item that raises created nothing, so the item may be created
        again. The errors that earlier messages met (RejectedError,
        NotStoredError, OutcomeUnknownError, an earlier item over the max
        payload) are raised before the item is created, and then it
        created nothing either; the item's own errors are raised by a later
        call."""
        self._check_open()
        p = self._p
        prio = check_item(table, priority)
        sig: Sequence[Any] | None = ()
        if self.options.validate_signatures:
            sig = self._c._aclient._signatures.get(table)
            if sig is None:
                trajectory = p.check_picks(trajectory)
                sig = self._c._call(self._c._aclient.signature(table))
        # What earlier calls left is published first, waiting for room in
        # the window: a create_item that raises created nothing.
        with p.mu:
            if not p.due_locked() or p.try_advance_locked():
                p.add_item_locked(table, prio, trajectory, sig or ())
                p.advance_kept_locked()
                return
        self._advance(False)
        with p.mu:
            p.add_item_locked(table, prio, trajectory, sig or ())
            p.advance_kept_locked()

    def flush(self, block_until_num_items: int = 0, timeout_ms: int | None = None, *, timeout: float | None = None) -> None:
        """Completes the open chunks, publishes every item created so far and
        waits until at most ``block_until_num_items`` items are not yet
        applied by the table service (0: all in their tables, so a sample
        sees them, as after Reverb's flush; a rate limiter that holds them
        holds this call). With ``WriterOptions(return_on_store=True)`` it
        waits only until JetStream stored them (durable). ``timeout``
        (seconds) or ``timeout_ms`` bounds the wait (DeadlineExceededError,
        raised with the errors seen meanwhile, as Go's Flush returns them
        beside ErrNotApplied; the items keep being retried)."""
        self._check_open()
        self._flush(block_until_num_items, _aio._deadline(timeout, timeout_ms), self._p.failure_mark())

    def _check_open(self) -> None:
        """Raises ClosedError once the writer's close has begun, as every
        call of a Go producer whose Close has begun returns ErrClosed: a
        wait beside the close's would end with it, or with its own
        timeout, and an end_episode would say that the episode did not
        end, for an actor to call it again in vain."""
        if self._closed:
            raise errors.ClosedError("writer closed")

    def _flush(self, block_until_num_items: int, deadline: float | None, mark: FailureMark) -> None:
        try:
            self._advance(True, deadline)
        except errors.RepriseError as e:
            with self._p.mu:
                raise self._p.ended_error_locked(e, mark)
        self._wait(lambda p: p.flushed_locked(block_until_num_items), deadline, "flush", mark)

    def wait_applied(self, timeout: float | None = None) -> None:
        """Flushes, then waits until the table service applied every item of
        this writer (or rejected it, which raises)."""
        self._check_open()
        deadline = _aio._deadline(timeout, None)
        mark = self._p.failure_mark()
        self._flush(0, deadline, mark)
        self._wait(lambda p: p.all_applied_locked(), deadline, "wait_applied", mark)

    def _wait(self, cond: Any, deadline: float | None, what: str, mark: FailureMark) -> None:
        """Waits until cond holds; raises the errors seen, and the loss of
        the items lost and the rejections since mark (the writer's
        failure_mark then)."""
        p = self._p
        with p.mu:
            while not cond(p):
                if p.stopped:
                    raise p.stopped_error_locked(what, mark)
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise p.ended_error_locked(
                        errors.DeadlineExceededError(f"writer {what}: timed out: {p.describe_wait_locked()}"), mark)
                p.cond.wait(1.0 if deadline is None else min(1.0, deadline - now))
            err = p.waited_errors_locked(mark)
        if err is not None:
            raise err

    def set_policy_version(self, version: int) -> None:
        """Sets the version of the policy producing the steps: items created
        from now on carry it, and a table with ``max_staleness`` drops them
        once they are too many versions behind its current one
        (:meth:`Client.set_policy_version`)."""
        version = check_policy_version(version)
        with self._p.mu:
            self._p.policy_version = version

    def end_episode(self, clear_buffers: bool = True, timeout_ms: int | None = None, *, timeout: float | None = None) -> None:
        """Publishes the episode's items, starts a new episode, and waits
        for the items as :meth:`flush` does. Later items cannot reference
        the old episode's steps and the service releases its chunks. The
        episode ends once its items are published, even when the wait then
        fails (a timeout, or an earlier message's error); it stays open
        only when publishing does not happen (no room in the window before
        the timeout), and then the error is an
        :class:`~reprise.EpisodeNotEndedError` (of the failure's class
        too): call ``end_episode`` again before the next episode's first
        step, which would otherwise continue this episode. Calling it again
        after any error is safe: an episode of no steps has nothing to end,
        so the call publishes what is left and waits, and starts no episode
        (nor moves a sharded writer to its next shard). (``clear_buffers``
        is accepted for Reverb compatibility; buffers are always
        cleared.)"""
        self._check_open()
        deadline = _aio._deadline(timeout, timeout_ms)
        p = self._p
        mark = p.failure_mark()
        try:
            self._advance(True, deadline)
        except errors.RepriseError as e:
            with p.mu:
                raise p.not_ended_error_locked(e)
        with p.mu:
            p.end_episode_locked()
        self._partial = {}
        self._wait(lambda p: p.flushed_locked(0), deadline, "end_episode", mark)

    def close(self, timeout: float | None = 60.0) -> None:
        """Flushes, tells the service it may drop this writer's chunks, waits
        for the acks (up to ``timeout``) and stops."""
        p = self._p
        if self not in self._c._writers:
            return
        deadline = _aio._deadline(timeout, None)
        if self._closed:
            if not self._closing:
                # An earlier close was interrupted (KeyboardInterrupt) before
                # its transport stopped: stop it now, and report what was
                # lost since that close began.
                self._stop(deadline)
                with p.mu:
                    err = p.waited_errors_locked(self._close_mark)
                if err is not None:
                    raise err
            return
        self._closed = self._closing = True
        self._close_mark = p.failure_mark()
        try:
            self._close(deadline)
        finally:
            self._closing = False

    def _stop(self, deadline: float | None) -> None:
        """Stops the transport; until it has stopped, the client keeps the
        writer, so that its close stops what an interrupted close left."""
        with self._p.mu:
            self._p.close_locked()
        try:
            self._c._lt.call(self._t.close(_aio._left(deadline)))
        finally:
            with self._p.mu:
                self._p.stop_locked()
        self._c._writers.discard(self)

    def _close(self, deadline: float | None) -> None:
        p = self._p
        mark = self._close_mark
        first: errors.RepriseError | None = None
        try:
            self._advance(True, deadline)
            with p.mu:
                p.end_episode_locked()
                while True:
                    try:
                        p._publish_locked(True)
                        break
                    except _Blocked:
                        now = time.monotonic()
                        if deadline is not None and now >= deadline:
                            raise errors.DeadlineExceededError(
                                "writer close: no room in the window for the final message"
                            ) from None
                        p.cond.wait(1.0 if deadline is None else min(1.0, deadline - now))
        except errors.RepriseError as e:
            first = e
        self._stop(deadline)
        with p.mu:
            err = p.waited_errors_locked(mark)
        if first is not None:
            raise first if err is None else _join([first, err])
        if err is not None:
            raise err

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ShardedClient:
    """A client of tables spread over several reprised, the shards: each
    serves its own prefix, all usually on one NATS server or cluster, and
    refuses items whose key does not name it (``reprised --prefix s1
    --shard 1/2``)::

        client = reprise.ShardedClient("nats://127.0.0.1:4222", ["s0", "s1"])

    It holds one :class:`Client` per shard, connected on one background
    event loop (:meth:`shard`), and offers the learner and actor calls of
    :class:`Client` over the whole table:

    - a sample draws the shard of each position independently, in
      proportion to the shards' total weights (the sum of
      priority**exponent for a prioritized table, the item count for any
      other), sends one request per shard drawn, at once, and returns the
      items in the drawn order. ``info.probability`` is the probability of
      this two-stage draw, exactly; ``info.table_size`` the whole table's.
      The shards' weights come with every sample reply; one learned more
      than 0.1 s ago, or before a mutation through this client, is asked
      for again first. A shard whose service does not answer (none
      listening, or an info request left unanswered for 2 s: it hangs)
      weighs 0 until it answers again, asked in the background: samples
      come from the others meanwhile, with probabilities over the items
      they hold, and the client logs the change both ways.
    - priority updates and deletes go to the shard each key names;
      ``reset``, ``set_policy_version``, ``set_max_staleness`` and
      ``checkpoint`` to every shard.
    - a :meth:`trajectory_writer` writes each episode to one shard, the
      next episode to the next shard.

    On a table's first use every shard is asked for it: each must report
    the shard its place in ``prefixes`` says (else InvalidArgumentError:
    give the prefixes in shard order), and serve the table with the same
    sampler, remover and signature. Each shard keeps its own size bound,
    rate limiter and order (fifo, lifo, heaps): they hold per shard.

    Args:
      server_address: NATS URL, several comma-separated or as a list.
      prefixes: every shard's prefix, in shard order: ``prefixes[i]`` is
        the reprised started with ``--shard i/len(prefixes)``.
      options: the other options of :class:`Client` (all but ``prefix``).
    """

    def __init__(self, server_address: str | Sequence[str], prefixes: Sequence[str], **options: Any) -> None:
        self._aclient = _sharded.ShardedClient(server_address, prefixes, **options)
        self._lt = _LoopThread("reprise-sharded-client")
        self._closed = False
        try:
            self._lt.call(self._aclient.connect())
        except BaseException:
            self._lt.stop()
            raise
        self._shards = tuple(Client._on_loop(c, self._lt) for c in self._aclient.shards)

    @property
    def prefixes(self) -> tuple[str, ...]:
        return self._aclient.prefixes

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    def shard(self, i: int) -> Client:
        """The :class:`Client` of shard i (prefix ``prefixes[i]``): its
        writers make keys of shard i. Closed with this client."""
        return self._shards[i]

    def _call(self, coro: Coroutine[Any, Any, T], *, interruptible: bool = False) -> T:
        if self._closed:
            coro.close()
            raise errors.ClosedError("client closed")
        return self._lt.call(coro, interruptible=interruptible)

    def close(self) -> None:
        """Closes every shard's client: its writers (flushing them), then its
        connection."""
        if self._closed:
            return
        # First, so that a sampler whose call the closing cancels ends.
        self._closed = True
        for c in self._shards:
            try:
                c.close()
            except errors.RepriseError as e:
                log.warning("reprise: closing shard %s: %s", c.prefix, e)
        try:
            self._lt.call(self._aclient.close(), 30)
        finally:
            self._lt.stop()

    def __enter__(self) -> ShardedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- learner side -----------------------------------------------------

    def sample(
        self, table: str, num_samples: int = 1, *, timeout: float | None = None, flexible: bool = False
    ) -> Iterator[ReplaySample]:
        """Samples ``num_samples`` items of ``table``, as
        :meth:`Client.sample`. An empty table is asked again, backing off,
        until a shard holds items; when ``timeout`` (one minute without
        one) passes first it raises RateLimitedError. A shard that returns
        fewer items than drawn for it (its rate limiter, ``flexible``) or
        fails leaves its positions out: the call raises that shard's error
        (a failure before a rate limit), whose ``partial`` holds the items
        the others returned; with ``flexible`` a rate limit is no error
        once some items came."""
        return iter(_sharded.merge_samples(self._call(self._aclient._draw(table, num_samples, timeout, flexible), interruptible=True)))

    def sample_batch(
        self, table: str, batch_size: int, *, timeout: float | None = None, flexible: bool = False
    ) -> SampleBatch:
        """One stacked batch, as :meth:`Client.sample_batch`, of the items
        :meth:`sample` would return."""
        return _sharded.merge_batch(self._call(self._aclient._draw(table, batch_size, timeout, flexible), interruptible=True))

    def sampler(
        self,
        table: str,
        batch_size: int,
        *,
        prefetch: int = 2,
        timeout: float | None = None,
        flexible: bool = False,
        retry_unavailable_for: float = 60.0,
    ) -> ShardedSampler:
        """An iterator of batches keeping ``prefetch`` calls in flight, as
        :meth:`Client.sampler`. A call that a shard failed while the others
        answered gives their items as a short batch; while that goes on
        (a shard that does not answer in time), for up to
        ``retry_unavailable_for`` seconds."""
        return ShardedSampler(self, table, batch_size, prefetch, timeout, flexible, retry_unavailable_for)

    def mutate_priorities(
        self,
        table: str,
        updates: Mapping[int, float] | None = None,
        deletes: Iterable[int] | None = None,
        *,
        timeout: float | None = 10.0,
    ) -> None:
        """As :meth:`Client.mutate_priorities`: each key's update or delete
        goes to the shard the key names (in the given order), all shards at
        once."""
        self._call(self._aclient.mutate_priorities(table, updates, deletes, timeout=timeout))

    def update_priorities(self, table: str, keys: Any, priorities: Any, *, timeout: float | None = 10.0) -> None:
        """``mutate_priorities`` from two arrays, e.g. ``batch.info.key`` and
        new priorities."""
        self._call(self._aclient.update_priorities(table, keys, priorities, timeout=timeout))

    def set_policy_version(self, table: str, version: int, *, timeout: float | None = 10.0) -> None:
        """As :meth:`Client.set_policy_version`, on every shard."""
        self._call(self._aclient.set_policy_version(table, version, timeout=timeout))

    def set_max_staleness(self, table: str, max_staleness: int | None, *, timeout: float | None = 10.0) -> None:
        """As :meth:`Client.set_max_staleness`, on every shard."""
        self._call(self._aclient.set_max_staleness(table, max_staleness, timeout=timeout))

    def reset(self, table: str, *, timeout: float | None = 60.0) -> None:
        """Empties ``table`` on every shard and zeroes their rate limiters."""
        self._call(self._aclient.reset(table, timeout=timeout))

    def server_info(self, timeout: float | None = 10.0) -> dict[str, TableInfo]:
        """Table name to :class:`TableInfo` of the whole table: sizes,
        capacities (``max_size``), counters and weights summed over the
        shards, the highest policy version, the item versions' span over
        the shards holding items, and shard 0's config."""
        return self._call(self._aclient.server_info(timeout))

    def shard_info(self, timeout: float | None = 10.0) -> list[dict[str, TableInfo]]:
        """Every shard's :meth:`Client.server_info`, in shard order."""
        return self._call(self._aclient.shard_info(timeout))

    def checkpoint(self, *, timeout: float | None = 120.0) -> list[CheckpointInfo]:
        """Has every shard write a checkpoint now; what each wrote, in shard
        order."""
        return self._call(self._aclient.checkpoint(timeout=timeout))

    # -- actor side ---------------------------------------------------------

    def trajectory_writer(self, num_keep_alive_refs: int = 128, **options: Any) -> ShardedTrajectoryWriter:
        """A :class:`ShardedTrajectoryWriter`; the arguments are those of
        :meth:`Client.trajectory_writer`."""
        if "key_shard" in options:
            raise errors.InvalidArgumentError("a ShardedClient's writers make each shard's keys: no key_shard")
        writers = [c.trajectory_writer(num_keep_alive_refs, **options) for c in self._shards]
        return ShardedTrajectoryWriter(self, writers, random.randrange(len(writers)))

    def insert(self, data: Mapping[str, Any], priorities: Mapping[str, float], *, timeout: float | None = 60.0) -> None:
        """As :meth:`Client.insert`, on one shard drawn at random."""
        self._call(self._aclient.insert(data, priorities, timeout=timeout))


class ShardedSampler(_InFlight):
    """Iterator of :class:`SampleBatch` from a sharded table with calls kept
    in flight; made by :meth:`ShardedClient.sampler`. Replies are decoded
    in the iterating thread."""

    def __init__(
        self,
        client: ShardedClient,
        table: str,
        batch_size: int,
        prefetch: int,
        timeout: float | None,
        flexible: bool,
        retry_unavailable_for: float,
    ) -> None:
        _aio.check_sampler(prefetch, timeout)
        self._c = client
        self._args = (table, batch_size, timeout, flexible)
        self._prefetch = prefetch
        self._retry_for = retry_unavailable_for
        self._futs: collections.deque[concurrent.futures.Future[_sharded._Draw]] = collections.deque()
        self._closed = False
        # The call __next__ waits on, which close cancels too.
        self._current: concurrent.futures.Future[_sharded._Draw] | None = None
        # _futs, _closed and _current, as close may come from another
        # thread.
        self._lock = threading.Lock()
        # Since when batches have come short of a failing shard.
        self._short_since: float | None = None

    def __iter__(self) -> ShardedSampler:
        return self

    def _fill(self) -> None:
        """Sends calls until prefetch are not yet taken, unless closed (the
        caller holds _lock)."""
        while not self._closed and not self._c._closed and len(self._futs) < self._prefetch:
            self._futs.append(self._c._lt.submit(self._c._aclient._draw(*self._args)))

    def __next__(self) -> SampleBatch:
        since: float | None = None
        backoff = 0.01
        timeout = self._args[2]
        while True:
            with self._lock:
                if self._closed or self._c._closed:
                    raise StopIteration
                self._fill()
                if not self._futs:
                    raise StopIteration  # the client closed meanwhile
                fut = self._current = self._futs.popleft()
            try:
                batch = _sharded.merge_batch(fut.result())
                self._short_since = None
            except (concurrent.futures.CancelledError, errors.ClosedError):
                if self._closed or self._c._closed:
                    raise StopIteration from None  # closed by another thread
                raise
            except errors.RateLimitedError as e:
                if e.partial is None or not len(e.partial):
                    if timeout is None:
                        continue  # no timeout: wait on, as Reverb's sampler does
                    self.close()
                    raise StopIteration from None
                batch = e.partial  # a short batch: samples are never dropped
            except errors._NotSentError:
                # The timeout passed before the shards could be asked: an
                # end, as the limiters' timeout is.
                self.close()
                raise StopIteration from None
            except (errors.UnavailableError, errors.DeadlineExceededError) as e:
                now = time.monotonic()
                if e.partial is not None and len(e.partial):
                    self._short_since = self._short_since or now
                    if now - self._short_since > self._retry_for:
                        raise
                    batch = e.partial
                else:
                    since = since or now
                    if now - since > self._retry_for:
                        raise
                    time.sleep(backoff)
                    backoff = min(2 * backoff, 1.0)
                    continue
            except (KeyboardInterrupt, SystemExit):
                self._keep(fut)
                raise
            finally:
                with self._lock:
                    self._current = None
            # The call that replaces this batch goes out before the caller
            # trains on it, or with prefetch 1 the shards would idle
            # through every training step.
            with self._lock:
                self._fill()
            return batch

    def _next_ready(self) -> SampleBatch | None:
        """The next batch if its call is done, else None: as
        :meth:`Sampler._next_ready`, never waiting on the shards."""
        timeout = self._args[2]
        while True:
            fut = self._pop_ready(lambda f: True)
            if fut is None:
                return None
            try:
                batch = _sharded.merge_batch(fut.result())
                self._short_since = None
                return batch
            except (concurrent.futures.CancelledError, errors.ClosedError):
                if self._closed or self._c._closed:
                    raise StopIteration from None
                raise
            except errors.RateLimitedError as e:
                if e.partial is not None and len(e.partial):
                    return e.partial
                if timeout is not None:
                    self.close()
                    raise StopIteration from None
            except errors._NotSentError:
                self.close()
                raise StopIteration from None
            except (errors.UnavailableError, errors.DeadlineExceededError) as e:
                if e.partial is not None and len(e.partial):
                    now = time.monotonic()
                    self._short_since = self._short_since or now
                    if now - self._short_since > self._retry_for:
                        raise
                    return e.partial

    def close(self) -> None:
        """Cancels the calls in flight, the one an iterating thread waits on
        too: its iteration ends. The shards' requests still waiting for the
        rate limiter are withdrawn, and take nothing."""
        with self._lock:
            self._closed = True
            futs, self._futs = self._futs, collections.deque()
            if self._current is not None:
                futs.append(self._current)
        for f in futs:
            f.cancel()

    def __enter__(self) -> ShardedSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ShardedTrajectoryWriter:
    """Writes trajectories to a sharded table, with the API of
    :class:`TrajectoryWriter`; made by :meth:`ShardedClient.trajectory_writer`.

    It holds one writer per shard (:attr:`writers`), each making keys of
    its shard, and writes each episode through one of them: the first
    episode's shard is drawn at random, and each :meth:`end_episode` moves
    to the next shard, so an item and the chunks it references live on one
    shard. ``history``, ``episode_steps``, ``append`` and ``create_item``
    are the current shard's writer's; ``flush``, ``wait_applied``,
    ``set_policy_version`` and ``close`` apply to every shard's (the
    waits at once, each within the timeout).
    """

    def __init__(self, client: ShardedClient, writers: Sequence[TrajectoryWriter], first: int) -> None:
        self._c = client
        self._writers = tuple(writers)
        self._shard = first

    @property
    def writers(self) -> tuple[TrajectoryWriter, ...]:
        """The shards' writers, in shard order."""
        return self._writers

    @property
    def shard(self) -> int:
        """The shard the current episode is written to."""
        return self._shard

    @property
    def options(self) -> WriterOptions:
        return self._writers[0].options

    @property
    def producer_id(self) -> str:
        """The current shard's writer's secret id: never log it."""
        return self._writers[self._shard].producer_id

    @property
    def notice_token(self) -> str:
        """The current shard's writer's public name."""
        return self._writers[self._shard].notice_token

    @property
    def history(self) -> History:
        """The current episode's columns, to pick items from."""
        return self._writers[self._shard].history

    @property
    def episode_steps(self) -> int:
        """Steps appended in the current episode."""
        return self._writers[self._shard].episode_steps

    def append(self, step: Mapping[str, Any], partial_step: bool = False) -> None:
        """Appends a step to the current episode (see
        :meth:`TrajectoryWriter.append`)."""
        self._writers[self._shard].append(step, partial_step)

    def create_item(
        self,
        table: str,
        priority: float,
        trajectory: Mapping[str, TrajectoryColumn] | Iterable[TrajectoryColumn],
    ) -> None:
        """Creates an item on the current episode's shard (see
        :meth:`TrajectoryWriter.create_item`). A table's first item checks
        the shards' places and configs, as a sample does."""
        w = self._writers[self._shard]
        # Closed, it asks the shards nothing: their answer would hide it.
        w._check_open()
        if table not in self._c._aclient._states:
            self._c._call(self._c._aclient._table_soft(table))
        w.create_item(table, priority, trajectory)

    def _each(self, call: Callable[[TrajectoryWriter], None]) -> None:
        """call on every shard's writer at once, the first on this thread
        and each other on one of its own, as the Go ShardedProducer's
        calls and the async writer's run: one after the other, a shard
        whose call waited out the timeout left the next none (a close then
        gave up on messages whose acks were on their way). Once all are
        done, raises their errors as one, each naming its shard (a
        writer's call took its errors: one left out would never be
        raised). A KeyboardInterrupt (or SystemExit) in this thread leaves
        at once, as it would a writer's own call, and an exception that is
        no RepriseError is raised as it is: the errors the shards' calls
        took then go back to their writers, for the next call to raise."""
        outcome: list[BaseException | None] = [None] * len(self._writers)
        lock = threading.Lock()
        left = False  # this thread left: the calls still running give back what they raise

        def run(i: int) -> None:
            try:
                call(self._writers[i])
            except BaseException as e:  # noqa: BLE001 - raised by the caller's thread
                with lock:
                    if not left:
                        outcome[i] = e
                        return
                self._give_back(i, e)

        others = [threading.Thread(target=run, args=(i,), name=f"sharded-writer-{i}", daemon=True)
                  for i in range(1, len(self._writers))]
        for th in others:
            th.start()
        try:
            try:
                call(self._writers[0])
            except Exception as first:  # noqa: BLE001 - raised once the others are done
                outcome[0] = first
            for th in others:
                th.join()
        except BaseException:
            # The other shards' calls run on to their deadlines: their
            # waits cannot be cut short from here.
            with lock:
                left = True
                done = list(enumerate(outcome))
            for i, taken in done:
                self._give_back(i, taken)
            raise
        bug = next((e for e in outcome if e is not None and not isinstance(e, errors.RepriseError)), None)
        if bug is not None:
            for i, taken in enumerate(outcome):
                if isinstance(taken, errors.RepriseError):
                    self._give_back(i, taken)
            raise bug
        errs = [_sharded.on_shard(e, i, self._c.prefixes[i])
                for i, e in enumerate(outcome) if isinstance(e, errors.RepriseError)]
        if errs:
            raise _join(errs)

    def _give_back(self, i: int, e: BaseException | None) -> None:
        """Hands e, which shard i's writer's call raised and no caller
        will, back to that writer, whose next call raises it; one that is
        no RepriseError is logged."""
        if isinstance(e, errors.RepriseError):
            self._writers[i]._p.on_error(e)
        elif e is not None:
            log.error("reprise sharded writer: shard %d's call raised, its caller gone", i, exc_info=e)

    def flush(self, block_until_num_items: int = 0, timeout_ms: int | None = None, *, timeout: float | None = None) -> None:
        """Flushes every shard's writer (see :meth:`TrajectoryWriter.flush`;
        ``block_until_num_items`` per shard), all within ``timeout``."""
        deadline = _aio._deadline(timeout, timeout_ms)
        self._each(lambda w: w.flush(block_until_num_items, timeout=_aio._left(deadline)))

    def wait_applied(self, timeout: float | None = None) -> None:
        """Waits until every shard applied every item of its writer."""
        deadline = _aio._deadline(timeout, None)
        self._each(lambda w: w.wait_applied(_aio._left(deadline)))

    def set_policy_version(self, version: int) -> None:
        """Sets the policy version of every shard's writer."""
        for w in self._writers:
            w.set_policy_version(version)

    def end_episode(self, clear_buffers: bool = True, timeout_ms: int | None = None, *, timeout: float | None = None) -> None:
        """Ends the episode on its shard (see
        :meth:`TrajectoryWriter.end_episode`); once it ended (the error, if
        any, is no :class:`~reprise.EpisodeNotEndedError`), the next
        episode goes to the next shard. Called again after an error, it
        moves no further: the episode it finds has no steps."""
        w = self._writers[self._shard]
        episode = w._p.episode
        try:
            w.end_episode(clear_buffers, timeout_ms, timeout=timeout)
        finally:
            if w._p.episode != episode:  # ended, even if its wait failed
                self._shard = (self._shard + 1) % len(self._writers)

    def close(self, timeout: float | None = 60.0) -> None:
        """Closes every shard's writer, all within ``timeout``."""
        deadline = _aio._deadline(timeout, None)
        self._each(lambda w: w.close(_aio._left(deadline)))

    def __enter__(self) -> ShardedTrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
