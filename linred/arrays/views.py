"""Views of the caller's arrays that the backends read, host or device, without copying.

- :func:`host_view`: a NumPy view of a NumPy array or a CPU PyTorch tensor
  (bfloat16 included);
- :func:`physical`: a PyTorch tensor without its lazy conjugate and negative bits,
  for libraries that read the memory rather than the bits;
- :func:`numpy_views`: a call's CPU tensors as NumPy views, or None where one cannot be.

Nothing here imports an array library beyond NumPy unless it is handed a tensor.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from linred._dtypes import numpy_dtype


def host_view(a: Any) -> np.ndarray:
    """A NumPy view of a NumPy array or a CPU PyTorch tensor (no copy)."""
    if isinstance(a, np.ndarray):
        return a
    import torch

    if a.dtype == torch.bfloat16:  # torch cannot export bfloat16 to NumPy directly
        return a.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    return a.numpy()


def physical(x: Any) -> tuple[Any, bool]:
    """``x`` without PyTorch's lazy conjugate and negative bits, and whether the result must be conjugated.

    BLAS reads the memory, not the bits: a conjugate view is summed as stored
    (the bit cleared, no copy) and the sum conjugated afterwards.  A negative
    view (the imaginary part of a conjugate view) is materialized, as PyTorch
    offers no public way to clear the bit without a copy.
    """
    if type(x).__module__.split(".")[0] != "torch":
        return x, False
    if x.is_neg():
        x = x.resolve_neg()
    if x.is_conj():
        return x.conj(), True
    return x, False


def numpy_views(*values: Any) -> tuple[Any, ...] | None:
    """``values`` with each PyTorch tensor among them as the NumPy view of its memory (no copy;
    other values as they are), or None where one cannot be viewed: a tensor on another device
    than the CPU, one that requires grad, with a conjugate or negative bit, or of a dtype NumPy
    lacks (bfloat16).  For the calls on CPU tensors that NumPy's arrays serve."""
    torch = sys.modules.get("torch")  # (no tensor without it)
    views = []
    for v in values:
        if torch is not None and isinstance(v, torch.Tensor):
            if not v.is_cpu:
                return None
            try:
                v = v.numpy()
            except (RuntimeError, TypeError):
                return None
        views.append(v)
    return tuple(views)
