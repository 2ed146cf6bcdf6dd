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

from linred.arrays._base import ArrayAdapter, ArrayInfo, adapters
from linred.arrays._numpy import NUMPY

__all__ = ["ArrayAdapter", "ArrayInfo", "adapter_for", "adapters", "as_array", "namespace", "refusal"]


def _cupy_adapter() -> ArrayAdapter:
    from linred.arrays._cupy import CUPY

    return CUPY


def _torch_adapter() -> ArrayAdapter:
    from linred.arrays._torch import TORCH

    return TORCH


def refusal(x: Any, name: str) -> str | None:
    """Why ``x``, a NumPy array or tensor of a known library, is still not an array linred reads.

    Masked and sparse arrays, and array subclasses that carry meaning of their own
    (``np.matrix``, units), would lose it silently: they are refused, not converted.
    """
    if isinstance(x, np.ndarray):
        if isinstance(x, np.ma.MaskedArray):
            return (
                f"{name} is a NumPy masked array: linred does not apply masks; pass {name}.filled(value) "
                f"or {name}.data to reduce explicit values"
            )
        if type(x) is not np.ndarray and not isinstance(x, np.memmap):
            return (
                f"{name} is a {type(x).__module__}.{type(x).__name__}, a NumPy array subclass whose meaning "
                f"linred would drop; pass np.asarray({name}) to reduce its values as a plain array"
            )
        return None
    layout = getattr(x, "layout", None)
    if layout is not None and type(x).__module__.split(".")[0] == "torch":
        if str(layout) != "torch.strided":
            return f"{name} is a torch tensor of layout {layout}: linred reads dense (strided) tensors only"
        if getattr(x, "is_nested", False):  # (a nested tensor of strided layout: no shape of its own)
            return f"{name} is a nested torch tensor: linred reads dense (strided) tensors only"
    return None


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


#: what ``as_array`` converts with :func:`numpy.asarray`: nested Python sequences and numbers,
#: NumPy scalars; any other object (another library's array, a DataFrame, a lazy or sparse
#: array) is refused rather than copied to the host behind the caller's back
_CONVERTIBLE = (list, tuple, int, float, complex, np.generic)


def namespace(kind: str) -> Any:
    """The array module of an adapter's ``kind``: NumPy, or CuPy or PyTorch (imported already,
    since linred is holding one of their arrays)."""
    return np if kind == "numpy" else sys.modules[kind]


def _kinds(name: str) -> str:
    """The arrays an argument may be (the data: also JAX and Dask arrays for the functions, which
    take them before they get here; plans do not)."""
    if name == "x":
        return "a NumPy, CuPy or PyTorch array or a sequence of numbers (the functions also take JAX and Dask arrays)"
    return "a NumPy, CuPy or PyTorch array or a sequence of numbers"


def as_array(x: Any, name: str = "x") -> tuple[Any, ArrayAdapter]:
    """Return ``(array, adapter)``; Python sequences and numbers become NumPy arrays.

    Raises
    ------
    TypeError
        If ``x`` is neither a NumPy, CuPy or PyTorch array nor a sequence of
        numbers, or is one that linred does not read as it is (masked, sparse,
        an ndarray subclass).
    """
    adapter = adapter_for(x)
    if adapter is not None:
        reason = refusal(x, name)
        if reason is not None:
            raise TypeError(reason)
        return x, adapter
    if not isinstance(x, _CONVERTIBLE) or isinstance(x, bool):
        where = type(x).__module__
        kind = type(x).__name__ if where == "builtins" else f"{where}.{type(x).__name__}"
        hint = "" if where == "builtins" else f"; pass np.asarray({name}) to reduce a host copy of its values"
        raise TypeError(f"{name} must be {_kinds(name)}; got {kind}{hint}")
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{name} must be {_kinds(name)}; got {type(x).__name__} that NumPy cannot convert ({e})"
        ) from None
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"{name} must hold numbers; got {type(x).__name__} converted to dtype {arr.dtype}")
    return arr, NUMPY
