"""Determinism as a contract: the same call on the same inputs gives the same bits, run after run.

docs/determinism.md says, backend by backend, which results are bitwise reproducible and
under which conditions; every backend that page calls deterministic has a test here.  Each
test makes the same call ``REPEATS`` times on the same inputs (through the functions, so
the first call plans and the later ones take the repeated-call path; the plan cache is
cleared every ``REPLAN`` calls, so that re-planning is covered too) and compares every
result with the first byte for byte (NaN-safe: bits, not values).  The shapes reach each
backend's code paths.

- ``numpy`` and ``auto`` on host data run here and in CI (a few seconds).
- ``nvmath`` on the host (MKL) is deterministic only in MKL's conditional numerical
  reproducibility mode with a fixed thread count: it runs in two subprocesses with
  ``MKL_CBWR=AUTO`` and ``MKL_NUM_THREADS=2``, which must agree with each other too.
- The GPU backends (``nvrtc``, ``cub``, ``cublas``, ``nvmath`` for fixed lengths, ``auto``)
  are marked ``gpu``.  ``nvmath`` with offsets (cuSPARSE SpMM with its default
  algorithm) is not documented as deterministic and has no test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import HAS_CUPY_GPU, HAS_TORCH_CUDA, HOST_BACKENDS, documented_refusal, make_data, to_numpy

import linred

if HAS_CUPY_GPU:
    import cupy
if HAS_TORCH_CUDA:
    import torch

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 100
REPLAN = 25  #: the plan cache is cleared before every REPLAN-th call


def first_difference(a: np.ndarray, b: np.ndarray) -> str:
    """Where two results of the same call first differ in their bits (or their dtype or shape)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{list(a.shape)} against {b.dtype}{list(b.shape)}"
    ra = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, a.itemsize)
    rb = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, b.itemsize)
    bad = np.flatnonzero((ra != rb).any(axis=1))
    i = np.unravel_index(int(bad[0]), a.shape)
    return f"{len(bad)} of {a.size} values differ; first at {tuple(int(v) for v in i)}: {a[i]!r} against {b[i]!r}"


def assert_same_bits(results: list[np.ndarray], what: str) -> None:
    first = results[0]
    for k, r in enumerate(results[1:], 1):
        same = r.dtype == first.dtype and r.shape == first.shape and r.tobytes() == first.tobytes()
        assert same, f"{what}: call {k} differs from call 0: {first_difference(first, r)}"


def repeat(call: Callable[[], Any], what: str, sync: Callable[[], None] = lambda: None) -> None:
    """Run ``call`` REPEATS times (clearing the plan cache every REPLAN calls) and compare the bits."""
    results = []
    for k in range(REPEATS):
        if k and k % REPLAN == 0:
            linred.clear_plan_cache()
        results.append(call())
    sync()
    assert_same_bits([to_numpy(r) for r in results], what)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def long_offsets(rng: np.random.Generator, long: int = 1 << 21) -> np.ndarray:
    """Short and empty segments around one long segment (it spans many blocks or runs of work)."""
    return _offsets(np.concatenate([rng.integers(0, 40, 3000), [long], rng.integers(0, 40, 3000), [0, 0]]))


def mixed_offsets(rng: np.random.Generator, m: int, mean: int) -> np.ndarray:
    """``m`` segments of geometric lengths of mean ``mean``, a fifth of them empty."""
    lengths = rng.geometric(1 / mean, m)
    lengths[rng.random(m) < 0.2] = 0
    return _offsets(lengths)


# ---------------------------------------------------------------------------
# Host: numpy and auto (auto's host order starts with numpy)
# ---------------------------------------------------------------------------


def host_cases() -> list[tuple[str, Callable[[np.random.Generator], tuple[str, np.ndarray, dict]]]]:
    """(id, build) pairs; build(rng) gives (reduction, x, keyword arguments)."""
    return [
        # fixed lengths of floating data: the (m, L) view times ones, a BLAS GEMV
        ("fixed-f32-sum-L7", lambda r: ("sum", make_data("float32", 7 * 20000, r), {"segment_length": 7})),
        ("fixed-f32-mean-L256", lambda r: ("mean", make_data("float32", 256 * 1024, r), {"segment_length": 256})),
        ("fixed-f64-sum-L3", lambda r: ("sum", make_data("float64", 3 * 30000, r), {"segment_length": 3})),
        # segments longer than a BLAS block (1024, or 256 for feature rows): block sums added in float64
        (
            "fixed-f32-sum-L5000-blocks",
            lambda r: ("sum", make_data("float32", 5000 * 60, r), {"segment_length": 5000}),
        ),
        (
            "fixed-f16-mean-L3000-blocks",
            lambda r: ("mean", make_data("float16", 3000 * 300, r), {"segment_length": 3000}),
        ),
        (
            "fixed-f32-sum-features-L1000-blocks",
            lambda r: ("sum", make_data("float32", (1000 * 64, 16), r), {"segment_length": 1000}),
        ),
        # 16-bit data: converted in blocks of rows, then the product
        ("fixed-f16-sum-L33", lambda r: ("sum", make_data("float16", 33 * 10000, r), {"segment_length": 33})),
        # complex: real and imaginary parts, each a GEMV
        ("fixed-c64-mean-L16", lambda r: ("mean", make_data("complex64", 16 * 8192, r), {"segment_length": 16})),
        # (n, d) feature rows: ones times each segment's (L, d) block, a batched product
        ("fixed-f32-sum-features", lambda r: ("sum", make_data("float32", (8 * 4096, 16), r), {"segment_length": 8})),
        # rows of a batch along the last axis
        (
            "fixed-f32-mean-rows",
            lambda r: ("mean", make_data("float32", (3, 100 * 500), r), {"segment_length": 100, "axis": -1}),
        ),
        # offsets: reduceat over the non-empty segments; 2^21 elements and more are cut across threads
        ("offsets-f32-sum-threads", lambda r: ("sum", make_data("float32", 1 << 22, r), {"offsets": None})),
        ("offsets-f32-mean-empty", lambda r: ("mean", make_data("float32", 200_000, r), {"offsets": 40})),
        ("offsets-f64-sum-features", lambda r: ("sum", make_data("float64", (50_000, 8), r), {"offsets": 12})),
        ("lengths-f16-sum", lambda r: ("sum", make_data("float16", 100_000, r), {"lengths": 30})),
        ("offsets-f32-max-nan", lambda r: ("max", _with_nans(make_data("float32", 100_000, r), r), {"offsets": 9})),
    ]


def _with_nans(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    x[rng.random(x.shape) < 0.001] = np.nan
    return x


def _host_arguments(rng: np.random.Generator, x: np.ndarray, kwargs: dict) -> dict:
    """Segment arguments for the data: None asks for long_offsets, an int for mixed offsets of that mean."""
    kwargs = dict(kwargs)
    n = x.shape[kwargs.get("axis", 0)]
    for key in ("offsets", "lengths"):
        if key in kwargs:
            if kwargs[key] is None:
                off = long_offsets(rng, long=n - 120_000)
            else:
                off = mixed_offsets(rng, n // kwargs[key], kwargs[key])
            off = np.append(off[off < n], n)
            kwargs[key] = off if key == "offsets" else np.diff(off)
    return kwargs


HOST_CASES = host_cases()


@pytest.mark.parametrize("backend", ["numpy", "auto"])
@pytest.mark.parametrize("build", [b for _, b in HOST_CASES], ids=[i for i, _ in HOST_CASES])
def test_host_results_are_bitwise_reproducible(backend, build):
    rng = np.random.default_rng(7)
    reduction, x, kwargs = build(rng)
    kwargs = _host_arguments(rng, x, kwargs)
    fn = getattr(linred, f"segmented_{reduction}")
    repeat(lambda: fn(x, backend=backend, **kwargs), f"{backend}: segmented_{reduction} {x.dtype}{list(x.shape)}")


def test_host_torch_tensor_is_bitwise_reproducible():
    torch_ = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    x = torch_.from_numpy(make_data("float32", 64 * 4096, rng))
    repeat(lambda: linred.segmented_sum(x, 64), "auto: a CPU tensor, fixed length 64")


# ---------------------------------------------------------------------------
# Host: nvmath on MKL, in MKL's conditional numerical reproducibility mode
# ---------------------------------------------------------------------------

#: MKL is bitwise reproducible run to run with CNR on and a fixed number of threads
#: (oneMKL Developer Guide, "Obtaining Numerically Reproducible Results")
MKL_ENV = {"MKL_CBWR": "AUTO", "MKL_NUM_THREADS": "2", "MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"}

_MKL_SCRIPT = r"""
import ctypes, hashlib, json, sys
import numpy as np
import linred

REPEATS, REPLAN = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(11)
def data(dtype, shape):
    if dtype.startswith("complex"):
        return (rng.uniform(-2, 2, shape) + 1j * rng.uniform(-2, 2, shape)).astype(dtype)
    return rng.uniform(-2, 2, shape).astype(dtype)
cases = {
    "fixed-f32-sum-L64": ("sum", data("float32", 64 * 8192), {"segment_length": 64}),
    "fixed-f64-mean-L1000": ("mean", data("float64", 1000 * 300), {"segment_length": 1000}),
    "fixed-c64-sum-L16": ("sum", data("complex64", 16 * 8192), {"segment_length": 16}),
    "fixed-f32-sum-features": ("sum", data("float32", (8 * 4096, 16)), {"segment_length": 8}),
    "fixed-f64-sum-rows": ("sum", data("float64", (3, 100 * 700)), {"segment_length": 100, "axis": -1}),
}
out = {}
for name, (reduction, x, kwargs) in cases.items():
    fn = getattr(linred, "segmented_" + reduction)
    results = []
    try:
        fn(x, backend="nvmath", **kwargs)
    except linred.BackendError as e:  # e.g. an MKL without batched products: declared, not compared
        out[name] = {"refused": e.reason}
        continue
    for k in range(REPEATS):
        if k and k % REPLAN == 0:
            linred.clear_plan_cache()
        results.append(fn(x, backend="nvmath", **kwargs).tobytes())
    differ = [k for k, r in enumerate(results) if r != results[0]]
    out[name] = {"sha256": hashlib.sha256(results[0]).hexdigest(), "differ": differ[:5]}
# MKL's CNR setting, as MKL itself reports it (MKL_CBWR_Get(MKL_CBWR_BRANCH); 1 is CNR off)
branch = None
for line in open("/proc/self/maps"):
    path = line.split()[-1]
    if "libmkl_rt" in path:
        get = ctypes.CDLL(path).MKL_CBWR_Get
        get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
        branch = get(1)
        break
print(json.dumps({"cases": out, "cbwr_branch": branch}))
"""


def _run_mkl(env: dict[str, str]) -> dict:
    full = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", _MKL_SCRIPT, str(REPEATS), str(REPLAN)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=full,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif("nvmath" not in HOST_BACKENDS, reason="nvmath cannot run on the CPU here (it needs MKL)")
def test_nvmath_on_mkl_is_bitwise_reproducible_with_cnr():
    """With MKL_CBWR set and a fixed thread count, every call in a process gives the bits of the
    first, and a second process gives the same bits as the first."""
    first, second = _run_mkl(MKL_ENV), _run_mkl(MKL_ENV)
    refused = {name: case["refused"] for name, case in first["cases"].items() if "refused" in case}
    for name, reason in refused.items():  # declared: documented refusals (or no MKL here) only
        assert documented_refusal("nvmath", reason) is not None, f"nvmath: {name}: undocumented refusal: {reason}"
    served = {name: case for name, case in first["cases"].items() if "refused" not in case}
    if not served:
        pytest.skip(f"nvmath refused every case here: {first['cases']}")
    for name, case in served.items():
        assert not case["differ"], f"nvmath (MKL, CNR): {name}: calls {case['differ']} differ from call 0"
    assert first["cases"] == second["cases"], "nvmath (MKL, CNR): two processes gave different bits"
    if first["cbwr_branch"] is not None:
        assert first["cbwr_branch"] != 1, "MKL_CBWR=AUTO did not turn MKL's CNR mode on"


# ---------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------


def _gpu(x_np: np.ndarray, kind: str = "cupy") -> Any:
    if kind == "cupy":
        return cupy.asarray(x_np)
    if x_np.dtype.name == "bfloat16":
        return torch.from_numpy(x_np.view(np.int16)).view(torch.bfloat16).to("cuda")
    return torch.from_numpy(x_np).to("cuda")


def _strided(x_np: np.ndarray) -> tuple[np.ndarray, Any]:
    """Every other element of a twice-as-long device buffer (a strided view) and its NumPy twin."""
    buffer = cupy.asarray(np.repeat(x_np, 2))
    return x_np, buffer[::2]


def _unaligned(x_np: np.ndarray) -> tuple[np.ndarray, Any]:
    """The data one element into a device buffer: not 16-byte aligned."""
    buffer = cupy.asarray(np.concatenate([x_np[:1], x_np]))
    view = buffer[1:]
    assert view.data.ptr % 16
    return x_np, view


def fixed(dtype: str, shape: int | tuple[int, ...], L: int, reduction: str = "sum", axis: int = 0) -> Callable:
    """A build for a fixed length ``L`` over fresh contiguous device data of ``shape``."""

    def build(rng: np.random.Generator) -> tuple[str, Any, dict]:
        kwargs = {"segment_length": L} if axis == 0 else {"segment_length": L, "axis": axis}
        return reduction, _gpu(make_data(dtype, shape, rng)), kwargs

    return build


def gpu_cases() -> list[tuple[str, str, Callable]]:
    """(id, backend, build) with build(rng) -> (reduction, device array, keyword arguments)."""
    return [
        # nvrtc: fixed_small (powers of two up to 32 vectors), fixed_rows, fixed_long (partials
        # added in order by a segment's last block), warp_reduce (offsets, other short fixed
        # lengths; segments spanning many runs joined by the fix-up), tile_reduce (strided or
        # unaligned data), features_reduce ((n, d) rows)
        ("nvrtc-fixed_small-f32-sum-L8", "nvrtc", fixed("float32", 1 << 22, 8)),
        ("nvrtc-fixed_small-f16-mean-L64", "nvrtc", fixed("float16", 1 << 22, 64, "mean")),
        ("nvrtc-fixed_small-f64-sum-L4", "nvrtc", fixed("float64", 1 << 21, 4)),
        ("nvrtc-fixed_rows-f32-sum-L1024", "nvrtc", fixed("float32", 1 << 22, 1024)),
        ("nvrtc-fixed_long-f32-sum-L2^20", "nvrtc", fixed("float32", 1 << 23, 1 << 20)),
        ("nvrtc-fixed_long-f32-mean-L100000", "nvrtc", fixed("float32", 100_000 * 20, 100_000, "mean")),
        ("nvrtc-fixed_long-f64-sum-L2^18", "nvrtc", fixed("float64", 1 << 22, 1 << 18)),
        ("nvrtc-fixed_long-f16-sum-L3000", "nvrtc", fixed("float16", 3000 * 500, 3000)),
        ("nvrtc-warp-fixed-f32-sum-L100", "nvrtc", fixed("float32", 100 * 40_000, 100)),
        ("nvrtc-warp-offsets-f32-sum-long", "nvrtc", lambda r: _offsets_case(r, "sum", "float32")),
        ("nvrtc-warp-offsets-f32-mean-long", "nvrtc", lambda r: _offsets_case(r, "mean", "float32")),
        ("nvrtc-warp-offsets-f64-sum-long", "nvrtc", lambda r: _offsets_case(r, "sum", "float64")),
        ("nvrtc-warp-offsets-f16-sum-long", "nvrtc", lambda r: _offsets_case(r, "sum", "float16")),
        ("nvrtc-warp-offsets-f32-sum-mixed", "nvrtc", lambda r: _offsets_case(r, "sum", "float32", mean=300)),
        ("nvrtc-warp-offsets-f32-max-nan", "nvrtc", lambda r: _offsets_case(r, "max", "float32", nans=True)),
        ("nvrtc-warp-offsets-rows", "nvrtc", lambda r: _offsets_case(r, "sum", "float32", rows=3)),
        ("nvrtc-tile-offsets-f32-sum-strided", "nvrtc", lambda r: _offsets_case(r, "sum", "float32", view=_strided)),
        ("nvrtc-tile-offsets-f32-unaligned", "nvrtc", lambda r: _offsets_case(r, "sum", "float32", view=_unaligned)),
        ("nvrtc-tile-fixed-f32-sum-L3000-strided", "nvrtc", lambda r: _fixed_view(r, 3000, 600, _strided)),
        ("nvrtc-features-offsets-f32-sum", "nvrtc", lambda r: _features_case(r, "sum", "float32", 8, offsets=True)),
        ("nvrtc-features-fixed-f32-mean-L5", "nvrtc", lambda r: _features_case(r, "mean", "float32", 16, L=5)),
        ("nvrtc-features-offsets-f16-sum", "nvrtc", lambda r: _features_case(r, "sum", "float16", 4, offsets=True)),
        # cub: cuda.compute's segmented reduce (cccl), CuPy's CUB (cupy-cub), CuPy's reduction
        # (cupy-reduce: features, strided segments, complex), the strided kernel (variable
        # lengths of features, of strided or of complex data)
        ("cub-cccl-offsets-f32-sum-long", "cub", lambda r: _offsets_case(r, "sum", "float32")),
        ("cub-cccl-offsets-f64-mean-mixed", "cub", lambda r: _offsets_case(r, "mean", "float64", mean=300)),
        ("cub-cccl-fixed-f32-sum-L1000", "cub", fixed("float32", 1000 * 4000, 1000)),
        ("cub-cccl-fixed-f16-mean-L64", "cub", fixed("float16", 1 << 22, 64, "mean")),
        ("cub-cupy_cub-fixed-f32-sum-L64", "cub", fixed("float32", 1 << 22, 64)),
        ("cub-cupy_cub-fixed-f64-sum-L256", "cub", fixed("float64", 1 << 21, 256)),
        ("cub-cupy_reduce-features-f32-sum", "cub", lambda r: _features_case(r, "sum", "float32", 8, L=16)),
        ("cub-cupy_reduce-fixed-c64-sum-L32", "cub", fixed("complex64", 32 * 40_000, 32)),
        ("cub-cupy_reduce-fixed-f32-sum-strided", "cub", lambda r: _fixed_view(r, 100, 20_000, _strided)),
        ("cub-strided-features-offsets-f32-sum", "cub", lambda r: _features_case(r, "sum", "float32", 8, offsets=True)),
        ("cub-strided-offsets-c64-sum", "cub", lambda r: _offsets_case(r, "sum", "complex64", mean=300)),
        ("cub-strided-offsets-f32-sum-strided", "cub", lambda r: _offsets_case(r, "sum", "float32", view=_strided)),
        # cublas: GEMV (one column), gemmEx (16-bit data), strided-batched GEMM (features),
        # complex as real parts, strided views as leading dimensions, a long inner dimension
        ("cublas-gemv-f32-sum-L100", "cublas", fixed("float32", 100 * 40_000, 100)),
        ("cublas-gemv-f32-sum-L2^20", "cublas", fixed("float32", 1 << 23, 1 << 20)),
        ("cublas-gemv-f64-mean-L1000", "cublas", fixed("float64", 1000 * 2000, 1000, "mean")),
        ("cublas-gemmex-f16-sum-L256", "cublas", fixed("float16", 1 << 22, 256)),
        ("cublas-batched-features-f32-sum-L32", "cublas", lambda r: _features_case(r, "sum", "float32", 8, L=32)),
        ("cublas-c64-sum-L64", "cublas", fixed("complex64", 64 * 20_000, 64)),
        ("cublas-padded-rows-f32-sum-L128", "cublas", lambda r: _padded_rows(r, 128, 10_000, 160)),
        ("cublas-rows-f32-mean-L300", "cublas", fixed("float32", (3, 300 * 2000), 300, "mean", axis=-1)),
        # nvmath, fixed lengths: cuBLASLt matmul (a long inner dimension invites split-K)
        ("nvmath-f32-sum-L1000", "nvmath", fixed("float32", 1000 * 4000, 1000)),
        ("nvmath-f32-sum-L2^20", "nvmath", fixed("float32", 1 << 23, 1 << 20)),
        ("nvmath-f16-sum-L4096", "nvmath", fixed("float16", 4096 * 512, 4096)),
        ("nvmath-f64-mean-L512", "nvmath", fixed("float64", 512 * 4000, 512, "mean")),
        ("nvmath-features-f32-sum-L64", "nvmath", lambda r: _features_case(r, "sum", "float32", 8, L=64)),
        ("nvmath-c64-sum-L64", "nvmath", fixed("complex64", 64 * 20_000, 64)),
        # auto: what the shipped dispatch table picks (nvrtc, cublas, nvmath's cuBLASLt, cub)
        ("auto-fixed-f32-sum-L8", "auto", fixed("float32", 1 << 22, 8)),
        ("auto-fixed-f32-sum-L300", "auto", fixed("float32", 300 * 10_000, 300)),
        ("auto-fixed-f16-sum-L300", "auto", fixed("float16", 300 * 10_000, 300)),
        ("auto-fixed-f64-sum-L100", "auto", fixed("float64", 100 * 20_000, 100)),
        ("auto-fixed-c64-sum-L16", "auto", fixed("complex64", 16 * 50_000, 16)),
        ("auto-offsets-f32-sum-long", "auto", lambda r: _offsets_case(r, "sum", "float32")),
        ("auto-offsets-f32-mean-mixed", "auto", lambda r: _offsets_case(r, "mean", "float32", mean=300)),
        ("auto-features-f32-sum-L4", "auto", lambda r: _features_case(r, "sum", "float32", 8, L=4)),
        ("auto-features-f32-sum-L1024", "auto", lambda r: _features_case(r, "sum", "float32", 8, L=1024)),
        ("auto-features-f32-max-offsets", "auto", lambda r: _features_case(r, "max", "float32", 8, offsets=True)),
    ]


def _offsets_case(
    rng: np.random.Generator,
    reduction: str,
    dtype: str,
    *,
    mean: int | None = None,
    nans: bool = False,
    rows: int = 0,
    view: Callable | None = None,
) -> tuple[str, Any, dict]:
    """Offsets over 1-D data (or rows of a batch): one segment of 2^21 elements among short ones,
    or geometric lengths of ``mean`` with empty segments."""
    off = long_offsets(rng) if mean is None else mixed_offsets(rng, (1 << 22) // mean, mean)
    n = int(off[-1])
    x_np = make_data(dtype, (rows, n) if rows else n, rng)
    if nans:
        x_np[rng.random(x_np.shape) < 0.001] = np.nan
    x = view(x_np)[1] if view else _gpu(x_np)
    kwargs = {"offsets": cupy.asarray(off)}
    if rows:
        kwargs["axis"] = 1
    return reduction, x, kwargs


def _padded_rows(rng: np.random.Generator, L: int, rows: int, width: int) -> tuple[str, Any, dict]:
    """Rows of ``L`` of a ``(rows, width)`` buffer, one segment each: a leading dimension for cuBLAS."""
    return "sum", _gpu(make_data("float32", (rows, width), rng))[:, :L], {"segment_length": L, "axis": -1}


def _fixed_view(rng: np.random.Generator, L: int, m: int, view: Callable) -> tuple[str, Any, dict]:
    return "sum", view(make_data("float32", L * m, rng))[1], {"segment_length": L}


def _features_case(
    rng: np.random.Generator, reduction: str, dtype: str, d: int, *, L: int | None = None, offsets: bool = False
) -> tuple[str, Any, dict]:
    if offsets:
        off = mixed_offsets(rng, 20_000, 12)
        return reduction, _gpu(make_data(dtype, (int(off[-1]), d), rng)), {"offsets": cupy.asarray(off)}
    return reduction, _gpu(make_data(dtype, (L * (200_000 // L), d), rng)), {"segment_length": L}


GPU_CASES = gpu_cases()


@pytest.mark.parametrize(("name", "backend", "build"), GPU_CASES, ids=[c[0] for c in GPU_CASES])
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy with a GPU")
def test_gpu_results_are_bitwise_reproducible(name, backend, build):
    rng = np.random.default_rng(9)
    reduction, x, kwargs = build(rng)
    fn = getattr(linred, f"segmented_{reduction}")
    stream = cupy.cuda.get_current_stream()
    repeat(lambda: fn(x, backend=backend, **kwargs), f"{name}: {backend}", sync=stream.synchronize)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_CUPY_GPU and HAS_TORCH_CUDA), reason="needs torch with CUDA")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("spec", ["fixed", "offsets"])
def test_gpu_torch_auto_is_bitwise_reproducible(dtype, spec):
    rng = np.random.default_rng(10)
    if spec == "fixed":
        x, kwargs = _gpu(make_data(dtype, 1 << 22, rng), "torch"), {"segment_length": 16}
    else:
        off = long_offsets(rng)
        x, kwargs = _gpu(make_data(dtype, int(off[-1]), rng), "torch"), {"offsets": torch.from_numpy(off).to("cuda")}
    repeat(lambda: linred.segmented_sum(x, **kwargs), f"auto, torch {dtype} {spec}", sync=torch.cuda.synchronize)


def test_cases_have_unique_names():
    names = [c[0] for c in GPU_CASES] + [c[0] for c in HOST_CASES]
    assert len(names) == len(set(names))
    assert {b for _, b, _ in GPU_CASES} == {"nvrtc", "cub", "cublas", "nvmath", "auto"}
