"""GPU: concurrent calls from several host threads, each on a stream of its own, and plans shared
between streams; every result against the float64 reference of tests/support/reference.py.

- Eight threads start together (a barrier) and each makes random calls on its own
  non-blocking stream (CuPy arrays, then CUDA tensors): random reduction, dtype, segment
  spec (fixed length, offsets with empty segments, lengths), layout (one column, ``(n, d)``
  feature rows, rows of a batch along the last axis), ``out=``, ``check=``, and mostly
  ``backend="auto"``.  A thread enqueues a few calls, synchronizes its stream, then checks
  every result.  Each thread draws from its own seeded generator (``BASE_SEED`` + thread),
  so a failure names the seed and the call that reproduce it.
- Two plans (a fixed length and offsets, both with scratch buffers of their own) run at
  once from two threads on two streams, then one plan alternates between two streams from
  one thread (linred orders such calls with events, so the plan's scratch is never used by
  both streams at once).

The random choices are drawn from small palettes (dtype and reduction pairs, segment
lengths, feature widths) so that the run compiles a bounded number of kernels: the whole
file is meant to take well under a minute on an H100 once the ``nvrtc`` kernels are in
their disk cache.
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from support import (
    FUNCTIONS,
    HAS_CUPY_GPU,
    HAS_TORCH_CUDA,
    INTEGER,
    Refused,
    assert_reduction,
    call_or_refused,
    error_bound,
    expected_dtype,
    make_data,
    np_dtype,
    reference,
    segment_bounds,
    to_kind,
    to_numpy,
)

import linred
from linred.backends.base import VENDOR_FLOAT32_LONGEST_SPARSE

if HAS_CUPY_GPU:
    import cupy
if HAS_TORCH_CUDA:
    import torch

# Every test is marked gpu but the last, which checks the random draws on the CPU.
needs_cupy = pytest.mark.skipif(not HAS_CUPY_GPU, reason="needs CuPy with a GPU")
needs_torch_cuda = pytest.mark.skipif(not HAS_TORCH_CUDA, reason="needs torch with CUDA")

THREADS = 8
CALLS = 40  #: calls per thread
IN_FLIGHT = 5  #: calls a thread enqueues before it synchronizes its stream and checks them
BASE_SEED = 20_261_121
MAX_ELEMENTS = 1 << 21  #: the most elements of one call's data

#: (dtype, reduction) pairs: every dtype and every reduction, without compiling every pairing
PAIRS = (
    ("float32", "sum"),
    ("float32", "mean"),
    ("float16", "max"),
    ("float16", "sum"),
    ("float64", "min"),
    ("float64", "mean"),
    ("int32", "sum"),
    ("int64", "max"),
    ("uint8", "sum"),
    ("bool", "min"),
)
#: the same for CUDA tensors, with bfloat16 (CuPy has no bfloat16)
TORCH_PAIRS = (*PAIRS, ("bfloat16", "mean"))
#: fixed segment lengths: a power of two (fixed_small), short ones (warp_reduce), a long one
#: (fixed_long for data of 2 bytes or more)
LENGTHS = (4, 3, 100, 3000)
#: backends: mostly auto; a named one may refuse a call, with a proper BackendError for something it is
#: documented to refuse only (counted; most calls must be served)
BACKENDS = ("auto",) * 15 + ("nvrtc", "nvrtc", "cublas", "nvmath", "cub")


def _log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(np.exp(rng.uniform(np.log(lo), np.log(hi + 1))))


@dataclass
class Call:
    """One random call: what it passes to linred, and the NumPy twin of its data."""

    thread: int
    seed: int
    index: int
    reduction: str
    dtype: str
    spec: str  # "fixed", "offsets" or "lengths"
    layout: str  # "column", "features" or "rows"
    shape: tuple[int, ...]
    axis: int
    n: int
    m: int
    L: int | None = None
    lengths: np.ndarray | None = None
    segs_on_device: bool = False
    use_out: bool = False
    check: bool = True
    backend: str = "auto"
    stream_arg: str = "context"  # "context" (with stream:), "object" (stream=s) or "handle" (stream=int)
    x_np: np.ndarray = field(default=None, repr=False)

    def describe(self) -> str:
        segs = f"L={self.L}" if self.spec == "fixed" else f"{self.spec} of {self.m} segments"
        if self.spec != "fixed":
            empty = int((self.lengths == 0).sum())
            segs += f" ({empty} empty, longest {int(self.lengths.max()) if self.m else 0}"
            segs += ", on the device)" if self.segs_on_device else ", on the host)"
        return (
            f"thread {self.thread} (seed {self.seed}) call {self.index}: segmented_{self.reduction} of "
            f"{self.dtype}{list(self.shape)} ({self.layout}), axis={self.axis}, {segs}, backend={self.backend!r}, "
            f"out={'yes' if self.use_out else 'no'}, check={self.check}, stream via {self.stream_arg}"
        )

    @property
    def bounds(self) -> list[tuple[int, int]]:
        if self.spec == "fixed":
            return segment_bounds(self.n, segment_length=self.L)
        return segment_bounds(self.n, lengths=self.lengths.tolist())

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)


def _random_lengths(rng: np.random.Generator, m: int, mean: int, align: int) -> np.ndarray:
    """``m`` segment lengths of about ``mean``: some empty, sometimes one long one; at least one
    element, and a total that is a multiple of ``align``."""
    lengths = rng.geometric(1 / max(mean, 1), size=m) - (1 if mean <= 1 else 0)
    lengths[rng.random(m) < 0.2] = 0
    if m > 2 and rng.random() < 0.3:
        lengths[rng.integers(m)] = rng.integers(mean, 8 * mean + 2)
    lengths[rng.integers(m)] += 1 + (-int(lengths.sum()) - 1) % align
    return lengths.astype(np.int64)


def draw(rng: np.random.Generator, thread: int, seed: int, index: int, pairs: tuple) -> Call:
    dtype, reduction = pairs[rng.integers(len(pairs))]
    layout = rng.choice(["column", "column", "features", "rows"])
    spec = rng.choice(["fixed", "fixed", "offsets", "lengths"])
    width = 1
    if layout == "features":
        width = int(rng.choice([16, 16, 3]))
    elif layout == "rows":
        width = int(rng.choice([2, 3, 5]))
    budget = MAX_ELEMENTS // width
    # Rows of a batch hold whole 16-byte vectors (a multiple of 16 elements), so that they take
    # the kernels of one row (unaligned rows are the tile kernel's, covered elsewhere).
    align = 16 if layout == "rows" else 1
    call = Call(thread, seed, index, reduction, dtype, spec, layout, (), 0, 0, 0)
    if spec == "fixed":
        L = int(rng.choice(LENGTHS))
        m = min(_log_uniform(rng, 1, 3000), max(1, budget // L))
        m = -(-m // align) * align
        call.L, call.m, call.n = L, m, m * L
    else:
        mean = _log_uniform(rng, 1, 3000)
        m = min(_log_uniform(rng, 1, 3000), max(1, budget // (2 * mean)))
        call.lengths = _random_lengths(rng, m, mean, align)
        call.m, call.n = m, int(call.lengths.sum())
        call.segs_on_device = bool(rng.random() < 0.5)
    if layout == "column":
        call.shape, call.axis = (call.n,), int(rng.choice([0, -1]))
    elif layout == "features":
        call.shape, call.axis = (call.n, width), int(rng.choice([0, -2]))
    else:
        call.shape, call.axis = (width, call.n), int(rng.choice([1, -1]))
    call.use_out = bool(rng.random() < 0.3)
    call.check = bool(rng.random() < 0.5)
    call.backend = str(rng.choice(BACKENDS))
    call.stream_arg = str(rng.choice(["context", "context", "object", "handle"]))
    return call


def data(call: Call) -> np.ndarray:
    """The call's data, from a generator of its own (the draws do not depend on the data)."""
    return make_data(call.dtype, call.shape, np.random.default_rng([call.seed, call.index]))


def out_shape(call: Call) -> tuple[int, ...]:
    shape = list(call.shape)
    shape[call.axis] = call.m
    return tuple(shape)


def first_wrong_segment(got: Any, call: Call) -> str:
    """Where a result first leaves the float64 reference: the segment, its bounds, the values."""
    try:
        axis = call.axis % len(call.shape)
        bounds = call.bounds
        ref = reference(call.reduction, call.x_np, bounds, axis)
        res = to_numpy(got)
        if res.shape != ref.shape:
            return f"result shape {res.shape}, reference {ref.shape}"
        out_name = expected_dtype(call.reduction, call.dtype)
        if out_name in INTEGER:
            ok = res == ref
        elif call.reduction in ("max", "min"):
            expected = ref.astype(np_dtype(out_name)).astype(np.float64)
            res64 = res.astype(np.float64)
            ok = (res64 == expected) | (np.isnan(res64) & np.isnan(expected))
        else:
            res64 = res.astype(np.float64)
            bound = error_bound(call.reduction, call.x_np, bounds, axis, out_name, ref)
            with np.errstate(invalid="ignore"):
                ok = (np.abs(res64 - ref) <= bound) | (res64 == ref) | (np.isnan(res64) & np.isnan(ref))
        bad = np.argwhere(~ok)
        if bad.size == 0:
            return "every value matches the reference (the type, dtype or device is wrong)"
        where = tuple(int(v) for v in bad[0])
        s = where[axis]
        start, stop = bounds[s]
        return (
            f"{len(bad)} wrong values; first wrong segment {s} = [{start}, {stop}) at index {where}: "
            f"got {res[where]!r}, reference {ref[where]!r}"
        )
    except Exception as e:  # the message must not hide the failure it describes
        return f"(could not locate the wrong segment: {type(e).__name__}: {e})"


# ---------------------------------------------------------------------------
# Array kinds: CuPy arrays on CuPy streams, CUDA tensors on torch streams
# ---------------------------------------------------------------------------


class CupyKind:
    name = "cupy"
    pairs = PAIRS

    @staticmethod
    def stream() -> Any:
        return cupy.cuda.Stream(non_blocking=True)

    @staticmethod
    def on(stream: Any) -> Any:
        return stream

    @staticmethod
    def handle(stream: Any) -> int:
        return int(stream.ptr)

    @staticmethod
    def device_ints(values: np.ndarray) -> Any:
        return cupy.asarray(values)

    @staticmethod
    def empty(shape: tuple[int, ...], dtype: str) -> Any:
        return cupy.empty(shape, dtype=dtype)


class TorchKind:
    name = "torch-cuda"
    pairs = TORCH_PAIRS

    @staticmethod
    def stream() -> Any:
        return torch.cuda.Stream()

    @staticmethod
    def on(stream: Any) -> Any:
        return torch.cuda.stream(stream)

    @staticmethod
    def handle(stream: Any) -> int:
        return int(stream.cuda_stream)

    @staticmethod
    def device_ints(values: np.ndarray) -> Any:
        return torch.from_numpy(values).to("cuda")

    @staticmethod
    def empty(shape: tuple[int, ...], dtype: str) -> Any:
        return torch.empty(shape, dtype=getattr(torch, dtype), device="cuda")


def run_thread(kind: Any, thread: int, barrier: threading.Barrier, failures: list, refusals: list) -> None:
    seed = BASE_SEED + thread
    rng = np.random.default_rng(seed)
    stream = kind.stream()
    pending: list[tuple[Call, Any, tuple]] = []

    def check_pending() -> None:
        stream.synchronize()
        with kind.on(stream):  # the copies to the host go on this thread's stream too
            for call, got, _keep in pending:
                try:
                    assert_reduction(
                        got, call.reduction, call.x_np, segments=call.bounds, axis=call.axis, like=_keep[0]
                    )
                except AssertionError as e:
                    failures.append(f"{call.describe()}:\n    {first_wrong_segment(got, call)}\n    {e}")
        pending.clear()

    barrier.wait(timeout=120)
    for index in range(CALLS):
        call = draw(rng, thread, seed, index, kind.pairs)
        call.x_np = data(call)
        try:
            with kind.on(stream):  # inputs (and out) are made on this thread's stream
                x = to_kind(call.x_np, kind.name)
                kwargs: dict[str, Any] = {"axis": call.axis, "check": call.check}
                if call.spec == "fixed":
                    kwargs["segment_length"] = call.L
                else:
                    values = call.offsets if call.spec == "offsets" else call.lengths
                    kwargs[call.spec] = kind.device_ints(values) if call.segs_on_device else values
                if call.use_out:
                    kwargs["out"] = kind.empty(out_shape(call), expected_dtype(call.reduction, call.dtype))
            keep = (x, kwargs)  # every input stays alive until its call has been checked
            fn = FUNCTIONS[call.reduction]
            if call.stream_arg == "context":
                with kind.on(stream):
                    got = call_or_refused(fn, x, backend=call.backend, **kwargs)
            else:  # the stream given as an argument, the current stream being another one
                arg = stream if call.stream_arg == "object" else kind.handle(stream)
                got = call_or_refused(fn, x, backend=call.backend, stream=arg, **kwargs)
            if call.use_out and got is not kwargs["out"]:
                failures.append(f"{call.describe()}: the result is not the out= array")
        except Refused as r:
            refusals.append((r.backend, r.reason))
            continue
        except Exception:
            failures.append(f"{call.describe()}: raised\n{traceback.format_exc()}")
            continue
        pending.append((call, got, keep))
        if len(pending) >= IN_FLIGHT:
            check_pending()
    check_pending()


def run_threads(kind: Any) -> None:
    barrier = threading.Barrier(THREADS)
    failures: list[str] = []
    refusals: list[tuple[str, str]] = []

    def target(thread: int) -> None:
        try:
            run_thread(kind, thread, barrier, failures, refusals)
        except Exception:
            failures.append(f"thread {thread} (seed {BASE_SEED + thread}) stopped:\n{traceback.format_exc()}")
            barrier.abort()

    threads = [threading.Thread(target=target, args=(t,), name=f"linred-{t}") for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread did not finish in 10 minutes"
    assert not failures, f"{len(failures)} failures (base seed {BASE_SEED}, thread t uses BASE_SEED + t):\n" + (
        "\n".join(failures[:10])
    )
    assert len(refusals) < THREADS * CALLS // 2, f"most calls were refused: {refusals[:5]}"


@pytest.mark.gpu
@needs_cupy
def test_threads_on_their_own_cupy_streams():
    run_threads(CupyKind)


@pytest.mark.gpu
@needs_cupy
@needs_torch_cuda
def test_threads_on_their_own_torch_streams():
    run_threads(TorchKind)


# ---------------------------------------------------------------------------
# Plans shared between streams
# ---------------------------------------------------------------------------

#: (backend of the fixed-length plan, backend of the offsets plan)
PLAN_BACKENDS = [("auto", "auto"), ("nvrtc", "nvrtc"), ("nvmath", "nvmath"), ("cublas", "cub")]
PLAN_CALLS = 50
#: a fixed length whose segments span several blocks of nvrtc's fixed_long (partials and tickets)
PLAN_L = 1 << 16
PLAN_M = 8


def _plan_offsets(rng: np.random.Generator, long: int = 1 << 18, around: int = 400) -> np.ndarray:
    """Offsets of about 2^19 elements: short and empty segments around one that spans many
    runs of nvrtc's warp_reduce (joined by its fix-up from per-run partials)."""
    lengths = np.concatenate([rng.integers(0, 300, around), [long], rng.integers(0, 300, around), [0, 5]])
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


@dataclass
class PlanCase:
    plan: Any
    reduction: str
    kwargs: dict
    n: int

    def data(self, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(-2, 2, self.n).astype(np.float32)

    def check(self, got: Any, x_np: np.ndarray, what: str) -> str | None:
        bounds = segment_bounds(self.n, **self.kwargs)
        try:
            assert_reduction(got, self.reduction, x_np, segments=bounds)
        except AssertionError as e:
            return f"{what} ({self.plan.backend}, {self.reduction}): {e}"
        return None


def _plans(backends: tuple[str, str], rng: np.random.Generator) -> list[PlanCase]:
    fixed_n = PLAN_L * PLAN_M
    # cuSPARSE serves float32 rows of at most VENDOR_FLOAT32_LONGEST_SPARSE (its accuracy limit)
    off = _plan_offsets(rng, 2000, 10) if backends[1] == "nvmath" else _plan_offsets(rng)  # (at most 7,985)
    assert backends[1] != "nvmath" or off[-1] <= VENDOR_FLOAT32_LONGEST_SPARSE
    example = cupy.zeros(fixed_n, dtype=cupy.float32)
    fixed = linred.SegmentedReduction(example, PLAN_L, reduction="sum", backend=backends[0])
    example = cupy.zeros(int(off[-1]), dtype=cupy.float32)
    offsets = linred.SegmentedReduction(example, offsets=cupy.asarray(off), reduction="mean", backend=backends[1])
    return [
        PlanCase(fixed, "sum", {"segment_length": PLAN_L}, fixed_n),
        PlanCase(offsets, "mean", {"offsets": off}, int(off[-1])),
    ]


@pytest.mark.gpu
@needs_cupy
@pytest.mark.parametrize("backends", PLAN_BACKENDS, ids=["-".join(b) for b in PLAN_BACKENDS])
def test_two_plans_on_two_streams_at_once(backends):
    """Two plans, each run 50 times by its own thread on its own stream, at the same time."""
    rng = np.random.default_rng(BASE_SEED)
    cases = _plans(backends, rng)
    barrier = threading.Barrier(len(cases))
    failures: list[str] = []

    def run(case: PlanCase, seed: int) -> None:
        try:
            local = np.random.default_rng(seed)
            stream = cupy.cuda.Stream(non_blocking=True)
            inputs = [case.data(local) for _ in range(PLAN_CALLS)]
            with stream:
                device = [cupy.asarray(x) for x in inputs]
            barrier.wait(timeout=120)
            results = []
            for i, x in enumerate(device):
                if i % 2:
                    results.append(case.plan(x, stream=stream))
                else:
                    with stream:
                        results.append(case.plan(x))
            stream.synchronize()
            with stream:
                for i, (got, x_np) in enumerate(zip(results, inputs, strict=True)):
                    problem = case.check(got, x_np, f"call {i} (seed {seed})")
                    if problem:
                        failures.append(problem)
        except Exception:
            failures.append(f"{case.plan.backend} plan (seed {seed}) raised:\n{traceback.format_exc()}")
            barrier.abort()

    threads = [threading.Thread(target=run, args=(c, BASE_SEED + 1 + i)) for i, c in enumerate(cases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for case in cases:
        case.plan.free()
    assert not failures, "\n".join(failures[:10])


@pytest.mark.gpu
@needs_cupy
@pytest.mark.parametrize("backends", PLAN_BACKENDS, ids=["-".join(b) for b in PLAN_BACKENDS])
def test_one_plan_alternating_between_two_streams(backends):
    """One plan called on two streams in turn (no host synchronization between the calls): each
    call must wait for the previous one where they share the plan's scratch."""
    rng = np.random.default_rng(BASE_SEED + 100)
    failures: list[str] = []
    for case in _plans(backends, rng):
        streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
        inputs = [case.data(rng) for _ in range(PLAN_CALLS)]
        device = []
        for i, x in enumerate(inputs):
            with streams[i % 2]:
                device.append(cupy.asarray(x))
        results = [case.plan(x, stream=streams[i % 2]) for i, x in enumerate(device)]
        for s in streams:
            s.synchronize()
        for i, (got, x_np) in enumerate(zip(results, inputs, strict=True)):
            problem = case.check(got, x_np, f"call {i} on stream {i % 2}")
            if problem:
                failures.append(problem)
        case.plan.free()
    assert not failures, f"base seed {BASE_SEED + 100}:\n" + "\n".join(failures[:10])


def test_draws_cover_the_palettes():
    """The random calls reach every dtype, reduction, spec, layout and way of passing the stream,
    with empty segments, and stay within the size budget (on the CPU: it checks the generator,
    so that a narrowed palette is noticed)."""
    seen: dict[str, set] = {k: set() for k in ("dtype", "reduction", "spec", "layout", "stream_arg", "backend")}
    empty = outs = 0
    for thread in range(THREADS):
        rng = np.random.default_rng(BASE_SEED + thread)
        for index in range(CALLS):
            call = draw(rng, thread, BASE_SEED + thread, index, TORCH_PAIRS)
            assert call.n == call.shape[call.axis] >= 1
            assert int(np.prod(call.shape)) <= 2 * MAX_ELEMENTS
            if call.spec == "fixed":
                assert call.n == call.m * call.L
            else:
                assert call.lengths.shape == (call.m,) and int(call.lengths.sum()) == call.n
                empty += int((call.lengths == 0).any())
            if call.layout == "rows":
                assert call.n % 16 == 0
            outs += call.use_out
            for k in seen:
                seen[k].add(getattr(call, k))
    assert seen["dtype"] == {d for d, _ in TORCH_PAIRS}
    assert seen["reduction"] == {"sum", "mean", "max", "min"}
    assert seen["spec"] == {"fixed", "offsets", "lengths"}
    assert seen["layout"] == {"column", "features", "rows"}
    assert seen["stream_arg"] == {"context", "object", "handle"}
    assert {"auto", "nvrtc", "cub"} <= seen["backend"]
    assert empty > 20 and outs > 20
