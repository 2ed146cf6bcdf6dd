"""Compile template instantiations of ``segreduce.cuh`` with NVRTC, cached in memory and on disk.

Each instantiation becomes an ``extern "C"`` wrapper with a plain name, so the
binary can be cached as a cubin and loaded again without NVRTC's name-expression
mapping.  The disk cache lives in ``$LINRED_CACHE_DIR/kernels`` (default: ``linred/kernels``
in ``$XDG_CACHE_HOME`` or ``~/.cache``) under a key that covers the source, the wrapper, the
options, the GPU architecture and the NVRTC version.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from linred._cache import user_cache_dir
from linred._dtypes import C_TYPES

logger = logging.getLogger("linred.kernels")

#: C++ type of each dtype name in the kernels (their own 16-bit float types)
CTYPES = {**C_TYPES, "float16": "half_t", "bfloat16": "bf16_t"}

_SOURCE: str | None = None
_modules: dict[tuple, Any] = {}
_lock = threading.Lock()


def source() -> str:
    global _SOURCE
    if _SOURCE is None:
        _SOURCE = resources.files("linred.kernels").joinpath("segreduce.cuh").read_text()
    return _SOURCE


def cache_dir() -> Path:
    """Where compiled kernels are kept between processes: ``$LINRED_CACHE_DIR/kernels``, else
    ``linred/kernels`` in the user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``),
    beside the table of ``linred tune``."""
    root = os.environ.get("LINRED_CACHE_DIR")
    return (Path(root) if root else user_cache_dir()) / "kernels"


def _nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc

        _, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception:  # the version only keys the cache; an unknown one is still a valid key
        return "unknown"


def _arch(device_id: int) -> str:
    from cuda.core import Device

    major, minor = Device(device_id).compute_capability
    return f"sm_{major}{minor}"


def get_kernels(device_id: int, wrapper: str, names: tuple[str, ...]) -> tuple[Any, ...]:
    """The kernels ``names`` defined by ``wrapper`` (C++ appended to the source) on ``device_id``."""
    key = (device_id, wrapper)
    module = _modules.get(key)
    if module is None:
        with _lock:
            module = _modules.get(key)
            if module is None:
                module = _build(device_id, wrapper)
                _modules[key] = module
    return tuple(module.get_kernel(name) for name in names)


def _build(device_id: int, wrapper: str) -> Any:
    from cuda.core import Device, ObjectCode, Program, ProgramOptions

    Device(device_id).set_current()
    arch = _arch(device_id)
    code = source() + "\n" + wrapper
    options = ProgramOptions(arch=arch, std="c++17", name="linred_segreduce")
    digest = hashlib.sha256("\0".join([code, arch, _nvrtc_version(), "std=c++17"]).encode()).hexdigest()[:32]
    path = cache_dir() / f"{digest}.cubin"
    try:
        cubin = path.read_bytes()
    except OSError:
        cubin = None
    if cubin is None:
        logger.debug("compiling kernels for %s:%s", arch, wrapper)
        cubin = bytes(Program(code, "c++", options).compile("cubin").code)
        try:  # a read-only or full disk only costs the next process a compilation
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(cubin)
            os.replace(tmp, path)
        except OSError as e:
            logger.debug("could not cache %s: %s", path, e)
    return ObjectCode.from_cubin(cubin)
