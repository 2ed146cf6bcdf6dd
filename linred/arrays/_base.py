"""The adapter interface shared by the NumPy, CuPy and PyTorch adapters."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def byte_range(pointer: int, shape: tuple[int, ...], byte_strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """``[first, last)``: the addresses an array of this layout touches (empty for no element)."""
    if 0 in shape:
        return pointer, pointer
    low = pointer + sum(s * (d - 1) for s, d in zip(byte_strides, shape, strict=True) if s < 0)
    high = pointer + sum(s * (d - 1) for s, d in zip(byte_strides, shape, strict=True) if s > 0) + itemsize
    return low, high


def ranges_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < a[1] and b[0] < b[1] and a[0] < b[1] and b[0] < a[1]


@dataclass(frozen=True, slots=True)
class ArrayInfo:
    """What linred needs to know about an array.

    ``strides`` are in elements, not bytes; ``device`` is None for host memory and
    the CUDA device ordinal otherwise.  ``plain`` says that the memory holds the
    elements as a typed pointer reads them: native byte order, every element aligned
    to its itemsize, strides whole multiples of the itemsize (``strides`` is
    meaningful only then).  A byte-swapped array, a field of a structured array or an
    unaligned view is not plain.
    """

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: int | None
    plain: bool = True


#: (adapter type, linred dtype name, device) -> that adapter's allocator (:meth:`ArrayAdapter.empty`)
_allocators: dict[tuple[type, str, int | None], Any] = {}


class ArrayAdapter:
    """Operations on one array library's arrays.  Subclasses fill every method."""

    #: the library's name: "numpy", "cupy" or "torch"
    kind: str = ""
    #: the array type's name for messages, e.g. "numpy.ndarray"
    type_name: str = ""
    #: whether :meth:`prepare` may return another array than it is given (else it is skipped)
    prepares: bool = False
    #: :meth:`prepare` for an array whose key (:meth:`key`) is that of a prepared array, where
    #: that takes less (None: :meth:`prepare` itself)
    prepare_plain: Any = None
    #: ``prepare_out(out)``: an ``out`` argument ready to be written through its memory, or None
    #: where it is written as it is (PyTorch: one that requires grad is refused while grad mode
    #: is on, as PyTorch's own functions with ``out=`` refuse it, and detached otherwise)
    prepare_out: Any = None
    #: ``written(out)``: told that ``out`` was written through its memory, or None (PyTorch: its
    #: version counter is bumped, as an in-place operation's is, so that autograd notices a
    #: tensor it saved being overwritten)
    written: Any = None
    #: ``plan_input(x)``: raises where a plan (:class:`~linred.SegmentedReduction`) cannot serve
    #: ``x`` as the functions would, or None (PyTorch: a tensor that requires grad in grad mode,
    #: whose gradient a plan does not record)
    plan_input: Any = None
    #: device arrays: ``pointer(x)``, the address of ``x``'s first element (None on the host);
    #: with :meth:`span`, a plan's per-call test of whether ``out`` overlaps its inputs
    pointer: Any = None

    def span(self, x: Any) -> tuple[int, int]:
        """``[first, last)``: the addresses ``x`` touches (device arrays; empty for no element)."""
        raise NotImplementedError

    def info(self, x: Any) -> ArrayInfo:
        raise NotImplementedError

    def key(self, x: Any) -> tuple:
        """A cheap, hashable description of ``x`` that, with its type, determines its
        :meth:`info` and whether :meth:`prepare` copies it: two arrays with equal keys
        can run on the same plan.  Equal keys must imply equal info (no false match);
        unequal keys for equal info only cost the slower, checked path."""
        raise NotImplementedError

    def out_key(self, shape: tuple[int, ...], dtype: str, device: int | None) -> tuple:
        """The :meth:`key_out` of a C-contiguous, plain, writeable array of ``shape``, ``dtype``
        and ``device`` (one that :meth:`empty` makes)."""
        raise NotImplementedError

    def key_out(self, x: Any) -> tuple:
        """:meth:`key` with whatever else decides whether ``x`` can be written (its writeability)."""
        return self.key(x)

    def allocator(self, dtype: str, device: int | None) -> Any:
        """``empty(shape)``: :meth:`empty` with the dtype and device fixed, for repeated calls."""
        raise NotImplementedError

    def capturing(self, x: Any) -> bool:
        """Whether work on ``x``'s device now goes into a CUDA graph capture (its current stream is
        capturing), where nothing may be read back on the host."""
        return False

    def current_stream(self, device: int) -> Any:
        """A function returning the handle of the library's current stream on CUDA device
        ``device``: what a call with ``stream=None`` runs on (host calls have no stream)."""
        raise NotImplementedError

    def prepare(self, x: Any) -> Any:
        """``x`` ready to be read by raw pointer (torch: lazy conjugation resolved)."""
        return x

    def device_of(self, x: Any) -> int | None:
        raise NotImplementedError

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        """``x`` with a new shape: a view when the layout allows, else a copy."""
        raise NotImplementedError

    def is_c_contiguous(self, x: Any) -> bool:
        raise NotImplementedError

    def is_writeable(self, x: Any) -> bool:
        return True

    def empty(self, shape: tuple[int, ...], dtype: str, device: int | None) -> Any:
        """A new C-contiguous array of ``shape``: :meth:`allocator`'s function, made once per dtype
        and device (the scratch arrays of a call: made per call, a torch.device cost as much as the
        allocation, and a CuPy device switch more)."""
        key = (type(self), dtype, device)
        allocate = _allocators.get(key)
        if allocate is None:
            allocate = _allocators[key] = self.allocator(dtype, device)
        return allocate(shape)

    def fill(self, x: Any, value: Any, stream: Any = None) -> None:
        """Set every element of ``x`` to ``value``, on ``stream`` for device arrays."""
        raise NotImplementedError

    def copy(self, dst: Any, src: Any, stream: Any = None) -> None:
        """``dst[...] = src`` (same shape and dtype), on ``stream`` for device arrays."""
        raise NotImplementedError

    def overlaps(self, a: Any, b: Any) -> bool:
        """Whether the memory of ``a`` and ``b`` may overlap (a cheap, conservative test of
        their address ranges: True may also mean interleaved without a common element)."""
        raise NotImplementedError

    def index_array(self, obj: Any, device: int | None, name: str) -> Any:
        """``obj`` (any array-like) as a 1-D-or-more integer array of this kind on ``device``.

        int32 and int64 arrays are used as they are (no copy when already on the
        device); other integer dtypes become int64.  Non-integer input raises
        TypeError naming ``name``.
        """
        raise NotImplementedError

    def on_stream(self, stream: Any, device: int | None) -> Any:
        """A context in which the library's own operations run on ``stream`` (a resolved handle)."""
        return contextlib.nullcontext()

    def resolve_stream(self, stream: Any, device: int | None) -> Any:
        """The stream work on ``device`` runs on: ``stream`` or the library's current one."""
        raise NotImplementedError

    # Index work for offsets and lengths.  Each returns host Python ints after one
    # synchronization, which is all ``check=True`` costs on a device.

    def offsets_ok(self, offsets: Any, n: int) -> bool | None:
        """Whether offsets on a device start at 0, never decrease and end at ``n``, found by one
        kernel over them on the current stream and one word read back (see
        :mod:`linred.arrays._device_checks`); None on the host, where :meth:`offsets_summary`
        costs no synchronization, and where that kernel cannot run (then :meth:`offsets_summary`
        checks them).  When False, :meth:`offsets_summary` says what broke."""
        return None

    def out_test(self, shape: tuple[int, ...], dtype: str) -> Callable[[Any], bool] | None:
        """For host arrays: a test that an ``out`` argument is an array of this type, ``shape`` and
        ``dtype``, C-contiguous, aligned and writeable (a result can be written into it as it is,
        short of overlapping the inputs), as cheap as the library allows; None where the plan's
        general test is used."""
        return None

    def check_word(self, offsets: Any) -> int:
        """For offsets on a device that a reduction kernel will check as it reads them: the
        address of this thread's pinned word, cleared (see :mod:`linred.arrays._device_checks`);
        0 on the host, where nothing is gained."""
        return 0

    def check_passed(self, stream: Any, device: int | None) -> bool:
        """After a call whose kernel checked its offsets (:meth:`check_word`): whether they kept
        every rule, read once ``stream`` (on ``device``) has finished."""
        raise NotImplementedError

    def offsets_summary(self, offsets: Any) -> tuple[int, int, int, int, int]:
        """``(offsets[0], offsets[-1], at, min step, max step)``.

        ``at`` is the first ``i`` with ``offsets[i + 1] < offsets[i]``, or -1 when the
        offsets never decrease; the steps ``offsets[1:] - offsets[:-1]`` (the segment
        lengths) are meaningful only then (they may wrap around otherwise).  For a single
        offset, ``at`` is -1 and the steps 0.
        """
        raise NotImplementedError

    def lengths_summary(self, lengths: Any, offsets: Any) -> tuple[int, int, int, bool, int]:
        """``(min length, index of the min, max length, wrapped, offsets[-1])`` of ``lengths`` and
        the ``offsets`` that :meth:`lengths_to_offsets` made of them; ``wrapped`` says that their
        running sum overflowed int64 (the offsets decrease somewhere).  Zeros and False for an
        empty array."""
        raise NotImplementedError

    def lengths_to_offsets(self, lengths: Any) -> Any:
        """int64 offsets ``[0, cumsum(lengths)...]`` on the lengths' device."""
        raise NotImplementedError

    def value_at(self, a: Any, i: int) -> int:
        """``int(a[i])`` (synchronizes for device arrays); used to build error messages."""
        return int(a[i])


#: array type -> its adapter; each adapter module registers its type on import
adapters: dict[type, ArrayAdapter] = {}
