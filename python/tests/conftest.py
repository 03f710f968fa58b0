"""Fixtures that run real processes: reprised (built with ``go build``) on a
free port with a temporary store, and the Go helper (tests/gohelper).

Set REPRISE_BIN_DIR to a directory holding prebuilt ``reprised`` and
``gohelper`` binaries to skip the build (scripts/test.sh does).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import reprise

REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs test_jax.py last. Once JAX has started its backend, the process
    holds JAX's threads, and a fork (test_torch.py's DataLoader workers)
    copies whatever locks they hold into the child."""
    items.sort(key=lambda item: item.path.name == "test_jax.py")

#: Tables most tests use; a test that needs others passes its own config.
DEFAULT_TABLES = """
tables:
  - name: replay
    max_size: 1000000
  - name: sig
    max_size: 100000
    signature:
      - {name: obs, dtype: float32, shape: [-1, 4]}
      - {name: action, dtype: int64, shape: [-1]}
  - name: dtypes
    max_size: 100000
  - name: limited
    max_size: 1000
    rate_limiter: {preset: min_size, min_size: 5}
"""


def in_thread(call: Callable[[], None], daemon: bool = False) -> tuple[threading.Thread, list[BaseException | None]]:
    """Starts call on a thread of its own; the list gets what it raised,
    or None once it returned. A daemon thread does not keep the test process
    from ending, for a call that may hang (the defect a test shows)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome.append(e)

    th = threading.Thread(target=run, daemon=daemon)
    th.start()
    return th, outcome


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02) -> Any:
    """Polls cond until it returns a true value or timeout passes (then
    fails the test saying what it waited for)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what} (last error: {last!r})")
        time.sleep(interval)


def _build(out: Path, pkg: str) -> Path:
    bin_path = out / Path(pkg).name
    r = subprocess.run(
        ["go", "build", "-o", str(bin_path), pkg], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    if r.returncode != 0:
        pytest.fail(f"go build {pkg} failed:\n{r.stdout}{r.stderr}")
    return bin_path


@pytest.fixture(scope="session")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    prebuilt = os.environ.get("REPRISE_BIN_DIR")
    if prebuilt:
        d = Path(prebuilt)
        bins = {n: d / n for n in ("reprised", "reprisectl", "gohelper")}
        if all(p.exists() for p in bins.values()):
            return bins
    if shutil.which("go") is None:
        pytest.fail("go is needed to build reprised for the integration tests")
    out = tmp_path_factory.mktemp("bin")
    return {
        "reprised": _build(out, "./cmd/reprised"),
        "reprisectl": _build(out, "./cmd/reprisectl"),
        "gohelper": _build(out, "./python/tests/gohelper"),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Reprised:
    """A reprised process on a free port with its own store; start, stop,
    kill -9 and restart it on the same port and store. With ``nats`` it
    serves on that (external) NATS server instead: another reprised's, as a
    shard beside it. ``prefix`` is its --prefix."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        tables: str,
        extra: list[str] | None = None,
        *,
        prefix: str = "reprise",
        nats: str | None = None,
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.prefix = prefix
        self.nats = nats
        self.port = free_port()
        self.url = nats or f"nats://127.0.0.1:{self.port}"
        self.config = workdir / "reprise.yaml"
        self.config.write_text(tables)
        self.store = workdir / "store"
        self.log_path = workdir / "reprised.log"
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> None:
        log = open(self.log_path, "ab")
        server = ["--nats", self.nats] if self.nats else ["--listen", f"127.0.0.1:{self.port}", "--store", str(self.store)]
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                "--config", str(self.config),
                *server,
                "--prefix", self.prefix,
                "--checkpoint-every", "0s",
                "--log-level", "warn",
                *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 60.0, user: str | None = None, password: str | None = None) -> None:
        """Waits until reprised answers info (asked as user, when its
        embedded server has users)."""

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"reprised exited with {self.proc.returncode}:\n{self.log()}")
            with reprise.Client(self.url, prefix=self.prefix, user=user, password=password, connect_timeout=1) as c:
                c.server_info(timeout=1)
            return True

        wait_for("reprised to answer", ready, timeout)

    def stop(self) -> None:
        """A graceful stop (SIGTERM), waiting for the process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""


@pytest.fixture
def reprised_factory(binaries: dict[str, Path], tmp_path: Path) -> Iterator[Callable[..., Reprised]]:
    made: list[Reprised] = []

    def make(tables: str = DEFAULT_TABLES, extra: list[str] | None = None, **kwargs: Any) -> Reprised:
        d = Path(tempfile.mkdtemp(prefix="reprised-", dir=tmp_path))
        r = Reprised(binaries["reprised"], d, tables, extra, **kwargs)
        r.start()
        made.append(r)
        return r

    yield make
    for r in made:
        r.kill9()


@pytest.fixture(scope="module")
def server(binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reprised]:
    """One reprised with DEFAULT_TABLES shared by a module's tests."""
    r = Reprised(binaries["reprised"], tmp_path_factory.mktemp("reprised"), DEFAULT_TABLES)
    r.start()
    yield r
    r.kill9()


@pytest.fixture
def client(server: Reprised) -> Iterator[reprise.Client]:
    with reprise.Client(server.url) as c:
        yield c


def gohelper(binaries: dict[str, Path], *args: str, timeout: float = 120) -> str:
    r = subprocess.run([str(binaries["gohelper"]), *args], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        pytest.fail(f"gohelper {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


async def aclose_while_waiting(s: Any, close: Callable[[], Any] | None = None) -> str:
    """Awaits ``s.__anext__()`` in a task, awaits ``close()`` (by default
    ``s.aclose()``) once the task waits on a request, and says how the task
    ended: "batch", "stop", or "still waiting" 20 s on."""

    async def one() -> str:
        try:
            await s.__anext__()
            return "batch"
        except StopAsyncIteration:
            return "stop"

    task = asyncio.ensure_future(one())
    while s._current is None:
        await asyncio.sleep(0.01)
    await (close or s.aclose)()
    done, _ = await asyncio.wait([task], timeout=20)
    return task.result() if done else "still waiting"


def next_in_thread(it: Any) -> tuple[threading.Thread, list[Any]]:
    """Starts next(it) on a thread; its list gets "batch", "stop" or the
    exception."""
    out: list[Any] = []

    def body() -> None:
        try:
            next(it)
            out.append("batch")
        except StopIteration:
            out.append("stop")
        except BaseException as e:  # noqa: BLE001 - the test reports it
            out.append(e)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


def close_while_waiting(s: Any, close: Callable[[], Any]) -> list[Any]:
    """Calls next(s) on a thread, then close() once it waits on a request
    (s._current); returns how next ended (next_in_thread's list), 20 s on
    at most."""
    t, out = next_in_thread(s)
    wait_for("next() waits on its request", lambda: s._current is not None)
    close()
    t.join(20)
    return out
