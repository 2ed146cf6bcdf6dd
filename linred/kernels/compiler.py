"""linred's one path from CUDA C++ to code: sources assembled from the headers of
:mod:`linred.kernels`, compiled with NVRTC (through cuda.core), cached in memory and on disk.

- :func:`source` assembles a program: the ``#include "x.cuh"`` lines of linred's
  headers are replaced by the headers themselves (each once), so that a program is
  one self-contained string, which is also what keys the caches;
- :func:`get_kernels` compiles a program made of an entry-point wrapper (the
  ``#include`` of a kernel family and one macro line per kernel, written by
  ``linred/backends/nvrtc/kernels.py``) to a cubin and returns its kernels; the
  wrapper defines ``extern "C"`` kernels with plain names, so the binary can be
  cached as a cubin and loaded again without NVRTC's name-expression mapping;
- :func:`get_ltoir` compiles a device function to LTO-IR (the operators the cub
  backend hands cuda.compute).

The CuPy elementwise kernels of :mod:`linred.kernels.elementwise` take their C++
from :func:`source` too, but CuPy compiles them (it writes the kernel around the
operation).

The disk cache lives in ``$LINRED_CACHE_DIR/kernels`` (default: ``linred/kernels``
in ``$XDG_CACHE_HOME`` or ``~/.cache``) under a key that covers the program, the
options, the GPU architecture and the NVRTC version.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from linred._cache import user_cache_dir
from linred._dtypes import C_TYPES

logger = logging.getLogger("linred.kernels")

#: C++ type of each dtype name in the kernels (their own 16-bit float types)
CTYPES = {**C_TYPES, "float16": "half_t", "bfloat16": "bf16_t"}

_INCLUDE = re.compile(r'^#include "([\w.]+\.cuh)"[ \t]*$', re.M)
_modules: dict[tuple, Any] = {}
_lock = threading.Lock()
_ltoir: dict[tuple[str, str], bytes] = {}
_ltoir_lock = threading.Lock()


@functools.cache
def header(name: str) -> str:
    """The text of linred's header ``name`` (e.g. ``"common.cuh"``), as shipped."""
    return resources.files("linred.kernels").joinpath(name).read_text()


def source(code: str) -> str:
    """``code`` with every ``#include "x.cuh"`` of a linred header replaced by the header itself
    (its own includes expanded the same way), each header once; ``#pragma once`` lines dropped."""
    done: set[str] = set()

    def expand(text: str) -> str:
        def include(match: re.Match) -> str:
            name = match.group(1)
            if name in done:
                return ""
            done.add(name)
            return expand(header(name)).rstrip("\n")

        return _INCLUDE.sub(include, text.replace("#pragma once\n", ""))

    return expand(code)


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
    """The kernels ``names`` defined by ``wrapper`` (a program of linred headers) on ``device_id``."""
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
    from cuda.core import ObjectCode, Program, ProgramOptions

    from linred.arrays._context import set_up

    set_up(device_id)
    arch = _arch(device_id)
    code = source(wrapper)
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


def get_ltoir(code: str, arch: str) -> bytes:
    """``code`` (a program of linred headers defining device functions) compiled to LTO-IR for
    ``arch`` (e.g. ``"sm_90"``), relocatable, for a link-time-optimized link (cached in memory)."""
    key = (code, arch)
    ltoir = _ltoir.get(key)
    if ltoir is None:
        with _ltoir_lock:
            ltoir = _ltoir.get(key)
            if ltoir is None:
                try:
                    from cuda.core import Program, ProgramOptions
                except ImportError:  # cuda.core < 0.4
                    from cuda.core.experimental import Program, ProgramOptions
                options = ProgramOptions(arch=arch, relocatable_device_code=True, link_time_optimization=True)
                ltoir = _ltoir[key] = bytes(Program(source(code), "c++", options).compile("ltoir").code)
    return ltoir
