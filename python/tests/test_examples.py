"""The examples run: examples/python/dqn_cartpole's PyTorch and JAX
learners in their smoke mode (actors and learner start, transitions flow
both ways, it exits 0)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO

DQN = REPO / "examples" / "python" / "dqn_cartpole"


def needs(*modules: str) -> None:
    """Skips the test unless the modules are installed. Looked up, not
    imported: JAX imported here would be in the process when test_torch.py
    forks its DataLoader workers (see conftest's ordering)."""
    for m in modules:
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"{m} is not installed")


def smoke(reprised_factory: Any, tmp_path: Path, script: str) -> None:
    r = reprised_factory((DQN / "reprise.yaml").read_text())
    out = subprocess.run(
        [sys.executable, str(DQN / script), "--nats", r.url, "--smoke", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "smoke:" in out.stdout
    assert (tmp_path / "curve-seed0.csv").exists()


def test_dqn_cartpole_smoke(reprised_factory: Any, tmp_path: Path) -> None:
    needs("gymnasium", "torch")
    smoke(reprised_factory, tmp_path, "dqn.py")


def test_dqn_jax_cartpole_smoke(reprised_factory: Any, tmp_path: Path) -> None:
    needs("gymnasium", "jax")
    smoke(reprised_factory, tmp_path, "dqn_jax.py")


def test_dqn_jax_actors_load_no_framework() -> None:
    """A spawned actor runs dqn_jax.py's top level as its main module: that
    must not import JAX (nor PyTorch), so the actors run without either."""
    needs("gymnasium")
    code = (
        "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__mp_main__');"
        " print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'jaxlib', 'torch'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(DQN / "dqn_jax.py")],
        capture_output=True, text=True, timeout=60, cwd=DQN,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "[]"
