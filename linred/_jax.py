"""JAX arrays in, JAX arrays out, through DLPack (no copy of the input).

A JAX array on the CPU is read as a NumPy array and one on a GPU as a CuPy array, both by
DLPack, which shares the memory; the result (a new NumPy or CuPy array) goes back to JAX
the same way, on the same device.  Offsets and lengths given as JAX arrays cross the same
way.  With JAX's 64-bit types off (its default), a 64-bit result is refused (positions come
back as int32, as ``jnp.argmax`` gives them): JAX would truncate it.  JAX arrays are immutable
and JAX orders its own work, so ``out=`` and ``stream=`` are refused for them; inside
``jax.jit`` or ``jax.grad`` (tracers, which hold no data) a call raises ``TypeError``: linred
reduces concrete arrays only.
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
        raise TypeError(
            f"{name} is a JAX tracer (inside jax.jit, jax.grad or jax.vmap); linred reduces concrete arrays only"
        )
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
        raise TypeError("x is a JAX tracer (inside jax.jit, jax.grad or jax.vmap); linred reduces concrete arrays only")
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
    kind = result.dtype.kind
    width = result.dtype.itemsize // (2 if kind == "c" else 1)  # (complex64: two 4-byte parts)
    if width >= 8 and kind in "iufc" and not jax.config.read("jax_enable_x64"):
        result = _without_x64(function, result, x.shape)
    # (DLPack names a host array's device as the CPU, which JAX reads as its first CPU device)
    device = next(iter(x.devices()))
    try:
        return jax.dlpack.from_dlpack(result, device=device)
    except TypeError:  # (a JAX whose from_dlpack takes no device)
        return jax.device_put(jax.dlpack.from_dlpack(result), device)


#: the functions whose results are positions (int64), which int32 holds where the axis is shorter
#: than 2**31
_POSITIONS = ("segmented_argmax", "segmented_argmin")


def _without_x64(function: Any, result: Any, shape: tuple[int, ...]) -> Any:
    """A 64-bit result for JAX with x64 off (its default), which would truncate it to 32 bits:
    positions as int32 where every position fits (the axis has fewer than 2**31 elements, as
    ``jnp.argmax`` gives them); anything else (the int64 sums of int32 data, the float64 means of
    integers, a dtype= of 64 bits) raises ``TypeError``: its values may not survive."""
    if getattr(function, "__name__", "") in _POSITIONS and max(shape, default=0) < 2**31:
        return result.astype("int32")
    raise TypeError(
        f"the result is {result.dtype}, which JAX with 64-bit types disabled (jax_enable_x64 off, its "
        f"default) would truncate to 32 bits; enable them (jax.config.update('jax_enable_x64', True)) "
        f"or pass a 32-bit dtype= (the sums of int32 data are int64, the means of integers float64)"
    )
