"""Reprise for asyncio programs: the same API as :class:`reprise.Client`
and :class:`reprise.ShardedClient`, as coroutines.

::

    import reprise.aio

    async with reprise.aio.Client("nats://127.0.0.1:4222") as client:
        batch = await client.sample_batch("replay", 256, timeout=5)
        async with await client.trajectory_writer(num_keep_alive_refs=3) as w:
            await w.append({"obs": obs, "action": 1})
            await w.create_item("replay", 1.0, {"obs": w.history["obs"][-1]})
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from nats.aio.msg import Msg
from nats.errors import SlowConsumerError

from . import _codec, _conn, _info, _sample, errors
from ._conn import ConnectOptions, Requester, Subjects
from ._info import CheckpointInfo, TableInfo
from ._proto import reprise_pb2 as pb
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
    rejection_error,
)

log = logging.getLogger("reprise")

#: How long a blocked writer waits before it logs why.
_WAIT_WARN_AFTER = 10.0
#: How long a sample without a timeout waits for the rate limiter: the
#: service's own default bound (service.max_sample_wait), after which it
#: answers RateLimitedError.
DEFAULT_SAMPLE_WAIT = 60.0
#: How long after the wait it asked for a client still waits for the
#: reply, on a loaded machine.
_SAMPLE_REPLY_MARGIN = 10.0
#: How often a sample that waits checks that a table service still listens.
_SERVICE_PROBE_EVERY = 1.0


def check_sampler(prefetch: int, timeout: float | None) -> None:
    """Refuses a sampler's settings that cannot work: fewer than one
    request in flight, or a timeout that leaves no time to send one (which
    would end the iteration before any request, however many items the
    table holds)."""
    if prefetch < 1:
        raise errors.InvalidArgumentError(f"prefetch must be >= 1, got {prefetch}")
    if timeout is not None and not timeout > 0:
        raise errors.InvalidArgumentError(
            f"timeout must be > 0 seconds or None (wait for the rate limiter), got {timeout}: a sampler sends no"
            " request without time for its reply (Reverb's rate_limiter_timeout_ms=0 is a small timeout here, such as 0.05)"
        )


def sample_timeouts(timeout: float | None) -> tuple[int, float | None]:
    """The service's wait (timeout_ms) and the client's own wait for a
    sample request with the caller's timeout in seconds. The service gets
    less than the caller, leaving the reply time to travel: a sample taken
    after the client stopped listening would be lost."""
    if timeout is None:
        # The service answers by then, rate limited or not, unless it is
        # gone.
        return int(DEFAULT_SAMPLE_WAIT * 1000), DEFAULT_SAMPLE_WAIT + _SAMPLE_REPLY_MARGIN
    margin = min(timeout / 2, max(timeout / 10, 0.25))
    return max(0, int((timeout - margin) * 1000)), timeout


def sample_request(table: str, num_samples: int, timeout_ms: int, flexible: bool) -> bytes:
    """A sample request, as Go's broker.Client sends it (golden vectors
    hold both). The compact layout only: _sample refuses replies in the
    wide one (a service older than this client)."""
    return pb.SampleRequest(
        table=table,
        num_samples=num_samples,
        timeout_ms=timeout_ms,
        flexible=flexible,
        packed=True,
        layout=pb.PACKED_LAYOUT_UNIFORM,
    ).SerializeToString()


def sample_withdrawal(reply: str) -> bytes:
    """The message that withdraws the sample request sent with reply
    subject ``reply``, published without one on the sample subject (as Go's
    broker.Client publishes it). A service older than withdrawals ignores
    it, and logs that it did (at most about once a second)."""
    return pb.SampleRequest(withdraw=reply).SerializeToString()


def ends_sampler(data: bytes, timeout: float | None) -> bool:
    """Whether a sample reply ends a sampler with that timeout: a rate
    limiter that allowed nothing in time. A sampler sends no request to
    replace it: that one would wait a whole timeout more, and take items
    for nobody. Such a reply is a status alone, a few hundred bytes: a
    larger one holds items and is not read here, where reading its fields
    would cost a Python step per chunk of every batch."""
    return timeout is not None and len(data) <= _STATUS_REPLY_BYTES and _sample.reply_code(data) == pb.CODE_RATE_LIMITED


#: The most bytes ends_sampler reads: a status reply's code and message
#: (which names the table and the wait) with room to spare.
_STATUS_REPLY_BYTES = 4096


def parse_status_reply(cls: Any, data: bytes, what: str) -> Any:
    try:
        resp = cls.FromString(data)
    except Exception as e:  # noqa: BLE001 - the runtime's DecodeError
        raise errors.ProtocolError(f"malformed {what} response: {e}") from None
    _sample.raise_for_status(resp.status.code, resp.status.message)
    return resp


#: The service's default limits.max_mutation_ops: a mutation of more ops
#: is sent as several messages.
MAX_MUTATION_OPS = 65536


def mutation_ops(updates: Mapping[int, float] | None, deletes: Iterable[int] | None) -> list[pb.MutationOp]:
    """The ops of a mutation, checked: the deletes first, then the updates
    (as Reverb applies them)."""
    ops: list[pb.MutationOp] = []
    for k in () if deletes is None else deletes:
        ops.append(pb.MutationOp(key=_key(k), delete=True))
    for k, p in (updates or {}).items():
        ops.append(pb.MutationOp(key=_key(k), priority=_codec.check_finite_priority(p, f"key {int(k)}")))
    return ops


def mutation_messages(table: str, ops: Sequence[pb.MutationOp], per_msg: int, notice: str = "") -> list[bytes]:
    """Encoded Mutation messages of ``table``, ``per_msg`` ops each (see
    :func:`_ops_per_message`); a refusal of one goes to ``notice``, when
    given."""
    return [
        pb.Mutation(table=table, ops=ops[i : i + per_msg], notice_subject=notice).SerializeToString()
        for i in range(0, len(ops), per_msg)
    ]


def _ops_per_message(table: str, max_payload: int, max_ops: int) -> int:
    """How many ops a mutation message of ``table`` holds: the service
    refuses one of more than its limits.max_mutation_ops, NATS one over its
    max payload."""
    return min(max_ops, max(1, (max_payload - 1024 - len(table)) // 24))


def _key(k: Any) -> int:
    """k as an item key, which the wire holds as a uint64."""
    try:
        key = int(k)
    except (TypeError, ValueError):
        raise errors.InvalidArgumentError(f"key {k!r} is not an integer") from None
    if not 0 <= key < 1 << 64:
        raise errors.InvalidArgumentError(f"key {key}: keys are 0 to 2**64-1")
    return key


def key_array(keys: Any) -> np.ndarray:
    """keys as a flat uint64 array, checked: integers from 0 to 2**64-1."""
    # A cast to uint64 wraps negative keys (numpy 1 does so for lists of
    # Python ints too), truncates fractions and turns floats past its range
    # into 0: the keys are checked first, as they are (floats hold integers
    # exactly only up to 2**53). Floats are refused only in arrays: numpy
    # makes floats of a list of Python ints that exceed int64, which the
    # cast itself checks.
    raw = np.asarray(keys)
    floats = raw.dtype.kind == "f" and getattr(keys, "dtype", None) is not None
    if (raw.dtype.kind == "i" or floats) and raw.size:
        bad = (raw < 0) | (raw != np.floor(raw)) | (raw > 2.0**53) if floats else raw < 0
        if bad.any():
            raise errors.InvalidArgumentError(f"key {raw[bad].ravel()[0]}: keys are integers from 0 to 2**64-1")
    try:
        return np.asarray(keys, dtype=np.uint64).ravel()
    except (OverflowError, TypeError, ValueError) as e:
        raise errors.InvalidArgumentError(f"keys: not all are 0 to 2**64-1 ({e})") from None


def priority_arrays(keys: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray]:
    """keys (uint64) and priorities (float64) as flat arrays, checked: the
    same length, every key 0 to 2**64-1, every priority finite and >= 0."""
    k = key_array(keys)
    p = np.asarray(priorities, dtype=np.float64).ravel()
    if k.shape != p.shape:
        raise errors.InvalidArgumentError(f"{k.size} keys and {p.size} priorities")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        bad = int(np.flatnonzero(~np.isfinite(p) | (p < 0))[0])
        raise errors.InvalidArgumentError(f"key {int(k[bad])}: priority {p[bad]} (must be finite and >= 0)")
    return k, p


def _priorities_from_arrays(keys: Any, priorities: Any) -> dict[int, float]:
    k, p = priority_arrays(keys, priorities)
    return dict(zip(k.tolist(), p.tolist()))


#: How many refusals of mutations wait to be taken: a mutation's caller
#: takes its own once the service applied it, so only callers that gave up
#: leave theirs behind.
_MAX_KEPT_REFUSALS = 1024


class _AppliedWatch:
    """The service's applied stream sequence (<prefix>.applied), which
    mutations wait for, and its refusals of this client's mutations."""

    def __init__(self) -> None:
        self.seq = 0
        #: seq before its latest change.
        self._prev_seq = 0
        self._closed = False
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        # Refusals by the mutation's stream sequence; on_progress lets the
        # refusals that came before a progress in first.
        self._refused: dict[int, Any] = {}
        #: Refusals dropped unread: past _MAX_KEPT_REFUSALS, or by nats-py
        #: as a slow consumer (Client._on_error).
        self.lost = 0

    def note_dropped(self) -> None:
        """nats-py dropped a message on the notice inbox (a slow consumer):
        a mutation waiting now may have been refused, as Go counts its
        subscription's drops."""
        self.lost += 1

    async def on_rejection(self, m: Msg) -> None:
        try:
            r = pb.Rejection.FromString(m.data)
        except Exception:  # noqa: BLE001 - anyone may publish to an inbox
            return
        if not r.sequence:
            return
        if r.sequence <= self.seq:
            # Progress passed it before it came, so its caller is gone: a
            # service that replays the stream (a restart, a takeover) sends
            # its refusals again. Kept, it would only push out one a caller
            # still waits for.
            return
        self._refused[r.sequence] = r
        if len(self._refused) > _MAX_KEPT_REFUSALS:
            # A caller takes its refusal once progress passed its mutation:
            # one the latest progress passed may still be waited for, one
            # an earlier progress passed was left by a caller that gave up.
            oldest = min(self._refused)
            del self._refused[oldest]
            if oldest > self._prev_seq:
                self.lost += 1

    def refusal(self, table: str, parts: Sequence[int], per: int, total: int, lost: int) -> errors.RejectedError | None:
        """The error for the refusals of a mutation of ``table`` sent as
        ``parts`` (their stream sequences, ``per`` of ``total`` ops each),
        taken once the service applied them; ``lost`` is :attr:`lost` from
        before the first part went out."""
        refused = [(i, self._refused.pop(seq)) for i, seq in enumerate(parts) if seq in self._refused]
        if not refused:
            if self.lost != lost:
                return errors.RejectedError(
                    f"mutation for table {table!r}: refusals of mutations were dropped unread (by the connection, "
                    f"or more than {_MAX_KEPT_REFUSALS} waiting), and this may have been one of them",
                    table=table,
                )
            return None
        what = ""
        if len(parts) > 1:
            ranges = ", ".join(f"{i * per} to {min((i + 1) * per, total) - 1}" for i, _ in refused)
            others = "none was applied" if len(refused) == len(parts) else "the other parts were applied"
            what = f" (ops {ranges} of {total}, of {len(parts)} parts sent apart; {others})"
        r = refused[0][1]
        return rejection_error(
            r, f"rejected by the table service: mutation for table {table!r} at stream sequence {r.sequence}{what}"
        )

    async def on_progress(self, m: Msg) -> None:
        # Refusals that came before this progress are handled first (see
        # _writer._Transport._on_applied).
        await asyncio.sleep(0)
        try:
            seq = pb.Progress.FromString(m.data).applied_sequence
        except Exception:  # noqa: BLE001 - not ours to judge
            return
        if seq <= self.seq:
            return
        self._prev_seq, self.seq = self.seq, seq
        kept = []
        for want, fut in self._waiters:
            if want <= seq:
                if not fut.done():
                    fut.set_result(None)
            else:
                kept.append((want, fut))
        self._waiters = kept

    def close(self) -> None:
        """Fails every wait, as the client closes."""
        waiters, self._waiters = self._waiters, []
        self._closed = True
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(errors.ClosedError("client closed while a mutation waited to be applied"))

    async def wait_for(self, seq: int, timeout: float | None) -> None:
        if self.seq >= seq:
            return
        if self._closed:
            raise errors.ClosedError("client closed")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((seq, fut))
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise errors.DeadlineExceededError(
                f"mutation stored at stream sequence {seq} but not applied within {timeout:.3g}s "
                "(is the table service running?)"
            ) from None
        finally:
            self._waiters = [(w, f) for w, f in self._waiters if f is not fut]


class Client:
    """An asyncio client of a Reprise deployment. Create it, then ``await
    client.connect()`` or use ``async with``. The arguments are those of
    :class:`reprise.Client`."""

    def __init__(
        self,
        server_address: str | Sequence[str] = _conn.DEFAULT_URL,
        *,
        prefix: str = _conn.DEFAULT_PREFIX,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        nkeys_seed: str | None = None,
        credentials: str | None = None,
        tls: Any = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_hostname: str | None = None,
        inbox_prefix: str | None = None,
        name: str | None = None,
        connect_timeout: float = 10.0,
        return_on_store: bool = False,
    ) -> None:
        servers = server_address if isinstance(server_address, str) else tuple(server_address)
        self.options = ConnectOptions(
            servers=servers,
            prefix=prefix,
            user=user,
            password=password,
            token=token,
            nkeys_seed=nkeys_seed,
            credentials=credentials,
            tls=tls,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_hostname=tls_hostname,
            inbox_prefix=inbox_prefix,
            name=name,
            connect_timeout=connect_timeout,
        )
        self.subjects = Subjects(prefix)
        self._nc: Any = None
        # Set by close, for good: a client never connected is not closed.
        self._closed = False
        self._req: Requester | None = None
        self._signatures: dict[str, tuple[Any, ...]] = {}
        self._insert_writer: AsyncTrajectoryWriter | None = None
        self._insert_lock: asyncio.Lock | None = None
        self._writers: set[Any] = set()
        self._denials = _conn.Denials()
        self._return_on_store = return_on_store
        self._applied = _AppliedWatch()
        #: Where the service reports a refused mutation (an inbox).
        self._notice = ""
        #: The service's limits.max_mutation_ops, once an info reply told it.
        self._mutation_ops = MAX_MUTATION_OPS
        #: Tables the service confirmed: a mutation goes through the stream,
        #: where a name nobody serves is a refusal, so it is checked first.
        self._known_tables: set[str] = set()
        # (index, count) when this client serves one shard of a ShardedClient:
        # its writers then make keys of that shard.
        self._key_shard: tuple[int, int] | None = None

    # -- connection -------------------------------------------------------

    async def connect(self) -> Client:
        """Connects (waiting up to connect_timeout for the server); a no-op
        once connected."""
        if self._nc is not None:
            return self
        nc = await _conn.open_connection(
            self.options,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
            error_cb=self._on_error,
        )
        self._nc = nc
        self._req = Requester(nc, self.options.prefix)
        self._denials.add(self._req.on_denied)
        await self._req.start()
        # Subscribed before the progress: the connection then queues a
        # refusal ahead of the progress that covers its mutation.
        self._notice = nc.new_inbox()
        self._denials.watch_drops(self._notice, self._applied.note_dropped)
        await nc.subscribe(self._notice, cb=self._applied.on_rejection)
        await nc.subscribe(self.subjects.applied, cb=self._applied.on_progress)
        return self

    async def _on_error(self, e: Exception) -> None:
        # Other errors surface through the calls they affect (or, while
        # connecting, through open_connection).
        if isinstance(e, SlowConsumerError) and self._denials.dropped(e.subject):
            return  # a notice inbox's (the client's or a writer's): its watcher was told
        err = _conn.permission_denied(e, self.options.user)
        if err is not None:
            log.warning("reprise: %s", err.message)
            self._denials.dispatch(err)

    async def _on_disconnected(self) -> None:
        if self._req is not None:
            self._req.fail_all(
                errors.UnavailableError(
                    "connection to NATS lost while waiting for a reply; the request may or may not have been served"
                ),
                lost=True,
            )

    async def _on_reconnected(self) -> None:
        log.info("reprise: reconnected to NATS")

    async def close(self) -> None:
        """Closes the writers this client made (flushing them), then the
        connection."""
        self._closed = True
        if self._nc is None:
            return
        for w in list(self._writers):
            try:
                await w.close()
            except errors.RepriseError as e:
                log.warning("reprise: closing a writer: %s", e)
        self._applied.close()
        if self._req is not None:
            await self._req.stop()
        try:
            await self._nc.drain()
        except Exception:  # noqa: BLE001 - already closed, or the server is gone
            try:
                await self._nc.close()
            except Exception as e:  # noqa: BLE001 - a server gone resets the socket: nothing is left to send
                log.debug("reprise: closing the connection: %r", e)
        self._nc = None

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _requester(self) -> Requester:
        if self._req is None:
            raise errors.ClosedError("client not connected: await client.connect() first")
        return self._req

    @property
    def nats(self) -> Any:
        """The underlying nats-py connection."""
        return self._nc

    @property
    def max_payload(self) -> int:
        return int(self._nc.max_payload) if self._nc is not None else 1 << 20

    # -- learner side -------------------------------------------------------

    async def sample_raw(
        self, table: str, num_samples: int, timeout: float | None, flexible: bool = False,
        *, hung_after: float | None = None,
    ) -> bytes:
        """Sends one sample request and returns the reply's bytes,
        undecoded (for callers that decode elsewhere). With ``hung_after``,
        a service that leaves one of the info requests a waiting sample
        checks it with unanswered that long counts as gone too (a sharded
        client samples the other shards meanwhile)."""
        if not isinstance(num_samples, (int, np.integer)) or not 1 <= num_samples <= 1 << 30:
            raise errors.InvalidArgumentError(f"sample size {num_samples!r}")
        timeout_ms, wait = sample_timeouts(timeout)
        # A service that dies with the request never answers, and nothing
        # else would tell: a request that waits long checks that one still
        # listens.
        # One the caller stops waiting for (a sampler closed, a task
        # cancelled) is withdrawn: still waiting for the rate limiter, it
        # would take items for nobody, and a queue table would lose them.
        return await self._requester().request(
            self.subjects.sample,
            sample_request(table, int(num_samples), timeout_ms, flexible),
            wait,
            watch=lambda: self._probe_service(table, hung_after),
            watch_after=_SERVICE_PROBE_EVERY,
            withdrawal=sample_withdrawal,
        )

    async def _probe_service(self, table: str, hung_after: float | None) -> None:
        """Asks for table's info every second and raises UnavailableError
        once no table service listens or, with hung_after, once one leaves
        a request unanswered that long (a service answers info at once,
        whatever its samples wait for: one that does not hangs, stopped or
        stuck)."""
        req = pb.TableRequest(table=table).SerializeToString()
        while True:
            try:
                await self._requester().request(self.subjects.info, req, hung_after or _SERVICE_PROBE_EVERY)
            except _conn.NoServiceError as e:
                raise errors.UnavailableError(f"the table service stopped while the sample waited: {e.message}") from None
            except errors.DeadlineExceededError:
                if hung_after is not None:
                    raise errors.UnavailableError(
                        f"the table service left an info request unanswered for {hung_after:.3g}s while the sample "
                        "waited: it hangs"
                    ) from None
            except errors.RepriseError:
                pass
            await asyncio.sleep(_SERVICE_PROBE_EVERY)

    async def sample(
        self, table: str, num_samples: int = 1, *, timeout: float | None = None, flexible: bool = False
    ) -> list[ReplaySample]:
        """Samples ``num_samples`` items of ``table`` as ReplaySamples (see
        :meth:`reprise.Client.sample`)."""
        return decode_samples(await self.sample_raw(table, num_samples, timeout, flexible))

    async def sample_batch(
        self, table: str, batch_size: int, *, timeout: float | None = None, flexible: bool = False
    ) -> SampleBatch:
        """One stacked batch (see :meth:`reprise.Client.sample_batch`)."""
        return decode_batch(await self.sample_raw(table, batch_size, timeout, flexible))

    def sampler(
        self,
        table: str,
        batch_size: int,
        *,
        prefetch: int = 2,
        timeout: float | None = None,
        flexible: bool = False,
        retry_unavailable_for: float = 60.0,
    ) -> AsyncSampler:
        """An async iterator of batches keeping ``prefetch`` requests in
        flight (see :meth:`reprise.Client.sampler`)."""
        return AsyncSampler(self, table, batch_size, prefetch, timeout, flexible, retry_unavailable_for)

    async def mutate_priorities(
        self,
        table: str,
        updates: Mapping[int, float] | None = None,
        deletes: Iterable[int] | None = None,
        *,
        timeout: float | None = 10.0,
    ) -> None:
        """Updates priorities and deletes items (see
        :meth:`reprise.Client.mutate_priorities`)."""
        if not table:
            raise errors.InvalidArgumentError("empty table name")
        ops = mutation_ops(updates, deletes)
        if not ops:
            return
        deadline = _deadline(timeout, None)
        await self._check_table(table, deadline)
        per = _ops_per_message(table, self.max_payload, self._mutation_ops)
        await self._mutate(table, mutation_messages(table, ops, per, self._mutation_notice()), per, len(ops), deadline)

    def _mutation_notice(self) -> str:
        """Where a refusal of a mutation goes: nowhere when nobody waits."""
        return "" if self._return_on_store else self._notice

    async def _check_table(self, table: str, deadline: float | None) -> None:
        """Asks the service, once per table, whether it serves ``table``
        (NotFoundError if not), learning its limits.max_mutation_ops."""
        if table not in self._known_tables:
            await self._info(_left(deadline), table)
            self._known_tables.add(table)

    async def _mutate(self, table: str, msgs: Sequence[bytes], per: int, total: int, deadline: float | None) -> None:
        """Publishes Mutation messages (of ``total`` ops, ``per`` in each)
        through the stream and, unless the client returns on store, waits
        until the service applied them, raising a RejectedError for one it
        refused."""
        lost = self._applied.lost
        parts = [await self._publish_js(self.subjects.mutate, m, _left(deadline)) for m in msgs]
        if not parts or self._return_on_store:
            return
        await self._applied.wait_for(parts[-1], _left(deadline))
        err = self._applied.refusal(table, parts, per, total, lost)
        if err is not None:
            # The service changed under the client (a new config, other
            # limits): the next call asks it again, and so fails before it
            # sends for a table it dropped, or sends parts it takes.
            self._known_tables.discard(table)
            raise err

    async def set_policy_version(self, table: str, version: int, *, timeout: float | None = 10.0) -> None:
        """Raises ``table``'s policy version (see
        :meth:`reprise.Client.set_policy_version`)."""
        if not table:
            raise errors.InvalidArgumentError("set_policy_version needs a table name")
        version = check_policy_version(version)
        deadline = _deadline(timeout, None)
        await self._check_table(table, deadline)
        m = pb.Mutation(table=table, policy_version=version, notice_subject=self._mutation_notice())
        await self._mutate(table, [m.SerializeToString()], 0, 0, deadline)

    async def set_max_staleness(self, table: str, max_staleness: int | None, *, timeout: float | None = 10.0) -> None:
        """Changes ``table``'s staleness bound (see
        :meth:`reprise.Client.set_max_staleness`)."""
        if not table:
            raise errors.InvalidArgumentError("set_max_staleness needs a table name")
        k = -1 if max_staleness is None else int(max_staleness)
        if max_staleness is not None and k < 0:
            raise errors.InvalidArgumentError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        deadline = _deadline(timeout, None)
        await self._check_table(table, deadline)
        m = pb.Mutation(table=table, max_staleness=k, notice_subject=self._mutation_notice())
        await self._mutate(table, [m.SerializeToString()], 0, 0, deadline)

    async def update_priorities(self, table: str, keys: Any, priorities: Any, *, timeout: float | None = 10.0) -> None:
        """mutate_priorities with arrays: ``keys`` (uint64) and
        ``priorities`` of the same length, such as ``batch.info.key`` and
        new TD errors."""
        await self.mutate_priorities(table, _priorities_from_arrays(keys, priorities), timeout=timeout)

    async def _publish_js(self, subject: str, data: bytes, timeout: float | None) -> int:
        try:
            reply = await self._requester().request(subject, data, timeout)
        except errors.UnavailableError as e:
            raise errors.UnavailableError(f"publishing to {subject}: {e.message}") from None
        from ._writer import _parse_ack  # local: one parser for every JetStream ack

        class _M:
            def __init__(self, d: bytes) -> None:
                self.data, self.headers = d, None

        seq, _dup, err, _retry = _parse_ack(_M(reply))  # type: ignore[arg-type]
        if err is not None:
            raise err
        return seq or 0

    async def reset(self, table: str, *, timeout: float | None = 60.0) -> None:
        """Empties ``table`` and zeroes its rate limiter. Like a mutation it
        goes through the stream, so it is replayed in order after a crash."""
        if not table:
            raise errors.InvalidArgumentError("reset needs a table name (Reverb resets one table)")
        data = await self._requester().request(
            self.subjects.reset, pb.TableRequest(table=table).SerializeToString(), timeout
        )
        parse_status_reply(pb.ResetResponse, data, "reset")

    async def server_info(self, timeout: float | None = 10.0) -> dict[str, TableInfo]:
        """Every table's config, size, selectors, rate limiter and counters,
        by table name."""
        resp = await self._info(timeout)
        return {t.name: _info.table_info(t) for t in resp.tables}

    async def _info(self, timeout: float | None, table: str = "") -> Any:
        """The InfoResponse of every table, or of ``table`` alone."""
        data = await self._requester().request(
            self.subjects.info, pb.TableRequest(table=table).SerializeToString(), timeout
        )
        resp = parse_status_reply(pb.InfoResponse, data, "info")
        if resp.max_mutation_ops:
            self._mutation_ops = resp.max_mutation_ops
        sigs = {t.name: tuple(t.signature) for t in resp.tables}
        if table:
            self._signatures.update(sigs)
        else:
            self._signatures = sigs
        return resp

    async def checkpoint(self, *, timeout: float | None = 120.0) -> CheckpointInfo:
        """Asks the service to write a checkpoint now."""
        data = await self._requester().request(
            self.subjects.checkpoint, pb.CheckpointRequest().SerializeToString(), timeout
        )
        return _info.checkpoint_info(parse_status_reply(pb.CheckpointResponse, data, "checkpoint"))

    async def signature(self, table: str) -> tuple[Any, ...] | None:
        """The table's signature from the (cached) server info; None when
        the service cannot be asked now (the service checks anyway)."""
        sig = self._signatures.get(table)
        if sig is not None:
            return sig
        try:
            await self._info(10.0)
        except (errors.UnavailableError, errors.DeadlineExceededError):
            return None
        sig = self._signatures.get(table)
        if sig is None:
            raise errors.NotFoundError(
                f"unknown table {table!r} (tables: {', '.join(sorted(self._signatures))})", code=errors.Code.NOT_FOUND
            )
        return sig

    # -- actor side ---------------------------------------------------------

    async def trajectory_writer(self, num_keep_alive_refs: int = 128, **options: Any) -> AsyncTrajectoryWriter:
        """A writer of trajectories (see
        :meth:`reprise.Client.trajectory_writer`)."""
        w = AsyncTrajectoryWriter(self, self.writer_options(num_keep_alive_refs, options))
        await w._start()
        return w

    def writer_options(self, num_keep_alive_refs: int, options: Mapping[str, Any]) -> WriterOptions:
        """A writer's WriterOptions; a shard's client adds its key_shard."""
        if self._key_shard is not None and "key_shard" not in options:
            options = {**options, "key_shard": self._key_shard}
        return WriterOptions(num_keep_alive_refs=num_keep_alive_refs, **options)

    async def insert(self, data: Mapping[str, Any], priorities: Mapping[str, float], *, timeout: float | None = 60.0) -> None:
        """Inserts one single-step item into each table of ``priorities``,
        as Reverb's ``Client.insert``; returns once the service applied it
        (with ``return_on_store`` once stored)."""
        if not priorities:
            raise errors.InvalidArgumentError("insert needs priorities={table: priority}")
        if self._insert_lock is None:
            self._insert_lock = asyncio.Lock()
        async with self._insert_lock:
            if self._insert_writer is None:
                self._insert_writer = await self.trajectory_writer(1, linger=0.0, return_on_store=self._return_on_store)
            w = self._insert_writer
            old: AsyncTrajectoryWriter | None = None
            try:
                await w.append(data)
            except errors.SignatureMismatchError:
                # Each insert is an episode of its own, free to differ from
                # the last (see reprise.Client.insert).
                old = w
                w = self._insert_writer = await self.trajectory_writer(
                    1, linger=0.0, return_on_store=self._return_on_store)
            try:
                if old is not None:
                    await w.append(data)
                traj = {c: w.history[c][-1] for c in data}
                for table, p in priorities.items():
                    await w.create_item(table, p, traj)
                await w.end_episode(timeout=timeout)
            finally:
                if old is not None:
                    # Every insert it carried waited until applied, and
                    # raised what it lost: what closing it can still fail
                    # is its own end, which no caller should take for this
                    # insert's failure (and insert again).
                    try:
                        await old.close(timeout)
                    except errors.RepriseError as e:
                        log.warning("reprise: closing the writer of earlier inserts: %s", e)


def decode_samples(data: bytes) -> list[ReplaySample]:
    resp = _sample.parse_response(data)
    out = _sample.decode_samples(resp)
    _sample.raise_for_status(resp.code, resp.message, out)
    if resp.code == pb.CODE_PARTIAL:
        raise errors.RateLimitedError(resp.message, code=errors.Code.RATE_LIMITED, partial=out)
    return out


def decode_batch(data: bytes) -> SampleBatch:
    resp = _sample.parse_response(data)
    _sample.raise_for_status(resp.code, resp.message)
    out = _sample.decode_batch(resp)
    if resp.code == pb.CODE_PARTIAL:
        raise errors.RateLimitedError(resp.message, code=errors.Code.RATE_LIMITED, partial=out)
    return out


class AsyncSampler:
    """Batches from one table with several requests in flight. Iterate it
    with ``async for``; ``aclose()`` (or ``async with``) stops it. A
    ``timeout`` that passes without the rate limiter allowing a batch ends
    the iteration (as Reverb's ``rate_limiter_timeout_ms`` does); a lost
    service is waited for up to ``retry_unavailable_for`` seconds."""

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
        check_sampler(prefetch, timeout)
        self._c = client
        self._args = (table, batch_size, timeout, flexible)
        self._prefetch = prefetch
        self._retry_for = retry_unavailable_for
        self._tasks: collections.deque[asyncio.Task[bytes]] = collections.deque()
        self._closed = False
        # The request next_raw awaits, which aclose cancels too.
        self._current: asyncio.Task[bytes] | None = None

    def _issue(self) -> None:
        t, n, timeout, flexible = self._args
        self._tasks.append(asyncio.ensure_future(self._c.sample_raw(t, n, timeout, flexible)))

    async def next_raw(self) -> bytes:
        """The next reply's bytes (decode with decode_batch)."""
        loop = asyncio.get_running_loop()
        since: float | None = None
        backoff = 0.01
        while True:
            if self._closed:
                raise StopAsyncIteration
            while len(self._tasks) < self._prefetch:
                self._issue()
            task = self._current = self._tasks.popleft()
            try:
                data = await task
            except (asyncio.CancelledError, errors.ClosedError) as e:
                if ends_iteration(e, self._closed or self._c._closed):
                    await self.aclose()
                    raise StopAsyncIteration from None
                raise
            except errors._NotSentError:
                # The timeout passed before a request could go: an end, as
                # the limiter's timeout is.
                await self.aclose()
                raise StopAsyncIteration from None
            except (errors.UnavailableError, errors.DeadlineExceededError):
                # No reply is a service gone or swamped, not a rate limiter
                # that allowed nothing in time (RateLimitedError): waited
                # out as such, never the end of the iteration.
                now = loop.time()
                since = since or now
                if now - since > self._retry_for:
                    raise
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, 1.0)
                continue
            finally:
                self._current = None
            # A reply that lands after aclose is still handed out: its
            # items were drawn, and a queue would lose them.
            if not self._closed and not ends_sampler(data, self._args[2]):
                self._issue()
            return data

    def __aiter__(self) -> AsyncSampler:
        return self

    async def __anext__(self) -> SampleBatch:
        since = _now()
        while True:
            data = await self.next_raw()
            try:
                return decode_batch(data)
            except errors.RateLimitedError as e:
                if e.partial is not None and len(e.partial):
                    return e.partial  # a short batch: samples are never dropped
                if self._args[2] is None:
                    continue  # no timeout: wait on, as Reverb's sampler does
                await self.aclose()
                raise StopAsyncIteration from None
            except errors.UnavailableError:
                # The service is shutting down or busy: wait it out.
                if _now() - since > self._retry_for:
                    raise
                await asyncio.sleep(0.05)

    async def aclose(self) -> None:
        """Cancels the requests in flight, the one another task awaits too
        (its iteration ends), withdrawing those that still wait for the
        rate limiter: they take nothing. Replies already sampled and on
        their way are lost: with a queue table use prefetch=1, which loses
        at most one batch."""
        self._closed = True
        for t in self._tasks:
            if not t.cancel() and not t.cancelled():
                t.exception()  # failed as the client closed: taken, not logged as lost
        self._tasks.clear()
        if self._current is not None:
            self._current.cancel()

    async def __aenter__(self) -> AsyncSampler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncTrajectoryWriter:
    """The asyncio twin of :class:`reprise.TrajectoryWriter`; every call
    that may wait for the window is a coroutine."""

    def __init__(self, client: Client, opts: WriterOptions) -> None:
        self._c = client
        self.options = opts
        self._p: _Producer | None = None
        self._t: _Transport | None = None
        self._partial: dict[str, Any] = {}
        self._closed = False
        self._closing = False  # a close is under way, not cancelled
        self._close_mark: FailureMark = (0, 0, 0)  # the writer's failure_mark as its close began

    async def _start(self) -> None:
        nc = self._c.nats
        if nc is None:
            raise errors.ClosedError("client not connected")
        loop = asyncio.get_running_loop()
        self._t = _Transport(nc, self._c.subjects, loop, self.options, self._c._denials)
        self._p = _Producer(self.options, self._c.max_payload, self._t.submit)
        await self._t.start(self._p)
        self._c._writers.add(self)

    @property
    def producer_id(self) -> str:
        """The writer's secret id (never log it; see notice_token)."""
        assert self._p is not None
        return self._p.id

    @property
    def notice_token(self) -> str:
        """The writer's public name: its rejection subject's last token."""
        assert self._p is not None
        return self._p.token

    @property
    def history(self) -> History:
        assert self._p is not None
        return self._p.history

    @property
    def episode_steps(self) -> int:
        assert self._p is not None
        return self._p.episode_steps

    async def _advance(self, force: bool, deadline: float | None = None) -> None:
        p = self._p
        assert p is not None
        started = 0.0
        warned = False
        while True:
            with p.mu:
                try:
                    if force:
                        p.flush_locked()
                    else:
                        p.advance_locked(False)
                    return
                except _Blocked:
                    fut = p.changed_future_locked()
                    why = p.describe_wait_locked()
            now = _now()
            started = started or now
            if deadline is not None and now >= deadline:
                raise errors.DeadlineExceededError(f"writer: no room in the window before the timeout: {why}")
            if not warned and now - started > _WAIT_WARN_AFTER:
                log.warning("reprise writer %s: waiting for room in the window: %s", p.token, why)
                warned = True
            wait = None if deadline is None else deadline - now
            try:
                await asyncio.wait_for(fut, min(wait, 1.0) if wait is not None else 1.0)
            except asyncio.TimeoutError:
                pass

    async def append(self, step: Mapping[str, Any], partial_step: bool = False) -> None:
        """Appends a step (see :meth:`reprise.TrajectoryWriter.append`)."""
        p = self._p
        assert p is not None
        self._check_open()
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
        await self._advance(False)
        with p.mu:
            p.append_locked(step)
            self._partial = {}
            p.advance_kept_locked()

    async def create_item(
        self,
        table: str,
        priority: float,
        trajectory: Mapping[str, TrajectoryColumn] | Iterable[TrajectoryColumn],
    ) -> None:
        """Creates an item (see :meth:`reprise.TrajectoryWriter.create_item`)."""
        p = self._p
        assert p is not None
        self._check_open()
        prio = check_item(table, priority)
        sig: Sequence[Any] | None = ()
        if self.options.validate_signatures:
            sig = self._c._signatures.get(table)
            if sig is None:
                trajectory = p.check_picks(trajectory)
                sig = await self._c.signature(table)
        # What earlier calls left is published first, waiting for room in
        # the window: a create_item that raises created nothing.
        with p.mu:
            if not p.due_locked() or p.try_advance_locked():
                p.add_item_locked(table, prio, trajectory, sig or ())
                p.advance_kept_locked()
                return
        await self._advance(False)
        with p.mu:
            p.add_item_locked(table, prio, trajectory, sig or ())
            p.advance_kept_locked()

    async def flush(
        self, block_until_num_items: int = 0, timeout_ms: int | None = None, *, timeout: float | None = None
    ) -> None:
        """Publishes everything and waits until it is applied (see
        :meth:`reprise.TrajectoryWriter.flush`)."""
        assert self._p is not None
        self._check_open()
        await self._flush(block_until_num_items, _deadline(timeout, timeout_ms), self._p.failure_mark())

    def _check_open(self) -> None:
        """Raises ClosedError once the writer's close has begun, as the
        sync writer's calls do (and a Go producer's return ErrClosed)."""
        if self._closed:
            raise errors.ClosedError("writer closed")

    async def _flush(self, block_until_num_items: int, deadline: float | None, mark: FailureMark) -> None:
        p = self._p
        assert p is not None
        try:
            await self._advance(True, deadline)
        except errors.RepriseError as e:
            with p.mu:
                raise p.ended_error_locked(e, mark)
        await self._wait(lambda p: p.flushed_locked(block_until_num_items), deadline, "flush", mark)

    async def wait_applied(self, timeout: float | None = None) -> None:
        """Flushes, then waits until the service applied every item."""
        assert self._p is not None
        self._check_open()
        deadline = _deadline(timeout, None)
        mark = self._p.failure_mark()
        await self._flush(0, deadline, mark)
        await self._wait(lambda p: p.all_applied_locked(), deadline, "wait_applied", mark)

    async def _wait(self, cond: Any, deadline: float | None, what: str, mark: FailureMark) -> None:
        """Waits until cond holds; raises the errors seen, and the loss of
        the items lost and the rejections since mark (the writer's
        failure_mark then)."""
        p = self._p
        assert p is not None
        while True:
            with p.mu:
                if cond(p):
                    err = p.waited_errors_locked(mark)
                    if err is not None:
                        raise err
                    return
                if p.stopped:
                    raise p.stopped_error_locked(what, mark)
                if deadline is not None and _now() >= deadline:
                    raise p.ended_error_locked(
                        errors.DeadlineExceededError(f"writer {what}: timed out: {p.describe_wait_locked()}"), mark)
                fut = p.changed_future_locked()
            wait = 1.0 if deadline is None else min(1.0, max(0.0, deadline - _now()))
            try:
                await asyncio.wait_for(fut, wait)
            except asyncio.TimeoutError:
                pass

    def set_policy_version(self, version: int) -> None:
        """See :meth:`reprise.TrajectoryWriter.set_policy_version`."""
        assert self._p is not None
        version = check_policy_version(version)
        with self._p.mu:
            self._p.policy_version = version

    async def end_episode(
        self, clear_buffers: bool = True, timeout_ms: int | None = None, *, timeout: float | None = None
    ) -> None:
        """Publishes the episode's items, starts a new episode and waits for
        the items (see :meth:`reprise.TrajectoryWriter.end_episode`)."""
        p = self._p
        assert p is not None
        self._check_open()
        deadline = _deadline(timeout, timeout_ms)
        mark = p.failure_mark()
        try:
            await self._advance(True, deadline)
        except errors.RepriseError as e:
            with p.mu:
                raise p.not_ended_error_locked(e)
        with p.mu:
            p.end_episode_locked()
            self._partial = {}
        await self._wait(lambda p: p.flushed_locked(0), deadline, "end_episode", mark)

    async def close(self, timeout: float | None = 60.0) -> None:
        """Flushes, tells the service to release this writer's chunks and
        stops. Messages not acknowledged within ``timeout`` are reported."""
        p, t = self._p, self._t
        if p is None or t is None or self not in self._c._writers:
            return
        if self._closed:
            if not self._closing:
                # An earlier close was cancelled before its transport
                # stopped: stop it now, and report what was lost since
                # that close began.
                await self._stop(p, t, _left(_deadline(timeout, None)))
                with p.mu:
                    err = p.waited_errors_locked(self._close_mark)
                if err is not None:
                    raise err
            return
        self._closed = self._closing = True
        self._close_mark = p.failure_mark()
        try:
            await self._close(p, t, _deadline(timeout, None))
        finally:
            self._closing = False

    async def _close(self, p: _Producer, t: _Transport, deadline: float | None) -> None:
        mark = self._close_mark
        first: errors.RepriseError | None = None
        try:
            await self._advance(True, deadline)
            with p.mu:
                p.end_episode_locked()
            while True:
                with p.mu:
                    try:
                        p._publish_locked(True)
                        break
                    except _Blocked:
                        fut = p.changed_future_locked()
                if deadline is not None and _now() >= deadline:
                    raise errors.DeadlineExceededError("writer close: no room in the window for the final message")
                try:
                    await asyncio.wait_for(fut, 1.0)
                except asyncio.TimeoutError:
                    pass
        except errors.RepriseError as e:
            first = e
        await self._stop(p, t, _left(deadline))
        with p.mu:
            err = p.waited_errors_locked(mark)
        if first is not None:
            raise first if err is None else _join([first, err])
        if err is not None:
            raise err

    async def _stop(self, p: _Producer, t: _Transport, timeout: float | None) -> None:
        """Stops the transport; until it has stopped, the client keeps the
        writer, so that its close stops what a cancelled close left."""
        with p.mu:
            p.close_locked()
        try:
            await t.close(timeout)
        finally:
            with p.mu:
                p.stop_locked()
        self._c._writers.discard(self)

    async def __aenter__(self) -> AsyncTrajectoryWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def ends_iteration(e: BaseException, closed: bool) -> bool:
    """Whether e, out of a sampler's await of its request, ends the
    iteration, given whether the sampler or its client was closed: a
    ClosedError of a closed client does (one never connected raises it
    too, and must be told), and so does the cancellation of the request by
    ``aclose`` from another task, rather than the awaiting task's own,
    which goes on up."""
    if not closed:
        return False
    if isinstance(e, errors.ClosedError):
        return True
    cancelling = getattr(asyncio.current_task(), "cancelling", None)  # Python 3.11 and later
    return not (callable(cancelling) and cancelling())


def _now() -> float:
    return time.monotonic()


def _left(deadline: float | None) -> float | None:
    """The seconds left until deadline (None: no deadline)."""
    return None if deadline is None else max(0.0, deadline - _now())


def _deadline(timeout: float | None, timeout_ms: int | None) -> float | None:
    if timeout is None and timeout_ms is not None:
        timeout = timeout_ms / 1000
    return None if timeout is None else _now() + timeout


async def connect(server_address: str | Sequence[str] = _conn.DEFAULT_URL, **kwargs: Any) -> Client:
    """Creates a :class:`Client` and connects it."""
    return await Client(server_address, **kwargs).connect()


# Last: the sharded client is built of this module's Client and writer.
from ._sharded import AsyncShardedSampler, AsyncShardedTrajectoryWriter, ShardedClient  # noqa: E402

__all__ = [
    "AsyncSampler",
    "AsyncShardedSampler",
    "AsyncShardedTrajectoryWriter",
    "AsyncTrajectoryWriter",
    "Client",
    "ShardedClient",
    "connect",
    "decode_batch",
    "decode_samples",
]
