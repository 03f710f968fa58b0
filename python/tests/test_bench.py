"""python/bench/bench.py, the Python-against-Go comparison, still runs and
reports each round."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench.py"


def test_bench_takes_turns_and_reports_each_round(binaries: dict[str, Path]) -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--duration", "0.3", "--warmup", "0.1", "--rounds", "2", "--prefetch", "2",
         "--json", "--bin-dir", str(binaries["reprisectl"].parent)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout)
    assert [r["workload"].split(",")[0] for r in results] == [
        "insert 400 B", "sample 400 B", "  ... Python prefetch=2", "sample 40 kB", "  ... Python prefetch=2"]
    for r in results:
        assert len(r["rounds"]) == 2, r
        for each in r["rounds"]:
            assert each["go"] > 0 and each["python"] > 0
            assert each["ratio"] == each["python"] / each["go"]
        ratios = sorted(each["ratio"] for each in r["rounds"])
        assert r["ratio"] == (ratios[0] + ratios[1]) / 2  # the median of two
