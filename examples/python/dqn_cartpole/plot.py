"""Plots the learning curves dqn.py or dqn_jax.py wrote (curve-seed*.csv)
into one PNG, with an optional title.

    python examples/python/dqn_cartpole/plot.py dqn-results learning-curve.png
    python examples/python/dqn_cartpole/plot.py dqn-jax-results learning-curve-jax.png "JAX learner"
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    title = "DQN on CartPole-v1 through Reprise"
    if len(sys.argv) > 3:
        title += f" ({sys.argv[3]})"
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for path in sorted(src.glob("curve-seed*.csv")):
        with open(path) as f:
            rows = list(csv.DictReader(f))
        xs = [float(r["seconds"]) for r in rows]
        ys = [float(r["greedy_return"]) for r in rows]
        ax.plot(xs, ys, marker="o", label=path.stem.replace("curve-", ""))
    ax.axhline(450, color="gray", linestyle="--", linewidth=1, label="target 450")
    ax.set_xlabel("wall-clock seconds (2 actors + learner + reprised on 2 cores)")
    ax.set_ylabel("greedy return (mean of 20 episodes)")
    ax.set_title(title)
    ax.set_ylim(0, 520)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(dst)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
