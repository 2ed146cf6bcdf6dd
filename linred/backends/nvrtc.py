"""The nvrtc backend: linred's own CUDA kernels, compiled at run time with NVRTC.

It serves what the libraries leave below memory bandwidth (see
docs/performance.md): short fixed-length segments, where a GEMV with a tiny
inner dimension or CUB's segment-per-warp mapping waste most of each load,
variable-length segments, where cuSPARSE's indicator SpMV reads an index per
element and CUB balances poorly, and short segments of feature rows.  The
kernels (``linred/kernels/segreduce.cuh``):

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
- ``tile_reduce`` + ``tile_fixup`` for everything else with one feature column:
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
"""

from __future__ import annotations

import functools
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
    unroll: int = 8  #: 16-byte vectors per thread in fixed_small and fixed_rows
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
    max_tiles_per_warp: int = 16  #: consecutive tiles one warp reduces in warp_reduce (fewer for small data)
    min_blocks_warp: int = 4  #: resident blocks per SM that warp_reduce's registers must allow


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


@functools.cache
def _compute_capability(device: int) -> tuple[int, int]:
    from cuda.core import Device

    return tuple(Device(device).compute_capability)


def _cuda_launch() -> Any:
    from cuda.core import launch

    return launch


def _cupy_pointer(a: Any) -> int:
    return a.data.ptr


def _torch_pointer(a: Any) -> int:
    return a.data_ptr()


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
        #: the device pointer of an array of the problem's library (chosen once: calls are hot)
        self.ptr = _cupy_pointer if problem.kind == "cupy" else _torch_pointer

    def stream(self, handle: int) -> Any:
        s = self._streams.get(handle)
        if s is None:
            from cuda.core import Stream

            s = self._streams[handle] = Stream.from_handle(handle)
        return s

    def allow_shared_memory(self, kernel: Any, size: int) -> None:
        """Let ``kernel`` use ``size`` bytes of dynamic shared memory (past 48 KiB it must opt in)
        and prefer the largest shared memory carveout (its occupancy is set by shared memory)."""
        from cuda.bindings import driver

        attribute = driver.CUfunction_attribute
        for attr, value in (
            (attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, size),
            (attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100),
        ):
            (err,) = driver.cuKernelSetAttribute(attr, value, kernel.handle, self.device)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cannot set {attr.name}={value} for a kernel on device {self.device}: {err}")

    def _adapter(self) -> Any:
        if self.kind == "cupy":
            from linred.arrays._cupy import CUPY as adapter
        else:
            from linred.arrays._torch import TORCH as adapter
        return adapter

    def empty(self, count: int, dtype: str) -> Any:
        return self._adapter().empty((count,), dtype, self.device)

    def fill(self, a: Any, value: Any, stream: int) -> None:
        """Fill ``a`` with ``value`` on ``stream`` (ordered with the kernels launched there)."""
        self._adapter().fill(a, value, stream)

    def stream_order(self) -> Any:
        """A :class:`StreamOrder` for an executor with scratch buffers: a call on another stream
        than the previous call's waits for it (an event, no host synchronization), so that two
        streams never use the scratch at once."""
        from linred.backends._nvmath_gpu_arrays import StreamOrder, ops_for

        return StreamOrder(ops_for(self.kind, self.device))


def _fixed_layout(problem: Problem, tuning: Tuning) -> tuple[str, int]:
    """``(kernel, vectors per thread)`` for a power-of-two fixed length: ``fixed_small`` up to
    32 vectors per segment, ``fixed_rows`` up to ``max_rows`` warp-rows (a thread loads at
    least one vector of each row of its segment, so the unroll grows with the rows)."""
    rows = problem.segment_length // (32 * _vec(problem))
    if rows <= 1:
        return "fixed_small", tuning.unroll_2byte if itemsize(problem.dtype) == 2 else tuning.unroll
    return "fixed_rows", max(tuning.unroll, rows)


def _fixed_wrapper(problem: Problem, tuning: Tuning) -> str:
    t, o, a, op, mean = _kernel_types(problem)
    kernel, unroll = _fixed_layout(problem, tuning)
    return (
        f'extern "C" __global__ void __launch_bounds__({tuning.threads}) '
        f"linred_fixed(const {t}* x, {o}* out, long long nvec) {{\n"
        f"    {kernel}<{t}, {a}, {o}, {op}, {problem.segment_length}, {mean}, "
        f"{tuning.threads}, {unroll}>(x, out, nvec);\n}}\n"
    )


def _long_threads(problem: Problem, tuning: Tuning) -> int:
    """Threads per block of fixed_long: up to ``tuning.long_threads``, halved (to 64 at least)
    until every thread has at least 2 of a segment's vectors to load.  One vector per thread
    left too few loads in flight (1000 float32 elements: 77% of copy with 256 threads, 104%
    with 128)."""
    lv = problem.segment_length // _vec(problem)
    threads = tuning.long_threads
    while threads > 64 and 2 * threads > lv:
        threads //= 2
    return threads


def _long_unroll(problem: Problem, tuning: Tuning) -> int:
    """Vectors per thread in fixed_long: the fewest (a power of two, at most 16) that let one
    block's chunk cover a whole segment, so that short-enough segments need no partials."""
    lv = problem.segment_length // _vec(problem)
    threads = _long_threads(problem, tuning)
    unroll = 1
    while unroll < 16 and threads * unroll < lv:
        unroll *= 2
    return unroll


def _long_wrapper(problem: Problem, tuning: Tuning) -> str:
    t, o, a, op, mean = _kernel_types(problem)
    threads = _long_threads(problem, tuning)
    return (
        f'extern "C" __global__ void __launch_bounds__({threads}) '
        f"linred_long(const {t}* x, {o}* out, {a}* partials, unsigned* tickets, long long lv, long long chunks, "
        "long long m) {\n"
        f"    fixed_long<{t}, {a}, {o}, {op}, {mean}, {threads}, {_long_unroll(problem, tuning)}>"
        "(x, out, partials, tickets, lv, chunks, m);\n}\n"
    )


def _kernel_types(problem: Problem) -> tuple[str, str, str, str, str]:
    """C types of the data, result and accumulator, the operation, and MEAN."""
    mean = "true" if problem.reduction == "mean" else "false"
    return _ctype(problem.dtype), _ctype(problem.out_dtype), _acc_ctype(problem), _OPS[problem.reduction], mean


#: the arguments every tile kernel takes, and the TileArgs they make
_COMMON = (
    "const {i}* offsets, long long L, long long n, long long m, long long rs, long long es, "
    "long long tpr, long long bpr, long long nb, long long tpb, const long long* bounds"
)
_ARGS = "TileArgs a{n, m, rs, es, tpr, bpr, nb, tpb};"


def _offsets(problem: Problem, index_ctype: str) -> str:
    return "FixedOffsets{L}" if problem.fixed else f"ArrayOffsets<{index_ctype}>{{offsets}}"


def _fixup(problem: Problem, index_ctype: str, threads: int, tile: int, group: int = 1) -> str:
    """The fix-up of segments that span runs of tiles of ``tile`` elements (with the heads of
    ``group`` consecutive runs also joined, when ``group`` > 1): one thread per run."""
    t, o, a, op, mean = _kernel_types(problem)
    common, offsets = _COMMON.format(i=index_ctype), _offsets(problem, index_ctype)
    return (
        f'extern "C" __global__ void __launch_bounds__({threads}) linred_fixup({o}* out, {common}, '
        f"const {a}* head, const {a}* tail, const long long* ts, const {a}* gh) {{\n    {_ARGS}\n"
        f"    tile_fixup<{t}, {a}, {o}, {op}, {mean}, {tile}, {group}>(out, {offsets}, a, head, tail, ts, gh);\n}}\n"
    )


def _bounds(problem: Problem, index_ctype: str, threads: int, tile: int) -> str:
    """The first segment of every tile of ``tile`` elements (one thread per tile)."""
    common, offsets = _COMMON.format(i=index_ctype), _offsets(problem, index_ctype)
    return (
        f'extern "C" __global__ void __launch_bounds__({threads}) linred_bounds({common}) {{\n'
        f"    tile_bounds<{tile}>({offsets}, m, n, tpr, const_cast<long long*>(bounds));\n}}\n"
    )


def _tile_wrapper(problem: Problem, vecload: bool, index_ctype: str, tuning: Tuning, k: int) -> str:
    t, o, a, op, mean = _kernel_types(problem)
    threads, tile = tuning.threads, tuning.tile
    common, offsets = _COMMON.format(i=index_ctype), _offsets(problem, index_ctype)
    vl = "true" if vecload else "false"
    min_blocks = tuning.min_blocks if itemsize(_acc_dtype(problem)) <= 4 else tuning.min_blocks_wide
    return (
        (
            f'extern "C" __global__ void __launch_bounds__({threads}, {min_blocks}) '
            f"linred_tile(const {t}* x, {o}* out, {common}, {a}* head, {a}* tail, long long* ts, {a}*) {{\n"
            "    extern __shared__ __align__(16) unsigned char smem[];\n"
            f"    {_ARGS}\n"
            f"    tile_reduce<{t}, {a}, {o}, {op}, {mean}, {threads}, {tile}, {k}, {vl}>"
            f"(x, out, {offsets}, a, bounds, head, tail, ts, smem);\n}}\n"
        )
        + _fixup(problem, index_ctype, threads, tile)
        + _bounds(problem, index_ctype, threads, tile)
    )


def _tile_shared_bytes(problem: Problem, vecload: bool, tuning: Tuning) -> int:
    """Dynamic shared memory of linred_tile: TileShared::BYTES in segreduce.cuh."""
    acc = itemsize(_acc_dtype(problem))
    pad = max(1, 16 // acc)
    items = tuning.tile // tuning.threads
    stage = -(-(tuning.tile + tuning.tile // 16 * pad) * acc // 16) * 16
    fast = vecload and acc == 4 and items <= 32 and 32 % items == 0
    return stage + (tuning.tile * 2 if fast else 0)


def _features_wrapper(problem: Problem, index_ctype: str, tuning: Tuning, width: int) -> str:
    t, o, a, op, mean = _kernel_types(problem)
    return (
        f'extern "C" __global__ void __launch_bounds__({tuning.threads}) '
        f"linred_features(const {t}* x, {o}* out, const {index_ctype}* offsets, long long L, long long n, "
        "long long m, long long bs, long long rs, long long d, long long groups, long long total) {\n"
        "    FeatureArgs a{n, m, bs, rs, d, groups, total};\n"
        f"    features_reduce<{t}, {a}, {o}, {op}, {mean}, {width}, {tuning.unroll}>"
        f"(x, out, {_offsets(problem, index_ctype)}, a);\n}}\n"
    )


class _OneLaunch:
    """What the one-launch fixed-length executors share: they read only the device pointers of
    ``x`` and ``out``, launch one kernel bound once by ``_compile``, and hand data that is not
    16-byte aligned to the tile kernel."""

    #: only the device pointers of ``x`` and ``out`` are read, so a repeated call may pass the
    #: caller's arrays without the (batch, n, features) views
    views = False

    def __init__(self, problem: Problem) -> None:
        self._problem = problem
        self._tuning = TUNING
        self._launch = _Launcher(problem)
        self._ptr = self._launch.ptr
        self._go: Any = None
        self._tiles: _TileExecutor | None = None

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        ptr = self._ptr
        xp = ptr(x)
        if xp % 16:
            if self._tiles is None:
                self._tiles = _TileExecutor(self._problem)
            self._tiles(x, out, segments, stream)  # it too reads only the pointers
            return
        (self._go or self._compile(stream))(stream, xp, ptr(out))

    def _compile(self, stream: int) -> Any:
        """Compile (or load) the kernel, bind what a call does not change, store and return
        ``go(stream, x pointer, out pointer)``; ``stream`` is the first call's."""
        raise NotImplementedError

    def _threads(self) -> int:
        """Threads per block of the executor's kernel."""
        return self._tuning.threads

    def _bind(self, wrapper: str, name: str, grid: int, *args: Any) -> Any:
        """``go`` for kernel ``name`` of ``wrapper``: ``(x, out, *args)`` on ``grid`` blocks."""
        from cuda.core import LaunchConfig, launch

        from linred.kernels.compiler import get_kernels

        (kernel,) = get_kernels(self._launch.device, wrapper, (name,))
        config = LaunchConfig(grid=max(1, min(grid, 2**31 - 1)), block=self._threads())
        streams = self._launch.stream

        def go(stream: int, xp: int, op: int) -> None:
            launch(streams(stream), config, kernel, xp, op, *args)

        self._go = go
        return go

    def free(self) -> None:
        if self._tiles is not None:
            self._tiles.free()
        self._go = self._tiles = None


class _FixedExecutor(_OneLaunch):
    """Power-of-two fixed lengths on contiguous data: ``fixed_small`` or ``fixed_rows``."""

    def _compile(self, stream: int) -> Any:
        problem, tuning = self._problem, self._tuning
        b, n, _ = problem.in_shape
        nvec = b * n // _vec(problem)
        _, unroll = _fixed_layout(problem, tuning)
        # One chunk per block: the block scheduler overlaps finishing blocks with new ones.
        blocks = -(-nvec // (tuning.threads * unroll))
        return self._bind(_fixed_wrapper(problem, tuning), "linred_fixed", blocks, nvec)


class _LongExecutor(_OneLaunch):
    """Long fixed lengths of whole 16-byte vectors on contiguous data: ``fixed_long`` (blocks
    reduce chunks of a segment; the last one of a segment adds the partials in order)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem)
        b, _, _ = problem.in_shape
        self._m = b * problem.num_segments
        self._lv = problem.segment_length // _vec(problem)
        self._chunks = -(-self._lv // (self._threads() * _long_unroll(problem, self._tuning)))
        # Partials and tickets only where a segment spans several blocks.  The tickets are
        # zeroed on the first call's stream, and every call leaves them at zero.
        many = self._chunks > 1
        self._partials = self._launch.empty(self._m * self._chunks, _acc_dtype(problem)) if many else None
        self._tickets = self._launch.empty(self._m, "uint32") if many else None
        self._order = self._launch.stream_order() if many else None

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        order = self._order
        if order is None:
            super().__call__(x, out, segments, stream)
            return
        order.begin(stream)
        super().__call__(x, out, segments, stream)
        order.end(stream)

    def _threads(self) -> int:
        return _long_threads(self._problem, self._tuning)

    def _compile(self, stream: int) -> Any:
        problem, ptr = self._problem, self._ptr
        partials = tickets = 0
        if self._tickets is not None:
            self._launch.fill(self._tickets, 0, stream)
            partials, tickets = ptr(self._partials), ptr(self._tickets)
        args = (partials, tickets, self._lv, self._chunks, self._m)
        return self._bind(_long_wrapper(problem, self._tuning), "linred_long", self._m * self._chunks, *args)

    def free(self) -> None:
        if self._order is not None:
            self._order.wait_idle()  # the partials and tickets go back to the pool
        super().free()
        self._partials = self._tickets = self._order = None


def _index_ctype(problem: Problem) -> str:
    return "long long" if problem.fixed else _ctype(problem.offsets_dtype)


class _Runs:
    """What the executors of ``tile_reduce`` and ``warp_reduce`` share: every row cut into tiles
    of ``tile`` elements, runs of ``k`` consecutive tiles each reduced by one worker (a block of
    ``tile_reduce``, a warp of ``warp_reduce``; ``per_block`` workers to a block), the partials of
    the segments that span runs, for offsets the first segment of every tile (``bounds``:
    ``tile_reduce`` reads them, ``warp_reduce``'s warps search for their own), compiling, and
    the launches: bounds, reduction, fix-up."""

    def __init__(
        self, problem: Problem, launch: _Launcher, *, tile: int, max_k: int, per_block: int, min_blocks: int,
        bounds: bool,
    ) -> None:  # fmt: skip
        from cuda.core import LaunchConfig

        self._problem = problem
        self._tuning = tuning = TUNING
        self._launch = launch
        b, n, _ = problem.in_shape
        threads = tuning.threads
        self._tiles_per_row = -(-n // tile)
        # Tiles per run: as many as leave a few waves of workers for every SM.
        k = max_k
        while k > 1 and b * -(-self._tiles_per_row // k) < 4 * min_blocks * per_block * launch.sms:
            k //= 2
        self._k = k
        self._runs_per_row = -(-self._tiles_per_row // k)
        self._runs = b * self._runs_per_row
        self._grid = -(-self._runs // per_block)
        acc = _acc_dtype(problem)
        self._head = launch.empty(self._runs, acc)
        self._tail = launch.empty(self._runs, acc)
        self._tail_seg = launch.empty(self._runs, "int64")
        # The heads of each block's runs, joined (where a block holds several runs).
        self._group_head = launch.empty(self._grid, acc) if per_block > 1 else None
        self._order = launch.stream_order()  # the partials (and bounds) serve one stream at a time
        # Offsets: the first segment of every tile, found once per call by linred_bounds.
        count = self._tiles_per_row + 1
        self._bounds = launch.empty(count, "int64") if bounds and not problem.fixed else None
        self._bounds_config = LaunchConfig(grid=max(1, -(-count // threads)), block=threads)
        self._fixup_config = LaunchConfig(grid=max(1, -(-self._runs // threads)), block=threads)
        self._needs_fixup = True

    def _rows_aligned(self, xp: int) -> bool:
        """Whether every row of the data at ``xp`` is contiguous and made of whole 16-byte vectors."""
        problem = self._problem
        b, _, _ = problem.in_shape
        s0, s1, _ = problem.strides
        return s1 == 1 and xp % 16 == 0 and (b == 1 or (s0 * itemsize(problem.dtype)) % 16 == 0)

    def _compile_kernels(self, wrapper: str, names: tuple[str, ...], shared: int) -> tuple[tuple[Any, Any, Any], Any]:
        """The kernels ``names`` of ``wrapper`` (reduction, fix-up, then the bounds kernel where
        there is one; None in its place otherwise) and the reduction's launch shape with
        ``shared`` bytes of dynamic shared memory."""
        from cuda.core import LaunchConfig

        from linred.kernels.compiler import get_kernels

        kernels = tuple(get_kernels(self._launch.device, wrapper, names))
        self._launch.allow_shared_memory(kernels[0], shared)
        config = LaunchConfig(grid=self._grid, block=self._tuning.threads, shmem_size=shared)
        return kernels + (None,) * (3 - len(kernels)), config

    def _run(self, xp: int, out: Any, segments: Segments, stream: Any, kernels: tuple, config: Any) -> None:
        """Launch the bounds (for offsets), the reduction ``kernels[0]`` and the fix-up
        ``kernels[1]``; both take the group heads' pointer (0 without them; tile_reduce ignores it)."""
        problem, launch = self._problem, self._launch
        kernel, fixup, bounds_kernel = kernels
        _, n, _ = problem.in_shape
        s0, s1, _ = problem.strides
        offsets = launch.ptr(segments.offsets) if isinstance(segments, VariableSegments) else 0
        bounds = 0 if self._bounds is None else launch.ptr(self._bounds)
        common = (offsets, problem.segment_length or 0, n, problem.num_segments, s0, s1, self._tiles_per_row,
                  self._runs_per_row, self._runs, self._k, bounds)  # fmt: skip
        group = 0 if self._group_head is None else launch.ptr(self._group_head)
        partials = (launch.ptr(self._head), launch.ptr(self._tail), launch.ptr(self._tail_seg), group)
        out_ptr = launch.ptr(out)
        s = launch.stream(stream)
        cuda_launch = _cuda_launch()
        self._order.begin(stream)
        if self._bounds is not None:
            cuda_launch(s, self._bounds_config, bounds_kernel, *common)
        cuda_launch(s, config, kernel, xp, out_ptr, *common, *partials)
        if self._needs_fixup:
            cuda_launch(s, self._fixup_config, fixup, out_ptr, *common, *partials)
        self._order.end(stream)

    def free(self) -> None:
        self._order.wait_idle()  # the partials go back to the pool
        self._head = self._tail = self._tail_seg = self._group_head = self._bounds = None


class _TileExecutor(_Runs):
    """Any segments (fixed or offsets) with one feature column, any strides: rows cut into
    tiles, runs of tiles given to blocks, per-block partials joined by the fix-up."""

    def __init__(self, problem: Problem, launch: _Launcher | None = None) -> None:
        tuning = TUNING
        launch = launch or _Launcher(problem)
        super().__init__(problem, launch, tile=tuning.tile, max_k=tuning.max_tiles_per_block, per_block=1,
                         min_blocks=tuning.min_blocks, bounds=True)  # fmt: skip
        L = problem.segment_length
        # Fixed lengths dividing the tile never span two tiles: no partials to combine.
        self._needs_fixup = not (problem.fixed and tuning.tile >= L and tuning.tile % L == 0)
        # Per vector-load variant: the three kernels and the tile kernel's launch shape.
        self._kernels: dict[bool, tuple[tuple[Any, Any, Any], Any]] = {}

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        problem, tuning = self._problem, self._tuning
        xp = self._launch.ptr(x)
        vecload = self._rows_aligned(xp)
        compiled = self._kernels.get(vecload)
        if compiled is None:
            compiled = self._kernels[vecload] = self._compile_kernels(
                _tile_wrapper(problem, vecload, _index_ctype(problem), tuning, self._k),
                ("linred_tile", "linred_fixup", "linred_bounds"),
                _tile_shared_bytes(problem, vecload, tuning),
            )
        self._run(xp, out, segments, stream, *compiled)

    def free(self) -> None:
        super().free()
        self._kernels.clear()


def _warp_items(problem: Problem) -> int:
    """Elements per lane of warp_reduce: WarpShared::ITEMS in segreduce.cuh."""
    return max(_vec(problem), 8 if itemsize(_acc_dtype(problem)) == 8 else 16)


def _warp_shared_bytes(problem: Problem, tuning: Tuning) -> int:
    """Dynamic shared memory of linred_warp: WarpShared::WARP_BYTES per warp of a block."""
    acc = itemsize(_acc_dtype(problem))
    wt = 32 * _warp_items(problem)
    pieces = -(-(wt + wt // 16 * max(1, 16 // acc)) * acc // 16) * 16
    return tuning.threads // 32 * (pieces + -(-wt // 32) * 4 + 48)  # 48: WarpState


def _warp_wrapper(problem: Problem, index_ctype: str, tuning: Tuning, k: int) -> str:
    t, o, a, op, mean = _kernel_types(problem)
    threads = tuning.threads
    common, offsets = _COMMON.format(i=index_ctype), _offsets(problem, index_ctype)
    return (
        f'extern "C" __global__ void __launch_bounds__({threads}, {tuning.min_blocks_warp}) '
        f"linred_warp(const {t}* x, {o}* out, {common}, {a}* head, {a}* tail, long long* ts, {a}* gh) {{\n"
        "    extern __shared__ __align__(16) unsigned char smem[];\n"
        f"    {_ARGS}\n"
        f"    warp_reduce<{t}, {a}, {o}, {op}, {mean}, {threads}, {k}>"
        f"(x, out, {offsets}, a, head, tail, ts, gh, smem);\n}}\n"
    ) + _fixup(problem, index_ctype, threads, 32 * _warp_items(problem), threads // 32)


class _WarpExecutor(_Runs):
    """Any segments (fixed or offsets) of contiguous, 16-byte aligned rows with one feature
    column: ``warp_reduce``, every warp a run of tiles of its own, partials of segments that
    span runs joined by the fix-up.  Other layouts go to ``tile_reduce``."""

    def __init__(self, problem: Problem, launch: _Launcher) -> None:
        tuning = TUNING
        wt = 32 * _warp_items(problem)
        super().__init__(problem, launch, tile=wt, max_k=tuning.max_tiles_per_warp, per_block=tuning.threads // 32,
                         min_blocks=tuning.min_blocks_warp, bounds=False)  # fmt: skip
        # Always a fix-up: warp_reduce finishes a segment at the first mark after its end, so a
        # segment that ends exactly where a run ends (every run's last one, when a fixed length
        # divides the run) is left open as the run's tail and written by the fix-up.
        self._tiles: _TileExecutor | None = None
        self._compiled: tuple[tuple[Any, Any, Any], Any] | None = None

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        problem, tuning = self._problem, self._tuning
        xp = self._launch.ptr(x)
        # Whole 16-byte vectors of every row (and segment indices that fit the int of its
        # per-tile table), else tile_reduce.
        if not self._rows_aligned(xp) or problem.num_segments >= 2**31:
            if self._tiles is None:
                self._tiles = _TileExecutor(problem, self._launch)
            self._tiles(x, out, segments, stream)
            return
        if self._compiled is None:
            self._compiled = self._compile_kernels(
                _warp_wrapper(problem, _index_ctype(problem), tuning, self._k),
                ("linred_warp", "linred_fixup"),
                _warp_shared_bytes(problem, tuning),
            )
        self._run(xp, out, segments, stream, *self._compiled)

    def free(self) -> None:
        super().free()
        if self._tiles is not None:
            self._tiles.free()
        self._compiled = self._tiles = None


class _FeaturesExecutor:
    """Segments of rows of several contiguous feature columns: one thread per segment
    and group of features (16 bytes of them where the rows are 16-byte aligned)."""

    def __init__(self, problem: Problem, launch: _Launcher) -> None:
        self._problem, self._launch, self._tuning = problem, launch, TUNING
        self._kernels: dict[int, Any] = {}
        self._configs: dict[int, Any] = {}

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        problem, launch = self._problem, self._launch
        b, n, d = problem.in_shape
        s0, s1, _ = problem.strides
        size = itemsize(problem.dtype)
        aligned = launch.ptr(x) % 16 == 0 and all((v * size) % 16 == 0 for v in (s1, d, s0 if b > 1 else 0))
        # 16 bytes of features per thread, whose results are stored as whole vectors when
        # they fill some: the result rows must then be 16-byte aligned too.
        width = _vec(problem) if aligned else 1
        out_size = itemsize(problem.out_dtype)
        if width > 1 and (width * out_size) % 16 == 0 and (launch.ptr(out) % 16 or (d * out_size) % 16):
            width = 1
        kernel = self._kernels.get(width)
        if kernel is None:
            from cuda.core import LaunchConfig

            from linred.kernels.compiler import get_kernels

            wrapper = _features_wrapper(problem, _index_ctype(problem), self._tuning, width)
            (kernel,) = get_kernels(launch.device, wrapper, ("linred_features",))
            self._kernels[width] = kernel
            total = b * problem.num_segments * (d // width)
            # Grid-stride: enough blocks to fill the device many times over, no more.
            blocks = max(1, min(-(-total // self._tuning.threads), 64 * launch.sms))
            self._configs[width] = (LaunchConfig(grid=blocks, block=self._tuning.threads), total)
        config, total = self._configs[width]
        offsets = launch.ptr(segments.offsets) if isinstance(segments, VariableSegments) else 0
        _cuda_launch()(launch.stream(stream), config, kernel, launch.ptr(x), launch.ptr(out), offsets,
                       problem.segment_length or 0, n, problem.num_segments, s0, s1, d, d // width, total)  # fmt: skip

    def free(self) -> None:
        self._kernels.clear()


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
        if "bfloat16" in (problem.dtype, problem.out_dtype) and _compute_capability(problem.device) < (8, 0):
            return "its bfloat16 conversions need compute capability 8.0 or newer; 'cub' serves bfloat16 here"
        if problem.features != 1 and problem.strides[2] != 1:
            return (
                f"its feature kernel reads contiguous feature columns (their stride is {problem.strides[2]} elements); "
                "'nvmath', 'cublas' and 'cub' serve strided features"
            )
        return None

    def plan(self, problem: Problem):
        L, vec = problem.segment_length, _vec(problem)
        # fixed_rows and fixed_long keep up to 16 vectors in flight per thread; 1-byte data widened
        # to 4- or 8-byte sums would need over 100 registers for that, so for 1-byte data only
        # fixed_small's lengths take a one-launch kernel.
        wide = vec <= 8
        longest = 32 * vec * (TUNING.max_rows if wide else 1)
        short = problem.fixed and _is_pow2(L) and longest >= L
        if short and _flat(problem) and (problem.batch * problem.n) % vec == 0:
            return _FixedExecutor(problem)
        # Long fixed lengths of whole vectors: fixed_long.
        long = wide and problem.fixed and L % vec == 0 and L * itemsize(problem.dtype) >= TUNING.long_min_bytes
        if long and problem.features == 1 and _flat(problem):
            return _LongExecutor(problem)
        launch = _Launcher(problem)
        if problem.features != 1:
            return _FeaturesExecutor(problem, launch)
        return _WarpExecutor(problem, launch)


BACKEND = NvrtcBackend()
