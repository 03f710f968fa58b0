"""Applies the harness's scenarios to DeepMind Reverb and prints what it
observed. Runs in the virtual environment bench/reverb/setup.sh makes:

    REVERB_VENV/bin/python bench/reverbdiff/reverb_runner.py < scenarios.json

Output is JSON lines: {"start": name}, one {"obs": {...}} per operation (the
first is the table's creation), then {"end": name}; run.py restarts this
runner after the scenario it was in when it crashed or hung.

Reverb picks item keys at random and lists no items, so the runner reads
its table through checkpoints (written to a temporary directory, a few ms
each): they hold every item's key, priority and times sampled and the
chunks, whose single int64 is the item's id. Samples carry the id in their
data.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from typing import Any, Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import reverb  # noqa: E402
import tensorflow as tf  # noqa: E402
from reverb.cc import schema_pb2  # noqa: E402
from reverb.cc.checkpointing import checkpoint_pb2  # noqa: E402
from reverb.platform import checkpointers_lib  # noqa: E402

Json = dict[str, Any]
TABLE = "t"
# A key for an id the table does not hold: Reverb's keys are random 64-bit
# numbers, so one of these colliding with a real key is not a concern.
MISSING_KEY_BASE = 0xFEED_0000_0000_0000


def num(x: Any) -> float:
    """A scenario number: a JSON number, or "nan", "inf", "-inf"."""
    return float(x)


def enc(x: float) -> float | str:
    """A float as the runners print it: non-finite ones as strings."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def emit(record: Json) -> None:
    print(json.dumps(record), flush=True)


def selector(spec: Json) -> Any:
    kind = spec["kind"]
    if kind == "prioritized":
        return reverb.selectors.Prioritized(num(spec["exponent"]))
    return {
        "fifo": reverb.selectors.Fifo,
        "lifo": reverb.selectors.Lifo,
        "uniform": reverb.selectors.Uniform,
        "max_heap": reverb.selectors.MaxHeap,
        "min_heap": reverb.selectors.MinHeap,
    }[kind]()


def rate_limiter(spec: Json) -> Any:
    preset = spec["preset"]
    if preset == "min_size":
        return reverb.rate_limiters.MinSize(spec["min_size"])
    if preset == "sample_to_insert_ratio":
        return reverb.rate_limiters.SampleToInsertRatio(num(spec["spi"]), spec["min_size"], num(spec["error_buffer"]))
    if preset == "queue":
        return reverb.rate_limiters.Queue(spec["size"])
    return reverb.rate_limiters.RateLimiter(
        samples_per_insert=num(spec["spi"]),
        min_size_to_sample=spec["min_size"],
        min_diff=num(spec["min_diff"]),
        max_diff=num(spec["max_diff"]),
    )


def error_class(e: BaseException) -> str:
    if isinstance(e, reverb.errors.DeadlineExceededError):
        return "rate_limited"
    if isinstance(e, (ValueError, tf.errors.InvalidArgumentError)):
        return "invalid_argument"
    return f"other: {type(e).__name__}: {e}"


class Runner:
    """One scenario's Reverb server, client and writer."""

    def __init__(self, table: Any, ckdir: str) -> None:
        self.server = reverb.Server(
            tables=[table], checkpointer=checkpointers_lib.DefaultCheckpointer(path=ckdir)
        )
        self.client = self.server.localhost_client()
        self.writer = self.client.trajectory_writer(num_keep_alive_refs=1)
        self.key_of: dict[int, int] = {}  # id -> key, from checkpoints
        self.id_of: dict[int, int] = {}

    def close(self) -> None:
        self.server.stop()

    def checkpoint(self) -> tuple[list[Json], Any]:
        """The table's items (id, priority, times_sampled, key) and its
        rate limiter's checkpoint, learning each item's id."""
        path = self.client.checkpoint()
        chunk_ids: dict[int, int] = {}
        for rec in tf.data.TFRecordDataset(os.path.join(path, "chunks.tfrecord"), compression_type="ZLIB"):
            c = schema_pb2.ChunkData()
            c.ParseFromString(rec.numpy())
            chunk_ids[c.chunk_key] = snappy_int64(c.data.tensors[0].tensor_content)
        items = []
        for rec in tf.data.TFRecordDataset(os.path.join(path, "items.tfrecord"), compression_type="ZLIB"):
            it = schema_pb2.PrioritizedItem()
            it.ParseFromString(rec.numpy())
            i = chunk_ids[it.flat_trajectory.columns[0].chunk_slices[0].chunk_key]
            self.key_of[i], self.id_of[it.key] = it.key, i
            items.append({"id": i, "priority": enc(it.priority), "times_sampled": it.times_sampled})
        limiter = None
        for rec in tf.data.TFRecordDataset(os.path.join(path, "tables.tfrecord"), compression_type="ZLIB"):
            t = checkpoint_pb2.PriorityTableCheckpoint()
            t.ParseFromString(rec.numpy())
            limiter = t.rate_limiter
        return sorted(items, key=lambda x: x["id"]), limiter

    def key(self, i: int) -> int:
        if i not in self.key_of:
            self.checkpoint()
        return self.key_of.get(i, MISSING_KEY_BASE + i)

    def apply(self, op: Json) -> Json:
        kind = op["op"]
        o: Json = {"op": kind, "error": None}
        try:
            if kind == "insert":
                self.writer.append({"id": np.int64(op["id"])})
                self.writer.create_item(TABLE, num(op["priority"]), {"id": self.writer.history["id"][-1]})
                self.writer.flush(timeout_ms=op.get("timeout_ms") or None)
            elif kind == "sample":
                if op.get("timeout_ms"):
                    o["items"] = self.sample_with_timeout(op["n"], op["timeout_ms"])
                    if len(o["items"]) < op["n"]:
                        o["error"] = "rate_limited"
                else:
                    o["items"] = [self.sample_info(s) for s in self.client.sample(TABLE, op["n"], emit_timesteps=False)]
            elif kind == "dist":
                counts: dict[str, int] = {}
                probs: dict[str, float | str] = {}
                for s in self.client.sample(TABLE, op["n"], emit_timesteps=False):
                    i = str(self.sample_id(s))
                    counts[i] = counts.get(i, 0) + 1
                    probs[i] = enc(float(s.info.probability))
                o.update(n=sum(counts.values()), counts=counts, probabilities=probs)
            elif kind == "mutate":
                updates = {self.key(u[0]): num(u[1]) for u in op["updates"]}
                deletes = [self.key(i) for i in op["deletes"]]
                self.client.mutate_priorities(TABLE, updates=updates, deletes=deletes)
            elif kind == "reset":
                self.client.reset(TABLE)
            elif kind == "info":
                o.update(self.info())
            elif kind == "contents":
                o["items"], _ = self.checkpoint()
            else:
                raise ValueError(f"unknown op {kind!r}")
        except Exception as e:  # noqa: BLE001 - every error is an observation
            o["error"] = error_class(e)
        return o

    def sample_id(self, s: Any) -> int:
        i = int(np.asarray(s.data[0]).reshape(-1)[0])
        self.key_of[i], self.id_of[int(s.info.key)] = int(s.info.key), i
        return i

    def sample_info(self, s: Any) -> Json:
        return {
            "id": self.sample_id(s),
            "probability": enc(float(s.info.probability)),
            "priority": enc(float(s.info.priority)),
            "times_sampled": int(s.info.times_sampled),
            "table_size": int(s.info.table_size),
        }

    def sample_with_timeout(self, n: int, timeout_ms: int) -> list[Json]:
        """Samples the way a learner with a deadline does in Reverb: a
        dataset with rate_limiter_timeout_ms, which ends when the limiter
        holds a sample that long. One request in flight, so that it takes no
        more than it returns while samples are refused."""
        ds = reverb.TrajectoryDataset(
            server_address=self.client.server_address,
            table=TABLE,
            dtypes=(tf.int64,),
            shapes=(tf.TensorShape([]),),
            max_in_flight_samples_per_worker=1,
            num_workers_per_iterator=1,
            rate_limiter_timeout_ms=timeout_ms,
        )
        out = []
        for s in ds.take(n):
            i = int(s.data[0].numpy())
            out.append(
                {
                    "id": i,
                    "probability": enc(float(s.info.probability.numpy())),
                    "priority": enc(float(s.info.priority.numpy())),
                    "times_sampled": int(s.info.times_sampled.numpy()),
                    "table_size": int(s.info.table_size.numpy()),
                }
            )
        return out

    def info(self) -> Json:
        ti = self.client.server_info()[TABLE]
        ri = ti.rate_limiter_info
        _, ck = self.checkpoint()
        return {
            "size": ti.current_size,
            "max_size": ti.max_size,
            "max_times_sampled": ti.max_times_sampled,
            "limiter": {
                "samples_per_insert": enc(ri.samples_per_insert),
                "min_size": ri.min_size_to_sample,
                "min_diff": enc(ri.min_diff),
                "max_diff": enc(ri.max_diff),
                "inserts": ck.insert_count,
                "samples": ck.sample_count,
                "deletes": ck.delete_count,
            },
            "insert_completed": ri.insert_stats.completed,
            "sample_completed": ri.sample_stats.completed,
        }


def snappy_int64(data: bytes) -> int:
    """The int64 in a snappy block of 8 bytes, which snappy stores as one
    literal: length varint 8, tag (8-1)<<2, the bytes."""
    if len(data) != 10 or data[0] != 8 or data[1] != 7 << 2:
        raise ValueError(f"not a snappy literal of 8 bytes: {data!r}")
    return int.from_bytes(data[2:], "little", signed=True)


def run(scenario: Json) -> Iterator[Json]:
    spec = scenario["table"]
    try:
        table = reverb.Table(
            name=TABLE,
            sampler=selector(spec["sampler"]),
            remover=selector(spec["remover"]),
            max_size=spec["max_size"],
            rate_limiter=rate_limiter(spec["limiter"]),
            max_times_sampled=spec["max_times_sampled"],
        )
    except Exception as e:  # noqa: BLE001
        yield {"op": "create", "error": error_class(e), "message": str(e)}
        return
    with tempfile.TemporaryDirectory(prefix="reverbdiff-") as ckdir:
        r = Runner(table, ckdir)
        try:
            yield {"op": "create", "error": None}
            for op in scenario["ops"]:
                yield r.apply(op)
        finally:
            r.close()


def main() -> None:
    for scenario in json.load(sys.stdin):
        emit({"start": scenario["name"]})
        for o in run(scenario):
            emit({"obs": o})
        emit({"end": scenario["name"]})


if __name__ == "__main__":
    main()
