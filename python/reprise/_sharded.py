"""Tables spread over several reprised ("shards"): the asyncio
:class:`ShardedClient` (``reprise.aio.ShardedClient``), and the draw and
merge that the synchronous :class:`reprise.ShardedClient` shares with it.

Shard i is a reprised of its own prefix started with ``--shard i/N``: it
refuses items whose key modulo N is not i, so a key names its shard, and a
priority update or delete goes to that shard alone. A sample draws the shard
of each of its positions independently, in proportion to the shards' total
weights (the sum of priority**exponent, or the item count), asks every shard
drawn for its share at once and puts the items back at their positions. An
item's reported probability is that of the two-stage draw, exactly.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from . import _info, _sample, errors
from ._info import CheckpointInfo, TableInfo
from ._proto import reprise_pb2 as pb
from ._sample import BatchInfo, ReplaySample, SampleBatch
from ._writer import MAX_SHARDS, History, TrajectoryColumn, WriterOptions, _join, with_message
from .aio import AsyncTrajectoryWriter, Client, _deadline, _left, check_sampler, ends_iteration, key_array, priority_arrays

T = TypeVar("T")

log = logging.getLogger("reprise")

#: How long a shard's size and weight, as learned from an info or sample
#: reply, are drawn by before the next draw asks the shard again.
FRESH_FOR = 0.1

#: Without a timeout, how long a sample waits for a first item on any shard
#: (the service's default max_sample_wait, which bounds a single table's
#: wait the same way).
EMPTY_WAIT = 60.0

#: The longest an info request made on the way to a sample may take; a
#: shard slower than that counts as down until it answers: a service
#: answers info at once, whatever its samples wait for, so one that does
#: not hangs (stopped, stuck). A call with a timeout gives it at most half
#: of the time it has left, so that one shard that does not answer cannot
#: take the time of the shards drawn after it. A sample waiting on a shard
#: checks it with info requests bounded the same way (hung_after), and a
#: down shard is asked again in the background with this bound.
_INFO_TIMEOUT = 2.0

#: A weight exponent a client takes: far above any a service reports
#: (2**60), so beyond it a reply is not trusted.
_MAX_WEIGHT_EXPONENT = 1 << 61


def _now() -> float:
    return time.monotonic()


def check_prefixes(prefixes: Sequence[str], options: Mapping[str, Any]) -> tuple[str, ...]:
    """The shards' prefixes, checked: a list of distinct prefixes, and no
    ``prefix=`` among the other options."""
    if "prefix" in options:
        raise errors.InvalidArgumentError(
            "a ShardedClient takes prefixes=[...], every shard's prefix in shard order, not prefix="
        )
    if isinstance(prefixes, str):
        raise errors.InvalidArgumentError(f"prefixes must be a list of prefixes, one per shard, got {prefixes!r}")
    out = tuple(prefixes)
    if not 1 <= len(out) <= MAX_SHARDS:
        raise errors.InvalidArgumentError(f"prefixes: {len(out)} shards (from 1 to {MAX_SHARDS})")
    if len(set(out)) != len(out):
        raise errors.InvalidArgumentError(f"prefixes {list(out)} name a shard twice")
    # Prefixes that differ only in case or in '.' against '-' name one
    # stream, as the service derives it.
    streams = ["REPRISE_" + p.replace(".", "_").replace("-", "_").upper() for p in out]
    if len(set(streams)) != len(streams):
        raise errors.InvalidArgumentError(f"prefixes {list(out)} share a stream ({streams}): each shard needs its own")
    return out


def on_shard(e: errors.RepriseError, i: int, prefix: str) -> errors.RepriseError:
    """e as raised for shard i: its message names the shard."""
    if isinstance(e, (errors.PermissionDeniedError, errors.RejectedError)):
        return e  # they name their subject or item
    return with_message(e, f"shard {i} (prefix {prefix!r}): {e.message}")


def is_down(e: errors.RepriseError) -> bool:
    """Whether e says that a shard's service is not there (no responder,
    shutting down, failing) rather than that the call was wrong."""
    return isinstance(e, (errors.UnavailableError, errors.InternalError, errors.ProtocolError, errors.DeadlineExceededError))


def trusted_weight(fraction: float, exponent: int) -> tuple[float, int]:
    """A weight as a shard reported it, or none when the reply cannot be
    trusted (a fraction outside [0.5, 1) or NaN, an exponent beyond any a
    service reports), so that no reply makes a share NaN or infinite."""
    if not 0.5 <= fraction < 1.0 or abs(exponent) > _MAX_WEIGHT_EXPONENT:
        return 0.0, 0
    return fraction, exponent


def one_table(resp: Any, table: str) -> Any:
    """The info of table from a shard's InfoResponse, which must describe
    it alone."""
    if len(resp.tables) != 1 or resp.tables[0].name != table:
        raise errors.ProtocolError(f"malformed info response: {len(resp.tables)} tables for table {table!r}")
    return resp.tables[0]


def shard_ratios(size: np.ndarray, fraction: np.ndarray, exponent: np.ndarray) -> np.ndarray | None:
    """Each shard's total weight relative to the largest (weights as
    fraction * 2**exponent pairs); the sizes when no shard has weight but
    some has items (a prioritized table whose priorities are all 0 samples
    uniformly, as one table does); None when every shard is empty."""
    has = fraction > 0
    if has.any():
        top = exponent[has].max()
        # Beyond 2**-1100 of the largest the ratio is 0 as a float anyway.
        rel = np.clip(exponent - top, -1100, 0).astype(np.int32)
        return np.where(has, np.ldexp(fraction, rel), 0.0)
    if (size > 0).any():
        return size.astype(np.float64)
    return None


class _TableState:
    """What the client knows of one table's shards: their sizes and
    weights, when it learned them (monotonic seconds; -inf: unknown or
    stale), why a shard's service did not answer (it weighs 0 until it
    does), and a generation a mutation raises, so that a reply to a request
    sent before the mutation was applied cannot pass for fresh."""

    def __init__(self, table: str, prefixes: tuple[str, ...]) -> None:
        n = len(prefixes)
        self.table = table
        self.prefixes = prefixes
        self.size = np.zeros(n, dtype=np.int64)
        self.fraction = np.zeros(n, dtype=np.float64)
        self.exponent = np.zeros(n, dtype=np.int64)
        self.at = np.full(n, -np.inf)
        self.gen = np.zeros(n, dtype=np.int64)
        self.down: list[errors.RepriseError | None] = [None] * n
        # Shards that have not answered since the table was first used:
        # their place and table are checked when they do.
        self.unchecked = [False] * n
        # The first shard to answer and how it configures the table (its
        # wire TableInfo), which a late shard must match.
        self.like: tuple[int, Any] | None = None

    def learn(self, i: int, gen: int, size: int, fraction: float, exponent: int) -> None:
        if self.gen[i] != gen:
            return
        if self.down[i] is not None:
            log.info("reprise: shard %d (prefix %r) answers again for table %r", i, self.prefixes[i], self.table)
            self.down[i] = None
        self.size[i] = max(size, 0)
        self.fraction[i], self.exponent[i] = trusted_weight(fraction, exponent)
        self.at[i] = _now()

    def fail(self, i: int, gen: int, err: errors.RepriseError) -> None:
        """The shard's service did not answer: it weighs 0, and is asked
        again in the background once FRESH_FOR passed."""
        if self.gen[i] != gen:
            return
        if self.down[i] is None:
            log.warning(
                "reprise: shard %d (prefix %r) does not answer for table %r; sampling the others until it does: %s",
                i, self.prefixes[i], self.table, err.message,
            )
        self.down[i] = err
        self.size[i], self.fraction[i], self.exponent[i] = 0, 0.0, 0
        self.at[i] = _now()

    def stale(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(_now() - self.at > FRESH_FOR)]

    def invalidate(self, i: int) -> None:
        self.gen[i] += 1
        self.at[i] = -np.inf


@dataclasses.dataclass
class _Draw:
    """One sample call: the shard drawn for each position, the shards'
    probabilities and known sizes, and each asked shard's reply (parsed) or
    error. merge_samples and merge_batch decode it, in the caller's thread."""

    prefixes: tuple[str, ...]
    shard_of: np.ndarray
    p: np.ndarray
    sizes: np.ndarray
    replies: list[tuple[int, _sample._Response | errors.RepriseError]]
    flexible: bool


def _decode(
    d: _Draw, decode: Callable[[_sample._Response], T]
) -> tuple[list[tuple[int, T]], list[errors.RepriseError]]:
    """Each shard's decoded items, and the errors of the shards that failed
    or (PARTIAL) returned fewer items than asked."""
    parts: list[tuple[int, T]] = []
    errs: list[errors.RepriseError] = []
    for i, r in d.replies:
        prefix = d.prefixes[i]
        if isinstance(r, errors.RepriseError):
            errs.append(on_shard(r, i, prefix))
            continue
        try:
            _sample.raise_for_status(r.code, r.message)
            out = decode(r)
        except errors.RepriseError as e:
            errs.append(on_shard(e, i, prefix))
            continue
        if r.code == pb.CODE_PARTIAL:
            errs.append(
                errors.RateLimitedError(f"shard {i} (prefix {prefix!r}): {r.message}", code=errors.Code.RATE_LIMITED)
            )
        parts.append((i, out))
    return parts, errs


def _places(d: _Draw, counts: Sequence[tuple[int, int]]) -> tuple[int, list[np.ndarray]]:
    """Where each shard's items go: shard i's m items fill the first m
    positions drawn for it, and the positions left unfilled are dropped,
    keeping the order. Returns the number of items and, per entry of
    counts ((shard, m) pairs), the indices of its items in the result."""
    filled = np.zeros(len(d.shard_of), dtype=bool)
    mine = []
    for i, m in counts:
        pos = np.flatnonzero(d.shard_of == i)
        if m > len(pos):
            raise errors.ProtocolError(f"shard {i} (prefix {d.prefixes[i]!r}) returned {m} items for {len(pos)} asked")
        pos = pos[:m]
        filled[pos] = True
        mine.append(pos)
    dest = np.cumsum(filled) - 1
    return int(filled.sum()), [dest[pos] for pos in mine]


def _raise(d: _Draw, errs: list[errors.RepriseError], partial: Any) -> None:
    """Raises the call's error, if any, with the items that did arrive: a
    shard's failure outranks a rate limit; with flexible, a rate limit is
    no error once some items arrived."""
    if d.flexible and partial is not None:
        errs = [e for e in errs if not isinstance(e, errors.RateLimitedError)]
    if not errs:
        return
    err = next((e for e in errs if not isinstance(e, errors.RateLimitedError)), errs[0])
    err.partial = partial
    raise err


def merge_samples(d: _Draw) -> list[ReplaySample]:
    """The items of a draw as ReplaySamples, in the drawn order, with the
    two-stage probability and the size of the whole table."""
    parts, errs = _decode(d, _sample.decode_samples)
    parts = [(i, s) for i, s in parts if s]
    m, dests = _places(d, [(i, len(s)) for i, s in parts])
    slots: list[ReplaySample | None] = [None] * m
    total = int(d.sizes.sum())
    for (i, samples), dest in zip(parts, dests):
        p, others = float(d.p[i]), total - int(d.sizes[i])
        for j, s in zip(dest.tolist(), samples):
            info = s.info._replace(probability=s.info.probability * p, table_size=s.info.table_size + others)
            slots[j] = ReplaySample(info, s.data)
    out = [s for s in slots if s is not None]
    _raise(d, errs, out or None)
    return out


_INFO_FIELDS = [f.name for f in dataclasses.fields(BatchInfo)]


def merge_batch(d: _Draw) -> SampleBatch:
    """The items of a draw as one batch, in the drawn order (see
    merge_samples): every shard's arrays are placed into the batch's with
    one fancy-index assignment per shard and column."""
    parts, errs = _decode(d, _sample.decode_batch)
    parts = [(i, b) for i, b in parts if len(b)]
    m, dests = _places(d, [(i, len(b)) for i, b in parts])
    batch = _assemble(d, parts, m, dests)
    _raise(d, errs, batch if m else None)
    return batch


def _assemble(d: _Draw, parts: list[tuple[int, SampleBatch]], m: int, dests: list[np.ndarray]) -> SampleBatch:
    if not parts:
        return _sample.empty_batch()
    total = int(d.sizes.sum())
    info: dict[str, np.ndarray] = {}
    for name in _INFO_FIELDS:
        out = np.empty(m, dtype=getattr(parts[0][1].info, name).dtype)
        for (i, b), dest in zip(parts, dests):
            v = getattr(b.info, name)
            if name == "probability":
                v = v * d.p[i]
            elif name == "table_size":
                v = v + (total - d.sizes[i])
            out[dest] = v
        info[name] = out
    layout = list(parts[0][1].data)
    if len(parts) == 1:
        # Its items fill the batch in their order: its arrays are the batch's.
        return SampleBatch(BatchInfo(**info), parts[0][1].data)
    if any(list(b.data) != layout for _, b in parts):
        raise errors.InvalidArgumentError(
            "the shards' items have different columns; use sample() for tables without a signature"
        )
    data: dict[str, np.ndarray] = {}
    for name in layout:
        a0 = parts[0][1].data[name]
        out = np.empty((m, *a0.shape[1:]), dtype=a0.dtype)
        for (_, b), dest in zip(parts, dests):
            a = b.data[name]
            if a.dtype != a0.dtype or a.shape[1:] != a0.shape[1:]:
                raise errors.InvalidArgumentError(
                    f"column {name!r}: the shards' items hold steps of different dtypes or shapes; use sample()"
                )
            out[dest] = a
        data[name] = out
    return SampleBatch(BatchInfo(**info), data)


def _retrieve(t: asyncio.Future[Any]) -> None:
    """Marks a task's failure as seen, for a task no one may await."""
    if not t.cancelled():
        t.exception()


def _key_array(keys: Iterable[int] | None) -> np.ndarray:
    if keys is None:
        return np.zeros(0, dtype=np.uint64)
    return key_array(keys if isinstance(keys, np.ndarray) else list(keys))


def _describe(t: Any, what: str) -> str:
    if what == "signature":
        return ", ".join(f"{c.name} {c.dtype}{list(c.shape)}" for c in t.signature) or "none"
    return str(getattr(t, what))


class ShardedClient:
    """An asyncio client of tables spread over shards: the API of
    :class:`reprise.ShardedClient` as coroutines. Create it, then ``await
    client.connect()`` or use ``async with``."""

    def __init__(self, server_address: str | Sequence[str], prefixes: Sequence[str], **options: Any) -> None:
        self.prefixes = check_prefixes(prefixes, options)
        n = len(self.prefixes)
        self._shards = tuple(Client(server_address, prefix=p, **options) for p in self.prefixes)
        for i, c in enumerate(self._shards):
            c._key_shard = (i, n)
        self._rng = np.random.default_rng()
        # Tables checked on their first use, and what is known of them.
        self._states: dict[str, _TableState] = {}
        # Info requests in flight, by (table, shard, generation): concurrent
        # draws wait for the same one.
        self._refreshing: dict[tuple[str, int, int], asyncio.Task[None]] = {}
        # Down shards' info requests in the background, by (table, shard):
        # one at a time, and what one raised other than the shard's being
        # down is the next draw's error (see _probe_down).
        self._probes: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._closed = False  # set by close, for good

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    @property
    def shards(self) -> tuple[Client, ...]:
        """Every shard's client, in shard order."""
        return self._shards

    def shard(self, i: int) -> Client:
        """The client of shard i (prefix ``prefixes[i]``); its writers make
        keys of shard i."""
        return self._shards[i]

    async def connect(self) -> ShardedClient:
        """Connects every shard's client (a no-op once connected)."""
        results = await asyncio.gather(*(c.connect() for c in self._shards), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                await self.close()
                raise r
        return self

    async def close(self) -> None:
        """Closes every shard's client (and the writers made by them)."""
        self._closed = True
        for t in list(self._refreshing.values()):
            t.cancel()
        for t in self._probes.values():
            if t.done():
                _retrieve(t)  # nobody is left to raise it to
        await self._on_shards({i: c.close() for i, c in enumerate(self._shards)})

    async def __aenter__(self) -> ShardedClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _on_shards(self, calls: Mapping[int, Awaitable[T]]) -> dict[int, T]:
        """Runs the calls (shard index to coroutine) at once and, once all
        are done, raises the first shard's error, naming the shard."""
        results = await asyncio.gather(*calls.values(), return_exceptions=True)
        out: dict[int, T] = {}
        for i, r in zip(calls, results):
            if isinstance(r, errors.RepriseError):
                raise on_shard(r, i, self.prefixes[i])
            if isinstance(r, BaseException):
                raise r
            out[i] = r
        return out

    # -- the shards' places and state ----------------------------------------

    def _check_placement(self, i: int, resp: Any) -> None:
        n = len(self._shards)
        if resp.shard_index != i or resp.shard_count != n:
            what = "not sharded" if resp.shard_count == 0 else f"shard {resp.shard_index}/{resp.shard_count}"
            raise errors.InvalidArgumentError(
                f"prefix {self.prefixes[i]!r} is {what} (reprised --shard), expected shard {i}/{n}: "
                "give every shard's prefix, in shard order"
            )

    def _check_same(self, table: str, infos: Sequence[tuple[int, Any]]) -> None:
        """Raises unless every shard's table ((shard, wire TableInfo) pairs)
        has the first one's sampler, remover and signature."""
        first, like = infos[0]
        for i, t in infos[1:]:
            for what in ("sampler", "remover", "signature"):
                a, b = _describe(like, what), _describe(t, what)
                if a != b:
                    raise errors.InvalidArgumentError(
                        f"table {table!r}: shard {first} (prefix {self.prefixes[first]!r}) has {what} {a}, shard {i} "
                        f"(prefix {self.prefixes[i]!r}) has {b}: a table's shards need the same sampler, remover "
                        "and signature"
                    )

    def _learn_info(self, table: str, infos: Sequence[Any]) -> _TableState:
        """Records every shard's info of table, checked alike."""
        st = self._states.get(table)
        if st is None:
            st = self._states[table] = _TableState(table, self.prefixes)
        if st.like is None:
            st.like = (0, infos[0])
        for i, t in enumerate(infos):
            st.unchecked[i] = False
            st.learn(i, int(st.gen[i]), t.size, t.weight_fraction, t.weight_exponent)
        return st

    async def _table(self, table: str, timeout: float | None) -> _TableState:
        """The table's state. On its first use every shard is asked for the
        table's info: each must be the shard its prefix's place says, and
        serve the table as the others do. A shard whose service does not
        answer is marked down, and checked once it answers, so that a
        learner started while a shard is down samples the others; with no
        shard answering it raises."""
        st = self._states.get(table)
        if st is not None:
            return st
        if not table:
            raise errors.InvalidArgumentError("empty table name")
        if timeout is not None and timeout <= 0:
            # Not sent: a shard is down for not answering in time it had.
            raise errors._NotSentError(f"table {table!r}: no time left to ask the shards for it")
        # A shard slower than _INFO_TIMEOUT is down for now, as in _fetch.
        wait = _INFO_TIMEOUT if timeout is None else min(timeout, _INFO_TIMEOUT)
        results = await asyncio.gather(*(c._info(wait, table) for c in self._shards), return_exceptions=True)
        infos: list[Any] = []
        downs: list[tuple[int, errors.RepriseError]] = []
        for i, r in enumerate(results):
            if isinstance(r, errors.RepriseError) and is_down(r):
                downs.append((i, on_shard(r, i, self.prefixes[i])))
                infos.append(None)
                continue
            if isinstance(r, errors.RepriseError):
                raise on_shard(r, i, self.prefixes[i])
            if isinstance(r, BaseException):
                raise r
            self._check_placement(i, r)
            try:
                infos.append(one_table(r, table))
            except errors.RepriseError as e:
                raise on_shard(e, i, self.prefixes[i]) from None
        answered = [(i, t) for i, t in enumerate(infos) if t is not None]
        if not answered:
            raise downs[0][1]
        self._check_same(table, answered)
        st = self._states[table] = _TableState(table, self.prefixes)
        st.like = answered[0]
        for i, t in enumerate(infos):
            if t is not None:
                st.learn(i, int(st.gen[i]), t.size, t.weight_fraction, t.weight_exponent)
        for i, why in downs:
            st.unchecked[i] = True
            st.fail(i, int(st.gen[i]), why)
        return st

    async def _table_soft(self, table: str) -> None:
        """_table for a writer: when the shards cannot be asked now it goes
        on (each shard refuses keys that are not its own anyway)."""
        try:
            await self._table(table, _INFO_TIMEOUT)
        except (errors.UnavailableError, errors.DeadlineExceededError):
            pass

    def _ask(self, table: str, st: _TableState, i: int, timeout: float | None) -> asyncio.Task[None]:
        """Shard i's info request for the table, the one in flight if any."""
        key = (table, i, int(st.gen[i]))
        t = self._refreshing.get(key)
        if t is None:
            t = self._refreshing[key] = asyncio.ensure_future(self._fetch(key, st, timeout))
        return t

    def _to_ask(self, table: str, st: _TableState, every: bool) -> list[int]:
        """The shards whose state a draw asks for and waits on: the
        answering ones whose state is stale (every one with every), and
        every one when none answers, as nothing else is left to wait on.
        Otherwise a down shard whose state is stale is asked again in the
        background (see _probe_down)."""
        stale = set(st.stale())
        answering = any(e is None for e in st.down)
        ask = []
        for i in range(len(self._shards)):
            if st.down[i] is not None and answering:
                if i in stale:
                    self._probe_down(table, st, i)
            elif every or i in stale:
                ask.append(i)
        return ask

    def _probe_down(self, table: str, st: _TableState, i: int) -> None:
        """Asks down shard i for the table's state again without a draw
        waiting on it, one request at a time (one that hangs is so asked
        once per _INFO_TIMEOUT). Raises, once, what the last such request
        raised other than the shard's being down (a shard back in another's
        place)."""
        if self._closed:
            return  # its failure would reach no one
        last = self._probes.pop((table, i), None)
        if last is not None and not last.done():
            self._probes[(table, i)] = last
            return
        err = None if last is None or last.cancelled() else last.exception()
        if err is not None:
            raise err
        self._probes[(table, i)] = self._ask(table, st, i, _INFO_TIMEOUT)

    async def _refresh(self, table: str, st: _TableState, shards: Iterable[int], timeout: float | None) -> None:
        """Asks the shards for the table's size and weight, at once. A shard
        whose service does not answer is marked down; another error is
        raised. With no time left none is asked, and none marked."""
        if timeout is not None and timeout <= 0:
            return
        tasks = [self._ask(table, st, i, timeout) for i in shards]
        if not tasks:
            return
        # Shielded: a caller that gives up does not cancel what others wait
        # for. A request in flight may be a background probe's, bounded by
        # _INFO_TIMEOUT rather than by this call's time: it is waited for
        # no longer than that time, and goes on.
        waits = [asyncio.shield(t) for t in tasks]
        try:
            done, _ = await asyncio.wait(waits, timeout=timeout)
        finally:
            # Timed out or cancelled: stop waiting, not the requests, whose
            # failures may then reach no one.
            for w in waits:
                if not w.done():
                    w.cancel()
            for t in tasks:
                if not t.done():
                    t.add_done_callback(_retrieve)
        # Every failure is read, the first in shard order raised.
        first: BaseException | None = None
        for w in waits:
            if w not in done:
                continue
            err: BaseException | None
            if w.cancelled():  # its request was: only close cancels them
                err = errors.ClosedError(f"table {table!r}: the client closed while it asked the shards")
            else:
                err = w.exception()
            first = first or err
        if first is not None:
            raise first

    async def _fetch(self, key: tuple[str, int, int], st: _TableState, timeout: float | None) -> None:
        table, i, gen = key
        try:
            resp = await self._shards[i]._info(timeout, table)
        except errors.RepriseError as e:
            if not is_down(e):
                raise on_shard(e, i, self.prefixes[i]) from None
            st.fail(i, gen, e)
            return
        finally:
            del self._refreshing[key]
        self._check_placement(i, resp)
        try:
            t = one_table(resp, table)
        except errors.ProtocolError as e:
            st.fail(i, gen, e)
            return
        if st.unchecked[i] and st.like is not None:
            self._check_same(table, [st.like, (i, t)])
            st.unchecked[i] = False
        st.learn(i, gen, t.size, t.weight_fraction, t.weight_exponent)

    @staticmethod
    def _info_timeout(deadline: float | None) -> float:
        """How long an info request on the way to a sample may take: the
        other half of the time left is the sample's (see _INFO_TIMEOUT)."""
        if deadline is None:
            return _INFO_TIMEOUT
        return min(_INFO_TIMEOUT, max(0.0, deadline - _now()) / 2)

    # -- learner side ---------------------------------------------------------

    async def _draw(self, table: str, num_samples: int, timeout: float | None, flexible: bool) -> _Draw:
        """Draws the shard of each position and asks every shard drawn for
        its share at once (see :meth:`reprise.ShardedClient.sample`)."""
        if not isinstance(num_samples, (int, np.integer)) or not 1 <= num_samples <= 1 << 30:
            raise errors.InvalidArgumentError(f"sample size {num_samples!r}")
        deadline = _deadline(timeout, None)
        st = await self._table(table, self._info_timeout(deadline))
        await self._refresh(table, st, self._to_ask(table, st, False), self._info_timeout(deadline))
        r = shard_ratios(st.size, st.fraction, st.exponent)
        if r is None:
            r = await self._wait_for_items(table, st, deadline)
        p = r / r.sum()
        n = len(self._shards)
        shard_of = self._rng.choice(n, size=int(num_samples), p=p)
        counts = np.bincount(shard_of, minlength=n)
        asked = [int(i) for i in np.flatnonzero(counts)]
        left = _left(deadline)
        if left == 0:
            # No shard is asked, so none is to blame.
            raise errors._NotSentError(
                f"table {table!r}: the timeout ({timeout}s) passed before the shards drawn could be asked for items"
            )
        results = await asyncio.gather(
            *(self._sample_shard(table, st, i, int(counts[i]), int(st.gen[i]), left, flexible) for i in asked),
            return_exceptions=True,
        )
        replies: list[tuple[int, _sample._Response | errors.RepriseError]] = []
        for i, res in zip(asked, results):
            if isinstance(res, BaseException) and not isinstance(res, errors.RepriseError):
                raise res
            replies.append((i, res))
        return _Draw(self.prefixes, shard_of, p, st.size.copy(), replies, flexible)

    async def _sample_shard(
        self, table: str, st: _TableState, i: int, k: int, gen: int, timeout: float | None, flexible: bool
    ) -> _sample._Response:
        try:
            resp = _sample.parse_response(
                await self._shards[i].sample_raw(table, k, timeout, flexible, hung_after=_INFO_TIMEOUT)
            )
        except errors.RepriseError as e:
            if is_down(e):
                st.fail(i, gen, e)
            raise
        if resp.code in (pb.CODE_OK, pb.CODE_PARTIAL):  # only replies with items carry the state
            st.learn(i, gen, resp.table_size, resp.weight_fraction, resp.weight_exponent)
        elif resp.code in (pb.CODE_UNAVAILABLE, pb.CODE_INTERNAL):  # shutting down, or failing
            st.fail(i, gen, errors.error_for_code(resp.code, resp.message))
        return resp

    async def _wait_for_items(self, table: str, st: _TableState, deadline: float | None) -> np.ndarray:
        """Asks the shards again, backing off, until one has items; raises
        RateLimitedError when the call's timeout (EMPTY_WAIT without one)
        passes first."""
        start = _now()
        until = deadline if deadline is not None else start + EMPTY_WAIT
        backoff = 0.005

        def down() -> str:
            return "".join(
                f"; shard {i} (prefix {self.prefixes[i]!r}) does not answer: {e.message}"
                for i, e in enumerate(st.down)
                if e is not None
            )

        while True:
            left = until - _now()
            if left <= 0:
                raise errors.RateLimitedError(
                    f"table {table!r}: no shard of the table holds items (waited {_now() - start:.3g}s){down()}",
                    code=errors.Code.RATE_LIMITED,
                )
            await asyncio.sleep(min(backoff, left))
            backoff = min(2 * backoff, 0.1)
            await self._refresh(table, st, self._to_ask(table, st, True), self._info_timeout(until))
            r = shard_ratios(st.size, st.fraction, st.exponent)
            if r is not None:
                return r
            # With no shard answering there is nothing to wait for: fail as
            # a Client does when its service is gone.
            if all(e is not None for e in st.down):
                raise errors.UnavailableError(f"table {table!r}: no shard of the table answers{down()}")

    async def sample(
        self, table: str, num_samples: int = 1, *, timeout: float | None = None, flexible: bool = False
    ) -> list[ReplaySample]:
        """Samples ``num_samples`` items of ``table`` (see
        :meth:`reprise.ShardedClient.sample`)."""
        return merge_samples(await self._draw(table, num_samples, timeout, flexible))

    async def sample_batch(
        self, table: str, batch_size: int, *, timeout: float | None = None, flexible: bool = False
    ) -> SampleBatch:
        """One stacked batch (see :meth:`reprise.ShardedClient.sample_batch`)."""
        return merge_batch(await self._draw(table, batch_size, timeout, flexible))

    def sampler(
        self,
        table: str,
        batch_size: int,
        *,
        prefetch: int = 2,
        timeout: float | None = None,
        flexible: bool = False,
        retry_unavailable_for: float = 60.0,
    ) -> AsyncShardedSampler:
        """An async iterator of batches keeping ``prefetch`` calls in flight
        (see :meth:`reprise.ShardedClient.sampler`)."""
        return AsyncShardedSampler(self, table, batch_size, prefetch, timeout, flexible, retry_unavailable_for)

    # -- mutations --------------------------------------------------------------

    async def mutate_priorities(
        self,
        table: str,
        updates: Mapping[int, float] | None = None,
        deletes: Iterable[int] | None = None,
        *,
        timeout: float | None = 10.0,
    ) -> None:
        """Updates priorities and deletes items, each at the shard its key
        names (see :meth:`reprise.ShardedClient.mutate_priorities`)."""
        upd = updates or {}
        keys, prios = priority_arrays(_key_array(upd.keys()), np.fromiter(upd.values(), np.float64, len(upd)))
        await self._mutate(table, keys, prios, _key_array(deletes), timeout)

    async def update_priorities(self, table: str, keys: Any, priorities: Any, *, timeout: float | None = 10.0) -> None:
        """mutate_priorities with arrays of keys and priorities."""
        k, p = priority_arrays(keys, priorities)
        await self._mutate(table, k, p, _key_array(None), timeout)

    async def _mutate(
        self, table: str, keys: np.ndarray, prios: np.ndarray, deletes: np.ndarray, timeout: float | None
    ) -> None:
        # Checked first: keys go where the prefixes' order says they live.
        st = await self._table(table, timeout)
        n = np.uint64(len(self._shards))
        kshard, dshard = keys % n, deletes % n
        calls = {}
        for i, c in enumerate(self._shards):
            ku, kd = kshard == i, dshard == i
            if ku.any() or kd.any():
                upd = dict(zip(keys[ku].tolist(), prios[ku].tolist()))
                calls[i] = c.mutate_priorities(table, upd, deletes[kd].tolist(), timeout=timeout)
        try:
            await self._on_shards(calls)
        finally:
            for i in calls:
                st.invalidate(i)

    async def _every(self, table: str, call: Callable[[Client], Awaitable[None]], timeout: float | None) -> None:
        """call on every shard at once; the table's state is stale after."""
        st = await self._table(table, timeout)
        try:
            await self._on_shards({i: call(c) for i, c in enumerate(self._shards)})
        finally:
            for i in range(len(self._shards)):
                st.invalidate(i)

    async def set_policy_version(self, table: str, version: int, *, timeout: float | None = 10.0) -> None:
        """Raises ``table``'s policy version on every shard."""
        await self._every(table, lambda c: c.set_policy_version(table, version, timeout=timeout), timeout)

    async def set_max_staleness(self, table: str, max_staleness: int | None, *, timeout: float | None = 10.0) -> None:
        """Changes ``table``'s staleness bound on every shard."""
        await self._every(table, lambda c: c.set_max_staleness(table, max_staleness, timeout=timeout), timeout)

    async def reset(self, table: str, *, timeout: float | None = 60.0) -> None:
        """Empties ``table`` on every shard."""
        await self._every(table, lambda c: c.reset(table, timeout=timeout), timeout)

    async def checkpoint(self, *, timeout: float | None = 120.0) -> list[CheckpointInfo]:
        """Asks every shard to write a checkpoint; what each wrote, by shard."""
        got = await self._on_shards({i: c.checkpoint(timeout=timeout) for i, c in enumerate(self._shards)})
        return [got[i] for i in range(len(self._shards))]

    async def _shard_tables(self, timeout: float | None) -> list[dict[str, Any]]:
        """Every shard's wire TableInfos by name, the shards' places checked."""
        resps = await self._on_shards({i: c._info(timeout) for i, c in enumerate(self._shards)})
        for i, r in resps.items():
            self._check_placement(i, r)
        return [{t.name: t for t in resps[i].tables} for i in range(len(self._shards))]

    async def server_info(self, timeout: float | None = 10.0) -> dict[str, TableInfo]:
        """Every table as one (see :meth:`reprise.ShardedClient.server_info`)."""
        per = await self._shard_tables(timeout)
        out: dict[str, TableInfo] = {}
        for name in dict.fromkeys(name for tables in per for name in tables):
            missing = [i for i, tables in enumerate(per) if name not in tables]
            if missing:
                i = missing[0]
                raise errors.InvalidArgumentError(
                    f"table {name!r} is not served by shard {i} (prefix {self.prefixes[i]!r}): "
                    "every shard of a table needs the same tables"
                )
            infos = [tables[name] for tables in per]
            self._check_same(name, list(enumerate(infos)))
            self._learn_info(name, infos)
            out[name] = _info.aggregate_tables([_info.table_info(t) for t in infos])
        return out

    async def shard_info(self, timeout: float | None = 10.0) -> list[dict[str, TableInfo]]:
        """Every shard's server_info, in shard order."""
        per = await self._shard_tables(timeout)
        return [{name: _info.table_info(t) for name, t in tables.items()} for tables in per]

    # -- actor side ---------------------------------------------------------------

    async def trajectory_writer(self, num_keep_alive_refs: int = 128, **options: Any) -> AsyncShardedTrajectoryWriter:
        """A writer that writes each episode to one shard (see
        :meth:`reprise.ShardedClient.trajectory_writer`)."""
        if "key_shard" in options:
            raise errors.InvalidArgumentError("a ShardedClient's writers make each shard's keys: no key_shard")
        writers = [await c.trajectory_writer(num_keep_alive_refs, **options) for c in self._shards]
        return AsyncShardedTrajectoryWriter(self, writers, random.randrange(len(writers)))

    async def insert(self, data: Mapping[str, Any], priorities: Mapping[str, float], *, timeout: float | None = 60.0) -> None:
        """Inserts one single-step item into each table of ``priorities``, on
        one shard drawn at random (see :meth:`reprise.Client.insert`)."""
        i = random.randrange(len(self._shards))
        try:
            await self._shards[i].insert(data, priorities, timeout=timeout)
        finally:
            for table in priorities:
                st = self._states.get(table)
                if st is not None:
                    st.invalidate(i)


class AsyncShardedSampler:
    """Batches from a sharded table with several calls in flight, as
    :class:`reprise.aio.AsyncSampler`; made by
    :meth:`ShardedClient.sampler`. A call that a shard failed while the
    others answered gives their items as a short batch; while that goes on,
    for up to ``retry_unavailable_for`` seconds."""

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
        check_sampler(prefetch, timeout)
        self._c = client
        self._args = (table, batch_size, timeout, flexible)
        self._prefetch = prefetch
        self._retry_for = retry_unavailable_for
        self._tasks: collections.deque[asyncio.Task[_Draw]] = collections.deque()
        self._closed = False
        # The call __anext__ awaits, which aclose cancels too.
        self._current: asyncio.Task[_Draw] | None = None
        # Since when batches have come short of a failing shard.
        self._short_since: float | None = None

    def __aiter__(self) -> AsyncShardedSampler:
        return self

    def _fill(self) -> None:
        while not self._closed and len(self._tasks) < self._prefetch:
            self._tasks.append(asyncio.ensure_future(self._c._draw(*self._args)))

    async def __anext__(self) -> SampleBatch:
        since: float | None = None
        backoff = 0.01
        timeout = self._args[2]
        while True:
            if self._closed:
                raise StopAsyncIteration
            self._fill()
            task = self._current = self._tasks.popleft()
            try:
                batch = merge_batch(await task)
                self._short_since = None
            except (asyncio.CancelledError, errors.ClosedError) as e:
                if ends_iteration(e, self._closed or self._c._closed):
                    await self.aclose()
                    raise StopAsyncIteration from None
                raise
            except errors.RateLimitedError as e:
                if e.partial is None or not len(e.partial):
                    if timeout is None:
                        continue  # no timeout: wait on, as Reverb's sampler does
                    await self.aclose()
                    raise StopAsyncIteration from None
                batch = e.partial  # a short batch: samples are never dropped
            except errors._NotSentError:
                # The timeout passed before the shards could be asked: an
                # end, as the limiters' timeout is.
                await self.aclose()
                raise StopAsyncIteration from None
            except (errors.UnavailableError, errors.DeadlineExceededError) as e:
                now = _now()
                if e.partial is not None and len(e.partial):
                    self._short_since = self._short_since or now
                    if now - self._short_since > self._retry_for:
                        raise
                    batch = e.partial
                else:
                    since = since or now
                    if now - since > self._retry_for:
                        raise
                    await asyncio.sleep(backoff)
                    backoff = min(2 * backoff, 1.0)
                    continue
            finally:
                self._current = None
            # Replaced before the caller trains on it, as in the sync sampler.
            self._fill()
            return batch

    async def aclose(self) -> None:
        """Cancels the calls in flight, withdrawing the shards' requests
        that still wait for the rate limiter: they take nothing. Replies
        already sampled and on their way are lost: with a queue table use
        prefetch=1, which loses at most one batch."""
        self._closed = True
        for t in self._tasks:
            if not t.cancel() and not t.cancelled():
                t.exception()  # failed as the client closed: taken, not logged as lost
        self._tasks.clear()
        if self._current is not None:
            self._current.cancel()

    async def __aenter__(self) -> AsyncShardedSampler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncShardedTrajectoryWriter:
    """The asyncio twin of :class:`reprise.ShardedTrajectoryWriter`: one
    writer per shard, each episode written through one of them."""

    def __init__(self, client: ShardedClient, writers: Sequence[AsyncTrajectoryWriter], first: int) -> None:
        self._c = client
        self._writers = tuple(writers)
        self._shard = first

    @property
    def writers(self) -> tuple[AsyncTrajectoryWriter, ...]:
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
        """The current shard's writer's secret id."""
        return self._writers[self._shard].producer_id

    @property
    def notice_token(self) -> str:
        """The current shard's writer's public name."""
        return self._writers[self._shard].notice_token

    @property
    def history(self) -> History:
        return self._writers[self._shard].history

    @property
    def episode_steps(self) -> int:
        return self._writers[self._shard].episode_steps

    async def append(self, step: Mapping[str, Any], partial_step: bool = False) -> None:
        """Appends a step to the current episode."""
        await self._writers[self._shard].append(step, partial_step)

    async def create_item(
        self,
        table: str,
        priority: float,
        trajectory: Mapping[str, TrajectoryColumn] | Iterable[TrajectoryColumn],
    ) -> None:
        """Creates an item on the current episode's shard (see
        :meth:`reprise.ShardedTrajectoryWriter.create_item`)."""
        w = self._writers[self._shard]
        # Closed, it asks the shards nothing: their answer would hide it.
        w._check_open()
        if table not in self._c._states:
            await self._c._table_soft(table)
        await w.create_item(table, priority, trajectory)

    async def _each(self, calls: Sequence[Awaitable[None]]) -> None:
        """Runs the calls on the shards' writers at once and, once all are
        done, raises their errors as one, each naming its shard (a
        writer's call took its errors: one left out would never be
        raised), or an exception that is no RepriseError as it is."""
        results = await asyncio.gather(*calls, return_exceptions=True)
        bug = next((r for r in results if isinstance(r, BaseException) and not isinstance(r, errors.RepriseError)), None)
        if bug is not None:
            # Raised as it is (a cancellation, say): the errors the other
            # calls took go back to their writers, for the next call.
            for i, r in enumerate(results):
                if isinstance(r, errors.RepriseError):
                    p = self._writers[i]._p
                    assert p is not None
                    p.on_error(r)
            raise bug
        errs = [on_shard(r, i, self._c.prefixes[i]) for i, r in enumerate(results) if isinstance(r, errors.RepriseError)]
        if errs:
            raise _join(errs)

    async def flush(
        self, block_until_num_items: int = 0, timeout_ms: int | None = None, *, timeout: float | None = None
    ) -> None:
        """Flushes every shard's writer (``block_until_num_items`` per
        shard)."""
        await self._each([w.flush(block_until_num_items, timeout_ms, timeout=timeout) for w in self._writers])

    async def wait_applied(self, timeout: float | None = None) -> None:
        """Waits until every shard applied every item of its writer."""
        await self._each([w.wait_applied(timeout) for w in self._writers])

    def set_policy_version(self, version: int) -> None:
        """Sets the policy version of every shard's writer."""
        for w in self._writers:
            w.set_policy_version(version)

    async def end_episode(
        self, clear_buffers: bool = True, timeout_ms: int | None = None, *, timeout: float | None = None
    ) -> None:
        """Ends the episode on its shard (see
        :meth:`reprise.ShardedTrajectoryWriter.end_episode`): once it ended,
        the next one goes to the next shard."""
        w = self._writers[self._shard]
        assert w._p is not None
        episode = w._p.episode
        try:
            await w.end_episode(clear_buffers, timeout_ms, timeout=timeout)
        finally:
            if w._p.episode != episode:  # ended, even if its wait failed
                self._shard = (self._shard + 1) % len(self._writers)

    async def close(self, timeout: float | None = 60.0) -> None:
        """Closes every shard's writer."""
        await self._each([w.close(timeout) for w in self._writers])

    async def __aenter__(self) -> AsyncShardedTrajectoryWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
