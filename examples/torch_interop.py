"""PyTorch tensors in, PyTorch tensors out: on the CPU, and on CUDA when a device is available.

linred returns a tensor of the input's kind on the input's device, with no copy
of the input; offsets and lengths may be tensors on that device too.  On CUDA
the work runs on PyTorch's current stream (or the ``stream=`` given).  Every
result is checked against a float64 NumPy loop.  Without PyTorch the script says
so and exits 0.

Run: python examples/torch_interop.py
"""

import itertools
import sys

import numpy as np

import linred

try:
    import torch
except ImportError:
    print("SKIPPED: torch_interop: PyTorch is not installed (pip install torch)")
    sys.exit(0)

failures = []


def compare(label, result, reference, rtol=1e-5):
    """Print ``result`` beside the float64 ``reference`` (norm-wise relative error); record a mismatch."""
    got = result.detach().cpu().to(torch.float64).numpy()
    err = np.inf
    if got.shape == reference.shape:
        err = float(np.linalg.norm(got - reference) / np.linalg.norm(reference))
    print(f"  {label:<50} {result.dtype!s:<15} {result.device!s:<7} rel. error {err:.1e}")
    if not err <= rtol:
        failures.append(f"{label} on {result.device}: error {err:.1e} > {rtol:.0e}")


def loop_sums(values, offsets):
    """The reference: a Python loop over the segments, in float64."""
    values = np.asarray(values, dtype=np.float64)
    return np.stack([values[a:b].sum(axis=0) for a, b in itertools.pairwise(offsets)])


devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
print(f"torch {torch.__version__}; devices: {', '.join(devices)}")
if "cuda" not in devices:
    print("(no CUDA device: the CUDA part is skipped)")

for device in devices:
    print(f"on {device}:")
    gen = torch.Generator().manual_seed(0)

    # float32 node features (n, d) with offsets as a tensor on the same device.
    x = torch.randn(1000, 16, generator=gen).to(device)
    offsets_list = [0, 100, 100, 700, 1000]  # one empty segment
    offsets = torch.tensor(offsets_list, device=device)
    sums = linred.segmented_sum(x, offsets=offsets)
    if not (isinstance(sums, torch.Tensor) and sums.device == x.device and sums.dtype == torch.float32):
        failures.append(f"expected a float32 tensor on {device}, got {type(sums).__name__}")
    compare("segmented_sum(x (1000, 16), offsets=tensor)", sums, loop_sums(x.cpu(), offsets_list))

    # Fixed lengths, and lengths as a tensor.
    windows = loop_sums(x.cpu(), range(0, 1001, 250))
    compare("segmented_mean(x, 250)", linred.segmented_mean(x, 250), windows / 250)
    lengths = torch.tensor([100, 0, 600, 300], device=device)
    by_lengths = linred.segmented_sum(x, lengths=lengths)
    compare("segmented_sum(x, lengths=tensor)", by_lengths, loop_sums(x.cpu(), offsets_list))

    # float16 and bfloat16 are accumulated in float32 and returned in their own dtype:
    # 4096 ones sum to exactly 4096 (a bfloat16 accumulator would stop at 256).
    for half in (torch.float16, torch.bfloat16):
        ones = torch.ones(2, 4096, dtype=half, device=device)
        name = str(half).removeprefix("torch.")
        compare(
            f"segmented_sum(ones {name}, 4096, axis=1)",
            linred.segmented_sum(ones, 4096, axis=1),
            np.full((2, 1), 4096.0),
            0,
        )

    # Integers are summed in int64; out= writes into a tensor you own.
    ints = torch.arange(1, 13, dtype=torch.int32, device=device)
    out = torch.empty(3, dtype=torch.int64, device=device)
    result = linred.segmented_sum(ints, 4, out=out)
    if result is not out:
        failures.append("out= must be returned")
    compare("segmented_sum(int32 1..12, 4, out=int64)", out, np.array([10.0, 26.0, 42.0]), 0)

    if device == "cuda":
        # Work is enqueued on the current stream (or stream=), never synchronized by linred.
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            on_stream = linred.segmented_sum(x, 250)
        stream.synchronize()
        compare("segmented_sum(x, 250) on a side stream", on_stream, windows)

# linred computes values, not gradients: its results are outside autograd's graph.
leaf = torch.ones(8, requires_grad=True)
print("results track gradients:", linred.segmented_sum(leaf, 4).requires_grad)

if failures:
    print("FAILED:", *failures, sep="\n  ")
    sys.exit(1)
print("OK: torch_interop")
