"""``linred bench --suite workloads``: what users run, beside the PyTorch idioms they would otherwise write.

Four workloads, all on PyTorch tensors (CUDA when there is a GPU, else the CPU):

``gnn``
    Graph pooling: an ``(N, d)`` float32 tensor of node rows and the CSR ``ptr``
    (offsets) of ``graphs`` graphs of random sizes (none empty), pooled with sum,
    mean and max, forward only and forward + backward (``x.grad = None;
    y = fn(x); y.backward(g)``).  Peers: ``torch.segment_reduce`` (as called,
    and with ``unsafe=True``, which skips its offsets check as ``check=False``
    skips linred's), ``torch.zeros(graphs, d).index_add_(0, batch, x)`` (sum;
    divided by the graph sizes for mean), ``torch.zeros(graphs, d).scatter_reduce(0,
    batch[:, None].expand(-1, d), x, reduce, include_self=False)`` and
    ``torch_scatter.segment_csr`` where it imports.  ``batch`` (the graph id of
    every row) and the expanded index are made once, outside the timed calls.
``attention``
    Graph attention: ``(E, heads)`` float32 edge scores sorted by destination node
    and the CSR ``ptr`` of ``nodes`` nodes' in-edges (random in-degrees, none
    zero), normalized by ``segmented_softmax`` per node, forward and forward +
    backward.  Peers: the composition of ``torch_geometric.utils.softmax``
    (``scatter_reduce`` amax of the detached scores, ``exp``, ``scatter_add``,
    ``index_select`` back to the edges, the division) written with PyTorch
    operations, ``torch_geometric.utils.softmax`` itself where it imports, and
    the same composition through ``torch.segment_reduce`` and
    ``repeat_interleave``.
``embedding``
    Embedding bags: ``F.embedding_bag(input, weight, offsets, mode)`` (sum,
    mean; forward and forward + backward to ``weight``) against linred on the
    gathered rows ``weight[input]``: the linred row *includes the gather*.  A
    further row, forward only, reduces rows gathered once outside the timed call
    (``reduce only``): not the same work, shown for what the reduction costs.
``windows``
    Windowed time series: a float32 1-D series cut into fixed windows of L = 60
    and 1440 values (mean, max) against ``x.view(-1, L).mean(1)`` /
    ``.amax(1)``, ``F.avg_pool1d`` / ``F.max_pool1d`` and, on the CPU, NumPy's
    ``x.reshape(-1, L).mean(1)`` / ``.max(1)`` and linred on the NumPy array.

Every method of a case is first run once and checked against a float64
reference computed by PyTorch on the same data (the result and, with backward,
the gradient: norm-wise relative error at most 1e-5); a method that fails is
reported WRONG and never timed.  The data of the GNN workload has no ties
within a column (every column is a permutation of distinct values), so the
gradient of max is one-hot whatever rule a method uses for ties.

Timing: on the GPU, CUDA events on PyTorch's current stream; on the CPU,
``time.perf_counter``.  After the correctness call and ``warmup`` untimed
calls, each method takes ``repeats`` samples (at least 7 by default); a sample
is ``calls`` back-to-back calls, enough to last about a millisecond, and gives
the time per call (on the GPU each sample follows about 3 ms of untimed calls of
the same method, so that the device runs at its steady clocks; see
:mod:`linred.bench.timing`).  The methods of a case take their samples in turns,
one sample of each per round in a shuffled order, so that a change of load
touches all of them alike.  On the GPU the small GNN sizes are also timed by the
host's wall clock with a synchronize after every call: the latency a caller
waits for one result.  After the samples each method is checked again (its last
result poisoned with NaN, then one more call).

A row is ``faster`` or ``slower`` than the best peer (the correct peer with the
lowest median) only when their ``[min, max]`` intervals do not overlap;
otherwise it is a ``tie``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import importlib.util
import math
import random
import statistics
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from linred.bench.data import is_out_of_memory
from linred.bench.report import dump_json
from linred.bench.runner import join_notes, short_error, wanted
from linred.bench.timing import HostClock, device_clock, lead_calls, take_sample, warm_up

__all__ = ["METHODS", "Method", "Row", "WCase", "WorkloadResult", "build_cases", "run", "run_cases"]

#: the workloads, in the order they run and print
WORKLOADS = ("gnn", "attention", "embedding", "windows")
TITLES = {
    "gnn": "GNN pooling: (N, d) float32 node rows, CSR ptr of `graphs` graphs of random sizes",
    "attention": "graph attention: softmax of (E, heads) float32 edge scores over each node's in-edges",
    "embedding": "embedding-bag pooling: bags of rows of an (E, D) float32 table",
    "windows": "windowed time series: float32 1-D series in fixed windows of L values",
}

#: norm-wise relative error against float64 above which a float32 result is WRONG
TOLERANCE = 1e-5
#: a sample batches calls up to this long; at most MAX_CALLS calls
MIN_SAMPLE_S = 1e-3
MAX_CALLS = 256

#: defaults per (device, quick)
DEFAULTS = {
    ("gpu", False): {"warmup": 3, "repeats": 10, "budget": 1.0, "max_time": 450.0},
    ("gpu", True): {"warmup": 2, "repeats": 7, "budget": 0.3, "max_time": 150.0},
    ("cpu", False): {"warmup": 2, "repeats": 7, "budget": 1.0, "max_time": 450.0},
    ("cpu", True): {"warmup": 1, "repeats": 7, "budget": 0.2, "max_time": 120.0},
}

#: GNN batches (N rows, d features, graphs), from a few small graphs to 100k of them
GNN_SIZES = [(2000, 64, 32), (50_000, 128, 256), (1_000_000, 128, 4096), (10_000_000, 16, 100_000)]
#: GNN sizes whose host latency (wall clock, synchronize after every call) is timed too, on the GPU
GNN_HOST_SIZES = 2
#: graph attention (E edges, heads, nodes): a small graph, a mid-size one, two large ones
ATTENTION_SIZES = [(20_000, 1, 2_000), (200_000, 8, 10_000), (2_000_000, 8, 62_500), (4_000_000, 1, 200_000)]
#: embedding bags (E table rows, D dim, bags, mean bag length)
EMBEDDING_SIZES = [
    (100_000, 64, 1024, 20),
    (1_000_000, 128, 8192, 32),
    (4_000_000, 64, 65536, 8),
    (1_000_000, 32, 4096, 512),
]
#: window lengths of the time series
WINDOWS = (60, 1440)
#: caps on values per tensor: N*d for GNN rows, E*D and gathered rows*D for embeddings; series length
CAPS = {
    ("gpu", False): {"values": None, "series": 1 << 24},
    ("gpu", True): {"values": 1 << 22, "series": 1 << 22},
    ("cpu", False): {"values": 1 << 22, "series": 1 << 22},
    ("cpu", True): {"values": 1 << 16, "series": 1 << 16},
}

_LINRED = {"sum": "segmented_sum", "mean": "segmented_mean", "max": "segmented_max", "softmax": "segmented_softmax"}


class Skip(Exception):
    """Raised by a method that cannot run here; recorded as ``skipped`` with the message."""


# ---------------------------------------------------------------- cases


def _fmt(k: int) -> str:
    """1000 -> 1k, 1_000_000 -> 1M, 32768 -> 2^15, 1500 -> 1500."""
    for div, suffix in ((1_000_000, "M"), (1000, "k")):
        if k >= div and k % div == 0:
            return f"{k // div}{suffix}"
    if k >= 1 << 15 and k & (k - 1) == 0:
        return f"2^{k.bit_length() - 1}"
    return str(k)


@dataclass(frozen=True)
class WCase:
    """One problem: a workload at one size, one reduction, forward only or forward + backward."""

    workload: str
    size: str
    reduction: str
    backward: bool
    params: tuple[tuple[str, int], ...]
    host_time: bool = False
    seed: int = 0

    @property
    def mode(self) -> str:
        return "fwd+bwd" if self.backward else "fwd"

    @property
    def name(self) -> str:
        return f"{self.workload} {self.size} {self.reduction} {self.mode}"

    @property
    def p(self) -> dict[str, int]:
        return dict(self.params)


def _shrink(rows: int, per_row: int, cap: int | None) -> int:
    return rows if cap is None or rows * per_row <= cap else max(1, cap // per_row)


def build_cases(device: str, quick: bool = False) -> list[WCase]:
    """Every case of the suite on ``device`` ("gpu" or "cpu"), sizes capped as ``CAPS`` says."""
    caps = CAPS[(device, quick)]
    cap = caps["values"]
    cases: list[WCase] = []
    seen: set[tuple[int, ...]] = set()
    for i, (n, d, graphs) in enumerate(GNN_SIZES):
        n2 = _shrink(n, d, cap)
        g2 = max(1, min(n2, round(graphs * n2 / n)))  # the same mean graph size
        if (n2, d) in seen:  # capped to the rows of a size before: run once
            continue
        seen.add((n2, d))
        size = f"N={_fmt(n2)} d={d} graphs={_fmt(g2)}"
        host = device == "gpu" and i < GNN_HOST_SIZES
        for backward in (False, True):
            for r in ("sum", "mean", "max"):
                cases.append(WCase("gnn", size, r, backward, (("n", n2), ("d", d), ("graphs", g2)), host, seed=i))
    for i, (e, heads, nodes) in enumerate(ATTENTION_SIZES):
        e2 = _shrink(e, heads, cap)
        n2 = max(1, min(e2, round(nodes * e2 / e)))  # the same mean in-degree
        if ("attention", e2, heads) in seen:
            continue
        seen.add(("attention", e2, heads))
        size = f"E={_fmt(e2)} heads={heads} nodes={_fmt(n2)}"
        host = device == "gpu" and i < GNN_HOST_SIZES
        for backward in (False, True):
            params = (("n", e2), ("d", heads), ("graphs", n2))
            cases.append(WCase("attention", size, "softmax", backward, params, host, seed=300 + i))
    for i, (e, dim, bags, mean) in enumerate(EMBEDDING_SIZES):
        e2 = _shrink(e, dim, cap)
        bags2 = max(1, _shrink(bags * mean, dim, cap) // mean)
        if (e2, dim, bags2, mean) in seen:
            continue
        seen.add((e2, dim, bags2, mean))
        size = f"E={_fmt(e2)} D={dim} bags={_fmt(bags2)} len={mean}"
        params = (("e", e2), ("d", dim), ("bags", bags2), ("mean", mean))
        for backward in (False, True):
            for r in ("sum", "mean"):
                cases.append(WCase("embedding", size, r, backward, params, seed=100 + i))
    n = caps["series"]
    for L in WINDOWS:
        size = f"n={_fmt(n // L * L)} L={L}"
        for r in ("mean", "max"):
            cases.append(WCase("windows", size, r, False, (("n", n // L * L), ("L", L)), seed=200))
    return cases


def select_cases(cases: list[WCase], patterns: str | None) -> list[WCase]:
    """Cases named by the comma-separated ``patterns`` (all if none).

    A pattern that is a case's whole name selects that case alone (``sum fwd`` without
    ``sum fwd+bwd``); any other selects every case whose name contains it.
    """
    if not patterns:
        return cases
    names = {c.name.lower() for c in cases}
    wanted = [p.strip().lower() for p in patterns.split(",") if p.strip()]

    def match(pattern: str, name: str) -> bool:
        return pattern == name if pattern in names else pattern in name

    return [c for c in cases if any(match(w, c.name.lower()) for w in wanted)]


# ---------------------------------------------------------------- data and references


class Data:
    """The tensors of one workload at one size, shared by its reductions and modes."""

    def __init__(self, case: WCase, device: str) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cuda" if device == "gpu" else "cpu")
        self.workload = case.workload
        self.p = case.p
        self.extras: dict[str, Any] = {}
        gen = torch.Generator(device=self.device).manual_seed(1234 + case.seed)
        getattr(self, f"_make_{case.workload}")(gen)

    def _segments(self, gen: Any, n: int, count: int) -> None:
        """CSR offsets ``ptr`` of ``count`` non-empty segments over ``n`` rows; ``batch``, ``counts``."""
        torch = self.torch
        if count > 1:
            cuts = torch.randperm(n - 1, generator=gen, device=self.device)[: count - 1] + 1
            cuts = cuts.sort().values
        else:
            cuts = torch.empty(0, dtype=torch.int64, device=self.device)
        zero = torch.zeros(1, dtype=torch.int64, device=self.device)
        end = torch.full((1,), n, dtype=torch.int64, device=self.device)
        self.ptr = torch.cat([zero, cuts, end])
        self.counts = self.ptr.diff()
        self.batch = torch.repeat_interleave(torch.arange(count, device=self.device), self.counts)
        self.max_length = int(self.counts.max())

    def _make_gnn(self, gen: Any) -> None:
        torch = self.torch
        n, d, graphs = self.p["n"], self.p["d"], self.p["graphs"]
        self._segments(gen, n, graphs)
        # Each column a permutation of n distinct values in (-1, 1): no ties, so the gradient
        # of max is one-hot whatever a method does with ties (float64 before the cast keeps
        # them distinct for n < 2^24).
        ranks = torch.rand(n, d, generator=gen, device=self.device).argsort(dim=0)
        self.x = ((ranks.to(torch.float64) + 0.5) * (2.0 / n) - 1.0).to(torch.float32)
        del ranks
        self.leaf = self.x
        self.index = self.batch[:, None].expand(-1, d)  # for scatter_reduce, made once
        self.grad_out = torch.randn(graphs, d, generator=gen, device=self.device)

    def _make_attention(self, gen: Any) -> None:
        torch = self.torch
        n, d, nodes = self.p["n"], self.p["d"], self.p["graphs"]
        self._segments(gen, n, nodes)
        self.x = 2 * torch.randn(n, d, generator=gen, device=self.device)
        self.leaf = self.x
        self.index = self.batch[:, None].expand(-1, d)  # for scatter_reduce, made once
        self.grad_out = torch.randn(n, d, generator=gen, device=self.device)

    def _make_embedding(self, gen: Any) -> None:
        torch = self.torch
        e, d, bags, mean = self.p["e"], self.p["d"], self.p["bags"], self.p["mean"]
        lengths = 1 + torch.poisson(torch.full((bags,), float(mean - 1), device=self.device), generator=gen)
        lengths = lengths.to(torch.int64)
        zero = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.ptr = torch.cat([zero, lengths.cumsum(0)])
        self.counts = lengths
        rows = int(self.ptr[-1])
        self.batch = torch.repeat_interleave(torch.arange(bags, device=self.device), lengths)
        self.max_length = int(lengths.max())
        self.starts = self.ptr[:-1].contiguous()  # embedding_bag's offsets: the start of each bag
        self.input = torch.randint(0, e, (rows,), generator=gen, device=self.device)
        self.weight = torch.randn(e, d, generator=gen, device=self.device)
        self.leaf = self.weight
        self.grad_out = torch.randn(bags, d, generator=gen, device=self.device)

    def _make_windows(self, gen: Any) -> None:
        torch = self.torch
        self.x = torch.randn(self.p["n"], generator=gen, device=self.device)
        self.leaf = self.x
        self.L = self.p["L"]
        self.max_length = self.L
        self.grad_out = None

    @property
    def segments(self) -> int:
        return self.p.get("graphs") or self.p.get("bags") or self.p["n"] // self.p["L"]

    def numpy(self) -> Any:
        """The series as a NumPy array sharing the tensor's memory (CPU only)."""
        return self.x.numpy()

    def gathered(self) -> Any:
        """``weight[input]``, made once (for the ``reduce only`` row)."""
        if "gathered" not in self.extras:
            self.extras["gathered"] = self.weight[self.input]
        return self.extras["gathered"]

    def reference(self, case: WCase) -> tuple[Any, ...]:
        """``(result,)`` or ``(result, gradient of the leaf)`` in float64, by PyTorch on the same data."""
        return getattr(self, f"_ref_{self.workload}")(case.reduction, case.backward)  # not kept: used once

    def _segment_ref(self, rows64: Any, reduction: str, backward: bool) -> tuple[Any, Any | None]:
        """Reduce float64 ``rows64`` by ``self.batch``; with ``backward``, the gradient of those rows."""
        torch = self.torch
        m = self.counts.shape[0]
        counts = self.counts.to(torch.float64)[:, None]
        out = torch.zeros(m, rows64.shape[1], dtype=torch.float64, device=self.device)
        if reduction == "max":
            index = self.batch[:, None].expand(-1, rows64.shape[1])
            y = out.scatter_reduce(0, index, rows64, reduce="amax", include_self=False)
        else:
            y = out.index_add_(0, self.batch, rows64)
            if reduction == "mean":
                y = y / counts
        if not backward:
            return y, None
        g = self.grad_out.to(torch.float64)
        if reduction == "sum":
            grad = g[self.batch]
        elif reduction == "mean":
            grad = (g / counts)[self.batch]
        else:
            hit = (rows64 == y[self.batch]).to(torch.float64)  # one-hot: the data has no ties
            grad = hit * g[self.batch]
        return y, grad

    def _ref_gnn(self, reduction: str, backward: bool) -> tuple[Any, ...]:
        y, grad = self._segment_ref(self.x.to(self.torch.float64), reduction, backward)
        return (y,) if grad is None else (y, grad)

    def _ref_attention(self, reduction: str, backward: bool) -> tuple[Any, ...]:
        torch = self.torch
        x64, batch, m = self.x.to(torch.float64), self.batch, self.counts.shape[0]
        zeros = torch.zeros(m, x64.shape[1], dtype=torch.float64, device=self.device)
        top = zeros.scatter_reduce(0, self.index, x64, reduce="amax", include_self=False)
        e = (x64 - top[batch]).exp()
        y = e / zeros.index_add(0, batch, e)[batch]
        if not backward:
            return (y,)
        g = self.grad_out.to(torch.float64)
        return y, y * (g - zeros.index_add(0, batch, g * y)[batch])

    def _ref_embedding(self, reduction: str, backward: bool) -> tuple[Any, ...]:
        torch = self.torch
        w64 = self.weight.to(torch.float64)
        y, grad_rows = self._segment_ref(w64[self.input], reduction, backward)
        if grad_rows is None:
            return (y,)
        grad = torch.zeros_like(w64).index_add_(0, self.input, grad_rows)
        return y, grad

    def _ref_windows(self, reduction: str, backward: bool) -> tuple[Any, ...]:
        view = self.x.to(self.torch.float64).view(-1, self.L)
        return (view.mean(1) if reduction == "mean" else view.amax(1),)

    def extra_note(self) -> str:
        if self.workload == "windows":
            return ""
        m = self.segments
        rows = int(self.ptr[-1])
        return f"mean length {rows / m:.1f}, max {self.max_length}"


# ---------------------------------------------------------------- methods


@dataclass(frozen=True)
class Method:
    """A way to compute a case: ``make(data, case)`` returns ``f(leaf) -> result`` (may raise :class:`Skip`).

    ``kind`` is ``"linred"`` or ``"peer"``; ``requires`` names modules that must import;
    ``backward`` says whether ``f`` is differentiable (forward-only methods are left out of
    forward + backward cases); ``devices`` where it runs; ``note`` is shown with its row.
    """

    name: str
    kind: str
    make: Callable[[Data, WCase], Callable[[Any], Any]]
    reductions: tuple[str, ...] = ("sum", "mean", "max")
    requires: tuple[str, ...] = ()
    backward: bool = True
    devices: tuple[str, ...] = ("gpu", "cpu")
    note: str = ""

    def applies(self, case: WCase, device: str) -> bool:
        return case.reduction in self.reductions and (self.backward or not case.backward) and device in self.devices


def _linred(check: bool = True, gather: bool = False, pregathered: bool = False) -> Callable[..., Any]:
    def make(data: Data, case: WCase) -> Callable[[Any], Any]:
        import linred

        fn = getattr(linred, _LINRED[case.reduction])
        kw = {} if check else {"check": False}
        if data.workload == "windows":
            L = data.L
            return lambda t: fn(t, L, **kw)
        ptr = data.ptr
        if pregathered:
            rows = data.gathered()
            return lambda t: fn(rows, offsets=ptr, **kw)
        if gather:
            index = data.input
            return lambda t: fn(t[index], offsets=ptr, **kw)
        return lambda t: fn(t, offsets=ptr, **kw)

    return make


def _linred_numpy(data: Data, case: WCase) -> Callable[[Any], Any]:
    import linred

    fn, xn, L = getattr(linred, _LINRED[case.reduction]), data.numpy(), data.L
    return lambda t: fn(xn, L)


def _segment_reduce(unsafe: bool = False, gather: bool = False) -> Callable[..., Any]:
    def make(data: Data, case: WCase) -> Callable[[Any], Any]:
        torch, ptr, r = data.torch, data.ptr, case.reduction
        kw = {"unsafe": True} if unsafe else {}
        if gather:
            index = data.input
            return lambda t: torch.segment_reduce(t[index], r, offsets=ptr, axis=0, **kw)
        return lambda t: torch.segment_reduce(t, r, offsets=ptr, axis=0, **kw)

    return make


def _index_add(data: Data, case: WCase) -> Callable[[Any], Any]:
    torch, batch, m, d = data.torch, data.batch, data.p["graphs"], data.p["d"]
    dev = data.device
    if case.reduction == "mean":
        counts = data.counts.to(torch.float32)[:, None]  # made once, as batch
        return lambda t: torch.zeros(m, d, device=dev).index_add_(0, batch, t) / counts
    return lambda t: torch.zeros(m, d, device=dev).index_add_(0, batch, t)


def _scatter_reduce(data: Data, case: WCase) -> Callable[[Any], Any]:
    torch, index, m, d = data.torch, data.index, data.p["graphs"], data.p["d"]
    dev, r = data.device, {"sum": "sum", "mean": "mean", "max": "amax"}[case.reduction]
    return lambda t: torch.zeros(m, d, device=dev).scatter_reduce(0, index, t, reduce=r, include_self=False)


def _segment_csr(data: Data, case: WCase) -> Callable[[Any], Any]:
    import torch_scatter

    ptr, r = data.ptr, case.reduction
    return lambda t: torch_scatter.segment_csr(t, ptr, reduce=r)


def _pyg_softmax(data: Data, case: WCase) -> Callable[[Any], Any]:
    """``torch_geometric.utils.softmax``'s composition, in PyTorch operations."""
    torch, index, batch, m, d, dev = data.torch, data.index, data.batch, data.p["graphs"], data.p["d"], data.device

    def softmax(t: Any) -> Any:
        top = torch.zeros(m, d, device=dev).scatter_reduce(0, index, t.detach(), reduce="amax", include_self=False)
        e = (t - top.index_select(0, batch)).exp()
        total = torch.zeros(m, d, device=dev).scatter_add(0, index, e) + 1e-16
        return e / total.index_select(0, batch)

    return softmax


def _tg_softmax(data: Data, case: WCase) -> Callable[[Any], Any]:
    from torch_geometric.utils import softmax

    ptr = data.ptr
    return lambda t: softmax(t, ptr=ptr)


def _segment_reduce_softmax(data: Data, case: WCase) -> Callable[[Any], Any]:
    torch, ptr, lengths, n = data.torch, data.ptr, data.counts, data.p["n"]

    def softmax(t: Any) -> Any:
        top = torch.segment_reduce(t.detach(), "max", offsets=ptr, axis=0)
        e = (t - top.repeat_interleave(lengths, dim=0, output_size=n)).exp()
        total = torch.segment_reduce(e, "sum", offsets=ptr, axis=0)
        return e / total.repeat_interleave(lengths, dim=0, output_size=n)

    return softmax


def _embedding_bag(data: Data, case: WCase) -> Callable[[Any], Any]:
    import torch.nn.functional as F

    index, starts, r = data.input, data.starts, case.reduction
    return lambda w: F.embedding_bag(index, w, starts, mode=r)


def _view(data: Data, case: WCase) -> Callable[[Any], Any]:
    L = data.L
    if case.reduction == "mean":
        return lambda t: t.view(-1, L).mean(1)
    return lambda t: t.view(-1, L).amax(1)


def _pool1d(data: Data, case: WCase) -> Callable[[Any], Any]:
    import torch.nn.functional as F

    L = data.L
    pool = F.avg_pool1d if case.reduction == "mean" else F.max_pool1d
    return lambda t: pool(t.view(1, 1, -1), L).view(-1)


def _numpy_reshape(data: Data, case: WCase) -> Callable[[Any], Any]:
    xn, L = data.numpy(), data.L
    if case.reduction == "mean":
        return lambda t: xn.reshape(-1, L).mean(1)
    return lambda t: xn.reshape(-1, L).max(1)


SR = ("sum", "mean")
#: the methods of each workload, linred's first; tests may add to these lists
METHODS: dict[str, list[Method]] = {
    "gnn": [
        Method("linred", "linred", _linred()),
        Method("linred check=False", "linred", _linred(check=False)),
        Method("torch.segment_reduce", "peer", _segment_reduce()),
        Method("torch.segment_reduce unsafe=True", "peer", _segment_reduce(unsafe=True)),
        Method("zeros.index_add_", "peer", _index_add, reductions=("sum",)),
        Method("zeros.index_add_ / sizes", "peer", _index_add, reductions=("mean",)),
        Method("zeros.scatter_reduce", "peer", _scatter_reduce),
        Method("torch_scatter.segment_csr", "peer", _segment_csr, requires=("torch_scatter",)),
    ],
    "attention": [
        Method("linred", "linred", _linred(), ("softmax",)),
        Method("linred check=False", "linred", _linred(check=False), ("softmax",)),
        Method("PyG composition (scatter_reduce)", "peer", _pyg_softmax, ("softmax",)),
        Method("torch_geometric.utils.softmax", "peer", _tg_softmax, ("softmax",), requires=("torch_geometric",)),
        Method("torch.segment_reduce composition", "peer", _segment_reduce_softmax, ("softmax",)),
    ],
    "embedding": [
        Method("linred weight[input]", "linred", _linred(gather=True), SR, note="includes the gather"),
        Method("linred weight[input] check=False", "linred", _linred(check=False, gather=True), SR),
        Method(
            "linred pre-gathered rows",
            "linred",
            _linred(pregathered=True),
            SR,
            backward=False,
            note="reduce only: gather not timed",
        ),
        Method("F.embedding_bag", "peer", _embedding_bag, SR),
        Method("torch.segment_reduce(weight[input])", "peer", _segment_reduce(gather=True), SR),
    ],
    "windows": [
        Method("linred", "linred", _linred(), ("mean", "max")),
        Method("linred (numpy array)", "linred", _linred_numpy, ("mean", "max"), backward=False, devices=("cpu",)),
        Method("torch x.view(-1, L).mean/amax(1)", "peer", _view, ("mean", "max")),
        Method("F.avg_pool1d / F.max_pool1d", "peer", _pool1d, ("mean", "max")),
        Method(
            "numpy x.reshape(-1, L).mean/max(1)",
            "peer",
            _numpy_reshape,
            ("mean", "max"),
            backward=False,
            devices=("cpu",),
        ),
    ],
}


# ---------------------------------------------------------------- results


@dataclass
class Stats:
    """Time per call of the samples of one row: median, min, max (seconds)."""

    samples: list[float] = field(default_factory=list)
    median: float | None = None
    min: float | None = None
    max: float | None = None
    calls: int = 0
    speedup: float | None = None  # best peer's median / this median
    verdict: str = ""  # best peer, faster, slower, tie

    def close(self) -> None:
        if self.samples:
            self.median = statistics.median(self.samples)
            self.min, self.max = min(self.samples), max(self.samples)


@dataclass
class Row:
    """One method on one case; ``status`` is ok, WRONG (never timed), refused, skipped or error."""

    name: str
    kind: str
    status: str = "ok"
    note: str = ""
    rel_err: float | None = None
    device: Stats = field(default_factory=Stats)
    host: Stats | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.device.median is not None


@dataclass
class WorkloadResult:
    """All rows of one case."""

    case: WCase
    status: str = "ok"
    note: str = ""
    rows: list[Row] = field(default_factory=list)
    wall_s: float = 0.0

    def best_peer(self, which: str = "device") -> Row | None:
        ok = [r for r in self.rows if r.kind == "peer" and r.ok and getattr(r, which) is not None]
        return min(ok, key=lambda r: getattr(r, which).median) if ok else None

    def rank(self) -> None:
        """Speedup and verdict of every row against the best peer, for each clock."""
        for which in ("device", "host"):
            best = self.best_peer(which)
            for r in self.rows:
                s = getattr(r, which)
                if s is None or not r.ok or best is None:
                    continue
                b = getattr(best, which)
                s.speedup = b.median / s.median
                if r is best:
                    s.verdict = "best peer"
                elif s.max < b.min:
                    s.verdict = "faster"
                elif s.min > b.max:
                    s.verdict = "slower"
                else:
                    s.verdict = "tie"


# ---------------------------------------------------------------- running


@dataclass
class Settings:
    device: str = "cpu"
    warmup: int = 2
    repeats: int = 7
    budget_s: float = 1.0
    deadline: float | None = None
    methods: str | None = None

    def wants(self, name: str) -> bool:
        return wanted(self.methods, name)

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


def _missing(names: tuple[str, ...]) -> str | None:
    for name in names:
        if importlib.util.find_spec(name) is None:
            return f"needs {name} (not installed)"
        try:
            importlib.import_module(name)
        except Exception as e:
            return f"needs {name} ({short_error(e, 120)})"
    return None


def _synced(fn: Callable[[], Any], torch: Any) -> Callable[[], Any]:
    def call() -> Any:
        out = fn()
        torch.cuda.synchronize()
        return out

    return call


def _as_tuple(out: Any) -> tuple[Any, ...]:
    return out if isinstance(out, tuple) else (out,)


def _check(torch: Any, out: Any, ref: tuple[Any, ...]) -> tuple[float | None, str | None]:
    """``(largest relative error, None)`` if every part of ``out`` matches ``ref``, else ``(error, why)``."""
    parts = _as_tuple(out)
    what = ("result", "gradient")
    if len(parts) != len(ref):
        return None, f"returned {len(parts)} value(s), expected {len(ref)}"
    worst = 0.0
    for name, o, r in zip(what[: len(ref)], parts, ref, strict=True):
        if o is None:
            return None, f"no {name} (not differentiable?)"
        try:
            o = torch.as_tensor(o)
        except Exception:
            return None, f"{name}: returned {type(o).__name__}, not an array"
        if tuple(o.shape) != tuple(r.shape):
            return None, f"{name}: shape {tuple(o.shape)}, expected {tuple(r.shape)}"
        o = o.detach().to(device=r.device, dtype=torch.float64)
        num = float(torch.linalg.vector_norm(o - r))
        den = float(torch.linalg.vector_norm(r))
        if not math.isfinite(num):
            return None, f"{name}: non-finite values"
        err = num / den if den > 0 else num
        if err > TOLERANCE:
            return err, f"{name}: relative error {err:.1e} > tolerance {TOLERANCE:.0e}"
        worst = max(worst, err)
    return worst, None


def _poison(torch: Any, out: Any, keep: set[int]) -> None:
    """Fill what a method returned with NaN: a method that stops writing its output must not pass.

    A result on the memory of an input (its data pointer in ``keep``) is left alone.
    """
    for part in _as_tuple(out):
        try:
            t = torch.as_tensor(part)
            if t.is_floating_point() and t.untyped_storage().data_ptr() not in keep:
                t.detach().fill_(math.nan)
        except Exception:
            pass


@dataclass
class _Timed:
    row: Row
    fn: Callable[[], Any]
    clock: Any
    calls: int
    lead: int
    host_fn: Callable[[], Any] | None = None
    host_calls: int = 0


class _Runner:
    def __init__(self, settings: Settings) -> None:
        import torch

        self.torch = torch
        self.settings = settings
        self.gpu = settings.device == "gpu"

    def sync(self) -> None:
        if self.gpu:
            self.torch.cuda.synchronize()

    def callable_for(self, f: Callable[[Any], Any], data: Data, case: WCase) -> Callable[[], Any]:
        """The timed call: ``f(leaf)``, or with backward ``leaf.grad = None; y = f(leaf); y.backward(g)``."""
        if not case.backward:
            leaf = data.leaf
            return lambda: f(leaf)
        leaf = data.leaf.detach().requires_grad_(True)  # each method its own leaf, on the same memory
        g = data.grad_out

        def forward_backward() -> tuple[Any, Any]:
            leaf.grad = None  # as optimizer.zero_grad() does by default
            y = f(leaf)
            y.backward(g)
            return y.detach(), leaf.grad

        return forward_backward

    def _plan(self, single: float) -> tuple[int, int]:
        """``(calls per sample, lead-in calls)``: a sample of about MIN_SAMPLE_S, all samples within the budget."""
        s = self.settings
        single = max(single, 1e-9)
        calls = max(1, min(MAX_CALLS, math.ceil(MIN_SAMPLE_S / single)))
        calls = max(1, min(calls, int(s.budget_s / (single * s.repeats))))
        return calls, (lead_calls(single) if self.gpu else 0)

    def begin(self, method: Method, data: Data, case: WCase, ref: tuple[Any, ...]) -> tuple[Row, _Timed | None]:
        """Build the method, check its first result, warm it up; None when it is not to be timed."""
        row = Row(method.name, method.kind, note=method.note)
        missing = _missing(method.requires)
        if missing:
            row.status, row.note = "skipped", missing
            return row, None
        if self.settings.out_of_time():
            row.status, row.note = "skipped", "time limit (--max-time) reached"
            return row, None
        f = None
        try:
            try:
                f = method.make(data, case)
                fn = self.callable_for(f, data, case)
                out = fn()
                self.sync()
            except Skip as e:
                row.status, row.note = "skipped", str(e)
                return row, None
            except Exception as e:
                # A backward that fails on a wrong forward (a wrong shape, no graph): the forward is WRONG.
                err, wrong = self._forward(f, data, ref) if case.backward and f is not None else (None, None)
                if wrong is None:
                    raise
                row.rel_err = err
                row.status, row.note = "WRONG", join_notes(f"{wrong} (backward: {short_error(e, 80)})", row.note)
                return row, None
            row.rel_err, wrong = _check(self.torch, out, ref)
            out = None
            if wrong:
                row.status, row.note = "WRONG", join_notes(wrong, row.note)
                return row, None
            clock = device_clock("torch") if self.gpu else HostClock()
            single, _ = warm_up(fn, clock, max(1, self.settings.warmup - 1))
            calls, lead = self._plan(single)
            timed = _Timed(row, fn, clock, calls, lead)
            if self.gpu and case.host_time:
                host_fn = _synced(fn, self.torch)
                single_host, _ = warm_up(host_fn, HostClock(), 1)
                timed.host_fn, timed.host_calls = host_fn, self._plan(single_host)[0]
                row.host = Stats()
            return row, timed
        except Exception as e:
            self._fail(row, e)
            return row, None

    def _forward(self, f: Callable[[Any], Any], data: Data, ref: tuple[Any, ...]) -> tuple[float | None, str | None]:
        """The check of the forward alone of ``f``: ``(error, why it is wrong or None)``; None, None if it raises."""
        try:
            with self.torch.no_grad():
                out = f(data.leaf)
            self.sync()
            return _check(self.torch, out, ref[:1])
        except Exception:
            return None, None

    @staticmethod
    def _fail(row: Row, e: BaseException) -> None:
        from linred.errors import BackendError

        if isinstance(e, BackendError):
            row.status, row.note = "refused", join_notes(e.reason, row.note)
        else:
            row.status = "skipped" if is_out_of_memory(e) else "error"
            row.note = join_notes(short_error(e, 240), row.note)
        row.device = Stats()
        row.host = None

    def sample(self, timed: list[_Timed]) -> None:
        """``repeats`` samples of every method, one of each per round, rounds in shuffled orders."""
        shuffle = random.Random(0).shuffle
        active = list(timed)
        enabled = gc.isenabled()
        gc.disable()  # as timeit does: a collection inside a sample is noise
        try:
            for _ in range(self.settings.repeats):
                order = list(active)
                shuffle(order)
                for t in order:
                    try:
                        seconds, _, _ = take_sample(t.fn, t.clock, t.calls, t.lead)
                        t.row.device.samples.append(seconds)
                        if t.host_fn is not None:
                            wall, _, _ = take_sample(t.host_fn, HostClock(), t.host_calls)
                            t.row.host.samples.append(wall)
                    except Exception as e:
                        self._fail(t.row, e)
                        active.remove(t)
        finally:
            if enabled:
                gc.enable()

    def finish(self, t: _Timed, ref: tuple[Any, ...], keep: set[int]) -> None:
        """Check once more (the last result poisoned first), then close the statistics."""
        row = t.row
        if row.status != "ok":
            return
        try:
            out = t.fn()
            self.sync()
            _poison(self.torch, out, keep)
            out = None
            out = t.fn()
            self.sync()
            _, wrong = _check(self.torch, out, ref)
            out = None
            if wrong:
                row.status, row.note = "WRONG", join_notes(f"after repeated calls: {wrong}", row.note)
                row.device, row.host = Stats(), None
                return
            row.device.calls = t.calls
            row.device.close()
            if row.host is not None:
                row.host.calls = t.host_calls
                row.host.close()
        except Exception as e:
            self._fail(row, e)
        finally:
            t.fn = t.host_fn = None

    def methods_for(self, case: WCase) -> list[Method]:
        return [
            m for m in METHODS[case.workload] if m.applies(case, self.settings.device) and self.settings.wants(m.name)
        ]

    def run_case(self, case: WCase, data: Data, progress: Callable[[str], None]) -> WorkloadResult:
        result = WorkloadResult(case)
        t0 = time.monotonic()
        timed: list[_Timed] = []
        try:
            if self.settings.out_of_time():
                result.status, result.note = "skipped", "time limit (--max-time) reached"
                return result
            try:
                ref = data.reference(case)
                result.note = data.extra_note()
            except Exception as e:
                result.status = "skipped"
                result.note = ("out of memory: " if is_out_of_memory(e) else "could not set up: ") + short_error(e, 240)
                return result
            for method in self.methods_for(case):
                progress(method.name)
                row, t = self.begin(method, data, case, ref)
                result.rows.append(row)
                if t is not None:
                    timed.append(t)
            progress("timing, interleaved")
            self.sample(timed)
            keep = {v.untyped_storage().data_ptr() for v in vars(data).values() if hasattr(v, "untyped_storage")}
            for t in timed:
                self.finish(t, ref, keep)
            result.rank()
        finally:
            timed.clear()
            result.wall_s = time.monotonic() - t0
        return result


def _groups(cases: list[WCase]) -> Iterator[tuple[tuple[str, str], list[WCase]]]:
    """Consecutive cases that share data (one workload at one size)."""
    key, group = None, []
    for c in cases:
        k = (c.workload, c.size)
        if k != key and group:
            yield key, group
            group = []
        key = k
        group.append(c)
    if group:
        yield key, group


def run_cases(
    cases: list[WCase],
    settings: Settings,
    *,
    on_method: Callable[[WCase, str], None] | None = None,
    on_case: Callable[[WorkloadResult], None] | None = None,
) -> list[WorkloadResult]:
    """Run ``cases`` in order (each size's data made once for its cases); the callbacks report progress."""
    runner = _Runner(settings)
    results: list[WorkloadResult] = []

    def done(r: WorkloadResult) -> None:
        results.append(r)
        if on_case:
            on_case(r)

    for _, group in _groups(cases):
        data = None
        try:
            if settings.out_of_time():
                raise TimeoutError("time limit (--max-time) reached")
            data = Data(group[0], settings.device)
        except Exception as e:
            if isinstance(e, TimeoutError):
                why = str(e)
            else:
                why = ("out of memory: " if is_out_of_memory(e) else "") + short_error(e, 240)
            for c in group:
                done(WorkloadResult(c, status="skipped", note=why))
            continue
        try:
            for c in group:
                done(runner.run_case(c, data, lambda name, c=c: on_method and on_method(c, name)))
        finally:
            data = None
            gc.collect()
            if settings.device == "gpu":
                runner.torch.cuda.empty_cache()  # the next size's tensors may need it all
    return results


# ---------------------------------------------------------------- reporting

WIDTH = 120


def _us(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    us = seconds * 1e6
    if us < 10:
        return f"{us:.2f}"
    if us < 1000:
        return f"{us:.1f}"
    return f"{us:.0f}"


def _clip(text: str, width: int = WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


_ROW = "{mark:<2}{name:<36} {median:>10}  {span:<22} {ratio:>7}  {verdict}"


def _stats_rows(result: WorkloadResult, which: str) -> list[str]:
    lines = []
    best = result.best_peer(which)
    order = {"ok": 0, "WRONG": 1, "error": 2, "refused": 3, "skipped": 4}

    def key(r: Row) -> tuple:
        s = getattr(r, which)
        return (order.get(r.status, 9), s.median if s is not None and s.median is not None else math.inf)

    for r in sorted(result.rows, key=key):
        s = getattr(r, which)
        mark = "+" if r is best else "*" if r.kind == "linred" else ""
        if r.ok and s is not None and s.median is not None:
            ratio = f"{s.speedup:.2f}x" if s.speedup is not None else "-"
            verdict = s.verdict or "-"
            if r.note:
                verdict += f" ({r.note})"
            line = _ROW.format(
                mark=mark,
                name=_clip(r.name, 36),
                median=_us(s.median),
                span=f"[{_us(s.min)}, {_us(s.max)}]",
                ratio=ratio,
                verdict=verdict,
            )
        elif which == "host":
            continue
        else:
            line = f"{mark:<2}{_clip(r.name, 36):<36} {r.status}: {r.note}"
        lines.append(_clip(line))
    return lines


def format_header(meta: dict[str, Any]) -> str:
    """Date, device, versions and how the numbers were taken."""
    s = meta["settings"]
    gpu_run = meta["device"] == "gpu"
    lines = [f"linred bench --suite workloads, {meta['date']}, on {meta['host']}"]
    gpu = meta.get("gpu")
    if gpu_run and gpu:
        lines.append(
            f"device: {gpu.get('name', '?')} (compute capability {gpu.get('compute_capability')}, "
            f"{gpu.get('memory_gib', '?')} GiB), torch built for CUDA {gpu.get('cuda')}"
        )
    else:
        cpu = meta.get("cpu", {})
        lines.append(
            f"device: CPU {cpu.get('processor', '?')} ({cpu.get('cores')} cores, torch {s['torch_threads']} threads)"
        )
    versions = [f"{k} {v}" for k, v in meta["versions"].items() if v and k != "matplotlib"]
    text = [
        "versions: " + ", ".join(versions),
        f"timing: {'CUDA events on the current torch stream' if gpu_run else 'perf_counter'}; "
        f"{s['warmup']} warm-up call(s), then {s['repeats']} samples per method, taken in turns (one sample of "
        "each method per round, in a shuffled order); a sample is back-to-back calls up to ~1 ms"
        + (", after ~3 ms of untimed calls" if gpu_run else "")
        + "; shown: time per call, median [min, max] over the samples, in µs",
        "speedup = best peer's median / the row's median; faster or slower only when the [min, max] intervals "
        "do not overlap, else tie",
        "every result (and gradient) is checked against float64 PyTorch on the same data before and after "
        f"timing (rel err <= {TOLERANCE:.0e}); WRONG is never timed",
        "* linred row, + best peer; fwd+bwd = leaf.grad = None; y = f(leaf); y.backward(g)",
    ]
    load, cores = meta.get("load_average"), meta.get("cpu", {}).get("cores") or 1
    if not gpu_run and load and load[0] > 0.5 * cores:
        text.append(
            f"WARNING: load average {load[0]:.1f} on {cores} cores when the run began: other processes compete "
            "for the CPU (and torch's threads); these figures are noisy"
        )
    for t in text:
        lines += textwrap.wrap(t, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join(lines)


def format_tables(results: list[WorkloadResult]) -> str:
    lines: list[str] = []
    head = _ROW.format(
        mark="", name="method", median="median µs", span="[min, max]", ratio="speedup", verdict="vs best peer"
    )
    workload = None
    for r in results:
        c = r.case
        if c.workload != workload:
            workload = c.workload
            lines += ["", "=" * WIDTH, TITLES[workload], "=" * WIDTH]
        lines.append("")
        lines.append(_clip(f"{c.name}" + (f"  ({r.note})" if r.note and r.status == "ok" else "")))
        if r.status != "ok":
            lines.append(_clip(f"   {r.status}: {r.note}"))
            continue
        lines.append(head)
        lines += _stats_rows(r, "device")
        if any(row.host is not None and row.ok for row in r.rows):
            lines.append("   host latency per call (wall clock, torch.cuda.synchronize() after every call):")
            lines += _stats_rows(r, "host")
    return "\n".join(lines)


def format_summary(results: list[WorkloadResult]) -> str:
    lines = ["Summary: linred (default arguments) against the best peer, per case"]
    fmt = "{case:<50} {linred:>9} {peer:<32} {best:>9} {ratio:>7}  {verdict}"
    lines.append(
        fmt.format(case="case", linred="linred µs", peer="best peer", best="peer µs", ratio="speedup", verdict="")
    )
    counts = {"faster": 0, "tie": 0, "slower": 0}
    for r in results:
        if r.status != "ok":
            lines.append(_clip(f"{r.case.name:<50} {r.status}: {r.note}"))
            continue
        lin = next((x for x in r.rows if x.kind == "linred"), None)
        best = r.best_peer()
        ok = lin is not None and lin.ok
        verdict = lin.device.verdict if ok else (lin.status if lin else "-")
        if verdict in counts:
            counts[verdict] += 1
        lines.append(
            _clip(
                fmt.format(
                    case=_clip(r.case.name, 50),
                    linred=_us(lin.device.median) if ok else "-",
                    peer=_clip(best.name, 32) if best else "-",
                    best=_us(best.device.median) if best else "-",
                    ratio=f"{lin.device.speedup:.2f}x" if ok and lin.device.speedup else "-",
                    verdict=verdict,
                )
            )
        )
    lines.append(f"linred faster in {counts['faster']}, tie in {counts['tie']}, slower in {counts['slower']} case(s)")
    return "\n".join(lines)


def to_json(meta: dict[str, Any], results: list[WorkloadResult]) -> dict[str, Any]:
    cases = []
    for r in results:
        c = r.case
        best, host_best = r.best_peer(), r.best_peer("host")
        cases.append(
            {
                "workload": c.workload,
                "name": c.name,
                "size": c.size,
                "reduction": c.reduction,
                "mode": c.mode,
                "params": c.p,
                "host_time": c.host_time,
                "status": r.status,
                "note": r.note,
                "wall_seconds": r.wall_s,
                "best_peer": best.name if best else None,
                "host_best_peer": host_best.name if host_best else None,
                "methods": [asdict(row) for row in r.rows],
            }
        )
    return {"suite": "workloads", "units": "seconds per call", "meta": meta, "cases": cases}


def write_json(path: str, meta: dict[str, Any], results: list[WorkloadResult]) -> None:
    dump_json(path, to_json(meta, results))


def write_plot(path: str, meta: dict[str, Any], results: list[WorkloadResult]) -> None:
    """Per workload, the speedup of every method against the best peer (log scale), case by case."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    shown = [r for r in results if r.status == "ok"]
    workloads = [w for w in WORKLOADS if any(r.case.workload == w for r in shown)]
    fig = Figure(
        figsize=(
            max(10.0, 0.45 * max((sum(r.case.workload == w for r in shown) for w in workloads), default=1) + 6),
            4.5 * max(1, len(workloads)),
        )
    )
    FigureCanvasAgg(fig)
    markers = "osD^v<>pPXh*d"
    for i, w in enumerate(workloads):
        ax = fig.add_subplot(len(workloads), 1, i + 1)
        rs = [r for r in shown if r.case.workload == w]
        names: list[str] = []
        for r in rs:
            for row in r.rows:
                if row.ok and row.name not in names:
                    names.append(row.name)
        xs = list(range(len(rs)))
        for j, name in enumerate(names):
            ys = []
            for r in rs:
                row = next((x for x in r.rows if x.name == name and x.ok), None)
                ys.append(row.device.speedup if row is not None and row.device.speedup else math.nan)
            linred_row = name.startswith("linred")
            style = (
                {"linewidth": 2.0, "marker": markers[j % len(markers)]}
                if linred_row
                else {"linestyle": ":", "marker": markers[j % len(markers)], "linewidth": 1.0, "alpha": 0.8}
            )
            ax.plot(xs, ys, label=name, **style)
        ax.axhline(1.0, color="grey", linewidth=1.0)
        ax.set_yscale("log")
        ax.set_xticks(xs, [r.case.name.removeprefix(w + " ") for r in rs], rotation=40, ha="right", fontsize="small")
        ax.set_ylabel("best peer time / method time")
        ax.set_title(TITLES[w], fontsize="medium")
        ax.grid(axis="y", alpha=0.3, which="both")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    where = meta.get("gpu", {}).get("name") if meta["device"] == "gpu" else meta.get("cpu", {}).get("processor")
    fig.suptitle(f"linred bench --suite workloads: {where or meta['device']}, {meta['date'][:10]} (above 1: faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")


# ---------------------------------------------------------------- the command


def _device(requested: str) -> tuple[str | None, str]:
    if importlib.util.find_spec("torch") is None:
        return None, "the workloads suite needs PyTorch (pip install torch)"
    import torch

    if requested == "cpu":
        return "cpu", ""
    if torch.cuda.is_available():
        return "gpu", ""
    why = "torch.cuda.is_available() is False"
    return (None, f"--device gpu, but {why}") if requested == "gpu" else ("cpu", why)


def _meta(device: str, settings: dict[str, Any], date: datetime.datetime) -> dict[str, Any]:
    import torch

    from linred.bench.meta import collect

    meta = collect("cpu", settings)  # the CPU part; the GPU's from torch (CuPy is not needed here)
    meta["device"] = device
    meta["date"] = date.isoformat(timespec="seconds")
    meta["suite"] = "workloads"
    if importlib.util.find_spec("torch_scatter") is not None:
        from linred.bench.meta import _version

        meta["versions"]["torch_scatter"] = _version("torch-scatter", "torch_scatter")
    if device == "gpu":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        meta["gpu"] = {
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
        }
    return meta


def run(args: argparse.Namespace) -> int:
    """Run the suite; 0, 1 if a linred row gave a wrong result, 2 for a usage error."""
    started = time.monotonic()
    date = datetime.datetime.now(datetime.timezone.utc)
    if getattr(args, "n", None):
        print(
            "linred bench: --n sets the bandwidth suite's buffer; the workloads suite has its own sizes "
            "(--quick shrinks them)",
            file=sys.stderr,
        )
        return 2
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print(
            "linred bench: --plot needs matplotlib, which is not installed: pip install 'linred[bench]' "
            "(or pip install matplotlib)",
            file=sys.stderr,
        )
        return 2
    device, why = _device(args.device)
    if device is None and args.list and args.device == "gpu" and importlib.util.find_spec("torch"):
        device = "gpu"  # listing runs nothing: the GPU's cases can be listed anywhere
    if device is None:
        print(f"linred bench: {why}", file=sys.stderr)
        return 2
    quick = bool(args.quick)
    all_cases = build_cases(device, quick)
    cases = select_cases(all_cases, args.cases)
    if args.list:
        for c in cases:
            print(f"{c.workload:<10} {c.name}")
        return 0
    if not cases:
        print(
            f"linred bench: no workload case matches --cases {args.cases!r}; workloads: {', '.join(WORKLOADS)}",
            file=sys.stderr,
        )
        return 2
    d = DEFAULTS[(device, quick)]
    max_time = d["max_time"] if args.max_time is None else args.max_time
    import torch

    settings = Settings(
        device=device,
        warmup=args.warmup or d["warmup"],
        repeats=args.repeats or d["repeats"],
        budget_s=args.budget or d["budget"],
        deadline=started + max_time if max_time and max_time > 0 else None,
        methods=args.methods,
    )
    settings_meta = {
        "suite": "workloads",
        "quick": quick,
        "warmup": settings.warmup,
        "repeats": settings.repeats,
        "budget_s": settings.budget_s,
        "max_time_s": max_time,
        "min_sample_s": MIN_SAMPLE_S,
        "cases": args.cases,
        "methods": args.methods,
        "interleaved": True,
        "tolerance": TOLERANCE,
        "torch_threads": torch.get_num_threads(),
    }
    if why and args.device == "auto":
        print(f"linred bench: running on the CPU ({why})", file=sys.stderr)
    meta = _meta(device, settings_meta, date)
    results: list[WorkloadResult] = []
    progress = not args.no_progress

    def on_case(r: WorkloadResult) -> None:
        results.append(r)
        if progress:
            lin = next((x for x in r.rows if x.kind == "linred"), None)
            best = r.best_peer()
            text = f"[{len(results)}/{len(cases)}] {r.case.name}: {r.status}"
            if lin is not None and lin.ok:
                text += f", linred {_us(lin.device.median)} µs"
            elif lin is not None:
                text += f", linred {lin.status}"
            if best is not None:
                text += f", best peer {best.name} {_us(best.device.median)} µs"
            print(f"{text} ({r.wall_s:.1f} s)", file=sys.stderr, flush=True)
        if args.json:  # keep the file current: a run cut short still leaves its numbers
            write_json(args.json, meta, results)

    run_cases(cases, settings, on_case=on_case)
    meta["wall_seconds"] = round(time.monotonic() - started, 1)
    print(format_header(meta))
    print(format_tables(results))
    print()
    print(format_summary(results))
    if args.json:
        write_json(args.json, meta, results)
        print(f"\nwrote {args.json}")
    if args.plot:
        try:
            write_plot(args.plot, meta, results)
            print(f"wrote {args.plot}")
        except Exception as e:
            print(f"linred bench: no plot ({type(e).__name__}: {e})", file=sys.stderr)
    wrong = [
        f"{r.case.name}: {row.name}"
        for r in results
        for row in r.rows
        if row.kind == "linred" and row.status == "WRONG"
    ]
    if wrong:
        print(f"\nlinred gave WRONG results: {'; '.join(wrong)}", file=sys.stderr)
        return 1
    return 0
