"""var and std of long segments on the GPU, from the moments of pieces of them.

The softmax family's kernel (:mod:`linred._softmax_kernel`) reads each segment with one worker
(a group of a warp's lanes, a warp, or a thread per feature), so it serves only calls whose
segments make enough workers to fill the GPU and are no longer than
:data:`~linred._softmax_kernel.MAX_MEAN_ROWS` rows on average.  Fewer, longer segments (a
variance per sequence of 10^6 values, say) went to the composition: the mean, the deviations
written out, their squares, their sum, six passes over the data (64M float32 values in one to
1,024 segments took 520-580 us on an H200, ``torch.var`` of the same rows 95-100).

Here each segment is cut into pieces at the multiples of a piece length ``P`` (rows that give each
lane of the kernel's workers about :data:`LANE_VALUES` values, fewer where the GPU would not be
filled), in three launches and no host synchronization (``linred/kernels/pieces.cuh``):

1. ``linred_pieces_bounds``: the segments' bounds and the multiples of ``P`` inside the axis
   merged into one sorted list (``m + ceil(n / P) - 1`` pieces, an empty segment one empty
   piece), and where each segment's bounds lie in it;
2. the softmax family's kernel reads every piece once for its moments (``SOFTMAX_MOMENTS``: its
   mean and sum of squared deviations, in float64; float64 data, or a float64 result, by the
   mean's pass and the deviations');
3. ``linred_pieces_join``: a warp per (row of the batch, segment, feature) joins its pieces'
   moments (a block, ``linred_pieces_join_block``, where segments hold many pieces) by the
   parallel formula of Chan, Golub and LeVeque (``M2 = M2_a + M2_b + d^2 n_a n_b / n``; no
   ``E[x^2] - E[x]^2``), in a fixed order (the same bits every run), and writes var or std.

The results are the composition's for every value: NaN where a segment holds a NaN or an
infinity or is no longer than ``ddof``.  A checked call's segments are checked first (the
documented ``ValueError``, before any kernel).
"""

from __future__ import annotations

import math
import threading
from typing import Any

from linred import _softmax_kernel
from linred._dtypes import dtype_name, itemsize
from linred.kernels.compiler import CTYPES
from linred.kernels.launch import PackedLaunch, multiprocessors, thread_launch
from linred.segments import FixedSegments, parse_segments

__all__ = ["run", "serves"]

#: the values of a piece each lane of the kernel's workers reads, about: a warp reads 32 times as
#: many (rows of a power of two up to 32 features), a thread per feature this many rows
LANE_VALUES = 128
#: the shortest pieces (rows)
SHORTEST = 32
#: the workers a multiprocessor the pieces are cut to give at least, where they can (the kernel
#: serves a call whatever its lengths from :data:`linred._softmax_kernel.MIN_WORKERS_PER_SM`)
WORKERS_PER_SM = 4 * _softmax_kernel.MIN_WORKERS_PER_SM
#: the most values each lane of the kernel's workers reads, on average, in calls the kernel
#: serves that are not cut into pieces: a thread per feature of 64 features read 16,384 rows in
#: 640-670 us against 200-220 for the pieces of 10^6 x 64 float32 values in 8 segments (H200)
LONG_LANE_VALUES = 8 * LANE_VALUES
#: linred_pieces_join_block's threads, which join the pieces of segments of more than
#: :data:`BLOCK_JOIN_PIECES` on average (a warp's lanes each joined their share four round
#: trips at a time: one segment of 16,384 pieces kept one warp busy for 500 us; a warp's lanes
#: now have eight in flight)
BLOCK_THREADS = 512
BLOCK_JOIN_PIECES = 64
#: whether calls the kernel does not serve for their segments' count or lengths are cut into
#: pieces (False: the composition, as before; tests and benchmarks compare the two)
ENABLED = True


def _piece_rows(batch: int, n: int, features: int, device: int) -> int:
    """The piece length (rows): :data:`LANE_VALUES` a lane, fewer where the pieces would make
    fewer than :data:`WORKERS_PER_SM` workers a multiprocessor (a worker a piece of a power of
    two up to 32 features, else a piece and a feature), down to :data:`SHORTEST`."""
    warps = _softmax_kernel.warp_workers(features)
    rows = LANE_VALUES * 32 // features if warps else LANE_VALUES
    per_piece = batch * (1 if warps else features)
    want = WORKERS_PER_SM * multiprocessors(device)
    while rows > SHORTEST and per_piece * -(-n // rows) < want:
        rows //= 2
    return max(rows, SHORTEST)


def serves(name: str, x: Any, adapter: Any, in_name: str, result: str, segments: dict[str, Any], backend: Any,
           grad: bool, check: Any, axis: int) -> bool:  # fmt: skip
    """Whether :func:`run` computes ``name`` (var or std) of ``x``: a call the kernel would serve
    but for its segments' count or lengths (:func:`linred._softmax_kernel.eligible`), or whose
    workers would each read more than :data:`LONG_LANE_VALUES` values a lane; whose rows are
    longer than a piece, and whose pieces the kernel serves."""
    if not (ENABLED and name in _softmax_kernel.VARIANCE):
        return False
    if not _softmax_kernel.eligible(name, x, adapter, in_name, result, segments, backend, grad, check):
        return False
    shape = tuple(x.shape)
    n, batch, features = shape[axis], math.prod(shape[:axis]), math.prod(shape[axis + 1 :])
    m = _softmax_kernel.count(x, axis, segments)
    if m is None or m <= 0 or not n or not batch * features:  # (empty offsets: -1 segments; raised elsewhere)
        return False
    device = adapter.device_of(x)
    rows = _piece_rows(batch, n, features, device)
    if n <= rows:
        return False
    warps = _softmax_kernel.warp_workers(features)
    lane_values = n / m * (features / 32 if warps else 1)  # (what each lane of the kernel's workers reads)
    if lane_values <= LONG_LANE_VALUES and _softmax_kernel.enough_workers_for(
        batch, n, features, m, device, name, x.dtype.itemsize
    ):
        return False  # (the kernel serves the call, its workers each reading a segment)
    # (the pieces as the kernel would see them: their count is known without reading the offsets)
    pieces = m + -(-n // rows) - 1
    return _softmax_kernel.enough_workers_for(batch, n, features, pieces, device, "segmented_var", x.dtype.itemsize)


_local = threading.local()  # this thread's launches (PackedLaunch slots are rewritten per call)


def _launches(device: int, index: Any, result: str, root: bool) -> tuple[PackedLaunch, ...]:
    """This thread's launches of linred_pieces_bounds, linred_pieces_join and
    linred_pieces_join_block for offsets of dtype
    ``index`` (None: a fixed length), a ``result`` dtype name and std (``root``), compiled once."""
    key = (device, index, result, root)
    found = getattr(_local, "launches", {}).get(key)
    if found is None:
        ctype = "long long" if index is None else CTYPES[dtype_name(index)]
        bounds = "FixedOffsets{L}" if index is None else f"ArrayOffsets<{ctype}>{{offsets}}"
        source = (
            f'#include "pieces.cuh"\nLINRED_PIECES({ctype}, {bounds}, {CTYPES[result]}, {str(root).lower()}, '
            f"{BLOCK_THREADS})\n"
        )
        found = (
            thread_launch(_local, ("bounds", *key), device, source, "linred_pieces_bounds", 8),
            thread_launch(_local, ("join", *key), device, source, "linred_pieces_join", 8),
            thread_launch(_local, ("join_block", *key), device, source, "linred_pieces_join_block", 8),
        )
        _local.launches[key] = found
    return found


def run(name: str, x: Any, adapter: Any, axis: int, result: str, segments: dict[str, Any], device: int, check: bool,
        stream: int, ddof: float) -> Any:  # fmt: skip
    """``name`` (var or std) of ``x`` along ``axis`` from the moments of pieces (see the module
    docstring), on ``stream`` (a raw handle); ``segments``: the call's segment keywords, offsets
    and lengths already on the device (checked here when ``check``: the documented errors, before
    any kernel)."""
    shape = tuple(x.shape)
    n, batch, features = shape[axis], math.prod(shape[:axis]), math.prod(shape[axis + 1 :])
    seg = parse_segments(segments.get("segment_length"), segments.get("offsets"), segments.get("lengths"), n=n,
                         axis=axis, adapter=adapter, device=device, check=check)  # fmt: skip
    m = seg.count
    rows = _piece_rows(batch, n, features, device)
    inner = -(-n // rows) - 1  # the multiples of rows strictly inside (0, n)
    fixed = isinstance(seg, FixedSegments)
    bounds, join, join_block = _launches(device, None if fixed else seg.offsets.dtype, result, name == "segmented_std")
    int64 = adapter.allocator("int64", device)
    merged, places = int64((m + 1 + inner,)), int64((m + 1,))
    if not check:
        # (unchecked offsets that decrease leave some bounds unwritten and write others twice: zeros
        # there keep every piece inside the data, its results undefined, as for any broken offsets)
        adapter.fill(merged, 0, stream)
    offsets = 0 if fixed else adapter.pointer(seg.offsets)
    threads, most = 256, 16 * multiprocessors(device)  # (threads a block; blocks at most)
    grid = max(1, min(-(-(m + 1 + inner) // threads), most))
    bounds(stream, grid, threads, 0, offsets, seg.length if fixed else 0, n, m, rows, inner, adapter.pointer(merged),
           adapter.pointer(places))  # fmt: skip
    # Each piece's moments in one read (float16, bfloat16 and float32 data, a result of that width),
    # or by the mean's pass and the deviations' (float64)
    mode = "segmented_moments" if x.dtype.itemsize < 8 and itemsize(result) < 8 else "segmented_moments_exact"
    moments = _softmax_kernel.run(mode, x.reshape(batch, n, features), adapter, 1, "float64", "float64",
                                  {"offsets": merged}, device, False, stream)  # fmt: skip
    out = adapter.allocator(result, device)((*shape[:axis], m, *shape[axis + 1 :]))
    joins = batch * m * features  # (a warp, or a block, each)
    if joins:
        args = (adapter.pointer(moments), adapter.pointer(merged), adapter.pointer(places), adapter.pointer(out),
                batch, m, features, _softmax_kernel.ddof_word(ddof))  # fmt: skip
        if m + inner > BLOCK_JOIN_PIECES * m:
            join_block(stream, max(1, min(joins, most)), BLOCK_THREADS, 0, *args)
        else:
            join(stream, max(1, min(-(-joins * 32 // threads), most)), threads, 0, *args)
    return out
