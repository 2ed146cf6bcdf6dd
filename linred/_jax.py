"""JAX arrays in, JAX arrays out, through DLPack (no copy of the input).

A JAX array on the CPU is read as a NumPy array and one on a GPU as a CuPy array, both by
DLPack, which shares the memory; the result (a new NumPy or CuPy array) goes back to JAX
the same way, on the same device.  Offsets and lengths given as JAX arrays cross the same
way.  JAX arrays are immutable and JAX orders its own work, so ``out=`` and ``stream=``
are refused for them; inside ``jax.jit`` or ``jax.grad`` (tracers, which hold no data) a
call raises ``TypeError``: linred reduces concrete arrays only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["call_jax", "is_jax"]


def is_jax(x: Any) -> bool:
    """Whether ``x`` is a JAX array (or a JAX tracer)."""
    module = type(x).__module__
    return module.startswith(("jax.", "jaxlib.")) or module in ("jax", "jaxlib")


def _platform(x: Any) -> str:
    devices = x.devices()
    if len(devices) != 1:
        raise TypeError(f"x is a JAX array spread over {len(devices)} devices; linred reduces arrays on one device")
    return next(iter(devices)).platform


def _as_local(a: Any, platform: str, name: str) -> Any:
    """A JAX array as a NumPy (CPU) or CuPy (GPU) array sharing its memory."""
    if not is_jax(a):
        return a
    if not hasattr(a, "__dlpack__") or type(a).__name__.endswith("Tracer"):
        raise TypeError(f"{name} is a JAX tracer (inside jax.jit or jax.grad); linred reduces concrete arrays only")
    if _platform(a) != platform:
        raise ValueError(f"{name} is a JAX array on {_platform(a)} but x is on {platform}")
    try:
        if platform == "cpu":
            import numpy as np

            return np.from_dlpack(a)
        import cupy

        return cupy.from_dlpack(a)
    except (TypeError, ValueError, BufferError, RuntimeError) as e:
        raise TypeError(f"{name} is a JAX array of dtype {a.dtype} that cannot cross DLPack here ({e})") from None


def call_jax(function: Any, x: Any, segment_length: Any, *, offsets: Any, lengths: Any, out: Any, stream: Any,
             **kwargs: Any) -> Any:  # fmt: skip
    """``function(x, ...)`` for JAX ``x``: reduced on its device, returned as a JAX array there."""
    import jax

    if out is not None or stream is not None:
        which = " and ".join(n for n, v in (("out", out), ("stream", stream)) if v is not None)
        raise TypeError(f"{which} cannot be given for JAX arrays (they are immutable; JAX orders its own work)")
    if not hasattr(x, "__dlpack__") or type(x).__name__.endswith("Tracer"):
        raise TypeError("x is a JAX tracer (inside jax.jit or jax.grad); linred reduces concrete arrays only")
    platform = _platform(x)
    if platform not in ("cpu", "gpu", "cuda"):
        raise TypeError(f"x is a JAX array on {platform}; linred serves JAX arrays on the CPU and CUDA GPUs")
    platform = "cpu" if platform == "cpu" else "gpu"
    local = _as_local(x, platform, "x")
    result = function(
        local,
        segment_length,
        offsets=_as_local(offsets, platform, "offsets"),
        lengths=_as_local(lengths, platform, "lengths"),
        **{k: _as_local(v, platform, k) if k == "segment_ids" else v for k, v in kwargs.items()},
    )
    if not result.flags.c_contiguous:
        # (a result can be a view of a larger buffer, as unsorted ids with check=False give;
        # JAX takes only compact strides through DLPack)
        result = result.copy()
    return jax.dlpack.from_dlpack(result)
