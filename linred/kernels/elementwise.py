"""The CuPy elementwise kernels of the CuPy-based backends.

The ``cub`` backend runs them (and the ``nvmath`` backend's CuPy path divides by
segment lengths with :func:`divide_by_lengths`); they are compiled by CuPy (NVRTC)
on first use and take CuPy arrays or CUDA tensors (viewed as CuPy, bfloat16 as
int16 bits):

- :func:`divide_by_lengths`: ``out = sums / lengths`` per segment, NaN when empty;
- :func:`fill_empty`: the empty segments of a result set to the reduction's identity;
- :func:`cast_into`: a dtype conversion, bfloat16 rounded to nearest even;
- :func:`strided_reduce`: one thread per (batch, segment, feature) of any strided
  input, for the layouts CUB's segmented reduction cannot read.

Their shared C++ (bfloat16 conversions, NaN and infinities) is ``elementwise.cuh``,
assembled by :func:`linred.kernels.compiler.source`; the operation of each kernel is
written here per dtype, since CuPy writes the kernel around it (indexing, types).
"""

from __future__ import annotations

import threading
from typing import Any

import cupy
import numpy as np

from linred._dtypes import C_TYPES, COMPLEX, HALF, identity
from linred.backends._device import as_cupy, bits16, on_stream, span_view
from linred.kernels.compiler import source

#: CUDA C type of each dtype as CuPy kernels spell it; bfloat16 data is passed as int16 bits
CTYPE = {
    **C_TYPES,
    "float16": "float16",
    "bfloat16": "short",
    "complex64": "complex<float>",
    "complex128": "complex<double>",
}

#: the preamble of every kernel here (bfloat16 as int16 bits, NaN and infinities)
PREAMBLE = source('#include "elementwise.cuh"\n')

_kernels: dict[tuple, cupy.ElementwiseKernel] = {}
_kernels_lock = threading.Lock()


def _kernel(key: tuple, make: Any) -> cupy.ElementwiseKernel:
    kernel = _kernels.get(key)
    if kernel is None:
        with _kernels_lock:
            kernel = _kernels.get(key)
            if kernel is None:
                kernel = _kernels[key] = make()
    return kernel


def _real_of(name: str) -> str:
    """The real type division by a length happens in, for a sum of dtype ``name``."""
    if name in ("float32", "complex64", "float16"):
        return "float"
    return "double"


def _divide_kernel(sums_dtype: str, out_dtype: str, out_is_bf16: bool) -> cupy.ElementwiseKernel:
    real = _real_of(sums_dtype)
    nan = "LINRED_NAN_F" if real == "float" else "LINRED_NAN_D"
    # integer and float16 sums are converted first; float32/float64/complex ones divide in their own type
    convert = sums_dtype not in ("float32", "float64", "complex64", "complex128")
    value = f"(({real})sums[i] / ({real})len)" if convert else f"(sums[i] / ({real})len)"
    if sums_dtype.startswith("complex"):
        # Real and imaginary parts divided separately: a complex division would turn an
        # infinite part into NaN (inf * 0 in the cross terms).
        value = f"T(sums[i].real() / ({real})len, sums[i].imag() / ({real})len)"
    if out_is_bf16:
        body = f"out = linred_bf16_bits(len > 0 ? (float){value} : LINRED_NAN_F);"
    else:
        body = f"out = len > 0 ? (T){value} : (T){nan};"

    def make() -> cupy.ElementwiseKernel:
        return cupy.ElementwiseKernel(
            "raw S sums, raw I offsets, int64 m, int64 d",
            "T out",
            f"""
            const long long seg = (i / d) % m;
            const long long len = (long long)offsets[seg + 1] - (long long)offsets[seg];
            {body}
            """,
            f"linred_divide_by_lengths_{'bf16' if out_is_bf16 else 'std'}_{real}_{int(convert)}",
            preamble=PREAMBLE,
        )

    return _kernel(("divide", sums_dtype, out_dtype, out_is_bf16), make)


def dtype_name_of(a: Any) -> str:
    """The canonical dtype name of a CuPy array or a tensor."""
    if isinstance(a, cupy.ndarray):
        return a.dtype.name
    return str(a.dtype).removeprefix("torch.")


def divide_by_lengths(sums: Any, offsets: Any, out: Any, stream: int) -> None:
    """``out = sums / lengths`` per segment (NaN for empty segments), on ``stream``.

    ``sums`` and ``out`` are ``(batch, m, features)``, C-contiguous, CuPy arrays
    or CUDA tensors (a bfloat16 ``out`` tensor included); ``sums`` may be ``out``
    itself.  Integer sums are divided in float64; float16 sums in float32;
    complex sums keep their precision.
    """
    _, m, d = out.shape
    out_name = dtype_name_of(out)
    sums_name = dtype_name_of(sums)
    device = out.device.id if isinstance(out, cupy.ndarray) else out.device.index
    with on_stream(stream, device):
        bf16 = out_name == "bfloat16"
        target = as_cupy(bits16(out) if bf16 else out)
        kernel = _divide_kernel(sums_name, out_name, bf16)
        kernel(as_cupy(sums), as_cupy(offsets), m, d, target)


_fill_empty = cupy.ElementwiseKernel(
    "raw I offsets, int64 m, int64 d, T value",
    "T out",
    """
    const long long seg = (i / d) % m;
    if (offsets[seg + 1] == offsets[seg]) out = value;
    """,
    "linred_fill_empty",
)


def bf16_bits(value: float) -> int:
    """The bfloat16 bit pattern (as a signed 16-bit int) of ``value``, rounded to nearest even:
    ``linred_bf16_round`` of ``bf16.cuh`` on the host."""
    u = int(np.array(value, dtype=np.float32).view(np.uint32))
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    # a NaN stays a quiet NaN with its sign; anything else rounds to nearest even
    h = ((u >> 16) | 0x40) if nan else (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
    return h - 0x10000 if h & 0x8000 else h


def fill_empty(out: Any, offsets: Any, reduction: str, stream: int) -> None:
    """Set the empty segments of ``out`` (``(batch, m, features)``) to the reduction's identity.

    ``out`` is a CuPy array or a CUDA tensor (bfloat16 included); the identity is
    that of ``out``'s dtype.
    """
    _, m, d = out.shape
    name = dtype_name_of(out)
    device = out.device.id if isinstance(out, cupy.ndarray) else out.device.index
    with on_stream(stream, device):
        if name == "bfloat16":
            target = as_cupy(bits16(out))
            value = np.int16(bf16_bits(identity(reduction, name)))
        else:
            target = as_cupy(out)
            value = target.dtype.type(identity(reduction, name))
        _fill_empty(as_cupy(offsets), m, d, value, target)


def _cast_bf16_kernel() -> cupy.ElementwiseKernel:
    return _kernel(
        ("cast-bf16",),
        lambda: cupy.ElementwiseKernel(
            "S src", "short out", "out = linred_bf16_bits((float)src);", "linred_cast_bf16", preamble=PREAMBLE
        ),
    )


def cast_into(src: cupy.ndarray, out: Any) -> None:
    """Copy ``src`` (a CuPy array) into ``out`` converting the dtype, on CuPy's current stream.

    ``out`` is a CuPy array or a CUDA tensor of the same shape, bfloat16 included
    (rounded to nearest even).
    """
    if dtype_name_of(out) == "bfloat16":
        _cast_bf16_kernel()(src, as_cupy(bits16(out)))
    else:
        cupy.copyto(as_cupy(out), src, casting="unsafe")


# --- the strided kernel: one thread per (batch, segment, feature) ------------------


def _literal(value: float | int, ctype: str) -> str:
    if isinstance(value, float):
        single = ctype == "float"
        if value != value:
            return "LINRED_NAN_F" if single else "LINRED_NAN_D"
        inf = "LINRED_INF_F" if single else "LINRED_INF_D"
        if value == float("inf"):
            return inf
        if value == float("-inf"):
            return f"(-{inf})"
        return repr(value)
    if ctype == "bool":
        return "true" if value else "false"
    if value == -(1 << 63):
        return "(-9223372036854775807LL - 1)"
    suffix = "ULL" if ctype.startswith("unsigned") else "LL"
    return f"(({ctype}){value}{suffix})"


def _literal_ctype(name: str) -> str:
    """The C type a literal of dtype ``name`` is written in (16-bit floats as float)."""
    if name in ("float16", "bfloat16", "float32"):
        return "float"
    if name == "float64":
        return "double"
    return CTYPE[name]


def _store(expr: str, out_dtype: str) -> str:
    if out_dtype == "bfloat16":
        return f"out = linred_bf16_bits((float)({expr}));"
    if out_dtype == "float16":  # (CuPy's float16 converts from float)
        return f"out = (Y)((float)({expr}));"
    return f"out = (Y)({expr});"


def strided_kernel_body(reduction: str, in_dtype: str, acc_dtype: str, out_dtype: str) -> str:
    """The CUDA body of the strided kernel (see :func:`strided_reduce`); pure, for tests.

    ``i`` is the flat (batch, segment, feature) index of the result element
    ``out`` (type ``Y``); the input ``x`` (type ``X``) is read through the
    strides.  bfloat16 data and results are int16 bits.
    """
    # max/min compare in the input type (16-bit floats widened exactly); sums use linred's accumulator
    compare_c = "float" if in_dtype in HALF else CTYPE[in_dtype]
    acc_c = compare_c if reduction in ("max", "min") else CTYPE[acc_dtype]
    if reduction in ("sum", "mean"):
        # A thread adds its segment's elements one after another: float32 sums are kept in double
        # (in float32 one segment of 80000 complex values came out 2e-6 off, and more for longer)
        acc_c = {"float": "double", "complex<float>": "complex<double>"}.get(acc_c, acc_c)
    complex_acc = acc_c.startswith("complex")
    # the real type of the accumulator's parts (complex sums add real and imaginary parts
    # separately, which is what complex<T>::operator+= does)
    part_c = ("double" if "double" in acc_c else "float") if complex_acc else acc_c
    if in_dtype == "bfloat16":
        raw = "linred_bf16_value(x[p])"
    elif in_dtype == "float16":
        raw = "(float)x[p]"
    else:
        raw = "x[p]"
    # a real value becomes complex through its part type: one conversion, no ambiguity
    load = f"({acc_c})(({part_c}){raw})" if complex_acc and in_dtype not in COMPLEX else f"({acc_c}){raw}"
    floating = acc_c in ("float", "double")
    if reduction in ("sum", "mean"):
        init = f"({acc_c})0"
        combine = "acc += v;"
    else:
        init = _literal(identity(reduction, "float64" if floating else acc_dtype), acc_c)
        cmp = ">" if reduction == "max" else "<"
        nan_first = "acc != acc || " if floating else ""  # NaN propagates
        combine = f"acc = ({nan_first}acc {cmp} v) ? acc : v;"
    if reduction == "mean":
        if complex_acc:
            nan = "LINRED_NAN_F" if part_c == "float" else "LINRED_NAN_D"
            # complex / real divides each part: no cross terms that would turn inf into NaN
            result = f"(stop > start ? acc / ({part_c})(stop - start) : ({acc_c})({nan}))"
        else:
            real = "double" if not floating or acc_c == "double" else "float"
            nan = "LINRED_NAN_F" if real == "float" else "LINRED_NAN_D"
            result = f"(stop > start ? ({real})acc / ({real})(stop - start) : {nan})"
        store = _store(result, out_dtype)
    elif reduction in ("max", "min"):
        # An empty segment gets the identity of the result dtype (dtype= may widen it),
        # not the input's identity converted.
        empty = _literal(identity(reduction, out_dtype), _literal_ctype(out_dtype))
        store = f"if (stop > start) {{ {_store('acc', out_dtype)} }} else {{ {_store(empty, out_dtype)} }}"
    else:
        store = _store("acc", out_dtype)
    return f"""
    const long long j = i % d;
    const long long r = i / d;
    const long long seg = r % m;
    const long long b = r / m;
    long long start, stop;
    if (seglen > 0) {{ start = seg * seglen; stop = start + seglen; }}
    else {{ start = (long long)offsets[seg]; stop = (long long)offsets[seg + 1]; }}
    const long long p0 = base + b * sb + j * sd;
    {acc_c} acc = {init};
    for (long long t = start; t < stop; ++t) {{
        const long long p = p0 + t * sn;
        const {acc_c} v = {load};
        {combine}
    }}
    {store}
    """


def _strided_kernel(reduction: str, in_dtype: str, acc_dtype: str, out_dtype: str) -> cupy.ElementwiseKernel:
    """A kernel reducing ``(batch, m, features)`` outputs of any strided input, fixed or variable segments.

    Each thread walks one segment of one feature; neighbouring threads handle
    neighbouring features, so reads coalesce when the features are contiguous.
    It serves the layouts CUB's segmented reduction cannot read (strided
    segments, feature dimensions), bfloat16 (as int16 bits) and complex sums.
    """
    body = strided_kernel_body(reduction, in_dtype, acc_dtype, out_dtype)
    name = f"linred_strided_{reduction}_{in_dtype}_{acc_dtype}_{out_dtype}"

    def make() -> cupy.ElementwiseKernel:
        return cupy.ElementwiseKernel(
            "raw X x, raw I offsets, int64 base, int64 sb, int64 sn, int64 sd, int64 m, int64 d, int64 seglen",
            "Y out",
            body,
            name,
            preamble=PREAMBLE,
        )

    return _kernel(("strided", reduction, in_dtype, acc_dtype, out_dtype), make)


def strided_reduce(
    x3: Any,
    strides: tuple[int, int, int],
    out3: Any,
    offsets: Any,
    length: int | None,
    reduction: str,
    dtypes: tuple[str, str, str],
) -> None:
    """Reduce ``x3`` (``(batch, n, features)``, any strides) into ``out3`` on CuPy's current stream.

    ``offsets`` (variable segments) or ``length`` (fixed) gives the segments.
    ``dtypes`` is ``(input, accumulation, result)``; bfloat16 arrays must be
    tensors (viewed as int16 here).
    """
    in_dtype, acc_dtype, out_dtype = dtypes
    B, n, D = x3.shape
    _, m, _ = out3.shape
    src = bits16(x3) if in_dtype == "bfloat16" else x3
    span, base = span_view(src, (B, n, D), strides)
    target = as_cupy(bits16(out3) if out_dtype == "bfloat16" else out3)
    if offsets is None:
        offsets = _no_offsets(target.device.id)
    sb, sn, sd = strides
    kernel = _strided_kernel(reduction, in_dtype, acc_dtype, out_dtype)
    kernel(as_cupy(span), as_cupy(offsets), base, sb, sn, sd, m, D, length or 0, target)


_empty_offsets: dict[int, cupy.ndarray] = {}


def _no_offsets(device: int) -> cupy.ndarray:
    """A placeholder offsets argument for fixed-length segments (never read)."""
    a = _empty_offsets.get(device)
    if a is None:
        with cupy.cuda.Device(device):
            a = _empty_offsets.setdefault(device, cupy.empty(1, dtype=np.int64))
    return a
