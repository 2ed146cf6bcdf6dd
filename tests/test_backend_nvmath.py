"""The nvmath backend: host products on MKL, its layouts and refusals, and its GPU executors.

The whole contract runs through ``test_reductions.py`` (nvmath is one of the
host backends there, and one of the GPU backends on a GPU).  This file covers
what is particular to nvmath:

- host results for every form of :mod:`linred.backends.nvmath.layout` (rows,
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
import ctypes
import dataclasses
import gc
import logging
import subprocess
import sys
import types
from typing import Any, ClassVar

import numpy as np
import pytest
from support import HAS_CUPY_GPU, HAS_TORCH, HAS_TORCH_CUDA, assert_reduction, segment_bounds, to_kind, to_numpy

import linred
import linred.backends as registry
from linred.backends.nvmath import layout as layouts
from linred.backends.nvmath.layout import HOST_SEQUENTIAL_MAX
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
        "import sys, linred, linred.backends.nvmath, linred.backends.nvmath.layout\n"
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
        # does not merge with the segments, have no real form; complex64 feature rows longer than
        # MKL adds accurately in float32 are refused
        assert dtype.startswith("complex"), e.reason
        too_long = dtype == "complex64" and L > HOST_SEQUENTIAL_MAX and "float32 digits" in e.reason
        assert "complex features" in e.reason or "do not merge" in e.reason or too_long, e.reason
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
    # features broadcast (stride 0) in segments of one row: nvmath's own ValueError before
    "broadcast features, L = 1": (
        lambda: linred.segmented_sum(np.broadcast_to(np.ones((8, 1)), (8, 3)), 1, backend="nvmath"),
        r"block has strides \(1, 0\): BLAS needs one of them to be 1",
    ),
    "broadcast features of a batch, L = 1": (
        lambda: linred.segmented_mean(np.broadcast_to(np.ones((2, 8, 1)), (2, 8, 3)), 1, axis=1, backend="nvmath"),
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
    assert "2^31 - 1" in layouts.check_device_extents(layout)


def test_gpu_extent_limits():
    """cuBLASLt has no kernel for a segment of 2^31 elements or more (measured: CUBLAS_STATUS_NOT_SUPPORTED)."""
    big = 2**31 + 2**20
    layout = layouts.dense_layout(gpu(shape=(1, big, 1), num_segments=1, segment_length=big), host=False)
    assert "inner dimension K" in layouts.check_device_extents(layout)
    features = layouts.dense_layout(gpu(shape=(1, big, 2), num_segments=1, segment_length=big), host=False)
    assert "inner dimension K" in layouts.check_device_extents(features)
    ok = layouts.dense_layout(gpu(shape=(1, big, 1), num_segments=big // 2**20, segment_length=2**20), host=False)
    assert layouts.check_device_extents(ok) is None


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

    def __init__(self, device: int) -> None:
        self.device = device

    #: the stream each buffer was allocated on (the innermost ``on``), and linred's own stream here
    allocated: ClassVar[list[int | None]] = []
    _current: ClassVar[list[int]] = []
    OWN = 99

    @contextlib.contextmanager
    def on(self, stream: int):
        NumpyOps._current.append(stream)
        try:
            yield
        finally:
            NumpyOps._current.pop()

    @staticmethod
    def _allocating() -> None:
        NumpyOps.allocated.append(NumpyOps._current[-1] if NumpyOps._current else None)

    def own_stream(self):
        return NumpyOps.OWN, None

    @staticmethod
    def lasting(stream, handle) -> bool:
        return True

    def synchronize(self, stream: int) -> None:
        pass

    @staticmethod
    def capturing(stream: int) -> bool:
        return False  # (no CUDA graphs on the host)

    @staticmethod
    def current_stream() -> int:
        return 0  # (the host has one "stream")

    waits: ClassVar[list[int]] = []

    @staticmethod
    def event():
        return object()

    @staticmethod
    def record_unless_capturing(event, stream):
        return True

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
        NumpyOps._allocating()
        return np.ones(size, dtype)

    @staticmethod
    def empty(shape, dtype):
        NumpyOps._allocating()
        return aligned_empty(shape, dtype)

    @staticmethod
    def copy(dst, src):
        np.copyto(dst, src)


class CpuMatmul:
    """``nvmath.linalg.advanced.Matmul`` as the executors use it, run by the generic host Matmul."""

    planned: ClassVar[list[tuple[int, ...]]] = []
    preferences: ClassVar[list[Any]] = []

    def __init__(self, a, b, c=None, *, alpha=1.0, beta=None, options=None, stream=None):
        from nvmath.linalg import Matmul, MatmulOptions
        from nvmath.linalg.generic import ExecutionCPU

        assert options.inplace and beta == 0.0 and options.compute_type is not None and stream in (7, 8)
        self._mm = Matmul(
            a, b, c=c, alpha=alpha, beta=beta, options=MatmulOptions(inplace=True), execution=ExecutionCPU()
        )
        self._allocator = options.allocator
        self.workspace = None
        CpuMatmul.planned.append(tuple(a.shape))

    def plan(self, *, preferences=None, stream=None):
        assert stream in (7, 8)
        CpuMatmul.preferences.append(preferences)
        self._mm.plan()
        # (nvmath allocates a workspace for the stream it plans on, from the options' allocator)
        self.workspace = self._allocator.memalloc_async(64, types.SimpleNamespace(handle=stream))

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
    from linred.backends.nvmath import dense as _nvmath_device

    monkeypatch.setattr(_nvmath_device, "ops_for", lambda kind, device: NumpyOps(device))
    monkeypatch.setattr(_nvmath_device, "Matmul", CpuMatmul)
    CpuMatmul.planned = []
    CpuMatmul.preferences = []
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
    x = data("float32", (64,), rng)
    executor, _ = run_dense(simulated_dense, x, 8, stream=7)
    NumpyOps.waits = []
    run_dense(simulated_dense, x, 8, executor=executor, stream=7)
    assert NumpyOps.waits == []
    _, got = run_dense(simulated_dense, x, 8, executor=executor, stream=8)
    assert NumpyOps.waits == [8]
    check(got[:, 0], "sum", x, 8)


def test_simulated_dense_keeps_its_buffers_on_linreds_own_stream(simulated_dense, rng):
    """Every buffer of the executor (its ones, nvmath's workspaces, a re-plan's too) comes from the
    pool of linred's own stream, whichever stream the calls use (the stream a workspace is first
    used on waits for it), and dropping the executor without free() makes that one stream wait
    for the last call: the streams of the calls, which their owners may destroy, are never named
    again."""
    NumpyOps.allocated, NumpyOps.waits = [], []
    buf = data("float32", (8192,), rng)
    start = (-buf.__array_interface__["data"][0] % 256) // 4
    x = buf[start : start + 4096]
    executor, got = run_dense(simulated_dense, x, 8, stream=7)
    check(got[:, 0], "sum", x, 8)
    assert NumpyOps.allocated == [NumpyOps.OWN] * 2, NumpyOps.allocated  # the ones, the workspace
    assert NumpyOps.waits == [7]  # (the workspace's first stream waits for linred's)
    odd = buf[start + 1 : start + 1 + 4096]  # a re-plan on stream 8: its workspace from the same pool
    got = run_dense(simulated_dense, odd, 8, executor=executor, stream=8)[1]
    check(got[:, 0], "sum", odd, 8)
    assert NumpyOps.allocated == [NumpyOps.OWN] * 3, NumpyOps.allocated
    assert NumpyOps.waits == [7, 8, NumpyOps.OWN, 8]  # the new stream; the old workspace; the new one
    NumpyOps.waits = []
    del executor
    gc.collect()
    assert NumpyOps.waits == [NumpyOps.OWN]


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


def test_simulated_dense_16_bit_results_reduce_split_k_in_float32(simulated_dense):
    """cuBLASLt may split K; for a 16-bit result only the float32 (compute type) reduction scheme is allowed."""
    from nvmath.linalg.advanced import MatmulReductionScheme

    from linred.backends.nvmath import BACKEND

    for dtype, out, expected in (
        ("float16", "float16", MatmulReductionScheme.COMPUTE_TYPE),
        ("bfloat16", "bfloat16", MatmulReductionScheme.COMPUTE_TYPE),
        ("float16", "float32", None),
        ("float32", "float32", None),
    ):
        executor = BACKEND.plan(gpu(dtype=dtype, out_dtype=out, acc_dtype="float32"))
        preferences = executor._preferences
        assert (preferences and preferences.reduction_scheme_mask) == expected, (dtype, out)


class TorchCpuOps:
    """The PyTorch operations of the executors, on CPU tensors (no streams)."""

    def __new__(cls, device: int):
        from linred.backends._device import TorchOps

        ops = TorchOps(device)
        ops._device = torch.device("cpu")
        ops.on = lambda stream: contextlib.nullcontext()
        ops.synchronize = lambda stream: None
        ops.event = lambda: None
        ops.record_unless_capturing = lambda event, stream: True
        ops.wait = lambda stream, event: None
        ops.capturing = lambda stream: False
        ops.current_stream = lambda: 0
        ops.current_stream_object = lambda: None
        ops.own_stream = lambda: (0, None)
        return ops


def host_array(pointer: int, dtype: Any, count: int) -> np.ndarray:
    """``count`` elements of ``dtype`` at a host address, as a writable NumPy array."""
    dtype = np.dtype(dtype)
    buf = (ctypes.c_char * (count * dtype.itemsize)).from_address(pointer)
    return np.frombuffer(buf, dtype=np.uint8).view(dtype)


class FakeCusparse:
    """The cuSPARSE generic API as the sparse executor calls it, run with NumPy on host memory by address.

    It checks what cuSPARSE requires (types of ``S``, data, result and compute
    type; matching index types; batch counts; leading dimensions) and computes
    ``C = S @ B`` in float64 before storing in C's dtype, so a layout or pointer
    mistake in the executor shows as a wrong result.
    """

    def __init__(self) -> None:
        from nvmath.bindings import cusparse

        for name in ("IndexType", "IndexBase", "Order", "Operation", "SpMMAlg", "PointerMode"):
            setattr(self, name, getattr(cusparse, name))
        self.objects: dict[int, dict[str, Any]] = {}
        self.created: list[str] = []
        self.products: list[dict[str, Any]] = []
        self.streams: list[int] = []

    @staticmethod
    def dtype(data_type: int) -> Any:
        import ml_dtypes

        return {2: np.float16, 14: ml_dtypes.bfloat16, 0: np.float32, 1: np.float64}[int(data_type)]

    def _new(self, kind: str, **fields: Any) -> int:
        handle = 1000 + len(self.created)
        self.objects[handle] = {"kind": kind, "batch": 1, **fields}
        self.created.append(kind)
        return handle

    def create(self) -> int:
        return self._new("handle", mode=None)

    def destroy(self, handle: int) -> None:
        assert self.objects.pop(handle)["kind"] == "handle"

    def set_pointer_mode(self, handle: int, mode: int) -> None:
        self.objects[handle]["mode"] = mode

    def set_stream(self, handle: int, stream: int) -> None:
        self.streams.append(stream)

    def create_csr(self, rows, cols, nnz, indptr, indices, values, indptr_type, indices_type, base, data_type):
        assert indptr_type == indices_type and base == self.IndexBase.ZERO
        index = np.int32 if indptr_type == self.IndexType.INDEX_32I else np.int64
        return self._new("csr", rows=rows, cols=cols, nnz=nnz, index=index, dtype=self.dtype(data_type), ptrs=None)

    def csr_set_pointers(self, descr, indptr, indices, values):
        self.objects[descr]["ptrs"] = (indptr, indices, values)

    def csr_set_strided_batch(self, descr, count, indptr_stride, values_stride):
        assert (indptr_stride, values_stride) == (0, 0), "S is broadcast"
        self.objects[descr]["batch"] = count

    def destroy_sp_mat(self, descr):
        assert self.objects.pop(descr)["kind"] == "csr"

    def create_dn_mat(self, rows, cols, ld, values, data_type, order):
        assert ld >= (cols if order == self.Order.ROW else rows)
        return self._new("dense", rows=rows, cols=cols, ld=ld, ptr=values, dtype=self.dtype(data_type), order=order)

    def dn_mat_set_values(self, descr, values):
        self.objects[descr]["ptr"] = values

    def dn_mat_set_strided_batch(self, descr, count, stride):
        d = self.objects[descr]
        assert stride >= d["ld"] * (d["rows"] if d["order"] == self.Order.ROW else d["cols"])
        d["batch"], d["stride"] = count, stride

    def destroy_dn_mat(self, descr):
        assert self.objects.pop(descr)["kind"] == "dense"

    def _check(self, handle, op_a, op_b, a, b, c, compute) -> tuple[dict, dict, dict]:
        assert self.objects[handle]["mode"] == self.PointerMode.HOST
        assert op_a == op_b == self.Operation.NON_TRANSPOSE
        A, B, C = self.objects[a], self.objects[b], self.objects[c]
        assert A["dtype"] == B["dtype"], "S and the data have one dtype"
        half = np.dtype(B["dtype"]).itemsize == 2
        assert C["dtype"] == B["dtype"] or (half and C["dtype"] == np.float32), (B["dtype"], C["dtype"])
        assert self.dtype(compute) == (np.float64 if C["dtype"] == np.float64 else np.float32)
        assert (A["rows"], A["cols"]) == (C["rows"], B["rows"]) and B["cols"] == C["cols"]
        assert A["batch"] == B["batch"] == C["batch"]
        return A, B, C

    def sp_mm_buffer_size(self, handle, op_a, op_b, alpha, a, b, beta, c, compute, alg):
        self._check(handle, op_a, op_b, a, b, c, compute)
        self.objects[c]["alg"] = alg  # (the workspace is sized for the algorithm that runs)
        return 64

    def _matrix(self, d: dict, batch: int) -> np.ndarray:
        rows, cols, ld = d["rows"], d["cols"], d["ld"]
        item = np.dtype(d["dtype"]).itemsize
        inner = (ld, 1) if d["order"] == self.Order.ROW else (1, ld)
        span = (rows - 1) * inner[0] + (cols - 1) * inner[1] + 1 + (batch - 1) * d.get("stride", 0)
        flat = host_array(d["ptr"], d["dtype"], span)
        strides = (d.get("stride", 0) * item, inner[0] * item, inner[1] * item)
        return np.lib.stride_tricks.as_strided(flat, (batch, rows, cols), strides)

    def sp_mm(self, handle, op_a, op_b, alpha, a, b, beta, c, compute, alg, workspace):
        A, B, C = self._check(handle, op_a, op_b, a, b, c, compute)
        assert C["alg"] == alg, "the workspace was sized for another algorithm"
        scalar = self.dtype(compute)
        assert host_array(alpha, scalar, 1)[0] == 1 and host_array(beta, scalar, 1)[0] == 0
        assert workspace != 0
        batch = A["batch"]
        indptr_ptr, indices_ptr, values_ptr = A["ptrs"]
        indptr = host_array(indptr_ptr, A["index"], A["rows"] + 1).astype(np.int64)
        indices = host_array(indices_ptr, A["index"], A["nnz"]).astype(np.int64)
        values = host_array(values_ptr, A["dtype"], A["nnz"]).astype(np.float64)
        data = self._matrix(B, batch).astype(np.float64)
        result = self._matrix(C, batch)
        for i in range(A["rows"]):
            lo, hi = indptr[i], indptr[i + 1]
            row = (values[lo:hi, None] * data[:, indices[lo:hi], :]).sum(axis=1)
            result[:, i, :] = row.astype(C["dtype"])
        self.products.append(
            {"c_dtype": np.dtype(C["dtype"]), "c_ptr": C["ptr"], "batch": batch, "alg": alg, "columns": B["cols"],
             "order": B["order"]}
        )  # fmt: skip


@pytest.fixture
def simulated_sparse(monkeypatch):
    if not HAS_TORCH:
        pytest.skip("needs torch")
    pytest.importorskip("ml_dtypes")
    from linred.backends.nvmath import sparse as _nvmath_sparse

    fake = FakeCusparse()
    monkeypatch.setattr(_nvmath_sparse, "ops_for", lambda kind, device: TorchCpuOps(device))
    monkeypatch.setattr(_nvmath_sparse, "cusparse", fake)
    monkeypatch.setattr(_nvmath_sparse, "_handles", {})
    return fake


@pytest.fixture
def configure_nvmath():
    """``configure("nvmath", ...)`` for the test, the options put back after it."""
    old = registry.configure("nvmath")
    yield lambda **changes: registry.configure("nvmath", **changes)
    registry.configure("nvmath", **dataclasses.asdict(old))


def sparse_problem(x: Any, reduction: str, offsets_dtype: str, out_dtype: str | None = None, m: int = 6) -> Problem:
    """The Problem of a (batch, n, features) tensor ``x`` with ``m`` variable-length segments."""
    dtype = str(x.dtype).removeprefix("torch.")
    B, n, D = x.shape
    return problem(
        kind="torch",
        device=0,
        reduction=reduction,
        dtype=dtype,
        acc_dtype="float32" if dtype in ("float16", "bfloat16") else dtype,
        out_dtype=out_dtype or dtype,
        shape=(B, n, D),
        strides=tuple(x.stride()),
        num_segments=m,
        segment_length=None,
        offsets_dtype=offsets_dtype,
    )


def segment_reference(x: Any, offsets: list[int], reduction: str) -> np.ndarray:
    complex_ = x.dtype.is_complex
    x_ref = to_numpy(x).astype(np.complex128 if complex_ else np.float64)
    ref = np.stack([x_ref[:, a:b].sum(1) for a, b in segment_bounds(x.shape[1], offsets=offsets)], axis=1)
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            ref = ref / np.diff(offsets)[None, :, None]
    return ref


OFFSETS_24 = [0, 0, 5, 5, 13, 24, 24]


@pytest.mark.parametrize("strategy", ["batched", "loop"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "complex64"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("offsets_dtype", ["int32", "int64"])
def test_simulated_sparse(simulated_sparse, configure_nvmath, strategy, dtype, reduction, offsets_dtype, rng):
    from linred.backends.nvmath import BACKEND
    from linred.backends.nvmath.layout import LOOP_VECTORS
    from linred.backends.nvmath.sparse import SPMM_ALG, SPMM_ALG_COLUMNS
    from linred.segments import VariableSegments

    configure_nvmath(batch_strategy=strategy)
    half = dtype in ("float16", "bfloat16")
    cases = ((1, 1), (2, 1), (1, 3), (2, 3), (LOOP_VECTORS + 4, 1))
    for B, D in cases:
        x_np = data("float32" if half else dtype, (B, 24, D), rng)
        x = torch.from_numpy(x_np).to(getattr(torch, dtype))
        executor = BACKEND.plan(sparse_problem(x, reduction, offsets_dtype))
        for _ in range(2):  # a second call rebinds everything
            out = torch.full((B, 6, D), float("nan"), dtype=x.dtype)
            off = torch.tensor(OFFSETS_24, dtype=getattr(torch, offsets_dtype))
            executor(x, out, VariableSegments(off, 6), 7)
            ref = segment_reference(x, OFFSETS_24, reduction)
            got = to_numpy(out).astype(ref.dtype)
            if half:  # float32 sums rounded once: within half an ulp of the 16-bit result
                ulp = 2.0**-10 if dtype == "float16" else 2.0**-7
                np.testing.assert_allclose(got, ref, rtol=ulp, atol=1e-6)
            else:
                np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        executor.free()
    left = [o["kind"] for o in simulated_sparse.objects.values()]
    assert left == ["handle"], f"free() left cuSPARSE objects behind: {left}"
    # One product per batch slice where the executor loops (the loop strategy, or a few vectors:
    # complex data is two real columns), else one; several vectors' columns take CSR_ALG2.
    vectors = not dtype.startswith("complex")
    loops = [B > 1 and (strategy == "loop" or (vectors and D == 1 and B <= LOOP_VECTORS)) for B, D in cases]
    launches = sum(B if loop else 1 for (B, _), loop in zip(cases, loops, strict=True))
    assert len(simulated_sparse.products) == 2 * launches
    for p in simulated_sparse.products:
        several = p["columns"] > 1 and p["order"] == simulated_sparse.Order.COL
        assert p["alg"] == (SPMM_ALG_COLUMNS if several else SPMM_ALG), p
    assert any(p["alg"] == SPMM_ALG_COLUMNS for p in simulated_sparse.products) == (strategy == "batched" and vectors)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_simulated_sparse_16_bit_data_sums_in_float32(simulated_sparse, dtype):
    """16-bit data is summed into a float32 buffer and rounded once: 3000 ones give 3000 (rounded)."""
    from linred.backends.nvmath import BACKEND
    from linred.segments import VariableSegments

    x = torch.ones((2, 3000, 3), dtype=getattr(torch, dtype))
    offsets = [0, 0, 3000]
    off = torch.tensor(offsets)
    out = torch.empty((2, 2, 3), dtype=x.dtype)
    BACKEND.plan(sparse_problem(x, "sum", "int64", m=2))(x, out, VariableSegments(off, 2), 7)
    assert simulated_sparse.products[-1]["c_dtype"] == np.float32
    assert simulated_sparse.products[-1]["c_ptr"] != out.data_ptr(), "a float32 buffer, not the result"
    expected = float(torch.tensor(3000.0).to(x.dtype))  # 3008 in bfloat16
    assert to_numpy(out[:, 1].float()).tolist() == [[expected] * 3] * 2
    assert to_numpy(out[:, 0].float()).tolist() == [[0.0] * 3] * 2
    # dtype=float32: the sums are the result
    out32 = torch.empty((2, 2, 3), dtype=torch.float32)
    BACKEND.plan(sparse_problem(x, "mean", "int64", out_dtype="float32", m=2))(x, out32, VariableSegments(off, 2), 7)
    assert simulated_sparse.products[-1]["c_ptr"] == out32.data_ptr()
    assert np.isnan(to_numpy(out32[:, 0])).all() and (to_numpy(out32[:, 1]) == 1.0).all()


def test_simulated_sparse_strided_data_and_offsets(simulated_sparse, rng):
    """Sliced features, padded batches and strided offsets (converted to a contiguous indptr)."""
    from linred.backends.nvmath import BACKEND
    from linred.segments import VariableSegments

    base = torch.from_numpy(data("float32", (2, 30, 5), rng))
    x = base[:, 3:27, 1:4]  # (2, 24, 3) with strides (150, 5, 1)
    every_other = torch.tensor([v for o in OFFSETS_24 for v in (o, -1)], dtype=torch.int32)[::2]
    out = torch.empty((2, 6, 3))
    executor = BACKEND.plan(sparse_problem(x, "mean", "int32"))
    executor(x, out, VariableSegments(every_other, 6), 7)
    np.testing.assert_allclose(to_numpy(out), segment_reference(x, OFFSETS_24, "mean"), rtol=1e-5)
    assert simulated_sparse.created.count("csr") == 1
    x2 = torch.from_numpy(data("float32", (2, 30, 5), rng))[:, 3:27, 1:4]
    executor(x2, out, VariableSegments(torch.tensor(OFFSETS_24, dtype=torch.int32), 6), 8)
    np.testing.assert_allclose(to_numpy(out), segment_reference(x2, OFFSETS_24, "mean"), rtol=1e-5)
    assert simulated_sparse.created.count("csr") == 1, "descriptors are made once and rebound"
    assert simulated_sparse.streams[-1] == 8
    executor.free()
    # a dropped executor destroys its descriptors; the thread's handle is shared and kept
    executor = BACKEND.plan(sparse_problem(x, "sum", "int32"))
    executor(x, out, VariableSegments(every_other, 6), 7)
    del executor
    gc.collect()
    assert [o["kind"] for o in simulated_sparse.objects.values()] == ["handle"]
    assert simulated_sparse.created.count("handle") == 1


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


def test_variable_dtypes_and_limits():
    var = {"segment_length": None, "offsets_dtype": "int64", "num_segments": 5}
    for dtype, out, ok in (("float16", "float16", True), ("bfloat16", "float32", True), ("float32", "float64", False)):
        assert (layouts.dtype_reason(gpu(dtype=dtype, out_dtype=out, acc_dtype=out, **var)) is None) == ok


def test_torch_stream_handle_zero_is_the_default_stream(monkeypatch):
    """torch.cuda.ExternalStream(0) is a pooled stream, not the default one: handle 0 must not go through it."""
    if not HAS_TORCH:
        pytest.skip("needs torch")
    from linred.backends import _device
    from linred.backends._device import TorchOps

    made = []
    monkeypatch.setattr(_device, "_torch_streams", {})
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: made.append(("default", device)) or "d")
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda h, device=None: made.append(("external", h)) or f"e{h}")
    ops = TorchOps(0)
    assert ops.stream(0) == "d" and ops.stream(0) == "d"
    assert ops.stream(1234) == "e1234"
    assert made == [("default", torch.device("cuda", 0)), ("external", 1234)], "streams are cached"


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
    views = [(lambda a: a, 0, 4), (lambda a: a[::2], 0, 4)]  # features; rows with a step
    if not dtype.startswith("complex"):  # complex columns have no real form
        views.append((lambda a: a.T, -1, 6))  # the columns form
    for view, axis, L in views:
        got = fixed(reduction, view(x), L, axis)
        check(got, reduction, view(x_np), L, axis, like=view(x))
    if not dtype.startswith("complex"):  # a strided real vector: BLAS would need a copy
        with pytest.raises(linred.BackendError, match="no unit stride"):
            fixed(reduction, x[:, 0], 8)
    fn = linred.segmented_sum if reduction == "sum" else linred.segmented_mean
    # features; sliced features; a batch (axis=1) with features
    cases = ((x, x_np, 0), (x[:, 1:], x_np[:, 1:], 0), (x.reshape(2, 24, 3), x_np.reshape(2, 24, 3), 1))
    for arr, arr_np, axis in cases:
        n = arr_np.shape[axis]
        offsets = [0, 0, 5, 5, 13, n, n]
        got = fn(arr, offsets=offsets, axis=axis, backend="nvmath")
        assert_reduction(got, reduction, arr_np, segments=segment_bounds(n, offsets=offsets), axis=axis, like=arr)
    if not dtype.startswith("complex"):  # complex parts are adjacent: a strided complex vector is (n, 2) real
        with pytest.raises(linred.BackendError, match="unit-stride segment axis"):
            fn(x[:, 0], offsets=[0, 5, 48], backend="nvmath")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs a CUDA torch")
def test_gpu_torch_handle_zero_is_the_default_stream():
    from linred.backends._device import TorchOps

    stream = TorchOps(0).stream(0)
    assert stream.cuda_stream == 0 and stream == torch.cuda.default_stream(0)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GPU_KINDS)
def test_gpu_variable_result_prefilled_with_nan(kind):
    """beta = 0: cuSPARSE must not read the result, so NaN in an unused out does not leak."""
    x = to_kind(np.ones((40, 2), np.float32), kind)
    out = to_kind(np.full((4, 2), np.nan, np.float32), kind)
    got = linred.segmented_sum(x, offsets=[0, 0, 10, 10, 40], out=out, backend="nvmath")
    np.testing.assert_array_equal(to_numpy(got), [[0, 0], [10, 10], [0, 0], [30, 30]])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs a CUDA torch")
@pytest.mark.parametrize("features", [None, 3])
def test_gpu_torch_bfloat16(features):
    """bfloat16 accumulates in float32: 1000 ones give 1000, 3000 give 3000 rounded to bfloat16 (3008)."""
    shape = (3000,) if features is None else (3000, features)
    x = torch.ones(shape, dtype=torch.bfloat16, device="cuda")
    rounded = float(torch.tensor(3000.0).bfloat16())
    got = linred.segmented_sum(x, 3000, backend="nvmath")
    assert got.dtype == torch.bfloat16 and (got.float() == rounded).all()
    got = linred.segmented_sum(x, offsets=[0, 1000, 3000], backend="nvmath")
    assert got.dtype == torch.bfloat16
    assert got[0].float().eq(1000).all() and got[1].float().eq(2000).all()
    got = linred.segmented_sum(x, offsets=[0, 3000], dtype="float32", backend="nvmath")
    assert got.dtype == torch.float32 and got.eq(3000).all()


@needs_host
def test_host_without_batched_products_refuses_feature_columns(monkeypatch, clean_plan_cache):
    """A CPU library that serves plain products but not strided-batched ones (nvmath without MKL)
    must make nvmath refuse the layouts that need them, with the reason, not fail inside execute."""
    from linred.backends import nvmath as nvmath_backend

    why = "nvmath's CPU library has no batched matmul here (FunctionNotFoundError: cblas_sgemm_batch_strided)"
    monkeypatch.setattr(nvmath_backend, "_host_batched_error", lambda: why)
    x = np.ones((64, 8), dtype=np.float32)  # 8 feature columns: a batched product on the host
    with pytest.raises(linred.BackendError, match="no batched matmul"):
        linred.segmented_sum(x, 8, backend="nvmath")
    np.testing.assert_array_equal(linred.segmented_sum(x[:, 0].copy(), 8, backend="nvmath"), np.full(8, 8.0))
    np.testing.assert_array_equal(linred.segmented_sum(x, 8), np.full((8, 8), 8.0))  # auto: numpy serves it


@needs_host
def test_host_products_probe():
    from linred.backends.nvmath import _host_batched_error, _host_product

    assert _host_product(batched=False) is None
    assert _host_product(batched=True) is None  # MKL here: both kinds of product work
    assert _host_batched_error() is None


def test_float32_rows_cusparse_keeps_within_linreds_accuracy(monkeypatch, configure_nvmath):
    """(No GPU needed.) cuSPARSE takes float32 rows of offsets up to the length it was measured to
    sum within 1e-6 of sum|x|: 2^13 elements, 2^12 where several vectors are the columns of one
    matrix (CSR_ALG2); longer ones are refused naming the library, unless the batch is a loop of
    SpMVs (``batch_strategy="loop"``) or the data is float64."""
    from linred.backends import nvmath as backend
    from linred.backends.base import VENDOR_FLOAT32_LONGEST_SPARSE, VENDOR_FLOAT32_LONGEST_SPARSE_COLUMNS

    monkeypatch.setattr(backend, "_device_error", lambda: None)
    monkeypatch.setattr(backend, "_sparse_error", lambda: None)
    nv = backend.BACKEND

    def rows(n, batch, dtype="float32"):
        return gpu(shape=(batch, n, 1), num_segments=3, segment_length=None, offsets_dtype="int64",
                   dtype=dtype, acc_dtype=dtype, out_dtype=dtype)  # fmt: skip

    many = backend.layouts.LOOP_VECTORS + 1
    assert nv.unsupported(rows(VENDOR_FLOAT32_LONGEST_SPARSE, 1)) is None
    assert "cuSPARSE sums float32 rows of 8193" in nv.unsupported(rows(VENDOR_FLOAT32_LONGEST_SPARSE + 1, 1))
    assert nv.unsupported(rows(VENDOR_FLOAT32_LONGEST_SPARSE_COLUMNS, many)) is None
    why = nv.unsupported(rows(VENDOR_FLOAT32_LONGEST_SPARSE_COLUMNS + 1, many))
    assert "cuSPARSE (CSR_ALG2) sums float32 rows of 4097" in why
    assert nv.unsupported(rows(VENDOR_FLOAT32_LONGEST_SPARSE_COLUMNS + 1, many, "float64")) is None
    configure_nvmath(batch_strategy="loop")
    assert backend.BACKEND.unsupported(rows(VENDOR_FLOAT32_LONGEST_SPARSE_COLUMNS + 1, many)) is None
