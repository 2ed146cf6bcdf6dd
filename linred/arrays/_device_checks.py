"""Offsets checked on the GPU: one kernel over them, one word read back.

``check=True`` must raise before the call returns when the offsets break a rule, so
the host has to learn the verdict: :func:`offsets_ok` launches ``checks.cuh``'s kernel
on the call's stream, which writes into a word of pinned host memory that the device
reads and writes directly (no copy back), then synchronizes that stream once and reads
the word.  That is one pass over the offsets and one synchronization per checked call;
which rule broke, and where, is found only when one did (the callers then compute the
offending index and values for the message).

A reduction kernel that reads every segment's bounds can check them itself
(``checked_bounds`` in ``offsets.cuh``): :func:`arm` gives it this thread's word, and
:func:`passed`, after the reduction is enqueued, synchronizes its stream once and reads the
word.  That saves the pass over the offsets and the synchronization between it and the
reduction (a call's host time then waits on the device once, not twice).

But such a call waits for the whole reduction, and the GPU then idles while the host does
the next call's work up to its launch (25-30 us of Python and driver calls, 6-7% of a 1 GiB
reduction).  Where the offsets are a small part of the bytes a large call reads
(:func:`ahead_pays`), :func:`check_ahead` launches the one-kernel check into the armed word
ahead of the reduction and marks its end with an event; the reduction (a checking kernel,
so bad offsets are read as empty segments, never out of bounds) is enqueued behind it, and
:func:`verdict` waits for the check alone.  The call returns while its reduction runs, as an
unchecked call does, and the next call's host work overlaps it: the offsets are read twice
(the check's pass, at most 64 MiB of them), the GPU never waits for the host.

The word after the armed one is a note a kernel may leave for the host, read once the call
has waited for it (:func:`clear_note`, :func:`noted`): the softmax family's kernel notes that
it listed very long segments, and the host then launches the kernel that reads them.

The words (and the packed launch arguments) are per thread: a thread's check is over
(synchronized) before it returns, so no two checks share them.  The words are allocated by
the array library of the call (CuPy's or PyTorch's pinned allocator).  The kernel is
launched through the driver with its arguments packed once per thread
(:class:`linred.kernels.launch.DriverKernels`): the check is on the path of every checked
call, where cuda.core's launch costs microseconds more.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

from linred.arrays._context import driver as cuda_driver
from linred.arrays._context import is_current, on_device
from linred.kernels.launch import DriverKernels

__all__ = [
    "ahead_pays",
    "arm",
    "check_ahead",
    "check_armed",
    "clear_note",
    "noted",
    "offsets_ok",
    "passed",
    "verdict",
    "word_value",
]

_THREADS = 256
#: enough blocks to keep the memory system busy; a grid-stride loop does the rest
_MAX_BLOCKS = 8192
#: the kernels (int32 and int64 offsets), four 8-byte arguments: offsets, m, n, the word; where
#: they cannot run on a device, the callers check with array-library reductions
_kernels = DriverKernels(
    '#include "checks.cuh"\n',
    ("linred_check_offsets32", "linred_check_offsets64"),
    4,
    "the offsets check",
    "offsets on CUDA device %d are checked with array-library reductions (a few more kernels): "
    "the one-kernel check cannot run there (%s)",
    "checking the offsets on CUDA device {device} failed: {err}",
)


class _State(threading.local):
    """This thread's pinned words: the buffer that owns them, ctypes views of them (the verdict,
    and the note after it) and the verdict's address (the check kernel's last argument)."""

    owner: Any = None
    word: Any = None
    note: Any = None
    address: Any = None
    #: per device: the event that marks the end of this thread's last check launched ahead
    events: dict[int, _Event] | None = None


class _Event:
    """A CUDA event of one thread's :class:`_State`, destroyed with it: the threads of a pool come
    and go, and each would otherwise leave an event per device behind.  (The driver releases an
    event destroyed before the work it marks is done once that work is.)"""

    __slots__ = ("handle",)

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __del__(self) -> None:
        driver = _driver
        if driver is not None:
            # (not contextlib.suppress: at interpreter exit the module's globals may be gone)
            try:  # noqa: SIM105
                driver.cuEventDestroy(self.handle)
            except Exception:  # pragma: no cover
                pass


_state = _State()
_driver: Any = None


def _reason(device: int) -> str | None:
    """Why the check cannot run on ``device`` (:meth:`DriverKernels.functions`: its kernels are
    loaded once per device), or None where it can."""
    global _driver
    functions = _kernels.functions(device)
    if isinstance(functions, str):
        return functions
    if _driver is None:
        _driver = cuda_driver()
    return None


def _thread_state(pinned_words: Callable[[], tuple[Any, int]]) -> None:
    owner, address = pinned_words()
    _state.owner, _state.word = owner, ctypes.c_int32.from_address(address)
    _state.note = ctypes.c_int32.from_address(address + 4)
    _state.address = address


def offsets_ok(
    pointer: int, wide: bool, m: int, n: int, device: int, stream: int, pinned_words: Callable[[], tuple[Any, int]]
) -> bool | None:
    """Whether the ``m + 1`` contiguous offsets at device address ``pointer`` (int64 if ``wide``,
    else int32) start at 0, never decrease and end at ``n``; checked on ``device`` in stream order
    on ``stream`` (a raw handle), whose work is waited for.  None when the check cannot run on
    that device (see :func:`_reason`): the caller then checks another way.

    ``pinned_words`` allocates two int32 words of pinned host memory (the first call in a thread)
    and returns the object that owns them and their address.
    """
    if _reason(device) is not None:
        return None
    _clear(pinned_words)  # (this thread's word, whose address is the fourth argument)
    return _check_and_wait(pointer, wide, m, n, device, stream)


def check_armed(pointer: int, wide: bool, m: int, n: int, device: int, stream: int) -> bool:
    """:func:`offsets_ok` into this thread's word as :func:`arm` left it: for a reduction handed
    that word whose kernel cannot check the offsets as it reads them (a layout it hands to
    another kernel), which then checks them first and reduces only if they pass.  Raises
    RuntimeError if the check cannot run on ``device`` (the reduction kernels could not either)."""
    reason = _reason(device)
    if reason is not None:
        raise RuntimeError(f"cannot check offsets on CUDA device {device}: {reason}")
    return _check_and_wait(pointer, wide, m, n, device, stream)


#: A checked call learns its verdict ahead of its reduction (:func:`check_ahead`) where the
#: reduction reads at least this many bytes of data (below, its kernel is too short for the
#: next call's host work to hide behind it, and the extra launch would only add device time) ...
AHEAD_MIN_BYTES = 32 << 20
#: ... and its offsets are at most this many bytes.  The check reads them once more, which
#: takes a time in proportion to their bytes, against a host gap that is the same whatever the
#: call's size (H200, 2026-11-30, CuPy, float32, every layout both ways: at 2^24 values in
#: segments of 16 (8 MiB of offsets) 54 us a call ahead against 67 waiting, 2^26 129 against
#: 139, 2^27 (64 MiB) 246 against 250; at 2^28 (128 MiB) 481 against 466).
AHEAD_MAX_OFFSETS_BYTES = 64 << 20


def ahead_pays(data_bytes: int, offsets_bytes: int) -> bool:
    """Whether a checked call whose reduction reads ``data_bytes`` of data and ``offsets_bytes``
    of offsets takes the check launched ahead (:func:`check_ahead`) over waiting for the
    reduction that checks them as it reads them."""
    return data_bytes >= AHEAD_MIN_BYTES and offsets_bytes <= AHEAD_MAX_OFFSETS_BYTES


def check_ahead(pointer: int, wide: bool, m: int, n: int, device: int, stream: int) -> bool:
    """Launch the check of the offsets at ``pointer`` into this thread's word as :func:`arm` left
    it, on ``stream``, and record this thread's event on ``device`` behind it, without waiting: the
    reduction is enqueued next, and :func:`verdict` waits for the check alone.  False (nothing
    launched) where the check cannot run on ``device``: the call then waits for its reduction."""
    if _reason(device) is not None:
        return False
    state, driver = _state, _driver
    events = state.events
    if events is None:
        events = state.events = {}
    with on_device(device):
        event = events.get(device)
        if event is None:
            err, handle = driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cannot create an event for the offsets check on CUDA device {device}: {err}")
            event = events[device] = _Event(handle)
        err = _launch(pointer, wide, m, n, device, stream)
        if err == driver.CUresult.CUDA_SUCCESS:
            (err,) = driver.cuEventRecord(event.handle, stream)
    _kernels.check(device, err)
    return True


def verdict(device: int) -> bool:
    """Whether the offsets checked by :func:`check_ahead` on ``device`` kept every rule: waits for
    that check (not for the work enqueued after it), then reads the word.  When False, the
    caller waits for the stream (:func:`passed`) before it raises: the reduction behind the check
    may still write the result and the word."""
    with on_device(device):
        (err,) = _driver.cuEventSynchronize(_state.events[device].handle)
    if err != _driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"waiting for the offsets check on CUDA device {device} failed: {err}")
    return _state.word.value == 0


def _check_and_wait(pointer: int, wide: bool, m: int, n: int, device: int, stream: int) -> bool:
    """Launch the check of the offsets at ``pointer`` into this thread's word, wait for
    ``stream`` and read the word."""
    driver = _driver
    with on_device(device):
        err = _launch(pointer, wide, m, n, device, stream)
        if err == driver.CUresult.CUDA_SUCCESS:
            (err,) = driver.cuStreamSynchronize(stream)
    _kernels.check(device, err)
    return _state.word.value == 0


def _launch(pointer: int, wide: bool, m: int, n: int, device: int, stream: int) -> Any:
    """Enqueue the check of the ``m + 1`` offsets at ``pointer`` into this thread's word on
    ``stream`` (in ``device``'s context, current); the driver's result."""
    blocks = min(m // _THREADS + 1, _MAX_BLOCKS)
    return _kernels.enqueue(device, wide, blocks, _THREADS, 0, stream, pointer, m, n, _state.address)


def _clear(pinned_words: Callable[[], tuple[Any, int]]) -> int:
    """This thread's word (allocated on the thread's first check), set to 0; its address."""
    state = _state
    if state.word is None:
        _thread_state(pinned_words)
    state.word.value = 0
    return state.address


def arm(pinned_words: Callable[[], tuple[Any, int]]) -> int:
    """This thread's word, cleared, for a kernel that checks offsets as it reads them: its
    address (the kernel sets it to 1 when a rule is broken; :func:`passed` reads it)."""
    return _clear(pinned_words)


def clear_note() -> None:
    """Set this thread's note (the word after the one :func:`arm` armed: a kernel handed that
    word may write 1 into the next, softmax.cuh's list_long) to 0."""
    _state.note.value = 0


def noted() -> bool:
    """Whether a kernel wrote this thread's note since :func:`clear_note` (read after
    :func:`passed` waited for it)."""
    return _state.note.value != 0


def word_value() -> int:
    """This thread's check word as the last kernel left it (read after :func:`passed` waited)."""
    return _state.word.value


def passed(stream: int, device: int) -> bool:
    """Whether the offsets a kernel checked since :func:`arm` kept every rule: waits for
    ``stream`` (a raw handle on ``device``) once, then reads the word."""
    global _driver
    if _driver is None:
        _driver = cuda_driver()
    if is_current(device):
        (err,) = _driver.cuStreamSynchronize(stream)
    else:
        with on_device(device):
            (err,) = _driver.cuStreamSynchronize(stream)
    if err != _driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"waiting for a reduction on CUDA device {device} failed: {err}")
    return _state.word.value == 0
