"""PyTorch tensors and CuPy arrays in, the same type out, on the same device.

On a machine without a CUDA device the GPU parts are skipped with a message;
CPU PyTorch tensors are used when PyTorch is installed.

Run: python examples/gpu_interop.py
"""

import numpy as np

import linred

EXPECTED = [10, 26, 42]


def torch_part() -> None:
    try:
        import torch
    except ImportError:
        print("skipped torch: PyTorch is not installed")
        return
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        x = torch.arange(1, 13, dtype=torch.float32, device=device)
        result = linred.segmented_sum(x, 4)
        assert isinstance(result, torch.Tensor) and result.device == x.device
        assert result.tolist() == EXPECTED
        print(f"torch on {device}: segmented_sum(x, 4) -> {result}")
        if device == "cuda":
            # bfloat16 is accumulated in float32 and returned as bfloat16.
            h = torch.ones(3000, dtype=torch.bfloat16, device=device)
            total = linred.segmented_sum(h, 3000)
            assert total.dtype == torch.bfloat16 and float(total[0]) == 3000
            # Work runs on the stream given (or torch's current one).
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                on_stream = linred.segmented_sum(x, 4, stream=stream)
            stream.synchronize()
            assert on_stream.tolist() == EXPECTED
    if "cuda" not in devices:
        print("skipped torch on CUDA: no CUDA device")


def cupy_part() -> None:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("0 devices")
    except Exception as e:  # not installed, no driver, no device
        print(f"skipped CuPy: no usable CUDA device ({type(e).__name__})")
        return
    x = cupy.arange(1, 13, dtype=cupy.float32)
    for backend in ["auto", *(b for b, ok in linred.available_backends().items() if ok is True)]:
        try:
            result = linred.segmented_sum(x, 4, backend=backend)
        except linred.BackendError as e:
            print(f"cupy, backend={backend!r}: refused ({e.reason})")
            continue
        assert isinstance(result, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(result), EXPECTED)
        print(f"cupy, backend={backend!r}: {result}")
    offsets = cupy.asarray([0, 4, 4, 12])
    np.testing.assert_array_equal(cupy.asnumpy(linred.segmented_sum(x, offsets=offsets)), [10, 0, 68])


torch_part()
cupy_part()
print("OK: gpu_interop")
