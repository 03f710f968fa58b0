"""Writer faults found in review: each test fails on the code before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import reprise
from conftest import DEFAULT_TABLES, Reprised, wait_for


@pytest.fixture
def roles_server(binaries: Any, tmp_path: Path) -> Any:
    r = Reprised(binaries["reprised"], tmp_path, DEFAULT_TABLES,
                 ["--embedded-user", "actor:bob:s3cret", "--embedded-user", "learner:alice:s3cret"])
    r.start(wait=False)

    def ready() -> bool:
        assert r.proc is not None
        if r.proc.poll() is not None:
            pytest.fail(f"reprised exited with {r.proc.returncode}:\n{r.log()}")
        with reprise.Client(r.url, user="alice", password="s3cret", connect_timeout=1) as c:
            c.server_info(timeout=1)
        return True

    wait_for("reprised with users to answer", ready, 60)
    yield r
    r.kill9()


def test_denied_writer_keeps_failing_after_its_error_was_taken(roles_server: Reprised) -> None:
    """A writer whose inserts the role refuses loses every later item too:
    once its denial was raised, a later flush must not return as if the
    items it waited for were stored. It returned, losing them silently."""
    with reprise.Client(roles_server.url, user="alice", password="s3cret") as learner:
        w = learner.trajectory_writer(1, linger=0.0)
        w.append({"x": np.int64(0)})
        w.create_item("replay", 1.0, {"x": w.history["x"][-1]})
        with pytest.raises(reprise.PermissionDeniedError):
            w.flush(timeout=30)
        # The denial was reported; the writer is still open and takes items.
        w.append({"x": np.int64(1)})
        try:
            w.create_item("replay", 1.0, {"x": w.history["x"][-1]})
        except reprise.PermissionDeniedError:
            pass  # raising at once is as good
        else:
            with pytest.raises(reprise.PermissionDeniedError) as e:
                w.flush(timeout=30)
            # A loss, as every message given up on is.
            assert isinstance(e.value, reprise.NotStoredError) and e.value.subject.endswith(".data.insert")
        with pytest.raises(reprise.RepriseError):
            w.close(timeout=10)
