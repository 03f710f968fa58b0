"""Reprise: experience replay for reinforcement learning on NATS JetStream.

The Python client of a Reprise deployment (``reprised``), on the same wire as
the Go client::

    import reprise

    client = reprise.Client("nats://127.0.0.1:4222")

    # An actor.
    with client.trajectory_writer(num_keep_alive_refs=3) as writer:
        for t in range(100):
            writer.append({"obs": obs, "action": action, "reward": reward})
            if writer.episode_steps >= 3:
                writer.create_item("replay", 1.0, {c: writer.history[c][-3:] for c in ("obs", "action", "reward")})
        writer.end_episode()

    # A learner.
    for batch in client.sampler("replay", batch_size=256, prefetch=4):
        obs = batch.data["obs"]          # numpy array [256, 3, *obs_shape]
        client.update_priorities("replay", batch.info.key, new_priorities)

:class:`ShardedClient` serves a table spread over several reprised (shards).
:mod:`reprise.aio` has the same API as coroutines; :mod:`reprise.torch` a
PyTorch ``IterableDataset``; :mod:`reprise.jax` an iterator of batches
placed on JAX devices. Errors derive from :class:`RepriseError`.
"""

from . import errors
from ._codec import DTYPES
from ._info import CheckpointInfo, ColumnSpec, RateLimiterInfo, TableInfo
from ._sample import BatchInfo, ReplaySample, SampleBatch, SampleInfo
from ._writer import ColumnHistory, History, TrajectoryColumn, WriterOptions
from .client import Client, Sampler, ShardedClient, ShardedSampler, ShardedTrajectoryWriter, TrajectoryWriter
from .errors import (
    ClosedError,
    Code,
    DeadlineExceededError,
    DuplicateIdError,
    EpisodeNotEndedError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    NotStoredError,
    OutcomeUnknownError,
    PermissionDeniedError,
    ProtocolError,
    RateLimitedError,
    RejectedError,
    RepriseError,
    ResourceExhaustedError,
    SignatureMismatchError,
    UnavailableError,
    UnknownTableError,
    UnsupportedCodecError,
)

__version__ = "0.1.0"

__all__ = [
    "DTYPES",
    "BatchInfo",
    "CheckpointInfo",
    "Client",
    "ClosedError",
    "Code",
    "ColumnHistory",
    "ColumnSpec",
    "DeadlineExceededError",
    "DuplicateIdError",
    "EpisodeNotEndedError",
    "History",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "NotStoredError",
    "OutcomeUnknownError",
    "PermissionDeniedError",
    "ProtocolError",
    "RateLimitedError",
    "RateLimiterInfo",
    "RejectedError",
    "ReplaySample",
    "RepriseError",
    "ResourceExhaustedError",
    "SampleBatch",
    "SampleInfo",
    "Sampler",
    "ShardedClient",
    "ShardedSampler",
    "ShardedTrajectoryWriter",
    "SignatureMismatchError",
    "TableInfo",
    "TrajectoryColumn",
    "TrajectoryWriter",
    "UnavailableError",
    "UnknownTableError",
    "UnsupportedCodecError",
    "WriterOptions",
    "errors",
]
