"""dtype rules: which dtypes linred accepts, accumulates in and returns.

dtypes are handled by canonical name (``"float32"``, ``"bfloat16"``, ...) so that
NumPy, CuPy and PyTorch dtypes share one set of rules and no array library has
to be imported to apply them.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
INTEGER = ("bool", *SIGNED, *UNSIGNED)
HALF = ("float16", "bfloat16")
REAL = (*HALF, "float32", "float64")
COMPLEX = ("complex64", "complex128")
FLOATING = (*REAL, *COMPLEX)
SUPPORTED = (*INTEGER, *FLOATING)

REDUCTIONS = ("sum", "mean", "max", "min", "prod")

#: the C type of every dtype that CUDA C spells one way; each kernel source adds its own
#: spelling of float16, bfloat16 and complex
C_TYPES = {
    "bool": "bool",
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
    "float32": "float",
    "float64": "double",
}


def dtype_name(dtype: Any) -> str:
    """Return the canonical name of a NumPy, CuPy or PyTorch dtype (or dtype-like).

    Raises
    ------
    TypeError
        If ``dtype`` is not a dtype linred supports.
    """
    if isinstance(dtype, str):
        name = dtype
    elif type(dtype).__module__ == "torch":  # torch.dtype, without importing torch
        name = str(dtype).removeprefix("torch.")
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise TypeError(f"dtype must be one of {', '.join(SUPPORTED)}; got {dtype!r}") from None
    if name == "bool_":
        name = "bool"
    if name not in SUPPORTED:
        with contextlib.suppress(TypeError):  # NumPy spellings such as "f4", "<f8", "double"
            name = np.dtype(name).name
    if name not in SUPPORTED:
        raise TypeError(f"dtype must be one of {', '.join(SUPPORTED)}; got {dtype!r}")
    return name


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a canonical name (bfloat16 needs the ``ml_dtypes`` package)."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - only without ml_dtypes
            raise TypeError("bfloat16 NumPy arrays need the ml_dtypes package (pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def resolve(reduction: str, in_name: str, requested: str | None) -> tuple[str, str]:
    """Return ``(accumulation dtype, result dtype)`` for a reduction.

    - sum: bool and signed integers give int64, unsigned integers uint64, floating
      dtypes their own dtype; float16 and bfloat16 are accumulated in float32.
    - prod: as sum (integers multiply in 64 bits and wrap around as NumPy's do).
    - mean: as sum for floating dtypes; integers are accumulated in float64 and give
      float64, as NumPy's mean does (an int64 sum of, say, epoch-nanosecond timestamps
      would overflow).
    - max, min: the input dtype (complex is rejected: it has no order).
    - ``requested`` (the ``dtype=`` argument) sets both, except that float16 and
      bfloat16 are still accumulated in float32.
    """
    if reduction in ("max", "min"):
        if in_name in COMPLEX:
            raise TypeError(
                f"segmented_{reduction} does not support complex input ({in_name}): complex numbers have no order"
            )
        if requested is not None and requested in COMPLEX:
            raise TypeError(f"segmented_{reduction} cannot return complex dtype {requested}")
        out = requested or in_name
        return in_name, out  # compared in the input dtype, then converted
    if requested is not None:
        if requested == "bool":
            raise TypeError(f"dtype=bool is not a valid result dtype for segmented_{reduction}")
        if in_name in COMPLEX and requested not in COMPLEX:
            raise TypeError(f"cannot reduce complex input ({in_name}) into real dtype {requested}")
        if reduction == "mean" and requested in INTEGER:
            raise TypeError(f"segmented_mean cannot return integer dtype {requested}")
        acc = "float32" if requested in HALF else requested
        return acc, requested
    if in_name in FLOATING:
        return ("float32" if in_name in HALF else in_name), in_name
    if reduction == "mean":
        return "float64", "float64"
    acc = "uint64" if in_name in UNSIGNED else "int64"
    return acc, acc


def identity(reduction: str, name: str) -> Any:
    """The value an empty segment reduces to, as a Python scalar of dtype ``name``."""
    if reduction == "sum":
        return 0
    if reduction == "prod":
        return 1
    if reduction == "mean":
        return float("nan")
    if name == "bool":
        return reduction == "min"
    if name in REAL:
        return float("-inf") if reduction == "max" else float("inf")
    info = np.iinfo(name)
    return int(info.min) if reduction == "max" else int(info.max)


def itemsize(name: str) -> int:
    return 2 if name == "bfloat16" else np.dtype(name).itemsize
