"""The methods ``linred bench`` times: linred's backends and the peers a user would otherwise call.

A :class:`Method` builds, from a case's :class:`~linred.bench.data.Inputs`, a
zero-argument callable that performs one segmented sum and returns its result.
Everything a user would do once (a vector of ones, a CSR indicator matrix, CUB
temporary storage, lengths for ``torch.segment_reduce``) is done when the
callable is built, outside the timed region; the callable does what a user's
repeated call does, nothing more.

The peer registries :data:`CPU_PEERS` and :data:`GPU_PEERS` are plain lists,
looked up when a case runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from linred.bench.data import Inputs

__all__ = ["CPU_PEERS", "GPU_PEERS", "Method", "Skip", "linred_methods"]


class Skip(Exception):
    """Raised by a method's ``make`` when it cannot run here; recorded as ``skipped`` with the message."""


def _always(inp: Inputs) -> bool | str:
    return True


@dataclass(frozen=True)
class Method:
    """One way of computing a case's segmented sum.

    Attributes
    ----------
    name : str
        Label in the table, the plot and the JSON.
    make : callable
        ``make(inputs) -> fn``; ``fn()`` computes the sum and returns the result
        of shape ``(m,)`` or ``(m, features)``.  ``fn.note``, if set, is shown
        beside the result.  ``make`` may raise :class:`Skip`.
    lib : {"numpy", "cupy", "torch", "input"}
        The library whose current stream the method uses (what its CUDA events
        are recorded on); ``"input"``: the library of the case's buffer.
    applies : callable
        ``applies(inputs)``: True to run, False to leave the method out of this
        case (it does not apply, e.g. a reshape for variable lengths), or a
        string: listed as skipped with that note.
    requires : tuple of str
        Modules that must import for the method to run (skipped with the import
        error otherwise).
    kind : {"linred", "peer"}
    """

    name: str
    make: Callable[[Inputs], Callable[[], Any]]
    lib: str = "input"
    applies: Callable[[Inputs], bool | str] = _always
    requires: tuple[str, ...] = ()
    kind: str = "peer"


# ---------------------------------------------------------------- linred


def _auto_choice(inp: Inputs, kwargs: dict[str, Any]) -> str | None:
    """The backend ``backend="auto"`` picks for this call (planning only, no data touched)."""
    from linred._frontend import request
    from linred.backends.select import select

    try:
        seg = kwargs.get("segment_length")
        check = kwargs.get("check", False)
        req, _, _ = request("sum", inp.x, segment_length=seg, offsets=kwargs.get("offsets"), check=check)
        return select(req.problem, "auto").name
    except Exception:  # the call itself will report why
        return None


def _linred(backend: str, check: bool = False) -> Method:
    def make(inp: Inputs) -> Callable[[], Any]:
        import linred
        import linred.backends as registry

        if backend != "auto":
            try:
                registry.get_backend(backend)
            except Exception as e:
                if isinstance(e, ModuleNotFoundError) and e.name == f"linred.backends.{backend}":
                    raise Skip(f"no module linred.backends.{backend}") from None
                raise Skip(f"linred.backends.{backend} does not import ({type(e).__name__}: {e})") from None
        x = inp.x
        kwargs = inp.segment_kwargs()
        if not inp.fixed:
            kwargs["check"] = check
        segmented_sum = linred.segmented_sum

        def fn() -> Any:
            return segmented_sum(x, **kwargs, backend=backend)

        if backend == "auto":
            chosen = _auto_choice(inp, kwargs)
            if chosen:
                fn.note = f"auto -> {chosen}"  # type: ignore[attr-defined]
        return fn

    name = f"linred {backend}" + ("+check" if check else "")
    applies = _always if not check else (lambda inp: not inp.fixed)
    return Method(name, make, lib="input", applies=applies, kind="linred")


#: the backends timed on the CPU (the GPU runs every registered backend but the host-only NumPy one)
CPU_BACKENDS = ("numpy", "nvmath")


def linred_methods(device: str) -> list[Method]:
    """linred's methods: ``auto`` and every backend by name, plus ``auto`` with ``check=True`` for offsets.

    Variable-length calls are timed with ``check=False`` (the caller's promise
    that the offsets are valid, which is what every peer assumes); the
    ``+check`` row shows what validating them on every call costs.
    """
    from linred.backends import BACKENDS

    backends = [b for b in BACKENDS if b != "numpy"] if device == "gpu" else CPU_BACKENDS
    return [_linred("auto"), *(_linred(b) for b in backends), _linred("auto", check=True)]


# ---------------------------------------------------------------- NumPy (host)


def _fixed_only(inp: Inputs) -> bool | str:
    return inp.fixed


def _numpy_reduceat(inp: Inputs) -> Callable[[], Any]:
    x = inp.x
    # For offsets, reduceat gives empty segments the next element, not 0: users get that, so the bench does too.
    starts = np.arange(0, inp.case.n, inp.case.length) if inp.fixed else inp.host_offsets[:-1]
    return lambda: np.add.reduceat(x, starts, axis=0)


def _numpy_reshape_sum(inp: Inputs) -> Callable[[], Any]:
    X = inp.x.reshape(inp.m, inp.case.length, *inp.x.shape[1:])
    return lambda: X.sum(axis=1)


def _numpy_matmul(inp: Inputs) -> Callable[[], Any]:
    L = inp.case.length
    ones = np.ones(L, dtype=inp.x.dtype)
    if inp.case.features == 1:
        X = inp.x.reshape(inp.m, L)
        return lambda: X @ ones
    X3 = inp.x.reshape(inp.m, L, inp.case.features)
    return lambda: np.matmul(ones, X3)


CPU_PEERS: list[Method] = [
    Method("numpy add.reduceat", _numpy_reduceat, lib="numpy"),
    Method("numpy reshape.sum(1)", _numpy_reshape_sum, lib="numpy", applies=_fixed_only),
    Method("numpy X@ones", _numpy_matmul, lib="numpy", applies=_fixed_only),
]


# ---------------------------------------------------------------- CuPy


def _cupy_input(inp: Inputs) -> bool | str:
    return True if inp.lib == "cupy" else f"CuPy has no {inp.case.dtype} dtype"


def _cupy_fixed(inp: Inputs) -> bool | str:
    return _cupy_input(inp) if inp.fixed else False


def _cupy_sum(accelerators: list[str]) -> Callable[[Inputs], Callable[[], Any]]:
    def make(inp: Inputs) -> Callable[[], Any]:
        from cupy import _core

        X = inp.x.reshape(inp.m, inp.case.length, *inp.x.shape[1:])

        def fn() -> Any:
            # CuPy's accelerator switch is global: set it for this call only.
            saved = _core.get_reduction_accelerators(), _core.get_routine_accelerators()
            _core.set_reduction_accelerators(accelerators)
            _core.set_routine_accelerators(accelerators)
            try:
                return X.sum(axis=1)
            finally:
                _core.set_reduction_accelerators(saved[0])
                _core.set_routine_accelerators(saved[1])

        return fn

    return make


def _cupy_matmul(inp: Inputs) -> Callable[[], Any]:
    import cupy

    L = inp.case.length
    if inp.case.features == 1:
        X = inp.x.reshape(inp.m, L)
        ones = cupy.ones(L, dtype=inp.x.dtype)
        return lambda: X @ ones
    d = inp.case.features
    X3 = inp.x.reshape(inp.m, L, d)
    ones = cupy.ones((1, L), dtype=inp.x.dtype)
    m = inp.m
    return lambda: cupy.matmul(ones, X3).reshape(m, d)


def _cuda_compute_applies(inp: Inputs) -> bool | str:
    if inp.lib != "cupy":
        return f"needs a CuPy array; CuPy has no {inp.case.dtype} dtype"
    if inp.case.features != 1:
        return "segments of a 1-D sequence only (feature dims need a strided iterator)"
    if inp.m > np.iinfo(np.int32).max:
        return "more than 2^31-1 segments"
    return True


def _cuda_compute(inp: Inputs) -> Callable[[], Any]:
    import cupy
    from cuda import compute

    x = inp.x
    m = inp.m
    offsets = cupy.arange(0, inp.case.n + 1, inp.case.length, dtype=cupy.int64) if inp.fixed else inp.offsets
    starts, ends = offsets[:-1], offsets[1:]
    stream = cupy.cuda.get_current_stream()
    errors = []
    # float16 in, float32 accumulator and result: what a careful user asks for; else the input's own type.
    accumulators = [np.float32, x.dtype] if x.dtype == np.float16 else [x.dtype]
    for acc in accumulators:
        try:
            out = cupy.empty(m, dtype=acc)
            h_init = np.zeros(1, dtype=acc)  # must be a 1-element array, not a scalar
            reducer = compute.make_segmented_reduce(
                d_in=x, d_out=out, start_offsets_in=starts, end_offsets_in=ends, op=compute.OpKind.PLUS, h_init=h_init
            )
            args = {
                "d_in": x,
                "d_out": out,
                "num_segments": m,
                "start_offsets_in": starts,
                "end_offsets_in": ends,
                "op": compute.OpKind.PLUS,
                "h_init": h_init,
                "max_segment_size": inp.max_length or None,
                "stream": stream,
            }
            temp_bytes = reducer(temp_storage=None, **args)
            temp = cupy.empty(max(1, int(temp_bytes)), dtype=cupy.uint8)
            break
        except Exception as e:
            errors.append(f"{np.dtype(acc).name}: {type(e).__name__}: {e}")
    else:
        raise RuntimeError("; ".join(errors))

    def fn() -> Any:
        reducer(temp_storage=temp, **args)
        return out

    fn.note = f"acc {np.dtype(acc).name}, temp storage reused"  # type: ignore[attr-defined]
    if inp.fixed:
        fn.note += ", offsets materialized"  # type: ignore[attr-defined]
    return fn


def _csr_applies(inp: Inputs) -> bool | str:
    if inp.fixed:
        return False
    if inp.lib != "cupy" or inp.case.dtype not in ("float32", "float64") or inp.case.features != 1:
        return "cuSPARSE SpMV through cupyx: 1-D float32/float64 CuPy data only"
    if inp.case.n >= 2**31:
        return "cupyx CSR indices are int32 (n >= 2^31)"
    return True


def _cupyx_csr(inp: Inputs) -> Callable[[], Any]:
    import cupy
    from cupyx.scipy import sparse

    n = inp.case.n
    # The indicator matrix: ones as values, so that S @ x sums each segment of x.
    # (Never the data as values: cupyx would sum duplicates on first use and the
    # timed calls would measure nothing.)
    S = sparse.csr_matrix(
        (cupy.ones(n, dtype=inp.x.dtype), cupy.arange(n, dtype=cupy.int32), inp.offsets.astype(cupy.int32)),
        shape=(inp.m, n),
    )
    x = inp.x

    def fn() -> Any:
        return S @ x

    fn.note = "indicator matrix built once"  # type: ignore[attr-defined]
    return fn


# ---------------------------------------------------------------- PyTorch


def _torch_sum(inp: Inputs) -> Callable[[], Any]:
    xt = inp.torch_x()
    X = xt.view(inp.m, inp.case.length, *xt.shape[1:])
    return lambda: X.sum(1)


def _torch_matmul(inp: Inputs) -> Callable[[], Any]:
    import torch

    xt = inp.torch_x()
    L = inp.case.length
    if inp.case.features == 1:
        X = xt.view(inp.m, L)
        ones = torch.ones(L, dtype=xt.dtype, device=xt.device)
        return lambda: torch.mv(X, ones)
    d = inp.case.features
    X3 = xt.view(inp.m, L, d)
    ones = torch.ones((1, L), dtype=xt.dtype, device=xt.device)
    m = inp.m
    return lambda: torch.matmul(ones, X3).view(m, d)


def _torch_segment_reduce(by: str) -> Callable[[Inputs], Callable[[], Any]]:
    def make(inp: Inputs) -> Callable[[], Any]:
        import torch

        xt = inp.torch_x()
        if inp.fixed:
            L = inp.case.length
            if by == "lengths":
                index = torch.full((inp.m,), L, dtype=torch.int64, device=xt.device)
            else:
                index = torch.arange(0, inp.case.n + 1, L, dtype=torch.int64, device=xt.device)
        else:
            index = inp.as_torch(inp.lengths if by == "lengths" else inp.offsets)
        kwargs = {by: index}

        def fn() -> Any:
            # unsafe=True skips torch's validation of the segments, as linred's check=False does
            return torch.segment_reduce(xt, "sum", axis=0, unsafe=True, **kwargs)

        return fn

    return make


GPU_PEERS: list[Method] = [
    Method("cupy sum (CUB)", _cupy_sum(["cub"]), lib="cupy", applies=_cupy_fixed, requires=("cupy",)),
    Method("cupy sum (no CUB)", _cupy_sum([]), lib="cupy", applies=_cupy_fixed, requires=("cupy",)),
    Method("cupy X@ones", _cupy_matmul, lib="cupy", applies=_cupy_fixed, requires=("cupy",)),
    Method("torch sum", _torch_sum, lib="torch", applies=_fixed_only, requires=("torch",)),
    Method("torch X@ones", _torch_matmul, lib="torch", applies=_fixed_only, requires=("torch",)),
    Method("torch segment_reduce(lengths)", _torch_segment_reduce("lengths"), lib="torch", requires=("torch",)),
    Method("torch segment_reduce(offsets)", _torch_segment_reduce("offsets"), lib="torch", requires=("torch",)),
    Method(
        "cuda.compute segmented_reduce",
        _cuda_compute,
        lib="cupy",
        applies=_cuda_compute_applies,
        requires=("cuda.compute",),
    ),
    Method("cupyx CSR SpMV", _cupyx_csr, lib="cupy", applies=_csr_applies, requires=("cupyx.scipy.sparse",)),
]
