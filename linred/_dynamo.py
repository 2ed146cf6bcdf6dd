"""linred calls inside ``torch.compile``: run as they are, outside the compiled graph.

TorchDynamo traces the Python a compiled function calls.  Traced, linred's call
pipeline (stream handles, raw device pointers, the plan cache) would not run as
written, so linred's public functions are opaque to it: a compiled function that
calls one is split there (a graph break), and the call runs eagerly, exactly as
without ``torch.compile``.

Two pieces, so that ``import linred`` still imports no PyTorch:

- :func:`opaque` marks a public function with the attribute that
  ``torch.compiler.disable`` sets: Dynamo does not inline such a function into the
  caller's graph.
- :func:`register_torch` (run when ``linred`` is imported after ``torch``, or when
  linred first meets a tensor) wraps the pipeline, :data:`run`, in
  ``torch.compiler.disable``, so that Dynamo compiles none of the frames the call
  runs through.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

from linred import _plan_cache

F = TypeVar("F", bound=Callable[..., Any])

#: the body of the public functions: :func:`linred._plan_cache.call`, or the same wrapped in
#: ``torch.compiler.disable`` once PyTorch is in use
run: Callable[..., Any] = _plan_cache.call

_REASON = "linred's reductions run eagerly, outside the compiled graph"


def opaque(fn: F) -> F:
    """Mark ``fn`` as not to be traced by TorchDynamo (a graph break where it is called)."""
    fn._torchdynamo_disable = True  # type: ignore[attr-defined]
    fn._torchdynamo_disable_msg = _REASON  # type: ignore[attr-defined]
    return fn


def register_torch() -> None:
    """Make :data:`run` a ``torch.compiler.disable`` function (once; a no-op without it)."""
    global run
    if run is not _plan_cache.call:
        return
    torch = sys.modules.get("torch")
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is not None:
        run = disable(_plan_cache.call, reason=_REASON)
