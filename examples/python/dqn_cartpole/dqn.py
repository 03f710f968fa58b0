"""DQN on CartPole-v1 with Reprise: actor processes play and publish
n-step transitions through the Python writer; a PyTorch learner samples a
prioritized table held to a samples-per-insert ratio and updates priorities
from TD errors.

    go run ./cmd/reprised --config examples/python/dqn_cartpole/reprise.yaml   # terminal 1
    python examples/python/dqn_cartpole/dqn.py --seed 0                        # terminal 2

The learner evaluates the greedy policy every --eval-every seconds (20
episodes) and stops once the mean return reaches --target (450) or after
--minutes. It writes the learning curve to --out (CSV, and a PNG when
matplotlib is installed). ``--smoke`` runs a few seconds of everything and
exits 0 when data moved both ways (what CI runs).
"""

from __future__ import annotations

import argparse
import csv
import logging
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import reprise

TABLE = "dqn"


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


def actor(index: int, args: argparse.Namespace, weights: Path, stop: mp.Event, steps_out: mp.Value) -> None:
    """Plays episodes with an epsilon-greedy policy and writes one item per
    transition: the n+1 observations s_t .. s_t+n as one column, the action
    a_t, and the n rewards and discounts that follow (n-step returns). Each
    step's discount is gamma, 0 where the episode terminated; the steps after
    an episode's end repeat its last observation with reward 0 and discount
    1, so every item has the same shape."""
    torch.set_num_threads(1)
    # The rate limiter holds the actors to the learner's pace by design:
    # the writer's "waiting for room" notes are expected here.
    logging.getLogger("reprise").setLevel(logging.ERROR)
    rng = np.random.default_rng(args.seed * 100 + index)
    env = gym.make("CartPole-v1")
    net = make_net()
    mtime = 0.0
    n = args.n_step
    client = reprise.Client(args.nats, prefix=args.prefix)
    w = client.trajectory_writer(num_keep_alive_refs=n + 1)

    def append(obs: np.ndarray, action: int, reward: float, discount: float) -> None:
        w.append({"obs": obs.astype(np.float32), "action": np.int64(action),
                  "reward": np.float32(reward), "discount": np.float32(discount)})
        if w.episode_steps >= n + 1:
            h = w.history
            w.create_item(TABLE, 1.0, {
                "obs": h["obs"][-(n + 1):],
                "action": h["action"][-(n + 1)],
                "reward": h["reward"][-(n + 1):-1],
                "discount": h["discount"][-(n + 1):-1],
            })

    steps = 0
    obs, _ = env.reset(seed=args.seed * 1000 + index)
    try:
        while not stop.is_set():
            eps = max(args.eps_min, 1.0 - steps * args.actors / args.eps_decay_steps)
            if rng.random() < eps:
                action = int(rng.integers(2))
            else:
                with torch.no_grad():
                    action = int(net(torch.from_numpy(obs)).argmax())
            nxt, reward, terminated, truncated, _ = env.step(action)
            append(obs, action, reward, 0.0 if terminated else args.gamma)
            obs = nxt
            steps += 1
            if terminated or truncated:
                for _ in range(n):  # the final observation, then padding
                    append(obs, 0, 0.0, 1.0)
                w.end_episode()
                obs, _ = env.reset()
            if steps % 200 == 0:
                mtime = load_weights(net, weights, mtime)
                with steps_out.get_lock():
                    steps_out.value += 200
        w.close(timeout=10)
    except reprise.ClosedError:
        pass
    except reprise.RepriseError as e:
        if not stop.is_set():
            raise
        print(f"actor {index}: stopping: {e}", file=sys.stderr)
    finally:
        client.close()


def evaluate(net: nn.Module, episodes: int, seed: int) -> float:
    env = gym.make("CartPole-v1")
    total = 0.0
    for i in range(episodes):
        obs, _ = env.reset(seed=10_000 + seed * 100 + i)
        done = False
        while not done:
            with torch.no_grad():
                a = int(net(torch.from_numpy(obs)).argmax())
            obs, r, term, trunc, _ = env.step(a)
            total += r
            done = term or trunc
    return total / episodes


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
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    steps = ctx.Value("q", 0)
    procs = [ctx.Process(target=actor, args=(i, args, weights, stop, steps), daemon=True) for i in range(args.actors)]
    for p in procs:
        p.start()

    start = time.monotonic()
    deadline = start + args.minutes * 60
    next_eval = start + args.eval_every
    curve: list[tuple[float, int, int, float]] = []
    updates = 0
    reached = False
    beta = args.beta
    try:
        for batch in batches(client, args, procs, deadline):
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
            updates += 1
            # Actors insert at priority 1 (they cannot know the largest TD
            # error so far): clipping at 1 keeps fresh transitions at the
            # top priority, as "new items get the max priority" does.
            client.update_priorities(TABLE, batch.info.key, td.detach().abs().clamp(1e-3, 1.0).numpy())
            with torch.no_grad():  # a slowly moving target network
                for pt, pn in zip(target.parameters(), net.parameters()):
                    pt.lerp_(pn, args.tau)
            if updates % 50 == 0:
                save_weights(net, weights)
            now = time.monotonic()
            if args.smoke and updates >= args.smoke_updates:
                ret = evaluate(net, 2, args.seed)
                curve.append((now - start, steps.value, updates, ret))
                print(f"smoke: {updates} updates on {steps.value} actor steps; greedy return {ret:.1f}")
                reached = steps.value > 0 and updates > 0
                break
            if now >= next_eval:
                ret = evaluate(net, args.eval_episodes, args.seed)
                curve.append((now - start, steps.value, updates, ret))
                info = client.server_info()[TABLE]
                print(f"{now - start:6.0f}s  steps {steps.value:8d}  updates {updates:7d}  table {info.current_size:6d}  "
                      f"greedy return {ret:6.1f}", flush=True)
                next_eval = time.monotonic() + args.eval_every
                if ret >= args.target:
                    reached = True
                    break
            if now >= deadline:
                break
    finally:
        stop.set()
        for p in procs:
            # An actor the rate limiter holds waits for samples that no
            # longer come: give it a moment, then stop it.
            p.join(3)
            if p.is_alive():
                p.terminate()
        client.close()
        # The actors read the weights from here; they have all stopped.
        shutil.rmtree(weights.parent, ignore_errors=True)
    write_curve(out, args.seed, curve)
    if args.smoke:
        return 0 if reached else 1
    print(f"seed {args.seed}: {'reached' if reached else 'did not reach'} {args.target} "
          f"in {time.monotonic() - start:.0f}s ({steps.value} actor steps, {updates} updates)")
    return 0 if reached else 2


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


def write_curve(out: Path, seed: int, curve: list[tuple[float, int, int, float]]) -> None:
    path = out / f"curve-seed{seed}.csv"
    with open(path, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["seconds", "actor_steps", "updates", "greedy_return"])
        wr.writerows(curve)
    print(f"learning curve: {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nats", default="nats://127.0.0.1:4222")
    ap.add_argument("--prefix", default="reprise")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--minutes", type=float, default=15)
    ap.add_argument("--target", type=float, default=450)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--gamma", type=float, default=0.99)
    ap.add_argument("--n-step", type=int, default=3, help="steps of reward before bootstrapping")
    ap.add_argument("--beta", type=float, default=0.4)
    ap.add_argument("--tau", type=float, default=0.005, help="target network update rate per learner step")
    ap.add_argument("--eps-decay-steps", type=int, default=10_000)
    ap.add_argument("--eps-min", type=float, default=0.02)
    ap.add_argument("--eval-every", type=float, default=20)
    ap.add_argument("--eval-episodes", type=int, default=20)
    ap.add_argument("--out", default="dqn-results")
    ap.add_argument("--smoke", action="store_true", help="a few seconds of everything; exit 0 if data moved")
    ap.add_argument("--smoke-updates", type=int, default=20)
    args = ap.parse_args()
    return learner(args)


if __name__ == "__main__":
    sys.exit(main())
