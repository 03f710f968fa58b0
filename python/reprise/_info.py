"""Server info and checkpoint results."""

from __future__ import annotations

import dataclasses
from typing import Any

from ._proto import reprise_pb2 as pb


@dataclasses.dataclass(frozen=True)
class ColumnSpec:
    """One column of a table signature: shape is [T, *step_shape] for
    T-step columns ([*step_shape] when squeezed); -1 matches any size."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class RateLimiterInfo:
    """A table's rate limiter: the samples-per-insert inequality's
    parameters and its counters (inserts, samples, deletes since creation
    or reset)."""

    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float
    inserts: int
    samples: int
    deletes: int


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """What ``server_info`` says about one table. Field names follow
    Reverb's ``TableInfo`` where they exist (``current_size``,
    ``max_size``, ``max_times_sampled``, ``rate_limiter_info``,
    ``signature``); ``sampler_options`` and ``remover_options`` are the
    selector names as strings (Reverb: protos). Reprise adds the table's
    counters and bytes held."""

    name: str
    sampler_options: str
    remover_options: str
    max_size: int
    max_times_sampled: int
    rate_limiter_info: RateLimiterInfo
    signature: tuple[ColumnSpec, ...]
    current_size: int
    bytes_held: int
    num_inserts: int
    num_samples: int
    num_deletes: int
    num_evictions: int
    insert_waits: int
    sample_waits: int
    #: The table's current policy version, its staleness bound (None: none),
    #: its items' lowest and highest versions (0 when empty), and the items
    #: removed or dropped as stale.
    policy_version: int = 0
    max_staleness: int | None = None
    min_item_version: int = 0
    max_item_version: int = 0
    num_stale_evictions: int = 0
    #: As Reverb's: the episodes the items hold steps of, the episodes whose
    #: last item left, and the items sampled at least once.
    num_episodes: int = 0
    num_deleted_episodes: int = 0
    num_unique_samples: int = 0

    @property
    def size(self) -> int:
        """The table's current size (``current_size``)."""
        return self.current_size

    @property
    def sampler(self) -> str:
        return self.sampler_options

    @property
    def remover(self) -> str:
        return self.remover_options

    @property
    def limiter(self) -> RateLimiterInfo:
        return self.rate_limiter_info


def table_info(t: Any) -> TableInfo:
    lim = t.limiter
    return TableInfo(
        name=t.name,
        sampler_options=t.sampler,
        remover_options=t.remover,
        max_size=t.max_size,
        max_times_sampled=t.max_times_sampled,
        rate_limiter_info=RateLimiterInfo(
            samples_per_insert=lim.samples_per_insert,
            min_size_to_sample=lim.min_size,
            min_diff=lim.min_diff,
            max_diff=lim.max_diff,
            inserts=lim.inserts,
            samples=lim.samples,
            deletes=lim.deletes,
        ),
        signature=tuple(ColumnSpec(c.name, c.dtype, tuple(c.shape)) for c in t.signature),
        current_size=t.size,
        bytes_held=t.bytes_held,
        num_inserts=t.inserts,
        num_samples=t.samples,
        num_deletes=t.deletes,
        num_evictions=t.evictions,
        insert_waits=t.insert_waits,
        sample_waits=t.sample_waits,
        policy_version=t.policy_version,
        max_staleness=t.max_staleness if t.HasField("max_staleness") else None,
        min_item_version=t.min_item_version,
        max_item_version=t.max_item_version,
        num_stale_evictions=t.stale_evictions,
        num_episodes=t.num_episodes,
        num_deleted_episodes=t.num_deleted_episodes,
        num_unique_samples=t.num_unique_samples,
    )


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What ``checkpoint`` wrote (Reverb returns only a path; Reprise names
    the checkpoint in its store and says what it holds)."""

    name: str
    applied_sequence: int
    items: int
    bytes: int
    pause_ns: int
    write_ns: int

    def __str__(self) -> str:
        return self.name


def checkpoint_info(r: pb.CheckpointResponse) -> CheckpointInfo:
    return CheckpointInfo(r.name, r.applied_sequence, r.items, r.bytes, r.pause_ns, r.write_ns)
