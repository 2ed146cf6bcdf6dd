"""Lengths into offsets on the GPU in one launch: ``scan.cuh``'s kernel.

A call with ``lengths=`` on a device needs their offsets, ``[0, cumsum(lengths)]`` in int64.
The array libraries' cumulative sums cost a call 25-45 µs of host time whatever the number of
lengths (H200 host, 2026-11-30: CuPy's ``cumsum(out=)`` 41-43 µs for 8,192 to 131,072 lengths,
PyTorch's 25-35 µs: several launches and their allocations), which a checked call, waiting for
its verdict, adds to its time.  :func:`scan` writes them with one launch (and a memset of its
flags) through the driver, with its arguments packed once per thread
(:class:`linred.kernels.launch.DriverKernels`, as for the offsets check): one read of the lengths
and one write of the offsets (a decoupled look-back scan).  Past :data:`MAX_LENGTHS` lengths the
libraries' scans are as fast or faster on the device (H200, 2026-11-28: 16.7 M lengths, PyTorch's
about 80 µs faster) and their host time is hidden: they keep those.

The buffer it writes into also holds the scan's per-tile state (two 8-byte words and a flag a
tile): allocated with the offsets by the array library, on the call's stream, so that two
scans in flight on two streams never share it; only the flags are cleared (one small memset,
enqueued on the same stream) before the kernel.
"""

from __future__ import annotations

from linred.arrays._context import driver as cuda_driver
from linred.arrays._context import on_device
from linred.kernels.launch import DriverKernels

__all__ = ["MAX_LENGTHS", "TILE", "scan", "serves", "words"]

_THREADS = 256
#: lengths a block scans (SCAN_TILE in scan.cuh)
TILE = 16 * _THREADS
#: the most lengths :func:`scan` takes (the array libraries' cumulative sums beyond)
MAX_LENGTHS = 1 << 21

#: the kernels (int32 and int64 lengths), six 8-byte arguments: lengths, m, offsets, sums,
#: prefixes, flags
_kernels = DriverKernels(
    '#include "scan.cuh"\n',
    ("linred_lengths_to_offsets32", "linred_lengths_to_offsets64"),
    6,
    "the lengths scan",
    "lengths on CUDA device %d become offsets by the array library's cumulative sum (more host "
    "time a call): the one-launch scan cannot run there (%s)",
    "turning lengths into offsets on CUDA device {device} failed: {err}",
)


def words(m: int) -> int:
    """The int64 words of the buffer :func:`scan` writes ``m`` lengths' offsets into: the ``m + 1``
    offsets, then two words a tile (its sum and its prefix) and its flag (4 bytes, rounded up)."""
    tiles = max(1, -(-m // TILE))
    return m + 1 + 2 * tiles + -(-tiles // 2)


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
    if isinstance(_kernels.functions(device), str):
        return False
    driver = cuda_driver()
    tiles = max(1, -(-m // TILE))
    sums = buffer + 8 * (m + 1)
    prefixes = sums + 8 * tiles
    flags = prefixes + 8 * tiles
    with on_device(device):
        (err,) = driver.cuMemsetD32Async(flags, 0, tiles, stream)
        if err == driver.CUresult.CUDA_SUCCESS:
            err = _kernels.enqueue(device, wide, tiles, _THREADS, 0, stream, lengths, m, buffer, sums, prefixes, flags)
    _kernels.check(device, err)
    return True
