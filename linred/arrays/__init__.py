"""Array adapters: one small module per array library (NumPy, CuPy, PyTorch).

An adapter answers what linred needs to know about an array (shape, strides,
dtype, device), makes arrays of the same kind (results, offsets) and resolves
streams.  The array library is detected through :data:`sys.modules`, so asking
about a NumPy array never imports CuPy or PyTorch.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from linred.arrays._base import ArrayAdapter, ArrayInfo, fast_keys
from linred.arrays._numpy import NUMPY

__all__ = ["ArrayAdapter", "ArrayInfo", "adapter_for", "as_array", "fast_keys"]


def _cupy_adapter() -> ArrayAdapter:
    from linred.arrays._cupy import CUPY

    return CUPY


def _torch_adapter() -> ArrayAdapter:
    from linred.arrays._torch import TORCH

    return TORCH


def adapter_for(x: Any) -> ArrayAdapter | None:
    """The adapter of ``x``'s array library, or None if ``x`` is no supported array."""
    if isinstance(x, np.ndarray):
        return NUMPY
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return _cupy_adapter()
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _torch_adapter()
    return None


def as_array(x: Any, name: str = "x") -> tuple[Any, ArrayAdapter]:
    """Return ``(array, adapter)``; array-likes (lists, scalars' sequences) become NumPy arrays.

    Raises
    ------
    TypeError
        If ``x`` is neither a NumPy, CuPy or PyTorch array nor convertible to a
        numeric NumPy array.
    """
    adapter = adapter_for(x)
    if adapter is not None:
        return x, adapter
    if isinstance(x, (str, bytes, dict, set)) or x is None:
        raise TypeError(
            f"{name} must be a NumPy, CuPy or PyTorch array or a sequence of numbers; got {type(x).__name__}"
        )
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{name} must be a NumPy, CuPy or PyTorch array or a sequence of numbers; "
            f"got {type(x).__name__} that NumPy cannot convert ({e})"
        ) from None
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"{name} must hold numbers; got {type(x).__name__} converted to dtype {arr.dtype}")
    return arr, NUMPY
