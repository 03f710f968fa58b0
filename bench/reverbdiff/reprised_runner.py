"""Applies the harness's scenarios to reprised end to end, through the
Python client, and prints what it observed in the Reverb runner's form
(JSON lines: {"start"}, {"obs"} per operation, {"end"}). Runs in a Python
with reprise installed; REPRISED_BIN names a reprised binary (run.py builds
one).

Each scenario gets its own reprised (a fresh store, a free loopback port)
with the scenario's table as its only table; a config reprised refuses is
the scenario's creation error.

The public client lacks two things the harness needs, so it uses the
client's request helper (reprise.aio internals) for them: listing a table's
items (<prefix>.api.items, which reprisectl and the client do not offer)
and waiting until the service has applied a mutation (the publish's stream
sequence against info's applied_sequence). The writer picks item keys at
random; listings map new keys to the ids inserted, in insertion order,
skipping an id whose item was applied and evicted on arrival.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import reprise
from reprise import errors
from reprise._proto import reprise_pb2 as pb
from reprise.aio import mutation_messages

Json = dict[str, Any]
TABLE = "t"
START_TIMEOUT = 60.0
# Bounds a sample with no timeout, which Reverb would wait on for ever:
# the service answers "rate limited" after it.
MAX_SAMPLE_WAIT = "10s"
MISSING_KEY_BASE = 0xFEED_0000_0000_0000


def num(x: Any) -> float:
    return float(x)


def enc(x: float) -> float | str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def yaml_num(x: Any) -> str:
    f = num(x)
    if math.isnan(f):
        return ".nan"
    if math.isinf(f):
        return ".inf" if f > 0 else "-.inf"
    return repr(f)


def selector_yaml(spec: Json) -> str:
    if spec["kind"] == "prioritized":
        return f"{{kind: prioritized, exponent: {yaml_num(spec['exponent'])}}}"
    return str(spec["kind"])


def limiter_yaml(spec: Json, table: Json) -> str:
    p = spec["preset"]
    if p == "min_size":
        return f"{{preset: min_size, min_size: {spec['min_size']}}}"
    if p == "sample_to_insert_ratio":
        return (
            f"{{preset: sample_to_insert_ratio, samples_per_insert: {yaml_num(spec['spi'])}, "
            f"min_size: {spec['min_size']}, error_buffer: {yaml_num(spec['error_buffer'])}}}"
        )
    if p == "queue" and spec["size"] == table["max_size"]:
        # reprised's queue and stack presets are the queue limiter with
        # fifo or lifo selectors.
        return "{preset: stack}" if table["sampler"]["kind"] == "lifo" else "{preset: queue}"
    if p == "queue":  # a queue limiter sized apart from the table: its parameters
        spec = {"spi": 1.0, "min_size": 1, "min_diff": 0.0, "max_diff": spec["size"]}
    return (
        f"{{preset: custom, samples_per_insert: {yaml_num(spec['spi'])}, min_size: {spec['min_size']}, "
        f"min_diff: {yaml_num(spec['min_diff'])}, max_diff: {yaml_num(spec['max_diff'])}}}"
    )


def config_yaml(t: Json) -> str:
    return (
        f"service:\n  max_sample_wait: {MAX_SAMPLE_WAIT}\n"
        f"tables:\n  - name: {TABLE}\n"
        f"    sampler: {selector_yaml(t['sampler'])}\n"
        f"    remover: {selector_yaml(t['remover'])}\n"
        f"    max_size: {t['max_size']}\n"
        f"    max_times_sampled: {t['max_times_sampled']}\n"
        f"    rate_limiter: {limiter_yaml(t['limiter'], t)}\n"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def error_class(e: BaseException) -> str:
    if isinstance(e, (errors.RateLimitedError, errors.DeadlineExceededError)):
        return "rate_limited"
    if isinstance(e, (errors.InvalidArgumentError, errors.RejectedError, ValueError)):
        return "invalid_argument"
    return f"other: {type(e).__name__}: {e}"


class Reprised:
    """A reprised process serving one table, and a client of it."""

    def __init__(self, scenario: Json, workdir: Path) -> None:
        cfg = workdir / "reprise.yaml"
        cfg.write_text(config_yaml(scenario["table"]))
        self.log = workdir / "reprised.log"
        port = free_port()
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [os.environ["REPRISED_BIN"], "--config", str(cfg), "--listen", f"127.0.0.1:{port}",
                 "--store", str(workdir / "store"), "--checkpoint-every", "0s", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT,
            )
        self.client: reprise.Client | None = None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                c = reprise.Client(f"nats://127.0.0.1:{port}")
            except errors.RepriseError:
                time.sleep(0.05)  # the server is not listening yet
                continue
            try:
                c.server_info(timeout=5)
                self.client = c
                break
            except errors.RepriseError:
                c.close()
                time.sleep(0.05)  # JetStream or the service is still starting
        if self.client is None:
            self.stop()
            raise RuntimeError(self.log.read_text().strip().splitlines()[-1] if self.log.read_text().strip() else "no start")
        self.writer = self.client.trajectory_writer(1, linger=0.0)
        self.key_of: dict[int, int] = {}
        self.known: set[int] = set()
        self.unmapped: list[int] = []  # ids inserted whose keys are not yet seen

    def stop(self) -> None:
        if self.client is not None:
            try:
                self.client.close()
            except errors.RepriseError:
                pass  # a writer with items the limiter still holds
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _request(self, subject: str, data: bytes, timeout: float = 10.0) -> bytes:
        assert self.client is not None
        ac = self.client._aclient  # noqa: SLF001 - see the module's docstring
        reply: bytes = self.client._call(ac._requester().request(subject, data, timeout))  # noqa: SLF001
        return reply

    def items(self) -> list[Any]:
        """The table's items in insertion order, mapping new keys to the
        ids inserted, in that order."""
        assert self.client is not None
        req = pb.ItemsRequest(table=TABLE, limit=10_000)
        resp = pb.ItemsResponse()
        resp.ParseFromString(self._request(self.client._aclient.subjects.items, req.SerializeToString()))  # noqa: SLF001
        for it in resp.items:
            if it.key not in self.known and self.unmapped:
                self.known.add(it.key)
                self.key_of[self.unmapped.pop(0)] = it.key
        return list(resp.items)

    def id_of(self, key: int) -> int:
        for i, k in self.key_of.items():
            if k == key:
                return i
        return -1

    def key(self, i: int) -> int:
        if i not in self.key_of:
            self.items()
        return self.key_of.get(i, MISSING_KEY_BASE + i)

    def mutate(self, updates: dict[int, float], deletes: list[int]) -> None:
        """mutate_priorities, then a wait until the service applied it."""
        assert self.client is not None
        ac = self.client._aclient  # noqa: SLF001
        seq = 0
        for m in mutation_messages(TABLE, updates, deletes, ac.max_payload):
            seq = self.client._call(ac._publish_js(ac.subjects.mutate, m, 10.0))  # noqa: SLF001
        deadline = time.monotonic() + 10
        while self.client._call(ac._info(10.0)).applied_sequence < seq:  # noqa: SLF001
            if time.monotonic() > deadline:
                raise TimeoutError(f"mutation {seq} not applied within 10s")
            time.sleep(0.01)

    def sample_info(self, s: Any) -> Json:
        i = int(np.asarray(s.data["id"]).reshape(-1)[0])
        self.key_of[i] = int(s.info.key)
        return {
            "id": i,
            "probability": enc(float(s.info.probability)),
            "priority": enc(float(s.info.priority)),
            "times_sampled": int(s.info.times_sampled),
            "table_size": int(s.info.table_size),
        }

    def apply(self, op: Json) -> Json:
        assert self.client is not None
        kind = op["op"]
        o: Json = {"op": kind, "error": None}
        timeout = op.get("timeout_ms", 0) / 1000 or None
        try:
            if kind == "insert":
                self.unmapped.append(op["id"])
                try:
                    self.writer.append({"id": np.int64(op["id"])})
                    self.writer.create_item(TABLE, num(op["priority"]), {"id": self.writer.history["id"][-1]})
                    self.writer.wait_applied(timeout=timeout)
                except Exception as e:
                    # Held by the limiter, it may be applied later and stays
                    # unmapped; refused, it never will be.
                    if error_class(e) != "rate_limited":
                        self.unmapped.remove(op["id"])
                    raise
                finally:
                    self.items()
                if op["id"] in self.unmapped:
                    # Applied but not listed: its remover evicted it on
                    # arrival, so the next new key is not its.
                    self.unmapped.remove(op["id"])
            elif kind == "sample":
                try:
                    o["items"] = [self.sample_info(s) for s in self.client.sample(TABLE, op["n"], timeout=timeout)]
                except errors.RateLimitedError as e:
                    o["items"] = [self.sample_info(s) for s in (e.partial or [])]
                    raise
            elif kind == "dist":
                counts: dict[str, int] = {}
                probs: dict[str, float | str] = {}
                left = op["n"]
                while left:
                    for s in self.client.sample(TABLE, min(left, 1000), timeout=timeout):
                        info = self.sample_info(s)
                        counts[str(info["id"])] = counts.get(str(info["id"]), 0) + 1
                        probs[str(info["id"])] = info["probability"]
                    left -= min(left, 1000)
                o.update(n=sum(counts.values()), counts=counts, probabilities=probs)
            elif kind == "mutate":
                self.mutate({self.key(u[0]): num(u[1]) for u in op["updates"]}, [self.key(i) for i in op["deletes"]])
            elif kind == "reset":
                self.client.reset(TABLE)
            elif kind == "info":
                ti = self.client.server_info()[TABLE]
                li = ti.rate_limiter_info
                o.update(
                    size=ti.current_size,
                    max_size=ti.max_size,
                    max_times_sampled=ti.max_times_sampled,
                    limiter={
                        "samples_per_insert": enc(li.samples_per_insert),
                        "min_size": li.min_size_to_sample,
                        "min_diff": enc(li.min_diff),
                        "max_diff": enc(li.max_diff),
                        "inserts": li.inserts,
                        "samples": li.samples,
                        "deletes": li.deletes,
                    },
                    # Reverb's completed counts are since the last reset,
                    # as the limiter's are; num_inserts and num_samples are
                    # Reprise's lifetime counts, which Reverb lacks.
                    insert_completed=li.inserts,
                    sample_completed=li.samples,
                )
            elif kind == "contents":
                items = [
                    {"id": self.id_of(it.key), "priority": enc(it.priority), "times_sampled": it.times_sampled}
                    for it in self.items()
                ]
                o["items"] = sorted(items, key=lambda x: x["id"])
            else:
                raise ValueError(f"unknown op {kind!r}")
        except Exception as e:  # noqa: BLE001 - every error is an observation
            o["error"] = error_class(e)
        return o


def run(scenario: Json) -> Iterator[Json]:
    with tempfile.TemporaryDirectory(prefix="reprisediff-") as d:
        try:
            r = Reprised(scenario, Path(d))
        except RuntimeError as e:
            yield {"op": "create", "error": "invalid_argument", "message": str(e)}
            return
        try:
            yield {"op": "create", "error": None}
            for op in scenario["ops"]:
                yield r.apply(op)
        finally:
            r.stop()


def main() -> None:
    for scenario in json.load(sys.stdin):
        print(json.dumps({"start": scenario["name"]}), flush=True)
        for o in run(scenario):
            print(json.dumps({"obs": o}), flush=True)
        print(json.dumps({"end": scenario["name"]}), flush=True)


if __name__ == "__main__":
    main()
