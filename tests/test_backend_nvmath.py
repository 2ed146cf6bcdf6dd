"""The nvmath backend: host products on MKL, its layouts and refusals, and its GPU executors.

The whole contract runs through ``test_reductions.py`` (nvmath is one of the
host backends there, and one of the GPU backends on a GPU).  This file covers
what is particular to nvmath:

- host results for every form of :mod:`linred.backends._nvmath_layout` (rows,
  batched rows, chunked long rows, features, columns, complex as real parts);
- the refusals and their reasons;
- the layout and dtype decisions for GPU problems, as pure functions;
- the GPU executors' orchestration (views, re-planning for alignment,
  temporaries, conjugate views, mean division), run on the CPU with nvmath's
  GPU classes replaced by CPU stand-ins;
- on a GPU (marked ``gpu``): the real thing on CuPy and PyTorch data.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
from typing import Any, ClassVar

import numpy as np
import pytest
from conftest import HAS_CUPY_GPU, HAS_TORCH, HAS_TORCH_CUDA, assert_reduction, segment_bounds, to_kind, to_numpy

import linred
from linred.backends import _nvmath_layout as layouts
from linred.backends import registry
from linred.problem import Problem

if HAS_TORCH:
    import torch

NVMATH_OK = registry.unavailable("nvmath") is None if "nvmath" in registry.BACKENDS else False
try:
    from linred.backends.nvmath import _host_error

    HOST_OK = NVMATH_OK and _host_error() is None
except Exception:  # pragma: no cover - nvmath missing
    HOST_OK = False

needs_host = pytest.mark.skipif(not HOST_OK, reason="nvmath cannot execute on the CPU here (needs MKL)")

FLOATS = ("float32", "float64", "complex64", "complex128")


def data(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    x = rng.uniform(-1, 1, shape)
    if dtype.startswith("complex"):
        x = x + 1j * rng.uniform(-1, 1, shape)
    return x.astype(dtype)


def fixed(reduction: str, x: Any, L: int, axis: int = 0, **kwargs: Any) -> Any:
    fn = linred.segmented_sum if reduction == "sum" else linred.segmented_mean
    return fn(x, L, axis=axis, backend="nvmath", **kwargs)


def check(got: Any, reduction: str, x_np: np.ndarray, L: int, axis: int = 0, like: Any = None) -> None:
    n = x_np.shape[axis]
    assert_reduction(got, reduction, x_np, segments=segment_bounds(n, L), axis=axis, like=like)


def test_import_is_lazy():
    """Importing the backend module imports neither nvmath nor an array library beyond NumPy."""
    code = (
        "import sys, linred, linred.backends.nvmath, linred.backends._nvmath_layout\n"
        "heavy = [m for m in ('nvmath', 'cupy', 'torch', 'cuda') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_available():
    assert NVMATH_OK, registry.unavailable("nvmath")


# ---------------------------------------------------------------------------
# Host: every form against the float64 reference
# ---------------------------------------------------------------------------

HOST_CASES = {
    # name: (base shape, view, axis, L)
    "1-D L=1": ((12,), lambda a: a, 0, 1),
    "1-D L=2": ((24,), lambda a: a, 0, 2),
    "1-D L=3": ((24,), lambda a: a, 0, 3),
    "1-D L=8": ((64,), lambda a: a, 0, 8),
    "1-D one segment": ((37,), lambda a: a, 0, 37),
    "L=128 small (1 level)": ((5 * 128,), lambda a: a, 0, 128),
    "L=128 (levels 32, 4)": ((1 << 18,), lambda a: a, 0, 128),
    "L=48 (levels 16, 3)": ((48 * 5462,), lambda a: a, 0, 48),
    "L=40 (levels 8, 5)": ((40 * 6554,), lambda a: a, 0, 40),
    "L=100 (1 level)": ((100 * 2622,), lambda a: a, 0, 100),
    "axis=-1 L=256 (levels 32, 8)": ((2, 1 << 17), lambda a: a, -1, 256),
    "long L=4096": ((3 * 4096,), lambda a: a, 0, 4096),
    "long L=8192 (2 levels)": ((2 * 8192,), lambda a: a, 0, 8192),
    "long L=6144 (chunk 1024)": ((2 * 6144,), lambda a: a, 0, 6144),
    "long L=5003 (prime, 1 level)": ((2 * 5003,), lambda a: a, 0, 5003),
    "long L=2^20 single segment (2 levels)": ((1 << 20,), lambda a: a, 0, 1 << 20),
    "features D=3": ((24, 3), lambda a: a, 0, 4),
    "features D=3 L=1": ((6, 3), lambda a: a, 0, 1),
    "features one segment": ((24, 5), lambda a: a, 0, 24),
    "features Fortran (column-major blocks)": ((24, 3), np.asfortranarray, 0, 4),
    "features sliced": ((24, 5), lambda a: a[:, 1:4], 0, 4),
    "features step 2 rows": ((48, 3), lambda a: a[::2], 0, 6),
    "axis=-1 (merged rows)": ((3, 24), lambda a: a, -1, 4),
    "axis=-1 long rows": ((2, 16384), lambda a: a, -1, 8192),
    "axis=-1 sliced (batched rows)": ((3, 30), lambda a: a[:, :24], -1, 4),
    "axis=1 of 3-D": ((2, 24, 3), lambda a: a, 1, 6),
    "axis=-1 transposed (columns)": ((24, 3), lambda a: a.T, -1, 4),
    "axis=-1 Fortran (columns)": ((3, 24), np.asfortranarray, -1, 6),
    "axis=-1 transposed one segment": ((24, 3), lambda a: a.T, -1, 24),
    "axis=-1 transposed L=1": ((6, 3), lambda a: a.T, -1, 1),
    "axis=0 transposed (features)": ((3, 24), lambda a: a.T, 0, 4),
}


@needs_host
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", list(HOST_CASES))
def test_host_forms(case, dtype, reduction, rng):
    shape, make_view, axis, L = HOST_CASES[case]
    x = make_view(data(dtype, shape, rng))
    try:
        got = fixed(reduction, x, L, axis)
    except linred.BackendError as e:
        # complex data is summed as (real, imaginary) features: strided features, or a batch that
        # does not merge with the segments, have no real form
        assert dtype.startswith("complex"), e.reason
        assert "complex features" in e.reason or "do not merge" in e.reason, e.reason
        return
    check(got, reduction, x, L, axis, like=x)


@pytest.mark.parametrize(
    ("n", "L", "levels"),
    [
        (1 << 18, 128, [(8192, 32), (2048, 4)]),
        (1 << 10, 128, [(8, 128)]),  # small data: one product (a second costs more than it saves)
        (1 << 20, 1 << 20, [(1024, 1024), (1, 1024)]),  # long rows: chunks near 1024, any size
        (100 * 2622, 100, [(2622, 100)]),  # no divisor of 8, 16 or 32
        (1 << 18, 16, [(16384, 16)]),
    ],
)
def test_host_levels(n, L, levels):
    layout = layouts.dense_layout(problem(shape=(1, n, 1), num_segments=n // L, segment_length=L), host=True)
    assert [p.a.shape for p in layout.products] == levels
    assert [p.scaled for p in layout.products] == [False] * (len(levels) - 1) + [True], "alpha = 1/L on the last level"
    gpu_layout = layouts.dense_layout(gpu(shape=(1, n, 1), num_segments=n // L, segment_length=L), host=False)
    assert len(gpu_layout.products) == 1


@needs_host
def test_host_long_segments_accuracy(rng):
    """Chunked levels keep float32 sums of 2^20 elements within 1e-6 of float64 (MKL alone: ~7e-6)."""
    x = rng.standard_normal(1 << 22).astype(np.float32)
    got = fixed("sum", x, 1 << 20)
    ref = x.astype(np.float64).reshape(4, -1).sum(1)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-6


@needs_host
def test_host_infinities_in_complex_data():
    """Complex data is summed as real parts: inf + 0j stays inf + 0j (a complex product gives inf + nan*j)."""
    x = np.array([np.inf, 1, 2j, 3, complex(0, -np.inf), 1], dtype=np.complex64)
    got = fixed("sum", x, 3)
    np.testing.assert_array_equal(got, np.array([np.inf + 2j, 4 + complex(0, -np.inf)], dtype=np.complex64))


@needs_host
@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
@pytest.mark.parametrize("dtype", FLOATS)
def test_host_torch_tensors(dtype, rng):
    x_np = data(dtype, (24, 3), rng)
    x = torch.from_numpy(x_np.copy())
    got = fixed("mean", x, 4)
    check(got, "mean", x_np, 4, like=x)
    if not dtype.startswith("complex"):  # complex columns have no real form (refused)
        got = fixed("sum", x.T, 6, axis=-1)
        check(got, "sum", x_np.T, 6, axis=-1, like=x)
    else:
        got = fixed("sum", x.conj(), 4)
        check(got, "sum", x_np.conj(), 4, like=x)


@needs_host
@pytest.mark.parametrize("dtype", FLOATS)
def test_host_out_and_plan_reuse(dtype, rng):
    """out= is filled in place; a plan runs on new arrays, and the cached executor keeps no reference to them."""
    x_np = data(dtype, (48, 2), rng)
    out = np.empty((12, 2), dtype=dtype)
    assert fixed("sum", x_np, 4, out=out) is out
    check(out, "sum", x_np, 4)
    with linred.SegmentedReduction(x_np, 4, reduction="mean", backend="nvmath") as plan:
        assert plan.backend == "nvmath"
        for _ in range(3):
            y = data(dtype, (48, 2), rng)
            check(plan(y), "mean", y, 4)
        y = data(dtype, (48, 2), rng)
        plan(y, out=out)
        check(out, "mean", y, 4)


@needs_host
def test_host_input_unmodified_and_not_retained(rng):
    import weakref

    x = data("float32", (64,), rng)
    before = x.copy()
    fixed("sum", x, 8)
    np.testing.assert_array_equal(x, before)

    class Tracked(np.ndarray):
        pass

    y = data("float32", (64,), rng).view(Tracked)
    ref = weakref.ref(y)
    fixed("sum", np.asarray(y), 8)
    del y
    assert ref() is None, "a cached executor holds the caller's array"


@needs_host
def test_host_logging_stays_quiet(caplog, rng):
    """nvmath logs every execution at INFO; its logger 'linred.nvmath' is at WARNING by default."""
    linred.clear_plan_cache()
    with caplog.at_level(logging.INFO):
        fixed("sum", data("float32", (4096,), rng), 16)
    assert not [r for r in caplog.records if r.name.startswith("linred.nvmath")]


# ---------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------

REFUSALS = {
    "integer": (lambda: linred.segmented_sum(np.arange(8), 2, backend="nvmath"), "no integer matrix product"),
    "bool": (lambda: linred.segmented_sum(np.ones(8, bool), 2, backend="nvmath"), "no integer matrix product"),
    "max": (lambda: linred.segmented_max(np.ones(8), 2, backend="nvmath"), "not a linear-algebra operation"),
    "min": (lambda: linred.segmented_min(np.ones(8), 2, backend="nvmath"), "not a linear-algebra operation"),
    "offsets": (lambda: linred.segmented_sum(np.ones(8), offsets=[0, 3, 8], backend="nvmath"), "GPU only"),
    "lengths": (lambda: linred.segmented_mean(np.ones(8), lengths=[3, 5], backend="nvmath"), "GPU only"),
    "float16": (lambda: linred.segmented_sum(np.ones(8, np.float16), 2, backend="nvmath"), "backend='numpy'"),
    "dtype=float64": (
        lambda: linred.segmented_sum(np.ones(8, np.float32), 2, dtype=np.float64, backend="nvmath"),
        "one dtype for the data and the result",
    ),
    "step 2": (lambda: linred.segmented_sum(np.ones(16)[::2], 2, backend="nvmath"), "no unit stride"),
    "reversed": (lambda: linred.segmented_sum(np.ones(8)[::-1], 2, backend="nvmath"), "no unit stride"),
    "broadcast": (
        lambda: linred.segmented_sum(np.broadcast_to(np.ones((1, 3)), (8, 3)), 2, backend="nvmath"),
        "BLAS needs one of them to be 1",
    ),
    "complex strided features": (
        lambda: linred.segmented_sum(np.ones((8, 3), np.complex64, order="F"), 2, backend="nvmath"),
        "complex features have stride",
    ),
}


@pytest.mark.skipif(not NVMATH_OK, reason="nvmath is not available")
@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals(case):
    call, match = REFUSALS[case]
    with pytest.raises(linred.BackendError, match=match) as info:
        call()
    assert info.value.backend == "nvmath"


@pytest.mark.skipif(not HAS_TORCH or not NVMATH_OK, reason="needs torch and nvmath")
def test_refuses_bfloat16_on_host():
    with pytest.raises(linred.BackendError, match="bfloat16"):
        linred.segmented_sum(torch.ones(8, dtype=torch.bfloat16), 2, backend="nvmath")


def problem(**kw: Any) -> Problem:
    """A Problem as the front end builds it; contiguous (batch, n, features) by default."""
    B, n, D = kw.pop("shape", (1, 24, 1))
    base = {
        "reduction": "sum",
        "kind": "numpy",
        "device": None,
        "dtype": "float32",
        "acc_dtype": "float32",
        "out_dtype": "float32",
        "batch": B,
        "n": n,
        "features": D,
        "strides": (n * D, D, 1),
        "num_segments": n // 4,
        "segment_length": 4,
        "offsets_dtype": None,
    }
    base.update(kw)
    return Problem(**base)


@pytest.mark.skipif(not HOST_OK, reason="nvmath cannot execute on the CPU here")
def test_refuses_32_bit_overflow_on_host():
    """nvmath's host BLAS calls take 32-bit integers: larger extents are refused (checked without data)."""
    from linred.backends.nvmath import BACKEND

    big = problem(shape=(1, 2**32, 1), num_segments=2**32, segment_length=1)
    assert "2^31" in BACKEND.unsupported(big)
    assert BACKEND.unsupported(problem(shape=(1, 2**32, 1), num_segments=2**20, segment_length=2**12)) is None


# ---------------------------------------------------------------------------
# Layouts and dtypes for GPU problems (pure functions)
# ---------------------------------------------------------------------------


def gpu(**kw: Any) -> Problem:
    return problem(kind="cupy", device=0, **kw)


@pytest.mark.parametrize(
    ("kw", "form"),
    [
        ({}, "rows"),
        ({"shape": (3, 24, 1)}, "rows"),
        ({"shape": (3, 24, 1), "strides": (30, 1, 1)}, "rows"),  # batched: rows padded to 30
        ({"shape": (1, 24, 5)}, "features"),
        ({"shape": (1, 24, 5), "strides": (120, 1, 24)}, "features"),  # column-major blocks
        ({"shape": (3, 24, 1), "strides": (1, 3, 1)}, "columns"),  # axis=-1 of a transposed array
        ({"dtype": "complex64", "out_dtype": "complex64", "acc_dtype": "complex64"}, "features"),
    ],
)
def test_gpu_layout_forms(kw, form):
    layout = layouts.dense_layout(gpu(**kw), host=False)
    assert not isinstance(layout, str), layout
    assert layout.form == form
    assert len(layout.products) == 1, "the GPU path never splits segments into levels"


def test_gpu_layout_columns_uses_a_small_temporary():
    layout = layouts.dense_layout(gpu(shape=(3, 24, 1), strides=(1, 3, 1)), host=False)
    assert layout.temporaries == {"result": 6 * 3}
    assert layout.copy_from is not None


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"strides": (48, 2, 2)}, "no unit stride"),
        ({"shape": (1, 24, 3), "strides": (72, 0, 1)}, "BLAS needs one of them to be 1"),
        ({"shape": (2, 24, 3), "strides": (3, 6, 1)}, "do not merge"),
        (
            {"shape": (1, 24, 3), "strides": (72, 1, 24), "dtype": "complex64", "out_dtype": "complex64"},
            "complex features",
        ),
    ],
)
def test_gpu_layout_refusals(kw, match):
    reason = layouts.dense_layout(gpu(**kw), host=False)
    assert isinstance(reason, str) and match in reason, reason


@pytest.mark.parametrize(
    ("dtype", "out", "ok"),
    [
        ("float32", "float32", True),
        ("float64", "float64", True),
        ("float16", "float16", True),
        ("bfloat16", "bfloat16", True),
        ("float16", "float32", True),
        ("bfloat16", "float32", True),
        ("complex64", "complex64", True),
        ("complex128", "complex128", True),
        ("float32", "float64", False),
        ("float64", "float32", False),
        ("float16", "float64", False),
        ("complex64", "complex128", False),
        ("int32", "int64", False),
    ],
)
def test_gpu_dtypes(dtype, out, ok):
    reason = layouts.dtype_reason(gpu(dtype=dtype, out_dtype=out, acc_dtype=out))
    assert (reason is None) == ok, reason


def test_gpu_variable_dtypes_and_strides():
    var = {"segment_length": None, "offsets_dtype": "int64", "num_segments": 5}
    assert layouts.variable_dtype_reason(gpu(dtype="float16", out_dtype="float16", **var)) is None
    assert "one dtype" in layouts.variable_dtype_reason(gpu(dtype="float16", out_dtype="float32", **var))
    assert layouts.sparse_dense_strides(gpu(**var)) == (1, 24)  # a column vector
    assert layouts.sparse_dense_strides(gpu(shape=(2, 24, 3), **var)) == (3, 1)  # row-major
    complex_vector = gpu(shape=(1, 24, 1), dtype="complex64", out_dtype="complex64", **var)
    assert layouts.sparse_dense_strides(complex_vector) == (2, 1), "complex as real: (n, 2) row-major"
    assert "unit-stride segment axis" in layouts.sparse_dense_strides(gpu(strides=(48, 2, 1), **var))
    assert "row-major" in layouts.sparse_dense_strides(gpu(shape=(1, 24, 3), strides=(72, 1, 24), **var))
    assert "whole batches" in layouts.sparse_dense_strides(gpu(shape=(2, 24, 1), strides=(12, 1, 1), **var))


def test_gpu_batch_count_limit():
    layout = layouts.dense_layout(gpu(shape=(1, 2**33, 2), num_segments=2**32, segment_length=2), host=False)
    assert "2^31 - 1" in layouts.check_batch_count(layout)


# ---------------------------------------------------------------------------
# GPU executors on the CPU: nvmath's GPU classes replaced by CPU stand-ins
# ---------------------------------------------------------------------------


def aligned_empty(shape: Any, dtype: Any) -> np.ndarray:
    """An uninitialized array at a 256-byte boundary, as CUDA allocators give."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape))
    buf = np.empty(size * dtype.itemsize + 256, np.uint8)
    start = -buf.__array_interface__["data"][0] % 256
    return buf[start : start + size * dtype.itemsize].view(dtype).reshape(shape)


class NumpyOps:
    """The CuPy operations of the executors, on NumPy arrays."""

    kind = "cupy"

    def __init__(self, device: int) -> None:
        self.device = device

    @contextlib.contextmanager
    def on(self, stream: int):
        yield

    def synchronize(self, stream: int) -> None:
        pass

    waits: ClassVar[list[int]] = []

    @staticmethod
    def event():
        return object()

    @staticmethod
    def record(event, stream):
        pass

    @staticmethod
    def wait(stream, event):
        NumpyOps.waits.append(stream)

    @staticmethod
    def view(base, shape, strides):
        return np.lib.stride_tricks.as_strided(base, shape, tuple(s * base.itemsize for s in strides))

    @staticmethod
    def pointer(a):
        return a.__array_interface__["data"][0]

    @staticmethod
    def ones(size, dtype):
        return np.ones(size, dtype)

    @staticmethod
    def empty(shape, dtype):
        return aligned_empty(shape, dtype)

    @staticmethod
    def copy(dst, src):
        np.copyto(dst, src)


class CpuMatmul:
    """``nvmath.linalg.advanced.Matmul`` as the executors use it, run by the generic host Matmul."""

    planned: ClassVar[list[tuple[int, ...]]] = []

    def __init__(self, a, b, c=None, *, alpha=1.0, beta=None, options=None, stream=None):
        from nvmath.linalg import Matmul, MatmulOptions
        from nvmath.linalg.generic import ExecutionCPU

        assert options.inplace and beta == 0.0 and options.compute_type is not None and stream in (7, 8)
        self._mm = Matmul(
            a, b, c=c, alpha=alpha, beta=beta, options=MatmulOptions(inplace=True), execution=ExecutionCPU()
        )
        CpuMatmul.planned.append(tuple(a.shape))

    def plan(self, *, stream=None):
        assert stream in (7, 8)
        self._mm.plan()

    def reset_operands_unchecked(self, **kw):
        self._mm.reset_operands_unchecked(**kw)

    def execute(self, *, stream=None):
        assert stream in (7, 8)
        return self._mm.execute()

    def release_operands(self):
        self._mm.release_operands()

    def free(self):
        self._mm.free()


@pytest.fixture
def simulated_dense(monkeypatch):
    if not HOST_OK:
        pytest.skip("nvmath cannot execute on the CPU here")
    from linred.backends import _nvmath_device

    monkeypatch.setattr(_nvmath_device, "ops_for", lambda kind, device: NumpyOps(device))
    monkeypatch.setattr(_nvmath_device, "Matmul", CpuMatmul)
    CpuMatmul.planned = []
    return _nvmath_device


def run_dense(
    module, x: np.ndarray, L: int, reduction: str = "sum", out: np.ndarray | None = None, executor=None, stream=7
):
    """Plan (or reuse) a DenseExecutor for x viewed (batch=1, n, features) along axis 0, and run it."""
    from linred.backends.nvmath import BACKEND

    x3 = x.reshape(1, x.shape[0], -1) if x.ndim <= 2 else x
    n, D = x3.shape[1], x3.shape[2]
    p = problem(
        kind="cupy",
        device=0,
        reduction=reduction,
        dtype=x.dtype.name,
        acc_dtype=x.dtype.name,
        out_dtype=x.dtype.name,
        shape=(1, n, D),
        strides=tuple(s // x.itemsize for s in x3.strides),
        num_segments=n // L,
        segment_length=L,
    )
    if executor is None:
        executor = BACKEND.plan(p)
    if out is None:
        out = aligned_empty((1, n // L, D), x.dtype)
    executor(x3, out, None, stream)
    return executor, out.reshape(n // L, D)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_simulated_dense(simulated_dense, dtype, reduction, rng):
    for shape, L in (((24,), 4), ((24, 3), 6), ((24, 3), 24)):
        x = data(dtype, shape, rng)
        _, got = run_dense(simulated_dense, x, L, reduction)
        check(got.reshape(x.shape[0] // L, *shape[1:]), reduction, x, L)


def test_simulated_dense_replans_for_smaller_alignment(simulated_dense, rng):
    """A plan made for 256-byte aligned data is replaced once for data at an odd offset, then reused."""
    buf = data("float32", (8192,), rng)
    start = (-buf.__array_interface__["data"][0] % 256) // 4
    x = buf[start : start + 4096]
    executor, got = run_dense(simulated_dense, x, 8)
    check(got[:, 0], "sum", x, 8)
    assert len(CpuMatmul.planned) == 1
    odd = buf[start + 1 : start + 1 + 4096]
    _, got = run_dense(simulated_dense, odd, 8, executor=executor)
    check(got[:, 0], "sum", odd, 8)
    assert len(CpuMatmul.planned) == 2, "no new plan for a 4-byte aligned pointer"
    for view in (x, odd):
        _, got = run_dense(simulated_dense, view, 8, executor=executor)
        check(got[:, 0], "sum", view, 8)
    assert len(CpuMatmul.planned) == 2, "re-planned although the alignment did not drop"


def test_simulated_dense_orders_a_new_stream_after_the_previous_call(simulated_dense, rng):
    """A call on another stream than the previous one waits for it (the workspace is shared), else not."""
    NumpyOps.waits = []
    x = data("float32", (64,), rng)
    executor, _ = run_dense(simulated_dense, x, 8, stream=7)
    run_dense(simulated_dense, x, 8, executor=executor, stream=7)
    assert NumpyOps.waits == []
    _, got = run_dense(simulated_dense, x, 8, executor=executor, stream=8)
    assert NumpyOps.waits == [8]
    check(got[:, 0], "sum", x, 8)


def test_simulated_dense_misaligned_out(simulated_dense, rng):
    """A result buffer that is not 256-byte aligned is written through an aligned temporary."""
    x = data("float32", (64,), rng)
    buf = np.zeros(64 + 64, np.float32)
    start = (-buf.__array_interface__["data"][0] % 256) // 4 + 1
    out = buf[start : start + 8].reshape(1, 8, 1)
    _, got = run_dense(simulated_dense, x, 8, out=out)
    check(got[:, 0], "sum", x, 8)
    assert np.all(buf[:start] == 0) and np.all(buf[start + 8 :] == 0), "wrote outside out"


def test_simulated_dense_columns_form(simulated_dense, rng):
    """axis=-1 of a transposed array: products into a temporary, copied transposed into out."""
    from linred.backends.nvmath import BACKEND

    a = data("float32", (24, 3), rng)
    x3 = a.T.reshape(3, 24, 1)
    p = gpu(shape=(3, 24, 1), strides=(1, 3, 1), num_segments=6)
    out = aligned_empty((3, 6, 1), np.float32)
    BACKEND.plan(p)(x3, out, None, 7)
    check(out[..., 0], "sum", a.T, 4, axis=-1)


class TorchCpuOps:
    """The PyTorch operations of the executors, on CPU tensors (no streams)."""

    def __new__(cls, device: int):
        from linred.backends._nvmath_gpu_arrays import TorchOps

        ops = TorchOps(device)
        ops._device = torch.device("cpu")
        ops.on = lambda stream: contextlib.nullcontext()
        ops.synchronize = lambda stream: None
        ops.event = lambda: None
        ops.record = lambda event, stream: None
        ops.wait = lambda stream, event: None
        return ops


class CpuSparseMatmul:
    """``nvmath.sparse.Matmul`` as the sparse executor uses it: ``c = a @ b`` with a torch CSR ``a``."""

    def __init__(self, a, b, c=None, *, beta=None, options=None, stream=None):
        assert beta == 0.0 and options.compute_type is not None and stream == 7
        self.reset_operands_unchecked(a=a, b=b, c=c)

    def plan(self, *, stream=None):
        assert stream == 7

    def reset_operands_unchecked(self, *, a, b, c):
        assert a.layout == torch.sparse_csr and a.crow_indices().dtype == a.col_indices().dtype
        self.a, self.b, self.c = a, b, c

    def execute(self, *, stream=None):
        dense = self.a.to_dense().double()
        if self.b.dim() == 3:
            for i in range(self.b.shape[0]):
                self.c[i].copy_(dense @ self.b[i].double())
        else:
            self.c.copy_(dense @ self.b.double())

    def release_operands(self):
        self.a = self.b = self.c = None

    def free(self):
        pass


@pytest.fixture
def simulated_sparse(monkeypatch):
    if not HAS_TORCH:
        pytest.skip("needs torch")
    from linred.backends import _nvmath_sparse

    monkeypatch.setattr(_nvmath_sparse, "ops_for", lambda kind, device: TorchCpuOps(device))
    monkeypatch.setattr(_nvmath_sparse.nvmath.sparse, "Matmul", CpuSparseMatmul)
    return _nvmath_sparse


@pytest.mark.parametrize("strategy", ["batched", "loop"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "complex64"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("offsets_dtype", ["int32", "int64"])
def test_simulated_sparse(simulated_sparse, monkeypatch, strategy, dtype, reduction, offsets_dtype, rng):
    from linred.backends.nvmath import BACKEND
    from linred.segments import VariableSegments

    monkeypatch.setattr(simulated_sparse, "BATCH_STRATEGY", strategy)
    offsets = [0, 0, 5, 5, 13, 24, 24]
    for B, D in ((1, 1), (2, 1), (1, 3), (2, 3)):
        x_np = data("float32" if dtype in ("float16", "bfloat16") else dtype, (B, 24, D), rng)
        x = torch.from_numpy(x_np).to(getattr(torch, dtype))
        p = problem(
            kind="torch",
            device=0,
            reduction=reduction,
            dtype=dtype,
            acc_dtype="float32" if dtype in ("float16", "bfloat16") else dtype,
            out_dtype=dtype,
            shape=(B, 24, D),
            num_segments=6,
            segment_length=None,
            offsets_dtype=offsets_dtype,
        )
        executor = BACKEND.plan(p)
        for _ in range(2):  # a second call rebinds everything
            out = torch.empty((B, 6, D), dtype=x.dtype)
            off = torch.tensor(offsets, dtype=getattr(torch, offsets_dtype))
            executor(x, out, VariableSegments(off, 6), 7)
            x_ref = to_numpy(x).astype(np.complex128 if dtype.startswith("complex") else np.float64)
            ref = np.stack([x_ref[:, a:b].sum(1) for a, b in segment_bounds(24, offsets=offsets)], axis=1)
            if reduction == "mean":
                with np.errstate(invalid="ignore"):
                    ref = ref / np.diff(offsets)[None, :, None]
            got = to_numpy(out).astype(ref.dtype)
            tol = 1e-2 if dtype in ("float16", "bfloat16") else 1e-5
            np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
        executor.free()


def test_simulated_sparse_conjugate_view(simulated_sparse):
    from linred.backends.nvmath import BACKEND
    from linred.segments import VariableSegments

    x = torch.tensor([1 + 1j, 2 + 2j, 3 - 1j, 4j], dtype=torch.complex64)
    p = problem(
        kind="torch",
        device=0,
        dtype="complex64",
        acc_dtype="complex64",
        out_dtype="complex64",
        shape=(1, 4, 1),
        num_segments=2,
        segment_length=None,
        offsets_dtype="int64",
    )
    out = torch.empty((1, 2, 1), dtype=torch.complex64)
    BACKEND.plan(p)(x.conj().reshape(1, 4, 1), out, VariableSegments(torch.tensor([0, 1, 4]), 2), 7)
    np.testing.assert_array_equal(out.reshape(-1).numpy(), np.array([1 - 1j, 5 - 5j], dtype=np.complex64))


# ---------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------

GPU_KINDS = [k for k, ok in (("cupy", HAS_CUPY_GPU), ("torch-cuda", HAS_TORCH_CUDA)) if ok] or ["cupy"]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "complex64"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_gpu_fixed_and_variable(kind, dtype, reduction, rng):
    x_np = data("float32" if dtype == "float16" else dtype, (48, 3), rng).astype(dtype)
    x = to_kind(x_np, kind)
    for view, axis, L in ((lambda a: a, 0, 4), (lambda a: a[:, 0], 0, 8), (lambda a: a.T, -1, 6)):
        got = fixed(reduction, view(x), L, axis)
        check(got, reduction, view(x_np), L, axis, like=view(x))
    offsets = [0, 0, 5, 5, 13, 48, 48]
    fn = linred.segmented_sum if reduction == "sum" else linred.segmented_mean
    got = fn(x, offsets=offsets, backend="nvmath")
    assert_reduction(got, reduction, x_np, segments=segment_bounds(48, offsets=offsets), like=x)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs a CUDA torch")
def test_gpu_torch_bfloat16(rng):
    x = torch.ones(3000, dtype=torch.bfloat16, device="cuda")
    got = linred.segmented_sum(x, 3000, backend="nvmath")
    assert got.dtype == torch.bfloat16 and float(got[0]) == 3000.0
    got = linred.segmented_sum(x, offsets=[0, 3000], backend="nvmath")
    assert float(got[0]) == 3000.0
