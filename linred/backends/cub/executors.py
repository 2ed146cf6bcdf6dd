"""The CUB backend's executors: the four paths of :func:`linred.backends.cub.choose_path`.

- ``CcclExecutor`` (``"cccl"``): ``DeviceSegmentedReduce`` through cuda.compute;
- ``CupyCubExecutor`` (``"cupy-cub"``): CuPy's fixed-size CUB segmented reduction;
- ``CupyReduceExecutor`` (``"cupy-reduce"``): CuPy's reduction over the segment axis;
- ``StridedKernelExecutor`` (``"strided-kernel"``): one thread per (batch, segment,
  feature), a CuPy elementwise kernel.

:data:`EXECUTORS` maps each path to its executor.
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np
from cuda.compute import (
    CountingIterator,
    OpKind,
    TransformIterator,
    TransformOutputIterator,
    make_segmented_reduce,
)
from cuda.compute import types as cc_types
from cuda.compute.op import RawOp
from cupy.cuda import cub as cupy_cub
from cupy.lib.stride_tricks import as_strided

from linred._dtypes import HALF, identity
from linred.arrays._streams import ProtocolStream
from linred.backends._device import as_cupy, bits16, data_ptr, on_stream, span_view
from linred.backends.base import segment_chunks
from linred.backends.cub import MAX_SEGMENTS_PER_LAUNCH, batches_adjacent, normalized_strides
from linred.backends.cub.operators import batch_state, mul_state, op_source
from linred.kernels.compiler import get_ltoir
from linred.kernels.elementwise import cast_into, divide_by_lengths, fill_empty, strided_reduce
from linred.problem import Problem
from linred.segments import FixedSegments, Segments

# --- the operators, compiled to LTO-IR --------------------------------------------------


def raw_op(name: str, arch: str, state: bytes = b"", alignment: int = 1) -> Any:
    """A cuda.compute ``RawOp`` for operator ``name`` compiled for ``arch`` (e.g. ``"sm_90"``)."""
    return RawOp(ltoir=get_ltoir(op_source(name), arch), name=name, state=state, state_alignment=alignment)


# --- the cuda.compute path -------------------------------------------------------------


def _internal_acc(problem: Problem) -> str:
    """CUB's accumulator (``h_init``'s dtype): float32 for 16-bit floats, else linred's."""
    if problem.reduction in ("max", "min"):
        return "float32" if problem.dtype in HALF else problem.dtype
    return problem.acc_dtype


class CcclExecutor:
    """DeviceSegmentedReduce through cuda.compute; see the module docstring."""

    def __init__(self, problem: Problem) -> None:
        self._problem = problem
        B, n, _ = problem.in_shape
        sB, _, _ = normalized_strides(problem)
        self._B, self._n, self._m, self._sB = B, n, problem.num_segments, sB
        self._total = B * problem.num_segments
        self._fold = batches_adjacent(problem)
        self._device = problem.device
        with cupy.cuda.Device(problem.device):
            self._arch = "sm_" + cupy.cuda.Device(problem.device).compute_capability
        reduction = problem.reduction
        acc = _internal_acc(problem)
        self._acc = acc
        out = problem.out_dtype

        # input
        if problem.dtype in HALF:
            widen = "linred_f16_to_f32" if problem.dtype == "float16" else "linred_bf16_to_f32"
            self._in_op = raw_op(widen, self._arch)
            self._in_type = cc_types.float32
        else:
            self._in_op = None
            self._in_type = None

        # reduction operator and initial value
        if reduction in ("sum", "mean"):
            self._op = OpKind.PLUS
        elif acc in ("float32", "float64"):
            self._op = raw_op(f"linred_{reduction}_f{acc[-2:]}", self._arch)
        else:
            self._op = OpKind.MAXIMUM if reduction == "max" else OpKind.MINIMUM
        init = identity("sum" if reduction == "mean" else reduction, acc)
        self._h_init = np.array([init], dtype=np.dtype(acc))

        # output: straight into the result, converted on the way out, or through a temporary
        self._scale: float | None = None
        self._out_op_name: str | None = None
        scalable = (acc == "float32" and out in ("float32", *HALF)) or (acc == "float64" and out == "float64")
        if reduction == "mean" and problem.fixed and scalable:
            self._scale = 1.0 / problem.segment_length
        elif reduction != "mean" and acc == "float32" and out in HALF:
            self._scale = 1.0
        if self._scale is not None:
            self._out_op_name = {"float16": "linred_scale_f32_to_f16", "bfloat16": "linred_scale_f32_to_bf16"}.get(
                out, f"linred_scale_f{acc[-2:]}"
            )
            self._out_mode = "convert"
        elif reduction != "mean" and out == acc:
            self._out_mode = "direct"
        else:
            self._out_mode = "temp"
        if self._out_op_name is not None:
            scale_dtype = np.float64 if self._out_op_name == "linred_scale_f64" else np.float32
            self._out_op = raw_op(
                self._out_op_name, self._arch, np.array([self._scale], dtype=scale_dtype).tobytes(),
                np.dtype(scale_dtype).itemsize,
            )  # fmt: skip
            self._out_type = cc_types.float64 if scale_dtype is np.float64 else cc_types.float32

        # segment boundaries
        self._fixed = problem.fixed
        self._length = problem.segment_length
        if problem.fixed:
            self._fixed_offsets = [self._fixed_bounds(k0, k1) for k0, k1 in self._chunks()]
        else:
            width = "32" if problem.offsets_dtype == "int32" else "64"
            self._offsets_op_name = f"linred_batched_offsets{width}"

        self._use_hint = not _using_v2()
        self._reducer: Any = None
        self._temp_bytes: dict[tuple[int, int], int] = {}

    def _chunks(self) -> list[tuple[int, int]]:
        return list(segment_chunks(self._total, MAX_SEGMENTS_PER_LAUNCH))

    def _counting(self, start: int) -> Any:
        return CountingIterator(np.int64(start))

    def _fixed_bounds(self, k0: int, k1: int) -> tuple[Any, Any]:
        int64 = cc_types.int64
        L = self._length
        if self._fold:
            starts = TransformIterator(self._counting(k0), raw_op("linred_mul", self._arch, mul_state(L), 8), int64)
            return starts, starts + 1

        def make(shift: int) -> Any:
            return raw_op("linred_batched_fixed", self._arch, batch_state(L, self._m, self._sB, shift), 8)

        return (
            TransformIterator(self._counting(k0), make(0), int64),
            TransformIterator(self._counting(k0), make(1), int64),
        )

    def _variable_bounds(self, offsets: Any, k0: int, k1: int) -> tuple[Any, Any]:
        if self._B == 1:
            return offsets[k0:k1], offsets[k0 + 1 : k1 + 1]
        ptr = data_ptr(offsets)
        int64 = cc_types.int64

        def bound(shift: int) -> Any:
            op = raw_op(self._offsets_op_name, self._arch, batch_state(ptr, self._m, self._sB, shift), 8)
            return TransformIterator(self._counting(k0), op, int64)

        return bound(0), bound(1)

    def _input(self, x3: Any) -> Any:
        span, _ = span_view(x3, (self._B, self._n, 1), (self._sB, 1, 1))
        # CuPy views of tensors too: cuda.compute keys its compiled reductions by array type
        span = as_cupy(bits16(span) if self._problem.dtype in HALF else span)
        if self._in_op is None:
            return span
        return TransformIterator(span, self._in_op, self._in_type)

    def _output(self, target: Any) -> Any:
        if self._out_mode != "convert":
            return target
        return TransformOutputIterator(target, self._out_op, self._out_type)

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        with on_stream(stream, self._device):
            self._run(x, out, segments, stream)

    def _run(self, x: Any, out: Any, segments: Segments, stream: int) -> None:
        d_in = self._input(x)
        out_flat = out.reshape(self._total)
        if self._out_mode == "temp":
            target = cupy.empty(self._total, dtype=self._acc)
        elif self._problem.out_dtype in HALF:
            target = as_cupy(bits16(out_flat))  # written as 16-bit words by the converting iterator
        else:
            target = as_cupy(out_flat)
        offsets = None if isinstance(segments, FixedSegments) else as_cupy(segments.offsets)
        hint = self._length if isinstance(segments, FixedSegments) else segments.max_length
        if not self._use_hint:
            hint = None
        stream_arg = ProtocolStream(stream)
        for index, (k0, k1) in enumerate(self._chunks()):
            d_out = self._output(target[k0:k1])
            if self._fixed:
                starts, ends = self._fixed_offsets[index]
            else:
                starts, ends = self._variable_bounds(offsets, k0, k1)
            if self._reducer is None:
                self._reducer = make_segmented_reduce(
                    d_in=d_in, d_out=d_out, start_offsets_in=starts, end_offsets_in=ends, op=self._op,
                    h_init=self._h_init,
                )  # fmt: skip
            args = dict(
                d_in=d_in, d_out=d_out, num_segments=k1 - k0, start_offsets_in=starts, end_offsets_in=ends,
                op=self._op, h_init=self._h_init, max_segment_size=hint, stream=stream_arg,
            )  # fmt: skip
            key = (k1 - k0, hint or 0)
            need = self._temp_bytes.get(key)
            if need is None:
                need = self._temp_bytes[key] = int(self._reducer(temp_storage=None, **args))
            # Temporary storage comes from CuPy's pool on the call's stream, which orders
            # its reuse with that stream's work: safe whichever stream the next call uses.
            temp = cupy.empty(max(need, 1), dtype=cupy.uint8)
            self._reducer(temp_storage=temp, **args)
        if self._out_mode == "temp":
            self._finish(target, out, out_flat, segments, stream)

    def _finish(self, target: Any, out: Any, out_flat: Any, segments: Segments, stream: int) -> None:
        problem = self._problem
        if problem.reduction != "mean":
            cast_into(target, out_flat)
            if problem.reduction in ("max", "min") and not problem.fixed:
                # Empty segments hold h_init, the identity of the accumulator (the input
                # dtype); the result dtype's identity differs (int8 -> int64, int32 -> -inf).
                fill_empty(out, segments.offsets, problem.reduction, stream)
        elif problem.fixed:
            cast_into(cupy.true_divide(target, self._length), out_flat)
        else:
            divide_by_lengths(target.reshape(problem.out_shape), segments.offsets, out, stream)

    def free(self) -> None:
        self._reducer = None


def _using_v2() -> bool:
    """cuda.compute's v2 backend ignores (and warns about) ``max_segment_size``."""
    try:
        from cuda.compute._build_info import USING_V2
    except Exception:
        return False
    return bool(USING_V2)


# --- the CuPy paths -------------------------------------------------------------------


class CupyCubExecutor:
    """CuPy's fixed-size CUB segmented reduction over the ``(batch * m, L)`` view."""

    def __init__(self, problem: Problem) -> None:
        ops = {"sum": cupy_cub.CUPY_CUB_SUM, "max": cupy_cub.CUPY_CUB_MAX, "min": cupy_cub.CUPY_CUB_MIN}
        self._op = ops[problem.reduction]
        self._reduce = cupy_cub.device_segmented_reduce
        self._device = problem.device
        self._shape = (problem.batch * problem.num_segments, problem.segment_length)
        self._strides = normalized_strides(problem)
        self._in_shape = problem.in_shape

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        with on_stream(stream, self._device):
            span, _ = span_view(x, self._in_shape, self._strides)
            rows = as_cupy(span).reshape(self._shape)
            target = as_cupy(out).reshape(self._shape[0])
            self._reduce(rows, self._op, (1,), (0,), out=target, contiguous_size=self._shape[1])

    def free(self) -> None:
        pass


class CupyReduceExecutor:
    """CuPy's reduction over axis 2 of the ``(batch, m, L, features)`` strided view.

    CuPy's reductions are called without ``out=``: CuPy 14's ``ndarray.min``
    hands ``out`` and ``dtype`` to its CUB dispatcher in swapped order, which then
    compares the output array with a dtype and raises.  The reduction goes into a
    fresh array (``m`` times ``features`` elements per batch, ``1/L`` of the
    data) that is copied into the result.
    """

    def __init__(self, problem: Problem) -> None:
        self._problem = problem
        B, _, D = problem.in_shape
        L = problem.segment_length
        self._shape4 = (B, problem.num_segments, L, D)
        sB, sN, sD = problem.strides
        self._strides4 = (sB, sN * L, sN, sD)
        self._part = {"complex64": "float32", "complex128": "float64"}.get(problem.acc_dtype)

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        p = self._problem
        with on_stream(stream, p.device):
            xc = as_cupy(x)
            size = xc.dtype.itemsize
            x4 = as_strided(xc, self._shape4, tuple(s * size for s in self._strides4))
            if p.reduction in ("max", "min"):
                f = cupy.amax if p.reduction == "max" else cupy.amin
                cast_into(f(x4, axis=2), out)
                return
            total = cupy.sum(x4, axis=2, dtype=p.acc_dtype)
            if p.reduction == "mean":
                if self._part is not None:
                    # Each part on its own: a complex division by L would turn an infinite
                    # part into NaN (Smith's algorithm multiplies it by 0).
                    parts = total.view(self._part)
                    parts /= p.segment_length
                else:
                    total = cupy.true_divide(total, p.segment_length)
            cast_into(total, out)

    def free(self) -> None:
        pass


class StridedKernelExecutor:
    """One thread per (batch, segment, feature); see :func:`linred.kernels.elementwise.strided_reduce`."""

    def __init__(self, problem: Problem) -> None:
        self._problem = problem
        self._dtypes = (problem.dtype, problem.acc_dtype, problem.out_dtype)

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        p = self._problem
        with on_stream(stream, p.device):
            if isinstance(segments, FixedSegments):
                strided_reduce(x, p.strides, out, None, segments.length, p.reduction, self._dtypes)
            else:
                strided_reduce(x, p.strides, out, segments.offsets, None, p.reduction, self._dtypes)

    def free(self) -> None:
        pass


#: the executor of each path
EXECUTORS = {
    "cccl": CcclExecutor,
    "cupy-cub": CupyCubExecutor,
    "cupy-reduce": CupyReduceExecutor,
    "strided-kernel": StridedKernelExecutor,
}
