"""Forward + backward of the softmax family and var for PyTorch tensors, default arguments.

Graph attention normalizes edge scores per destination node with a segmented softmax, and
trains through it.  For ``segmented_softmax``, ``segmented_log_softmax``,
``segmented_logsumexp`` and ``segmented_var`` of float32 tensors that require grad, over
random CSR offsets (every segment non-empty), this times one training step's share,
``x.grad = None; f(x).backward(g)``, and the forward alone under ``torch.no_grad()``, against
the compositions users write today: the ``scatter_reduce`` + ``index_select`` form of
``torch_geometric.utils.softmax`` (softmax) and ``torch.segment_reduce`` with
``repeat_interleave`` (the others).  Before timing, each composition's result and gradient are
compared with linred's (a row is marked ``DIFFERS`` otherwise).

Every row is timed warm in this process on the same tensors: ``--samples`` samples of ``k``
back-to-back steps (``k`` chosen so that a sample lasts about 3 ms), reported as the median
with the min and max per step; on the GPU with CUDA events around the steps ("device") and
again with a synchronization after every step ("host").

    python tools/fused_backward.py            # CPU tensors, small cases
    python tools/fused_backward.py --gpu      # CUDA tensors, the four cases below
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import linred

#: (edges, segments, heads): a small graph, a mid-size one with 8 heads, and two large ones
CASES = ((20_000, 2_000, 1), (200_000, 10_000, 8), (2_000_000, 62_500, 8), (4_000_000, 200_000, 1))
FUNCTIONS = ("softmax", "log_softmax", "logsumexp", "var")


def _compositions(torch: Any, ptr: Any, m: int, shape: tuple[int, ...]) -> dict[str, tuple[str, Callable]]:
    """The peers: what users write today, differentiable."""
    dev = ptr.device
    lengths = ptr.diff()
    n, features = shape[0], shape[1:]
    index = torch.repeat_interleave(torch.arange(m, device=dev), lengths, output_size=n)
    wide = index.view(-1, *([1] * len(features))).expand(shape)

    def spread(r: Any) -> Any:
        return r.repeat_interleave(lengths, dim=0, output_size=n)

    def pyg_softmax(s: Any) -> Any:
        top = torch.zeros((m, *features), device=dev).scatter_reduce(0, wide, s, "amax", include_self=False)
        e = (s - top.index_select(0, index)).exp()
        total = torch.zeros((m, *features), device=dev).scatter_add(0, wide, e) + 1e-16
        return e / total.index_select(0, index)

    def log_softmax(s: Any) -> Any:
        d = s - spread(torch.segment_reduce(s.detach(), "max", offsets=ptr, axis=0))
        return d - spread(torch.segment_reduce(d.exp(), "sum", offsets=ptr, axis=0).log())

    def logsumexp(s: Any) -> Any:
        top = torch.segment_reduce(s.detach(), "max", offsets=ptr, axis=0)
        return torch.segment_reduce((s - spread(top)).exp(), "sum", offsets=ptr, axis=0).log() + top

    def var(s: Any) -> Any:
        d = s - spread(torch.segment_reduce(s, "mean", offsets=ptr, axis=0))
        count = lengths.to(s.dtype).view(-1, *([1] * len(features)))
        return torch.segment_reduce(d * d, "sum", offsets=ptr, axis=0) / count

    composed = "torch.segment_reduce composition"
    return {"softmax": ("PyG softmax (scatter_reduce)", pyg_softmax), "log_softmax": (composed, log_softmax),
            "logsumexp": (composed, logsumexp), "var": (composed, var)}  # fmt: skip


def _timer(torch: Any, gpu: bool, samples: int) -> Callable[[Callable[[], Any]], tuple[list[float], list[float]]]:
    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    def run(step: Callable[[], Any]) -> tuple[list[float], list[float]]:
        for _ in range(3):
            step()
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        k = max(3, min(200, int(3e-3 / max(time.perf_counter() - t0, 1e-6))))
        device, host = [], []
        for _ in range(samples):
            if gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(k):
                    step()
                end.record()
                end.synchronize()
                device.append(start.elapsed_time(end) / k * 1e3)
            t0 = time.perf_counter()
            for _ in range(k):
                step()
                sync()
            host.append((time.perf_counter() - t0) / k * 1e6)
        return device, host

    return run


def _show(times: list[float]) -> str:
    return f"{statistics.median(times):9.1f} [{min(times):.1f}, {max(times):.1f}]" if times else " " * 9 + "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="CUDA tensors (default: CPU tensors, the small case)")
    parser.add_argument("--samples", type=int, default=9, help="samples per row")
    parser.add_argument("--functions", nargs="+", default=list(FUNCTIONS), choices=FUNCTIONS)
    parser.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True, help="time the compositions")
    args = parser.parse_args(argv)
    import torch

    device = "cuda" if args.gpu else "cpu"
    timer = _timer(torch, args.gpu, args.samples)
    print(f"linred {linred.__version__} ({linred.__file__}), torch {torch.__version__}, {device}; µs per step, "
          f"median [min, max] of {args.samples} samples")  # fmt: skip
    for n, m, heads in CASES if args.gpu else CASES[:1]:
        rng = np.random.default_rng(0)
        ptr = torch.tensor(np.r_[0, np.sort(rng.choice(np.arange(1, n), m - 1, replace=False)), n], device=device)
        shape = (n,) if heads == 1 else (n, heads)
        x = torch.randn(shape, device=device, generator=torch.Generator(device).manual_seed(0), requires_grad=True)
        peers = _compositions(torch, ptr, m, shape) if args.peers else {}
        for name in args.functions:
            f = getattr(linred, f"segmented_{name}")
            y = f(x, offsets=ptr)
            g = torch.randn_like(y)
            rows = [("linred", lambda s, f=f, ptr=ptr: f(s, offsets=ptr))]
            if name in peers:
                label, peer = peers[name]
                (g1,) = torch.autograd.grad(y, x, g)
                y2 = peer(x)
                (g2,) = torch.autograd.grad(y2, x, g)
                same = torch.allclose(y, y2, rtol=1e-4, atol=1e-5) and torch.allclose(g1, g2, rtol=1e-3, atol=1e-5)
                rows.append((label if same else f"{label} DIFFERS", peer))
            for label, h in rows:

                def step(h: Callable = h, x: Any = x, g: Any = g) -> None:
                    x.grad = None
                    h(x).backward(g)

                def forward(h: Callable = h, x: Any = x) -> None:
                    with torch.no_grad():
                        h(x)

                d1, h1 = timer(step)
                d2, h2 = timer(forward)
                what = f"{n:>9,} x {heads} in {m:>7,} {name:11s} {label:34s}"
                print(f"{what} fwd+bwd device {_show(d1)} host {_show(h1)} | fwd device {_show(d2)} host {_show(h2)}",
                      flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
