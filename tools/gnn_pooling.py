"""GNN pooling per call on a GPU: host latency and device time, linred against torch.segment_reduce.

For each (N rows, d features, graphs) size, float32 CUDA tensors with an evenly spaced
``ptr``, in this process, on the same tensors:

- host time per call without and with ``torch.cuda.synchronize()`` after every call (median of
  5 batches of 5,000 calls, with the min and max), every method's before any is profiled;
- device time per call: 50 calls captured into a CUDA graph, replayed 5 times (median), which
  leaves the host out; a call that cannot be captured (one that reads back on the host) says so;
- kernel time per call: the durations of the kernels 200 calls ran, as the CUDA profiler
  (``torch.profiler``) records them, summed and divided by 200: a device time for calls that
  cannot be captured (linred's default ``check=True`` synchronizes once per call).

    python tools/gnn_pooling.py [--sizes N,d,graphs ...] [--reductions sum,mean]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import linred

SIZES = ((2000, 64, 32), (50_000, 128, 256), (1_000_000, 128, 4096))


def host_time(fn: Callable[[], object], budget: float = 0.1) -> str:
    """Median [min, max] µs per call over 5 batches of calls (after a warm-up), each batch as many
    calls as fill about ``budget`` seconds (20 to 5,000)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    number = max(20, min(5000, int(budget / ((time.perf_counter() - t0) / 20))))
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


def kernel_time(fn: Callable[[], object], calls: int = 200) -> str:
    """µs of kernels per call: the profiler's durations of every kernel ``calls`` calls ran."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = sum(e.self_device_time_total for e in prof.key_averages())
    return f"{total / calls:7.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", help="N,d,graphs triples (default: three GNN sizes)")
    parser.add_argument("--reductions", default="sum", help="comma-separated: sum, mean")
    args = parser.parse_args()
    sizes = [tuple(int(v) for v in s.split(",")) for s in args.sizes] if args.sizes else SIZES
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; µs per call")
    print("host: median [min, max] of 5 batches; device: CUDA graph replay; kernels: profiler")
    for n, d, graphs in sizes:
        x = torch.rand(n, d, device="cuda").squeeze(1) if d == 1 else torch.rand(n, d, device="cuda")
        ptr = torch.linspace(0, n, graphs + 1, device="cuda").long()
        for r in args.reductions.split(","):
            print(f"== {n} x {d}, {graphs} graphs, {r}")
            fn_l = getattr(linred, f"segmented_{r}")
            methods = {
                "torch.segment_reduce": lambda x=x, p=ptr, r=r: torch.segment_reduce(x, r, offsets=p),
                "linred check=False": lambda x=x, p=ptr, f=fn_l: f(x, offsets=p, check=False),
                "linred (default)": lambda x=x, p=ptr, f=fn_l: f(x, offsets=p),
            }
            # Host times first, for every method, then the device and kernel times: after a
            # profiler session (kernel_time) and graph captures the process launched slower
            # (H200, 2,000 x 64 rows: linred's check=False call with a synchronize 49.5 us after
            # torch's were profiled, 28.8 us with every host time taken first).
            hosts = {}
            for name, fn in methods.items():
                synced = host_time(lambda fn=fn: (fn(), torch.cuda.synchronize()))
                hosts[name] = f"host {host_time(fn)}  with sync {synced}"
            for name, fn in methods.items():
                print(f"  {name:22s} {hosts[name]}  device {device_time(fn)}  kernels {kernel_time(fn)}", flush=True)


if __name__ == "__main__":
    main()
