"""A compiled kernel launched through the CUDA driver, its arguments packed once; and the two
helpers the kernels outside the nvrtc backend share (:func:`thread_launch`, one launch per
thread and kernel; :func:`multiprocessors`, a device's SM count).

cuda.core's ``launch`` converts and packs every argument on every call (about 8 µs for a
kernel of 14 arguments on an H100 host), which is most of what a small call costs.  The
kernels of the hot paths take only 8-byte arguments (pointers and ``long long``), so
:class:`PackedLaunch` keeps one array of 8-byte slots and the array of their addresses,
writes a call's values into the slots and hands the driver the addresses
(``cuLaunchKernel`` copies the values when it is called, so the slots are free again at
once).  An executor owns its launches and a plan serves one thread at a time, so no two
calls share the slots.  Most of a plan's arguments (sizes, strides, its scratch buffers'
pointers) never change: :meth:`PackedLaunch.bind` writes them once, and a call writes only the
slots that change (the data's and the result's pointers) before :meth:`PackedLaunch.launch`
(about 1 µs of a 17-argument launch's 8 on an H100 host goes to writing all the slots).  A
launch runs with its device's primary context current
(:class:`linred.arrays._context.on_device`: one driver query when it already is, none inside
a block of the caller's for the device), since a raw stream handle 0 names the current
context's null stream.
"""

from __future__ import annotations

import ctypes
from typing import Any

from linred.arrays._context import current_device, on_device
from linred.arrays._context import driver as cuda_driver

__all__ = ["PackedLaunch", "multiprocessors", "thread_launch"]

_driver: Any = None
_sms: dict[int, int] = {}


def _check(result: Any, what: str) -> Any:
    err, *value = result if isinstance(result, tuple) else (result,)
    if err != _driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
    return value[0] if value else None


class PackedLaunch:
    """``kernel`` (a cuda.core kernel, in ``device``'s primary context) with ``count`` 8-byte
    arguments, launched by :meth:`__call__`.

    Parameters
    ----------
    kernel
        A ``cuda.core`` kernel (what :func:`linred.kernels.compiler.get_kernels` returns).
    count : int
        How many arguments it takes, every one 8 bytes (a pointer or a ``long long``).
    name : str
        The kernel's name, for error messages (and tools that count launches).
    device : int
        The CUDA device whose primary context holds the kernel.
    """

    __slots__ = ("_function", "_params", "_pointers", "count", "device", "kernel", "name", "slots")

    def __init__(self, kernel: Any, count: int, name: str, device: int) -> None:
        global _driver
        if _driver is None:
            _driver = cuda_driver()
        self.kernel, self.count, self.name, self.device = kernel, count, name, device
        with on_device(device):
            self._function = _check(_driver.cuKernelGetFunction(kernel.handle), f"loading {name}")
        #: the arguments' 8-byte slots: :meth:`launch` passes them as they are
        self.slots = (ctypes.c_int64 * count)()
        base = ctypes.addressof(self.slots)
        self._pointers = (ctypes.c_void_p * count)(*(base + 8 * i for i in range(count)))
        self._params = ctypes.addressof(self._pointers)

    def bind(self, first: int, *values: int) -> None:
        """Write ``values`` into the slots from ``first`` on (arguments no call changes)."""
        if first < 0 or first + len(values) > self.count:
            raise IndexError(f"{self.name} takes {self.count} arguments; cannot bind {len(values)} from {first}")
        self.slots[first : first + len(values)] = values

    def __call__(self, stream: int, grid: int, block: int, shared: int, *values: int) -> None:
        """Launch on ``stream`` (a raw handle) with ``grid`` blocks of ``block`` threads and
        ``shared`` bytes of dynamic shared memory; ``values`` are the first arguments, in order
        (the slots after them keep what :meth:`bind` wrote)."""
        self.slots[: len(values)] = values
        self.launch(stream, grid, block, shared)

    def launch(self, stream: int, grid: int, block: int, shared: int) -> None:
        """Launch with the slots as they are (see :meth:`__call__`)."""
        if current_device() == self.device:  # (a block of the caller's made it current)
            (err,) = _driver.cuLaunchKernel(self._function, grid, 1, 1, block, 1, 1, shared, stream, self._params, 0)
        else:
            with on_device(self.device):
                (err,) = _driver.cuLaunchKernel(
                    self._function, grid, 1, 1, block, 1, 1, shared, stream, self._params, 0
                )
        if err:  # (CUDA_SUCCESS is 0)
            raise RuntimeError(f"launching {self.name} failed: {err}")


def thread_launch(local: Any, key: Any, device: int, wrapper: str, name: str, count: int) -> PackedLaunch:
    """This thread's :class:`PackedLaunch` of kernel ``name`` (``count`` arguments) of program
    ``wrapper`` on ``device``, made once and kept in ``local.launches[key]`` (``local`` is a
    ``threading.local``: a launch's slots are rewritten by every call, so each thread has its own)."""
    from linred.kernels.compiler import get_kernels

    (kernel,) = get_kernels(device, wrapper, (name,))
    launches = getattr(local, "launches", None)
    if launches is None:
        launches = local.launches = {}
    launch = launches[key] = PackedLaunch(kernel, count, name, device)
    return launch


def multiprocessors(device: int) -> int:
    """The multiprocessor count of CUDA device ``device`` (asked once per process)."""
    count = _sms.get(device)
    if count is None:
        from cuda.core import Device

        count = _sms[device] = Device(device).properties.multiprocessor_count
    return count
