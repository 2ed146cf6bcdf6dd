"""Lengths into offsets on the GPU in one launch (``scan.cuh``), against NumPy's int64 cumulative sum.

The kernel scans tiles of ``TILE`` lengths (16 per thread, 256 threads), each tile adding the
sums of the tiles before it through a decoupled look-back: the counts cross the tile at
``k * TILE - 1``, ``k * TILE``, ``k * TILE + 1`` for one, a few and a thousand tiles, int32 and
int64 lengths, negative ones and sums past the int64 range (which wrap, as ``np.cumsum``
does: the offsets' check then finds them decreasing).  The library serves calls of up to
``MAX_LENGTHS`` lengths with it; these tests lift that bound where they scan more (the kernel
must be right at every size).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from support import GPU_KINDS, to_kind, to_numpy
from support.calls import count_calls

import linred
from linred.arrays import _device_scan

TILE = _device_scan.TILE


def test_buffer_layout_and_bound():
    """The offsets, then a tile's sum and prefix (int64 words), then the 4-byte flags; the scan
    serves 1 to MAX_LENGTHS lengths (none: the library makes the single offset)."""
    for m in (0, 1, TILE - 1, TILE, TILE + 1, 5 * TILE + 3):
        tiles = max(1, -(-m // TILE))
        assert _device_scan.words(m) == m + 1 + 2 * tiles + -(-tiles // 2)
    assert TILE == 4096 and _device_scan.MAX_LENGTHS == 1 << 21
    assert not _device_scan.serves(0) and _device_scan.serves(1) and _device_scan.serves(1 << 21)
    assert not _device_scan.serves((1 << 21) + 1)


needs_gpu = pytest.mark.skipif(not GPU_KINDS, reason="needs a GPU (CuPy)")


@pytest.fixture
def scans(monkeypatch):
    """Counts the launches of the one-launch scan (which serves every size here): ``scan`` must
    launch (a False would leave the call to the library's cumulative sum, right but untested)."""
    monkeypatch.setattr(_device_scan, "MAX_LENGTHS", float("inf"))
    return count_calls(monkeypatch, _device_scan, "scan", key="scans", launches="the lengths scan")


def _adapter(kind: str):
    from linred.arrays import adapter_for

    return adapter_for(to_kind(np.zeros(1, np.int64), kind))


def _want(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize(
    "m", [0, 1, 2, 17, TILE - 1, TILE, TILE + 1, 2 * TILE - 1, 3 * TILE + 1, 1000 * TILE - 1, 1000 * TILE + 17]
)
def test_scan_is_the_cumulative_sum(scans, kind, dtype, m):
    rng = np.random.default_rng(m)
    lengths = rng.integers(-5, 100, m).astype(dtype)
    got = _adapter(kind).lengths_to_offsets(to_kind(lengths, kind))
    assert scans["scans"] == (m > 0)
    np.testing.assert_array_equal(to_numpy(got), _want(lengths))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
def test_scan_wraps_past_the_int64_range_as_cumsum_does(scans, kind):
    rng = np.random.default_rng(2)
    lengths = rng.integers(1 << 60, 1 << 62, 3 * TILE + 5).astype(np.int64)
    with np.errstate(over="ignore"):
        want = _want(lengths)
    got = to_numpy(_adapter(kind).lengths_to_offsets(to_kind(lengths, kind)))
    np.testing.assert_array_equal(got, want)
    assert (got[1:] < got[:-1]).any()  # (wrapped: decreasing offsets, which a checked call refuses)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
def test_strided_lengths_take_the_library_scan(scans, kind):
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 50, 2 * TILE + 2).astype(np.int64)
    got = _adapter(kind).lengths_to_offsets(to_kind(lengths, kind)[::2])
    assert scans["scans"] == 0
    np.testing.assert_array_equal(to_numpy(got), _want(lengths[::2]))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.skipif("cupy" not in GPU_KINDS, reason="needs CuPy")
def test_scans_in_flight_on_two_streams(scans):
    """Two scans queued at once on two non-blocking streams (each with its own state), then a
    third on the first stream: every one right, every one the kernel's."""
    import cupy

    from linred.arrays._cupy import CUPY

    rng = np.random.default_rng(4)
    a = rng.integers(0, 1000, 5000 * TILE + 3).astype(np.int64)
    b = rng.integers(0, 1000, 3000 * TILE + 1).astype(np.int32)
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    da, db = cupy.asarray(a), cupy.asarray(b)
    cupy.cuda.get_current_stream().synchronize()
    with s1:
        ra = CUPY.lengths_to_offsets(da)
    with s2:
        rb = CUPY.lengths_to_offsets(db)
    with s1:
        rc = CUPY.lengths_to_offsets(db)
    s1.synchronize()
    s2.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(ra), _want(a))
    np.testing.assert_array_equal(cupy.asnumpy(rb), _want(b))
    np.testing.assert_array_equal(cupy.asnumpy(rc), _want(b))
    assert scans["scans"] == 3


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("check", [True, False])
def test_lengths_calls_through_the_scan(scans, kind, check):
    """``lengths=`` calls (planned, then cached) take their offsets from the scan: results against
    float64, and (checked) broken lengths refused with the host's message."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 40, 3 * TILE + 7)
    n = int(lengths.sum())
    x = rng.standard_normal((n, 3)).astype(np.float32)
    xd = to_kind(x, kind)
    off = _want(lengths)
    want = np.stack([x[a:b].astype(np.float64).sum(0) for a, b in itertools.pairwise(off)])
    for _ in range(2):
        got = linred.segmented_sum(xd, lengths=to_kind(lengths, kind), check=check)
        np.testing.assert_allclose(to_numpy(got), want, rtol=1e-5, atol=1e-5)
    assert scans["scans"] >= 2
    if check:
        bad = lengths.copy()
        bad[TILE + 3] = -1
        with pytest.raises(ValueError, match=r"lengths must be non-negative: lengths\[4099\]=-1"):
            linred.segmented_sum(xd, lengths=to_kind(bad, kind))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
def test_the_library_scans_past_the_bound(monkeypatch, kind):
    """Past MAX_LENGTHS lengths (here lowered) the array library's cumulative sum makes the
    offsets; at the bound the kernel does; both right."""
    monkeypatch.setattr(_device_scan, "MAX_LENGTHS", TILE + 1)
    counts = count_calls(monkeypatch, _device_scan, "scan", key="scans", launches="the lengths scan")
    rng = np.random.default_rng(6)
    for m, scanned in ((TILE + 1, 1), (TILE + 2, 0)):
        counts["scans"] = 0
        lengths = rng.integers(0, 100, m)
        got = _adapter(kind).lengths_to_offsets(to_kind(lengths, kind))
        np.testing.assert_array_equal(to_numpy(got), _want(lengths))
        assert counts["scans"] == scanned


@pytest.mark.gpu
@needs_gpu
@pytest.mark.skipif("torch-cuda" not in GPU_KINDS, reason="needs PyTorch with CUDA")
def test_torch_lengths_calls_on_a_named_stream_and_in_a_graph(scans):
    """A lengths= call with stream= (the scan on that stream) and one captured in a CUDA graph
    (check=False: the memset and the kernel captured, replayed with new lengths in the same
    buffer), each right."""
    import torch

    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 30, 2 * TILE + 5)
    n = int(lengths.sum())
    x = torch.as_tensor(rng.standard_normal(n).astype(np.float32), device="cuda")
    lt = torch.as_tensor(lengths, device="cuda")
    total = np.concatenate([[0.0], np.cumsum(x.cpu().numpy().astype(np.float64))])
    off = _want(lengths)
    want = total[off[1:]] - total[off[:-1]]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    got = linred.segmented_sum(x, lengths=lt, stream=side)
    side.synchronize()
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-5, atol=1e-4)
    capturing = torch.cuda.Stream()
    capturing.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capturing):  # (planned outside the capture, on the stream that captures)
        linred.segmented_sum(x, lengths=lt, check=False)
    capturing.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capturing):
        captured = linred.segmented_sum(x, lengths=lt, check=False)
    other = np.roll(lengths, 1)
    lt.copy_(torch.as_tensor(other, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    off = _want(other)
    want = total[off[1:]] - total[off[:-1]]
    np.testing.assert_allclose(captured.cpu().numpy(), want, rtol=1e-5, atol=1e-4)
    assert scans["scans"] == 3  # (the named stream's call, the warm-up and the captured one)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.skipif("torch-cuda" not in GPU_KINDS, reason="needs PyTorch with CUDA")
@pytest.mark.parametrize("name", ["sum", "softmax", "argmax", "var"])
def test_compiled_cuda_lengths_calls_trace(name):
    """torch.compile(fullgraph=True) of a call with CUDA lengths traces (inside the trace the
    offsets come from torch.cumsum, which TorchDynamo can trace; the scan's launch it cannot),
    and gives the eager result."""
    import torch

    rng = np.random.default_rng(8)
    lengths = rng.integers(1, 20, 300)
    x = torch.as_tensor(rng.standard_normal(int(lengths.sum())), device="cuda")
    lt = torch.as_tensor(lengths, device="cuda")
    fn = getattr(linred, f"segmented_{name}")
    torch._dynamo.reset()
    compiled = torch.compile(lambda t, ln: fn(t, lengths=ln), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, lt), fn(x, lengths=lt))
