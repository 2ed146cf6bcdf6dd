"""The ``linred`` command: ``info``, ``demo``, ``bench``, ``tune`` and ``--version``.

``bench`` and ``tune`` live in their own modules (:mod:`linred.bench`,
:mod:`linred.cli.tune`), imported only when their subcommand runs, so
``linred info`` and ``linred demo`` start fast and keep working in an
installation where those modules are absent or broken.  ``demo`` is
:mod:`linred.cli.demo`, also imported only when it runs; what it shares with
``info`` is in :mod:`linred.cli._status`, so neither imports the other.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import platform
import sys
from collections.abc import Sequence
from typing import Any

from linred.cli._status import backend_status
from linred.cli._status import short_error as _short_error

__all__ = ["main"]

#: subcommands served by a module of their own: name -> (module, one-line help).
#: The module defines ``add_arguments(parser)`` and ``run(args) -> int``.
PLUGINS: dict[str, tuple[str, str]] = {
    "bench": ("linred.bench", "measure linred's backends beside the peers (NumPy, CuPy, torch, CUB)"),
    "tune": ("linred.cli.tune", "measure this GPU (or, with --device cpu, this CPU) and cache the dispatch table"),
}

#: optional packages reported by ``linred info``: shown name -> distribution names to try
OPTIONAL_PACKAGES: dict[str, tuple[str, ...]] = {
    "nvmath-python": ("nvmath-python",),
    "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"),
    "torch": ("torch",),
    "cuda-cccl": ("cuda-cccl",),
    "cuda-core": ("cuda-core",),
    "ml_dtypes": ("ml_dtypes",),
    "jax": ("jax",),
    "dask": ("dask",),
}


def package_version(*distributions: str) -> tuple[str, str] | None:
    """``(distribution, version)`` of the first installed distribution, read from metadata only."""
    for dist in distributions:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _cupy_devices() -> list[str]:
    import cupy

    devices = []
    for i in range(cupy.cuda.runtime.getDeviceCount()):
        p = cupy.cuda.runtime.getDeviceProperties(i)
        name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
        devices.append(
            f"{i}: {name}, {p['totalGlobalMem'] / 2**30:.1f} GiB, compute capability {p['major']}.{p['minor']}"
        )
    return devices


def _torch_devices() -> list[str]:
    import torch

    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append(f"{i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, compute capability {p.major}.{p.minor}")
    return devices


def cuda_devices() -> tuple[list[str], list[str]]:
    """``(devices, notes)``: the CUDA devices CuPy or PyTorch can see, and why a probe saw none."""
    notes = []
    probes = (("cupy", OPTIONAL_PACKAGES["cupy"], _cupy_devices), ("torch", ("torch",), _torch_devices))
    for label, dists, probe in probes:
        if package_version(*dists) is None:
            continue
        try:
            devices = probe()
        except Exception as e:  # no driver, wrong CUDA build, ...: report, never fail
            notes.append(f"{label}: {_short_error(e)}")
            continue
        if devices:
            return [f"{d} (seen by {label})" for d in devices], notes
        notes.append(f"{label}: 0 devices")
    return [], notes


def _info(args: argparse.Namespace) -> int:
    import numpy as np

    import linred

    print(f"linred {linred.__version__} ({linred.__file__.rsplit('/', 1)[0]})")
    print(f"Python {platform.python_version()} ({platform.python_implementation()}) on {platform.platform()}")
    print(f"NumPy {np.__version__}")

    print("\nBackends:")
    for name, (ok, text) in backend_status().items():
        print(f"  {name:<7} {'available' if ok else 'unavailable'}: {text}")

    print("\nOptional packages (versions from package metadata):")
    for shown, dists in OPTIONAL_PACKAGES.items():
        found = package_version(*dists)
        if found is None:
            version = "not installed"
        elif found[0] == shown:
            version = found[1]
        else:
            version = f"{found[1]} ({found[0]})"
        print(f"  {shown:<14} {version}")

    print("\nCUDA devices:")
    devices, notes = cuda_devices()
    for line in devices or ["no CUDA device"]:
        print(f"  {line}")
    if not devices and notes:
        print(f"  ({'; '.join(notes)})")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from linred.cli.demo import run

    return run(n=args.n, segment_lengths=args.segment_length, mean_length=args.mean_length, repeat=args.repeat)


def _plugin(args: argparse.Namespace, rest: list[str]) -> int:
    module_name, help_text = PLUGINS[args.command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            problem = f"not available in this installation ({module_name} is missing)"
        else:
            problem = f"{module_name} needs a package that is missing: {e}"
        print(f"linred {args.command}: {problem}", file=sys.stderr)
        return 2
    except Exception as e:
        print(f"linred {args.command}: {module_name} failed to import: {_short_error(e)}", file=sys.stderr)
        return 2
    if not (callable(getattr(module, "add_arguments", None)) and callable(getattr(module, "run", None))):
        print(f"linred {args.command}: {module_name} lacks add_arguments(parser) or run(args)", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog=f"linred {args.command}", description=help_text)
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(rest)) or 0)


def build_parser() -> argparse.ArgumentParser:
    import linred

    parser = argparse.ArgumentParser(
        prog="linred", description="Segmented reductions as linear algebra: information, demo and benchmarks."
    )
    parser.add_argument("--version", action="version", version=f"linred {linred.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    sub.add_parser("info", help="versions, backends and CUDA devices (for bug reports)")

    demo = sub.add_parser("demo", help="the [1..12] example, then a large array through every available backend")
    demo.add_argument("--n", type=_positive_int, default=1 << 24, help="elements of the large array (default 2^24)")
    demo.add_argument(
        "--segment-length",
        "-L",
        type=_positive_int,
        action="append",
        help="fixed segment length to run (repeatable; default 32 and 1024)",
    )
    demo.add_argument(
        "--mean-length",
        type=_non_negative_int,
        default=64,
        help="mean of the random variable segment lengths (default 64; 0 skips them)",
    )
    demo.add_argument(
        "--repeat", type=_positive_int, default=7, help="timed samples per case (default 7), after a warm-up"
    )

    for name, (_, help_text) in PLUGINS.items():
        # No options of its own: they come from the plugin module, parsed in _plugin, so
        # that `linred bench --help` is the module's help and the module is imported lazily.
        sub.add_parser(name, help=f"{help_text} (see linred {name} --help)", add_help=False)
    return parser


def _positive_int(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0; got {text}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return _power_of_two(text)


def _power_of_two(text: str) -> int:
    """Accept ``2^24`` and ``2**24`` as well as plain integers."""
    for sep in ("^", "**"):
        base, found, exp = text.partition(sep)
        if found and base.strip() == "2" and exp.strip().isdigit():
            return 1 << int(exp)
    raise argparse.ArgumentTypeError(f"must be an integer such as 1000000 or 2^20; got {text!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``linred`` command line; returns the exit status."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command in PLUGINS:
        return _plugin(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    handlers: dict[str, Any] = {"info": _info, "demo": _demo}
    return handlers[args.command](args)
