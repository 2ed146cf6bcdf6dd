"""What this machine has (CuPy with a GPU, torch, CUDA tensors) and the array kinds the tests use.

An array *kind* is ``numpy``, ``torch-cpu`` (host kinds), ``cupy`` or ``torch-cuda`` (GPU
kinds, present only when a GPU is).  :func:`to_kind` makes one from a NumPy array,
:func:`to_numpy` brings any back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from support.dtypes import ml_dtypes, np_dtype, torch


def _cupy_device_count() -> int:
    # cupy may be missing, or present without a driver (it then raises on the first CUDA call)
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


GPU_COUNT = _cupy_device_count()
HAS_CUPY_GPU = GPU_COUNT > 0
HAS_TORCH = torch is not None
HAS_TORCH_CUDA = HAS_TORCH and torch.cuda.is_available()
HAS_GPU = HAS_CUPY_GPU or HAS_TORCH_CUDA

if HAS_CUPY_GPU:
    import cupy
else:
    cupy = None

HOST_KINDS = ("numpy", "torch-cpu") if HAS_TORCH else ("numpy",)
GPU_KINDS = tuple(k for k, ok in (("cupy", HAS_CUPY_GPU), ("torch-cuda", HAS_TORCH_CUDA and HAS_CUPY_GPU)) if ok)
KINDS = HOST_KINDS + GPU_KINDS


def is_gpu_kind(kind: str) -> bool:
    return kind in ("cupy", "torch-cuda")


def is_host_array(x: Any) -> bool:
    if isinstance(x, (np.ndarray, list, tuple)):
        return True
    return HAS_TORCH and isinstance(x, torch.Tensor) and x.device.type == "cpu"


def to_kind(a: Any, kind: str) -> Any:
    """A fresh, C-contiguous array of ``kind`` with the values and dtype of NumPy array ``a``."""
    a = np.asarray(a)
    if kind == "numpy":
        return np.array(a, copy=True)
    if kind in ("torch-cpu", "torch-cuda"):
        if not HAS_TORCH:  # pragma: no cover
            pytest.skip("torch is not installed")
        a = np.array(a, order="C", copy=True)  # (np.ascontiguousarray would make 0-d arrays 1-D)
        t = (
            torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
            if a.dtype.name == "bfloat16"
            else torch.from_numpy(a)
        )
        return t.to("cuda") if kind == "torch-cuda" else t
    if kind == "cupy":
        if a.dtype.name == "bfloat16":
            pytest.skip("CuPy has no bfloat16 dtype")
        return cupy.asarray(a)
    raise ValueError(kind)


def to_numpy(a: Any) -> np.ndarray:
    """A host NumPy copy of any array kind (bfloat16 as an ml_dtypes array)."""
    if isinstance(a, np.ndarray):
        return a
    if HAS_TORCH and isinstance(a, torch.Tensor):
        t = a.detach().cpu().resolve_conj().resolve_neg()
        if t.dtype == torch.bfloat16:
            return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16).reshape(t.shape)
        return t.numpy()
    if cupy is not None and isinstance(a, cupy.ndarray):
        return cupy.asnumpy(a)
    raise TypeError(f"not an array: {type(a).__name__}")


def kind_of(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return "numpy"
    if HAS_TORCH and isinstance(a, torch.Tensor):
        return "torch-cpu" if a.device.type == "cpu" else "torch-cuda"
    if cupy is not None and isinstance(a, cupy.ndarray):
        return "cupy"
    return type(a).__module__ + "." + type(a).__name__


def device_of(a: Any) -> Any:
    if HAS_TORCH and isinstance(a, torch.Tensor):
        return a.device
    if cupy is not None and isinstance(a, cupy.ndarray):
        return a.device.id
    return None


def assert_same_kind(result: Any, x: Any) -> None:
    """The result has the input's array type and device (a silent host fallback fails here)."""
    expected = kind_of(np.asarray(x)) if isinstance(x, (list, tuple)) else kind_of(x)
    assert kind_of(result) == expected, f"result is {kind_of(result)}, input is {expected}"
    assert type(result) is type(x) or isinstance(x, (list, tuple)), f"{type(result)} is not {type(x)}"
    assert device_of(result) == device_of(x), f"result on {device_of(result)}, input on {device_of(x)}"


def xp_of(kind: str) -> Any:
    return cupy if kind == "cupy" else np


def synchronize(kind: str) -> None:
    if kind == "cupy":
        cupy.cuda.get_current_stream().synchronize()
    elif kind == "torch-cuda":
        torch.cuda.synchronize()


def empty_like_kind(kind: str, shape: tuple[int, ...], dtype: str) -> Any:
    """An uninitialized array of ``kind`` (C-contiguous) to pass as ``out``."""
    if kind == "numpy":
        return np.empty(shape, dtype=np_dtype(dtype))
    if kind == "cupy":
        if dtype == "bfloat16":
            pytest.skip("CuPy has no bfloat16 dtype")
        return cupy.empty(shape, dtype=dtype)
    return torch.empty(shape, dtype=getattr(torch, dtype), device="cuda" if kind == "torch-cuda" else "cpu")


class FakeDeviceAdapter:
    """An array adapter for routing tests without a GPU: every array is CuPy's, on device 0,
    C-contiguous, at address 0 (what the GPU kernels' ``serves`` functions ask of it)."""

    kind = "cupy"

    def device_of(self, x: Any) -> int:
        return 0

    def is_c_contiguous(self, x: Any) -> bool:
        return True

    def pointer(self, x: Any) -> int:
        return 0
