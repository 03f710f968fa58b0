"""Server info and checkpoint results."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
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
    #: The total weight the sampler draws by, ``weight_fraction *
    #: 2**weight_exponent`` (fraction in [0.5, 1), or both 0): the sum of
    #: priority**exponent for a prioritized sampler, the item count for every
    #: other. As a pair it holds totals beyond a float's range; see
    #: :attr:`weight`.
    weight_fraction: float = 0.0
    weight_exponent: int = 0

    @property
    def weight(self) -> float:
        """The total weight as a float: inf beyond its range, 0 below it."""
        return weight_float(self.weight_fraction, self.weight_exponent)

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
        weight_fraction=t.weight_fraction,
        weight_exponent=t.weight_exponent,
    )


def weight_float(fraction: float, exponent: int) -> float:
    """fraction * 2**exponent as a float: inf beyond its range, 0 below it."""
    if fraction == 0.0 or exponent < -1100:
        return 0.0
    if exponent > 1100:
        return math.inf
    try:
        return math.ldexp(fraction, exponent)
    except OverflowError:
        return math.inf


#: Weights more than this many binary orders below the largest of a sum are
#: left out of it: their share is below 2**-4096, far below what the service
#: itself keeps (it leaves out bands below 2**-1536 of a table's total).
_SUM_SPAN = 4096


def add_weights(weights: Iterable[tuple[float, int]]) -> tuple[float, int]:
    """The sum of weights given as (fraction, exponent) pairs, as a pair
    again, correctly rounded: the mantissas are added as integers, so no
    term is lost to rounding or overflow on the way."""
    # A fraction outside [0.5, 1) (NaN, inf, a hostile reply's) is no weight.
    terms = [(f, e) for f, e in weights if 0.5 <= f < 1.0 and abs(e) <= 1 << 61]
    if not terms:
        return 0.0, 0
    top = max(e for _, e in terms)
    low = top - _SUM_SPAN - 53  # the exponent of the integer sum's unit
    total = 0
    for f, e in terms:
        if e - 53 >= low:
            # f has 53 significant bits: f * 2**53 is an exact integer.
            total += int(math.ldexp(f, 53)) << (e - 53 - low)
    # Integer true division rounds correctly; keep the quotient in range.
    shift = max(0, total.bit_length() - 1000)
    frac, exp = math.frexp(total / (1 << shift))
    return frac, exp + shift + low


def aggregate_tables(infos: Sequence[TableInfo]) -> TableInfo:
    """One table spread over shards as one TableInfo: the config of the
    first shard, sizes, capacities, counters and weights summed, versions
    spanned (the lowest item version over the shards holding items)."""
    first = infos[0]
    held = [t for t in infos if t.current_size > 0]
    lims = [t.rate_limiter_info for t in infos]
    frac, exp = add_weights((t.weight_fraction, t.weight_exponent) for t in infos)
    return dataclasses.replace(
        first,
        max_size=sum(t.max_size for t in infos),
        rate_limiter_info=dataclasses.replace(
            first.rate_limiter_info,
            inserts=sum(lim.inserts for lim in lims),
            samples=sum(lim.samples for lim in lims),
            deletes=sum(lim.deletes for lim in lims),
        ),
        current_size=sum(t.current_size for t in infos),
        bytes_held=sum(t.bytes_held for t in infos),
        num_inserts=sum(t.num_inserts for t in infos),
        num_samples=sum(t.num_samples for t in infos),
        num_deletes=sum(t.num_deletes for t in infos),
        num_evictions=sum(t.num_evictions for t in infos),
        insert_waits=sum(t.insert_waits for t in infos),
        sample_waits=sum(t.sample_waits for t in infos),
        policy_version=max(t.policy_version for t in infos),
        min_item_version=min((t.min_item_version for t in held), default=0),
        max_item_version=max((t.max_item_version for t in held), default=0),
        num_stale_evictions=sum(t.num_stale_evictions for t in infos),
        num_episodes=sum(t.num_episodes for t in infos),
        num_deleted_episodes=sum(t.num_deleted_episodes for t in infos),
        num_unique_samples=sum(t.num_unique_samples for t in infos),
        weight_fraction=frac,
        weight_exponent=exp,
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
