"""The nvrtc backend's executors: compile the kernels of :mod:`.kernels`, keep their scratch, launch.

- ``_FixedExecutor`` (``fixed_small``/``fixed_rows``), ``_StagedExecutor``
  (``fixed_staged``) and ``_LongExecutor`` (``fixed_long``): one launch that reads only
  the device pointers of the data and the result;
- ``_WarpExecutor`` (``warp_reduce`` + ``tile_fixup``) and ``_TileExecutor``
  (``tile_reduce`` + ``tile_fixup``, ``tile_bounds`` for offsets): rows cut into
  tiles, runs of tiles per warp or block, per-run partials joined in a fixed order;
- ``_FeaturesExecutor`` (``features_reduce``): segments of rows of feature columns.

:data:`EXECUTORS` maps the routes of :func:`linred.backends.nvrtc.route` to them.
Every executor launches through the driver (:class:`linred.kernels.launch.PackedLaunch`)
on the raw stream handle it is given and reads its launch shapes from the
:class:`~linred.backends.nvrtc.NvrtcOptions` of its plan.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver

from linred._dtypes import itemsize
from linred.arrays._context import on_device, set_up
from linred.backends._device import ReleasedInOrder, StreamOrder, ops_for
from linred.backends.base import INT32_MAX
from linred.backends.nvrtc.kernels import (
    FEATURE_TILE_ROWS,
    FUSED_FIXUP_PASSES,
    LSE_REDUCTIONS,
    acc_dtype,
    acc_words,
    feature_partial_dtype,
    features_long_chunks,
    features_long_rows,
    features_shared_bytes,
    features_split_lanes,
    features_widths,
    features_wrapper,
    fixed_layout,
    fixed_wrapper,
    index_ctype,
    long_threads,
    long_unroll,
    long_wrapper,
    rows_aligned,
    staged_segments_per_thread,
    staged_shared_bytes,
    staged_threads,
    staged_wrapper,
    tile_shared_bytes,
    tile_tiles_per_run,
    tile_vecload,
    tile_wrapper,
    vec,
    warp_items,
    warp_shared_bytes,
    warp_shift,
    warp_tiles_per_run,
    warp_wrapper,
)
from linred.kernels.compiler import get_kernels
from linred.kernels.launch import PackedLaunch, multiprocessors
from linred.problem import Problem
from linred.segments import Segments, VariableSegments

if TYPE_CHECKING:
    from linred.backends.nvrtc import NvrtcOptions


#: per (kernel handle, device): the dynamic shared memory its attribute allows (see
#: _Launcher.allow_shared_memory), under a lock (threads plan at once)
_SHARED_ALLOWED: dict[tuple[int, int], int] = {}
_SHARED_LOCK = threading.Lock()


class _Launcher:
    """What every executor needs: the device, its SM count, device pointers and scratch."""

    def __init__(self, problem: Problem) -> None:
        self.device = problem.device
        set_up(problem.device)
        self.sms = multiprocessors(problem.device)
        self.kind = problem.kind
        #: the device pointer of an array of the problem's library (chosen once: calls are hot)
        self.ptr = self._adapter().pointer

    def allow_shared_memory(self, kernel: Any, size: int) -> None:
        """Let ``kernel`` use ``size`` bytes of dynamic shared memory (past 48 KiB it must opt in)
        and prefer the largest shared memory carveout (its occupancy is set by shared memory).

        The attribute belongs to the compiled kernel, which every executor of the same program
        shares (``get_kernels`` keeps one per program and device), and executors of one program
        may launch it with different sizes (``features_split``'s shared memory follows its
        threads, set by the problem at run time): it is only ever raised, so that one executor
        never takes away what another launches with (a later, smaller setting made an earlier
        executor's launches fail with CUDA_ERROR_INVALID_VALUE)."""
        key = (int(kernel.handle), self.device)
        with _SHARED_LOCK:
            if _SHARED_ALLOWED.get(key, -1) >= size:
                return
            attribute = driver.CUfunction_attribute
            for attr, value in (
                (attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, size),
                (attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100),
            ):
                (err,) = driver.cuKernelSetAttribute(attr, value, kernel.handle, self.device)
                if err != driver.CUresult.CUDA_SUCCESS:
                    raise RuntimeError(f"cannot set {attr.name}={value} for a kernel on device {self.device}: {err}")
            _SHARED_ALLOWED[key] = size

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
        return StreamOrder(ops_for(self.kind, self.device))


class _OneLaunch:
    """What the one-launch fixed-length executors share: they read only the device pointers of
    ``x`` and ``out``, launch one kernel bound once by ``_compile``, and hand data that is not
    16-byte aligned to the tile kernel."""

    #: only the device pointers of ``x`` and ``out`` are read, so a repeated call may pass the
    #: caller's arrays without the (batch, n, features) views
    views = False

    def __init__(self, problem: Problem, options: NvrtcOptions) -> None:
        self._problem = problem
        self._tuning = options
        self._launch = _Launcher(problem)
        self._ptr = self._launch.ptr
        self._go: Any = None
        self._tiles: _TileExecutor | None = None

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        ptr = self._ptr
        xp = ptr(x)
        if xp % 16:
            if self._tiles is None:
                self._tiles = _TileExecutor(self._problem, self._tuning)
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

    def _bind(self, wrapper: str, name: str, grid: int, *args: Any, shared: int = 0) -> Any:
        """``go`` for kernel ``name`` of ``wrapper``: ``(x, out, *args)`` on ``grid`` blocks with
        ``shared`` bytes of dynamic shared memory."""
        (kernel,) = get_kernels(self._launch.device, wrapper, (name,))
        launch = PackedLaunch(kernel, 2 + len(args), name, self._launch.device)
        launch.bind(2, *args)
        grid, block = max(1, min(grid, INT32_MAX)), self._threads()
        slots, run = launch.slots, launch.launch

        def go(stream: int, xp: int, op: int) -> None:
            slots[0] = xp
            slots[1] = op
            run(stream, grid, block, shared)

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
        nvec = b * n // vec(problem)
        _, unroll = fixed_layout(problem, tuning)
        # One chunk per block: the block scheduler overlaps finishing blocks with new ones.
        blocks = -(-nvec // (tuning.threads * unroll))
        return self._bind(fixed_wrapper(problem, tuning), "linred_fixed", blocks, nvec)


class _StagedExecutor(_OneLaunch):
    """Short fixed lengths that are not powers of two on contiguous data: ``fixed_staged``."""

    def _threads(self) -> int:
        return staged_threads(self._problem)

    def _compile(self, stream: int) -> Any:
        problem = self._problem
        m = problem.batch * problem.num_segments
        tiles = -(-m // (self._threads() * staged_segments_per_thread(problem)))
        # Grid-stride over tiles: enough blocks to fill the device many times over, no more.
        grid = min(tiles, 64 * self._launch.sms)
        return self._bind(staged_wrapper(problem), "linred_staged", grid, m, shared=staged_shared_bytes(problem))


class _LongExecutor(_OneLaunch, ReleasedInOrder):
    """Long fixed lengths of whole 16-byte vectors on contiguous data: ``fixed_long`` (blocks
    reduce chunks of a segment; the last one of a segment adds the partials in order)."""

    def __init__(self, problem: Problem, options: NvrtcOptions) -> None:
        super().__init__(problem, options)
        b, _, _ = problem.in_shape
        self._m = b * problem.num_segments
        self._lv = problem.segment_length // vec(problem)
        self._chunks = -(-self._lv // (self._threads() * long_unroll(problem, self._tuning)))
        # Partials and tickets only where a segment spans several blocks.  The tickets are
        # zeroed on the first call's stream, and every call leaves them at zero.
        many = self._chunks > 1
        self._partials = self._launch.empty(self._m * self._chunks, acc_dtype(problem)) if many else None
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
        return long_threads(self._problem, self._tuning)

    def _compile(self, stream: int) -> Any:
        problem, ptr = self._problem, self._ptr
        partials = tickets = 0
        if self._tickets is not None:
            self._launch.fill(self._tickets, 0, stream)
            partials, tickets = ptr(self._partials), ptr(self._tickets)
        args = (partials, tickets, self._lv, self._chunks, self._m)
        return self._bind(long_wrapper(problem, self._tuning), "linred_long", self._m * self._chunks, *args)

    def free(self) -> None:
        if self._order is not None:
            self._order.wait_idle()  # the partials and tickets go back to the pool
        super().free()
        self._partials = self._tickets = self._order = None


class _Runs(ReleasedInOrder):
    """What the executors of ``tile_reduce`` and ``warp_reduce`` share: every row cut into tiles
    of ``tile`` elements, runs of ``k`` consecutive tiles each reduced by one worker (a block of
    ``tile_reduce``, a warp of ``warp_reduce``; ``per_block`` workers to a block), the partials of
    the segments that span runs, for offsets the first segment of every tile (``bounds``:
    ``tile_reduce`` reads them, ``warp_reduce``'s warps search for their own), compiling, and
    the launches: bounds, reduction, fix-up."""

    #: only the device pointers of ``x`` and ``out`` are read (the strides are the plan's)
    views = False

    def __init__(
        self, problem: Problem, options: NvrtcOptions, launch: _Launcher, *, tile: int, k: int, per_block: int,
        bounds: bool,
    ) -> None:  # fmt: skip
        self._problem = problem
        self._tuning = tuning = options
        self._launch = launch
        b, n, d = problem.in_shape
        b *= d  # (strided feature columns, tile_reduce's only: each column a row of its own)
        threads = tuning.threads
        self._tiles_per_row = -(-n // tile)
        self._k = k  # tiles per run (kernels.tiles_per_run)
        self._runs_per_row = -(-self._tiles_per_row // k)
        self._runs = b * self._runs_per_row
        self._grid = -(-self._runs // per_block)
        acc, words = acc_dtype(problem), acc_words(problem)
        self._head = launch.empty(self._runs * words, acc)
        self._tail = launch.empty(self._runs * words, acc)
        self._tail_seg = launch.empty(self._runs, "int64")
        # The heads of each block's runs, joined (where a block holds several runs).
        self._group_head = launch.empty(self._grid * words, acc) if per_block > 1 else None
        self._order = launch.stream_order()  # the partials (and bounds) serve one stream at a time
        # Offsets: the first segment of every tile, found once per call by linred_bounds.
        count = self._tiles_per_row + 1
        self._bounds = launch.empty(count, "int64") if bounds and not problem.fixed else None
        self._bounds_grid = max(1, -(-count // threads))
        self._fixup_grid = max(1, -(-self._runs // threads))
        self._needs_fixup = True

    def _rows_aligned(self, xp: int) -> bool:
        """Whether every row of the data at ``xp`` is contiguous and made of whole 16-byte vectors."""
        return rows_aligned(self._problem, xp)

    def _compile_kernels(
        self, wrapper: str, names: tuple[str, ...], shared: int, walks: int = 0, ticket: int = 0
    ) -> tuple[tuple[Any, Any, Any], int]:
        """The kernels ``names`` of ``wrapper`` as :class:`PackedLaunch` (reduction, fix-up, then the
        bounds kernel where there is one; None in its place otherwise), with what no call changes
        bound (the tiling, the partials' pointers, and warp_reduce's ``walks`` (the pointer its
        checked variant records its walks at) and ``ticket`` (the counter of its last-block
        fix-up)), and the bytes of dynamic shared memory the reduction is launched with.  A call
        writes the rest (:meth:`_run`)."""
        problem, launch = self._problem, self._launch
        kernels = tuple(get_kernels(launch.device, wrapper, names))
        launch.allow_shared_memory(kernels[0], shared)
        # (x, out, offsets, the 12 tiling arguments, 4 partials), (out, offsets, 12, 4), (offsets, 12)
        # (linred_warp and linred_fixup: and the walks and the check word; linred_warp: the ticket)
        counts = {"linred_tile": 19, "linred_warp": _WARP_ARGS, "linred_fixup": 20, "linred_bounds": 13}
        launches = tuple(
            PackedLaunch(k, counts[name], name, launch.device) for k, name in zip(kernels, names, strict=True)
        )
        _, n, d = problem.in_shape
        s0, s1, s2 = problem.strides
        bounds = 0 if self._bounds is None else launch.ptr(self._bounds)
        tiling = (problem.segment_length or 0, n, problem.num_segments, s0, s1, d, s2, self._tiles_per_row,
                  self._runs_per_row, self._runs, self._k, bounds)  # fmt: skip
        group = 0 if self._group_head is None else launch.ptr(self._group_head)
        partials = (launch.ptr(self._head), launch.ptr(self._tail), launch.ptr(self._tail_seg), group)
        reduction, fixup = launches[:2]
        # Both take the group heads' pointer (0 without them; tile_reduce ignores it).
        reduction.bind(3, *tiling, *partials)
        if reduction.count == _WARP_ARGS:
            reduction.bind(_WARP_WORD - 1, walks)
            reduction.bind(_WARP_WORD + 1, ticket)
        fixup.bind(2, *tiling, *partials, walks)
        if len(launches) > 2:
            launches[2].bind(1, *tiling)
        return launches + (None,) * (3 - len(launches)), shared

    def _run(
        self, xp: int, out: Any, segments: Segments, stream: Any, kernels: tuple, shared: int, word: int = 0
    ) -> None:
        """Launch the bounds (for offsets), the reduction ``kernels[0]`` and the fix-up
        ``kernels[1]``; ``word`` is the check word (warp_reduce's checked variant, and the fix-up
        after it; 0 otherwise)."""
        launch = self._launch
        kernel, fixup, bounds_kernel = kernels
        threads = self._tuning.threads
        offsets = launch.ptr(segments.offsets) if segments.__class__ is VariableSegments else 0
        out_ptr = launch.ptr(out)
        # Once for the launches and events inside; nothing inside may switch devices (nested
        # blocks trust this one: compiling and allocating happen before it).
        with on_device(launch.device):
            self._order.begin(stream)
            if self._bounds is not None:
                bounds_kernel.slots[0] = offsets
                bounds_kernel.launch(stream, self._bounds_grid, threads, 0)
            slots = kernel.slots
            slots[0] = xp
            slots[1] = out_ptr
            slots[2] = offsets
            if kernel.count == _WARP_ARGS:
                slots[_WARP_WORD] = word
            kernel.launch(stream, self._grid, threads, shared)
            if self._needs_fixup:
                slots = fixup.slots
                slots[0] = out_ptr
                slots[1] = offsets
                slots[fixup.count - 1] = word
                fixup.launch(stream, self._fixup_grid, threads, 0)
            self._order.end(stream)

    def free(self) -> None:
        self._order.wait_idle()  # the partials go back to the pool
        self._head = self._tail = self._tail_seg = self._group_head = self._bounds = None


class _TileExecutor(_Runs):
    """Any segments (fixed or offsets), any strides, with one feature column or feature columns
    that are not contiguous (each read as a row of its own, its results a column of the
    result): rows cut into tiles, runs of tiles given to blocks, per-block partials joined by
    the fix-up."""

    def __init__(self, problem: Problem, options: NvrtcOptions, launch: _Launcher | None = None) -> None:
        tuning = options
        launch = launch or _Launcher(problem)
        b, n, d = problem.in_shape
        k = tile_tiles_per_run(b * d, n, tuning, launch.sms)
        super().__init__(problem, options, launch, tile=tuning.tile, k=k, per_block=1, bounds=True)
        L = problem.segment_length
        # Fixed lengths dividing the tile never span two tiles: no partials to combine.
        self._needs_fixup = not (problem.fixed and tuning.tile >= L and tuning.tile % L == 0)
        # Per vector-load variant: the three kernels and the tile kernel's shared memory.
        self._kernels: dict[bool, tuple[tuple[Any, Any, Any], int]] = {}

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        problem, tuning = self._problem, self._tuning
        xp = self._launch.ptr(x)
        vecload = tile_vecload(problem, tuning, xp)
        compiled = self._kernels.get(vecload)
        if compiled is None:
            compiled = self._kernels[vecload] = self._compile_kernels(
                tile_wrapper(problem, vecload, index_ctype(problem), tuning, self._k),
                ("linred_tile", "linred_fixup", "linred_bounds"),
                tile_shared_bytes(problem, vecload, tuning),
            )
        self._run(xp, out, segments, stream, *compiled)

    def free(self) -> None:
        super().free()
        self._kernels.clear()


class _WarpExecutor(_Runs):
    """Any segments (fixed or offsets) of contiguous, 16-byte aligned rows with one feature
    column: ``warp_reduce``, every warp a run of tiles of its own, partials of segments that
    span runs joined by the fix-up.  Rows that each begin as far past a 16-byte boundary (a
    slice ``x[k:]``) are read from the boundary by an executor of rows that much longer (its
    ``shift``); other layouts go to ``tile_reduce``.

    Offsets with a check word are checked by ``warp_reduce`` as it reads them (its CHECKED
    variant, shifted rows too); a layout handed to ``tile_reduce`` has them checked first by the
    one-kernel check, into the same word, and is reduced only if they pass.  Plans take that
    route only where the class claims ``checks_offsets``."""

    #: warp_reduce's CHECKED variant checks every offset it reads (its device time within 1% of
    #: the unchecked variant's on an H100); what it does not reach, the unaligned layouts handed
    #: to tile_reduce, the one-kernel check covers first.
    checks_offsets = True

    def __init__(
        self, problem: Problem, options: NvrtcOptions, launch: _Launcher | None = None, shift: int = 0
    ) -> None:
        tuning = options
        launch = launch or _Launcher(problem)
        wt = 32 * warp_items(problem)
        #: rows that begin ``shift`` elements past a 16-byte boundary are read from it, as rows
        #: ``shift`` elements longer whose segments begin ``shift`` further (the elements before
        #: each row belong to no segment: :func:`kernels.warp_shift`); the tiling is theirs
        self._shift = shift
        if shift:
            problem = dataclasses.replace(problem, n=problem.n + shift)
        b, n, _ = problem.in_shape
        k = warp_tiles_per_run(b, n, problem, tuning, launch.sms)
        super().__init__(problem, options, launch, tile=wt, k=k, per_block=tuning.threads // 32, bounds=False)
        # Always a fix-up: warp_reduce finishes a segment at the first mark after its end, so a
        # segment that ends exactly where a run ends (every run's last one, when a fixed length
        # divides the run) is left open as the run's tail and written by the fix-up.  Where the
        # runs are few, the reduction kernel's last block does it (one launch instead of two);
        # its ticket is zeroed on the first call's stream, and every call leaves it at zero.
        self._fused = self._runs <= FUSED_FIXUP_PASSES * tuning.threads
        self._needs_fixup = not self._fused
        self._ticket: Any = None
        self._tiles: _TileExecutor | None = None
        #: per shift: the executor of rows that begin that many elements past a 16-byte boundary
        self._shifted: dict[int, _WarpExecutor] = {}
        # Per variant (checking the offsets or not): the kernels and the shared memory.
        self._compiled: dict[bool, tuple[tuple[Any, Any, Any], int]] = {}
        #: where each run's walk of the offsets began and ended (the checked variant's)
        self._walks: Any = None

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        problem, tuning = self._problem, self._tuning
        xp = self._launch.ptr(x)
        word = segments.word if segments.__class__ is VariableSegments else 0
        # Whole 16-byte vectors of every row (and segment indices that fit the int of its
        # per-tile table); rows as far past a 16-byte boundary each read from it; else tile_reduce.
        if not self._rows_aligned(xp) or problem.num_segments > INT32_MAX:
            shift = warp_shift(problem, xp) if problem.num_segments <= INT32_MAX else 0
            if shift:
                shifted = self._shifted.get(shift)
                if shifted is None:
                    shifted = self._shifted[shift] = _WarpExecutor(problem, tuning, self._launch, shift)
                shifted._reduce(xp - shift * itemsize(problem.dtype), out, segments, stream, word)
                return
            if problem.reduction in LSE_REDUCTIONS:  # (tile_reduce has no LseAcc: the caller checks both)
                raise ValueError("warp_reduce's logsumexp needs rows of whole 16-byte vectors (or each as far "
                                 "past a 16-byte boundary) and at most 2^31 - 1 segments")  # fmt: skip
            if word and not self._checked_first(segments, stream):
                return  # (the word is set: the caller raises)
            if self._tiles is None:
                self._tiles = _TileExecutor(problem, tuning, self._launch)
            self._tiles(x, out, segments, stream)
            return
        self._reduce(xp, out, segments, stream, word)

    def _reduce(self, xp: int, out: Any, segments: Segments, stream: Any, word: int) -> None:
        """warp_reduce (and its fix-up) on rows at ``xp`` that it reads as whole 16-byte vectors
        (this executor's shift before them), checking the offsets into ``word`` (0: not)."""
        problem, tuning = self._problem, self._tuning
        checked = word != 0
        compiled = self._compiled.get(checked)
        if compiled is None:
            if checked and self._walks is None:
                self._walks = self._launch.empty(2 * self._runs, "int64")
            if self._fused and self._ticket is None:
                self._ticket = self._launch.empty(1, "uint32")
                self._launch.fill(self._ticket, 0, stream)
            ptr = self._launch.ptr
            compiled = self._compiled[checked] = self._compile_kernels(
                warp_wrapper(problem, index_ctype(problem), tuning, self._k, checked, self._fused, self._shift),
                ("linred_warp", "linred_fixup"),
                warp_shared_bytes(problem, tuning),
                ptr(self._walks) if checked else 0,
                ptr(self._ticket) if self._fused else 0,
            )
        self._run(xp, out, segments, stream, *compiled, word)

    def _checked_first(self, segments: VariableSegments, stream: Any) -> bool:
        """Whether ``segments``' offsets keep every rule, checked into their word by the
        one-kernel check (waited for) before ``tile_reduce``, which does not check them."""
        from linred.arrays._device_checks import check_armed

        offsets, problem = segments.offsets, self._problem
        wide = offsets.dtype.itemsize == 8
        return check_armed(self._launch.ptr(offsets), wide, segments.count, problem.n, self._launch.device, stream)

    def free(self) -> None:
        super().free()
        if self._tiles is not None:
            self._tiles.free()
        for shifted in self._shifted.values():
            shifted.free()
        self._shifted.clear()
        self._compiled.clear()
        self._tiles = self._walks = self._ticket = None


class _FeaturesExecutor(ReleasedInOrder):
    """Segments of rows of several contiguous feature columns: one thread per segment
    and group of features (16 bytes of them where the rows are 16-byte aligned), or, where
    those threads are too few to fill the device, each segment's rows dealt to several lanes
    of a block whose partials are added in a fixed order (``features_split``)."""

    #: only the device pointers of ``x`` and ``out`` are read (the strides are the plan's)
    views = False
    #: every segment's bounds are read by a thread that checks them (``checked_bounds``)
    checks_offsets = True

    def __init__(self, problem: Problem, options: NvrtcOptions, launch: _Launcher | None = None) -> None:
        self._problem, self._launch, self._tuning = problem, launch or _Launcher(problem), options
        self._kernels: dict[int, Any] = {}
        _, _, d = problem.in_shape
        s0, s1, _ = problem.strides
        self._fixed = (problem.segment_length or 0, problem.n, problem.num_segments, s0, s1, d)
        self._widths = features_widths(problem)  # (xp % 16 != 0, op % 16 != 0) -> width
        self._long_rows = features_long_rows(problem, options, self._launch.sms)
        #: the long segments' workspace (heads, partials, counts), made with the first kernels
        #: that use it; it serves one stream at a time
        self._long: tuple[Any, Any, Any] | None = None
        self._epoch = 0
        self._zeroed = False  #: whether a call outside a CUDA graph capture zeroed the counts
        self._order: Any = None
        self._ops: Any = None

    def __call__(self, x: Any, out: Any, segments: Segments, stream: Any) -> None:
        launch = self._launch
        xp, op = launch.ptr(x), launch.ptr(out)
        width = self._widths[(xp % 16 != 0, op % 16 != 0)]
        compiled = self._kernels.get(width)
        if compiled is None:
            compiled = self._kernels[width] = self._compile(width)
        kernel, grid, block, shared, epoch = compiled
        slots = kernel.slots  # (the arguments after the check word are bound once)
        slots[0] = xp
        slots[1] = op
        if segments.__class__ is VariableSegments:
            slots[2] = launch.ptr(segments.offsets)
            slots[3] = segments.word
        if epoch:  # the long segments' tiles and sums too, in this call's epoch
            self._epoch = self._epoch % 0xFFFFFFFF + 1  # (1 to 2^32 - 1: zeroed counts are of epoch 0)
            slots[epoch] = self._epoch
            with on_device(launch.device):
                self._order.begin(stream)
                # The counts are zeroed before the first call that runs now, and in every call a
                # CUDA graph captures: its replays share one epoch, so a replay cut short by bad
                # offsets would otherwise leave counts that the next replay takes as its own.
                captured = self._ops.capturing(stream)
                if captured or not self._zeroed:
                    launch.fill(self._long[2], 0, stream)
                    self._zeroed = self._zeroed or not captured
                kernel.launch(stream, grid, block, shared)
                self._order.end(stream, captured)
            return
        kernel.launch(stream, grid, block, shared)

    def _compile(self, width: int) -> tuple[Any, int, int, int, int]:
        """The kernel for ``width`` features per thread (a :class:`PackedLaunch` with its arguments
        after the pointers and the check word bound), its grid, block and shared memory, and the
        slot of its last argument, the call's epoch, where it cuts long segments into tiles (else
        0)."""
        problem, launch, tuning = self._problem, self._launch, self._tuning
        b, _, d = problem.in_shape
        groups = d // width
        lanes = features_split_lanes(problem, width, tuning.threads, launch.sms)
        long = self._long_rows > 0
        chunks = long and features_long_chunks(problem, tuning, launch.sms)
        if lanes == 1:
            wrapper = features_wrapper(problem, index_ctype(problem), tuning, width, long=long, chunks=chunks)
            (kernel,) = get_kernels(launch.device, wrapper, ("linred_features",))
            total = b * problem.num_segments * groups
            threads, shared, items = tuning.threads, 0, total
            tail = (*self._fixed, groups, total)
            name = "linred_features"
        else:
            wrapper = features_wrapper(problem, index_ctype(problem), tuning, width, split=True, long=long,
                                       chunks=chunks)  # fmt: skip
            (kernel,) = get_kernels(launch.device, wrapper, ("linred_features_split",))
            per_block = tuning.threads // (lanes * groups)  # (row of the batch, segment) pairs per block
            threads = per_block * lanes * groups
            shared = features_shared_bytes(problem, width, threads)
            launch.allow_shared_memory(kernel, shared)
            total = b * problem.num_segments
            items = -(-total // per_block) * threads  # (each block's threads take its pairs)
            tail = (*self._fixed, groups, total, lanes)
            name = "linred_features_split"
        if long:
            heads, partials, counts = (launch.ptr(a) for a in self._long_workspace())
            tiles = -(-problem.n // FEATURE_TILE_ROWS)
            tile_items = b * tiles * groups
            tail = (*tail, self._long_rows, tiles, tile_items, heads, partials, counts)
            # features_reduce takes both kinds of item in one grid-stride loop; features_split
            # its pairs, then the tiles
            items = total + tile_items if lanes == 1 else max(items, tile_items)
        # Grid-stride: enough blocks to fill the device many times over, no more.
        blocks = max(1, min(-(-items // threads), 64 * launch.sms))
        packed = PackedLaunch(kernel, 4 + len(tail) + long, name, launch.device)
        packed.bind(4, *tail)  # (fixed segments: no offsets, no word)
        return packed, blocks, threads, shared, 4 + len(tail) if long else 0

    def _long_workspace(self) -> tuple[Any, Any, Any]:
        """The long segments' heads and partials (one per row of the batch, tile and feature) and
        counts of finished pieces (of segments and of chunks of tiles: one per row of the batch,
        tile and feature group each, at most a feature), made once; the counts are zeroed on a
        call's stream (see ``__call__``)."""
        if self._long is None:
            b, n, d = self._problem.in_shape
            tiles, launch = -(-n // FEATURE_TILE_ROWS), self._launch
            partial = feature_partial_dtype(self._problem)
            # (the kernel's unsigned long long: the segments' counts, then the chunks' from
            # b * tiles * groups on, at most b * tiles * d)
            counts = launch.empty(2 * b * tiles * d, "int64")
            self._ops = ops_for(launch.kind, launch.device)
            self._order = StreamOrder(self._ops)
            self._long = (launch.empty(b * tiles * d, partial), launch.empty(b * tiles * d, partial), counts)
        return self._long

    def free(self) -> None:
        if self._order is not None:
            self._order.wait_idle()  # the workspace goes back to the pool
        self._kernels.clear()
        self._long = self._order = self._ops = None
        self._zeroed = False


#: linred_warp's argument count, and the slot of its check word (the walks' pointer before it,
#: the ticket after it)
_WARP_ARGS = 22
_WARP_WORD = 20

#: the executor of each route of :func:`linred.backends.nvrtc.route`
EXECUTORS = {
    "fixed": _FixedExecutor,
    "staged": _StagedExecutor,
    "long": _LongExecutor,
    "features": _FeaturesExecutor,
    "warp": _WarpExecutor,
    "tile": _TileExecutor,
}
