"""Host-side logic of the GPU backends, tested without a GPU.

The cuBLAS call plans are checked by executing them with a NumPy model of the
cuBLAS calls on a flat buffer, so every leading dimension, batch stride and
offset is verified against the float64 reference; CUB path choice, segment
chunking past ``2**31`` segments, refusal reasons and stream arguments are
checked directly.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import types
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

from linred.arrays._streams import stream_handle
from linred.backends import BACKENDS, configure, cub, cublas, get_backend, options_generation
from linred.backends.base import INT32_MAX, Options, segment_chunks
from linred.backends.nvrtc import DEFAULT_OPTIONS
from linred.errors import BackendError
from linred.problem import Problem

KERNELS = Path(__file__).resolve().parents[1] / "linred" / "kernels"


def gpu_helpers():
    """linred.kernels.elementwise, which imports CuPy (no device needed); skip without CuPy."""
    try:
        from linred.kernels import elementwise
    except ImportError as e:  # no CuPy, or a CuPy that cannot load
        pytest.skip(f"CuPy is not importable: {e}")
    return elementwise


def device_helpers():
    """linred.backends._device, whose CuPy helpers need CuPy (no device); skip without CuPy."""
    from linred.backends import _device

    if _device.cupy is None:
        pytest.skip("CuPy is not importable")
    return _device


def problem(
    reduction: str = "sum",
    dtype: str = "float32",
    shape: tuple[int, int, int] = (1, 64, 1),
    strides: tuple[int, int, int] | None = None,
    length: int | None = 8,
    *,
    acc: str | None = None,
    out: str | None = None,
    kind: str = "cupy",
    device: int | None = 0,
    segments: int | None = None,
    offsets_dtype: str | None = None,
) -> Problem:
    B, n, D = shape
    if strides is None:
        strides = (n * D, D, 1)
    if acc is None:
        acc = {"float16": "float32", "bfloat16": "float32"}.get(dtype, dtype)
        if reduction in ("sum", "mean") and dtype in ("bool", "int8", "int16", "int32"):
            acc = "int64"
        if reduction in ("max", "min"):
            acc = dtype
    if out is None:
        out = dtype if reduction in ("max", "min") or dtype.startswith(("float", "bfloat", "complex")) else acc
    if segments is None:
        segments = n // length if length else 4
    return Problem(
        reduction=reduction,
        kind=kind,
        device=device,
        dtype=dtype,
        acc_dtype=acc,
        out_dtype=out,
        batch=B,
        n=n,
        features=D,
        strides=strides,
        num_segments=segments,
        segment_length=length,
        offsets_dtype=offsets_dtype if length is None else None,
    )


# --- segment chunking -----------------------------------------------------------------


def test_segment_chunks_cover_more_than_int32_segments():
    total = 2 * INT32_MAX + 5
    chunks = list(segment_chunks(total))
    assert chunks == [(0, INT32_MAX), (INT32_MAX, 2 * INT32_MAX), (2 * INT32_MAX, total)]
    assert all(stop - start <= INT32_MAX for start, stop in chunks)


@pytest.mark.parametrize("total, limit", [(0, 3), (1, 3), (3, 3), (10, 3), (10, 1), (7, 100)])
def test_segment_chunks_partition(total, limit):
    chunks = list(segment_chunks(total, limit))
    covered = [i for start, stop in chunks for i in range(start, stop)]
    assert covered == list(range(total))
    assert all(0 < stop - start <= limit for start, stop in chunks)


def test_segment_chunks_rejects_bad_limit():
    with pytest.raises(ValueError, match="limit must be >= 1"):
        list(segment_chunks(5, 0))


# --- a NumPy model of the cuBLAS calls -------------------------------------------------


def _run_calls(calls: list[cublas.Call], buffer: np.ndarray, out_size: int) -> np.ndarray:
    """Execute cuBLAS calls on a flat buffer with column-major semantics, in float64."""
    out = np.full(out_size, np.nan)

    def gemm(call: cublas.Call, x_offset: int, out_offset: int) -> None:
        M, K, lda = call.rows, call.cols, call.lda
        if call.trans:  # A stored K x M, C = A^T ones
            assert lda >= K
            a = np.array([[buffer[x_offset + k + i * lda] for k in range(K)] for i in range(M)])
        else:  # A stored M x K, C = A ones
            assert lda >= M
            a = np.array([[buffer[x_offset + i + k * lda] for k in range(K)] for i in range(M)])
        assert np.all(np.isnan(out[out_offset : out_offset + M])), "a result is written twice"
        out[out_offset : out_offset + M] = a.sum(axis=1)

    for call in calls:
        assert 0 < call.rows <= INT32_MAX and 0 < call.cols <= INT32_MAX and 0 < call.lda <= INT32_MAX
        if call.kind == "gemv":
            assert call.trans
            rows, cols = call.rows, call.cols
            assert call.lda >= rows
            for c in range(cols):
                out[call.out_offset + c] = sum(buffer[call.x_offset + r + c * call.lda] for r in range(rows))
        elif call.kind == "gemm":
            gemm(call, call.x_offset, call.out_offset)
        else:
            assert 0 < call.batch <= INT32_MAX
            for b in range(call.batch):
                gemm(call, call.x_offset + b * call.stride_a, call.out_offset + b * call.stride_c)
    return out


def _strided(base: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    return np.lib.stride_tricks.as_strided(base, shape, tuple(s * base.itemsize for s in strides), writeable=False)


LAYOUTS = {
    # name: (shape (B, n, D), strides in elements, buffer size)
    "contiguous 1-D": ((1, 64, 1), (64, 1, 1), 64),
    "batch adjacent": ((3, 32, 1), (32, 1, 1), 96),
    "batch with gaps": ((3, 32, 1), (40, 1, 1), 120),
    "features contiguous": ((1, 32, 5), (160, 5, 1), 160),
    "features padded rows": ((1, 32, 5), (224, 7, 1), 224),
    "features transposed": ((1, 32, 5), (0, 1, 40), 200),
    "batch and features": ((2, 16, 3), (48, 3, 1), 96),
    "batch gaps and features": ((4, 16, 3), (50, 3, 1), 200),
    "many batches few segments": ((9, 8, 3), (30, 3, 1), 270),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("length", [1, 2, 8])
@pytest.mark.parametrize("use_gemv", [True, False])
def test_cublas_plan_computes_the_segment_sums(name, length, use_gemv):
    shape, strides, size = LAYOUTS[name]
    B, n, D = shape
    buffer = np.random.default_rng(0).standard_normal(size)
    x3 = _strided(buffer, shape, strides)
    p = problem(shape=shape, strides=strides, length=length)
    calls = cublas.plan_calls(p, use_gemv=use_gemv)
    assert not isinstance(calls, str), calls
    m = n // length
    got = _run_calls(calls, buffer, B * m * D).reshape(B, m, D)
    expected = x3.reshape(B, m, length, D).sum(axis=2)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


COMPLEX_LAYOUTS = {
    # name: (shape (B, n, D), strides in complex elements, buffer size in complex elements)
    "contiguous 1-D": ((1, 64, 1), (64, 1, 1), 64),
    "batch with gaps": ((3, 32, 1), (40, 1, 1), 120),
    "strided segments": ((1, 32, 1), (64, 2, 1), 64),
    "features contiguous": ((1, 32, 5), (160, 5, 1), 160),
    "batch gaps and features": ((4, 16, 3), (50, 3, 1), 200),
}


@pytest.mark.parametrize("name", list(COMPLEX_LAYOUTS))
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_cublas_plans_complex_sums_as_real_parts(name, dtype):
    shape, strides, size = COMPLEX_LAYOUTS[name]
    B, n, D = shape
    length = 4
    rng = np.random.default_rng(1)
    data = (rng.standard_normal(size) + 1j * rng.standard_normal(size)).astype(dtype)
    # infinite parts must stay infinite (a complex product with ones makes them NaN)
    x3 = _strided(data, shape, strides)
    first = np.unravel_index(0, shape)
    data[sum(i * s for i, s in zip(first, strides, strict=True))] = complex(np.inf, 1.0)
    p = problem(dtype=dtype, shape=shape, strides=strides, length=length)
    assert cublas.BACKEND.unsupported(p) is None
    real = cublas.real_view(p)
    assert real.dtype == real.out_dtype == {"complex64": "float32", "complex128": "float64"}[dtype]
    assert real.features == 2 * D
    calls = cublas.plan_calls(p)
    assert not isinstance(calls, str), calls
    m = n // length
    got = _run_calls(calls, data.view(data.real.dtype).astype(np.float64), B * m * 2 * D).view(np.complex128)
    expected = x3.reshape(B, m, length, D).astype(np.complex128)
    expected = expected.real.sum(axis=2) + 1j * expected.imag.sum(axis=2)
    got = got.reshape(B, m, D)
    assert np.isinf(got[0, 0, 0].real) and got[0, 0, 0].imag == expected[0, 0, 0].imag
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_cublas_refuses_complex_with_strided_features():
    p = problem(dtype="complex64", shape=(1, 32, 4), strides=(0, 1, 40))  # features down the columns
    reason = cublas.BACKEND.unsupported(p)
    assert reason is not None and "contiguous features" in reason and "backend='cub'" in reason
    assert cublas.plan_calls(p) == reason


def test_cublas_real_view_leaves_real_problems_alone():
    p = problem(shape=(1, 32, 4))
    assert cublas.real_view(p) is p


def test_cublas_plan_chunks_past_int32_segments():
    m = 5 * (1 << 30)  # 5 * 2**30 segments of one element: three calls
    p = problem(shape=(1, m, 1), strides=(m, 1, 1), length=1, segments=m)
    calls = cublas.plan_calls(p, use_gemv=True)
    assert [(c.x_offset, c.out_offset, c.cols) for c in calls] == [
        (0, 0, INT32_MAX),
        (INT32_MAX, INT32_MAX, INT32_MAX),
        (2 * INT32_MAX, 2 * INT32_MAX, m - 2 * INT32_MAX),
    ]


def test_cublas_plan_uses_gemv_only_for_same_dtype_problems():
    assert cublas.plan_calls(problem(dtype="float32"), use_gemv=True)[0].kind == "gemv"
    assert cublas.plan_calls(problem(dtype="float16"), use_gemv=True)[0].kind == "gemm"
    assert cublas.plan_calls(problem(dtype="float32"), use_gemv=False)[0].kind == "gemm"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(shape=(1, 64, 1), strides=(128, 2, 1)), "segments are strided"),
        (dict(shape=(1, 64, 1), strides=(64, -1, 1)), "non-negative strides"),
        (dict(shape=(1, 32, 4), strides=(0, 8, 2)), "neither the features"),
        (dict(shape=(1, 32, 4), strides=(0, 3, 1)), "neither the features"),  # overlapping rows
        (dict(length=None, offsets_dtype="int64"), "variable lengths"),
    ],
)
def test_cublas_plan_refuses_layouts_it_cannot_describe(kwargs, match):
    reason = cublas.plan_calls(problem(**kwargs))
    assert isinstance(reason, str) and match in reason
    assert "backend=" in reason  # every refusal names who serves it instead


def test_cublas_plan_refuses_too_many_calls():
    # 300 batches with gaps and 300 segments each, with features: one call per batch or segment
    p = problem(shape=(300, 600, 2), strides=(2000, 2, 1), length=2)
    reason = cublas.plan_calls(p)
    assert isinstance(reason, str) and "cuBLAS calls" in reason


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(device=None, kind="numpy"), "on the host"),
        (dict(reduction="max"), "not linear"),
        (dict(reduction="min"), "not linear"),
        (dict(length=None, offsets_dtype="int32"), "no segmented GEMV for variable lengths"),
        (dict(dtype="int32"), "no integer GEMV"),
        (dict(dtype="bool"), "no integer GEMV"),
        (dict(dtype="float32", acc="float64", out="float64"), "in no single call"),
    ],
)
def test_cublas_refusal_reasons(kwargs, match):
    reason = cublas.BACKEND.unsupported(problem(**kwargs))
    assert reason is not None and match in reason


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(dtype="float32"),
        dict(dtype="float64", reduction="mean"),
        dict(dtype="complex64"),
        dict(dtype="complex128", reduction="mean"),
        dict(dtype="float16"),
        dict(dtype="bfloat16", kind="torch"),
        dict(dtype="float16", out="float32"),
        dict(shape=(1, 32, 4), strides=(128, 4, 1)),
    ],
)
def test_cublas_serves(kwargs):
    assert cublas.BACKEND.unsupported(problem(**kwargs)) is None


# --- CUB: paths and refusals -----------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, path",
    [
        (dict(), "cupy-cub"),  # float32 sum, L = 8
        (dict(length=4096, shape=(1, 8192, 1)), "cccl"),
        (dict(dtype="int32"), "cccl"),  # int32 -> int64 accumulation: CuPy's CUB cannot widen
        (dict(dtype="float16"), "cccl"),
        (dict(reduction="mean"), "cccl"),
        (dict(reduction="max", dtype="float16"), "cupy-cub"),
        (dict(reduction="max", dtype="bool"), "cccl"),
        (dict(reduction="max", dtype="bfloat16", kind="torch"), "cccl"),
        (dict(length=None, offsets_dtype="int64"), "cccl"),
        (dict(shape=(3, 64, 1), strides=(100, 1, 1)), "cccl"),  # batches with gaps
        (dict(shape=(1, 64, 4)), "cupy-reduce"),
        (dict(shape=(1, 64, 1), strides=(128, 2, 1)), "cupy-reduce"),
        (dict(shape=(1, 64, 4), reduction="max", dtype="bfloat16", kind="torch"), "strided-kernel"),
        (dict(shape=(1, 64, 4), length=None, offsets_dtype="int32"), "strided-kernel"),
        (dict(shape=(1, 64, 1), strides=(128, 2, 1), length=None, offsets_dtype="int32"), "strided-kernel"),
    ],
)
def test_cub_path_choice(kwargs, path):
    p = problem(**kwargs)
    assert cub.choose_path(p) == path
    assert cub.path_unsupported(p, path) is None


def test_cub_leaves_cupy_cub_for_long_segments_and_int32_overflow():
    assert cub.choose_path(problem(length=cub.CUPY_CUB_MAX_LENGTH, shape=(1, 4 * cub.CUPY_CUB_MAX_LENGTH, 1))) == (
        "cupy-cub"
    )
    long = 2 * cub.CUPY_CUB_MAX_LENGTH
    assert cub.choose_path(problem(length=long, shape=(1, 4 * long, 1))) == "cccl"
    n = 1 << 31  # CuPy's CUB wrappers count elements in int
    assert not cub.cupy_cub_eligible(problem(length=8, shape=(1, n, 1), strides=(n, 1, 1)))


@pytest.fixture
def restore_options():
    """Put back every backend's options after the test (they are changed through ``configure``)."""
    saved = {name: configure(name) for name in BACKENDS}
    yield
    for name, options in saved.items():
        configure(name, **{f.name: getattr(options, f.name) for f in dataclasses.fields(options)})


def test_cub_force_path(restore_options):
    configure("cub", path="strided-kernel")
    p = problem()
    assert cub.choose_path(p) == "cupy-cub"  # the rule itself
    assert cub.BACKEND.path(p) == "strided-kernel"  # what a plan made now takes
    assert cub.BACKEND.unsupported(p) is None
    configure("cub", path="cupy-cub")
    reason = cub.BACKEND.unsupported(problem(length=None, offsets_dtype="int64"))
    assert reason is not None and "CuPy's CUB" in reason
    configure("cub", path=None)
    assert cub.BACKEND.path(p) == "cupy-cub"


@pytest.mark.parametrize(
    "name, changes, error",
    [
        ("cub", {"path": "bogus"}, ValueError),
        ("cub", {"force": "cccl"}, TypeError),  # not a field
        ("cublas", {"gemv": 1}, ValueError),
        ("nvmath", {"batch_strategy": "parallel"}, ValueError),
        ("nvrtc", {"threads": 100}, ValueError),  # not a multiple of 32
        ("nvrtc", {"unroll": 6}, ValueError),  # not a power of two
        ("nvrtc", {"tile": 1000}, ValueError),  # not a multiple of threads
        ("nvrtc", {"max_rows": 0}, ValueError),
        ("nvrtc", {"min_blocks": True}, ValueError),
    ],
)
def test_configure_validates(restore_options, name, changes, error):
    before = configure(name)
    generation = options_generation()
    with pytest.raises(error):
        configure(name, **changes)
    assert configure(name) is before and options_generation() == generation  # nothing changed


def test_configure_round_trips(restore_options):
    """configure replaces a backend's options (a new frozen instance, a new generation) and
    takes them back; every backend module imports without a GPU library, so this runs anywhere."""
    for name, field, value in (
        ("cub", "path", "strided-kernel"),
        ("cublas", "gemv", False),
        ("nvmath", "batch_strategy", "loop"),
        ("nvrtc", "tile", 2048),
    ):
        old = configure(name)
        generation = options_generation()
        new = configure(name, **{field: value})
        assert getattr(new, field) == value and get_backend(name).options is new
        assert type(new) is type(old) and options_generation() > generation
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(new, field, getattr(old, field))
        assert configure(name, **{field: getattr(old, field)}) == old
    assert configure("numpy") == Options()


def test_cub_refusal_reasons():
    reason = cub.BACKEND.unsupported(problem(device=None, kind="numpy"))
    assert reason is not None and "on the host" in reason


@pytest.mark.parametrize(
    "kwargs, path",
    [
        (dict(dtype="complex64"), "cupy-reduce"),
        (dict(dtype="complex64", acc="complex128", out="complex128"), "cupy-reduce"),
        (dict(dtype="complex128", reduction="mean", shape=(2, 64, 3)), "cupy-reduce"),
        (dict(dtype="float32", acc="complex64", out="complex64"), "cupy-reduce"),  # not cuda.compute
        (dict(dtype="complex64", length=None, offsets_dtype="int64"), "strided-kernel"),
        (
            dict(dtype="complex64", acc="complex128", out="complex128", length=None, offsets_dtype="int32"),
            "strided-kernel",
        ),
        (dict(dtype="bfloat16", kind="torch", acc="complex64", out="complex64"), "strided-kernel"),
    ],
)
def test_cub_serves_complex_sums(kwargs, path):
    p = problem(**kwargs)
    assert cub.BACKEND.unsupported(p) is None
    assert cub.choose_path(p) == path
    assert cub.path_unsupported(p, path) is None
    assert cub.path_unsupported(p, "cccl") is not None
    assert cub.path_unsupported(p, "cupy-cub") is not None


@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("dtype", ["bool", "int8", "int32", "uint64", "float16", "float32", "float64"])
@pytest.mark.parametrize("length", [8, None])
@pytest.mark.parametrize("shape", [(1, 64, 1), (2, 64, 3)])
def test_cub_serves_every_real_dtype(reduction, dtype, length, shape):
    if reduction == "mean" and dtype == "bool":
        pytest.skip("mean of bool is a float64 mean of ints, covered by int8")
    p = problem(reduction, dtype, shape=shape, length=length, offsets_dtype="int64")
    assert cub.BACKEND.unsupported(p) is None
    assert cub.choose_path(p) in cub.PATHS


def test_cub_operator_sources():
    """Every operator the cub backend names is one of operators.cuh, compiled alone (its define)."""
    import re

    from linred.backends.cub import operators
    from linred.kernels.compiler import header, source

    text = header("operators.cuh")
    defined = re.findall(r'^extern "C" __device__ void (\w+)\(', text, re.M)
    defined += re.findall(r"^LINRED_NAN_MAX_MIN\((\w+),", text, re.M)
    assert sorted(defined) == sorted(operators.OPERATORS)
    for name in operators.OPERATORS:
        program = source(operators.op_source(name))
        assert f"#define LINRED_OP_{name}\n" in program and f"#ifdef LINRED_OP_{name}\n" in program
        assert not re.search(r"^#include", program, re.M)
    assert "linred_bf16_round" in source(operators.op_source("linred_scale_f32_to_bf16"))
    with pytest.raises(KeyError):
        operators.op_source("linred_cvt_int32_int64")
    # NaN-propagating max/min keep x when x is NaN and take y when y is NaN
    assert "(x != x || x CMP y) ? x : y" in text
    assert "LINRED_NAN_MAX_MIN(linred_max_f32, float, >)" in text
    assert "LINRED_NAN_MAX_MIN(linred_min_f64, double, <)" in text


def test_cub_batch_state_layout():
    from linred.backends.cub.operators import batch_state

    state = np.frombuffer(batch_state(7, 5, 100, 1), dtype=np.int64)
    assert state.tolist() == [7, 5, 100, 1]


def _batched_bound(k: int, a: int, count: int, batch_stride: int, shift: int, offsets=None) -> int:
    """The arithmetic of ``linred_batched_fixed`` / ``linred_batched_offsets*``, in Python."""
    b = k // count
    i = k - b * count + shift
    return b * batch_stride + (offsets[i] if offsets is not None else i * a)


@pytest.mark.parametrize("B, m, L, stride", [(1, 5, 3, 15), (3, 4, 2, 8), (3, 4, 2, 11), (2, 1, 7, 9)])
def test_cub_batched_bounds_match_segments(B, m, L, stride):
    for k in range(B * m):
        b, i = divmod(k, m)
        assert _batched_bound(k, L, m, stride, 0) == b * stride + i * L
        assert _batched_bound(k, L, m, stride, 1) == b * stride + (i + 1) * L
    offsets = [0, 0, 3, 3, 4][: m + 1] if m == 4 else list(range(0, (m + 1) * L, L))
    for k in range(B * m):
        b, i = divmod(k, m)
        assert _batched_bound(k, 0, m, stride, 0, offsets) == b * stride + offsets[i]
        assert _batched_bound(k, 0, m, stride, 1, offsets) == b * stride + offsets[i + 1]


# --- strided-kernel source generation ----------------------------------------------------


@pytest.mark.parametrize(
    "value, ctype, expected",
    [
        (float("-inf"), "float", "(-LINRED_INF_F)"),
        (float("inf"), "double", "LINRED_INF_D"),
        (-(1 << 63), "long long", "(-9223372036854775807LL - 1)"),
        ((1 << 64) - 1, "unsigned long long", "((unsigned long long)18446744073709551615ULL)"),
        (-128, "signed char", "((signed char)-128LL)"),
        (False, "bool", "false"),
    ],
)
def test_kernel_literals(value, ctype, expected):
    assert gpu_helpers()._literal(value, ctype) == expected


@pytest.mark.parametrize(
    "args, empty",
    [
        # an empty segment's max/min is the identity of the result dtype, not the input's
        (("min", "int8", "int8", "int64"), "out = (Y)(((long long)9223372036854775807LL));"),
        (("max", "int32", "int32", "float64"), "out = (Y)((-LINRED_INF_D));"),
        (("max", "int32", "int32", "bfloat16"), "out = linred_bf16_bits((float)((-LINRED_INF_F)));"),
        (("min", "bool", "bool", "int64"), "out = (Y)(((long long)9223372036854775807LL));"),
        (("max", "float16", "float16", "float16"), "out = (Y)((float)((-LINRED_INF_F)));"),
    ],
)
def test_strided_kernel_empty_max_min_is_the_result_identity(args, empty):
    body = gpu_helpers().strided_kernel_body(*args)
    assert f"else {{ {empty} }}" in body


def test_strided_kernel_complex_sums_add_parts():
    gpu = gpu_helpers()
    body = gpu.strided_kernel_body("mean", "complex64", "complex64", "complex64")
    # complex / real divides each part (no complex division by a complex length); float32 parts
    # are added in double (a thread adds its segment sequentially)
    assert "acc / (double)(stop - start)" in body and "(complex<double>)(LINRED_NAN_D)" in body
    body = gpu.strided_kernel_body("sum", "complex64", "complex128", "complex128")
    assert "complex<double> acc = (complex<double>)0;" in body and "(complex<double>)x[p]" in body
    body = gpu.strided_kernel_body("sum", "float16", "complex64", "complex64")
    assert "(complex<double>)((double)(float)x[p])" in body


@pytest.mark.parametrize(
    "value, bits",
    [
        (float("inf"), 0x7F80),
        (float("-inf"), 0xFF80),
        (float("nan"), 0x7FC0),
        (1.0, 0x3F80),
        (0.0, 0),
        (1.00390625, 0x3F80),  # halfway: to even
    ],
)
def test_bf16_bits(value, bits):
    got = gpu_helpers().bf16_bits(value)
    assert -(1 << 15) <= got < (1 << 15)
    assert got & 0xFFFF == bits


# --- spans and streams ---------------------------------------------------------------------


def test_span_view_of_a_strided_tensor():
    torch = pytest.importorskip("torch")
    base = torch.arange(60.0)
    t = base.as_strided((2, 3, 4), (30, 8, 2), 1)
    span, first = device_helpers().span_view(t, tuple(t.shape), t.stride())
    assert first == 0
    assert span.shape[0] == 30 * 1 + 8 * 2 + 2 * 3 + 1
    for idx in np.ndindex(2, 3, 4):
        offset = sum(i * s for i, s in zip(idx, t.stride(), strict=True))
        assert span[first + offset] == t[idx]


class _Protocol:
    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


class _TorchLike:
    """Looks like a torch.cuda.Stream: ``cuda_stream`` and a ``device`` with type and index."""

    class _Device:
        type = "cuda"

        def __init__(self, index: int) -> None:
            self.index = index

    def __init__(self, handle: int, device: int) -> None:
        self.cuda_stream = handle
        self.device = self._Device(device)


def test_stream_handles():
    assert stream_handle(0) == 0
    assert stream_handle(12345) == 12345
    assert stream_handle(_Protocol(77)) == 77
    assert stream_handle(_TorchLike(99, 0), device=0) == 99
    with pytest.raises(ValueError, match="stream is on CUDA device 1 but the data is on CUDA device 0"):
        stream_handle(_TorchLike(99, 1), device=0)
    with pytest.raises(ValueError, match="non-negative"):
        stream_handle(-1)
    with pytest.raises(TypeError, match="stream must be"):
        stream_handle(True)
    with pytest.raises(TypeError, match="stream must be"):
        stream_handle("default")


def test_importing_the_backends_imports_no_cuda_library():
    """The registry imports a backend's package to ask it what it serves: that must not import
    an array or CUDA library (those come with its executor modules, when a plan is made)."""
    import subprocess
    import sys

    packages = ", ".join(f"linred.backends.{name}" for name in BACKENDS)
    code = (
        f"import sys; import {packages}; "
        "print(sorted(m for m in ('torch', 'cupy', 'cuda.compute', 'cuda.core', 'nvmath') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_backend_imports_another():
    """A backend's modules import the shared layers (base, _device, linred.kernels, linred.arrays)
    and their own package, never another backend."""
    import ast
    from pathlib import Path

    root = Path(cub.__file__).parents[1]  # linred/backends
    for name in BACKENDS:
        files = sorted((root / name).glob("*.py")) if (root / name).is_dir() else [root / f"{name}.py"]
        assert files, name
        for path in files:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                else:
                    continue
                for module in modules:
                    parts = module.split(".")
                    if parts[:2] == ["linred", "backends"] and len(parts) > 2:
                        assert parts[2] in (name, "base", "_device"), f"{path.name} of {name} imports {module}"


def test_problem_helper_is_consistent():
    p = problem(shape=(2, 64, 3), length=8)
    assert p.out_shape == (2, 8, 3)
    assert math.prod(p.in_shape) == 2 * 64 * 3


# --- nvrtc: which problems its kernels take, and the C++ they are built from ---


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dtype": "complex64"}, "real and integer data"),
        ({"kind": "numpy", "device": None}, "runs on CUDA devices"),
    ],
)
def test_nvrtc_refusal_reasons(kwargs, match):
    from linred.backends.nvrtc import BACKEND

    assert re.search(match, BACKEND.unsupported(problem(**kwargs)))


@pytest.mark.parametrize(
    "strides",
    [
        (8192, 1, 1024),  # the transpose of (8, 1024) rows: each feature column contiguous
        (32768, 16, 2),  # every other column of (1024, 16) rows
    ],
)
@pytest.mark.parametrize("length", [8, 64, 3, None])
def test_nvrtc_serves_feature_columns_that_are_not_contiguous(strides, length):
    """tile_reduce takes them, each column a row of its own, whatever the length: a column
    of unit stride must not take the one-column kernels' routes (fixed lengths on flat data)."""
    from linred.backends.nvrtc import BACKEND, DEFAULT_OPTIONS, route

    kwargs = {"offsets_dtype": "int64"} if length is None else {"segments": 1023 // length}
    p = problem(shape=(1, 1024, 8), strides=strides, length=length, **kwargs)
    assert BACKEND.unsupported(p) is None
    assert route(p, DEFAULT_OPTIONS) == "tile"
    contiguous = problem(shape=(1, 1024, 8), length=length, **kwargs)
    assert route(contiguous, DEFAULT_OPTIONS) == "features"


def test_nvrtc_serves_feature_columns_too_short_for_its_tiles_after_the_others():
    """Columns shorter than a quarter of a tile (the transpose of wide rows in short segments):
    nvrtc serves them, but ``auto`` tries the backends that read strided features first (each
    column would take a block of its own) and comes back to nvrtc where none of them serves the
    call; a named backend serves what it can."""
    from linred.backends import select
    from linred.backends.nvrtc import BACKEND, COLUMN_MIN_TILE_SHARE, DEFAULT_OPTIONS

    n = DEFAULT_OPTIONS.tile // COLUMN_MIN_TILE_SHARE
    long = problem(shape=(1, n, 64), strides=(n * 64, 1, n), length=8)
    assert BACKEND.unsupported(long) is None and BACKEND.slower(long) is None
    short = problem(shape=(1, n - 8, 64), strides=(n * 64, 1, n), length=8)
    assert BACKEND.unsupported(short) is None
    why = BACKEND.slower(short)
    assert re.search(r"columns of 1016 elements \(fewer than 1024\) leave its tiles nearly empty", why)
    assert BACKEND.slower(problem(shape=(1, n - 8, 64), length=8)) is None  # contiguous rows

    class Fake:
        def __init__(self, name, refuses=False, slow=False):
            self.name, self.refuses, self.slow = name, refuses, slow
            self.reductions, self.reads_pointers = ("sum",), True

        def unsupported(self, problem):
            return "refused" if self.refuses else None

        def slower(self, problem):
            return "slow" if self.slow else None

    def chosen(fakes):
        table = {f.name: f for f in fakes}
        with (
            mock.patch.object(select, "preference", lambda p: tuple(table)),
            mock.patch.object(select, "unavailable", lambda name: None),
            mock.patch.object(select, "get_backend", table.__getitem__),
        ):
            return select.select(short, "auto").name

    assert chosen([Fake("a", slow=True), Fake("b")]) == "b"  # a faster one serves it
    assert chosen([Fake("a", slow=True), Fake("b", refuses=True), Fake("c", slow=True)]) == "a"  # none faster
    assert chosen([Fake("a", refuses=True), Fake("b", slow=True)]) == "b"
    with pytest.raises(BackendError, match="a: refused; b: refused"):
        chosen([Fake("a", refuses=True), Fake("b", refuses=True)])


@pytest.mark.parametrize("shape", [(1, 64, 8), (3, 64, 16)])
@pytest.mark.parametrize("length", [8, None])
def test_nvrtc_serves_contiguous_feature_columns(shape, length):
    from linred.backends.nvrtc import BACKEND

    kwargs = {"offsets_dtype": "int64"} if length is None else {}
    assert BACKEND.unsupported(problem(shape=shape, length=length, **kwargs)) is None


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("length", [8, None])
def test_nvrtc_features_wrapper(width, length):
    """The feature kernel's C++ wrapper names the types, the operation, the width, the rows a
    thread loads at once (fewer for narrow rows) and the offsets."""
    from linred.backends.nvrtc.kernels import features_wrapper, index_ctype

    kwargs = {"offsets_dtype": "int32"} if length is None else {}
    p = problem("mean", "float16", shape=(1, 64, 8), length=length, **kwargs)  # 16-byte rows: narrow
    src = features_wrapper(p, index_ctype(p), DEFAULT_OPTIONS, width)
    assert src.startswith('#include "features.cuh"\n')
    unroll = DEFAULT_OPTIONS.feature_narrow_unroll
    assert f"LINRED_FEATURES(half_t, float, half_t, OpSum, true, 256, {width}, {unroll}, " in src
    wide = problem("mean", "float16", shape=(1, 64, 40), length=length, **kwargs)  # 80-byte rows
    src = features_wrapper(wide, index_ctype(wide), DEFAULT_OPTIONS, width)
    assert f"LINRED_FEATURES(half_t, float, half_t, OpSum, true, 256, {width}, {DEFAULT_OPTIONS.unroll}, " in src
    offsets = "int, ArrayOffsets<int>{offsets})" if length is None else "long long, FixedOffsets{L})"
    assert src.endswith(offsets + "\n")


def test_nvrtc_refuses_bfloat16_before_sm80(monkeypatch):
    from linred.backends import nvrtc

    monkeypatch.setattr(nvrtc, "_compute_capability", lambda device: (7, 5))
    assert "compute capability 8.0" in nvrtc.BACKEND.unsupported(problem(dtype="bfloat16"))
    assert nvrtc.BACKEND.unsupported(problem(dtype="float16")) is None
    monkeypatch.setattr(nvrtc, "_compute_capability", lambda device: (9, 0))
    assert nvrtc.BACKEND.unsupported(problem(dtype="bfloat16")) is None


@pytest.mark.parametrize(
    "dtype, reduction, vecload, expected",
    [
        # float32 sums: 4096 + 4096/16*4 padded floats, then 4096 int16 segment indices
        ("float32", "sum", True, (4096 + 1024) * 4 + 4096 * 2),
        ("float32", "sum", False, (4096 + 1024) * 4),
        ("float16", "max", True, (4096 + 1024) * 4 + 4096 * 2),
        # 8-byte accumulators have no branch-free mode: the staged tile only
        ("float64", "sum", True, (4096 + 512) * 8),
        ("int8", "sum", True, (4096 + 512) * 8),
    ],
)
def test_nvrtc_tile_shared_memory(dtype, reduction, vecload, expected):
    """The dynamic shared memory the tile kernel is launched with (TileShared in tile.cuh)."""
    from linred.backends.nvrtc.kernels import tile_shared_bytes

    p = problem(reduction, dtype, shape=(1, 1 << 16, 1), length=None, offsets_dtype="int64", segments=100)
    assert (DEFAULT_OPTIONS.tile, DEFAULT_OPTIONS.threads) == (4096, 256)
    assert tile_shared_bytes(p, vecload, DEFAULT_OPTIONS) == expected


# --- nvrtc: which kernel a fixed length gets ---


@pytest.mark.parametrize(
    "dtype, length, shape, strides, expected",
    [
        ("float32", 128, (1, 128 * 64, 1), None, "fixed"),  # fixed_small: 32 vectors
        ("float32", 256, (1, 256 * 64, 1), None, "fixed"),  # fixed_rows: 2 rows
        ("float32", 2048, (1, 2048 * 8, 1), None, "fixed"),  # fixed_rows: 16 rows
        ("float32", 4096, (1, 4096 * 8, 1), None, "long"),
        ("float32", 3000, (1, 3000 * 8, 1), None, "long"),  # 750 whole vectors
        ("float32", 1020, (1, 1020 * 8, 1), None, "long"),  # 255 vectors: 64 threads
        ("float32", 500, (1, 500 * 8, 1), None, "long"),  # 2000 bytes: 64 threads
        ("float32", 492, (1, 492 * 8, 1), None, "warp"),  # 1968 bytes: too short for a block each
        ("float16", 1000, (1, 1000 * 8, 1), None, "long"),
        ("float32", 3001, (1, 3001 * 8, 1), None, "warp"),  # not whole vectors
        ("float16", 4096, (1, 4096 * 8, 1), None, "fixed"),  # 16 rows of 8 halves
        ("float16", 8192, (1, 8192 * 8, 1), None, "long"),
        ("float64", 1024, (1, 1024 * 8, 1), None, "fixed"),
        ("float64", 2048, (1, 2048 * 8, 1), None, "long"),
        ("int8", 512, (1, 512 * 8, 1), None, "fixed"),  # fixed_small: 32 vectors of 16
        ("int8", 1024, (1, 1024 * 8, 1), None, "warp"),  # no rows or long kernel for 1 byte
        ("float32", 4096, (2, 4096 * 8, 1), None, "long"),  # a contiguous batch
        ("float32", 4096, (2, 4096 * 8, 1), (4096 * 9, 1, 1), "warp"),  # rows apart
        ("float32", 4096, (1, 4096 * 8, 1), (4096 * 8 * 2, 2, 1), "warp"),  # strided elements
        ("float32", 256, (1, 256 * 8, 4), None, "features"),
        ("float32", 3, (1, 3 * 8, 1), None, "staged"),  # short, not a power of two
        ("float32", 63, (1, 63 * 8, 1), None, "staged"),  # 252 bytes
        ("float32", 65, (1, 65 * 8, 1), None, "warp"),  # 260 bytes: past fixed_staged
        ("float16", 127, (1, 127 * 8, 1), None, "staged"),
        ("int8", 255, (1, 255 * 8, 1), None, "staged"),
        ("float64", 33, (1, 33 * 8, 1), None, "warp"),  # 264 bytes
        ("float32", 7, (2, 7 * 8, 1), None, "staged"),  # a contiguous batch
        ("float32", 7, (2, 7 * 8, 1), (7 * 9, 1, 1), "warp"),  # rows apart
        ("float32", 7, (1, 7 * 8, 4), None, "features"),
    ],
)
# "warp": everything else with one feature column; it runs warp_reduce on aligned,
# contiguous rows and tile_reduce on the rest (chosen per call, by the data's alignment).
def test_nvrtc_fixed_kernel_choice(dtype, length, shape, strides, expected):
    from linred.backends import nvrtc

    assert nvrtc.route(problem(dtype=dtype, shape=shape, strides=strides, length=length), nvrtc.DEFAULT_OPTIONS) == (
        expected
    )


@pytest.mark.parametrize(
    "dtype, length, kernel, unroll",
    [
        ("float32", 8, "fixed_small", 8),
        ("float32", 128, "fixed_small", 8),
        ("float32", 256, "fixed_rows", 8),
        ("float32", 1024, "fixed_rows", 8),
        ("float32", 2048, "fixed_rows", 16),  # a vector of each of 16 rows in flight
        ("float16", 4096, "fixed_rows", 16),
        ("float16", 128, "fixed_small", 4),  # 2-byte data: fewer vectors per thread
        ("bfloat16", 8, "fixed_small", 4),
        ("bfloat16", 512, "fixed_rows", 8),
        ("float64", 128, "fixed_rows", 8),
    ],
)
def test_nvrtc_fixed_layout(dtype, length, kernel, unroll):
    from linred.backends import nvrtc
    from linred.backends.nvrtc import kernels

    p = problem(dtype=dtype, shape=(1, length * 4, 1), length=length)
    assert kernels.fixed_layout(p, nvrtc.DEFAULT_OPTIONS) == (kernel, unroll)
    src = kernels.fixed_wrapper(p, nvrtc.DEFAULT_OPTIONS)
    assert f"LINRED_FIXED({kernel}, " in src and src.endswith(f", {length}, false, 256, {unroll})\n")


@pytest.mark.parametrize(
    "dtype, length, threads, unroll",
    [
        ("float32", 500, 64, 2),  # 125 vectors: at least 2 per thread, one block per segment
        ("float16", 1000, 64, 2),
        ("float64", 300, 64, 4),  # 150 vectors
        ("float32", 1000, 64, 4),  # 250 vectors: 4 for each of 64
        ("float32", 1024, 128, 2),  # 256 vectors: 2 for each of 128
        ("float32", 1028, 128, 4),  # 257
        ("float32", 2048, 256, 2),  # 512 vectors: 2 for each of 256
        ("float32", 4096, 256, 4),
        ("float32", 16384, 256, 16),  # 4096 vectors: still one chunk per segment
        ("float32", 2**20, 256, 16),  # then chunks of 4096 vectors
        ("float64", 2048, 256, 4),
    ],
)
def test_nvrtc_long_shape(dtype, length, threads, unroll):
    from linred.backends import nvrtc
    from linred.backends.nvrtc import kernels

    p = problem(dtype=dtype, shape=(1, length * 2, 1), length=length)
    assert kernels.long_threads(p, nvrtc.DEFAULT_OPTIONS) == threads
    assert kernels.long_unroll(p, nvrtc.DEFAULT_OPTIONS) == unroll
    src = kernels.long_wrapper(p, nvrtc.DEFAULT_OPTIONS)
    assert "LINRED_LONG(" in src and src.endswith(f", OpSum, false, {threads}, {unroll})\n")


class _FakePointer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class _FakeDeviceArray:
    """Stands for a CuPy array: only ``.data.ptr`` is read by the one-launch executors."""

    def __init__(self, ptr: int) -> None:
        self.data = _FakePointer(ptr)


@pytest.fixture
def fake_launches(monkeypatch):
    """The executors' driver launches (PackedLaunch) and kernel compiler replaced by recorders;
    returns the executors module (it imports cuda.core: skip without it)."""
    pytest.importorskip("cuda.core")
    from linred.backends.nvrtc import executors

    calls: dict[str, list] = {"launch": [], "fill": [], "kernels": []}

    class FakeLauncher:
        device = 0

        @staticmethod
        def ptr(a: _FakeDeviceArray) -> int:
            return a.data.ptr

        def __init__(self, problem: Problem) -> None:
            self._next = 1 << 20

        def stream(self, handle: int) -> str:
            return f"stream {handle}"

        def empty(self, count: int, dtype: str) -> _FakeDeviceArray:
            self._next += 1 << 16
            return _FakeDeviceArray(self._next)

        def fill(self, a: _FakeDeviceArray, value: int, stream: int) -> None:
            calls["fill"].append((a.data.ptr, value, stream))

        def stream_order(self) -> Any:
            class Order:
                def begin(self, stream: int) -> None:
                    calls["launch"].append(("begin", stream))

                def end(self, stream: int) -> None:
                    calls["launch"].append(("end", stream))

                def wait_idle(self) -> None:
                    calls["launch"].append(("wait_idle",))

            return Order()

    monkeypatch.setattr(executors, "_Launcher", FakeLauncher)
    monkeypatch.setattr(
        executors, "_TileExecutor", lambda problem, options: lambda *a: calls["launch"].append(("tiles", a[3]))
    )

    class FakePackedLaunch:
        """Records each launch as (stream, (grid, block), kernel, arguments): the slots as a launch
        finds them, bound once or written by the call (as PackedLaunch's)."""

        def __init__(self, kernel: str, count: int, name: str, device: int) -> None:
            assert kernel == name and device == 0
            self.kernel, self.count = kernel, count
            self.slots = [0] * count

        def bind(self, first: int, *values: int) -> None:
            assert first + len(values) <= self.count, (self.kernel, first, len(values), self.count)
            self.slots[first : first + len(values)] = values

        def __call__(self, stream: int, grid: int, block: int, shared: int, *args: int) -> None:
            assert len(args) <= self.count, (self.kernel, len(args), self.count)
            self.slots[: len(args)] = args
            self.launch(stream, grid, block, shared)

        def launch(self, stream: int, grid: int, block: int, shared: int) -> None:
            calls["launch"].append((f"stream {stream}", (grid, block), self.kernel, tuple(self.slots)))

    def get_kernels(device: int, wrapper: str, names: tuple[str, ...]) -> tuple[str, ...]:
        calls["kernels"].append(names)
        return names

    monkeypatch.setattr(executors, "PackedLaunch", FakePackedLaunch)
    monkeypatch.setattr(executors, "get_kernels", get_kernels)
    return executors, calls


def test_fixed_executor_launch_arguments(fake_launches):
    executors, calls = fake_launches
    p = problem(dtype="float32", shape=(2, 256 * 64, 1), length=256)  # fixed_rows, a contiguous batch
    ex = executors._FixedExecutor(p, DEFAULT_OPTIONS)
    x, out = _FakeDeviceArray(4096), _FakeDeviceArray(8192)
    ex(x, out, None, 7)
    ex(x, out, None, 9)
    nvec = 2 * 256 * 64 // 4
    grid = -(-nvec // (256 * 8))
    assert calls["kernels"] == [("linred_fixed",)]  # compiled once
    launched = ((grid, 256), "linred_fixed", (4096, 8192, nvec))
    assert calls["launch"] == [("stream 7", *launched), ("stream 9", *launched)]
    ex(_FakeDeviceArray(4100), out, None, 9)  # not 16-byte aligned: the tile kernel
    assert calls["launch"][-1] == ("tiles", 9)
    assert calls["fill"] == []


def test_long_executor_launch_arguments(fake_launches):
    executors, calls = fake_launches
    L, m = 2**16, 3
    p = problem(dtype="float32", shape=(1, L * m, 1), length=L)
    ex = executors._LongExecutor(p, DEFAULT_OPTIONS)
    lv, chunks = L // 4, L // 4 // (256 * 16)
    assert (ex._lv, ex._chunks, ex._m) == (lv, chunks, m) and chunks == 4
    x, out = _FakeDeviceArray(4096), _FakeDeviceArray(8192)
    for stream in (5, 6):
        ex(x, out, None, stream)
    partials, tickets = ex._partials.data.ptr, ex._tickets.data.ptr
    assert calls["fill"] == [(tickets, 0, 5)]  # the tickets are zeroed once, on the first call's stream
    args = (4096, 8192, partials, tickets, lv, chunks, m)
    launched = ((m * chunks, 256), "linred_long", args)
    # partials and tickets serve one stream at a time: each call is ordered after the previous one
    expected = [(stage, stream) for stream in (5, 6) for stage in ("begin", "launch", "end")]
    assert calls["launch"] == [
        (stage, stream) if stage != "launch" else (f"stream {stream}", *launched) for stage, stream in expected
    ]
    ex.free()
    assert calls["launch"][-1] == ("wait_idle",)  # the scratch goes back to the pool only when idle
    assert ex._partials is None and ex._tickets is None


def test_long_executor_without_partials(fake_launches):
    executors, calls = fake_launches
    p = problem(dtype="float64", shape=(1, 4096 * 5, 1), length=4096)  # 2048 vectors: one chunk each
    ex = executors._LongExecutor(p, DEFAULT_OPTIONS)
    ex(_FakeDeviceArray(4096), _FakeDeviceArray(8192), None, 3)
    assert ex._tickets is None and calls["fill"] == []
    assert calls["launch"] == [("stream 3", (5, 256), "linred_long", (4096, 8192, 0, 0, 2048, 1, 5))]


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"LINRED_CACHE_DIR": "/tmp/lr", "XDG_CACHE_HOME": "/tmp/xdg"}, "/tmp/lr/kernels"),
        ({"XDG_CACHE_HOME": "/tmp/xdg"}, "/tmp/xdg/linred/kernels"),
        ({"HOME": "/tmp/home"}, "/tmp/home/.cache/linred/kernels"),
    ],
)
def test_kernel_cache_dir(monkeypatch, env, expected):
    from linred.kernels.compiler import cache_dir

    for name in ("LINRED_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert str(cache_dir()) == expected


# --- linred/kernels: the headers, and the programs assembled from them ---


def _kernel_headers() -> dict[str, str]:
    from importlib import resources

    root = resources.files("linred.kernels")
    return {p.name: p.read_text() for p in root.iterdir() if p.name.endswith(".cuh")}


def test_every_header_opens_with_what_it_holds():
    """A header's opening comment names every function, operator and macro it defines."""
    headers = _kernel_headers()
    assert {"common.cuh", "fixed.cuh", "tile.cuh", "warp.cuh", "fixup.cuh", "features.cuh"} <= set(headers)
    for name, text in headers.items():
        head = text[: text.index("#pragma once")]
        assert head.startswith("//"), name
        defined = set(
            re.findall(r"^(?:template <[^\n]*>\s*\n?)?__device__ __forceinline__ [\w:<> ]+?\b(\w+)\(", text, re.M)
        )
        defined |= set(re.findall(r'^extern "C" __device__ void (\w+)\(', text, re.M))
        defined |= set(re.findall(r"^LINRED_NAN_MAX_MIN\((\w+),", text, re.M))
        defined |= set(re.findall(r"^#define (LINRED_\w+)", text, re.M))
        missing = sorted(d for d in defined if not re.search(rf"\b{d}\b", head))
        assert not missing, f"{name} does not list {missing} in its opening comment"


def test_source_expands_each_header_once():
    from linred.kernels.compiler import source

    program = source(
        '#include "tile.cuh"\n#include "fixup.cuh"\nLINRED_BOUNDS(256, 4096, int, ArrayOffsets<int>{offsets})\n'
    )
    assert not re.search(r"^#(include|pragma once)", program, re.M)
    assert program.count("typedef long long i64;") == 1  # common.cuh, included by offsets.cuh, once
    assert program.count("struct TileArgs {") == 1
    assert program.index("#define LINRED_BOUNDS(") < program.index("LINRED_BOUNDS(256,")


def _programs() -> list[tuple[str, str, tuple[str, ...]]]:
    """(what, wrapper, kernel names) for every kernel family, a few dtypes and layouts."""
    from linred.backends.nvrtc import kernels

    T = DEFAULT_OPTIONS
    out = []
    for dtype, reduction, out_dtype in (("float32", "sum", None), ("bfloat16", "mean", None), ("int8", "max", "int64")):
        kw = {"out": out_dtype} if out_dtype else {}
        if reduction == "max":
            kw["acc"] = dtype
        fixed = problem(reduction, dtype, shape=(1, 1024, 1), length=64, **kw)
        out.append((f"fixed {dtype}", kernels.fixed_wrapper(fixed, T), ("linred_fixed",)))
        staged = problem(reduction, dtype, shape=(1, 7 * 64, 1), length=7, **kw)
        out.append((f"staged {dtype}", kernels.staged_wrapper(staged), ("linred_staged",)))
        for L in (1, 2):  # shorter than a vector: several results per thread, stored together
            short = problem(reduction, dtype, shape=(1, 1024, 1), length=L, **kw)
            out.append((f"fixed {dtype} L={L}", kernels.fixed_wrapper(short, T), ("linred_fixed",)))
        if dtype != "int8":
            long = problem(reduction, dtype, shape=(1, 4096 * 4, 1), length=4096, **kw)
            out.append((f"long {dtype}", kernels.long_wrapper(long, T), ("linred_long",)))
        var = problem(reduction, dtype, shape=(2, 1000, 1), length=None, offsets_dtype="int32", segments=9, **kw)
        ic = kernels.index_ctype(var)
        out.append((f"tile {dtype}", kernels.tile_wrapper(var, dtype == "float32", ic, T, 4),
                    ("linred_tile", "linred_fixup", "linred_bounds")))  # fmt: skip
        out.append((f"warp {dtype}", kernels.warp_wrapper(var, ic, T, 2), ("linred_warp", "linred_fixup")))
        checked = kernels.warp_wrapper(var, ic, T, 2, checked=True)
        out.append((f"warp checked {dtype}", checked, ("linred_warp", "linred_fixup")))
        for shifted, what in ((var, "offsets"), (staged, "fixed")):  # rows past a 16-byte boundary
            wrapper = kernels.warp_wrapper(shifted, kernels.index_ctype(shifted), T, 2, what == "offsets",
                                           fused=what == "fixed", shift=3)  # fmt: skip
            out.append((f"warp shifted {what} {dtype}", wrapper, ("linred_warp", "linred_fixup")))
        for ch in (False, True):
            fused = kernels.warp_wrapper(var, ic, T, 2, checked=ch, fused=True)
            out.append((f"warp fused checked={ch} {dtype}", fused, ("linred_warp", "linred_fixup")))
        feat = problem(reduction, dtype, shape=(1, 64, 8), length=8, **kw)
        out.append((f"features {dtype}", kernels.features_wrapper(feat, "long long", T, 1), ("linred_features",)))
        rows = problem(reduction, dtype, shape=(2, 640, 8), length=None, offsets_dtype="int64", segments=5, **kw)
        long = kernels.features_wrapper(rows, "long long", T, 1, long=True)
        out.append((f"features long {dtype}", long, ("linred_features",)))
    from linred import _softmax_kernel

    for name in _softmax_kernel.MODES:  # (the softmax family: 16-bit data a row or two rows a load)
        for data, result, pairs, index in (
            ("float16", "float16", 2, "int64"),
            ("bfloat16", "float32", 2, None),
            ("float16", "float16", 1, "int32"),
            ("float32", "float32", 1, "int64"),
        ):
            source = _softmax_kernel.wrapper(name, data, "float32", result, 32, 1, pairs, index)
            out.append((f"softmax {name} {data} pairs={pairs}", source, ("linred_softmax",)))
    # (the programs every backend launches through the driver: the offsets check, the lengths scan)
    out.append(("offsets check", '#include "checks.cuh"\n', ("linred_check_offsets32", "linred_check_offsets64")))
    out.append(
        ("lengths scan", '#include "scan.cuh"\n', ("linred_lengths_to_offsets32", "linred_lengths_to_offsets64"))
    )
    out.append(("ids to offsets", '#include "ids.cuh"\n', ("linred_ids_to_offsets32", "linred_ids_to_offsets64")))
    out.append(("rows' gather", '#include "gather.cuh"\n', tuple(f"linred_gather_rows{w}" for w in (16, 8, 4, 2, 1))))
    return out


def test_nvrtc_programs_assemble():
    """Every wrapper is the #include of its family and one macro line per entry point, and assembles into
    one self-contained program that defines those macros and those entry points' kernels."""
    from linred.kernels.compiler import source

    for what, wrapper, names in _programs():
        lines = wrapper.splitlines()
        includes = [line for line in lines if line.startswith("#include")]
        macros = [line for line in lines if not line.startswith("#include")]
        assert includes and all(re.fullmatch(r'#include "\w+\.cuh"', line) for line in includes), what
        assert all(re.fullmatch(r"LINRED_[A-Z_]+\(.*\)", line) for line in macros), what
        program = source(wrapper)
        assert not re.search(r"^#include", program, re.M), what
        for line in macros:
            assert f"#define {line[: line.index('(')]}(" in program, (what, line)
        for name in names:
            assert f"{name}(" in program, (what, name)


def _nvrtc_or_skip():
    try:
        from cuda.bindings import nvrtc

        err, _, _ = nvrtc.nvrtcVersion()
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
        from cuda.core import Program, ProgramOptions
    except Exception as e:  # no cuda-bindings, or no libnvrtc: compiled on the GPU machines
        pytest.skip(f"NVRTC is not usable here ({type(e).__name__})")
    return Program, ProgramOptions


def test_nvrtc_programs_compile():
    """NVRTC (no GPU needed) compiles every family, whose entry points check the shared memory the
    backend computes against the C++ structs, and every cub operator to LTO-IR."""
    Program, ProgramOptions = _nvrtc_or_skip()
    from linred.backends.cub.operators import OPERATORS, op_source
    from linred.kernels.compiler import get_ltoir, source

    options = ProgramOptions(arch="sm_80", std="c++17", name="linred_segreduce")
    for what, wrapper, _ in _programs():
        assert Program(source(wrapper), "c++", options).compile("cubin").code, what
    for name in OPERATORS:
        assert get_ltoir(op_source(name), "sm_80"), name


def test_nvrtc_programs_check_their_shared_memory():
    """A wrapper launching with other shared memory than the C++ structs' does not compile."""
    Program, ProgramOptions = _nvrtc_or_skip()
    from linred.backends.nvrtc import kernels
    from linred.kernels.compiler import source

    p = problem("sum", "float32", shape=(1, 1000, 1), length=None, offsets_dtype="int64", segments=9)
    options = ProgramOptions(arch="sm_80", std="c++17")
    smem = kernels.tile_shared_bytes(p, True, DEFAULT_OPTIONS)
    wrong = kernels.tile_wrapper(p, True, "long long", DEFAULT_OPTIONS, 2).replace(f", {smem})", f", {smem + 16})")
    with pytest.raises(Exception, match="TileShared::BYTES"):
        Program(source(wrong), "c++", options).compile("cubin")
    smem = kernels.warp_shared_bytes(p, DEFAULT_OPTIONS)
    wrong = kernels.warp_wrapper(p, "long long", DEFAULT_OPTIONS, 2).replace(
        f", {smem}, false,", f", {smem - 16}, false,"
    )
    with pytest.raises(Exception, match="WarpShared"):
        Program(source(wrong), "c++", options).compile("cubin")


# --- the device context of driver calls, and the offsets check's fallback (no GPU needed) ---


class _FakeDriver:
    """The few driver calls of linred.arrays._context, recording what they are asked."""

    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_INVALID_CONTEXT = 201

    def __init__(self, current: int | None) -> None:
        self.current, self.calls = current, []

    def cuCtxGetDevice(self):
        if self.current is None:
            return self.CUresult.CUDA_ERROR_INVALID_CONTEXT, 0
        return self.CUresult.CUDA_SUCCESS, self.current

    def cuDevicePrimaryCtxRetain(self, device):
        self.calls.append(("retain", device))
        return self.CUresult.CUDA_SUCCESS, f"ctx{device}"

    def cuCtxPushCurrent(self, ctx):
        self.calls.append(("push", ctx))
        return (self.CUresult.CUDA_SUCCESS,)

    def cuCtxPopCurrent(self):
        self.calls.append(("pop",))
        return self.CUresult.CUDA_SUCCESS, None


@pytest.mark.parametrize("current", [0, 1, None], ids=["current", "another", "none"])
def test_on_device_pushes_the_primary_context_only_when_needed(monkeypatch, current):
    """Handle 0 means the current context's null stream: the data's device must be current."""
    import sys
    import types

    from linred.arrays import _context

    fake = _FakeDriver(current)
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = fake
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", fake)
    monkeypatch.setattr(_context, "_contexts", {})
    monkeypatch.setattr(_context, "_driver", None)  # (imported on the first use: the fake)
    with _context.on_device(0):
        with _context.on_device(0):  # nested for the same device: no query, no push
            pass
        assert _context._current.device == 0
    assert _context._current.device == -1
    if current == 0:
        assert fake.calls == []
    else:
        assert fake.calls == [("retain", 0), ("push", "ctx0"), ("pop",)]


@pytest.mark.parametrize("current", [0, 1, None], ids=["current", "another", "none"])
def test_is_current_asks_the_driver_outside_a_block(monkeypatch, current):
    """is_current (the test the hottest launches make before entering a block): true inside an
    on_device block for the device without asking, else what the driver says of the current
    context (false where none is current)."""
    from linred.arrays import _context

    fake = _FakeDriver(current)
    asked = []
    query = fake.cuCtxGetDevice
    fake.cuCtxGetDevice = lambda: asked.append(1) or query()
    monkeypatch.setattr(_context, "_contexts", {})
    monkeypatch.setattr(_context, "_driver", fake)
    assert _context.is_current(0) is (current == 0)
    assert _context.is_current(1) is (current == 1)
    assert len(asked) == 2
    with _context.on_device(1):
        asked.clear()
        assert _context.is_current(1) is True and asked == []  # (the block's device: no query)
    assert _context._current.device == -1


def test_offsets_check_falls_back_where_its_kernel_cannot_run(monkeypatch, caplog):
    """No NVRTC, driver or cuda.core: the adapters' array-library summary checks instead."""
    from linred.arrays import _device_checks
    from linred.kernels import compiler

    def broken(*args, **kwargs):
        raise RuntimeError("no NVRTC here")

    monkeypatch.setattr(compiler, "get_kernels", broken)
    monkeypatch.setattr(_device_checks._kernels, "_functions", {})
    with caplog.at_level("WARNING", logger="linred"):
        assert _device_checks.offsets_ok(0, True, 3, 12, 7, 0, lambda: (None, 0)) is None
        assert _device_checks.offsets_ok(0, True, 3, 12, 7, 0, lambda: (None, 0)) is None  # remembered
    assert sum("cannot run there" in r.getMessage() for r in caplog.records) == 1


def test_stream_order_records_its_event_only_outside_a_capture(monkeypatch):
    """(No GPU needed.) The capture query every executor with scratch makes per call, with a fake
    driver: a stream not capturing gets the event recorded; a capturing one, or the legacy stream
    while another captures in global mode (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), does not; any
    other error raises."""
    import enum

    from linred.backends import _device

    class CUresult(enum.IntEnum):
        CUDA_SUCCESS = 0
        CUDA_ERROR_INVALID_HANDLE = 400
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906

    class CUstreamCaptureStatus(enum.IntEnum):
        CU_STREAM_CAPTURE_STATUS_NONE = 0
        CU_STREAM_CAPTURE_STATUS_ACTIVE = 1

    answers = {
        1: (CUresult.CUDA_SUCCESS, CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE),
        2: (CUresult.CUDA_SUCCESS, CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE),
        0: (CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE),
        3: (CUresult.CUDA_ERROR_INVALID_HANDLE, CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE),
    }
    recorded = []

    class FakeDriver:
        pass

    FakeDriver.CUresult, FakeDriver.CUstreamCaptureStatus = CUresult, CUstreamCaptureStatus
    FakeDriver.cuStreamIsCapturing = staticmethod(lambda stream: answers[stream])
    FakeDriver.cuEventRecord = staticmethod(lambda event, stream: recorded.append((event, stream)) or (0,))
    monkeypatch.setattr(_device, "cuda_driver", lambda: FakeDriver)
    monkeypatch.setattr(_device, "_capture_names", None)
    assert [_device.capturing(s) for s in (1, 2, 0)] == [False, True, True]
    assert [_device._record_unless_capturing("event", s) for s in (1, 2, 0)] == [True, False, False]
    assert recorded == [("event", 1)]
    with pytest.raises(RuntimeError, match="cannot tell whether stream 0x3 is being captured"):
        _device.capturing(3)
    with pytest.raises(RuntimeError, match="cannot tell whether stream 0x3 is being captured"):
        _device._record_unless_capturing("event", 3)
    assert recorded == [("event", 1)]


class _OrderOps:
    """The operations StreamOrder calls, recorded; stream 9 is being captured."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def event(self):
        return "event"

    def record_unless_capturing(self, event, stream):
        self.calls.append(("asked", stream))
        return stream != 9

    def record(self, event, stream):
        self.calls.append(("recorded", stream))

    def wait(self, stream, event):
        self.calls.append(("waited", stream))

    def capturing(self, stream):
        return stream == 9

    def current_stream(self):
        return self.home

    home = 0


def test_stream_order_release_orders_the_home_stream_after_a_call_elsewhere():
    """(No GPU needed.) A dropped executor's buffers go back to the pool of the stream current
    when it was made (its home): that stream waits for the last call where it ran on another
    stream; not where it ran there, where the host waited for it (idle), before any call, or
    where the home stream is being captured."""
    from linred.backends._device import StreamOrder

    for home, calls_on, idle, waits in [
        (0, None, False, False),  # no call
        (0, 0, False, False),  # the last call on the home stream: the pool orders it already
        (0, 5, False, True),  # on another stream: the home stream waits for it
        (0, 5, True, False),  # the host waited for it since
        (9, 5, False, False),  # the home stream captures: it cannot wait on work outside
    ]:
        ops = _OrderOps()
        ops.home = home
        order = StreamOrder(ops)
        if calls_on is not None:
            order.begin(calls_on)
            order.end(calls_on)
            if idle:
                order.idle()
        ops.calls.clear()
        order.release()
        assert ops.calls == ([("waited", home)] if waits else []), (home, calls_on, idle)


def test_stream_order_release_after_free_names_no_stream():
    """(No GPU needed.) After free() (wait_idle: the host waited for the last call) a dropped
    executor's release makes no driver call: the stream of that call, which may be a stream the
    caller has destroyed since, is never named again."""
    from linred.backends._device import StreamOrder

    class Event:
        def synchronize(self):
            ops.calls.append(("synchronized",))

    ops = _OrderOps()
    ops.event = Event
    order = StreamOrder(ops)
    order.begin(5)
    order.end(5)
    order.wait_idle()
    assert order.home == 0
    order.release()
    assert ops.calls == [("asked", 5), ("synchronized",)]


def test_stream_order_waits_on_the_host_for_a_home_stream_it_cannot_keep():
    """(No GPU needed.) Where the stream current when an executor was made is a wrapper of a raw
    handle (a stream the caller named, which it may destroy), a dropped executor's release waits
    for the last call on the host and names no stream; the default streams and linred's own
    stream (``own=True``) are kept, and ordered on the device."""
    from linred.backends._device import StreamOrder

    class Event:
        def synchronize(self):
            ops.calls.append(("synchronized",))

    class Ops(_OrderOps):
        held = "wrapper"

        def current_stream_object(self):
            return self.held

        def lasting(self, stream, handle):
            return stream != "wrapper"

        def own_stream(self):
            return 42, "linred's"

    for home, held, own, expected in [
        (5, "wrapper", False, [("synchronized",)]),
        (5, "caller's own", False, [("waited", 5)]),
        (0, "wrapper", False, [("waited", 0)]),  # (the legacy default stream never goes)
        (5, "wrapper", True, [("waited", 42)]),
    ]:
        ops = Ops()
        ops.home, ops.held = home, held
        ops.event = Event
        order = StreamOrder(ops, own=own)
        order.begin(7)
        order.end(7)
        ops.calls.clear()
        order.release()
        assert ops.calls == expected, (home, held, own)


def test_torch_ops_tell_a_stream_from_its_handle(monkeypatch):
    """(No GPU needed.) PyTorch's current stream object is a plain ``Stream`` even where an
    ``ExternalStream`` is current, so whether the home stream stays alive is told from its
    handle: one linred wrapped for the caller (a stream= it named) may be destroyed."""
    pytest.importorskip("torch")
    from linred.arrays import _torch
    from linred.backends import _device

    # (5: wrapped by the executors' ops, TorchOps.stream; 7: for a call's stream=; both through
    # torch_stream, which records the handles it wraps)
    monkeypatch.setattr(_torch, "WRAPPED", {(5, 0), (7, 0)})
    ops = _device.TorchOps(0)
    plain = object()  # (what the current stream object is does not matter)
    assert not ops.lasting(plain, 5)
    assert not ops.lasting(plain, 7)
    assert ops.lasting(plain, 6)
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda handle, device=None: ("external", handle))
    assert _torch.torch_stream(9, torch.device("cuda", 0)) == ("external", 9)
    assert not ops.lasting(plain, 9)  # (the handle a wrapper was made of is recorded)


def test_stream_order_takes_the_callers_answer_to_whether_the_stream_captures():
    """(No GPU needed.) StreamOrder.end asks whether the stream is being captured only where its
    caller did not: an executor that asked already saves the driver call; a captured call records
    no event and leaves the next call nothing to wait for."""
    from linred.backends._device import StreamOrder

    ops = _OrderOps()
    calls = ops.calls
    order = StreamOrder(ops)
    order.end(1, False)
    assert calls == [("recorded", 1)] and order._last == 1
    order.begin(2)  # another stream: it waits for the event of stream 1
    order.end(2, True)
    assert calls[1:] == [("waited", 2)] and order._last is None
    order.begin(3)  # nothing recorded by the captured call: nothing to wait for
    order.end(3)
    assert calls[2:] == [("asked", 3)] and order._last == 3
    order.end(9)
    assert calls[3:] == [("asked", 9)] and order._last is None


def test_packed_launch_hands_the_driver_its_values_in_order(monkeypatch):
    """(No GPU needed.) PackedLaunch writes a call's values into its 8-byte slots and hands the
    driver the array of their addresses, on the stream, grid, block and shared memory given;
    a failed launch raises naming the kernel."""
    import contextlib
    import ctypes

    from linred.kernels import launch as launch_module

    seen = []

    class Results:
        CUDA_SUCCESS = 0
        CUDA_ERROR_LAUNCH_FAILED = 719

    class FakeDriver:
        CUresult = Results
        fail = False

        @staticmethod
        def cuKernelGetFunction(handle):
            return (Results.CUDA_SUCCESS, f"function of {handle}")

        def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            pointers = (ctypes.c_void_p * 3).from_address(params)
            values = [ctypes.c_int64.from_address(p).value for p in pointers]
            seen.append((f, gx, gy, gz, bx, by, bz, shared, stream, values, extra))
            return (Results.CUDA_ERROR_LAUNCH_FAILED if self.fail else Results.CUDA_SUCCESS,)

    driver = FakeDriver()
    entered, current = [], [False]
    monkeypatch.setattr(launch_module, "_driver", driver)
    monkeypatch.setattr(launch_module, "on_device", lambda device: entered.append(device) or contextlib.nullcontext())
    monkeypatch.setattr(launch_module, "is_current", lambda device: current[0])

    class Kernel:
        handle = 42

    packed = launch_module.PackedLaunch(Kernel(), 3, "linred_test", 2)
    entered.clear()
    packed(7, 100, 256, 1024, 1 << 40, -5, 3)
    assert entered == [2]  # the device's context made current for the launch ...
    current[0] = True
    packed(0, 1, 32, 0, 9, 8, 7)  # the slots are rewritten by the next call
    assert entered == [2]  # ... and not where it is current already
    assert seen == [
        ("function of 42", 100, 1, 1, 256, 1, 1, 1024, 7, [1 << 40, -5, 3], 0),
        ("function of 42", 1, 1, 1, 32, 1, 1, 0, 0, [9, 8, 7], 0),
    ]
    # Arguments bound once stay in their slots; a launch passes the slots as they are.
    packed.bind(1, 11, 12)
    packed(3, 2, 64, 0, 5)
    packed.slots[0] = 6
    packed.launch(4, 2, 64, 0)
    assert seen[2:] == [
        ("function of 42", 2, 1, 1, 64, 1, 1, 0, 3, [5, 11, 12], 0),
        ("function of 42", 2, 1, 1, 64, 1, 1, 0, 4, [6, 11, 12], 0),
    ]
    with pytest.raises(IndexError, match="linred_test takes 3 arguments"):
        packed.bind(2, 1, 2)
    driver.fail = True
    with pytest.raises(RuntimeError, match="launching linred_test failed"):
        packed(0, 1, 32, 0, 1, 2, 3)


def test_driver_kernels_load_once_a_device_and_pack_per_thread(monkeypatch, caplog):
    """(No GPU needed.) DriverKernels (the offsets check's, the lengths scan's and the ids'
    launches) loads its kernels once a device, or remembers why it cannot and warns once; a launch
    writes its values into this thread's slots (the slots after them keep this thread's last
    values) and a failed one raises the message it was given."""
    import contextlib
    import ctypes
    import threading

    from linred.kernels import compiler
    from linred.kernels import launch as launch_module

    seen = []

    class FakeDriver:
        class CUresult:
            CUDA_SUCCESS = 0

        result = 0

        @staticmethod
        def cuKernelGetFunction(handle):
            return (0, f"function of {handle}")

        def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            pointers = (ctypes.c_void_p * 2).from_address(params)
            seen.append((f, gx, bx, shared, stream, [ctypes.c_int64.from_address(p).value for p in pointers]))
            return (self.result,)

    class Kernel:
        def __init__(self, name: str) -> None:
            self.handle = name

    def get_kernels(device, program, names):
        if device == 9:
            raise ValueError("no NVRTC on 9")
        return [Kernel(name) for name in names]

    driver = FakeDriver()
    monkeypatch.setattr(launch_module, "cuda_driver", lambda: driver)
    monkeypatch.setattr(launch_module, "_driver", None)
    entered, current = [], [False]
    monkeypatch.setattr(launch_module, "on_device", lambda device: entered.append(device) or contextlib.nullcontext())
    monkeypatch.setattr(launch_module, "is_current", lambda device: current[0])
    monkeypatch.setattr(compiler, "get_kernels", get_kernels)
    kernels = launch_module.DriverKernels(
        '#include "x.cuh"\n', ("a", "b"), 2, "x", "device %d falls back: %s", "on {device} failed: {err}"
    )
    with caplog.at_level("WARNING", logger="linred"):
        assert kernels.functions(9) == kernels.functions(9) == "ValueError: no NVRTC on 9"
    assert [r.getMessage() for r in caplog.records] == ["device 9 falls back: ValueError: no NVRTC on 9"]
    assert kernels.functions(0) == ("function of a", "function of b")
    entered.clear()
    kernels.launch(0, True, 3, 256, 0, 7, 5, 6)
    assert entered == [0]  # the device's context made current for the launch ...
    current[0] = True
    other = threading.Thread(target=kernels.launch, args=(0, 0, 2, 64, 0, 1, 10, 11))
    other.start()
    other.join()
    assert entered == [0]  # ... and not where it is current already
    assert kernels.enqueue(0, 0, 1, 32, 8, 0, 1) == 0
    assert seen == [
        ("function of b", 3, 256, 0, 7, [5, 6]),
        ("function of a", 2, 64, 0, 1, [10, 11]),
        ("function of a", 1, 32, 8, 0, [1, 6]),
    ]
    driver.result = 719
    with pytest.raises(RuntimeError, match=r"^on 0 failed: 719$"):
        kernels.launch(0, 1, 1, 32, 0, 0, 1, 2)


@pytest.mark.parametrize(
    ("d", "rows", "segments", "lanes"),
    [
        (16, 100, 100_000, 8),  # narrow rows (4 groups): about 12 rows a lane, 32 threads a segment
        (8, 100, 100_000, 8),  # 2 groups: 8 lanes (16 would leave 6 rows a lane)
        (4, 100, 100_000, 8),  # 1 group
        (16, 20, 100_000, 1),  # short segments: one thread per group
        (32, 100, 100_000, 1),  # 8 groups: not narrow, and enough threads to fill the device
        (128, 100, 10_000, 1),
        (64, 244, 4096, 2),  # too few threads to fill the device: the rule before (unchanged)
        (16, 244, 4096, 8),  # both rules: the larger
    ],
)
def test_nvrtc_features_lanes(d, rows, segments, lanes):
    """features_split's lanes: narrow rows (at most FEATURE_NARROW_GROUPS 16-byte groups) get
    about FEATURE_LANE_ROWS rows a lane with a segment's threads in one warp; wider rows keep
    one thread per group unless the device would not be filled."""
    from linred.backends.nvrtc.kernels import FEATURE_LANE_ROWS, features_split_lanes

    p = problem(shape=(1, rows * segments, d), length=rows, segments=segments)
    got = features_split_lanes(p, 4, DEFAULT_OPTIONS.threads, 132)
    assert got == lanes
    if d <= 16 and lanes > 1:
        assert lanes * (d // 4) <= 32 and rows >= lanes * FEATURE_LANE_ROWS


@pytest.mark.parametrize(
    ("shape", "strides", "xp", "op", "width"),
    [
        ((1, 64, 8), None, 0, 0, 4),  # aligned rows of 32 bytes: 16-byte groups
        ((1, 64, 8), None, 4, 0, 1),  # data 4 bytes past 16
        ((1, 64, 8), None, 0, 4, 1),  # results stored as vectors, not aligned
        ((1, 64, 6), None, 0, 0, 1),  # rows of 24 bytes
        ((1, 64, 8), (0, 12, 1), 0, 0, 4),  # rows 48 bytes apart: aligned
        ((1, 64, 8), (0, 10, 1), 0, 0, 1),  # rows 40 bytes apart
        ((2, 64, 8), (600, 8, 1), 0, 0, 4),  # batch rows 2400 bytes apart: aligned
        ((2, 64, 8), (601, 8, 1), 0, 0, 1),  # batch rows 2404 bytes apart
    ],
)
def test_nvrtc_features_width(shape, strides, xp, op, width):
    """Features a thread reads at once: 16 bytes where every row (and batch row) is 16-byte
    aligned and the results' vectors are too, else 1."""
    from linred.backends.nvrtc.kernels import features_width

    assert features_width(problem(shape=shape, strides=strides), xp, op) == width


@pytest.mark.parametrize(
    ("shape", "widths"),
    [
        ((1, 64, 8), {(False, False): 4, (True, False): 1, (False, True): 1, (True, True): 1}),
        ((1, 64, 6), {(False, False): 1, (True, False): 1, (False, True): 1, (True, True): 1}),
    ],
)
def test_nvrtc_features_widths(shape, widths):
    """The width _FeaturesExecutor launches with for each alignment of its pointers: 16-byte
    groups only where both the data and the results are 16-byte aligned (a misaligned pointer
    read or written 16 bytes at a time faults)."""
    from linred.backends.nvrtc.kernels import features_widths

    assert features_widths(problem(shape=shape)) == widths


@pytest.mark.parametrize(
    ("shape", "length", "segments", "min_bytes", "factor", "rows"),
    [
        ((1, 10**6, 128), None, 10**4, 1, 4, 400),  # four times the average length of 100
        ((1, 10**6, 128), None, 10**5, 1, 4, 128),  # at least a tile
        ((1, 10**6, 128), None, 10**4 + 1, 1, 2, 200),  # average rounded up: 99.99 -> 100
        ((2, 1000, 64), None, 10, 2 * 1000 * 64 * 4, 1, 128),  # batch rows count: exactly the floor
        ((2, 1000, 64), None, 10, 2 * 1000 * 64 * 4 + 1, 1, 0),  # under it: none
        ((1, 1000, 64), 10, None, 1, 1, 0),  # a fixed length: no long segments
        ((1, 0, 64), None, 3, 1, 1, 0),  # no rows
        ((1, 10**6, 16), None, 10**4, 1, 2, 0),  # narrow rows (64 bytes): lanes share a segment, none cut
        ((1, 10**6, 16), None, 10**5, 1, 2, 128),  # narrow rows in segments too short for lanes: cut
        ((1, 10**6, 3), None, 10**5, 1, 2, 128),  # the same, three features (a feature a thread)
        ((1, 10**6, 17), None, 10**4, 1, 2, 200),  # past them
        # pairs too few to fill 132 SMs with a block each (< 528): segments past FEATURE_FEW_ROWS
        # cut whatever the size, the lengths' kind or the rows' width
        ((1, 10**6, 64), None, 1, 1 << 62, 2, 1024),  # one segment
        ((1, 10**6, 64), 10**6, None, 1 << 62, 2, 1024),  # a fixed length
        ((1, 10**6, 16), None, 527, 1 << 62, 2, 1024),  # narrow rows, 527 segments of about 1898 rows
        ((1, 10**6, 16), None, 528, 1 << 62, 2, 0),  # 528: enough pairs (and narrow rows are not cut)
        ((1, 10**6, 64), None, 500, 1 << 62, 1, 1024),  # the factor times the mean (2000) capped
        ((1, 500 * 1024, 64), None, 500, 1 << 62, 2, 0),  # segments of 1,024 rows: none past it
        ((4, 10**6, 64), None, 132, 1 << 62, 2, 0),  # 4 x 132 pairs of the batch: enough
    ],
)
def test_nvrtc_features_long_rows(shape, length, segments, min_bytes, factor, rows):
    """The rows past which the feature kernels leave a segment to tiles: the factor times the average
    length, at least a tile; none for fixed lengths, no rows, narrow rows that lanes share, or fewer
    bytes than the floor; but segments too few to fill the device are cut past FEATURE_FEW_ROWS."""
    from linred.backends.nvrtc import NvrtcOptions
    from linred.backends.nvrtc.kernels import features_long_rows

    kwargs = {"offsets_dtype": "int64", "segments": segments} if length is None else {}
    p = problem(shape=shape, length=length, **kwargs)
    options = NvrtcOptions(feature_long_min_bytes=min_bytes, feature_long_factor=factor)
    assert features_long_rows(p, options, sms=132) == rows


@pytest.mark.parametrize(
    ("shape", "length", "segments", "chunks"),
    [
        ((1, 10**6, 64), None, 1, True),  # one segment: thousands of tiles
        ((1, 10**6, 64), 10**6, None, True),  # the same with a fixed length
        ((1, 2 * 10**5, 32), None, 3, True),  # three segments of 520 tiles
        ((1, 10**6, 64), None, 100, False),  # 100 of 78 tiles: a chain each
        ((1, 128 * 4 * 64 * 2, 64), None, 2, False),  # exactly four chunks on average: a chain
        ((1, 128 * 4 * 64 * 2 + 2, 64), None, 2, True),  # past them
        ((1, 10**6, 16), None, 527, False),  # 527 pairs, segments of about 1898 rows
        ((1, 500 * 1024, 64), None, 500, False),  # segments of 1,024 rows on average
        ((4, 10**6, 64), None, 132, False),  # 4 x 132 pairs of the batch
        ((1, 2 * 10**5, 128), None, 2000, False),  # many segments: one chain each (its registers)
        ((1, 0, 64), None, 3, False),  # no rows
    ],
)
def test_nvrtc_features_long_chunks(shape, length, segments, chunks):
    """Long segments are added a chunk of tiles at a time in the calls whose segments are too few
    to fill the device (132 SMs: fewer than 528 pairs of 256 threads) and longer than four chunks
    (32,768 rows) on average, and only there; the kernel's source then defines the chunk."""
    from linred.backends.nvrtc import NvrtcOptions
    from linred.backends.nvrtc.kernels import FEATURE_LONG_CHUNK, features_long_chunks, features_wrapper, index_ctype

    kwargs = {"offsets_dtype": "int64", "segments": segments} if length is None else {}
    p = problem(shape=shape, length=length, **kwargs)
    assert features_long_chunks(p, NvrtcOptions(), sms=132) is chunks
    src = features_wrapper(p, index_ctype(p), DEFAULT_OPTIONS, 1, long=True, chunks=chunks)
    assert src.startswith(f"#define LINRED_LONG_CHUNK {FEATURE_LONG_CHUNK}\n") is chunks
    assert '#include "features.cuh"\n' in src


def test_nvrtc_features_long_wrapper():
    """The long-segment variant of the feature kernel names its header, the tile rows and the
    offsets, after the same types, operation, width and unroll."""
    from linred.backends.nvrtc.kernels import FEATURE_TILE_ROWS, features_wrapper, index_ctype

    p = problem("max", "float64", shape=(1, 640, 9), length=None, offsets_dtype="int32", segments=5)
    src = features_wrapper(p, index_ctype(p), DEFAULT_OPTIONS, 2, long=True)
    assert src.startswith('#include "features.cuh"\n')
    head = f"LINRED_FEATURES_LONG(double, double, double, OpMax, false, 256, 2, {DEFAULT_OPTIONS.unroll}, "
    assert f"{head}{FEATURE_TILE_ROWS}, int, ArrayOffsets<int>{{offsets}})\n" in src


def test_stream_order_idle_leaves_the_next_call_nothing_to_wait_for():
    """(No GPU needed.) After a call the host waited for (a checked call that listed nothing),
    ``idle`` records nothing, and a call on another stream then waits for nothing."""
    from linred.backends._device import StreamOrder

    ops = _OrderOps()
    order = StreamOrder(ops)
    order.begin(1)
    order.end(1, False)
    order.begin(2)  # waits for stream 1's call
    order.idle()
    order.begin(3)  # nothing to wait for
    assert ops.calls == [("recorded", 1), ("waited", 2)] and order._last is None


def test_torch_capture_test_asks_about_the_datas_device(monkeypatch):
    """(No GPU needed.) A checked call is refused inside a CUDA graph capture of the stream it
    runs on, the current stream of its data's device: the question is asked with that device
    current, whichever device is current."""
    torch = pytest.importorskip("torch")
    from linred.arrays import _torch

    current = [0]
    asked: list[int] = []

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            self.before, current[0] = current[0], self.index

        def __exit__(self, *exc):
            current[0] = self.before

    class CudaTensor:
        is_cuda = True

        def __init__(self, device):
            self.device = device

        def get_device(self):
            return self.device

    monkeypatch.setattr(_torch, "_current_device", lambda: current[0])
    monkeypatch.setattr(_torch, "_stream_capturing", lambda: asked.append(current[0]) or current[0] == 1)
    monkeypatch.setattr(torch.cuda, "device", Device)
    adapter = _torch.TorchAdapter()
    assert adapter.capturing(CudaTensor(1)) is True  # cuda:1 captures, cuda:0 is current
    assert adapter.capturing(CudaTensor(0)) is False
    assert asked == [1, 0] and current == [0]
    assert adapter.capturing(torch.zeros(2)) is False  # host data: never asked
    assert asked == [1, 0]


def _tile_kernel_parameters() -> dict[str, list[str]]:
    """The parameter names of linred_tile, linred_fixup, linred_bounds and linred_warp, in order,
    read from the C++ (LINRED_TILE_PARAMS expanded)."""
    src = "".join((KERNELS / f"{f}.cuh").read_text() for f in ("offsets", "tile", "fixup", "warp"))
    shared = re.search(r"#define LINRED_TILE_PARAMS\(I\)(.*?)\n#define", src, re.S).group(1)

    def last(p: str) -> str:
        return re.split(r"[\s*]+", p.replace("\\", "").strip())[-1]

    tiling = [last(p) for p in shared.split(",")]
    names = {}
    for kernel in ("linred_tile", "linred_fixup", "linred_bounds", "linred_warp"):
        signature = re.search(kernel + r"\(\s*(.*?)\)\s*\{", src, re.S).group(1)
        names[kernel] = [n for p in signature.split(",") for n in (tiling if "LINRED_TILE_PARAMS" in p else [last(p)])]
    return names


def test_tile_launch_arguments_match_the_kernels_and_reduce_strided_columns(monkeypatch):
    """The slots nvrtc's tile executor packs for linred_tile, linred_fixup and linred_bounds line
    up with the kernels' parameters (read from the C++), warp_reduce's word slots too, and the
    kernels' row and result arithmetic (tile_row_start, tile_out_start, tile_out_stride) over
    those values reduces strided feature columns right: six layouts, against NumPy."""
    pytest.importorskip("cuda.core")
    import contextlib

    from linred._frontend import request
    from linred.backends.nvrtc import DEFAULT_OPTIONS, executors, route

    names = _tile_kernel_parameters()
    assert len(names["linred_warp"]) == executors._WARP_ARGS
    w = names["linred_warp"]
    assert (w[executors._WARP_WORD - 1], w[executors._WARP_WORD], w[executors._WARP_WORD + 1]) == (
        "walks", "bad", "ticket")  # fmt: skip
    launched = []

    class Arr:
        def __init__(self, ptr: int) -> None:
            self.ptr = ptr

    class Launcher:
        device, sms = 0, 132

        def __init__(self, problem: Problem) -> None:
            self._next = 1 << 20

        @staticmethod
        def ptr(a: Any) -> int:
            return getattr(a, "ptr", 4242)  # (the offsets: a NumPy array here)

        def empty(self, count: int, dtype: str) -> Arr:
            self._next += 1 << 16
            return Arr(self._next)

        def allow_shared_memory(self, kernel: Any, size: int) -> None:
            pass

        def stream_order(self) -> Any:
            return types.SimpleNamespace(begin=lambda s: None, end=lambda s: None, wait_idle=lambda: None)

    class Packed:
        def __init__(self, kernel: Any, count: int, name: str, device: int) -> None:
            assert count == len(names[name]), (name, count)
            self.name, self.count, self.slots = name, count, [None] * count

        def bind(self, first: int, *values: Any) -> None:
            assert first + len(values) <= self.count
            self.slots[first : first + len(values)] = values

        def launch(self, stream: Any, grid: int, block: int, shared: int) -> None:
            launched.append((self.name, list(self.slots)))

    monkeypatch.setattr(executors, "_Launcher", Launcher)
    monkeypatch.setattr(executors, "PackedLaunch", Packed)
    monkeypatch.setattr(executors, "get_kernels", lambda device, wrapper, kernels: kernels)
    monkeypatch.setattr(executors, "on_device", lambda device: contextlib.nullcontext())

    def check(buf: np.ndarray, x: np.ndarray, axis: int, L: int | None = None, offsets: Any = None) -> None:
        first = (x.__array_interface__["data"][0] - buf.__array_interface__["data"][0]) // buf.itemsize
        req, _, _ = request("sum", x, segment_length=L, offsets=offsets, axis=axis, check=False)
        p = dataclasses.replace(req.problem, kind="cupy", device=0)
        assert route(p, DEFAULT_OPTIONS) == "tile"
        launched.clear()
        executors.EXECUTORS["tile"](p, DEFAULT_OPTIONS)(Arr(16000), Arr(80000), req.segments, 7)
        slots = {name: dict(zip(names[name], values, strict=True)) for name, values in launched}
        t = slots["linred_tile"]
        for name, values in slots.items():  # (the tiling every kernel takes, the same values)
            assert all(values[k] == t[k] for k in names["linred_bounds"][1:] if k in values), name
        b, n, d = p.in_shape
        bounds = np.arange(0, n + 1, L) if L else np.asarray(offsets)
        got = np.full(b * len(bounds[:-1]) * d, np.nan)
        for row in range(t["nb"] // t["bpr"]):  # (what tile_row_start / tile_out_start compute)
            batch, column = divmod(row, t["inner"])
            start = batch * t["rs"] + column * t["is"]
            out = batch * t["m"] * t["inner"] + column
            for s in range(t["m"]):
                got[out + s * t["inner"]] = buf[first + start + np.arange(bounds[s], bounds[s + 1]) * t["es"]].sum()
        moved = np.moveaxis(x, axis, 0)
        want = np.stack([moved[a:c].sum(axis=0) for a, c in itertools.pairwise(bounds.tolist())])
        np.testing.assert_allclose(got.reshape(np.moveaxis(want, 0, axis).shape), np.moveaxis(want, 0, axis))

    n, d = 301, 5
    buf = np.random.default_rng(0).standard_normal(10 * n * d)
    check(buf, buf[: d * n].reshape(d, n).T, 0, offsets=[0, 7, 7, 200, 301])  # transposed
    check(buf, buf[: d * 3 * n].reshape(d, 3, n).transpose(1, 2, 0), 1, L=7)  # a batch stored feature-major
    check(buf, buf[: 3 * n * 2 * d].reshape(3, n, 2 * d)[..., ::2], 1, offsets=[0, 0, 100, 301])  # sliced
    check(buf, buf[: 3 * n * 2 * d].reshape(3, n, 2 * d)[..., ::-2], 1, L=43)  # reversed columns
    check(buf, buf[: 2 * d * n].reshape(d, 2 * n).T[::2], 0, offsets=[0, 50, 301])  # strided rows and columns
    check(buf, buf[: 2 * n * d].reshape(2, d, n).transpose(2, 0, 1), 0, L=7)  # (2, d) features after the axis


def test_warp_shift_of_rows_past_a_16_byte_boundary():
    """warp_reduce reads contiguous rows of one column that each begin as far past a 16-byte
    boundary from that boundary: the shift in elements, or 0 where it cannot (or need not)."""
    from linred.backends.nvrtc.kernels import warp_shift

    base = 1 << 20  # (16-byte aligned)
    one = problem(shape=(1, 1000, 1), length=None, segments=3, offsets_dtype="int64")
    assert [warp_shift(one, base + 4 * e) for e in range(5)] == [0, 1, 2, 3, 0]
    assert warp_shift(one, base + 2) == 0  # (not a whole float32 past the boundary)
    for dtype, size in (("float64", 8), ("float16", 2), ("int8", 1)):
        p = problem(dtype=dtype, shape=(1, 1000, 1), length=None, segments=3, offsets_dtype="int64")
        assert [warp_shift(p, base + size * e) for e in range(16 // size + 1)] == [*range(16 // size), 0]
    rows = problem(shape=(3, 1000, 1), length=None, segments=3, offsets_dtype="int64")  # rows of 4,000 bytes
    assert warp_shift(rows, base + 12) == 3
    ragged = problem(shape=(3, 1001, 1), length=None, segments=3, offsets_dtype="int64")  # each row elsewhere
    assert warp_shift(ragged, base + 12) == 0
    strided = problem(shape=(1, 1000, 1), strides=(2000, 2, 1), length=None, segments=3, offsets_dtype="int64")
    assert warp_shift(strided, base + 4) == 0
    features = problem(shape=(1, 1000, 4), length=None, segments=3, offsets_dtype="int64")
    assert warp_shift(features, base + 4) == 0


def test_warp_shifted_wrapper_reads_offsets_further():
    from linred.backends.nvrtc import kernels

    var = problem(shape=(1, 1000, 1), length=None, segments=9, offsets_dtype="int64")
    wrapper = kernels.warp_wrapper(var, "long long", DEFAULT_OPTIONS, 2, shift=3)
    assert wrapper.count("shifted<3>(ArrayOffsets<long long>{offsets})") == 2  # (the reduction and the fix-up)
    fixed = problem(shape=(1, 700, 1), length=7)
    assert "shifted<1>(FixedOffsets{L})" in kernels.warp_wrapper(fixed, "long long", DEFAULT_OPTIONS, 2, shift=1)
    checked = kernels.warp_wrapper(var, "long long", DEFAULT_OPTIONS, 2, checked=True, shift=3)
    assert checked.count("shifted<3>(ArrayOffsets<long long>{offsets})") == 2 and ", true, " in checked


def test_tile_reduce_reads_vectors_only_where_every_thread_gets_whole_ones():
    """A tile (configure allows 512) smaller than threads * the vector, or not a multiple of it,
    is read element by element: its vector variant would give a thread no vector (and did not
    compile: ``V vbuf[0]``)."""
    from linred.backends.nvrtc import kernels

    base = 1 << 20
    f32 = problem(shape=(1, 1000, 1), length=None, segments=3, offsets_dtype="int64")
    i8 = problem(dtype="int8", shape=(1, 1000, 1), length=None, segments=3, offsets_dtype="int64")
    assert kernels.tile_vecload(f32, DEFAULT_OPTIONS, base)
    assert not kernels.tile_vecload(f32, DEFAULT_OPTIONS, base + 4)  # (not on a 16-byte boundary)
    small = dataclasses.replace(DEFAULT_OPTIONS, tile=512)
    assert not kernels.tile_vecload(f32, small, base)
    assert kernels.tile_vecload(f32, dataclasses.replace(DEFAULT_OPTIONS, tile=1024), base)
    assert not kernels.tile_vecload(i8, dataclasses.replace(DEFAULT_OPTIONS, tile=2048), base)
    assert not kernels.tile_vecload(f32, dataclasses.replace(DEFAULT_OPTIONS, tile=1280), base)
    Program, ProgramOptions = _nvrtc_or_skip()
    from linred.kernels.compiler import source

    wrapper = kernels.tile_wrapper(f32, kernels.tile_vecload(f32, small, base), "long long", small, 1)
    assert Program(source(wrapper), "c++", ProgramOptions(arch="sm_80", std="c++17")).compile("cubin").code


def test_a_kernels_shared_memory_attribute_is_only_raised(monkeypatch):
    """(No GPU needed.) Executors share a compiled kernel (one per program and device) and may
    launch it with different dynamic shared memory (features_split's follows its threads): the
    attribute that allows it is only ever raised, so that a later executor with less never takes
    away what an earlier one launches with (a launch then failed with CUDA_ERROR_INVALID_VALUE)."""
    pytest.importorskip("cuda.bindings")
    from linred.backends.nvrtc import executors

    class FakeDriver:
        CUfunction_attribute = executors.driver.CUfunction_attribute
        CUresult = executors.driver.CUresult

        def __init__(self):
            self.calls = []

        def cuKernelSetAttribute(self, attr, value, handle, device):
            self.calls.append((attr.name, value, handle, device))
            return (self.CUresult.CUDA_SUCCESS,)

    fake = FakeDriver()
    monkeypatch.setattr(executors, "driver", fake)
    monkeypatch.setattr(executors, "_SHARED_ALLOWED", {})
    kernel, other = type("K", (), {"handle": 101})(), type("K", (), {"handle": 202})()
    launcher = type("L", (), {"device": 0})()
    allow = executors._Launcher.allow_shared_memory
    allow(launcher, kernel, 4000)
    allow(launcher, kernel, 2000)  # (smaller: kept at 4000)
    allow(launcher, kernel, 4000)
    sizes = [value for name, value, _, _ in fake.calls if name == "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"]
    assert sizes == [4000]
    allow(launcher, kernel, 9000)  # (larger: raised)
    allow(launcher, other, 100)  # (another kernel: its own)
    sizes = [(value, handle) for name, value, handle, _ in fake.calls
             if name == "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"]  # fmt: skip
    assert sizes == [(4000, 101), (9000, 101), (100, 202)]
