"""Segment ids into offsets on the GPU in one launch: ``ids.cuh``'s kernel.

A call with ``segment_ids=`` and ``num_segments=`` on a device reduces by offsets: for sorted
ids, the first position of each id.  Built from the array library's operations (a summary of the
ids read back, ``searchsorted`` over ``arange``, a pad with sentinel segments), that cost a small
call 100-150 µs of host time (H200, 2026-11-30: 2,000 x 64 rows in 32 graphs took 174 µs a
checked call, against 34 with ``offsets=``).  :func:`to_offsets` writes the offsets with their
sentinel segments in one launch through the driver (its arguments packed once per thread, as
:mod:`linred.arrays._device_checks` launches the offsets check), and tests the ids' rules on the
way (an id outside ``[0, num_segments)``, ids out of order) into this thread's check word, which
a checked call reads after one wait for its stream.

The offsets are allocated by the array library on the call's stream; every value the kernel
writes lies in ``[0, n]`` whatever the ids, so a reduction that reads them never leaves the data.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

from linred.arrays._context import driver as cuda_driver
from linred.arrays._context import on_device
from linred.kernels.compiler import get_kernels

__all__ = ["OUTSIDE", "UNSORTED", "to_offsets"]

logger = logging.getLogger("linred")

_PROGRAM = '#include "ids.cuh"\n'
_NAMES = ("linred_ids_to_offsets32", "linred_ids_to_offsets64")
_THREADS = 256
#: enough blocks to keep the memory system busy; a grid-stride loop does the rest
_MAX_BLOCKS = 4096
#: the bits the kernel sets in the check word
OUTSIDE, UNSORTED = 1, 2

_functions: dict[int, tuple[Any, Any] | str] = {}
_driver: Any = None


class _State(threading.local):
    """This thread's packed launch arguments (a launch reads them before it returns)."""

    args: Any = None
    pointers: Any = None
    params: int = 0


_state = _State()


def _load(device: int) -> tuple[Any, Any] | str:
    """The kernels on ``device`` as driver functions, or why they cannot be had."""
    global _driver
    try:
        _driver = driver = cuda_driver()
        kernels = get_kernels(device, _PROGRAM, _NAMES)
        with on_device(device):
            functions = []
            for k in kernels:
                err, function = driver.cuKernelGetFunction(k.handle)
                if err != driver.CUresult.CUDA_SUCCESS:
                    raise RuntimeError(f"cannot load the ids' conversion: {err}")
                functions.append(function)
            return tuple(functions)
    except Exception as e:  # (cuda.core's errors are not all RuntimeErrors)
        reason = f"{type(e).__name__}: {e}"
        logger.warning(
            "segment ids on CUDA device %d become offsets by the array library's operations (more host "
            "time a call): the one-launch conversion cannot run there (%s)",
            device,
            reason,
        )
        return reason


def to_offsets(ids: int, wide: bool, n: int, ns: int, padded: int, word: int, device: int, stream: int) -> bool:
    """Write the offsets of the ``n`` contiguous ids at device address ``ids`` (int64 if ``wide``,
    else int32) for ``ns`` segments into the ``ns + 3`` int64 words at ``padded``: ``[0, first
    position of id 0, ..., of id ns, n]`` (for sorted ids, segments 0 .. ns - 1 framed by two
    sentinel segments); where ``word`` (a check word's address) is not 0, a broken rule's bits
    stored into it (:data:`OUTSIDE`, :data:`UNSORTED`: with several threads finding broken rules,
    one thread's bits, never 0; :data:`UNSORTED` alone does not say the ids are in range).  On
    ``device``, in stream order on ``stream`` (a raw handle), without waiting.  False (nothing
    launched) where the kernel cannot run on ``device``: the caller then takes the array
    library's operations."""
    functions = _functions.get(device)
    if functions is None:
        functions = _functions[device] = _load(device)
    if isinstance(functions, str):
        return False
    state, driver = _state, _driver
    if state.args is None:
        # Five 8-byte arguments (ids, n, ns, padded, word) and their addresses.
        state.args = args = (ctypes.c_int64 * 5)()
        base = ctypes.addressof(args)
        state.pointers = pointers = (ctypes.c_void_p * 5)(*(base + 8 * i for i in range(5)))
        state.params = ctypes.addressof(pointers)
    args = state.args
    args[0], args[1], args[2], args[3], args[4] = ids, n, ns, padded, word
    blocks = min(max(n, ns + 3) // _THREADS + 1, _MAX_BLOCKS)
    with on_device(device):
        (err,) = driver.cuLaunchKernel(functions[wide], blocks, 1, 1, _THREADS, 1, 1, 0, stream, state.params, 0)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"turning segment ids into offsets on CUDA device {device} failed: {err}")
    return True
