"""Lengths into offsets on the GPU in one launch: ``scan.cuh``'s kernel.

A call with ``lengths=`` on a device needs their offsets, ``[0, cumsum(lengths)]`` in int64.
The array libraries' cumulative sums cost a call 25-45 µs of host time whatever the number of
lengths (H200 host, 2026-11-30: CuPy's ``cumsum(out=)`` 41-43 µs for 8,192 to 131,072 lengths,
PyTorch's 25-35 µs: several launches and their allocations), which a checked call, waiting for
its verdict, adds to its time.  :func:`scan` writes them with one launch (and a memset of its
flags) through the driver, with its arguments packed once per thread, as
:mod:`linred.arrays._device_checks` launches the offsets check: one read of the lengths and one
write of the offsets (a decoupled look-back scan).  Past :data:`MAX_LENGTHS` lengths the
libraries' scans are as fast or faster on the device (H200, 2026-11-28: 16.7 M lengths, PyTorch's
about 80 µs faster) and their host time is hidden: they keep those.

The buffer it writes into also holds the scan's per-tile state (two 8-byte words and a flag a
tile): allocated with the offsets by the array library, on the call's stream, so that two
scans in flight on two streams never share it; only the flags are cleared (one small memset,
enqueued on the same stream) before the kernel.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

from linred.arrays._context import driver as cuda_driver
from linred.arrays._context import on_device
from linred.kernels.compiler import get_kernels

__all__ = ["MAX_LENGTHS", "TILE", "scan", "serves", "words"]

logger = logging.getLogger("linred")

_PROGRAM = '#include "scan.cuh"\n'
_NAMES = ("linred_lengths_to_offsets32", "linred_lengths_to_offsets64")
_THREADS = 256
#: lengths a block scans (SCAN_TILE in scan.cuh)
TILE = 16 * _THREADS
#: the most lengths :func:`scan` takes (the array libraries' cumulative sums beyond)
MAX_LENGTHS = 1 << 21

_functions: dict[int, tuple[Any, Any] | str] = {}
_driver: Any = None


class _State(threading.local):
    """This thread's packed launch arguments (a launch reads them before it returns)."""

    args: Any = None
    pointers: Any = None
    params: int = 0


_state = _State()


def words(m: int) -> int:
    """The int64 words of the buffer :func:`scan` writes ``m`` lengths' offsets into: the ``m + 1``
    offsets, then two words a tile (its sum and its prefix) and its flag (4 bytes, rounded up)."""
    tiles = max(1, -(-m // TILE))
    return m + 1 + 2 * tiles + -(-tiles // 2)


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
                    raise RuntimeError(f"cannot load the lengths scan: {err}")
                functions.append(function)
            return tuple(functions)
    except Exception as e:  # (cuda.core's errors are not all RuntimeErrors)
        reason = f"{type(e).__name__}: {e}"
        logger.warning(
            "lengths on CUDA device %d become offsets by the array library's cumulative sum (more host "
            "time a call): the one-launch scan cannot run there (%s)",
            device,
            reason,
        )
        return reason


def serves(m: int) -> bool:
    """Whether ``m`` lengths become offsets by :func:`scan` (else the array library's cumsum)."""
    return 0 < m <= MAX_LENGTHS


def scan(lengths: int, wide: bool, m: int, buffer: int, device: int, stream: int) -> bool:
    """Write the offsets of the ``m`` contiguous lengths at device address ``lengths`` (int64 if
    ``wide``, else int32) into the first ``m + 1`` int64 words at ``buffer``, whose next words
    (:func:`words`) hold the scan's state; on ``device``, in stream order on ``stream`` (a raw
    handle), without waiting: the state's flags cleared, then the kernel.  False (nothing
    launched) where the kernel cannot run on ``device``: the caller then takes the array
    library's cumulative sum."""
    functions = _functions.get(device)
    if functions is None:
        functions = _functions[device] = _load(device)
    if isinstance(functions, str):
        return False
    state, driver = _state, _driver
    if state.args is None:
        # Six 8-byte arguments (lengths, m, offsets, sums, prefixes, flags) and their addresses.
        state.args = args = (ctypes.c_int64 * 6)()
        base = ctypes.addressof(args)
        state.pointers = pointers = (ctypes.c_void_p * 6)(*(base + 8 * i for i in range(6)))
        state.params = ctypes.addressof(pointers)
    tiles = max(1, -(-m // TILE))
    sums = buffer + 8 * (m + 1)
    flags = sums + 16 * tiles
    args = state.args
    args[0], args[1], args[2], args[3], args[4], args[5] = lengths, m, buffer, sums, sums + 8 * tiles, flags
    with on_device(device):
        (err,) = driver.cuMemsetD32Async(flags, 0, tiles, stream)
        if err == driver.CUresult.CUDA_SUCCESS:
            (err,) = driver.cuLaunchKernel(functions[wide], tiles, 1, 1, _THREADS, 1, 1, 0, stream, state.params, 0)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"turning lengths into offsets on CUDA device {device} failed: {err}")
    return True
