"""What a benchmark result must carry to be read later: date, machine, device, driver and versions."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
from typing import Any

__all__ = ["collect", "gpu_available"]

#: shown name -> distribution names to try (versions are read from package metadata, no import)
PACKAGES: dict[str, tuple[str, ...]] = {
    "numpy": ("numpy",),
    "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy"),
    "torch": ("torch",),
    "nvmath-python": ("nvmath-python",),
    "cuda-cccl": ("cuda-cccl",),
    "cuda-core": ("cuda-core",),
    "ml_dtypes": ("ml_dtypes",),
    "matplotlib": ("matplotlib",),
}


#: environment variables that change what is measured (TF32, CuPy's CUB switch, threads, device)
ENVIRONMENT = ("CUPY_TF32", "NVIDIA_TF32_OVERRIDE", "CUPY_ACCELERATORS", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def _version(*distributions: str) -> str | None:
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def gpu_available() -> tuple[bool, str]:
    """``(True, "")`` if CuPy imports and sees a CUDA device, else ``(False, why not)``."""
    try:
        import cupy
    except Exception as e:
        return False, f"CuPy does not import ({type(e).__name__}: {e})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return False, f"no CUDA device ({type(e).__name__}: {str(e).strip()[:120]})"
    return (count > 0, "" if count else "no CUDA device")


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _nvidia_smi_driver() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except Exception:
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def _gpu() -> dict[str, Any]:
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    info: dict[str, Any] = {
        "name": name.decode() if isinstance(name, bytes) else str(name),
        "index": dev.id,
        "compute_capability": f"{props['major']}.{props['minor']}",
        "multiprocessors": props.get("multiProcessorCount"),
        "memory_gib": round(props["totalGlobalMem"] / 2**30, 1),
        "l2_cache_mib": round(props.get("l2CacheSize", 0) / 2**20, 1),
        "driver": _nvidia_smi_driver(),
        "driver_cuda_version": _cuda_version(cupy.cuda.runtime.driverGetVersion()),
        "runtime_cuda_version": _cuda_version(cupy.cuda.runtime.runtimeGetVersion()),
        "cupy_accelerators": {
            "reduction": list(cupy._core.get_reduction_accelerators()),
            "routine": list(cupy._core.get_routine_accelerators()),
        },
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch_cuda_version"] = torch.version.cuda
        info["torch_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    return info


def _cpu() -> dict[str, Any]:
    info: dict[str, Any] = {"processor": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["processor"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import numpy as np

        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["numpy_blas"] = f"{blas.get('name')} {blas.get('version', '')}".strip()
    except Exception:
        pass
    return info


def _load() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def collect(device: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Metadata of a run: date, host, CPU, GPU (if used), package versions, environment, settings."""
    import linred

    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "versions": {"linred": linred.__version__},
        "load_average": _load(),
        "cpu": _cpu(),
        "environment": {k: os.environ[k] for k in ENVIRONMENT if k in os.environ},
        "settings": settings,
    }
    for shown, dists in PACKAGES.items():
        meta["versions"][shown] = _version(*dists)
    if device == "gpu":
        try:
            meta["gpu"] = _gpu()
        except Exception as e:
            meta["gpu"] = {"error": f"{type(e).__name__}: {e}"}
    return meta
