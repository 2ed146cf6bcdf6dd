"""Segmented logsumexp, softmax, log_softmax, var and std of CUDA arrays as one NVRTC kernel.

:mod:`linred._fused` composes these functions from linred's reductions and the array
library's elementwise operations: four to six launches, an element -> segment index for
variable segments, and the per-segment values gathered back to the elements.  On a GPU,
where a call is mostly those launches, :func:`run` does the same in one kernel
(``linred/kernels/softmax.cuh``): each (row of the batch, segment) reads its segment for the
maximum, again for the sum of ``exp(x - shift)`` (mostly from L1/L2) and, for softmax and
log_softmax, a third time to write each element, with the composition's results for every
value (NaN, infinities, empty segments); for var and std of float16, bfloat16 and float32 data
with a result of that width it reads each segment once, summing its deviations from its first
value and their squares in float64, and for float64 it reads each segment for its mean, then
again for the squared deviations from it.

A worker is a group of a warp's lanes (a warp for long segments, as few as 2 lanes for short
ones, chosen by the mean length: :func:`_workers`) or one thread per feature, so a segment is
read by one worker: the kernel serves only calls with enough workers to fill the GPU
(:data:`MIN_WORKERS_PER_SM` per SM) and segments no longer than :data:`MAX_MEAN_ROWS` rows on
average; fewer, longer segments go to the composition, whose reductions spread a segment over
the whole GPU.  One segment far longer than the others would keep its worker busy alone: the
warps list segments longer than :data:`LONG_ROWS` rows instead (:class:`_LongList`), and a
second kernel, ``linred_softmax_long``, reads each with a whole block.  Checked calls (the
default) wait for their kernel anyway: they list wherever a segment can be that long and launch
the second kernel only where the first noted a listed segment (and their backward then takes
the per-segment values, :func:`listed_last`); unchecked calls list from :data:`LONG_MIN_VALUES`
values, launching both kernels (smaller unchecked calls, calls captured into a CUDA graph,
logsumexp's warps per segment in calls of :data:`RUNS_MIN_VALUES` values or more and a thread
per feature of several still read such a segment with one worker).  16-bit data of
one feature in long segments is read two rows a load (:data:`PAIRS`).

The backward (:func:`run_backward`, ``softmax_grad.cuh``) has the same workers; for one feature
column whose segments they would each read alone, or long on average
(:data:`GRAD_PARTS_MIN_MEAN`), :func:`run_grad_from_parts` writes the derivative from
per-segment values that linred's reductions computed (``linred._fused_grad``).

logsumexp, softmax and log_softmax of one feature column computed in float32, in segments of
:data:`LSE_RUNS_MIN_MEAN` rows or more on average (whatever their count or longest; more for
the softmaxes and 16-bit data), in large calls or calls the workers do not serve, go instead
to the kernel of linred's variable-length sums, ``warp_reduce``, with ``lse.cuh``'s accumulator
(:func:`_by_runs`): a segment is read by as many warps as it spans; softmax and log_softmax then
read the data again (``softmax_from_parts``).

It serves what the composition would otherwise compute without a gradient to record:
CuPy arrays and CUDA tensors (not requiring grad, or under ``torch.no_grad``), C-contiguous,
float16, bfloat16 (on GPUs of compute capability 8.0 or more), float32 or float64, segments
given as one of ``segment_length``, ``offsets`` or ``lengths``, ``check`` a bool, with
``backend`` ``"auto"`` or ``"nvrtc"`` and the nvrtc backend available.
Anything else (segment ids, autograd, strided views, integer data) is composed as before.
``check=True`` is done by the kernel as it reads each segment's bounds (``checked_bounds``),
with one wait for the stream after it, as for the feature-rows reductions.
"""

from __future__ import annotations

import math
import operator
import struct
import threading
from typing import Any

from linred._dtypes import HALF, REAL, dtype_name, itemsize
from linred.arrays import _device_checks
from linred.backends.base import INT32_MAX
from linred.kernels.compiler import CTYPES
from linred.kernels.launch import PackedLaunch, multiprocessors, thread_launch
from linred.segments import FixedSegments, explain, parse_lengths, parse_offsets, parse_segments, verify

__all__ = ["run", "serves"]

#: the kernel's MODE for each function (softmax.cuh)
MODES = {"segmented_logsumexp": 0, "segmented_softmax": 1, "segmented_log_softmax": 2, "segmented_var": 3,
         "segmented_std": 4, "segmented_moments": 5, "segmented_moments_exact": 6}  # fmt: skip
#: the functions computed in float64 whatever the data
VARIANCE = ("segmented_var", "segmented_std")
#: each segment's mean and sum of squared deviations from it (two float64 values a segment and
#: feature: the result's last axis), for var and std of long segments cut into pieces
#: (:mod:`linred._pieces`): by one pass over 16-bit and float32 data (the first), or by the
#: mean's pass and the deviations' (the second: float64 data or a float64 result)
MOMENTS = ("segmented_moments", "segmented_moments_exact")
#: the functions whose result has one value per segment (the others: one per element)
PER_SEGMENT = ("segmented_logsumexp", *VARIANCE, *MOMENTS)
THREADS = 256
#: the most blocks per SM a call launches (its workers loop over the rest)
BLOCKS_PER_SM = 64
#: the workers (segments, or segments x features) per SM from which the kernel serves a call
#: whatever their lengths: one warp reads about a cache line per load in flight, so the GPU's
#: bandwidth needs thousands of them
MIN_WORKERS_PER_SM = 16
#: with fewer workers, the most values one lane reads (each pass) for the kernel to serve the call:
#: the composition's dozen launches cost 250-350 us of host time on an H200's host, and the
#: kernel took 64-125 us at 2,000-2,000,000 float32 values in 10-2,000 segments; at 500 values a
#: lane it was 0.6-1.1x the composition at 16M values in 1,000 segments and 2-5x faster at 2M x 8
#: in 1,000 (docs/performance.md, sixteenth run)
FEW_WORKERS_LANE_VALUES = 512
#: the longest mean segment (rows) the kernel serves
MAX_MEAN_ROWS = 1 << 14
#: whether a warp's lanes read float16 and bfloat16 data of one feature two rows at a time (one
#: 4-byte load, and one store of two results), where the data (and a per-element result) are
#: aligned for it; False reads a row at a time (tests and benchmarks compare the two)
PAIRS = True
#: ... where the segments hold this many rows on average: a segment that starts at an odd row
#: begins with a partial step, and a pair that straddles a bound is masked, which costs more than
#: the loads save in short segments (H200, 64M float16 values: at mean 4,096 rows softmax 150 against
#: 171 us, log_softmax 143 against 182, logsumexp 76 against 83; at 1,024 and 2,048 within the
#: noise either way; at 256, 1.5x slower)
PAIRS_MIN_ROWS = 4096
#: a worker's lanes for one feature column or a power of two of them (None: chosen by the mean
#: segment length, :func:`_workers`); a power of two up to 32 forces it, and the workers' kernel
#: for logsumexp too (:data:`LSE_RUNS`; tests and benchmarks)
GROUP: int | None = None
#: the values of a segment each lane of a worker reads, about, and the fewest lanes of a worker
#: whose segments hold more than 8 values, by function (else 16 and 2): the lanes per worker that
#: ran fastest on an H200 at mean lengths of 4 to 256 rows of one feature and 16 and 64 rows of 8
#: (64M and 8M x 8 float32 values; docs/performance.md, seventeenth run); softmax and
#: log_softmax, which read a segment three times and write it, run faster with more lanes
LANES = {"segmented_softmax": (8, 4), "segmented_log_softmax": (8, 4)}
#: the values of a segment each lane of the backward kernel's workers reads, about, for every
#: function (its passes are a lane's rows one at a time: at mean 256 rows, logsumexp's backward
#: took 170 us with a warp per segment against 195 with 16 lanes; H200, seventeenth run)
BACKWARD_LANE_VALUES = 8
#: whether logsumexp, softmax and log_softmax of one feature column, computed in float32, are read
#: by ``warp_reduce`` where their rows are whole 16-byte vectors (each as far past a 16-byte
#: boundary: read from it) and their segments long on average
#: (:func:`_by_runs`); False leaves every call to the workers (or, past :data:`MAX_MEAN_ROWS`, to
#: the composition), as :data:`GROUP` set does (tests and benchmarks compare the two)
LSE_RUNS = True
#: ... from this many rows a segment on average.  H200, 64M float32 values, logsumexp (device us,
#: the workers (or the composition) -> warp_reduce; docs/performance.md, eighteenth run): mean 1,024
#: rows 83 -> 128, 2,048 128 -> 128, 4,096 156 -> 99, 8,192 174 -> 109, 16,384 928 -> 108, 2^20
#: 3,676 -> 89; but mean 16 150 -> 216, and 16 with one segment of 641,841 rows 1,874 -> 212:
#: warp_reduce issues 2.4 times the instructions of its sums per value (ncu) and is bound by them,
#: where the workers read a segment's rows in whole steps, but one worker reads a long segment
#: alone
LSE_RUNS_MIN_MEAN = 2048
#: ... for 16-bit data: the workers' kernel reads it two rows a load in segments of 4,096 rows or
#: more (PAIRS), and warp_reduce issues as many instructions per value as for float32 (H200, 64M
#: float16 values, logsumexp: mean 4,096 rows 93 -> 114 us, 8,192 106 -> 113, 16,384 1,122 -> 109)
LSE_RUNS_MIN_MEAN_16BIT = 16384
#: ... for softmax and log_softmax of data of 4 or 8 bytes, which read the data twice from memory
#: there (H200, 64M float32 values, softmax: mean 4,096 rows 291 -> 286 us, 8,192 336 -> 266)
SOFTMAX_RUNS_MIN_MEAN = 8192
#: ... and in calls of at least this many values, or calls the workers' kernel does not serve (too
#: few workers, or segments past MAX_MEAN_ROWS): warp_reduce's launches (two or three kernels, and
#: an event) cost host time that a small call waits for (H200, float32 values in segments of 4,096,
#: logsumexp: 8M 51 -> 65 us a call, 16M 51 -> 65, 32M 85 -> 68; softmax 4M 51 -> 138, 32M 162 -> 170)
RUNS_MIN_VALUES = 1 << 25
#: the functions warp_reduce serves (:func:`_by_runs`): logsumexp, and softmax and log_softmax of
#: its parts (each segment's maximum and sum of exps) by a second read (:func:`_from_parts`)
RUNS = ("segmented_logsumexp", "segmented_softmax", "segmented_log_softmax")
#: the longest mean segment, as a share of a warp's loop step of rows (8 steps of 32 / D; 4 for
#: 8-byte data in the forward), that workers of fewer lanes than a warp serve: the kernels hand a
#: segment longer than that step to the whole warp, and where many are, that costs more than the
#: groups save (H200, seventeenth run: mean 256 rows, logsumexp 130 us with 16 lanes against 100
#: with a warp; at means of 16 and 64 rows the groups were 1.7-7.8x faster than a warp)
WHOLE_WARP_SHARE = 0.75

_DOUBLE, _DOUBLE_BITS = struct.Struct("<d"), struct.Struct("<q")
_local = threading.local()  # this thread's launches (PackedLaunch slots are rewritten per call)


def forget_listed() -> None:
    """Clear what :func:`listed_last` says (before a call whose answer is wanted)."""
    _local.listed = False


def listed_last() -> bool:
    """Whether a checked call of this thread since :func:`forget_listed` had its kernel list a
    very long segment (known from its note: the backward of the same segments then takes the
    route that spreads a segment over the GPU, ``linred._fused_grad``).  Unchecked calls, which
    launch the second kernel without knowing, never set it."""
    return getattr(_local, "listed", False)


_NONE: dict[Any, PackedLaunch] = {}  # (the launches of a thread that has none yet)


def _offsets_arguments(index: str | None) -> tuple[str, str]:
    """The C type of the offsets of dtype name ``index`` (None: a fixed length) and the kernels'
    OFFSETS argument: ArrayOffsets over the array, or FixedOffsets{L}."""
    if index is None:
        return "long long", "FixedOffsets{L}"
    ctype = CTYPES[index]
    return ctype, f"ArrayOffsets<{ctype}>{{offsets}}"


def ddof_word(ddof: float) -> int:
    """var's and std's ``ddof`` as the kernels read it: the bits of a double (0 for 0)."""
    return _DOUBLE_BITS.unpack(_DOUBLE.pack(float(ddof)))[0] if ddof else 0


def _chunk_grid(batch: int, n: int, chunk: int, device: int) -> int:
    """Blocks for a walk over chunks of ``chunk`` values of ``batch`` rows of ``n``
    (segment_chunks): one a chunk, at most BLOCKS_PER_SM a multiprocessor."""
    return max(1, min(batch * -(-n // chunk), BLOCKS_PER_SM * multiprocessors(device)))


def serves(
    name: str, x: Any, adapter: Any, in_name: str, result: str, segments: dict[str, Any], backend: Any, grad: bool,
    check: Any, axis: int = 0,
) -> bool:  # fmt: skip
    """Whether :func:`run` computes ``name`` of ``x`` along ``axis`` (normalized; see the module
    docstring).  Calls it does not serve go to the composition (or, var and std of long
    segments, to :mod:`linred._pieces`), which also raises the errors of bad arguments (two
    segment arguments or none, a ``check`` that is not a bool)."""
    if not eligible(name, x, adapter, in_name, result, segments, backend, grad, check):
        return False
    runs = _takes_runs(name, x, adapter, result, axis, segments, adapter.device_of(x))  # (any long mean length)
    return runs or _enough_workers(x, axis, segments, adapter.device_of(x), name, itemsize=itemsize(in_name))


def eligible(
    name: str, x: Any, adapter: Any, in_name: str, result: str, segments: dict[str, Any], backend: Any, grad: bool,
    check: Any,
) -> bool:  # fmt: skip
    """Whether the kernel computes ``name`` of ``x`` where its segments make enough workers, of
    lengths it serves (:func:`serves` asks both)."""
    if name not in MODES or grad or backend not in ("auto", "nvrtc") or in_name not in REAL or type(check) is not bool:
        return False
    if adapter.kind not in ("cupy", "torch") or adapter.device_of(x) is None or not adapter.is_c_contiguous(x):
        return False
    keys = ("segment_length", "offsets", "lengths", "segment_ids", "num_segments")
    given = [k for k in keys if segments.get(k) is not None]
    if len(given) != 1 or given[0] not in ("segment_length", "offsets", "lengths"):
        return False
    from linred.backends import unavailable

    if unavailable("nvrtc") is not None:
        return False
    if name in VARIANCE and in_name == "float64" and result != "float64":
        # (the composition computes in the narrower dtype, the kernel would read float64 values)
        return False
    if "bfloat16" in (in_name, result):  # (bfloat16 conversions need compute capability 8.0, as nvrtc's kernels)
        from linred.backends.nvrtc import _compute_capability

        return _compute_capability(adapter.device_of(x)) >= (8, 0)
    return True


def count(x: Any, axis: int, segments: dict[str, Any]) -> int | None:
    """The count of a call's segments, known without reading them (a length, or the offsets' or
    the lengths' shape); None where an argument is neither (the composition raises its error)."""
    length, offsets, lengths = segments.get("segment_length"), segments.get("offsets"), segments.get("lengths")
    try:
        if length is not None:
            length = operator.index(length)  # (NumPy integers too; bool is refused later)
            return -(-x.shape[axis] // length) if length > 0 else 0
        return len(offsets) - 1 if offsets is not None else len(lengths)
    except TypeError:
        return None


def _by_runs(name: str, x: Any, adapter: Any, result: str, axis: int, m: int | None) -> bool:
    """Whether ``name`` of ``x`` along ``axis`` in ``m`` segments is read by ``warp_reduce``
    (:data:`LSE_RUNS`): logsumexp, softmax or log_softmax (:data:`RUNS`) of one feature column
    (C-contiguous ``x``), computed in float32 (a result other than float64, whatever the data:
    float64 data with ``dtype=float32`` too), rows of the batch of whole 16-byte vectors (each as
    far past a 16-byte boundary: read from it), in segments of
    :data:`LSE_RUNS_MIN_MEAN` rows or more on average (:data:`SOFTMAX_RUNS_MIN_MEAN` for softmax
    and log_softmax, :data:`LSE_RUNS_MIN_MEAN_16BIT` for 16-bit data).

    ``warp_reduce`` (``linred/kernels/warp.cuh``) gives every lane its own consecutive values and
    joins the pieces that cross lanes, warps and runs of tiles (``tile_fixup``), so a long segment
    is read by as many warps as its tiles; with ``lse.cuh``'s accumulator (a piece's maximum and
    its sum of exps) it computes logsumexp in one read.  It issues more instructions per value
    than the workers' kernel, which is faster where segments are short and even (see
    :data:`LSE_RUNS_MIN_MEAN`) but reads each segment with one worker, and so takes the time
    one warp needs for the longest.  float64 keeps the workers: its 16-byte accumulator makes
    ``warp_reduce`` spill."""
    if not (LSE_RUNS and GROUP is None and name in RUNS and result != "float64" and m):
        return False
    shape = tuple(x.shape)
    if x.dtype.itemsize == 2:
        least = LSE_RUNS_MIN_MEAN_16BIT
    else:
        least = LSE_RUNS_MIN_MEAN if name == "segmented_logsumexp" else SOFTMAX_RUNS_MIN_MEAN
    if math.prod(shape[axis + 1 :]) != 1 or shape[axis] < least * m:
        return False
    row_bytes = shape[axis] * x.dtype.itemsize if axis else 0  # (rows of the batch: one after another)
    # Rows each as far past a 16-byte boundary (a slice x[k:]) are read from the boundary
    # (kernels.warp_shift): the data need only be aligned to its values.
    return adapter.pointer(x) % x.dtype.itemsize == 0 and row_bytes % 16 == 0


def _takes_runs(name: str, x: Any, adapter: Any, result: str, axis: int, segments: dict[str, Any],
                device: int) -> bool:  # fmt: skip
    """Whether ``warp_reduce`` serves the call (:func:`_by_runs`), and it is large
    (:data:`RUNS_MIN_VALUES`) or one the workers' kernel does not serve (:func:`_enough_workers`)."""
    if not _by_runs(name, x, adapter, result, axis, count(x, axis, segments)):
        return False
    if math.prod(tuple(x.shape)) >= RUNS_MIN_VALUES:
        return True
    return not _enough_workers(x, axis, segments, device, name, itemsize=x.dtype.itemsize)


#: per thread: the warp_reduce executors of logsumexp by their problem and the nvrtc options
#: (each holds its partials; the least recently used beyond this many are dropped, not freed, as
#: the plan cache's evicted plans: freeing waits for the device; a dropped one makes the stream
#: its partials were allocated on wait for its last call where that ran on another stream, so
#: that the array library's pool orders the memory's next use after it: ReleasedInOrder)
RUNS_CACHE_SIZE = 32


def _runs(x: Any, out: Any, seg: Any, adapter: Any, device: int, stream: int, batch: int, n: int, m: int,
          result: str, reduction: str = "logsumexp") -> None:  # fmt: skip
    """logsumexp of ``x`` (``batch`` rows of ``n`` values, one feature) into ``out`` by
    ``warp_reduce`` with ``lse.cuh``'s accumulator and the nvrtc backend's executor, its
    partials and fix-up (the offsets checked as they are read where ``seg`` has a check word);
    with ``reduction="logsumexp_parts"``, each segment's maximum and sum of exps (2 float32 values
    a segment: ``out`` of ``batch * m * 2``)."""
    fixed = isinstance(seg, FixedSegments)
    index = None if fixed else seg.offsets.dtype
    backend = _nvrtc_backend()
    # (the key is made of cheap values: the Problem is built only to plan)
    key = (reduction, adapter.kind, device, x.dtype, result, batch, n, m, seg.length if fixed else None, index,
           backend.options)  # fmt: skip
    cache = getattr(_local, "runs", None)
    if cache is None:
        cache = _local.runs = {}
    executor = cache.pop(key, None)  # (put back last: the dict's order is the use order)
    if executor is None:
        from linred.backends.nvrtc.executors import _WarpExecutor
        from linred.problem import Problem

        problem = Problem(reduction, adapter.kind, device, dtype_name(x.dtype), "float32", result, batch, n, 1,
                          (n, 1, 1), m, key[8], None if fixed else dtype_name(index))  # fmt: skip
        executor = _WarpExecutor(problem, backend.options)
        while len(cache) >= RUNS_CACHE_SIZE:
            del cache[next(iter(cache))]
    cache[key] = executor
    executor(x, out, seg, stream)


#: softmax_from_parts (lse.cuh): threads a block, and values a thread
PARTS_THREADS, PARTS_ITEMS = 256, 8
PARTS_MODES = {"segmented_softmax": 1, "segmented_log_softmax": 2}


def _from_parts(name: str, x: Any, out: Any, seg: Any, adapter: Any, device: int, stream: int, batch: int, n: int,
                m: int, result: str) -> None:  # fmt: skip
    """softmax or log_softmax of ``x`` (``batch`` rows of ``n`` values, one feature) into ``out``:
    each segment's parts (maximum, sum of exps) by ``warp_reduce`` (:func:`_runs`, one read of the
    data), then each value from its segment's (``softmax_from_parts``, lse.cuh: a second read and
    the write).  The workers' kernel reads a short segment the second time from L1/L2; this reads
    the data twice from memory, and is for segments long on average (:data:`LSE_RUNS_MIN_MEAN`)."""
    parts = adapter.allocator("float32", device)((batch * m * 2,))
    _runs(x, parts, seg, adapter, device, stream, batch, n, m, "float32", "logsumexp_parts")
    fixed = isinstance(seg, FixedSegments)
    index = None if fixed else seg.offsets.dtype
    key = ("parts", device, name, x.dtype, result, index)
    launch = getattr(_local, "launches", _NONE).get(key)
    if launch is None:
        ctype, bounds = _offsets_arguments(None if fixed else dtype_name(index))
        source = (
            '#include "lse.cuh"\n'
            f"LINRED_SOFTMAX_FROM_PARTS({CTYPES[dtype_name(x.dtype)]}, {CTYPES[result]}, {PARTS_MODES[name]}, "
            f"{PARTS_THREADS}, {PARTS_ITEMS}, {ctype}, {bounds})\n"
        )
        launch = thread_launch(_local, key, device, source, "linred_softmax_from_parts", 8)
    grid = _chunk_grid(batch, n, PARTS_THREADS * PARTS_ITEMS, device)
    launch(stream, grid, PARTS_THREADS, 0, adapter.pointer(x), adapter.pointer(out), adapter.pointer(parts),
           0 if fixed else adapter.pointer(seg.offsets), seg.length if fixed else 0, batch, n, m)  # fmt: skip


#: grad_from_parts (softmax_grad.cuh): threads a block, and values a thread; 4 where each value
#: reads two arrays (y and g: as many loads in flight; at 8 ptxas spilled a register there)
GRAD_PARTS_THREADS = 256
#: the backward of one column from the parts (:func:`run_grad_from_parts`) where the workers'
#: kernel would serve it too, from this mean length: segments read by one worker each lose to
#: passes that spread them over the GPU (H200, 64M float32 values, µs per backward, workers
#: against the parts: mean 1,024 softmax 450 / 569, log_softmax 364 / 383, var 236 / 428;
#: 2,048: 539 / 526, 432 / 340, var 352 / 371; 4,088: 623 / 501, 490 / 319, var 434 / 318,
#: logsumexp 188 / 187).  logsumexp keeps the workers while they serve.
GRAD_PARTS_MIN_MEAN = {"segmented_softmax": 2048, "segmented_log_softmax": 2048, "segmented_var": 3072,
                       "segmented_std": 3072}  # fmt: skip
GRAD_PARTS_ITEMS = 8
GRAD_PARTS_ITEMS_TWO_ARRAYS = 4


def run_grad_from_parts(
    name: str,
    dtypes: tuple[str, str, str, str],
    pointers: tuple[int, int, int, int, int, int],
    batch: int,
    n: int,
    m: int,
    length: int | None,
    index_dtype: str | None,
    ddof: float,
    device: int,
    stream: int,
) -> None:
    """The derivative of ``name`` for one feature column of ``batch`` rows of ``n`` values from
    per-segment values (``linred_grad_from_parts``, softmax_grad.cuh: one read of the data, and of
    the gradient for softmax and log_softmax, and one write): ``dtypes`` are the names of the
    input's (the data for logsumexp, var and std, the result for softmax and log_softmax), the
    result's and its gradient's, ``dx``'s and the computation's (float32 or float64, ``p``'s dtype);
    ``pointers`` those of the input, the gradient (per element for softmax and log_softmax, else
    per segment), the per-segment result (logsumexp, std; else 0), ``p`` (the per-segment sum for
    softmax and log_softmax, the mean for var and std; else 0), ``dx`` and the offsets (0 for a
    fixed ``length``), C-contiguous on ``device``, per-segment arrays ``batch x m``; the offsets
    valid."""
    if not (batch and n):
        return
    a_dtype, r_dtype, dx_dtype, compute = dtypes
    key = ("grad_parts", device, name, a_dtype, r_dtype, dx_dtype, compute, index_dtype)
    items = GRAD_PARTS_ITEMS_TWO_ARRAYS if name in PARTS_MODES else GRAD_PARTS_ITEMS
    launch = getattr(_local, "launches", _NONE).get(key)
    if launch is None:
        index, bounds = _offsets_arguments(index_dtype)
        source = (
            '#include "softmax_grad.cuh"\n'
            f"LINRED_GRAD_FROM_PARTS({CTYPES[a_dtype]}, {CTYPES[r_dtype]}, {CTYPES[dx_dtype]}, {CTYPES[compute]}, "
            f"{GRAD_MODES[name]}, {GRAD_PARTS_THREADS}, {items}, {index}, {bounds})\n"
        )
        launch = thread_launch(_local, key, device, source, "linred_grad_from_parts", 11)
    grid = _chunk_grid(batch, n, GRAD_PARTS_THREADS * items, device)
    ddof_bits = ddof_word(ddof)
    a, g, res, p, dx, offsets = pointers
    launch(stream, grid, GRAD_PARTS_THREADS, 0, a, g, res, p, dx, offsets, length or 0, batch, n, m, ddof_bits)


def _nvrtc_backend() -> Any:
    """The nvrtc backend (its options are read per call: ``linred.backends.configure`` replaces them)."""
    from linred.backends.nvrtc import BACKEND

    return BACKEND


def _enough_workers(
    x: Any,
    axis: int,
    segments: dict[str, Any],
    device: int,
    name: str | None = None,
    backward: bool = False,
    itemsize: int = 4,
) -> bool:
    """Whether a call's segments are, on average, short enough for the kernel
    (:data:`MAX_MEAN_ROWS`), and either make enough workers for the GPU or leave each lane few
    values (:data:`FEW_WORKERS_LANE_VALUES`); the count of segments is known without reading
    them: a length, or the offsets' or the lengths' shape.  ``name``: the function, for the
    kernels' lanes per worker (:func:`_workers`; ``backward``: the backward kernel's; ``itemsize``:
    the data's); None: a warp per segment."""
    shape = tuple(x.shape)
    n, batch, features = shape[axis], math.prod(shape[:axis]), math.prod(shape[axis + 1 :])
    m = count(x, axis, segments)
    if m is None:  # (not a length or an array: the composition raises its error)
        return True
    return enough_workers_for(batch, n, features, m, device, name, itemsize, backward)


def enough_workers_for(batch: int, n: int, features: int, m: int, device: int, name: str | None, itemsize: int = 4,
                       backward: bool = False) -> bool:  # fmt: skip
    """:func:`_enough_workers` for ``batch`` rows of ``n`` rows of ``features`` in ``m`` segments."""
    group, _, workers = _workers(batch, m, features, None if name is None else n, name, backward, itemsize)
    if not workers:
        return True  # (nothing to read: the kernel is not even launched)
    if n > MAX_MEAN_ROWS * m:
        return False
    if workers >= MIN_WORKERS_PER_SM * multiprocessors(device):
        return True
    # Few workers: each lane reads its share of the values, one load in flight per step of it.
    return batch * n * features <= FEW_WORKERS_LANE_VALUES * workers * group


def _workers(
    batch: int,
    m: int,
    features: int,
    n: int | None = None,
    name: str | None = None,
    backward: bool = False,
    itemsize: int = 4,
) -> tuple[int, int, int]:
    """The kernel's worker layout: lanes per worker (G), features per step of a worker (DW) and
    the count of workers.  Where the features are a power of two up to 32, G lanes per (row of the
    batch, segment), which cover G / D rows of D features a step (every load is G consecutive
    elements): a warp (G = 32), or, given the rows ``n`` of each row of the batch and the function
    ``name``, as many lanes as leave each about the values :data:`LANES` gives of a segment of the
    mean length (a power of two, at least D and the fewest :data:`LANES` gives; a thread per
    segment of one feature of 8 values or fewer, of data of ``itemsize`` 4 or 8: the thread's
    kernel for 16-bit data takes about 110 registers), so that short segments share a warp instead
    of leaving most of its lanes idle (the ``backward`` kernel's lanes: :data:`BACKWARD_LANE_VALUES`
    each), but a warp where the mean length passes :data:`WHOLE_WARP_SHARE` of a warp's loop step;
    :data:`GROUP` forces G.  Else a thread per (row of the batch, segment, feature)."""
    if warp_workers(features):
        group = 32
        if GROUP is not None:
            group = max(GROUP, features)
        elif n is not None and m:
            values = n / m * features  # (a segment's, on average)
            # (the kernels hand a segment longer than a warp's loop step to the whole warp)
            warp_rows = (8 if backward else unroll(32, itemsize)) * 32 // max(features, 1)
            if values <= 0 or n / m > WHOLE_WARP_SHARE * warp_rows:  # (no data: no launch either)
                group = 32
            elif features == 1 and values <= 8 and itemsize >= 4:
                group = 1
            else:
                per_lane, fewest = LANES.get(name, (16, 2))
                per_lane = BACKWARD_LANE_VALUES if backward else per_lane
                lanes = values / per_lane
                group = min(32, max(fewest, features, 2 ** round(math.log2(max(lanes, 1)))))
        return group, features, batch * m
    return 1, 1, batch * m * features


def warp_workers(features: int) -> bool:
    """Whether a worker is a group of a warp's lanes covering all ``features`` of a row (a power
    of two up to 32 of them), rather than a thread per feature (:func:`_workers`)."""
    return features <= 32 and features & (features - 1) == 0


def unroll(group: int, itemsize: int) -> int:
    """The steps of its rows a worker's lanes load at once (softmax.cuh: softmax_unroll)."""
    return 8 if group > 1 and itemsize <= 4 else 4


def _pairs(name: str, x: Any, out: Any, adapter: Any, group: int, width: int, batch: int, n: int, m: int) -> bool:
    """Whether a warp's lanes read ``x`` two rows at a time (:data:`PAIRS`): 16-bit data of one
    feature in segments of :data:`PAIRS_MIN_ROWS` rows or more on average, every row of the batch
    starting at a 4-byte boundary, and a per-element result aligned to two of its values."""
    if not (PAIRS and group == 32 and width == 1 and x.dtype.itemsize == 2 and (batch == 1 or n % 2 == 0)):
        return False
    if n < PAIRS_MIN_ROWS * m:
        return False
    if adapter.pointer(x) % 4:
        return False
    return name in PER_SEGMENT or adapter.pointer(out) % (2 * out.dtype.itemsize) == 0


def _accumulator(name: str, compute: str) -> str:
    """The C type the kernels of ``name`` accumulate in for a computation in ``compute``: double
    for var and std, float for 16-bit computations, else ``compute``'s (the workers' kernel and
    linred_softmax_long, which reads the segments it listed, alike)."""
    return CTYPES["float64" if name in VARIANCE or name in MOMENTS else "float32" if compute in HALF else compute]


def wrapper(name: str, data: str, compute: str, result: str, group: int, width: int, pairs: int,
            index: str | None, lists: bool = False) -> str:  # fmt: skip
    """The kernel's source for ``name`` of ``data`` (dtype names) computed in ``compute``, giving
    ``result``, with ``group`` lanes a worker over ``width`` features a step, ``pairs`` rows a lane
    reads at once (1, or 2: pairs of 16-bit rows), and offsets of dtype ``index`` (None: a fixed
    length)."""
    ctype, bounds = _offsets_arguments(index)
    t, o, a = CTYPES[data], CTYPES[result], _accumulator(name, compute)
    return (
        f'#include "softmax.cuh"\n'
        f"LINRED_SOFTMAX({t}, {a}, {o}, {MODES[name]}, {group}, {width}, {pairs}, {str(lists).lower()}, {THREADS}, "
        f"{ctype}, {bounds})\n"
    )


#: segments longer than this are listed by the workers' warps and read by linred_softmax_long, a
#: block of LONG_THREADS threads each (SOFTMAX_LONG_ROWS in softmax.cuh); the list has room for
#: LONG_LIST of them (32 bytes each, after a 16-byte head: LongList), the rest read by their warps
LONG_ROWS = 1 << 15
LONG_LIST = 1024
LONG_THREADS = 1024
#: the fewest values of an unchecked call whose very long segments are listed: the list's code
#: costs the workers' loop registers, the second kernel a launch (about 30 µs of host time a call
#: on an H200's host, 94 -> 129 µs at 4M values), which calls of 64M values hide behind their
#: device time (150 µs and more), smaller ones not.  A checked call waits for its kernel anyway:
#: it lists wherever a segment can be that long, and launches the second kernel only where the
#: first listed one (its note, :func:`linred.arrays._device_checks.noted`).
LONG_MIN_VALUES = 1 << 26
#: how an unchecked call of LONG_MIN_VALUES or more uses the list (the second kernel always), and
#: a checked one (the second kernel where the first noted that it listed)
ALWAYS, NOTED = "always", "noted"


def _lists(name: str, n: int, values: int, group: int, features: int, checked: bool) -> str | None:
    """How the workers' kernel lists segments longer than LONG_ROWS for linred_softmax_long
    (:data:`ALWAYS`, :data:`NOTED`), or None: checked calls whose rows ``n`` exceed LONG_ROWS and
    unchecked calls of LONG_MIN_VALUES ``values`` or more, of workers of a layout
    linred_softmax_long takes (groups of lanes, or a thread of one feature), and not logsumexp's
    warps per segment but in checked calls of fewer than RUNS_MIN_VALUES values (the list's
    registers cost them 20% at segments of 256 rows in calls of 64M values; a smaller checked
    call's time is mostly its host's; where segments are long on average ``warp_reduce`` reads
    logsumexp instead, :func:`_by_runs`).  Never the moments of :mod:`linred._pieces`, whose
    pieces are shorter than LONG_ROWS."""
    if not (group > 1 or features == 1) or name in MOMENTS:
        return None
    if group == 32 and name == "segmented_logsumexp" and not (checked and values < RUNS_MIN_VALUES):
        return None
    if checked:
        return NOTED if n > LONG_ROWS else None
    return ALWAYS if values >= LONG_MIN_VALUES else None


class _LongList:
    """This thread's list of very long segments on a device (softmax.cuh's LongList, room for
    LONG_LIST), made zero once and left zero by every call that uses it (the second kernel's last
    block empties it; the host, where the second launch fails or a checked call's offsets broke a
    rule; a checked call whose first kernel listed nothing launches no second one).
    A call on another stream than the previous one waits for that one's pair on the device
    (:class:`linred.backends._device.StreamOrder`: an event recorded after each pair), so that two
    pairs never share it, whatever became of the earlier stream."""

    def __init__(self, adapter: Any, device: int, stream: int) -> None:
        from linred.backends._device import StreamOrder, ops_for

        ops = ops_for(adapter.kind, device)
        with ops.on(stream):  # (memory of the stream it is first made zero on)
            self.buffer = ops.empty(((16 + 32 * LONG_LIST) // 4,), "int32")
        adapter.fill(self.buffer, 0, stream)
        self.pointer = adapter.pointer(self.buffer)
        self.order = StreamOrder(ops)
        self.ops = ops


def _long_list(adapter: Any, device: int, stream: int, checked: bool) -> _LongList | None:
    """This thread's list for ``device`` and the array library of ``adapter``, or None where
    ``stream`` is being captured into a CUDA graph (its very long segments are read by their
    warps).  A ``checked`` call is asked only where it makes the list (once a thread and device:
    a list made inside a capture would come from the graph's memory, its zero-fill only
    captured); later it is not (a driver call): it waits for its kernel, which no capture
    allows, and was refused in one when its offsets were parsed."""
    lists = getattr(_local, "longs", None)
    if lists is None:
        lists = _local.longs = {}
    key = (device, adapter.kind, LONG_LIST)
    found = lists.get(key)
    if found is None:
        from linred.backends._device import ops_for

        if ops_for(adapter.kind, device).capturing(stream):
            return None
        found = lists[key] = _LongList(adapter, device, stream)
    elif not checked and found.ops.capturing(stream):
        return None
    return found


def _compile_long(key: tuple[Any, ...]) -> PackedLaunch:
    """This thread's launch of linred_softmax_long for ``key`` (device, function, data dtype,
    compute and result dtypes, DW: the workers' kernel's features a step), compiled and kept."""
    _, device, name, x_dtype, compute, result, width = key
    t, o, a = CTYPES[dtype_name(x_dtype)], CTYPES[result], _accumulator(name, compute)
    source = f'#include "softmax.cuh"\nLINRED_SOFTMAX_LONG({t}, {a}, {o}, {MODES[name]}, {width}, {LONG_THREADS})\n'
    return thread_launch(_local, key, device, source, "linred_softmax_long", 7)


def _compile(key: tuple[Any, ...]) -> PackedLaunch:
    """This thread's launch of the kernel for ``key`` (what a call's kernel depends on: device,
    function, data dtype, compute and result dtypes, worker layout (G, DW), rows a lane reads at
    once (1, or 2 for pairs), and the offsets' dtype, None for a fixed length), compiled and kept."""
    device, name, x_dtype, compute, result, group, width, pairs, index_dtype, lists = key
    index = None if index_dtype is None else dtype_name(index_dtype)
    source = wrapper(name, dtype_name(x_dtype), compute, result, group, width, pairs, index, lists)
    return thread_launch(_local, key, device, source, "linred_softmax", 12)


def _launch_pair(lists: str, listed: _LongList, launch: PackedLaunch, first: tuple, long_key: tuple[Any, ...],
                 second: tuple, grid: int, adapter: Any, device: int, stream: int) -> bool:  # fmt: skip
    """The workers' kernel with ``listed`` (its arguments ``first``), then linred_softmax_long (of
    ``long_key``, its arguments ``second``) for the segments it listed: always (:data:`ALWAYS`),
    or, for a checked call (:data:`NOTED`), which waits for the first kernel anyway, only where
    that one noted a listed segment.  Whether the offsets kept the rules (a checked call's
    verdict: False where they did not; True for an unchecked one)."""
    # The second kernel compiled before the first is launched: a list the first filled must be
    # emptied by it (the next call would read this call's segments).
    long_launch = getattr(_local, "launches", _NONE).get(long_key)
    if long_launch is None:
        long_launch = _compile_long(long_key)
    if lists == NOTED:
        _device_checks.clear_note()
    listed.order.begin(stream)
    # (whether the host has waited for all this call enqueued: then later calls wait for nothing)
    waited = False
    try:
        launch(stream, grid, THREADS, 0, *first)
        passed = lists == ALWAYS or adapter.check_passed(stream, device)
        if lists == ALWAYS or _device_checks.noted():
            if passed:  # (a block a listed segment; none listed: every block returns at once)
                long_launch(stream, multiprocessors(device), LONG_THREADS, 0, *second)
                _local.listed = lists == NOTED
            else:  # (offsets that break the rules: the list emptied, the call raises)
                adapter.fill(listed.buffer, 0, stream)
        else:  # a checked call whose kernel listed nothing
            waited = True
    except BaseException:
        adapter.fill(listed.buffer, 0, stream)
        raise
    finally:
        if waited:
            listed.order.idle()
        else:
            listed.order.end(stream, capturing=False)
    return passed


def run(
    name: str,
    x: Any,
    adapter: Any,
    axis: int,
    compute: str,
    result: str,
    segments: dict[str, Any],
    device: int,
    check: bool,
    stream: int,
    ddof: float = 0,
) -> Any:
    """``name`` of ``x`` along ``axis`` in one kernel on ``stream`` (a raw handle; two where very long
    segments are listed, :func:`_lists`, a checked call's second only where the first listed
    one; ``warp_reduce``'s where :func:`_takes_runs`), computing in
    ``compute`` and returning ``result``; ``segments`` are the call's segment keywords (offsets
    and lengths already on the device, checked here when ``check``); ``ddof``: var's and std's."""
    shape = tuple(x.shape)
    n = shape[axis]
    batch, features = math.prod(shape[:axis]), math.prod(shape[axis + 1 :])
    length, offsets, lengths = segments.get("segment_length"), segments.get("offsets"), segments.get("lengths")
    # The kernel checks the offsets as it reads them, where it runs at all (no rows, no features:
    # checked before, by the separate pass).
    deferred = batch * features > 0
    if length is not None:
        seg = parse_segments(length, None, None, n=n, axis=axis, adapter=adapter, device=device, check=check)
    elif offsets is not None:
        seg = parse_offsets(offsets, n, axis, adapter, device, check, deferred)
    else:
        seg = parse_lengths(lengths, n, axis, adapter, device, check, deferred)
    m = seg.count
    out_shape = shape if name not in PER_SEGMENT else (*shape[:axis], m, *shape[axis + 1 :])
    if name in MOMENTS:
        out_shape = (*out_shape, 2)
    out = adapter.allocator(result, device)(out_shape)
    group, width, workers = _workers(batch, m, features, n, name, itemsize=x.dtype.itemsize)
    if workers and m <= INT32_MAX and _takes_runs(name, x, adapter, result, axis, segments, device):
        if name == "segmented_logsumexp":  # (one value a segment; the softmaxes: one a value)
            _runs(x, out, seg, adapter, device, stream, batch, n, m, result)
        else:
            _from_parts(name, x, out, seg, adapter, device, stream, batch, n, m, result)
    elif workers and features:
        if isinstance(seg, FixedSegments):
            index_dtype, offsets_pointer, word, length = None, 0, 0, seg.length
        else:
            index_dtype, offsets_pointer, word, length = seg.offsets.dtype, adapter.pointer(seg.offsets), seg.word, 0
        pairs = 2 if _pairs(name, x, out, adapter, group, width, batch, n, m) else 1
        # (the key is made of cheap values: the kernel's C source is built only to compile it)
        # (the list, where the call lists: none where the stream is being captured)
        lists = _lists(name, n, batch * n * features, group, features, bool(word))
        listed = _long_list(adapter, device, stream, lists == NOTED) if lists else None
        key = (device, name, x.dtype, compute, result, group, width, pairs, index_dtype, listed is not None)
        launch = getattr(_local, "launches", _NONE).get(key)
        if launch is None:
            launch = _compile(key)
        grid = max(1, min(-(-workers * group // THREADS), BLOCKS_PER_SM * multiprocessors(device)))
        # (var and std read ddof as the bits of a double; the other functions ignore it)
        ddof_bits = ddof_word(ddof)
        longs = 0 if listed is None else listed.pointer
        first = (adapter.pointer(x), adapter.pointer(out), offsets_pointer, word, longs, LONG_LIST, length, n, m,
                 features, workers, ddof_bits)  # fmt: skip
        if listed is None:
            launch(stream, grid, THREADS, 0, *first)
        else:
            long_key = ("long", device, name, x.dtype, compute, result, width)
            second = (adapter.pointer(x), adapter.pointer(out), listed.pointer, LONG_LIST, n, features, ddof_bits)
            if not _launch_pair(lists, listed, launch, first, long_key, second, grid, adapter, device, stream):
                explain(seg, adapter, lengths, n=n, axis=axis, device=device)
            if lists == NOTED:
                return out  # (waited for, and checked)
    if not isinstance(seg, FixedSegments) and seg.word:
        verify(seg, adapter, stream, lengths, n=n, axis=axis, device=device)
    return out


#: the backward kernel's MODE for each function (softmax_grad.cuh)
GRAD_MODES = {"segmented_logsumexp": 0, "segmented_softmax": 1, "segmented_log_softmax": 2, "segmented_var": 3,
              "segmented_std": 4}  # fmt: skip


def _compile_backward(key: tuple[Any, ...]) -> PackedLaunch:
    """This thread's launch of the backward kernel for ``key`` (device, function, the dtype names of
    its input ``a``, of the result and its gradient, of ``dx``, of the computation, the worker
    layout (G, DW), and the offsets' dtype name, None for a fixed length), compiled and kept."""
    device, name, a_dtype, result, dx_dtype, compute, group, width, index_dtype = key
    index, bounds = _offsets_arguments(index_dtype)
    c = CTYPES["float64" if compute == "float64" else "float32"]
    wrapper = (
        f'#include "softmax_grad.cuh"\n'
        f"LINRED_SOFTMAX_GRAD({CTYPES[a_dtype]}, {CTYPES[result]}, {CTYPES[dx_dtype]}, {c}, {GRAD_MODES[name]}, "
        f"{group}, {width}, {THREADS}, {index}, {bounds})\n"
    )
    return thread_launch(_local, key, device, wrapper, "linred_softmax_grad", 11)


def run_backward(
    name: str,
    dtypes: tuple[str, str, str, str],
    pointers: tuple[int, int, int, int, int],
    shape: tuple[int, ...],
    axis: int,
    m: int,
    length: int | None,
    index_dtype: str | None,
    ddof: float,
    device: int,
    stream: int,
) -> None:
    """The derivative of ``name`` in one kernel on ``stream`` (a raw handle; see
    ``linred/kernels/softmax_grad.cuh``): ``dtypes`` are the names of the input's (the data ``x``
    for logsumexp, var and std, the result for softmax and log_softmax), the result's and its
    gradient's, ``dx``'s and the computation's; ``pointers`` those of the input, the gradient, the
    per-segment result (0 where unused), ``dx`` and the offsets (0 for a fixed ``length``), all
    C-contiguous on ``device``; ``shape`` is ``x``'s, ``m`` the count of segments, the offsets
    valid (the forward checked them)."""
    n = shape[axis]
    batch, features = math.prod(shape[:axis]), math.prod(shape[axis + 1 :])
    a_dtype, result, dx_dtype, compute = dtypes
    group, width, workers = _workers(batch, m, features, n, name, True, itemsize(a_dtype))
    if not (workers and features and n):
        return
    key = (device, name, a_dtype, result, dx_dtype, compute, group, width, index_dtype)
    launch = getattr(_local, "launches", _NONE).get(key)
    if launch is None:
        launch = _compile_backward(key)
    grid = max(1, min(-(-workers * group // THREADS), BLOCKS_PER_SM * multiprocessors(device)))
    ddof_bits = ddof_word(ddof)
    a, g, res, dx, offsets = pointers
    launch(stream, grid, THREADS, 0, a, g, res, dx, offsets, length or 0, n, m, features, workers, ddof_bits)
