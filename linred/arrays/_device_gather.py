"""Rows of a device array gathered in a given order in one launch: ``gather.cuh``'s kernel.

Unsorted segment ids are reduced by a stable sort of the ids and a gather of the data into their
order (:mod:`linred._segment_ids`).  The array libraries' row gathers are slow for many rows:
on an H200, torch's ``index_select`` of 4M rows of 16 float32 values took 2,438 µs and of 10^6
rows of 64 627 µs, CuPy's ``take`` 451 and 392 (a copy of those bytes: about 130).
:func:`gather_rows` copies words of 16 bytes where the rows' bytes and addresses allow (else 8,
4, 2 or 1), one thread a word, through the driver (its arguments packed once per thread by
:class:`linred.kernels.launch.DriverKernels`).
"""

from __future__ import annotations

from linred.kernels.launch import DriverKernels

__all__ = ["gather_rows"]

_THREADS = 256
#: enough blocks to keep the memory system busy; a grid-stride loop does the rest
_MAX_BLOCKS = 16384
#: the word sizes of the kernels, widest first (their index in the program's names)
_WORDS = (16, 8, 4, 2, 1)

#: the kernels (words of 16 to 1 bytes), five 8-byte arguments: x, order, out, n, words
_kernels = DriverKernels(
    '#include "gather.cuh"\n',
    tuple(f"linred_gather_rows{w}" for w in _WORDS),
    5,
    "the rows' gather",
    "rows on CUDA device %d are gathered by the array library's operation (slower for many rows): "
    "the one-launch gather cannot run there (%s)",
    "gathering rows on CUDA device {device} failed: {err}",
)


def gather_rows(x: int, order: int, out: int, n: int, row_bytes: int, device: int, stream: int) -> bool:
    """Copy row ``order[i]`` of the C-contiguous rows of ``row_bytes`` bytes at device address
    ``x`` into row ``i`` of those at ``out``, for ``i < n`` (``order``: ``n`` int64 positions,
    each a row of ``x``), on ``device`` in stream order on ``stream`` (a raw handle), without
    waiting.  False (nothing launched) where the kernel cannot run on ``device``: the caller then
    takes the array library's gather."""
    if isinstance(_kernels.functions(device), str):
        return False
    which = next(i for i, w in enumerate(_WORDS) if row_bytes % w == 0 and x % w == 0 and out % w == 0)
    words = row_bytes // _WORDS[which]
    total = n * words
    if total:
        blocks = min((total + _THREADS - 1) // _THREADS, _MAX_BLOCKS)
        _kernels.launch(device, which, blocks, _THREADS, 0, stream, x, order, out, n, words)
    return True
