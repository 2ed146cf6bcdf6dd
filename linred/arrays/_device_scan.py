"""Lengths into offsets on the GPU in one pass: ``scan.cuh``'s kernel.

A call with ``lengths=`` on a device needs their offsets, ``[0, cumsum(lengths)]`` in int64.
The array libraries' cumulative sums read and write them more than once where the result goes
into a slice of a larger array (CuPy's ``cumsum(out=)`` scans a copy, then copies it into
``out``: six passes over 8-byte values; PyTorch's needs its first element zeroed apart), which
at 16.7 million segments of 16 float32 values costs 30% of the reduction.  :func:`scan` writes
them with one read of the lengths and one write of the offsets (a decoupled look-back scan).

The buffer it writes into also holds the scan's per-tile state (two 8-byte words and a flag a
tile): allocated with the offsets by the array library, on the call's stream, so that two
scans in flight on two streams never share it; only the flags are cleared (one small memset)
before the kernel.  The kernels are launched through the driver with their arguments packed
once per thread, as :mod:`linred.arrays._device_checks` launches the offsets check.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

from linred.arrays._context import driver as cuda_driver
from linred.arrays._context import on_device
from linred.kernels.compiler import get_kernels

__all__ = ["TILE", "flags", "scan", "words"]

logger = logging.getLogger("linred")

_PROGRAM = '#include "scan.cuh"\n'
_NAMES = ("linred_lengths_to_offsets32", "linred_lengths_to_offsets64")
_THREADS = 256
#: lengths a block scans (SCAN_TILE in scan.cuh)
TILE = 16 * _THREADS

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
            "lengths on CUDA device %d become offsets by the array library's cumulative sum (more passes "
            "over them): the one-pass scan cannot run there (%s)",
            device,
            reason,
        )
        return reason


def scan(lengths: int, wide: bool, m: int, buffer: int, device: int, stream: int) -> bool:
    """Write the offsets of the ``m`` contiguous lengths at device address ``lengths`` (int64 if
    ``wide``, else int32) into the first ``m + 1`` int64 words at ``buffer``, whose next words
    (:func:`words`) hold the scan's state, its flags already zeroed; on ``device``, in stream order
    on ``stream`` (a raw handle), without waiting.  False (nothing launched) where the kernel cannot
    run on ``device``: the caller then takes the array library's cumulative sum."""
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
    args = state.args
    args[0], args[1], args[2], args[3], args[4], args[5] = lengths, m, buffer, sums, sums + 8 * tiles, sums + 16 * tiles
    with on_device(device):
        (err,) = driver.cuLaunchKernel(functions[wide], tiles, 1, 1, _THREADS, 1, 1, 0, stream, state.params, 0)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"turning lengths into offsets on CUDA device {device} failed: {err}")
    return True


def flags(m: int) -> tuple[int, int]:
    """``(first, count)``: the int64 words of :func:`words`'s buffer that hold the flags, which
    must be zeroed before :func:`scan`."""
    tiles = max(1, -(-m // TILE))
    first = m + 1 + 2 * tiles
    return first, -(-tiles // 2)
