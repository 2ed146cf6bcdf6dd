"""The CUB backend: ``DeviceSegmentedReduce`` through cuda.compute, and CuPy's CUB.

It serves every GPU reduction: max and min, integer sums, complex sums,
variable-length segments, and any layout.  One of four paths runs each problem,
chosen once per plan by :func:`choose_path`:

``"cccl"``
    ``cuda.compute.make_segmented_reduce`` (CUB ``DeviceSegmentedReduce``) on
    the data in place, for one feature with contiguous segments (any batch
    stride).  Segment boundaries are never materialised for fixed lengths: the
    start offsets are a ``TransformIterator`` over a ``CountingIterator``
    multiplying by ``L`` (a C++ operator compiled to LTO-IR with cuda.core, ``L``
    passed as state so one compilation serves every length) and the end
    offsets the same iterator advanced by one.  Batches whose rows are not
    adjacent, and offsets shared by every batch, go through operators that map
    the flat segment index to ``batch * batch_stride + offset``.  float16 and
    bfloat16 are read as 16-bit words through a converting iterator and
    accumulated in float32; results narrower than the accumulator (float16,
    bfloat16), and means of fixed lengths (times ``1/L``), are converted on the
    way out by a ``TransformOutputIterator``.  Integer sums accumulate in the
    result type (``h_init`` is int64/uint64, CUB's accumulator type).  max and
    min of floating data use operators that propagate NaN (CUB's ``MAXIMUM`` is
    ``a < b ? b : a``, which drops a NaN depending on the order it meets it).
    Empty segments get ``h_init``: 0, or the identity of max/min (of the
    accumulator's dtype; when ``dtype=`` asks for another result dtype, its
    identity is written over the empty segments after the conversion).  More than
    ``2**31 - 1`` segments are reduced in several launches.  The reduction object
    and its temporary storage belong to the plan and are reused across calls
    (cuda.compute also caches the compiled reduction across plans).
``"cupy-cub"``
    CuPy's fixed-size CUB segmented reduction (``cupy.cuda.cub``), for fixed
    lengths up to :data:`CUPY_CUB_MAX_LENGTH` where its fixed-size kernels are
    faster, when input, accumulator and result share a dtype (float32/float64
    and 64-bit integer sums; max/min of every dtype but bool, NaN-propagating).
``"cupy-reduce"``
    CuPy's reduction over the segment axis of the ``(batch, m, L, features)``
    view, for fixed lengths whose layout CUB's segmented reduction cannot read
    (feature dimensions, strided segments), and for complex data (CuPy adds
    complex values part by part; means divide each part by ``L``).
``"strided-kernel"``
    A small kernel with one thread per (batch, segment, feature), for variable
    lengths with feature dimensions or strided segments, bfloat16 in those
    layouts, and complex sums of variable lengths (real and imaginary parts
    added, and divided by the length, separately).  Neighbouring threads read
    neighbouring features.

All work runs on the resolved stream; nothing waits on the host.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from linred._dtypes import C_TYPES, COMPLEX, HALF, identity
from linred.arrays._streams import ProtocolStream
from linred.backends.base import Backend, cupy_gpu_unavailable
from linred.problem import Problem
from linred.segments import FixedSegments, Segments

#: CuPy's fixed-size CUB reduction serves fixed lengths up to this (its small- and
#: medium-segment kernels beat the general segmented reduction there)
CUPY_CUB_MAX_LENGTH = 256
#: segments per cuda.compute launch (it refuses more than 2**31 - 1)
MAX_SEGMENTS_PER_LAUNCH = (1 << 31) - 1
#: convert integer input to a wider accumulator in the input iterator instead of
#: relying on CUB's implicit conversion of the input type to ``h_init``'s type
CONVERT_INPUT_IN_ITERATOR = False
#: force a path (``"cccl"``, ``"cupy-cub"``, ``"cupy-reduce"``, ``"strided-kernel"``)
#: for new plans; for tests and benchmarks only
FORCE_PATH: str | None = None

PATHS = ("cccl", "cupy-cub", "cupy-reduce", "strided-kernel")

_INT32_MAX = (1 << 31) - 1
_CCCL_DTYPES = frozenset(
    ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", *HALF, "float32", "float64")
)
_CUPY_CUB_SUM = frozenset(("int64", "uint64", "float32", "float64"))
_CUPY_CUB_MINMAX = frozenset(
    ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64")
)


# --- choosing a path (pure; runs without a GPU) -------------------------------------


def _layout(problem: Problem) -> tuple[int, int, int]:
    """The strides with those of length-1 dimensions normalised (they are never used)."""
    B, n, D = problem.in_shape
    sB, sN, sD = problem.strides
    return (0 if B == 1 else sB, 1 if n == 1 else sN, 1 if D == 1 else sD)


def cccl_layout(problem: Problem) -> bool:
    """One feature, unit stride along the segments, non-negative batch stride."""
    sB, sN, _ = _layout(problem)
    return problem.features == 1 and sN == 1 and sB >= 0


def batches_adjacent(problem: Problem) -> bool:
    """Whether batch ``b + 1`` starts where batch ``b`` ends, so all segments are one flat sequence."""
    sB, _, _ = _layout(problem)
    return problem.batch == 1 or sB == problem.n


def cupy_cub_eligible(problem: Problem) -> bool:
    """Whether CuPy's fixed-size CUB reduction can serve ``problem`` exactly."""
    if not (problem.fixed and cccl_layout(problem) and batches_adjacent(problem)):
        return False
    if problem.batch * problem.n > _INT32_MAX:  # CuPy's CUB wrappers count in int
        return False
    if problem.reduction == "sum":
        return problem.dtype == problem.acc_dtype == problem.out_dtype and problem.dtype in _CUPY_CUB_SUM
    if problem.reduction in ("max", "min"):
        return problem.dtype == problem.out_dtype and problem.dtype in _CUPY_CUB_MINMAX
    return False


def is_complex(problem: Problem) -> bool:
    """Whether the data or the accumulator is complex (cuda.compute has no complex addition)."""
    return problem.dtype in COMPLEX or problem.acc_dtype in COMPLEX


def _cupy_reducible(problem: Problem) -> bool:
    """Fixed lengths of dtypes CuPy has (not bfloat16)."""
    return problem.fixed and "bfloat16" not in (problem.dtype, problem.out_dtype)


def choose_path(problem: Problem) -> str:
    """The path that serves ``problem`` (see the module docstring)."""
    if FORCE_PATH is not None:
        return FORCE_PATH
    if cccl_layout(problem) and problem.dtype in _CCCL_DTYPES and not is_complex(problem):
        if cupy_cub_eligible(problem) and problem.segment_length <= CUPY_CUB_MAX_LENGTH:
            return "cupy-cub"
        return "cccl"
    if _cupy_reducible(problem):
        return "cupy-reduce"
    return "strided-kernel"


def path_unsupported(problem: Problem, path: str) -> str | None:
    """Why ``path`` cannot serve ``problem`` (used when a path is forced), or None."""
    if path == "cccl":
        if not cccl_layout(problem):
            return "CUB's segmented reduction needs one feature and contiguous segments"
        if problem.dtype not in _CCCL_DTYPES or is_complex(problem):
            return f"cuda.compute cannot add {problem.dtype} into {problem.acc_dtype}"
    elif path == "cupy-cub":
        if not cupy_cub_eligible(problem):
            return "CuPy's CUB reduction needs fixed contiguous segments of one dtype"
    elif path == "cupy-reduce":
        if not _cupy_reducible(problem):
            return "CuPy's reduction serves fixed lengths of CuPy dtypes"
    elif path != "strided-kernel":
        return f"unknown path {path!r}"
    return None


# --- device code for cuda.compute ----------------------------------------------------

_PRELUDE = r"""
struct linred_batch_state { long long a; long long count; long long batch_stride; long long shift; };
"""
_BITS = r"""
[[maybe_unused]] static __device__ __forceinline__ float linred_as_float(unsigned int u) {
    float f; asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u)); return f;
}
[[maybe_unused]] static __device__ __forceinline__ unsigned int linred_as_uint(float f) {
    unsigned int u; asm("mov.b32 %0, %1;" : "=r"(u) : "f"(f)); return u;
}
"""

# Each operator is compiled on its own, so that a build linking one operator twice
# (start and end offsets) links identical LTO-IR, which cuda.compute deduplicates.
_SOURCES = {
    # start offset of flat segment k: k * L (state: L)
    "linred_mul": """
extern "C" __device__ void linred_mul(void* state, void* in, void* out) {
    *(long long*)out = *(const long long*)in * *(const long long*)state;
}""",
    # (k / m) * batch_stride + (k % m + shift) * L  (state: L, m, batch_stride, shift)
    "linred_batched_fixed": """
extern "C" __device__ void linred_batched_fixed(void* state, void* in, void* out) {
    const linred_batch_state* s = (const linred_batch_state*)state;
    const long long k = *(const long long*)in;
    const long long b = k / s->count;
    *(long long*)out = b * s->batch_stride + (k - b * s->count + s->shift) * s->a;
}""",
    # (k / m) * batch_stride + offsets[k % m + shift]  (state: offsets pointer, m, batch_stride, shift)
    "linred_batched_offsets32": """
extern "C" __device__ void linred_batched_offsets32(void* state, void* in, void* out) {
    const linred_batch_state* s = (const linred_batch_state*)state;
    const long long k = *(const long long*)in;
    const long long b = k / s->count;
    const int* offsets = (const int*)s->a;
    *(long long*)out = b * s->batch_stride + (long long)offsets[k - b * s->count + s->shift];
}""",
    "linred_batched_offsets64": """
extern "C" __device__ void linred_batched_offsets64(void* state, void* in, void* out) {
    const linred_batch_state* s = (const linred_batch_state*)state;
    const long long k = *(const long long*)in;
    const long long b = k / s->count;
    const long long* offsets = (const long long*)s->a;
    *(long long*)out = b * s->batch_stride + offsets[k - b * s->count + s->shift];
}""",
    # 16-bit floats read as 16-bit words, widened exactly
    "linred_f16_to_f32": """
extern "C" __device__ void linred_f16_to_f32(void* in, void* out) {
    const unsigned short h = *(const unsigned short*)in;
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    *(float*)out = f;
}""",
    "linred_bf16_to_f32": """
extern "C" __device__ void linred_bf16_to_f32(void* in, void* out) {
    *(float*)out = linred_as_float(((unsigned int)*(const unsigned short*)in) << 16);
}""",
    # results: times a scale (1 or 1/L), rounded to the result type (state: the scale)
    "linred_scale_f32_to_f16": """
extern "C" __device__ void linred_scale_f32_to_f16(void* state, void* in, void* out) {
    const float v = *(const float*)in * *(const float*)state;
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    *(unsigned short*)out = h;
}""",
    "linred_scale_f32_to_bf16": """
extern "C" __device__ void linred_scale_f32_to_bf16(void* state, void* in, void* out) {
    const unsigned int u = linred_as_uint(*(const float*)in * *(const float*)state);
    unsigned short h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h = (unsigned short)((u >> 16) | 0x40u);  // NaN stays NaN
    else h = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);           // nearest even
    *(unsigned short*)out = h;
}""",
    "linred_scale_f32": """
extern "C" __device__ void linred_scale_f32(void* state, void* in, void* out) {
    *(float*)out = *(const float*)in * *(const float*)state;
}""",
    "linred_scale_f64": """
extern "C" __device__ void linred_scale_f64(void* state, void* in, void* out) {
    *(double*)out = *(const double*)in * *(const double*)state;
}""",
}


def _nan_max_min(op: str, suffix: str, ctype: str) -> str:
    """max/min that propagate NaN, like NumPy."""
    compare = ">" if op == "max" else "<"
    return (
        f'\nextern "C" __device__ void linred_{op}_{suffix}(void* a, void* b, void* out) {{\n'
        f"    const {ctype} x = *(const {ctype}*)a, y = *(const {ctype}*)b;\n"
        f"    *({ctype}*)out = (x != x || x {compare} y) ? x : y;\n}}"
    )


_SOURCES.update(
    {
        f"linred_{op}_{suffix}": _nan_max_min(op, suffix, ctype)
        for op in ("max", "min")
        for suffix, ctype in (("f32", "float"), ("f64", "double"))
    }
)


def op_source(name: str) -> str:
    """The C++ source of operator ``name`` (``linred_cvt_<src>_<dst>`` are generated)."""
    if name.startswith("linred_cvt_"):
        src, dst = name.removeprefix("linred_cvt_").split("_")
        body = (
            f'extern "C" __device__ void {name}(void* in, void* out) {{\n'
            f"    *({C_TYPES[dst]}*)out = ({C_TYPES[dst]})*(const {C_TYPES[src]}*)in;\n}}"
        )
    else:
        body = _SOURCES[name]
    return _PRELUDE + (_BITS if "linred_as_" in body else "") + body


_ltoir: dict[tuple[str, str], bytes] = {}
_ltoir_lock = threading.Lock()


def _compile(name: str, arch: str) -> bytes:
    key = (name, arch)
    code = _ltoir.get(key)
    if code is None:
        with _ltoir_lock:
            code = _ltoir.get(key)
            if code is None:
                try:
                    from cuda.core import Program, ProgramOptions
                except ImportError:  # cuda.core < 0.4
                    from cuda.core.experimental import Program, ProgramOptions
                options = ProgramOptions(arch=arch, relocatable_device_code=True, link_time_optimization=True)
                code = _ltoir[key] = bytes(Program(op_source(name), "c++", options).compile("ltoir").code)
    return code


def raw_op(name: str, arch: str, state: bytes = b"", alignment: int = 1) -> Any:
    """A cuda.compute ``RawOp`` for operator ``name`` compiled for ``arch`` (e.g. ``"sm_90"``)."""
    from cuda.compute.op import RawOp

    return RawOp(ltoir=_compile(name, arch), name=name, state=state, state_alignment=alignment)


def _batch_state(a: int, count: int, batch_stride: int, shift: int) -> bytes:
    return np.array([a, count, batch_stride, shift], dtype=np.int64).tobytes()


# --- the cuda.compute path -------------------------------------------------------------


def _internal_acc(problem: Problem) -> str:
    """CUB's accumulator (``h_init``'s dtype): float32 for 16-bit floats, else linred's."""
    if problem.reduction in ("max", "min"):
        return "float32" if problem.dtype in HALF else problem.dtype
    return problem.acc_dtype


class CcclExecutor:
    """DeviceSegmentedReduce through cuda.compute; see the module docstring."""

    def __init__(self, problem: Problem) -> None:
        import cupy
        from cuda.compute import OpKind
        from cuda.compute import types as cc_types

        self._problem = problem
        self._cupy = cupy
        self._types = cc_types
        B, n, _ = problem.in_shape
        sB, _, _ = _layout(problem)
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
        elif CONVERT_INPUT_IN_ITERATOR and problem.dtype != acc:
            self._in_op = raw_op(f"linred_cvt_{problem.dtype}_{acc}", self._arch)
            self._in_type = getattr(cc_types, "boolean" if acc == "bool" else acc)
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
        from linred.backends._gpu import segment_chunks

        return list(segment_chunks(self._total, MAX_SEGMENTS_PER_LAUNCH))

    def _counting(self, start: int) -> Any:
        from cuda.compute import CountingIterator

        return CountingIterator(np.int64(start))

    def _fixed_bounds(self, k0: int, k1: int) -> tuple[Any, Any]:
        from cuda.compute import TransformIterator

        int64 = self._types.int64
        L = self._length
        if self._fold:
            starts = TransformIterator(self._counting(k0), raw_op("linred_mul", self._arch, _mul_state(L), 8), int64)
            return starts, starts + 1

        def make(shift: int) -> Any:
            return raw_op("linred_batched_fixed", self._arch, _batch_state(L, self._m, self._sB, shift), 8)

        return (
            TransformIterator(self._counting(k0), make(0), int64),
            TransformIterator(self._counting(k0), make(1), int64),
        )

    def _variable_bounds(self, offsets: Any, k0: int, k1: int) -> tuple[Any, Any]:
        if self._B == 1:
            return offsets[k0:k1], offsets[k0 + 1 : k1 + 1]
        from cuda.compute import TransformIterator

        from linred.backends._gpu import data_ptr

        ptr = data_ptr(offsets)
        int64 = self._types.int64

        def bound(shift: int) -> Any:
            op = raw_op(self._offsets_op_name, self._arch, _batch_state(ptr, self._m, self._sB, shift), 8)
            return TransformIterator(self._counting(k0), op, int64)

        return bound(0), bound(1)

    def _input(self, x3: Any) -> Any:
        from linred.backends._gpu import as_cupy, bits16, span_view

        span, _ = span_view(x3, (self._B, self._n, 1), (self._sB, 1, 1))
        # CuPy views of tensors too: cuda.compute keys its compiled reductions by array type
        span = as_cupy(bits16(span) if self._problem.dtype in HALF else span)
        if self._in_op is None:
            return span
        from cuda.compute import TransformIterator

        return TransformIterator(span, self._in_op, self._in_type)

    def _output(self, target: Any) -> Any:
        if self._out_mode != "convert":
            return target
        from cuda.compute import TransformOutputIterator

        return TransformOutputIterator(target, self._out_op, self._out_type)

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        from linred.backends._gpu import on_stream

        with on_stream(stream, self._device):
            self._run(x, out, segments, stream)

    def _run(self, x: Any, out: Any, segments: Segments, stream: int) -> None:
        from linred.backends._gpu import as_cupy, bits16

        cupy = self._cupy
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
                from cuda.compute import make_segmented_reduce

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
        from linred.backends._gpu import cast_into, divide_by_lengths, fill_empty

        problem = self._problem
        if problem.reduction != "mean":
            cast_into(target, out_flat)
            if problem.reduction in ("max", "min") and not problem.fixed:
                # Empty segments hold h_init, the identity of the accumulator (the input
                # dtype); the result dtype's identity differs (int8 -> int64, int32 -> -inf).
                fill_empty(out, segments.offsets, problem.reduction, stream)
        elif problem.fixed:
            cast_into(self._cupy.true_divide(target, self._length), out_flat)
        else:
            divide_by_lengths(target.reshape(problem.out_shape), segments.offsets, out, stream)

    def free(self) -> None:
        self._reducer = None


def _mul_state(length: int) -> bytes:
    return np.array([length], dtype=np.int64).tobytes()


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
        import cupy.cuda.cub as cub

        self._op = {"sum": cub.CUPY_CUB_SUM, "max": cub.CUPY_CUB_MAX, "min": cub.CUPY_CUB_MIN}[problem.reduction]
        self._reduce = cub.device_segmented_reduce
        self._device = problem.device
        self._shape = (problem.batch * problem.num_segments, problem.segment_length)
        self._strides = _layout(problem)
        self._in_shape = problem.in_shape

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        from linred.backends._gpu import as_cupy, on_stream, span_view

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
        import cupy
        from cupy.lib.stride_tricks import as_strided

        from linred.backends._gpu import as_cupy, cast_into, on_stream

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
    """One thread per (batch, segment, feature); see :func:`linred.backends._gpu.strided_reduce`."""

    def __init__(self, problem: Problem) -> None:
        self._problem = problem
        self._dtypes = (problem.dtype, problem.acc_dtype, problem.out_dtype)

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        from linred.backends._gpu import on_stream, strided_reduce

        p = self._problem
        with on_stream(stream, p.device):
            if isinstance(segments, FixedSegments):
                strided_reduce(x, p.strides, out, None, segments.length, p.reduction, self._dtypes)
            else:
                strided_reduce(x, p.strides, out, segments.offsets, None, p.reduction, self._dtypes)

    def free(self) -> None:
        pass


_EXECUTORS = {
    "cccl": CcclExecutor,
    "cupy-cub": CupyCubExecutor,
    "cupy-reduce": CupyReduceExecutor,
    "strided-kernel": StridedKernelExecutor,
}


class CubBackend(Backend):
    name = "cub"
    summary = "CUB DeviceSegmentedReduce (cuda.compute) and CuPy's CUB: every reduction, dtype and layout on the GPU"

    def unavailable(self) -> str | None:
        reason = cupy_gpu_unavailable()
        if reason is not None:
            return reason
        try:
            import cuda.compute

            if not getattr(cuda.compute, "_BINDINGS_AVAILABLE", True):
                return "cuda.compute is installed but its CUDA bindings are not available"
            from cuda.compute import make_segmented_reduce  # noqa: F401
        except Exception as e:
            return f"cuda.compute (cuda-cccl) is not usable ({type(e).__name__}: {e}); pip install cuda-cccl"
        try:
            import cuda.core
        except Exception as e:
            return f"cuda.core is not importable ({type(e).__name__}: {e}); pip install cuda-core"
        if not hasattr(cuda.core, "Program"):
            try:
                from cuda.core.experimental import Program  # noqa: F401
            except Exception as e:
                return f"cuda.core is not importable ({type(e).__name__}: {e}); pip install cuda-core"
        return None

    def unsupported(self, problem: Problem) -> str | None:
        if problem.device is None:
            return (
                f"it runs on CUDA devices and the data is a {problem.kind} array on the host; "
                "backend='numpy' serves host data"
            )
        if FORCE_PATH is not None:
            return path_unsupported(problem, FORCE_PATH)
        return None

    def plan(self, problem: Problem) -> Any:
        return _EXECUTORS[choose_path(problem)](problem)


BACKEND = CubBackend()
