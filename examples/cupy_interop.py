"""CuPy arrays in, CuPy arrays out, on the array's device and the current CUDA stream.

Each of linred's GPU backends is named explicitly, so you can see which serve
the call and why the others refuse it (a backend never falls back silently).
Results are checked against float64 NumPy.  Without a usable CUDA device the
script says so and exits 0.

Run: python examples/cupy_interop.py
"""

import itertools
import sys

import numpy as np

import linred

try:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("no CUDA device")
except Exception as e:  # CuPy missing, no driver, no device
    print(f"SKIPPED: cupy_interop: no usable CUDA device ({type(e).__name__})")
    sys.exit(0)

failures = []


def compare(label, result, reference, rtol=1e-5):
    """Print the norm-wise relative error of ``result`` against the float64 ``reference``."""
    if not isinstance(result, cupy.ndarray):
        failures.append(f"{label}: returned {type(result).__name__}, not a CuPy array")
        return
    got = cupy.asnumpy(result).astype(np.float64)
    err = np.inf
    if got.shape == reference.shape:
        err = float(np.linalg.norm(got - reference) / np.linalg.norm(reference))
    print(f"  {label:<44} {result.dtype!s:<8} rel. error {err:.1e}")
    if not err <= rtol:
        failures.append(f"{label}: error {err:.1e} > {rtol:.0e}")


host = np.random.default_rng(0).standard_normal(1 << 20, dtype=np.float32)
x = cupy.asarray(host)
fixed_ref = host.astype(np.float64).reshape(-1, 256).sum(axis=1)
offsets_host = np.array([0, 1000, 1000, 300_000, 1 << 20])
variable_ref = np.array([host[a:b].astype(np.float64).sum() for a, b in itertools.pairwise(offsets_host)])
offsets = cupy.asarray(offsets_host)

print(f"CuPy {cupy.__version__}, device {cupy.cuda.Device().id}; backends: {linred.available_backends()}")
for backend in ["auto", *(b for b, ok in linred.available_backends().items() if ok is True)]:
    print(f"backend={backend!r}:")
    for label, segments, reference in [
        ("segmented_sum(x, 256)", {"segment_length": 256}, fixed_ref),
        ("segmented_sum(x, offsets=cupy array)", {"offsets": offsets}, variable_ref),
    ]:
        try:
            compare(label, linred.segmented_sum(x, **segments, backend=backend), reference)
        except linred.BackendError as e:
            print(f"  {label:<44} refused: {e.reason}")

# out= and a stream of your own: the work is enqueued on it, and linred does not synchronize.
out = cupy.empty(4096, dtype=cupy.float32)
stream = cupy.cuda.Stream(non_blocking=True)
with stream:
    result = linred.segmented_sum(x, 256, out=out)
stream.synchronize()
if result is not out:
    failures.append("out= must be returned")
compare("segmented_sum(x, 256, out=...) on a stream", out, fixed_ref)

if failures:
    print("FAILED:", *failures, sep="\n  ")
    sys.exit(1)
print("OK: cupy_interop")
