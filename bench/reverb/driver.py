#!/usr/bin/env python3
"""Runs the workloads of Reprise's benchmark suite against DeepMind Reverb.

The suite (go run ./bench/suite --reverb) writes a JSON spec of the same
workloads it runs on Reprise and starts, in the virtual environment that
bench/reverb/setup.sh creates:

    python bench/reverb/driver.py --spec SPEC.json

By hand, without a spec, the flags pick a small run:

    python bench/reverb/driver.py --payloads 400 --clients 1,4 --duration 1

The Reverb server runs in a child process and listens on a loopback port:
in the process of its clients Reverb would skip gRPC. The clients are
threads of this process, each with its own reverb.Client (its own gRPC
channel); Reverb's C++ core releases the GIL while it waits.

Results go to stdout as one JSON object per line, each with a "kind":
version, throughput, mixed, latency, memory. Progress goes to stderr.
"""

import argparse
import importlib.metadata
import json
import multiprocessing
import os
import queue
import sys
import threading
import time

import numpy as np
import reverb

NUM_INFO_TENSORS = 5  # key, probability, table_size, priority, times_sampled


def log(*args):
    print("reverb driver:", *args, file=sys.stderr, flush=True)


def emit(kind, **fields):
    print(json.dumps({"kind": kind, **fields}), flush=True)


# --- the server, in a child process --------------------------------------


def make_table(t):
    if t["kind"] == "queue":
        return reverb.Table.queue(t["name"], t["max_size"])
    limiter = reverb.rate_limiters.MinSize(1)
    if t["kind"] == "ratio":
        limiter = reverb.rate_limiters.SampleToInsertRatio(
            samples_per_insert=t["samples_per_insert"],
            min_size_to_sample=t["min_size"],
            error_buffer=t["error_buffer"],
        )
    return reverb.Table(
        name=t["name"],
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        max_size=t["max_size"],
        rate_limiter=limiter,
    )


def serve(tables, conn):
    server = reverb.Server(tables=[make_table(t) for t in tables])
    conn.send(server.port)
    conn.recv()  # anything, or EOF when the parent dies, stops the server
    server.stop()


class Server:
    """A Reverb server in a child process, stopped on exit."""

    def __init__(self, tables):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(tables, child), daemon=True)
        self.process.start()
        if not self._conn.poll(120):
            self.process.kill()
            raise RuntimeError("the Reverb server did not start within 120s")
        self.address = "localhost:%d" % self._conn.recv()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self._conn.send("stop")
        except OSError:
            pass
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    def rss(self):
        with open("/proc/%d/status" % self.process.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS for the Reverb server")

    def settled_rss(self, limit):
        """Resident memory once it moves less than 1% over four readings."""
        deadline = time.monotonic() + limit
        prev, steady = self.rss(), 0
        while steady < 4 and time.monotonic() < deadline:
            time.sleep(0.25)
            cur = self.rss()
            steady = steady + 1 if abs(cur - prev) * 100 <= prev else 0
            prev = cur
        return prev


# --- measurement ----------------------------------------------------------


class Counter:
    """Counts operations that end inside [start, end]."""

    def __init__(self, warmup, duration):
        self.start = time.perf_counter() + warmup
        self.end = self.start + duration
        self._lock = threading.Lock()
        self.items = 0
        self.bytes = 0
        self.latencies = []

    def record(self, t0, t1, items, nbytes):
        if not self.start <= t1 <= self.end:
            return
        with self._lock:
            self.items += items
            self.bytes += nbytes
            self.latencies.append(t1 - t0)

    def result(self):
        secs = self.end - self.start
        lat = sorted(self.latencies)

        def q(p):
            return lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3 if lat else 0.0

        return {
            "items_per_sec": self.items / secs,
            "bytes_per_sec": self.bytes / secs,
            "p50_ms": q(0.5),
            "p99_ms": q(0.99),
        }


def run_threads(n, target):
    """Runs target(i) on n threads and re-raises the first failure."""
    errors = []

    def wrap(i):
        try:
            target(i)
        except Exception as e:  # reported below, with the thread's number
            errors.append("client %d: %r" % (i, e))

    threads = [threading.Thread(target=wrap, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))


def payloads(seed, nbytes):
    rng = np.random.default_rng(seed)
    return [rng.random(nbytes // 4, dtype=np.float32) for _ in range(8)]


def insert_loop(address, table, nbytes, batch, counter, seed, keep_going):
    """Appends steps and creates one item per step, flushing every batch,
    as reprisectl bench's inserters do, while keep_going() is true."""
    client = reverb.Client(address)
    data = payloads(seed, nbytes)
    with client.trajectory_writer(num_keep_alive_refs=1) as w:
        step = 0
        while keep_going():
            t0 = time.perf_counter()
            for _ in range(batch):
                w.append({"payload": data[step % len(data)]})
                w.create_item(table, 1.0, w.history["payload"][-1])
                step += 1
            w.flush()
            counter.record(t0, time.perf_counter(), batch, batch * nbytes)


def sample_loop(address, table, batch, counter, keep_going):
    """Takes batch items at a time from one sampler that keeps batch items
    in flight, while keep_going() is true."""
    client = reverb.Client(address)
    # Client.sample() makes a sampler per call with one item in flight;
    # a learner keeps one open, as Reverb's datasets do.
    sampler = client._client.NewSampler(table, -1, batch)
    try:
        while keep_going():
            t0 = time.perf_counter()
            nbytes = 0
            for _ in range(batch):
                sample = sampler.GetNextTrajectory()
                nbytes += sum(col.nbytes for col in sample[NUM_INFO_TENSORS:])
            counter.record(t0, time.perf_counter(), batch, nbytes)
    finally:
        del sampler


def fill(address, table, items, nbytes, clients=4):
    def one(i):
        client = reverb.Client(address)
        data = payloads(100 + i, nbytes)
        n = items // clients + (1 if i < items % clients else 0)
        with client.trajectory_writer(num_keep_alive_refs=1) as w:
            for k in range(n):
                w.append({"payload": data[k % len(data)]})
                w.create_item(table, 1.0, w.history["payload"][-1])
                if k % 256 == 255:
                    w.flush()
            w.flush()

    run_threads(clients, one)


# --- the workloads --------------------------------------------------------


def bench_table(payload):
    return "bench_%d" % payload


def throughput(spec):
    tables = [
        {"name": bench_table(p), "kind": "uniform", "max_size": spec["table_size"][str(p)]}
        for p in spec["payloads"]
    ]
    with Server(tables) as server:
        for payload in spec["payloads"]:
            for mode in ("insert", "sample"):
                batch = spec["insert_batch" if mode == "insert" else "sample_batch"][str(payload)]
                for clients in spec["clients"]:
                    load1 = os.getloadavg()[0]
                    c = Counter(spec["warmup_sec"], spec["duration_sec"])

                    def running():
                        return time.perf_counter() < c.end

                    if mode == "insert":
                        run_threads(clients, lambda i: insert_loop(
                            server.address, bench_table(payload), payload, batch, c, i, running))
                    else:
                        run_threads(clients, lambda i: sample_loop(
                            server.address, bench_table(payload), batch, c, running))
                    r = c.result()
                    log("%s %d B, %d clients: %.0f items/s" % (mode, payload, clients, r["items_per_sec"]))
                    emit("throughput", mode=mode, payload_bytes=payload, clients=clients, batch=batch, load1=load1, **r)


def mixed(spec):
    m = spec["mixed"]
    table = {"name": "mixed", "kind": "ratio", "max_size": m["max_size"],
             "samples_per_insert": m["samples_per_insert"], "min_size": m["min_size"],
             "error_buffer": m["error_buffer"]}
    with Server([table]) as server:
        for clients in m["clients"]:
            reverb.Client(server.address).reset("mixed")
            ins = Counter(spec["warmup_sec"], spec["duration_sec"])
            smp = Counter(spec["warmup_sec"], spec["duration_sec"])
            inserters_done = threading.Event()

            def insert_until_end():
                return time.perf_counter() < ins.end

            # Learners go on past the end until every actor has flushed:
            # the limiter holds the actors' last items until they are
            # sampled.
            def sample_until_actors_done():
                return time.perf_counter() < smp.end or not inserters_done.is_set()

            learners = threading.Thread(target=run_threads, args=(clients, lambda i: sample_loop(
                server.address, "mixed", m["batch"], smp, sample_until_actors_done)), daemon=True)
            learners.start()
            run_threads(clients, lambda i: insert_loop(
                server.address, "mixed", m["payload"], m["batch"], ins, i, insert_until_end))
            inserters_done.set()
            # A learner waiting for an insert that no actor will make is
            # released by these.
            drain = reverb.Client(server.address)
            data = payloads(999, m["payload"])
            with drain.trajectory_writer(num_keep_alive_refs=1) as w:
                while learners.is_alive():
                    w.append({"payload": data[0]})
                    w.create_item("mixed", 1.0, w.history["payload"][-1])
                    try:
                        w.flush(timeout_ms=200)
                    except reverb.errors.DeadlineExceededError:
                        pass
                    learners.join(0.01)
            ri, rs = ins.result(), smp.result()
            achieved = rs["items_per_sec"] / ri["items_per_sec"] if ri["items_per_sec"] else 0.0
            log("mixed %d B, %d clients: %.0f inserts/s, %.0f samples/s" % (m["payload"], clients, ri["items_per_sec"], rs["items_per_sec"]))
            emit("mixed", payload_bytes=m["payload"], clients=clients, batch=m["batch"],
                 samples_per_insert=m["samples_per_insert"],
                 insert_items_per_sec=ri["items_per_sec"], sample_items_per_sec=rs["items_per_sec"],
                 achieved_samples_per_insert=achieved, insert_p50_ms=ri["p50_ms"], sample_p50_ms=rs["p50_ms"])


def latency(spec):
    lat = spec["latency"]
    nbytes = lat["payload"]
    tables = [
        {"name": bench_table(nbytes), "kind": "uniform", "max_size": spec["table_size"][str(nbytes)]},
        {"name": "latency", "kind": "queue", "max_size": 1000},
    ]
    with Server(tables) as server:
        fill(server.address, bench_table(nbytes), 1000, nbytes, clients=1)
        client = reverb.Client(server.address)
        # Single-item samples through the public API, one request each.
        samples = []
        end = time.perf_counter() + spec["warmup_sec"] + lat["duration_sec"]
        warm = time.perf_counter() + spec["warmup_sec"]
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            got = list(client.sample(bench_table(nbytes), num_samples=1, emit_timesteps=False))
            t1 = time.perf_counter()
            if len(got) != 1:
                raise RuntimeError("sampled %d items, want 1" % len(got))
            if t1 >= warm:
                samples.append(t1 - t0)

        # Insert to sampled: a learner waits on the queue table.
        arrived = queue.Queue()
        stop = threading.Event()

        def learner():
            sampler = reverb.Client(server.address)._client.NewSampler("latency", -1, 1)
            while not stop.is_set():
                s = sampler.GetNextTrajectory()
                arrived.put((time.perf_counter(), float(s[NUM_INFO_TENSORS][0])))
            del sampler

        t = threading.Thread(target=learner, daemon=True)
        t.start()
        v = payloads(3, nbytes)[0].copy()
        sampled, durable = [], []
        with client.trajectory_writer(num_keep_alive_refs=1) as w:
            for i in range(lat["inserts"]):
                v[0] = i
                t0 = time.perf_counter()
                w.append({"payload": v})
                w.create_item("latency", 1.0, w.history["payload"][-1])
                w.flush()
                durable.append(time.perf_counter() - t0)
                at, got = arrived.get(timeout=10)
                if got != i:
                    raise RuntimeError("the learner got item %r, want %d" % (got, i))
                sampled.append(at - t0)
            stop.set()
            w.append({"payload": v})  # releases the learner's last request
            w.create_item("latency", 1.0, w.history["payload"][-1])
            w.flush()
        t.join(10)

    def pct(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))] * 1e6

    log("latency: sample p50 %.0f us, insert to sampled p50 %.0f us" % (pct(samples, 0.5), pct(sampled, 0.5)))
    emit("latency", sample_p50_us=pct(samples, 0.5), sample_p99_us=pct(samples, 0.99),
         insert_to_sampled_p50_us=pct(sampled, 0.5), insert_to_sampled_p99_us=pct(sampled, 0.99),
         insert_to_durable_p50_us=pct(durable, 0.5), insert_to_durable_p99_us=pct(durable, 0.99))


def memory(spec):
    for series in spec["memory"]:
        with Server([{"name": "mem", "kind": "uniform", "max_size": 10_000_000}]) as server:
            base = server.settled_rss(spec["settle_sec"])
            client = reverb.Client(server.address)
            held = 0
            for items in series["items"]:
                fill(server.address, "mem", items - held, series["payload_bytes"])
                held = items
                size = client.server_info()["mem"].current_size
                if size != held:
                    raise RuntimeError("table mem holds %d items after a fill of %d" % (size, held))
                rss = server.settled_rss(spec["settle_sec"])
                log("memory %s: %d items, rss %.1f MB" % (series["name"], size, rss / 1e6))
                emit("memory", series=series["name"], payload_bytes=series["payload_bytes"], items=size,
                     payload_bytes_held=size * series["payload_bytes"], rss_bytes=rss, base_rss_bytes=base)


def insert_batch(payload):
    """64, halved until 64 clients have at most 64 MiB unflushed, as the
    suite does."""
    b = 64
    while b > 1 and 64 * b * payload > 64 << 20:
        b //= 2
    return b


def default_spec(args):
    payloads_ = [int(p) for p in args.payloads.split(",")]
    sizes = sorted(set(payloads_ + [400, 4000]))
    return {
        "payloads": payloads_,
        "clients": [int(c) for c in args.clients.split(",")],
        "warmup_sec": args.warmup,
        "duration_sec": args.duration,
        "insert_batch": {str(p): insert_batch(p) for p in sizes},
        "sample_batch": {str(p): min(256, max(1, (900 << 10) // p)) for p in sizes},
        "table_size": {str(p): min(100000, max(100, (200 << 20) // p)) for p in sizes},
        "mixed": {"payload": 4000, "clients": [2], "batch": 64, "samples_per_insert": 4,
                  "min_size": 1000, "error_buffer": 4096, "max_size": 100000},
        "latency": {"payload": 400, "duration_sec": args.duration, "inserts": 200},
        "memory": [{"name": "payload", "payload_bytes": 4000, "items": [5000]}],
        "settle_sec": 3,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", help="JSON spec written by bench/suite")
    ap.add_argument("--payloads", default="400", help="comma-separated payload bytes (without --spec)")
    ap.add_argument("--clients", default="1,4", help="comma-separated client counts (without --spec)")
    ap.add_argument("--warmup", type=float, default=0.25, help="seconds (without --spec)")
    ap.add_argument("--duration", type=float, default=1.0, help="seconds per point (without --spec)")
    ap.add_argument("--sections", default="throughput,mixed,latency,memory",
                    help="comma-separated sections to run")
    args = ap.parse_args()
    if args.spec:
        with open(args.spec) as f:
            spec = json.load(f)
    else:
        spec = default_spec(args)
    emit("version", version="dm-reverb %s, tensorflow %s" % (
        importlib.metadata.version("dm-reverb"), importlib.metadata.version("tensorflow")))
    sections = {"throughput": throughput, "mixed": mixed, "latency": latency, "memory": memory}
    for name in args.sections.split(","):
        if name not in sections:
            ap.error("unknown section %r: want some of %s" % (name, ", ".join(sections)))
        sections[name](spec)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    # Reverb's sampler threads can outlive their Python objects; do not
    # wait for them at interpreter exit.
    os._exit(0)
