"""The differential harness's scenarios: one table each and the operations
applied to it, as JSON-ready dicts that every runner (Reverb, the Go engine,
reprised) reads the same way.

A scenario is ``{"name", "seed", "table", "ops", "random"}``:

- ``table``: ``sampler`` and ``remover`` (``{"kind", "exponent"}``),
  ``max_size``, ``max_times_sampled`` and ``limiter`` (``preset`` min_size,
  sample_to_insert_ratio, queue or custom, with its parameters).
- ``ops``: ``insert`` (id, priority, optional timeout_ms), ``sample`` (n,
  optional timeout_ms), ``mutate`` (updates [[id, priority]...], deletes
  [id...]), ``reset``, ``info``, ``contents`` and ``dist`` (n samples whose
  per-item counts are compared statistically).
- ``random``: the sampler is random, so the items a sample returns are not
  compared one by one, only through ``dist``; ``random_remover``: the
  remover is, so which items a table holds is compared by number only.

Items are named by ids: the engine uses the id as the key, the other runners
put it in the item's data and map the keys they get back to it. Numbers JSON
cannot spell are strings: "nan", "inf", "-inf".
"""

from __future__ import annotations

import sys
from typing import Any

Json = dict[str, Any]

SELECTORS = ("fifo", "lifo", "uniform", "prioritized", "max_heap", "min_heap")
RANDOM = ("uniform", "prioritized")
DBL_MAX = sys.float_info.max


def sel(kind: str, exponent: float | str | None = None) -> Json:
    out: Json = {"kind": kind}
    if kind == "prioritized":
        out["exponent"] = 1.0 if exponent is None else exponent
    return out


def min_size(k: int = 1) -> Json:
    return {"preset": "min_size", "min_size": k}


def ratio(spi: float, k: int, eb: float | str) -> Json:
    return {"preset": "sample_to_insert_ratio", "spi": spi, "min_size": k, "error_buffer": eb}


def custom(spi: float, k: int, lo: float | str, hi: float | str) -> Json:
    return {"preset": "custom", "spi": spi, "min_size": k, "min_diff": lo, "max_diff": hi}


def queue(size: int) -> Json:
    return {"preset": "queue", "size": size}


def table(
    sampler: Json, remover: Json, max_size: int = 10, limiter: Json | None = None, max_times_sampled: int = 0
) -> Json:
    return {
        "sampler": sampler,
        "remover": remover,
        "max_size": max_size,
        "max_times_sampled": max_times_sampled,
        "limiter": limiter or min_size(1),
    }


def ins(i: int, p: float | str = 1.0, timeout_ms: int = 5000) -> Json:
    """An insert; every insert has a timeout, so that one the limiter holds
    unexpectedly cannot hang a runner."""
    return {"op": "insert", "id": i, "priority": p, "timeout_ms": timeout_ms}


def smp(n: int = 1, timeout_ms: int = 0) -> Json:
    op: Json = {"op": "sample", "n": n}
    if timeout_ms:
        op["timeout_ms"] = timeout_ms
    return op


def mut(updates: list[tuple[int, float | str]] | None = None, deletes: list[int] | None = None) -> Json:
    return {"op": "mutate", "updates": [list(u) for u in updates or []], "deletes": deletes or []}


INFO: Json = {"op": "info"}
CONTENTS: Json = {"op": "contents"}
RESET: Json = {"op": "reset"}


def dist(n: int) -> Json:
    return {"op": "dist", "n": n}


def scenario(name: str, tbl: Json, ops: list[Json], seed: int = 1) -> Json:
    return {
        "name": name,
        "seed": seed,
        "table": tbl,
        "ops": ops,
        "random": tbl["sampler"]["kind"] in RANDOM,
        "random_remover": tbl["remover"]["kind"] in RANDOM,
    }


def selector_scenarios() -> list[Json]:
    out = []
    # Distinct priorities, inserted out of order, so that every selector's
    # choice is visible; ties (ids 5 and 6) test the heaps' tie order.
    prios = [(1, 3.0), (2, 1.0), (3, 4.0), (4, 2.0), (5, 5.0), (6, 5.0)]
    for kind in SELECTORS:
        ops = [ins(i, p) for i, p in prios]
        if kind in RANDOM:
            ops += [CONTENTS, dist(20000), INFO]
        else:
            ops += [smp(3), CONTENTS, mut([(2, 9.0)]), smp(2), INFO]
        out.append(scenario(f"sampler_{kind}", table(sel(kind), sel("fifo")), ops))
        # As a remover: a table of 3 evicts on every insert past the third;
        # the new item can be its own victim (min_heap, lowest priority).
        rops = [ins(i, p) for i, p in prios[:3]] + [CONTENTS]
        for i, p in prios[3:]:
            rops += [ins(i, p), CONTENTS]
        rops += [ins(7, 0.5), CONTENTS, INFO]
        out.append(scenario(f"remover_{kind}", table(sel("fifo"), sel(kind), max_size=3), rops))
    return out


def max_times_sampled_scenarios() -> list[Json]:
    out = []
    for mts in (1, 2, 0, -1, -5):
        ops = [ins(1), ins(2), ins(3), ins(4), smp(2), CONTENTS, smp(1), CONTENTS, INFO]
        out.append(scenario(f"max_times_sampled_{mts}", table(sel("fifo"), sel("fifo"), max_times_sampled=mts), ops))
    out.append(
        scenario("max_size_1", table(sel("fifo"), sel("fifo"), max_size=1), [ins(1), ins(2), ins(3), CONTENTS, INFO])
    )
    return out


def limiter_scenarios() -> list[Json]:
    """Each limiter at the edges of its inequality. A refused insert comes
    last, or is followed only by what its staying pending (Reverb) or not
    (the engine) does not change, except in insert_timeout_then_room, which
    shows the difference."""
    fifo = sel("fifo")
    no = 200  # the timeout of an operation the limiter refuses
    return [
        scenario(
            "min_size_edge",
            table(fifo, fifo, limiter=min_size(3)),
            [ins(1), ins(2), smp(1, timeout_ms=no), ins(3), smp(1), INFO],
        ),
        scenario(
            "min_size_after_delete",
            table(fifo, fifo, limiter=min_size(2)),
            [ins(1), ins(2), smp(1), mut(deletes=[1]), smp(1, timeout_ms=no), ins(3), smp(1), INFO],
        ),
        # spi 2, min size 2, error buffer 3: min_diff 1, max_diff 7.
        scenario(
            "ratio_edges",
            table(fifo, fifo, limiter=ratio(2.0, 2, 3.0)),
            [ins(1), ins(2), ins(3), smp(5), smp(1, timeout_ms=no), INFO, ins(4), ins(5), ins(6), ins(7, timeout_ms=no), INFO],
        ),
        # spi 0.5, min size 1, error buffer 1: min_diff -0.5, max_diff 1.5.
        scenario(
            "ratio_fractional",
            table(fifo, fifo, limiter=ratio(0.5, 1, 1.0)),
            [ins(1), ins(2), ins(3), smp(1), smp(1, timeout_ms=no), INFO, ins(4), ins(5), ins(6, timeout_ms=no), INFO],
        ),
        scenario(
            "queue_preset",
            table(fifo, fifo, max_size=3, limiter=queue(3), max_times_sampled=1),
            [
                smp(1, timeout_ms=no), ins(1), ins(2), ins(3), CONTENTS, smp(2), CONTENTS, ins(4), ins(5),
                smp(3), smp(1, timeout_ms=no), ins(6), ins(7), ins(8), ins(9, timeout_ms=no), INFO,
            ],
        ),
        scenario(
            "stack_preset",
            table(sel("lifo"), sel("lifo"), max_size=3, limiter=queue(3), max_times_sampled=1),
            [ins(1), ins(2), ins(3), CONTENTS, smp(2), CONTENTS, ins(4), ins(5), ins(6, timeout_ms=no), INFO],
        ),
        scenario(
            "custom_window",
            table(fifo, fifo, limiter=custom(1.0, 1, 0.0, 2.0)),
            [ins(1), ins(2), smp(2), smp(1, timeout_ms=no), ins(3), ins(4), ins(5, timeout_ms=no), INFO],
        ),
        # Refused while the limiter holds it: Reverb keeps the insert pending
        # and makes it once a sample makes room.
        scenario(
            "insert_timeout_then_room",
            table(fifo, fifo, limiter=custom(1.0, 1, 0.0, 1.0)),
            [ins(1), ins(2, timeout_ms=no), smp(1), INFO, CONTENTS],
        ),
    ]


def config_scenarios() -> list[Json]:
    fifo = sel("fifo")
    out = [
        ("config_min_size_above_max_size", table(fifo, fifo, max_size=2, limiter=min_size(5)), [ins(1), ins(2), INFO]),
        ("config_min_diff_above_max_diff", table(fifo, fifo, limiter=custom(1.0, 1, 2.0, 1.0)), [ins(1), INFO]),
        ("config_queue_negative", table(fifo, fifo, limiter=queue(-1), max_times_sampled=1), [ins(1, timeout_ms=200), INFO]),
        ("config_exponent_negative", table(sel("prioritized", -1.0), fifo), [ins(1, 2.0), ins(2, 1.0), CONTENTS]),
        ("config_exponent_nan", table(sel("prioritized", "nan"), fifo), [ins(1, 2.0), CONTENTS]),
        ("config_error_buffer_nan", table(fifo, fifo, limiter=ratio(1.0, 1, "nan")), [ins(1), smp(1, timeout_ms=200), INFO]),
        ("config_error_buffer_inf", table(fifo, fifo, limiter=ratio(1.0, 1, "inf")), [ins(1), ins(2), smp(1), INFO]),
        ("config_ratio_buffer_too_small", table(fifo, fifo, limiter=ratio(2.0, 1, 1.0)), [ins(1), INFO]),
        ("config_min_size_zero", table(fifo, fifo, limiter=min_size(0)), [ins(1), INFO]),
        ("config_max_size_zero", table(fifo, fifo, max_size=0), [ins(1), INFO]),
    ]
    return [scenario(n, t, o) for n, t, o in out]


def mutate_scenarios() -> list[Json]:
    heap = sel("max_heap")
    base = [ins(1, 1.0), ins(2, 2.0), ins(3, 3.0)]
    return [
        scenario("mutate_missing_keys", table(heap, sel("fifo")), base + [mut([(99, 5.0)], [98]), CONTENTS, INFO]),
        scenario(
            "mutate_delete_then_update_same_key",
            table(heap, sel("fifo")),
            base + [mut([(1, 9.0)], [1]), CONTENTS, smp(1), INFO],
        ),
        scenario("mutate_delete_twice", table(heap, sel("fifo")), base + [mut(deletes=[2, 2]), CONTENTS, INFO]),
        scenario(
            "mutate_update_order",
            table(heap, sel("fifo")),
            base + [mut([(1, 3.0)]), smp(1), mut([(3, 0.5), (2, 0.5)]), smp(1), CONTENTS],
        ),
        scenario("mutate_invalid_priority", table(heap, sel("fifo")), base + [mut([(1, -1.0), (2, 7.0)]), CONTENTS]),
    ]


def reset_scenarios() -> list[Json]:
    fifo = sel("fifo")
    return [
        scenario(
            "reset_counters",
            table(fifo, fifo, limiter=min_size(1)),
            [ins(1), ins(2), smp(3), mut(deletes=[1]), INFO, RESET, INFO, CONTENTS, ins(3), smp(1), INFO],
        ),
        scenario(
            "reset_ratio_limiter",
            table(fifo, fifo, limiter=ratio(1.0, 1, 2.0)),
            [ins(1), ins(2), ins(3), INFO, RESET, INFO, ins(4), ins(5), ins(6), ins(7, timeout_ms=200), INFO],
        ),
        scenario(
            "info_through_life",
            table(fifo, fifo, max_size=2, max_times_sampled=2),
            [INFO, ins(1), INFO, ins(2), ins(3), INFO, smp(3), INFO, mut(deletes=[3]), INFO],
        ),
    ]


def priority_scenarios() -> list[Json]:
    """Priorities at float64's limits, through the prioritized sampler."""

    def prio(name: str, exponent: float | str, prios: list[float | str], n: int = 20000) -> Json:
        ops = [ins(i + 1, p) for i, p in enumerate(prios)] + [CONTENTS, dist(n)]
        return scenario(name, table(sel("prioritized", exponent), sel("fifo")), ops)

    sub = 5e-324
    return [
        prio("prio_zero_exponent_zero", 0.0, [0.0, 1.0, 2.0, 0.0]),
        prio("prio_zero_exponent_one", 1.0, [0.0, 1.0, 3.0]),
        prio("prio_all_zero", 1.0, [0.0, 0.0, 0.0]),
        prio("prio_all_zero_exponent_zero", 0.0, [0.0, 0.0]),
        prio("prio_subnormal", 1.0, [sub, 2 * sub, 3e-320]),
        prio("prio_subnormal_mixed", 1.0, [sub, 1e-310, 2e-310]),
        prio("prio_subnormal_weight", 2.0, [1e-160, 3e-160]),
        prio("prio_subnormal_exponent_1_5", 1.5, [sub, 2 * sub]),
        prio("prio_underflowing_weight", 2.0, [1e-200, 2e-200]),
        prio("prio_huge", 1.0, [1e308, 5e307]),
        prio("prio_sum_overflows", 1.0, [1e308, 1e308, 1.7e308]),
        prio("prio_power_overflows", 1.5, [1e300, 1e200, 1.0]),
        prio("prio_exponent_half", 0.5, [1.0, 4.0, 9.0, 16.0]),
        scenario(
            "prio_invalid",
            table(sel("prioritized", 1.0), sel("fifo")),
            [ins(1, 1.0), ins(2, -1.0), ins(3, "nan"), ins(4, "inf"), ins(5, "-inf"), CONTENTS],
        ),
        scenario(
            "fifo_invalid_priority",
            table(sel("fifo"), sel("fifo")),
            [ins(1, 1.0), ins(2, -1.0), ins(3, "inf"), CONTENTS],
        ),
    ]


def all_scenarios() -> list[Json]:
    """Every scenario, with distinct names."""
    out = (
        selector_scenarios()
        + max_times_sampled_scenarios()
        + limiter_scenarios()
        + config_scenarios()
        + mutate_scenarios()
        + reset_scenarios()
        + priority_scenarios()
    )
    names = [s["name"] for s in out]
    assert len(names) == len(set(names)), "scenario names must be unique"
    return out


if __name__ == "__main__":
    import json

    json.dump(all_scenarios(), sys.stdout, indent=1)
