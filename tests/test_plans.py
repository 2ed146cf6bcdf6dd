"""Plans (linred.SegmentedReduction) and the functions' plan cache."""

from __future__ import annotations

import gc
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from support import (
    HAS_TORCH,
    REDUCTIONS,
    Refused,
    assert_reduction,
    call_or_refused,
    empty_like_kind,
    expected_dtype,
    make_data,
    run_or_refused,
    segment_bounds,
    to_kind,
)

import linred
import linred.backends as registry

SPECS = {
    "fixed": {"segment_length": 4},
    "offsets": {"offsets": [0, 0, 5, 5, 13, 24, 24]},
    "lengths": {"lengths": [3, 0, 21]},
}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("how", list(SPECS))
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_plan_runs_on_new_arrays(array_kind, backend, reduction, how, dtype, rng):
    kwargs = SPECS[how]
    bounds = segment_bounds(24, **kwargs)
    example = to_kind(make_data(dtype, (24, 3), rng), array_kind)
    plan = run_or_refused(linred.SegmentedReduction, example, backend=backend, reduction=reduction, **kwargs)
    with plan:
        assert plan.backend in registry.BACKENDS
        if backend != "auto":
            assert plan.backend == backend
        assert plan.reduction == reduction
        assert plan.out_shape == (len(bounds), 3)
        assert plan.out_dtype == expected_dtype(reduction, dtype)
        for _ in range(3):
            x_np = make_data(dtype, (24, 3), rng)
            x = to_kind(x_np, array_kind)
            assert_reduction(plan(x), reduction, x_np, segments=bounds, like=x)
        out = empty_like_kind(array_kind, plan.out_shape, plan.out_dtype)
        x_np = make_data(dtype, (24, 3), rng)
        got = plan.execute(to_kind(x_np, array_kind), out=out)
        assert got is out
        assert_reduction(got, reduction, x_np, segments=bounds)
    assert "freed" in repr(plan)
    with pytest.raises(RuntimeError, match="has been freed"):
        plan(example)
    plan.free()  # freeing twice is harmless


def test_plan_auto_resolves_to_a_backend(array_kind):
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    with linred.SegmentedReduction(x, 4) as plan:
        assert plan.backend != "auto"
        assert plan.backend in registry.BACKENDS
        assert plan.backend in repr(plan)


def test_plan_axis_and_dtype(array_kind, backend, rng):
    x_np = make_data("float32", (2, 24, 3), rng)
    x = to_kind(x_np, array_kind)
    kwargs = {"offsets": [0, 0, 5, 5, 13, 24, 24]}
    plan = run_or_refused(
        linred.SegmentedReduction, x, backend=backend, axis=1, reduction="mean", dtype="float64", **kwargs
    )
    with plan:
        assert plan.out_shape == (2, 6, 3)
        assert plan.out_dtype == "float64"
        assert_reduction(plan(x), "mean", x_np, segments=segment_bounds(24, **kwargs), axis=1, dtype="float64", like=x)


def _plan_mismatches(kind: str) -> dict:
    base = to_kind(np.zeros((24, 3), dtype=np.float32), kind)
    wide = to_kind(np.zeros((24, 6), dtype=np.float32), kind)
    cases = {
        "shape": (to_kind(np.zeros((28, 3), dtype=np.float32), kind), ValueError, r"x must have the shape of .*got"),
        "features": (to_kind(np.zeros((24, 4), dtype=np.float32), kind), ValueError, r"x must have the shape"),
        "dtype": (
            to_kind(np.zeros((24, 3), dtype=np.float64), kind),
            ValueError,
            r"x must have the dtype of .*float32",
        ),
        "strides": (wide[:, ::2], ValueError, r"x must have the strides of the array the plan was built for"),
        "string": ("abc", TypeError, r"x must be a NumPy, CuPy or PyTorch array"),
    }
    if kind != "numpy":
        cases["numpy array"] = (np.zeros((24, 3), np.float32), TypeError, r"x must be a .* like the array the plan")
    elif HAS_TORCH:
        import torch

        cases["tensor"] = (torch.zeros((24, 3)), TypeError, r"x must be a numpy\.ndarray like the array the plan")
    del base
    return cases


@pytest.mark.parametrize("case", ["shape", "features", "dtype", "strides", "string", "numpy array", "tensor"])
def test_plan_rejects_other_layouts(array_kind, case):
    cases = _plan_mismatches(array_kind)
    if case not in cases:
        pytest.skip(f"not applicable to {array_kind}")
    x, error, match = cases[case]
    example = to_kind(np.zeros((24, 3), dtype=np.float32), array_kind)
    with linred.SegmentedReduction(example, 4) as plan, pytest.raises(error, match=match):
        plan(x)


def test_plan_rejects_a_byte_swapped_or_unaligned_array_in_words():
    """A byte-swapped or unaligned array (same shape, dtype name and strides) is refused with a
    message that says so, not with the name of an internal field ("plain")."""
    x = np.arange(8.0)
    with linred.SegmentedReduction(x, 2) as plan:
        with pytest.raises(ValueError, match="x must be aligned, in native byte order like the array the plan"):
            plan(x.astype(">f8"))
        raw = np.zeros(8 * 8 + 1, np.uint8)[1:].view(np.float64)  # (unaligned)
        assert not raw.flags.aligned
        with pytest.raises(ValueError, match="got one unaligned or byte-swapped"):
            plan(raw)


def test_plan_bad_arguments(array_kind):
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    with pytest.raises(ValueError, match=r"reduction must be one of 'sum', 'mean', 'max', 'min', 'prod'; got 'std'"):
        linred.SegmentedReduction(x, 4, reduction="std")
    with pytest.raises(ValueError, match=r"offsets must be non-decreasing"):
        linred.SegmentedReduction(x, offsets=[0, 8, 4, 12])
    with pytest.raises(TypeError, match=r"exactly one of segment_length, offsets or lengths"):
        linred.SegmentedReduction(x)
    with pytest.raises(ValueError, match=r"backend must be one of"):
        linred.SegmentedReduction(x, 4, backend="fast")


def test_plan_keeps_no_reference_to_the_example():
    x = np.arange(12, dtype=np.float32)
    ref = weakref.ref(x)
    plan = linred.SegmentedReduction(x, 4)
    del x
    gc.collect()
    assert ref() is None
    np.testing.assert_array_equal(plan(np.ones(12, np.float32)), [4, 4, 4])
    plan.free()


def test_plan_binds_offsets_at_plan_time(array_kind):
    """The plan uses the offsets it was built (and checked) with, whatever happens to the caller's array later."""
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    offsets = to_kind(np.array([0, 4, 12]), array_kind)
    with linred.SegmentedReduction(x, offsets=offsets) as plan:
        np.testing.assert_array_equal(np.asarray(plan(x).tolist()), [6, 60])
        offsets[1] = 8
        np.testing.assert_array_equal(np.asarray(plan(x).tolist()), [6, 60])


def test_plan_with_lengths_and_check_false(array_kind):
    x = to_kind(np.arange(12, dtype=np.float32), array_kind)
    with linred.SegmentedReduction(x, lengths=[2, 0, 10], check=False, reduction="max") as plan:
        np.testing.assert_array_equal(np.asarray(plan(x).tolist()), [1, -np.inf, 11])


# ---------------------------------------------------------------------------
# The functions' plan cache
# ---------------------------------------------------------------------------


def test_cache_hits(clean_plan_cache):
    x = np.arange(24, dtype=np.float32)
    info = linred.plan_cache_info()
    assert set(info) == {"size", "maxsize", "hits", "misses"}
    assert info["size"] == 0 and info["maxsize"] == 64
    linred.segmented_sum(x, 4)
    after_first = linred.plan_cache_info()
    assert after_first["misses"] == info["misses"] + 1
    assert after_first["size"] == 1
    for i in range(5):
        linred.segmented_sum(x + i, 4)  # same layout, new data: no new plan
    after = linred.plan_cache_info()
    assert after["hits"] == after_first["hits"] + 5
    assert after["misses"] == after_first["misses"]
    assert after["size"] == 1
    linred.segmented_sum(x, 6)  # another problem
    assert linred.plan_cache_info()["misses"] == after_first["misses"] + 1


def test_repeated_calls_with_out_skip_the_checks_only_for_an_out_already_checked(
    array_kind, backend, clean_plan_cache, monkeypatch
):
    """A repeated fixed-length call with ``out`` takes the fast path when ``out`` is described
    like one already checked (same type, shape, strides, dtype, device and writeability); any
    other ``out`` is checked again and refused with the usual error."""
    import linred._plan_cache
    import linred.plan

    rng = np.random.default_rng(11)
    x = to_kind(make_data("float32", (64, 3), rng), array_kind)
    out = empty_like_kind(array_kind, (16, 3), "float32")
    got = run_or_refused(linred.segmented_sum, x, 4, out=out, backend=backend)
    assert got is out
    prepared = []
    real_request = linred._plan_cache.request
    monkeypatch.setattr(linred._plan_cache, "request", lambda *a, **k: prepared.append(1) or real_request(*a, **k))
    checked = []  # the plan's own check of an out that is not described like the one it expects
    real_check_out = linred.plan.check_out
    monkeypatch.setattr(linred.plan, "check_out", lambda *a: checked.append(1) or real_check_out(*a))
    for _ in range(3):
        data = make_data("float32", (64, 3), rng)
        other = empty_like_kind(array_kind, (16, 3), "float32")  # a new buffer, described the same
        assert linred.segmented_sum(to_kind(data, array_kind), 4, out=other, backend=backend) is other
        assert_reduction(other, "sum", data, segments=segment_bounds(64, segment_length=4), like=x)
    assert prepared == checked == []  # all three ran their plan without a check
    with pytest.raises(ValueError, match=r"out must have shape \(16, 3\); got \(8, 3\)"):
        linred.segmented_sum(x, 4, out=empty_like_kind(array_kind, (8, 3), "float32"), backend=backend)
    with pytest.raises(ValueError, match=r"out must have dtype float32; got float64"):
        linred.segmented_sum(x, 4, out=empty_like_kind(array_kind, (16, 3), "float64"), backend=backend)
    with pytest.raises(ValueError, match=r"out must be C-contiguous"):
        wide = empty_like_kind(array_kind, (16, 6), "float32")
        linred.segmented_sum(x, 4, out=wide[:, ::2], backend=backend)
    with pytest.raises(TypeError, match=r"out must be a"):
        linred.segmented_sum(x, 4, out=[0.0] * 48, backend=backend)
    # Each was checked by a plan's check of out, without validating the call again.  (CPU tensors
    # run as NumPy views; an out that is no tensor takes the tensor's own route, to be refused
    # naming the tensor type, whose plan is made there: one request.)
    viewed = array_kind == "torch-cpu" and backend in ("auto", "numpy")
    assert len(checked) == 4 and len(prepared) == viewed
    if array_kind == "numpy":
        frozen = np.empty((16, 3), np.float32)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match=r"out must be writeable"):
            linred.segmented_sum(x, 4, out=frozen, backend=backend)


def test_cache_is_bounded(clean_plan_cache):
    linred.set_plan_cache_size(2)
    assert linred.plan_cache_info()["maxsize"] == 2
    x = np.arange(24, dtype=np.float32)
    for L in (1, 2, 3, 4, 6, 8, 12, 24):
        np.testing.assert_array_equal(linred.segmented_sum(x, L), x.reshape(-1, L).sum(1))
        assert linred.plan_cache_info()["size"] <= 2
    linred.set_plan_cache_size(1)
    assert linred.plan_cache_info()["size"] <= 1
    linred.set_plan_cache_size(0)
    assert linred.plan_cache_info()["size"] == 0
    np.testing.assert_array_equal(linred.segmented_sum(x, 4), x.reshape(-1, 4).sum(1))
    assert linred.plan_cache_info()["size"] == 0


def test_clear_plan_cache_keeps_the_size(clean_plan_cache):
    linred.set_plan_cache_size(16)
    linred.segmented_sum(np.arange(12.0), 4)
    linred.clear_plan_cache()
    info = linred.plan_cache_info()
    assert info["size"] == 0
    assert info["maxsize"] == 16


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8", None])
def test_set_plan_cache_size_rejects(bad, clean_plan_cache):
    with pytest.raises(ValueError, match=r"maxsize must be a non-negative integer; got"):
        linred.set_plan_cache_size(bad)


def test_threads(array_kind, backend, clean_plan_cache):
    """8 threads call concurrently on different data and layouts; every result is right."""
    rng = np.random.default_rng(7)
    jobs = []
    for i in range(64):
        reduction = REDUCTIONS[i % 4]
        L = (1, 2, 3, 4)[(i // 4) % 4]
        kwargs = {"segment_length": L} if i % 8 < 4 else {"offsets": [0, 0, L, 12, 12]}
        x_np = make_data("float32", (12, 2), rng)
        jobs.append((reduction, x_np, kwargs))
    barrier = threading.Barrier(8)

    def work(k: int):
        barrier.wait()
        results, refusals = [], []
        for reduction, x_np, kwargs in jobs[k::8]:
            x = to_kind(x_np, array_kind)
            fn = getattr(linred, f"segmented_{reduction}")
            try:
                results.append((reduction, x_np, kwargs, x, call_or_refused(fn, x, backend=backend, **kwargs)))
            except Refused as r:  # documented (auto and numpy never refuse: call_or_refused fails them)
                refusals.append(r)
        return results, refusals

    with ThreadPoolExecutor(8) as pool:
        outcomes = [f.result() for f in [pool.submit(work, k) for k in range(8)]]
    checked = 0
    refused = [r for _, refusals in outcomes for r in refusals]
    for results, _ in outcomes:
        for reduction, x_np, kwargs, x, got in results:
            assert_reduction(got, reduction, x_np, segments=segment_bounds(12, **kwargs), like=x)
            checked += 1
    if backend in ("numpy", "auto"):
        assert checked == len(jobs)
    if refused:  # what was served is right, but not every call was: declared, not passed
        whats = sorted({r.what for r in refused})
        pytest.skip(f"{backend} refused {len(refused)} of {len(jobs)} calls (declared): {', '.join(whats)}")


def test_cache_eviction_never_frees_a_plan_in_use(monkeypatch, clean_plan_cache):
    """Thread A has looked up its plan; thread B's call evicts it from a full cache; A's call still works."""
    import linred.plan as plan_module

    linred.set_plan_cache_size(1)
    looked_up = threading.Event()
    evicted = threading.Event()
    original = plan_module.SegmentedReduction._setup

    def setup(plan, req, x):  # each plan's run step (a method, or a closure made for host data) pauses A
        original(plan, req, x)
        run = plan._run

        def paused_run(x, out, handle, segments, named=False):
            if threading.current_thread().name == "A":
                looked_up.set()
                assert evicted.wait(10)
            return run(x, out, handle, segments, named)

        plan._run = paused_run

    monkeypatch.setattr(plan_module.SegmentedReduction, "_setup", setup)
    results = {}

    def a():
        try:
            results["A"] = linred.segmented_sum(np.arange(12, dtype=np.float32), 4)
        except Exception as e:
            results["A"] = e

    thread = threading.Thread(target=a, name="A")
    thread.start()
    assert looked_up.wait(10)
    results["B"] = linred.segmented_sum(np.arange(12, dtype=np.float64), 6)  # another problem: evicts A's plan
    evicted.set()
    thread.join(10)
    np.testing.assert_array_equal(results["B"], [15, 51])
    assert not isinstance(results.get("A"), Exception), f"the evicted plan was freed while in use: {results['A']!r}"
    np.testing.assert_array_equal(results["A"], [6, 22, 38])


def test_the_first_call_with_a_librarys_array_is_cached():
    """The first PyTorch tensor of a process (linred imported after torch: the operator is
    registered, the tensor adapter not yet) plans once; its next call finds that plan."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    code = (
        "import torch, linred\n"
        "x = torch.ones(12)\n"
        "linred.segmented_sum(x, 4); linred.segmented_sum(x, 4)\n"
        "info = linred.plan_cache_info()\n"
        "print(info['misses'], info['hits'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1"]


def test_checked_calls_take_the_verdict_ahead_only_where_it_pays():
    """The rule of :func:`linred.arrays._device_checks.ahead_pays`: a large call (at least 32 MiB
    of data) whose offsets are at most 64 MiB checks them ahead of its reduction (the extra read
    grows with the offsets, the host gap it saves does not); a small call, or one with more
    offsets (short segments in a very large call), waits for its checking reduction.  Host plans
    never do either."""
    import numpy as np

    from linred import _plan_cache
    from linred.arrays._device_checks import AHEAD_MAX_OFFSETS_BYTES, AHEAD_MIN_BYTES, ahead_pays

    assert (AHEAD_MIN_BYTES, AHEAD_MAX_OFFSETS_BYTES) == (32 << 20, 64 << 20)
    gib = 1 << 30
    assert ahead_pays(gib, gib // 1024)  # float32 segments of 2048 values, int64 offsets
    assert ahead_pays(gib, gib // 16)  # segments of 32 float32 values
    assert not ahead_pays(gib, gib // 8)  # segments of 16 float32 values: 128 MiB of offsets
    assert ahead_pays(gib // 16, gib // 128)  # 2^24 float32 values in segments of 16
    assert ahead_pays(4 * gib, 64 << 20) and not ahead_pays(4 * gib, (64 << 20) + 8)
    assert ahead_pays(32 << 20, 1 << 20)
    assert not ahead_pays((32 << 20) - 1, 8)
    linred.clear_plan_cache()
    x = np.ones(1 << 23, np.float32)  # 32 MiB on the host: checked there, with no device to wait for
    linred.segmented_sum(x, offsets=np.array([0, 1 << 22, 1 << 23]))
    (plan,) = _plan_cache._plans.values()
    assert plan._ahead is False
    linred.clear_plan_cache()


@pytest.mark.parametrize("library", ["jax", "dask"])
def test_plans_refuse_jax_and_dask_arrays_saying_where_they_are_served(library):
    """The functions take JAX and Dask arrays (through DLPack, chunk by chunk); a plan does not,
    and says so, rather than asking for a JAX or Dask array."""
    if library == "jax":
        jnp = pytest.importorskip("jax.numpy")
        x = jnp.arange(8.0)
    else:
        da = pytest.importorskip("dask.array")
        x = da.from_array(np.arange(8.0), chunks=4)
    with pytest.raises(TypeError, match=r"^SegmentedReduction takes NumPy, CuPy and PyTorch arrays; got .*: JAX and "
                       r"Dask arrays are reduced by the functions"):  # fmt: skip
        linred.SegmentedReduction(x, 2)


def test_a_plan_is_neither_pickled_nor_copied():
    """A plan holds its backend's resources: pickling or copying it raises a TypeError that says so
    (not the first unpicklable attribute's error), before and after free()."""
    import copy
    import pickle

    plan = linred.SegmentedReduction(np.arange(6.0), 3)
    for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot be pickled"):
            attempt(plan)
    np.testing.assert_array_equal(plan(np.arange(6.0)), [3.0, 12.0])
    plan.free()
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(plan)
