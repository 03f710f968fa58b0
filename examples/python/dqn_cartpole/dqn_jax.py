"""DQN on CartPole-v1 with Reprise and JAX: dqn.py's actors and table, with
a learner in plain JAX (jax.numpy, jax.value_and_grad, jax.jit and a few
lines of Adam) that takes its batches from reprise.jax.ReplayIterator.
The actor processes act with a numpy forward pass of the learner's
network, saved as .npz: they do not load JAX.

    go run ./cmd/reprised --config examples/python/dqn_cartpole/reprise.yaml   # terminal 1
    python examples/python/dqn_cartpole/dqn_jax.py --seed 0                    # terminal 2

The learner evaluates the greedy policy every --eval-every seconds (20
episodes) and stops once the mean return reaches --target (450) or after
--minutes. It writes the learning curve to --out as CSV. ``--smoke`` runs
a few seconds of everything and exits 0 when data moved both ways (what
CI runs).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Generator, Sequence
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import reprise
from dqn_common import TABLE, Greedy, Progress, parser, play, start_actors, stop_actors

if TYPE_CHECKING:
    import reprise.jax

# JAX is imported inside the learner's functions, not here: a spawned actor
# runs this file's top level as its main module, and acts without JAX.

HIDDEN = 128
SIZES = (4, HIDDEN, HIDDEN, 2)

#: The Q-network's weights and biases by name ("w0", "b0", ...): numpy
#: arrays in the actors and the .npz file, jax.Arrays in the learner.
Params = dict[str, Any]


def init_params(seed: int) -> Params:
    """The Q-network's initial weights, as torch.nn.Linear draws them:
    uniform within +-1/sqrt(fan_in)."""
    rng = np.random.default_rng(seed)
    params: Params = {}
    for i, (fan_in, fan_out) in enumerate(zip(SIZES, SIZES[1:])):
        bound = 1 / np.sqrt(fan_in)
        params[f"w{i}"] = rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32)
        params[f"b{i}"] = rng.uniform(-bound, bound, fan_out).astype(np.float32)
    return params


def q_values(params: Params, obs: Any, xp: Any = np) -> Any:
    """Q-values of obs ([..., 4]) for both actions: a ReLU MLP. ``xp`` is
    numpy (the actors, the evaluation) or jax.numpy (the learner), one
    definition for both."""
    layers = len(SIZES) - 1
    h = obs
    for i in range(layers):
        h = h @ params[f"w{i}"] + params[f"b{i}"]
        if i < layers - 1:
            h = xp.maximum(h, 0)
    return h


def greedy_of(params: Params) -> Greedy:
    def greedy(obs: np.ndarray) -> int:
        return int(np.argmax(q_values(params, obs)))
    return greedy


def actor(index: int, args: argparse.Namespace, weights: Path, stop: Event, steps_out: Synchronized) -> None:  # type: ignore[type-arg]
    """An actor process: plays with the learner's latest weights, read
    from its .npz file (replaced whole, so never read half written)."""
    params: Params = {}

    def reload() -> None:
        with np.load(weights) as f:
            params.update({k: f[k] for k in f.files})

    reload()
    play(index, args, greedy_of(params), reload, stop, steps_out)


def save_weights(params: Params, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:  # a file, so that numpy adds no .npz suffix
        np.savez(f, **params)
    os.replace(tmp, path)


def make_train_step(args: argparse.Namespace) -> Any:
    """The jitted learner step: (state, batch data, sampling probability,
    table size) -> (state, new priorities), where the state is (params,
    target params, Adam's first and second moments, step count)."""
    import jax
    import jax.numpy as jnp

    b1, b2, eps = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults

    def loss_fn(params: Params, target: Params, data: dict[str, jax.Array], weight: jax.Array) -> Any:
        obs = data["obs"]  # [B, n+1, 4]: s_t .. s_t+n
        s, sn = obs[:, 0], obs[:, -1]
        r = data["reward"]  # [B, n]
        disc = jnp.cumprod(data["discount"], axis=1)  # [B, n]
        # n-step return: r_t + d_t r_t+1 + d_t d_t+1 r_t+2 + ...
        ret = r[:, 0] + jnp.sum(r[:, 1:] * disc[:, :-1], axis=1)
        an = jnp.argmax(q_values(params, sn, jnp), axis=1)  # double DQN
        qn = jnp.take_along_axis(q_values(target, sn, jnp), an[:, None], axis=1)[:, 0]
        y = jax.lax.stop_gradient(ret + disc[:, -1] * qn)
        q = jnp.take_along_axis(q_values(params, s, jnp), data["action"][:, None], axis=1)[:, 0]
        td = q - y
        huber = jnp.where(jnp.abs(td) < 1, 0.5 * td**2, jnp.abs(td) - 0.5)  # smooth L1
        return jnp.mean(weight * huber), td

    @jax.jit
    def train_step(state: tuple[Any, ...], data: dict[str, jax.Array], probability: jax.Array,
                   table_size: jax.Array) -> tuple[tuple[Any, ...], jax.Array]:
        params, target, m, v, t = state
        # Importance weights for prioritized sampling.
        wts = (table_size.astype(jnp.float32) * probability) ** (-args.beta)
        wts = wts / jnp.max(wts)
        (_, td), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, target, data, wts)
        norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads)))
        grads = jax.tree.map(lambda g: g * jnp.minimum(1.0, 10.0 / (norm + 1e-6)), grads)  # clip at 10
        t = t + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        params = jax.tree.map(
            lambda p, m, v: p - args.lr * (m / (1 - b1**t)) / (jnp.sqrt(v / (1 - b2**t)) + eps), params, m, v
        )
        target = jax.tree.map(lambda pt, p: pt + args.tau * (p - pt), target, params)  # a slowly moving target
        # Actors insert at priority 1 (they cannot know the largest TD
        # error so far): clipping at 1 keeps fresh transitions at the top
        # priority, as "new items get the max priority" does.
        return (params, target, m, v, t), jnp.clip(jnp.abs(td), 1e-3, 1.0)

    return train_step


def learner(args: argparse.Namespace) -> int:
    # The step is small and the actors need the other cores: XLA on CPU
    # runs each op on one thread.
    if "xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
    import jax

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    weights = Path(tempfile.mkdtemp(prefix="dqn-jax-weights-")) / "q.npz"
    params = init_params(args.seed)
    save_weights(params, weights)
    zeros = jax.tree.map(np.zeros_like, params)
    state = jax.device_put((params, params, zeros, zeros, np.int32(0)))
    train_step = make_train_step(args)

    # Start from an empty table (a fresh reprised): a reset would queue
    # behind inserts that the rate limiter holds from an earlier run.
    client = reprise.Client(args.nats, prefix=args.prefix)
    stop, steps, procs = start_actors(args, actor, weights)

    progress = Progress(args, client, steps)
    try:
        with contextlib.closing(batches(client, args, procs, progress.deadline)) as stream:
            for it, batch in stream:
                state, prio = train_step(state, batch.data, batch.info["probability"], batch.info["table_size"])
                it.update_priorities(batch.info_numpy.key, prio)
                done = progress.updated(lambda: greedy_of(jax.device_get(state[0])))
                if progress.updates % 50 == 0:
                    save_weights(jax.device_get(state[0]), weights)
                if done:
                    break
    finally:
        stop_actors(stop, procs)
        client.close()
        # The actors read the weights from here; they have all stopped.
        shutil.rmtree(weights.parent, ignore_errors=True)
    return progress.finish(out)


def batches(client: reprise.Client, args: argparse.Namespace, procs: Sequence[mp.process.BaseProcess],
            deadline: float) -> Generator[tuple[reprise.jax.ReplayIterator, reprise.jax.JaxBatch], None, None]:
    """Batches on the JAX device, each with the iterator that sampled it,
    until the deadline. An iterator with a timeout ends when the rate
    limiter allows nothing for that long (the actors are starting, or
    gone): check on them, then sample again."""
    import reprise.jax

    while time.monotonic() < deadline:
        with reprise.jax.ReplayIterator(client, TABLE, args.batch, prefetch=2, device_prefetch=2, timeout=10) as it:
            for batch in it:
                yield it, batch
        if not any(p.is_alive() for p in procs):
            raise RuntimeError("every actor exited; see their errors above")


def main() -> int:
    return learner(parser(__doc__, "dqn-jax-results").parse_args())


if __name__ == "__main__":
    sys.exit(main())
