"""check=True with offsets on the GPU: the offsets checked by the reduction kernel that reads them.

A cached plan whose executor ``checks_offsets`` (the nvrtc feature-rows kernels, and
``warp_reduce`` for one column) runs a checked call without the offsets' own pass: the
feature-rows kernels test every segment's bounds as they read them (``checked_bounds`` in
``offsets.cuh``), ``warp_reduce`` every pair of offsets its warps walk (walks that join up
into all of them: see ``warp.cuh``); neither reads nor writes outside the data, the result
or shared memory whatever the offsets hold, and the call waits for the stream once and
reads the verdict.  Layouts ``warp_reduce`` hands to ``tile_reduce`` (rows not 16-byte
aligned) are checked by the one-kernel check into the same word, just before.  Every
verdict here is compared with the host check of the same values (the exact message), every
valid result with a float64 reference, and each test asserts that the kernel's check, not
the separate pass, gave the verdict.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from support import GPU_KINDS, to_kind, to_numpy
from support.calls import count_calls

import linred
from linred.arrays import _device_checks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU_KINDS, reason="needs a GPU (CuPy)")]


@pytest.fixture(params=["fix-up kernel", "fix-up in last block"])
def warp_checks(request, monkeypatch):
    """Fresh plans: those of one-column data check offsets in ``warp_reduce`` (its CHECKED
    variant, which the executor claims: test_which_executors_check_offsets), the runs' walks
    joined by ``linred_fixup`` or by the reduction kernel's last block, whatever the number of
    runs."""
    from linred.backends.nvrtc import executors

    linred.clear_plan_cache()
    monkeypatch.setattr(executors, "FUSED_FIXUP_PASSES", 0 if request.param == "fix-up kernel" else 1 << 40)
    yield
    linred.clear_plan_cache()


def _route_counts(monkeypatch) -> dict[str, int]:
    """Counts, from now on, the checks launched ahead of a reduction (``ahead``) and the waits for
    a whole stream after a checking reduction (``waits``)."""
    counts = count_calls(monkeypatch, _device_checks, "check_ahead", key="ahead")
    return count_calls(monkeypatch, _device_checks, "passed", counts, key="waits")


@pytest.fixture(params=["after the reduction", "ahead"])
def verdict_route(request, monkeypatch):
    """Fresh plans whose checked calls learn the verdict after their reduction (the call waits
    for the stream), or from the one-kernel check enqueued ahead of it (the call waits for that
    check alone: :func:`_device_checks.check_ahead`), whatever the size of the call.  Yields the
    route and the counts of the checks launched ahead and of the waits for a whole stream."""
    counts = _route_counts(monkeypatch)
    if request.param == "ahead":
        monkeypatch.setattr(_device_checks, "AHEAD_MIN_BYTES", 0)
        monkeypatch.setattr(_device_checks, "AHEAD_MAX_OFFSETS_BYTES", float("inf"))
    else:
        monkeypatch.setattr(_device_checks, "AHEAD_MIN_BYTES", 1 << 62)
    linred.clear_plan_cache()
    yield request.param, counts
    linred.clear_plan_cache()


@pytest.fixture
def kernel_checked(monkeypatch):
    """Counts the calls checked by a kernel (:func:`_device_checks.arm`) and those checked by the
    separate pass (:func:`_device_checks.offsets_ok`)."""
    counts = count_calls(monkeypatch, _device_checks, "arm", key="kernel")
    return count_calls(monkeypatch, _device_checks, "offsets_ok", counts, key="pass")


def _host_message(fn, x: np.ndarray, **kwargs) -> str:
    try:
        fn(x, **kwargs)
    except ValueError as e:
        return str(e)
    raise AssertionError(f"the host accepts {kwargs}")


def _reference(reduction: str, x: np.ndarray, offsets: np.ndarray, axis: int) -> np.ndarray:
    x64 = np.moveaxis(x.astype(np.float64), axis, 0)
    op = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[reduction]
    rows = [op(x64[a:b], axis=0) for a, b in itertools.pairwise(offsets)]
    return np.moveaxis(np.stack(rows), 0, axis)


def _offsets(m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """m non-empty segments (the reductions' reference needs no identity)."""
    cuts = np.sort(rng.choice(np.arange(1, n), m - 1, replace=False))
    return np.concatenate([[0], cuts, [n]]).astype(np.int64)


def _broken(good: np.ndarray, n: int, dtype: str) -> list[np.ndarray]:
    """Offsets that break each rule, at the first, a middle and the last segment, with values
    far outside the axis too (a kernel that read them unchecked would read out of bounds)."""
    m = len(good) - 1
    big = np.iinfo(dtype).max
    out = []
    for at in sorted({0, m // 2, m}):
        for value in (good[at] + 1 if at == 0 else good[at - 1] - 1, -5, big, n + 1, -big):
            bad = good.copy()
            bad[at] = value
            out.append(bad)
    if m >= 3:
        bad = good.copy()
        bad[1], bad[2] = -7, -3  # a segment inside [-7, -3): increasing, but outside the axis
        out.append(bad)
    if good[m - 1] + 1 < n:  # a last offset short of n, still non-decreasing
        bad = good.copy()
        bad[m] = good[m - 1] + 1
        out.append(bad)
    if m >= 8:
        # Decreasing runs that a search for a run's first segment may jump over: a quarter of
        # the offsets reversed, and two far apart swapped.
        bad = good.copy()
        bad[m // 4 : m // 2] = bad[m // 4 : m // 2][::-1].copy()
        out.append(bad)
        bad = good.copy()
        bad[1], bad[m - 1] = bad[m - 1], bad[1]
        out.append(bad)
    return out


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("reduction", ["sum", "mean", "max"])
@pytest.mark.parametrize(
    "shape, axis, m",
    [
        ((2000, 64), 0, 32),
        ((2000, 64), 0, 1),
        ((4096,), 0, 4),  # a last offset short of n ends a tile that is not the row's last
        ((513, 4), 0, 300),
        ((3, 400, 16), 1, 7),
        ((50_000, 128), 0, 256),
        # one column: warp_reduce (runs of warp tiles; several rows sharing the offsets)
        ((100_000,), 0, 5000),
        ((100_000,), 0, 1),
        ((3 * 4096 + 5,), 0, 40),
        ((3, 20_000), 1, 300),
    ],
)
def test_kernel_checked_offsets(warp_checks, verdict_route, kernel_checked, kind, dtype, reduction, shape, axis, m):
    rng = np.random.default_rng(m + shape[axis])
    n = shape[axis]
    fn = getattr(linred, f"segmented_{reduction}")
    x = rng.standard_normal(shape).astype(np.float32)
    good = _offsets(m, n, rng)
    xd = to_kind(x, kind)
    fn(xd, offsets=to_kind(good.astype(dtype), kind), axis=axis, backend="nvrtc")  # plans (checked by the pass)
    kernel_checked.update({"kernel": 0, "pass": 0})
    route, counts = verdict_route
    counts.update({"ahead": 0, "waits": 0})
    for bad in _broken(good, n, dtype):
        expected = _host_message(fn, x, offsets=bad.astype(dtype), axis=axis)
        before = kernel_checked["kernel"]
        with pytest.raises(ValueError, match=re.escape(expected)):
            fn(xd, offsets=to_kind(bad.astype(dtype), kind), axis=axis, backend="nvrtc")
        assert kernel_checked["kernel"] == before + 1, f"not checked by the kernel: {bad}"
        # and the next valid call is right (the verdict word was cleared)
        got = fn(xd, offsets=to_kind(good.astype(dtype), kind), axis=axis, backend="nvrtc")
        np.testing.assert_allclose(
            to_numpy(got).astype(np.float64), _reference(reduction, x, good, axis), rtol=2e-5, atol=2e-5
        )
    assert kernel_checked["kernel"] == 2 * len(_broken(good, n, dtype))
    assert kernel_checked["pass"] == 0
    calls = 2 * len(_broken(good, n, dtype))
    if route == "ahead":  # every call checked ahead; only a refused one waits for its stream
        assert counts == {"ahead": calls, "waits": calls // 2}
    else:  # every call waits for its stream
        assert counts == {"ahead": 0, "waits": calls}


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_kernel_checked_lengths(verdict_route, kernel_checked, kind, dtype):
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 40, 100)
    n = int(lengths.sum())
    x = rng.standard_normal((n, 32)).astype(np.float32)
    xd = to_kind(x, kind)
    linred.segmented_sum(xd, lengths=to_kind(lengths.astype(dtype), kind), backend="nvrtc")  # planned
    kernel_checked.update({"kernel": 0, "pass": 0})
    verdict_route[1].update({"ahead": 0, "waits": 0})
    cases = []
    for at in (0, 50, 99):
        for value in (-1, lengths[at] + 1, lengths[at] - 1):
            bad = lengths.copy()
            bad[at] = value
            cases.append(bad)
    if dtype == "int64":  # lengths whose sum wraps around the int64 range
        wrap = lengths.copy()
        wrap[:4] = 1 << 62
        cases.append(wrap)
    for bad in cases:
        expected = _host_message(linred.segmented_sum, x, lengths=bad.astype(dtype))
        with pytest.raises(ValueError, match=re.escape(expected)):
            linred.segmented_sum(xd, lengths=to_kind(bad.astype(dtype), kind), backend="nvrtc")
    got = linred.segmented_sum(xd, lengths=to_kind(lengths.astype(dtype), kind), backend="nvrtc")
    off = np.concatenate([[0], np.cumsum(lengths)])
    np.testing.assert_allclose(to_numpy(got), _reference("sum", x, off, 0), rtol=2e-5, atol=2e-5)
    assert kernel_checked["kernel"] == len(cases) + 1
    assert kernel_checked["pass"] == 0
    route, counts = verdict_route
    if route == "ahead":
        assert counts["ahead"] == len(cases) + 1
        assert counts["waits"] == len(cases)


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_kernel_checked_out_and_a_new_result(verdict_route, kernel_checked, kind):
    """``out=``: a valid call writes it; a broken one raises (``out`` may have been written)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1000, 8)).astype(np.float32)
    good = _offsets(10, 1000, rng)
    xd = to_kind(x, kind)
    out = to_kind(np.zeros((10, 8), np.float32), kind)
    for _ in range(3):  # planned, then cached
        assert linred.segmented_sum(xd, offsets=to_kind(good, kind), out=out, backend="nvrtc") is out
        np.testing.assert_allclose(to_numpy(out), _reference("sum", x, good, 0), rtol=2e-5, atol=2e-5)
    kernel_checked["kernel"] = 0
    bad = good.copy()
    bad[5] = 2000
    with pytest.raises(ValueError, match=re.escape("offsets must be non-decreasing: offsets[6]=")):
        linred.segmented_sum(xd, offsets=to_kind(bad, kind), out=out, backend="nvrtc")
    assert kernel_checked["kernel"] == 1


@pytest.mark.skipif("cupy" not in GPU_KINDS, reason="needs CuPy")
def test_kernel_check_waits_for_the_calls_stream(verdict_route, kernel_checked):
    """Offsets broken on a non-blocking stream just before the call: the verdict is read after
    that stream's work, not the current stream's."""
    import cupy

    n = 1 << 16
    x = cupy.ones((n, 16), cupy.float32)
    good = cupy.linspace(0, n, 257).astype(cupy.int64)
    linred.segmented_sum(x, offsets=good, backend="nvrtc")  # planned
    cupy.cuda.get_current_stream().synchronize()
    kernel_checked.update({"kernel": 0, "pass": 0})
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(20):
            off = cupy.linspace(0, n, 257).astype(cupy.int64)
            if i % 2:
                off[100] = off[101] + 1
            if i % 2:
                with pytest.raises(ValueError, match=r"offsets must be non-decreasing: offsets\[101\]"):
                    linred.segmented_sum(x, offsets=off, stream=stream, backend="nvrtc")
            else:
                assert float(linred.segmented_sum(x, offsets=off, stream=stream, backend="nvrtc").sum()) == n * 16
    assert kernel_checked["kernel"] == 20


@pytest.mark.skipif("torch-cuda" not in GPU_KINDS, reason="needs PyTorch with CUDA")
def test_kernel_checked_offsets_with_autograd():
    """A tensor that requires grad goes through the autograd Function: the same check."""
    import torch

    x = torch.randn(500, 16, device="cuda", dtype=torch.float64, requires_grad=True)
    good = torch.tensor([0, 100, 250, 500], device="cuda")
    linred.segmented_mean(x, offsets=good).sum().backward()
    np.testing.assert_allclose(x.grad[:100].cpu().numpy(), 1 / 100)
    bad = torch.tensor([0, 300, 250, 500], device="cuda")
    with pytest.raises(ValueError, match=re.escape("offsets must be non-decreasing: offsets[2]=250 < offsets[1]=300")):
        linred.segmented_mean(x, offsets=bad)


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("reduction", ["sum", "max"])
@pytest.mark.parametrize("layout", ["one element in", "three elements in", "rows of odd length"])
def test_kernel_checked_rows_not_aligned(warp_checks, verdict_route, kernel_checked, kind, reduction, layout):
    """Data that is not 16-byte aligned.  A view one or three elements in: warp_reduce reads it
    from the boundary before it (its offsets checked as it reads them, the first where the
    shifted segments begin), NaN there reaching no result.  Rows of an odd length, each
    elsewhere past a boundary: warp_reduce hands them to tile_reduce, which does not check
    offsets; they are checked first into the same word."""
    rng = np.random.default_rng(3)
    n = 50_001
    fn = getattr(linred, f"segmented_{reduction}")
    if layout == "rows of odd length":
        x = rng.standard_normal((2, n)).astype(np.float32)
        xd, host, axis = to_kind(x, kind), x, 1
    else:
        skip = 1 if layout == "one element in" else 3
        x = rng.standard_normal(n + skip).astype(np.float32)
        x[:skip] = np.nan
        xd, host, axis = to_kind(x, kind)[skip:], x[skip:], 0
    good = _offsets(700, n, rng)
    fn(xd, offsets=to_kind(good, kind), axis=axis, backend="nvrtc")  # plans
    kernel_checked.update({"kernel": 0, "pass": 0})
    for bad in _broken(good, n, "int64"):
        expected = _host_message(fn, host, offsets=bad, axis=axis)
        with pytest.raises(ValueError, match=re.escape(expected)):
            fn(xd, offsets=to_kind(bad, kind), axis=axis, backend="nvrtc")
        got = fn(xd, offsets=to_kind(good, kind), axis=axis, backend="nvrtc")
        np.testing.assert_allclose(
            to_numpy(got).astype(np.float64), _reference(reduction, host, good, axis), rtol=2e-5, atol=2e-5
        )
    assert kernel_checked["kernel"] == 2 * len(_broken(good, n, "int64"))
    assert kernel_checked["pass"] == 0


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("n, good, bad", [
    (4096, [0, 1000, 2000, 3000, 4096], [0, 1000, 2000, 3000, 3010]),
    (1000, [0, 1000], [0, 5]),
])  # fmt: skip
def test_kernel_checked_short_last_offset(warp_checks, verdict_route, kernel_checked, kind, n, good, bad):
    """The offsets' common mistake, a last offset short of n, in a tile that is not the row's
    last: refused with the host's message, and (under compute-sanitizer) nothing read or written
    out of bounds; the next valid call is right."""
    x = np.arange(n, dtype=np.float32)
    xd = to_kind(x, kind)
    linred.segmented_sum(xd, offsets=to_kind(np.array(good), kind), backend="nvrtc")  # planned
    kernel_checked.update({"kernel": 0, "pass": 0})
    message = f"offsets[-1] must equal the length of axis 0 (n={n}); got {bad[-1]}"
    with pytest.raises(ValueError, match=re.escape(message)):
        linred.segmented_sum(xd, offsets=to_kind(np.array(bad), kind), backend="nvrtc")
    got = linred.segmented_sum(xd, offsets=to_kind(np.array(good), kind), backend="nvrtc")
    np.testing.assert_allclose(to_numpy(got), _reference("sum", x, np.array(good), 0), rtol=1e-6)
    assert kernel_checked == {"kernel": 2, "pass": 0}


def test_which_executors_check_offsets():
    """The executors that claim ``checks_offsets`` are those whose kernels check every offset they
    read: the nvrtc feature-rows executor (``checked_bounds`` on every segment) and the
    one-column ``warp_reduce`` executor (its CHECKED variant; the layouts it hands to
    ``tile_reduce`` are checked first by the one-kernel pass), and no other."""
    from linred.backends.nvrtc import executors

    claims = {name for name, cls in executors.EXECUTORS.items() if getattr(cls, "checks_offsets", False)}
    assert claims == {"features", "warp"}
    assert not getattr(executors._TileExecutor, "checks_offsets", False)


def _valid_offsets(layout: str, n: int, tile: int, rng: np.random.Generator) -> np.ndarray:
    """Valid offsets of ``n`` elements that stress warp_reduce's walks: random cuts with empty
    segments, boundaries on every tile edge (each repeated: empty segments there), one segment."""
    if layout == "random":
        m = max(1, n // 7)
        cuts = np.sort(rng.integers(0, n + 1, m - 1))  # repeats: empty segments, at 0 and n too
        return np.concatenate([[0], cuts, [n]]).astype(np.int64)
    if layout == "tile-edges":
        edges = np.arange(0, n + 1, tile)
        return np.concatenate([[0], np.repeat(edges, 2), [n, n]]).astype(np.int64)
    return np.array([0, n], np.int64)


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32"])
@pytest.mark.parametrize("reduction", ["sum", "mean", "max"])
def test_kernel_checked_valid_offsets_across_tiles(warp_checks, verdict_route, kernel_checked, kind, dtype, reduction):
    """Valid offsets are never refused by warp_reduce's check, and its checked variant gives
    the unchecked variant's exact results: around one warp tile (n at k * T - 1, k * T,
    k * T + 1 for the tile T of the dtype), many runs, a ragged last tile, empty segments at
    0, at n and on every tile edge, one segment; results against a float64 reference too."""
    from linred.backends.nvrtc.kernels import warp_items
    from linred.problem import Problem

    rng = np.random.default_rng(11)
    fn = getattr(linred, f"segmented_{reduction}")
    probe = Problem(reduction, "cupy", 0, dtype, dtype, dtype, 1, 1, 1, (1, 1, 1), 1, None, "int64")
    tile = 32 * warp_items(probe)
    sizes = sorted({tile - 1, tile, tile + 1, 3 * tile + 1, 64 * tile - 1, 64 * tile, 1000 * tile + 1})
    for n in sizes:
        x = rng.integers(-8, 9, n).astype(dtype) if dtype == "int32" else rng.standard_normal(n).astype(dtype)
        xd = to_kind(x, kind)
        for layout in ("random", "tile-edges", "one"):
            good = _valid_offsets(layout, n, tile, rng)
            if reduction != "sum" and (np.diff(good) == 0).any():
                good = np.unique(good)  # (mean and max of an empty segment: compared apart below)
            off = to_kind(good, kind)
            unchecked = to_numpy(fn(xd, offsets=off, check=False, backend="nvrtc"))
            fn(xd, offsets=off, backend="nvrtc")  # planned (the first call's own check)
            before = dict(kernel_checked)
            checked = to_numpy(fn(xd, offsets=off, backend="nvrtc"))
            assert kernel_checked == {"kernel": before["kernel"] + 1, "pass": before["pass"]}, (n, layout)
            np.testing.assert_array_equal(checked, unchecked, err_msg=f"n={n} {layout}")
            want = _reference(reduction, x, good, 0)
            tol = {"float16": 2e-2, "float32": 1e-4}.get(dtype, 1e-9)
            np.testing.assert_allclose(checked.astype(np.float64), want, rtol=tol, atol=tol * np.sqrt(n))


def _plan_of_last_call():
    from linred import _plan_cache

    (plan,) = _plan_cache._plans.values()
    return plan


@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("shape, mean, ahead", [
    ((1 << 24,), 256, True),  # 64 MiB of data, offsets 1/128 of it
    ((1 << 24,), 8, True),  # 16 MiB of offsets, 1/4 of the data: their second read costs less than the wait
    ((1 << 24,), 1, False),  # about 85 MiB of offsets: the call waits for its checking reduction
    ((1 << 20, 16), 64, True),  # feature rows
    ((1 << 16,), 256, False),  # 256 KiB: too short a reduction for the next call to hide behind
])  # fmt: skip
def test_checked_ahead_by_default_where_it_pays(monkeypatch, kind, shape, mean, ahead):
    """With the default thresholds, a large checked call whose offsets are at most 64 MiB takes
    its verdict from the check enqueued ahead of its reduction and waits for no
    stream when they are valid; the others wait for their reduction.  Results against float64,
    broken offsets with the host's message either way, the next valid call right."""
    counts = _route_counts(monkeypatch)
    linred.clear_plan_cache()
    rng = np.random.default_rng(mean)
    n = shape[0]
    x = rng.standard_normal(shape).astype(np.float32)
    good = np.unique(np.concatenate([[0], rng.integers(0, n, n // mean), [n]])).astype(np.int64)
    xd, offd = to_kind(x, kind), to_kind(good, kind)
    linred.segmented_sum(xd, offsets=offd)  # planned
    assert _plan_of_last_call()._ahead is ahead
    for _ in range(3):
        got = linred.segmented_sum(xd, offsets=offd)
    np.testing.assert_allclose(to_numpy(got).astype(np.float64), _reference("sum", x, good, 0), rtol=1e-4, atol=1e-3)
    assert counts == ({"ahead": 3, "waits": 0} if ahead else {"ahead": 0, "waits": 3})
    bad = good.copy()
    bad[len(good) // 2] = n + 1
    with pytest.raises(ValueError, match=re.escape(_host_message(linred.segmented_sum, x, offsets=bad))):
        linred.segmented_sum(xd, offsets=to_kind(bad, kind))
    got = linred.segmented_sum(xd, offsets=offd)
    np.testing.assert_allclose(to_numpy(got).astype(np.float64), _reference("sum", x, good, 0), rtol=1e-4, atol=1e-3)
    linred.clear_plan_cache()


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_checked_ahead_back_to_back_calls_keep_their_verdicts(verdict_route, kind):
    """Calls that return while their reduction runs, queued back to back on one stream with
    valid and broken offsets alternating: each valid call's result is right once the stream
    ends, each broken one raises, and no verdict leaks into the next call."""
    route, counts = verdict_route
    rng = np.random.default_rng(4)
    n = 1 << 20
    x = rng.standard_normal(n).astype(np.float32)
    good = [np.sort(np.concatenate([[0], rng.integers(0, n, 999), [n]])).astype(np.int64) for _ in range(3)]
    xd = to_kind(x, kind)
    linred.segmented_sum(xd, offsets=to_kind(good[0], kind))  # planned
    results = []
    for i in range(12):
        off = good[i % 3]
        if i % 4 == 3:
            bad = off.copy()
            bad[500] = bad[499] - 1
            with pytest.raises(ValueError, match=r"offsets must be non-decreasing: offsets\[500\]"):
                linred.segmented_sum(xd, offsets=to_kind(bad, kind))
        else:
            results.append((linred.segmented_sum(xd, offsets=to_kind(off, kind)), off))
    for got, off in results:
        np.testing.assert_allclose(to_numpy(got).astype(np.float64), _reference("sum", x, off, 0), rtol=1e-4,
                                   atol=1e-4)  # fmt: skip
    if route == "ahead":
        assert counts == {"ahead": 12, "waits": 3}


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_checked_ahead_in_threads(verdict_route, kind):
    """Threads checking ahead at once, each its own offsets (some broken), on its own plan, word
    and event: every thread gets its own verdict and result."""
    import threading

    rng = np.random.default_rng(8)
    n = 1 << 18
    x = rng.standard_normal((n, 4)).astype(np.float32)
    xd = to_kind(x, kind)
    good = np.sort(np.concatenate([[0], rng.integers(0, n, 300), [n]])).astype(np.int64)
    bad = good.copy()
    bad[-1] = n - 1
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(10):
                if (t + i) % 3 == 0:
                    with pytest.raises(ValueError, match=re.escape("offsets[-1] must equal the length of axis 0")):
                        linred.segmented_sum(xd, offsets=to_kind(bad, kind))
                else:
                    got = linred.segmented_sum(xd, offsets=to_kind(good, kind))
                    np.testing.assert_allclose(to_numpy(got).astype(np.float64), _reference("sum", x, good, 0),
                                               rtol=1e-4, atol=1e-4)  # fmt: skip
        except BaseException as e:  # (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_checked_ahead_events_go_with_their_threads(verdict_route, kind):
    """The event a thread's checks ahead record behind them is destroyed when the thread ends
    (threads of a pool come and go): as many cuEventDestroy calls as threads checked ahead."""
    import gc
    import threading
    import time

    route, counts = verdict_route
    rng = np.random.default_rng(9)
    n = 1 << 16
    x = to_kind(rng.standard_normal(n).astype(np.float32), kind)
    off = to_kind(np.sort(np.concatenate([[0], rng.integers(0, n, 99), [n]])).astype(np.int64), kind)
    linred.segmented_sum(x, offsets=off)  # the kernels loaded (and the driver module) in this thread
    driver = _device_checks._driver
    destroyed = []
    real = driver.cuEventDestroy

    class Recording:  # the driver module, with cuEventDestroy counted
        def __getattr__(self, name: str):
            return getattr(driver, name)

        @staticmethod
        def cuEventDestroy(handle):
            destroyed.append(handle)
            return real(handle)

    _device_checks._driver = Recording()
    try:
        before = counts["ahead"]

        errors: list[BaseException] = []

        def work() -> None:
            try:
                for _ in range(3):  # (a thread's first call plans; its next ones check ahead)
                    linred.segmented_sum(x, offsets=off)
            except BaseException as e:  # (reported by the main thread)
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        del threads
        # (a thread's locals go a moment after join returns: the thread state is cleared last)
        for _ in range(100):
            gc.collect()
            if len(destroyed) >= 3 or route != "ahead":
                break
            time.sleep(0.01)
    finally:
        _device_checks._driver = driver
    assert not errors, errors[0]
    assert (counts["ahead"] > before) == (route == "ahead")
    assert len(destroyed) == (3 if route == "ahead" else 0), (route, destroyed)
