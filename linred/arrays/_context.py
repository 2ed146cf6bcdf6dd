"""A CUDA device made current for a block of driver calls, through its primary context.

Driver calls that name a stream by handle run in the current context, and handle 0 (the
legacy default stream) is the null stream of whichever context is current: work for an
array on a device that is not current would otherwise go to the wrong device.  CuPy and
PyTorch use each device's primary context, so pushing that context is what their own
device switches amount to.
"""

from __future__ import annotations

from typing import Any

__all__ = ["on_device"]

#: per device: its primary context (retained once, for the process)
_contexts: dict[int, Any] = {}


class on_device:
    """Make ``device``'s primary context current for the block, unless it already is (the common
    case costs one driver query), and restore the previous one after it."""

    __slots__ = ("_device", "_pushed")

    def __init__(self, device: int) -> None:
        self._device = device
        self._pushed = False

    def __enter__(self) -> None:
        from cuda.bindings import driver

        err, current = driver.cuCtxGetDevice()
        if err == driver.CUresult.CUDA_SUCCESS and int(current) == self._device:
            return
        context = _contexts.get(self._device)
        if context is None:
            err, context = driver.cuDevicePrimaryCtxRetain(self._device)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cannot retain the primary context of CUDA device {self._device}: {err}")
            _contexts[self._device] = context
        (err,) = driver.cuCtxPushCurrent(context)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cannot make CUDA device {self._device} current: {err}")
        self._pushed = True

    def __exit__(self, *exc: object) -> None:
        if self._pushed:
            from cuda.bindings import driver

            driver.cuCtxPopCurrent()
            self._pushed = False
