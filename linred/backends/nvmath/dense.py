"""The nvmath backend on the GPU, fixed-length segments: ``nvmath.linalg.advanced.Matmul`` (cuBLASLt).

The compute type is always given explicitly, so TF32 (``COMPUTE_32F_FAST_TF32``)
is never chosen, whatever the environment or a framework's TF32 switch says:
float32, float16, bfloat16 and complex64 multiply with ``COMPUTE_32F``, float64
and complex128 with ``COMPUTE_64F``.  Every product is in place (``inplace=True``,
``c`` = the result, ``beta = 0``), so the result lands in ``out3``.  For a
float16/bfloat16 result, split-K algorithms are limited to those that add their
partial sums in the float32 compute type: the result is rounded once.

Planning needs operands, so the ``Matmul`` objects are built on the first call
(cuBLASLt's heuristic query synchronizes that stream once) and rebound with
``reset_operands_unchecked`` afterwards.  cuBLASLt picks kernels for the
alignment of the pointers it is planned with; a later call whose data is less
aligned (a view at an odd offset) gets a new plan for the smaller alignment,
and a result buffer that is not 256-byte aligned (the alignment cuBLASLt assumes
for the output) is written through an aligned temporary.
"""

from __future__ import annotations

from typing import Any

from cuda.core import Device
from nvmath.linalg import ComputeType
from nvmath.linalg.advanced import Matmul, MatmulOptions, MatmulPlanPreferences, MatmulReductionScheme

from linred._dtypes import HALF
from linred.arrays._context import keep_current
from linred.arrays.views import physical
from linred.backends._device import ReleasedInOrder, StreamOrder, alignment, ops_for
from linred.backends.nvmath.layout import Layout, View
from linred.problem import Problem
from linred.segments import Segments

#: float64 and complex128 multiply in double precision, everything else in single
DOUBLE = ("float64", "complex128")


def compute_type(dtype: str) -> ComputeType:
    return ComputeType.COMPUTE_64F if dtype in DOUBLE else ComputeType.COMPUTE_32F


class DenseExecutor(ReleasedInOrder):
    """Runs a :class:`Layout` through planned cuBLASLt products on the call's stream."""

    def __init__(self, problem: Problem, layout: Layout, logger: Any, *, complex_as_real: bool = False) -> None:
        self._ops = ops_for(problem.kind, problem.device)
        # Every buffer of the executor, nvmath's workspaces too (_HomeAllocator), comes from the
        # pool of linred's own stream, which it keeps: released in order from one stream.
        self._order = StreamOrder(self._ops, own=True)
        self._layout = layout
        self._real = complex_as_real
        self._dtype = problem.dtype
        self._out_dtype = problem.out_dtype
        self._alpha = 1.0 / problem.segment_length if problem.reduction == "mean" else 1.0
        self._out_size = problem.batch * problem.num_segments * problem.features
        self._options = MatmulOptions(
            compute_type=compute_type(problem.dtype),
            inplace=True,
            logger=logger,
            allocator=_HomeAllocator(self._ops, self._order),
        )
        # split-K partial sums must be added in the float32 compute type, not in a 16-bit result type
        # (the "output type" and "in place" reduction schemes), so that a 16-bit result is rounded once
        self._preferences = (
            MatmulPlanPreferences(reduction_scheme_mask=MatmulReductionScheme.COMPUTE_TYPE)
            if problem.out_dtype in HALF
            else None
        )
        self._constants: dict[str, Any] | None = None
        self._fixed: list[dict[str, Any]] = []  # per product: views of the constants, made once
        # per product: the Matmul and the alignments (a, b, c) it was planned for
        self._plans: list[tuple[Any, tuple[int, int, int]] | None] = [None] * len(layout.products)

    def _make_constants(self) -> dict[str, Any]:
        ops = self._ops
        home = self._order.home
        constants = {}
        with ops.on(home):  # (see StreamOrder.home)
            for name, kind in self._layout.constants.items():
                assert kind[0] == "ones", kind
                constants[name] = ops.ones(kind[1], self._dtype)
        self._fixed = [
            {
                key: ops.view(constants[v.src], v.shape, v.strides)
                for key, v in zip("abc", (p.a, p.b, p.c), strict=True)
                if v.src in constants
            }
            for p in self._layout.products
        ]
        # built once and then read on whatever stream later calls use: wait for them once
        ops.synchronize(home)
        return constants

    def _view(self, sources: dict[str, Any], v: View) -> Any:
        return self._ops.view(sources[v.src], v.shape, v.strides)

    def __call__(self, x: Any, out: Any, segments: Segments, stream: int) -> None:
        ops = self._ops
        layout = self._layout
        with ops.on(stream):
            if self._constants is None:
                self._constants = self._make_constants()
            self._order.begin(stream)
            x, conjugate = physical(x)
            x_base, out_base = (x.real, out.real) if self._real else (x, out)  # complex as real parts (views)
            flat_out = ops.view(out_base, (self._out_size,), (1,))
            target = flat_out
            if alignment(ops.pointer(out)) < 256:
                target = ops.empty((self._out_size,), self._out_dtype)
            sources = {**self._constants, "x": x_base, "out": target}
            for name, size in layout.temporaries.items():
                sources[name] = ops.empty((size,), self._out_dtype)
            for i, product in enumerate(layout.products):
                fixed = self._fixed[i]
                a = fixed["a"] if "a" in fixed else self._view(sources, product.a)
                b = fixed["b"] if "b" in fixed else self._view(sources, product.b)
                c = self._view(sources, product.c)
                aligned = (alignment(ops.pointer(a)), alignment(ops.pointer(b)), alignment(ops.pointer(c)))
                entry = self._plans[i]
                if entry is None or any(now < then for now, then in zip(aligned, entry[1], strict=True)):
                    if entry is not None:
                        self._order.release()  # (its workspace goes back to the home stream's pool)
                        _free_matmul(entry[0])
                    alpha = self._alpha if product.scaled else 1.0
                    mm = Matmul(a, b, c=c, alpha=alpha, beta=0.0, options=self._options, stream=stream)
                    mm.plan(preferences=self._preferences, stream=stream)
                    self._plans[i] = (mm, aligned)
                else:
                    mm = entry[0]
                    mm.reset_operands_unchecked(a=a, b=b, c=c)
                mm.execute(stream=stream)
                mm.release_operands()  # keep no reference to the caller's arrays
            if layout.copy_from is not None:
                ops.copy(out, self._view(sources, layout.copy_from))
            elif target is not flat_out:
                ops.copy(flat_out, target)
            if conjugate:  # a lazily conjugated tensor, summed as stored
                out.imag.neg_()
            self._order.end(stream)

    def free(self) -> None:
        self._order.wait_idle()  # the constants and workspaces go back to the pool
        # Freeing a Matmul orders its workspace after its last use: a driver call that needs the
        # device's context current, and free() may run on a thread that never used the device
        # (where CuPy's and torch's device guards make none current).
        with keep_current():  # (the thread's own device current again afterwards)
            Device(self._ops.device).set_current()
            for entry in self._plans:
                if entry is not None:
                    _free_matmul(entry[0])
        self._plans = []
        self._constants = None


def _free_matmul(mm: Any) -> None:
    """Free a Matmul whose last call the caller has ordered before its workspace's reuse (the
    host waited for it, or the home stream, whose pool the workspace goes back to, waits for it):
    nvmath need not order the release after it on that call's stream, which its owner may have
    destroyed since (a thread's stream, say: a driver call on it may crash).  Freeing a Matmul
    needs the device's context current."""
    mm.last_compute_event = None
    workspace = getattr(mm, "workspace", None)
    if getattr(workspace, "stream", None) is not None:
        workspace.stream = None
    mm.free()


class _HomeAllocator:
    """nvmath's memory manager (``BaseCUDAMemoryManagerAsync``) for an executor's Matmuls: each
    workspace from the pool of the executor's home stream (:attr:`StreamOrder.home`), whatever
    stream nvmath allocates it for, so that the executor's memory is released in order from one
    stream that linred keeps; the stream nvmath named first waits for the home stream's work (an
    event, no host wait: its pool may hand back memory that a released executor's last call,
    which the home stream waits for, still uses)."""

    def __init__(self, ops: Any, order: StreamOrder) -> None:
        self.device_id = ops.device
        self._ops = ops
        self._order = order

    def memalloc_async(self, size: int, stream: Any) -> Any:
        from nvmath.memory import MemoryPointer

        ops, home = self._ops, self._order.home
        with ops.on(home):
            buffer = ops.empty((size,), "uint8")
        event = ops.event()
        ops.record(event, home)
        ops.wait(int(stream.handle), event)
        held = [buffer]  # (the buffer lives until nvmath frees the pointer)
        return MemoryPointer(ops.pointer(buffer), size, finalizer=held.clear)
