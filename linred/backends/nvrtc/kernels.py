"""What the nvrtc backend compiles and how it launches it, for one problem: pure arithmetic.

No GPU and no CUDA library is needed here, so the choices can be tested anywhere:

- the accumulator and vector width of a problem (:func:`acc_dtype`, :func:`vec`), and
  whether rows can be read as whole 16-byte vectors (:func:`rows_aligned`);
- launch shapes: :func:`fixed_layout` (``fixed_small`` or ``fixed_rows`` and the
  vectors per thread), :func:`staged_threads`, :func:`staged_segments_per_thread` and
  :func:`staged_shared_bytes`
  (``fixed_staged``), :func:`long_threads` and :func:`long_unroll` (``fixed_long``),
  :func:`warp_items` (``warp_reduce``'s elements per lane), and the dynamic shared
  memory of the tile and warp kernels (:func:`tile_shared_bytes`,
  :func:`warp_shared_bytes`; each wrapper has the compiler check them against the
  C++ structs, ``TileShared`` and ``WarpShared``);
- the programs :func:`linred.kernels.compiler.get_kernels` compiles (``*_wrapper``):
  the ``#include`` of a kernel family of ``linred/kernels/`` and one line per
  ``extern "C"`` entry point, a macro of that header given the template arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from linred._dtypes import REAL, UNSIGNED, itemsize
from linred.kernels.compiler import CTYPES
from linred.problem import Problem

if TYPE_CHECKING:
    from linred.backends.nvrtc import NvrtcOptions

# --- the problem --------------------------------------------------------------------

#: max/min compare narrow types in a wider one (exactly: every value is representable)
_COMPARE_IN = {
    "float16": "float32",
    "bfloat16": "float32",
    "bool": "int32",
    "int8": "int32",
    "int16": "int32",
    "uint8": "uint32",
    "uint16": "uint32",
}


#: warp_reduce's fix-up is done by its last block where that block goes through the runs in at
#: most this many passes of its threads (one launch fewer: about 6 µs of a small call's host
#: time on an H100 host); larger grids launch linred_fixup, whose threads cover all runs at once
FUSED_FIXUP_PASSES = 2


def acc_dtype(problem: Problem) -> str:
    """The accumulator dtype: the problem's for sums and means; for max/min, a type that
    holds every input value and the result dtype's identity (an empty segment's value)."""
    if problem.reduction not in ("max", "min"):
        return problem.acc_dtype
    compare = _COMPARE_IN.get(problem.dtype, problem.dtype)
    out = problem.out_dtype
    if out == problem.dtype:
        return compare
    if out in REAL or compare in REAL:  # conversions to and from floating point are monotone
        return "float64" if "float64" in (out, compare) or out not in REAL else "float32"
    if (compare in UNSIGNED) != (out in UNSIGNED):
        return "int64"  # mixed signedness: a signed type wide enough for both ranges
    return max((compare, _COMPARE_IN.get(out, out)), key=itemsize)


#: the reductions warp_reduce serves with lse.cuh's accumulator (not reductions of the public
#: functions: linred._softmax_kernel's): logsumexp, and its parts (each segment's maximum and sum
#: of exps, as LseAcc results: softmax and log_softmax from them)
LSE_REDUCTIONS = ("logsumexp", "logsumexp_parts")


def acc_words(problem: Problem) -> int:
    """Words of :func:`acc_dtype` in an accumulator of the kernels: 2 for logsumexp (``LseAcc``:
    a piece's maximum and its sum of exps, lse.cuh), else 1."""
    return 2 if problem.reduction in LSE_REDUCTIONS else 1


def acc_bytes(problem: Problem) -> int:
    """Bytes of an accumulator of the kernels (``sizeof(A)``)."""
    return itemsize(acc_dtype(problem)) * acc_words(problem)


def vec(problem: Problem) -> int:
    return 16 // itemsize(problem.dtype)


def is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def flat(problem: Problem) -> bool:
    """Whether x3 is one contiguous run of batch * n elements."""
    b, n, _ = problem.in_shape
    s0, s1, _ = problem.strides
    return s1 == 1 and (b == 1 or s0 == n)


def rows_aligned(problem: Problem, xp: int) -> bool:
    """Whether every row of the data at address ``xp`` is contiguous and made of whole 16-byte
    vectors (then ``warp_reduce``, and ``tile_reduce``'s vector loads, can read it)."""
    b, _, d = problem.in_shape
    s0, s1, s2 = problem.strides
    size = itemsize(problem.dtype)
    return (
        s1 == 1
        and xp % 16 == 0
        and (b == 1 or (s0 * size) % 16 == 0)
        and (d == 1 or (s2 * size) % 16 == 0)  # (strided feature columns: each a row)
    )


def tile_vecload(problem: Problem, tuning: NvrtcOptions, xp: int) -> bool:
    """Whether ``tile_reduce`` reads the rows at ``xp`` as 16-byte vectors: rows of whole vectors
    (:func:`rows_aligned`) and tiles of whole vectors for every thread (a tile of fewer elements
    than ``threads`` vectors, which ``configure`` allows, leaves a thread no vector)."""
    return rows_aligned(problem, xp) and tuning.tile % (vec(problem) * tuning.threads) == 0


def warp_shift(problem: Problem, xp: int) -> int:
    """How many elements past a 16-byte boundary the rows of the data at address ``xp`` begin,
    where ``warp_reduce`` can read them from that boundary instead (contiguous rows of one
    column, each as far past a boundary: :func:`rows_aligned` of the boundary below ``xp``); 0
    where it cannot (then ``tile_reduce`` reads them) or need not (whole vectors already)."""
    size = itemsize(problem.dtype)
    if problem.features != 1 or xp % size:
        return 0
    shift = (xp % 16) // size
    return shift if rows_aligned(problem, xp - shift * size) else 0


def index_ctype(problem: Problem) -> str:
    """The C type of the offsets (``long long`` for a fixed length, whose offsets are computed)."""
    return "long long" if problem.fixed else CTYPES[problem.offsets_dtype]


# --- launch shapes ------------------------------------------------------------------


def fixed_layout(problem: Problem, tuning: NvrtcOptions) -> tuple[str, int]:
    """``(kernel, vectors per thread)`` for a power-of-two fixed length: ``fixed_small`` up to
    32 vectors per segment, ``fixed_rows`` up to ``max_rows`` warp-rows (a thread loads at
    least one vector of each row of its segment, so the unroll grows with the rows)."""
    rows = problem.segment_length // (32 * vec(problem))
    if rows <= 1:
        return "fixed_small", tuning.unroll_2byte if itemsize(problem.dtype) == 2 else tuning.unroll
    return "fixed_rows", max(tuning.unroll, rows)


#: the longest segment fixed_staged serves, in bytes (a tile of 128 such segments is 32 KiB of
#: shared memory, under the 48 KiB every GPU grants a block without opting in)
STAGED_MAX_BYTES = 256


def staged_threads(problem: Problem) -> int:
    """Threads per block of fixed_staged, one per segment of a tile: 256, or 128 for segments
    longer than 128 bytes (a tile's shared memory stays at 32 KiB at most)."""
    return 256 if problem.segment_length * itemsize(problem.dtype) <= 128 else 128


def staged_segments_per_thread(problem: Problem) -> int:
    """Segments each thread of fixed_staged reduces per tile: enough that a tile of the shortest
    segments holds about 16 KiB (float16 at L = 3 ran at 69% of copy with one per thread, a
    1.5 KiB tile per barrier, on an H100)."""
    return max(1, 64 // (problem.segment_length * itemsize(problem.dtype)))


def staged_shared_bytes(problem: Problem) -> int:
    """Dynamic shared memory of linred_staged: a tile of whole segments."""
    size = problem.segment_length * itemsize(problem.dtype)
    return staged_threads(problem) * staged_segments_per_thread(problem) * size


def long_threads(problem: Problem, tuning: NvrtcOptions) -> int:
    """Threads per block of fixed_long: up to ``tuning.long_threads``, halved (to 64 at least)
    until every thread has at least 2 of a segment's vectors to load.  One vector per thread
    left too few loads in flight (1000 float32 elements: 77% of copy with 256 threads, 104%
    with 128)."""
    lv = problem.segment_length // vec(problem)
    threads = tuning.long_threads
    while threads > 64 and 2 * threads > lv:
        threads //= 2
    return threads


def long_unroll(problem: Problem, tuning: NvrtcOptions) -> int:
    """Vectors per thread in fixed_long: the fewest (a power of two, at most 16) that let one
    block's chunk cover a whole segment, so that short-enough segments need no partials."""
    lv = problem.segment_length // vec(problem)
    threads = long_threads(problem, tuning)
    unroll = 1
    while unroll < 16 and threads * unroll < lv:
        unroll *= 2
    return unroll


def warp_items(problem: Problem) -> int:
    """Elements per lane of warp_reduce: WarpShared::ITEMS in warp.cuh."""
    return max(vec(problem), 8 if acc_bytes(problem) == 8 else 16)


def tiles_per_run(rows: int, n: int, tile: int, max_k: int, runs_per_sm: int, sms: int) -> int:
    """Consecutive tiles of ``tile`` elements one worker of ``tile_reduce`` or ``warp_reduce``
    reduces (a run) in ``rows`` rows of ``n`` elements: ``max_k``, halved while the runs leave
    fewer than ``runs_per_sm`` for each of ``sms`` SMs."""
    tiles = -(-n // tile)
    k = max_k
    while k > 1 and rows * -(-tiles // k) < runs_per_sm * sms:
        k //= 2
    return k


def warp_tiles_per_run(rows: int, n: int, problem: Problem, tuning: NvrtcOptions, sms: int) -> int:
    """:func:`tiles_per_run` of ``warp_reduce`` (tiles of :func:`warp_items` lanes' elements)."""
    return tiles_per_run(rows, n, 32 * warp_items(problem), tuning.max_tiles_per_warp, tuning.warp_runs_per_sm, sms)


def tile_tiles_per_run(rows: int, n: int, tuning: NvrtcOptions, sms: int) -> int:
    """:func:`tiles_per_run` of ``tile_reduce`` (a block a run)."""
    return tiles_per_run(rows, n, tuning.tile, tuning.max_tiles_per_block, tuning.tile_runs_per_sm, sms)


def warp_shared_bytes(problem: Problem, tuning: NvrtcOptions) -> int:
    """Dynamic shared memory of linred_warp: WarpShared::WARP_BYTES per warp of a block (warp.cuh)."""
    acc = acc_bytes(problem)
    wt = 32 * warp_items(problem)
    pieces = -(-(wt + wt // 16 * max(1, 16 // acc)) * acc // 16) * 16
    return tuning.threads // 32 * (pieces + -(-wt // 32) * 4 + 48)  # 48: WarpState


def tile_shared_bytes(problem: Problem, vecload: bool, tuning: NvrtcOptions) -> int:
    """Dynamic shared memory of linred_tile: TileShared::BYTES in tile.cuh."""
    acc = itemsize(acc_dtype(problem))
    pad = max(1, 16 // acc)
    items = tuning.tile // tuning.threads
    stage = -(-(tuning.tile + tuning.tile // 16 * pad) * acc // 16) * 16
    fast = vecload and acc == 4 and items <= 32 and 32 % items == 0
    return stage + (tuning.tile * 2 if fast else 0)


# --- the programs: a kernel family's header and its entry points -------------------

#: the operation of each reduction (LSE_REDUCTIONS: served by warp_reduce alone)
_OPS = {"sum": "OpSum", "mean": "OpSum", "max": "OpMax", "min": "OpMin", "prod": "OpProd", "logsumexp": "OpLse",
        "logsumexp_parts": "OpLse"}  # fmt: skip


def kernel_types(problem: Problem) -> tuple[str, str, str, str, str]:
    """C types of the data, result and accumulator, the operation, and MEAN."""
    mean = "true" if problem.reduction == "mean" else "false"
    acc, out = CTYPES[acc_dtype(problem)], CTYPES[problem.out_dtype]
    if problem.reduction in LSE_REDUCTIONS:
        acc = f"LseAcc<{acc}>"
        out = acc if problem.reduction == "logsumexp_parts" else out  # (each segment's parts, as they are)
    return CTYPES[problem.dtype], out, acc, _OPS[problem.reduction], mean


def _offsets(problem: Problem, index_ctype: str, shift: int = 0) -> str:
    """The segment boundaries as the kernels read them (offsets.cuh), ``shift`` elements further."""
    plain = "FixedOffsets{L}" if problem.fixed else f"ArrayOffsets<{index_ctype}>{{offsets}}"
    return f"shifted<{shift}>({plain})" if shift else plain


def fixed_wrapper(problem: Problem, tuning: NvrtcOptions) -> str:
    """``linred_fixed``: ``fixed_small`` or ``fixed_rows`` (fixed.cuh)."""
    t, o, a, op, mean = kernel_types(problem)
    kernel, unroll = fixed_layout(problem, tuning)
    L, threads = problem.segment_length, tuning.threads
    return f'#include "fixed.cuh"\nLINRED_FIXED({kernel}, {t}, {a}, {o}, {op}, {L}, {mean}, {threads}, {unroll})\n'


def staged_wrapper(problem: Problem) -> str:
    """``linred_staged``: ``fixed_staged`` (fixed.cuh)."""
    t, o, a, op, mean = kernel_types(problem)
    L, threads, spt = problem.segment_length, staged_threads(problem), staged_segments_per_thread(problem)
    return f'#include "fixed.cuh"\nLINRED_STAGED({t}, {a}, {o}, {op}, {L}, {mean}, {threads}, {spt})\n'


def long_wrapper(problem: Problem, tuning: NvrtcOptions) -> str:
    """``linred_long``: ``fixed_long`` (fixed.cuh)."""
    t, o, a, op, mean = kernel_types(problem)
    threads, unroll = long_threads(problem, tuning), long_unroll(problem, tuning)
    return f'#include "fixed.cuh"\nLINRED_LONG({t}, {a}, {o}, {op}, {mean}, {threads}, {unroll})\n'


def tile_wrapper(problem: Problem, vecload: bool, index_ctype: str, tuning: NvrtcOptions, k: int) -> str:
    """``linred_tile`` (``tile_reduce``, ``k`` tiles per block), ``linred_fixup`` and
    ``linred_bounds`` (tile.cuh, fixup.cuh)."""
    t, o, a, op, mean = kernel_types(problem)
    threads, tile = tuning.threads, tuning.tile
    offsets = _offsets(problem, index_ctype)
    vl = "true" if vecload else "false"
    min_blocks = tuning.min_blocks if itemsize(acc_dtype(problem)) <= 4 else tuning.min_blocks_wide
    smem = tile_shared_bytes(problem, vecload, tuning)
    return (
        '#include "tile.cuh"\n#include "fixup.cuh"\n'
        f"LINRED_TILE({t}, {a}, {o}, {op}, {mean}, {threads}, {min_blocks}, {tile}, {k}, {vl}, {index_ctype}, "
        f"{offsets}, {smem})\n"
        f"LINRED_FIXUP({t}, {a}, {o}, {op}, {mean}, {threads}, {tile}, 1, {index_ctype}, {offsets}, false)\n"
        f"LINRED_BOUNDS({threads}, {tile}, {index_ctype}, {offsets})\n"
    )


def warp_wrapper(
    problem: Problem,
    index_ctype: str,
    tuning: NvrtcOptions,
    k: int,
    checked: bool = False,
    fused: bool = False,
    shift: int = 0,
) -> str:
    """``linred_warp`` (``warp_reduce``, ``k`` tiles per warp; with ``checked``, checking the
    offsets it reads; with ``fused``, joining the runs' partials in its last block; with
    ``shift``, reading rows that begin that many elements past a 16-byte boundary from the
    boundary, its segments' bounds ``shift`` further, the first at ``shift``) and ``linred_fixup`` (the join as a kernel
    of its own), whose runs are a block's warps (warp.cuh, fixup.cuh)."""
    t, o, a, op, mean = kernel_types(problem)
    threads, min_blocks = tuning.threads, tuning.min_blocks_warp
    offsets = _offsets(problem, index_ctype, shift)
    wt, group = 32 * warp_items(problem), threads // 32
    smem = warp_shared_bytes(problem, tuning)
    ch, fu = ("true" if flag else "false" for flag in (checked, fused))
    lse = '#include "lse.cuh"\n' if problem.reduction in LSE_REDUCTIONS else ""  # (before the templates it overloads)
    return (
        f'{lse}#include "warp.cuh"\n#include "fixup.cuh"\n'
        f"LINRED_WARP({t}, {a}, {o}, {op}, {mean}, {threads}, {min_blocks}, {k}, {index_ctype}, {offsets}, {wt}, "
        f"{smem}, {ch}, {fu}, {group})\n"
        f"LINRED_FIXUP({t}, {a}, {o}, {op}, {mean}, {threads}, {wt}, {group}, {index_ctype}, {offsets}, {ch})\n"
    )


def features_shared_bytes(problem: Problem, width: int, threads: int) -> int:
    """The shared memory of ``features_split``: ``width`` accumulators per thread, of
    :func:`feature_partial_dtype` (float32 sums in double, as ``SumWide`` makes them)."""
    return threads * width * itemsize(feature_partial_dtype(problem))


def features_lanes(problem: Problem, groups: int, threads: int, sms: int) -> int:
    """How many lanes ``features_split`` deals each segment's rows to (1: ``features_reduce``).

    The larger of two counts, each a power of two:

    - **to fill the device**: doubled while the doubled threads stay within 1024 per SM, every
      lane keeps at least :data:`FEATURE_ROWS_PER_LANE` rows of an average segment, and a block
      holds all the lanes of a group (one thread per (row of the batch, segment, feature group),
      each with its loads in flight, already reads at full bandwidth from about half an H100's
      resident threads);
    - **for narrow rows** (at most :data:`FEATURE_NARROW_GROUPS` feature groups): about
      :data:`FEATURE_LANE_ROWS` rows of an average segment per lane, with a segment's threads
      in one warp (its partials added by shuffles).  One thread per feature group reads a
      narrow row in one 16-byte load and walks its segment a round trip per ``unroll`` rows,
      so the longest segment's thread sets the time where lengths vary, and even lengths
      leave the device short of loads in flight: see :data:`FEATURE_NARROW_GROUPS`.
    """
    pairs = problem.batch * problem.num_segments
    if not pairs:
        return 1
    rows = problem.n / problem.num_segments
    target = 1024 * sms
    lanes = 1
    while (
        2 * lanes * groups <= threads
        and rows >= 2 * lanes * FEATURE_ROWS_PER_LANE
        and 2 * pairs * groups * lanes <= target
    ):
        lanes *= 2
    narrow = 1
    if groups <= FEATURE_NARROW_GROUPS:
        while 2 * narrow * groups <= min(threads, 32) and rows >= 2 * narrow * FEATURE_LANE_ROWS:
            narrow *= 2
    return max(lanes, narrow)


def features_width(problem: Problem, xp: int, op: int) -> int:
    """The features a thread of ``features_reduce``/``features_split`` reads at once for data at
    address ``xp`` and results at ``op``: 16 bytes of them where every row is 16-byte aligned,
    else 1; and 1 where the results would go out as 16-byte vectors that are not aligned."""
    b, _, d = problem.in_shape
    s0, s1, _ = problem.strides
    size, out_size = itemsize(problem.dtype), itemsize(problem.out_dtype)
    width = vec(problem)
    if xp % 16 or not all((v * size) % 16 == 0 for v in (s1, d, s0 if b > 1 else 0)):
        return 1
    if (width * out_size) % 16 == 0 and (op % 16 or (d * out_size) % 16):
        return 1
    return width


def features_widths(problem: Problem) -> dict[tuple[bool, bool], int]:
    """:func:`features_width` for each alignment of the pointers, the only per-call inputs it
    depends on: ``(data misaligned, results misaligned) -> width`` (misaligned: not a multiple
    of 16 bytes)."""
    return {(a, o): features_width(problem, int(a), int(o)) for a in (False, True) for o in (False, True)}


def features_split_lanes(problem: Problem, width: int, threads: int, sms: int) -> int:
    """The lanes ``features_split`` is launched with for ``width`` features a thread (1:
    ``features_reduce``): :func:`features_lanes`, unless the wide accumulators of a larger
    ``threads`` option would need more shared memory than :data:`SPLIT_SHARED_LIMIT`."""
    groups = problem.in_shape[2] // width
    lanes = features_lanes(problem, groups, threads, sms)
    per_block = threads // (lanes * groups)
    if lanes > 1 and features_shared_bytes(problem, width, per_block * lanes * groups) > SPLIT_SHARED_LIMIT:
        return 1
    return lanes


#: the most shared memory features_split asks for: the 48 KiB every GPU grants a block without
#: opting in (the default 256 threads need at most 32 KiB)
SPLIT_SHARED_LIMIT = 48 * 1024
#: the fewest rows of an average segment each lane of ``features_split`` adds
FEATURE_ROWS_PER_LANE = 8
#: the rows of an average segment per lane of narrow rows' ``features_split``
FEATURE_LANE_ROWS = 12
#: the most feature groups (16 bytes each where rows are aligned) of the rows that
#: ``features_split`` deals to about :data:`FEATURE_LANE_ROWS` rows a lane.  Measured on an H200
#: (float32, device us per call back to back, one thread per group -> lanes by this rule,
#: ``torch.segment_reduce`` in brackets): segments of 100 rows, 10^7 x 4 70.2 -> 58.6 (74.3),
#: 10^7 x 8 124.0 -> 93.7 (89.5), 10^7 x 16 179.5 -> 167.5 (160.3), 10^6 x 16 in 10^4 segments
#: 25.1 -> 22.7 (24.5); geometric lengths of mean 100, 10^7 x 16 326.8 -> 208.4 (268),
#: 10^6 x 16 113.5 -> 51.6 (103).  The same rule for 32 to 128 features cost 7-16% at even
#: lengths (the tree of partials and each segment's bounds weigh on fewer rows a thread).
FEATURE_NARROW_GROUPS = 4


def narrow_rows(problem: Problem) -> bool:
    """Whether feature rows are narrow: at most :data:`FEATURE_NARROW_GROUPS` 16-byte groups
    (their long segments are not cut where ``features_split`` deals them to lanes:
    :func:`features_long_rows`; their threads load :func:`features_unroll` rows at once)."""
    return problem.features * itemsize(problem.dtype) <= 16 * FEATURE_NARROW_GROUPS


def features_unroll(problem: Problem, tuning: NvrtcOptions) -> int:
    """The rows a thread of the feature kernels loads at once: ``feature_narrow_unroll`` for
    narrow rows (:func:`narrow_rows`), else ``unroll``."""
    return tuning.feature_narrow_unroll if narrow_rows(problem) else tuning.unroll


def features_wrapper(
    problem: Problem,
    index_ctype: str,
    tuning: NvrtcOptions,
    width: int,
    split: bool = False,
    long: bool = False,
    chunks: bool = False,
) -> str:
    """``linred_features`` (``features_reduce``), or with ``split`` ``linred_features_split``
    (``features_split``), over groups of ``width`` features (features.cuh); with ``long``,
    either also reads long segments in tiles of :data:`FEATURE_TILE_ROWS` rows, whose last to
    finish adds them up (``LINRED_FEATURES_LONG``, ``LINRED_FEATURES_SPLIT_LONG``); with
    ``chunks``, a chunk of :data:`FEATURE_LONG_CHUNK` tiles at a time (``LONG_CHUNK``)."""
    t, o, a, op, mean = kernel_types(problem)
    offsets = _offsets(problem, index_ctype)
    head = f"{t}, {a}, {o}, {op}, {mean}, {tuning.threads}, {width}, {features_unroll(problem, tuning)}"
    macro = "LINRED_FEATURES_SPLIT" if split else "LINRED_FEATURES"
    if long:
        chunk = f"#define LINRED_LONG_CHUNK {FEATURE_LONG_CHUNK}\n" if chunks else ""
        return f'{chunk}#include "features.cuh"\n{macro}_LONG({head}, {FEATURE_TILE_ROWS}, {index_ctype}, {offsets})\n'
    return f'#include "features.cuh"\n{macro}({head}, {index_ctype}, {offsets})\n'


#: the rows of a tile of a long segment (features_long_rows): a thread of ``linred_features``
#: adds at most this many rows of one of its feature groups
FEATURE_TILE_ROWS = 128


#: past this many rows, a segment of a call whose segments are too few to fill the device (fewer
#: than a block's threads each: see features_long_rows) is cut into tiles whatever the average
FEATURE_FEW_ROWS = 8 * FEATURE_TILE_ROWS

#: the tiles of a chunk of a long segment in the calls of :func:`features_long_chunks`: a segment
#: of more tiles is added a chunk at a time, then its chunks
FEATURE_LONG_CHUNK = 64

#: the average rows of a segment past which :func:`features_long_chunks` holds: four chunks
FEATURE_CHUNKS_MIN_ROWS = 4 * FEATURE_LONG_CHUNK * FEATURE_TILE_ROWS


def _few_pairs(problem: Problem, options: NvrtcOptions, sms: int) -> bool:
    """Whether the (row of the batch, segment) pairs are too few to fill the device even with a
    block's threads each, and their segments longer than :data:`FEATURE_FEW_ROWS` on average."""
    m = problem.num_segments
    return problem.batch * m * options.threads < 1024 * sms and -(-problem.n // m) > FEATURE_FEW_ROWS


def features_long_chunks(problem: Problem, options: NvrtcOptions, sms: int) -> bool:
    """Whether the long kernels of a call add a long segment's tiles a chunk of
    :data:`FEATURE_LONG_CHUNK` at a time (features.cuh, ``LONG_CHUNK``): in the calls whose
    segments are too few to fill the device (:func:`features_long_rows`) and longer than four
    chunks on average (:data:`FEATURE_CHUNKS_MIN_ROWS`), where one thread would add thousands of
    tiles in a chain.  Measured on an H200 (device us, chain -> chunks; a copy of the data for
    scale): one segment of 10^6 x 64 int32 rows 1,096 -> 130 (123), float32 10^6 x 128 in one
    segment 2,061 -> 175 (243), int64 2 * 10^5 x 32 in 3 segments 53.2 -> 41.6 (27); but 10^6 x 64
    int32 rows in 100 segments of 78 tiles 89.1 -> 103.6, and 2 * 10^5 x 128 float32 rows in
    2,000 even segments (no chunks needed) 32.0 -> 35.6: the chunks cost the kernel registers.
    Elsewhere the chain stays."""
    n, m = problem.n, problem.num_segments
    return n > 0 and m > 0 and _few_pairs(problem, options, sms) and -(-n // m) > FEATURE_CHUNKS_MIN_ROWS


def features_long_rows(problem: Problem, options: NvrtcOptions, sms: int) -> int:
    """The rows past which ``features_reduce`` and ``features_split`` leave a segment to tiles
    (0: they reduce every segment themselves): ``feature_long_factor`` times the average length,
    at least :data:`FEATURE_TILE_ROWS`, for feature rows with offsets of at least
    ``feature_long_min_bytes``.

    ``features_reduce`` walks a segment with one thread per feature group (``features_split``
    with a few lanes), so where lengths vary the longest segment sets the time (10^6 x 128
    float32 rows on an H200: lengths of mean 100 drawn from a geometric law 229-284 us where
    even ones take 124; one segment of 5% of the rows 8.2 ms).  Cut into tiles, a long segment
    is read by as many threads as its tiles, and their partials are added in a fixed order by
    the last of them to finish (in the calls of :func:`features_long_chunks`, a chunk of 64 tiles
    at a time).  A search of the offsets per tile costs microseconds when no segment is long,
    hence the size floor.

    Where the (row of the batch, segment) pairs are too few to fill the device even with a
    block's threads each (fewer than ``1024 * sms / threads``), a block's lanes would walk
    segments of any length: segments past :data:`FEATURE_FEW_ROWS` rows are then cut whatever
    the average, the size, or whether lengths are fixed (one segment of 10^6 rows of 64 int32
    features: 256 threads for 256 MB otherwise).

    Narrow rows (at most :data:`FEATURE_NARROW_GROUPS` 16-byte groups) that ``features_split``
    deals to lanes are not cut by the average: their lanes already share a long segment's rows,
    and a tile's thread walks its rows alone (H200, float32, 10^7 x 16 rows in 10^5 segments:
    even lengths 167.6 -> 180.1 us cut, geometric ones 214.7 -> 255.5).  Narrow rows in segments
    too short for lanes (one thread per group) are cut as wider ones are."""
    n, m = problem.n, problem.num_segments
    if n == 0 or m == 0:
        return 0
    mean = -(-n // m)
    if _few_pairs(problem, options, sms):
        if problem.fixed:
            return FEATURE_FEW_ROWS
        return max(FEATURE_TILE_ROWS, min(options.feature_long_factor * mean, FEATURE_FEW_ROWS))
    if problem.fixed:
        return 0
    if narrow_rows(problem):
        v = vec(problem)  # (the width of aligned rows; rows of other lengths are read a feature a thread)
        if features_split_lanes(problem, v if problem.features % v == 0 else 1, options.threads, sms) > 1:
            return 0
    if problem.batch * n * problem.features * itemsize(problem.dtype) < options.feature_long_min_bytes:
        return 0
    return max(FEATURE_TILE_ROWS, options.feature_long_factor * mean)


def feature_partial_dtype(problem: Problem) -> str:
    """The dtype of the feature kernels' accumulators and partials (``SumWide``): the
    accumulator's, but float64 for float32 sums."""
    acc = acc_dtype(problem)
    return "float64" if problem.reduction in ("sum", "mean") and acc == "float32" else acc
