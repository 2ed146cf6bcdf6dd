#!/usr/bin/env python3
"""Run NVIDIA compute-sanitizer over every NVRTC kernel entry point of linred.

A *driver* (``--driver``) makes, inside one Python process, a list of calls that reach
every kernel linred compiles at run time, on small shapes that straddle the kernels'
tiling boundaries (``k*T - 1``, ``k*T``, ``k*T + 1`` for the tile constants ``T`` read
from ``linred.backends.nvrtc``), checks every result against a float64 NumPy reference
and checks that each call launched the entry points linred's planning rules say it
should.  The *parent* (the default mode) runs the driver once natively (which also fills
the kernel cache, so that the sanitized runs compile nothing), then once under each of
``compute-sanitizer --tool memcheck|racecheck|initcheck|synccheck``, parses every
tool's ``ERROR SUMMARY`` and prints a table.

The entry points.  ``linred/backends/nvrtc/`` (wrappers of
``linred/kernels/*.cuh``): ``linred_fixed`` (``fixed_small`` and ``fixed_rows``),
``linred_staged`` (``fixed_staged``), ``linred_long`` (``fixed_long``),
``linred_warp`` + ``linred_fixup`` (``warp_reduce``),
``linred_tile`` + ``linred_fixup`` + ``linred_bounds`` (``tile_reduce``),
``linred_features`` (``features_reduce``).  ``tile_reduce`` with 16-byte vector loads
(``linred_tile:vecload``) is planned for aligned feature columns that are not contiguous
and for aligned rows with 2**31 segments or more; the driver reaches the second by calling
``nvrtc.executors._TileExecutor`` directly.
``linred/kernels/elementwise.py`` (CuPy ``ElementwiseKernel``, compiled with NVRTC, run by the
``cub`` backend): ``linred_strided_*``, ``linred_divide_by_lengths_*``,
``linred_fill_empty``, ``linred_cast_bf16``.  ``linred/backends/cub/operators.py``'s
operators are LTO-IR that cuda.compute links into CUB's kernels (not kernels of their
own): the driver records which ones its ``cub`` calls build (``op:linred_*``), and the
sanitizers check them inside the CUB kernels.

Examples
--------
On the GPU machine, from the repository root, all four tools (logs in ``$OUT/sanitize``)::

    PYTHONPATH=$PWD:/tmp/site python tools/sanitize_kernels.py --log-dir $OUT/sanitize

Fewer calls (only the ``k*T`` member of every boundary triple), two tools::

    PYTHONPATH=$PWD:/tmp/site python tools/sanitize_kernels.py --quick --tools memcheck,racecheck

Without a GPU: the planned calls and the entry points each should reach::

    python tools/sanitize_kernels.py --list

Notes
-----
- Flags: ``--report-api-errors no --error-exitcode 99 --target-processes all
  --print-limit 1000 --log-file <log>``; racecheck adds ``--racecheck-report
  analysis``.  No kernel filter by default: every kernel of the driver process is
  checked (nearly all are linred's: ``backend=`` is pinned, the data and offsets are
  copied from the host with ``cudaMemcpy``, offsets are not validated (``check=False``),
  the references are computed on the host).  ``--kernel-filter linred`` passes
  ``--kernel-name kns=linred_`` instead (the CUB kernels are then not checked, and
  initcheck may count memory written by unchecked kernels as uninitialized).
- initcheck: an error attributed to a kernel that is not linred's (CuPy's, PyTorch's,
  CUB's internals, whose scratch reads are known false positives of initcheck) is
  listed but does not fail the run unless ``--strict``; errors in ``linred_*`` kernels
  and host API errors (e.g. copying a result with unwritten elements back) always do.
  The other tools fail on any error.
- Allocations are exact, so memcheck sees overruns: CuPy's memory pool is switched off
  (``cupy.cuda.set_allocator(None)``) and PyTorch's caching allocator too
  (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``).
- Tools run concurrently (``--parallel``, default 4) on the one GPU; ``--parallel 1``
  runs them one after another.  Each has its own ``--timeout`` (seconds, default 420).
  The native run is split into ``--jobs`` processes, which compile into a shared
  temporary kernel cache (``LINRED_CACHE_DIR``), removed at the end.
- Which entry points a call should reach: ``linred.backends.nvrtc.route`` itself (no GPU
  touched), then the executors' run-time rule (data that is not 16-byte aligned goes to
  ``tile_reduce``, via ``nvrtc.kernels.rows_aligned``).  Two rules without a function of
  their own are reproduced: the tiles per run (``_Runs.__init__``) and when
  ``tile_reduce`` needs its fix-up (``_TileExecutor.__init__``).  Launches are counted by
  wrapping the names ``get_kernels`` and ``PackedLaunch`` of ``linred.backends.nvrtc.executors``
  (``linred.kernels.compiler.get_kernels`` and ``cuda.core.launch``); some calls plan
  with ``_Launcher.sms`` set to 1, so that small data gets several tiles per run.
- Exit status: 0 clean and correct; 1 a tool reported errors, a result was wrong, an
  entry point was not reached or a run timed out or crashed; 2 compute-sanitizer, CuPy,
  a GPU or linred's nvrtc backend is missing (a one-line reason, no traceback).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
REDUCTIONS = ("sum", "mean", "max", "min")
GROUPS = ("nvrtc", "cub")

#: the entry points of linred/backends/nvrtc/ (``name:variant`` where one name has variants)
NVRTC_ENTRY_POINTS = (
    "linred_fixed:fixed_small",
    "linred_fixed:fixed_rows",
    "linred_staged",
    "linred_long",
    "linred_warp",
    "linred_tile",
    "linred_tile:vecload",
    "linred_bounds",
    "linred_fixup",
    "linred_features",
    "linred_features_split",
)
#: the CuPy ElementwiseKernels of linred/kernels/elementwise.py (by name prefix)
CUPY_ENTRY_POINTS = ("linred_strided", "linred_divide_by_lengths", "linred_fill_empty", "linred_cast_bf16")
#: warp_reduce reads the offsets of a tile's segment starts 64 at a time (warp.cuh, warp_reduce:
#: a constant of the CUDA source only, not of the Python code)
OFFSETS_PER_READ = 64

RESULT_MARK = "SANITIZE-DRIVER-RESULT "
EXIT_UNAVAILABLE = 2
SANITIZER_EXIT = 99


class Unavailable(Exception):
    """Something the run needs is missing (exit 2 with the message)."""


# ---------------------------------------------------------------------------------------------
# Cases and shape sets
# ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One call: the data's layout, its segments and what it should reach."""

    name: str
    reduction: str
    dtype: str
    kind: str  #: "cupy" or "torch"
    shape: tuple[int, ...]  #: the logical shape of x
    axis: int
    #: contig | offset1 | stride2 | rows_pad | rows_offset1 | columns (the transpose of (d, n) data)
    #: | cols_stride2 (every other column of (n, 2d) data)
    layout: str = "contig"
    L: int | None = None
    lengths: np.ndarray | None = None  #: segment lengths (offsets), None for a fixed length
    index_dtype: str = "int64"
    out_dtype: str | None = None  #: the dtype= argument
    backend: str = "nvrtc"
    sms: int | None = None  #: SM count the nvrtc executors plan with (more tiles per run on small data)
    #: "tile": run nvrtc._TileExecutor directly (its vector-load variant); "features_long":
    #: nvrtc._FeaturesExecutor with every segment past FEATURE_TILE_ROWS rows left to tiles
    direct: str | None = None
    declared: tuple[str, ...] = ()  #: entry points a cub-group call must reach
    value: int | None = None  #: the value of its set's quantity

    @property
    def n(self) -> int:
        return self.shape[self.axis]

    @property
    def m(self) -> int:
        return len(self.lengths) if self.lengths is not None else self.n // self.L

    @property
    def offsets(self) -> np.ndarray:
        if self.lengths is None:
            return np.arange(0, self.n + 1, self.L, dtype=np.int64)
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    def describe(self) -> str:
        if self.lengths is None:
            seg = f"L={self.L} m={self.m}"
        else:
            ln = self.lengths
            seg = f"offsets({self.index_dtype}) m={len(ln)} len {int(ln.min())}..{int(ln.max())}"
            seg += f" empty={int((ln == 0).sum())}"
        extra = "".join(
            [
                f" dtype={self.out_dtype}" if self.out_dtype else "",
                f" sms={self.sms}" if self.sms else "",
                f" direct={self.direct}" if self.direct else "",
                f" backend={self.backend}" if self.backend != "nvrtc" else "",
            ]
        )
        return (
            f"{self.kind:5} {self.dtype:8} {self.reduction:4} shape={self.shape} axis={self.axis} "
            f"{self.layout} {seg}{extra}"
        )


@dataclass
class ShapeSet:
    """Calls aimed at one kernel; with ``T``, the calls put ``quantity`` at k*T-1, k*T, k*T+1."""

    name: str
    target: str
    quantity: str | None = None  #: m | L | n | lv | starts (see measure)
    T: int | None = None
    k: int = 1
    why: str = ""
    cases: list[Case] = field(default_factory=list)
    tile: int | None = None  #: for quantity "starts": the tile whose segment starts are counted

    @property
    def values(self) -> tuple[int, ...]:
        if self.T is None:
            return ()
        c = self.k * self.T
        return (c - 1, c, c + 1)


def measure(case: Case, quantity: str, tile: int | None = None) -> int:
    """The value of ``quantity`` in ``case``, computed from its shape and segments.

    m: segments per row; L: the fixed length, or the one length of uniform offsets; n: the
    length of the segment axis; lv: L in 16-byte vectors; starts: segment starts in the
    first ``tile`` elements; runs: tiles of ``tile`` elements per row (runs of one tile each).
    """
    if quantity == "m":
        return case.m
    if quantity == "n":
        return case.n
    if quantity in ("L", "lv"):
        if case.lengths is None:
            length = case.L
        else:
            (length,) = set(case.lengths.tolist())
        return length if quantity == "L" else length * _itemsize(case.dtype) // 16
    if quantity == "starts":
        offsets = case.offsets[:-1][case.lengths > 0]
        return int((offsets < tile).sum())
    if quantity == "runs":
        return -(-case.n // tile)
    raise ValueError(quantity)


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _lengths_to(n: int, lo: int, hi: int, rng: np.random.Generator, p_empty: float = 0.0) -> np.ndarray:
    """Random lengths in [lo, hi] (a share ``p_empty`` of them 0) summing to exactly n, then two empty ones."""
    out: list[int] = []
    total = 0
    while total < n:
        v = 0 if rng.random() < p_empty else int(rng.integers(lo, hi + 1))
        v = min(v, n - total)
        out.append(v)
        total += v
    return np.array([*out, 0, 0], dtype=np.int64)


def _nvrtc() -> types.ModuleType:
    """linred.backends.nvrtc: the backend, its options and ``route`` (imports no CUDA library)."""
    return importlib.import_module("linred.backends.nvrtc")


def _nvrtc_kernels() -> types.ModuleType:
    """linred.backends.nvrtc.kernels: the kernels' launch shapes and sources (pure arithmetic)."""
    return importlib.import_module("linred.backends.nvrtc.kernels")


def _nvrtc_executors() -> types.ModuleType:
    """linred.backends.nvrtc.executors (imports cuda.core: the driver only)."""
    return importlib.import_module("linred.backends.nvrtc.executors")


def _run_with_k(k_of: Callable[[int], int], tile: int, max_k: int, target: int = 1 << 18) -> tuple[int, int]:
    """(k, m): the most tiles per run k >= 2 (a power of two up to max_k) that ``k_of`` (n -> k) gives
    for all of m segments of length k*tile - 1, k*tile and k*tile + 1, with m*k*tile near ``target``."""
    ks = [k for k in (2**i for i in range(max_k.bit_length())) if 2 <= k <= max_k]
    for k in reversed(ks):
        run = k * tile
        m = max(2, target // run)
        if all(k_of(m * v) == k for v in (run - 1, run, run + 1)):
            return k, m
    return 1, max(2, target // tile)


class Constants:
    """The tile constants, read from linred.backends.nvrtc through probe problems."""

    def __init__(self) -> None:
        self.nv = _nvrtc_kernels()
        self.t = _nvrtc().BACKEND.options

    def probe(self, reduction: str, dtype: str, L: int) -> Any:
        return _problem_of(Case("probe", reduction, dtype, "cupy", (2 * L,), 0, L=L))

    def vec(self, dtype: str) -> int:
        return self.nv.vec(self.probe("sum", dtype, 64))

    def fixed_chunk(self, reduction: str, dtype: str, L: int) -> tuple[str, int]:
        """(kernel, elements per block chunk) of fixed_small/fixed_rows for length L."""
        p = self.probe(reduction, dtype, L)
        kernel, unroll = self.nv.fixed_layout(p, self.t)
        return kernel, self.t.threads * unroll * self.nv.vec(p)

    def long_chunk(self, reduction: str, dtype: str, L: int) -> int:
        """Vectors per block chunk of fixed_long for length L."""
        p = self.probe(reduction, dtype, L)
        return self.nv.long_threads(p, self.t) * self.nv.long_unroll(p, self.t)

    def warp_tile(self, reduction: str, dtype: str) -> int:
        return 32 * self.nv.warp_items(self.probe(reduction, dtype, 64))

    def warp_k(self, n: int, sms: int, b: int = 1, wt: int = 512) -> int:
        t = self.t
        return self.nv.tiles_per_run(b, n, wt, t.max_tiles_per_warp, t.warp_runs_per_sm, sms)

    def tile_k(self, n: int, sms: int, b: int = 1) -> int:
        t = self.t
        return self.nv.tile_tiles_per_run(b, n, t, sms)


def _triple(
    sets: list[ShapeSet], name: str, target: str, quantity: str, T: int, k: int, why: str,
    make: Callable[[str, int], Case],
) -> None:  # fmt: skip
    s = ShapeSet(name, target, quantity, T, k, why)
    for v in s.values:
        case = make(f"{name}/{quantity}={v}", v)
        case.value = v
        s.cases.append(case)
    sets.append(s)


def _singles(sets: list[ShapeSet], name: str, target: str, cases: Sequence[Case]) -> None:
    sets.append(ShapeSet(name, target, cases=list(cases)))


def build_sets(quick: bool = False, groups: Sequence[str] = GROUPS) -> list[ShapeSet]:
    """Every shape set of the driver (``quick``: only the k*T member of each triple)."""
    c = Constants()
    sets: list[ShapeSet] = []
    if "nvrtc" in groups:
        _fixed_small_sets(sets, c)
        _fixed_rows_sets(sets, c)
        _fixed_staged_sets(sets)
        _fixed_long_sets(sets, c)
        _warp_sets(sets, c)
        _tile_sets(sets, c)
        _features_sets(sets, c)
    if "cub" in groups:
        _cub_sets(sets)
    if quick:
        for s in sets:
            if s.T is not None:
                s.cases = [x for x in s.cases if x.value == s.k * s.T]
    return sets


def _fixed_small_sets(sets: list[ShapeSet], c: Constants) -> None:
    # (dtype, reduction, kind, L as a multiple of the vector, k): m straddles k block chunks
    specs = [
        ("float32", "sum", "cupy", 1.0, 1),
        ("float16", "mean", "torch", 1.0, 2),
        ("int8", "max", "cupy", 4.0, 1),
        ("float64", "min", "torch", 1.0, 1),
        ("bool", "sum", "cupy", 32.0, 1),  # the longest fixed_small length: 32 vectors
        ("uint8", "max", "torch", 1.0, 1),
        ("float32", "max", "cupy", 0.5, 1),  # L < vec: odd m leaves n off the vector (-> warp_reduce)
        ("int32", "mean", "cupy", 8.0, 1),
    ]
    for dtype, red, kind, per_vec, k in specs:
        L = int(per_vec * c.vec(dtype))
        kernel, chunk = c.fixed_chunk(red, dtype, L)  # fixed_small unless the tuning changed
        _triple(
            sets, f"{kernel}/{dtype}-{red}-L{L}", f"linred_fixed:{kernel}", "m", chunk // L, k,
            f"segments per block chunk = threads*unroll*vec/L = {chunk}/{L}",
            lambda name, m, dtype=dtype, red=red, kind=kind, L=L: Case(name, red, dtype, kind, (m * L,), 0, L=L),
        )  # fmt: skip


def _fixed_rows_sets(sets: list[ShapeSet], c: Constants) -> None:
    t = c.t
    specs = [  # (dtype, reduction, kind, warp-rows per segment, k, batch)
        ("float32", "sum", "cupy", 2, 1, 1),
        ("float32", "max", "torch", t.max_rows, 2, 1),  # the longest fixed_rows length
        ("float16", "mean", "cupy", 4, 1, 1),
        ("float64", "min", "torch", 2, 1, 1),
        ("int32", "sum", "cupy", 4, 1, 3),  # rows of a batch, one flat run
    ]
    for dtype, red, kind, rows, k, b in specs:
        L = rows * 32 * c.vec(dtype)
        kernel, chunk = c.fixed_chunk(red, dtype, L)  # fixed_rows unless the tuning changed

        def make(name: str, m: int, dtype: str = dtype, red: str = red, kind: str = kind, L: int = L, b: int = b):
            shape, axis = ((m * L,), 0) if b == 1 else ((b, m * L), 1)
            return Case(name, red, dtype, kind, shape, axis, L=L)

        _triple(sets, f"{kernel}/{dtype}-{red}-L{L}-b{b}", f"linred_fixed:{kernel}", "m", chunk // L, k,
                f"segments per block chunk = threads*max(unroll, rows)*vec/L = {chunk}/{L}", make)  # fmt: skip
    _singles(sets, "fixed_rows/misaligned", "linred_tile", [
        Case("fixed_rows/misaligned/float32-sum", "sum", "float32", "cupy", (8 * 256,), 0, "offset1", L=256),
        Case("fixed_small/misaligned/float32-mean", "mean", "float32", "torch", (4096 + 64,), 0, "offset1", L=8),
    ])  # fmt: skip


def _fixed_staged_sets(sets: list[ShapeSet]) -> None:
    # (dtype, reduction, kind, L, k): a tile is threads (256, or 128 for segments over 128 bytes)
    # times max(1, 64 // segment bytes) segments; m crosses it (the last tile short, loaded
    # element by element)
    specs = [
        ("float32", "sum", "cupy", 3, 1),
        ("float16", "mean", "torch", 7, 2),
        ("float64", "max", "cupy", 31, 1),  # 248 bytes: 128 threads
        ("int8", "sum", "cupy", 255, 1),  # the longest, into int64
        ("uint8", "min", "torch", 6, 1),
    ]
    for dtype, red, kind, L, k in specs:
        size = L * _itemsize(dtype)
        threads, spt = (256 if size <= 128 else 128), max(1, 64 // size)
        _triple(
            sets, f"fixed_staged/{dtype}-{red}-L{L}", "linred_staged", "m", threads * spt, k,
            f"segments per tile = threads*segments per thread = {threads}*{spt}",
            lambda name, m, dtype=dtype, red=red, kind=kind, L=L: Case(name, red, dtype, kind, (m * L,), 0, L=L),
        )  # fmt: skip
    _singles(sets, "fixed_staged/other", "linred_staged", [
        Case("fixed_staged/float16-max-batch", "max", "float16", "torch", (3, 5 * 700), 1, L=5),
    ])  # fmt: skip


def _fixed_long_sets(sets: list[ShapeSet], c: Constants) -> None:
    t = c.t
    big = 1 << 22
    for dtype, red, kind, k, m in (("float32", "sum", "cupy", 1, 3), ("float16", "max", "torch", 2, 2)):
        vec = c.vec(dtype)
        chunk = c.long_chunk(red, dtype, big)  # the largest chunk, in vectors
        _triple(
            sets, f"fixed_long/{dtype}-{red}-chunks", "linred_long", "lv", chunk, k,
            f"vectors per block chunk at full size = long_threads*unroll = {chunk}",
            lambda name, lv, dtype=dtype, red=red, kind=kind, vec=vec, m=m: Case(
                name, red, dtype, kind, (m * lv * vec,), 0, L=lv * vec
            ),
        )  # fmt: skip
    # threads per block halve while 2 * threads > lv: lv around 2 * long_threads
    dtype, vec = "float64", c.vec("float64")
    _triple(
        sets, "fixed_long/float64-mean-threads", "linred_long", "lv", 2 * t.long_threads, 1,
        f"threads halve below lv = 2*long_threads = {2 * t.long_threads} (lv=512 is a power of two: fixed_rows)",
        lambda name, lv: Case(name, "mean", dtype, "torch", (4 * lv * vec,), 0, L=lv * vec),
    )  # fmt: skip
    # the shortest fixed_long length, long_min_bytes; L-1 and L+1 are not whole vectors (-> warp_reduce)
    shortest = t.long_min_bytes // _itemsize("int32")
    _triple(
        sets, "fixed_long/int32-min-shortest", "linred_long", "L", shortest, 1,
        f"long_min_bytes/itemsize = {t.long_min_bytes}/4",
        lambda name, L: Case(name, "min", "int32", "cupy", (7 * L,), 0, L=L),
    )  # fmt: skip
    L = (c.long_chunk("sum", "float32", big) + 1) * c.vec("float32")
    _singles(sets, "fixed_long/other", "linred_long", [
        Case("fixed_long/float32-mean-rows", "mean", "float32", "cupy", (2, 2 * L), 1, L=L),
        Case("fixed_long/misaligned/float32-max", "max", "float32", "cupy", (3 * L,), 0, "offset1", L=L),
    ])  # fmt: skip


def _warp_sets(sets: list[ShapeSet], c: Constants) -> None:
    t = c.t
    wt = c.warp_tile("sum", "float32")
    _triple(
        sets, "warp/float32-sum-offsets-L", "linred_warp", "L", wt, 1, f"warp tile = 32*warp_items = {wt}",
        lambda name, L: Case(name, "sum", "float32", "cupy", (24 * L,), 0, lengths=np.full(24, L)),
    )  # fmt: skip
    wt8 = c.warp_tile("sum", "int8")
    block = t.threads // 32 * wt8
    _triple(
        sets, "warp/int8-sum-offsets-n", "linred_warp", "n", block, 1,
        f"block of warp tiles = threads/32*warp tile = {block}",
        lambda name, n: Case(name, "sum", "int8", "torch", (n,), 0, lengths=_lengths_to(n, 1, 20, _rng(name), 0.2),
                             index_dtype="int32"),
    )  # fmt: skip
    wt64 = c.warp_tile("max", "float64")
    _triple(
        sets, "warp/float64-max-fixed-L", "linred_warp", "L", wt64, 1,
        f"warp tile = {wt64} (L = {wt64} is a power of two: fixed_rows)",
        lambda name, L: Case(name, "max", "float64", "cupy", (9 * L,), 0, L=L),
    )  # fmt: skip
    wti = c.warp_tile("sum", "int32")

    def starts(name: str, s: int) -> Case:
        rng = _rng(name)
        lengths = np.concatenate([np.ones(s - 1, np.int64), [2 * wti + 3], rng.integers(0, 30, 100)])
        return Case(name, "sum", "int32", "cupy", (int(lengths.sum()),), 0, lengths=lengths)

    s = ShapeSet("warp/int32-sum-starts-per-tile", "linred_warp", "starts", OFFSETS_PER_READ, 1,
                 f"offsets read {OFFSETS_PER_READ} at a time per warp tile of {wti}", tile=wti)  # fmt: skip
    for v in s.values:
        case = starts(f"{s.name}/starts={v}", v)
        case.value = v
        s.cases.append(case)
    sets.append(s)
    # several tiles per warp run: plan with 1 SM so that small data gets k > 1
    wt16 = c.warp_tile("max", "float16")
    k, m = _run_with_k(lambda n: c.warp_k(n, 1, wt=wt16), wt16, c.t.max_tiles_per_warp)
    _triple(
        sets, "warp/float16-max-runs-L", "linred_warp", "L", k * wt16, 1,
        f"warp run = k*warp tile = {k}*{wt16} (k as nvrtc._Runs picks it with sms=1, m={m})",
        lambda name, L: Case(name, "max", "float16", "torch", (m * L,), 0, lengths=np.full(m, L), sms=1),
    )  # fmt: skip
    # where the runs' join moves from the reduction kernel's last block to linred_fixup
    joined = c.nv.FUSED_FIXUP_PASSES * c.t.threads
    s = ShapeSet("warp/float32-sum-runs-joined", "linred_warp", "runs", joined, 1,
                 f"runs the last block joins = FUSED_FIXUP_PASSES*threads = {joined} of one warp tile of {wt} "
                 "(more: linred_fixup)", tile=wt)  # fmt: skip
    for r in s.values:
        name = f"{s.name}/runs={r}"
        case = Case(
            name,
            "sum",
            "float32",
            "cupy",
            (r * wt,),
            0,
            lengths=_lengths_to(r * wt, 0, 3 * wt, _rng(name)),
            sms=NOMINAL_SMS,
        )  # (runs of one tile: planned for a full GPU whatever this one's SMs)
        case.value = r
        s.cases.append(case)
    sets.append(s)
    rng = _rng("warp/one-segment-over-many-runs")
    spans = np.concatenate([rng.integers(0, 20, 200), [60_000], rng.integers(0, 20, 200), [0, 0, 0]])
    few = _rng("warp/few-runs").integers(1, 6 * wt, 40)
    _singles(sets, "warp/other", "linred_warp", [
        Case("warp/float32-min-one-segment-over-many-runs", "min", "float32", "cupy", (int(spans.sum()),), 0,
             lengths=spans, sms=1),
        Case("warp/float32-max-segments-over-few-runs", "max", "float32", "torch", (int(few.sum()),), 0,
             lengths=few),
        Case("warp/float32-mean-rows-L3", "mean", "float32", "cupy", (3, 2052), 1, L=3),
        Case("warp/uint8-max-L5", "max", "uint8", "torch", (5000,), 0, L=5),
        Case("warp/bool-sum-L1024", "sum", "bool", "cupy", (3 * 1024,), 0, L=1024),  # too long for 1-byte fixed
        Case("warp/int32-mean-offsets32", "mean", "int32", "torch", (3000,), 0, index_dtype="int32",
             lengths=_lengths_to(3000, 0, 40, _rng("warp/int32-mean"), 0.1)),
        Case("warp/float32-sum-L1535", "sum", "float32", "cupy", (3 * 1535,), 0, L=1535),
        # more runs than the last block joins: linred_fixup (also in --quick, which keeps only
        # the k*T member of the runs-joined triple)
        Case("warp/float32-sum-fixup-kernel", "sum", "float32", "cupy", (2 * joined * wt,), 0,
             lengths=_lengths_to(2 * joined * wt, 0, 3 * wt, _rng("warp/fixup-kernel")), sms=NOMINAL_SMS),
    ])  # fmt: skip


def _tile_sets(sets: list[ShapeSet], c: Constants) -> None:
    t = c.t
    T = t.tile
    _triple(
        sets, "tile/float32-sum-stride2-L", "linred_tile", "L", T, 1, f"tile = {T}",
        lambda name, L: Case(name, "sum", "float32", "cupy", (3 * L,), 0, "stride2", L=L),
    )  # fmt: skip
    per_warp = T // (t.threads // 32)
    _triple(
        sets, "tile/float32-max-offset1-offsets-L", "linred_tile", "L", per_warp, 1,
        f"few/many segments per tile: tile/warps = {T}/{t.threads // 32}",
        lambda name, L: Case(name, "max", "float32", "torch", (24 * L,), 0, "offset1", lengths=np.full(24, L)),
    )  # fmt: skip
    _triple(
        sets, "tile/int8-sum-offset1-dense-n", "linred_tile", "n", T, 2, f"tile = {T}; lengths 0-3 (> tile/2 per tile)",
        lambda name, n: Case(name, "sum", "int8", "cupy", (n,), 0, "offset1", lengths=_lengths_to(n, 0, 3, _rng(name))),
    )  # fmt: skip
    _triple(
        sets, "tile/float16-mean-stride2-L1-n", "linred_tile", "n", T, 1, f"tile = {T}; L = 1",
        lambda name, n: Case(name, "mean", "float16", "torch", (n,), 0, "stride2", L=1),
    )  # fmt: skip
    _triple(
        sets, "tile/float64-min-rows-offsets-n", "linred_tile", "n", T, 1, f"tile = {T}; 3 rows",
        lambda name, n: Case(name, "min", "float64", "cupy", (3, n), 1, "rows_offset1",
                             lengths=_lengths_to(n, 0, 50, _rng(name), 0.1)),
    )  # fmt: skip
    k, m = _run_with_k(lambda n: c.tile_k(n, 1), T, t.max_tiles_per_block)
    _triple(
        sets, "tile/int32-sum-runs-L", "linred_tile", "L", k * T, 1,
        f"block run = k*tile = {k}*{T} (k as nvrtc._Runs picks it with sms=1, m={m})",
        lambda name, L: Case(name, "sum", "int32", "cupy", (m * L,), 0, "stride2", lengths=np.full(m, L), sms=1),
    )  # fmt: skip
    items = T // t.threads
    _triple(
        sets, "tile/uint8-max-stride2-balanced-L", "linred_tile", "L", items, 1,
        f"elements per thread in the balanced mode = tile/threads = {items}",
        lambda name, L: Case(name, "max", "uint8", "torch", (600 * L,), 0, "stride2", lengths=np.full(600, L)),
    )  # fmt: skip
    _triple(
        sets, "tile/float32-sum-vecload-n", "linred_tile:vecload", "n", T, 1, f"tile = {T}; _TileExecutor directly",
        lambda name, n: Case(name, "sum", "float32", "cupy", (n,), 0, lengths=_lengths_to(n, 0, 40, _rng(name), 0.1),
                             direct="tile"),
    )  # fmt: skip
    _singles(sets, "tile/other", "linred_tile", [
        Case("tile/bool-sum-offset1-L-over-5-tiles", "sum", "bool", "cupy", (2 * (5 * T + 1),), 0, "offset1",
             L=5 * T + 1),
        Case("tile/float16-mean-stride2-offsets", "mean", "float16", "torch", (5000,), 0, "stride2",
             lengths=_lengths_to(5000, 0, 300, _rng("tile/f16"), 0.2)),
        Case("tile/float64-sum-misaligned-long", "sum", "float64", "torch", (3 * 1100,), 0, "offset1", L=1100),
        Case("tile/int32-mean-rows-pad-L7", "mean", "int32", "cupy", (3, 7 * 300), 1, "rows_pad", L=7),
        Case("tile/int8-max-vecload-L100", "max", "int8", "torch", (100 * 90,), 0, L=100, direct="tile"),
        Case("tile/float64-mean-vecload-offsets", "mean", "float64", "cupy", (6000,), 0, direct="tile",
             lengths=_lengths_to(6000, 0, 700, _rng("tile/f64"), 0.1)),
        Case("tile/uint8-min-vecload-L7", "min", "uint8", "cupy", (7 * 1000,), 0, L=7, direct="tile"),
    ])  # fmt: skip
    # feature columns that are not contiguous: each column a row of its own, its results a column
    # of the result (TileArgs::inner)
    _singles(sets, "tile/columns", "linred_tile", [
        Case("tile/float32-sum-columns-offsets", "sum", "float32", "cupy", (5001, 6), 0, "columns",
             lengths=_lengths_to(5001, 0, 300, _rng("tile/columns-f32"), 0.2)),
        Case("tile/int32-max-columns-L7-unaligned", "max", "int32", "torch", (7 * 301, 3), 0, "columns", L=7),
        Case("tile/float64-min-cols-stride2-offsets", "min", "float64", "cupy", (3000, 5), 0, "cols_stride2",
             lengths=_lengths_to(3000, 0, 700, _rng("tile/columns-f64"), 0.1)),
        Case("tile/float32-mean-cols-stride2-L", "mean", "float32", "torch", (3 * (T + 1), 4), 0, "cols_stride2",
             L=T + 1),
        # (planned for one SM: runs of several tiles, partials joined across blocks)
        Case("tile/float64-sum-columns-runs", "sum", "float64", "cupy", (9 * T + 3, 2), 0, "columns",
             lengths=_lengths_to(9 * T + 3, 0, 3 * T, _rng("tile/columns-runs"), 0.1), sms=1),
    ])  # fmt: skip
    _singles(sets, "tile/columns-vecload", "linred_tile:vecload", [
        Case("tile/float16-mean-columns-vecload", "mean", "float16", "cupy", (4096, 4), 0, "columns",
             lengths=_lengths_to(4096, 0, 600, _rng("tile/columns-f16"), 0.2)),
        Case("tile/int8-sum-columns-vecload-L", "sum", "int8", "torch", (64 * 50, 3), 0, "columns", L=50),
        Case("tile/int32-max-columns-vecload-L7", "max", "int32", "torch", (7 * 300, 3), 0, "columns", L=7),
    ])  # fmt: skip


def _features_sets(sets: list[ShapeSet], c: Constants) -> None:
    t = c.t
    _triple(
        sets, "features/float32-sum-d4-m", "linred_features", "m", t.threads, 1,
        f"threads per block = {t.threads} (one per segment and 16-byte feature group)",
        lambda name, m: Case(name, "sum", "float32", "cupy", (2 * m, 4), 0, L=2),
    )  # fmt: skip
    _triple(
        sets, "features/float32-max-d8-L", "linred_features", "L", t.feature_narrow_unroll, 1,
        f"rows in flight = feature_narrow_unroll = {t.feature_narrow_unroll} (rows of 32 bytes are narrow)",
        lambda name, L: Case(name, "max", "float32", "torch", (5 * L, 8), 0, L=L),
    )  # fmt: skip
    _triple(
        sets, "features/float32-max-d32-L", "linred_features", "L", t.unroll, 1,
        f"rows in flight = unroll = {t.unroll}",
        lambda name, L: Case(name, "max", "float32", "torch", (5 * L, 32), 0, L=L),
    )  # fmt: skip
    _singles(sets, "features/other", "linred_features", [
        Case("features/float16-mean-d16-offsets", "mean", "float16", "cupy", (3000, 16), 0,
             lengths=_lengths_to(3000, 0, 30, _rng("features/f16"), 0.2)),
        Case("features/int8-min-misaligned-d5", "min", "int8", "torch", (900, 5), 0, "offset1",
             lengths=_lengths_to(900, 0, 20, _rng("features/i8"), 0.2)),
        Case("features/float64-sum-batch-d3", "sum", "float64", "cupy", (2, 400, 3), 1, L=4),
        Case("features/uint8-max-d32", "max", "uint8", "cupy", (999, 32), 0, L=3),
        Case("features/bool-sum-d16-offsets", "sum", "bool", "torch", (800, 16), 0,
             lengths=_lengths_to(800, 0, 25, _rng("features/bool"), 0.2)),
        Case("features/int32-mean-d4-L5", "mean", "int32", "cupy", (1000, 4), 0, L=5),
        Case("features/float32-sum-stride2-rows", "sum", "float32", "cupy", (700, 4), 0, "stride2",
             lengths=_lengths_to(700, 0, 20, _rng("features/f32"), 0.2)),
    ])  # fmt: skip
    # features_split: rows dealt to lanes, their partials added by shuffles (a segment's threads in
    # one warp) or in shared memory (d = 65: groups of one feature), every step of the lanes' tails
    _singles(sets, "features/split", "linred_features_split", [
        Case("features/split-float32-sum-d8-shuffles", "sum", "float32", "cupy", (62 * 40, 8), 0, L=62),
        Case("features/split-float32-mean-d16-offsets", "mean", "float32", "torch", (4000, 16), 0,
             lengths=_lengths_to(4000, 0, 150, _rng("features/split16"), 0.1)),
        Case("features/split-float64-max-d65-shared", "max", "float64", "cupy", (97 * 30, 65), 0, L=97),
        Case("features/split-float16-sum-d8-tail", "sum", "float16", "torch", (61 * 20, 8), 0, L=61),
        Case("features/split-int32-min-batch-d4", "min", "int32", "cupy", (2, 900, 4), 1, L=75),
    ])  # fmt: skip
    # long segments cut into tiles (run directly, as on one SM: planned for larger calls): long
    # ones beginning on a tile boundary and past it, ending on one, empty ones, a batch, misaligned
    rows = _nvrtc_kernels().FEATURE_TILE_ROWS
    spans = [rows + 1, 0, 5, rows - 6, 2 * rows, 0, 3, 10 * rows + 3, 7, rows, 0, 3 * rows + 5]
    # (at least 33 segments of 16 feature groups: fewer would go to features_split even on one SM)
    shorts = [int(v) for v in _rng("features/long-short").integers(0, 30, 40)]
    long_ones = np.array(spans[:6] + shorts + spans[6:], dtype=np.int64)
    huge = np.array([3, 0, 4800, *shorts, 90, 107], dtype=np.int64)
    many = np.array([*shorts[:20], 257 * rows + 3, *shorts[20:]], dtype=np.int64)
    _singles(sets, "features/long", "linred_features", [
        Case("features/long-float32-sum-d64", "sum", "float32", "cupy", (int(long_ones.sum()), 64), 0,
             lengths=long_ones, direct="features_long", sms=1),
        Case("features/long-float64-max-d33-misaligned", "max", "float64", "torch", (3000, 33), 0, "offset1",
             lengths=_lengths_to(3000, 0, 300, _rng("features/long33"), 0.2), direct="features_long", sms=1),
        Case("features/long-float16-mean-batch-d128", "mean", "float16", "cupy", (2, 4000, 128), 1,
             lengths=_lengths_to(4000, 0, 250, _rng("features/long128"), 0.2), direct="features_long", sms=1),
        Case("features/long-int32-min-one-huge-d64", "min", "int32", "torch", (int(huge.sum()), 64), 0,
             lengths=huge, direct="features_long", sms=1),
        # a segment of 258 tiles amid many short ones: one chain adds them (no chunks)
        Case("features/long-float32-max-d64-258-tiles", "max", "float32", "torch", (int(many.sum()), 64), 0,
             lengths=many, direct="features_long", sms=1),
    ])  # fmt: skip
    # the same in features_split (few segments, as on one SM): four lanes whose partials are added
    # in shared memory (ten segments of 16 groups) or by shuffles (24 of 8 groups)
    few = np.array([rows + 1, 5, 3 * rows + 7, 0, 2 * rows, 40, rows - 1, 10 * rows + 3, 17, 2 * rows - 1])
    more = np.concatenate([few, [30, 0, 90, rows, 64, 3, 2 * rows + 1, 50, 70, 11, 0, 100, 4 * rows, 60]])
    _singles(sets, "features/split-long", "linred_features_split", [
        Case("features/split-long-float32-sum-d64-shared", "sum", "float32", "cupy", (int(few.sum()), 64), 0,
             lengths=few, direct="features_long", sms=1),
        Case("features/split-long-float64-mean-d16-shuffles", "mean", "float64", "torch", (int(more.sum()), 16), 0,
             lengths=more, direct="features_long", sms=1),
        Case("features/split-long-float16-max-batch-d64", "max", "float16", "cupy", (2, int(more.sum()), 64), 1,
             lengths=more, direct="features_long", sms=1),
    ])  # fmt: skip
    # segments too few to fill the device (planned for it): cut past FEATURE_FEW_ROWS rows whatever
    # the average, fixed lengths too (features_split for these few pairs)
    _singles(sets, "features/few-long", "linred_features_split", [
        Case("features/few-long-int32-sum-m1-fixed", "sum", "int32", "cupy", (5000, 64), 0, L=5000),
        Case("features/few-long-float32-mean-m3-offsets", "mean", "float32", "torch", (7000, 32), 0,
             lengths=np.array([1500, 0, 5500])),
        # a segment of 34 chunks of 64 tiles (the last of one tile), added a chunk at a time, in
        # rows of groups of one feature (d = 5)
        Case("features/few-long-float32-sum-d5-many-tiles", "sum", "float32", "cupy", (2176 * rows + 3, 5), 0,
             lengths=np.array([63 * rows, 2113 * rows + 3])),
    ])  # fmt: skip


def _cub_sets(sets: list[ShapeSet]) -> None:
    def off(name: str, n: int) -> np.ndarray:
        return _lengths_to(n, 0, 40, _rng(name), 0.2)

    _singles(sets, "cub", "cub", [
        Case("cub/strided-float32-sum-d3", "sum", "float32", "cupy", (1200, 3), 0, lengths=off("c1", 1200),
             backend="cub", declared=("linred_strided",)),
        Case("cub/strided-bfloat16-mean-d2", "mean", "bfloat16", "torch", (900, 2), 0, lengths=off("c2", 900),
             backend="cub", declared=("linred_strided",)),
        Case("cub/divide-float32-mean-offsets", "mean", "float32", "cupy", (3000,), 0, lengths=off("c3", 3000),
             backend="cub", declared=("linred_divide_by_lengths",)),
        Case("cub/cast-fill-int32-max-bf16", "max", "int32", "torch", (2000,), 0, lengths=off("c4", 2000),
             out_dtype="bfloat16", backend="cub", declared=("linred_cast_bf16", "linred_fill_empty")),
        Case("cub/ops-float16-mean-L300", "mean", "float16", "cupy", (300 * 20,), 0, L=300, backend="cub",
             declared=("op:linred_mul", "op:linred_f16_to_f32", "op:linred_scale_f32_to_f16")),
        Case("cub/ops-float64-max-rows-pad", "max", "float64", "cupy", (2, 1000), 1, "rows_pad", L=10,
             backend="cub", declared=("op:linred_batched_fixed", "op:linred_max_f64")),
        Case("cub/ops-float32-min-rows-offsets", "min", "float32", "torch", (2, 1500), 1, lengths=off("c7", 1500),
             backend="cub", declared=("op:linred_batched_offsets64", "op:linred_min_f32")),
    ])  # fmt: skip


def all_cases(sets: Sequence[ShapeSet]) -> list[Case]:
    return [case for s in sets for case in s.cases]


# ---------------------------------------------------------------------------------------------
# Layouts, problems and planning (host-only: no GPU needed)
# ---------------------------------------------------------------------------------------------


def _base_shape(case: Case) -> tuple[int, ...]:
    shape = case.shape
    if case.layout == "contig":
        return shape
    if case.layout == "offset1":
        return (math.prod(shape) + 1,)
    if case.layout == "stride2":
        return (*shape[: case.axis], 2 * shape[case.axis], *shape[case.axis + 1 :])
    if case.layout in ("rows_pad", "rows_offset1"):
        return (shape[0], shape[1] + 1, *shape[2:])
    if case.layout == "columns":
        return shape[::-1]
    if case.layout == "cols_stride2":
        return (*shape[:-1], 2 * shape[-1])
    raise ValueError(case.layout)


def _view(base: Any, case: Case) -> Any:
    """``case``'s view of ``base`` (NumPy, CuPy and PyTorch slice alike)."""
    if case.layout == "contig":
        return base
    if case.layout == "offset1":
        return base[1:].reshape(case.shape)
    if case.layout == "stride2":
        return base[(slice(None),) * case.axis + (slice(None, None, 2),)]
    if case.layout == "rows_pad":
        return base[:, : case.shape[1]]
    if case.layout == "rows_offset1":
        return base[:, 1:]
    if case.layout == "columns":  # (2-D cases)
        return base.T
    if case.layout == "cols_stride2":
        return base[..., ::2]
    raise ValueError(case.layout)


def _nominal_misalignment(case: Case) -> int:
    """The view's pointer modulo 16, for a base allocation aligned to 256 bytes (cudaMalloc)."""
    return _itemsize(case.dtype) % 16 if case.layout in ("offset1", "rows_offset1") else 0


def _numpy_dtype(dtype: str) -> np.dtype:
    from linred._dtypes import numpy_dtype

    return numpy_dtype(dtype)


def _prepare(case: Case, x: Any, offsets: Any) -> Any:
    """linred's own validation of a call (linred._frontend.request): its Problem, adapter, result
    shape, segments, stream and the (batch, n, features) view of ``x``."""
    from linred._frontend import request

    req, x, handle = request(
        case.reduction, x, segment_length=case.L, offsets=offsets, axis=case.axis,
        dtype=case.out_dtype, backend=case.backend, check=False,
    )  # fmt: skip
    return types.SimpleNamespace(
        problem=req.problem, adapter=req.adapter, out_shape=req.out_shape, segments=req.segments, stream=handle,
        x3=req.adapter.reshape(x, req.problem.in_shape),
    )  # fmt: skip


def _problem_of(case: Case, kind: str | None = None, device: int = 0) -> Any:
    """The Problem linred makes of ``case``: from a NumPy twin of its view, moved to ``device``."""
    base = np.zeros(_base_shape(case), dtype=_numpy_dtype(case.dtype))
    call = _prepare(case, _view(base, case), None if case.lengths is None else case.offsets.astype(case.index_dtype))
    return dataclasses.replace(call.problem, kind=kind or case.kind, device=device)


def _rows_aligned(problem: Any, misalignment: int) -> bool:
    return bool(_nvrtc_kernels().rows_aligned(problem, misalignment))


def _tile_entries(problem: Any, vecload: bool) -> list[str]:
    tile = _nvrtc().BACKEND.options.tile
    entries = ["linred_tile:vecload" if vecload else "linred_tile"]
    if not problem.fixed:
        entries.append("linred_bounds")
    L = problem.segment_length
    if not (problem.fixed and tile >= L and tile % L == 0):  # nvrtc._TileExecutor.__init__
        entries.append("linred_fixup")
    return entries


def _warp_fused(problem: Any, sms: int) -> bool:
    """Whether nvrtc's _WarpExecutor joins its runs in the reduction kernel's last block (few runs,
    planned with ``sms`` SMs) rather than with linred_fixup."""
    kern, t = _nvrtc_kernels(), _nvrtc().BACKEND.options
    b, n, _ = problem.in_shape
    wt = 32 * kern.warp_items(problem)
    k = kern.warp_tiles_per_run(b, n, problem, t, sms)
    tiles = -(-n // wt)
    runs = b * -(-tiles // k)
    return runs <= kern.FUSED_FIXUP_PASSES * t.threads


#: the SM count the host-only plan list assumes for cases that do not set their own (an H100's)
NOMINAL_SMS = 132


def planned_entries(case: Case, problem: Any, misalignment: int, sms: int | None = None) -> tuple[str, ...]:
    """The entry points a call of ``problem`` with data at ``misalignment`` bytes past 16 launches,
    planned with ``sms`` SMs (default: the case's own, else :data:`NOMINAL_SMS`).

    nvrtc: linred.backends.nvrtc.route chooses the executor; then the executors' run-time choices
    (data that is not 16-byte aligned goes to tile_reduce).  cub: the entry points ``case`` declares.
    """
    sms = sms or case.sms or NOMINAL_SMS
    if case.backend != "nvrtc":
        return tuple(case.declared)
    nv = _nvrtc()
    if case.direct == "tile":
        return tuple(_tile_entries(problem, _rows_aligned(problem, misalignment)))
    reason = nv.BACKEND.unsupported(problem)
    if reason is not None:
        return (f"refused: {reason}",)
    route = nv.route(problem, nv.BACKEND.options)
    if route == "features" or case.direct == "features_long":  # nvrtc._FeaturesExecutor: its width, then its lanes
        kern = _nvrtc_kernels()
        width = kern.features_width(problem, misalignment, 0)
        lanes = kern.features_split_lanes(problem, width, nv.BACKEND.options.threads, sms)
        return ("linred_features_split",) if lanes > 1 else ("linred_features",)
    if route in ("fixed", "staged", "long"):
        if misalignment % 16:
            return tuple(_tile_entries(problem, _rows_aligned(problem, misalignment)))
        if route in ("staged", "long"):
            return (f"linred_{route}",)
        return ("linred_fixed:" + _nvrtc_kernels().fixed_layout(problem, nv.BACKEND.options)[0],)
    if route == "tile":  # (feature columns that are not contiguous)
        return tuple(_tile_entries(problem, _rows_aligned(problem, misalignment)))
    if route == "warp":
        if _rows_aligned(problem, misalignment) and problem.num_segments < 2**31:
            return ("linred_warp",) if _warp_fused(problem, sms) else ("linred_warp", "linred_fixup")
        return tuple(_tile_entries(problem, _rows_aligned(problem, misalignment)))
    return (f"unknown route {route!r}",)


def plan_list(sets: Sequence[ShapeSet]) -> list[dict[str, Any]]:
    """Every case with the entry points linred's planning rules give it (host only)."""
    rows = []
    for s in sets:
        for case in s.cases:
            try:
                problem = _problem_of(case)
                entries = planned_entries(case, problem, _nominal_misalignment(case))
                if case.backend == "cub":
                    from linred.backends.cub import choose_path

                    entries = (*entries, f"path:{choose_path(problem)}")
            except Exception as e:  # a dtype this host cannot make (bfloat16 without ml_dtypes)
                entries = (f"unplanned: {type(e).__name__}: {e}",)
            rows.append({"set": s.name, "target": s.target, "quantity": s.quantity, "T": s.T, "k": s.k,
                         "value": case.value, "case": case.name, "describe": case.describe(),
                         "reduction": case.reduction, "entries": list(entries)})  # fmt: skip
    return rows


def coverage(rows: Sequence[dict[str, Any]]) -> dict[str, set[str]]:
    """Entry point -> the reductions of the calls planned to reach it."""
    out: dict[str, set[str]] = {}
    for row in rows:
        for entry in row["entries"]:
            out.setdefault(entry, set()).add(row["reduction"])
    return out


def print_list(sets: Sequence[ShapeSet], as_json: bool) -> int:
    rows = plan_list(sets)
    if as_json:
        json.dump({"sets": [{"name": s.name, "target": s.target, "quantity": s.quantity, "T": s.T, "k": s.k,
                             "values": list(s.values), "why": s.why} for s in sets],
                   "calls": rows}, sys.stdout, indent=1)  # fmt: skip
        print()
        return 0
    by_set: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_set.setdefault(row["set"], []).append(row)
    for s in sets:
        claim = f"{s.quantity} in {list(s.values)} (k={s.k}, T={s.T}: {s.why})" if s.T else "no boundary claim"
        print(f"[{s.name}] target {s.target}; {claim}")
        for row in by_set.get(s.name, []):
            print(f"    {row['describe']}\n        -> {', '.join(row['entries'])}")
    cov = coverage(rows)
    print(f"\n{len(rows)} calls in {len(sets)} sets; entry point -> planned calls (reductions):")
    for entry in sorted(cov, key=_entry_order):
        count = sum(entry in r["entries"] for r in rows)
        print(f"    {entry:34} {count:4}  ({', '.join(sorted(cov[entry]))})")
    expected = [*NVRTC_ENTRY_POINTS] if any(s.target != "cub" for s in sets) else []
    missing = [e for e in expected if e not in cov]
    if missing:
        print(f"NOT PLANNED: {', '.join(missing)}")
        return 1
    return 0


def _entry_order(entry: str) -> tuple[int, str]:
    order = [*NVRTC_ENTRY_POINTS, *CUPY_ENTRY_POINTS]
    return (order.index(entry) if entry in order else len(order), entry)


# ---------------------------------------------------------------------------------------------
# The driver (needs a GPU)
# ---------------------------------------------------------------------------------------------


class Recorder:
    """Counts the kernel launches of linred's executors, by entry point, while the driver runs.

    The nvrtc executors' get_kernels is wrapped to learn each kernel's name (and, from its
    wrapper source, fixed_small/fixed_rows, vector loads, tiles per run), their PackedLaunch
    to count launches; for the cub group, the CuPy ElementwiseKernels of linred.kernels.elementwise
    and the operators linred.backends.cub.executors builds (raw_op).
    """

    def __init__(self) -> None:
        self.names: dict[int, tuple[Any, str, int | None]] = {}
        self.launches: Counter[str] = Counter()
        self.current: Counter[str] = Counter()
        self.ks: dict[str, set[int]] = {}
        self.current_k: set[tuple[str, int]] = set()

    def record(self, entry: str, k: int | None = None) -> None:
        self.launches[entry] += 1
        self.current[entry] += 1
        if k is not None:
            self.ks.setdefault(entry, set()).add(k)
            self.current_k.add((entry, k))

    def begin(self) -> None:
        self.current = Counter()
        self.current_k = set()

    def install(self, with_cub: bool) -> None:
        executors = _nvrtc_executors()  # it launches through its own names of these two
        get_kernels = executors.get_kernels

        def counting_get_kernels(device_id: int, wrapper: str, names: tuple[str, ...]) -> tuple[Any, ...]:
            kernels = get_kernels(device_id, wrapper, names)
            for name, kernel in zip(names, kernels, strict=True):
                self.names[id(kernel)] = (kernel, *_entry_of(name, wrapper))
            return kernels

        recorder = self

        class CountingPackedLaunch(executors.PackedLaunch):  # type: ignore[misc, name-defined]
            """The executors' driver launches, counted by entry point."""

            __slots__ = ()

            def launch(self, *args: Any) -> None:  # (a call launches through it too)
                known = recorder.names.get(id(self.kernel))
                recorder.record(known[1] if known else self.name, known[2] if known else None)
                super().launch(*args)

        executors.get_kernels = counting_get_kernels
        executors.PackedLaunch = CountingPackedLaunch
        if not with_cub:
            return
        gpu = importlib.import_module("linred.kernels.elementwise")
        cub = importlib.import_module("linred.backends.cub.executors")
        make_kernel, raw_op = gpu._kernel, cub.raw_op

        class CountingKernel:
            def __init__(self, kernel: Any) -> None:
                self._kernel = kernel

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                recorder.record(_cupy_entry(self._kernel.name))
                return self._kernel(*args, **kwargs)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._kernel, name)

        gpu._kernel = lambda key, make: CountingKernel(make_kernel(key, make))
        gpu._fill_empty = CountingKernel(gpu._fill_empty)

        def counting_raw_op(name: str, *args: Any, **kwargs: Any) -> Any:
            self.record(f"op:{name}")
            return raw_op(name, *args, **kwargs)

        cub.raw_op = counting_raw_op


def _entry_of(name: str, wrapper: str) -> tuple[str, int | None]:
    """The entry point (with its variant) and tiles per run of kernel ``name`` of ``wrapper``
    (its macro lines: see linred/backends/nvrtc/kernels.py)."""
    if name == "linred_fixed":
        rows = "LINRED_FIXED(fixed_rows," in wrapper
        return ("linred_fixed:fixed_rows" if rows else "linred_fixed:fixed_small"), None
    if name in ("linred_tile", "linred_warp"):
        macro = "LINRED_TILE" if name == "linred_tile" else "LINRED_WARP"
        match = re.search(macro + r"\(([^)]*)\)", wrapper)
        if match is None:
            return name, None
        args = [a.strip() for a in match.group(1).split(",")]
        if name == "linred_warp":  # (T, A, O, OP, MEAN, THREADS, MIN_BLOCKS, K, ...)
            return name, int(args[7])
        # (T, A, O, OP, MEAN, THREADS, MIN_BLOCKS, TILE, K, VECLOAD, ...)
        return ("linred_tile:vecload" if args[9] == "true" else "linred_tile"), int(args[8])
    return name, None


def _cupy_entry(name: str) -> str:
    for prefix in CUPY_ENTRY_POINTS:
        if name.startswith(prefix):
            return prefix
    return name


@contextlib.contextmanager
def _sms(sms: int | None) -> Iterator[None]:
    """Plan the nvrtc executors as if the GPU had ``sms`` SMs (more tiles per run for small data)."""
    if sms is None:
        yield
        return
    import linred

    executors = _nvrtc_executors()
    launcher = executors._Launcher

    class FewSMs(launcher):  # type: ignore[misc, valid-type]
        def __init__(self, problem: Any) -> None:
            super().__init__(problem)
            self.sms = sms

    linred.clear_plan_cache()
    executors._Launcher = FewSMs
    try:
        yield
    finally:
        executors._Launcher = launcher
        linred.clear_plan_cache()


_EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


def reference(x: np.ndarray, case: Case, out_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """float64 NumPy result of ``case`` on ``x`` (its logical view) and the sums of |x| per segment."""
    from linred._dtypes import identity

    shape = x.shape
    b, n, d = math.prod(shape[: case.axis]), shape[case.axis], math.prod(shape[case.axis + 1 :])
    x3 = np.asarray(x, dtype=np.float64).reshape(b, n, d)
    offsets = case.offsets
    lengths = np.diff(offsets)
    m = len(lengths)
    nonempty = lengths > 0
    starts = offsets[:-1][nonempty]
    res = np.zeros((b, m, d))
    absum = np.zeros((b, m, d))
    if case.reduction in ("sum", "mean"):
        if starts.size:
            res[:, nonempty] = np.add.reduceat(x3, starts, axis=1)
            absum[:, nonempty] = np.add.reduceat(np.abs(x3), starts, axis=1)
        if case.reduction == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                res = res / lengths[None, :, None]
                absum = absum / np.maximum(lengths, 1)[None, :, None]
    else:
        res[:] = identity(case.reduction, out_dtype)
        if starts.size:
            ufunc = np.maximum if case.reduction == "max" else np.minimum
            res[:, nonempty] = ufunc.reduceat(x3, starts, axis=1)
    out_shape = (*shape[: case.axis], m, *shape[case.axis + 1 :])
    return res.reshape(out_shape), absum.reshape(out_shape)


def compare(got: np.ndarray, case: Case, x: np.ndarray, out_dtype: str, acc_dtype: str) -> str | None:
    """None if ``got`` matches the float64 reference, else what differs."""
    ref, absum = reference(x, case, out_dtype)
    if got.shape != ref.shape:
        return f"shape {got.shape} != {ref.shape}"
    if out_dtype not in _EPS:  # integers and bool: exact
        want = ref.astype(np.dtype(out_dtype)) if out_dtype != "bool" else ref.astype(bool)
        bad = got != want
    elif case.reduction in ("max", "min"):
        want = ref.astype(np.float32).astype(_numpy_dtype(out_dtype)) if out_dtype == "bfloat16" else ref
        g, w = got.astype(np.float64), np.asarray(want, dtype=np.float64)
        bad = ~((g == w) | (np.isnan(g) & np.isnan(w)))
    else:
        g = got.astype(np.float64)
        eps_acc = _EPS.get(acc_dtype, 0.0)
        tol = 4 * _EPS[out_dtype] * np.abs(ref) + 4 * eps_acc * absum
        close = np.abs(g - ref) <= tol
        bad = ~(close | (np.isnan(g) & np.isnan(ref)))
    if not bad.any():
        return None
    where = np.argwhere(bad)
    i = tuple(where[0])
    return f"{int(bad.sum())} of {bad.size} results differ, first at {i}: got {got[i]!r}, want {ref[i]!r}"


def _host_data(case: Case) -> np.ndarray:
    """Values exactly representable in the dtype whose float64 sums are exact (so any rounding shows)."""
    rng = _rng(case.name)
    size = math.prod(_base_shape(case))
    if case.dtype in ("float16", "bfloat16", "float32", "float64"):
        values = rng.integers(-8, 9, size) * 0.25
        return values.astype(np.float32 if case.dtype == "bfloat16" else case.dtype).reshape(_base_shape(case))
    if case.dtype == "bool":
        return (rng.random(size) < 0.5).reshape(_base_shape(case))
    lo, hi = {"int8": (-100, 100), "uint8": (0, 255), "int32": (-1000, 1000)}.get(case.dtype, (0, 100))
    return rng.integers(lo, hi + 1, size).astype(case.dtype).reshape(_base_shape(case))


class Libraries:
    """CuPy and (optional) PyTorch, set up for exact allocations."""

    def __init__(self) -> None:
        os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
        try:
            import cupy
        except Exception as e:
            raise Unavailable(f"CuPy is not importable ({type(e).__name__}: {e}); install cupy-cuda12x/13x") from None
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:
            raise Unavailable(f"CuPy sees no CUDA device ({type(e).__name__}: {e})") from None
        if count == 0:
            raise Unavailable("CuPy sees no CUDA device")
        cupy.cuda.set_allocator(None)  # exact cudaMalloc per array: memcheck sees every overrun
        self.cupy = cupy
        #: the device's SM count (what the nvrtc executors plan with, unless a case sets its own)
        self.sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        try:
            import torch

            self.torch: Any = torch if torch.cuda.is_available() else None
            self.torch_reason = None if self.torch is not None else "torch.cuda.is_available() is False"
        except Exception as e:
            self.torch, self.torch_reason = None, f"PyTorch is not importable ({type(e).__name__}: {e})"

    def to_device(self, a: np.ndarray, kind: str, dtype: str) -> Any:
        if kind == "cupy":
            return self.cupy.asarray(a)
        t = self.torch.from_numpy(np.ascontiguousarray(a))
        if dtype == "bfloat16":
            t = t.to(self.torch.bfloat16)  # on the host: the device copy is a plain memcpy
        return t.to("cuda")

    def to_host(self, a: Any, kind: str) -> np.ndarray:
        if kind == "cupy":
            return self.cupy.asnumpy(a)
        if a.dtype == self.torch.bfloat16:
            a = a.float()
        return a.cpu().numpy()

    def pointer(self, a: Any, kind: str) -> int:
        return int(a.data.ptr) if kind == "cupy" else int(a.data_ptr())

    def synchronize(self) -> None:
        self.cupy.cuda.runtime.deviceSynchronize()


def _run_case(case: Case, libs: Libraries, recorder: Recorder) -> dict[str, Any]:
    """Run one call; return its record (entries launched and expected, result check)."""
    import linred

    rec: dict[str, Any] = {"case": case.name, "describe": case.describe()}
    if case.kind == "torch" and libs.torch is None:
        rec["skipped"] = f"torch: {libs.torch_reason}"
        return rec
    host = _host_data(case)
    base = libs.to_device(host, case.kind, case.dtype)
    x = _view(base, case)
    offsets = None
    if case.lengths is not None:
        offsets = libs.to_device(case.offsets.astype(case.index_dtype), case.kind, case.index_dtype)
    call = _prepare(case, x, offsets)
    problem = call.problem
    misalignment = libs.pointer(call.x3, case.kind) % 16
    expected = planned_entries(case, problem, misalignment, case.sms or libs.sms)
    recorder.begin()
    with _sms(case.sms):
        if case.direct in ("tile", "features_long"):
            adapter = call.adapter
            result = adapter.empty(call.out_shape, problem.out_dtype, problem.device)
            options = _nvrtc().BACKEND.options
            if case.direct == "tile":
                executor = _nvrtc_executors()._TileExecutor(problem, options)
            else:
                options = dataclasses.replace(options, feature_long_min_bytes=1, feature_long_factor=1)
                executor = _nvrtc_executors()._FeaturesExecutor(problem, options)
            executor(call.x3, adapter.reshape(result, problem.out_shape), call.segments, call.stream)
            libs.synchronize()
            executor.free()
        else:
            fn = getattr(linred, f"segmented_{case.reduction}")
            kwargs: dict[str, Any] = {"axis": case.axis, "backend": case.backend, "check": False}
            if case.out_dtype is not None:
                kwargs["dtype"] = case.out_dtype
            result = fn(x, case.L, offsets=offsets, **kwargs)
    libs.synchronize()
    launched = dict(recorder.current)
    rec["launched"] = launched
    rec["expected"] = list(expected)
    rec["k"] = sorted(f"{e}:k={k}" for e, k in recorder.current_k)
    missing = [e for e in expected if e not in launched]
    unexpected = [e for e in launched if e.startswith("linred_") and e not in expected]
    if case.backend != "nvrtc":
        unexpected = []
    if missing or unexpected:
        rec["route"] = f"expected {sorted(expected)}, launched {sorted(launched)}"
    got = libs.to_host(result, case.kind)
    x_host = _view(host, case)
    rec["error"] = compare(np.asarray(got), case, x_host, problem.out_dtype, problem.acc_dtype)
    return rec


def driver(args: argparse.Namespace) -> int:
    """Run the calls (under a sanitizer when the parent says so); print and store the result."""
    started = time.monotonic()
    groups = _groups(args.groups)
    try:
        libs = Libraries()
        import linred

        available = linred.available_backends()
        if available.get("nvrtc") is not True:
            raise Unavailable(f"linred's nvrtc backend is not available: {available.get('nvrtc')}")
        if "cub" in groups and available.get("cub") is not True:
            print(f"NOTE: cub group skipped: linred's cub backend is not available: {available.get('cub')}")
            groups = [g for g in groups if g != "cub"]
        recorder = Recorder()
        recorder.install(with_cub="cub" in groups)
    except Unavailable as e:
        print(f"UNAVAILABLE: {e}")
        _write_result(args, {"unavailable": str(e)})
        return EXIT_UNAVAILABLE
    except Exception as e:  # linred's internals moved: say what, without a traceback
        print(f"SETUP FAILED: {type(e).__name__}: {e}")
        _write_result(args, {"ok": False, "setup_error": f"{type(e).__name__}: {e}"})
        return 1
    cases = all_cases(build_sets(args.quick, groups))
    if args.shard:
        i, count = (int(v) for v in args.shard.split("/"))
        cases = cases[i::count]
    records = []
    for case in cases:
        try:
            rec = _run_case(case, libs, recorder)
        except Exception as e:
            rec = {"case": case.name, "describe": case.describe(), "exception": f"{type(e).__name__}: {e}"}
        records.append(rec)
        bad = rec.get("exception") or rec.get("error") or rec.get("route")
        if bad or args.verbose:
            print(f"{'FAIL' if bad else 'ok  '} {case.name}: {case.describe()}")
            for key in ("exception", "error", "route"):
                if rec.get(key):
                    print(f"     {key}: {rec[key]}")
    summary = _summarize(records, recorder, groups, time.monotonic() - started, full=not args.shard)
    _print_driver_summary(summary)
    _write_result(args, summary)
    return 0 if summary["ok"] else 1


def _summarize(
    records: list[dict[str, Any]], recorder: Recorder, groups: Sequence[str], seconds: float, full: bool
) -> dict[str, Any]:
    skipped = [r for r in records if "skipped" in r]
    run = [r for r in records if "skipped" not in r]
    failures = [r for r in run if r.get("exception") or r.get("error")]
    routes = [r for r in run if r.get("route")]
    calls_per_entry: Counter[str] = Counter()
    for r in run:
        for entry in r.get("launched", {}):
            calls_per_entry[entry] += 1
    wanted = [*NVRTC_ENTRY_POINTS] if "nvrtc" in groups else []
    if "cub" in groups:
        wanted += [*CUPY_ENTRY_POINTS]
    missing = [e for e in wanted if e not in recorder.launches] if full else []
    no_launches = "nvrtc" in groups and run and not any(e.startswith("linred_") for e in recorder.launches)
    return {
        "calls": len(run),
        "checked": sum(1 for r in run if "error" in r),
        "failures": len(failures),
        "route_mismatches": len(routes),
        "skipped": len(skipped),
        "skip_reasons": sorted({r["skipped"] for r in skipped}),
        "launches": dict(recorder.launches),
        "calls_per_entry": dict(calls_per_entry),
        "tiles_per_run": {e: sorted(v) for e, v in recorder.ks.items()},
        "missing_entries": missing,
        "failed_cases": [r["case"] for r in failures + routes],
        "seconds": round(seconds, 1),
        "ok": not failures and not routes and not missing and not no_launches,
        "no_launches_seen": bool(no_launches),
        "groups_run": list(groups),
    }


def _print_driver_summary(s: dict[str, Any]) -> None:
    print(f"\n{'entry point':34} {'calls':>6} {'launches':>9}  tiles per run")
    for entry in sorted(s["launches"], key=_entry_order):
        ks = ",".join(str(k) for k in s["tiles_per_run"].get(entry, []))
        print(f"{entry:34} {s['calls_per_entry'].get(entry, 0):6} {s['launches'][entry]:9}  {ks}")
    print(
        f"\n{s['calls']} calls, {s['checked']} checked against float64 NumPy, {s['failures']} wrong or failed, "
        f"{s['route_mismatches']} not reaching their planned entry points, {s['skipped']} skipped "
        f"{s['skip_reasons'] or ''}; {s['seconds']} s"
    )
    if s["missing_entries"]:
        print(f"ENTRY POINTS NOT LAUNCHED: {', '.join(s['missing_entries'])}")
    if s["no_launches_seen"]:
        print("NO LAUNCH OF linred's KERNELS WAS SEEN: the launch counting no longer matches linred's code")
    print("DRIVER " + ("OK" if s["ok"] else "FAILED"))


def _write_result(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    if args.result:
        Path(args.result).write_text(json.dumps(summary))


def _groups(value: str) -> list[str]:
    groups = [g.strip() for g in value.split(",") if g.strip()]
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        raise SystemExit(f"unknown group(s) {bad}; choose from {GROUPS}")
    return groups


# ---------------------------------------------------------------------------------------------
# The parent
# ---------------------------------------------------------------------------------------------


@dataclass
class ToolRun:
    tool: str  #: a sanitizer tool, or "native"
    seconds: float = 0.0
    returncode: int | None = None
    timed_out: bool = False
    errors: int | None = None  #: from ERROR SUMMARY
    racecheck: str = ""
    attributed: Counter[str] = field(default_factory=Counter)
    result: dict[str, Any] | None = None
    log: str = ""
    note: str = ""

    def judged_errors(self, strict: bool) -> int | None:
        """The errors that fail the run (initcheck, unless strict: those in linred's kernels or host API calls)."""
        if self.errors is None or self.tool != "initcheck" or strict:
            return self.errors
        ours = sum(v for k, v in self.attributed.items() if k.startswith("linred_") or k == "host API")
        foreign = sum(self.attributed.values()) - ours
        # errors the log does not attribute (a format this script does not know) count as ours
        return max(ours, self.errors - foreign)


def _sanitizer_command(sanitizer: str, tool: str, log_file: Path, kernel_filter: str) -> list[str]:
    cmd = [sanitizer, "--tool", tool, "--report-api-errors", "no", "--error-exitcode", str(SANITIZER_EXIT),
           "--target-processes", "all", "--print-limit", "1000", "--log-file", str(log_file)]  # fmt: skip
    if tool == "racecheck":
        cmd += ["--racecheck-report", "analysis"]
    if kernel_filter == "linred":
        cmd += ["--kernel-name", "kns=linred_"]
    return cmd


def _driver_command(args: argparse.Namespace, result: Path, label: str, shard: str | None = None) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--driver", "--tool", label, "--result", str(result),
           "--groups", args.groups]  # fmt: skip
    if args.quick:
        cmd.append("--quick")
    if shard:
        cmd += ["--shard", shard]
    return cmd


def _run(cmd: list[str], env: dict[str, str], timeout: float, out_path: Path) -> tuple[int | None, bool, float]:
    """Run ``cmd`` in its own process group with stdout+stderr to ``out_path``; kill the group on timeout."""
    start = time.monotonic()
    with out_path.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout), False, time.monotonic() - start
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=15)
                    break
                except subprocess.TimeoutExpired:
                    continue
            return proc.returncode, True, time.monotonic() - start


_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error")
_RACE = re.compile(r"RACECHECK SUMMARY:\s*(.*)")
_NOT_A_REPORT = re.compile(
    r"COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Target application returned|"
    r"This application|Saved host backtrace|Host Frame|Device Frame|by thread|Address 0x|Referenced"
)


def parse_log(text: str) -> tuple[int | None, str, Counter[str]]:
    """(ERROR SUMMARY count, RACECHECK SUMMARY, error reports by the kernel they name) of a sanitizer log."""
    errors = None
    for match in _SUMMARY.finditer(text):
        errors = int(match.group(1))
    race = _RACE.search(text)
    if errors is None and race:  # racecheck ends with its own summary line instead
        counts = re.search(r"(\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", race.group(1))
        if counts:
            errors = int(counts.group(2)) + int(counts.group(3))
    attributed: Counter[str] = Counter()
    block: list[str] = []

    def close() -> None:
        if not block:
            return
        joined = "\n".join(block)
        name = re.search(r"\blinred_\w+", joined)
        if name:
            attributed[_cupy_entry(name.group(0))] += 1
        elif "Host API" in block[0]:
            attributed["host API"] += 1
        else:
            at = re.search(r"^=+\s+at (.*)$", joined, re.MULTILINE)
            attributed[f"other: {(at.group(1) if at else block[0].strip('= '))[:80]}"] += 1

    for line in text.splitlines():
        if re.match(r"^=+ \S", line) and not _NOT_A_REPORT.search(line):
            close()
            block = [line]
        elif block and line.startswith("="):
            block.append(line)
    close()
    return errors, race.group(1).strip() if race else "", attributed


def parent(args: argparse.Namespace) -> int:
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    bad = [t for t in tools if t not in TOOLS]
    if bad:
        print(f"unknown tool(s) {bad}; choose from {', '.join(TOOLS)}")
        return EXIT_UNAVAILABLE
    groups = _groups(args.groups)
    sanitizer = shutil.which(args.sanitizer) if tools else None
    if tools and sanitizer is None:
        cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        candidate = Path(cuda_home) / "bin" / "compute-sanitizer"
        sanitizer = str(candidate) if candidate.exists() else None
    if tools and sanitizer is None:
        print(f"UNAVAILABLE: {args.sanitizer} is not on PATH (nor in $CUDA_HOME/bin); install the CUDA toolkit's "
              "compute-sanitizer or pass --sanitizer PATH")  # fmt: skip
        return EXIT_UNAVAILABLE
    if importlib.util.find_spec("cupy") is None:
        print("UNAVAILABLE: CuPy is not importable here (pip install cupy-cuda12x or cupy-cuda13x)")
        return EXIT_UNAVAILABLE
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="linred-sanitize-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache_dir) if args.cache_dir else Path(tempfile.mkdtemp(prefix="linred-kernels-"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["LINRED_CACHE_DIR"] = str(cache)
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    print(f"logs: {log_dir}; kernel cache: {cache}; tools: {', '.join(tools) or 'none'}; groups: {', '.join(groups)}")
    runs: list[ToolRun] = []
    if not args.no_native:
        native = _native(args, env, log_dir)
        runs.append(native)
        if native.result and "unavailable" in native.result:
            print(f"UNAVAILABLE: {native.result['unavailable']}")
            if not args.cache_dir:
                shutil.rmtree(cache, ignore_errors=True)
            return EXIT_UNAVAILABLE
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        futures = [pool.submit(_sanitize, args, tool, sanitizer or "", env, log_dir) for tool in tools]
        for future in futures:
            run = future.result()
            runs.append(run)
            print(f"  {run.tool}: done in {run.seconds:.0f} s ({run.note or 'ERROR SUMMARY ' + str(run.errors)})")
    if not args.cache_dir:
        shutil.rmtree(cache, ignore_errors=True)
    for run in runs:
        if run.result and "unavailable" in run.result:
            print(f"UNAVAILABLE: {run.result['unavailable']}")
            return EXIT_UNAVAILABLE
    return _report(runs, args.strict, log_dir)


def _native(args: argparse.Namespace, env: dict[str, str], log_dir: Path) -> ToolRun:
    """The driver without a sanitizer, in ``--jobs`` shards at once: correctness, and the kernel cache filled."""
    jobs = max(1, args.jobs)
    run = ToolRun("native")
    start = time.monotonic()
    parts: list[tuple[Path, Path, str]] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = []
        for i in range(jobs):
            result, out = log_dir / f"native.{i}.json", log_dir / f"native.{i}.log"
            shard = f"{i}/{jobs}" if jobs > 1 else None
            futures.append(pool.submit(_run, _driver_command(args, result, "native", shard), env, args.timeout, out))
            parts.append((result, out, shard or ""))
        outcomes = [f.result() for f in futures]
    run.seconds = time.monotonic() - start
    run.timed_out = any(o[1] for o in outcomes)
    codes = [o[0] for o in outcomes]
    run.returncode = max((c for c in codes if c is not None), default=None) if None not in codes else None
    merged: dict[str, Any] = {}
    for result, _, _ in parts:
        try:
            merged = _merge(merged, json.loads(result.read_text()))
        except (OSError, ValueError):
            run.note = "a shard left no result"
    if merged:
        merged = _finish_merge(merged, _groups(args.groups))
    run.result = merged or None
    run.errors = 0
    run.log = ", ".join(str(p[1]) for p in parts)
    print(f"  native: done in {run.seconds:.0f} s")
    return run


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    if "unavailable" in b:
        return b
    if not a:
        return dict(b)
    out = dict(a)
    for key in ("calls", "checked", "failures", "route_mismatches", "skipped"):
        out[key] = a.get(key, 0) + b.get(key, 0)
    for key in ("launches", "calls_per_entry"):
        out[key] = dict(Counter(a.get(key, {})) + Counter(b.get(key, {})))
    ka, kb = a.get("tiles_per_run", {}), b.get("tiles_per_run", {})
    out["tiles_per_run"] = {e: sorted(set(ka.get(e, [])) | set(kb.get(e, []))) for e in {**ka, **kb}}
    out["failed_cases"] = a.get("failed_cases", []) + b.get("failed_cases", [])
    out["skip_reasons"] = sorted(set(a.get("skip_reasons", [])) | set(b.get("skip_reasons", [])))
    out["ok"] = a.get("ok", False) and b.get("ok", False)
    out["no_launches_seen"] = a.get("no_launches_seen", False) or b.get("no_launches_seen", False)
    return out


def _finish_merge(merged: dict[str, Any], groups: Sequence[str]) -> dict[str, Any]:
    if "unavailable" in merged:
        return merged
    groups = merged.get("groups_run", groups)
    wanted = [*NVRTC_ENTRY_POINTS] if "nvrtc" in groups else []
    if "cub" in groups:
        wanted += [*CUPY_ENTRY_POINTS]
    merged["missing_entries"] = [e for e in wanted if e not in merged.get("launches", {})]
    merged["ok"] = merged.get("ok", False) and not merged["missing_entries"]
    return merged


def _sanitize(args: argparse.Namespace, tool: str, sanitizer: str, env: dict[str, str], log_dir: Path) -> ToolRun:
    run = ToolRun(tool)
    log, out, result = log_dir / f"{tool}.log", log_dir / f"{tool}.driver.log", log_dir / f"{tool}.json"
    for p in (log, result):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    cmd = _sanitizer_command(sanitizer, tool, log, args.kernel_filter) + _driver_command(args, result, tool)
    (log_dir / f"{tool}.cmd").write_text(" ".join(cmd) + "\n")
    run.returncode, run.timed_out, run.seconds = _run(cmd, env, args.timeout, out)
    text = log.read_text(errors="replace") if log.exists() else ""
    run.errors, run.racecheck, run.attributed = parse_log(text)
    try:
        run.result = json.loads(result.read_text())
    except (OSError, ValueError):
        run.result = None
    run.log = str(log)
    if run.timed_out:
        run.note = f"timed out after {args.timeout} s"
    elif run.errors is None:
        run.note = f"no ERROR SUMMARY in {log} (exit {run.returncode})"
    elif run.result is None:
        run.note = f"the driver left no result (exit {run.returncode}); see {out}"
    return run


def _report(runs: list[ToolRun], strict: bool, log_dir: Path) -> int:
    print(f"\n{'tool':10} {'entries':>7} {'calls':>6} {'checked':>7} {'wrong':>6} {'route':>6} {'errors':>7} "
          f"{'judged':>7} {'seconds':>8}  verdict")  # fmt: skip
    ok_all = True
    for run in runs:
        r = run.result or {}
        judged = run.judged_errors(strict)
        problems = []
        if run.timed_out:
            problems.append("timeout")
        if run.errors is None and run.tool != "native":
            problems.append("no error summary")
        if judged:
            problems.append(f"{judged} errors")
        if not r:
            problems.append("no driver result")
        elif not r.get("ok"):
            problems.append("driver failed")
        if run.returncode not in (0, SANITIZER_EXIT) and not run.timed_out:
            problems.append(f"exit {run.returncode}")
        ok = not problems
        ok_all &= ok
        entries = sum(1 for e in r.get("launches", {}) if e.startswith(("linred_", "op:")))
        print(f"{run.tool:10} {entries:7} {r.get('calls', 0):6} {r.get('checked', 0):7} {r.get('failures', 0):6} "
              f"{r.get('route_mismatches', 0):6} {'-' if run.errors is None else run.errors:>7} "
              f"{'-' if judged is None else judged:>7} {run.seconds:8.0f}  "
              f"{'clean' if ok else 'NOT CLEAN: ' + ', '.join(problems)}")  # fmt: skip
        if run.racecheck:
            print(f"{'':10} racecheck: {run.racecheck}")
        for name, count in run.attributed.most_common(8):
            print(f"{'':10} {count:5} reports in {name}")
        if r.get("missing_entries"):
            print(f"{'':10} entry points not launched: {', '.join(r['missing_entries'])}")
        if r.get("failed_cases"):
            print(f"{'':10} failed calls: {', '.join(r['failed_cases'][:8])}")
        if r.get("setup_error"):
            print(f"{'':10} driver setup failed: {r['setup_error']}")
        if run.note:
            print(f"{'':10} {run.note}")
    native = next((run.result for run in runs if run.tool == "native" and run.result), None) or next(
        (run.result for run in runs if run.result), None
    )
    if native:
        print(f"\n{'entry point':34} {'calls':>6} {'launches':>9}  tiles per run (native run)")
        for entry in sorted(native.get("launches", {}), key=_entry_order):
            ks = ",".join(str(k) for k in native.get("tiles_per_run", {}).get(entry, []))
            print(f"{entry:34} {native['calls_per_entry'].get(entry, 0):6} {native['launches'][entry]:9}  {ks}")
    print(f"\nlogs in {log_dir}")
    print("ALL CLEAN" if ok_all else "NOT CLEAN")
    return 0 if ok_all else 1


# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Run compute-sanitizer over linred's NVRTC kernels on shapes at their tiling boundaries.",
        epilog="On the GPU machine: PYTHONPATH=$PWD:/tmp/site python tools/sanitize_kernels.py --log-dir $OUT/sanitize",
    )
    p.add_argument("--tools", default=",".join(TOOLS), help="comma-separated sanitizer tools (default: all four)")
    p.add_argument("--quick", action="store_true", help="only the k*T member of every boundary triple")
    p.add_argument("--log-dir", help="write each tool's full log (and the driver's output) here")
    p.add_argument("--timeout", type=float, default=420, help="seconds each tool (and the native run) may take")
    p.add_argument("--parallel", type=int, default=4, help="tools run at once on the GPU (default 4)")
    p.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                   help="processes of the native run, which compiles the kernels into the cache")  # fmt: skip
    p.add_argument("--no-native", action="store_true", help="skip the native run (the sanitized runs then compile)")
    p.add_argument("--groups", default=",".join(GROUPS), help="nvrtc (linred's kernels), cub (the cub backend's)")
    p.add_argument("--kernel-filter", choices=("none", "linred"), default="none",
                   help="linred: check only kernels named linred_* (--kernel-name kns=linred_)")  # fmt: skip
    p.add_argument("--strict", action="store_true", help="initcheck errors in other libraries' kernels fail too")
    p.add_argument("--sanitizer", default="compute-sanitizer", help="the compute-sanitizer executable")
    p.add_argument("--cache-dir", help="linred's kernel cache for the runs (default: a new temporary directory)")
    p.add_argument("--list", action="store_true", help="print the planned calls and their entry points (no GPU)")
    p.add_argument("--json", action="store_true", help="with --list: as JSON")
    p.add_argument("--driver", action="store_true", help="run the calls in this process (what the sanitizer runs)")
    p.add_argument("--tool", default="native", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--shard", help=argparse.SUPPRESS)
    p.add_argument("--verbose", action="store_true", help="with --driver: print every call")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        return print_list(build_sets(args.quick, _groups(args.groups)), args.json)
    if args.driver:
        return driver(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
