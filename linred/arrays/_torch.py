"""The PyTorch adapter (CPU and CUDA tensors).  Imported only when a tensor is seen."""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import numpy as np
import torch
from torch._C import _functorch

from linred._dtypes import dtype_name
from linred._dynamo import register_torch
from linred.arrays import _device_checks, _device_scan, refusal
from linred.arrays._base import ArrayAdapter, ArrayInfo, adapters, byte_range, ranges_overlap
from linred.arrays._numpy import refuse_dask
from linred.arrays._streams import stream_handle

#: whether the current CUDA stream is capturing a graph: asked on every checked call, so the
#: function under ``torch.cuda.is_current_stream_capturing`` where this PyTorch has it
_stream_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)

_TORCH_DTYPES = {
    "bool": torch.bool,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "uint16": torch.uint16,
    "uint32": torch.uint32,
    "uint64": torch.uint64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


#: the unsigned dtypes PyTorch has no 1-D index_select for ("not implemented for 'UInt64'"), each
#: with the signed dtype of its width, whose view moves the same bits
_SIGNED_OF_UNSIGNED = {
    getattr(torch, u): getattr(torch, i)
    for u, i in (("uint16", "int16"), ("uint32", "int32"), ("uint64", "int64"))
    if hasattr(torch, u)
}


def index_select(a: torch.Tensor, axis: int, index: torch.Tensor) -> torch.Tensor:
    """``torch.index_select(a, axis, index)``, also for uint16, uint32 and uint64 data (through the
    signed view of the same bits, where PyTorch lacks the kernel), and for a CPU tensor whose
    memory is not aligned to its elements (``torch.from_numpy`` of an unaligned NumPy view: an
    aligned copy first, through which autograd passes too; PyTorch 2.13's CPU index_select of
    such complex128 data ends the process with a segmentation fault)."""
    a = aligned(a)
    signed = _SIGNED_OF_UNSIGNED.get(a.dtype)
    if signed is None:
        return torch.index_select(a, axis, index)
    return torch.index_select(a.view(signed), axis, index).view(a.dtype)


def aligned(a: torch.Tensor) -> torch.Tensor:
    """``a``, or an aligned copy of a CPU tensor whose memory is not aligned to its elements
    (``torch.from_numpy`` of an unaligned NumPy view), for PyTorch's operations: its CPU kernels of
    such complex128 data (``index_select``, a broadcast subtraction, the product's backward, even
    ``clone``) end the process with a segmentation fault (PyTorch 2.13).  The copy is NumPy's,
    which reads unaligned memory; autograd passes through it."""
    if not _misaligned(a):
        return a
    if a.requires_grad and torch.is_grad_enabled():
        return _AlignedCopy.apply(a)
    return _aligned_copy(a)


def _aligned_copy(a: torch.Tensor) -> torch.Tensor:
    """A copy of ``a`` (unaligned, on the CPU) in new, aligned memory, made by NumPy."""
    base = a.detach()
    conj = base.is_conj()
    if conj:
        base = base.conj()  # (the same memory without the bit: NumPy conjugates it as it copies)
    try:
        values = base.numpy()
    except (RuntimeError, TypeError):  # (a negative bit, or a dtype NumPy lacks: PyTorch's copy)
        return a.detach().clone()
    return torch.from_numpy(np.conj(values) if conj else np.array(values, copy=True))


class _AlignedCopy(torch.autograd.Function):
    """:func:`_aligned_copy`, through which the gradient passes unchanged."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
        return _aligned_copy(a)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _misaligned(a: torch.Tensor) -> bool:
    """Whether CPU tensor ``a``'s memory is not aligned to its elements (outside torch.compile,
    which reads no address; a torch.func transform's tensor, which has no memory of its own, is
    taken as aligned)."""
    if not a.is_cpu or not a.numel() or torch.compiler.is_compiling():
        return False
    try:
        return a.data_ptr() % a.element_size() != 0
    except RuntimeError:
        return False


#: ``(handle, device index)`` of every raw handle linred wrapped as a PyTorch stream (a stream the
#: caller named, which it may destroy): linred.backends._device.TorchOps.lasting reads it
WRAPPED: set[tuple[int, int]] = set()


def torch_stream(handle: int, device: torch.device) -> torch.cuda.Stream:
    """A torch stream object for a raw handle.  Handle 0 is the legacy default stream, which
    torch calls its default stream: ``ExternalStream(0)`` would instead hand out another
    stream from torch's pool."""
    if handle == 0:
        return torch.cuda.default_stream(device)
    WRAPPED.add((handle, torch.device(device).index or 0))
    return torch.cuda.ExternalStream(handle, device=device)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream_handle(device: int) -> Any:
    """A function returning the handle of torch's current stream on CUDA device ``device``.

    ``torch._C._cuda_getCurrentRawStream`` (what torch's own generated code and Triton call)
    returns the handle without building a ``torch.cuda.Stream``, a few microseconds less per
    call; where a torch build lacks it, the public ``current_stream(device).cuda_stream``.
    """
    raw = _raw_stream
    if raw is not None:
        return lambda: raw(device)
    current = torch.cuda.current_stream
    return lambda: current(device).cuda_stream


def _current_stream(device: int) -> int:
    """The handle of torch's current stream on CUDA device ``device`` (the raw one where torch
    has it: see :func:`_current_stream_handle`)."""
    return int(_raw_stream(device)) if _raw_stream is not None else int(torch.cuda.current_stream(device).cuda_stream)


def _pinned_words() -> tuple[torch.Tensor, int]:
    # (the check's word and a note: linred.arrays._device_checks)
    words = torch.empty(2, dtype=torch.int32, device="cpu", pin_memory=True)  # (whatever the default device)
    return words, words.data_ptr()


#: contiguous strides per shape (for torch.empty_strided; a plan asks for one shape on every call)
_strides: dict[tuple[int, ...], tuple[int, ...]] = {}


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape`` (torch's rule: a size of 0 steps as 1)."""
    if len(shape) < 2:  # (the common 1-D result: nothing to look up)
        return (1,) if shape else ()
    strides = _strides.get(shape)
    if strides is None:
        out, step = [], 1
        for d in reversed(shape):
            out.append(step)
            step *= max(d, 1)
        strides = tuple(reversed(out))
        if len(_strides) >= 256:
            _strides.clear()
        _strides[shape] = strides
    return strides


def _empty(dtype: torch.dtype, device: torch.device) -> Any:
    """``empty(shape)``: a new contiguous tensor of ``dtype`` on ``device``, by ``torch.empty_strided``
    with the strides looked up (H200 host, CUDA, 32 x 64 float32: 2.0 µs a tensor against 3.3 for
    ``torch.empty``, which works out its memory format)."""
    empty_strided = torch.empty_strided

    def empty(shape: tuple[int, ...]) -> torch.Tensor:
        if type(shape) is not tuple:  # (a torch.Size, a list, an int or a NumPy integer)
            shape = (operator.index(shape),) if hasattr(shape, "__index__") else tuple(map(operator.index, shape))
        return empty_strided(shape, _contiguous_strides(shape), dtype=dtype, device=device)

    return empty


def _device(device: int | None) -> torch.device:
    return torch.device("cpu") if device is None else torch.device("cuda", device)


def _range(t: torch.Tensor) -> tuple[int, int]:
    size = t.element_size()
    return byte_range(t.data_ptr(), tuple(t.shape), tuple(s * size for s in t.stride()), size)


class TorchAdapter(ArrayAdapter):
    kind = "torch"
    type_name = "torch.Tensor"
    prepares = True
    pointer = staticmethod(torch.Tensor.data_ptr)

    def span(self, x: torch.Tensor) -> tuple[int, int]:
        return _range(x)

    def info(self, x: torch.Tensor) -> ArrayInfo:
        return ArrayInfo(tuple(x.shape), tuple(x.stride()), dtype_name(x.dtype), self.device_of(x))

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        # A lazily conjugated or negated tensor is stored unconjugated: libraries that
        # read the raw memory would see the wrong values, so materialize it.
        if x.requires_grad:  # a tensor without it has no graph to leave (detach costs 0.6 us)
            x = x.detach()
        return x.resolve_conj().resolve_neg() if x.is_conj() or x.is_neg() else x

    @staticmethod
    def prepare_plain(x: torch.Tensor) -> torch.Tensor:
        # (the key says it is neither conjugated nor negated: only a graph to leave; 0.1 against 0.5 us)
        return x.detach() if x.requires_grad else x

    @staticmethod
    def prepare_out(out: torch.Tensor) -> torch.Tensor:
        if isinstance(out, torch.Tensor) and out.requires_grad:  # (anything else is refused by the check of out)
            if torch.is_grad_enabled():
                raise TypeError(
                    "out requires grad: linred writes out= without recording a gradient (as PyTorch's functions "
                    "with out= do); pass an out that does not require grad, call under torch.no_grad(), or leave out "
                    "None"
                )
            return out.detach()
        return out

    written = staticmethod(torch.autograd.graph.increment_version)

    @staticmethod
    def plan_input(x: Any) -> None:
        if not isinstance(x, torch.Tensor):  # (refused by check_x)
            return
        if _functorch.maybe_current_level() is not None and _functorch.is_functorch_wrapped_tensor(x):
            raise TypeError(
                "x is a torch.func tensor (inside grad, vmap or jacrev): a SegmentedReduction cannot read it; call "
                "the function (linred.segmented_sum and the others), which torch.func transforms"
            )
        if x.requires_grad and torch.is_grad_enabled():
            raise TypeError(
                "x requires grad: a SegmentedReduction does not record gradients; call the function "
                "(linred.segmented_sum and the others, which do), or run the plan on x.detach() or under "
                "torch.no_grad()"
            )

    def key(self, x: torch.Tensor) -> tuple:
        # is_conj/is_neg decide whether prepare() copies.
        return (x.shape, x.stride(), x.dtype, x.device, x.is_conj(), x.is_neg())

    def out_key(self, shape: tuple[int, ...], dtype: str, device: int | None) -> tuple:
        return (torch.Size(shape), _contiguous_strides(tuple(shape)), torch_dtype(dtype), _device(device), False, False)

    def allocator(self, dtype: str, device: int | None) -> Any:
        return _empty(torch_dtype(dtype), _device(device))

    def current_stream(self, device: int) -> Any:
        return _current_stream_handle(device)

    def capturing(self, x: torch.Tensor) -> bool:
        """Whether the current stream of ``x``'s device (the stream its call runs on) is being
        captured into a CUDA graph (that device's, not the current device's: a capture on
        cuda:1 while cuda:0 is current must still refuse a checked call on cuda:1's data)."""
        if not x.is_cuda:
            return False
        device = x.get_device()
        if device == _current_device():
            return _stream_capturing()
        with torch.cuda.device(device):
            return _stream_capturing()

    def is_writeable(self, x: torch.Tensor) -> bool:
        return not (x.is_conj() or x.is_neg())

    def device_of(self, x: torch.Tensor) -> int | None:
        # (two attribute reads and get_device(): a third of x.device's cost, on every call's offsets)
        if x.is_cuda:
            return x.get_device()
        if x.is_cpu:
            return None
        dev = x.device
        if dev.type == "cpu":
            return None
        if dev.type != "cuda":
            raise TypeError(f"torch tensors on device type {dev.type!r} are not supported (only cpu and cuda)")
        return dev.index if dev.index is not None else torch.cuda.current_device()

    def reshape(self, x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return x.detach().reshape(shape)  # no autograd; .numpy() and DLPack refuse tensors that require grad

    def is_c_contiguous(self, x: torch.Tensor) -> bool:
        return x.is_contiguous()

    def _writing(self, x: torch.Tensor, stream: Any) -> Any:
        """A context with ``stream`` current, for work that writes ``x`` (none needed on the CPU
        or where ``stream`` is already current)."""
        if stream is None or x.device.type != "cuda" or torch.cuda.current_stream(x.device).cuda_stream == stream:
            return contextlib.nullcontext()
        return torch.cuda.stream(torch_stream(stream, x.device))

    def fill(self, x: torch.Tensor, value: Any, stream: Any = None) -> None:
        with self._writing(x, stream):
            x.fill_(value)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Any = None) -> None:
        with self._writing(dst, stream):
            dst.copy_(src)

    def overlaps(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        if a.device != b.device:
            return False
        return ranges_overlap(_range(a), _range(b))

    def index_array(self, obj: Any, device: int | None, name: str) -> torch.Tensor:
        if isinstance(obj, torch.Tensor):
            why = refusal(obj, name)
            if why is not None:  # (a sparse or nested tensor: refused by name, as x is)
                raise TypeError(why)
            t = obj
            here = self.device_of(t)
            if here != device:
                if device is None:
                    raise TypeError(f"{name} is a CUDA tensor but x is a CPU tensor; pass {name} on the CPU")
                if here is not None:
                    raise ValueError(f"{name} is on CUDA device {here} but x is on CUDA device {device}")
                t = t.to(_device(device))
        else:
            if torch.compiler.is_compiling():
                # (a list or NumPy array is a constant of the traced function: made a tensor as
                # it is, which TorchDynamo can trace; the checks below still refuse non-integers)
                a = torch.as_tensor(obj)
                if a.numel() == 0 and not hasattr(obj, "dtype"):
                    a = a.to(torch.int64)
            elif hasattr(obj, "__cuda_array_interface__"):
                refuse_dask(obj, name)
                if device is None:
                    raise TypeError(f"{name} is a device array but x is a CPU tensor; pass {name} on the CPU")
                a = obj
            else:
                # Host values are read as the NumPy adapter reads them (lists of integers past
                # int64, uint64 past int64: refused by value, not wrapped to negative ids).
                from linred.arrays._numpy import _int_array

                a = _int_array(np, obj, name)
                if not (
                    a.dtype.isnative and a.flags.c_contiguous and a.flags.writeable and min(a.strides, default=0) >= 0
                ):
                    # (PyTorch takes native byte order and positive strides only, and warns on
                    # a read-only array: a copy of its own)
                    a = np.array(a, dtype=a.dtype.newbyteorder("="), order="C")
            try:
                t = torch.as_tensor(a, device=_device(device))
            except (TypeError, ValueError, RuntimeError) as e:
                raise TypeError(f"{name} must be an array of integers; got {type(obj).__name__} ({e})") from None
        if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
            raise TypeError(f"{name} must be an array of integers; got dtype {dtype_name(t.dtype)}")
        if t.dtype not in (torch.int32, torch.int64):
            wide = t.dtype == getattr(torch, "uint64", None)
            t = t.to(torch.int64)
            if (
                wide
                and t.device.type == "cpu"
                and t.numel()
                and not torch.compiler.is_compiling()
                and bool((t < 0).any())
            ):
                # (as NumPy's uint64: refused by value, not wrapped; CUDA ids wrap to negative
                # ids, which the checks of check=True refuse)
                raise ValueError(f"{name} must fit in int64; got {int(t[t < 0][0]) + 2**64}")
        # The kernels read offsets as a plain array: a strided view is made contiguous.
        return t.contiguous()

    def on_stream(self, stream: Any, device: int | None) -> Any:
        if device is None or _current_stream(device) == stream:
            return contextlib.nullcontext()
        return torch.cuda.stream(torch_stream(stream, _device(device)))

    def resolve_stream(self, stream: Any, device: int | None) -> int | None:
        if device is None:
            if stream is not None:
                raise ValueError(f"stream must be None for CPU tensors; got {type(stream).__name__}")
            return None
        if stream is None:
            return _current_stream(device)
        return stream_handle(stream, device)

    def offsets_ok(self, offsets: torch.Tensor, n: int) -> bool | None:
        if offsets.device.type != "cuda":
            return None
        device = offsets.device.index
        stream = _current_stream(device)
        wide, m = offsets.dtype == torch.int64, offsets.shape[0] - 1
        return _device_checks.offsets_ok(offsets.data_ptr(), wide, m, n, device, stream, _pinned_words)

    def check_word(self, offsets: torch.Tensor) -> int:
        if not offsets.is_cuda:  # (a tensor's device made per call costs more than the test)
            return 0
        return _device_checks.arm(_pinned_words)

    def check_passed(self, stream: Any, device: int | None) -> bool:
        return _device_checks.passed(stream, device)

    def offsets_summary(self, offsets: torch.Tensor) -> tuple[int, int, int, int, int]:
        if offsets.device.type == "cpu":
            # On the host NumPy's reductions of the same memory (a view) cost a few µs where
            # torch's small operations cost about 60 (2,000 x 64 rows in 32 segments: the whole
            # checked call took 130 µs against 65 for NumPy data).
            from linred.arrays._numpy import NUMPY

            return NUMPY.offsets_summary(offsets.numpy())
        if offsets.shape[0] < 2:
            return int(offsets[0]), int(offsets[-1]), -1, 0, 0
        down = offsets[1:] < offsets[:-1]  # compared, not subtracted: differences may wrap
        at = down.int().argmax()
        steps = torch.diff(offsets)
        summary = torch.stack(
            [
                offsets[0].long(),
                offsets[-1].long(),
                torch.where(down[at], at, -1).long(),
                steps.min().long(),
                steps.max().long(),
            ]
        )
        first, last, at, lo, hi = summary.tolist()
        return first, last, at, lo, hi

    def lengths_summary(self, lengths: torch.Tensor, offsets: torch.Tensor) -> tuple[int, int, int, bool, int]:
        if lengths.device.type == "cpu":  # (as offsets_summary)
            from linred.arrays._numpy import NUMPY

            return NUMPY.lengths_summary(lengths.numpy(), offsets.numpy())
        if lengths.shape[0] == 0:
            return 0, 0, 0, False, 0
        summary = torch.stack(
            [
                lengths.min().long(),
                lengths.argmin(),
                lengths.max().long(),
                (offsets[1:] < offsets[:-1]).any().long(),
                offsets[-1],
            ]
        )
        lo, at, hi, wrapped, total = summary.tolist()
        return lo, at, hi, bool(wrapped), total

    def lengths_to_offsets(self, lengths: torch.Tensor) -> torch.Tensor:
        if (
            lengths.device.type == "cuda"
            and _device_scan.serves(lengths.shape[0])
            and lengths.dtype in (torch.int32, torch.int64)
            and lengths.is_contiguous()
            and torch._C._functorch.maybe_current_level() is None
            and not torch.compiler.is_compiling()  # (its launch cannot be traced: torch.cumsum can)
        ):
            # One launch (scan.cuh), into a buffer that also holds the scan's state: torch.cumsum
            # costs a call 25-35 us of host time.
            m, device = lengths.shape[0], lengths.device.index
            buffer = torch.empty(_device_scan.words(m), dtype=torch.int64, device=lengths.device)
            stream = _current_stream(device)
            wide = lengths.dtype == torch.int64
            if _device_scan.scan(lengths.data_ptr(), wide, m, buffer.data_ptr(), device, stream):
                return buffer[: m + 1]
        if torch._C._functorch.maybe_current_level() is not None:
            # (inside torch.func transforms, whose batched lengths take no out=)
            return torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int64), (1, 0))
        # (empty, not zeros: only the first offset needs its 0; the scan writes the others)
        off = torch.empty(lengths.shape[0] + 1, dtype=torch.int64, device=lengths.device)
        off[:1].zero_()
        torch.cumsum(lengths, 0, dtype=torch.int64, out=off[1:])
        return off


TORCH = TorchAdapter()
adapters[torch.Tensor] = TORCH
register_torch()  # autograd and torch.compile through linred's operator (see linred._dynamo)
