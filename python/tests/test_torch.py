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


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_unsigned_columns_come_as_usable_tensors(dtype: type) -> None:
    """uint16 and uint32 (actions, say) are widened to signed types torch
    computes with: from torch 2.3 on they came as torch.uint16/uint32,
    which have no arithmetic, indexing or gather, so a learner's
    q.gather(1, action) that worked on torch 2.2 failed."""
    a = rt.to_tensor(np.array([0, 2, np.iinfo(dtype).max], dtype))
    assert not a.is_floating_point() and a.dtype.is_signed
    assert a.tolist() == [0, 2, int(np.iinfo(dtype).max)]
    q = torch.arange(12.0).reshape(3, 4)
    assert q.gather(1, a[:2, None].long()).ravel().tolist() == [0.0, 6.0]
    assert (a[:2] + 1).tolist() == [1, 3]


def test_uint64_is_reinterpreted_as_keys_are() -> None:
    """uint64 becomes int64 with the same bits on every torch, without a
    copy: torch before 2.3 has no uint64, and torch.uint64 after has next
    to no operations."""
    big = np.array([2**63 + 7, 5], np.uint64)
    t = rt.to_tensor(big)
    assert t.dtype == torch.int64 and t.data_ptr() == big.ctypes.data
    np.testing.assert_array_equal(t.numpy().view(np.uint64), big)


def test_to_tensor_takes_either_byte_order() -> None:
    """The decoder's dtypes are little-endian by name; torch.from_numpy
    refused an array in the byte order that is not the host's."""
    for dt in (">f4", "<f4", ">i8", ">u4"):
        a = np.array([1, 2, 3], dt)
        assert rt.to_tensor(a).tolist() == [1, 2, 3]


def fill_dtypes(url: str) -> None:
    """Nine items in table dtypes: two steps of obs (2x2, filled with the
    step), the last step's a."""
    with reprise.Client(url) as c:
        c.reset("dtypes")
        with c.trajectory_writer(2) as w:
            for t in range(10):
                w.append({"obs": np.full((2, 2), t, np.float32), "a": np.int64(t)})
                if t:
                    w.create_item("dtypes", 1.0, {"obs": w.history["obs"][-2:], "a": w.history["a"][-1]})
            w.wait_applied(timeout=30)


def test_replay_dataset(server: Reprised) -> None:
    fill_dtypes(server.url)
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


def test_forked_workers_make_their_own_clients(server: Reprised) -> None:
    """DataLoader workers forked after the main process made its client
    (update_priorities in the training loop) each make their own: the
    copy they inherit has no event-loop thread and shares the parent's
    socket. A worker that used it waited for ever."""
    fill_dtypes(server.url)
    ds = rt.ReplayDataset(server.url, "dtypes", batch_size=4, timeout=30)
    first = next(iter(ds))
    ds.update_priorities(first.info["key"], torch.ones(4))  # the main process's client
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60
    )
    for _ in range(2):  # a new iterator forks new workers
        for i, b in enumerate(loader):
            assert b.data["a"].shape == (4,)
            ds.update_priorities(b.info["key"], torch.ones(4))
            if i == 3:
                break
    ds.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_replay_dataset_on_cuda(server: Reprised) -> None:
    """Batches reach the GPU through pinned memory, hold what was inserted
    (bfloat16 too), own their memory (writing one changes no other batch
    nor a later one), and their GPU keys update priorities."""
    n = 64
    bf16 = _codec.DTYPES["bfloat16"]
    with reprise.Client(server.url) as c:
        c.reset("dtypes")
        with c.trajectory_writer(1) as w:
            for t in range(n):
                w.append({"obs": np.full((3, 5), t, np.float32), "half": np.full(4, t, bf16), "a": np.int64(t)})
                w.create_item("dtypes", 1.0, {k: w.history[k][-1] for k in ("obs", "half", "a")})
            w.wait_applied(timeout=30)

        ds = rt.ReplayDataset(server.url, "dtypes", batch_size=32, prefetch=4, device="cuda", pin_memory=True)
        assert ds.pin_memory

        def check(b: rt.TensorBatch) -> None:
            obs, half, a = b.data["obs"], b.data["half"], b.data["a"]
            assert all(t.is_cuda for t in (obs, half, a, b.info["key"], b.info["probability"]))
            assert obs.shape == (32, 3, 5) and half.dtype == torch.bfloat16 and a.dtype == torch.int64
            assert 0 <= int(a.min()) and int(a.max()) < n
            torch.testing.assert_close(obs, a.float()[:, None, None].expand(-1, 3, 5))
            torch.testing.assert_close(half.float(), a.float()[:, None].expand(-1, 4))

        batches = ds.__iter__()
        first = [next(batches) for _ in range(4)]
        torch.cuda.synchronize()
        for b in first:
            check(b)
        kept = [{k: v.clone() for k, v in b.data.items()} for b in first[1:]]
        for v in first[0].data.values():
            v.fill_(-1)
        later = next(batches)
        torch.cuda.synchronize()
        check(later)
        for b, k in zip(first[1:], kept):
            for name, v in k.items():
                assert torch.equal(b.data[name], v), name

        keys = first[1].info["key"]
        ds.update_priorities(keys, torch.full(keys.shape, 7.0, device="cuda"))
        updated = set(keys.cpu().numpy().view(np.uint64).tolist())
        after = c.sample_batch("dtypes", 256, timeout=5)
        seen = np.isin(after.info.key, np.fromiter(updated, np.uint64))
        assert seen.any()
        np.testing.assert_array_equal(after.info.priority[seen], 7.0)
        assert (after.info.priority[~seen] == 1.0).all()
        batches.close()
        ds.close()
