"""Segment ids into offsets on the GPU in one launch: ``ids.cuh``'s kernel.

A call with ``segment_ids=`` and ``num_segments=`` on a device reduces by offsets: for sorted
ids, the first position of each id.  Built from the array library's operations (a summary of the
ids read back, ``searchsorted`` over ``arange``, a pad with sentinel segments), that cost a small
call 100-150 µs of host time (H200, 2026-11-30: 2,000 x 64 rows in 32 graphs took 174 µs a
checked call, against 34 with ``offsets=``).  :func:`to_offsets` writes the offsets with their
sentinel segments in one launch through the driver (its arguments packed once per thread by
:class:`linred.kernels.launch.DriverKernels`, as for the offsets check), and tests the ids' rules
on the way (an id outside ``[0, num_segments)``, ids out of order) into this thread's check word,
which a checked call reads after one wait for its stream.

The offsets are allocated by the array library on the call's stream; every value the kernel
writes lies in ``[0, n]`` whatever the ids, so a reduction that reads them never leaves the data.
"""

from __future__ import annotations

from linred.kernels.launch import DriverKernels

__all__ = ["OUTSIDE", "UNSORTED", "to_offsets"]

_THREADS = 256
#: enough blocks to keep the memory system busy; a grid-stride loop does the rest
_MAX_BLOCKS = 4096
#: the bits the kernel sets in the check word
OUTSIDE, UNSORTED = 1, 1 << 8

#: the kernels (int32 and int64 ids), five 8-byte arguments: ids, n, ns, padded, word
_kernels = DriverKernels(
    '#include "ids.cuh"\n',
    ("linred_ids_to_offsets32", "linred_ids_to_offsets64"),
    5,
    "the ids' conversion",
    "segment ids on CUDA device %d become offsets by the array library's operations (more host "
    "time a call): the one-launch conversion cannot run there (%s)",
    "turning segment ids into offsets on CUDA device {device} failed: {err}",
)


def to_offsets(ids: int, wide: bool, n: int, ns: int, padded: int, word: int, device: int, stream: int) -> bool:
    """Write the offsets of the ``n`` contiguous ids at device address ``ids`` (int64 if ``wide``,
    else int32) for ``ns`` segments into the ``ns + 3`` int64 words at ``padded``: ``[0, first
    position of id 0, ..., of id ns, n]`` (for sorted ids, segments 0 .. ns - 1 framed by two
    sentinel segments); where ``word`` (a check word's address) is not 0, a broken rule's bits
    stored into it (:data:`OUTSIDE`, :data:`UNSORTED`: a byte each, so that threads finding
    broken rules together leave every rule's bit).  On
    ``device``, in stream order on ``stream`` (a raw handle), without waiting.  False (nothing
    launched) where the kernel cannot run on ``device``: the caller then takes the array
    library's operations."""
    if isinstance(_kernels.functions(device), str):
        return False
    blocks = min(max(n, ns + 3) // _THREADS + 1, _MAX_BLOCKS)
    _kernels.launch(device, wide, blocks, _THREADS, 0, stream, ids, n, ns, padded, word)
    return True
