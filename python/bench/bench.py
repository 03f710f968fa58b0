"""Python client vs Go client throughput, on one reprised.

Starts reprised (built with ``go build``) on a free port, then for each
workload runs the Go client (``reprisectl bench``) and the Python client the
same way (one client, same payloads, batch sizes and duration) and prints
both with their ratio (the Go client has one request in flight; the Python
sampler is measured with prefetch 1, the same, and with --prefetch). The two
take turns, --rounds times per workload, and each ratio is taken within a
round: the machine's speed drifts more between minutes than between clients.
The figures printed are the medians, with each round's ratio beside them:

  insert 400 B   one-step items of random float32s, uncompressed chunks,
                 64 items per message; items/s once JetStream acked them
  sample 400 B   batches of 256 from a table of 400 B items; items/s decoded
                 into stacked numpy arrays
  sample 40 kB   batches of 23 (about 1 MB per reply); bytes/s

    .venv/bin/python python/bench/bench.py [--duration 10] [--rounds 3] [--prefetch 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import reprise

REPO = Path(__file__).resolve().parents[2]


def build(out: Path, prebuilt: Path | None) -> dict[str, Path]:
    """reprised and reprisectl: those in prebuilt, or built into out."""
    bins = {}
    for pkg in ("./cmd/reprised", "./cmd/reprisectl"):
        name = Path(pkg).name
        if prebuilt is not None:
            bins[name] = prebuilt / name
            continue
        subprocess.run(["go", "build", "-o", str(out / name), pkg], cwd=REPO, check=True)
        bins[name] = out / name
    return bins


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, bins: dict[str, Path], work: Path) -> None:
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        work.mkdir(parents=True, exist_ok=True)
        cfg = work / "reprise.yaml"
        cfg.write_text("tables:\n  - name: replay\n    max_size: 200000\n")
        self.proc = subprocess.Popen(
            [str(bins["reprised"]), "--config", str(cfg), "--listen", f"127.0.0.1:{self.port}",
             "--store", str(work / "store"), "--checkpoint-every", "0s", "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with reprise.Client(self.url, connect_timeout=1) as c:
                    c.server_info(timeout=1)
                return
            except reprise.RepriseError:
                if time.monotonic() > deadline:
                    raise

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def go_bench(
    bins: dict[str, Path], url: str, mode: str, payload: int, batch: int, duration: float, warmup: float = 1.0
) -> dict[str, Any]:
    out = subprocess.run(
        [str(bins["reprisectl"]), "bench", "--nats", url, "--mode", mode, "--clients", "1", "--payload", str(payload),
         "--batch", str(batch), "--duration", f"{duration}s", "--warmup", f"{warmup}s", "--json"],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)


def py_insert(url: str, payload: int, batch: int, duration: float, warmup: float = 1.0) -> dict[str, float]:
    rng = np.random.default_rng(0)
    payloads = [rng.standard_normal(payload // 4).astype(np.float32) for _ in range(16)]
    with reprise.Client(url) as c:
        # Flush returns once JetStream stored the batch, as it does for
        # reprisectl bench's producers (WithReturnOnStore).
        w = c.trajectory_writer(
            1, compression="none", batch_items=batch, batch_bytes=max(256 << 10, batch * (payload + 256)),
            return_on_store=True,
        )
        warm_end = time.monotonic() + warmup
        n = 0
        start = None
        counted = 0
        while True:
            for i in range(batch):
                w.append({"payload": payloads[(n + i) % 16]})
                w.create_item("replay", 1.0, {"payload": w.history["payload"][-1]})
            w.flush(timeout=60)
            n += batch
            now = time.monotonic()
            if start is None and now >= warm_end:
                start, counted = now, 0
            elif start is not None:
                counted += batch
                if now - start >= duration:
                    break
        w.close()
        el = time.monotonic() - start
    return {"items_per_sec": counted / el, "bytes_per_sec": counted * payload / el}


def settle(url: str, payload: int) -> None:
    """Returns once the service applied everything inserted so far, so that
    the next measurement does not share it with a backlog: the inserts above
    return once JetStream stored them, and the service applies the stream in
    order, so one more item applied means all of them are."""
    with reprise.Client(url) as c:
        c.insert({"payload": np.zeros(payload // 4, dtype=np.float32)}, {"replay": 1.0}, timeout=120)


def py_sample(url: str, batch: int, duration: float, prefetch: int, warmup: float = 1.0) -> dict[str, float]:
    with reprise.Client(url) as c, c.sampler("replay", batch, prefetch=prefetch) as s:
        warm_end = time.monotonic() + warmup
        start = None
        items = nbytes = 0
        for b in s:
            now = time.monotonic()
            if start is None:
                if now >= warm_end:
                    start = now
                continue
            items += len(b)
            nbytes += b.data["payload"].nbytes
            if now - start >= duration:
                break
        assert start is not None  # a sampler without a timeout ends only at the break
        el = time.monotonic() - start
    return {"items_per_sec": items / el, "bytes_per_sec": nbytes / el}


class Workload:
    """One line of the table: each round's Go and Python figures."""

    def __init__(self, name: str, target: float) -> None:
        self.name = name
        self.target = target
        self.rounds: list[tuple[float, float]] = []

    def add(self, go: float, py: float) -> None:
        self.rounds.append((go, py))

    def summary(self) -> dict[str, Any]:
        ratios = [p / g for g, p in self.rounds]
        return {
            "workload": self.name,
            "go": statistics.median(g for g, _ in self.rounds),
            "python": statistics.median(p for _, p in self.rounds),
            "ratio": statistics.median(ratios),
            "rounds": [{"go": g, "python": p, "ratio": p / g} for g, p in self.rounds],
            "target": self.target,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds each client runs a workload in a round")
    ap.add_argument("--rounds", type=int, default=3, help="turns of the two clients per workload")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds each run is not counted at its start")
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--bin-dir", type=Path, help="reprised and reprisectl already built (default: go build)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    dur, warm, pf = args.duration, args.warmup, args.prefetch
    work = Path(tempfile.mkdtemp(prefix="reprise-pybench-"))
    try:
        bins = build(work, args.bin_dir)
        ins = Workload("insert 400 B, 64 per message (items/s)", 0.25)
        s400 = Workload("sample 400 B, batch 256 (items/s)", 0.5)
        s400pf = Workload(f"  ... Python prefetch={pf}", 0.5)
        s40k = Workload("sample 40 kB, batch 23 (MB/s)", 0.8)
        s40kpf = Workload(f"  ... Python prefetch={pf}", 0.8)
        srv = Server(bins, work / "a")
        try:
            for _ in range(args.rounds):
                # Each run starts once the service applied the runs before
                # it: a backlog would slow whichever client came next.
                g = go_bench(bins, srv.url, "insert", 400, 64, dur, warm)["items_per_sec"]
                settle(srv.url, 400)
                ins.add(g, py_insert(srv.url, 400, 64, dur, warm)["items_per_sec"])
                settle(srv.url, 400)
            for _ in range(args.rounds):
                g = go_bench(bins, srv.url, "sample", 400, 256, dur, warm)["items_per_sec"]
                s400.add(g, py_sample(srv.url, 256, dur, 1, warm)["items_per_sec"])
                s400pf.add(g, py_sample(srv.url, 256, dur, pf, warm)["items_per_sec"])
        finally:
            srv.stop()
        srv = Server(bins, work / "b")
        try:
            go_bench(bins, srv.url, "insert", 40000, 8, 3)
            settle(srv.url, 40000)
            for _ in range(args.rounds):
                g = go_bench(bins, srv.url, "sample", 40000, 23, dur, warm)["bytes_per_sec"] / 1e6
                s40k.add(g, py_sample(srv.url, 23, dur, 1, warm)["bytes_per_sec"] / 1e6)
                s40kpf.add(g, py_sample(srv.url, 23, dur, pf, warm)["bytes_per_sec"] / 1e6)
        finally:
            srv.stop()
        results = [w.summary() for w in (ins, s400, s400pf, s40k, s40kpf)]
        if args.json:
            print(json.dumps(results))
        else:
            print(f"{'workload':42} {'Go':>12} {'Python':>12} {'ratio':>7} {'target':>7}   each round")
            for r in results:
                each = " / ".join(f"{x['ratio']:.2f}" for x in r["rounds"])
                print(f"{r['workload']:42} {r['go']:12.1f} {r['python']:12.1f} {r['ratio']:7.2f} {r['target']:7.2f}   {each}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
