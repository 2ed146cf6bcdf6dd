"""linred's composed reductions against the compositions users write by hand today.

For ``segmented_logsumexp``, ``segmented_softmax``, ``segmented_log_softmax``,
``segmented_var`` and ``segmented_std`` over ragged segments (CSR offsets, every segment
non-empty so that every composition below is correct), on an ``(n, d)`` array:

- NumPy: ``np.maximum.reduceat`` / ``np.add.reduceat`` per segment, ``np.repeat`` back to the
  elements, ``np.exp`` and friends;
- PyTorch: ``torch.segment_reduce`` with ``repeat_interleave(..., output_size=n)``, and the
  ``scatter_reduce`` + ``index_select`` form of ``torch_geometric.utils.softmax`` (what
  ``torch_scatter`` users write);
- JAX (when installed): ``jax.ops.segment_max`` / ``segment_sum`` compositions under ``jax.jit``;
- CuPy (``--gpu``): ``cupyx.scatter_max`` / ``cupyx.scatter_add`` compositions.

Every row is timed warm in this process on the same arrays: ``--samples`` (>= 7) samples of
``k`` back-to-back calls, ``k`` chosen so that a sample lasts about ``--sample-ms``; reported as
the median with the min and max per call.  On the host with ``time.perf_counter``; on the GPU
(``--gpu``: CUDA torch and CuPy) with CUDA events recorded around the calls on the current
stream and a synchronization on the end event.  GB/s counts the bytes a call must move at
least (the data read once, the result written once); on the GPU it is also given as a
percentage of a device-to-device copy of the data measured the same way.  Every composition's
result is compared with linred's (``ok`` or ``DIFF``).  linred runs with ``check=False`` (the
compositions check nothing either); ``--check`` times the default.

    python tools/fused_bench.py                          # CPU: NumPy, torch CPU, JAX CPU
    python tools/fused_bench.py --n 20000 --d 8          # smaller
    python tools/fused_bench.py --gpu                    # CUDA torch and CuPy (and JAX on a GPU)
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import linred

FUNCTIONS = ("logsumexp", "softmax", "log_softmax", "var", "std")
PER_ELEMENT = ("softmax", "log_softmax")


@dataclass
class Problem:
    """The data of one run, as NumPy arrays: ``x`` (n, d), the segments as offsets, lengths, starts and ids."""

    x: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    ids: np.ndarray

    @property
    def m(self) -> int:
        return len(self.lengths)

    def bytes_moved(self, name: str) -> int:
        """The least a call moves: the data read once, the result written once."""
        n, d = self.x.shape
        out = n if name in PER_ELEMENT else self.m
        return (n + out) * d * self.x.itemsize


def make_problem(n: int, d: int, mean_length: int, dtype: str, seed: int = 0) -> Problem:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2 * mean_length, size=n // mean_length + 2)  # >= 1: reduceat needs no empty segment
    ends = np.cumsum(lengths)
    lengths = lengths[: int(np.searchsorted(ends, n)) + 1]
    lengths[-1] -= int(lengths.sum()) - n
    lengths = lengths[lengths > 0]
    assert lengths.sum() == n
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    x = rng.standard_normal((n, d)).astype(dtype)
    return Problem(x, offsets, lengths.astype(np.int64), np.repeat(np.arange(len(lengths)), lengths))


# --- the compositions written by hand ---


def numpy_rows(p: Problem, name: str, check: bool) -> dict[str, Callable[[], Any]]:
    x, starts, lengths, offsets = p.x, p.offsets[:-1], p.lengths, p.offsets
    den = lengths[:, None].astype(x.dtype)

    def composed() -> np.ndarray:
        if name in ("var", "std"):
            mean = np.add.reduceat(x, starts, axis=0) / den
            dev = x - np.repeat(mean, lengths, axis=0)
            var = np.add.reduceat(dev * dev, starts, axis=0) / den
            return np.sqrt(var) if name == "std" else var
        mx = np.maximum.reduceat(x, starts, axis=0)
        dev = x - np.repeat(mx, lengths, axis=0)
        s = np.add.reduceat(np.exp(dev), starts, axis=0)
        if name == "logsumexp":
            return mx + np.log(s)
        if name == "softmax":
            return np.exp(dev) / np.repeat(s, lengths, axis=0)
        return dev - np.repeat(np.log(s), lengths, axis=0)

    fn = getattr(linred, f"segmented_{name}")
    return {
        "linred numpy": lambda: fn(x, offsets=offsets, check=check),
        "np reduceat+repeat": composed,
    }


def torch_rows(p: Problem, name: str, check: bool, device: str) -> dict[str, Callable[[], Any]]:
    import torch

    x = torch.as_tensor(p.x, device=device)
    offsets = torch.as_tensor(p.offsets, device=device)
    lengths = torch.as_tensor(p.lengths, device=device)
    index = torch.as_tensor(p.ids, device=device)
    n, d = x.shape
    m = p.m
    den = lengths[:, None].to(x.dtype)

    def spread(r: Any) -> Any:
        return r.repeat_interleave(lengths, dim=0, output_size=n)  # output_size: no synchronization

    def segment_reduce() -> Any:
        if name in ("var", "std"):
            mean = torch.segment_reduce(x, "mean", lengths=lengths, axis=0)
            dev = x - spread(mean)
            var = torch.segment_reduce(dev * dev, "sum", lengths=lengths, axis=0) / den
            return var.sqrt() if name == "std" else var
        mx = torch.segment_reduce(x, "max", lengths=lengths, axis=0)
        dev = x - spread(mx)
        s = torch.segment_reduce(dev.exp(), "sum", lengths=lengths, axis=0)
        if name == "logsumexp":
            return mx + s.log()
        if name == "softmax":
            return dev.exp() / spread(s)
        return dev - spread(s.log())

    def scatter(src: Any, reduce: str) -> Any:  # torch_scatter.scatter(src, index, dim=0, dim_size=m, reduce=...)
        out = torch.zeros((m, d), dtype=src.dtype, device=src.device)
        return out.scatter_reduce_(0, index[:, None].expand(n, d), src, reduce, include_self=False)

    def scatter_form() -> Any:  # torch_geometric.utils.softmax and its relatives
        if name in ("var", "std"):
            mean = scatter(x, "mean")
            dev = x - mean.index_select(0, index)
            var = scatter(dev * dev, "sum") / den
            return var.sqrt() if name == "std" else var
        mx = scatter(x, "amax")
        dev = x - mx.index_select(0, index)
        s = scatter(dev.exp(), "sum")
        if name == "logsumexp":
            return mx + s.log()
        if name == "softmax":
            return dev.exp() / s.index_select(0, index)
        return dev - s.log().index_select(0, index)

    fn = getattr(linred, f"segmented_{name}")
    where = "CUDA" if device != "cpu" else "CPU"
    return {
        f"linred torch {where}": lambda: fn(x, offsets=offsets, check=check),
        "torch.segment_reduce": segment_reduce,
        "scatter_reduce (PyG)": scatter_form,
    }


def jax_rows(p: Problem, name: str, check: bool, gpu: bool) -> dict[str, Callable[[], Any]]:
    import jax
    import jax.numpy as jnp

    device = jax.devices("gpu" if gpu else "cpu")[0]
    x = jax.device_put(p.x, device)
    ids = jax.device_put(p.ids, device)
    den = jax.device_put(p.lengths[:, None].astype(p.x.dtype), device)
    offsets = jax.device_put(p.offsets, device)
    m = p.m

    @jax.jit
    def composed(x: Any, ids: Any, den: Any) -> Any:
        kw = {"num_segments": m, "indices_are_sorted": True}
        if name in ("var", "std"):
            mean = jax.ops.segment_sum(x, ids, **kw) / den
            dev = x - mean[ids]
            var = jax.ops.segment_sum(dev * dev, ids, **kw) / den
            return jnp.sqrt(var) if name == "std" else var
        mx = jax.ops.segment_max(x, ids, **kw)
        dev = x - mx[ids]
        s = jax.ops.segment_sum(jnp.exp(dev), ids, **kw)
        if name == "logsumexp":
            return mx + jnp.log(s)
        if name == "softmax":
            return jnp.exp(dev) / s[ids]
        return dev - jnp.log(s)[ids]

    fn = getattr(linred, f"segmented_{name}")
    return {
        "linred jax": lambda: fn(x, offsets=offsets, check=check).block_until_ready(),
        "jax.ops.segment_* (jit)": lambda: composed(x, ids, den).block_until_ready(),
    }


def cupy_rows(p: Problem, name: str, check: bool) -> dict[str, Callable[[], Any]]:
    import cupy
    import cupyx

    x = cupy.asarray(p.x)
    offsets = cupy.asarray(p.offsets)
    ids = cupy.asarray(p.ids)
    den = cupy.asarray(p.lengths[:, None].astype(p.x.dtype))
    m, d = p.m, p.x.shape[1]

    def scatter(src: Any, how: Callable[..., None], fill: float) -> Any:
        out = cupy.full((m, d), fill, dtype=src.dtype)
        how(out, ids, src)
        return out

    def composed() -> Any:
        if name in ("var", "std"):
            mean = scatter(x, cupyx.scatter_add, 0.0) / den
            dev = x - mean[ids]
            var = scatter(dev * dev, cupyx.scatter_add, 0.0) / den
            return cupy.sqrt(var) if name == "std" else var
        mx = scatter(x, cupyx.scatter_max, -np.inf)
        dev = x - mx[ids]
        s = scatter(cupy.exp(dev), cupyx.scatter_add, 0.0)
        if name == "logsumexp":
            return mx + cupy.log(s)
        if name == "softmax":
            return cupy.exp(dev) / s[ids]
        return dev - cupy.log(s)[ids]

    fn = getattr(linred, f"segmented_{name}")
    return {
        "linred cupy": lambda: fn(x, offsets=offsets, check=check),
        "cupyx.scatter_*": composed,
    }


# --- timing ---


class HostTimer:
    """Wall-clock time of ``k`` calls (host data: the call is the work)."""

    def __call__(self, fn: Callable[[], Any], k: int) -> float:
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        return (time.perf_counter() - t0) / k


class CudaTimer:
    """Device time of ``k`` calls between two CUDA events on the current stream (torch or CuPy)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __call__(self, fn: Callable[[], Any], k: int) -> float:
        if self.kind == "torch":
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()  # nothing earlier in the stream counts
            start.record()
            for _ in range(k):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / k
        import cupy

        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        cupy.cuda.get_current_stream().synchronize()
        start.record()
        for _ in range(k):
            fn()
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) / 1e3 / k


def measure(fn: Callable[[], Any], timer: Callable[[Callable[[], Any], int], float], samples: int,
            sample_ms: float) -> list[float]:  # fmt: skip
    """Seconds per call: ``samples`` samples of ``k`` calls, after warm-up calls (plans, kernels, jit)."""
    for _ in range(3):
        fn()
    once = timer(fn, 1)
    k = max(1, min(10_000, int(sample_ms / 1e3 / max(once, 1e-9))))
    return [timer(fn, k) for _ in range(samples)]


def to_numpy(a: Any) -> np.ndarray:
    if type(a).__module__.startswith("torch"):
        return a.detach().cpu().numpy()
    if type(a).__module__.startswith("cupy"):
        return a.get()
    return np.asarray(a)


def agrees(a: Any, b: Any, dtype: str) -> str:
    tol = 1e-4 if dtype == "float32" else 1e-9
    a, b = to_numpy(a).astype(np.float64), to_numpy(b).astype(np.float64)
    return "ok" if a.shape == b.shape and np.allclose(a, b, rtol=tol, atol=tol, equal_nan=True) else "DIFF"


def copy_bandwidth(kind: str, p: Problem, samples: int, sample_ms: float) -> float:
    """GB/s of a device-to-device copy of the data (bytes read + written), timed like the rows."""
    if kind == "torch":
        import torch

        src = torch.as_tensor(p.x, device="cuda")
        dst = torch.empty_like(src)
        fn = lambda: dst.copy_(src)
    else:
        import cupy

        src = cupy.asarray(p.x)
        dst = cupy.empty_like(src)
        fn = lambda: cupy.copyto(dst, src)
    seconds = statistics.median(measure(fn, CudaTimer(kind), samples, sample_ms))
    return 2 * p.x.nbytes / seconds / 1e9


def report(label: str, seconds: list[float], nbytes: int, copy_gbs: float | None, check: str) -> str:
    med, lo, hi = statistics.median(seconds), min(seconds), max(seconds)
    gbs = nbytes / med / 1e9
    of_copy = f"{100 * gbs / copy_gbs:5.1f}%" if copy_gbs else "     -"
    us = 1e6
    return f"  {label:26s} {med * us:10.1f} [{lo * us:9.1f}, {hi * us:9.1f}] us  {gbs:7.2f} GB/s  {of_copy}  {check}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200_000, help="rows (elements along the segment axis)")
    parser.add_argument("--d", type=int, default=16, help="feature columns")
    parser.add_argument("--mean-length", type=int, default=32, help="mean segment length (lengths 1 .. 2*mean-1)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--samples", type=int, default=9, help="samples per row (at least 7)")
    parser.add_argument("--sample-ms", type=float, default=20.0, help="about how long one sample lasts")
    parser.add_argument("--functions", nargs="+", default=list(FUNCTIONS), choices=FUNCTIONS)
    parser.add_argument("--gpu", action="store_true", help="CUDA torch and CuPy (and JAX on a GPU) instead of the CPU")
    parser.add_argument("--check", action="store_true", help="linred with check=True (default: check=False)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU rows; default: torch's)")
    args = parser.parse_args(argv)
    if args.samples < 7:
        parser.error("--samples must be at least 7")

    p = make_problem(args.n, args.d, args.mean_length, args.dtype)
    have = {name: importlib.util.find_spec(name) is not None for name in ("torch", "jax", "cupy")}
    if args.threads is not None and have["torch"]:
        import torch

        torch.set_num_threads(args.threads)  # (on a busy host, spinning threads make every torch row noise)
    groups: list[tuple[str, Callable[[str], dict[str, Callable[[], Any]]], Any, float | None]] = []
    if args.gpu:
        if have["torch"]:
            import torch

            if torch.cuda.is_available():
                gbs = copy_bandwidth("torch", p, args.samples, args.sample_ms)
                groups.append(("torch CUDA", lambda f: torch_rows(p, f, args.check, "cuda"), CudaTimer("torch"), gbs))
        if have["cupy"]:
            gbs = copy_bandwidth("cupy", p, args.samples, args.sample_ms)
            groups.append(("CuPy", lambda f: cupy_rows(p, f, args.check), CudaTimer("cupy"), gbs))
        if have["jax"]:
            import jax

            if any(dev.platform == "gpu" for dev in jax.devices()):  # (timed on the host: jax owns its stream)
                groups.append(("JAX GPU", lambda f: jax_rows(p, f, args.check, True), HostTimer(), None))
        if not groups:
            print("no CUDA torch or CuPy here", file=sys.stderr)
            return 1
    else:
        groups.append(("NumPy", lambda f: numpy_rows(p, f, args.check), HostTimer(), None))
        if have["torch"]:
            groups.append(("torch CPU", lambda f: torch_rows(p, f, args.check, "cpu"), HostTimer(), None))
        if have["jax"]:
            groups.append(("JAX CPU", lambda f: jax_rows(p, f, args.check, False), HostTimer(), None))

    print(
        f"linred {linred.__version__}: x {args.n} x {args.d} {args.dtype}, {p.m} segments (mean length "
        f"{args.n / p.m:.1f}), check={args.check}; per call: median [min, max] of {args.samples} samples, "
        "GB/s of the data read + the result written"
    )
    for where, rows_of, timer, copy_gbs in groups:
        suffix = f" (device copy {copy_gbs:.0f} GB/s)" if copy_gbs else ""
        print(f"== {where}{suffix}")
        for name in args.functions:
            print(f" {name}")
            rows = rows_of(name)
            first = None
            for label, fn in rows.items():
                result = fn()
                first = result if first is None else first
                verdict = "" if result is first else agrees(result, first, args.dtype)
                seconds = measure(fn, timer, args.samples, args.sample_ms)
                print(report(label, seconds, p.bytes_moved(name), copy_gbs, verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
