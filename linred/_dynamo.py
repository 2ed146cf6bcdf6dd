"""The public functions' body, and how it meets PyTorch.

Without PyTorch, a call goes straight to the plan cache
(:func:`linred._plan_cache.call`).  Once PyTorch is in use, :data:`run` becomes
:func:`linred._torch_ops.run`, which sends a tensor through the registered operator
``linred::segmented_reduce`` inside ``torch.compile``, through an autograd Function for
tensors that require grad and inside ``torch.func`` transforms, and every other call
to the plan cache, as before.
``import linred`` still imports no PyTorch: the switch happens when linred is
imported after PyTorch, or when linred first meets a tensor.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from linred import _plan_cache

#: the body of the public functions: ``run(reduction, x, segment_length, offsets, lengths, axis,
#: dtype, out, backend, stream, check)``
run: Callable[..., Any] = _plan_cache.call

# The plan cache is opaque to TorchDynamo (what torch.compiler.disable marks): a compiled function
# breaks its graph there and runs the call eagerly.  That is every call before PyTorch is registered
# (the call registers it, so that the next compilation traces through linred's operator), and any
# call on NumPy or CuPy data afterwards.
_plan_cache.call._torchdynamo_disable = True  # type: ignore[attr-defined]
_plan_cache.call._torchdynamo_disable_msg = "linred runs this call eagerly, outside the graph"  # type: ignore[attr-defined]


def register_torch() -> None:
    """Route the public functions through :mod:`linred._torch_ops` (once; a no-op without PyTorch)."""
    global run
    if run is not _plan_cache.call:
        return
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(getattr(torch, "library", None), "custom_op"):
        return
    from linred import _torch_ops

    run = _torch_ops.run
