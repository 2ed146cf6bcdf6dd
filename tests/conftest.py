"""Shared test machinery: the float64 reference, array kinds, backends and tolerances.

Every numerical test compares linred with :func:`reference`, a deliberately
naive float64 (complex128, or exact Python-int) NumPy loop over explicit segment
bounds, written without any of linred's code.  Tests are parametrized over
``(array_kind, backend)`` pairs by :func:`pytest_generate_tests`:

- host kinds (``numpy``, ``torch-cpu``) with the ``numpy`` backend, ``nvmath``
  when it is available, and ``auto``;
- GPU kinds (``cupy``, ``torch-cuda``), present only when a GPU is, with every
  registered backend but ``numpy`` (``nvmath``, ``cublas``, ``cub``, ...) and
  ``auto``, marked ``gpu``.

A named backend may refuse a call, but only with :class:`linred.BackendError`
naming itself and a reason (see :func:`run_or_refused`); such a test stops there
and counts as passed, and the refusals are listed at the end of the run.
``auto`` must never refuse a valid call, and the ``numpy`` backend never refuses
host data.

On a GPU machine the same files run the GPU contract: ``python -m pytest -q -m gpu``
(``-m "gpu and not slow"`` leaves out the > 2^31-element tests).
"""

from __future__ import annotations

import collections
import itertools
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import settings

import linred
import linred.backends as registry

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes comes with the test environment
    ml_dtypes = None

try:
    import torch
except ImportError:  # torch is optional
    torch = None

settings.register_profile("linred", max_examples=50, deadline=None, derandomize=True, database=None)
settings.load_profile("linred")

# ---------------------------------------------------------------------------
# What this machine has
# ---------------------------------------------------------------------------


def _cupy_device_count() -> int:
    # cupy may be missing, or present without a driver (it then raises on the first CUDA call)
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


GPU_COUNT = _cupy_device_count()
HAS_CUPY_GPU = GPU_COUNT > 0
HAS_TORCH = torch is not None
HAS_TORCH_CUDA = HAS_TORCH and torch.cuda.is_available()
HAS_GPU = HAS_CUPY_GPU or HAS_TORCH_CUDA

if HAS_CUPY_GPU:
    import cupy
else:
    cupy = None

#: the backends of the public contract; the registry may list more
CONTRACT_BACKENDS = ("numpy", "nvmath", "cublas", "cub")
#: every registered backend but the host-only numpy one runs on GPU data
GPU_BACKENDS = tuple(b for b in registry.BACKENDS if b != "numpy")
REDUCTIONS = ("sum", "mean", "max", "min")
FUNCTIONS = {
    "sum": linred.segmented_sum,
    "mean": linred.segmented_mean,
    "max": linred.segmented_max,
    "min": linred.segmented_min,
}


def backend_available(name: str) -> bool:
    """Whether backend ``name`` can run here; a backend module that fails to import counts as unavailable."""
    try:
        return registry.unavailable(name) is None
    except Exception:
        return False


HOST_KINDS = ("numpy", "torch-cpu") if HAS_TORCH else ("numpy",)
GPU_KINDS = tuple(k for k, ok in (("cupy", HAS_CUPY_GPU), ("torch-cuda", HAS_TORCH_CUDA and HAS_CUPY_GPU)) if ok)
KINDS = HOST_KINDS + GPU_KINDS
HOST_BACKENDS = ("numpy", "nvmath") if backend_available("nvmath") else ("numpy",)


def is_gpu_kind(kind: str) -> bool:
    return kind in ("cupy", "torch-cuda")


def _kind_param(kind: str) -> Any:
    return pytest.param(kind, id=kind, marks=[pytest.mark.gpu] if is_gpu_kind(kind) else [])


def _kind_backend_params() -> list[Any]:
    params = []
    for kind in KINDS:
        names = (*GPU_BACKENDS, "auto") if is_gpu_kind(kind) else (*HOST_BACKENDS, "auto")
        marks = [pytest.mark.gpu] if is_gpu_kind(kind) else []
        params += [pytest.param(kind, name, id=f"{kind}-{name}", marks=marks) for name in names]
    return params


KIND_PARAMS = [_kind_param(k) for k in KINDS]
KIND_BACKEND_PARAMS = _kind_backend_params()
HOST_BACKEND_PARAMS = [pytest.param(b, id=b) for b in (*HOST_BACKENDS, "auto")]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``array_kind`` and ``backend`` arguments are parametrized together: only meaningful pairs."""
    names = metafunc.fixturenames
    if "array_kind" in names and "backend" in names:
        metafunc.parametrize(("array_kind", "backend"), KIND_BACKEND_PARAMS)
    elif "array_kind" in names:
        metafunc.parametrize("array_kind", KIND_PARAMS)
    elif "host_backend" in names:
        metafunc.parametrize("host_backend", HOST_BACKEND_PARAMS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240607)


@pytest.fixture
def clean_plan_cache():
    """Start and end with an empty plan cache of the default size."""
    linred.set_plan_cache_size(64)
    linred.clear_plan_cache()
    yield
    linred.set_plan_cache_size(64)
    linred.clear_plan_cache()


# ---------------------------------------------------------------------------
# Backend refusals
# ---------------------------------------------------------------------------


class Refused(Exception):
    """A named backend refused a call with a proper BackendError; the test stops and passes."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"backend {backend!r} refused: {reason}")
        self.backend = backend
        self.reason = reason


REFUSALS: collections.Counter = collections.Counter()
#: calls the differential suite checked (tests/test_differential.py), refused and found wrong
DIFFERENTIAL: collections.Counter = collections.Counter()


def is_host_array(x: Any) -> bool:
    if isinstance(x, (np.ndarray, list, tuple)):
        return True
    return HAS_TORCH and isinstance(x, torch.Tensor) and x.device.type == "cpu"


def check_refusal(error: BaseException, backend: str) -> None:
    """Assert that ``error`` is a well-formed refusal by ``backend``."""
    assert isinstance(error, linred.BackendError), f"expected BackendError, got {type(error).__name__}: {error}"
    assert error.backend == backend, f"BackendError names {error.backend!r}, not the requested {backend!r}"
    assert f"{backend!r}" in str(error), f"the message does not name the backend: {error}"
    assert isinstance(error.reason, str) and error.reason.strip(), "BackendError without a reason"


def run_or_refused(fn: Callable[..., Any], *args: Any, backend: str, **kwargs: Any) -> Any:
    """``fn(*args, backend=backend, **kwargs)``; a proper refusal by a named backend ends the test as passed.

    ``auto`` must never refuse a valid call, and the numpy backend must serve every
    host call; any other exception propagates.
    """
    try:
        return fn(*args, backend=backend, **kwargs)
    except linred.BackendError as e:
        if backend == "auto":
            raise AssertionError(f"backend='auto' refused a valid call: {e}") from e
        check_refusal(e, backend)
        if backend == "numpy" and args and is_host_array(args[0]):
            raise AssertionError(f"the numpy backend must serve every host call: {e}") from e
        raise Refused(backend, e.reason) from e


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    try:
        return (yield)
    except Refused as r:
        reason = r.reason if len(r.reason) <= 160 else r.reason[:157] + "..."
        REFUSALS[(r.backend, reason)] += 1
        pyfuncitem.user_properties.append(("refused", f"{r.backend}: {r.reason}"))
        return True


@pytest.fixture
def differential_counts(request: pytest.FixtureRequest):
    """Records the differential calls a test checked on its report (summed by the main process,
    also across pytest-xdist workers: see pytest_runtest_logreport)."""
    before = collections.Counter(DIFFERENTIAL)
    yield
    delta = collections.Counter(DIFFERENTIAL)
    delta.subtract(before)
    request.node.user_properties.append(("differential", dict(delta)))


#: whether this process is a pytest-xdist controller: the tests run in workers, whose counts of
#: differential calls arrive on their reports
_CONTROLLER = False


def pytest_configure(config: pytest.Config) -> None:
    global _CONTROLLER
    _CONTROLLER = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _CONTROLLER and report.when == "teardown":
        for key, value in report.user_properties:
            if key == "differential":
                DIFFERENTIAL.update(value)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if DIFFERENTIAL:
        terminalreporter.section("differential suite")
        terminalreporter.write_line(
            f"{DIFFERENTIAL['calls']} calls checked against the float64 reference "
            f"({DIFFERENTIAL['refused']} proper refusals by named backends), {DIFFERENTIAL['failed']} wrong"
        )
    if not REFUSALS:
        return
    terminalreporter.section("backend refusals (proper BackendError; counted as passed)")
    for (backend, reason), count in sorted(REFUSALS.items()):
        terminalreporter.write_line(f"{count:6d}  {backend}: {reason}")


# ---------------------------------------------------------------------------
# dtypes, independent of linred._dtypes
# ---------------------------------------------------------------------------

SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
INTEGER = ("bool", *SIGNED, *UNSIGNED)
HALF = ("float16", "bfloat16")
REAL = (*HALF, "float32", "float64")
COMPLEX = ("complex64", "complex128")
ALL_DTYPES = (*INTEGER, *REAL, *COMPLEX)


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        if ml_dtypes is None:  # pragma: no cover
            pytest.skip("bfloat16 NumPy arrays need ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def canonical(dtype: Any) -> str:
    """Canonical name of a NumPy/torch dtype or a dtype-like."""
    if HAS_TORCH and isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    if isinstance(dtype, str) and dtype == "bfloat16":
        return dtype
    return np.dtype(dtype).name


def dtype_of(a: Any) -> str:
    return canonical(a.dtype)


def expected_dtype(reduction: str, in_name: str, requested: Any = None) -> str:
    """The result dtype the contract promises."""
    if requested is not None:
        return canonical(requested)
    if reduction in ("max", "min") or in_name in REAL or in_name in COMPLEX:
        return in_name
    if reduction == "mean":
        return "float64"
    return "uint64" if in_name in UNSIGNED else "int64"


def finfo(name: str) -> Any:
    """finfo of the real part of a floating dtype name."""
    name = {"complex64": "float32", "complex128": "float64"}.get(name, name)
    if name == "bfloat16":
        return ml_dtypes.finfo(ml_dtypes.bfloat16)
    return np.finfo(name)


def accumulation(out_name: str) -> str:
    """The accumulation precision the contract promises for a floating result (real part)."""
    if out_name in HALF:
        return "float32"
    return {"complex64": "float32", "complex128": "float64"}.get(out_name, out_name)


def make_data(dtype: str, shape: int | tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random test data of ``dtype`` whose sums cannot overflow."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in SIGNED:
        return rng.integers(-50, 50, shape).astype(dtype)
    if dtype in UNSIGNED:
        return rng.integers(0, 100, shape).astype(dtype)
    if dtype in COMPLEX:
        return (rng.uniform(-2, 2, shape) + 1j * rng.uniform(-2, 2, shape)).astype(dtype)
    return rng.uniform(-2, 2, shape).astype(np_dtype(dtype))


# ---------------------------------------------------------------------------
# Array kinds
# ---------------------------------------------------------------------------


def to_kind(a: Any, kind: str) -> Any:
    """A fresh, C-contiguous array of ``kind`` with the values and dtype of NumPy array ``a``."""
    a = np.asarray(a)
    if kind == "numpy":
        return np.array(a, copy=True)
    if kind in ("torch-cpu", "torch-cuda"):
        if not HAS_TORCH:  # pragma: no cover
            pytest.skip("torch is not installed")
        a = np.array(a, order="C", copy=True)  # (np.ascontiguousarray would make 0-d arrays 1-D)
        t = (
            torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
            if a.dtype.name == "bfloat16"
            else torch.from_numpy(a)
        )
        return t.to("cuda") if kind == "torch-cuda" else t
    if kind == "cupy":
        if a.dtype.name == "bfloat16":
            pytest.skip("CuPy has no bfloat16 dtype")
        return cupy.asarray(a)
    raise ValueError(kind)


def to_numpy(a: Any) -> np.ndarray:
    """A host NumPy copy of any array kind (bfloat16 as an ml_dtypes array)."""
    if isinstance(a, np.ndarray):
        return a
    if HAS_TORCH and isinstance(a, torch.Tensor):
        t = a.detach().cpu().resolve_conj().resolve_neg()
        if t.dtype == torch.bfloat16:
            return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16).reshape(t.shape)
        return t.numpy()
    if cupy is not None and isinstance(a, cupy.ndarray):
        return cupy.asnumpy(a)
    raise TypeError(f"not an array: {type(a).__name__}")


def kind_of(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return "numpy"
    if HAS_TORCH and isinstance(a, torch.Tensor):
        return "torch-cpu" if a.device.type == "cpu" else "torch-cuda"
    if cupy is not None and isinstance(a, cupy.ndarray):
        return "cupy"
    return type(a).__module__ + "." + type(a).__name__


def device_of(a: Any) -> Any:
    if HAS_TORCH and isinstance(a, torch.Tensor):
        return a.device
    if cupy is not None and isinstance(a, cupy.ndarray):
        return a.device.id
    return None


def assert_same_kind(result: Any, x: Any) -> None:
    """The result has the input's array type and device (a silent host fallback fails here)."""
    expected = kind_of(np.asarray(x)) if isinstance(x, (list, tuple)) else kind_of(x)
    assert kind_of(result) == expected, f"result is {kind_of(result)}, input is {expected}"
    assert type(result) is type(x) or isinstance(x, (list, tuple)), f"{type(result)} is not {type(x)}"
    assert device_of(result) == device_of(x), f"result on {device_of(result)}, input on {device_of(x)}"


def xp_of(kind: str) -> Any:
    return cupy if kind == "cupy" else np


def synchronize(kind: str) -> None:
    if kind == "cupy":
        cupy.cuda.get_current_stream().synchronize()
    elif kind == "torch-cuda":
        torch.cuda.synchronize()


def empty_like_kind(kind: str, shape: tuple[int, ...], dtype: str) -> Any:
    """An uninitialized array of ``kind`` (C-contiguous) to pass as ``out``."""
    if kind == "numpy":
        return np.empty(shape, dtype=np_dtype(dtype))
    if kind == "cupy":
        if dtype == "bfloat16":
            pytest.skip("CuPy has no bfloat16 dtype")
        return cupy.empty(shape, dtype=dtype)
    return torch.empty(shape, dtype=getattr(torch, dtype), device="cuda" if kind == "torch-cuda" else "cpu")


# ---------------------------------------------------------------------------
# Segments and the reference
# ---------------------------------------------------------------------------


def segment_bounds(
    n: int, segment_length: int | None = None, offsets: Any = None, lengths: Any = None
) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of a segment spec (given as plain Python/NumPy values)."""
    if segment_length is not None:
        return [(i * segment_length, (i + 1) * segment_length) for i in range(n // segment_length)]
    if lengths is not None:
        lengths = to_numpy(lengths) if hasattr(lengths, "shape") else lengths
        offsets = [0, *np.cumsum(np.asarray(lengths, dtype=np.int64)).tolist()]
    off = [int(v) for v in np.asarray(to_numpy(offsets) if hasattr(offsets, "shape") else offsets).tolist()]
    return list(itertools.pairwise(off))


def identity(reduction: str, name: str) -> Any:
    if reduction == "sum":
        return 0
    if reduction == "mean":
        return math.nan
    if name == "bool":
        return reduction == "min"
    if name in INTEGER:
        info = np.iinfo(name)
        return int(info.min) if reduction == "max" else int(info.max)
    return -math.inf if reduction == "max" else math.inf


def reference(
    reduction: str, x: Any, segments: Sequence[tuple[int, int]], axis: int = 0, dtype: Any = None
) -> np.ndarray:
    """The segmented reduction of NumPy array ``x``, segment by segment.

    Integer results are exact (Python ints, then the result dtype); floating
    results are float64 (complex128 for complex), not rounded to the result dtype.
    Complex sums and means are those of the real and imaginary parts, so an
    infinity gives ``inf+0j``, as ``numpy.sum`` does.
    """
    x = np.asarray(x)
    out_name = expected_dtype(reduction, x.dtype.name, dtype)
    xm = np.moveaxis(x, axis, 0)
    rest = xm.shape[1:]
    if out_name == "bool":  # max/min of bool
        work = xm.astype(bool)
    elif out_name in INTEGER:  # exact: Python ints
        work = (xm.astype(np.int64) if x.dtype.kind == "b" else xm).astype(object)
    elif x.dtype.name in COMPLEX or out_name in COMPLEX:
        work = xm.astype(np.complex128)
    else:
        work = xm.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as it should be
        pieces = [_reduce_segment(reduction, work[start:stop], rest, out_name) for start, stop in segments]
    result = np.stack(pieces) if pieces else np.empty((0, *rest), dtype=work.dtype)
    if out_name in INTEGER:
        result = result.astype(np.dtype(out_name))  # exact; raises if the true result overflows
    elif result.dtype == object:
        result = result.astype(np.float64)
    return np.moveaxis(result, 0, axis)


def _reduce_segment(reduction: str, seg: np.ndarray, rest: tuple[int, ...], out_name: str) -> np.ndarray:
    if seg.shape[0] == 0:
        return np.full(rest, identity(reduction, out_name), dtype=seg.dtype)
    if reduction == "sum":
        return np.asarray(seg.sum(axis=0), dtype=seg.dtype)
    if reduction == "mean" and seg.dtype.kind == "c":  # componentwise: (inf+0j)/4 is inf+0j, not inf+nanj
        total = seg.sum(axis=0)
        mean = np.empty(rest, dtype=seg.dtype)
        mean.real, mean.imag = total.real / seg.shape[0], total.imag / seg.shape[0]
        return mean
    if reduction == "mean":
        return np.asarray(seg.sum(axis=0) / seg.shape[0])
    if reduction == "max":
        return np.asarray(np.max(seg, axis=0), dtype=seg.dtype)
    return np.asarray(np.min(seg, axis=0), dtype=seg.dtype)


def _segment_lengths_like(ref: np.ndarray, segments: Sequence[tuple[int, int]], axis: int) -> np.ndarray:
    lengths = np.array([stop - start for start, stop in segments], dtype=np.float64)
    shape = [1] * ref.ndim
    shape[axis] = len(segments)
    return lengths.reshape(shape)


def error_bound(
    reduction: str, x: np.ndarray, segments: Sequence[tuple[int, int]], axis: int, out_name: str, ref: np.ndarray
) -> np.ndarray:
    """An honest elementwise bound on ``|result - exact|`` for a floating sum or mean.

    Any summation order in precision ``u`` (unit roundoff of the accumulation
    dtype) errs by at most ``gamma(L) * sum|x|`` with ``gamma(k) = k u / (1 - k u)``
    (Higham, Accuracy and Stability, 4.2); the input's conversion to the
    accumulation dtype adds one more ``u``, a mean's division and the rounding to
    the result dtype one ulp of the result each.  The factor 2 absorbs complex
    arithmetic and stays far below what accumulating in a narrower dtype (or TF32)
    would need.
    """
    u = finfo(accumulation(out_name)).eps / 2
    k = _segment_lengths_like(ref, segments, axis) + 1
    gamma = np.where(k * u < 0.5, k * u / (1 - k * u), np.inf)
    absx = np.abs(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64))
    magnitude = reference(reduction, absx, segments, axis)
    eps_out = float(finfo(out_name).eps)
    tiny = float(finfo(out_name).smallest_normal)
    return 2 * gamma * magnitude + 2 * eps_out * np.abs(ref) + tiny


def assert_reduction(
    got: Any,
    reduction: str,
    x: Any,
    *,
    segments: Sequence[tuple[int, int]],
    axis: int = 0,
    dtype: Any = None,
    like: Any = None,
) -> None:
    """Check a result against :func:`reference`: type, device, dtype, shape and values.

    ``like`` is the array the call received (its kind and device must be the
    result's); ``x`` is its NumPy twin.  max/min and integer results must be exact,
    floating sums and means within :func:`error_bound`.
    """
    if like is not None:
        assert_same_kind(got, like)
    x = np.asarray(x)
    out_name = expected_dtype(reduction, x.dtype.name, dtype)
    assert dtype_of(got) == out_name, f"result dtype {dtype_of(got)}, expected {out_name}"
    ref = reference(reduction, x, segments, axis, dtype)
    res = to_numpy(got)
    assert res.shape == ref.shape, f"result shape {res.shape}, expected {ref.shape}"
    if out_name in INTEGER:
        np.testing.assert_array_equal(res, ref, strict=True)
        return
    res = res.astype(np.complex128 if out_name in COMPLEX else np.float64)
    if reduction in ("max", "min"):
        # an element of the input, so exact once rounded to the result dtype
        expected = ref.astype(np_dtype(out_name)).astype(res.dtype)
        np.testing.assert_array_equal(res, expected)
        return
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(np.isnan(res), np.isnan(ref), err_msg="NaN in the wrong places")
    np.testing.assert_array_equal(res[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)], err_msg="inf")
    bound = error_bound(reduction, x, segments, axis, out_name, ref)
    with np.errstate(invalid="ignore"):
        err = np.abs(res - ref)
    bad = finite & ~(err <= bound)
    if bad.any():
        i = tuple(int(v[0]) for v in np.nonzero(bad))
        raise AssertionError(
            f"{int(bad.sum())} of {ref.size} elements off the float64 reference beyond the bound; "
            f"first at {i}: got {res[i]!r}, reference {ref[i]!r}, error {err[i]:.3g} > bound {bound[i]:.3g}"
        )


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        available = linred.available_backends()
    except Exception as e:  # a backend module that fails to import is reported by the tests
        available = f"error: {type(e).__name__}: {e}"
    return [
        f"linred {linred.__version__} from {linred.__file__}; python {sys.version.split()[0]}",
        f"GPUs: {GPU_COUNT} (cupy), torch cuda: {HAS_TORCH_CUDA}; kinds: {', '.join(KINDS)}",
        f"host backends under test: {', '.join(HOST_BACKENDS)}; available_backends(): {available}",
    ]
