"""A compiled kernel launched through the CUDA driver, its arguments packed once; the small
kernels of linred's own headers that the array adapters launch the same way
(:class:`DriverKernels`); and the two helpers the kernels outside the nvrtc backend share
(:func:`thread_launch`, one launch per thread and kernel; :func:`multiprocessors`, a device's SM
count).

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

:class:`DriverKernels` serves the adapters' one-launch helpers (the offsets check, the lengths
scan, the ids' conversion: :mod:`linred.arrays._device_checks`, ``_device_scan``,
``_device_ids``): a pair of kernels loaded once per device (or the reason they cannot be, logged
once: the caller then takes the array library's way), launched with this thread's packed 8-byte
arguments (a thread's launch reads them before it returns, so its next one rewrites them).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

from linred.arrays._context import driver as cuda_driver
from linred.arrays._context import is_current, on_device

__all__ = ["DriverKernels", "PackedLaunch", "multiprocessors", "thread_launch"]

logger = logging.getLogger("linred")

_driver: Any = None
_sms: dict[int, int] = {}


def _check(result: Any, what: str) -> Any:
    err, *value = result if isinstance(result, tuple) else (result,)
    if err != _driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
    return value[0] if value else None


def _pack(count: int) -> tuple[Any, Any, int]:
    """``count`` 8-byte argument slots, the array of their addresses (kept with them) and that
    array's address (what ``cuLaunchKernel`` takes)."""
    slots = (ctypes.c_int64 * count)()
    base = ctypes.addressof(slots)
    pointers = (ctypes.c_void_p * count)(*(base + 8 * i for i in range(count)))
    return slots, pointers, ctypes.addressof(pointers)


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
        self.slots, self._pointers, self._params = _pack(count)

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
        if is_current(self.device):  # (the common case: no block to enter)
            (err,) = _driver.cuLaunchKernel(self._function, grid, 1, 1, block, 1, 1, shared, stream, self._params, 0)
        else:
            with on_device(self.device):
                (err,) = _driver.cuLaunchKernel(
                    self._function, grid, 1, 1, block, 1, 1, shared, stream, self._params, 0
                )
        if err:  # (CUDA_SUCCESS is 0)
            raise RuntimeError(f"launching {self.name} failed: {err}")


class _Packed(threading.local):
    """One thread's packed arguments of a :class:`DriverKernels` (made on its first launch)."""

    slots: Any = None
    pointers: Any = None
    params: int = 0


class DriverKernels:
    """The kernels ``names`` of ``program`` (one of linred's headers, compiled by
    :func:`linred.kernels.compiler.get_kernels`), each taking the same ``count`` 8-byte arguments,
    as driver functions per device, launched with this thread's packed arguments.

    Parameters
    ----------
    program : str
        The program's source (``'#include "checks.cuh"\\n'``).
    names : tuple of str
        Its kernels, in the order :meth:`enqueue`'s ``which`` picks them.
    count : int
        The arguments a kernel takes, every one 8 bytes (a pointer or a ``long long``).
    what : str
        What the kernels do, for the reason they cannot be had (``cannot load <what>: <error>``).
    fallback : str
        The warning logged (once per device) where they cannot be had: a ``%``-format of the
        device (``%d``) and the reason (``%s``).
    failed : str
        The message of the RuntimeError a failed launch raises: a ``str.format`` of ``device``
        and ``err`` (the driver's result).
    """

    __slots__ = ("_functions", "_packed", "count", "failed", "fallback", "names", "program", "what")

    def __init__(self, program: str, names: tuple[str, ...], count: int, what: str, fallback: str, failed: str) -> None:
        self.program, self.names, self.count = program, names, count
        self.what, self.fallback, self.failed = what, fallback, failed
        #: per device: the kernels as driver functions (in the device's primary context), or the
        #: reason they cannot be had there
        self._functions: dict[int, tuple[Any, ...] | str] = {}
        self._packed = _Packed()

    def functions(self, device: int) -> tuple[Any, ...] | str:
        """The kernels on ``device`` as driver functions, or why they cannot be had (no cuda.core
        or cuda.bindings, no NVRTC, a module that does not load): loaded once per device."""
        functions = self._functions.get(device)
        if functions is None:
            functions = self._functions[device] = self._load(device)
        return functions

    def _load(self, device: int) -> tuple[Any, ...] | str:
        global _driver
        from linred.kernels.compiler import get_kernels

        try:
            _driver = driver = cuda_driver()
            kernels = get_kernels(device, self.program, self.names)
            with on_device(device):
                functions = []
                for k in kernels:
                    err, function = driver.cuKernelGetFunction(k.handle)
                    if err != driver.CUresult.CUDA_SUCCESS:
                        raise RuntimeError(f"cannot load {self.what}: {err}")
                    functions.append(function)
                return tuple(functions)
        except Exception as e:  # (cuda.core's errors are not all RuntimeErrors)
            reason = f"{type(e).__name__}: {e}"
            logger.warning(self.fallback, device, reason)
            return reason

    def _params(self, values: tuple[int, ...]) -> int:
        """``values`` written into this thread's first slots (made on its first launch; those after
        them keep what its last launch wrote); the address ``cuLaunchKernel`` takes."""
        packed = self._packed
        slots = packed.slots
        if slots is None:
            slots, packed.pointers, packed.params = _pack(self.count)
            packed.slots = slots
        slots[: len(values)] = values
        return packed.params

    def enqueue(self, device: int, which: int, grid: int, block: int, shared: int, stream: int, *values: int) -> Any:
        """Launch kernel ``which`` on ``device`` (loaded: :meth:`functions`) in the current context,
        which must be ``device``'s, on ``stream`` (a raw handle) with ``grid`` blocks of ``block``
        threads and ``shared`` bytes of dynamic shared memory; ``values`` are its first arguments.
        The driver's result (see :meth:`check`)."""
        function, params = self._functions[device][which], self._params(values)
        (err,) = _driver.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, shared, stream, params, 0)
        return err

    def launch(self, device: int, which: int, grid: int, block: int, shared: int, stream: int, *values: int) -> None:
        """:meth:`enqueue` with ``device``'s primary context current; raises RuntimeError
        (``failed``) if the launch fails.  (:meth:`enqueue`'s steps written out: this launch is on
        the path of every call by segment ids, where each Python call costs a few tenths of a µs.)"""
        function, params = self._functions[device][which], self._params(values)
        if is_current(device):
            (err,) = _driver.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, shared, stream, params, 0)
        else:
            with on_device(device):
                (err,) = _driver.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, shared, stream, params, 0)
        if err:  # (CUDA_SUCCESS is 0)
            raise RuntimeError(self.failed.format(device=device, err=err))

    def check(self, device: int, err: Any) -> None:
        """Raise RuntimeError (``failed``) unless ``err``, a driver call's result for work on
        ``device``, is success."""
        if err != _driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(self.failed.format(device=device, err=err))


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
