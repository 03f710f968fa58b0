"""The examples run: examples/python/dqn_cartpole in its smoke mode (actors
and learner start, transitions flow both ways, it exits 0)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO

DQN = REPO / "examples" / "python" / "dqn_cartpole"


def test_dqn_cartpole_smoke(reprised_factory: Any, tmp_path: Path) -> None:
    pytest.importorskip("gymnasium")
    pytest.importorskip("torch")
    r = reprised_factory((DQN / "reprise.yaml").read_text())
    out = subprocess.run(
        [sys.executable, str(DQN / "dqn.py"), "--nats", r.url, "--smoke", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "smoke:" in out.stdout
    assert (tmp_path / "curve-seed0.csv").exists()
