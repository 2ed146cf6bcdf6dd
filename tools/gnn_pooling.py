"""GNN pooling per call on a GPU: host latency and device time, linred against torch.segment_reduce.

For each (N rows, d features, graphs) size, float32 CUDA tensors with an evenly spaced
``ptr``, in this process, on the same tensors:

- host time per call without and with ``torch.cuda.synchronize()`` after every call (median of
  5 batches of 5,000 calls, with the min and max);
- device time per call: 50 calls captured into a CUDA graph, replayed 5 times (median), which
  leaves the host out; a call that cannot be captured (one that reads back on the host) says so.

    python tools/gnn_pooling.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

import linred

SIZES = ((2000, 64, 32), (50_000, 128, 256), (1_000_000, 128, 4096))


def host_time(fn: Callable[[], object], number: int = 5000) -> str:
    """Median [min, max] µs per call over 5 batches of ``number`` calls (after a warm-up)."""
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / number * 1e6)
    times.sort()
    return f"{times[2]:7.2f} [{times[0]:.2f}, {times[-1]:.2f}]"


def device_time(fn: Callable[[], object], calls: int = 50) -> str:
    """Median µs per call of ``calls`` calls captured in a CUDA graph, replayed 5 times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # plans made and kernels compiled before the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
    except Exception as e:  # a call that synchronizes cannot be captured
        return f"not capturable ({type(e).__name__})"
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    times.sort()
    return f"{times[2]:7.2f}"


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; µs per call")
    for n, d, graphs in SIZES:
        x = torch.rand(n, d, device="cuda")
        ptr = torch.linspace(0, n, graphs + 1, device="cuda").long()
        print(f"== {n} x {d}, {graphs} graphs")
        methods = {
            "torch.segment_reduce": lambda x=x, p=ptr: torch.segment_reduce(x, "sum", offsets=p),
            "linred check=False": lambda x=x, p=ptr: linred.segmented_sum(x, offsets=p, check=False),
            "linred (default)": lambda x=x, p=ptr: linred.segmented_sum(x, offsets=p),
        }
        for name, fn in methods.items():
            synced = host_time(lambda fn=fn: (fn(), torch.cuda.synchronize()))
            print(f"  {name:22s} host {host_time(fn)}  with sync {synced}  device {device_time(fn)}")


if __name__ == "__main__":
    main()
