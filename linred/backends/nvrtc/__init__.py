"""The nvrtc backend: linred's own CUDA kernels, compiled at run time with NVRTC.

It serves what the libraries leave below memory bandwidth (see
docs/performance.md): short fixed-length segments, where a GEMV with a tiny
inner dimension or CUB's segment-per-warp mapping waste most of each load,
variable-length segments, where cuSPARSE's indicator SpMV reads an index per
element and CUB balances poorly, and short segments of feature rows.  The
kernels (``linred/kernels/*.cuh``):

- ``fixed_small`` for fixed lengths that are powers of two up to 32 vectors of 16
  bytes, on contiguous data: 16-byte loads, segments reduced in registers and
  warp shuffles; ``fixed_rows`` for longer powers of two, up to 16 rows of 32
  vectors (2048 float32 elements), each warp streaming a contiguous run of rows
  and reducing a segment's rows lane by lane, then across the warp.  Both are
  one launch that reads only the data's and the result's device pointers,
  which keeps small calls cheap; ``fixed_long`` for longer fixed lengths of
  whole vectors: blocks reduce chunks of up to 4096 vectors and the last block
  of each segment adds the partials in order (one launch, deterministic);
- ``warp_reduce`` + ``tile_fixup`` for offsets, and fixed lengths that are not powers
  of two, on 16-byte aligned contiguous rows: every warp reduces a run of tiles of
  512 elements on its own (no block barriers), finding its first segment with a
  32-way search, marking the segment starts of a tile in a bitmask and joining the
  pieces that cross lanes with a keyed warp scan; segments that span runs are
  completed from per-run partials in a fixed order;
- ``tile_reduce`` + ``tile_fixup`` for everything else with one feature column, and for
  feature columns that are not contiguous (a transposed array: each column reduced as a
  row of its own, its results written as a column of the result):
  tiles of 4096 elements, every segment in a tile reduced by a group of lanes
  sized to the tile's segment count (or, where a tile holds many segments, every
  thread reducing its own 16 consecutive elements and a block-wide segmented
  scan joining the pieces), and segments that span blocks completed from
  per-block partials in a fixed order, so results are deterministic;
- ``features_reduce`` for segments of rows of several contiguous feature columns:
  one thread per segment and 16 bytes of features.

Sums accumulate in float32 for float16/bfloat16, in the data's own precision for
float32/float64 (never TF32: these are plain FMA-free adds), and in int64/uint64
for integers.  Complex data is left to the linear-algebra backends.

The package: this module decides (availability, refusals, :func:`route`: which
kernel family serves a problem) and imports no CUDA library; :mod:`.kernels`
derives the template instantiations and launch shapes (pure arithmetic);
:mod:`.executors` compiles, allocates and launches through cuda.core.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from linred._dtypes import COMPLEX, itemsize
from linred.backends.base import INT32_MAX, Backend, Executor, Options
from linred.backends.nvrtc.kernels import STAGED_MAX_BYTES, flat, is_pow2, vec
from linred.problem import Problem


@dataclass(frozen=True, slots=True)
class NvrtcOptions(Options):
    """Launch shapes of the kernels, read once per plan (see docs/performance.md for how they
    were chosen); change them with ``linred.backends.configure("nvrtc", ...)``."""

    threads: int = 256  #: threads per block
    unroll: int = 8  #: 16-byte vectors per thread in fixed_small and fixed_rows (rows in the feature kernels)
    #: the same for fixed_small with 2-byte data (float16 and bfloat16 ran 4-8% faster with 4
    #: than with 8 for L = 32 to 256 on an H100, and as fast for L = 2 and 8)
    unroll_2byte: int = 4
    max_rows: int = 16  #: longest fixed_rows segment, in warp-rows of 32 vectors (then the tile kernel)
    #: most threads per block of fixed_long (fewer for short segments: see _long_threads)
    long_threads: int = 256
    #: shortest segment fixed_long reduces, in bytes: each block reads a segment's chunk, and
    #: blocks of shorter segments start too slowly (1200-byte segments ran at 66% of copy on
    #: an H100, 2000-byte ones at 104%); shorter ones go to warp_reduce
    long_min_bytes: int = 2000
    tile: int = 4096  #: elements per tile in tile_reduce
    min_blocks: int = 5  #: resident blocks per SM that tile_reduce's registers must allow
    min_blocks_wide: int = 4  #: the same with 8-byte accumulators (more registers without spilling)
    max_tiles_per_block: int = 16  #: consecutive tiles one block reduces (fewer when the data is small)
    #: the fewest runs per SM tile_reduce's tiles per run leave (halved from max_tiles_per_block
    #: until there are as many; 20 measured fastest or within 2% of 10, 5 and 2 on an H200)
    tile_runs_per_sm: int = 20
    max_tiles_per_warp: int = 16  #: consecutive tiles one warp reduces in warp_reduce (fewer for small data)
    min_blocks_warp: int = 4  #: resident blocks per SM that warp_reduce's registers must allow
    #: the fewest runs per SM warp_reduce's tiles per run leave (halved from max_tiles_per_warp
    #: until there are as many): long runs, fewer searches and partials.  H200, float32, device
    #: us per call at 2^24 values (128, as tile_reduce's four waves, -> 16): one segment 102 ->
    #: 32, geometric lengths of mean 16 54.9 -> 37.5, of 8192 40.6 -> 27.9; at 2^26 1-43% (one
    #: segment 117 -> 83, float16 108 -> 61); at 2^28 unchanged (16 tiles a run already)
    warp_runs_per_sm: int = 16
    #: the fewest bytes of feature rows with offsets whose long segments the feature kernels cut
    #: into tiles of FEATURE_TILE_ROWS rows (a search of the offsets per tile: see features_long_rows)
    feature_long_min_bytes: int = 32 << 20
    #: a segment is long past this many times the average length (and FEATURE_TILE_ROWS rows)
    feature_long_factor: int = 2
    #: rows a thread of the feature kernels loads at once where rows are narrow (64 bytes or
    #: less; ``unroll`` elsewhere).  H200, float32, device us per call (8 -> 4, torch in
    #: brackets): 10^7 x 16 in 10^5 even segments 167.4 -> 159.5 (157.6), geometric lengths
    #: 209.0 -> 178.3 (260.1); 10^7 x 8 93.4 -> 86.4 (87.0); 10^6 x 16 22.8 -> 21.8 (24.3).
    feature_narrow_unroll: int = 4

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if type(value) is not int or value < 1:
                raise ValueError(f"nvrtc option {f.name} must be a positive int; got {value!r}")
        for name in ("threads", "long_threads"):
            value = getattr(self, name)
            if value % 32 or value > 1024:
                raise ValueError(f"nvrtc option {name} must be a multiple of 32 up to 1024; got {value}")
        for name in ("unroll", "unroll_2byte", "max_rows", "feature_narrow_unroll"):
            value = getattr(self, name)
            if value & (value - 1):
                raise ValueError(f"nvrtc option {name} must be a power of two; got {value}")
        if self.tile % self.threads:
            raise ValueError(f"nvrtc option tile must be a multiple of threads ({self.threads}); got {self.tile}")


def route(problem: Problem, options: NvrtcOptions) -> str:
    """Which kernel family serves ``problem`` (one the backend does not refuse).

    - ``"fixed"``: power-of-two fixed lengths on contiguous data, ``fixed_small``
      or ``fixed_rows``;
    - ``"staged"``: short fixed lengths that are not powers of two (at most 256 bytes)
      on contiguous data, ``fixed_staged``;
    - ``"long"``: long fixed lengths of whole 16-byte vectors on contiguous data,
      ``fixed_long``;
    - ``"features"``: several contiguous feature columns, ``features_reduce``;
    - ``"tile"``: several feature columns that are not contiguous, ``tile_reduce``, each
      column a row of its own;
    - ``"warp"``: everything else, ``warp_reduce`` on aligned contiguous rows and
      ``tile_reduce`` on the rest (chosen per call, by the data's alignment).
    """
    if problem.features != 1:  # (before the one-column kernels: a strided column can look flat)
        return "features" if problem.strides[2] == 1 else "tile"
    L, v = problem.segment_length, vec(problem)
    # fixed_rows and fixed_long keep up to 16 vectors in flight per thread; 1-byte data widened
    # to 4- or 8-byte sums would need over 100 registers for that, so for 1-byte data only
    # fixed_small's lengths take a one-launch kernel.
    wide = v <= 8
    longest = 32 * v * (options.max_rows if wide else 1)
    short = problem.fixed and is_pow2(L) and longest >= L
    if short and flat(problem) and (problem.batch * problem.n) % v == 0:
        return "fixed"
    # Short lengths that are not powers of two, whole segments staged in shared memory.
    staged = problem.fixed and not is_pow2(L) and L * itemsize(problem.dtype) <= STAGED_MAX_BYTES
    if staged and flat(problem):
        return "staged"
    # Long fixed lengths of whole vectors: fixed_long.
    long = wide and problem.fixed and L % v == 0 and L * itemsize(problem.dtype) >= options.long_min_bytes
    if long and flat(problem):
        return "long"
    return "warp"


#: feature columns that are not contiguous are read by tile_reduce, each as a row of its own;
#: ``auto`` tries the backends that read strided features first where a column holds less than
#: a quarter of a tile (the transpose of wide rows in short segments, say: each column would take
#: a block that reads a few elements), and comes back to nvrtc where none of them serves the call
#: (products, means and integer sums of some layouts)
COLUMN_MIN_TILE_SHARE = 4


def _columns_slower(problem: Problem, options: NvrtcOptions) -> str | None:
    """Why ``auto`` should try the other backends first for ``problem``'s feature columns, or None."""
    n = problem.n
    if problem.features != 1 and problem.strides[2] != 1 and n * COLUMN_MIN_TILE_SHARE < options.tile:
        return (
            f"it reads feature columns that are not contiguous as rows of their own, and columns of {n} "
            f"elements (fewer than {options.tile // COLUMN_MIN_TILE_SHARE}) leave its tiles nearly empty"
        )
    return None


def _columns_unsupported(problem: Problem, options: NvrtcOptions) -> str | None:
    """Why tile_reduce does not take ``problem``'s feature columns that are not contiguous, or None."""
    n = problem.n
    if problem.batch * problem.features * -(-n // options.tile) > INT32_MAX:
        return f"its tile kernel would need more than {INT32_MAX} blocks for {problem.batch * problem.features} columns"
    return None


@functools.cache
def _compute_capability(device: int) -> tuple[int, int]:
    from cuda.core import Device

    return tuple(Device(device).compute_capability)


#: the launch shapes nvrtc starts with (tests and tools read the default shapes here)
DEFAULT_OPTIONS = NvrtcOptions()


class NvrtcBackend(Backend):
    options = DEFAULT_OPTIONS
    name = "nvrtc"
    reductions = ("sum", "mean", "max", "min", "prod")
    summary = "CUDA devices: linred's own kernels (NVRTC) for short fixed segments and variable lengths"

    def unavailable(self) -> str | None:
        try:
            import cuda.core  # noqa: F401 - compiles and launches the kernels
            from cuda.bindings import nvrtc, runtime

            err, count = runtime.cudaGetDeviceCount()
            if err != runtime.cudaError_t.cudaSuccess or count == 0:
                return "no CUDA device is visible"
            err, _, _ = nvrtc.nvrtcVersion()
            if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                return "NVRTC is not usable"
        except Exception as e:  # missing packages or libraries raise more than ImportError
            return f"cuda.core, cuda.bindings or NVRTC is not usable ({type(e).__name__}: {e})"
        return None

    def unsupported(self, problem: Problem) -> str | None:
        if not problem.on_gpu:
            return f"it runs on CUDA devices and the data is a host {problem.kind} array"
        if problem.dtype in COMPLEX or problem.out_dtype in COMPLEX:
            return "its kernels handle real and integer data; 'nvmath' and 'cublas' serve complex sums"
        if "bfloat16" in (problem.dtype, problem.out_dtype) and _compute_capability(problem.device) < (8, 0):
            return "its bfloat16 conversions need compute capability 8.0 or newer; 'cub' serves bfloat16 here"
        if problem.features != 1 and problem.strides[2] != 1:
            return _columns_unsupported(problem, self.options)
        return None

    def slower(self, problem: Problem) -> str | None:
        return _columns_slower(problem, self.options)

    def plan(self, problem: Problem) -> Executor:
        from linred.backends.nvrtc.executors import EXECUTORS

        options = self.options  # read once: the executor keeps them
        return EXECUTORS[route(problem, options)](problem, options)


BACKEND = NvrtcBackend()
