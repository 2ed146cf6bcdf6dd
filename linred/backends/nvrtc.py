"""The nvrtc backend: linred's own CUDA kernels, compiled at run time with NVRTC.

It serves what the libraries leave below memory bandwidth (see
docs/performance.md): short fixed-length segments, where a GEMV with a tiny
inner dimension or CUB's segment-per-warp mapping waste most of each load, and
variable-length segments, where cuSPARSE's indicator SpMV reads an index per
element and CUB balances poorly.  Two kernels (``linred/kernels/segreduce.cuh``):

- ``fixed_small`` for fixed lengths that are powers of two up to 32 vectors of 16
  bytes, on contiguous data: 16-byte loads, segments reduced in registers and
  warp shuffles;
- ``tile_reduce`` + ``tile_fixup`` for everything else with one feature column:
  tiles of 4096 elements staged in shared memory, every segment in a tile
  reduced by a group of lanes sized to the tile's segment count, and segments
  that span tiles completed from per-tile partials in a fixed order, so results
  are deterministic.

Sums accumulate in float32 for float16/bfloat16, in the data's own precision for
float32/float64 (never TF32: these are plain FMA-free adds), and in int64/uint64
for integers.  Complex data and feature dimensions are left to the
linear-algebra backends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from linred._dtypes import COMPLEX, REAL, UNSIGNED, itemsize
from linred.backends.base import Backend
from linred.problem import Problem
from linred.segments import Segments, VariableSegments


@dataclass(frozen=True)
class Tuning:
    """Launch shapes of the kernels (fixed per plan; see docs/performance.md for how they were chosen)."""

    threads: int = 256  #: threads per block
    unroll: int = 8  #: 16-byte vectors per thread in fixed_small
    tile: int = 4096  #: elements per tile in tile_reduce
    min_blocks: int = 4  #: resident blocks per SM that tile_reduce's registers must allow
    max_tiles_per_block: int = 16  #: consecutive tiles one block reduces (fewer when the data is small)


TUNING = Tuning()

_OPS = {"sum": "OpSum", "mean": "OpSum", "max": "OpMax", "min": "OpMin"}


def _ctype(name: str) -> str:
    from linred.kernels.compiler import CTYPES

    return CTYPES[name]


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


def _acc_dtype(problem: Problem) -> str:
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


def _acc_ctype(problem: Problem) -> str:
    return _ctype(_acc_dtype(problem))


def _vec(problem: Problem) -> int:
    return 16 // itemsize(problem.dtype)


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _flat(problem: Problem) -> bool:
    """Whether x3 is one contiguous run of batch * n elements."""
    b, n, _ = problem.in_shape
    s0, s1, _ = problem.strides
    return s1 == 1 and (b == 1 or s0 == n)


def _cuda_launch() -> Any:
    from cuda.core import launch

    return launch


class _Launcher:
    """What every executor needs: the device, SM count and cuda.core streams by handle."""

    def __init__(self, problem: Problem) -> None:
        from cuda.core import Device

        self.device = problem.device
        dev = Device(problem.device)
        dev.set_current()
        self.sms = dev.properties.multiprocessor_count
        self._streams: dict[int, Any] = {}
        self.kind = problem.kind

    def stream(self, handle: int) -> Any:
        s = self._streams.get(handle)
        if s is None:
            from cuda.core import Stream

            s = self._streams[handle] = Stream.from_handle(handle)
        return s

    def ptr(self, a: Any) -> int:
        return a.data.ptr if self.kind == "cupy" else a.data_ptr()

    def empty(self, count: int, dtype: str) -> Any:
        if self.kind == "cupy":
            from linred.arrays._cupy import CUPY as adapter
        else:
            from linred.arrays._torch import TORCH as adapter
        return adapter.empty((count,), dtype, self.device)


def _fixed_small_wrapper(problem: Problem, tuning: Tuning) -> str:
    t, o, a = _ctype(problem.dtype), _ctype(problem.out_dtype), _acc_ctype(problem)
    mean = "true" if problem.reduction == "mean" else "false"
    return (
        f'extern "C" __global__ void __launch_bounds__({tuning.threads}) '
        f"linred_fixed_small(const {t}* x, {o}* out, long long nvec) {{\n"
        f"    fixed_small<{t}, {a}, {o}, {_OPS[problem.reduction]}, {problem.segment_length}, {mean}, "
        f"{tuning.threads}, {tuning.unroll}>(x, out, nvec);\n}}\n"
    )


def _tile_wrapper(problem: Problem, vecload: bool, index_ctype: str, tuning: Tuning, k: int) -> str:
    t, o, a = _ctype(problem.dtype), _ctype(problem.out_dtype), _acc_ctype(problem)
    mean = "true" if problem.reduction == "mean" else "false"
    op = _OPS[problem.reduction]
    threads, tile = tuning.threads, tuning.tile
    offsets = "FixedOffsets{L}" if problem.fixed else f"ArrayOffsets<{index_ctype}>{{offsets}}"
    common = (
        f"const {index_ctype}* offsets, long long L, long long n, long long m, long long rs, long long es, "
        "long long tpr, long long bpr, long long nb, const long long* bounds"
    )
    args = "TileArgs a{n, m, rs, es, tpr, bpr, nb};"
    vl = "true" if vecload else "false"
    return (
        f'extern "C" __global__ void __launch_bounds__({threads}, {tuning.min_blocks}) '
        f"linred_tile(const {t}* x, {o}* out, {common}, {a}* head, {a}* tail, long long* ts) {{\n    {args}\n"
        f"    tile_reduce<{t}, {a}, {o}, {op}, {mean}, {threads}, {tile}, {k}, {vl}>"
        f"(x, out, {offsets}, a, bounds, head, tail, ts);\n}}\n"
        f'extern "C" __global__ void __launch_bounds__({threads}) linred_fixup({o}* out, {common}, '
        f"const {a}* head, const {a}* tail, const long long* ts) {{\n    {args}\n"
        f"    tile_fixup<{t}, {a}, {o}, {op}, {mean}, {tile}, {k}>(out, {offsets}, a, head, tail, ts);\n}}\n"
        f'extern "C" __global__ void __launch_bounds__({threads}) linred_bounds({common}) {{\n'
        f"    tile_bounds<{tile}>({offsets}, m, n, tpr, const_cast<long long*>(bounds));\n}}\n"
    )


class _FixedSmallExecutor:
    """Power-of-two fixed lengths on contiguous, 16-byte aligned data; otherwise the tile path."""

    def __init__(self, problem: Problem) -> None:
        self._problem = problem
        self._tuning = TUNING
        self._launch = _Launcher(problem)
        self._kernel = None
        self._tiles: _TileExecutor | None = None
        b, n, _ = problem.in_shape
        self._nvec = b * n // _vec(problem)
        # One chunk per block: the block scheduler overlaps finishing blocks with new ones.
        self._blocks = max(1, -(-self._nvec // (self._tuning.threads * self._tuning.unroll)))
        self._config = None

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        launch = self._launch
        xp = launch.ptr(x)
        if xp % 16:
            if self._tiles is None:
                self._tiles = _TileExecutor(self._problem)
            self._tiles(x, out, segments, stream)
            return
        if self._kernel is None:
            from linred.kernels.compiler import get_kernels

            wrapper = _fixed_small_wrapper(self._problem, self._tuning)
            (self._kernel,) = get_kernels(launch.device, wrapper, ("linred_fixed_small",))
        if self._config is None:
            from cuda.core import LaunchConfig

            self._config = LaunchConfig(grid=self._blocks, block=self._tuning.threads)
        _cuda_launch()(launch.stream(stream), self._config, self._kernel, xp, launch.ptr(out), self._nvec)

    def free(self) -> None:
        if self._tiles is not None:
            self._tiles.free()
        self._kernel = self._tiles = None


class _TileExecutor:
    """Any segments (fixed or offsets) with one feature column, any strides."""

    def __init__(self, problem: Problem) -> None:
        self._problem = problem
        self._tuning = tuning = TUNING
        self._launch = _Launcher(problem)
        b, n, _ = problem.in_shape
        self._tiles_per_row = -(-n // tuning.tile)
        # Tiles per block: as many as keep every SM busy with a few waves of blocks.
        k = tuning.max_tiles_per_block
        while k > 1 and b * -(-self._tiles_per_row // k) < 4 * tuning.min_blocks * self._launch.sms:
            k //= 2
        self._k = k
        self._blocks_per_row = -(-self._tiles_per_row // k)
        self._num_blocks = b * self._blocks_per_row
        acc = _acc_dtype(problem)
        self._head = self._launch.empty(self._num_blocks, acc)
        self._tail = self._launch.empty(self._num_blocks, acc)
        self._tail_seg = self._launch.empty(self._num_blocks, "int64")
        # Offsets: the first segment of every tile, found once per call by linred_bounds.
        self._bounds = None if problem.fixed else self._launch.empty(self._tiles_per_row + 1, "int64")
        self._kernels: dict[tuple[bool, str], tuple[Any, Any, Any]] = {}
        self._configs: tuple[Any, Any, Any] | None = None
        self._fix_blocks = max(1, -(-self._num_blocks // (tuning.threads // 32)))
        self._bound_blocks = max(1, -(-(self._tiles_per_row + 1) // tuning.threads))
        L = problem.segment_length
        # Fixed lengths dividing the tile never span two tiles: no partials to combine.
        self._needs_fixup = not (problem.fixed and tuning.tile >= L and tuning.tile % L == 0)

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        problem = self._problem
        launch = self._launch
        threads = self._tuning.threads
        xp = launch.ptr(x)
        b, n, _ = problem.in_shape
        s0, s1, _ = problem.strides
        size = itemsize(problem.dtype)
        vecload = s1 == 1 and xp % 16 == 0 and (b == 1 or (s0 * size) % 16 == 0)
        if isinstance(segments, VariableSegments):
            offsets_ptr = launch.ptr(segments.offsets)
            index = _ctype(problem.offsets_dtype)
        else:
            offsets_ptr, index = 0, "long long"
        key = (vecload, index)
        kernels = self._kernels.get(key)
        if kernels is None:
            from linred.kernels.compiler import get_kernels

            wrapper = _tile_wrapper(problem, vecload, index, self._tuning, self._k)
            kernels = get_kernels(launch.device, wrapper, ("linred_tile", "linred_fixup", "linred_bounds"))
            self._kernels[key] = kernels
        if self._configs is None:
            from cuda.core import LaunchConfig

            self._configs = (
                LaunchConfig(grid=self._bound_blocks, block=threads),
                LaunchConfig(grid=self._num_blocks, block=threads),
                LaunchConfig(grid=self._fix_blocks, block=threads),
            )
        cuda_launch = _cuda_launch()
        s = launch.stream(stream)
        L = problem.segment_length or 0
        bounds = 0 if self._bounds is None else launch.ptr(self._bounds)
        common = (offsets_ptr, L, n, problem.num_segments, s0, s1, self._tiles_per_row, self._blocks_per_row,
                  self._num_blocks, bounds)  # fmt: skip
        head, tail, ts = launch.ptr(self._head), launch.ptr(self._tail), launch.ptr(self._tail_seg)
        op = launch.ptr(out)
        bounds_config, tile_config, fixup_config = self._configs
        if self._bounds is not None:
            cuda_launch(s, bounds_config, kernels[2], *common)
        cuda_launch(s, tile_config, kernels[0], xp, op, *common, head, tail, ts)
        if self._needs_fixup:
            cuda_launch(s, fixup_config, kernels[1], op, *common, head, tail, ts)

    def free(self) -> None:
        self._kernels.clear()
        self._head = self._tail = self._tail_seg = self._bounds = None


class NvrtcBackend(Backend):
    name = "nvrtc"
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
        if problem.features != 1:
            return (
                f"its kernels reduce one column (the data has {problem.features} features after the segment axis); "
                "'nvmath', 'cublas' and 'cub' serve feature dimensions"
            )
        return None

    def plan(self, problem: Problem):
        L, vec = problem.segment_length, _vec(problem)
        short = problem.fixed and _is_pow2(L) and 32 * vec >= L
        if short and _flat(problem) and (problem.batch * problem.n) % vec == 0:
            return _FixedSmallExecutor(problem)
        return _TileExecutor(problem)


BACKEND = NvrtcBackend()
