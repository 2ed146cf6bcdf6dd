"""The public functions' body, and how it meets PyTorch.

Without PyTorch, a call goes straight to the plan cache
(:func:`linred._plan_cache.call`).  Once PyTorch is imported, :data:`run` becomes
:func:`linred._torch_ops.run`, which sends a tensor through the registered operator
``linred::segmented_reduce`` where that is needed (inside ``torch.compile``, and
for tensors that require grad) and every other call to the plan cache, as before.
``import linred`` still imports no PyTorch: the switch happens on the first call
made after PyTorch is imported (or when linred is imported after it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from linred import _plan_cache


def _without_torch(*args: Any) -> Any:
    """The body while PyTorch is not imported (one dictionary test per call)."""
    if "torch" in sys.modules:
        register_torch()
        return run(*args)
    return _plan_cache.call(*args)


#: the body of the public functions: ``run(reduction, x, segment_length, offsets, lengths, axis,
#: dtype, out, backend, stream, check)``
run: Callable[..., Any] = _without_torch


def register_torch() -> None:
    """Route the public functions through :mod:`linred._torch_ops` (once; a no-op without PyTorch)."""
    global run
    if run is not _without_torch:
        return
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(getattr(torch, "library", None), "custom_op"):
        return
    from linred import _torch_ops

    run = _torch_ops.run
