"""PyTorch adapter: :class:`ReplayDataset`, an ``IterableDataset`` of
sampled batches as tensors (``pip install 'reprise[torch]'``).

::

    ds = reprise.torch.ReplayDataset("nats://127.0.0.1:4222", "replay", batch_size=256,
                                     prefetch=4, device="cuda", pin_memory=True)
    for batch in ds:                      # or torch.utils.data.DataLoader(ds, batch_size=None)
        q = net(batch.data["obs"])        # [256, *obs_shape] on the GPU
        ...
        ds.update_priorities(batch.info["key"], td_errors)

Tensors are made with ``torch.from_numpy`` (no copy), pinned when asked (one
copy into page-locked memory) and moved with ``.to(device,
non_blocking=True)``, so a CUDA copy overlaps the next batch's decoding.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from . import _codec
from ._sample import SampleBatch
from .aio import check_sampler
from .client import Client, ShardedClient

_BF16 = _codec.DTYPES["bfloat16"]


def to_tensor(a: np.ndarray, device: torch.device | str | None = None, pin_memory: bool = False) -> torch.Tensor:
    """A numpy array as a tensor, pinned and moved to ``device`` without
    blocking when asked. It shares the array's memory except where torch
    lacks a usable dtype: bfloat16 is reinterpreted; uint16 and uint32 are
    widened to int32 and int64 (torch's own have next to no operations:
    no arithmetic, indexing or gather); uint64 is reinterpreted as int64,
    as keys are (``t.numpy().view(np.uint64)`` gives the values back); an
    array in the other byte order is swapped."""
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if a.dtype == _BF16:
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    elif a.dtype in _WIDENED:
        t = torch.from_numpy(a.astype(_WIDENED[a.dtype]))
    elif a.dtype == np.uint64:
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int64))
    else:
        t = torch.from_numpy(np.ascontiguousarray(a))
    if pin_memory:
        t = t.pin_memory()
    if device is not None:
        t = t.to(device, non_blocking=pin_memory)
    return t


_WIDENED: dict[np.dtype[Any], np.dtype[Any]] = {np.dtype(np.uint16): np.dtype(np.int32), np.dtype(np.uint32): np.dtype(np.int64)}


@dataclasses.dataclass(frozen=True)
class TensorBatch:
    """A sampled batch as tensors: ``data`` as in
    :class:`reprise.SampleBatch`; ``info`` maps ``key``, ``probability``,
    ``priority``, ``table_size``, ``times_sampled`` to tensors (keys are
    int64: uint64 keys are reinterpreted; ``info_numpy`` keeps the originals
    for priority updates)."""

    info: dict[str, torch.Tensor]
    data: dict[str, torch.Tensor]
    info_numpy: Any

    def __len__(self) -> int:
        return int(self.info["key"].shape[0])


def batch_to_tensors(
    batch: SampleBatch, device: torch.device | str | None = None, pin_memory: bool = False
) -> TensorBatch:
    """Converts a SampleBatch to a TensorBatch."""
    i = batch.info
    info = {
        "key": to_tensor(i.key.view(np.int64), device, pin_memory),
        "probability": to_tensor(i.probability, device, pin_memory),
        "priority": to_tensor(i.priority, device, pin_memory),
        "table_size": to_tensor(i.table_size, device, pin_memory),
        "times_sampled": to_tensor(i.times_sampled, device, pin_memory),
    }
    data = {k: to_tensor(v, device, pin_memory) for k, v in batch.data.items()}
    return TensorBatch(info, data, i)


class ReplayDataset(torch.utils.data.IterableDataset):  # type: ignore[misc]
    """Endless batches from one table as :class:`TensorBatch` objects.

    Each iterator (each DataLoader worker) opens its own connection with
    ``client_options`` and keeps ``prefetch`` requests in flight. Use it with
    ``DataLoader(ds, batch_size=None)`` or iterate it directly. ``timeout``
    ends the iteration when the rate limiter allows no batch in time (as
    Reverb's ``rate_limiter_timeout_ms``); ``pin_memory`` is ignored where
    torch cannot pin (no accelerator). With ``prefixes``, the table is
    sharded over the services with those prefixes (in shard order), read
    through a :class:`reprise.ShardedClient`."""

    def __init__(
        self,
        server_address: str,
        table: str,
        batch_size: int,
        *,
        prefetch: int = 2,
        timeout: float | None = None,
        device: torch.device | str | None = None,
        pin_memory: bool = False,
        client_options: Mapping[str, Any] | None = None,
        prefixes: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        check_sampler(prefetch, timeout)  # here, not in a DataLoader's worker
        self.server_address = server_address
        self.table = table
        self.batch_size = batch_size
        self.prefetch = prefetch
        self.timeout = timeout
        self.device = torch.device(device) if device is not None else None
        self.pin_memory = pin_memory and _can_pin()
        self.client_options = dict(client_options or {})
        self.prefixes = list(prefixes) if prefixes is not None else None
        self._client: Client | ShardedClient | None = None
        self._client_pid = 0
        # Guards _client: two threads starting on the dataset at once (an
        # iterating thread, the training loop's update_priorities) would
        # each make a client, and close only one.
        self._lock: threading.Lock | None = None
        self._lock_pid = 0

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers get a copy without the connection: each makes
        # its own.
        state = self.__dict__.copy()
        state["_client"] = None
        state["_lock"], state["_lock_pid"] = None, 0
        return state

    def _guard(self) -> threading.Lock:
        """This process's lock for _client. A fork copies a lock that
        another thread may hold, and would hold for good in the child,
        where only the forking thread goes on: a new process makes its
        own."""
        if self._lock is None or self._lock_pid != os.getpid():
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
        return self._lock

    def client(self) -> Client | ShardedClient:
        """This process's client (made on first use)."""
        # A DataLoader worker forked after the main process made its client
        # (update_priorities in the training loop) has a copy of it whose
        # event-loop thread did not survive the fork, and which shares the
        # parent's socket: the worker makes its own, and leaves the copy
        # alone rather than close what is the parent's.
        with self._guard():
            if self._client is None or self._client_pid != os.getpid():
                if self.prefixes is not None:
                    self._client = ShardedClient(self.server_address, self.prefixes, **self.client_options)
                else:
                    self._client = Client(self.server_address, **self.client_options)
                self._client_pid = os.getpid()
            return self._client

    def __iter__(self) -> Generator[TensorBatch, None, None]:
        c = self.client()
        with c.sampler(self.table, self.batch_size, prefetch=self.prefetch, timeout=self.timeout) as s:
            for batch in s:
                yield batch_to_tensors(batch, self.device, self.pin_memory)

    def update_priorities(self, keys: Any, priorities: Any) -> None:
        """Sets priorities of sampled items (keys: ``batch.info["key"]`` or
        ``batch.info_numpy.key``; priorities: a tensor or array)."""
        if isinstance(keys, torch.Tensor):
            keys = keys.detach().cpu().numpy().view(np.uint64)
        if isinstance(priorities, torch.Tensor):
            priorities = priorities.detach().double().cpu().numpy()  # priorities travel as float64
        self.client().update_priorities(self.table, keys, priorities)

    def close(self) -> None:
        """Closes this process's client: iterations in other threads end."""
        with self._guard():
            c, self._client = self._client, None
            ours = self._client_pid == os.getpid()
        if c is not None and ours:
            c.close()


def _can_pin() -> bool:
    try:
        return bool(torch.cuda.is_available()) or bool(getattr(torch, "accelerator", None) and torch.accelerator.is_available())
    except Exception:  # noqa: BLE001
        return False


__all__ = ["ReplayDataset", "TensorBatch", "batch_to_tensors", "to_tensor"]
