"""DQN on CartPole-v1 with Reprise: actor processes play and publish
n-step transitions through the Python writer; a PyTorch learner samples a
prioritized table held to a samples-per-insert ratio and updates priorities
from TD errors.

    go run ./cmd/reprised --config examples/python/dqn_cartpole/reprise.yaml   # terminal 1
    python examples/python/dqn_cartpole/dqn.py --seed 0                        # terminal 2

The learner evaluates the greedy policy every --eval-every seconds (20
episodes) and stops once the mean return reaches --target (450) or after
--minutes. It writes the learning curve to --out as CSV (plot.py draws
it). ``--smoke`` runs a few seconds of everything and
exits 0 when data moved both ways (what CI runs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import reprise
from dqn_common import TABLE, Greedy, Progress, parser, play, start_actors, stop_actors

HIDDEN = 128


def make_net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2))


def load_weights(net: nn.Module, path: Path, last_mtime: float) -> float:
    """Reloads the learner's latest weights when the file changed."""
    try:
        m = path.stat().st_mtime
    except FileNotFoundError:
        return last_mtime
    if m != last_mtime:
        try:
            net.load_state_dict(torch.load(path, weights_only=True))
        except (RuntimeError, EOFError, OSError):
            return last_mtime  # being replaced: next time
    return m


def actor(index: int, args: argparse.Namespace, weights: Path, stop: Event, steps_out: Synchronized) -> None:  # type: ignore[type-arg]
    """An actor process: plays with the torch network, reloaded from the
    learner's weights file."""
    torch.set_num_threads(1)
    net = make_net()
    mtime = 0.0

    def reload() -> None:
        nonlocal mtime
        mtime = load_weights(net, weights, mtime)

    play(index, args, greedy_of(net), reload, stop, steps_out)


def greedy_of(net: nn.Module) -> Greedy:
    def greedy(obs: np.ndarray) -> int:
        with torch.no_grad():
            return int(net(torch.from_numpy(obs)).argmax())
    return greedy


def learner(args: argparse.Namespace) -> int:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    weights = Path(tempfile.mkdtemp(prefix="dqn-weights-")) / "q.pt"
    net, target = make_net(), make_net()
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    save_weights(net, weights)

    # Start from an empty table (a fresh reprised): a reset would queue
    # behind inserts that the rate limiter holds from an earlier run.
    client = reprise.Client(args.nats, prefix=args.prefix)
    stop, steps, procs = start_actors(args, actor, weights)

    progress = Progress(args, client, steps)
    beta = args.beta
    try:
        for batch in batches(client, args, procs, progress.deadline):
            d = batch.data
            obs = torch.from_numpy(d["obs"])  # [B, n+1, 4]: s_t .. s_t+n
            s, sn = obs[:, 0], obs[:, -1]
            a = torch.from_numpy(d["action"])  # [B]
            r = torch.from_numpy(d["reward"])  # [B, n]
            disc = torch.cumprod(torch.from_numpy(d["discount"]), dim=1)  # [B, n]
            # n-step return: r_t + d_t r_t+1 + d_t d_t+1 r_t+2 + ...
            ret = r[:, 0] + (r[:, 1:] * disc[:, :-1]).sum(1)
            with torch.no_grad():
                an = net(sn).argmax(1, keepdim=True)  # double DQN
                y = ret + disc[:, -1] * target(sn).gather(1, an).squeeze(1)
            q = net(s).gather(1, a.unsqueeze(1)).squeeze(1)
            td = q - y
            # Importance weights for prioritized sampling.
            p = torch.from_numpy(batch.info.probability)
            n = torch.from_numpy(batch.info.table_size.astype(np.float64))
            wts = (n * p) ** (-beta)
            wts = (wts / wts.max()).float()
            loss = (wts * F.smooth_l1_loss(q, y, reduction="none")).mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 10.0)
            opt.step()
            # Actors insert at priority 1 (they cannot know the largest TD
            # error so far): clipping at 1 keeps fresh transitions at the
            # top priority, as "new items get the max priority" does.
            client.update_priorities(TABLE, batch.info.key, td.detach().abs().clamp(1e-3, 1.0).numpy())
            with torch.no_grad():  # a slowly moving target network
                for pt, pn in zip(target.parameters(), net.parameters()):
                    pt.lerp_(pn, args.tau)
            done = progress.updated(lambda: greedy_of(net))
            if progress.updates % 50 == 0:
                save_weights(net, weights)
            if done:
                break
    finally:
        stop_actors(stop, procs)
        client.close()
        # The actors read the weights from here; they have all stopped.
        shutil.rmtree(weights.parent, ignore_errors=True)
    return progress.finish(out)


def batches(client: reprise.Client, args: argparse.Namespace, procs: list, deadline: float):  # type: ignore[no-untyped-def]
    """Sampled batches until the deadline. A sampler with a timeout ends
    when the rate limiter allows nothing for that long (the actors are
    starting, or gone): check on them, then sample again."""
    while time.monotonic() < deadline:
        with client.sampler(TABLE, args.batch, prefetch=2, timeout=10) as sampler:
            yield from sampler
        if not any(p.is_alive() for p in procs):
            raise RuntimeError("every actor exited; see their errors above")


def save_weights(net: nn.Module, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(net.state_dict(), tmp)
    os.replace(tmp, path)


def main() -> int:
    args = parser(__doc__, "dqn-results").parse_args()
    return learner(args)


if __name__ == "__main__":
    sys.exit(main())
