"""Stream arguments: whatever a caller passes as ``stream=``, as a raw ``cudaStream_t``.

No array library is imported here: CuPy and PyTorch streams are recognised by
the attributes they carry, so a PyTorch user needs no CuPy and vice versa.
"""

from __future__ import annotations

from typing import Any


class ProtocolStream:
    """A raw ``cudaStream_t`` in the CUDA stream protocol (``__cuda_stream__``), for APIs that
    take stream objects: cuda.compute, CuPy's ``Stream.from_external``."""

    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


_ACCEPTED = "a CuPy or PyTorch stream, an object with __cuda_stream__, or an int cudaStream_t handle"


def _stream_device(stream: Any) -> int | None:
    """The device a stream object belongs to, when it says (CuPy: ``device_id``; PyTorch: ``device``)."""
    device_id = getattr(stream, "device_id", None)
    if isinstance(device_id, int) and device_id >= 0:
        return device_id
    device = getattr(stream, "device", None)
    index = getattr(device, "index", None)
    if getattr(device, "type", None) == "cuda" and isinstance(index, int):
        return index
    return None


def stream_handle(stream: Any, device: int | None = None) -> int:
    """The raw ``cudaStream_t`` of ``stream``.

    Accepts a CuPy stream, a PyTorch CUDA stream, any object with
    ``__cuda_stream__`` (the CUDA stream protocol) or a non-negative int handle
    (0 is the legacy default stream, 2 the per-thread default stream).  With
    ``device`` given, a stream object that names another device is refused.

    Raises
    ------
    TypeError
        If ``stream`` is none of these.
    ValueError
        If it is a negative int or a stream of another device.
    """
    if isinstance(stream, bool) or stream is None:
        raise TypeError(f"stream must be {_ACCEPTED}; got {type(stream).__name__}")
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"stream must be a non-negative cudaStream_t handle; got {stream}")
        return stream
    if hasattr(stream, "__cuda_stream__"):
        handle = int(stream.__cuda_stream__()[1])
    elif hasattr(stream, "cuda_stream"):  # torch.cuda.Stream without the protocol
        handle = int(stream.cuda_stream)
    elif hasattr(stream, "ptr") and type(stream).__module__.split(".")[0] == "cupy":
        handle = int(stream.ptr)
    else:
        raise TypeError(f"stream must be {_ACCEPTED}; got {type(stream).__name__}")
    if device is not None:
        owner = _stream_device(stream)
        if owner is not None and owner != device:
            raise ValueError(f"stream is on CUDA device {owner} but the data is on CUDA device {device}")
    return handle
