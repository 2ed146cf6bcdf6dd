"""Workload benchmarks: what users run on PyTorch tensors, beside the PyTorch idioms they would otherwise write.

The history of ``linred bench --suite workloads`` (docs/performance.md): torch CPU tensors
(``Cpu*``) and CUDA tensors (``Gpu*``, skipped, asv's n/a, where no CUDA device is visible).
A "shape" names a problem as that suite's case names do: its size, its reduction, and
``fwd`` (forward only) or ``fwd+bwd`` (``leaf.grad = None; y = f(leaf); y.backward(g)``).

- GNN pooling: ``(N, d)`` float32 node rows and the CSR ``ptr`` of ``graphs`` graphs of random
  sizes (none empty), pooled by sum, mean or max: ``linred-auto`` (default arguments),
  ``linred-nocheck`` (``check=False``), ``torch-segment_reduce``, ``torch-index_add``
  (``zeros.index_add_``, sum; mean divides by the graph sizes), ``torch-scatter_reduce``
  (``zeros.scatter_reduce(..., include_self=False)``) and ``torch-segment_csr``
  (``torch_scatter.segment_csr``, n/a where torch_scatter is not installed).
- Embedding bags: ``torch-embedding_bag`` (``F.embedding_bag``) against ``linred-gather``
  (linred on ``weight[input]``: the gather is part of the call), sum and mean.
- Windowed time series: a float32 series in windows of 60 or 1440 values, mean and max:
  ``linred-auto``, ``torch-view`` (``x.view(-1, L).mean(1)`` / ``.amax(1)``) and, on the CPU,
  ``numpy-reshape``.
- Per-segment spread (PNA's std aggregation): var and std of float32 rows in sorted segments:
  ``linred-auto``, ``linred-nocheck``, and the two-pass compositions ``torch-segment_reduce``
  and ``torch-index_add``.

The sizes are those of the suite; no tensor holds more than ``N_CPU`` (CPU: 2^22, the suite's
CPU cap) or ``N_GPU`` values (the mean graph and bag sizes are kept).  ``time_sum`` is asv's
timing of one call (on the GPU it synchronizes the device, so it includes the launch and the
host's work); ``track_gbps`` is the bytes of the input and the result (twice that with
backward, for the gradients) / the median time of one call (CUDA events on the GPU), in GB/s.
Every method's first result, and gradient, is checked against float64 in ``setup``: a wrong
linred result fails the benchmark, a wrong peer is skipped.  linred is reached through its
public reductions only, each looked up defensively (an older linred without one is n/a).
"""

from __future__ import annotations

import inspect
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from ._common import _driver_device_count, _one_line, _SegmentedSum, check, host_seconds, import_torch, relative_error

#: most values in one tensor on the CPU (the suite's CPU cap) and on the GPU (above every GPU size)
N_CPU = 1 << 22
N_GPU = 1 << 28

GNN_METHODS = [
    "linred-auto",
    "linred-nocheck",
    "torch-segment_reduce",
    "torch-index_add",
    "torch-scatter_reduce",
    "torch-segment_csr",
]
#: (N rows, d features, graphs)
GNN_SIZES = {
    "N=2k d=64 graphs=32": (2000, 64, 32),
    "N=50k d=128 graphs=256": (50_000, 128, 256),
    "N=1M d=128 graphs=4096": (1_000_000, 128, 4096),
    "N=10M d=16 graphs=100k": (10_000_000, 16, 100_000),
}
#: (E table rows, D, bags, mean bag length)
EMBEDDING_SIZES = {
    "E=100k D=64 bags=1024 len=20": (100_000, 64, 1024, 20),
    "E=1M D=128 bags=8192 len=32": (1_000_000, 128, 8192, 32),
    "E=4M D=64 bags=2^16 len=8": (4_000_000, 64, 65536, 8),
}
#: float32 values of the series on the CPU and on the GPU (cut to a multiple of the window)
SERIES = {"cpu": 1 << 22, "gpu": 1 << 24}
_REDUCE = {"sum": "segmented_sum", "mean": "segmented_mean", "max": "segmented_max"}


def _shapes(sizes: list[str], reductions: tuple[str, ...], passes: tuple[str, ...] = ("fwd", "fwd+bwd")) -> list[str]:
    return [f"{s} {r} {p}" for s in sizes for r in reductions for p in passes]


def _split(shape: str) -> tuple[str, str, bool]:
    """``(size, reduction, backward)`` of a shape name."""
    size, reduction, pass_ = shape.rsplit(" ", 2)
    return size, reduction, pass_ == "fwd+bwd"


def _shrink(rows: int, per_row: int, cap: int) -> int:
    return rows if rows * per_row <= cap else max(2, cap // per_row)


def _torch_device(gpu: bool) -> tuple[Any, Any]:
    """``(torch, device)``; NotImplementedError (asv's skip) without PyTorch, or without CUDA for ``gpu``."""
    if gpu:
        count, why = _driver_device_count()  # cheap: no torch import where there is no device
        if count < 1:
            raise NotImplementedError(why)
    torch = import_torch()
    if not gpu:
        return torch, torch.device("cpu")
    if not torch.cuda.is_available():
        raise NotImplementedError("torch.cuda.is_available() is False")
    return torch, torch.device("cuda")


def _batch(torch: Any, ptr: Any) -> tuple[Any, Any]:
    """``(sizes, segment id of every row)`` of int64 offsets ``ptr``."""
    counts = ptr.diff()
    return counts, torch.repeat_interleave(torch.arange(counts.shape[0], device=ptr.device), counts)


def _segment_reference(torch: Any, rows64: Any, batch: Any, counts: Any, reduction: str) -> Any:
    out = torch.zeros(counts.shape[0], rows64.shape[1], dtype=torch.float64, device=rows64.device)
    if reduction == "max":
        index = batch[:, None].expand(-1, rows64.shape[1])
        return out.scatter_reduce(0, index, rows64, reduce="amax", include_self=False)
    out.index_add_(0, batch, rows64)
    return out / counts.to(torch.float64)[:, None] if reduction == "mean" else out


def _linred(method: str, reduction: str) -> Callable[..., Any]:
    """``linred.segmented_<reduction>``, with ``check=False`` for ``linred-nocheck``."""
    import linred

    fn = getattr(linred, _REDUCE[reduction], None)
    if fn is None:
        raise NotImplementedError(f"this linred has no {_REDUCE[reduction]}")
    if method == "linred-nocheck":
        if "check" not in inspect.signature(fn).parameters:
            raise NotImplementedError("this linred has no check= argument")
        return lambda *a, **k: fn(*a, **k, check=False)
    return fn


def _random_ptr(torch: Any, rows: int, segments: int, gen: Any, device: Any) -> Any:
    """int64 offsets of ``segments`` non-empty segments of random sizes over ``rows`` rows."""
    cuts = (torch.randperm(rows - 1, generator=gen, device=device)[: segments - 1] + 1).sort().values
    return torch.cat([torch.zeros(1, dtype=cuts.dtype, device=device), cuts, torch.full((1,), rows, device=device)])


def _linred_composed(method: str, name: str, ptr: Any) -> Callable[[Any], Any]:
    """``linred.segmented_<name>`` over ``ptr`` (``check=False`` for ``linred-nocheck``)."""
    import linred

    fn = getattr(linred, f"segmented_{name}", None)
    if fn is None:
        raise NotImplementedError(f"this linred has no segmented_{name}")
    check_arg = {"check": False} if method == "linred-nocheck" else {}
    return lambda t: fn(t, offsets=ptr, **check_arg)


class _Workload(_SegmentedSum):
    """One workload problem by one method (``time_sum`` times one call of it, whatever its reduction)."""

    timeout = 300  # a first call may compile kernels
    gpu = False

    @property
    def cap(self) -> int:
        return N_GPU if self.gpu else N_CPU

    def prepare(self, method: str, shape: str, dtype: str) -> tuple[Callable[[], Any], int]:
        self.torch, self.device = _torch_device(self.gpu)
        size, reduction, backward = _split(shape)
        forward, leaf, reference, grad_out, nbytes = self.build(method, size, reduction)
        if backward:
            leaf = leaf.detach().requires_grad_(True)

            def fn() -> Any:
                leaf.grad = None  # as optimizer.zero_grad() does
                y = forward(leaf)
                y.backward(grad_out)
                return y, leaf.grad

        else:
            fn = lambda: forward(leaf)
        try:
            result = fn()  # the first call plans (and may compile); not timed
        except NotImplementedError:
            raise
        except Exception as e:
            if method.startswith("linred-"):  # an older linred without autograd or torch input
                raise NotImplementedError(f"{method} cannot run this: {_one_line(e)}") from None
            raise
        results = result if isinstance(result, tuple) else (result,)
        for got, want in zip(results, reference(backward), strict=True):
            if got is None:
                check(None, "no gradient", dtype, method)
            got64 = self.torch.as_tensor(got).detach().to(device=want.device, dtype=self.torch.float64)
            check(*relative_error(self.torch, got64, want), dtype, method)
        del result, results
        self.sync()
        return fn, nbytes * (2 if backward else 1)

    def build(self, method: str, size: str, reduction: str) -> tuple[Any, ...]:
        """``(forward(leaf), leaf, reference(backward) -> float64 (result[, gradient]), g, bytes of a forward)``."""
        raise NotImplementedError

    def sync(self) -> None:
        if self.gpu:
            self.torch.cuda.synchronize()

    def seconds(self) -> float:
        if not self.gpu:
            return host_seconds(self.fn)
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            self.fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)


# ---------------------------------------------------------------- GNN pooling


class _Gnn(_Workload):
    def build(self, method: str, size: str, reduction: str) -> tuple[Any, ...]:
        torch, device = self.torch, self.device
        n, d, graphs = GNN_SIZES[size]
        n_capped = _shrink(n, d, self.cap)
        n, graphs = n_capped, max(1, min(n_capped - 1, round(graphs * n_capped / n)))  # the same mean graph size
        if method == "torch-index_add" and reduction == "max":
            raise NotImplementedError("index_add_ sums")
        gen = torch.Generator(device=device).manual_seed(n + d + graphs)
        ptr = _random_ptr(torch, n, graphs, gen, device)
        counts, batch = _batch(torch, ptr)
        # every column a permutation of distinct values: no ties, so max's gradient is one-hot
        ranks = torch.rand(n, d, generator=gen, device=device).argsort(dim=0)
        x = ((ranks.to(torch.float64) + 0.5) * (2.0 / n) - 1.0).to(torch.float32)
        del ranks
        g = torch.randn(graphs, d, generator=gen, device=device)
        index = batch[:, None].expand(-1, d)

        def reference(backward: bool) -> tuple[Any, ...]:
            x64 = x.to(torch.float64)
            y = _segment_reference(torch, x64, batch, counts, reduction)
            if not backward:
                return (y,)
            g64 = g.to(torch.float64)
            if reduction == "sum":
                return y, g64[batch]
            if reduction == "mean":
                return y, (g64 / counts.to(torch.float64)[:, None])[batch]
            return y, (x64 == y[batch]).to(torch.float64) * g64[batch]

        if method.startswith("linred-"):
            fn = _linred(method, reduction)
            forward = lambda t: fn(t, offsets=ptr)
        elif method == "torch-segment_reduce":
            forward = lambda t: torch.segment_reduce(t, reduction, offsets=ptr, axis=0)
        elif method == "torch-index_add":
            sizes = counts.to(torch.float32)[:, None]
            if reduction == "mean":
                forward = lambda t: torch.zeros(graphs, d, device=device).index_add_(0, batch, t) / sizes
            else:
                forward = lambda t: torch.zeros(graphs, d, device=device).index_add_(0, batch, t)
        elif method == "torch-scatter_reduce":
            r = {"sum": "sum", "mean": "mean", "max": "amax"}[reduction]
            forward = lambda t: torch.zeros(graphs, d, device=device).scatter_reduce(
                0, index, t, reduce=r, include_self=False
            )
        elif method == "torch-segment_csr":
            try:
                import torch_scatter
            except Exception as e:
                raise NotImplementedError(f"torch_scatter does not import ({_one_line(e)})") from None
            forward = lambda t: torch_scatter.segment_csr(t, ptr, reduce=reduction)
        else:
            raise ValueError(f"unknown method {method!r}")
        return forward, x, reference, g, 4 * (n + graphs) * d


class CpuGnnPooling(_Gnn):
    """GNN readout on CPU tensors: sum/mean/max pooling of node rows per graph, forward and backward."""

    params = (
        GNN_METHODS,
        _shapes([*list(GNN_SIZES)[:2], "N=10M d=16 graphs=100k"], ("sum", "mean", "max")),
        ["float32"],
    )


class GpuGnnPooling(_Gnn):
    """GNN readout on CUDA tensors, the four sizes of ``linred bench --suite workloads``."""

    gpu = True
    params = (GNN_METHODS, _shapes(list(GNN_SIZES), ("sum", "mean", "max")), ["float32"])


# ---------------------------------------------------------------- embedding bags


class _EmbeddingBag(_Workload):
    def build(self, method: str, size: str, reduction: str) -> tuple[Any, ...]:
        torch, device = self.torch, self.device
        e, d, bags, mean = EMBEDDING_SIZES[size]
        e = _shrink(e, d, self.cap)
        bags = max(1, _shrink(bags * mean, d, self.cap) // mean)
        gen = torch.Generator(device=device).manual_seed(e + d + bags)
        lengths = (1 + torch.poisson(torch.full((bags,), mean - 1.0, device=device), generator=gen)).to(torch.int64)
        ptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), lengths.cumsum(0)])
        _, batch = _batch(torch, ptr)
        rows = int(ptr[-1])
        index = torch.randint(0, e, (rows,), generator=gen, device=device)
        weight = torch.randn(e, d, generator=gen, device=device)
        g = torch.randn(bags, d, generator=gen, device=device)

        def reference(backward: bool) -> tuple[Any, ...]:
            w64 = weight.to(torch.float64)
            y = _segment_reference(torch, w64[index], batch, lengths, reduction)
            if not backward:
                return (y,)
            g64 = g.to(torch.float64)
            grad_rows = g64[batch] if reduction == "sum" else (g64 / lengths.to(torch.float64)[:, None])[batch]
            return y, torch.zeros_like(w64).index_add_(0, index, grad_rows)

        if method == "linred-gather":
            fn = _linred("linred-auto", reduction)
            forward = lambda w: fn(w[index], offsets=ptr)
        elif method == "torch-embedding_bag":
            import torch.nn.functional as F

            starts = ptr[:-1].contiguous()
            forward = lambda w: F.embedding_bag(index, w, starts, mode=reduction)
        else:
            raise ValueError(f"unknown method {method!r}")
        return forward, weight, reference, g, 4 * (rows + bags) * d


class CpuEmbeddingBag(_EmbeddingBag):
    """Embedding-bag pooling on the CPU: ``F.embedding_bag`` against linred on ``weight[input]``."""

    params = (
        ["linred-gather", "torch-embedding_bag"],
        _shapes(list(EMBEDDING_SIZES)[:1], ("sum", "mean")),
        ["float32"],
    )


class GpuEmbeddingBag(_EmbeddingBag):
    """Embedding-bag pooling on CUDA tensors."""

    gpu = True
    params = (["linred-gather", "torch-embedding_bag"], _shapes(list(EMBEDDING_SIZES), ("sum", "mean")), ["float32"])


# ---------------------------------------------------------------- windowed time series


class _Windows(_Workload):
    def build(self, method: str, size: str, reduction: str) -> tuple[Any, ...]:
        torch, device = self.torch, self.device
        window = int(size.removeprefix("L="))
        n = min(self.cap, SERIES["gpu" if self.gpu else "cpu"]) // window * window
        x = torch.randn(n, generator=torch.Generator(device=device).manual_seed(window), device=device)

        def reference(backward: bool) -> tuple[Any, ...]:
            view = x.to(torch.float64).view(-1, window)
            return (view.mean(1) if reduction == "mean" else view.amax(1),)

        if method == "linred-auto":
            fn = _linred(method, reduction)
            forward = lambda t: fn(t, window)
        elif method == "torch-view":
            if reduction == "mean":
                forward = lambda t: t.view(-1, window).mean(1)
            else:
                forward = lambda t: t.view(-1, window).amax(1)
        elif method == "numpy-reshape":
            if self.gpu:
                raise NotImplementedError("NumPy runs on the host")
            xn = x.numpy()
            reduce = np.mean if reduction == "mean" else np.max
            forward = lambda t: reduce(xn.reshape(-1, window), axis=1)
        else:
            raise ValueError(f"unknown method {method!r}")
        return forward, x, reference, None, 4 * (n + n // window)


class CpuWindows(_Windows):
    """A 2^22-value float32 series on the CPU in windows of 60 or 1440 values."""

    params = (
        ["linred-auto", "torch-view", "numpy-reshape"],
        _shapes(["L=60", "L=1440"], ("mean", "max"), ("fwd",)),
        ["float32"],
    )


class GpuWindows(_Windows):
    """A 2^24-value float32 CUDA series in windows of 60 or 1440 values."""

    gpu = True
    params = (["linred-auto", "torch-view"], _shapes(["L=60", "L=1440"], ("mean", "max"), ("fwd",)), ["float32"])


# ---------------------------------------------------------------- graph attention (segment softmax)

#: (E edge scores, heads, destination nodes, the in-degree of one hub node, 0 for none): edges
#: sorted by destination, random in-degrees; a power-law graph's hub takes 7.5% of the edges
ATTENTION_SIZES = {
    "E=2M heads=8 nodes=62k": (2_000_000, 8, 62_500, 0),
    "E=64M heads=1 nodes=262k": (1 << 26, 1, 1 << 18, 0),
    "E=4M heads=1 nodes=250k hub=300k": (4_000_000, 1, 250_000, 300_000),
}
ATTENTION_METHODS = ["linred-auto", "linred-nocheck", "torch-segment_reduce", "torch-scatter_reduce"]


class _Attention(_Workload):
    """The softmax of each node's incoming edge scores (GAT's attention), and logsumexp, forward
    and forward + backward: ``linred.segmented_softmax`` / ``segmented_logsumexp`` (one kernel
    each way on the GPU), against the compositions users write: ``torch.segment_reduce`` max and
    sum with ``repeat_interleave``, and PyG's ``scatter_reduce`` + gather form (both with the
    maximum detached, as ``torch_geometric.utils.softmax`` takes it)."""

    def build(self, method: str, size: str, reduction: str) -> tuple[Any, ...]:
        torch, device = self.torch, self.device
        e, heads, nodes, hub = ATTENTION_SIZES[size]
        e_capped = _shrink(e, heads, self.cap)
        hub = hub * e_capped // e  # (the same share of the edges)
        e, nodes = e_capped, max(2, min(e_capped - 1, round(nodes * e_capped / e)))  # the same mean in-degree
        gen = torch.Generator(device=device).manual_seed(e + heads + nodes)
        if hub:  # (the other nodes' edges, and the hub's in the middle of them)
            ptr = _random_ptr(torch, e - hub, nodes - 1, gen, device)
            middle = (nodes - 1) // 2
            ptr = torch.cat([ptr[: middle + 1], ptr[middle:] + hub])
        else:
            ptr = _random_ptr(torch, e, nodes, gen, device)
        counts, batch = _batch(torch, ptr)
        scores = torch.randn(e, heads, generator=gen, device=device) * 3
        per_edge = reduction == "softmax"

        g = torch.randn((e if per_edge else nodes), heads, generator=gen, device=device)

        def compose(t: Any, dtype: Any) -> Any:  # the torch.segment_reduce composition, in dtype
            t = t.to(dtype)
            mx = torch.segment_reduce(t.detach(), "max", offsets=ptr, axis=0)
            ex = (t - mx.repeat_interleave(counts, dim=0, output_size=e)).exp()
            total = torch.segment_reduce(ex, "sum", offsets=ptr, axis=0)
            if per_edge:
                return ex / total.repeat_interleave(counts, dim=0, output_size=e)
            return total.log() + mx

        def reference(backward: bool) -> tuple[Any, ...]:
            s64 = scores.to(torch.float64).requires_grad_(backward)
            y = compose(s64, torch.float64)
            if not backward:
                return (y,)
            (grad,) = torch.autograd.grad(y, s64, g.to(torch.float64))
            return y.detach(), grad

        if method.startswith("linred-"):
            forward = _linred_composed(method, reduction, ptr)
        elif method == "torch-segment_reduce":
            forward = lambda t: compose(t, t.dtype)
        elif method == "torch-scatter_reduce":
            index = batch[:, None].expand(-1, heads)

            def forward(t: Any) -> Any:
                mx = torch.zeros(nodes, heads, device=device).scatter_reduce(
                    0, index, t.detach(), "amax", include_self=False
                )
                ex = (t - mx[batch]).exp()
                total = torch.zeros(nodes, heads, device=device).index_add_(0, batch, ex)
                return ex / total[batch] if per_edge else total.log() + mx
        else:
            raise ValueError(f"unknown method {method!r}")
        return forward, scores, reference, g, 4 * heads * (2 * e if per_edge else e + nodes)


class CpuAttention(_Attention):
    """Segment softmax and logsumexp of edge scores on CPU tensors, forward and forward + backward."""

    params = (ATTENTION_METHODS, _shapes(list(ATTENTION_SIZES), ("softmax", "logsumexp")), ["float32"])


class GpuAttention(_Attention):
    """Segment softmax and logsumexp of edge scores on CUDA tensors (linred: one kernel each way)."""

    gpu = True
    params = (ATTENTION_METHODS, _shapes(list(ATTENTION_SIZES), ("softmax", "logsumexp")), ["float32"])


# ---------------------------------------------------------------- per-graph spread (PNA's std aggregation)

#: (N rows, d features, segments): segments sorted, random sizes (mean N / segments)
SPREAD_SIZES = {
    "N=2M d=8 segments=62k": (2_000_000, 8, 62_500),
    "N=64M d=1 segments=262k": (1 << 26, 1, 1 << 18),
}
SPREAD_METHODS = ["linred-auto", "linred-nocheck", "torch-segment_reduce", "torch-index_add"]


class _Spread(_Workload):
    """The variance and standard deviation of each segment's rows (PNA's std aggregation, per-graph
    feature statistics), forward: ``linred.segmented_var`` / ``segmented_std`` (one kernel on the
    GPU), against the two-pass compositions users write: ``torch.segment_reduce`` mean and sum of
    the squared deviations with ``repeat_interleave``, and the ``index_add_`` form (as
    ``torch_scatter.scatter_std``)."""

    def build(self, method: str, size: str, reduction: str) -> tuple[Any, ...]:
        torch, device = self.torch, self.device
        n, d, segments = SPREAD_SIZES[size]
        n_capped = _shrink(n, d, self.cap)
        n, segments = n_capped, max(1, min(n_capped - 1, round(segments * n_capped / n)))  # the same mean size
        gen = torch.Generator(device=device).manual_seed(n + d + segments)
        ptr = _random_ptr(torch, n, segments, gen, device)
        counts, batch = _batch(torch, ptr)
        rows = torch.randn(n, d, generator=gen, device=device) * 3 + 10
        if d == 1:
            rows = rows[:, 0]
        std = reduction == "std"

        def finish(total: Any, dtype: Any) -> Any:
            var = total / counts.to(dtype).reshape((-1,) + (1,) * (total.dim() - 1))
            return var.sqrt() if std else var

        def compose(t: Any, dtype: Any) -> Any:  # the torch.segment_reduce composition, in dtype
            t = t.to(dtype)
            mean = torch.segment_reduce(t, "mean", offsets=ptr, axis=0)
            dev = t - mean.repeat_interleave(counts, dim=0, output_size=n)
            return finish(torch.segment_reduce(dev * dev, "sum", offsets=ptr, axis=0), dtype)

        def reference(backward: bool) -> tuple[Any, ...]:
            return (compose(rows, torch.float64),)

        if method.startswith("linred-"):
            forward = _linred_composed(method, reduction, ptr)
        elif method == "torch-segment_reduce":
            forward = lambda t: compose(t, t.dtype)
        elif method == "torch-index_add":
            shape = (segments, *rows.shape[1:])
            per_row = counts.to(rows.dtype).reshape((-1,) + (1,) * (rows.dim() - 1))

            def forward(t: Any) -> Any:
                mean = torch.zeros(shape, device=device).index_add_(0, batch, t) / per_row
                dev = t - mean[batch]
                return finish(torch.zeros(shape, device=device).index_add_(0, batch, dev * dev), t.dtype)
        else:
            raise ValueError(f"unknown method {method!r}")
        return forward, rows, reference, None, 4 * d * (n + segments)


class CpuSpread(_Spread):
    """var and std of each segment's rows on CPU tensors (composed from linred's reductions)."""

    params = (SPREAD_METHODS, _shapes(list(SPREAD_SIZES), ("var", "std"), ("fwd",)), ["float32"])


class GpuSpread(_Spread):
    """var and std of each segment's rows on CUDA tensors (linred: one kernel)."""

    gpu = True
    params = (SPREAD_METHODS, _shapes(list(SPREAD_SIZES), ("var", "std"), ("fwd",)), ["float32"])
