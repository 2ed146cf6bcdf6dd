"""Where each segment's extreme first appears, on the GPU, in one NVRTC kernel.

:func:`linred.segmented_argmax` (``argmin``) and the gradient of max and min for PyTorch
need, per (row of the batch, segment, feature), the first position along the axis whose
value is the segment's extreme, given that extreme.  Composed from array operations this is
the extreme spread back to every element, a comparison (two more for NaN), the positions of
the hits as an int64 array the size of the data, and a segmented minimum of it: about ten
launches and three passes over data-sized arrays.  :func:`first_hit` does it in one fill of
the result (``n``: no element) and one kernel (``linred/kernels/arg.cuh``) that reads the
data once and lowers each segment's position by ``atomicMin`` where it meets its extreme: the
smallest position wins whatever order the threads run in, so the result is the same every run.

It serves CuPy arrays and CUDA tensors whose data is C-contiguous and real or integer
(:func:`serves`), with the extreme computed by linred (C-contiguous, the data's dtype), and
segments given as a fixed length or as offsets on the device; lengths are turned into offsets
first.  Anything else, and every call inside ``torch.compile`` (which cannot trace the launch),
is composed as before.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from linred._dtypes import dtype_name
from linred.kernels.compiler import CTYPES
from linred.kernels.launch import PackedLaunch, multiprocessors, thread_launch

__all__ = ["ARG_LOADS", "ARG_ROWS", "first_hit", "serves"]

#: rows of one feature a thread walks, and the loads it keeps in flight (arg.cuh's ARG_ROWS and
#: ARG_LOADS, which the kernel's program defines from these)
ARG_ROWS = 128
ARG_LOADS = 8
THREADS = 256
#: the most blocks per SM a call launches (its threads loop over the rest)
BLOCKS_PER_SM = 32
_SERVED = frozenset(("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
                     "bfloat16", "float32", "float64"))  # fmt: skip

_local = threading.local()  # this thread's launches (PackedLaunch slots are rewritten per call)
_NONE: dict[Any, PackedLaunch] = {}


def serves(adapter: Any, x: Any, dtype: str, backend: Any) -> bool:
    """Whether :func:`first_hit` takes ``x`` (of dtype name ``dtype``) for a call with ``backend``:
    a CuPy array or CUDA tensor (not inside ``torch.compile``, which traces the composition
    instead), C-contiguous, of a dtype with an order (complex numbers have none), the backend
    ``"auto"`` or ``"nvrtc"`` (a call naming another backend has each of its steps done by that
    backend), the nvrtc backend available, and for bfloat16 a GPU of compute capability 8.0 or
    more."""
    if backend not in ("auto", "nvrtc") or dtype not in _SERVED or adapter.kind not in ("cupy", "torch"):
        return False
    if adapter.kind == "torch":
        import torch

        if torch.compiler.is_compiling():  # (traced: the composition's operations go in the graph)
            return False
    if adapter.device_of(x) is None or not adapter.is_c_contiguous(x):
        return False
    from linred.backends import unavailable

    if unavailable("nvrtc") is not None:
        return False
    if dtype == "bfloat16":  # (bfloat16 conversions need compute capability 8.0, as nvrtc's kernels)
        from linred.backends.nvrtc import _compute_capability

        return _compute_capability(adapter.device_of(x)) >= (8, 0)
    return True


def _launch(key: tuple[Any, ...]) -> PackedLaunch:
    """This thread's launch of the kernel for ``key`` (device, data dtype name, offsets dtype name
    or None for a fixed length, ARG_ROWS, ARG_LOADS), compiled and kept."""
    launch = getattr(_local, "launches", _NONE).get(key)
    if launch is not None:
        return launch
    device, dtype, index_dtype, rows, loads = key
    index = "long long" if index_dtype is None else CTYPES[index_dtype]
    bounds = "FixedOffsets{L}" if index_dtype is None else f"ArrayOffsets<{index}>{{offsets}}"
    wrapper = (
        f"#define LINRED_ARG_ROWS {rows}\n#define LINRED_ARG_LOADS {loads}\n"
        f'#include "arg.cuh"\nLINRED_FIRST_HIT({CTYPES[dtype]}, {index}, {bounds})\n'
    )
    return thread_launch(_local, key, device, wrapper, "linred_first_hit", 9)


def first_hit(
    adapter: Any,
    x: Any,
    extreme: Any,
    axis: int,
    segment_length: int | None,
    offsets: Any,
    device: int,
    stream: int,
) -> Any:
    """The first position along ``axis`` of each segment's ``extreme`` in ``x``, as int64 shaped like
    ``extreme``; ``x.shape[axis]`` for an empty segment.

    ``x`` is served (:func:`serves`), ``extreme`` C-contiguous of its dtype; the segments are
    ``segment_length`` (the segments are ``extreme.shape[axis]`` of it; rows past them are not
    looked at) or ``offsets`` (a contiguous int32 or int64 array on ``device``, one more than the
    segments), already checked where they had to be.  Runs on ``stream`` (a raw handle), which
    must be the array library's current stream on ``device`` (the fill of the result is
    enqueued there); the result is on ``device``.
    """
    shape = tuple(x.shape)
    n = shape[axis]
    batch, features = math.prod(shape[:axis]), math.prod(shape[axis + 1 :])
    m = extreme.shape[axis]
    out_shape = tuple(extreme.shape)
    if adapter.kind == "torch":
        import torch

        first = torch.full(out_shape, n, dtype=torch.int64, device=x.device)
    else:
        import cupy

        with cupy.cuda.Device(device):  # (x's device, which need not be the current one)
            first = cupy.full(out_shape, n, dtype=cupy.int64)
    items = batch * -(-n // ARG_ROWS) * features
    if items == 0 or m == 0:
        return first
    if offsets is None:
        index_dtype, offsets_pointer, length = None, 0, int(segment_length)
    else:
        index_dtype, offsets_pointer, length = dtype_name(offsets.dtype), adapter.pointer(offsets), 0
    launch = _launch((device, dtype_name(x.dtype), index_dtype, ARG_ROWS, ARG_LOADS))
    grid = max(1, min(-(-items // THREADS), BLOCKS_PER_SM * multiprocessors(device)))
    launch(stream, grid, THREADS, 0, adapter.pointer(x), adapter.pointer(extreme), adapter.pointer(first),
           offsets_pointer, length, n, m, features, items)  # fmt: skip
    return first
