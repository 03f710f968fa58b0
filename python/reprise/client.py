"""The synchronous client: :class:`Client`, :class:`TrajectoryWriter` and
:class:`Sampler`.

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
import threading
import time
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from . import _codec, _conn, errors
from . import aio as _aio
from ._info import CheckpointInfo, TableInfo
from ._sample import ReplaySample, SampleBatch
from ._writer import History, TrajectoryColumn, WriterOptions, _Blocked, _Producer, _Transport, check_signature

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
        self.loop.close()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("reprise: a blocking call from the client's own event loop thread would deadlock")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            if fut.done():
                raise  # the coroutine's own error (DeadlineExceededError is a TimeoutError)
            fut.cancel()
            raise errors.DeadlineExceededError(f"no result within {timeout}s") from None

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
        round trip sooner (Go: broker.WithReturnOnStore).

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
        try:
            self._lt.call(self._aclient.connect())
        except BaseException:
            self._lt.stop()
            raise

    @property
    def options(self) -> _conn.ConnectOptions:
        return self._aclient.options

    @property
    def prefix(self) -> str:
        return self._aclient.options.prefix

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._closed:
            coro.close()
            raise errors.ClosedError("client closed")
        return self._lt.call(coro, timeout)

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

        Waits for the table's rate limiter up to ``timeout`` seconds (None:
        as long as the service allows, one minute by default) and then
        raises RateLimitedError; when the limiter allowed only some items,
        the error's ``partial`` holds them. With ``flexible`` the reply may
        hold fewer items, as soon as at least one is allowed."""
        data = self._call(self._aclient.sample_raw(table, num_samples, timeout, flexible))
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
        return _aio.decode_batch(self._call(self._aclient.sample_raw(table, batch_size, timeout, flexible)))

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
        ``max_in_flight_samples_per_worker``. With a ``timeout``, a request
        the rate limiter does not allow in time ends the iteration (as
        Reverb's ``rate_limiter_timeout_ms`` ends a dataset); without, it
        waits. A lost service (a restart) is waited for up to
        ``retry_unavailable_for`` seconds. Close it (or use ``with``) to
        stop its requests; prefetched items nobody took are lost, so use
        ``prefetch=1`` with a queue table."""
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
        opts = WriterOptions(num_keep_alive_refs=num_keep_alive_refs, **options)
        return TrajectoryWriter(self, opts)

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
            w.append(data)
            traj = {c: w.history[c][-1] for c in data}
            for table, p in priorities.items():
                w.create_item(table, p, traj)
            w.end_episode(timeout=timeout)


class Sampler:
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
        if prefetch < 1:
            raise errors.InvalidArgumentError(f"prefetch must be >= 1, got {prefetch}")
        self._c = client
        self._args = (table, batch_size, timeout, flexible)
        self._prefetch = prefetch
        self._retry_for = retry_unavailable_for
        self._futs: collections.deque[concurrent.futures.Future[bytes]] = collections.deque()
        self._closed = False

    def _issue(self) -> None:
        t, n, timeout, flexible = self._args
        self._futs.append(self._c._lt.submit(self._c._aclient.sample_raw(t, n, timeout, flexible)))

    def next_raw(self) -> bytes:
        """The next reply's bytes, undecoded."""
        if self._closed or self._c._closed:
            raise StopIteration
        since: float | None = None
        backoff = 0.01
        while True:
            while len(self._futs) < self._prefetch:
                self._issue()
            fut = self._futs.popleft()
            try:
                data = fut.result()
            except (errors.UnavailableError, errors.DeadlineExceededError) as e:
                if isinstance(e, errors.DeadlineExceededError) and self._args[2] is not None:
                    self.close()
                    raise StopIteration from None
                now = time.monotonic()
                since = since or now
                if now - since > self._retry_for:
                    raise
                time.sleep(backoff)
                backoff = min(2 * backoff, 1.0)
                continue
            self._issue()
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

    def close(self) -> None:
        """Cancels the requests in flight."""
        self._closed = True
        for f in self._futs:
            f.cancel()
        self._futs.clear()

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
        return History(self._p)

    @property
    def episode_steps(self) -> int:
        """Steps appended in the current episode."""
        return self._p.episode_steps

    def _advance(self, force: bool, deadline: float | None = None) -> None:
        p = self._p
        started = time.monotonic()
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
        append without it. A column missing from a step has no cell there.
        Blocks while the window is full."""
        if self._closed:
            raise errors.ClosedError("writer closed")
        if partial_step or self._partial:
            for k in step:
                if k in self._partial:
                    raise errors.InvalidArgumentError(f"column {k!r} was already given for this step")
            merged = {**self._partial, **step}
            if partial_step:
                self._partial = merged
                return
            self._partial = {}
            step = merged
        p = self._p
        with p.mu:
            p.append_locked(step)
            if not p.pending:
                return  # nothing waits for the chunks this step sealed
        self._advance(False)

    def create_item(
        self,
        table: str,
        priority: float,
        trajectory: Mapping[str, TrajectoryColumn] | Sequence[TrajectoryColumn],
    ) -> None:
        """Creates an item for ``table`` from steps picked from
        :attr:`history`: ``trajectory`` maps the item's column names to
        references (``history["obs"][-3:]``; an integer index squeezes the
        single step). The item's columns are checked against the table's
        signature before anything is sent. It is published once the chunks
        it needs are complete (at once with chunk_length 1)."""
        if self._closed:
            raise errors.ClosedError("writer closed")
        if not table:
            raise errors.InvalidArgumentError("empty table name")
        p = self._p
        prio = _codec.check_finite_priority(priority, f"item for table {table!r}")
        with p.mu:
            refs = p.resolve_locked(trajectory)
        if self.options.validate_signatures:
            sig = self._c._aclient._signatures.get(table)
            if sig is None:
                sig = self._c._call(self._c._aclient.signature(table))
            if sig is not None:
                check_signature(table, refs, sig)
        with p.mu:
            err = p.take_errors_locked()
            p.create_item_locked(table, prio, refs)
        self._advance(False)
        if err is not None:
            raise err

    def flush(self, block_until_num_items: int = 0, timeout_ms: int | None = None, *, timeout: float | None = None) -> None:
        """Completes the open chunks, publishes every item created so far and
        waits until at most ``block_until_num_items`` items are not yet
        applied by the table service (0: all in their tables, so a sample
        sees them, as after Reverb's flush; a rate limiter that holds them
        holds this call). With ``WriterOptions(return_on_store=True)`` it
        waits only until JetStream stored them (durable). ``timeout``
        (seconds) or ``timeout_ms`` bounds the wait (DeadlineExceededError;
        the items keep being retried)."""
        deadline = _aio._deadline(timeout, timeout_ms)
        self._advance(True, deadline)
        self._wait(lambda p: p.flushed_locked(block_until_num_items), deadline, "flush")

    def wait_applied(self, timeout: float | None = None) -> None:
        """Flushes, then waits until the table service applied every item of
        this writer (or rejected it, which raises)."""
        deadline = _aio._deadline(timeout, None)
        self.flush(timeout=_aio._left(deadline))
        self._wait(lambda p: p.unacked_items + p.acked_items == 0, deadline, "wait_applied")

    def _wait(self, cond: Any, deadline: float | None, what: str) -> None:
        p = self._p
        with p.mu:
            while not cond(p):
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise errors.DeadlineExceededError(f"writer {what}: timed out: {p.describe_wait_locked()}")
                p.cond.wait(1.0 if deadline is None else min(1.0, deadline - now))
            err = p.take_errors_locked()
        if err is not None:
            raise err

    def set_policy_version(self, version: int) -> None:
        """Sets the version of the policy producing the steps: items created
        from now on carry it, and a table with ``max_staleness`` drops them
        once they are too many versions behind its current one
        (:meth:`Client.set_policy_version`)."""
        with self._p.mu:
            self._p.policy_version = int(version)

    def end_episode(self, clear_buffers: bool = True, timeout_ms: int | None = None, *, timeout: float | None = None) -> None:
        """Publishes the episode's items, waits as :meth:`flush` does, and
        starts a new episode: later items cannot reference its steps and
        the service releases its chunks. (``clear_buffers`` is accepted for
        Reverb compatibility; buffers are always cleared.)"""
        self.flush(timeout_ms=timeout_ms, timeout=timeout)
        with self._p.mu:
            self._p.end_episode_locked()
        self._partial = {}

    def close(self, timeout: float | None = 60.0) -> None:
        """Flushes, tells the service it may drop this writer's chunks, waits
        for the acks (up to ``timeout``) and stops."""
        if self._closed:
            return
        self._closed = True
        self._c._writers.discard(self)
        p = self._p
        deadline = _aio._deadline(timeout, None)
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
        with p.mu:
            p.closing = True
            p.closed = True
        left = _aio._left(deadline)
        self._c._lt.call(self._t.close(left))
        with p.mu:
            err = p.take_errors_locked()
        if first is not None:
            raise first
        if err is not None:
            raise err

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
