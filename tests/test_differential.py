"""Differential suite: every backend and every kernel family it dispatches to, on shapes that
straddle the family's tiling, against a float64 NumPy reference.

The tiling constants are read from the code (``linred.backends.nvrtc.TUNING`` and the
functions that derive vectors, items and tiles from it, ``linred.backends.numpy``'s BLAS and
conversion blocks, ``linred.backends._nvmath_layout``'s host chunks, ``linred.backends.cub``'s
path switch), so the shapes follow when a constant changes: for each constant ``T``, the
lengths, segment counts and feature counts at ``k*T - 1``, ``k*T`` and ``k*T + 1``.  Each
family runs every dtype and reduction, the three segment specs (with empty runs, one huge
segment and power-law lengths), NumPy, CuPy and PyTorch inputs, contiguous, strided,
negative-stride, misaligned, ``axis=-1``, byte-swapped, unaligned and structured-field
views, ``out=`` and ``check=False``.  The error model is stated once, in
``tests/support/differential.py``.

On a machine without a GPU the host families run; under ``CI=true`` a deterministic sample of
them (a quarter, and shorter long segments).  On a GPU machine,
``python -m pytest -q -m gpu tests/test_differential.py`` runs the device families and a
hypothesis suite (m up to 10^5, L up to 10^4); the terminal summary says how many calls
were checked.
"""

from __future__ import annotations

import itertools
import os
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import (
    HAS_CUPY_GPU,
    HAS_GPU,
    HAS_TORCH,
    HAS_TORCH_CUDA,
    backend_available,
    cupy,
    long_feature_segments_forced,
)
from support.differential import (
    COLUMN_LAYOUTS,
    DIFFERENTIAL,
    DTYPES,
    LAYOUTS,
    NUMPY_LAYOUTS,
    REDUCTIONS,
    STYLES,
    Case,
    around,
    expand,
    random_lengths,
    run_case,
)

from linred._dtypes import itemsize
from linred.backends import numpy as numpy_backend
from linred.backends.cub import CUPY_CUB_MAX_LENGTH
from linred.backends.nvmath.layout import HOST_CHUNK, HOST_LEVELS_FROM, HOST_SPLIT_ABOVE
from linred.backends.nvrtc import DEFAULT_OPTIONS as TUNING
from linred.problem import Problem

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: the longest single segment of the accuracy family (2^26 on a GPU machine, 2^22 in CI)
LONGEST = 2**22 if CI else 2**24


def _fixed(L: int, m: int, d: int = 0) -> tuple[str, tuple[int, ...], int]:
    return ("fixed", (L,) * m, d)


def _variable(spec: str, lengths: tuple[int, ...], d: int = 0) -> tuple[str, tuple[int, ...], int]:
    assert min(lengths, default=0) >= 0, lengths  # (a shape's lengths are valid: the checks are tested apart)
    return (spec, lengths, d)


def _styles(rng: np.random.Generator, ms: list[int], mean: float, d: int = 0) -> list[tuple[str, tuple[int, ...], int]]:
    """Variable-length shapes: every style of lengths for every m, offsets and lengths in turn."""
    shapes = []
    for i, m in enumerate(ms):
        style = STYLES[i % len(STYLES)]
        shapes.append(_variable(("offsets", "lengths")[i % 2], random_lengths(rng, m, style, mean), d))
    return shapes


def _aligned_offsets(tile: int, count: int, m_per_tile: int) -> tuple[int, ...]:
    """Lengths whose segment boundaries fall exactly on tile boundaries (and inside tiles)."""
    lengths = []
    for _ in range(count):
        part = [tile // m_per_tile] * (m_per_tile - 1)
        lengths += [*part, tile - sum(part)]
    return tuple(lengths)


def _problem(dtype: str, reduction: str, *, fixed: int | None = 8, n: int = 1024, d: int = 1) -> Problem:
    """A Problem as planning sees it (no GPU needed), to read the kernels' derived constants."""
    from linred._dtypes import resolve

    acc, out = resolve(reduction, dtype, None)
    return Problem(reduction, "cupy", 0, dtype, acc, out, 1, n, d, (n * d, d, 1), n // (fixed or 1), fixed)


# ---------------------------------------------------------------------------
# Families: (name, backend, kinds, layouts, shapes per dtype)
# ---------------------------------------------------------------------------


def nvrtc_families(dtype: str, sms: int) -> dict[str, list]:
    """Shapes straddling every tiling constant of linred's kernels, for ``dtype``."""
    from linred.backends.nvrtc.kernels import warp_items as _warp_items

    T = TUNING
    size = itemsize(dtype)
    vec = 16 // size
    rng = np.random.default_rng(zlib.crc32(dtype.encode()))
    fam: dict[str, list] = {}
    # fixed_small: power-of-two L up to 32 vectors; chunks of threads * unroll vectors.
    unroll = T.unroll_2byte if size == 2 else T.unroll
    chunk = T.threads * unroll * vec  # elements per block pass
    shapes = []
    for L in sorted({1, 2, max(1, vec // 2), vec, 2 * vec, 32 * vec}):
        per_chunk = chunk // L
        ms = around(per_chunk, 2 * per_chunk) + around(max(1, vec // L), lo=1)
        shapes += [_fixed(L, m) for m in ms]
    fam["fixed_small"] = shapes
    # fixed_rows: L = 32 * vec * R warp-rows (data of at most 8-byte vectors).
    if vec <= 8:
        shapes = []
        for R in (2, T.max_rows):
            L = 32 * vec * R
            warp_chunk = 32 * max(T.unroll, R) * vec
            ms = around(1, max(1, T.threads // 32 * warp_chunk // L), max(2, 2 * T.threads // 32 * warp_chunk // L))
            shapes += [_fixed(L, m) for m in ms]
        fam["fixed_rows"] = shapes
        # fixed_long: whole vectors from long_min_bytes; chunks of up to long_threads * 16 vectors.
        lmin = -(-T.long_min_bytes // (size * vec)) * vec
        big = T.long_threads * 16 * vec
        lengths = [lmin - vec, lmin, lmin + vec, lmin + 1, big - vec, big, big + vec, 2 * big + vec]
        fam["fixed_long"] = [_fixed(L, m) for L in lengths for m in (1, 2, 3)]
    # warp_reduce: warp tiles of 32 * items elements, runs of tiles; offsets and other lengths.
    items = max(_warp_items(_problem(dtype, r)) for r in REDUCTIONS if not (r in ("max", "min") and dtype == "bool"))
    wt = 32 * items
    shapes = []
    for L in (3, 5, 7, 12, 100, vec + 1):  # fixed lengths that are not powers of two
        shapes += [_fixed(L, m) for m in around(wt // L, 2 * wt // L + 1)]
    if vec > 1:  # short powers of two with n not a multiple of the vector (issue: every 256th result)
        shapes += [_fixed(L, m) for L in (1, 2) if vec > L for m in around(wt // L, 3 * wt // L) if (m * L) % vec]
    shapes += _styles(rng, [m for m in around(wt // 16, 2 * wt // 16, 40 * wt // 16) for _ in (0, 1)], 16)
    shapes += _styles(rng, around(3, 40), wt * 3)  # segments spanning tiles and runs
    shapes += [_variable("offsets", _aligned_offsets(wt, c, k)) for c in (1, 2, 5) for k in (1, 4, wt // 2)]
    # Runs of several tiles per warp only on data large enough for k > 1 (see _Runs): the first
    # row length at which each k is chosen, on this device.
    big = dtype in ("float32", "float16", "int64")  # (large data: a few dtypes only)
    if big:
        per_run = T.warp_runs_per_sm * sms
        n = 2 * per_run * wt  # the smallest row that gets runs of 2 tiles
        shapes.append(_variable("offsets", _aligned_offsets(2 * wt, n // (2 * wt) + 1, 3)))
        shapes.append(_fixed(3, n // 3 + 1))
        # The longest runs (max_tiles_per_warp tiles): boundaries on and beside run boundaries,
        # segments spanning runs, one segment (the fix-up adds every run's part).
        k = T.max_tiles_per_warp
        run = k * wt
        count = k * per_run + 1  # (runs of k tiles from k * per_run tiles on)
        shapes.append(_variable("offsets", _aligned_offsets(run, count, 3)))
        shapes.append(_variable("lengths", tuple(L for _ in range(count // 3 + 1) for L in (run - 1, run, run + 1))))
        shapes.append(_variable("offsets", (count * run + 1,)))
    fam["warp_reduce"] = shapes
    # warp_reduce on rows that begin 1 or 3 elements past a 16-byte boundary (the misaligned
    # layouts), read from that boundary as rows that many elements longer whose segments begin
    # that much further: the tiles and runs of those rows (n + shift at k*T-1, k*T, k*T+1), a
    # segment boundary at and beside a tile boundary of them, one segment, fixed lengths.
    shapes = []
    for shift in (1, 3):
        for nn in around(wt, 2 * wt, 5 * wt):
            n = nn - shift
            shapes.append(_variable("offsets", (n,)))
            shapes.append(_variable("lengths", (n // 3, n // 3, 0, n - 2 * (n // 3))))
            for b in around(wt - shift, lo=1):  # a boundary on and beside a tile boundary of the row read
                if b <= n:
                    shapes.append(_variable("offsets", (b, n - b)))
        for L in (3, 7):
            shapes += [_fixed(L, m) for m in around((wt - shift) // L, (2 * wt - shift) // L)]
        if big:  # runs of 2 tiles, and the longest
            per_run = T.warp_runs_per_sm * sms
            for k in (2, T.max_tiles_per_warp):
                n = k * per_run * wt - shift
                shapes.append(_variable("offsets", (n + 1,)))
                shapes.append(_variable("offsets", (*_aligned_offsets(k * wt, n // (k * wt), 3), n % (k * wt))))
    fam["warp_shifted"] = shapes
    # tile_reduce: layouts warp_reduce does not take (strided, misaligned): tiles of T.tile.
    tile = T.tile
    shapes = [_fixed(L, m) for L in (1, 3, 64, tile, tile + 1) for m in around(max(1, tile // L), 2 * tile // L + 1)]
    shapes += _styles(rng, around(tile // 16, 3 * tile // 16), 16)
    shapes += _styles(rng, around(2, 9), tile * 3)
    shapes += [_variable("offsets", _aligned_offsets(tile, c, k)) for c in (1, 3) for k in (1, 5, 2048)]
    if big:  # the smallest row that gets runs of 2 tiles
        shapes.append(_fixed(5, T.tile_runs_per_sm * sms * 2 * tile // 5 + 1))
    fam["tile_reduce"] = shapes
    # tile_reduce on feature columns that are not contiguous: each column a row of its own
    # (TileArgs::inner), its results a column of the result; rows of a batch of columns, tiles
    # and runs of tiles, fixed lengths and offsets.
    shapes = [_fixed(L, m, d) for d in (2, 5) for L in (1, 3, tile + 1) for m in around(max(1, tile // L))]
    for d in (2, vec + 1):
        shapes += _styles(rng, around(tile // 16), 16, d)
    shapes += _styles(rng, around(2, 5), tile * 3, 3)
    # columns shorter than a quarter of a tile (auto tries other backends first; nvrtc serves them)
    shapes += [_fixed(L, m, 3) for L in (1, 5) for m in (1, 7, (tile // 4 - 1) // L)]
    shapes += _styles(rng, [3, 20], 16, 2)
    if big:  # runs of 2 tiles (the rows are the columns: fewer tiles a row than one column has)
        d = 4
        shapes.append(_fixed(5, T.tile_runs_per_sm * sms * 2 * tile // (5 * d) + 1, d))
    fam["tile_columns"] = shapes
    # features_reduce: d around the vector (narrow rows) and of 8 vectors, short and long segments;
    # every tail of its loop of U rows a step (features_unroll: fewer for narrow rows; the tail in
    # steps of halving powers of two) and lengths around k * U.
    from linred.backends.nvrtc.kernels import features_unroll

    shapes = []
    for d in (*around(vec, 2 * vec, lo=2), 8 * vec):
        U = features_unroll(_problem(dtype, "sum", d=d), T)
        tails = (*range(2 * U + 2), *around(3 * U), 7 * U - 1)
        shapes += [_fixed(L, m, d) for L, m in ((1, 33), (7, 40), (64, 9), (3000, 2))]
        shapes += [_variable(s, ls, d) for s, ls, _ in _styles(rng, [50, 7], 20)]
        shapes.append(_variable("offsets", tails, d))
    # features_split: each segment's rows dealt to R lanes (features_split_lanes) where segments are
    # few or long; lengths around multiples of U * R (the unrolled loop's step) and past one
    # step by 1 to U - 1 rows a lane (the tail's steps); partials added by shuffles (a
    # segment's threads in one warp: d = 2 * vec) or in shared memory (d = 16 * vec + 1); counts
    # around a block's pairs, empty segments.  (Its grid-stride loop starts past 64 blocks per SM
    # of pairs, over 10^8 elements at two lanes: not reached here.)
    from linred.backends.nvrtc.kernels import features_split_lanes

    for d in (16 * vec, 16 * vec + 1, 2 * vec):
        width = vec if d % vec == 0 else 1
        U = features_unroll(_problem(dtype, "sum", d=d), T)
        for L, m in ((62, 32), (500, 3), (3000, 1)):
            lanes = features_split_lanes(_problem(dtype, "sum", fixed=L, n=L * m, d=d), width, T.threads, sms)
            step = U * lanes
            shapes += [_fixed(length, m, d) for length in around(step * max(1, L // step))]
            if L == 62:  # each lane's last rows, 0 to U - 1 of them: every step of the tail
                shapes += [_fixed(step + t * lanes + 1, m, d) for t in range(U)]
            lengths = [int(v) for v in rng.integers(0, 2 * L, m)]
            lengths[m // 2] = 0
            shapes.append(_variable(("offsets", "lengths")[m % 2], tuple(lengths), d))
        per_pair = max(1, T.threads // (2 * (d // width)))  # pairs per block at two lanes
        shapes += [_fixed(17, count, d) for count in around(per_pair)]
    fam["features"] = shapes
    # features_long (forced for these small calls, as on a one-SM GPU: see test_nvrtc_kernel_families):
    # long segments (more than FEATURE_TILE_ROWS rows) starting at k * ROWS - 1, k * ROWS and
    # k * ROWS + 1, ending on a tile boundary and past it, first and last, one of exactly ROWS rows
    # (not long), one of ten tiles and more (the fix-up's loads eight at a time), amid short and
    # empty ones; d of 16 groups or more (features_reduce); and few segments, which features_split
    # takes even on one SM (four lanes: ten segments of 16 groups, partials added in shared memory;
    # 24 of 8 groups, by shuffles).  (Narrow rows, 64 bytes or less, are cut only where segments
    # are too short for lanes: features_long_rows.)
    from linred.backends.nvrtc.kernels import FEATURE_TILE_ROWS as rows

    shapes = []
    for d in (16 * vec, 16 * vec + 1):
        shapes.append(_variable("offsets", _long_lengths(rng, rows), d))
        shapes.append(_variable("lengths", _long_lengths(rng, rows)[::-1], d))
        shapes += [_variable(s, ls, d) for s, ls, _ in _styles(rng, [120, 90], 70)]
    few = (rows + 1, 5, 3 * rows + 7, 0, 2 * rows, 40, rows - 1, 10 * rows + 3, 17, 2 * rows - 1)
    shapes += [_variable("offsets", few, 16 * vec), _variable("lengths", few[::-1], 16 * vec)]
    more = (*few, 30, 0, 90, rows, 64, 3, 2 * rows + 1, 50, 70, 11, 0, 100, 4 * rows, 60)
    shapes += [_variable("offsets", more, 8 * vec), _variable("lengths", more[::-1], 8 * vec)]
    # Where segments are too few to fill the device and long (features_long_chunks: here three or
    # fewer, of more than 32,768 rows on average), a segment of more than 64 tiles is added a
    # chunk of 64 tiles at a time: 64 tiles from a tile boundary (one chain), 66 from a chunk's
    # first tile, 800 after a head (d = vec + 1, groups of one feature); 2,113 tiles (34 chunks,
    # the last of one tile) beside a short one.  Elsewhere one chain adds them: 258 tiles in
    # features_reduce, amid short segments.
    shapes += [_variable("offsets", (64 * rows, 65 * rows + 5, 7 + 800 * rows), vec + 1)]
    shapes += [_variable("lengths", (2113 * rows - 60, 5), vec + 1)]
    shorts = tuple(int(v) for v in rng.integers(0, 41, 40))
    shapes += [_variable("lengths", (*shorts[:20], 257 * rows + 3, *shorts[20:]), 16 * vec)]
    fam["features_long"] = shapes
    return fam


def _long_lengths(rng: np.random.Generator, rows: int) -> tuple[int, ...]:
    """Lengths of :func:`nvrtc_families`' features_long shapes: each long segment of ``(start,
    length)`` below reached through short segments (0 to 40 rows), some more short ones, and a long
    one last."""
    longs = [(0, rows + 1), (2 * rows - 1, rows), (4 * rows, 2 * rows), (6 * rows, 0), (6 * rows + 1, 2 * rows - 1),
             (9 * rows - 1, rows + 1), (11 * rows + 1, 10 * rows + 3), (23 * rows, 17 * rows)]  # fmt: skip
    lengths: list[int] = []
    pos = 0
    for start, length in [*longs, (42 * rows + 7, 3 * rows + 5)]:
        while pos < start:
            step = min(start - pos, int(rng.integers(0, 41)))
            lengths.append(step)
            pos += step
        lengths.append(length)
        pos += length
    return tuple(lengths)


def device_sms() -> int:
    if HAS_CUPY_GPU:
        return int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    import torch

    return int(torch.cuda.get_device_properties(0).multi_processor_count)


def gpu_kinds() -> list[str]:
    return [k for k, ok in (("cupy", HAS_CUPY_GPU), ("torch-cuda", HAS_TORCH_CUDA and HAS_CUPY_GPU)) if ok]


def host_kinds() -> list[str]:
    return ["numpy", "torch-cpu"] if HAS_TORCH else ["numpy"]


def library_shapes(rng: np.random.Generator) -> list:
    """Shapes for the library backends (cub, cublas, nvmath) and auto: their switch points."""
    cub = CUPY_CUB_MAX_LENGTH
    shapes = [_fixed(L, m) for L in around(cub, 2) for m in (1, 3, 64)]
    shapes += [_fixed(L, m, d) for L in (1, 5, 256, 1500) for m in (1, 7) for d in (0, 3, 16)]
    shapes += _styles(rng, [1, 9, 200, 2000], 40) + _styles(rng, [30, 5], 20, d=4)
    shapes.append(_variable("offsets", random_lengths(rng, 100, "one-huge", 150)))  # under the SpMM limit
    shapes += [_fixed(8, 500)]
    return shapes


def host_shapes(rng: np.random.Generator) -> list:
    """The numpy backend's and nvmath's host constants."""
    nb = numpy_backend
    shapes = [_fixed(L, m) for L in around(nb.BLAS_BLOCK, 2 * nb.BLAS_BLOCK, 3 * nb.BLAS_BLOCK // 2) for m in (1, 3)]
    # a segment's blocks added to the float64 totals one by one up to CHAIN_LONGEST of them
    chained = nb.CHAIN_LONGEST * nb.BLAS_BLOCK
    shapes += [_fixed(L, m) for L in around(chained, chained + nb.BLAS_BLOCK) for m in (1, 3)]
    shapes += [_fixed(L, 2, 3) for L in around(nb.CHAIN_LONGEST * nb.BLAS_BLOCK_FEATURES)]
    shapes += [_fixed(L, m, d) for L in around(nb.BLAS_BLOCK_FEATURES, 4 * nb.BLAS_BLOCK_FEATURES) for m in (1, 2)
               for d in (2, 5)]  # fmt: skip
    shapes += [_fixed(L, 2) for L in around(HOST_SPLIT_ABOVE, HOST_CHUNK * 7)]
    # conversion blocks (rows of BLOCK_ELEMENTS) and threads of reduceat (THREAD_ELEMENTS)
    rows = nb.BLOCK_ELEMENTS
    shapes += [_fixed(L, m) for L in (16, 3000) for m in around(rows // L)]
    shapes += [_fixed(4, m) for m in around(HOST_LEVELS_FROM // 4)]
    shapes += _styles(rng, around(nb.THREAD_ELEMENTS // 64, 2 * nb.THREAD_ELEMENTS // 64), 64)
    shapes += _styles(rng, [1, 3, 17, 400], 10) + _styles(rng, [6, 40], 12, d=3)
    shapes += [_fixed(L, m) for L in (1, 2, 3, 7, 32, 33) for m in (1, 5, 64)]
    # max, min and prod of short segments as elementwise calls over the columns (and sums of
    # L <= 2): across CHAIN_LONGEST
    shapes += [_fixed(L, m) for L in around(nb.CHAIN_LONGEST) for m in (1, 5, 64)]
    # short segments of narrow feature rows as one product with a stacked identity: L * d * d
    # across IDENTITY_PRODUCT_MAX (d = 4: L = 31, 32, 33) and the segments across its minimum
    m0 = nb.IDENTITY_PRODUCT_MIN_SEGMENTS
    shapes += [_fixed(L, m, 4) for L in around(nb.IDENTITY_PRODUCT_MAX // 16) for m in (m0,)]
    shapes += [_fixed(2, m, d) for m in around(m0) for d in (2, 3)]
    # feature rows with offsets in tiles of TILE_ROWS (more than TILE_MIN_SEGMENTS segments of
    # ROWS_LOOP_MIN_ROWS to TILE_MAX_ROWS rows on average, at least TILE_MIN_ELEMENTS): segment
    # lengths and the data's rows across the tiles (16 features; 3 where the call is not small),
    # the segment counts, mean lengths and elements across the switches, a segment's tiles across
    # TILE_COMBINE_STEPS, the elements across TILE_THREAD_ELEMENTS (and the chunks across
    # TILE_MIN_CHUNKS: 512 tiles of 64)
    T, few, least = nb.TILE_ROWS, nb.TILE_MIN_SEGMENTS + 1, nb.TILE_MIN_ELEMENTS

    def tiled(lengths: tuple[int, ...], d: int) -> tuple[str, tuple[int, ...], int]:
        """``lengths`` repeated to more than TILE_MIN_SEGMENTS segments and TILE_MIN_ELEMENTS elements."""
        reps = max(-(-few // len(lengths)), -(-least // (sum(lengths) * d)))
        return _variable("offsets", lengths * reps, d)

    def last(count: int, L: int, rows: int, e: int, d: int) -> tuple[str, tuple[int, ...], int]:
        """``count`` segments of ``L`` rows, the last one ending at ``rows + e``."""
        return _variable("lengths", (L,) * (count - 1) + (rows - L * (count - 1) + e,), d)

    shapes += [tiled((L, 300), d) for L in around(T, 2 * T) for d in (3, 16)]
    shapes += [last(few + 1, T, T * (few + 1), e, 16) for e in (-1, 0, 1)]
    shapes += [_variable("offsets", random_lengths(rng, m, "geometric", mean), d) for m in around(few - 1)
               for d, mean in ((3, 1000), (16, 200))]  # fmt: skip
    shapes += [last(few, R, R * few, e, 3) for R in (nb.TILE_MAX_ROWS,) for e in (-1, 0, 1)]
    shapes += [last(600, R, R * 600, e, 32) for R in (nb.ROWS_LOOP_MIN_ROWS,) for e in (-1, 0, 1)]
    shapes += [last(few, 127, least // 16, e, 16) for e in (-1, 0, 1)]
    steps = nb.TILE_COMBINE_STEPS
    shapes += [_variable("offsets", (L, *random_lengths(rng, few, "empty-runs", 300)), 16)
               for L in (steps * T, *around((steps + 1) * T))]  # fmt: skip
    shapes += [last(256, 256, nb.TILE_THREAD_ELEMENTS // 64, e, 64) for e in (-1, 0, 1)]
    # narrow rows of a small call (at most BLOCKED_MAX_FEATURES and BLOCKED_MAX_BYTES, or
    # BLOCKED_WIDE_MAX_BYTES past BLOCKED_NARROW_FEATURES; the 3-feature
    # tiled shapes above among them): reduceat over blocks of TILE_ROWS rows, segments across the
    # blocks, with empty ones
    shapes += [_variable("offsets", (L, 0) * 20, d) for L in around(T, 2 * T) for d in (2, 4)]
    shapes += [_variable("lengths", random_lengths(rng, 40, "empty-runs", 300), 8)]
    return shapes


def accuracy_cases(backends: list[str], kinds: list[str], longest: int) -> list[Case]:
    """m = 1 with very long float32 segments of positive values (errors add up), and feature rows."""
    cases = []
    for backend in backends:
        for i, kind in enumerate(kinds):
            for L in sorted({2**20, min(longest, 2**24), longest}):
                for reduction in ("sum", "mean"):
                    cases.append(Case("accuracy", backend, kind, "float32", reduction, "fixed", (L,), values="offset"))
                cases.append(Case("accuracy", backend, kind, "float32", "prod", "fixed", (L,)))
                cases.append(Case("accuracy", backend, kind, "float32", "sum", "offsets", (L,), values="offset"))
                cases.append(Case("accuracy", backend, kind, "float32", "sum", "fixed", (L // 2, L // 2),
                                  layout="strided", values="offset"))  # fmt: skip
                cases.append(Case("accuracy", backend, kind, "float32", "sum", "fixed", (L // 4,), d=4,
                                  values="offset"))  # fmt: skip
            cases.append(Case("accuracy", backend, kind, "float64", "sum", "fixed", (longest,), values="offset",
                              layout=("contiguous", "strided")[i % 2]))  # fmt: skip
    return cases


def _sample(cases: list[Case], keep: int) -> list[Case]:
    """Every ``keep``-th case, deterministically (CI's share of the suite)."""
    return cases[::keep] if keep > 1 else cases


def _run_all(cases: list[Case], seed: int) -> None:
    """Run every case (a refusal must be a documented one; see run_case); fail with the wrong
    ones, and skip, naming the refusals, when the backend refused every case."""
    rng = np.random.default_rng(seed)
    failures = []
    refused = []
    for case in cases:
        try:
            outcome = run_case(case, rng)
        except AssertionError as e:
            failures.append(str(e))
            DIFFERENTIAL["failed"] += 1
            continue
        DIFFERENTIAL["calls"] += 1
        if outcome != "ok":
            DIFFERENTIAL["refused"] += 1
            refused.append(outcome.removeprefix("refused: ").split(": ")[0])
    log = os.environ.get("LINRED_DIFF_LOG")
    if failures and log:  # written as they are found: a run cut short still leaves them
        with open(log, "a") as f:
            f.write("\n".join(failures) + "\n")
    if failures:
        shown = "\n".join(failures[:12])
        raise AssertionError(f"{len(failures)} of {len(cases)} calls wrong:\n{shown}")
    if cases and len(refused) == len(cases):
        backends = ", ".join(sorted({case.backend for case in cases}))
        pytest.skip(f"{backends} refused all {len(cases)} calls (declared): {', '.join(sorted(set(refused)))}")


# ---------------------------------------------------------------------------
# Host backends (these run in CI)
# ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _count(differential_counts):
    """Every test here reports how many calls it checked (see conftest.differential_counts)."""


HOST_BACKENDS = ["numpy", "auto"] + (["nvmath"] if backend_available("nvmath") else [])


def _host_cases(backend: str) -> list[Case]:
    rng = np.random.default_rng(7)
    layouts = (*LAYOUTS, *NUMPY_LAYOUTS)
    cases = []
    for i, dtype in enumerate(DTYPES):
        cases += expand("host", backend, host_kinds(), host_shapes(rng), dtypes=[dtype], layouts=layouts, seed=i)
    return _sample(cases, 4 if CI else 1)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_host_backends(backend):
    cases = _host_cases(backend)
    assert cases
    _run_all(cases, 11)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_host_accuracy_of_long_segments(backend):
    """float32 within 1e-6 of float64 relative to sum|x| for one segment of up to 2^22 (CI) / 2^24."""
    _run_all(accuracy_cases([backend], host_kinds(), LONGEST), 12)


def test_suite_covers_every_dtype_reduction_spec_layout():
    """The host sweep meets every dtype, reduction, spec, layout, kind, out= and check= value."""
    cases = [c for b in HOST_BACKENDS for c in _host_cases(b)]
    seen = {field: {getattr(c, field) for c in cases} for field in ("dtype", "reduction", "spec", "layout", "kind")}
    assert seen["dtype"] == set(DTYPES)
    assert seen["reduction"] == set(REDUCTIONS)
    assert seen["spec"] == {"fixed", "offsets", "lengths"}
    assert seen["layout"] == {*LAYOUTS, *NUMPY_LAYOUTS}
    assert seen["kind"] == set(host_kinds())
    assert {c.out for c in cases} == {True, False} and {c.check for c in cases} == {True, False}
    assert any(c.d for c in cases) and any(0 in c.lengths for c in cases)


def test_boundaries_straddle_the_constants():
    """The shapes cross each host constant at k*T - 1, k*T and k*T + 1 (read from the code)."""
    rng = np.random.default_rng(0)
    lengths = {c[1][0] for c in host_shapes(rng) if c[0] == "fixed"}
    nb = numpy_backend
    for T in (nb.BLAS_BLOCK, nb.BLAS_BLOCK_FEATURES, HOST_SPLIT_ABOVE, nb.CHAIN_LONGEST):
        assert {T - 1, T, T + 1} <= lengths, T
    narrow = [c for c in host_shapes(rng) if c[0] == "fixed" and c[2] in (2, 3, 4)]
    T = numpy_backend.IDENTITY_PRODUCT_MAX
    assert {T - 16, T, T + 16} <= {c[1][0] * 16 for c in narrow if c[2] == 4}
    T = numpy_backend.IDENTITY_PRODUCT_MIN_SEGMENTS
    assert {T - 1, T, T + 1} <= {len(c[1]) for c in narrow if c[1][0] == 2}
    # feature rows with offsets: the tiles' constants
    nb = numpy_backend
    rows = [c for c in host_shapes(rng) if c[0] != "fixed" and c[2] in (3, 16, 32, 64)]
    T, m0 = nb.TILE_ROWS, nb.TILE_MIN_SEGMENTS

    def sized(c: tuple) -> bool:  # for the tiles, but for the segment count
        m, n, d = len(c[1]), sum(c[1]), c[2]
        fits = n * d >= nb.TILE_MIN_ELEMENTS and n * d >= nb.ROWS_LOOP_MIN_ELEMENTS * m
        return fits and nb.ROWS_LOOP_MIN_ROWS * m <= n < nb.TILE_MAX_ROWS * m

    # served by the tiles (data of the accumulation dtype, C-contiguous)
    tiled = [c for c in rows if len(c[1]) > m0 and sized(c)]
    assert {T - 1, T, T + 1} <= {L for c in tiled if c[2] == 16 for L in c[1]}
    for d in (3, 16):
        assert {2 * T - 1, 2 * T, 2 * T + 1} <= {L for c in tiled if c[2] == d for L in c[1]}, d
        assert {m0 - 1, m0, m0 + 1} <= {len(c[1]) for c in rows if c[2] == d and sized(c)}
    assert any({k * T - 1, k * T, k * T + 1} <= {sum(c[1]) for c in tiled} for k in range(1, 1000))
    for R in (nb.TILE_MAX_ROWS, nb.ROWS_LOOP_MIN_ROWS):
        assert {-1, 0, 1} <= {sum(c[1]) - R * len(c[1]) for c in rows if len(c[1]) > m0}, R
    E = nb.TILE_MIN_ELEMENTS
    assert {E - 16, E, E + 16} <= {sum(c[1]) * c[2] for c in rows if c[2] == 16 and len(c[1]) > m0}
    S = nb.TILE_COMBINE_STEPS  # tiles a segment spans after its first
    assert {S - 1, S, S + 1} <= {(c[1][0] - 1) // T for c in tiled}
    E = nb.TILE_THREAD_ELEMENTS
    assert {E - 64, E, E + 64} <= {sum(c[1]) * c[2] for c in tiled}
    assert {nb.TILE_MIN_CHUNKS * 64 * T + e for e in (-1, 0, 1)} <= {sum(c[1]) for c in tiled if c[2] == 64}
    fam = nvrtc_families("float32", 132)
    small = {(c[1][0], len(c[1])) for c in fam["fixed_small"]}
    per_chunk = TUNING.threads * TUNING.unroll * 4
    assert {(1, per_chunk - 1), (1, per_chunk), (1, per_chunk + 1)} <= small


# ---------------------------------------------------------------------------
# GPU backends
# ---------------------------------------------------------------------------

GPU_FAMILIES = ("fixed_small", "fixed_rows", "fixed_long", "warp_reduce", "warp_shifted", "tile_reduce", "tile_columns",
                "features", "features_long")  # fmt: skip


REAL_DTYPES = [d for d in DTYPES if d not in ("complex64", "complex128")]  # nvrtc refuses complex data


def _nvrtc_cases(family: str, dtype: str) -> list[Case]:
    features = ("contiguous", "axis-1", "misaligned")
    layouts = {"tile_reduce": ("strided", "misaligned", "reversed"), "tile_columns": COLUMN_LAYOUTS,
               "features": features, "features_long": features,
               "warp_shifted": ("misaligned", "misaligned-3")}  # fmt: skip
    shapes = nvrtc_families(dtype, device_sms()).get(family, [])
    lay = layouts.get(family, ("contiguous", "axis-1"))
    return list(expand(family, "nvrtc", gpu_kinds(), shapes, dtypes=[dtype], layouts=lay, seed=DTYPES.index(dtype)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", REAL_DTYPES)
@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_nvrtc_kernel_families(family, dtype):
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    cases = _nvrtc_cases(family, dtype)
    if not cases:
        pytest.skip(f"no {family} shapes for {dtype}")
    if family != "features_long":
        _run_all(cases, zlib.crc32(f"{family}-{dtype}".encode()))
        return
    # Long segments are cut into tiles in large calls only, and features_split takes these few
    # segments on a GPU of many SMs.
    with long_feature_segments_forced():
        _run_all(cases, zlib.crc32(f"{family}-{dtype}".encode()))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", ["cub", "cublas", "nvmath", "auto"])
def test_library_backends(backend, dtype):
    shapes = library_shapes(np.random.default_rng(3))
    i = DTYPES.index(dtype)
    _run_all(list(expand("library", backend, gpu_kinds(), shapes, dtypes=[dtype], layouts=LAYOUTS, seed=i)), 5 + i)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["nvrtc", "cub", "cublas", "nvmath", "auto"])
def test_gpu_accuracy_of_long_segments(backend):
    """float32 within 1e-6 relative to sum|x| for one segment of up to 2^26 elements, every backend."""
    _run_all(accuracy_cases([backend], gpu_kinds(), 2**26), 13)


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(6))  # six independent draws of 25 (spread over workers)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=False)
@given(
    backend=st.sampled_from(["auto", "nvrtc", "cub"]),
    dtype=st.sampled_from([d for d in DTYPES if d not in ("complex64", "complex128")]),
    reduction=st.sampled_from(REDUCTIONS),
    spec=st.sampled_from(["fixed", "offsets", "lengths"]),
    m=st.integers(1, 10**5),
    length=st.integers(1, 10**4),
    style=st.sampled_from(STYLES),
    layout=st.sampled_from(["contiguous", "strided", "misaligned", "axis-1"]),
    kind_index=st.integers(0, 1),
    flags=st.tuples(st.booleans(), st.booleans()),
    seed=st.integers(0, 2**32 - 1),
)
def test_gpu_hypothesis(shard, backend, dtype, reduction, spec, m, length, style, layout, kind_index, flags, seed):
    """Random calls with m up to 10^5 and L up to 10^4 (n capped at 2^23 elements)."""
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    kinds = gpu_kinds()
    kind = kinds[kind_index % len(kinds)]
    if kind == "cupy" and dtype == "bfloat16":
        kind = "torch-cuda" if "torch-cuda" in kinds else kind
        dtype = dtype if kind != "cupy" else "float16"
    if reduction in ("max", "min") and dtype == "bool" and backend == "cublas":
        backend = "auto"
    rng = np.random.default_rng(seed)
    length = max(1, min(length, 2**23 // m))
    if spec == "fixed":
        lengths = (length,) * m
    else:
        lengths = random_lengths(rng, m, style, length)
        total = sum(lengths)
        if total > 2**23:
            scale = 2**23 / total
            lengths = tuple(int(v * scale) for v in lengths)
    out, check = flags
    case = Case("hypothesis", backend, kind, dtype, reduction, spec, lengths, 0, layout, out, check)
    _run_all([case], seed)


# ---------------------------------------------------------------------------
# The composed functions: logsumexp, softmax, log_softmax, var and std (one kernel on a GPU)
# ---------------------------------------------------------------------------

COMPOSED = ("logsumexp", "softmax", "log_softmax", "var", "std")


def _composed_reference(name: str, x: np.ndarray, offsets: np.ndarray, ddof: int = 0) -> np.ndarray:
    """``segmented_<name>`` of ``x`` (n, D) along axis 0, in float64, written without linred's
    code: the rules of tests/test_fused.py's reference, vectorized per segment."""
    x = x.astype(np.float64)
    per_element = name in ("softmax", "log_softmax")
    out = np.empty_like(x) if per_element else np.empty((len(offsets) - 1, x.shape[1]))
    with np.errstate(all="ignore"):
        for s, (a, b) in enumerate(itertools.pairwise(offsets)):
            seg = x[a:b]
            nan = np.isnan(seg).any(axis=0)
            mx = np.where(np.isnan(seg), -np.inf, seg).max(axis=0, initial=-np.inf)
            finite = np.isfinite(mx)
            safe = np.where(finite, mx, 0.0)
            total = np.exp(seg - safe).sum(axis=0)
            if name == "logsumexp":
                out[s] = np.where(nan, np.nan, np.where(finite, safe + np.log(total), mx))
            elif per_element:
                bad = nan | ~finite
                r = np.exp(seg - safe) / total if name == "softmax" else seg - safe - np.log(total)
                out[a:b] = np.where(bad, np.nan, r)
            else:
                k = b - a
                broken = ~np.isfinite(seg).all(axis=0) | (k <= ddof)
                mean = seg.mean(axis=0) if k else np.zeros(x.shape[1])
                var = ((seg - mean) ** 2).sum(axis=0) / max(k - ddof, 1)
                var = np.where(broken, np.nan, var)
                out[s] = np.sqrt(var) if name == "std" else var
    return out


def _composed_shapes() -> list[tuple[int, tuple[int, ...]]]:
    """(features D, segment lengths) crossing the softmax kernel's steps: a warp covers 32 / D rows
    of D features per step (D a power of two up to 32) with 4 loads in flight (8 for 2- and 4-byte
    data), so lengths at k * 4 * 32 / D - 1, k * 4 * 32 / D and + 1 and at twice those; a thread
    per feature for other D; with empty and length-1 segments, and (for D = 1) more segments than
    one grid pass."""
    shapes = []
    for d in (1, 2, 4, 8, 16, 32, 3, 33):
        step = 4 * (32 // d) if d <= 32 and d & (d - 1) == 0 else 4
        lengths = [0, 1, *around(step, 2 * step, 4 * step), 5]
        shapes.append((d, tuple(lengths * 3)))
    shapes.append((1, (7,) * 20_000 + (0, 300, 1)))  # 20,003 segments
    return shapes


#: lengths crossing the steps of a warp whose lanes read 16-bit data of one feature two rows a
#: load (softmax.cuh: load_pairs): a pair, a step of the lanes (64 rows) and a loop step (256), the
#: segments starting at odd and even rows
PAIR_LENGTHS = (0, 1, 2, 3, *around(2, 64, 128, 256, 512), 1, 5) * 3


def _composed_cases(kinds: list[str]) -> list[tuple]:
    cases = []
    for kind in kinds:
        for name in COMPOSED:
            for i, (d, lengths) in enumerate(_composed_shapes()):
                dtype = ("float32", "float64", "float16")[i % 3]
                spec = ("offsets", "lengths", "fixed")[i % 3]
                if spec == "fixed":  # the same lengths as one fixed length (their maximum)
                    lengths = (max(max(lengths), 1),) * (len(lengths) // 3)
                cases.append((kind, name, d, lengths, dtype, spec, i))
            for j, spec in enumerate(("offsets", "lengths")):  # (16-bit data a pair of rows a load)
                cases.append((kind, name, 1, PAIR_LENGTHS, "float16", spec, 100 + j))
    return cases


def _run_composed(cases: list[tuple]) -> None:
    from support import to_kind, to_numpy

    import linred

    failures = []
    for kind, name, d, lengths, dtype, spec, seed in cases:
        rng = np.random.default_rng(seed)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        n = int(offsets[-1])
        x = (rng.normal(size=(n, d)) * 4).astype(dtype)
        if n > 8 and name not in ("var", "std"):  # special values in the first column
            x[1, 0], x[min(5, n - 1), 0] = np.inf, np.nan
            first = next((int(a) for a, b in itertools.pairwise(offsets) if b - a > 1), None)
            if first is not None:
                x[first : first + 2, 0] = -np.inf
        kw = (
            {"segment_length": lengths[0]}
            if spec == "fixed"
            else {spec: to_kind(np.diff(offsets) if spec == "lengths" else offsets, kind)}
        )
        xd = to_kind(x if d > 1 else x[:, 0], kind)
        got = to_numpy(getattr(linred, f"segmented_{name}")(xd, **kw)).astype(np.float64)
        ref = _composed_reference(name, x, offsets)
        if d == 1:
            ref = ref[:, 0]
        tol = {"float64": 1e-11, "float32": 2e-5, "float16": 1e-2}[dtype]
        scale = np.maximum(1.0, np.abs(np.where(np.isfinite(ref), ref, 0.0)))
        with np.errstate(invalid="ignore"):  # (inf - inf where both are inf: isclose decides those)
            ok = np.isclose(got, ref, rtol=tol, atol=0, equal_nan=True) | (np.abs(got - ref) <= tol * scale)
        DIFFERENTIAL["calls"] += 1
        if not ok.all():
            DIFFERENTIAL["failed"] += 1
            at = np.argwhere(~ok)[0]
            failures.append(f"{kind} {name} {dtype} {spec} D={d} m={len(lengths)}: at {tuple(at)} got "
                            f"{got[tuple(at)]!r}, float64 {ref[tuple(at)]!r}")  # fmt: skip
    assert not failures, "\n".join(failures[:20])


def test_composed_functions_on_the_host():
    """The composed functions of NumPy and CPU torch data against float64, at the softmax kernel's
    step boundaries (on the host they are composed: the same shapes as the GPU test below)."""
    _run_composed(_composed_cases(host_kinds()))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("group", [None, 1, 4, 32])
def test_composed_functions_on_the_gpu(monkeypatch, group):
    """The same on CuPy arrays and CUDA tensors, through the kernel (which these shapes' few
    segments would otherwise leave to the composition, tested on the host above), with the lanes
    per worker it chooses by the mean length (None) and with a thread, groups of 4 lanes and a
    warp per worker."""
    from linred import _softmax_kernel

    monkeypatch.setattr(_softmax_kernel, "MIN_WORKERS_PER_SM", 0)
    monkeypatch.setattr(_softmax_kernel, "GROUP", group)
    monkeypatch.setattr(_softmax_kernel, "PAIRS_MIN_ROWS", 0)  # (16-bit data: pairs of rows in short segments too)
    _run_composed(
        _composed_cases(
            [
                k
                for k in ("cupy", "torch-cuda")
                if (k == "cupy" and HAS_CUPY_GPU) or (k == "torch-cuda" and HAS_TORCH_CUDA)
            ]
        )
    )
