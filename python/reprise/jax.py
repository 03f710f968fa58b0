"""JAX adapter: :class:`ReplayIterator`, endless sampled batches placed on
JAX devices (``pip install 'reprise[jax]'``).

::

    it = reprise.jax.ReplayIterator("nats://127.0.0.1:4222", "replay", batch_size=256,
                                    prefetch=4, device_prefetch=2)
    for batch in it:
        params, td = train_step(params, batch.data, batch.info["probability"])   # a jitted step
        it.update_priorities(batch.info_numpy.key, jnp.abs(td))

Arrays are placed with ``jax.device_put``, which returns at once and copies
in the background: the iterator keeps up to ``device_prefetch`` batches
placed ahead of the one it hands out (those already sampled), so their
copies overlap the caller's step
(as ``flax.jax_utils.prefetch_to_device`` does). With ``sharding=``, a
``jax.sharding.Sharding`` that splits a batch's leading axis (such as
``NamedSharding(mesh, PartitionSpec("batch"))``), each batch becomes one
global array a column through ``jax.make_array_from_process_local_data``:
on one host the batch is split over its devices, and with several JAX
processes each samples its own local batch and together they make the
global one.

JAX computes in 32 bits unless ``jax_enable_x64`` is set: see
:func:`to_jax` for what becomes of 64-bit columns. Item keys (uint64) stay
numpy, in ``JaxBatch.info_numpy``, whatever the setting.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, TypeAlias

import jax
import numpy as np

from . import errors
from ._sample import BatchInfo, SampleBatch
from .aio import check_sampler
from .client import Client, Sampler, ShardedClient, ShardedSampler

log = logging.getLogger("reprise")

#: Where arrays go: a device, a sharding, or None for JAX's default device.
Placement: TypeAlias = "jax.Device | jax.sharding.Sharding | None"

_WIDE_INTS = (np.dtype(np.int64), np.dtype(np.uint64))


def to_jax(a: np.ndarray, device_or_sharding: Placement = None) -> jax.Array:
    """A numpy array as a ``jax.Array``, placed without waiting for the
    copy: ``jax.device_put`` on ``device`` (None: JAX's default device),
    or, given a ``jax.sharding.Sharding``,
    ``jax.make_array_from_process_local_data``, for which ``a`` is this
    process's part of the global array (the whole of it with one process).

    dtypes are JAX's: bfloat16 stays bfloat16; an array in the other byte
    order is swapped. Without ``jax_enable_x64`` (JAX's default), JAX has
    no 64-bit types and makes int64, uint64, float64 and complex128 arrays
    32-bit: floats lose precision (and overflow to inf past float32's
    range), while integers would wrap, so an int64 or uint64 array with a
    value outside int32 or uint32 is refused (ValueError) rather than
    silently changed. With ``jax_enable_x64`` 64-bit arrays keep their
    dtype.

    On CPU, ``jax.device_put`` may share the array's memory rather than
    copy it: do not write to ``a`` afterwards."""
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if a.dtype in _WIDE_INTS and a.size:
        to = jax.dtypes.canonicalize_dtype(a.dtype)
        if to != a.dtype:
            lo, hi = np.iinfo(to).min, np.iinfo(to).max
            if a.min() < lo or a.max() > hi:
                raise ValueError(
                    f"a {a.dtype} array holds values outside {to} ({lo} to {hi}), which JAX without"
                    " jax_enable_x64 would wrap: set jax.config.update('jax_enable_x64', True) or write a narrower dtype"
                )
    if isinstance(device_or_sharding, jax.sharding.Sharding):
        return jax.make_array_from_process_local_data(device_or_sharding, a)
    return jax.device_put(a, device_or_sharding)


@dataclasses.dataclass(frozen=True)
class JaxBatch:
    """A sampled batch as JAX arrays: ``data`` maps each column to an array
    of shape [B, T, *step_shape] ([B, *step_shape] for squeezed single-step
    columns), as in :class:`reprise.SampleBatch`; ``info`` maps
    ``probability``, ``priority``, ``table_size`` and ``times_sampled`` to
    arrays of length B. ``info_numpy`` is the batch's
    :class:`reprise.BatchInfo`: its uint64 ``key`` (which JAX without
    ``jax_enable_x64`` cannot hold) for :meth:`ReplayIterator.update_priorities`,
    and the 64-bit originals of the rest (``inserted_at_unix_nano``,
    ``rate_limited`` too)."""

    info: dict[str, jax.Array]
    data: dict[str, jax.Array]
    info_numpy: BatchInfo

    def __len__(self) -> int:
        """This process's items: the local batch size."""
        return int(self.info_numpy.key.shape[0])


_INFO = ("probability", "priority", "table_size", "times_sampled")


def batch_to_jax(batch: SampleBatch, device: jax.Device | None = None, sharding: jax.sharding.Sharding | None = None) -> JaxBatch:
    """Converts a SampleBatch to a JaxBatch, placing its arrays as
    :func:`to_jax` does on ``device`` or split by ``sharding`` (not both).
    The batch's arrays become read-only: the placed arrays may share their
    memory, and a jax.Array must not change."""
    if device is not None and sharding is not None:
        raise ValueError("give a device or a sharding, not both")
    where: Placement = sharding if sharding is not None else device
    i = batch.info
    info = {name: to_jax(getattr(i, name), where) for name in _INFO}
    data = {k: to_jax(v, where) for k, v in batch.data.items()}
    for a in (*batch.data.values(), *(getattr(i, f.name) for f in dataclasses.fields(i))):
        a.flags.writeable = False
    return JaxBatch(info, data, i)


class ReplayIterator:
    """Endless batches of one table as :class:`JaxBatch` objects.

    ``server`` is an address, for which the iterator makes its own
    :class:`reprise.Client` with ``client_options`` (a
    :class:`reprise.ShardedClient` with ``prefixes``, for a table sharded
    over the services with those prefixes) and closes it with itself; or a
    Client or ShardedClient, which stays the caller's. An iterator, not a
    dataset to iterate again: each batch is sampled once, as a training
    loop takes it.

    ``prefetch`` sample requests are kept in flight (the sampler's), and
    up to ``device_prefetch`` batches are kept placed on the devices ahead
    of the one handed out (0: each placed as it is taken): those whose
    replies are in, as a batch is handed out without waiting for more
    (which a rate limiter may allow only once the caller's step has let
    items in); what sampling or placing one ahead raises comes after the
    batches before it. ``timeout`` ends the iteration when the rate limiter
    allows no batch in time (as Reverb's ``rate_limiter_timeout_ms``);
    without, it waits.

    ``device`` or ``sharding`` (not both) say where the batches go, as
    :func:`batch_to_jax` has it; the device must be this process's
    (ValueError otherwise). ``batch_size`` is this process's batch, so
    a sharding must split it evenly over the devices it splits the leading
    axis over here, and name no other axis (ValueError otherwise); with
    several JAX processes it must not place the same rows on devices of
    more than one, as PartitionSpec() or an axis within each process does
    (ValueError): each process samples a batch of its own, which JAX would
    take to be the same in each; nor give the processes it spans unequal
    shares of the batch, or this process none (ValueError). A batch
    the rate limiter cut short (see :meth:`reprise.Client.sampler`) is
    handed out as it is, a new shape for a jitted step to trace, except
    with a sharding, where it is dropped: it may not split, and every
    process must give the global array the same share. Its items count as
    sampled."""

    def __init__(
        self,
        server: str | Client | ShardedClient,
        table: str,
        batch_size: int,
        *,
        prefetch: int = 2,
        device_prefetch: int = 2,
        timeout: float | None = None,
        device: jax.Device | None = None,
        sharding: jax.sharding.Sharding | None = None,
        client_options: Mapping[str, Any] | None = None,
        prefixes: Sequence[str] | None = None,
    ) -> None:
        check_sampler(prefetch, timeout)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if device_prefetch < 0:
            raise ValueError(f"device_prefetch must be >= 0, got {device_prefetch}")
        if device is not None and sharding is not None:
            raise ValueError("give a device or a sharding, not both")
        if isinstance(device, jax.Device) and device.process_index != jax.process_index():
            # JAX places an array on another process's device without a
            # word, one this process cannot read: its batches would be
            # sampled for nobody. (A sharding passed as the device, which
            # to_jax places as a sharding, is left to JAX.)
            raise ValueError(
                f"device {device} is process {device.process_index}'s, not this one's ({jax.process_index()}):"
                " each JAX process samples a batch of its own for its own devices (jax.local_devices())"
            )
        if sharding is not None:
            splits = _local_splits(sharding)
            _refuse_unequal_shares(sharding)
            if batch_size % splits:
                raise ValueError(
                    f"batch_size {batch_size} does not split evenly over the {splits} devices"
                    " the sharding splits a batch's leading axis over in this process"
                )
            _refuse_rows_of_several_processes(sharding)
        if isinstance(server, str):
            if prefixes is not None:
                self._client: Client | ShardedClient = ShardedClient(server, prefixes, **dict(client_options or {}))
            else:
                self._client = Client(server, **dict(client_options or {}))
            self._owned = True
        else:
            if client_options is not None or prefixes is not None:
                raise ValueError("client_options and prefixes are for an address: the client given has its own")
            self._client, self._owned = server, False
        self.table = table
        self.batch_size = batch_size
        self.device_prefetch = device_prefetch
        self.device = device
        self.sharding = sharding
        self._sampler: Sampler | ShardedSampler = self._client.sampler(
            table, batch_size, prefetch=prefetch, timeout=timeout
        )
        # Batches placed (their copies under way), oldest first. Only the
        # iterating thread touches it.
        self._placed: collections.deque[JaxBatch] = collections.deque()
        # What placing a batch ahead raised, for the call after the batches
        # placed before it. Only the iterating thread touches it.
        self._error: Exception | None = None
        self._closed = False
        self._lock = threading.Lock()  # _closed, against a close on another thread

    @property
    def client(self) -> Client | ShardedClient:
        """The client the iterator samples through."""
        return self._client

    def __iter__(self) -> ReplayIterator:
        return self

    def __next__(self) -> JaxBatch:
        if not self._placed:
            error, self._error = self._error, None
            with self._lock:
                closed = self._closed
            if error is not None and not closed:
                raise error
            b = self._next_placed(wait=True)
            if b is None:
                raise StopIteration
            self._placed.append(b)
        # Placed before the batch is handed out, so that the caller's step
        # runs while their copies do; only batches already come, as the
        # rate limiter may allow the next ones only once the caller's step
        # let a producer insert more (an actor in the learner's thread):
        # waiting for them would hold back the batch in hand, or end the
        # iteration on the timeout.
        while len(self._placed) <= self.device_prefetch and self._error is None:
            try:
                b = self._next_placed(wait=False)
            except Exception as e:  # noqa: BLE001 - raised once the batches that came before it are handed out
                self._error = e
                break
            if b is None:
                break
            self._placed.append(b)
        try:
            return self._placed.popleft()
        except IndexError:  # a close on another thread emptied it
            raise StopIteration from None

    def _next_placed(self, wait: bool) -> JaxBatch | None:
        """The sampler's next batch placed, or None at the end; without
        wait, None too unless its reply is in."""
        while True:
            with self._lock:
                if self._closed:
                    return None
            try:
                batch = next(self._sampler) if wait else self._sampler._next_ready()
            except StopIteration:
                return None
            if batch is None:
                return None
            if self.sharding is not None and len(batch) != self.batch_size:
                log.warning(
                    "reprise: dropped a batch of %d items of table %r (batch_size %d): the rate limiter cut it short,"
                    " and a sharded batch keeps its shape",
                    len(batch), self.table, self.batch_size,
                )  # fmt: skip
                continue
            return batch_to_jax(batch, self.device, self.sharding)

    def update_priorities(self, keys: Any, priorities: Any, *, timeout: float | None = 10.0) -> None:
        """Sets priorities of sampled items: ``keys`` as
        ``batch.info_numpy.key`` (uint64), ``priorities`` a numpy or JAX
        array of as many (sent as float64). A JAX array of the global
        batch, over several processes, gives this process's rows, those it
        sampled, from whichever of its devices here holds them: laid out
        as the batch, replicated, or otherwise (InvalidArgumentError if
        none here holds them)."""
        if isinstance(keys, jax.Array):
            if keys.dtype.itemsize != 8:
                raise errors.InvalidArgumentError(
                    f"keys of dtype {keys.dtype}: keys are uint64, which JAX without jax_enable_x64 cuts to 32 bits;"
                    " pass batch.info_numpy.key"
                )
            keys = _local_rows(keys, self.sharding)
        if isinstance(priorities, jax.Array):
            priorities = _local_rows(priorities, self.sharding)
        self._client.update_priorities(self.table, keys, np.asarray(priorities, dtype=np.float64), timeout=timeout)

    def close(self) -> None:
        """Stops the sampler's requests (an iteration in another thread
        ends), drops the batches placed ahead, and closes the client if
        the iterator made it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._sampler.close()
        self._placed.clear()
        if self._owned:
            self._client.close()

    def __enter__(self) -> ReplayIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _local_splits(sharding: jax.sharding.Sharding) -> int:
    """Into how many parts the sharding splits this process's share of a
    batch's leading axis: the distinct row ranges of its devices here. A
    sharding for more axes than one is refused: it cannot place the 1-D
    info arrays (and squeezed scalar columns), even where it splits the
    leading axis alone (P("data", None))."""
    refused = (
        f"the sharding {sharding} must name a batch's leading axis alone, as PartitionSpec('data') does:"
        " it places every column and the 1-D info arrays"
    )
    if isinstance(sharding, jax.sharding.NamedSharding) and len(sharding.spec) > 1:
        raise ValueError(refused)
    n = len(sharding.device_set)
    try:
        indices = sharding.addressable_devices_indices_map((n,)).values()
    except Exception as e:  # noqa: BLE001 - JAX's error for a sharding of another rank varies (ValueError, IndexError)
        raise ValueError(f"{refused} ({type(e).__name__}: {e})") from None
    return len({idx[0].indices(n)[:2] if idx else (0, n) for idx in indices})


def _refuse_unequal_shares(sharding: jax.sharding.Sharding) -> None:
    """Refuses a sharding that gives the JAX processes it spans unequal
    shares of a batch's leading axis, or this process none (a mesh of
    some other process's devices): each process samples batch_size items
    and places them on its own devices, which
    make_array_from_process_local_data fails to do (once the batch is
    sampled) where the shares differ. A sharding of this process's devices
    alone gives it the whole, its arrays its own."""
    n = len(sharding.device_set)
    rows_of: dict[int, set[tuple[int, int]]] = {}
    for device, index in sharding.devices_indices_map((n,)).items():
        rows = index[0].indices(n)[:2] if index else (0, n)
        rows_of.setdefault(device.process_index, set()).add(rows)  # type: ignore[attr-defined]  # jaxlib's Device has no stub
    shares = {p: Fraction(sum(stop - start for start, stop in rows), n) for p, rows in sorted(rows_of.items())}
    here = jax.process_index()
    if any(share != shares.get(here) for share in shares.values()):
        raise ValueError(
            f"the sharding {sharding} gives the JAX processes unequal shares of a batch's leading axis"
            f" ({', '.join(f'process {p} {share}' for p, share in shares.items())}"
            f"{'' if here in shares else f', process {here} none'}), but each samples batch_size items for its own"
            " devices: split the leading axis over a mesh of every process's devices, or of this process's alone"
        )


def _refuse_rows_of_several_processes(sharding: jax.sharding.Sharding) -> None:
    """Refuses a sharding that places the same rows of a batch's leading
    axis on devices of several JAX processes: one that replicates the axis
    (PartitionSpec()) or splits it over a mesh axis within each process.
    make_array_from_process_local_data takes such rows to be the same in
    every process that holds them, but each process samples a batch of its
    own: each would hold a "global" array of its own batch, unlike the
    others', and a jitted step compute on it without a word."""
    n = len(sharding.device_set)
    processes: dict[tuple[int, int], set[int]] = {}
    for device, index in sharding.devices_indices_map((n,)).items():
        rows = index[0].indices(n)[:2] if index else (0, n)
        processes.setdefault(rows, set()).add(device.process_index)  # type: ignore[attr-defined]  # jaxlib's Device has no stub
    for held in processes.values():
        if len(held) > 1:
            raise ValueError(
                f"the sharding {sharding} places the same rows of a batch's leading axis on devices of several JAX"
                f" processes ({sorted(held)}), but each process samples a batch of its own: split the leading axis"
                " over a mesh axis that spans the processes, as PartitionSpec('batch') over a mesh of jax.devices() does"
            )


def _local_rows(x: jax.Array, placed: jax.sharding.Sharding | None) -> np.ndarray:
    """This process's rows of x, in order. For a global x (over several
    processes) and ``placed``, the batches' sharding: the rows this
    process's local batch went to, the distinct row ranges ``placed`` gives
    its devices, in order (as make_array_from_process_local_data maps a
    local batch), taken from whichever shards of x here hold them, as x's
    own sharding may differ (a step's output replicated, or laid out
    otherwise). Otherwise x's rows on its devices here."""
    if x.ndim == 0:
        return np.asarray(x.addressable_data(0)).reshape(-1)
    n = x.shape[0]

    def rows(index: tuple[slice, ...] | None) -> tuple[int, int]:
        start, stop, _ = index[0].indices(n) if index else (0, n, 1)
        return start, stop

    held: dict[tuple[int, int], Any] = {}
    for s in x.addressable_shards:
        held.setdefault(rows(s.index), s)
    if placed is None or x.is_fully_addressable:
        wanted = sorted(held)
    else:
        wanted = sorted({rows(index) for index in placed.addressable_devices_indices_map((n,)).values()})
    parts = []
    for start, stop in wanted:
        at = start
        while at < stop:  # x's shards may split the range finer than the batch's
            got = next(((a, b, s) for (a, b), s in held.items() if a <= at < b), None)
            if got is None:
                raise errors.InvalidArgumentError(
                    f"row {at} of a global array of shape {x.shape}, which this process sampled, is on none of its"
                    f" devices with the array's sharding {x.sharding}: lay it out as the batch, or replicate it"
                )
            a, b, shard = got
            parts.append(np.asarray(shard.data)[at - a : min(b, stop) - a].reshape(-1))
            at = min(b, stop)
    return np.concatenate(parts)


__all__ = ["JaxBatch", "ReplayIterator", "batch_to_jax", "to_jax"]
