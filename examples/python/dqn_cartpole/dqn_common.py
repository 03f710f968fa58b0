"""What dqn.py (PyTorch) and dqn_jax.py (JAX) share: the actor loop that
plays CartPole and writes n-step transitions, the greedy evaluation, the
learner's progress (evaluations, learning curve CSV, when to stop) and the
command line. It imports neither framework:
each learner hands in its own greedy policy, so the PyTorch example does
not need JAX, nor the JAX one PyTorch.
"""

from __future__ import annotations

import argparse
import csv
import logging
import multiprocessing as mp
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path

import gymnasium as gym
import numpy as np

import reprise

TABLE = "dqn"

#: How often (actor steps) an actor reloads the learner's weights and adds
#: to the shared step count.
RELOAD_EVERY = 200

#: The greedy action for an observation.
Greedy = Callable[[np.ndarray], int]


def play(index: int, args: argparse.Namespace, greedy: Greedy, reload: Callable[[], None],
         stop: Event, steps_out: Synchronized) -> None:  # type: ignore[type-arg]
    """Plays episodes with an epsilon-greedy policy and writes one item per
    transition: the n+1 observations s_t .. s_t+n as one column, the action
    a_t, and the n rewards and discounts that follow (n-step returns). Each
    step's discount is gamma, 0 where the episode terminated; the steps after
    an episode's end repeat its last observation with reward 0 and discount
    1, so every item has the same shape. ``reload`` is called every
    RELOAD_EVERY steps to take the learner's latest weights."""
    # The rate limiter holds the actors to the learner's pace by design:
    # the writer's "waiting for room" notes are expected here.
    logging.getLogger("reprise").setLevel(logging.ERROR)
    rng = np.random.default_rng(args.seed * 100 + index)
    env = gym.make("CartPole-v1")
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
                action = greedy(obs)
            nxt, reward, terminated, truncated, _ = env.step(action)
            append(obs, action, float(reward), 0.0 if terminated else args.gamma)
            obs = nxt
            steps += 1
            if terminated or truncated:
                for _ in range(n):  # the final observation, then padding
                    append(obs, 0, 0.0, 1.0)
                w.end_episode()
                obs, _ = env.reset()
            if steps % RELOAD_EVERY == 0:
                reload()
                with steps_out.get_lock():
                    steps_out.value += RELOAD_EVERY
        w.close(timeout=10)
    except reprise.ClosedError:
        pass
    except reprise.RepriseError as e:
        if not stop.is_set():
            raise
        print(f"actor {index}: stopping: {e}", file=sys.stderr)
    finally:
        client.close()


def start_actors(args: argparse.Namespace, actor: Callable[..., None], weights: Path) -> tuple[Event, Synchronized, list[mp.process.BaseProcess]]:  # type: ignore[type-arg]
    """Starts --actors processes running ``actor(index, args, weights,
    stop, steps)``, spawned (not forked: the learner's threads and
    framework stay out of them); returns the event that stops them, their
    shared step count and the processes."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    steps = ctx.Value("q", 0)
    procs: list[mp.process.BaseProcess] = [
        ctx.Process(target=actor, args=(i, args, weights, stop, steps), daemon=True) for i in range(args.actors)
    ]
    for p in procs:
        p.start()
    return stop, steps, procs


def stop_actors(stop: Event, procs: Sequence[mp.process.BaseProcess]) -> None:
    """Tells the actors to stop and waits for them."""
    stop.set()
    for p in procs:
        # An actor the rate limiter holds waits for samples that no
        # longer come: give it a moment, then stop it.
        p.join(3)
        if p.is_alive():
            p.terminate()


def evaluate(greedy: Greedy, episodes: int, seed: int) -> float:
    """The greedy policy's mean return over ``episodes`` episodes."""
    env = gym.make("CartPole-v1")
    total = 0.0
    for i in range(episodes):
        obs, _ = env.reset(seed=10_000 + seed * 100 + i)
        done = False
        while not done:
            obs, r, term, trunc, _ = env.step(greedy(obs))
            total += float(r)
            done = term or trunc
    return total / episodes


class Progress:
    """A learner's progress: it counts the updates, evaluates the greedy
    policy every --eval-every seconds into a learning curve, and says when
    to stop (the target reached, --minutes passed, or --smoke's updates
    done)."""

    def __init__(self, args: argparse.Namespace, client: reprise.Client, steps: Synchronized) -> None:  # type: ignore[type-arg]
        self.args, self.client, self.steps = args, client, steps
        self.start = time.monotonic()
        self.deadline = self.start + args.minutes * 60
        self.next_eval = self.start + args.eval_every
        self.curve: list[tuple[float, int, int, float]] = []
        self.updates = 0
        self.reached = False

    def updated(self, greedy: Callable[[], Greedy]) -> bool:
        """Counts an update; evaluates ``greedy()`` (made only when due)
        if it is time; says whether the learner should stop."""
        args, steps = self.args, self.steps.value
        self.updates += 1
        now = time.monotonic()
        if args.smoke and self.updates >= args.smoke_updates:
            ret = evaluate(greedy(), 2, args.seed)
            self.curve.append((now - self.start, steps, self.updates, ret))
            print(f"smoke: {self.updates} updates on {steps} actor steps; greedy return {ret:.1f}")
            self.reached = steps > 0
            return True
        if now >= self.next_eval:
            ret = evaluate(greedy(), args.eval_episodes, args.seed)
            self.curve.append((now - self.start, steps, self.updates, ret))
            info = self.client.server_info()[TABLE]
            print(f"{now - self.start:6.0f}s  steps {steps:8d}  updates {self.updates:7d}  table {info.current_size:6d}  "
                  f"greedy return {ret:6.1f}", flush=True)
            self.next_eval = time.monotonic() + args.eval_every
            if ret >= args.target:
                self.reached = True
                return True
        return now >= self.deadline

    def finish(self, out: Path) -> int:
        """Writes the learning curve; the exit status (0: reached, or data
        moved in a smoke run)."""
        args = self.args
        path = out / f"curve-seed{args.seed}.csv"
        with open(path, "w", newline="") as f:
            wr = csv.writer(f)
            wr.writerow(["seconds", "actor_steps", "updates", "greedy_return"])
            wr.writerows(self.curve)
        print(f"learning curve: {path}")
        if args.smoke:
            return 0 if self.reached else 1
        print(f"seed {args.seed}: {'reached' if self.reached else 'did not reach'} {args.target} "
              f"in {time.monotonic() - self.start:.0f}s ({self.steps.value} actor steps, {self.updates} updates)")
        return 0 if self.reached else 2


def parser(doc: str | None, out: str) -> argparse.ArgumentParser:
    """The command line both learners take; ``out`` is --out's default."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("--out", default=out)
    ap.add_argument("--smoke", action="store_true", help="a few seconds of everything; exit 0 if data moved")
    ap.add_argument("--smoke-updates", type=int, default=20)
    return ap
