"""dtype names and the result dtypes the contract promises, independent of ``linred._dtypes``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes comes with the test environment
    ml_dtypes = None

try:
    import torch
except ImportError:  # torch is optional
    torch = None

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
    if torch is not None and isinstance(dtype, torch.dtype):
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
