"""Offsets checked on the GPU: one kernel over them, one word read back.

``check=True`` must raise before the call returns when the offsets break a rule, so
the host has to learn the verdict: :func:`offsets_ok` launches ``checks.cuh``'s kernel
on the call's stream, which writes into a word of pinned host memory that the device
reads and writes directly (no copy back), then synchronizes that stream once and reads
the word.  That is one pass over the offsets and one synchronization per checked call;
which rule broke, and where, is found only when one did (the callers then compute the
offending index and values for the message).

The word is per thread: a thread's check is over (synchronized) before it returns, so
no two checks share one.  It is allocated by the array library of the call (CuPy's or
PyTorch's pinned allocator), so this module needs only cuda.core to launch.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

from linred.kernels.compiler import get_kernels

__all__ = ["offsets_ok"]

_PROGRAM = '#include "checks.cuh"\n'
_NAMES = ("linred_check_offsets32", "linred_check_offsets64")
_THREADS = 256
#: enough blocks to keep the memory system busy; a grid-stride loop does the rest
_MAX_BLOCKS = 8192


class _Word(threading.local):
    """This thread's pinned word: the buffer that owns it and a ctypes view of it."""

    owner: Any = None
    value: Any = None


_word = _Word()
_streams: dict[int, Any] = {}
_kernels: dict[int, tuple[Any, Any]] = {}


def _pinned_word(pinned_int32: Callable[[], tuple[Any, int]]) -> Any:
    if _word.value is None:
        owner, address = pinned_int32()
        _word.owner, _word.value = owner, ctypes.c_int32.from_address(address)
    return _word.value


def offsets_ok(
    pointer: int, wide: bool, m: int, n: int, device: int, stream: int, pinned_int32: Callable[[], tuple[Any, int]]
) -> bool:
    """Whether the ``m + 1`` contiguous offsets at device address ``pointer`` (int64 if ``wide``,
    else int32) start at 0, never decrease and end at ``n``; checked on ``device`` in stream order
    on ``stream`` (a raw handle), whose work is waited for.

    ``pinned_int32`` allocates 4 bytes of pinned host memory (the first call in a thread) and
    returns the object that owns them and their address.
    """
    from cuda.bindings import driver
    from cuda.core import LaunchConfig, Stream, launch

    kernels = _kernels.get(device)
    if kernels is None:
        kernels = _kernels[device] = get_kernels(device, _PROGRAM, _NAMES)
    s = _streams.get(stream)
    if s is None:
        s = _streams[stream] = Stream.from_handle(stream)
    word = _pinned_word(pinned_int32)
    word.value = 0
    blocks = max(1, min(-(-(m + 1) // _THREADS), _MAX_BLOCKS))
    launch(s, LaunchConfig(grid=blocks, block=_THREADS), kernels[wide], pointer, m, n, ctypes.addressof(word))
    (err,) = driver.cuStreamSynchronize(stream)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"checking the offsets on CUDA device {device} failed: {err}")
    return word.value == 0
