"""reprise.torch: ReplayDataset and tensor conversion."""

from __future__ import annotations

import os

import numpy as np
import pytest

if os.environ.get("REPRISE_REQUIRE_TORCH") == "1":
    import torch
else:
    torch = pytest.importorskip("torch")

import reprise
import reprise.torch as rt
from reprise import _codec
from conftest import Reprised


def test_to_tensor_shares_memory_and_keeps_bfloat16() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = rt.to_tensor(a)
    assert t.data_ptr() == a.ctypes.data  # no copy
    bf = np.array([1.5, -2.0], dtype=_codec.DTYPES["bfloat16"])
    tb = rt.to_tensor(bf)
    assert tb.dtype == torch.bfloat16 and tb.tolist() == [1.5, -2.0]
    assert rt.to_tensor(np.array([1, 2], np.uint16)).tolist() == [1, 2]


def test_replay_dataset(server: Reprised) -> None:
    with reprise.Client(server.url) as c:
        c.reset("dtypes")
        with c.trajectory_writer(2) as w:
            for t in range(10):
                w.append({"obs": np.full((2, 2), t, np.float32), "a": np.int64(t)})
                if t:
                    w.create_item("dtypes", 1.0, {"obs": w.history["obs"][-2:], "a": w.history["a"][-1]})
            w.wait_applied(timeout=30)
    pin = torch.cuda.is_available()
    ds = rt.ReplayDataset(server.url, "dtypes", batch_size=16, prefetch=2, device="cpu", pin_memory=pin)
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    for i, b in enumerate(loader):
        assert b.data["obs"].shape == (16, 2, 2, 2) and b.data["obs"].dtype == torch.float32
        assert b.data["a"].shape == (16,) and b.data["a"].device.type == "cpu"
        torch.testing.assert_close(b.data["obs"][:, 1, 0, 0], b.data["a"].float())
        assert b.info["key"].dtype == torch.int64 and b.info["probability"].shape == (16,)
        ds.update_priorities(b.info["key"], torch.ones(16))
        if i == 2:
            break
    ds.close()
