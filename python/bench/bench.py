"""Python client vs Go client throughput, on one reprised.

Starts reprised (built with ``go build``) on a free port, then for each
workload runs the Go client (``reprisectl bench``) and the Python client the
same way (one client, same payloads, batch sizes and duration) and prints
both with their ratio (the Go client has one request in flight; the Python
sampler is measured with prefetch 1, the same, and with --prefetch):

  insert 400 B   one-step items of random float32s, uncompressed chunks,
                 64 items per message; items/s once JetStream acked them
  sample 400 B   batches of 256 from a table of 400 B items; items/s decoded
                 into stacked numpy arrays
  sample 40 kB   batches of 23 (about 1 MB per reply); bytes/s

    .venv/bin/python python/bench/bench.py [--duration 10] [--prefetch 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import reprise

REPO = Path(__file__).resolve().parents[2]


def build(out: Path) -> dict[str, Path]:
    bins = {}
    for pkg in ("./cmd/reprised", "./cmd/reprisectl"):
        p = out / Path(pkg).name
        subprocess.run(["go", "build", "-o", str(p), pkg], cwd=REPO, check=True)
        bins[p.name] = p
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


def go_bench(bins: dict[str, Path], url: str, mode: str, payload: int, batch: int, duration: float) -> dict[str, Any]:
    out = subprocess.run(
        [str(bins["reprisectl"]), "bench", "--nats", url, "--mode", mode, "--clients", "1", "--payload", str(payload),
         "--batch", str(batch), "--duration", f"{duration}s", "--warmup", "1s", "--json"],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)


def py_insert(url: str, payload: int, batch: int, duration: float) -> dict[str, float]:
    rng = np.random.default_rng(0)
    payloads = [rng.standard_normal(payload // 4).astype(np.float32) for _ in range(16)]
    with reprise.Client(url) as c:
        # Flush returns once JetStream stored the batch, as it does for
        # reprisectl bench's producers (WithReturnOnStore).
        w = c.trajectory_writer(
            1, compression="none", batch_items=batch, batch_bytes=max(256 << 10, batch * (payload + 256)),
            return_on_store=True,
        )
        warm_end = time.monotonic() + 1.0
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


def py_sample(url: str, batch: int, duration: float, prefetch: int) -> dict[str, float]:
    with reprise.Client(url) as c, c.sampler("replay", batch, prefetch=prefetch) as s:
        warm_end = time.monotonic() + 1.0
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
        el = time.monotonic() - start
    return {"items_per_sec": items / el, "bytes_per_sec": nbytes / el}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="reprise-pybench-"))
    try:
        bins = build(work)
        results = []
        srv = Server(bins, work / "a")
        try:
            g = go_bench(bins, srv.url, "insert", 400, 64, args.duration)
            p = py_insert(srv.url, 400, 64, args.duration)
            results.append(("insert 400 B, 64 per message (items/s)", g["items_per_sec"], p["items_per_sec"], 0.25))
            settle(srv.url, 400)
            g = go_bench(bins, srv.url, "sample", 400, 256, args.duration)
            p1 = py_sample(srv.url, 256, args.duration, 1)
            p = py_sample(srv.url, 256, args.duration, args.prefetch)
            results.append(("sample 400 B, batch 256 (items/s)", g["items_per_sec"], p1["items_per_sec"], 0.5))
            results.append((f"  ... Python prefetch={args.prefetch}", g["items_per_sec"], p["items_per_sec"], 0.5))
        finally:
            srv.stop()
        srv = Server(bins, work / "b")
        try:
            go_bench(bins, srv.url, "insert", 40000, 8, 3)
            settle(srv.url, 40000)
            g = go_bench(bins, srv.url, "sample", 40000, 23, args.duration)
            p1 = py_sample(srv.url, 23, args.duration, 1)
            p = py_sample(srv.url, 23, args.duration, args.prefetch)
            results.append(("sample 40 kB, batch 23 (MB/s)", g["bytes_per_sec"] / 1e6, p1["bytes_per_sec"] / 1e6, 0.8))
            results.append((f"  ... Python prefetch={args.prefetch}", g["bytes_per_sec"] / 1e6, p["bytes_per_sec"] / 1e6, 0.8))
        finally:
            srv.stop()
        if args.json:
            print(json.dumps([{"workload": w, "go": g, "python": p, "ratio": p / g, "target": t} for w, g, p, t in results]))
        else:
            print(f"{'workload':42} {'Go':>12} {'Python':>12} {'ratio':>7} {'target':>7}")
            for w, g, p, t in results:
                print(f"{w:42} {g:12.1f} {p:12.1f} {p / g:7.2f} {t:7.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
